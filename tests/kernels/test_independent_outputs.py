"""GPyTorch's "Batch Independent Multioutput GP" (a ``batch_shape=[T]`` kernel, ``from_batch_mvn``,
``MultitaskGaussianLikelihood``) with a sketched kernel: the marginal likelihood, its gradient and the posterior of
the T independent GPs on the same features, through rfgp's multi-output feature algebra."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy

from .._dense import DenseKernel
from .._models import UserGP

F64 = torch.float64
TASKS = torch.Size([2])
N = 450  # N·T = 900 > max_cholesky_size: linear_operator's generic path was CG and stochastic Lanczos


class BatchIndependentGP(gpytorch.models.ExactGP):
    """GPyTorch's tutorial model, kernel swapped."""

    def __init__(self, x, y, kernel, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=TASKS)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal.from_batch_mvn(
            gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x)))


class TaskKernel(gpytorch.kernels.Kernel):
    """Output t of the batched sketch, dense."""

    def __init__(self, kernel, task):
        super().__init__()
        self.kernel, self.task = kernel, task

    @property
    def batch_shape(self):
        return torch.Size([])

    def forward(self, x1, x2, diag=False, **params):
        covar = self.kernel(x1, x2).to_dense()[self.task]
        return covar.diagonal(dim1=-2, dim2=-1) if diag else covar


def data():
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N, 3, generator=gen, dtype=F64) * 4 - 2
    y = torch.stack([torch.sin(x.sum(-1)), torch.cos(2 * x[:, 0])], -1) + 0.1 * torch.randn(N, 2, generator=gen,
                                                                                            dtype=F64)
    return x, y, torch.rand(30, 3, generator=gen, dtype=F64) * 4 - 2


def sketched_batch_kernel():
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=TASKS), batch_shape=TASKS)
    exact.base_kernel.lengthscale = torch.tensor([[[0.4]], [[0.9]]])
    exact.outputscale = torch.tensor([1.0, 0.5])
    return rfgp.sketch(exact, 64, seed=0).double()


def fit_and_predict(model, x, y, test_x):
    """(loss, gradient of the raw lengthscales, predictive mean and variance)."""
    model.train()
    loss = -gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y)
    lengthscale = model.covar_module.base_kernel.raw_lengthscale
    (gradient,) = torch.autograd.grad(loss, lengthscale)
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(test_x))
    return loss.detach(), gradient, predictive.mean, predictive.variance


@pytest.mark.parametrize("missing", [False, True])
def test_batch_independent_outputs_are_the_separate_gps(missing):
    """Rank-0 task noise: the outputs are T separate GPs (NaN targets under ``observation_nan_policy("mask")``
    left out of their output's GP): loss, gradient and predictions equal theirs on the same features, at the
    default settings (GPyTorch's generic path was off by 3e-3 in the loss and 4e-3 in the means; its dense path
    keeps the masked points in the predictive variance)."""
    x, y, test_x = data()
    if missing:
        y[::5, 0] = float("nan")
        y[1::7, 1] = float("nan")
    kernel = sketched_batch_kernel()
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2).double()
    likelihood.noise, likelihood.task_noises = 0.01, torch.tensor([0.02, 0.05])
    model = BatchIndependentGP(x, y, kernel, likelihood)
    with gpytorch.settings.observation_nan_policy("mask" if missing else "ignore"):
        loss, gradient, mean, variance = fit_and_predict(model, x, y, test_x)
    expected_loss, expected_gradient = 0.0, []
    for task in range(2):
        seen = ~y[:, task].isnan()
        single = UserGP(x[seen], y[seen, task], TaskKernel(kernel, task)).double()
        single.likelihood.noise = likelihood.noise + likelihood.task_noises[task]
        single.mean_module.constant = model.mean_module.constant[task].detach()
        with gpytorch.settings.max_cholesky_size(10 ** 6):
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(single.likelihood, single)
            task_loss = -mll(single(x[seen]), y[seen, task])
            task_loss = task_loss * seen.sum() / y.numel()  # GPyTorch divides by all N·T entries
            (task_gradient,) = torch.autograd.grad(task_loss, kernel.base_kernel.raw_lengthscale)
            single.eval()
            with torch.no_grad():
                predictive = single.likelihood(single(test_x))
        expected_loss = expected_loss + task_loss.detach()
        expected_gradient.append(task_gradient)
        torch.testing.assert_close(mean[:, task], predictive.mean, rtol=1e-9, atol=1e-9)
        torch.testing.assert_close(variance[:, task], predictive.variance, rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(gradient, sum(expected_gradient), rtol=1e-8, atol=1e-10)
    assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)


def test_batch_independent_outputs_with_correlated_task_noise_match_the_dense_model():
    """``MultitaskGaussianLikelihood(rank=1)`` couples the outputs: the same numbers as GPyTorch's dense Cholesky
    algebra on the same covariance."""
    x, y, test_x = data()
    kernel = sketched_batch_kernel()
    results = []
    for covariance, max_cholesky_size in ((kernel, 800), (DenseKernel(kernel), 10 ** 6)):  # rfgp: any setting
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=1).double()
        model = BatchIndependentGP(x, y, covariance, likelihood)
        with gpytorch.settings.max_cholesky_size(max_cholesky_size):
            model.train()
            loss = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
            (gradient,) = torch.autograd.grad(loss, kernel.base_kernel.raw_lengthscale)
            model.eval()
            with torch.no_grad():
                predictive = likelihood(model(test_x))
        results.append((loss.detach(), gradient, predictive.mean, predictive.variance))
    for value, expected in zip(*results):
        torch.testing.assert_close(value, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("rank", [0, 1])
def test_batch_independent_outputs_over_the_memory_budget_train_and_predict_block_by_block(rank):
    """A block root (N·T × T·F) over ``rfgp.settings.memory_budget`` is evaluated a block of points at a time: loss,
    gradient and predictions equal the unchunked ones (it fell back to GPyTorch's generic operator)."""
    x, y, test_x = data()
    results = []
    for budget in (2**30, 2**17):  # the whole root is 900 × 128 float64 = 0.9 MiB
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=rank).double()
        model = BatchIndependentGP(x, y, sketched_batch_kernel(), likelihood)
        with rfgp.settings.memory_budget(budget):
            model.train()
            covariance = model(x).lazy_covariance_matrix.evaluate_kernel()
            results.append((*fit_and_predict(model, x, y, test_x), type(covariance).__name__))
            assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    (*whole, whole_type), (*chunked, chunked_type) = results
    assert (whole_type, chunked_type) == ("FeatureRootLinearOperator", "ChunkedMultiOutputFeatureOperator")
    for value, expected in zip(chunked, whole):
        torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-11)
