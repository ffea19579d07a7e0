"""DirichletClassificationLikelihood: transform, validation, structured batched solve, fantasies, state."""

import math
import re
from contextlib import nullcontext

import gpytorch
import pytest
import torch

from rfgp.inference import classification
from rfgp.inference.classification import (
    ChunkedClassNoiseFeatureLinearOperator,
    ClassNoiseFeatureLinearOperator,
    LabelBlockPlan,
    label_feature_statistics,
)
from rfgp.kernels.fourier import SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel

TOL = {torch.float32: 2e-4, torch.float64: 1e-10}


def _record_label_statistics(patch) -> list:
    """Spy on the shared-Φ structured solve: the list of feature sources it is called with."""
    calls = []
    patch.setattr(classification, "label_feature_statistics",
                  lambda *a, **k: calls.append(a[0]) or label_feature_statistics(*a, **k))
    return calls


def _problem(dtype, num_points=120, num_classes=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(num_points, 2, generator=gen, dtype=dtype)
    # class 3 is absent on purpose: num_classes must still create its regression
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    return x, labels, num_classes


def _model(x, labels, num_classes, dtype, num_features=24, learn_noise=True, kernel_seed=0):
    likelihood = DirichletClassificationLikelihood(
        labels, num_classes=num_classes, dtype=dtype, learn_additional_noise=learn_noise
    )
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=kernel_seed))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).to(dtype)
    with torch.no_grad():
        kernel.base_kernel.lengthscale = 0.7
        kernel.outputscale = 1.3
        mean.constant.copy_(torch.linspace(-1.0, 0.5, num_classes, dtype=dtype))
        if learn_noise:
            likelihood.second_noise_covar.noise = torch.linspace(0.05, 0.4, num_classes, dtype=dtype).unsqueeze(-1)
    return model, likelihood, kernel


def test_transform_matches_milios_formulas():
    labels = torch.tensor([0, 2, 2, 1])
    likelihood = DirichletClassificationLikelihood(labels, num_classes=4, alpha_epsilon=0.05, dtype=torch.float64)
    alpha = torch.full((4, 4), 0.05, dtype=torch.float64)
    alpha[labels, torch.arange(4)] += 1.0
    sigma2 = torch.log(1.0 / alpha + 1.0)
    assert likelihood.noise.shape == (4, 4) and likelihood.transformed_targets.shape == (4, 4)
    torch.testing.assert_close(likelihood.noise, sigma2, rtol=0, atol=1e-14)
    torch.testing.assert_close(likelihood.transformed_targets, alpha.log() - sigma2 / 2, rtol=0, atol=1e-14)
    # the absent class 3 sees only "off" noise log(1/α_ε + 1)
    assert torch.allclose(likelihood.noise[3], torch.full((4,), math.log(21.0), dtype=torch.float64))
    # identical to GPyTorch's transform where GPyTorch can express the problem (all classes present)
    reference = gpytorch.likelihoods.DirichletClassificationLikelihood(labels[:3], alpha_epsilon=0.05, dtype=torch.float64)
    ours = DirichletClassificationLikelihood(labels[:3], alpha_epsilon=0.05, dtype=torch.float64)
    torch.testing.assert_close(ours.noise, reference.noise)
    torch.testing.assert_close(ours.transformed_targets, reference.transformed_targets)


def test_noise_shapes_with_learned_noise_and_test_labels():
    labels = torch.tensor([0, 1, 1, 2, 0])
    likelihood = DirichletClassificationLikelihood(labels, learn_additional_noise=True)
    assert likelihood.num_classes == 3
    assert likelihood.second_noise_covar.noise.shape == (3, 1)
    assert likelihood.noise.shape == (3, 5)
    latent = gpytorch.distributions.MultivariateNormal(torch.zeros(3, 2), torch.eye(2).expand(3, 2, 2))
    observed = likelihood(latent, targets=torch.tensor([2, 0]))
    expected = 1.0 + likelihood.label_noise(torch.tensor([2, 0])) + likelihood.second_noise_covar.noise
    torch.testing.assert_close(observed.variance, expected)


