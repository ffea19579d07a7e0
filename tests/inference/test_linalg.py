"""Feature statistics (ΦᵀWΦ, ΦᵀWR): the blocked symmetric Gram, the fused backward for per-point and
uniform weights, the outputscale folded into the weights, and the MLL of a ScaleKernel-wrapped
sketched kernel against dense algebra on both the materialised and the chunked path."""

import math

import gpytorch
import pytest
import torch
from linear_operator.operators import ConstantMulLinearOperator
from torch.utils.flop_counter import FlopCounterMode

import rfgp
from rfgp.inference import linalg
from rfgp.inference.linalg import GRAM_BLOCK, feature_statistics, fold_constant, symmetric_gram
from rfgp.inference.operators import FeatureRootLinearOperator, noise_weights
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel
from tests._cost import LargestTensor

F64 = torch.float64


@pytest.mark.parametrize("num_features", [GRAM_BLOCK - 3, 2 * GRAM_BLOCK, 2 * GRAM_BLOCK + 77])
@pytest.mark.parametrize("batch", [(), (2,)])
def test_symmetric_gram_equals_the_full_product(num_features, batch, device):
    features = torch.randn(*batch, 40, num_features, dtype=F64, device=device)
    weighted = features * torch.rand(*batch, 40, 1, dtype=F64, device=device)
    gram = symmetric_gram(weighted, features)
    torch.testing.assert_close(gram, weighted.mT @ features, rtol=1e-12, atol=1e-12)
    # the mirrored lower blocks are exact copies of the computed upper ones
    upper = torch.triu(gram, diagonal=GRAM_BLOCK)
    assert torch.equal(upper, torch.tril(gram, diagonal=-GRAM_BLOCK).mT)


def _naive_statistics(features, weights, rhs):
    w = weights.unsqueeze(-1)
    return (features * w).mT @ features, features.mT @ (rhs * w)


