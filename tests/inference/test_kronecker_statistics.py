"""The multitask marginal likelihood and posterior statistics of a sketched MultitaskKernel from its Kronecker factors
(rfgp.inference.kronecker_statistics), against the whitened-root path of the same operator."""

import math

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    KroneckerProductDiagLinearOperator,
    KroneckerProductLinearOperator,
)

import rfgp
from rfgp.inference import kronecker_statistics
from rfgp.inference.kronecker_tasks import KroneckerFeatureRootLinearOperator
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.inference.statistics_precision import recorded_statistics_dtypes
from rfgp.kernels import SketchedDecomposableKernel, SketchedRBFKernel
from tests._cost import LargestTensor
from tests._models import MultitaskGP

F64 = torch.float64


def _kernel(num_tasks, rank, num_features=16, batch_shape=torch.Size(), dtype=F64):
    data = SketchedRBFKernel(num_features, seed=0, batch_shape=batch_shape)
    kernel = SketchedDecomposableKernel(data, num_tasks=num_tasks, rank=rank).to(dtype)
    with torch.no_grad():
        task = kernel.task_covar_module
        task.covar_factor.copy_(torch.randn(num_tasks, rank, generator=torch.Generator().manual_seed(1)))
        task.var = torch.linspace(0.3, 0.9, num_tasks, dtype=dtype)
        data.lengthscale = 0.4
    return kernel


def _likelihood(num_tasks, noise_rank, global_noise=True, dtype=F64):
    likelihood = MultitaskGaussianLikelihood(num_tasks, rank=noise_rank, has_global_noise=global_noise).to(dtype)
    with torch.no_grad():
        if noise_rank:
            factor = torch.randn(num_tasks, noise_rank, generator=torch.Generator().manual_seed(2))
            likelihood.task_noise_covar_factor.copy_(0.3 * factor)
        else:
            likelihood.task_noises = torch.linspace(0.05, 0.2, num_tasks)
    return likelihood


def _noise(likelihood, num_points, num_tasks, point_noise=None):
    """The likelihood's D_N ⊗ Σ_T, or diag(``point_noise``) ⊗ Σ_T (FixedNoise-style D_N)."""
    noise = likelihood._shaped_noise_covar(torch.Size([num_points, num_tasks]))
    if point_noise is None:
        return noise
    task = noise.linear_ops[1]
    if isinstance(noise, KroneckerProductDiagLinearOperator):
        return KroneckerProductDiagLinearOperator(DiagLinearOperator(point_noise), task)
    return KroneckerProductLinearOperator(DiagLinearOperator(point_noise), DenseLinearOperator(task.to_dense()))


def _loss_and_grads(total, targets, params):
    inv_quad, logdet = total.inv_quad_logdet(targets, logdet=True)
    loss = (inv_quad + logdet).sum()
    return loss, torch.autograd.grad(loss, params, allow_unused=True)