@pytest.mark.parametrize(
    "labels, num_classes, error, match",
    [
        (torch.tensor([0.0, 1.5]), None, ValueError, "integer class labels"),
        (torch.tensor([0, -1, 1]), None, ValueError, "negative label -1"),
        (torch.tensor([0, 3, 1]), 3, ValueError, r"0\.\.2 \(num_classes=3\); got label 3"),
        (torch.zeros(2, 3, dtype=torch.long), None, ValueError, "1-D"),
        (torch.tensor([True, False]), None, TypeError, "dtype torch.bool"),
        ([0, 1], None, TypeError, "torch.Tensor"),
        (torch.zeros(4, dtype=torch.long), None, ValueError, "single class"),
        (torch.tensor([0, 1]), 1, ValueError, "num_classes must be ≥ 2"),
    ],
)
def test_labels_are_validated(labels, num_classes, error, match):
    with pytest.raises(error, match=match):
        DirichletClassificationLikelihood(labels, num_classes=num_classes)


def test_bad_alpha_and_fixed_noise_assignment_rejected():
    with pytest.raises(ValueError, match="alpha_epsilon"):
        DirichletClassificationLikelihood(torch.tensor([0, 1]), alpha_epsilon=0.0)
    likelihood = DirichletClassificationLikelihood(torch.tensor([0, 1]))
    with pytest.raises(AttributeError, match="learn_additional_noise"):
        likelihood.noise = torch.ones(2, 2)


@pytest.mark.parametrize("dtype, alpha, reason", [
    (torch.float32, 1e-40, "overflows"), (torch.float64, 1e-310, "overflows"),
    (torch.float32, 2e4, "min_fixed_noise"), (torch.float64, 1e7, "min_fixed_noise"),
])
def test_alpha_epsilon_whose_noise_the_model_cannot_hold_is_refused(dtype, alpha, reason):
    """An α_ε below the dtype's smallest normal number gave infinite noise and −∞ targets without a word; one whose
    on-class noise falls below gpytorch's min_fixed_noise had that noise rounded up by FixedGaussianNoise (a warning)
    but not by the structured solve: its marginal likelihood was −3.1e8 against −3.1e7 for the noise the likelihood
    reports (α_ε = 1e7, float64).  The ends of the accepted range still build."""
    labels = torch.tensor([0, 1, 1])
    with pytest.raises(ValueError, match=rf"alpha_epsilon must be within about .*got {re.escape(f'{alpha:g}')}: .*{reason}"):
        DirichletClassificationLikelihood(labels, alpha_epsilon=alpha, dtype=dtype)
    high = 1.0 / math.expm1(gpytorch.settings.min_fixed_noise.value(dtype)) - 1.0
    for edge in (torch.finfo(dtype).tiny, 0.999 * high):
        likelihood = DirichletClassificationLikelihood(labels, alpha_epsilon=edge, dtype=dtype)
        assert bool(torch.isfinite(likelihood.transformed_targets).all())
        assert bool((likelihood.noise >= gpytorch.settings.min_fixed_noise.value(dtype)).all())


