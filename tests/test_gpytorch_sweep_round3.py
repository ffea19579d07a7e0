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
from torch.utils._python_dispatch import TorchDispatchMode

import rfgp
from rfgp.core.validation import NonFiniteError

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
    """Measured relative errors (ELBO, lengthscale gradient, mean, variance of q(f)): 7e-3, 0.09, 0.11, 0.05 at
    F = 256; 3e-4, 2e-3, 0.01, 5e-3 at F = 65 536."""
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
