"""GPyTorch's Pyro-integrated models, noise models and model lists with rfgp kernels, each against the same model with
the exact kernel.

Every model is built twice with the same hyperparameters and variational parameters: once with GPyTorch's exact kernel,
once converted by ``rfgp.sketch``.  Nyström features whose landmarks are every training, inducing and test point give
the exact model (to the landmark jitter), and ORF features approach it as F grows (random-feature error ∝ 1/√F: the
tests ask the 256× wider map for less than half the narrow map's error and for a bound).  Pyro objectives are
Monte-Carlo estimates; both models draw the same standard normals (same seed, same sample sites and shapes), so the
comparison is not drowned in sampling noise.
"""

import math

import gpytorch
import pyro
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import (
    FixedNoiseGaussianLikelihood,
    GaussianLikelihood,
    GaussianLikelihoodWithMissingObs,
    LikelihoodList,
    _GaussianLikelihoodBase,
)
from gpytorch.likelihoods.noise_models import HeteroskedasticNoise

import rfgp
from rfgp.core.validation import NonFiniteError

from ._cost import LargestTensor
from ._models import UserSVGP

F64 = torch.float64


def exact(kernel):
    return kernel


def orf(width):
    return lambda kernel: rfgp.sketch(kernel, width, method="orf", seed=0)


def nystrom(points):
    """Nyström features with every given point as a landmark: the exact kernel on those points."""
    return lambda kernel: rfgp.sketch(kernel, len(points), method="nystrom", x_sample=points, seed=0)


def rbf(lengthscale, outputscale, batch_shape=torch.Size([])):
    kernel = ScaleKernel(RBFKernel(batch_shape=batch_shape, ard_num_dims=lengthscale.shape[-1]),
                         batch_shape=batch_shape).double()
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def relative_errors(sketched, reference):
    return [float((s - e).abs().max() / e.abs().max()) for s, e in zip(sketched, reference)]


def assert_approaches(outputs, bound, widths=(256, 65536)):
    reference = outputs(exact)
    narrow, wide = (relative_errors(outputs(orf(width)), reference) for width in widths)
    assert all(w < n / 2 for w, n in zip(wide, narrow)), (narrow, wide)
    assert max(wide) < bound, (narrow, wide)


def lengthscale_grads(module):
    return torch.cat([p.grad.flatten() for name, p in module.named_parameters() if name.endswith("raw_lengthscale")])


def set_cholesky_variational(strategy, scale=0.3, seed=3):
    """A fixed, non-trivial q(u): means scale·N(0, 1), covariance factors 0.4·I + 0.1·strict-tril(N(0, 1))."""
    gen = torch.Generator().manual_seed(seed)
    distribution = strategy._variational_distribution
    size = distribution.num_inducing_points
    distribution.variational_mean.data = scale * torch.randn(distribution.variational_mean.shape, generator=gen,
                                                             dtype=F64)
    noise = torch.randn(distribution.chol_variational_covar.shape, generator=gen, dtype=F64).tril(-1)
    distribution.chol_variational_covar.data = 0.4 * torch.eye(size, dtype=F64) + 0.1 * noise
    strategy.variational_params_initialized.fill_(1)


def pyro_outputs(model, *data, particles=64):
    """Trace_ELBO loss (vectorised particles, pyro seed 1), the gradient of its lengthscales, and q(f)'s mean and
    variance at the model's test points."""
    pyro.clear_param_store()
    pyro.set_rng_seed(1)
    elbo = pyro.infer.Trace_ELBO(num_particles=particles, vectorize_particles=True, retain_graph=True)
    loss = elbo.differentiable_loss(model.model, model.guide, *data)
    loss.backward()
    model.eval()
    with torch.no_grad():
        posterior = model(model.test_x)
    return loss.detach(), lengthscale_grads(model), posterior.mean, posterior.variance