@pytest.mark.parametrize("max_block_size", [None, 5])
def test_label_statistics_partition_the_gram_matrix_with_exact_gradients(max_block_size):
    gen = torch.Generator().manual_seed(1)
    labels = torch.cat((torch.zeros(37, dtype=torch.long), torch.full((3,), 2), torch.full((61,), 4)))
    labels = labels[torch.randperm(labels.numel(), generator=gen)]
    features = torch.randn(labels.numel(), 9, generator=gen, dtype=torch.float64, requires_grad=True)
    rhs = torch.randn(labels.numel(), 4, generator=gen, dtype=torch.float64, requires_grad=True)
    plan = LabelBlockPlan.from_labels(labels, 5, max_block_size)
    grams, projection = label_feature_statistics(features, plan, rhs, blocks_per_step=3)
    reference = torch.stack([features[labels == c].mT @ features[labels == c] for c in range(5)])
    torch.testing.assert_close(grams, reference, rtol=0, atol=1e-12)
    torch.testing.assert_close(projection, rhs.mT @ features, rtol=0, atol=1e-12)
    grad_grams = torch.randn(grams.shape, generator=gen, dtype=torch.float64)
    grad_projection = torch.randn(projection.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((grams * grad_grams).sum() + (projection * grad_projection).sum(), (features, rhs))
    reference_loss = (reference * grad_grams).sum() + ((rhs.mT @ features) * grad_projection).sum()
    for g, r in zip(grads, torch.autograd.grad(reference_loss, (features, rhs))):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)
    assert plan.num_blocks * plan.block_size <= labels.numel() * 5 / 4 + 5 * plan.block_size
    assert max_block_size is None or plan.block_size <= max_block_size


def test_structured_mll_and_gradients_equal_dense_gaussian(dtype, monkeypatch):
    calls = _record_label_statistics(monkeypatch)
    x, labels, num_classes = _problem(dtype)
    model, likelihood, kernel = _model(x, labels, num_classes, dtype)
    marginal = likelihood(model(x))
    assert isinstance(marginal.lazy_covariance_matrix, ClassNoiseFeatureLinearOperator)
    assert marginal.lazy_covariance_matrix.structure is not None
    targets = likelihood.transformed_targets
    params = [kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale, likelihood.second_noise_covar.raw_noise]
    structured = marginal.log_prob(targets)
    assert calls, "the shared-Φ structured solve was not used"
    grads = torch.autograd.grad(structured.sum(), params)
    prior = model(x)
    covar = kernel(x).to_dense().double() + torch.diag_embed(likelihood.noise.double())
    dense = torch.distributions.MultivariateNormal(prior.mean.double(), covar).log_prob(targets.double())
    dense_grads = torch.autograd.grad(dense.sum(), params)
    tol = TOL[dtype] * 50
    torch.testing.assert_close(structured.double(), dense, rtol=tol, atol=tol)
    for g, d in zip(grads, dense_grads):
        torch.testing.assert_close(g.double(), d.double(), rtol=tol * 10, atol=tol * 10)


def test_batched_kernel_takes_generic_path_with_same_answer():
    dtype = torch.float64
    x, labels, num_classes = _problem(dtype)
    likelihood = DirichletClassificationLikelihood(labels, num_classes=num_classes, dtype=dtype)
    batch = torch.Size([num_classes])
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(24, seed=0, batch_shape=batch), batch_shape=batch)
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel,
                         gpytorch.means.ConstantMean(batch_shape=batch)).to(dtype)
    with torch.no_grad():
        kernel.base_kernel.lengthscale = torch.linspace(0.5, 1.5, num_classes, dtype=dtype).view(-1, 1, 1)
    marginal = likelihood(model(x))
    # per-class lengthscales give one Φ per class: the shared-Φ shortcut must not be taken
    assert marginal.lazy_covariance_matrix._feature_source() is None
    covar = kernel(x).to_dense() + torch.diag_embed(likelihood.noise)
    dense = torch.distributions.MultivariateNormal(model(x).mean, covar)
    targets = likelihood.transformed_targets
    torch.testing.assert_close(marginal.log_prob(targets), dense.log_prob(targets), rtol=1e-10, atol=1e-10)


