"""float32 training at a high signal-to-noise ratio: the feature-space MLL factorises its F × F capacitance in float64.

IGRF positions (3-D, Earth radii) with the hyperparameters of a float32 curl-free IGRF fit (lengthscale 0.43, noise
4.4·10⁻⁴): ‖ΦᵀD⁻¹Φ‖ ≈ 10⁷, about 1/eps of float32.
"""

import copy
import math
import re
from contextlib import nullcontext
from functools import partial

import gpytorch
import pytest
import torch
from gpytorch.kernels import ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood, MultitaskGaussianLikelihood
from linear_operator.operators import DiagLinearOperator
from linear_operator.utils.errors import NotPSDError

import rfgp
from rfgp.datasets import igrf_magnetic_field
from rfgp.inference.chunking import Featurizer, chunked_feature_statistics
from rfgp.inference.kernel_space import KernelSpaceNotPSDError, kernel_space_inv_quad_logdet
from rfgp.inference.linalg import CapacitanceNotPSDError, capacitance_inv_quad_logdet, feature_statistics
from rfgp.inference.operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator, noise_weights
from rfgp.inference.statistics_precision import recorded_statistics_dtypes, unit_roundoff
from rfgp.inference.triangular_statistics import (
    TriangularFeaturizer,
    chunked_triangular_statistics,
    triangular_features,
)
from rfgp.kernels import NystromKernel, SketchedCurlFreeKernel, SketchedRBFKernel
from rfgp.kernels.combinations import kernel_features
from rfgp.models import ExactGPModel, MultiOutputGPModel

F64 = torch.float64


def igrf_model(dtype, multi_output: bool, num_features: int, num_points: int = 1500):
    x, field = igrf_magnetic_field(num_points, altitude_km=(0.0, 1000.0), seed=0)
    if multi_output:
        kernel = ScaleKernel(SketchedCurlFreeKernel(num_features, input_dim=3, seed=0))
        likelihood = MultitaskGaussianLikelihood(num_tasks=3, rank=0, has_task_noise=False)
        model = MultiOutputGPModel(x.to(dtype), (field / 30).to(dtype), likelihood, kernel)
    else:
        kernel = ScaleKernel(SketchedRBFKernel(num_features, seed=0))
        likelihood = GaussianLikelihood()
        model = ExactGPModel(x.to(dtype), (field[:, 0] / 30).to(dtype), likelihood, kernel)
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.43, 15.6 if multi_output else 84.0
    likelihood.noise = 4.4e-4
    return model.to(dtype).train()


def loss_and_grads(model):
    kernel, likelihood = model.covar_module, model.likelihood
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    loss = -mll(model(*model.train_inputs), model.train_targets)
    params = [kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale, likelihood.raw_noise]
    grads = torch.autograd.grad(loss, params)
    return loss.double(), torch.cat([g.double().reshape(-1) for g in grads])


@pytest.mark.parametrize("multi_output, chunked", [(True, False), (False, False), (False, True)])
def test_float32_mll_and_gradient_at_a_high_signal_to_noise_ratio_match_float64(multi_output, chunked):
    """Before: NotPSDError ('not positive definite after repeatedly adding jitter up to 1e-4') from the float32
    Cholesky factor of I + ΦᵀD⁻¹Φ (F = 512, N·p = 4500 or 1500 rows: feature space).  Now it is factorised in
    float64; what remains is the rounding of the float32 statistics ΦᵀD⁻¹Φ at a condition number of ≈ 10⁷
    (measured: loss 2–4·10⁻³, gradient 4·10⁻² relative; with float64 statistics 10⁻⁴ and 10⁻³)."""
    budget = 2**18 if chunked else 2**40  # 2**18 bytes: chunks of 64 rows
    results = []
    for dtype in (torch.float32, F64):
        with rfgp.settings.memory_budget(budget):
            results.append(loss_and_grads(igrf_model(dtype, multi_output, 512)))
    (loss32, grads32), (loss64, grads64) = results
    assert abs(loss32 - loss64) <= 1e-2 * abs(loss64)
    assert (grads32 - grads64).norm() <= 0.1 * grads64.norm()


def test_float32_mll_that_cannot_be_factorised_says_what_to_do():
    """Outputscale 10⁴ at noise 10⁻⁴ (‖ΦᵀD⁻¹Φ‖ ≈ 10⁹): the rounding of the float32 ΦᵀD⁻¹Φ (≈ 100) exceeds the
    smallest eigenvalue 1 of I + ΦᵀD⁻¹Φ, which is indefinite even in float64.  Before: linear_operator's 'not positive
    definite after repeatedly adding jitter up to 1e-4'.  Now the error names the dtype, the scale of the rounding,
    the noise and the two ways out, and is a NotPSDError (rfgp.fit_mll restarts on it); float64 trains there.  By
    default the statistics of such a model are formed in float64 (u·tr(ΦᵀD⁻¹Φ) ≈ 10³ ≫ 10⁻¹), which factorises: the
    error needs float32 statistics forced (tolerance ∞), as chunked Nyström roots keep them."""
    models = {}
    for dtype in (torch.float32, F64):
        models[dtype] = igrf_model(dtype, False, 256)
        models[dtype].covar_module.outputscale, models[dtype].likelihood.noise = 1e4, 1e-4
    with pytest.raises(CapacitanceNotPSDError, match=r"(?s)torch\.float32 model.*even factorised in torch\.float64"
                       r".*smallest noise variance 0\.0001\b.*rounding errors of up to about u·tr\(ΦᵀD⁻¹Φ\) = "
                       r".*Train in float64.*raise the noise lower bound") as error, \
            rfgp.settings.float32_statistics_tolerance(math.inf):
        loss_and_grads(models[torch.float32])
    assert isinstance(error.value, NotPSDError)
    # the estimate is the statistics_precision rule's u·tr(ΦᵀD⁻¹Φ) (before: eps·(largest diagonal entry), 20 times
    # smaller than the rounding it stood for, which made A indefinite)
    features = models[F64].covar_module(models[F64].train_inputs[0]).evaluate_kernel().features()
    estimate = unit_roundoff(torch.float32) * features.square().sum() / 1e-4
    stated = float(re.search(r"u·tr\(ΦᵀD⁻¹Φ\) = ([0-9.e+]+)", str(error.value)).group(1))
    assert abs(stated - estimate) <= 0.01 * estimate
    loss, grads = loss_and_grads(models[F64])
    assert torch.isfinite(loss) and torch.isfinite(grads).all()
    with recorded_statistics_dtypes() as dtypes:
        loss32, grads32 = loss_and_grads(models[torch.float32])
    assert dtypes == [F64] and torch.isfinite(loss32) and torch.isfinite(grads32).all()


