"""Complex-feature GP posterior (paper 000 App. D): real-arithmetic form against direct complex algebra."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features import PolynomialSketch
from rfgp.inference.complex_posterior import complex_feature_posterior
from rfgp.kernels import SketchedPolynomialKernel
from rfgp.kernels.complex_posterior_option import complex_kernel_posterior


def _direct(phi_train, y, noise, phi_test):
    """Eqs. 84–85 in complex arithmetic with N × N matrices, then real parts (Eqs. 86–87)."""
    k_train = phi_train @ phi_train.conj().mT  # K̂ᵢⱼ = φᵢᵀ conj φⱼ
    k_cross = phi_train @ phi_test.conj().mT  # k̂(xᵢ, x*)
    k_test = phi_test @ phi_test.conj().mT
    system = k_train + torch.diag(noise.to(k_train.dtype))
    mean = k_cross.conj().mT @ torch.linalg.solve(system, y.to(k_train.dtype))
    covar = k_test - k_cross.conj().mT @ torch.linalg.solve(system, k_cross)
    return mean.real, covar.real


@pytest.mark.parametrize("projection", ["rademacher", "gaussian", "srht"])
def test_real_arithmetic_form_equals_complex_gp(projection):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(25, 4, generator=g, dtype=torch.float64)
    x_test = torch.rand(7, 4, generator=g, dtype=torch.float64)
    y = torch.randn(25, generator=g, dtype=torch.float64)
    noise = 0.05 + torch.rand(25, generator=g, dtype=torch.float64)  # heteroscedastic
    phi = PolynomialSketch(3, 16, input_dim=4, offset=1.0, projection=projection, weights="complex", seed=1).double()
    mean, covar = complex_feature_posterior(phi(x), y, noise, phi(x_test), full_covariance=True)
    mean_direct, covar_direct = _direct(phi.complex_features(x), y, noise, phi.complex_features(x_test))
    assert torch.allclose(mean, mean_direct, rtol=1e-8, atol=1e-10)
    assert torch.allclose(covar, covar_direct, rtol=1e-8, atol=1e-10)
    _, variance = complex_feature_posterior(phi(x), y, noise, phi(x_test))
    assert torch.allclose(variance, covar.diagonal())


def test_complex_posterior_differs_from_real_gp_on_re_k():
    """The notes' warning: the complex GP is a different estimator from the GP on Re K̂."""
    g = torch.Generator().manual_seed(1)
    x, x_test = torch.rand(20, 3, generator=g, dtype=torch.float64), torch.rand(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(20, generator=g, dtype=torch.float64)
    psi = PolynomialSketch(2, 8, input_dim=3, offset=1.0, weights="complex", seed=0).double()
    mean, _ = complex_feature_posterior(psi(x), y, 0.1, psi(x_test))
    k = psi(x) @ psi(x).T + 0.1 * torch.eye(20, dtype=torch.float64)
    real_mean = psi(x_test) @ psi(x).T @ torch.linalg.solve(k, y)
    assert (mean - real_mean).abs().max() > 1e-3


def test_kernel_wrapper_folds_outputscale_and_float32_runs():
    x = torch.rand(30, 3)
    y = torch.randn(30)
    kernel = gpytorch.kernels.ScaleKernel(SketchedPolynomialKernel(2, 32, weights="complex", seed=0))
    kernel.outputscale = 2.0
    mean, variance = complex_kernel_posterior(kernel, x, y, 0.1, x[:5])
    assert mean.dtype == torch.float32 and mean.shape == (5,) and (variance > 0).all()
    phi = kernel.base_kernel.featurize(x) * 2.0**0.5
    mean64, _ = complex_feature_posterior(phi.double(), y.double(), 0.1, phi[:5].double())
    assert torch.allclose(mean.double(), mean64, rtol=1e-3, atol=1e-4)


def test_bad_shapes():
    with pytest.raises(ValueError, match="even width"):
        complex_feature_posterior(torch.rand(5, 3), torch.rand(5), 0.1, torch.rand(2, 3))
    with pytest.raises(ValueError, match="points"):
        complex_feature_posterior(torch.rand(5, 4), torch.rand(6), 0.1, torch.rand(2, 4))


# ---------------------------------------------------------------- GPyTorch path: complex_posterior=True
from rfgp.kernels import (  # noqa: E402
    FeatureSumKernel,
    SketchedExponentialKernel,
    SketchedRBFKernel,
    SketchedSphericalPolynomialKernel,
)


class _ExactGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _model(kernel, x, y, noise=0.3, outputscale=1.7):
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    scaled = gpytorch.kernels.ScaleKernel(kernel, batch_shape=kernel.batch_shape)
    model = _ExactGP(x, y, scaled, likelihood).to(x.dtype)
    # float64 tensors: a Python float would be rounded to float32 by GPyTorch's setters
    likelihood.noise = torch.tensor(noise, dtype=torch.float64)
    scaled.outputscale = torch.tensor(outputscale, dtype=torch.float64)
    return model, likelihood


def _predict(model, likelihood, x_test):
    model.eval()
    likelihood.eval()
    with torch.no_grad():
        latent = model(x_test)
    return latent.mean, latent.variance


def _direct_posterior(phi_c, y, noise, phi_c_test):
    """Eqs. 88–90 literally in complex128: B = I + ΦᴴΣ⁻¹Φ, μ = Re φ*ᵀB⁻¹ΦᴴΣ⁻¹y, k = Re φ*ᵀB⁻¹ conj φ*."""
    sigma_inv = torch.diag(torch.full((phi_c.shape[-2],), 1.0 / noise, dtype=torch.complex128))
    b = torch.eye(phi_c.shape[-1], dtype=torch.complex128) + phi_c.conj().mT @ sigma_inv @ phi_c
    mean = phi_c_test @ torch.linalg.solve(b, phi_c.conj().mT @ sigma_inv @ y.to(torch.complex128))
    covar = phi_c_test @ torch.linalg.solve(b, phi_c_test.conj().mT)
    return mean.real, covar.diagonal().real


def _complex_evidence(phi_c, y, noise):
    """log CN(y + 0i; 0, 2(Φ_CΦ_Cᴴ + σ²I)) in complex arithmetic (N × N)."""
    n = phi_c.shape[-2]
    covar = 2 * (phi_c @ phi_c.conj().mT + noise * torch.eye(n, dtype=torch.complex128))
    yc = y.to(torch.complex128)
    quad = (yc.conj() @ torch.linalg.solve(covar, yc)).real
    return -n * torch.log(torch.tensor(torch.pi, dtype=torch.float64)) - torch.linalg.slogdet(covar)[1] - quad


def _data(n=30, d=4, seed=0, dtype=torch.float64, unit=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n + 6, d, generator=g, dtype=torch.float64)
    if unit:
        x = x / x.norm(dim=-1, keepdim=True)
    y = torch.sin(3 * x.sum(-1)[:n]) + 0.1 * torch.randn(n, generator=g, dtype=torch.float64)
    return x[:n].to(dtype), y.to(dtype), x[n:].to(dtype)


@pytest.mark.parametrize("projection", ["rademacher", "srht"])
def test_gpytorch_posterior_and_mll_equal_direct_complex_gp(projection):
    x, y, x_test = _data()
    kernel = SketchedPolynomialKernel(3, 24, projection=projection, weights="complex", complex_posterior=True, seed=3)
    model, likelihood = _model(kernel, x, y)
    kernel.offset = 0.7
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    value = mll(model(x), y) * x.shape[0]
    value.backward()

    offset = kernel.offset.detach().requires_grad_(True)
    outputscale = model.covar_module.outputscale.detach().requires_grad_(True)
    phi_c = kernel.feature_map.complex_features(x, offset=offset) * outputscale.sqrt()
    direct = _complex_evidence(phi_c, y, 0.3)
    assert torch.allclose(value, direct, rtol=1e-10, atol=1e-8)
    direct.backward()  # chain rule to the raw parameters: d/d raw = d/d value · d value/d raw
    sigmoid = torch.nn.functional.sigmoid
    assert torch.allclose(kernel.raw_offset.grad.squeeze(), offset.grad * sigmoid(kernel.raw_offset.detach()).squeeze(),
                          rtol=1e-8)
    raw_scale = model.covar_module.raw_outputscale
    assert torch.allclose(raw_scale.grad, outputscale.grad * sigmoid(raw_scale.detach()), rtol=1e-8)

    mean, variance = _predict(model, likelihood, x_test)
    with torch.no_grad():
        phi_c, phi_c_test = (kernel.feature_map.complex_features(z, offset=kernel.offset) * 1.7**0.5 for z in (x, x_test))
    mean_direct, variance_direct = _direct_posterior(phi_c, y, 0.3, phi_c_test)
    assert torch.allclose(mean, mean_direct, rtol=1e-8, atol=1e-10)
    assert torch.allclose(variance, variance_direct, rtol=1e-8, atol=1e-10)


def test_option_matters_and_skip_posterior_variances():
    x, y, x_test = _data(seed=1)
    results = {}
    for flag in (False, True):
        kernel = SketchedPolynomialKernel(2, 16, weights="complex", complex_posterior=flag, seed=0)
        model, likelihood = _model(kernel, x, y, noise=0.1)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        results[flag] = (mll(model(x), y).item(), *_predict(model, likelihood, x_test))
        if flag:
            with gpytorch.settings.skip_posterior_variances(True), torch.no_grad():
                skipped = model(x_test)
            assert torch.equal(skipped.mean, results[flag][1])
            assert torch.count_nonzero(skipped.lazy_covariance_matrix.to_dense()) == 0
    assert abs(results[True][0] - results[False][0]) > 1e-2
    assert (results[True][1] - results[False][1]).abs().max() > 1e-3
    assert (results[True][2] - results[False][2]).abs().max() > 1e-3


def test_maclaurin_constant_is_a_complex_feature_with_zero_imaginary_part():
    """The real constant column enters the precision through Ψ° (an extra coordinate), not only Ψ."""
    x, y, x_test = _data(seed=2)
    kernel = SketchedExponentialKernel(33, weights="complex", bias_correction=False, complex_posterior=True,
                                       lengthscale_constraint=gpytorch.constraints.Positive(), seed=1)
    model, likelihood = _model(kernel, x, y)
    kernel.lengthscale = 2.0
    mean, variance = _predict(model, likelihood, x_test)
    feature_map = kernel.feature_map
    assert feature_map.has_constant

    def complex_features(z):  # [c, Re Φ₁ + i Im Φ₁, …] rebuilt from the documented output layout
        out = feature_map(z / 2.0).to(torch.complex128) * 1.7**0.5
        parts, start = [out[:, :1]], 1
        for width in feature_map.widths:
            if width:
                parts.append(out[:, start:start + width] + 1j * out[:, start + width:start + 2 * width])
                start += 2 * width
        return torch.cat(parts, dim=-1)

    with torch.no_grad():
        mean_direct, variance_direct = _direct_posterior(complex_features(x), y, 0.3, complex_features(x_test))
    assert torch.allclose(mean, mean_direct, rtol=1e-8, atol=1e-10)
    assert torch.allclose(variance, variance_direct, rtol=1e-8, atol=1e-10)


def test_spherical_orthogonal_complex_features():
    x, y, x_test = _data(d=5, seed=3, unit=True)
    kernel = SketchedSphericalPolynomialKernel(3, 32, method="srf_orth_complex", complex_posterior=True, seed=0)
    model, likelihood = _model(kernel, x, y)
    mean, variance = _predict(model, likelihood, x_test)
    with torch.no_grad():
        phi_c, phi_c_test = (kernel.feature_map.complex_features(z).to(torch.complex128) * 1.7**0.5 for z in (x, x_test))
    mean_direct, variance_direct = _direct_posterior(phi_c, y, 0.3, phi_c_test)
    correction = kernel.variance_correction(x_test)
    correction = 0.0 if correction is None else 1.7 * correction
    assert torch.allclose(mean, mean_direct, rtol=1e-8, atol=1e-10)
    assert torch.allclose(variance, variance_direct + correction, rtol=1e-8, atol=1e-10)


def test_real_weights_are_rejected():
    with pytest.raises(ValueError, match="complex_posterior=True.*weights='real'"):
        SketchedPolynomialKernel(2, 16, weights="real", complex_posterior=True)
    with pytest.raises(ValueError, match="complex_posterior=True.*method='srf_orth'"):
        SketchedSphericalPolynomialKernel(2, 16, method="srf_orth", complex_posterior=True)
    with pytest.raises(ValueError, match="complex_posterior=True.*method='rff'"):
        SketchedRBFKernel(16, method="rff", complex_posterior=True)
    with pytest.raises(ValueError, match="complex_posterior=True.*weights='real'"):
        SketchedExponentialKernel(16, weights="real", complex_posterior=True)
    with pytest.raises(TypeError, match="complex_posterior must be True or False"):
        SketchedPolynomialKernel(2, 16, weights="complex", complex_posterior=1)


def test_sums_are_refused_rather_than_silently_real():
    x = torch.rand(10, 3, dtype=torch.float64)
    k1 = SketchedPolynomialKernel(2, 8, weights="complex", complex_posterior=True, seed=0).double()
    k2 = SketchedPolynomialKernel(3, 12, weights="complex", complex_posterior=True, seed=1).double()
    real = SketchedPolynomialKernel(2, 8, weights="real", seed=0).double()
    for kernels in ((k1, k2), (k1, real), (real, k1)):
        with pytest.raises(ValueError, match="complex_posterior"):
            gpytorch.kernels.AdditiveKernel(*kernels)(x).to_dense()
    with pytest.raises(ValueError, match=r"kernels\[1\] has complex_posterior=True"):
        FeatureSumKernel(real, gpytorch.kernels.ScaleKernel(k1))


def test_batch_shapes_and_float32():
    x, y, x_test = _data(seed=5)
    y = torch.stack((y, -2 * y))
    kernel = SketchedPolynomialKernel(2, 16, weights="complex", complex_posterior=True, batch_shape=torch.Size([2]),
                                      seed=0)
    model, likelihood = _model(kernel, x, y)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([2])).double()
    likelihood.noise = torch.tensor(0.3, dtype=torch.float64)
    model.likelihood = likelihood
    mean, variance = _predict(model, likelihood, x_test)
    assert mean.shape == (2, x_test.shape[0])
    phi, phi_test = (kernel.featurize(z) * 1.7**0.5 for z in (x, x_test))
    for b in range(2):
        mean_ref, variance_ref = complex_feature_posterior(phi[b].detach(), y[b], 0.3, phi_test[b].detach())
        assert torch.allclose(mean[b], mean_ref, rtol=1e-8, atol=1e-10)
        assert torch.allclose(variance[b], variance_ref, rtol=1e-8, atol=1e-10)

    model32, likelihood32 = _model(
        SketchedPolynomialKernel(2, 16, weights="complex", complex_posterior=True, seed=0), x.float(), y[0].float())
    mean32, variance32 = _predict(model32, likelihood32, x_test.float())
    assert mean32.dtype == torch.float32
    assert torch.allclose(mean32.double(), mean[0], rtol=1e-3, atol=1e-4)
    assert torch.allclose(variance32.double(), variance[0], rtol=1e-3, atol=1e-4)