@pytest.mark.parametrize(("factor_batch", "rhs_batch"), [((), ()), ((3,), ()), ((), (2,)), ((2, 1), (4,))])
def test_cholesky_solve_by_triangular_solves_equals_torch(factor_batch, rhs_batch, device):
    """linalg.cholesky_solve (two triangular solves, no copy of the factor) gives torch.cholesky_solve's solution,
    batches broadcast alike."""
    g = torch.Generator().manual_seed(4)
    root = torch.randn(*factor_batch, 30, 45, generator=g, dtype=F64).to(device)
    chol = torch.linalg.cholesky(root @ root.mT + 0.1 * torch.eye(30, dtype=F64, device=device))
    rhs = torch.randn(*rhs_batch, 30, 3, generator=g, dtype=F64).to(device)
    torch.testing.assert_close(linalg.cholesky_solve(rhs, chol), torch.cholesky_solve(rhs, chol),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("columns", [0, 1, 3])
@pytest.mark.parametrize("feature_batch, weight_batch", [((), ()), ((), (3,)), ((2,), (2,))])
def test_feature_statistics_values_and_gradients(uniform, columns, feature_batch, weight_batch, device):
    n, f = 30, 2 * GRAM_BLOCK + 5  # blocked Gram
    gen = torch.Generator().manual_seed(columns)
    features = torch.randn(*feature_batch, n, f, generator=gen, dtype=F64).to(device).requires_grad_()
    weights = (0.5 + torch.rand(*weight_batch, 1 if uniform else n, generator=gen, dtype=F64)).to(device)
    weights.requires_grad_()
    rhs = torch.randn(n, columns, generator=gen, dtype=F64).to(device).requires_grad_()
    gram, cross = feature_statistics(features, weights, rhs)
    ref_gram, ref_cross = _naive_statistics(features, weights, rhs)
    torch.testing.assert_close(gram, ref_gram)
    torch.testing.assert_close(cross, ref_cross)

    grad_gram = torch.randn(gram.shape, generator=gen, dtype=F64).to(device)  # not symmetric on purpose
    grad_cross = torch.randn(cross.shape, generator=gen, dtype=F64).to(device)
    inputs = (features, weights, rhs)
    grads = torch.autograd.grad((gram * grad_gram).sum() + (cross * grad_cross).sum(), inputs, allow_unused=True)
    ref = torch.autograd.grad((ref_gram * grad_gram).sum() + (ref_cross * grad_cross).sum(), inputs, allow_unused=True)
    for g, r in zip(grads, ref):
        if r is None:
            assert g is None or not g.abs().any()
        else:
            torch.testing.assert_close(g, r)



@pytest.mark.parametrize("feature_shape, batch", [((1,), (8,)), ((), (8,)), ((2, 1), (2, 3)), ((1, 1), (2, 3))])
def test_statistics_of_copied_features_form_one_gram(feature_shape, batch, device):
    """Uniform weights over a batch in which Φ is one tensor expanded (T targets of one unbatched kernel, the
    likelihood's noise expanding Φ to their batch): Φᵀ Φ once per distinct Φ, the members' R as its columns — the
    same statistics and gradients (w.r.t. Φ's base, the weights and R) as from distinct copies, at one Gram's cost."""
    n, f = 40, 2 * GRAM_BLOCK + 5
    gen = torch.Generator().manual_seed(3)
    base = torch.randn(*feature_shape, n, f, generator=gen, dtype=F64).to(device).requires_grad_()
    weights = (0.5 + torch.rand(*batch, 1, generator=gen, dtype=F64)).to(device).requires_grad_()
    rhs = torch.randn(*batch, n, 2, generator=gen, dtype=F64).to(device).requires_grad_()
    grad_gram = torch.randn(*batch, f, f, generator=gen, dtype=F64).to(device)
    grad_cross = torch.randn(*batch, f, 2, generator=gen, dtype=F64).to(device)
    results = []
    for copied in (True, False):
        features = base * 1.0  # a non-leaf, as a kernel's features are
        features = features.expand(*batch, n, f) if copied else features.expand(*batch, n, f).contiguous()
        with FlopCounterMode(display=False) as counter:
            gram, cross = feature_statistics(features, weights, rhs)
            loss = (gram * grad_gram).sum() + (cross * grad_cross).sum()
            grads = torch.autograd.grad(loss, (base, weights, rhs))
        results.append((gram, cross, grads, counter.get_total_flops()))
    (gram, cross, grads, flops), (ref_gram, ref_cross, ref_grads, ref_flops) = results
    torch.testing.assert_close(gram, ref_gram)
    torch.testing.assert_close(cross, ref_cross)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)
    distinct, members = math.prod(feature_shape), math.prod(batch)  # Grams formed: distinct Φ against members
    assert flops <= ref_flops * distinct / members * 1.2


@pytest.mark.parametrize("uniform", [False, True])
@pytest.mark.parametrize("feature_batch, weight_batch", [((), ()), ((2,), (2,))])
@pytest.mark.parametrize("n", [37, 33], ids=["short-last-block", "one-row-last-block"])
def test_float64_statistics_of_float32_features_cast_row_blocks(uniform, feature_batch, weight_batch, n, monkeypatch,
                                                                 device):
    """``dtype=float64`` for float32 Φ: the statistics and their gradients are those of Φ cast whole, in blocks of
    max(F, CAST_BLOCK_ELEMENTS/F) rows (here F = 8 rows: 5 blocks of 37 or 33 rows, the last short), with Φ's
    gradient in float32; second derivatives too.  A last block of one row has per-point weights of shape (..., 1),
    which the backward took for uniform ones (w̄ missing: a TypeError; Φ̄ of that row without its 2w)."""
    monkeypatch.setattr(linalg, "CAST_BLOCK_ELEMENTS", 64)
    f = 8
    gen = torch.Generator().manual_seed(5)
    features = torch.randn(*feature_batch, n, f, generator=gen).to(device).requires_grad_()
    weights = (0.5 + torch.rand(*weight_batch, 1 if uniform else n, generator=gen, dtype=F64)).to(device)
    weights.requires_grad_()
    rhs = torch.randn(n, 2, generator=gen, dtype=F64).to(device).requires_grad_()
    assert len(linalg.cast_row_blocks(features, F64)) == 5
    gram, cross = feature_statistics(features, weights, rhs, dtype=F64)
    ref_gram, ref_cross = _naive_statistics(features.double(), weights, rhs)
    assert gram.dtype == cross.dtype == F64
    torch.testing.assert_close(gram, ref_gram)
    torch.testing.assert_close(cross, ref_cross)
    grad_gram = torch.randn(gram.shape, generator=gen, dtype=F64).to(device)
    grad_cross = torch.randn(cross.shape, generator=gen, dtype=F64).to(device)
    inputs = (features, weights, rhs)
    for create_graph in (False, True):
        grads = torch.autograd.grad((gram * grad_gram).sum() + (cross * grad_cross).sum(), inputs,
                                    retain_graph=True, create_graph=create_graph)
        ref = torch.autograd.grad((ref_gram * grad_gram).sum() + (ref_cross * grad_cross).sum(), inputs,
                                  retain_graph=True, create_graph=create_graph)
        assert grads[0].dtype == torch.float32
        for g, r in zip(grads, ref):
            torch.testing.assert_close(g, r)


