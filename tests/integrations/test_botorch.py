"""BoTorch models with rfgp kernels: fit, posterior, acquisition optimisation, fantasies, model lists,
batched outputs, transforms and fixed noise — in feature space (no factorisation larger than F)."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.acquisition import (  # noqa: E402
    qKnowledgeGradient,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qUpperConfidenceBound,
)
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models import ModelListGP, SingleTaskGP  # noqa: E402
from botorch.models.transforms import Normalize, Standardize  # noqa: E402
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.prediction import FeatureSpacePredictionStrategy, RankUpdatedFantasyStrategy  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402

from .._dense import DenseKernel  # noqa: E402

D = 3
BOUNDS = torch.tensor([[0.0] * D, [2.0] * D], dtype=torch.float64)
FIT_OPTIONS = {"optimizer_kwargs": {"options": {"maxiter": 30}}}
ACQF_OPTIONS = {"num_restarts": 2, "raw_samples": 32, "options": {"maxiter": 10}}


def data(n, num_outputs=1, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(n, D, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(3 * x).sum(-1) * (k + 1) for k in range(num_outputs)], -1)
    return x, y + 0.1 * torch.randn(n, num_outputs, generator=gen, dtype=torch.float64)


def sketched_model(x, y, num_features=64, **options):
    """BoTorch's default SingleTaskGP kernel (RBF, dim-scaled LogNormal prior), sketched."""
    batch = torch.Size([y.shape[-1]]) if y.shape[-1] > 1 else torch.Size()
    exact = get_covar_module_with_dim_scaled_prior(ard_num_dims=D, batch_shape=batch)
    kernel = rfgp.sketch(exact, num_features, method="orf", seed=0)
    return SingleTaskGP(x, y, covar_module=kernel, input_transform=Normalize(D), **options).double()


def fitted(x, y, **options):
    model = sketched_model(x, y, **options)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), **FIT_OPTIONS)
    return model.eval()


def test_sketch_of_botorch_default_kernel_keeps_its_prior_and_constraint():
    x, y = data(20)
    default = SingleTaskGP(x, y).covar_module
    sketched = rfgp.sketch(default, 128, method="sorf", seed=0)
    assert isinstance(sketched, SketchedRBFKernel)
    prior = sketched.lengthscale_prior
    assert isinstance(prior, gpytorch.priors.LogNormalPrior)
    torch.testing.assert_close(prior.loc, default.lengthscale_prior.loc)
    assert sketched.raw_lengthscale_constraint.lower_bound == default.raw_lengthscale_constraint.lower_bound
    torch.testing.assert_close(sketched.lengthscale, default.lengthscale)


def test_sketch_of_matern_kernel_with_gamma_priors_fits():
    """BoTorch's Matérn-5/2 + ScaleKernel with Gamma priors (its earlier default) converts with both priors."""
    from botorch.models.utils.gpytorch_modules import get_matern_kernel_with_gamma_prior

    exact = get_matern_kernel_with_gamma_prior(ard_num_dims=D)
    sketched = rfgp.sketch(exact, 64, method="orf", seed=0)
    assert isinstance(sketched.base_kernel, rfgp.kernels.SketchedMaternKernel) and sketched.base_kernel.nu == 2.5
    for module, exact_module, name in ((sketched, exact, "outputscale_prior"),
                                       (sketched.base_kernel, exact.base_kernel, "lengthscale_prior")):
        prior, exact_prior = getattr(module, name), getattr(exact_module, name)
        assert isinstance(prior, gpytorch.priors.GammaPrior)
        torch.testing.assert_close(prior.concentration, exact_prior.concentration)
        torch.testing.assert_close(prior.rate, exact_prior.rate)
    x, y = data(60)
    model = SingleTaskGP(x, y, covar_module=sketched, input_transform=Normalize(D)).double()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), **FIT_OPTIONS)
    assert torch.isfinite(model.posterior(x[:3]).mean).all()