def _dense_posterior(kernel, likelihood, mean_constant, x, x_test):
    """Exact GP posterior per class with the (approximate) kernel matrix formed densely."""
    with torch.no_grad():
        k_train = kernel(x).to_dense() + torch.diag_embed(likelihood.noise)
        k_cross = kernel(x_test, x).to_dense()
        k_test = kernel(x_test, diag=True)
        residual = (likelihood.transformed_targets - mean_constant.unsqueeze(-1)).unsqueeze(-1)
        mean = (k_cross @ torch.linalg.solve(k_train, residual)).squeeze(-1) + mean_constant.unsqueeze(-1)
        solved = torch.linalg.solve(k_train, k_cross.mT.expand(k_train.shape[0], -1, -1))
        var = k_test - (k_cross * solved.mT).sum(-1)
    return mean, var


def test_batched_feature_space_posterior_equals_dense_exact_gp(dtype, monkeypatch):
    calls = _record_label_statistics(monkeypatch)
    x, labels, num_classes = _problem(dtype)
    model, likelihood, kernel = _model(x, labels, num_classes, dtype)
    x_test = torch.randn(9, 2, generator=torch.Generator().manual_seed(5), dtype=dtype)
    model.eval()
    with torch.no_grad():
        posterior = model(x_test)
    assert isinstance(model.prediction_strategy.lik_train_train_covar, ClassNoiseFeatureLinearOperator)
    assert calls, "the posterior caches did not come from the shared-Φ structured solve"
    xd, xtd = x.double(), x_test.double()
    model.double()
    mean, var = _dense_posterior(kernel, likelihood, model.mean_module.constant, xd, xtd)
    tol = TOL[dtype] * 20
    torch.testing.assert_close(posterior.mean.double(), mean, rtol=tol, atol=tol)
    torch.testing.assert_close(posterior.variance.double(), var, rtol=tol, atol=tol)


def test_fantasy_update_equals_refit_on_all_labels():
    dtype = torch.float64
    x, labels, num_classes = _problem(dtype)
    model, likelihood, _ = _model(x, labels, num_classes, dtype)
    x_new = torch.randn(5, 2, generator=torch.Generator().manual_seed(3), dtype=dtype)
    y_new = torch.tensor([3, 3, 0, 1, 2])  # includes the class absent from training
    x_test = torch.randn(6, 2, generator=torch.Generator().manual_seed(4), dtype=dtype)
    model.eval()
    with torch.no_grad():
        model(x_test)
        fantasy = model.get_fantasy_model(x_new, likelihood.transform_labels(y_new), noise=y_new)
        fantasy_post = fantasy(x_test)
    assert torch.equal(fantasy.likelihood.targets, torch.cat((labels, y_new)))
    refit, _, _ = _model(torch.cat((x, x_new)), torch.cat((labels, y_new)), num_classes, dtype)
    refit.eval()
    with torch.no_grad():
        refit_post = refit(x_test)
    torch.testing.assert_close(fantasy_post.mean, refit_post.mean, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(fantasy_post.variance, refit_post.variance, rtol=1e-9, atol=1e-9)
    with pytest.raises(TypeError, match="integer tensor"):
        likelihood.get_fantasy_likelihood(noise=torch.ones(2))
    with pytest.raises(ValueError, match="fantasy class labels"):
        likelihood.get_fantasy_likelihood()


def test_state_dict_round_trip_is_bit_exact(dtype):
    x, labels, num_classes = _problem(dtype)
    model, likelihood, _ = _model(x, labels, num_classes, dtype)
    x_test = torch.randn(4, 2, generator=torch.Generator().manual_seed(6), dtype=dtype)
    model.eval()
    with torch.no_grad():
        expected = likelihood.predict_proba(model(x_test), seed=3)
    other_labels = torch.zeros_like(labels).index_fill(0, torch.arange(3), 1)
    fresh, fresh_likelihood, _ = _model(x, other_labels, num_classes, dtype, kernel_seed=99)
    fresh.load_state_dict(model.state_dict())
    assert torch.equal(fresh_likelihood.noise, likelihood.noise)
    fresh.eval()
    with torch.no_grad():
        actual = fresh_likelihood.predict_proba(fresh(x_test), seed=3)
    assert torch.equal(actual, expected)
    assert actual.dtype == dtype


def _class_probabilities(kernel, x, labels, x_test, num_classes):
    dtype = torch.float64
    likelihood = DirichletClassificationLikelihood(labels, num_classes=num_classes, dtype=dtype)
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).to(dtype)
    with torch.no_grad():
        kernel.base_kernel.lengthscale = 0.8
        kernel.outputscale = 2.0
        mean.constant.fill_(-2.0)
    model.eval()
    with torch.no_grad():
        return likelihood.predict_proba(model(x_test), method="mean_field")


