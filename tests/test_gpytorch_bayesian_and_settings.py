"""GPyTorch user patterns on rfgp kernels: fully Bayesian hyperparameters (priors, ``pyro_sample_from_prior`` under
NUTS, ``pyro_load_from_samples`` and a batch of S models), GPyTorch's global settings, and the distribution API of
``likelihood(model(x))``, each against the same model with the exact kernel or the same model without the setting."""

import copy

import gpytorch
import pyro
import pytest
import torch
from gpytorch.kernels import (
    LinearKernel,
    MaternKernel,
    PeriodicKernel,
    PolynomialKernel,
    RBFKernel,
    RQKernel,
    ScaleKernel,
    SpectralMixtureKernel,
)
from gpytorch.priors import LogNormalPrior, NormalPrior

import rfgp
from rfgp.inference import posterior_covariance

from ._models import UserGP

DTYPE = torch.float64


def data(num_data=40, num_test=6, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(num_data, d, generator=g, dtype=DTYPE)
    test_x = torch.rand(num_test, d, generator=g, dtype=DTYPE)
    y = torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(num_data, generator=g, dtype=DTYPE)
    return x, y, test_x, torch.sin(4 * test_x).sum(-1)


def exact_kernel(d=2):
    kernel = ScaleKernel(RBFKernel(ard_num_dims=d)).to(DTYPE)
    kernel.base_kernel.lengthscale = torch.tensor([[0.3, 0.5]], dtype=DTYPE)[:, :d]
    return kernel


def user_model(x, y, kernel, noise=0.05):
    model = UserGP(x, y, kernel).to(DTYPE)
    model.likelihood.noise = noise
    return model


def test_predictive_log_prob_of_few_test_points_uses_their_n_x_n_factor(monkeypatch):
    """log_prob of n* = 6 test targets under a posterior of width F = 2048: the predictive covariance RRᵀ + σ²I
    (:class:`LowRankPosteriorAddedDiag`) factorises its 6 × 6 matrix.  GPyTorch's ``log_prob`` calls
    ``evaluate_kernel()`` first, which rebuilt it as linear_operator's plain ``LowRankRootAddedDiagLinearOperator``,
    whose Woodbury form factorises the F × F capacitance: 0.48 s at F = 2048, 59 s at F = 16 384 and a 34 GB
    allocation at F = 65 536, for 6 points."""
    x, y, test_x, test_y = data()
    model = user_model(x, y, rfgp.sketch(exact_kernel(), 2048, method="orf", seed=0)).eval()
    calls = []
    kernel_space = posterior_covariance.kernel_space_inv_quad_logdet
    monkeypatch.setattr(posterior_covariance, "kernel_space_inv_quad_logdet",
                        lambda *args: calls.append(args[0].shape) or kernel_space(*args))
    with torch.no_grad():
        predictive = model.likelihood(model(test_x))
        covariance = predictive.lazy_covariance_matrix.evaluate_kernel()
        assert isinstance(covariance, posterior_covariance.LowRankPosteriorAddedDiag)
        value = predictive.log_prob(test_y)
        nlpd = gpytorch.metrics.negative_log_predictive_density(predictive, test_y)
    assert calls and all(shape[-2:] == (6, 2048) for shape in calls)
    dense = torch.distributions.MultivariateNormal(predictive.mean, predictive.covariance_matrix).log_prob(test_y)
    torch.testing.assert_close(value, dense, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(nlpd, -dense / 6, rtol=1e-10, atol=1e-10)


# ------------------------------------------------------------------ 1. fully Bayesian: a batch of S sampled models
def _with_priors(model):
    """GPyTorch's tutorial priors: on the constant mean, the noise, every lengthscale and every outputscale, with the
    tutorial's ``Positive()`` noise constraint (GaussianLikelihood's default ``GreaterThan(1e-4)`` turns NUTS
    proposals below 1e-4 into NaN noise, which the exact model refuses as rfgp does, with a ``NanError``)."""
    model.likelihood.noise_covar.register_constraint("raw_noise", gpytorch.constraints.Positive())
    model.mean_module.register_prior("mean_prior", NormalPrior(0.0, 1.0), "constant")
    model.likelihood.register_prior("noise_prior", LogNormalPrior(-2.0, 0.5), "noise")
    for module in list(model.covar_module.modules()):
        if getattr(module, "raw_lengthscale", None) is not None:
            module.register_prior("lengthscale_prior", LogNormalPrior(-0.5, 0.3), "lengthscale")
        if isinstance(module, ScaleKernel):
            module.register_prior("outputscale_prior", LogNormalPrior(0.0, 0.3), "outputscale")
    return model


def _hand_made_samples(model, num_samples, seed=1):
    """``{prior name: (S, *hyperparameter shape)}`` drawn from the priors, as ``mcmc.get_samples()`` returns them."""
    torch.manual_seed(seed)
    return {name: prior.expand(closure(module).shape).sample(torch.Size([num_samples]))
            for name, module, prior, closure, _ in model.named_priors()}


def _log_likelihood_and_predictive(model, test_x):
    """log p(y | θ) on the (sample-batched) training data in train mode, then ``likelihood(model(test_x))``."""
    model.train()
    with torch.no_grad():
        log_likelihood = model.likelihood(model(*model.train_inputs)).log_prob(model.train_targets)
        model.eval()
        return log_likelihood, model.likelihood(model(test_x))


SAMPLED_KERNELS = {
    "orf": lambda x: rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=2)), 64, method="orf", seed=0),
    "sorf": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 64, method="sorf", seed=0),
    "matern_half": lambda x: rfgp.sketch(ScaleKernel(MaternKernel(nu=0.5)), 64, seed=0),
    "periodic": lambda x: rfgp.sketch(ScaleKernel(PeriodicKernel()), 64, seed=0),
    "rq": lambda x: rfgp.sketch(ScaleKernel(RQKernel()), 64, seed=0),
    "periodic_x_rbf": lambda x: rfgp.sketch(ScaleKernel(PeriodicKernel() * RBFKernel()), 64, seed=0),
    "polynomial_x_rbf": lambda x: rfgp.sketch(ScaleKernel(PolynomialKernel(power=2) * RBFKernel()), 64, seed=0),
    "linear_plus_matern": lambda x: rfgp.sketch(ScaleKernel(LinearKernel()) + ScaleKernel(MaternKernel(nu=1.5)), 64,
                                                seed=0),
    "spectral_mixture": lambda x: rfgp.sketch(SpectralMixtureKernel(num_mixtures=2, ard_num_dims=2), 64, seed=0),
    "maclaurin": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 64, method="maclaurin", seed=0),
    "nystrom": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 16, method="nystrom", x_sample=x, seed=0),
}