@pytest.mark.parametrize("grad", [False, True], ids=["posterior", "mll-gradient"])
def test_float32_model_with_float64_statistics_holds_no_float64_copy_of_the_features(grad, monkeypatch):
    """A float32 model whose statistics are formed in float64 (u·tr(ΦᵀD⁻¹Φ) above the tolerance; here forced by
    tolerance 0) casts Φ one row block at a time: no float64 tensor of N × F elements, in the posterior caches nor
    in the MLL and its backward pass.  Before: Φ was cast whole (an N × F float64 copy, twice Φ's memory, plus the
    float64 gradient in the backward pass); at N = 15 000, F = 4 096 the peak RSS of the posterior was 993 MB above
    the model's, 801 MB now, and of an MLL + gradient 1 717 MB, 1 317 MB now."""
    monkeypatch.setattr(linalg, "CAST_BLOCK_ELEMENTS", 64 * 64)
    gen = torch.Generator().manual_seed(6)
    n, f = 1000, 64
    x = torch.rand(n, 2, generator=gen)
    y = torch.sin(4 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(f, seed=0))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel)
    model.train(grad)
    with rfgp.settings.float32_statistics_tolerance(0.0), LargestTensor(torch.float64) as largest, \
            torch.set_grad_enabled(grad):
        if grad:
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
            (-mll(model(x), y)).backward()
        else:
            model(x[:5]).variance
    assert 0 < largest.numel <= 64 * 64


def test_fold_constant_gives_the_statistics_of_the_scaled_features(device):
    features = torch.randn(2, 20, 6, dtype=F64, device=device)
    constant = torch.tensor([0.7, 1.9], dtype=F64, device=device)
    weights, rhs = torch.rand(2, 20, dtype=F64, device=device), torch.randn(20, 2, dtype=F64, device=device)
    folded = feature_statistics(features, *fold_constant(constant, weights, rhs))
    expected = _naive_statistics(features * constant[:, None, None], weights, rhs)
    for got, want in zip(folded, expected):
        torch.testing.assert_close(got, want)


def test_scale_kernel_constant_stays_out_of_the_features(device):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, input_dim=3, seed=0)).to(device=device, dtype=F64)
    kernel.outputscale = 2.5
    x = torch.randn(50, 3, dtype=F64, device=device)
    covar = kernel(x).evaluate_kernel()
    assert isinstance(covar, FeatureRootLinearOperator)
    assert isinstance(covar.root, ConstantMulLinearOperator)  # √s carried, Φ₀ not rescaled
    base = kernel.base_kernel(x).to_dense()
    torch.testing.assert_close(covar.to_dense(), 2.5 * base)


