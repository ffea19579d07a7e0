"""rfgp kernels as the ``covar_module`` of GPyTorch's approximate GPs: a whitened SVGP and a two-layer deep GP
(batched kernels, sampled hidden inputs) give the exact kernel's ELBO and predictions as F grows.

The variational strategy evaluates the kernel on the joint input [Z; x] and slices the blocks K_ZZ, K_Zx and
k(x, x) out of it (with gradients in training, lazily under ``no_grad`` in prediction), so these tests check
those operator paths, not only the kernel values.
"""

import gpytorch
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.models import ApproximateGP
from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

import rfgp

F64 = torch.float64
N, M = 60, 12


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(N, 2, generator=gen, dtype=F64)
    y = torch.sin(4 * x[:, 0]) * x[:, 1] + 0.05 * torch.randn(N, generator=gen, dtype=F64)
    return x, y, torch.rand(20, 2, generator=gen, dtype=F64), gen


def set_variational(strategy: VariationalStrategy, gen: torch.Generator) -> None:
    """A fixed, non-trivial q(u) (GPyTorch would otherwise re-initialise it to the prior at the first call)."""
    distribution = strategy._variational_distribution
    distribution.variational_mean.data = torch.randn(distribution.variational_mean.shape, generator=gen, dtype=F64)
    chol = 0.3 * torch.randn(distribution.chol_variational_covar.shape, generator=gen, dtype=F64).tril(-1)
    distribution.chol_variational_covar.data = chol + 0.4 * torch.eye(chol.shape[-1], dtype=F64)
    strategy.variational_params_initialized.fill_(1)


class SVGP(ApproximateGP):
    def __init__(self, inducing_points, covar_module):
        distribution = CholeskyVariationalDistribution(inducing_points.shape[-2])
        super().__init__(VariationalStrategy(self, inducing_points, distribution, learn_inducing_locations=True))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def svgp_outputs(covar_module, x, y, xs):
    gen = torch.Generator().manual_seed(1)
    model = SVGP(x[:M].clone(), covar_module).double()
    set_variational(model.variational_strategy, gen)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), y)
    (grad,) = torch.autograd.grad(elbo, model.covar_module.base_kernel.raw_lengthscale)
    model.eval()
    with torch.no_grad():
        pred = model(xs)
    return elbo.detach(), grad, pred.mean, pred.variance


def exact_rbf(**kwargs):
    kernel = ScaleKernel(RBFKernel(ard_num_dims=2, **kwargs), **kwargs).double()
    kernel.base_kernel.lengthscale = 0.25
    kernel.outputscale = 1.5
    return kernel


def test_svgp_elbo_gradient_and_prediction_approach_the_exact_kernels():
    x, y, xs, _ = data()
    exact = svgp_outputs(exact_rbf(), x, y, xs)
    errors = []
    for num_features in (256, 32768):
        sketched = svgp_outputs(rfgp.sketch(exact_rbf(), num_features, method="orf", seed=0), x, y, xs)
        errors.append([float((a - b).abs().max() / b.abs().max()) for a, b in zip(sketched, exact)])
    # measured: elbo, lengthscale gradient, mean, variance relative errors 0.0074, 0.12, 0.19, 0.23 at F = 256 and
    # 0.0028, 0.019, 0.019, 0.024 at F = 32768 (the ELBO's KL term does not depend on the kernel when whitened)
    assert all(wide < narrow / 2 for wide, narrow in zip(errors[1], errors[0])), errors
    assert max(errors[1]) < 0.05, errors


class Layer(DeepGPLayer):
    def __init__(self, covar_module, input_dims, output_dims, gen):
        batch_shape = torch.Size([]) if output_dims is None else torch.Size([output_dims])
        inducing_points = torch.rand(*batch_shape, M, input_dims, generator=gen, dtype=F64)
        distribution = CholeskyVariationalDistribution(M, batch_shape=batch_shape)
        super().__init__(VariationalStrategy(self, inducing_points, distribution, learn_inducing_locations=True),
                         input_dims, output_dims)
        set_variational(self.variational_strategy, gen)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class TwoLayerDeepGP(DeepGP):
    def __init__(self, convert):
        super().__init__()
        gen = torch.Generator().manual_seed(2)
        self.hidden = Layer(convert(exact_rbf(batch_shape=torch.Size([2]))), 2, 2, gen)
        self.last = Layer(convert(exact_rbf()), 2, None, gen)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.double()

    def forward(self, x):
        return self.last(self.hidden(x))


def deep_gp_outputs(convert, x, y, hidden_samples):
    """Both layers' marginals (the last layer's at fixed hidden samples: rsample draws through whichever root the
    covariance has, so exact and sketched models would map the same seed to different samples) and the
    hidden lengthscale's ELBO gradient through sampled hidden inputs."""
    model = TwoLayerDeepGP(convert)
    mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=N))
    with gpytorch.settings.num_likelihood_samples(4):
        with torch.no_grad():
            hidden, last = model.hidden(x), model.last(hidden_samples)
        mll(model(x), y).backward()
    lengthscale_grad = model.hidden.covar_module.base_kernel.raw_lengthscale.grad
    return hidden.mean, hidden.variance, last.mean, last.variance, lengthscale_grad


def test_deep_gp_with_batched_rfgp_kernels_approaches_the_exact_model():
    x, y, _, gen = data(5)
    hidden_samples = torch.rand(4, N, 2, generator=gen, dtype=F64)
    exact = deep_gp_outputs(lambda kernel: kernel, x, y, hidden_samples)
    errors = []
    for num_features in (256, 32768):
        sketched = deep_gp_outputs(lambda kernel: rfgp.sketch(kernel, num_features, method="orf", seed=0), x, y,
                                   hidden_samples)
        assert [s.shape for s in sketched] == [e.shape for e in exact]  # hidden (S, N, 2), last (S, 4, N), (2, 1, 2)
        assert torch.isfinite(sketched[-1]).all()
        errors.append([float((a - b).abs().max() / b.abs().max()) for a, b in zip(sketched[:4], exact[:4])])
    # measured: hidden mean and variance, last mean and variance relative errors 0.20, 0.12, 0.18, 0.11 at F = 256
    # and 0.013, 0.015, 0.016, 0.0097 at F = 32768
    assert all(wide < narrow / 3 for wide, narrow in zip(errors[1], errors[0])), errors
    assert max(errors[1]) < 0.05, errors
