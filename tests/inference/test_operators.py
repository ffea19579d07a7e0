"""Feature-root operators: Woodbury inv_quad_logdet against dense algebra, weighted_gram backward,
concatenation of roots and constant scaling of the variance correction."""

import contextlib

import gpytorch
import pytest
import torch
from linear_operator import to_linear_operator
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NanError

import rfgp
from rfgp.inference.linalg import weighted_gram
from rfgp.inference.operators import (
    ChunkedFeatureRootLinearOperator,
    FeatureRootAddedDiagLinearOperator,
    FeatureRootLinearOperator,
)


def dense_inv_quad_logdet(features, noise, rhs):
    """Reference: rᵀ(ΦΦᵀ + D)⁻¹r per column and log|ΦΦᵀ + D| from a dense Cholesky."""
    covar = features @ features.mT + torch.diag_embed(noise)
    chol = torch.linalg.cholesky(covar)
    solve = torch.cholesky_solve(rhs, chol)
    return (rhs * solve).sum(-2), 2 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)


def operator(features, noise):
    op = FeatureRootLinearOperator(features) + DiagLinearOperator(noise)
    assert isinstance(op, FeatureRootAddedDiagLinearOperator)
    return op


CASES = [  # (batch, N, F): Woodbury (F < N) and dense-Cholesky (F ≥ N) paths
    ((), 30, 6), ((), 8, 8), ((), 6, 20), ((3,), 25, 4), ((2, 2), 5, 12),
]


# rhs of shape (N,) (vector; linear_operator allows it only for non-batched operators) or (..., N, k).
RHS_CASES = [(*case, columns) for case in CASES for columns in [None, 1, 3] if columns or not case[0]]


@pytest.mark.parametrize("batch, n, f, columns", RHS_CASES)
def test_inv_quad_logdet_matches_dense_values_and_gradients(batch, n, f, columns, device):
    gen = torch.Generator().manual_seed(n * f)
    kw = dict(dtype=torch.float64)
    features = torch.randn(*batch, n, f, generator=gen, **kw).to(device).requires_grad_()
    noise = (0.1 + torch.rand(*batch, n, generator=gen, **kw)).to(device).requires_grad_()
    shape = (*batch, n) if columns is None else (*batch, n, columns)
    rhs = torch.randn(*shape, generator=gen, **kw).to(device).requires_grad_()
    matrix_rhs = rhs.unsqueeze(-1) if columns is None else rhs

    inv_quad, logdet = operator(features, noise).inv_quad_logdet(rhs, logdet=True)
    ref_columns, ref_logdet = dense_inv_quad_logdet(features, noise, matrix_rhs)
    ref_inv_quad = ref_columns.sum(-1)
    torch.testing.assert_close(inv_quad, ref_inv_quad)
    torch.testing.assert_close(logdet, ref_logdet)

    weights = torch.randn(2, *batch, dtype=torch.float64, device=device)
    grads = torch.autograd.grad((weights[0] * inv_quad + weights[1] * logdet).sum(), (features, noise, rhs))
    ref_grads = torch.autograd.grad((weights[0] * ref_inv_quad + weights[1] * ref_logdet).sum(), (features, noise, rhs))
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)

    if columns is not None:  # per-column terms without reduction
        per_column, _ = operator(features, noise).inv_quad_logdet(rhs, logdet=False, reduce_inv_quad=False)
        torch.testing.assert_close(per_column, ref_columns)


@pytest.mark.parametrize("n, f", [(30, 6), (6, 20)])
def test_logdet_only_and_agrees_with_linear_operator(n, f, device):
    features = torch.randn(n, f, dtype=torch.float64, device=device)
    noise = 0.2 + torch.rand(n, dtype=torch.float64, device=device)
    op = operator(features, noise)
    _, logdet = op.inv_quad_logdet(None, logdet=True)
    dense = to_linear_operator(op.to_dense())
    torch.testing.assert_close(logdet, dense.inv_quad_logdet(None, logdet=True)[1])
    rhs = torch.randn(n, 2, dtype=torch.float64, device=device)
    torch.testing.assert_close(op.inv_quad_logdet(rhs, logdet=False)[0], dense.inv_quad_logdet(rhs)[0])
    torch.testing.assert_close(op.to_dense(), features @ features.T + torch.diag(noise))


