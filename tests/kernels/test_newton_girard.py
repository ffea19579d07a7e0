"""GPyTorch's NewtonGirardAdditiveKernel converted to random features of every interaction order
(rfgp/kernels/newton_girard.py): unbiased against an independent float64 e_d, exact diagonal, gradients in the
outputscales and base lengthscales, subset enumeration, state_dict, refusals, trees, training and resizing."""

import itertools
import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, NewtonGirardAdditiveKernel, PeriodicKernel, RBFKernel, ScaleKernel
from gpytorch.priors import GammaPrior

import rfgp
from rfgp.kernels import SketchedNewtonGirardAdditiveKernel
from rfgp.kernels.newton_girard import order_widths
from rfgp.models import ExactGPModel
from tests._spectral_checks import assert_unbiased

pytestmark = pytest.mark.filterwarnings("ignore:(NewtonGirardAdditiveKernel|The last_dim_is_batch).*:"
                                        "DeprecationWarning")

F64 = torch.float64
N = 4
X = torch.rand(9, N, dtype=F64, generator=torch.Generator().manual_seed(0)) * 2


def column_kernels(base, x, y):
    """kᵢ(xᵢ, yᵢ) for every column i, ``(n, N, M)``, from the closed form (RBF or Matérn-5/2, per-column ℓᵢ)."""
    r = ((x.unsqueeze(-2) - y.unsqueeze(-3)) / base.lengthscale.squeeze(-2)).abs().movedim(-1, 0)
    if type(base) is RBFKernel:
        return torch.exp(-0.5 * r**2)
    s = math.sqrt(5) * r
    return (1 + s + s**2 / 3) * torch.exp(-s)


def newton_girard_reference(exact, x, y=None):
    """Σ_d σ_d² e_d(k₁, …, k_n) in float64 by the recurrence E_d ← E_d + kᵢE_{d−1} over the columns (independent of
    GPyTorch's Newton-Girard evaluation, which runs in float32: see the first test)."""
    per_column = column_kernels(exact.base_kernel, x, x if y is None else y)
    elementary = [torch.ones_like(per_column[0])] + [torch.zeros_like(per_column[0])] * exact.max_degree
    for k in per_column:
        elementary = [elementary[0]] + [elementary[d] + k * elementary[d - 1] for d in range(1, exact.max_degree + 1)]
    return sum(exact.outputscale[..., d - 1, None, None] * elementary[d] for d in range(1, exact.max_degree + 1))


def exact_kernel(base=None, max_degree=3):
    base = RBFKernel(ard_num_dims=N, lengthscale_prior=GammaPrior(3.0, 3.0)) if base is None else base
    kernel = NewtonGirardAdditiveKernel(base, N, max_degree).double()
    if kernel.base_kernel.lengthscale.shape[-1] == N:
        kernel.base_kernel.lengthscale = torch.tensor([[0.5, 0.8, 1.2, 2.0]])
    kernel.outputscale = torch.tensor([0.5, 0.3, 0.2, 0.1][:kernel.max_degree])
    return kernel


def test_reference_is_gpytorchs_covariance():
    for exact in (exact_kernel(), exact_kernel(MaternKernel(nu=2.5), max_degree=4)):
        # GPyTorch's e_n buffer is torch.empty in the default dtype: float32 even for a float64 kernel
        assert torch.allclose(exact(X).to_dense(), newton_girard_reference(exact, X), rtol=0, atol=1e-6)


@pytest.mark.parametrize("num_features", [64, 16], ids=["enumerated", "sampled"])
@pytest.mark.parametrize("base", ["rbf_ard", "matern"])
def test_features_are_unbiased_for_every_order(num_features, base):
    exact = exact_kernel(MaternKernel(nu=2.5)) if base == "matern" else exact_kernel()
    target = newton_girard_reference(exact, X).detach()
    assert_unbiased(lambda seed: rfgp.sketch(exact, num_features, seed=seed)(X).to_dense(), target, num_seeds=80,
                    num_se=4.0)
    sketched = rfgp.sketch(exact, num_features, seed=0)
    assert type(sketched) is SketchedNewtonGirardAdditiveKernel and sketched.num_features == num_features
    total = sum(exact.outputscale[d - 1] * math.comb(N, d) for d in range(1, 4)).detach()
    assert torch.allclose(sketched(X, diag=True), total.expand(9), rtol=1e-14, atol=0)  # Φ(x)ᵀΦ(x) = k(x, x)
    assert torch.allclose(sketched(X).to_dense().diagonal(), total.expand(9), rtol=1e-13, atol=0)


