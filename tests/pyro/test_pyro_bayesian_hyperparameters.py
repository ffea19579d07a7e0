"""Fully Bayesian hyperparameters of GPyTorch models with rfgp kernels (NUTS through GPyTorch's Pyro API)."""

import math

import gpytorch
import pyro
import pytest
import torch
from gpytorch.priors import LogNormalPrior
from pyro.ops.stats import effective_sample_size

from rfgp.inference import operators
from rfgp.kernels import SketchedMaternKernel, SketchedRBFKernel
from rfgp.models.regression import ExactGPModel
from rfgp.pyro import batched_predictive, mixture_moments, sample_hyperparameters
from rfgp.training import fit_mll

DTYPE = torch.float64


def make_data(n=100):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(n, 1, generator=generator, dtype=DTYPE)
    y = torch.sin(6 * x[:, 0]) + 0.5 * torch.cos(13 * x[:, 0]) + 0.1 * torch.randn(n, generator=generator, dtype=DTYPE)
    return x, y


def make_model(x, y, num_features=64):
    kernel = gpytorch.kernels.ScaleKernel(
        SketchedRBFKernel(num_features, seed=0, lengthscale_prior=LogNormalPrior(math.log(0.3), 1.0)),
        outputscale_prior=LogNormalPrior(0.0, 1.0),
    )
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_prior=LogNormalPrior(math.log(0.05), 1.0))
    return ExactGPModel(x, y, likelihood, kernel, mean_module=gpytorch.means.ZeroMean()).to(DTYPE)


def test_nuts_hyperparameter_posterior_concentrates_at_mll_optimum(monkeypatch):
    x, y = make_data()
    optimum = make_model(x, y)
    fit_mll(optimum, num_iterations=200, lr=0.05, optimizer="adam")
    mll_lengthscale = optimum.covar_module.base_kernel.lengthscale.item()
    mll_noise = optimum.likelihood.noise.item()

    # Every likelihood evaluation must take the O(N·F²) capacitance path, never the dense one.
    calls = []
    woodbury = operators._statistics_inv_quad_logdet
    monkeypatch.setattr(operators, "_statistics_inv_quad_logdet", lambda *a: calls.append(1) or woodbury(*a))
    monkeypatch.setattr(operators, "kernel_space_inv_quad_logdet", lambda *a: pytest.fail("dense N × N path used"))

    pyro.set_rng_seed(0)
    model = make_model(x, y)
    samples = sample_hyperparameters(model, num_samples=60, warmup_steps=60, max_tree_depth=4)
    assert calls
    lengthscale = samples["covar_module.base_kernel.lengthscale_prior"].flatten()
    noise = samples["likelihood.noise_covar.noise_prior"].flatten()
    assert lengthscale.shape == noise.shape == (60,)
    # Concentrated: posterior spread ≪ prior spread (LogNormal σ = 1, i.e. a factor e).
    assert lengthscale.log().std() < 0.15 and noise.log().std() < 0.25
    # ... and at the optimum (Bernstein–von Mises): within a few posterior sds of the MLL optimum.
    assert abs(lengthscale.log().median() - math.log(mll_lengthscale)) < 2 * lengthscale.log().std()
    assert abs(noise.log().median() - math.log(mll_noise)) < 2 * noise.log().std()

    # The loaded model is a batch of 60 GPs sharing one feature draw; component s equals a
    # single GP with hyperparameters set to sample s.
    x_test = torch.linspace(0, 1, 7, dtype=DTYPE).unsqueeze(-1)
    output = batched_predictive(model, samples, x_test)
    assert output.batch_shape == (60,) and output.event_shape == (7,)
    single = make_model(x, y)
    single.covar_module.base_kernel.lengthscale = lengthscale[5]
    single.covar_module.outputscale = samples["covar_module.outputscale_prior"][5]
    single.likelihood.noise = noise[5]
    single.eval()
    with torch.no_grad():
        reference = single(x_test)
    torch.testing.assert_close(output.mean[5], reference.mean, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(output.variance[5], reference.variance, rtol=1e-6, atol=1e-8)
    mean, variance = mixture_moments(output)
    assert (variance >= output.variance.mean(0) - 1e-12).all()  # total variance ≥ mean within-variance
    truth = torch.sin(6 * x_test[:, 0]) + 0.5 * torch.cos(13 * x_test[:, 0])
    assert ((mean - truth).abs() < 0.1).all()


def test_errors():
    x, y = make_data(10)
    with pytest.raises(TypeError, match="ExactGP"):
        sample_hyperparameters(torch.nn.Linear(1, 1))
    bare = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(),
                        gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0)))
    with pytest.raises(ValueError, match="no hyperparameter priors"):
        sample_hyperparameters(bare)
    samples = {"covar_module.base_kernel.lengthscale_prior": torch.ones(3, 1, 1, dtype=DTYPE)}
    with pytest.raises(ValueError, match="sample_hyperparameters"):
        batched_predictive(make_model(x, y), samples, x)