@pytest.mark.parametrize("multi_output, chunked", [(False, False), (True, False), (False, True), (True, True)])
def test_float32_mll_at_a_high_signal_to_noise_ratio_forms_float64_statistics(multi_output, chunked):
    """The IGRF fits above: u·tr(ΦᵀD⁻¹Φ) = 32 (single output) and 40 (curl-free, p = 3), far above the tolerance
    10⁻¹, so the float32 features' statistics are formed in float64 (rfgp.inference.statistics_precision; chunked:
    recomputed in float64 after the float32 pass that measured tr(ΦᵀD⁻¹Φ)).  Before: float32 statistics, loss
    4.5·10⁻³, 2.6·10⁻³ and 1.5·10⁻³, gradient 5.3·10⁻², 7.3·10⁻² and 1.2·10⁻² (relative) from float64.  Now what
    remains is the float32 features' own rounding (δ ≈ 1.6·10⁻⁶): measured loss 7·10⁻⁷, 2·10⁻⁵ and 7·10⁻⁷, gradient
    5·10⁻⁵, 3·10⁻⁵ and 5·10⁻⁵.  The chunked curl-free fit (ChunkedMultiOutputFeatureOperator) kept float32
    statistics until the rule reached it: I + ΦᵀD⁻¹Φ indefinite (CapacitanceNotPSDError) by default; now 2·10⁻⁵ and
    3·10⁻⁵, as unchunked.  The tolerances are five times those (at least 10·δ)."""
    budget = 2**18 if chunked else 2**40  # 2**18 bytes: chunks of 64 rows
    with rfgp.settings.memory_budget(budget):
        loss64, grads64 = loss_and_grads(igrf_model(F64, multi_output, 512))
    with recorded_statistics_dtypes() as dtypes, rfgp.settings.memory_budget(budget):
        loss32, grads32 = loss_and_grads(igrf_model(torch.float32, multi_output, 512))
    assert dtypes == [F64]
    assert abs(loss32 - loss64) <= 1e-4 * abs(loss64)
    assert (grads32 - grads64).norm() <= 3e-4 * grads64.norm()


@pytest.mark.parametrize("multi_output, chunked", [(False, False), (False, True), (True, False), (True, True)])
def test_float32_posterior_at_a_high_signal_to_noise_ratio_forms_float64_statistics(multi_output, chunked):
    """The posterior caches of the IGRF fits take the same rule as their MLL (u·tr(ΦᵀD⁻¹Φ) = 32 and 40).  Before:
    float32 statistics, single output: posterior mean 5.7·10⁻⁴ and variance 9·10⁻³ (relative) from float64;
    curl-free: 9·10⁻⁴ and 6.4·10⁻³ (multi-output caches, materialised), CapacitanceNotPSDError (chunked).  Now
    6·10⁻⁷ and 4–6·10⁻⁶ (single output), 1.4·10⁻⁶ and 6.5·10⁻⁶ (curl-free): the features' rounding.  Tolerances
    ten times those."""
    results = []
    for dtype in (F64, torch.float32):
        model = igrf_model(dtype, multi_output, 512).eval()
        with torch.no_grad(), recorded_statistics_dtypes() as dtypes, \
                rfgp.settings.memory_budget(2**18 if chunked else 2**40):
            posterior = model(model.train_inputs[0][:50] * 1.01)
        assert dtypes == ([] if dtype == F64 else [F64])
        assert posterior.mean.dtype == dtype
        results.append((posterior.mean.double(), posterior.variance.double()))
    for value, reference, tol in zip(results[1], results[0], (1e-5, 6e-5)):
        assert (value - reference).norm() <= tol * reference.norm()


def assert_float32_kept(model, loss_rtol: float) -> None:
    """The default tolerance keeps float32 statistics — the computation of the tolerance ∞, bit for bit — and the
    tolerance 0 forms float64 ones, moving the loss by at most ``loss_rtol`` (relative)."""
    results = {}
    for tolerance in (None, math.inf, 0.0):
        setting = rfgp.settings.float32_statistics_tolerance(tolerance) if tolerance is not None else nullcontext()
        with setting, recorded_statistics_dtypes() as dtypes:
            results[tolerance] = loss_and_grads(model)
        assert dtypes == [F64 if tolerance == 0 else torch.float32]
    assert all(torch.equal(a, b) for a, b in zip(results[None], results[math.inf]))
    assert abs(results[0.0][0] - results[None][0]) <= loss_rtol * abs(results[None][0])