def test_inv_quad_logdet_float32(device):
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(40, 8, generator=gen).to(device)
    noise = torch.full((40,), 0.3, device=device)
    rhs = torch.randn(40, 1, generator=gen).to(device)
    inv_quad, logdet = operator(features, noise).inv_quad_logdet(rhs, logdet=True)
    ref = dense_inv_quad_logdet(features.double(), noise.double(), rhs.double())
    assert inv_quad.dtype == torch.float32
    torch.testing.assert_close(inv_quad.double(), ref[0].sum(-1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(logdet.double(), ref[1], rtol=1e-4, atol=1e-4)


def test_added_diag_plus_diag_stays_feature_space(device):
    features = torch.randn(10, 3, dtype=torch.float64, device=device)
    a, b = torch.rand(10, dtype=torch.float64, device=device), torch.rand(10, dtype=torch.float64, device=device)
    op = operator(features, a) + DiagLinearOperator(b)
    assert isinstance(op, FeatureRootAddedDiagLinearOperator)
    torch.testing.assert_close(op.to_dense(), features @ features.T + torch.diag(a + b))


# ------------------------------------------------------------ weighted_gram
@pytest.mark.parametrize("feature_batch, weight_batch", [((), ()), ((3,), (3,)), ((3,), ()), ((2, 1), (1, 4)), ((), (2,))])
def test_weighted_gram_forward_and_gradcheck(feature_batch, weight_batch, device):
    n, f = 7, 3
    features = torch.randn(*feature_batch, n, f, dtype=torch.float64, device=device, requires_grad=True)
    weights = torch.rand(*weight_batch, n, dtype=torch.float64, device=device, requires_grad=True)
    expected = (features * weights.unsqueeze(-1)).mT @ features
    torch.testing.assert_close(weighted_gram(features, weights), expected)
    assert torch.autograd.gradcheck(weighted_gram, (features, weights))


# --------------------------------------------------- sums and constant scaling
def test_feature_root_sum_concatenates_roots_and_corrections(device):
    kw = dict(dtype=torch.float64, device=device)
    a = FeatureRootLinearOperator(torch.randn(3, 9, 4, **kw), torch.rand(3, 9, **kw))
    b = FeatureRootLinearOperator(torch.randn(9, 2, **kw), torch.rand(9, **kw))
    c = FeatureRootLinearOperator(torch.randn(9, 5, **kw))
    total = a + b
    assert isinstance(total, FeatureRootLinearOperator)
    assert total.root.shape == (3, 9, 6)
    torch.testing.assert_close(total.to_dense(), a.to_dense() + b.to_dense())
    torch.testing.assert_close(total.variance_correction, a.variance_correction + b.variance_correction)
    mixed = b + c  # a missing correction counts as zero
    torch.testing.assert_close(mixed.variance_correction, b.variance_correction)
    assert (c + c).variance_correction is None


@pytest.mark.parametrize("constant", [2.5, torch.tensor(0.7)])
def test_mul_constant_scales_matrix_and_correction(constant, device):
    kw = dict(dtype=torch.float64, device=device)
    op = FeatureRootLinearOperator(torch.randn(8, 3, **kw), torch.rand(8, **kw))
    if torch.is_tensor(constant):
        constant = constant.to(**kw)
    scaled = op * constant
    assert isinstance(scaled, FeatureRootLinearOperator)
    c = float(constant)
    torch.testing.assert_close(scaled.to_dense(), c * op.to_dense())
    torch.testing.assert_close(scaled.variance_correction, c * op.variance_correction)


def test_mul_batched_constant_scales_each_batch(device):
    kw = dict(dtype=torch.float64, device=device)
    op = FeatureRootLinearOperator(torch.randn(2, 8, 3, **kw), torch.rand(2, 8, **kw))
    constant = torch.tensor([2.0, 3.0], **kw)
    scaled = op.mul(constant.view(2, 1, 1))
    assert isinstance(scaled, FeatureRootLinearOperator)
    torch.testing.assert_close(scaled.to_dense(), op.to_dense() * constant.view(2, 1, 1))
    torch.testing.assert_close(scaled.variance_correction, op.variance_correction * constant.view(2, 1))


def test_mul_negative_constant_falls_back_but_stays_correct_and_zero_is_refused(device):
    op = FeatureRootLinearOperator(torch.randn(6, 2, dtype=torch.float64, device=device))
    scaled = op * -1.5
    assert not isinstance(scaled, FeatureRootLinearOperator)  # no real root for c < 0
    torch.testing.assert_close(scaled.to_dense(), -1.5 * op.to_dense())
    with pytest.raises(NanError, match="multiplied by the constant 0"):  # an underflowed outputscale
        op * 0.0


@pytest.mark.parametrize("constant", [float("nan"), float("inf"), -float("inf")])
@pytest.mark.parametrize("as_tensor", [False, True])
def test_mul_non_finite_constant_is_refused_by_name(constant, as_tensor, device):
    """Before, a NaN constant (a diverged outputscale) was reported as 0 and an infinite one gave NaN entries."""
    op = FeatureRootLinearOperator(torch.randn(2, 6, 2, dtype=torch.float64, device=device))
    value = torch.tensor([1.0, constant], dtype=torch.float64, device=device).view(2, 1, 1) if as_tensor else constant
    with pytest.raises(NanError, match="NaN or ±Inf"):
        op * value


def test_scale_kernel_with_non_finite_outputscale_raises():
    x = torch.rand(20, 2, dtype=torch.float64)
    for raw in (float("nan"), float("inf")):
        kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, seed=0)).double()
        kernel.raw_outputscale.data.fill_(raw)
        with pytest.raises(NanError, match="outputscale"):
            kernel(x).to_dense()