def test_fit_factorises_nothing_larger_than_the_features(factorised):
    x, y = data(3000)
    model = sketched_model(x, y, num_features=64)
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    start = model.covar_module.lengthscale.detach().clone()
    fit_gpytorch_mll(mll, **FIT_OPTIONS)
    assert factorised and max(factorised) <= 64
    assert not torch.allclose(model.covar_module.lengthscale, start)


def test_posterior_and_observation_noise():
    x, y = data(60)
    model = fitted(x, y)
    xs = 2 * torch.rand(5, D, dtype=torch.float64)
    with torch.no_grad():
        latent, noisy = model.posterior(xs), model.posterior(xs, observation_noise=True)
    noise = model.likelihood.noise * model.outcome_transform.stdvs.pow(2)  # in output units
    torch.testing.assert_close(noisy.variance, latent.variance + noise, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(noisy.mean, latent.mean)


@pytest.mark.parametrize("acquisition", ["qLogEI", "qLogNEI", "qUCB"])
def test_acquisition_optimisation(acquisition):
    x, y = data(60)
    model = fitted(x, y)
    acqf = {
        "qLogEI": lambda: qLogExpectedImprovement(model, best_f=y.max()),
        "qLogNEI": lambda: qLogNoisyExpectedImprovement(model, X_baseline=x),
        "qUCB": lambda: qUpperConfidenceBound(model, beta=0.2),
    }[acquisition]()
    candidates, value = optimize_acqf(acqf, BOUNDS, q=2, **ACQF_OPTIONS)
    assert candidates.shape == (2, D) and torch.isfinite(value)
    assert ((candidates >= 0) & (candidates <= 2)).all()


def test_fantasize_and_knowledge_gradient():
    x, y = data(60)
    model = fitted(x, y)
    fantasy = model.fantasize(2 * torch.rand(2, D, dtype=torch.float64), SobolQMCNormalSampler(torch.Size([4])))
    assert fantasy.posterior(x[:3]).mean.shape == (4, 3, 1)
    candidates, value = optimize_acqf(qKnowledgeGradient(model, num_fantasies=4), BOUNDS, q=1,
                                      num_restarts=2, raw_samples=16, options={"maxiter": 3})
    assert candidates.shape == (1, D) and torch.isfinite(value)


def test_condition_on_observations_equals_refit_with_the_same_hyperparameters():
    x, y = data(60)
    model = fitted(x[:50], y[:50], outcome_transform=None)
    model.posterior(x[:1])  # GPyTorch builds the caches a fantasy update extends at the first prediction
    conditioned = model.condition_on_observations(x[50:], y[50:])  # BoTorch applies the input transform
    full = sketched_model(x, y, outcome_transform=None)
    full.load_state_dict(model.state_dict())
    full.eval()
    xs = 2 * torch.rand(6, D, dtype=torch.float64)
    with torch.no_grad():
        expected, actual = full.posterior(xs), conditioned.posterior(xs)
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-8, atol=1e-10)


def test_conditioning_a_small_model_with_wide_features_stays_in_kernel_space(monkeypatch):
    """N + m ≪ F (qJointEntropySearch's conditioning on a batch of optima): the conditioned model builds only the
    (N + m) × (N + m) caches, never GPyTorch's eager F × F ones, and predicts as the F × F caches do."""
    x, y = data(30)
    model = sketched_model(x[:24], y[:24], num_features=1024, outcome_transform=None).eval()
    model.posterior(x[:1])
    points = x[24:].unsqueeze(0).expand(3, 6, D)  # a batch of 3 conditionings, as JES makes
    targets = y[24:].unsqueeze(0).expand(3, 6, 1) + torch.arange(3, dtype=torch.float64).view(3, 1, 1)
    conditioned = model.condition_on_observations(points, targets)
    xs = 2 * torch.rand(3, 5, D, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        actual = conditioned.posterior(xs)
    strategy = conditioned.prediction_strategy
    def cached(name):  # GPyTorch's memoize keys: (name, args, kwargs)
        return any(key[0] == name for key in strategy._memoize_cache)

    assert strategy.uses_kernel_space and cached("kernel_space_cache") and not cached("mean_covar_cache")
    strategy._memoize_cache.clear()
    monkeypatch.setattr(FeatureSpacePredictionStrategy, "uses_kernel_space", property(lambda self: False))
    with torch.no_grad():
        expected = conditioned.posterior(xs)
    assert cached("mean_covar_cache")
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-7, atol=1e-9)