def test_float32_mll_at_a_moderate_signal_to_noise_ratio_keeps_float32_statistics():
    """N = 2000, outputscale 1, noise 0.1: u·tr(ΦᵀD⁻¹Φ) = u·N/σ² = 1.2·10⁻³ ≤ 10⁻¹, so the statistics stay float32
    (the speed of float32), the same computation as with the tolerance ∞, bit for bit; with the tolerance 0 they are
    float64 and the loss moves by no more than the float32 features' rounding."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(2000, 3, generator=gen)
    y = torch.sin(3 * x[:, 0]) + 0.3 * torch.randn(2000, generator=gen)
    kernel = ScaleKernel(SketchedRBFKernel(256, seed=0))
    model = ExactGPModel(x, y, GaussianLikelihood(), kernel).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, model.likelihood.noise = 0.5, 1.0, 0.1
    assert_float32_kept(model, loss_rtol=1e-5)


def test_float64_inv_quad_logdet_is_the_plain_cholesky_algebra_bit_for_bit():
    """Widening is a no-op in float64: the same operations as before on the same statistics, equal bit for bit."""
    gen = torch.Generator().manual_seed(0)
    features = torch.randn(300, 40, generator=gen, dtype=F64)
    noise = torch.rand(300, generator=gen, dtype=F64) + 0.1
    rhs = torch.randn(300, 2, generator=gen, dtype=F64)
    operator = FeatureRootLinearOperator(features) + DiagLinearOperator(noise)
    inv_quad, logdet = operator.inv_quad_logdet(rhs, logdet=True, reduce_inv_quad=False)
    weights = noise_weights(operator._diag_tensor)
    gram, cross = operator._linear_op.feature_statistics(weights, rhs)
    chol = torch.linalg.cholesky(gram + torch.eye(40, dtype=F64))
    projected = torch.linalg.solve_triangular(chol, cross, upper=False)
    expected_inv_quad = (rhs.pow(2) * weights.unsqueeze(-1)).sum(-2) - projected.pow(2).sum(-2)
    expected_logdet = 2.0 * torch.diagonal(chol).log().sum() - weights.log().sum()
    assert torch.equal(inv_quad, expected_inv_quad) and torch.equal(logdet, expected_logdet)


@pytest.mark.parametrize("tolerance", [math.inf, 0.0], ids=["float32-statistics", "float64-statistics"])
@pytest.mark.parametrize("num_points", [100, 400])  # kernel space (N ≤ F) and feature space (N > F)
def test_float32_mll_gradient_matches_finite_differences(num_points, tolerance):
    """The float32 gradient (through the float64 factor and its rounding back, and through the casts of float32
    features to float64 statistics) equals central differences of the float64 MLL at a moderate condition number."""
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(num_points, 3, generator=gen, dtype=F64)
    y = torch.sin(3 * x[:, 0]) + 0.1 * torch.randn(num_points, generator=gen, dtype=F64)

    def model(dtype):
        kernel = ScaleKernel(SketchedRBFKernel(128, seed=0))
        likelihood = GaussianLikelihood()
        gp = ExactGPModel(x.to(dtype), y.to(dtype), likelihood, kernel).to(dtype).train()
        kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.5, 2.0, 0.01
        return gp

    with rfgp.settings.float32_statistics_tolerance(tolerance):
        _, grads32 = loss_and_grads(model(torch.float32))
    reference = model(F64)
    params = [reference.covar_module.base_kernel.raw_lengthscale, reference.covar_module.raw_outputscale,
              reference.likelihood.raw_noise]
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(reference.likelihood, reference)
    step, differences = 1e-5, []
    with torch.no_grad():
        for param in params:
            values = []
            for sign in (1, -1):
                param.add_(sign * step)
                values.append(-mll(reference(*reference.train_inputs), reference.train_targets))
                param.sub_(sign * step)
            differences.append((values[0] - values[1]) / (2 * step))
    torch.testing.assert_close(grads32, torch.stack(differences), rtol=2e-3, atol=1e-4)


@pytest.mark.parametrize("logdet", [True, False])
def test_capacitance_inv_quad_logdet_gradients_and_second_derivatives(logdet):
    """The closed-form backward (A⁻¹ from the factor) against finite differences, and its double backward."""
    gen = torch.Generator().manual_seed(2)
    root = torch.randn(2, 6, 9, generator=gen, dtype=F64).requires_grad_()  # ΦᵀD⁻¹Φ = XXᵀ: symmetric
    cross = torch.randn(2, 6, 3, generator=gen, dtype=F64).requires_grad_()

    def terms(root, cross):
        quad, logdet_term = capacitance_inv_quad_logdet(root @ root.mT, cross, logdet)
        return (quad, logdet_term) if logdet else quad

    assert torch.autograd.gradcheck(terms, (root, cross))
    assert torch.autograd.gradgradcheck(terms, (root, cross))


def test_float32_capacitance_terms_are_float64_with_float32_gradients():
    gen = torch.Generator().manual_seed(3)
    root = torch.randn(6, 9, generator=gen)
    gram, cross = (root @ root.mT).requires_grad_(), torch.randn(6, 2, generator=gen).requires_grad_()
    quad, logdet_term = capacitance_inv_quad_logdet(gram, cross, True)
    assert quad.dtype == logdet_term.dtype == F64
    (quad.sum() + logdet_term).backward()
    assert gram.grad.dtype == cross.grad.dtype == torch.float32
    reference = torch.eye(6, dtype=F64) + gram.detach().double()
    expected = torch.linalg.inv(reference) - (sol := torch.linalg.solve(reference, cross.detach().double())) @ sol.mT
    torch.testing.assert_close(gram.grad.double(), expected, rtol=1e-5, atol=1e-6)


def kernel_space_model(dtype, outputscale: float, noise: float, num_points: int = 1000, num_features: int = 2048):
    """A float32 or float64 ExactGP with N ≤ F (the N × N kernel-space path), 3-D inputs, lengthscale 0.5."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen, dtype=F64) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
    kernel = ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    likelihood = GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-9))
    model = ExactGPModel(x.to(dtype), y.to(dtype), likelihood, kernel).to(dtype).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.5, outputscale, noise
    return model


