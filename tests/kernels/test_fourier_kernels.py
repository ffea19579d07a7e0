"""SketchedRBFKernel / SketchedMaternKernel: GPyTorch's kernel contract, exactness as F grows,
ScaleKernel pass-through, state_dict round-trips, dtypes, shared draws, gradients, bad input."""

import io
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.kernels import MaclaurinRBFKernel, SketchedMaternKernel, SketchedRBFKernel
from rfgp.kernels.random_feature_kernel import same_inputs
from rfgp.models import ExactGPModel

METHODS = ["rff", "orf", "sorf"]


# ------------------------------------------------------- GPyTorch's harness
class _SketchedHarness(BaseKernelTestCase):
    """GPyTorch's kernel contract.  A fixed seed makes every kernel instance of a test share its
    draws (lazily made per input dimension), so e.g. ``active_dims`` kernels compare equal."""

    seed = 0
    method = "rff"

    def make(self, **kwargs):
        raise NotImplementedError

    def create_kernel_no_ard(self, **kwargs):
        return self.make(**kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return self.make(ard_num_dims=num_dims, **kwargs)

    # Consistent input dimensions: 10 without batches (active_dims picks subsets), 2 with batches.
    def create_data_no_batch(self):
        return torch.randn(50, 10)

    def create_data_single_batch(self):
        return torch.randn(2, 30, 2)

    def create_data_double_batch(self):
        return torch.randn(3, 2, 50, 2)


def _harness(kernel_cls, method, **fixed):
    class Harness(_SketchedHarness, unittest.TestCase):
        def make(self, **kwargs):
            return kernel_cls(num_features=64, method=method, seed=17, **fixed, **kwargs)

    Harness.__name__ = Harness.__qualname__ = f"Test{kernel_cls.__name__}Harness_{method}"
    return Harness


for _method in METHODS:
    _rbf = _harness(SketchedRBFKernel, _method)
    _matern = _harness(SketchedMaternKernel, _method, nu=1.5)
    globals()[_rbf.__name__] = _rbf
    globals()[_matern.__name__] = _matern
del _rbf, _matern, _method


# ----------------------------------------------------------- exactness
@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("kind", ["rbf", "matern0.5", "matern2.5"])
def test_kernel_converges_to_exact(method, kind, device):
    # SORF's frequencies have the constant norm √d: at small d it targets a different kernel
    # (bias ≈ −e^{−z²/2}z⁴/(4d), notes pitfall 6), so it is checked at d = 32 (z ≈ 1.3).
    torch.manual_seed(0)
    d = 32 if method == "sorf" else 3
    x = torch.randn(40, d, dtype=torch.float64, device=device)
    if kind == "rbf":
        exact = gpytorch.kernels.RBFKernel()
        make = lambda F, seed: SketchedRBFKernel(F, method=method, seed=seed)  # noqa: E731
    else:
        nu = float(kind[6:])
        exact = gpytorch.kernels.MaternKernel(nu=nu)
        make = lambda F, seed: SketchedMaternKernel(F, nu=nu, method=method, seed=seed)  # noqa: E731
    exact = exact.double().to(device)
    lengthscale = 1.3 * d**0.5
    exact.lengthscale = lengthscale
    target = exact(x).to_dense().detach()
    errors = []
    for F in (64, 4096):
        kernel = make(F, 1).double().to(device)
        kernel.lengthscale = lengthscale
        errors.append(((kernel(x).to_dense().detach() - target).norm() / target.norm()).item())
    assert errors[1] < errors[0] / 3
    assert errors[1] < 0.08, errors


# ------------------------------------------------------ operator structure
@pytest.mark.parametrize("method", METHODS)
def test_returns_low_rank_feature_root_and_psd(method, device):
    kernel = SketchedRBFKernel(32, method=method, seed=0).to(device)
    x = torch.randn(50, 3, device=device)
    op = kernel(x).evaluate_kernel()
    assert isinstance(op, FeatureRootLinearOperator)
    assert op.root.shape == (50, 32)
    dense = op.to_dense().double()
    assert torch.linalg.eigvalsh(dense).min() > -1e-5  # K̂ = ΦΦᵀ is PSD


@pytest.mark.parametrize("method", METHODS)
def test_same_draw_for_x1_and_x2(method, device):
    kernel = SketchedRBFKernel(64, method=method, seed=0).double().to(device)
    x = torch.randn(20, 3, dtype=torch.float64, device=device)
    y = torch.randn(7, 3, dtype=torch.float64, device=device)
    full = kernel(torch.cat((x, y))).to_dense()
    cross = kernel(x, y).to_dense()
    torch.testing.assert_close(cross, full[:20, 20:], rtol=1e-12, atol=1e-12)
    # and the same draw across calls
    torch.testing.assert_close(kernel(x, y).to_dense(), cross, rtol=0, atol=0)


@pytest.mark.parametrize("pair", ["equal_leaves", "detached_x1"])
@pytest.mark.parametrize("diag", [False, True])
def test_input_gradients_of_distinct_inputs_with_equal_values(pair, diag):
    # k(x1, x2) for distinct tensors holding the same points was computed as Φ(x1)Φ(x1)ᵀ (or ‖Φ(x1)‖²): x1 got its
    # gradient twice and x2 none (k(x.detach(), x): a zero gradient for x, silently).
    kernel = SketchedRBFKernel(64, seed=0).double()
    x = torch.randn(5, 2, dtype=torch.float64)
    reference = [x.clone().requires_grad_(True), x.clone().requires_grad_(True)]
    phi1, phi2 = kernel.featurize(reference[0]), kernel.featurize(reference[1])
    ((phi1 * phi2).sum(-1) if diag else phi1 @ phi2.mT).sum().backward()
    if pair == "equal_leaves":
        x1, x2 = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    else:
        x2 = x.clone().requires_grad_(True)
        x1 = x2.detach()
    out = kernel(x1, x2, diag=diag)
    (out if diag else out.to_dense()).sum().backward()
    torch.testing.assert_close(x2.grad, reference[1].grad, rtol=1e-12, atol=1e-12)
    if pair == "equal_leaves":
        torch.testing.assert_close(x1.grad, reference[0].grad, rtol=1e-12, atol=1e-12)


def test_inputs_derived_alike_still_share_one_root_under_autograd():
    # GPyTorch's active_dims selects the columns of x1 and x2 separately (two index_select copies of one x): one
    # feature root with its variance correction, also where an input gradient is recorded; slices of one tensor that
    # hold equal values at different rows are not the same derivation
    x = torch.rand(6, 3, dtype=torch.float64, requires_grad=True)
    columns = torch.tensor([0, 2])
    assert same_inputs(x.index_select(-1, columns), x.index_select(-1, columns))
    assert same_inputs(x[:3], x[:3])
    repeated = torch.cat((x[:3], x[:3])).detach().requires_grad_(True)
    assert not same_inputs(repeated[:3], repeated[3:])
    assert not same_inputs(x.detach(), x)
    kernel = gpytorch.kernels.AdditiveKernel(MaclaurinRBFKernel(16, active_dims=[0, 2], seed=0)).double()
    covariance = kernel.kernels[0](x, x)  # GPyTorch selects the columns of x1 and x2 separately
    covariance = covariance.evaluate_kernel() if hasattr(covariance, "evaluate_kernel") else covariance
    assert isinstance(covariance, FeatureRootLinearOperator) and covariance.variance_correction is not None


@pytest.mark.parametrize("method", METHODS)
def test_diag_equals_row_wise_dot_products(method, device, dtype):
    kernel = SketchedMaternKernel(64, nu=2.5, method=method, seed=0, batch_shape=torch.Size([2])).to(device, dtype)
    x = torch.randn(2, 9, 3, dtype=dtype, device=device)
    y = torch.randn(2, 9, 3, dtype=dtype, device=device)
    diag = kernel(x, y, diag=True)
    assert diag.shape == (2, 9)
    torch.testing.assert_close(diag, torch.diagonal(kernel(x, y).to_dense(), dim1=-2, dim2=-1))
    torch.testing.assert_close(kernel(x, diag=True), torch.ones(2, 9, dtype=dtype, device=device))


@pytest.mark.parametrize("method", METHODS)
def test_scale_kernel_pass_through(method, device):
    base = SketchedRBFKernel(32, method=method, seed=0).double().to(device)
    scaled = gpytorch.kernels.ScaleKernel(base).double().to(device)
    scaled.outputscale = 2.5
    x = torch.randn(30, 2, dtype=torch.float64, device=device)
    op = scaled(x).evaluate_kernel()
    assert isinstance(op, FeatureRootLinearOperator)
    torch.testing.assert_close(op.to_dense(), 2.5 * base(x).to_dense())


@pytest.mark.parametrize("kernel_cls", [SketchedRBFKernel, SketchedMaternKernel])
def test_hyperparameters_named_and_constrained_like_gpytorch(kernel_cls):
    reference = gpytorch.kernels.RBFKernel(ard_num_dims=3) if kernel_cls is SketchedRBFKernel else \
        gpytorch.kernels.MaternKernel(ard_num_dims=3)
    kernel = kernel_cls(16, ard_num_dims=3, seed=0)
    assert [n for n, _ in kernel.named_parameters()] == [n for n, _ in reference.named_parameters()]
    assert type(kernel.raw_lengthscale_constraint) is type(reference.raw_lengthscale_constraint)
    torch.testing.assert_close(kernel.lengthscale, reference.lengthscale)
    # A saved GPyTorch hyperparameter state loads into the sketched kernel.
    reference.lengthscale = torch.tensor([[0.5, 1.0, 2.0]])
    kernel.load_state_dict(reference.state_dict(), strict=False)
    torch.testing.assert_close(kernel.lengthscale, reference.lengthscale)


@pytest.mark.parametrize("method", METHODS)
def test_ard_lengthscale_divides_inputs(method, device):
    kernel = SketchedRBFKernel(64, method=method, ard_num_dims=2, seed=0).double().to(device)
    kernel.lengthscale = torch.tensor([[0.5, 4.0]], dtype=torch.float64, device=device)
    plain = SketchedRBFKernel(64, method=method, input_dim=2, seed=0).double().to(device)
    plain.lengthscale = 1.0
    x = torch.randn(10, 2, dtype=torch.float64, device=device)
    torch.testing.assert_close(kernel(x).to_dense(), plain(x / kernel.lengthscale).to_dense())


@pytest.mark.parametrize("method", METHODS)
def test_gradients_wrt_hyperparameters_finite(method, device):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, method=method, ard_num_dims=3, seed=0)).to(device)
    x = torch.randn(25, 3, device=device)
    loss = kernel(x).to_dense().sum() + kernel(x, x[:5]).to_dense().pow(2).sum()
    loss.backward()
    grads = [kernel.raw_outputscale.grad, kernel.base_kernel.raw_lengthscale.grad]
    assert all(g is not None and bool(torch.isfinite(g).all()) and bool((g != 0).any()) for g in grads)