def test_large_feature_count_approaches_exact_kernel_dirichlet_gp():
    dtype = torch.float64
    gen = torch.Generator().manual_seed(11)
    x = torch.randn(300, 2, generator=gen, dtype=dtype)
    labels = ((x[:, 0] + 0.3 * torch.randn(300, generator=gen, dtype=dtype)) > 0).long() + (x[:, 1] > 0.7).long()
    x_test = torch.randn(200, 2, generator=gen, dtype=dtype)
    # GPyTorch's dense prediction path needs the kernel batched over the classes (same hyperparameters)
    batch = torch.Size([3])
    exact_kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)
    exact = _class_probabilities(exact_kernel, x, labels, x_test, 3)
    errors = []
    for num_features in (16, 128, 1024):
        sketched = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, method="orf", seed=1))
        probs = _class_probabilities(sketched, x, labels, x_test, 3)
        errors.append((probs - exact).abs().mean().item())
        agreement = (probs.argmax(-1) == exact.argmax(-1)).double().mean().item()
    assert errors[0] > errors[1] > errors[2]
    assert errors[2] < 0.01 and agreement >= 0.97


def _mll_grads_and_posterior(model, likelihood, kernel, x, x_test):
    targets = likelihood.transformed_targets
    params = [kernel.base_kernel.raw_lengthscale, kernel.raw_outputscale, likelihood.second_noise_covar.raw_noise,
              model.mean_module.constant]
    model.train()
    marginal = likelihood(model(x))
    mll = marginal.log_prob(targets).sum()
    grads = torch.autograd.grad(mll, params)
    model.eval()
    with torch.no_grad():
        posterior = model(x_test)
    return marginal.lazy_covariance_matrix, mll, grads, posterior.mean, posterior.variance


@pytest.mark.parametrize("chunk_size", [16, 50])
def test_chunked_structured_solve_equals_materialised(dtype, chunk_size, monkeypatch):
    # A chunked ΦΦᵀ (rfgp.settings.memory_budget) keeps the shared-Φ solve, accumulating the
    # per-label Grams chunk by chunk without ever materialising Φ: same MLL, gradients, posterior.
    import rfgp

    x, labels, num_classes = _problem(dtype)
    model, likelihood, kernel = _model(x, labels, num_classes, dtype)
    x_test = torch.randn(5, 2, dtype=dtype, generator=torch.Generator().manual_seed(3))
    covar, *reference = _mll_grads_and_posterior(model, likelihood, kernel, x, x_test)
    assert type(covar) is ClassNoiseFeatureLinearOperator

    def no_materialisation(self):
        raise AssertionError("the chunked training features were materialised")

    with rfgp.settings.chunk_size(chunk_size):
        assert isinstance(kernel(x).evaluate_kernel(), rfgp.inference.operators.ChunkedFeatureRootLinearOperator)
        with monkeypatch.context() as patch:
            calls = _record_label_statistics(patch)
            patch.setattr(rfgp.inference.operators.ChunkedFeatureRootLinearOperator, "features", no_materialisation)
            patch.setattr(rfgp.inference.operators.ChunkedFeatureRootLinearOperator, "to_dense", no_materialisation)
            covar, *chunked = _mll_grads_and_posterior(model, likelihood, kernel, x, x_test)
    assert type(covar) is ChunkedClassNoiseFeatureLinearOperator
    assert covar.structure.plan.block_size <= chunk_size
    # both the MLL and the posterior caches took the chunked structured path
    assert len(calls) == 2 and all(isinstance(c, rfgp.inference.operators.ChunkedFeatureRootLinearOperator) for c in calls)
    tol = TOL[dtype] * 50
    mll, grads, mean, variance = chunked
    ref_mll, ref_grads, ref_mean, ref_variance = reference
    torch.testing.assert_close(mll, ref_mll, rtol=tol, atol=tol)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=tol * 10, atol=tol * 10)
    torch.testing.assert_close(mean, ref_mean, rtol=tol, atol=tol)
    torch.testing.assert_close(variance, ref_variance, rtol=tol, atol=tol)