def test_float32_kernel_space_terms_at_a_high_signal_to_noise_ratio_are_float64_terms_of_the_same_features():
    """The N × N terms rᵀK⁻¹r and log|K| of K = sΦΦᵀ + D and their gradients (Φ, D, r, s) for float32 RBF features
    (N = 600, F = 1024) at s/σ² ≈ 7·10⁴: u·tr(sΦᵀD⁻¹Φ) = 2.5 > 10⁻¹, so K is formed, factorised and differentiated in
    float64 (rfgp.inference.kernel_space.covariance_dtype), and the terms and gradients are those of the float64
    computation on Φ.double() rounded to float32 (measured: 3·10⁻⁸ relative).  Before: all in float32, rᵀK⁻¹r off by
    0.7–2·10⁻² relative, log|K| by 1.5·10⁻⁴, the gradients by 4·10⁻² (s) to 0.16 (Φ)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(600, 3, generator=gen) * 2 - 1
    base = SketchedRBFKernel(1024, seed=0)
    base.lengthscale = 0.5
    with torch.no_grad():
        features = kernel_features(base, x)
    noise = 1e-4 * (1 + torch.rand(600, generator=gen))
    rhs = (torch.sin(3 * x[:, :1]) + 0.1 * torch.randn(600, 1, generator=gen))
    scale = torch.tensor(10.0)

    def terms(*inputs):
        inputs = [value.clone().requires_grad_() for value in inputs]
        inv_quad, logdet = kernel_space_inv_quad_logdet(inputs[0], inputs[1], inputs[2], True, inputs[3])
        grads = torch.autograd.grad(inv_quad.sum() + logdet, inputs)
        return (inv_quad, logdet), grads

    with recorded_statistics_dtypes() as dtypes:
        values32, grads32 = terms(features, noise, rhs, scale)
    values64, grads64 = terms(*(value.double() for value in (features, noise, rhs, scale)))
    assert dtypes == [F64]
    assert all(value.dtype == torch.float32 for value in (*values32, *grads32))
    for value, reference in zip((*values32, *grads32), (*values64, *grads64)):
        torch.testing.assert_close(value.double(), reference, rtol=2 * unit_roundoff(torch.float32),
                                   atol=2 * unit_roundoff(torch.float32) * reference.abs().max().item())


def test_float32_kernel_space_model_at_a_high_signal_to_noise_ratio_forms_float64_covariances():
    """N = 1000 ≤ F = 2048 (kernel space), outputscale 10 at noise 10⁻⁴: u·tr(sΦᵀD⁻¹Φ) = 6 > 10⁻¹.  Before: K formed
    and factorised in float32, MLL 1.6·10⁻⁴, gradient 1.3·10⁻² (relative), posterior mean 4.7·10⁻⁵ and variance
    1.8·10⁻² from the float64 model (with float64 features); now the MLL, its gradient and the posterior caches
    decide float64 (the factor's W and Q kept in float64): measured 10⁻⁹, 1.7·10⁻⁷, 10⁻⁷ and 1.2·10⁻⁶, the float32
    features' own rounding.  Tolerances about ten times those."""
    results = []
    for dtype in (torch.float32, F64):
        model = kernel_space_model(dtype, 10.0, 1e-4)
        with recorded_statistics_dtypes() as dtypes:
            loss, grads = loss_and_grads(model)
            model.eval()
            with torch.no_grad():
                posterior = model(model.train_inputs[0][:50] * 1.01)
                mean, variance = posterior.mean, posterior.variance
        strategy = model.prediction_strategy
        assert strategy.uses_kernel_space and strategy.kernel_space_cache[1].projection.dtype == F64
        assert dtypes == ([F64, F64] if dtype == torch.float32 else [])
        assert mean.dtype == variance.dtype == strategy.weight_samples(3).dtype == dtype
        results.append((loss, grads, mean.double(), variance.double()))
    (loss32, grads32, mean32, var32), (loss64, grads64, mean64, var64) = results
    assert abs(loss32 - loss64) <= 1e-6 * abs(loss64)
    assert (grads32 - grads64).norm() <= 2e-6 * grads64.norm()
    assert (mean32 - mean64).norm() <= 1e-6 * mean64.norm()
    assert (var32 - var64).norm() <= 1e-5 * var64.norm()


def test_float32_kernel_space_model_keeps_float32_at_a_moderate_signal_to_noise_ratio():
    """GPyTorch's default hyperparameters (σ² ≈ s): u·tr(sΦᵀD⁻¹Φ) ≈ u·N = 3·10⁻⁵, so K stays float32 — the same
    computation as with the tolerance ∞, bit for bit; with the tolerance 0 it is float64 and the loss moves by no more
    than float32's rounding."""
    model = kernel_space_model(torch.float32, 0.6931, 0.6932, num_points=500, num_features=1024)
    assert_float32_kept(model, loss_rtol=1e-6)


def test_float32_kernel_space_mll_that_cannot_be_factorised_says_what_to_do():
    """N = 200 ≤ F = 256 (the N × N kernel-space path), outputscale 10⁵ at noise 10⁻⁴: u·tr(sΦᵀD⁻¹Φ) ≈ 1.2·10⁷, so
    K formed in float32 (the tolerance ∞) fails whatever the BLAS's summation order.  Before (no rule): the default
    failed so, first with linear_operator's bare 'not positive definite after repeatedly adding jitter up to 1e-4',
    then with this error.  Now the default forms and factorises K in float64 and trains; forced float32 names the
    dtype, the rule's estimate, the noise and the ways out."""
    models = {dtype: kernel_space_model(dtype, 1e5, 1e-4, num_points=200, num_features=256)
              for dtype in (torch.float32, F64)}
    with pytest.raises(KernelSpaceNotPSDError, match=r"(?s)200 × 200 covariance.*kernel-space.*formed in "
                       r"torch\.float32.*u·tr\(sΦᵀD⁻¹Φ\) = .*smallest noise variance of 0\.0001\b.*Train in "
                       r"float64.*float32_statistics_tolerance\(0\).*raise the noise lower bound") as error, \
            rfgp.settings.float32_statistics_tolerance(math.inf), \
            pytest.warns(gpytorch.utils.warnings.NumericalWarning):  # linear_operator's jitter, tried first
        loss_and_grads(models[torch.float32])
    assert isinstance(error.value, NotPSDError)
    features = models[F64].covar_module.base_kernel(models[F64].train_inputs[0]).evaluate_kernel().features()
    estimate = unit_roundoff(torch.float32) * 1e5 * features.square().sum() / 1e-4
    stated = float(re.search(r"u·tr\(sΦᵀD⁻¹Φ\) = ([0-9.e+]+)", str(error.value)).group(1))
    assert abs(stated - estimate) <= 0.01 * estimate
    loss64, grads64 = loss_and_grads(models[F64])
    with recorded_statistics_dtypes() as dtypes:
        loss32, grads32 = loss_and_grads(models[torch.float32])
    assert dtypes == [F64]
    assert abs(loss32 - loss64) <= 1e-6 * abs(loss64)
    assert (grads32 - grads64).norm() <= 1e-5 * grads64.norm()


def igrf_task_noise_model(dtype):
    """The curl-free IGRF fit with correlated task noise Σ_T = σ²I + vvᵀ (rank 1), whitened before the statistics."""
    x, field = igrf_magnetic_field(1500, altitude_km=(0.0, 1000.0), seed=0)
    kernel = ScaleKernel(SketchedCurlFreeKernel(512, input_dim=3, seed=0))
    likelihood = MultitaskGaussianLikelihood(num_tasks=3, rank=1)
    model = MultiOutputGPModel(x.to(dtype), (field / 30).to(dtype), likelihood, kernel).to(dtype).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.43, 15.6, 4.4e-4
    with torch.no_grad():
        likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.02], [0.006], [-0.004]], dtype=dtype))
    return model


@pytest.mark.parametrize("chunked", [False, True])
def test_float32_correlated_task_noise_at_a_high_signal_to_noise_ratio_forms_float64_statistics(chunked):
    """Correlated task noise whitens the rows (Φ̃ = WΦ, D = I) and takes the same rule on tr(Φ̃ᵀΦ̃): u·tr ≫ 10⁻¹ here.
    Before, chunked: the whitened ChunkedMultiOutputFeatureOperator kept float32 statistics, and I + Φ̃ᵀΦ̃ was
    indefinite (CapacitanceNotPSDError); unchunked it already took the rule (float32 statistics: loss 1.5·10⁻³, gradient
    3·10⁻³).  Now both match float64: loss 5·10⁻⁶ and 2·10⁻⁶, gradient 3·10⁻⁶ and 9·10⁻⁶ (relative, unchunked and
    chunked); tolerances about five times those."""
    budget = 2**18 if chunked else 2**40
    with rfgp.settings.memory_budget(budget):
        loss64, grads64 = task_loss_and_grads(igrf_task_noise_model(F64))
    with recorded_statistics_dtypes() as dtypes, rfgp.settings.memory_budget(budget):
        loss32, grads32 = task_loss_and_grads(igrf_task_noise_model(torch.float32))
    assert dtypes == [F64]
    assert abs(loss32 - loss64) <= 3e-5 * abs(loss64)
    assert (grads32 - grads64).norm() <= 5e-5 * grads64.norm()