def test_homoscedastic_noise_gives_uniform_weights(device):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(device=device, dtype=F64)
    likelihood.noise = 0.3
    noise = likelihood.noise_covar(torch.zeros(7, 1, dtype=F64, device=device))
    weights = noise_weights(noise)
    assert weights.shape[-1] == 1
    torch.testing.assert_close(weights, torch.full_like(weights, 1 / 0.3))


@pytest.mark.parametrize("chunk_size", [None, 23])
def test_mll_and_gradients_match_dense_algebra(chunk_size, device):
    """-MLL of ScaleKernel(sketched RBF) + homoscedastic noise (uniform weights, folded outputscale)
    against log N(y; 0, s·ΦΦᵀ + σ²I) evaluated densely, with gradients for every hyperparameter."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 3, generator=gen, dtype=F64).to(device)
    y = torch.sin(x).sum(-1)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(600, ard_num_dims=3, seed=1))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(device=device, dtype=F64)
    model.covar_module.outputscale = 1.7
    model.likelihood.noise = 0.2
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters()]
    with rfgp.settings.chunk_size(chunk_size):
        loss = -mll(model(x), y)
    grads = torch.autograd.grad(loss, params)

    features = kernel.base_kernel.featurize(x)
    covar = kernel.outputscale * features @ features.mT + model.likelihood.noise * torch.eye(60, dtype=F64, device=device)
    mean = model.mean_module(x)
    ref_loss = -torch.distributions.MultivariateNormal(mean, covar).log_prob(y) / 60
    ref_grads = torch.autograd.grad(ref_loss, params)
    torch.testing.assert_close(loss, ref_loss)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r)


def test_squared_row_norms_equal_the_sum_of_squares_with_derivatives_of_every_order():
    rows = torch.randn(2, 6, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(0)).requires_grad_()
    assert torch.allclose(linalg.squared_row_norms(rows), rows.pow(2).sum(-1), rtol=1e-14, atol=0)
    assert torch.autograd.gradcheck(linalg.squared_row_norms, (rows,))
    assert torch.autograd.gradgradcheck(linalg.squared_row_norms, (rows,))


def test_squared_row_norms_second_derivative_at_a_zero_row_is_two():
    # vector_norm's own backward divides by the norm: NaN second derivatives where a Nyström row vanishes
    rows = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(linalg.squared_row_norms(rows).sum(), rows, create_graph=True)
    (second,) = torch.autograd.grad(grad.sum(), rows)
    assert torch.equal(grad, torch.zeros_like(rows)) and torch.equal(second, torch.full_like(rows, 2.0))


def test_squared_row_norms_go_through_torch_func_transforms():
    """``torch.func.grad``/``jacrev``/``hessian`` of a function of the row norms (a user's, or rfgp's diagonal under
    them) raised "it must override the setup_context staticmethod" where ``rows.pow(2).sum(-1)`` worked; forward mode
    (``hessian`` is ``jacfwd(jacrev)``) needs the Function's jvp.  Zero row included."""
    rows = torch.randn(4, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    rows[1] = 0.0

    def loss(squares):
        return lambda r: (squares(r).sin() * torch.arange(1.0, 5.0, dtype=r.dtype)).sum()

    reference = loss(lambda r: r.pow(2).sum(-1))
    for transform in (torch.func.grad, torch.func.jacrev, torch.func.hessian):
        torch.testing.assert_close(transform(loss(linalg.squared_row_norms))(rows), transform(reference)(rows),
                                   rtol=1e-12, atol=1e-14)
    batched = torch.func.vmap(torch.func.grad(loss(linalg.squared_row_norms)))(rows.expand(2, 4, 3))
    torch.testing.assert_close(batched, torch.func.grad(reference)(rows).expand(2, 4, 3), rtol=1e-12, atol=1e-14)
    assert torch.autograd.gradcheck(linalg.squared_row_norms, (rows.clone().requires_grad_(),), check_forward_ad=True)


def test_squared_row_norms_refuse_complex_rows():
    with pytest.raises(TypeError, match="real rows"):
        linalg.squared_row_norms(torch.ones(2, 3, dtype=torch.complex64))