def svi_losses(model, *data, steps=4):
    pyro.clear_param_store()
    pyro.set_rng_seed(2)
    elbo = pyro.infer.Trace_ELBO(num_particles=4, vectorize_particles=True, retain_graph=True)
    svi = pyro.infer.SVI(model.model, model.guide, pyro.optim.Adam({"lr": 0.05}), elbo)
    return torch.tensor([svi.step(*data) for _ in range(steps)], dtype=F64)


# --- GPyTorch's Cox-process example: an ApproximateGP whose pyro_model/pyro_guide feed a Poisson-process likelihood ---

class CoxProcessGP(gpytorch.models.ApproximateGP):
    """log λ(t) = f(t) + log(mean rate); the likelihood Σᵢ log λ(tᵢ) − ∫₀ᵀ λ, the integral a mean over a grid."""

    def __init__(self, kernel, max_time, mean_rate, num_inducing=8, name_prefix="cox"):
        self.name_prefix, self.max_time, self.mean_rate = name_prefix, max_time, mean_rate
        inducing = torch.linspace(0, max_time, num_inducing, dtype=F64).unsqueeze(-1)
        q_u = gpytorch.variational.CholeskyVariationalDistribution(num_inducing)
        super().__init__(gpytorch.variational.VariationalStrategy(self, inducing, q_u))
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = kernel
        self.test_x = torch.linspace(0, max_time, 7, dtype=F64).unsqueeze(-1)

    def forward(self, times):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(times), self.covar_module(times))

    def guide(self, arrivals, quadrature):
        q_f = self.pyro_guide(torch.cat([arrivals, quadrature]).unsqueeze(-1), name_prefix=self.name_prefix)
        with pyro.plate(self.name_prefix + ".times_plate", dim=-1):
            pyro.sample(self.name_prefix + ".function_samples", q_f)

    def model(self, arrivals, quadrature):
        pyro.module(self.name_prefix + ".gp", self)
        p_f = self.pyro_model(torch.cat([arrivals, quadrature]).unsqueeze(-1), name_prefix=self.name_prefix)
        with pyro.plate(self.name_prefix + ".times_plate", dim=-1):
            f = pyro.sample(self.name_prefix + ".function_samples", p_f)
        log_rate = f + math.log(self.mean_rate)
        count = arrivals.shape[-1]
        log_likelihood = log_rate[..., :count].sum(-1) - log_rate[..., count:].exp().mean(-1) * self.max_time
        pyro.factor(self.name_prefix + ".log_likelihood", log_likelihood)


def cox_data():
    gen = torch.Generator().manual_seed(0)
    arrivals = torch.sort(10 * torch.rand(60, generator=gen, dtype=F64) ** 0.7).values
    return arrivals, torch.linspace(0, 10, 40, dtype=F64)


def cox_model(convert):
    model = CoxProcessGP(convert(rbf(torch.tensor([[1.0]], dtype=F64), 0.8)), 10.0, 6.0).double()
    set_cholesky_variational(model.variational_strategy)
    return model


def cox_points():
    arrivals, quadrature = cox_data()
    model = cox_model(exact)
    points = [arrivals, quadrature, model.variational_strategy.inducing_points.squeeze(-1), model.test_x.squeeze(-1)]
    return torch.unique(torch.cat(points)).unsqueeze(-1)


def test_cox_process_elbo_gradients_and_intensity_approach_the_exact_kernels():
    """Measured relative errors (ELBO, lengthscale gradient, mean, variance of q(f)): 8.4e-3, 0.098, 0.11, 0.052 at
    F = 256; 3.3e-4, 6.7e-3, 0.010, 4.9e-3 at F = 65 536."""
    data = cox_data()
    assert_approaches(lambda convert: pyro_outputs(cox_model(convert), *data), 0.03)