def _assert_same_mll(kernel, likelihood, x, targets, point_noise=None, rtol=1e-10):
    """The Kronecker path's loss and gradients equal those of the same root as a plain feature root (the whitened-root
    statistics), and it never forms an (N·T) × (F·m) matrix."""
    params = [p for p in (*kernel.parameters(), *likelihood.parameters()) if p.requires_grad]
    covariance = kernel(x).evaluate_kernel()
    assert isinstance(covariance, KroneckerFeatureRootLinearOperator)
    num_points, num_tasks = x.shape[-2], covariance.task_factor.shape[-2]
    total = covariance + _noise(likelihood, num_points, num_tasks, point_noise)
    assert not total.uses_kernel_space()
    with LargestTensor() as largest:
        loss, grads = _loss_and_grads(total, targets, params)
    if covariance.root.shape[-2:].numel() > covariance.data_features.shape[-2:].numel():  # not T = m = 1
        assert largest.numel < covariance.root.numel()  # no (N·T) × (F·m) matrix
    covariance = kernel(x).evaluate_kernel()
    plain = FeatureRootLinearOperator(covariance.root) + _noise(likelihood, num_points, num_tasks, point_noise)
    expected_loss, expected_grads = _loss_and_grads(plain, targets, params)
    torch.testing.assert_close(loss, expected_loss, rtol=rtol, atol=rtol)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("num_tasks,rank,noise_rank", [
    (tasks, rank, noise_rank) for tasks in (1, 2, 3, 4) for rank in (0, 1, 2) for noise_rank in (0, 1, 2)
    if rank <= tasks and noise_rank <= tasks and tasks * (rank + tasks) > 1  # IndexKernel's rank ≤ T; Φ ≠ φ
])
def test_marginal_likelihood_and_gradients_from_the_factors_equal_the_whitened_root_path(num_tasks, rank, noise_rank):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=gen, dtype=F64)
    targets = torch.randn(40 * num_tasks, generator=gen, dtype=F64)
    _assert_same_mll(_kernel(num_tasks, rank), _likelihood(num_tasks, noise_rank), x, targets)


@pytest.mark.parametrize("noise_rank", [0, 2])
def test_task_noise_without_global_noise(noise_rank):
    gen = torch.Generator().manual_seed(0)
    x, targets = torch.rand(40, 2, generator=gen, dtype=F64), torch.randn(80, generator=gen, dtype=F64)
    _assert_same_mll(_kernel(2, 1), _likelihood(2, noise_rank, global_noise=False), x, targets)


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_a_non_constant_point_noise_and_a_batch_of_kernels_and_targets(noise_rank):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, 40, 2, generator=gen, dtype=F64)
    targets = torch.randn(2, 120, 3, generator=gen, dtype=F64)  # a batch of 3 right-hand sides
    point_noise = torch.linspace(0.5, 2.0, 40, dtype=F64).requires_grad_(True)
    kernel = _kernel(3, 1, batch_shape=torch.Size([2]))
    _assert_same_mll(kernel, _likelihood(3, noise_rank), x, targets, point_noise)