def test_small_orders_enumerate_every_subset_with_stratified_counts():
    assert order_widths(11, 3) == [4, 4, 3]
    kernel = SketchedNewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=3), 3, 2 * 11, max_degree=3, seed=0)
    masks = (kernel.unit_frequencies != 0).to(torch.int64)
    subsets = [tuple(row.nonzero().flatten().tolist()) for row in masks]
    assert subsets[:4] == [(0,), (0,), (1,), (2,)]  # 4 frequencies for 3 columns: counts 2, 1, 1
    assert subsets[4:8] == [(0, 1), (0, 1), (0, 2), (1, 2)]
    assert subsets[8:] == [(0, 1, 2)] * 3
    assert kernel.sampled.sum() == 0 and kernel.shares.tolist() == [2, 2, 1, 1, 2, 2, 1, 1, 3, 3, 3]
    sampled = SketchedNewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=N), N, 2 * 6, max_degree=3, seed=0)
    sizes = (sampled.unit_frequencies != 0).sum(-1)
    assert sizes.tolist() == [1, 1, 2, 2, 3, 3] and sampled.sampled[2:].all()  # C(4, 2) = 6 > 2: sampled
    columns = itertools.chain(*[row.nonzero().flatten().tolist() for row in sampled.unit_frequencies])
    assert set(columns) <= set(range(N))


def test_gradients_in_outputscales_and_lengthscales_are_unbiased_and_match_finite_differences():
    exact = exact_kernel()
    weights = torch.randn(9, 9, dtype=F64, generator=torch.Generator().manual_seed(2))
    raw = ("raw_outputscale", "base_kernel.raw_lengthscale")

    def gradient(kernel, gram):
        return torch.cat([g.flatten() for g in torch.autograd.grad((gram * weights).sum(),
                                                                   [kernel.get_parameter(name) for name in raw])])

    target = gradient(exact, newton_girard_reference(exact, X))
    draws = torch.stack([gradient(kernel, kernel(X).to_dense())
                         for kernel in (rfgp.sketch(exact, 32, seed=seed) for seed in range(80))])
    mean, se = draws.mean(0), draws.std(0) / 80**0.5
    assert ((mean - target).abs() <= 4.0 * se + 1e-12).all(), (mean - target) / se
    kernel = rfgp.sketch(exact, 32, seed=0)
    analytic = gradient(kernel, kernel(X).to_dense())
    parameters = [kernel.get_parameter(name) for name in raw]
    numeric = []
    for parameter in parameters:
        for i in range(parameter.numel()):
            values = []
            for step in (1e-6, -1e-6):
                with torch.no_grad():
                    parameter.view(-1)[i] += step
                    values.append((kernel(X).to_dense() * weights).sum())
                    parameter.view(-1)[i] -= step
            numeric.append((values[0] - values[1]) / 2e-6)
    assert torch.allclose(analytic, torch.stack(numeric), rtol=1e-6, atol=1e-8)


def test_state_dict_priors_and_hyperparameters_carry_over():
    exact = exact_kernel()
    sketched = rfgp.sketch(exact, 64, seed=0)
    assert torch.equal(sketched.outputscale, exact.outputscale)
    assert torch.equal(sketched.base_kernel.lengthscale, exact.base_kernel.lengthscale)
    assert {n for n, *_ in sketched.named_priors()} == {n for n, *_ in exact.named_priors()} == {
        "base_kernel.lengthscale_prior"}
    fresh = rfgp.sketch(exact_kernel(), 64, seed=0)
    with torch.no_grad():
        fresh.raw_outputscale.zero_()
    result = fresh.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == []
    assert torch.equal(fresh(X).to_dense(), sketched(X).to_dense())
    again = rfgp.sketch(exact_kernel(), 64, seed=9)
    again.load_state_dict(sketched.state_dict())
    assert torch.equal(again(X).to_dense(), sketched(X).to_dense())