def test_cox_process_with_nystrom_landmarks_at_every_point_is_the_exact_model_in_svi():
    """The ELBO, its gradient, q(f) and four SVI steps (Adam, hyperparameters and q(u) trained) of the exact model."""
    data = cox_data()
    reference = pyro_outputs(cox_model(exact), *data)
    errors = relative_errors(pyro_outputs(cox_model(nystrom(cox_points())), *data), reference)
    assert max(errors) < 1e-6, errors
    losses = svi_losses(cox_model(exact), *data)
    torch.testing.assert_close(svi_losses(cox_model(nystrom(cox_points())), *data), losses, rtol=1e-6, atol=0)
    assert losses[-1] < losses[0]


# --- GPyTorch's clustered multitask example: a PyroGP whose likelihood infers each task's latent cluster ---

CLUSTERS, TASKS, INDUCING, POINTS = 2, 4, 6, 40


class ClusterGaussianLikelihood(gpytorch.likelihoods.Likelihood):
    """yₜ ~ N(Σₖ cₜₖ fₖ, σ²) with one-hot cluster assignments cₜ: uniform prior, learned categorical guide."""

    def __init__(self):
        super().__init__()
        self.register_buffer("prior_logits", torch.zeros(TASKS, CLUSTERS, dtype=F64))
        self.variational_logits = torch.nn.Parameter(torch.tensor([[2.0, -2.0], [2.0, -1.0], [-2.0, 2.0],
                                                                   [-1.0, 2.0]], dtype=F64))
        self.raw_noise = torch.nn.Parameter(torch.tensor(-2.0, dtype=F64))
        self.max_plate_nesting = 1

    def _clusters(self, logits):
        return pyro.sample(self.name_prefix + ".clusters", pyro.distributions.OneHotCategorical(logits=logits)
                           .to_event(1))

    def pyro_guide(self, function_dist, target):
        self._clusters(self.variational_logits)
        return super().pyro_guide(function_dist, target)

    def pyro_model(self, function_dist, target):
        return super().pyro_model(function_dist, target, clusters=self._clusters(self.prior_logits))

    def forward(self, function_samples, clusters=None):
        clusters = self._clusters(self.variational_logits) if clusters is None else clusters
        mean = (function_samples.unsqueeze(-2) * clusters).sum(-1)
        return pyro.distributions.Normal(mean, torch.nn.functional.softplus(self.raw_noise).sqrt()).to_event(1)


class ClusteredMultitaskGP(gpytorch.models.PyroGP):
    """K latent functions (a batch kernel with a lengthscale and outputscale each) shared by T tasks."""

    def __init__(self, kernel):
        batch = torch.Size([CLUSTERS])
        inducing = torch.linspace(0, 1, INDUCING, dtype=F64).unsqueeze(-1)
        q_u = gpytorch.variational.CholeskyVariationalDistribution(INDUCING, batch_shape=batch)
        strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
            gpytorch.variational.VariationalStrategy(self, inducing, q_u), num_tasks=CLUSTERS)
        super().__init__(strategy, ClusterGaussianLikelihood(), num_data=POINTS, name_prefix="clustered")
        self.mean_module = gpytorch.means.ZeroMean(batch_shape=batch)
        self.covar_module = kernel
        self.test_x = torch.linspace(0, 1, 7, dtype=F64).unsqueeze(-1)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def cluster_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.linspace(0, 1, POINTS, dtype=F64)
    functions = torch.stack([torch.sin(6 * x), torch.cos(4 * x)], -1)
    return x, functions[:, [0, 0, 1, 1]] + 0.1 * torch.randn(POINTS, TASKS, generator=gen, dtype=F64)


def cluster_model(convert):
    kernel = rbf(torch.tensor([0.25, 0.35], dtype=F64).view(CLUSTERS, 1, 1), torch.tensor([0.8, 1.2], dtype=F64),
                 torch.Size([CLUSTERS]))
    model = ClusteredMultitaskGP(convert(kernel)).double()
    set_cholesky_variational(model.variational_strategy.base_variational_strategy, scale=0.5)
    return model