def test_a_scale_kernel_around_the_multitask_kernel_keeps_the_factors():
    """ScaleKernel(MultitaskKernel) converted: c·(φφᵀ ⊗ A), whose data factor is √c·φ (BoTorch's linear_ops too)."""
    gen = torch.Generator().manual_seed(0)
    x, targets = torch.rand(40, 2, generator=gen, dtype=F64), torch.randn(120, generator=gen, dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(_kernel(3, 1)).double()
    with torch.no_grad():
        kernel.outputscale = 2.5
        covariance = kernel(x).evaluate_kernel()
        data, task = covariance.linear_ops
        torch.testing.assert_close(torch.kron(data.to_dense(), task.to_dense()), covariance.to_dense())
        torch.testing.assert_close(data.to_dense(), 2.5 * kernel.base_kernel.data_covar_module(x).to_dense())
    _assert_same_mll(kernel, _likelihood(3, 1), x, targets)


def test_the_kernel_space_choice_compares_the_kronecker_cost():
    """N·T = 120 rows and F·m = 128 columns: the whitened-root statistics (N·T·F²·m²) cost more than the kernel-space
    path, the Kronecker ones (N·F² + F²·m²) less; values and gradients are those of the dense log density."""
    gen = torch.Generator().manual_seed(0)
    x, targets = torch.rand(60, 2, generator=gen, dtype=F64), torch.randn(120, generator=gen, dtype=F64)
    kernel, likelihood = _kernel(2, 0, num_features=64), _likelihood(2, 0)
    covariance = kernel(x).evaluate_kernel()
    assert (FeatureRootLinearOperator(covariance.root) + _noise(likelihood, 60, 2)).uses_kernel_space()
    total = covariance + _noise(likelihood, 60, 2)
    assert not total.uses_kernel_space()
    params = [p for p in (*kernel.parameters(), *likelihood.parameters()) if p.requires_grad]
    inv_quad, logdet = total.inv_quad_logdet(targets, logdet=True)
    grads = torch.autograd.grad(inv_quad + logdet, params)
    dense = kernel(x).to_dense() + _noise(likelihood, 60, 2).to_dense()  # the exact formula, autograd
    expected_inv_quad, expected_logdet = targets @ torch.linalg.solve(dense, targets), torch.logdet(dense)
    expected_grads = torch.autograd.grad(expected_inv_quad + expected_logdet, params)
    torch.testing.assert_close(inv_quad, expected_inv_quad, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(logdet, expected_logdet, rtol=1e-10, atol=1e-10)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-9, atol=1e-9)


def test_float32_statistics_decide_by_the_trace_of_the_whitened_gram(monkeypatch):
    """The float32 rule's estimate u·tr(Φ̃ᵀΦ̃) is read off the factors, and the float32 model at a high
    signal-to-noise ratio (statistics in float64) matches the float64 model."""
    traces = []
    decide = kronecker_statistics.statistics_dtype

    def recording(dtype, device, trace):
        traces.append(trace())
        return decide(dtype, device, trace)

    monkeypatch.setattr(kronecker_statistics, "statistics_dtype", recording)
    gen = torch.Generator().manual_seed(0)
    x, targets = torch.rand(200, 2, generator=gen, dtype=F64), torch.randn(600, generator=gen, dtype=F64)
    results = {}
    for dtype in (torch.float32, F64):
        kernel, likelihood = _kernel(3, 1, dtype=dtype), _likelihood(3, 1, dtype=dtype)
        with torch.no_grad():
            likelihood.noise = 2e-3
            likelihood.task_noise_covar_factor.mul_(1e-2)
        params = [p for p in (*kernel.parameters(), *likelihood.parameters()) if p.requires_grad]
        total = kernel(x.to(dtype)).evaluate_kernel() + _noise(likelihood, 200, 3)
        with recorded_statistics_dtypes() as chosen, rfgp.settings.float32_statistics_tolerance(1e-3):
            results[dtype] = _loss_and_grads(total, targets.to(dtype), params)
        if dtype == torch.float32:
            assert chosen == [F64]  # u·tr(Φ̃ᵀΦ̃) far above the tolerance
            whitened = total.whiten(total.feature_operator.root.to_dense().to(F64))
            torch.testing.assert_close(traces[0].to(F64), whitened.to(F64).square().sum(), rtol=1e-5, atol=0)
            assert float(traces[0]) * 2.0**-24 > 1e-3
    (loss32, grads32), (loss64, grads64) = results[torch.float32], results[F64]
    assert abs(float(loss32.detach()) - float(loss64)) <= 1e-5 * abs(float(loss64))
    for grad32, grad64 in zip(grads32, grads64):
        torch.testing.assert_close(grad32.to(F64), grad64, rtol=1e-3, atol=1e-3 * float(grad64.abs().max()))


@pytest.mark.parametrize("num_tasks,rank,noise_rank", [(2, 1, 0), (3, 2, 1), (4, 1, 2)])
def test_posterior_caches_from_the_factors_equal_the_whitened_root_path(monkeypatch, num_tasks, rank, noise_rank):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=gen, dtype=F64)
    y = torch.randn(60, num_tasks, generator=gen, dtype=F64)
    test_x = torch.rand(7, 2, generator=gen, dtype=F64)
    model = MultitaskGP(x, y, _likelihood(num_tasks, noise_rank), _kernel(num_tasks, rank)).eval()
    with torch.no_grad():
        model(test_x)  # builds the prediction strategy
        strategy = model.prediction_strategy
        assert not strategy.uses_kernel_space
        with LargestTensor() as largest:
            weight_mean, factor = strategy.mean_covar_cache
        assert largest.numel < y.numel() * model.covar_module.num_features  # no (N·T) × (F·m) matrix
        prediction = model.likelihood(model(test_x))
        mean, variance = prediction.mean, prediction.variance
    monkeypatch.setattr(MultitaskFeatureSpacePredictionStrategy, "_kronecker_statistics", lambda self, policy: None)
    model.train().eval()
    with torch.no_grad():
        prediction = model.likelihood(model(test_x))
        expected_mean, expected_factor = model.prediction_strategy.mean_covar_cache
    torch.testing.assert_close(weight_mean, expected_mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(factor, expected_factor, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(mean, prediction.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(variance, prediction.variance, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_a_training_step_never_forms_the_interleaved_root(noise_rank):
    """One MLL + gradient of GPyTorch's multitask model with a sketched MultitaskKernel: the kernel hands over φ and B,
    the root φ ⊗ B ((N·T) × (F·m)) is never formed, and the loss and gradients are those of the formed root."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(200, 2, generator=gen, dtype=F64), torch.randn(200, 3, generator=gen, dtype=F64)
    model = MultitaskGP(x, y, _likelihood(3, noise_rank), _kernel(3, 1))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    with LargestTensor() as largest:
        loss = -mll(model(x), y)
        grads = torch.autograd.grad(loss, params)
    assert largest.numel < y.numel() * model.covar_module.num_features
    with torch.no_grad():
        assert model.covar_module(x).evaluate_kernel().root.to_dense().shape == (600, 64)
    covariance = model.covar_module(x).evaluate_kernel()
    plain = FeatureRootLinearOperator(covariance.root.to_dense()) + _noise(model.likelihood, 200, 3)
    residual = (y - model.mean_module(x)).reshape(-1)
    inv_quad, logdet = plain.inv_quad_logdet(residual, logdet=True)
    expected_loss = 0.5 * (inv_quad + logdet + 600 * math.log(2 * math.pi)) / 600
    expected_grads = torch.autograd.grad(expected_loss, params, allow_unused=True)
    torch.testing.assert_close(loss, expected_loss, rtol=1e-10, atol=1e-10)
    for grad, expected in zip(grads, expected_grads):
        torch.testing.assert_close(grad, torch.zeros_like(grad) if expected is None else expected, rtol=1e-9,
                                   atol=1e-9)


@pytest.mark.parametrize("budget", [2**30, 20 * 4 * 16 * 8])  # φ whole; φ in row blocks of 20 points
def test_statistics_wider_than_the_memory_available_are_refused_by_name(monkeypatch, budget):
    """N = 40 points, T = 3, F = 16, rank 1: the capacitance is F·m = 64 wide (2 × 64² float64 = 64 KiB with its
    factor), the data kernel's F × F 4 KiB and the kernel's own check min(N, F·m)² 25.6 KiB.  With 30 000 bytes
    available the marginal likelihood and the posterior caches are refused before the statistics are formed, naming
    the 64 × 64 matrix; before, nothing checked it."""
    monkeypatch.setattr(rfgp.core.memory, "CHECK_THRESHOLD", 0)
    monkeypatch.setattr(rfgp.core.memory, "available_bytes", lambda device: 30_000)
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 2, generator=gen, dtype=F64), torch.randn(40, 3, generator=gen, dtype=F64)
    model = MultitaskGP(x, y, _likelihood(3, 1), _kernel(3, 1))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    message = r"N=120 training rows, num_features=64.*64 × 64 torch.float64 .*F·\(rank \+ T\) = 64 wide"
    with rfgp.settings.memory_budget(budget):
        with pytest.raises(ValueError, match=message):
            mll(model(x), y)
        model.eval()
        with torch.no_grad(), pytest.raises(ValueError, match=message):
            model(x[:5])
    monkeypatch.setattr(rfgp.core.memory, "available_bytes", lambda device: 70_000)
    with rfgp.settings.memory_budget(budget):
        model.train()
        mll(model(x), y)