def test_refusals_name_the_reason():
    with pytest.raises(TypeError, match="MaternKernel\\(nu=0.5\\).*Cauchy"):
        rfgp.sketch(NewtonGirardAdditiveKernel(MaternKernel(nu=0.5), N), 64)
    with pytest.raises(TypeError, match="over PeriodicKernel has no per-column random features.*method='nystrom'"):
        rfgp.sketch(NewtonGirardAdditiveKernel(PeriodicKernel(), N), 64)
    with pytest.raises(TypeError, match="base_kernel has active_dims=\\[0, 1\\].*active_dims of the "
                                        "NewtonGirardAdditiveKernel"):
        rfgp.sketch(NewtonGirardAdditiveKernel(RBFKernel(active_dims=[0, 1]), 2), 64)
    with pytest.raises(ValueError, match="max_degree must be in 1..num_dims=4.*got 5"):
        SketchedNewtonGirardAdditiveKernel(RBFKernel(), N, 64, max_degree=5)
    with pytest.raises(ValueError, match="num_features=4 is too small for max_degree=3.*at least 6"):
        rfgp.sketch(exact_kernel(), 4)
    with pytest.raises(ValueError, match="NewtonGirardAdditiveKernel\\(num_dims=4\\) sees 3 columns"):
        rfgp.sketch(exact_kernel(), 64, x_sample=X[:, :3])
    with pytest.raises(ValueError, match="x1 has 3 input dimensions .*input_dim=4"):
        rfgp.sketch(exact_kernel(), 64)(X[:, :3]).to_dense()


def test_trees_training_and_set_num_features():
    generator = torch.Generator().manual_seed(4)
    x = torch.rand(60, N, dtype=F64, generator=generator)
    y = torch.sin(4 * x[:, 0]) * x[:, 1] + x[:, 2] + 0.05 * torch.randn(60, dtype=F64, generator=generator)
    tree = (ScaleKernel(exact_kernel(max_degree=2)) + ScaleKernel(RBFKernel(active_dims=[3]))).double()
    covar = rfgp.sketch(tree, 256, seed=0)
    assert [rfgp.kernels.kernel_num_features(part) for part in covar.kernels] == [128, 128]
    assert_unbiased(lambda seed: rfgp.sketch(tree, 64, seed=seed)(X).to_dense(), tree(X).to_dense().detach(),
                    num_seeds=60, num_se=4.0)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), covar).double()
    before = covar.kernels[0].base_kernel.outputscale.detach().clone()
    history = rfgp.fit_mll(model, num_iterations=15)
    assert history.losses[-1] < history.losses[0]
    assert not torch.equal(covar.kernels[0].base_kernel.outputscale, before)
    trained = covar.kernels[0].base_kernel.outputscale.detach().clone()
    rfgp.set_num_features(model, 1024)
    assert [rfgp.kernels.kernel_num_features(part) for part in covar.kernels] == [512, 512]
    assert torch.equal(covar.kernels[0].base_kernel.outputscale, trained)


def test_product_with_another_kernel_is_unbiased():
    product = (ScaleKernel(exact_kernel(max_degree=2)) * RBFKernel(active_dims=[3])).double()
    assert_unbiased(lambda seed: rfgp.sketch(product, 128, seed=seed)(X).to_dense(), product(X).to_dense().detach(),
                    num_seeds=60, num_se=4.0)


def test_resample_under_inference_mode_keeps_the_kernel_trainable():
    # Draws made by resample() under torch.inference_mode() were inference tensors: the next training step raised
    # "Inference tensors cannot be saved for backward".
    kernel = SketchedNewtonGirardAdditiveKernel(RBFKernel(), 3, 16, seed=0).double()
    with torch.inference_mode():
        kernel.resample(torch.Generator().manual_seed(0))
    assert not any(buffer.is_inference() for buffer in kernel.buffers())
    kernel(torch.randn(6, 3, dtype=torch.float64)).to_dense().sum().backward()
    assert kernel.raw_outputscale.grad is not None and torch.isfinite(kernel.raw_outputscale.grad).all()