def cluster_points():
    x, _ = cluster_data()
    model = cluster_model(exact)
    inducing = model.variational_strategy.base_variational_strategy.inducing_points.squeeze(-1)
    return torch.unique(torch.cat([x, inducing, model.test_x.squeeze(-1)])).unsqueeze(-1)


def test_clustered_multitask_pyro_gp_approaches_the_exact_kernels():
    """Measured relative errors (ELBO, lengthscale gradients, mean, variance of q(f)): 0.019, 0.41, 0.066, 0.030 at
    F = 256; 3.5e-3, 0.081, 0.011, 3.4e-3 at F = 65 536 (the gradients of the two lengthscales differ 3-fold)."""
    data = cluster_data()
    assert_approaches(lambda convert: pyro_outputs(cluster_model(convert), *data), 0.12)


def test_clustered_multitask_pyro_gp_with_nystrom_landmarks_at_every_point_is_the_exact_model_in_svi():
    data = cluster_data()
    reference = pyro_outputs(cluster_model(exact), *data)
    errors = relative_errors(pyro_outputs(cluster_model(nystrom(cluster_points())), *data), reference)
    assert max(errors) < 1e-5, errors
    losses = svi_losses(cluster_model(exact), *data)
    # the landmark jitter's 1e-7 moves the fourth loss by 4e-5 (measured) after three Adam steps on 30 parameters
    torch.testing.assert_close(svi_losses(cluster_model(nystrom(cluster_points())), *data), losses, rtol=2e-4,
                               atol=0)
    assert losses[-1] < losses[0]


# --- Noise models: missing observations, a GP as the noise model, fixed noise plus a learned constant ---

class RegressionGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


NOISE_N = 120


def noise_data():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(NOISE_N, 2, generator=gen, dtype=F64)
    scale = 0.05 + 0.3 * x[:, 0]
    y = torch.sin(4 * x[:, 0]) + x[:, 1] + scale * torch.randn(NOISE_N, generator=gen, dtype=F64)
    return x, y, scale, torch.rand(15, 2, generator=gen, dtype=F64)


def main_kernel():
    return rbf(torch.tensor([[0.3, 0.5]], dtype=F64), 1.3)


def heteroskedastic_likelihood(convert_noise):
    """GPyTorch's heteroskedastic recipe: log σ²(x) is the posterior mean of a GP fitted to log noise observations."""
    x, _, scale, _ = noise_data()
    noise_gp = RegressionGP(x, (2 * scale).log(), convert_noise(rbf(torch.tensor([[0.4, 0.8]], dtype=F64), 0.5)),
                            GaussianLikelihood()).double()
    noise_gp.likelihood.noise = 0.1
    return _GaussianLikelihoodBase(noise_covar=HeteroskedasticNoise(noise_gp))


LIKELIHOODS = {
    "missing_obs": lambda convert: GaussianLikelihoodWithMissingObs(),
    "fixed_plus_learned": lambda convert: FixedNoiseGaussianLikelihood(noise=0.05 + 0.1 * noise_data()[2],
                                                                       learn_additional_noise=True),
    "heteroskedastic_main": lambda convert: heteroskedastic_likelihood(exact),
    "heteroskedastic_noise": lambda convert: heteroskedastic_likelihood(convert),
    "heteroskedastic_both": lambda convert: heteroskedastic_likelihood(convert),
}


def noise_outputs(name):
    """−MLL, the gradients of every lengthscale (the noise GP's too) and likelihood(model(x*), x*)'s mean and
    variance; ``convert`` goes to the main kernel except for "heteroskedastic_noise" (the noise GP's only)."""
    x, y, _, test_x = noise_data()
    params = (x,) if name.startswith("heteroskedastic") else ()

    def outputs(convert):
        likelihood = LIKELIHOODS[name](convert)
        main = exact if name == "heteroskedastic_noise" else convert
        model = RegressionGP(x, y, main(main_kernel()), likelihood).double()
        loss = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y, *params)
        loss.backward()
        model.eval()
        with torch.no_grad():
            predictive = likelihood(model(test_x), *((test_x,) if params else ()))
        return loss.detach(), lengthscale_grads(model), predictive.mean, predictive.variance

    return outputs