@pytest.mark.parametrize("method", METHODS)
@pytest.mark.parametrize("source_lazy", [False, True])
def test_state_dict_round_trip_reproduces_predictions(method, source_lazy, device):
    torch.manual_seed(0)
    x = torch.randn(40, 3, dtype=torch.float64, device=device)
    y = torch.sin(x.sum(-1))
    xs = torch.randn(11, 3, dtype=torch.float64, device=device)

    def build(seed, lazy):
        base = SketchedMaternKernel(32, nu=1.5, method=method, seed=seed, input_dim=None if lazy else 3)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        return ExactGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(base)).double().to(device)

    source = build(1, source_lazy)
    source.covar_module.outputscale = 1.7
    source.covar_module.base_kernel.lengthscale = 0.8
    source.likelihood.noise = 0.05
    source.eval()
    with torch.no_grad():
        phi = source.covar_module.base_kernel.featurize(xs)
        pred = source(xs)
        mean, var = pred.mean, pred.variance
    buffer = io.BytesIO()
    torch.save(source.state_dict(), buffer)
    for target_lazy in (True, False):
        target = build(2, target_lazy)
        target.load_state_dict(torch.load(io.BytesIO(buffer.getvalue())))
        target.eval()
        with torch.no_grad():
            assert torch.equal(target.covar_module.base_kernel.featurize(xs), phi)
            pred = target(xs)
            assert torch.equal(pred.mean, mean)
            assert torch.equal(pred.variance, var)


