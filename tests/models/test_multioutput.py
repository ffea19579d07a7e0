"""Multi-output GP training and prediction in feature space vs the dense GP with the same kernel."""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood

import rfgp
from rfgp.applications.vector_fields import posterior_component_fields
from rfgp.datasets import helmholtz_field
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.kernels import (
    CurlFreeRBFKernel,
    DecomposableKernel,
    DivFreeRBFKernel,
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedRBFKernel,
)
from rfgp.models.multioutput import MultiOutputGPModel
from tests._dense import assert_eager_kernels_keep_the_strategy

F64 = torch.float64
ScaleKernel = gpytorch.kernels.ScaleKernel


def _data(n=60, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64) * 2 - 1
    y = torch.stack([torch.sin(2 * x[:, 0]) + x[:, 1], torch.cos(3 * x[:, 1]) * x[:, 0]], -1)[:, :d]
    if d == 3:
        y = torch.cat([y, (x[:, :1] * x[:, 2:]).sin()], -1)
    return x, y + 0.05 * torch.randn(y.shape, generator=g, dtype=F64)


def _model(x, y, kernel, task_noise=True):
    likelihood = MultitaskGaussianLikelihood(num_tasks=y.shape[-1], rank=0, has_task_noise=task_noise).to(F64)
    model = MultiOutputGPModel(x, y, likelihood, ScaleKernel(kernel)).to(F64)
    model.covar_module.outputscale = 1.3
    if task_noise:
        likelihood.task_noises = torch.linspace(0.02, 0.05, y.shape[-1], dtype=F64)
    likelihood.noise = 0.01
    return model, likelihood


def _dense_reference(model, likelihood, x, y, test_x):
    """log p(y) and the posterior at test_x computed densely with the model's own (sketched) K̂."""
    with torch.no_grad():
        kernel = model.covar_module
        k_train = kernel(x).to_dense()
        noise = likelihood._shaped_noise_covar(y.shape).to_dense()
        mll = torch.distributions.MultivariateNormal(torch.zeros(y.numel(), dtype=F64), k_train + noise).log_prob(
            y.reshape(-1)
        ) / y.numel()
        cross = kernel(test_x, x).to_dense()
        solve = torch.linalg.solve(k_train + noise, torch.cat([y.reshape(-1, 1), cross.T], -1))
        mean = cross @ solve[:, 0]
        covar = kernel(test_x).to_dense() - cross @ solve[:, 1:]
    return mll, mean.reshape(-1, y.shape[-1]), covar


def _assert_posterior_equals(model, test_x, mean_ref, covar_ref):
    model.eval()
    with torch.no_grad():
        posterior = model(test_x)
    torch.testing.assert_close(posterior.mean, mean_ref, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(posterior.covariance_matrix, covar_ref, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize(
    "make_kernel, d",
    [
        (lambda: SketchedCurlFreeKernel(48, 2, seed=0), 2),
        (lambda: SketchedDivFreeKernel(48, 3, method="orf", seed=1), 3),
        (lambda: SketchedDecomposableKernel(SketchedRBFKernel(16, seed=2), num_tasks=2, rank=1), 2),
    ],
)
def test_feature_space_mll_and_posterior_match_the_dense_gp(make_kernel, d):
    x, y = _data(d=d)
    test_x = torch.rand(9, d, dtype=F64, generator=torch.Generator().manual_seed(2))
    model, likelihood = _model(x, y, make_kernel())
    assert model.covar_module(x).evaluate_kernel().root.shape[-1] < y.numel()  # Woodbury branch
    mll_ref, mean_ref, covar_ref = _dense_reference(model, likelihood, x, y, test_x)
    model.train()
    noisy = likelihood(model(x)).lazy_covariance_matrix
    assert isinstance(noisy, rfgp.FeatureRootAddedDiagLinearOperator)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    torch.testing.assert_close(mll(model(x), y).detach(), mll_ref, atol=1e-8, rtol=1e-8)
    model.eval()
    with torch.no_grad():
        posterior = model(test_x)
    assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    assert isinstance(posterior, gpytorch.distributions.MultitaskMultivariateNormal)
    torch.testing.assert_close(posterior.mean, mean_ref, atol=1e-8, rtol=1e-8)
    torch.testing.assert_close(posterior.covariance_matrix, covar_ref, atol=1e-8, rtol=1e-8)
    with torch.no_grad(), gpytorch.settings.skip_posterior_variances(True):
        torch.testing.assert_close(model(test_x).mean, mean_ref, atol=1e-8, rtol=1e-8)


@pytest.mark.parametrize("num_features", [16, 512])  # N·T > F: feature space; N·T < F: kernel space
@pytest.mark.parametrize("rank, global_noise", [(1, True), (2, True), (2, False)])
def test_correlated_task_noise_mll_gradients_and_posterior_match_the_dense_gp(rank, global_noise, num_features):
    """MultitaskGaussianLikelihood(rank ≥ 1) adds I_N ⊗ Σ_T: whitened per point, not a dense (N·T)³ path."""
    x, y = _data(n=40)
    test_x = torch.rand(7, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=rank, has_global_noise=global_noise).to(F64)
    with torch.no_grad():
        likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.2, 0.05], [-0.1, 0.15]], dtype=F64)[:, :rank])
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(num_features, seed=2), num_tasks=2, rank=1)
    model = MultiOutputGPModel(x, y, likelihood, ScaleKernel(kernel)).to(F64)
    if global_noise:
        likelihood.noise = 0.01
    mll_ref, mean_ref, covar_ref = _dense_reference(model, likelihood, x, y, test_x)
    model.train()
    noisy = likelihood(model(x)).lazy_covariance_matrix
    assert isinstance(noisy, rfgp.inference.task_noise.FeatureRootAddedTaskNoiseLinearOperator)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    value = mll(model(x), y)
    torch.testing.assert_close(value.detach(), mll_ref, atol=1e-8, rtol=1e-8)
    parameters = [likelihood.task_noise_covar_factor, kernel.data_covar_module.raw_lengthscale]
    gradients = torch.autograd.grad(value, parameters)
    dense = model.covar_module(x).to_dense() + likelihood._shaped_noise_covar(y.shape).to_dense()
    dense_value = torch.distributions.MultivariateNormal(torch.zeros(y.numel(), dtype=F64), dense).log_prob(
        y.reshape(-1) - model.mean_module(x).reshape(-1)) / y.numel()
    for gradient, expected in zip(gradients, torch.autograd.grad(dense_value, parameters)):
        torch.testing.assert_close(gradient, expected, atol=1e-8, rtol=1e-7)
    _assert_posterior_equals(model, test_x, mean_ref, covar_ref)