def test_state_dict_round_trip():
    x, y, x_test = _data(seed=6)

    def build(seed):
        kernel = SketchedPolynomialKernel(3, 16, weights="complex", complex_posterior=True, seed=seed)
        return _model(kernel, x, y)

    model, likelihood = build(0)
    model.covar_module.base_kernel.offset = 0.4
    mean, variance = _predict(model, likelihood, x_test)
    fresh, fresh_likelihood = build(7)
    assert not torch.equal(_predict(fresh, fresh_likelihood, x_test)[0], mean)
    fresh.load_state_dict(model.state_dict())
    fresh_mean, fresh_variance = _predict(fresh, fresh_likelihood, x_test)
    assert torch.equal(fresh_mean, mean) and torch.equal(fresh_variance, variance)


def test_float32_complex_gp_at_a_high_signal_to_noise_ratio_matches_float64():
    """N = 500, 2m = 64, degree 3, outputscale 30, noise 10⁻⁴: ‖ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°‖ ≈ 10⁹.  Before: the float32
    Cholesky factor of A broke down (linear_operator's 'not positive definite after repeatedly adding jitter up to
    1e-4') in the MLL, the posterior caches and complex_feature_posterior.  Now A is factorised in float64 (the
    shared capacitance helpers); measured against float64: evidence 1e-3, posterior mean 1e-3 and variance 1e-4
    relative.  The outputscale gradient (terms of size ≈ 2m that cancel to 10⁻²) is off by a few 10⁻² absolute
    before and after widening wherever float32 factorised: the rounding of the float32 statistics bounds it."""
    results = []
    for dtype in (torch.float32, torch.float64):
        x, y, x_test = _data(n=500, dtype=dtype)
        kernel = SketchedPolynomialKernel(3, 64, weights="complex", complex_posterior=True, seed=3)
        model, likelihood = _model(kernel, x, y, noise=1e-4, outputscale=30.0)
        evidence = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
        (grad,) = torch.autograd.grad(evidence, model.covar_module.raw_outputscale)
        mean, variance = _predict(model, likelihood, x_test)
        with torch.no_grad():
            phi, phi_test = (kernel.featurize(z) * 30.0**0.5 for z in (x, x_test))
        direct = complex_feature_posterior(phi, y, 1e-4, phi_test)
        results.append([evidence.detach(), mean, variance, *direct, grad])
    *values, grad32 = results[0]
    *references, grad64 = results[1]
    for value, reference in zip(values, references):
        assert (value.double() - reference).norm() <= 1e-2 * reference.norm()
    assert torch.isfinite(grad32) and (grad32.double() - grad64).abs() <= 0.5