@pytest.mark.parametrize("method", METHODS)
def test_to_dtype_and_double(method, device):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, method=method, input_dim=3, seed=0)).to(device)
    x = torch.randn(8, 3, device=device)
    k32 = kernel(x).to_dense()
    assert k32.dtype == torch.float32
    kernel.double()
    feature_map = kernel.base_kernel.feature_map
    floating = [getattr(feature_map, n) for n in feature_map._buffer_names if getattr(feature_map, n).is_floating_point()]
    assert floating and all(b.dtype == torch.float64 for b in floating)
    k64 = kernel(x.double()).to_dense()
    assert k64.dtype == torch.float64
    torch.testing.assert_close(k64.float(), k32, rtol=1e-4, atol=1e-5)
    kernel.to(torch.float32)
    assert kernel(x).to_dense().dtype == torch.float32


def test_batch_shape_shares_draws(device):
    kernel = SketchedRBFKernel(32, method="orf", seed=0, batch_shape=torch.Size([3])).double().to(device)
    kernel.lengthscale = torch.tensor([0.5, 1.0, 2.0], dtype=torch.float64, device=device).view(3, 1, 1)
    x = torch.randn(10, 2, dtype=torch.float64, device=device)
    batched = kernel(x).to_dense()
    assert batched.shape == (3, 10, 10)
    single = SketchedRBFKernel(32, method="orf", seed=0).double().to(device)
    for i, ls in enumerate((0.5, 1.0, 2.0)):
        single.lengthscale = ls
        torch.testing.assert_close(batched[i], single(x).to_dense())