def test_singular_task_noise_is_refused_by_name():
    x, y = _data(n=20)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=1, has_global_noise=False).to(F64)
    model = MultiOutputGPModel(x, y, likelihood, SketchedDecomposableKernel(SketchedRBFKernel(16, seed=0),
                                                                            num_tasks=2, rank=1)).to(F64)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with pytest.raises(ValueError, match="has_global_noise=True"):
        mll(model(x), y)


def test_sketched_lcm_model_mll_and_posterior_match_the_dense_gp():
    """GPyTorch's LCM multitask model (LCMKernel + MultitaskGaussianLikelihood) with rfgp.sketch: Woodbury = dense."""
    x, y = _data(n=50)
    test_x = torch.rand(6, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    lcm = gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()], num_tasks=2)
    model, likelihood = _model(x, y, rfgp.sketch(lcm, 32, seed=0))
    mll_ref, mean_ref, covar_ref = _dense_reference(model, likelihood, x, y, test_x)
    model.train()
    assert isinstance(likelihood(model(x)).lazy_covariance_matrix, rfgp.FeatureRootAddedDiagLinearOperator)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    torch.testing.assert_close(mll(model(x), y).detach(), mll_ref, atol=1e-8, rtol=1e-8)
    _assert_posterior_equals(model, test_x, mean_ref, covar_ref)


def test_mll_gradients_flow_and_training_reduces_the_loss():
    x, y = _data(n=80)
    model, likelihood = _model(x, y, SketchedCurlFreeKernel(64, 2, seed=0))
    losses = rfgp.fit_mll(model, num_iterations=25, lr=0.05, progress=False, optimizer="adam")
    assert losses[-1] < losses[0] - 0.1
    assert model.covar_module.base_kernel.raw_lengthscale.grad is not None


def test_sketched_gp_approaches_the_exact_curl_free_gp():
    x, y = _data(n=50)
    test_x = torch.rand(20, 2, dtype=F64, generator=torch.Generator().manual_seed(1)) * 2 - 1
    exact, _ = _model(x, y, CurlFreeRBFKernel(2))
    exact.eval()
    with torch.no_grad():
        target = exact(test_x)
    errors = []
    for num_features in (64, 2048):
        runs = []
        for seed in range(6):
            model, _ = _model(x, y, SketchedCurlFreeKernel(num_features, 2, method="orf", seed=seed))
            model.eval()
            with torch.no_grad():
                runs.append((model(test_x).mean - target.mean).pow(2).mean().sqrt())
        errors.append(torch.stack(runs).mean())
    assert errors[1] < errors[0] / 2, errors  # 32× the features: ≈ 5.7× smaller kernel error, less for the mean
    assert errors[1] < 0.05 * target.mean.abs().mean()


def _fit(model, iterations=40):
    rfgp.fit_mll(model, num_iterations=iterations, lr=0.05, progress=False, optimizer="adam")
    return model