@pytest.mark.parametrize("name", SAMPLED_KERNELS)
def test_loaded_samples_make_a_batch_of_models_each_equal_to_its_sample(name):
    """``model.pyro_load_from_samples(samples)`` gives every hyperparameter a leading batch dimension S while the
    kernel's draws stay unbatched buffers: the batched marginal likelihood (train mode) and posterior predictive at
    ``test_x.unsqueeze(0).repeat(S, 1, 1)`` (GPyTorch's tutorial) equal, member by member, the model loaded with one
    sample's hyperparameters (same draws)."""
    x, y, test_x, _ = data(num_data=30, num_test=5)
    model = _with_priors(user_model(x, y, SAMPLED_KERNELS[name](x)))
    model.covar_module(x).to_dense()  # fixes what is fixed at the first evaluation (allocation, anchor, proposal)
    num_samples = 3
    samples = _hand_made_samples(model, num_samples)
    singles = []
    for s in range(num_samples):  # a batch of one: ExactGP.local_load_samples adds the sample dimension to the data
        single = copy.deepcopy(model)
        single.pyro_load_from_samples({key: value[s:s + 1] for key, value in samples.items()})
        singles.append(_log_likelihood_and_predictive(single, test_x.unsqueeze(0)))
    model.pyro_load_from_samples(samples)
    log_likelihood, predictive = _log_likelihood_and_predictive(model, test_x.unsqueeze(0).repeat(num_samples, 1, 1))
    assert log_likelihood.shape == (num_samples,) and predictive.mean.shape == (num_samples, 5)
    for s, (single_log_likelihood, single_predictive) in enumerate(singles):
        torch.testing.assert_close(log_likelihood[s], single_log_likelihood[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(predictive.mean[s], single_predictive.mean[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(predictive.covariance_matrix[s], single_predictive.covariance_matrix[0], rtol=1e-10,
                                   atol=1e-10)


def _tutorial_pyro_model(model):
    """GPyTorch's "Fully Bayesian GPs" Pyro model: hyperparameters from their priors, the targets observed."""
    def pyro_model(x, y):
        with gpytorch.settings.fast_computations(False, False, False):
            sampled = model.pyro_sample_from_prior()
            pyro.sample("obs", sampled.likelihood(sampled(x)), obs=y)
        return y
    return pyro_model


def test_tutorial_nuts_log_joint_equals_the_exact_models_and_its_samples_load():
    """The tutorial's Pyro model has the exact model's log joint density (priors + marginal likelihood, with the
    fast computations off) where the rfgp kernel is exact — Nyström with every training point a landmark — and a tiny
    NUTS run on an ORF model loads into a batch of S models that predict finite, per-sample posteriors."""
    x, y, test_x, _ = data(num_data=25, num_test=4)
    exact = _with_priors(user_model(x, y, exact_kernel()))
    nystrom = _with_priors(user_model(x, y, rfgp.sketch(exact_kernel(), 25, method="nystrom", x_sample=x, seed=0)))
    for values in ({"mean": 0.3, "noise": 0.04, "outputscale": 1.3, "lengthscale": 0.4},
                   {"mean": -0.2, "noise": 0.2, "outputscale": 0.7, "lengthscale": 0.9}):
        log_joints = []
        for model in (exact, nystrom):
            names = {name: name.rsplit(".", 1)[-1].split("_")[0] for name, *_ in model.named_priors()}
            conditioned = pyro.poutine.condition(_tutorial_pyro_model(model), data={
                name: torch.full(closure(module).shape, values[names[name]], dtype=DTYPE)
                for name, module, _, closure, _ in model.named_priors()})
            log_joints.append(pyro.poutine.trace(conditioned).get_trace(x, y).log_prob_sum())
        # exact up to the jitter of chol(K(Z, Z) + εI) (4e-7 relative at ℓ = 0.9, where K(Z, Z) is ill-conditioned)
        torch.testing.assert_close(log_joints[1], log_joints[0], rtol=1e-5, atol=0.0)

    model = _with_priors(user_model(x, y, rfgp.sketch(exact_kernel(), 64, method="orf", seed=0)))
    pyro.set_rng_seed(0)
    mcmc = pyro.infer.MCMC(pyro.infer.NUTS(_tutorial_pyro_model(model), max_tree_depth=3, jit_compile=False),
                           num_samples=3, warmup_steps=3, disable_progbar=True)
    mcmc.run(x, y)
    samples = mcmc.get_samples()
    assert samples["covar_module.base_kernel.lengthscale_prior"].shape == (3, 1, 2)
    model.pyro_load_from_samples(samples)
    _, predictive = _log_likelihood_and_predictive(model, test_x.unsqueeze(0).repeat(3, 1, 1))
    single = _with_priors(user_model(x, y, rfgp.sketch(exact_kernel(), 64, method="orf", seed=0)))
    single.pyro_load_from_samples({key: value[2:] for key, value in samples.items()})
    _, single_predictive = _log_likelihood_and_predictive(single, test_x.unsqueeze(0))
    torch.testing.assert_close(predictive.mean[2], single_predictive.mean[0], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(predictive.variance[2], single_predictive.variance[0], rtol=1e-10, atol=1e-10)