def task_loss_and_grads(model):
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = -mll(model(*model.train_inputs), model.train_targets)
    params = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(loss, params)
    return loss.double(), torch.cat([g.double().reshape(-1) for g in grads])


def nystrom_model(dtype, noise):
    """An ExactGP with Nyström features at 50 landmarks (Φ = K·L⁻ᵀ), N = 1500 in 3-D."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1500, 3, generator=gen, dtype=F64)
    kernel = ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(), x[:50].clone()))
    likelihood = GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-9))
    model = ExactGPModel(x.to(dtype), torch.sin(4 * x[:, 0]).to(dtype), likelihood, kernel).to(dtype).train()
    kernel.base_kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.3, 1.0, noise
    return model


@pytest.mark.parametrize("chunked", [False, True])
def test_float32_nystrom_statistics_at_a_high_signal_to_noise_ratio_are_formed_in_float64(chunked):
    """Nyström roots (materialised Φ = K·L⁻ᵀ, statistics with the backward fused through L) take the rule too:
    noise 10⁻⁶, u·tr(ΦᵀD⁻¹Φ) ≈ 90.  Before: float32 statistics, gradient 8.5·10⁻⁵ from float64 (relative); now
    4·10⁻⁶ (loss 2.2·10⁻⁵ → 1.1·10⁻⁵); the posterior caches decide alike.  Chunked (K(x_c, Z) per chunk, L once:
    chunked_triangular_statistics) the same, decided from tr(G) of the float32 pass."""
    def loss_and_all_grads(model):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        loss = -mll(model(*model.train_inputs), model.train_targets)
        params = [model.covar_module.base_kernel.base_kernel.raw_lengthscale, model.covar_module.raw_outputscale,
                  model.likelihood.raw_noise]
        return loss.double(), torch.cat([g.double().reshape(-1) for g in torch.autograd.grad(loss, params)])

    budget = 2**18 if chunked else 2**40  # 2**18 bytes: chunks of 64 rows
    with rfgp.settings.memory_budget(budget):
        loss64, grads64 = loss_and_all_grads(nystrom_model(F64, 1e-6))
    model = nystrom_model(torch.float32, 1e-6)
    with rfgp.settings.memory_budget(budget):
        covariance = model.covar_module(model.train_inputs[0]).evaluate_kernel()
    assert isinstance(covariance, ChunkedFeatureRootLinearOperator if chunked else FeatureRootLinearOperator)
    with recorded_statistics_dtypes() as dtypes, rfgp.settings.memory_budget(budget):
        loss32, grads32 = loss_and_all_grads(model)
        model.eval()
        with torch.no_grad():
            model(model.train_inputs[0][:10] * 1.01)
    assert dtypes == [F64, F64]
    assert abs(loss32 - loss64) <= 5e-5 * abs(loss64)
    assert (grads32 - grads64).norm() <= 2e-5 * grads64.norm()


def ill_conditioned_nystrom_model():
    """A float32 ExactGP over 256 Nyström landmarks of an RBF (ℓ = 0.3) among N = 2 000 points of [0, 1]³, noise 10⁻²,
    jitter 10⁻⁶: κ(L) ≈ 7·10³, u·tr(ΦᵀD⁻¹Φ) ≈ 0.012, so the default rule keeps float32 statistics."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2000, 3, generator=gen, dtype=F64)
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2]) + 0.1 * torch.randn(2000, generator=gen, dtype=F64)
    landmarks = x[torch.randperm(2000, generator=torch.Generator().manual_seed(1))[:256]].float()
    kernel = ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(), landmarks, jitter=1e-6))
    likelihood = GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-9))
    model = ExactGPModel(x.float(), y.float(), likelihood, kernel).train()
    kernel.base_kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.3, 1.0, 1e-2
    return model


@pytest.mark.parametrize("budget", [2**40, 2**21])  # 2**21 bytes: chunks of 512 rows
def test_float32_nystrom_gradients_with_an_ill_conditioned_landmark_factor(budget):
    """The backward of float32 Nyström statistics solves K̄ = Φ̄L⁻¹ per row: the M × M factors SL⁻¹ and L⁻ᵀH̄ of the
    fused form, rounded to float32 once for all rows, put the gradient (the lengthscale's) 7.5·10⁻³ (materialised) and
    5.3·10⁻³ (chunked) off the float64 statistics of the same model; now 2.6·10⁻⁴ and 1.5·10⁻⁴ (the float32
    statistics' own rounding, 1.2–4.3·10⁻⁴ at other chunk sizes).  The loss (2·10⁻⁵ per point) and the posterior mean
    and variance (≤ 5.4·10⁻⁵ relative) do not go through that backward and were as accurate before."""
    model = ill_conditioned_nystrom_model()

    def loss_and_grads(tolerance):
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        params = [p for p in model.parameters() if p.requires_grad]
        with rfgp.settings.float32_statistics_tolerance(tolerance), rfgp.settings.memory_budget(budget):
            loss = -mll(model(*model.train_inputs), model.train_targets)
            grads = torch.autograd.grad(loss, params)
        return loss.double(), torch.cat([g.double().reshape(-1) for g in grads])

    def posterior(tolerance):
        model.train()
        model.eval()
        with rfgp.settings.float32_statistics_tolerance(tolerance), rfgp.settings.memory_budget(budget), \
                torch.no_grad():
            output = model(model.train_inputs[0][:200] + 0.01)
            return output.mean.double(), output.variance.double()

    loss64, grads64 = loss_and_grads(0.0)
    with recorded_statistics_dtypes() as dtypes:
        loss32, grads32 = loss_and_grads(rfgp.settings.float32_statistics_tolerance.value())
    assert dtypes == [torch.float32]
    assert abs(loss32 - loss64) <= 1e-4
    assert (grads32 - grads64).norm() <= 1e-3 * grads64.norm()
    mean64, variance64 = posterior(0.0)
    mean32, variance32 = posterior(rfgp.settings.float32_statistics_tolerance.value())
    assert (mean32 - mean64).norm() <= 2e-4 * mean64.norm()
    assert (variance32 - variance64).norm() <= 2e-4 * variance64.norm()