def _rmse(a, b):
    return (a - b).pow(2).mean().sqrt().item()


def _initialised(model, likelihood, kernel, y, lengthscale=0.4):
    """Start at ℓ = 0.4 with the prior variance of the data (σ²/ℓ² for the derivative kernels)."""
    kernel.lengthscale = lengthscale
    derivative = isinstance(kernel, (CurlFreeRBFKernel, DivFreeRBFKernel, SketchedCurlFreeKernel, SketchedDivFreeKernel))
    model.covar_module.outputscale = y.var().item() * (lengthscale**2 if derivative else 1.0)
    likelihood.noise = 0.01
    return model


def test_helmholtz_parts_are_recovered_better_by_matching_kernels():
    """Curl-free (div-free) data: the curl-free (div-free) GP beats independent GPs at small N; the
    sketched Helmholtz sum kernel splits a mixed field into its two parts."""
    torch.manual_seed(0)
    data = helmholtz_field(40, input_dim=2, noise=0.05, seed=3)
    test = helmholtz_field(300, input_dim=2, seed=3)  # same field, other points
    x, tx = data["x"], test["x"]
    for part, matching in (("curl_free", CurlFreeRBFKernel(2)), ("divergence_free", DivFreeRBFKernel(2))):
        y = data[part] + 0.05 * torch.randn(data[part].shape, dtype=F64)
        independent = DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=2, rank=1)
        independent.task_covar_module.covar_factor.data.zero_()  # A = diag(v): one GP per output
        independent.task_covar_module.covar_factor.requires_grad_(False)
        scores = {}
        for name, kernel, inner in (("matching", matching, matching), ("independent", independent, independent.base_kernel)):
            model, likelihood = _model(x, y, kernel)
            _fit(_initialised(model, likelihood, inner, y))
            with torch.no_grad():
                scores[name] = _rmse(model(tx).mean, test[part])
        assert scores["matching"] < 0.85 * scores["independent"], (part, scores)
    helmholtz = MultiOutputFeatureSumKernel(
        ScaleKernel(SketchedCurlFreeKernel(256, 2, seed=0)), ScaleKernel(SketchedDivFreeKernel(256, 2, seed=1))
    )
    data = helmholtz_field(100, input_dim=2, noise=0.05, seed=3)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(F64)
    model = MultiOutputGPModel(data["x"], data["y"], likelihood, helmholtz).to(F64)
    for component in helmholtz.kernels:
        component.base_kernel.lengthscale = 0.4
        component.outputscale = 0.5 * data["y"].var().item() * 0.16
    likelihood.noise = 0.01
    _fit(model, iterations=40)
    curl_part, div_part = posterior_component_fields(model)
    with torch.no_grad():
        for field, part in ((curl_part, "curl_free"), (div_part, "divergence_free")):
            assert _rmse(field(tx), test[part]) < 0.3 * test[part].pow(2).mean().sqrt().item(), part
        torch.testing.assert_close(curl_part(tx) + div_part(tx), model(tx).mean, atol=1e-8, rtol=1e-8)


def test_bad_model_input():
    x, y = _data()
    likelihood = MultitaskGaussianLikelihood(num_tasks=2)
    with pytest.raises(ValueError, match="train_y has 3 outputs"):
        MultiOutputGPModel(x, torch.randn(60, 3, dtype=F64), MultitaskGaussianLikelihood(num_tasks=3), CurlFreeRBFKernel(2))
    with pytest.raises(ValueError, match="num_tasks=3"):
        MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=3), CurlFreeRBFKernel(2))
    with pytest.raises(ValueError, match=r"\(n, p\)"):
        MultiOutputGPModel(x, y[:, 0], likelihood, CurlFreeRBFKernel(2))
    with pytest.raises(ValueError, match="same number of outputs"):
        MultiOutputFeatureSumKernel(SketchedCurlFreeKernel(32, 2), SketchedCurlFreeKernel(32, 3))


@pytest.mark.parametrize("likelihood", ["gaussian", "fixed_flat", "fixed_table"])
@pytest.mark.parametrize("kernel", [CurlFreeRBFKernel(2), SketchedCurlFreeKernel(32, 2, seed=0)])
def test_a_single_output_gaussian_likelihood_is_refused_by_name(kernel, likelihood):
    """Before: accepted; then GaussianLikelihood and a FixedNoiseGaussianLikelihood of (n, p) noises failed deep in
    torch ("Attempting to broadcast a dimension of length 2 at -1 ... [60, 120, 120]"), and one of (n·p,) noises
    was dropped with only GPyTorch's GPInputWarning: the marginal likelihood of a noise-free model."""
    x, y = _data()
    likelihood = {"gaussian": gpytorch.likelihoods.GaussianLikelihood,
                  "fixed_flat": lambda: gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.full((120,), 0.1)),
                  "fixed_table": lambda: gpytorch.likelihoods.FixedNoiseGaussianLikelihood(torch.full((60, 2), 0.1)),
                  }[likelihood]()
    with pytest.raises(TypeError, match=r"likelihood must be a multitask likelihood.*GaussianLikelihood.*num_tasks=2"):
        MultiOutputGPModel(x, y, likelihood, kernel)