@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_noise_models_with_nystrom_landmarks_at_every_point_are_the_exact_model(name):
    x, _, _, test_x = noise_data()
    outputs = noise_outputs(name)
    errors = relative_errors(outputs(nystrom(torch.cat([x, test_x]))), outputs(exact))
    assert max(errors) < 1e-6, errors


@pytest.mark.parametrize("name", list(LIKELIHOODS))
def test_noise_models_approach_the_exact_kernels(name):
    """Measured relative errors (−MLL, lengthscale gradients, predictive mean, variance) at F = 256 → 16 384: missing
    obs and fixed + learned noise 2.5e-3 → 3.4e-4, 0.064 → 0.011, 0.019 → 2.4e-3, 0.015 → 2.2e-3; heteroskedastic
    with an rfgp kernel in the main GP 8.3e-3 → 9.7e-4, 0.029 → 0.013, 9.7e-3 → 2.0e-3, 0.020 → 2.5e-3 (in both GPs
    alike); in the noise GP only 3.7e-5 → 7.4e-6, 1.9e-3 → 8.8e-5, 3.9e-4 → 3.2e-5, 0.024 → 1.2e-3."""
    assert_approaches(noise_outputs(name), 0.02, widths=(256, 16384))


@pytest.mark.parametrize("name", ["missing_obs", "fixed_plus_learned", "heteroskedastic_both"])
def test_noise_models_keep_the_feature_space_path(name, factorised):
    """At N = 120 > F = 32 nothing larger than the F × F capacitance is factorised, in training or prediction; the
    exact model factorises N × N (so the spy sees what it should)."""
    outputs = noise_outputs(name)
    outputs(orf(32))
    assert factorised and max(factorised) == 32, factorised
    factorised.clear()
    outputs(exact)
    assert max(factorised) == NOISE_N


def test_missing_obs_likelihood_with_nan_targets_raises_where_the_exact_model_returns_nan():
    """GaussianLikelihoodWithMissingObs masks NaN targets only in expected_log_prob/log_marginal; an ExactGP's
    marginal likelihood goes through ``marginal`` and GPyTorch's exact model returns a NaN loss (upstream, GPyTorch
    1.15.2: the likelihood is deprecated for gpytorch.settings.observation_nan_policy).  rfgp raises instead, naming
    that setting."""
    x, y, _, _ = noise_data()
    y = y.clone()
    y[::7] = float("nan")
    for convert in (exact, orf(32)):
        likelihood = GaussianLikelihoodWithMissingObs()
        model = RegressionGP(x, y, convert(main_kernel()), likelihood).double()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        if convert is exact:
            assert mll(model(x), y).isnan()
        else:
            with pytest.raises(NonFiniteError, match=r"observation_nan_policy\('mask'\)"):
                mll(model(x), y)
    with gpytorch.settings.observation_nan_policy("mask"):
        observed = ~y.isnan()
        losses = []
        for xs, ys in ((x, y), (x[observed], y[observed])):
            likelihood = GaussianLikelihoodWithMissingObs()
            model = RegressionGP(xs, ys, orf(32)(main_kernel()), likelihood).double()
            # GPyTorch divides the masked log likelihood by every target's count, the observed ones' included
            losses.append(gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(xs), ys) * len(ys))
    torch.testing.assert_close(losses[0], losses[1], rtol=1e-10, atol=0)