def _high_snr_results(outputscale: float, chunked: bool, tolerance: float | None = None):
    """(loss, gradient, posterior mean, variance) of a float32 and a float64 Dirichlet model, N = 1500, F = 512,
    lengthscale 0.3, and the statistics dtypes the float32 one chose."""
    import rfgp
    from rfgp.inference.statistics_precision import recorded_statistics_dtypes

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(1500, 2, generator=gen, dtype=torch.float64)
    labels = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long()
    x_test = torch.rand(20, 2, generator=gen, dtype=torch.float64)
    results, chosen = [], []
    setting = rfgp.settings.float32_statistics_tolerance(tolerance) if tolerance is not None else nullcontext()
    for dtype in (torch.float32, torch.float64):
        likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=dtype)
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(512, seed=0))
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
        model = ExactGPModel(x.to(dtype), likelihood.transformed_targets, likelihood, kernel, mean).to(dtype)
        kernel.base_kernel.lengthscale, kernel.outputscale = 0.3, torch.tensor(outputscale, dtype=torch.float64)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        with setting, rfgp.settings.chunk_size(200 if chunked else None), recorded_statistics_dtypes() as dtypes:
            loss = -mll(model(x.to(dtype)), likelihood.transformed_targets).sum()
            grads = torch.autograd.grad(loss, [kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale])
            model.eval()
            with torch.no_grad():
                posterior = model(x_test.to(dtype))
        chosen.append(dtypes)
        results.append([loss.detach(), torch.cat([g.reshape(-1) for g in grads]), posterior.mean, posterior.variance])
    return results, chosen[0]


@pytest.mark.parametrize("chunked", [False, True])
def test_float32_structured_solve_at_a_high_signal_to_noise_ratio_matches_float64(monkeypatch, chunked):
    """Outputscale 10⁵ over the Dirichlet noise (0.69 / 4.6): u·max_c tr(ΦᵀD_c⁻¹Φ) = 5.6 > 10⁻¹, so the per-label
    Grams are formed in float64 (rfgp.inference.statistics_precision; chunked: recomputed after the float32 pass that
    measured their traces), for the MLL and the posterior caches alike.  First (float32 Cholesky): 'not
    positive definite after repeatedly adding jitter up to 1e-4'; then, A_c factorised in float64 from float32
    statistics: MLL 1e-3, gradient 5e-2, posterior mean 5e-4 and variance 1.5e-3 from float64 (relative).  Now the
    float32 features' own rounding: MLL 1.8e-7, gradient 5e-5 (chunked 1.3e-4), mean 8e-6, variance 6e-6; with
    float32 statistics (tolerance ∞) 1e-3, 5e-2 (chunked 0.1), 5e-4, 1.7e-3.  Tolerances about eight times those."""
    calls = _record_label_statistics(monkeypatch)
    results, dtypes = _high_snr_results(1e5, chunked)
    assert len(calls) >= 4, "the structured solve was not used"
    assert dtypes == [torch.float64, torch.float64]
    assert results[0][2].dtype == results[0][3].dtype == torch.float32
    for value, reference, tol in zip(*results, (2e-6, 1e-3, 6e-5, 5e-5)):
        assert (value.double() - reference).norm() <= tol * reference.norm()