def test_fantasy_batches_equal_one_conditioning_per_fantasy():
    """The fantasy targets' batch is folded into right-hand-side columns; each fantasy is still its own model."""
    x, y = data(60)
    model = fitted(x, y, outcome_transform=None)
    points = 2 * torch.rand(2, D, dtype=torch.float64)
    fantasy = model.fantasize(points, SobolQMCNormalSampler(torch.Size([3])))
    xs = 2 * torch.rand(4, D, dtype=torch.float64)
    with torch.no_grad():
        means = fantasy.posterior(xs).mean
        for k in range(3):
            single = model.condition_on_observations(points, fantasy.train_targets[k, -2:].unsqueeze(-1))
            torch.testing.assert_close(means[k], single.posterior(xs).mean, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_batched_fantasies_update_the_caches_with_the_recomputed_values(fixed_noise, monkeypatch):
    """A two-output SingleTaskGP (batch kernel), 4 fantasies over 7 raw-sample batches of 3 points, with a fixed
    training noise and observation_noise=: the rank-q update gives the recomputation's posterior."""
    x, y = data(120, num_outputs=2)
    noise = 0.01 + 0.02 * torch.rand(120, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    model = sketched_model(x, y, outcome_transform=None, **({"train_Yvar": noise} if fixed_noise else {})).eval()
    points = 2 * torch.rand(7, 3, D, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    xs = 2 * torch.rand(5, D, dtype=torch.float64)
    kwargs = {"observation_noise": torch.full((3, 2), 0.05, dtype=torch.float64)} if fixed_noise else {}

    def posterior():
        with torch.no_grad():
            model.posterior(xs)
            fantasy = model.fantasize(points, SobolQMCNormalSampler(torch.Size([4]), seed=0), **kwargs)
            return fantasy.posterior(xs), type(fantasy.prediction_strategy)

    actual, strategy = posterior()
    with monkeypatch.context() as patch:
        patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
        expected, _ = posterior()
    assert strategy is RankUpdatedFantasyStrategy and actual.mean.shape == (4, 7, 5, 2)
    torch.testing.assert_close(actual.mean, expected.mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=0, atol=1e-12)


def _fixed_noise_refit(model, x, y, noise):
    """The model's kernel and mean refitted on (x, y) with the given per-point noise variances (no transforms)."""
    refit = sketched_model(x, y, num_features=model.covar_module.num_features, outcome_transform=None,
                           train_Yvar=noise)
    refit.covar_module.load_state_dict(model.covar_module.state_dict())
    refit.mean_module.load_state_dict(model.mean_module.state_dict())
    refit.input_transform.load_state_dict(model.input_transform.state_dict())
    return refit.eval()


@pytest.mark.parametrize("num_features", [64, 1024])  # feature space; kernel space (N + m ≪ F)
def test_conditioning_with_noise_is_a_fixed_noise_refit(num_features):
    """condition_on_observations(X, Y, noise) (qJointEntropySearch's near-noiseless optima) conditions the new points
    on that noise, in the mean and the covariance, as a model fitted with that fixed noise does; before, the
    homoscedastic likelihood's noise was used instead, silently."""
    x, y = data(60)
    model = fitted(x[:50], y[:50], num_features=num_features, outcome_transform=None)
    model.posterior(x[:1])
    noise = torch.tensor([1e-4, 0.5, 2.0, 1e-3, 0.1, 1e-4, 0.3, 1.0, 1e-2, 1e-4], dtype=torch.float64).unsqueeze(-1)
    conditioned = model.condition_on_observations(x[50:], y[50:], noise=noise)
    all_noise = torch.cat([model.likelihood.noise.expand(50, 1), noise])
    refit = _fixed_noise_refit(model, x, y, all_noise)
    xs = 2 * torch.rand(6, D, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, actual = refit.posterior(xs), conditioned.posterior(xs)
        homoscedastic = model.condition_on_observations(x[50:], y[50:]).posterior(xs)
    assert (actual.variance - homoscedastic.variance).abs().max() > 1e-3  # the noise matters here
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-7, atol=1e-9)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-7, atol=1e-9)


def test_fantasies_with_observation_noise_condition_on_that_noise():
    """fantasize(X, sampler, observation_noise) with a homoscedastic model: each fantasy is the fixed-noise refit."""
    x, y = data(60)
    model = fitted(x, y, outcome_transform=None)
    points = 2 * torch.rand(2, D, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    noise = torch.tensor([[0.5]], dtype=torch.float64)
    fantasy = model.fantasize(points, SobolQMCNormalSampler(torch.Size([3])), observation_noise=noise)
    xs = 2 * torch.rand(4, D, dtype=torch.float64)
    all_noise = torch.cat([model.likelihood.noise.expand(60, 1), noise.expand(2, 1)])
    with torch.no_grad():
        posterior = fantasy.posterior(xs)
        for k in range(3):
            targets = torch.cat([y, fantasy.train_targets[k, -2:].unsqueeze(-1)])
            expected = _fixed_noise_refit(model, torch.cat([x, points]), targets, all_noise).posterior(xs)
            torch.testing.assert_close(posterior.mean[k], expected.mean, rtol=1e-7, atol=1e-9)
            torch.testing.assert_close(posterior.variance[k], expected.variance, rtol=1e-7, atol=1e-9)


def test_model_list_with_sum_mll():
    x, y = data(60, num_outputs=2)
    models = [sketched_model(x, y[:, k : k + 1]) for k in range(2)]
    model_list = ModelListGP(*models)
    fit_gpytorch_mll(SumMarginalLogLikelihood(model_list.likelihood, model_list), **FIT_OPTIONS)
    model_list.eval()
    assert model_list.posterior(x[:4]).mean.shape == (4, 2)
    candidates, _ = optimize_acqf(qUpperConfidenceBound(models[0], beta=0.2), BOUNDS, q=1, **ACQF_OPTIONS)
    assert candidates.shape == (1, D)


def test_batched_multi_output_model(factorised):
    x, y = data(200, num_outputs=2)
    model = fitted(x, y)
    assert factorised and max(factorised) <= 64
    assert model.covar_module.batch_shape == torch.Size([2])
    posterior = model.posterior(x[:4])
    assert posterior.mean.shape == (4, 2)
    objective = botorch.acquisition.objective.LinearMCObjective(torch.tensor([1.0, -1.0], dtype=torch.float64))
    candidates, _ = optimize_acqf(qLogNoisyExpectedImprovement(model, X_baseline=x[:20], objective=objective),
                                  BOUNDS, q=1, **ACQF_OPTIONS)
    assert candidates.shape == (1, D)


def test_fixed_noise_from_train_yvar():
    x, y = data(60)
    model = fitted(x, y, train_Yvar=torch.full_like(y, 0.02))
    assert isinstance(model.likelihood, gpytorch.likelihoods.FixedNoiseGaussianLikelihood)
    xs = x[:4]
    with torch.no_grad():
        latent, noisy = model.posterior(xs), model.posterior(xs, observation_noise=True)
    assert (noisy.variance > latent.variance).all()
    assert isinstance(model.outcome_transform, Standardize)


def _dense_multitask_log_prob(model, x):
    """log N(vec Y | vec μ, K + Σ) / (N·T) plus the priors, from the dense covariance of the model's own kernel."""
    with torch.no_grad():
        out = model(x)
        covar = out.lazy_covariance_matrix.to_dense() + model.likelihood._shaped_noise_covar(x.shape).to_dense()
        normal = torch.distributions.MultivariateNormal(out.mean.reshape(-1), covar)
        targets = model.train_targets.reshape(-1)
        priors = sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in model.named_priors())
        return (normal.log_prob(targets) + priors) / targets.numel()


def test_kronecker_multitask_gp_with_a_sketched_multitask_kernel_trains_and_predicts():
    x, y = data(40, num_outputs=2)
    model = botorch.models.KroneckerMultiTaskGP(x, y).double()
    model.covar_module = rfgp.sketch(model.covar_module, 64, seed=0)
    model.train()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        value = mll(model(x), model.train_targets)
    torch.testing.assert_close(value, _dense_multitask_log_prob(model, x), rtol=1e-9, atol=1e-9)
    model.eval()
    # BoTorch's posterior takes K_XX ⊗ K_TT apart: the sketched covariance hands over its factors φφᵀ and A
    # (tests/integrations/test_botorch_kronecker_multitask.py checks the posterior against the dense GP)
    with torch.no_grad():
        assert model.posterior(x[:3]).rsample(torch.Size([4])).shape == (4, 3, 2)


def test_kronecker_multitask_gp_with_a_sketched_data_kernel_is_the_gp_of_that_kernel():
    x, y = data(40, num_outputs=2)
    model = botorch.models.KroneckerMultiTaskGP(x, y, outcome_transform=None).double()
    model.covar_module.data_covar_module = rfgp.sketch(model.covar_module.data_covar_module, 64, seed=0)
    model.train()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        torch.testing.assert_close(mll(model(x), model.train_targets), _dense_multitask_log_prob(model, x),
                                   rtol=1e-9, atol=1e-9)
    model.eval()
    xs = 2 * torch.rand(5, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        posterior = model.posterior(xs)
        # the dense GP posterior of the same covariance (the model has no outcome transform)
        train_x, noise = model.train_inputs[0], model.likelihood._shaped_noise_covar(x.shape).to_dense()
        joint = model.covar_module(torch.cat([train_x, xs])).to_dense()
        n = 2 * train_x.shape[0]
        k_train, k_cross, k_test = joint[:n, :n] + noise, joint[n:, :n], joint[n:, n:]
        residual = (model.train_targets - model.mean_module(train_x)).reshape(-1)
        mean = model.mean_module(xs).reshape(-1) + k_cross @ torch.linalg.solve(k_train, residual)
        variance = (k_test - k_cross @ torch.linalg.solve(k_train, k_cross.mT)).diagonal()
    torch.testing.assert_close(posterior.mean, mean.reshape(5, 2), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(posterior.variance, variance.reshape(5, 2), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("transform", ["normalize", "warp"])
def test_set_num_features_reselects_nystrom_landmarks_among_the_input_transformed_inputs(transform, training):
    """BoTorch keeps raw train_inputs in training mode and transformed ones in eval mode; either way the landmarks are
    re-chosen among the inputs the kernel sees (Normalize, or a Warp of its bounds), never among the raw x."""
    from botorch.models.transforms.input import Warp

    x, y = data(40)
    x = 10 * x + 5
    bounds = torch.stack([x.min(0).values, x.max(0).values])
    make = {"normalize": lambda: Normalize(D), "warp": lambda: Warp(d=D, indices=list(range(D)), bounds=bounds)}
    transform = make[transform]()
    seen = SingleTaskGP(x, y, input_transform=transform).transform_inputs(x)
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D))
    kernel = rfgp.sketch(exact, 20, method="nystrom", x_sample=seen, seed=0)
    model = SingleTaskGP(x, y, covar_module=kernel, input_transform=transform).double().train(training)
    rfgp.set_num_features(model, 30)
    landmarks = model.covar_module.base_kernel.landmarks
    assert landmarks.shape == (30, D) and bool((landmarks[:, None] == seen[None]).all(-1).any(-1).all())


def test_maclaurin_allocation_fitted_at_the_first_call_sees_the_normalized_inputs():
    """An optimized Maclaurin map built without x_sample fits its allocation on its first inputs; in a SingleTaskGP
    with Normalize those are the normalised training inputs (on the raw 10x + 5 it is refused)."""
    x, y = data(40)
    x = 10 * x + 5
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D))
    model = SingleTaskGP(x, y, covar_module=rfgp.sketch(exact, 64, method="maclaurin", seed=0),
                         input_transform=Normalize(D)).double()
    model(*model.train_inputs).covariance_matrix  # the first kernel evaluation, in training mode
    expected = rfgp.sketch(exact, 64, method="maclaurin", seed=0, x_sample=model.transform_inputs(x))
    assert model.covar_module.base_kernel.feature_map.widths == expected.base_kernel.feature_map.widths


def test_fit_scale_and_noise_on_a_fitted_single_task_gp_with_transforms_and_priors():
    x, y = data(80)
    model = fitted(x, y)  # Normalize inputs, Standardize outputs, LogNormal noise prior, no ScaleKernel
    rfgp.set_num_features(model, 256)
    fit = rfgp.fit_scale_and_noise(model)
    assert fit.fitted == ("noise", "constant") and fit.loss_after <= fit.loss_before
    model.train()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        loss = -mll(model(*model.train_inputs), model.train_targets)
    torch.testing.assert_close(torch.tensor(fit.loss_after, dtype=torch.float64), loss, rtol=1e-9, atol=1e-9)
    assert not model.eval().training and model.posterior(x[:3]).mean.shape == (3, 1)


def test_rfgp_fit_mll_trains_botorch_default_model_within_its_noise_bound():
    # BoTorch's noise constraint (≥ 1e-4) has no transform; near-noiseless data push the noise against it
    x = 2 * torch.rand(100, D, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1, keepdim=True)
    model = SingleTaskGP(x, y, covar_module=rfgp.sketch(get_covar_module_with_dim_scaled_prior(ard_num_dims=D), 128,
                                                         seed=0))
    history = rfgp.fit_mll(model, progress=False)
    lower = model.likelihood.noise_covar.raw_noise_constraint.lower_bound
    assert not history.restarts and history.converged
    assert float(model.likelihood.noise) >= float(lower)


@pytest.mark.parametrize("num_data", [100, 32, 20])  # N > F, N = F, N < F (F = 32)
def test_cached_root_noisy_improvement_without_outcome_standardisation(num_data):
    """qLogNEI caches a Cholesky factor of the baseline posterior (BoTorch's CachedCholeskyMCSamplerMixin).

    Without Standardize the posterior covariance reaches BoTorch untransformed: its root decomposition must be
    a square lower-triangular factor and its base samples n-dimensional, as for an exact GP.  Cached and
    uncached values are the same expectation, estimated from differently arranged samples: they agree up to
    Monte Carlo error (the improvement is a rare event here, so compared in EI, not log-EI, units).
    """
    x, y = data(num_data)
    model = sketched_model(x, y, num_features=32, outcome_transform=None)
    model.likelihood.noise = 0.01
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_computations(covar_root_decomposition=False):
        factor = model.posterior(x).mvn.lazy_covariance_matrix.root_decomposition().root.to_dense()
    assert factor.shape == (num_data, num_data)
    torch.testing.assert_close(factor, factor.tril())
    candidates = 2 * torch.rand(4, 2, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    values = [
        qLogNoisyExpectedImprovement(model, X_baseline=x, prune_baseline=False, cache_root=cache_root,
                                     sampler=SobolQMCNormalSampler(torch.Size([1024]), seed=1))(candidates)
        for cache_root in (True, False)
    ]
    assert torch.isfinite(values[0]).all()
    torch.testing.assert_close(values[0].exp(), values[1].exp(), atol=2e-3, rtol=0.0)


def _cached_root_qlognei_value_gradient_flops(model, baseline, candidates):
    """One qLogNEI value + gradient, and its matmul and triangular-solve flops."""
    from torch.utils.flop_counter import FlopCounterMode

    from .._cost import TriangularSolveFlops

    acquisition = qLogNoisyExpectedImprovement(model, X_baseline=baseline, prune_baseline=False,
                                               sampler=SobolQMCNormalSampler(torch.Size([64]), seed=1))
    candidates = candidates.clone().requires_grad_(True)
    with FlopCounterMode(display=False) as counter, TriangularSolveFlops() as solves:
        value = acquisition(candidates)
        value.sum().backward()  # (FlopCounterMode's module hooks refuse torch.autograd.grad)
    return value.detach(), candidates.grad, counter.get_total_flops() + solves.flops


@pytest.mark.parametrize("num_train, num_features", [(300, 512), (1000, 256)], ids=["kernel-space", "feature-space"])
def test_cached_root_qlognei_reads_only_the_candidates_rows_of_the_posterior(monkeypatch, num_train, num_features):
    """qLogNEI with its cached baseline root asks every evaluation for the joint posterior at the n_b baseline
    points and the q candidates, and reads only its q bottom rows (``sample_cached_cholesky``).  The whole n × F
    root cost, per t-batch and again backward, 2·n·N·F at N ≲ F (kernel space, Φ* − (Φ*Wᵀ)Q) and n·F² at N > F
    (feature space, the triangular solve Φ*L_A⁻ᵀ); the rows cost O(q·N·F) or O(q·F²), plus q·n·F.  Same values and
    gradients as from the whole root (float64, 1e-10), under ``Standardize``."""
    from rfgp.inference import posterior_covariance, prediction

    x, y = data(num_train)
    model = sketched_model(x, y, num_features=num_features, outcome_transform=Standardize(1))
    model.likelihood.noise = 0.01
    model.eval()
    baseline = x[:40]
    candidates = 2 * torch.rand(3, 2, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    value, gradient, flops = _cached_root_qlognei_value_gradient_flops(model, baseline, candidates)
    kernel_space = num_train < num_features
    assert model.prediction_strategy.uses_kernel_space == kernel_space

    def whole_root(features, factor, kernel_space):
        lazy = posterior_covariance.feature_posterior_covariance(features, factor, kernel_space)
        return posterior_covariance.LowRankPosteriorCovariance(lazy.low_rank_root)

    monkeypatch.setattr(prediction, "feature_posterior_covariance", whole_root)
    expected_value, expected_gradient, whole_root_flops = _cached_root_qlognei_value_gradient_flops(
        model, baseline, candidates)
    torch.testing.assert_close(value, expected_value, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-10, atol=1e-10)
    num_rows = candidates.shape[0] * (baseline.shape[0] + candidates.shape[1])
    one_root = 2 * num_rows * num_train * num_features if kernel_space else num_rows * num_features**2
    assert whole_root_flops > 2 * one_root  # the whole root, forward and backward
    assert flops < one_root / 2


def test_a_trial_point_with_a_zero_lengthscale_is_a_nan_loss_for_botorchs_fit():
    """L-BFGS-B may probe a raw lengthscale whose softplus underflows to 0: the kernel raises a NonFiniteError
    that is also linear_operator's NanError, which BoTorch's scipy closure turns into a NaN loss (the line search
    steps back, as for an exact kernel) instead of aborting fit_gpytorch_mll."""
    from botorch.optim.closures import ForwardBackwardClosure, NdarrayOptimizationClosure
    from linear_operator.utils.errors import NanError

    x, y = data(40)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, ard_num_dims=D, seed=0))  # softplus constraint
    model = SingleTaskGP(x, y, covar_module=kernel).double()
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    mll.train()
    with torch.no_grad():
        kernel.base_kernel.raw_lengthscale.fill_(-1000.0)  # softplus(-1000) == 0.0
    with pytest.raises(NanError, match="lengthscale"):
        mll(model(*model.train_inputs), model.train_targets)
    with pytest.raises(rfgp.core.validation.NonFiniteError, match="lengthscale"):  # still rfgp's named error
        mll(model(*model.train_inputs), model.train_targets)
    parameters = dict(mll.named_parameters())
    closure = NdarrayOptimizationClosure(
        ForwardBackwardClosure(lambda: -mll(model(*model.train_inputs), model.train_targets), parameters), parameters)
    value, grad = closure()
    assert value != value and (grad != grad).all()  # NaN: the optimiser rejects the point
    with torch.no_grad():
        kernel.base_kernel.raw_lengthscale.fill_(0.0)
    value, grad = closure()
    assert value == value and (grad == grad).all()


def test_acquisition_evaluation_featurises_and_checks_only_the_candidates(monkeypatch):
    """A qLogEI value + gradient at a t-batch of candidates reads none of the N training rows: GPyTorch evaluates the
    test–train covariance of every t-batch (the training points expanded to the batch, sliced from its joint inputs),
    which rfgp's posterior never multiplies; checking its N rows for NaN/Inf at every call cost more than the
    prediction (N = 3000, F = 1024, 256 t-batches: 31 of 54 ms per posterior).  Values and gradients are those of
    GPyTorch's generic exact prediction with the same covariance (its dense N × N algebra on ΦΦᵀ)."""
    num_train = 300
    x, y = data(num_train)
    model = sketched_model(x, y).eval()
    reference = sketched_model(x, y).eval()
    reference.load_state_dict(model.state_dict())
    reference.covar_module = DenseKernel(reference.covar_module)
    candidates = 2 * torch.rand(5, 2, D, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def value_and_grad(m):
        sampler = SobolQMCNormalSampler(torch.Size([64]), seed=0)
        acquisition = qLogExpectedImprovement(m, best_f=y.max(), sampler=sampler)
        points = candidates.clone().requires_grad_(True)
        value = acquisition(points)
        return value.detach(), torch.autograd.grad(value.sum(), points)[0]

    expected = value_and_grad(model)  # the first call builds the posterior caches from the training rows
    checked, featurised = [], []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: checked.append(t.shape[-2]) or isfinite(t))
    feature_map = next(m for m in model.modules() if isinstance(m, rfgp.features.FeatureMap))
    features = feature_map.forward
    monkeypatch.setattr(feature_map, "forward", lambda t: featurised.append(t.shape[-2]) or features(t))
    actual = value_and_grad(model)
    monkeypatch.undo()
    assert featurised and max(featurised) <= candidates.shape[-2]
    assert checked and max(checked) <= candidates.shape[-2]
    torch.testing.assert_close(actual, expected, rtol=0, atol=0)
    generic = value_and_grad(reference)
    assert not isinstance(reference.prediction_strategy, FeatureSpacePredictionStrategy)
    torch.testing.assert_close(actual, generic, rtol=1e-6, atol=1e-8)


def test_a_lazy_cross_covariance_checks_the_rows_it_reads():
    """The finiteness check of a test–train covariance moved into the products that read its rows: a NaN still
    raises, naming the input, as soon as a value depends on it; views of one memory are the same points unread."""
    x, _ = data(20)
    kernel = rfgp.sketch(get_covar_module_with_dim_scaled_prior(ard_num_dims=D), 64, seed=0).double()
    bad = x.clone()
    bad[7, 1] = float("nan")
    covar = kernel(x[:4], bad).evaluate_kernel()  # lazy: not read yet
    rhs = torch.ones(20, 1, dtype=torch.float64)
    for read in (lambda: covar @ rhs, lambda: covar.to_dense(), lambda: covar.mT @ torch.ones(4, 1, dtype=x.dtype)):
        with pytest.raises(ValueError, match="x2 contains NaN"):
            read()
    with pytest.raises(ValueError, match="x1 contains NaN"):
        kernel(bad, bad.clone()).to_dense()
    from rfgp.kernels.random_feature_kernel import same_inputs, same_memory
    joint = torch.cat([x, bad])
    assert same_inputs(joint[..., 20:, :], joint[..., 20:, :])  # NaN ≠ NaN: answered without comparing values
    assert not same_inputs(bad, bad.clone()) and same_inputs(x, x.clone())
    assert not same_memory(x, x.clone()) and not same_memory(joint[:20], joint[20:]) and not same_memory(x[:3], x[:4])
    with pytest.raises(ValueError, match="x1 contains NaN"):  # the test–test covariance: one check of one memory
        kernel(joint[..., 20:, :], joint[..., 20:, :]).to_dense()