def _complex_high_snr_model(dtype):
    """N = 1500 points, complex polynomial features (F = 256), noise 10⁻⁵: u·tr(ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°) ≫ 10⁻¹."""
    x, y, _ = _data(n=1500, d=4)
    kernel = SketchedPolynomialKernel(2, 256, weights="complex", complex_posterior=True, seed=0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-9))
    model = _ExactGP(x.to(dtype), y.to(dtype), gpytorch.kernels.ScaleKernel(kernel), likelihood).to(dtype)
    likelihood.noise = torch.tensor(1e-5, dtype=torch.float64)
    kernel.offset = 1.0
    return model.train(), likelihood


def test_float32_complex_posterior_at_a_high_signal_to_noise_ratio_forms_float64_statistics():
    """The complex-GP evidence and posterior caches take the adaptive precision of rfgp.inference.statistics_precision
    on 2·Σᵢ‖ψᵢ‖²/σᵢ² = tr(ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°) (u·tr = 78).  Before: float32 statistics, I + ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°
    indefinite (CapacitanceNotPSDError); now float64 ones: loss, gradient and posterior mean 1·10⁻⁷, 5·10⁻⁸ and
    1.4·10⁻⁷ from float64 (relative); tolerances about ten times those."""
    from rfgp.inference.statistics_precision import recorded_statistics_dtypes

    results = []
    for dtype in (torch.float64, torch.float32):
        model, likelihood = _complex_high_snr_model(dtype)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        with recorded_statistics_dtypes() as dtypes:
            loss = -mll(model(*model.train_inputs), model.train_targets)
            grads = torch.autograd.grad(loss, [p for p in model.parameters() if p.requires_grad])
            model.eval()
            with torch.no_grad():
                mean = model(model.train_inputs[0][:20] * 1.01).mean
        assert dtypes == ([] if dtype == torch.float64 else [torch.float64, torch.float64])
        results.append((loss.double(), torch.cat([g.double().reshape(-1) for g in grads]), mean.double()))
    (loss64, grads64, mean64), (loss32, grads32, mean32) = results
    assert abs(loss32 - loss64) <= 1e-6 * abs(loss64)
    assert (grads32 - grads64).norm() <= 1e-6 * grads64.norm()
    assert (mean32 - mean64).norm() <= 1.5e-6 * mean64.norm()