def test_float32_weighted_square_of_the_targets_is_formed_with_the_float64_statistics():
    """rᵀD⁻¹r − ‖L⁻¹B‖² cancels at a high signal-to-noise ratio (outputscale 900, noise 10⁻³, targets of size 60):
    before, rᵀD⁻¹r was summed in float32 while B and L came from float64 statistics — the loss 5.3·10⁻³ relative off
    the float64 model's; now 10⁻⁹.  The noise gradient was 1.1·10⁻² off while D⁻¹ and r were cast to float64
    separately for the statistics and for rᵀD⁻¹r (each term's gradient rounded to float32 before they cancelled);
    cast once, 6·10⁻⁸.  The tolerances, 10⁻⁶ and 10⁻⁵, are a few float32 roundings of the loss and 170 times the
    gradient's error."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2000, 2, generator=gen, dtype=F64) * 4 - 2
    y = 30 * torch.sin(2 * x).sum(-1) + 5 + 0.01 * torch.randn(2000, generator=gen, dtype=F64)
    results = {}
    for dtype in (torch.float32, F64):
        kernel = ScaleKernel(SketchedRBFKernel(256, method="orf", seed=0))
        kernel.base_kernel.lengthscale, kernel.outputscale = 0.7, 900.0
        model = ExactGPModel(x.to(dtype), y.to(dtype), GaussianLikelihood(), kernel)
        model.likelihood.noise = 1e-3
        model = model.to(dtype).train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with recorded_statistics_dtypes() as recorded:
            loss = -mll(model(*model.train_inputs), model.train_targets)
        (noise_grad,) = torch.autograd.grad(loss, [model.likelihood.raw_noise])
        results[dtype] = float(loss), float(noise_grad)
        if dtype == torch.float32:
            assert recorded == [F64]  # the statistics are promoted
    (loss32, noise32), (loss64, noise64) = results[torch.float32], results[F64]
    assert abs(loss32 - loss64) <= 1e-6 * abs(loss64)
    assert abs(noise32 - noise64) <= 1e-5 * abs(noise64)


def _high_signal_to_noise_models():
    """(dtype, model, its ScaleKernel) in float32 and then float64, on the same data (y ≈ 5, N = 3 000) at the same
    hyperparameters (the float32 ones exactly: outputscale 0.69, noise 10⁻⁴, lengthscale 0.3)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(3000, 2, generator=gen, dtype=F64)
    y = 5 + torch.sin(6 * x[:, 0]) + 0.01 * torch.randn(3000, generator=gen, dtype=F64)
    x, y = x.float().double(), y.float().double()  # the same data in both precisions
    for dtype in (torch.float32, F64):
        kernel = ScaleKernel(SketchedRBFKernel(256, ard_num_dims=2, seed=0))
        model = ExactGPModel(x.to(dtype), y.to(dtype), GaussianLikelihood(), kernel).to(dtype)
        if dtype == torch.float32:
            model.likelihood.noise, kernel.base_kernel.lengthscale, kernel.outputscale = 1e-4, 0.3, 0.6931
            state = {name: value.double() if value.is_floating_point() else value
                     for name, value in model.state_dict().items()}
        else:
            model.load_state_dict(state)  # the float32 hyperparameters exactly
        yield dtype, model, kernel


def test_float32_statistics_fold_the_outputscale_in_float64():
    """B = Φ₀ᵀ(c²W)(R/c) for Φ = c·Φ₀ (ScaleKernel): with c²W and R/c rounded to float32 before the float64
    statistics, B was scaled by up to 2u, which rᵀD⁻¹r − ‖L⁻¹B‖² amplified (outputscale 0.69, noise 10⁻⁴, y ≈ 5,
    N = 3 000: rᵀ(K + D)⁻¹r 3 395.1 for 3 412.5, the loss 2.9·10⁻³ per point off the float64 model's); now c is
    folded in float64 and the loss is within 10⁻⁶ of the float64 model of the same data and hyperparameters.
    (A chunked Φ: :func:`test_float32_chunked_statistics_fold_the_outputscale_in_float64`.)"""
    losses = {}
    for dtype, model, kernel in _high_signal_to_noise_models():
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with torch.no_grad(), recorded_statistics_dtypes() as recorded:
            losses[dtype] = float(-mll(model(*model.train_inputs), model.train_targets))
        if dtype == torch.float32:
            assert recorded == [F64]
    assert abs(losses[torch.float32] - losses[F64]) <= 1e-6 * abs(losses[F64]) + 1e-6


def test_float32_chunked_statistics_fold_the_outputscale_in_float64():
    """The chunked counterpart of :func:`test_float32_statistics_fold_the_outputscale_in_float64`, under a memory
    budget that chunks Φ: the chunked statistics folded c²W and R/c in float32 before their float64 recomputation
    (the loss 2.9·10⁻³ per point off the float64 model's).  Now c, W and R enter the chunked Function unfolded and c
    is folded in the statistics' precision forward and backward: the loss and the gradients of the lengthscales and
    the output scale (before: 5 % off in the output scale's) agree with the float64 model of the same data and
    hyperparameters."""
    results = {}
    for dtype, model, kernel in _high_signal_to_noise_models():
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with rfgp.settings.memory_budget(2**20), recorded_statistics_dtypes() as recorded:
            output = model(*model.train_inputs)
            assert isinstance(output.lazy_covariance_matrix.evaluate_kernel(), ChunkedFeatureRootLinearOperator)
            loss = -mll(output, model.train_targets)
            params = [kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale]
            grads = torch.autograd.grad(loss, params)
        results[dtype] = float(loss.detach()), torch.cat([g.double().reshape(-1) for g in grads])
        if dtype == torch.float32:
            assert recorded == [F64]
    (loss32, grads32), (loss64, grads64) = results[torch.float32], results[F64]
    assert abs(loss32 - loss64) <= 1e-6 * abs(loss64) + 1e-6
    assert torch.allclose(grads32, grads64, rtol=1e-4, atol=1e-6), (grads32, grads64)


def _random_features(x, omega, phase):
    return torch.cos(x @ omega + phase)


def _rbf_cross(x, landmarks):
    return torch.exp(-torch.cdist(x, landmarks).square() / 0.18)