def missing_obs_svgp_outputs(convert):
    """GaussianLikelihoodWithMissingObs where it masks NaN targets, in a variational ELBO: −ELBO (every 7th target
    NaN), its lengthscale gradients, likelihood(model(x*))'s mean and variance."""
    x, y, _, test_x = noise_data()
    y = y.clone()
    y[::7] = float("nan")
    model = UserSVGP(convert(main_kernel()), x[:10].clone()).double()
    set_cholesky_variational(model.variational_strategy)
    likelihood = GaussianLikelihoodWithMissingObs().double()
    loss = -gpytorch.mlls.VariationalELBO(likelihood, model, num_data=NOISE_N)(model(x), y)
    loss.backward()
    model.eval()
    with torch.no_grad():
        predictive = likelihood(model(test_x))
    return loss.detach(), lengthscale_grads(model), predictive.mean, predictive.variance


def test_missing_obs_likelihood_in_a_variational_elbo_is_the_exact_kernels():
    """Nyström at every point: the exact model to 1.2e-6 (measured); ORF: 2.5e-3, 0.041, 0.46, 0.034 at F = 256,
    4.7e-4, 4.4e-3, 0.024, 2.3e-3 at F = 65 536 (the mean of a random whitened q(u) is sensitive to K_ZZ)."""
    x, _, _, test_x = noise_data()
    reference = missing_obs_svgp_outputs(exact)
    errors = relative_errors(missing_obs_svgp_outputs(nystrom(torch.cat([x, test_x]))), reference)
    assert max(errors) < 1e-5, errors
    assert_approaches(missing_obs_svgp_outputs, 0.05)


# --- GPyTorch's ModelList tutorial: IndependentModelList, LikelihoodList, SumMarginalLogLikelihood ---