def test_float32_structured_solve_at_a_moderate_signal_to_noise_ratio_keeps_float32_statistics():
    """Outputscale 10 (the classifier's usual initial value): u·max_c tr(ΦᵀD_c⁻¹Φ) = 5.6·10⁻⁴ ≤ 10⁻¹, so the
    statistics stay float32 — the same computation as with the tolerance ∞, bit for bit."""
    default, dtypes = _high_snr_results(10.0, False)
    always_float32, _ = _high_snr_results(10.0, False, math.inf)
    assert dtypes == [torch.float32, torch.float32]
    for value, reference in zip(default[0], always_float32[0]):
        assert torch.equal(value, reference)


def test_float64_structured_solve_is_the_plain_cholesky_algebra_bit_for_bit():
    """Widening is a no-op in float64: the structured MLL terms and posterior caches are the plain Cholesky algebra
    on the same statistics, equal bit for bit."""
    dtype = torch.float64
    x, labels, num_classes = _problem(dtype)
    model, likelihood, kernel = _model(x, labels, num_classes, dtype)
    operator = likelihood(model(x)).lazy_covariance_matrix
    rhs = likelihood.transformed_targets.unsqueeze(-1)
    with torch.no_grad():
        inv_quad, logdet = operator.inv_quad_logdet(rhs, logdet=True, reduce_inv_quad=False)
        mean_cache, chol = operator.feature_space_caches(likelihood.transformed_targets)
        gram, projection, weighted_square, _ = operator._solve_statistics(operator._feature_source(), rhs)
        expected_chol = torch.linalg.cholesky(gram + torch.eye(gram.shape[-1], dtype=dtype))
        projected = torch.linalg.solve_triangular(expected_chol, projection, upper=False)
        structure = operator.structure
        counts = structure.plan.counts.to(dtype)
        noise_logdet = counts * structure.on.log() + (len(labels) - counts) * structure.off.log()
    assert torch.equal(inv_quad, weighted_square - projected.pow(2).sum(-2))
    assert torch.equal(logdet, 2.0 * torch.diagonal(expected_chol, dim1=-2, dim2=-1).log().sum(-1) + noise_logdet)
    assert torch.equal(chol, expected_chol)
    assert torch.equal(mean_cache, torch.cholesky_solve(projection, expected_chol, upper=False))


def test_float32_label_projection_is_accumulated_in_float64_partial_sums(monkeypatch):
    """VᵀΦ of the per-label statistics was summed over N = 10⁴ rows in float32 (one product per step of ≈ N/4 rows,
    the steps added in float32): a Maclaurin classifier (columns of large mean) at outputscale 50 over the Dirichlet
    noise (0.69 / 4.6) had its float32 MLL gradient 1.4·10⁻³ off the float64 statistics'; float64 partial sums of
    float32 row blocks (accumulated_project) bring it to 8.3·10⁻⁵."""
    import rfgp
    from rfgp.inference.statistics_precision import recorded_statistics_dtypes

    calls = _record_label_statistics(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(10_000, 3, generator=gen, dtype=torch.float64).float()
    labels = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=torch.float32)
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.MaclaurinRBFKernel(256, input_dim=3, seed=0))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).train()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.5, 50.0

    def gradient(tolerance):
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        with rfgp.settings.float32_statistics_tolerance(tolerance), recorded_statistics_dtypes() as chosen:
            loss = -mll(model(x), likelihood.transformed_targets).sum()
        grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
        return torch.cat([g.double().reshape(-1) for g in grads]), chosen

    grad64, _ = gradient(0.0)
    grad32, chosen = gradient(0.1)
    assert calls, "the structured solve was not used"
    assert chosen and set(chosen) == {torch.float32}  # the default rule keeps float32 statistics here
    assert float((grad32 - grad64).norm() / grad64.norm()) < 4e-4