# ---------------------------------------------------------------- bad input
def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match=r"method must be one of 'rff', 'orf', 'sorf', 'gaussian_sketch', "
                                         r"'gaussian_sketch_hd', 'maclaurin'; got 'fastfood'"):
        SketchedRBFKernel(64, method="fastfood")
    with pytest.raises(ValueError, match=r"method must be one of"):
        SketchedMaternKernel(64, method="qmc")
    with pytest.raises(ValueError, match="num_features"):
        SketchedRBFKernel(0)
    with pytest.raises(ValueError, match="num_features must be even"):
        SketchedRBFKernel(31)
    with pytest.raises(ValueError, match="nu must be one of"):
        SketchedMaternKernel(64, nu=2.0)
    with pytest.raises(ValueError, match="ard_num_dims=3.*input_dim=2"):
        SketchedRBFKernel(64, ard_num_dims=3, input_dim=2)


def test_bad_inputs_to_kernel(device):
    kernel = SketchedRBFKernel(16, input_dim=3, seed=0).to(device)
    with pytest.raises(ValueError, match="x1 has 4 input dimensions.*input_dim=3"):
        kernel(torch.randn(5, 4, device=device)).to_dense()
    x = torch.randn(5, 3, device=device)
    x[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        kernel(x).to_dense()
    with pytest.raises(TypeError, match="x1 must be a real tensor"):
        kernel(torch.randn(5, 3, dtype=torch.complex64, device=device)).to_dense()
    # Integer (and half-precision) inputs are refused, not promoted (rfgp's dtype policy).
    ints = torch.arange(15, device=device).view(5, 3)
    with pytest.raises(TypeError, match="x1 must be a floating-point tensor.*int64"):
        kernel(ints).to_dense()
    # With ARD, GPyTorch's own check fires first and names ard_num_dims.
    ard = SketchedRBFKernel(16, ard_num_dims=3, seed=0).to(device)
    with pytest.raises(RuntimeError, match="ard_num_dims"):
        ard(torch.randn(5, 4, device=device)).to_dense()


def test_assigning_nu_after_construction_is_refused_by_name():
    """GPyTorch's ``MaternKernel.nu`` is a plain attribute read at every call; the sketched kernel's frequencies were
    drawn from ν's spectral density at construction, so ``kernel.nu = 2.5`` was accepted and changed nothing: the
    kernel matrix stayed the ν = 1.5 one.  Now the assignment raises, naming the kernel to build instead."""
    kernel = SketchedMaternKernel(64, nu=1.5, input_dim=2, seed=0)
    with pytest.raises(AttributeError, match=r"SketchedMaternKernel.nu is fixed at construction .* nu=2.5"):
        kernel.nu = 2.5
    assert kernel.nu == 1.5 and kernel.config()["nu"] == 1.5