def model_list(n, convert, seed=0):
    """Two ExactGPs on different inputs (n and n/2 points) with their own hyperparameters and likelihoods."""
    gen = torch.Generator().manual_seed(seed)
    x1, x2 = torch.rand(n, 2, generator=gen, dtype=F64), torch.rand(n // 2, 2, generator=gen, dtype=F64)
    y1 = torch.sin(4 * x1[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=F64)
    y2 = torch.cos(3 * x2[:, 1]) + 0.1 * torch.randn(n // 2, generator=gen, dtype=F64)
    models = [RegressionGP(x, y, convert(rbf(torch.tensor([ls], dtype=F64), scale)), GaussianLikelihood()).double()
              for x, y, ls, scale in ((x1, y1, [0.3, 0.5], 1.3), (x2, y2, [0.6, 0.2], 0.7))]
    models[1].likelihood.noise = 0.05
    model = gpytorch.models.IndependentModelList(*models)
    likelihood = LikelihoodList(*(m.likelihood for m in models))
    return model, likelihood, torch.rand(n, 2, generator=gen, dtype=F64)


def model_list_outputs(convert, n=60):
    """−Σ MLL and its lengthscale gradients, then the joint predictive of both outputs at the same test points
    (``MultitaskMultivariateNormal.from_independent_mvns`` of the two likelihood(model(x*))): mean and variance."""
    model, likelihood, test_x = model_list(n, convert)
    loss = -gpytorch.mlls.SumMarginalLogLikelihood(likelihood, model)(model(*model.train_inputs), model.train_targets)
    loss.backward()
    model.eval()
    with torch.no_grad():
        joint = gpytorch.distributions.MultitaskMultivariateNormal.from_independent_mvns(
            likelihood(*model(test_x, test_x)))
    return loss.detach(), lengthscale_grads(model), joint.mean, joint.variance


def test_model_list_with_nystrom_landmarks_at_every_point_is_the_exact_model():
    model, _, test_x = model_list(60, exact)
    points = torch.cat([*(x for (x,) in model.train_inputs), test_x])
    errors = relative_errors(model_list_outputs(nystrom(points)), model_list_outputs(exact))
    assert max(errors) < 1e-6, errors


def test_model_list_approaches_the_exact_kernels():
    """Measured relative errors (−Σ MLL, lengthscale gradients, joint mean, variance): 4.0e-3, 0.077, 0.044, 0.028 at
    F = 256; 2.7e-4, 7.1e-3, 3.1e-3, 8.9e-4 at F = 65 536."""
    assert_approaches(model_list_outputs, 0.01)


def test_model_list_trains_and_predicts_jointly_without_an_n_by_n_tensor():
    """N = 1000 training and test points, F = 32, T = 2 outputs: the sum of marginal likelihoods, its backward pass
    and the joint predictive's mean, variance and confidence region create nothing larger than N × T·F — the joint
    root of the T outputs, which ``from_independent_mvns`` stacks once rfgp's BoTorch integration is imported, else
    N × F — while the exact kernel's model creates N × N tensors, which the counter sees."""
    n, width, outputs = 1000, 32, 2
    for convert, bound in ((orf(width), n * width * outputs), (exact, n * n)):
        model, likelihood, test_x = model_list(n, convert)
        with LargestTensor() as largest:
            mll = gpytorch.mlls.SumMarginalLogLikelihood(likelihood, model)
            mll(model(*model.train_inputs), model.train_targets).backward()
            model.eval()
            with torch.no_grad():
                joint = gpytorch.distributions.MultitaskMultivariateNormal.from_independent_mvns(
                    likelihood(*model(test_x, test_x)))
                lower, upper = joint.confidence_region()
        assert n * width <= largest.numel <= bound if convert is not exact else largest.numel == bound, (
            convert, largest.numel)
        assert joint.mean.shape == (n, 2) and bool((upper > lower).all())


# --- GPyTorch's high-level Pyro example: a PyroGP with one of GPyTorch's own likelihoods ---

class HighLevelPyroGP(gpytorch.models.PyroGP):
    def __init__(self, kernel, likelihood):
        inducing = torch.linspace(0, 1, 6, dtype=F64).unsqueeze(-1)
        q_u = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[-2])
        super().__init__(gpytorch.variational.VariationalStrategy(self, inducing, q_u), likelihood, num_data=40,
                         name_prefix="high_level")
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel
        self.test_x = torch.linspace(0, 1, 7, dtype=F64).unsqueeze(-1)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def high_level_data(likelihood):
    gen = torch.Generator().manual_seed(0)
    x = torch.linspace(0, 1, 40, dtype=F64)
    y = torch.sin(6 * x) + 0.1 * torch.randn(40, generator=gen, dtype=F64)
    return x, y if likelihood is GaussianLikelihood else (y > 0).to(F64)


def high_level_model(convert, likelihood):
    model = HighLevelPyroGP(convert(rbf(torch.tensor([[0.3]], dtype=F64), 1.0)), likelihood()).double()
    set_cholesky_variational(model.variational_strategy)
    return model


@pytest.mark.parametrize("likelihood", [GaussianLikelihood, gpytorch.likelihoods.BernoulliLikelihood])
def test_high_level_pyro_gp_with_nystrom_landmarks_at_every_point_is_the_exact_model_in_svi(likelihood):
    """The ELBO, its lengthscale gradient, q(f) and four SVI steps of the exact model (measured: 2e-7 or less).  ORF
    features converge, the lengthscale gradient slowest (seeds 0 and 1: 0.086 at F = 4096, 0.009–0.015 at
    F = 262 144; the ELBO 4e-4–3e-3 and 4e-5–2e-4)."""
    data = high_level_data(likelihood)
    points = torch.unique(torch.cat([data[0], torch.linspace(0, 1, 6, dtype=F64), torch.linspace(0, 1, 7,
                                                                                                dtype=F64)]))
    convert = nystrom(points.unsqueeze(-1))
    reference = pyro_outputs(high_level_model(exact, likelihood), *data)
    errors = relative_errors(pyro_outputs(high_level_model(convert, likelihood), *data), reference)
    assert max(errors) < 1e-6, errors
    losses = svi_losses(high_level_model(exact, likelihood), *data)
    torch.testing.assert_close(svi_losses(high_level_model(convert, likelihood), *data), losses, rtol=1e-6, atol=0)


def fantasy_inputs():
    gen = torch.Generator().manual_seed(5)
    return ([torch.rand(4, 2, generator=gen, dtype=F64) for _ in range(2)],
            [torch.randn(4, generator=gen, dtype=F64) for _ in range(2)])


def test_model_list_fantasy_model_with_nystrom_landmarks_at_every_point_is_the_exact_models():
    """``IndependentModelList.get_fantasy_model`` (each model's fantasy update of its cached posterior) gives the exact
    models' fantasy posteriors; an ORF model's ``state_dict`` restores its fantasy predictions bit for bit."""
    new_x, new_y = fantasy_inputs()

    def fantasy(convert, state=None):
        model, likelihood, test_x = model_list(60, convert)
        if state is not None:
            model.load_state_dict(state)
        model.eval()
        with torch.no_grad():
            model(test_x, test_x)  # the caches a fantasy update starts from
            posteriors = model.get_fantasy_model(new_x, new_y)(test_x, test_x)
        return model, [p.mean for p in posteriors] + [p.variance for p in posteriors]

    model, reference = fantasy(exact)
    points = torch.cat([*(x for (x,) in model.train_inputs), *new_x, model_list(60, exact)[2]])
    errors = relative_errors(fantasy(nystrom(points))[1], reference)
    assert max(errors) < 1e-6, errors
    trained, expected = fantasy(orf(64))
    assert max(relative_errors(expected, reference)) < 0.5
    for restored, wanted in zip(fantasy(lambda kernel: rfgp.sketch(kernel, 64, method="orf", seed=1),
                                        trained.state_dict())[1], expected):
        assert torch.equal(restored, wanted)


def test_fit_mll_passes_the_training_inputs_to_a_likelihood_that_takes_them():
    """GPyTorch's heteroskedastic recipe evaluates ``mll(model(x), y, x)``: HeteroskedasticNoise needs x for its noise
    GP, as BoTorch's fit_gpytorch_mll passes it.  ``rfgp.fit_mll`` called ``mll(model(x), y)``, and the noise GP, asked
    for its posterior at no inputs, failed with "zip() argument 2 is shorter than argument 1" — rfgp kernel or exact.
    Now both train, with the loss fit_mll reports equal to the heteroskedastic model's −MLL at the trained point."""
    x, y, _, _ = noise_data()
    for convert in (exact, orf(64)):
        likelihood = heteroskedastic_likelihood(convert)
        model = RegressionGP(x, y, convert(main_kernel()), likelihood).double()
        history = rfgp.fit_mll(model, num_iterations=5)
        model.train()  # fit_mll returns the model in eval mode
        loss = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y, x)
        assert history.losses[-1] == pytest.approx(loss.item(), rel=1e-10, abs=0)
        assert history.losses[-1] < history.losses[0]


def test_high_level_pyro_gp_predictive_probabilities_are_the_exact_models():
    """``likelihood(model(x*))`` of the Bernoulli PyroGP in eval mode (GPyTorch's quadrature): Nyström at every point
    gives the exact probabilities; ORF at F = 4096 within 0.01 (measured 6.1e-3, at the boundary x* = 1)."""
    likelihood = gpytorch.likelihoods.BernoulliLikelihood
    x, _ = high_level_data(likelihood)
    points = torch.unique(torch.cat([x, torch.linspace(0, 1, 6, dtype=F64), torch.linspace(0, 1, 7, dtype=F64)]))

    def probabilities(convert):
        model = high_level_model(convert, likelihood)
        model.eval()
        with torch.no_grad():
            return model.likelihood(model(model.test_x)).mean

    reference = probabilities(exact)
    torch.testing.assert_close(probabilities(nystrom(points.unsqueeze(-1))), reference, rtol=1e-7, atol=0)
    assert (probabilities(orf(4096)) - reference).abs().max() < 0.01
