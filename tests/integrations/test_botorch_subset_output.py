"""``subset_output`` of a batched multi-output BoTorch model whose kernel was converted by ``rfgp.sketch``: the subset
model is the full model's outputs ``idcs``, whatever names the converted tree gives its batched hyperparameters."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.transforms import Normalize, Standardize  # noqa: E402

import rfgp  # noqa: E402

D, N, OUTPUTS = 2, 30, 3


def three_output_model():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N, D, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(6 * x).sum(-1), torch.cos(5 * x).prod(-1), x.sum(-1)], -1)
    model = SingleTaskGP(x, y, input_transform=Normalize(D), outcome_transform=Standardize(OUTPUTS))
    model.likelihood.noise = torch.tensor([[0.01], [0.05], [0.02]], dtype=torch.float64)
    model.covar_module.lengthscale = torch.tensor([[[0.2, 0.3]], [[0.4, 0.25]], [[0.5, 0.6]]], dtype=torch.float64)
    return model, x


@pytest.mark.parametrize("options", [
    dict(method="nystrom", num_features=20),
    dict(method="nystrom", num_features=20, learn_landmarks=True),
    dict(method="rff", num_features=64),
], ids=["nystrom", "nystrom-learned-landmarks", "rff"])
@pytest.mark.parametrize("idcs", [[1], [2, 0]])
def test_subset_output_is_the_full_models_outputs(options, idcs):
    # Before: a Nyström conversion keeps the lengthscale as covar_module.base_kernel.raw_lengthscale, which
    # SingleTaskGP's _subset_batch_dict ("covar_module.raw_lengthscale") does not name, so BoTorch set the base kernel's
    # batch shape to the subset's and left its (3, 1, 2) lengthscale (and learned (3, M, 2) landmarks) as they were:
    # the subset's posterior raised "The size of tensor a (4) must match the size of tensor b (3)".
    model, x = three_output_model()
    model.covar_module = rfgp.sketch(model.covar_module, seed=0, x_sample=model.transform_inputs(x), **options)
    model.eval()
    test_x = torch.rand(4, 3, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    full = model.posterior(test_x)
    subset = model.subset_output(idcs)
    part = subset.posterior(test_x)
    assert subset.num_outputs == len(idcs)
    assert part.mean.shape == (4, 3, len(idcs))
    # the same model algebra on the same numbers, per output: equal to rounding
    torch.testing.assert_close(part.mean, full.mean[..., idcs], rtol=0, atol=1e-10)
    torch.testing.assert_close(part.variance, full.variance[..., idcs], rtol=0, atol=1e-10)
    assert model.covar_module.lengthscale.shape[0] == OUTPUTS  # the full model is left as it was

