"""BoTorch model classes beyond SingleTaskGP with rfgp kernels, written as a BoTorch user would, against the exact GP
of the same (sketched) kernel."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models import HigherOrderGP  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402

import rfgp  # noqa: E402

F64 = torch.float64


@pytest.mark.parametrize("num_features", [8, 64])  # below and above the 12 training points
def test_higher_order_gp_with_a_sketched_data_kernel_is_the_gp_of_that_kernel(num_features):
    """HigherOrderGP.posterior slices its joint train/test data covariance (a CatLinearOperator of the kernel's
    operators, through .to(device)), which raised an AttributeError for the lazy rfgp cross-covariance."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(12, 2, generator=gen, dtype=F64)
    grid = torch.linspace(0, 1, 3, dtype=F64)[:, None], torch.linspace(0, 1, 2, dtype=F64)
    y = torch.sin(4 * x[:, :1, None] + grid[0]) * torch.cos(3 * x[:, 1:, None] + grid[1])  # (12, 3, 2) outputs
    torch.manual_seed(0)  # the latent parameters' initial values
    model = HigherOrderGP(x, y, outcome_transform=None)
    model.covar_modules[0] = rfgp.sketch(model.covar_modules[0], num_features, seed=0)
    model.likelihood.noise = 0.01
    xs = torch.rand(4, 2, generator=gen, dtype=F64)
    with torch.no_grad():
        latents = [k(p).to_dense() for k, p in zip(model.covar_modules[1:], model.latent_parameters)]

        def covariance(a, b):  # K_data(a, b) ⊗ K_latent1 ⊗ K_latent2, the model's prior covariance (zero mean)
            k = model.covar_modules[0](a, b).to_dense()
            for latent in latents:
                k = torch.kron(k, latent)
            return k

        train = covariance(x, x) + 0.01 * torch.eye(y.numel(), dtype=F64)
        cross = covariance(xs, x)
        mean = cross @ torch.linalg.solve(train, y.reshape(-1))
        variance = (covariance(xs, xs) - cross @ torch.linalg.solve(train, cross.mT)).diagonal()
        model.train()
        mll = ExactMarginalLogLikelihood(model.likelihood, model)(model(x), model.train_targets)
        log_prior = sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in model.named_priors())
        normal = torch.distributions.MultivariateNormal(torch.zeros(y.numel(), dtype=F64), train)
        expected_mll = (normal.log_prob(y.reshape(-1)) + log_prior) / y.numel()
        torch.testing.assert_close(mll, expected_mll, rtol=1e-7, atol=1e-7)  # GPyTorch: Kronecker eigendecompositions
        posterior = model.posterior(xs)
        torch.testing.assert_close(posterior.mean.reshape(-1), mean, rtol=1e-7, atol=1e-7)
        torch.testing.assert_close(posterior.variance.reshape(-1), variance, rtol=1e-7, atol=1e-7)
        torch.manual_seed(1)
        samples = posterior.rsample(torch.Size([2000])).reshape(2000, -1)  # BoTorch's Matheron sampler
    assert float(((samples.mean(0) - mean) / (variance / 2000).sqrt()).abs().max()) < 4.5
    # the training gradient (GPyTorch's dense log-prob under BoTorch's settings) is the dense GP's
    model.train()
    lengthscale = model.covar_modules[0].raw_lengthscale
    (grad,) = torch.autograd.grad(ExactMarginalLogLikelihood(model.likelihood, model)(model(x), model.train_targets),
                                  lengthscale)
    train = covariance(x, x) + 0.01 * torch.eye(y.numel(), dtype=F64)  # now with the graph to the lengthscale
    normal = torch.distributions.MultivariateNormal(torch.zeros(y.numel(), dtype=F64), train)
    log_prior = sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in model.named_priors())
    (expected_grad,) = torch.autograd.grad((normal.log_prob(y.reshape(-1)) + log_prior) / y.numel(), lengthscale)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)


def test_latent_kronecker_gp_predicts_with_a_sketched_kernel_and_refuses_its_dense_pathwise_sampler():
    """LatentKroneckerGP's mean and variance are GPyTorch's for the sketched covariance K_X ⊗ K_T (missing entries
    dropped); its pathwise sampler reads the kernel's dense ``.tensor`` (an AttributeError before) and is refused."""
    latent_kronecker = pytest.importorskip("botorch.models.latent_kronecker_gp")
    from botorch.exceptions.errors import UnsupportedError

    gen = torch.Generator().manual_seed(0)
    x, times = torch.rand(15, 2, generator=gen, dtype=F64), torch.linspace(0, 1, 4, dtype=F64)[:, None]
    y = torch.sin(5 * x[:, :1] + 2 * times.mT) + 0.05 * torch.randn(15, 4, generator=gen, dtype=F64)
    y[2, 3] = float("nan")  # a missing entry
    model = latent_kronecker.LatentKroneckerGP(x, times, y, outcome_transform=None)
    model.covar_module_X = rfgp.sketch(model.covar_module_X, 64, seed=1)
    model.eval()
    xs = torch.rand(3, 2, generator=gen, dtype=F64)
    with torch.no_grad():
        posterior = model.posterior(xs, times)
        joint = torch.kron(model.covar_module_X(torch.cat([x, xs])).to_dense(), model.covar_module_T(times).to_dense())
        observed = ~torch.isnan(y.reshape(-1))
        train = joint[:60, :60][observed][:, observed] + model.likelihood.noise * torch.eye(59, dtype=F64)
        cross = joint[60:, :60][:, observed]
        mean = cross @ torch.linalg.solve(train, y.reshape(-1)[observed])  # zero prior means
        variance = (joint[60:, 60:] - cross @ torch.linalg.solve(train, cross.mT)).diagonal()
    torch.testing.assert_close(posterior.distribution.mean, mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(posterior.distribution.variance, variance, rtol=1e-10, atol=1e-10)
    with pytest.raises(UnsupportedError, match="covar_module_X, an rfgp kernel.*SingleTaskGP.*HigherOrderGP"):
        posterior.rsample(torch.Size([2]))
