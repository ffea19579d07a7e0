"""BoTorch kernels rfgp.sketch refuses by name (InfiniteWidthBNNKernel, LCEAKernel, SACKernel): the message gives the
reason and the routes, and the routes work — Nyström with every training point a landmark gives the exact posterior,
and SACKernel's equivalent AdditiveKernel tree has its covariance and converts to random features."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.kernels.contextual_lcea import LCEAKernel  # noqa: E402
from botorch.models.kernels.contextual_sac import SACKernel  # noqa: E402
from botorch.models.kernels.infinite_width_bnn import InfiniteWidthBNNKernel  # noqa: E402
from gpytorch.kernels import AdditiveKernel, ScaleKernel  # noqa: E402
from gpytorch.priors import GammaPrior  # noqa: E402

import rfgp  # noqa: E402

F64 = torch.float64
CONTEXTS = {"a": [0, 1], "b": [2, 3]}
N = 30
KERNELS = {
    "InfiniteWidthBNNKernel": (lambda: InfiniteWidthBNNKernel(depth=3), "a bias that no number of seeds removes"),
    "LCEAKernel": (lambda: LCEAKernel(CONTEXTS, batch_shape=torch.Size([])), "trainable context embeddings"),
    "SACKernel": (lambda: SACKernel(CONTEXTS, batch_shape=torch.Size([])), "counts C \\+ 1 times for C contexts"),
}


def model(kernel):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(N, 4, generator=generator, dtype=F64)
    y = torch.sin(4 * x[:, :2]).sum(-1, keepdim=True) + x[:, 2:3] * x[:, 3:]
    return SingleTaskGP(x, y, covar_module=kernel.to(F64)).eval(), x


@pytest.mark.parametrize("name", KERNELS)
def test_refused_by_name_with_the_reason_and_the_nystrom_route_is_exact(name):
    make, reason = KERNELS[name]
    exact, x = model(make())
    with pytest.raises(TypeError, match=f"does not convert {name}: .*{reason}.*method='nystrom'"):
        rfgp.sketch(exact.covar_module, 64)
    converted, _ = model(make())
    converted.covar_module = rfgp.sketch(converted.covar_module, N, method="nystrom",
                                         x_sample=converted.transform_inputs(x))
    converted.train().eval()
    test_x = torch.rand(6, 4, generator=torch.Generator().manual_seed(1), dtype=F64)
    with torch.no_grad():
        expected, actual = exact.posterior(test_x), converted.posterior(test_x)
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-5, atol=1e-6)


def test_sac_kernels_equivalent_tree_has_its_covariance_and_converts():
    sac = SACKernel(CONTEXTS, batch_shape=torch.Size([])).to(F64)
    sac.kernel_dict["a"].outputscale, sac.kernel_dict["b"].outputscale = 0.5, 2.0
    sac.base_kernel.lengthscale = torch.tensor([[0.3, 0.8]], dtype=F64)
    tree = AdditiveKernel(*(ScaleKernel(sac.base_kernel, active_dims=columns, outputscale_prior=GammaPrior(2.0, 15.0))
                            for columns in sac._indexers.values())).to(F64)
    for part, context in zip(tree.kernels, sac.kernel_dict.values()):
        part.outputscale = context.outputscale.detach()
    x = torch.rand(10, 4, generator=torch.Generator().manual_seed(2), dtype=F64)
    truth = sac(x).to_dense().detach()
    torch.testing.assert_close(tree(x).to_dense().detach(), truth, rtol=1e-14, atol=1e-14)
    converted = rfgp.sketch(tree, 8192, seed=0)
    assert float((converted(x).to_dense().detach() - truth).norm() / truth.norm()) < 0.05
    # the counts of the lengthscale prior that make SACKernel's conversion a different MAP objective
    count = [sum(name.endswith("lengthscale_prior") for name, *_ in k.named_priors()) for k in (sac, converted)]
    assert count == [3, 2]
