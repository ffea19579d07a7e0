"""GPyTorch's online variational conditioning (``VariationalStrategy.get_fantasy_model``, the "SVGP model updating"
notebook) with rfgp kernels: an exact GP on the inducing points whose training noise is the dense pseudo-observation
covariance S (rfgp.inference.dense_noise), then conditioned on new points.

The reference is the formula (Maddox et al. 2021), computed densely with GPyTorch's exact kernel: GPyTorch 1.15's own
exact model is not (its fantasy mean cache is stored under a key its strategy never reads, cornellius-gp/gpytorch#2669,
so its mean and variance come from the likelihood's σ² instead of S).  Before, an rfgp kernel raised
``AttributeError: 'SumLinearOperator' object has no attribute '_diag_tensor'``.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from linear_operator.utils.errors import NotPSDError

import rfgp
from rfgp.inference.dense_noise import dense_noise_posterior_caches

F64 = torch.float64
Z = torch.linspace(0, 3, 8, dtype=F64).view(-1, 1)
NEW_X = torch.linspace(3, 5, 6, dtype=F64).view(-1, 1)
NEW_Y = torch.sin(6 * NEW_X).squeeze(-1) + 0.1 * torch.randn(6, dtype=F64, generator=torch.Generator().manual_seed(1))
TEST_X = torch.linspace(0, 8, 25, dtype=F64).view(-1, 1)


def exact_kernel():
    kernel = ScaleKernel(RBFKernel()).double()
    kernel.outputscale, kernel.base_kernel.lengthscale = 1.5, 0.5
    return kernel


class SVGP(gpytorch.models.ApproximateGP):
    """The notebook's model, with fixed hyperparameters and a fixed q(u) whose whitened covariance is below I."""

    def __init__(self, kernel):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(len(Z))
        super().__init__(gpytorch.variational.VariationalStrategy(self, Z, distribution, learn_inducing_locations=True))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.double()
        self.mean_module.constant.data.fill_(0.3)
        self.likelihood.noise = 0.1
        gen = torch.Generator().manual_seed(3)
        distribution.variational_mean.data = 0.5 * torch.randn(len(Z), generator=gen, dtype=F64)
        noise = torch.randn(len(Z), len(Z), generator=gen, dtype=F64).tril(-1)
        distribution.chol_variational_covar.data = 0.4 * torch.eye(len(Z), dtype=F64) + 0.1 * noise
        self.variational_strategy.variational_params_initialized.fill_(1)
        self.eval()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def conditioned_formula(model, new_noise):
    """Mean and variance of y* for the exact GP on [Z, x_new] with targets [ỹ + μ, y_new] and noise
    blockdiag(S, diag(new_noise)), S and ỹ GPyTorch's pseudo-points, computed densely with the exact kernel."""
    kernel = exact_kernel()
    with torch.no_grad():
        covariance, targets = model.variational_strategy.pseudo_points
        inputs = torch.cat([Z, NEW_X])
        residual = torch.cat([targets.squeeze(-1), NEW_Y - 0.3])
        train = kernel(inputs).to_dense() + torch.block_diag(covariance, torch.diag(new_noise))
        cross = kernel(TEST_X, inputs).to_dense()
        mean = 0.3 + cross @ torch.linalg.solve(train, residual)
        variance = kernel(TEST_X, diag=True) - (cross * torch.linalg.solve(train, cross.mT).mT).sum(-1) + 0.1
    return mean, variance


def predictions(model, **kwargs):
    with torch.no_grad():
        variational = model.likelihood(model(TEST_X))
        amortized = model.variational_strategy.amortized_exact_gp()
        pseudo = amortized.likelihood(amortized(TEST_X))
        conditioned = model.variational_strategy.get_fantasy_model(inputs=NEW_X, targets=NEW_Y, **kwargs)
        updated = conditioned.likelihood(conditioned(TEST_X))
    return variational, pseudo, updated


@pytest.mark.parametrize("noise", [None, 0.02])
def test_online_variational_conditioning_with_nystrom_landmarks_at_every_point_is_the_formula(noise):
    """The exact GP on the pseudo-points reproduces the SVGP's predictive (OVC's defining property), and conditioned on
    new points (with the likelihood's σ² or ``noise=``) it is the formula, to the landmark jitter."""
    points = torch.unique(torch.cat([Z, NEW_X, TEST_X]), dim=0)
    model = SVGP(rfgp.sketch(exact_kernel(), len(points), method="nystrom", x_sample=points, seed=0))
    kwargs = {} if noise is None else {"noise": torch.full((len(NEW_X),), noise, dtype=F64)}
    variational, pseudo, updated = predictions(model, **kwargs)
    torch.testing.assert_close(pseudo.mean, variational.mean, rtol=0, atol=1e-4)
    torch.testing.assert_close(pseudo.variance, variational.variance, rtol=0, atol=1e-4)
    mean, variance = conditioned_formula(model, torch.full((len(NEW_X),), 0.1 if noise is None else noise, dtype=F64))
    torch.testing.assert_close(updated.mean, mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(updated.variance, variance, rtol=0, atol=1e-6)
    # differentiated w.r.t. the test inputs, the conditioned model's caches are rebuilt with their graph: same S
    conditioned = model.variational_strategy.get_fantasy_model(inputs=NEW_X, targets=NEW_Y, **kwargs)
    test_x = TEST_X.clone().requires_grad_(True)
    output = conditioned.likelihood(conditioned(test_x))
    torch.testing.assert_close(output.mean.detach(), mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(output.variance.detach(), variance, rtol=0, atol=1e-6)


def test_online_variational_conditioning_with_random_features_approaches_the_formula():
    errors = []
    for width in (256, 65536):
        model = SVGP(rfgp.sketch(exact_kernel(), width, method="orf", seed=0))
        variational, pseudo, updated = predictions(model)
        # the same kernel either way: the pseudo-point GP is the SVGP of the sketched kernel
        torch.testing.assert_close(pseudo.mean, variational.mean, rtol=0, atol=1e-4)
        mean, variance = conditioned_formula(model, torch.full((len(NEW_X),), 0.1, dtype=F64))
        errors.append(max(float((updated.mean - mean).abs().max()), float((updated.variance - variance).abs().max())))
    assert errors[1] < errors[0] / 4 and errors[1] < 0.05, errors


def test_an_indefinite_noise_covariance_is_refused_by_name():
    """An indefinite S (the pseudo-observation covariance where q(u) is wider than the prior in some directions and
    not in others) makes the posterior covariance indefinite: refused, not predicted."""
    features = torch.randn(4, 16, dtype=F64, generator=torch.Generator().manual_seed(0))
    noise = torch.diag(torch.tensor([0.5, 0.2, -0.3, 0.4], dtype=F64))
    with pytest.raises(NotPSDError, match="pseudo-observation covariance"):
        dense_noise_posterior_caches(features, noise, torch.ones(4, 1, dtype=F64))