def test_nuts_samples_the_matern_half_model_anchored_at_its_current_lengthscale(monkeypatch):
    """A Matérn-½ kernel fixes its anchor ℓ₀ at its first evaluation.  sample_hyperparameters made that evaluation
    inside its copy of the model at NUTS' random initial point (ℓ₀ = 4.7 here, where ℓ = 0.69) and the loaded model
    at its first prediction, at every sample (r ≡ 1: other features than NUTS sampled under).  Now ℓ₀ = the model's
    ℓ before sampling, NUTS' E[log ℓ] is the model's (a grid over ℓ of its MLL × prior: 0.38; NUTS 0.40 ± 0.07,
    before −0.15, 7 SE off), and component s of the predictive is the model at sample s."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(100, 2, generator=generator, dtype=DTYPE)
    y = torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(100, generator=generator, dtype=DTYPE)

    def make(kernel):
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = 0.3
        likelihood.raw_noise.requires_grad_(False)
        return ExactGPModel(x, y, likelihood, kernel, mean_module=gpytorch.means.ZeroMean()).to(DTYPE)

    prior = LogNormalPrior(0.0, 1.0)
    kernel = SketchedMaternKernel(256, nu=0.5, seed=0, lengthscale_prior=prior)
    model = make(kernel)
    initial = kernel.lengthscale.detach().clone()
    anchored_at = []
    anchor = SketchedMaternKernel.anchor_lengthscale
    monkeypatch.setattr(SketchedMaternKernel, "anchor_lengthscale",
                        lambda self: anchored_at.append(self.lengthscale.detach().clone()) or anchor(self))
    pyro.set_rng_seed(0)
    samples = sample_hyperparameters(model, num_samples=150, warmup_steps=100, max_tree_depth=4)
    assert len(anchored_at) == 1 and torch.equal(anchored_at[0], initial)
    assert torch.equal(kernel.lengthscale_anchor, initial)

    # the model's posterior of log ℓ on a grid: its MLL (anchored at the initial ℓ) × the prior
    grid = torch.linspace(math.log(0.05), math.log(8.0), 300, dtype=DTYPE)
    reference = make(SketchedMaternKernel(256, nu=0.5, seed=0)).train()
    reference.covar_module.lengthscale = initial
    reference.covar_module.anchor_lengthscale()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(reference.likelihood, reference)
    log_posterior = []
    with torch.no_grad():
        for value in grid:
            reference.covar_module.lengthscale = value.exp()
            log_posterior.append(mll(reference(x), y) * len(y) + prior.log_prob(value.exp()) + value)
    assert torch.equal(reference.covar_module.lengthscale_anchor, initial)
    weights = torch.stack(log_posterior).softmax(0)
    expected = (weights * grid).sum()
    log_lengthscale = samples["covar_module.lengthscale_prior"].flatten().log()
    ess = effective_sample_size(log_lengthscale.reshape(1, -1, 1)).item()
    se = log_lengthscale.std() / math.sqrt(ess)
    assert abs(log_lengthscale.mean() - expected) <= 4 * se, (log_lengthscale.mean(), expected, se)

    x_test = torch.rand(5, 2, generator=generator, dtype=DTYPE)
    output = batched_predictive(model, samples, x_test)
    assert torch.equal(kernel.lengthscale_anchor, initial)
    reference.covar_module.lengthscale = samples["covar_module.lengthscale_prior"][7]
    reference.eval()
    with torch.no_grad():
        single = reference(x_test)
    torch.testing.assert_close(output.mean[7], single.mean, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(output.variance[7], single.variance, rtol=1e-6, atol=1e-8)


def test_nuts_rejects_proposals_below_a_transform_less_constraint():
    """A noise constraint without a transform (BoTorch's GreaterThan(1e-4, transform=None)) is not enforced by the
    prior's setting closure: on noiseless data NUTS sampled the noise down to 1e-7 and loaded it into the model.
    Such proposals are rejected, so every sample and the loaded model keep noise ≥ the bound."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(25, 1, generator=generator, dtype=DTYPE)
    y = torch.sin(3 * x[:, 0])
    kernel = gpytorch.kernels.ScaleKernel(
        SketchedRBFKernel(32, seed=0, lengthscale_prior=LogNormalPrior(math.log(0.5), 0.5)))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(
        noise_prior=LogNormalPrior(math.log(1e-4), 1.0),
        noise_constraint=gpytorch.constraints.GreaterThan(1e-4, transform=None, initial_value=1e-3))
    model = ExactGPModel(x, y, likelihood, kernel, mean_module=gpytorch.means.ZeroMean()).to(DTYPE)
    pyro.set_rng_seed(0)
    samples = sample_hyperparameters(model, num_samples=30, warmup_steps=30, max_tree_depth=4)
    assert (samples["likelihood.noise_covar.noise_prior"] >= 1e-4).all()
    assert (model.likelihood.noise >= 1e-4).all()


def test_mixture_variance_does_not_cancel_for_large_means():
    """mean_s(σ²_s + μ_s²) − E[f]² in float32 with means near 1000 returned 0 for a variance of 1.0025e-4."""
    output = gpytorch.distributions.MultivariateNormal(
        torch.tensor([[1000.0], [1000.001]]), torch.full((2, 1, 1), 1e-4))
    mean, variance = mixture_moments(output)
    spread = (output.mean - mean).pow(2).mean(0)
    torch.testing.assert_close(variance, 1e-4 + spread, rtol=1e-5, atol=0.0)


def test_a_model_holding_loaded_samples_is_refused_and_left_as_it_was():
    """A second call sampled S independent copies of each hyperparameter given S copies of the same data (samples of
    shape (num_samples, S, ...)), the posterior of another model, and loaded them."""
    x, y = make_data(20)
    model = make_model(x, y, num_features=16)
    model.pyro_load_from_samples({"covar_module.base_kernel.lengthscale_prior": torch.full((3, 1, 1), 0.3, dtype=DTYPE),
                                  "covar_module.outputscale_prior": torch.ones(3, dtype=DTYPE),
                                  "likelihood.noise_covar.noise_prior": torch.full((3, 1), 0.01, dtype=DTYPE)})
    model.eval()
    with pytest.raises(ValueError, match="holds 3 hyperparameter samples loaded by an earlier sample_hyperparameters"):
        sample_hyperparameters(model, num_samples=2, warmup_steps=2)
    assert not model.training


def test_batched_predictive_refuses_empty_samples():
    x, y = make_data(10)
    with pytest.raises(ValueError, match="non-empty dict"):
        batched_predictive(make_model(x, y), {}, x)


def test_a_failed_run_leaves_the_model_in_the_mode_it_was_given_in(monkeypatch):
    """sample_hyperparameters switched the model to train mode first, and an error (or an interrupt) inside NUTS left
    it there."""
    from rfgp.pyro import bayesian_hyperparameters

    def interrupted(self, *args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(bayesian_hyperparameters.MCMC, "run", interrupted)
    x, y = make_data(20)
    model = make_model(x, y, num_features=16)
    model.eval()
    with pytest.raises(KeyboardInterrupt):
        sample_hyperparameters(model, num_samples=2, warmup_steps=2)
    assert not model.training and not model.likelihood.training