@pytest.mark.parametrize("kind", ["features", "nystrom"])
def test_chunked_float64_statistics_fold_the_constant_in_float64(kind):
    """Both chunked statistics Functions (random features and Nyström K(x)L⁻ᵀ) recomputed in float64 for float32
    features form (ΦᵀWΦ, ΦᵀWR) of Φ = c·Φ₀ with c²W and R/c folded in float64: equal to the float64 statistics of the
    same float32 Φ₀, c, W and R to float64 rounding, and their gradients to c, W and R to float32 rounding.  Before,
    c²W and R/c were rounded to float32 first: relative errors of ~10⁻⁷ in G and B."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(500, 2, generator=gen)
    if kind == "features":
        omega, phase = 3 * torch.randn(2, 40, generator=gen), 6.3 * torch.rand(40, generator=gen)
        unit = partial(_random_features, omega=omega, phase=phase)

        def make(constant):
            return Featurizer(unit, (), 40, torch.Size(), constant)

        def reference(constant):
            return unit(x).double() * constant
    else:
        landmarks = torch.rand(12, 2, generator=gen)
        cross = partial(_rbf_cross, landmarks=landmarks)
        chol = torch.linalg.cholesky(cross(landmarks) + 1e-3 * torch.eye(12))

        def make(constant):
            return TriangularFeaturizer(cross, lambda: chol, (), 12, torch.Size(), constant)

        def reference(constant):
            return triangular_features(cross(x).double(), chol.double()) * constant

    constant = torch.tensor(0.8317, requires_grad=True)
    weights = torch.full((1,), 1e4, requires_grad=True)  # uniform: 1/σ² of noise 10⁻⁴
    rhs = (5 + torch.randn(500, 1, generator=gen)).requires_grad_()
    grad_gram, grad_cross = torch.randn(2, 40 if kind == "features" else 12, 40 if kind == "features" else 12,
                                        generator=gen, dtype=F64).unbind(0)
    grad_cross = grad_cross[:, :1]
    with rfgp.settings.float32_statistics_tolerance(0.0):
        featurizer = make(constant)
        if kind == "features":
            gram, cross_stats = chunked_feature_statistics(featurizer, x, weights, rhs, 64, adaptive_precision=True)
        else:
            gram, cross_stats = chunked_triangular_statistics(featurizer, x, weights, rhs, 64, adaptive_precision=True)
    assert gram.dtype == cross_stats.dtype == F64
    grads = torch.autograd.grad((gram * grad_gram).sum() + (cross_stats * grad_cross).sum(), (constant, weights, rhs))
    leaves = [t.detach().double().requires_grad_() for t in (constant, weights, rhs)]
    features = reference(leaves[0])
    expected = feature_statistics(features, leaves[1], leaves[2])
    expected_grads = torch.autograd.grad((expected[0] * grad_gram).sum() + (expected[1] * grad_cross).sum(), leaves)
    for value, want in zip((gram, cross_stats), expected):
        assert torch.linalg.matrix_norm(value - want) <= 1e-12 * torch.linalg.matrix_norm(want)
    for grad, want in zip(grads, expected_grads):
        assert grad.dtype == torch.float32
        assert torch.allclose(grad.double(), want, rtol=1e-6, atol=0), (grad, want)


@pytest.mark.parametrize("chunked", [False, True])
def test_float32_cross_statistics_are_accumulated_in_float64_partial_sums(chunked):
    """B = ΦᵀWr summed over 10⁴ rows in one float32 product put a Maclaurin model's MLL gradient 3.7·10⁻³ off the float64
    statistics' (every Maclaurin column has a large mean: the terms round coherently); float64 partial sums of
    float32 row blocks bring it to ≈ 7·10⁻⁵, the loss being unchanged (benchmarks/results/float32_statistics_refined.md).
    The chunked case summed short chunks already (2·10⁻⁴ before): it guards that the partial sums keep it there."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(10_000, 3, generator=gen, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2]) + 0.1 * torch.randn(10_000, generator=gen,
                                                                                        dtype=torch.float64)
    kernel = ScaleKernel(rfgp.kernels.MaclaurinRBFKernel(256, input_dim=3, seed=0))
    model = ExactGPModel(x.float(), y.float(), GaussianLikelihood(), kernel).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, model.likelihood.noise = 0.5, 1.0, 1e-2

    def loss_and_gradient(tolerance):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        budget = rfgp.settings.memory_budget(2**21) if chunked else nullcontext()
        with rfgp.settings.float32_statistics_tolerance(tolerance), budget, recorded_statistics_dtypes() as chosen:
            loss = -mll(model(x.float()), y.float())
        grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        return loss.double(), torch.cat([g.double().reshape(-1) for g in grads]), chosen

    loss64, grad64, _ = loss_and_gradient(0.0)
    loss32, grad32, chosen = loss_and_gradient(0.1)
    assert chosen and set(chosen) == {torch.float32}  # the default rule keeps float32 statistics here
    assert float((grad32 - grad64).norm() / grad64.norm()) < 5e-4
    assert abs(float(loss32 - loss64)) < 1e-5  # per point: the float32 features' own rounding


def test_float32_multi_output_posterior_cross_statistics_are_accumulated_in_float64_partial_sums():
    """The materialised multi-output posterior cache summed RᵀD⁻¹r over its N·T = 2·10⁴ rows in one float32 product:
    an LCM of two Maclaurin sketches (columns of large mean) at noise 10⁻² had its float32 posterior mean 8.7·10⁻⁵
    off (relative; 5.8·10⁻⁴ at worst) the float64 statistics', 3.8·10⁻⁶ (1.9·10⁻⁵) with float64 partial sums."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(10_000, 3, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2]), torch.cos(2 * x[:, 1]) + x[:, 0]], -1)
    y = (y + 0.1 * torch.randn(10_000, 2, generator=gen, dtype=torch.float64)).float()
    test_x = torch.rand(500, 3, generator=gen, dtype=torch.float64).float()
    parts = [rfgp.kernels.SketchedDecomposableKernel(rfgp.kernels.MaclaurinRBFKernel(128, input_dim=3, seed=q),
                                                     num_tasks=2, rank=1) for q in range(2)]
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0, has_task_noise=False)
    model = MultiOutputGPModel(x.float(), y, likelihood, rfgp.kernels.SketchedLCMKernel(*parts))
    likelihood.noise = 1e-2
    for part in parts:
        part.data_covar_module.lengthscale = 0.5
        with torch.no_grad():
            part.task_covar_module.covar_factor.fill_(0.35)
        part.task_covar_module.var = torch.tensor(0.12)
    model.eval()

    def posterior_mean(tolerance):
        model.prediction_strategy = None
        with (torch.no_grad(), gpytorch.settings.skip_posterior_variances(),
              rfgp.settings.float32_statistics_tolerance(tolerance), recorded_statistics_dtypes() as chosen):
            return model(test_x).mean.double(), chosen

    mean64, _ = posterior_mean(0.0)
    mean32, chosen = posterior_mean(0.1)
    assert chosen and set(chosen) == {torch.float32}  # the default rule keeps float32 statistics here
    assert float((mean32 - mean64).norm() / mean64.norm()) < 2e-5


def _offset_model(noise: float, offset: float = 10.0, num_points: int = 500):
    """A float32 ExactGP (F = 256, ConstantMean at 0, targets offset + sin) and its ``.double()`` (the same draws)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen)
    y = offset + torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
    kernel = ScaleKernel(SketchedRBFKernel(256, seed=0))
    likelihood = GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x, y, likelihood, kernel).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.3, 1.0, noise
    return model, copy.deepcopy(model).double()