@pytest.mark.parametrize("num_features", [16, 512])  # N·T > F: feature space; N·T < F: kernel space
@pytest.mark.parametrize("rank, global_noise", [(1, True), (2, False)])
def test_missing_targets_with_correlated_task_noise_match_the_dense_gp_of_the_observed_entries(
        rank, global_noise, num_features):
    """observation_nan_policy("mask"): the MLL, its gradients and the posterior are the dense GP's on the observed
    entries, whose noise is a sub-block of Σ_T per point (whole points missing, single tasks missing)."""
    x, y = _data(n=30)
    test_x = torch.rand(5, 2, dtype=F64, generator=torch.Generator().manual_seed(3))
    y = y.clone()
    y[3, 1] = y[7, 0] = y[11, 0] = float("nan")
    y[20] = float("nan")
    observed = ~torch.isnan(y.reshape(-1))
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=rank, has_global_noise=global_noise).to(F64)
    with torch.no_grad():
        likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.2, 0.05], [-0.1, 0.15]], dtype=F64)[:, :rank])
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(num_features, seed=2), num_tasks=2, rank=1)
    with gpytorch.settings.observation_nan_policy("mask"):
        model = MultiOutputGPModel(x, y, likelihood, ScaleKernel(kernel)).to(F64)
        if global_noise:
            likelihood.noise = 0.01
        value = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
        parameters = [likelihood.task_noise_covar_factor, kernel.data_covar_module.raw_lengthscale,
                      model.covar_module.raw_outputscale]
        gradients = torch.autograd.grad(value, parameters)

        dense = model.covar_module(x).to_dense() + likelihood._shaped_noise_covar(y.shape).to_dense()
        residual = (y - model.mean_module(x)).reshape(-1)[observed]
        dense_value = torch.distributions.MultivariateNormal(
            torch.zeros(residual.numel(), dtype=F64), dense[observed][:, observed]).log_prob(residual) / y.numel()
        torch.testing.assert_close(value.detach(), dense_value.detach(), atol=1e-8, rtol=1e-8)
        for gradient, expected in zip(gradients, torch.autograd.grad(dense_value, parameters)):
            torch.testing.assert_close(gradient, expected, atol=1e-8, rtol=1e-7)

        with torch.no_grad():
            cross = model.covar_module(test_x, x).to_dense()[:, observed]
            solve = torch.linalg.solve(dense[observed][:, observed],
                                       torch.cat([residual.detach().unsqueeze(-1), cross.T], -1))
            mean_ref = (model.mean_module(test_x).reshape(-1) + cross @ solve[:, 0]).reshape(-1, 2)
            covar_ref = model.covar_module(test_x).to_dense() - cross @ solve[:, 1:]
        _assert_posterior_equals(model, test_x, mean_ref, covar_ref)
    with gpytorch.settings.observation_nan_policy("fill"):
        _assert_posterior_equals(model, test_x, mean_ref, covar_ref)


def test_posterior_with_eagerly_evaluated_kernels_keeps_the_feature_space_strategy():
    """Under ``gpytorch.settings.lazily_evaluate_kernels(False)`` GPyTorch's ExactGP predicted through its generic
    DefaultPredictionStrategy (it asks the kernel only for a lazily evaluated covariance)."""
    x, y = _data()
    test_x = torch.rand(9, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    model, _ = _model(x, y, SketchedCurlFreeKernel(32, input_dim=2, seed=0))
    model.eval()
    assert_eager_kernels_keep_the_strategy(model, test_x, MultitaskFeatureSpacePredictionStrategy, tolerance=1e-10)


def test_conditioning_with_a_per_point_noise_is_refused_for_a_multitask_likelihood():
    """get_fantasy_model(x, y, noise=...) cannot give a MultitaskGaussianLikelihood per-point noise of the new points;
    it raises instead of conditioning them on the likelihood's task noise (single-output models take it exactly)."""
    x, y = _data(n=20)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2).to(F64)
    model = MultiOutputGPModel(x, y, likelihood, SketchedDecomposableKernel(SketchedRBFKernel(16, seed=0),
                                                                            num_tasks=2, rank=1)).to(F64).eval()
    model(x[:2])
    with pytest.raises(NotImplementedError,
                       match="noise= is supported for single-output Gaussian likelihoods.*MultitaskGaussianLik"):
        model.get_fantasy_model(x[:3] + 0.1, y[:3], noise=torch.full((3, 2), 0.1, dtype=F64))
