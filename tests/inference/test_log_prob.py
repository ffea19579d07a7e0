"""rfgp.inference.log_prob: the feature-space MLL runs whatever gpytorch.settings.fast_computations says (BoTorch
switches its log_prob flag off globally), and only rfgp covariances are affected."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.inference.log_prob import has_feature_space_covariance
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

SLOW_LOG_PROB = gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False, solves=False)


def model(kernel, n=300, d=2):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = torch.sin(5 * x).sum(-1) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    gp = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel)).double()
    return gp, x, y


def mll_and_grads(gp, x, y):
    gp.train()
    gp.zero_grad()
    loss = -gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)(gp(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in gp.parameters()]


@pytest.mark.parametrize("chunk_size", [None, 64])
def test_mll_stays_in_feature_space_with_fast_log_prob_off(factorised, chunk_size):
    gp, x, y = model(SketchedRBFKernel(32, method="orf", ard_num_dims=2, seed=0))
    with rfgp.settings.chunk_size(chunk_size):
        reference, reference_grads = mll_and_grads(gp, x, y)
        factorised.clear()
        with SLOW_LOG_PROB:
            loss, grads = mll_and_grads(gp, x, y)
    assert factorised and max(factorised) <= 32  # only F × F capacitance matrices
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=0)
    for grad, expected in zip(grads, reference_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_dense_log_prob_agrees(factorised):
    """The feature-space branch computes GPyTorch's dense log-density of ΦΦᵀ + D exactly."""
    gp, x, y = model(SketchedRBFKernel(32, seed=0, ard_num_dims=2))
    gp.train()
    output = gp.likelihood(gp(x))
    with torch.no_grad(), SLOW_LOG_PROB:
        fast = output.log_prob(y)
        dense_covariance = output.lazy_covariance_matrix.to_dense()
    dense = torch.distributions.MultivariateNormal(output.mean.detach(), dense_covariance).log_prob(y)
    torch.testing.assert_close(fast, dense, rtol=1e-10, atol=0)


def test_other_covariances_keep_gpytorch_behaviour(factorised):
    gp, x, y = model(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    gp.train()
    output = gp.likelihood(gp(x))
    assert not has_feature_space_covariance(output)
    with torch.no_grad(), SLOW_LOG_PROB:
        output.log_prob(y)
    assert max(factorised) == x.shape[0]  # GPyTorch's own dense Cholesky, untouched


def test_install_is_idempotent():
    wrapped = gpytorch.distributions.MultivariateNormal.log_prob
    rfgp.inference.log_prob.install()
    assert gpytorch.distributions.MultivariateNormal.log_prob is wrapped