def test_temperature_rescales_the_latents_before_the_softmax(dtype):
    """predict_proba at temperature T is E[softmax(f/T)], f/T ~ N(μ/T, σ²/T²): Monte Carlo with the same draws and
    mean field alike; T = 1 is the default and the posterior itself is untouched."""
    from rfgp.likelihoods.softmax import softmax_expectation_mc, softmax_expectation_mean_field

    x, labels, num_classes = _problem(dtype)
    model, likelihood, _ = _model(x, labels, num_classes, dtype)
    x_test = torch.randn(5, 2, generator=torch.Generator().manual_seed(6), dtype=dtype)
    model.eval()
    assert likelihood.temperature == 1.0
    likelihood.temperature = 0.4
    with torch.no_grad():
        posterior = model(x_test)
        mean, variance = posterior.mean.T, posterior.variance.T
        field = likelihood.predict_proba(posterior, method="mean_field")
        sampled = likelihood.predict_proba(posterior, seed=2)
    torch.testing.assert_close(field, softmax_expectation_mean_field(mean / 0.4, variance / 0.16))
    expected = softmax_expectation_mc(mean / 0.4, variance / 0.16, 1000, torch.Generator().manual_seed(2))[0]
    torch.testing.assert_close(sampled, expected)
    sharp = field.max(-1).values
    likelihood.temperature = 1.0
    with torch.no_grad():
        assert bool((likelihood.predict_proba(model(x_test), method="mean_field").max(-1).values < sharp).all())


def test_temperature_is_checked_and_round_trips_through_state_dict(dtype):
    x, labels, num_classes = _problem(dtype)
    for bad, error in [(0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), ("loo", TypeError),
                       (True, TypeError)]:
        with pytest.raises(error, match="temperature"):
            DirichletClassificationLikelihood(labels, num_classes=num_classes, temperature=bad)
        likelihood = DirichletClassificationLikelihood(labels, num_classes=num_classes)
        with pytest.raises(error, match="temperature"):
            likelihood.temperature = bad
    model, likelihood, _ = _model(x, labels, num_classes, dtype)
    likelihood.temperature = 0.1 + 0.2  # not a float32 number: saved bit for bit
    state = model.state_dict()
    assert state["likelihood.config_temperature"].dtype == torch.float64
    fresh, fresh_likelihood, _ = _model(x, labels, num_classes, dtype)
    fresh.load_state_dict(state)
    assert fresh_likelihood.temperature == 0.1 + 0.2
    x_test = torch.randn(4, 2, generator=torch.Generator().manual_seed(6), dtype=dtype)
    model.eval()
    fresh.eval()
    with torch.no_grad():
        assert torch.equal(fresh_likelihood.predict_proba(fresh(x_test)), likelihood.predict_proba(model(x_test)))
    # a state saved before the temperature existed loads and keeps the module's own
    del state["likelihood.config_temperature"]
    fresh_likelihood.temperature = 2.0
    fresh.load_state_dict(state)
    assert fresh_likelihood.temperature == 2.0
    # the fantasy likelihood keeps it
    assert likelihood.get_fantasy_likelihood(labels=labels[:2]).temperature == 0.1 + 0.2


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("alpha", [0.001, 0.01, 0.03, 0.05, 0.06, 0.1, 0.7, 2.0])
def test_structured_noise_levels_are_the_dense_noise_bit_for_bit(dtype, alpha):
    # the structured solve took its two levels from a float64 copy of the formula rounded to dtype, the dense
    # FixedNoise from the formula in dtype: one float32 ulp apart (α_ε = 0.1: on-class 0.64662719 vs 0.64662713)
    labels = torch.tensor([0, 2, 1, 1, 0, 2])
    likelihood = DirichletClassificationLikelihood(labels, 3, alpha_epsilon=alpha, dtype=dtype)
    structure = likelihood._two_level_noise()
    assert torch.equal(structure.per_point(), likelihood.noise_covar.noise)