@pytest.mark.parametrize("batch, n, f, columns", [((), 6, 64, 40), ((2,), 6, 64, 40), ((), 6, 64, 1), ((), 50, 8, 40)])
def test_matmul_takes_the_cheaper_order_with_the_same_values_and_gradients(batch, n, f, columns, monkeypatch, device):
    """ΦΦᵀR: with N ≪ F and a wide R the N × N Gram first (N²(F + k) flops), never Φ(ΦᵀR) (2NFk: a Kronecker
    product's dense form in BoTorch's HigherOrderGP training took 19× the exact kernel's time); otherwise Φ(ΦᵀR)."""
    from linear_operator.operators import RootLinearOperator

    widths = []
    original = RootLinearOperator._matmul

    def spy(self, rhs):
        widths.append(rhs.shape[-1])
        return original(self, rhs)

    monkeypatch.setattr(RootLinearOperator, "_matmul", spy)
    gen = torch.Generator().manual_seed(n + f)
    features = torch.randn(*batch, n, f, generator=gen, dtype=torch.float64).to(device).requires_grad_()
    rhs = torch.randn(*batch, n, columns, generator=gen, dtype=torch.float64).to(device)
    product = FeatureRootLinearOperator(features).matmul(rhs)
    gram_first = n * n * (f + columns) < 2 * n * f * columns
    assert widths == ([] if gram_first else [columns])
    expected = features @ (features.mT @ rhs)
    torch.testing.assert_close(product, expected, rtol=1e-12, atol=1e-12)
    (grad,) = torch.autograd.grad((product * rhs).sum(), features)
    (expected_grad,) = torch.autograd.grad((expected * rhs).sum(), features)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)


def test_a_gram_first_formed_without_gradients_is_formed_again_with_them():
    """Before: ``to_dense`` was cached whatever the grad mode (as linear_operator's ``RootLinearOperator``), so a
    ΦΦᵀ first formed under ``torch.no_grad()`` was returned to a later read with gradients: no graph, the gradient
    w.r.t. Φ silently missing.  Now one Gram per grad mode."""
    features = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    operator = FeatureRootLinearOperator(features)
    with torch.no_grad():
        without = operator.to_dense()
    dense = operator.to_dense()
    assert dense.requires_grad and not without.requires_grad
    (gradient,) = torch.autograd.grad(dense.sum(), features)
    torch.testing.assert_close(gradient, 2 * features.detach().sum(0, keepdim=True).expand(5, 3).clone())
    assert operator.to_dense() is dense  # cached within a grad mode