def _offset_loss_and_grads(model, chunked: bool):
    """(loss, gradients of raw lengthscale, raw outputscale, raw noise and the mean constant), in float64."""
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [model.covar_module.base_kernel.raw_lengthscale, model.covar_module.raw_outputscale,
              model.likelihood.raw_noise, model.mean_module.raw_constant]
    with rfgp.settings.chunk_size(125 if chunked else None):
        loss = -mll(model(*model.train_inputs), model.train_targets)
        grads = torch.autograd.grad(loss, params)
    return loss.double(), torch.stack([g.double().reshape(()) for g in grads])


@pytest.mark.parametrize("chunked", [False, True])
def test_float32_noise_and_mean_gradients_with_float64_statistics_match_float64(chunked):
    """With float64 statistics (noise 10⁻⁴: u·tr(sΦᵀD⁻¹Φ) ≈ 0.3), a float32 model's gradients are the float64 model's
    to the float32 features' own rounding.  The weights D⁻¹ and residual r used to be cast to float64 separately for
    the statistics and for rᵀD⁻¹r and log|D|; each term's gradient, about ‖r‖²/σ⁴ for the noise and r/σ² per point for
    the mean, was rounded to float32 before they cancelled: the noise gradient 12 % and the mean's 3.2·10⁻⁴ off
    (N = 500, F = 256, targets ≈ 10).  Now both are within 3·10⁻⁶ (the kernel-space path's, which casts once, 1.5·10⁻⁶);
    the tolerance 10⁻⁴ leaves 30 times that and is 10³ below the error it pins."""
    model, reference = _offset_model(1e-4)
    with recorded_statistics_dtypes() as recorded:
        loss, grads = _offset_loss_and_grads(model, chunked)
    assert recorded and set(recorded) == {F64}
    ref_loss, ref_grads = _offset_loss_and_grads(reference, chunked)
    assert abs(loss - ref_loss) <= 1e-6 * abs(ref_loss) + 1e-5
    assert ((grads - ref_grads).abs() <= 1e-4 * ref_grads.abs()).all(), (grads - ref_grads) / ref_grads


def _complex_offset_model():
    """A float32 complex-feature GP (degree-2 polynomial, F = 256, noise 10⁻⁴: float64 statistics), targets ≈ 10."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(600, 2, generator=gen)
    kernel = ScaleKernel(rfgp.kernels.SketchedPolynomialKernel(2, 256, weights="complex", complex_posterior=True,
                                                               seed=0))
    likelihood = GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x, 10 + torch.sin(4 * x[:, 0]), likelihood, kernel).train()
    likelihood.noise = 1e-4
    return model


def _dirichlet_model():
    """A float32 3-class Dirichlet GP at outputscale 3·10⁴ (u·max_c tr(ΦᵀD_c⁻¹Φ) > 0.1: float64 statistics)."""
    from rfgp.likelihoods import DirichletClassificationLikelihood

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(600, 2, generator=gen)
    labels = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, alpha_epsilon=1e-3, dtype=torch.float32)
    kernel = ScaleKernel(SketchedRBFKernel(256, seed=0))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).train()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.3, 3e4
    return model


@pytest.mark.parametrize("kind, chunk, tolerance", [("complex", None, 1e-3), ("dirichlet", None, 5e-3),
                                                    ("dirichlet", 150, 5e-3)])
def test_float32_mean_gradient_with_float64_statistics_matches_float64(kind, chunk, tolerance):
    """The complex-feature GP and Dirichlet classification cast the residual (and D⁻¹) to float64 once for the
    projections and rᵀD⁻¹r: the mean's gradient, 2·K⁻¹r summed from 2D⁻¹r and −2D⁻¹ΦA⁻¹B (each ≈ r/σ² per point),
    was rounded to float32 per term before they cancelled — 6.6·10⁻³ (complex) and 2.3·10⁻² (Dirichlet) off the
    float64 model; now 5.7·10⁻⁵ and 0.5–1.3·10⁻³, the float32 features' and per-class sums' own rounding.  The
    tolerances leave 4–17 times that and are 4–7 times below the errors they pin."""
    model = _complex_offset_model() if kind == "complex" else _dirichlet_model()
    reference = copy.deepcopy(model).double()
    results = []
    for candidate in (model, reference):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(candidate.likelihood, candidate)
        with rfgp.settings.chunk_size(chunk), recorded_statistics_dtypes() as recorded:
            loss = -mll(candidate(*candidate.train_inputs), candidate.train_targets).sum()
            (grad,) = torch.autograd.grad(loss, [candidate.mean_module.raw_constant])
        results.append(grad.double())
        if candidate is model:
            assert recorded and set(recorded) == {F64}
    grad32, grad64 = results
    assert (grad32 - grad64).norm() <= tolerance * grad64.norm()


def test_float32_correlated_task_noise_gradient_with_float64_statistics_matches_float64():
    """A multi-output model with correlated task noise (rank 1, noise 10⁻⁴: float64 statistics) whitens its residual,
    r̃ = C⁻¹r, which the statistics and r̃ᵀr̃ used through separate casts: the noise gradient was 1.4·10⁻² off the
    float64 model (N = 300, T = 2, targets ≈ 10), now 2.8·10⁻⁶; the tolerance 10⁻⁴ leaves 35 times that and is 140
    times below the error it pins."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(300, 2, generator=gen)
    y = 10 + torch.stack([torch.sin(3 * x[:, 0]), torch.cos(3 * x[:, 1])], -1)
    kernel = ScaleKernel(SketchedCurlFreeKernel(128, input_dim=2, seed=0))
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=1, has_task_noise=False,
                                             noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = MultiOutputGPModel(x, y, likelihood, kernel).train()
    kernel.base_kernel.lengthscale, likelihood.noise = 0.3, 1e-4
    grads = []
    for candidate in (model, copy.deepcopy(model).double()):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(candidate.likelihood, candidate)
        with recorded_statistics_dtypes() as recorded:
            loss = -mll(candidate(*candidate.train_inputs), candidate.train_targets)
            (grad,) = torch.autograd.grad(loss, [candidate.likelihood.raw_noise])
        grads.append(grad.double())
        if candidate is model:
            assert recorded and set(recorded) == {F64}
    assert (grads[0] - grads[1]).abs().max() <= 1e-4 * grads[1].abs().max()