@pytest.mark.parametrize("bad", [0.0, -0.1, float("nan")])
def test_non_positive_noise_is_refused_by_name(bad):
    """A zero, negative or NaN noise variance is refused naming it: the complex GP's evidence was NaN for a negative
    one (and its capacitance "not finite" for a zero one), while the real feature GP refused it."""
    from linear_operator.operators import DiagLinearOperator

    from rfgp.core.validation import InvalidValueError
    from rfgp.inference.complex_posterior import ComplexFeatureRootLinearOperator

    g = torch.Generator().manual_seed(0)
    features = torch.randn(10, 8, generator=g, dtype=torch.float64)
    y = torch.randn(10, generator=g, dtype=torch.float64)
    noise = torch.full((10,), 0.1, dtype=torch.float64)
    noise[3] = bad
    covariance = ComplexFeatureRootLinearOperator(features) + DiagLinearOperator(noise)
    with pytest.raises(InvalidValueError, match="noise variances must be finite and > 0"):
        gpytorch.distributions.MultivariateNormal(torch.zeros_like(y), covariance).log_prob(y)
    with pytest.raises(InvalidValueError, match="noise must be finite and > 0"):
        complex_feature_posterior(features, y, noise, features[:2])


@pytest.mark.parametrize("lazy", [True, False])
def test_independent_outputs_are_separate_complex_gps_and_correlated_task_noise_is_refused(lazy):
    """GPyTorch's batch-independent multi-output GP on a complex_posterior=True kernel (batch of T = 2): with
    diagonal task noise (rank 0) the outputs are T complex GPs, loss Σ_t evidence_t / (N·T) and posteriors Eqs. 88–90,
    also with eagerly evaluated kernels (which had given the real GP on Re K̂ silently); correlated task noise
    (rank 1) would couple them through the real model on Re K̂ (it did, silently) and raises."""
    from tests._models import BatchIndependentGP

    x, y, x_test = _data()
    targets = torch.stack((y, 0.5 - y), -1)
    base = SketchedPolynomialKernel(3, 24, weights="complex", complex_posterior=True, seed=3,
                                    batch_shape=torch.Size([2]))
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).double()
    likelihood.noise, likelihood.task_noises = 0.1, torch.tensor([0.2, 0.05])
    model = BatchIndependentGP(x, targets, base, likelihood).double()
    with gpytorch.settings.lazily_evaluate_kernels(lazy):
        loss = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), targets)
        model.eval()
        with torch.no_grad():
            posterior = model(x_test)
    with torch.no_grad():
        noises = likelihood.noise + likelihood.task_noises
        evidence = 0.0
        for task in range(2):
            phi_c, phi_c_test = (base.feature_map.complex_features(z, offset=base.offset[task]) for z in (x, x_test))
            evidence = evidence + _complex_evidence(phi_c, targets[:, task], noises[task])
            mean, variance = _direct_posterior(phi_c, targets[:, task], noises[task], phi_c_test)
            assert torch.allclose(posterior.mean[:, task], mean, rtol=1e-8, atol=1e-10)
            assert torch.allclose(posterior.variance[:, task], variance, rtol=1e-8, atol=1e-10)
    assert torch.allclose(loss.detach(), evidence / targets.numel(), rtol=1e-10, atol=1e-12)

    correlated = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=1).double()
    model = BatchIndependentGP(x, targets, base, correlated).double()
    with gpytorch.settings.lazily_evaluate_kernels(lazy), pytest.raises(ValueError, match="complex_posterior=True"):
        gpytorch.mlls.ExactMarginalLogLikelihood(correlated, model)(model(x), targets)


@pytest.mark.parametrize("setting, message", [
    (lambda: rfgp.settings.memory_budget(2000), r"over rfgp.settings.memory_budget \(2000 bytes\): raise rfgp"),
    # the message named the memory budget where a forced chunk_size had chunked the call
    (lambda: rfgp.settings.chunk_size(5), r"in chunks of rfgp.settings.chunk_size\(5\) rows: leave rfgp.settings"),
])
def test_chunked_complex_posterior_is_refused_naming_the_chunking(setting, message):
    x, _, _ = _data()
    kernel = SketchedPolynomialKernel(3, 24, weights="complex", complex_posterior=True, seed=3).double()
    with setting(), pytest.raises(NotImplementedError, match=message):
        kernel(x).to_dense()