@pytest.mark.parametrize("budget", [None, 2**12], ids=["materialised", "chunked"])
@pytest.mark.parametrize("batch", [(), (2,)], ids=["single", "batched"])
def test_a_zero_outputscale_is_refused_not_solved_iteratively(budget, batch):
    """An outputscale of exactly 0 (a float32 raw_outputscale below about −104 underflows GPyTorch's softplus) made
    the scaled feature root fall back to linear_operator's generic product: the MLL went through CG and Lanczos with
    NaN preconditioners, silently.  It raises a NanError naming the outputscale (fit_mll steps back from it)."""
    torch.manual_seed(0)
    x = torch.rand(64, 2, dtype=torch.float64)
    y = torch.sin(4 * x.sum(-1))
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(32, seed=0), batch_shape=batch).double()
    zero = torch.zeros(batch, dtype=torch.float64)
    if batch:
        zero[0] = 1.0  # one member at 0 is enough
        zero = zero.flip(0)
    kernel.outputscale = zero
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double()
    mean = gpytorch.means.ConstantMean(batch_shape=batch).double()

    class Model(gpytorch.models.ExactGP):
        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(mean(inputs), kernel(inputs))

    model = Model(x, y.expand(*batch, 64), likelihood)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with rfgp.settings.memory_budget(budget) if budget else contextlib.nullcontext():
        with pytest.raises(NanError, match="outputscale is 0"):
            mll(model(x), y.expand(*batch, 64))
    kernel.outputscale = torch.full(batch, 0.5, dtype=torch.float64)
    with rfgp.settings.memory_budget(budget) if budget else contextlib.nullcontext():
        assert torch.isfinite(mll(model(x), y.expand(*batch, 64))).all()


@pytest.mark.parametrize("budget", [None, 2**12], ids=["materialised", "chunked"])
def test_batched_outputscales_around_an_unbatched_feature_kernel_keep_the_feature_root(budget):
    """ScaleKernel(batch_shape=(2,)) around an unbatched rfgp kernel: linear_operator hands the (2, 1, 1) outputscales
    to _mul_matrix, whose generic product formed the dense 2 × N × N covariance (O(N³) training behind a feature
    kernel).  The root is expanded and scaled per member instead: same MLL and gradients as the dense algebra."""
    torch.manual_seed(0)
    x = torch.rand(50, 2, dtype=torch.float64)
    y = torch.stack([torch.sin(4 * x.sum(-1)), torch.cos(3 * x[:, 0])])
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(32, seed=0), batch_shape=(2,)).double()
    kernel.outputscale = torch.tensor([1.0, 0.3], dtype=torch.float64)
    noise = torch.tensor([0.1, 0.05], dtype=torch.float64)

    def loss_and_grads(dense: bool):
        kernel.zero_grad()
        with rfgp.settings.memory_budget(budget) if budget else contextlib.nullcontext():
            covar = kernel(x, x).evaluate_kernel()
            assert dense or isinstance(covar, (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator))
            matrix = covar.to_dense() if dense else covar
            noisy = to_linear_operator(matrix) + DiagLinearOperator(noise.unsqueeze(-1).expand(2, 50))
            inv_quad, logdet = noisy.inv_quad_logdet(y.unsqueeze(-1), logdet=True)
        (inv_quad + logdet).sum().backward()
        return inv_quad + logdet, kernel.raw_outputscale.grad.clone(), kernel.base_kernel.raw_lengthscale.grad.clone()

    for ours, dense in zip(loss_and_grads(False), loss_and_grads(True)):
        torch.testing.assert_close(ours, dense, rtol=1e-10, atol=1e-10)
