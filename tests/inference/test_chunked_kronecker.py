"""A sketched MultitaskKernel over rfgp.settings.memory_budget (rfgp.inference.chunked_kronecker): sized by its data
features φ, not by the interleaved root φ ⊗ B, and kept on the Kronecker statistics — from φ whole where φ fits, from
row blocks of φ where it does not — with the values and gradients of the unchunked model.

Before, a root over the budget was chunked as a whole and left the Kronecker path for the whitened root's statistics
(O(N·T·F²·m²)), although φ fitted.
"""

import contextlib

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood
from linear_operator.operators import DiagLinearOperator

import rfgp
from rfgp.inference import chunking, kronecker_statistics, multioutput_chunking
from rfgp.inference.chunked_kronecker import ChunkedKroneckerFeatureOperator
from rfgp.inference.kronecker_posterior import ChunkedKroneckerPosteriorCovariance
from rfgp.inference.kronecker_tasks import KroneckerFeatureRootLinearOperator, KroneckerStatistics
from rfgp.inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator, ChunkedPosteriorCovariance
from rfgp.inference.statistics_precision import recorded_statistics_dtypes
from rfgp.kernels import SketchedDecomposableKernel, SketchedRBFKernel
from tests._cost import LargestTensor, TriangularSolveFlops
from tests._models import MultitaskGP

F64 = torch.float64
N, T, WIDTH, RANK = 400, 3, 16, 1  # root (N·T) × (F·m) = 1200 × 64; φ 400 × 16; statistics 64 × 64
ROOT_ROW, DATA_ROW = 4 * WIDTH * (RANK + T) * 8, 4 * WIDTH * 8  # working-set bytes per row (rfgp.settings)
WHOLE = 2**30
DATA_FITS = N * DATA_ROW * 2  # φ fits, the root (T·(rank + T) = 12 times φ) does not
DATA_CHUNKED = 50 * DATA_ROW  # φ in blocks of 50 points
BUDGETS = {"whole": WHOLE, "data fits": DATA_FITS, "data chunked": DATA_CHUNKED}


def _model(noise_rank, dtype=F64, scaled=False, missing=False, num_points=N):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 2, generator=gen, dtype=F64)
    y = torch.sin(4 * x[:, :1] + torch.arange(T, dtype=F64)) + 0.1 * torch.randn(num_points, T, generator=gen,
                                                                                   dtype=F64)
    if missing:
        y[3, 1] = y[7, 0] = float("nan")
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(WIDTH, seed=0), num_tasks=T, rank=RANK)
    if scaled:
        kernel = gpytorch.kernels.ScaleKernel(kernel)
    likelihood = MultitaskGaussianLikelihood(T, rank=noise_rank)
    with gpytorch.settings.observation_nan_policy("mask" if missing else "ignore"):
        model = MultitaskGP(x, y, likelihood, kernel).to(dtype)
    pgen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 + 0.3 * torch.rand(p.shape, generator=pgen, dtype=F64))
    return model, x.to(dtype), y.to(dtype)


def _spied(monkeypatch):
    """Records the φ argument of every Kronecker statistics call, and every call of the whitened root's chunked
    statistics."""
    calls = {"kronecker": [], "whitened root": 0}
    kronecker, whitened = kronecker_statistics.kronecker_statistics, multioutput_chunking.chunked_feature_statistics

    def kronecker_spy(data, *args):
        calls["kronecker"].append(data)
        return kronecker(data, *args)

    def whitened_spy(*args, **kwargs):
        calls["whitened root"] += 1
        return whitened(*args, **kwargs)

    monkeypatch.setattr("rfgp.inference.kronecker_tasks.kronecker_statistics", kronecker_spy)
    monkeypatch.setattr(multioutput_chunking, "chunked_feature_statistics", whitened_spy)
    return calls


def _mll_and_grads(model, x, y, budget, missing=False):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    with rfgp.settings.memory_budget(budget), gpytorch.settings.observation_nan_policy("mask" if missing else "ignore"):
        covariance = model.covar_module(x).evaluate_kernel()
        with LargestTensor() as largest:
            loss = -mll(model(x), y)
            grads = torch.autograd.grad(loss, params)
    return loss.detach(), grads, covariance, largest.numel


def _assert_close(actual, expected, rtol=1e-10):
    (loss, grads), (expected_loss, expected_grads) = actual, expected
    torch.testing.assert_close(loss, expected_loss, rtol=rtol, atol=rtol)
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=rtol, atol=rtol * float(expected_grad.abs().max()))


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_the_budget_sizes_phi_and_keeps_the_kronecker_path(monkeypatch, noise_rank):
    """Whole: the materialised root's Kronecker statistics.  Root over the budget, φ within: the same statistics from
    φ whole (before: the chunked whitened root).  φ over the budget: from φ in blocks of 50 points.  No tensor as
    large as the root (N·T × F·m) in any case, and none as large as φ where φ is chunked."""
    calls = _spied(monkeypatch)
    model, x, y = _model(noise_rank)
    results = {name: _mll_and_grads(model, x, y, budget) for name, budget in BUDGETS.items()}
    assert calls["whitened root"] == 0
    (whole, fits, chunked) = calls["kronecker"]
    assert isinstance(results["whole"][2], KroneckerFeatureRootLinearOperator)
    assert torch.is_tensor(whole) and torch.is_tensor(fits) and fits.shape == (N, WIDTH)
    assert isinstance(results["data fits"][2], ChunkedKroneckerFeatureOperator)
    assert isinstance(chunked, kronecker_statistics.ChunkedDataFeatures) and chunked.chunk_size == 50
    root_numel = N * T * WIDTH * (RANK + T)
    assert all(result[3] < root_numel for result in results.values())
    assert results["data chunked"][3] < N * WIDTH
    for name in ("data fits", "data chunked"):
        _assert_close(results[name][:2], results["whole"][:2])


@pytest.mark.parametrize("scaled", [False, True])
def test_correlated_noise_and_a_scale_kernel_chunked_equal_unchunked(monkeypatch, scaled):
    """ScaleKernel(MultitaskKernel) multiplies the chunked root by c: the factors stay (φ scaled by √c)."""
    calls = _spied(monkeypatch)
    model, x, y = _model(2, scaled=scaled)
    expected = _mll_and_grads(model, x, y, WHOLE)[:2]
    for budget in (DATA_FITS, DATA_CHUNKED):
        _assert_close(_mll_and_grads(model, x, y, budget)[:2], expected)
    assert calls["whitened root"] == 0 and len(calls["kronecker"]) == 3


def test_missing_targets_keep_the_chunked_whitened_root(monkeypatch):
    """Per-point masks break the Kronecker structure: under the budget the chunked whitened root's statistics, as
    before, equal to the unchunked model's."""
    calls = _spied(monkeypatch)
    model, x, y = _model(1, missing=True)
    expected = _mll_and_grads(model, x, y, WHOLE, missing=True)[:2]
    _assert_close(_mll_and_grads(model, x, y, DATA_CHUNKED, missing=True)[:2], expected)
    assert calls["whitened root"] == 1 and calls["kronecker"] == []


def test_a_per_entry_noise_keeps_the_chunked_whitened_root(monkeypatch):
    """A noise that is not D_N ⊗ Σ_T (here a per-entry diagonal): the chunked root's statistics."""
    calls = _spied(monkeypatch)
    model, x, _ = _model(0)
    gen = torch.Generator().manual_seed(3)
    diag = DiagLinearOperator(0.1 + torch.rand(N * T, generator=gen, dtype=F64))
    targets = torch.randn(N * T, generator=gen, dtype=F64)
    params = [p for p in model.covar_module.parameters() if p.requires_grad]
    results = []
    for budget in (WHOLE, DATA_CHUNKED):
        with rfgp.settings.memory_budget(budget):
            total = model.covar_module(x).evaluate_kernel() + diag
            inv_quad, logdet = total.inv_quad_logdet(targets, logdet=True)
            results.append((inv_quad + logdet, torch.autograd.grad(inv_quad + logdet, params)))
    _assert_close(results[1], results[0])
    assert calls["whitened root"] == 1 and calls["kronecker"] == []


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_posterior_under_the_budget_equals_the_unchunked_posterior(monkeypatch, noise_rank):
    """The posterior caches of a chunked training root come from the Kronecker statistics (φ in blocks); mean and
    variance at test points (the test covariance chunked too) equal the unchunked ones."""
    calls = _spied(monkeypatch)
    model, x, _ = _model(noise_rank)
    test_x = torch.rand(30, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    results = []
    for budget in (WHOLE, DATA_CHUNKED):
        model.train().eval()
        with rfgp.settings.memory_budget(budget), torch.no_grad():
            prediction = model.likelihood(model(test_x))
            results.append((prediction.mean, prediction.variance))
    assert isinstance(calls["kronecker"][-1], kronecker_statistics.ChunkedDataFeatures)
    assert calls["whitened root"] == 0
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


def test_float32_chunked_statistics_decide_by_the_trace_of_the_whitened_gram(monkeypatch):
    """u·tr(φᵀD_N⁻¹φ)·‖B̃‖_F² (not u·tr(φᵀD_N⁻¹φ) alone) decides the precision of φ's blocks: at a tolerance between
    the two the float32 model forms its statistics in float64, and matches the float64 model as unchunked."""
    traces = []
    decide = chunking.statistics_dtype

    def recording(dtype, device, trace):
        traces.append(float(trace()))
        return decide(dtype, device, trace)

    monkeypatch.setattr(chunking, "statistics_dtype", recording)
    results = {}
    for dtype in (torch.float32, F64):
        model, x, y = _model(1, dtype=dtype)
        with torch.no_grad():
            model.likelihood.noise = 1e-3
        with recorded_statistics_dtypes() as chosen, rfgp.settings.float32_statistics_tolerance(1e-2):
            results[dtype] = _mll_and_grads(model, x, y, DATA_CHUNKED)[:2]
        if dtype == torch.float32:
            assert chosen == [F64]
            total = model.covar_module(x).evaluate_kernel() + model.likelihood._shaped_noise_covar((N, T))
            with torch.no_grad():
                whitened = total.whiten(total.feature_operator.features().to(F64))
            expected_trace = float(whitened.square().sum())
            assert traces[0] == pytest.approx(expected_trace, rel=1e-4)
    (loss32, grads32), (loss64, grads64) = results[torch.float32], results[F64]
    assert abs(float(loss32) - float(loss64)) <= 1e-5 * abs(float(loss64))
    # float32 rounding of the loss (≈ 1.7 here) reaches every gradient entry alike: the tolerance is set by the largest
    # gradient of all parameters, not by each one's own (a scalar of 2.4e-4 moved by 5e-7 on another CPU's BLAS)
    scale = max(float(grad.abs().max()) for grad in grads64)
    for grad32, grad64 in zip(grads32, grads64):
        torch.testing.assert_close(grad32.to(F64), grad64, rtol=1e-3, atol=1e-4 * scale)


def test_a_batch_of_kernels_chunked_equals_unchunked(monkeypatch):
    calls = _spied(monkeypatch)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2, N, 2, generator=gen, dtype=F64)
    targets = torch.randn(2, N * T, generator=gen, dtype=F64)
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(WIDTH, seed=0, batch_shape=torch.Size([2])), num_tasks=T,
                                        rank=RANK).double()
    likelihood = MultitaskGaussianLikelihood(T, rank=1, batch_shape=torch.Size([2])).double()
    params = [p for p in (*kernel.parameters(), *likelihood.parameters()) if p.requires_grad]
    results = []
    for budget in (WHOLE, DATA_CHUNKED // 2):  # two batch members: half the rows per block fit
        with rfgp.settings.memory_budget(budget):
            covariance = kernel(x).evaluate_kernel()
            total = covariance + likelihood._shaped_noise_covar((N, T))
            inv_quad, logdet = total.inv_quad_logdet(targets.unsqueeze(-1), logdet=True)
            loss = (inv_quad + logdet).sum()
            results.append((loss, torch.autograd.grad(loss, params)))
    assert isinstance(covariance, ChunkedMultiOutputFeatureOperator)
    assert isinstance(calls["kronecker"][-1], kronecker_statistics.ChunkedDataFeatures)
    _assert_close(results[1], results[0])


@pytest.mark.parametrize("budget", list(BUDGETS))
@pytest.mark.parametrize("noise_rank", [0, 1])
def test_a_covariance_expanded_to_the_batch_of_the_mean_keeps_the_kronecker_statistics(monkeypatch, budget,
                                                                                       noise_rank):
    """A mean (and targets) with a batch of two and a kernel without one: linear_operator's noise sum expands the
    covariance to the batch.  Before, the expanded materialised covariance lost its factors (whitened-root statistics,
    O(N·T·F²·m²)) and the expanded chunked one was a plain chunked root inside the Kronecker noise operator, which
    raised AttributeError ('task_factor'); now both keep the Kronecker statistics, with the whitened path's loss and
    gradients."""
    calls = _spied(monkeypatch)
    model, x, y = _model(noise_rank, num_points=100)
    y = torch.stack((y, 0.5 * y.flip(-1)))
    model.set_train_data(x, y, strict=False)
    model.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(batch_shape=torch.Size([2])),
                                                     num_tasks=T).double()

    def mll_and_grads():
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        params = [p for p in model.parameters() if p.requires_grad]
        with rfgp.settings.memory_budget(BUDGETS[budget]):
            loss = -mll(model(x), y).sum()
            return loss.detach(), torch.autograd.grad(loss, params)

    new = mll_and_grads()
    assert len(calls["kronecker"]) == 1 and calls["whitened root"] == 0
    monkeypatch.setattr(KroneckerStatistics, "_kronecker_noise", lambda self: None)
    _assert_close(new, mll_and_grads())
    assert len(calls["kronecker"]) == 1


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_a_chunked_test_covariance_contracts_the_factors_of_its_blocks(noise_rank):
    """300 test points over the budget (the test covariance chunked): the mean is φ*_c·W·Bᵀ per block and the variance
    contracts φ*_c, B and C = A⁻¹ per block (``ChunkedKroneckerPosteriorCovariance``), with no triangular solve of the
    test rows (before: the blocks' roots Φ*_cL⁻ᵀ, n*·T·(F·m)² flops); the same mean and variances as unchunked."""
    model, x, _ = _model(noise_rank)
    test_x = torch.rand(300, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    expected, _, _ = _test_moments(model, x, test_x, rfgp.settings.memory_budget(WHOLE))
    actual, latent, flops = _test_moments(model, x, test_x, rfgp.settings.memory_budget(DATA_CHUNKED))
    assert isinstance(latent.lazy_covariance_matrix, ChunkedKroneckerPosteriorCovariance)
    assert flops == 0
    for value, reference in zip(actual, expected):
        torch.testing.assert_close(value, reference, rtol=1e-10, atol=1e-12)


def _test_moments(model, x, test_x, *settings):
    """((mean, variance, predictive variance) at ``test_x``, the latent posterior, the triangular-solve flops of the
    test rows) under ``settings``, the posterior caches built first (at two training points)."""
    model.train().eval()
    with contextlib.ExitStack() as stack, torch.no_grad():
        for setting in settings:
            stack.enter_context(setting)
        model(x[:2])
        with TriangularSolveFlops() as flops:
            latent = model(test_x)
            moments = (latent.mean, latent.variance, model.likelihood(latent).variance)
    return moments, latent, flops.flops


@pytest.mark.parametrize("kernel", ["multitask", "lcm"])  # lcm: a plain chunked test root (ChunkedPosteriorCovariance)
@pytest.mark.parametrize("noise_rank", [0, 1])
def test_a_chunked_posterior_of_batched_targets_over_an_unbatched_kernel_has_their_batch(noise_rank, kernel):
    """Targets and a mean with a batch of two, an unbatched kernel, the test covariance over the budget: the
    posterior covariance has the batch of the targets (the factor L carries it), with the unchunked variances and
    covariances.  Before, the chunked posterior took the unbatched test covariance's batch and raised
    ``RuntimeError: expand(...)`` at its variance, covariance matrix and samples."""
    model, x, y = _model(noise_rank, num_points=100)
    if kernel == "lcm":
        lcm = gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()],
                                         num_tasks=T, rank=RANK)
        model.covar_module = rfgp.sketch(lcm, WIDTH, seed=0).double()
    y = torch.stack((y, 0.5 * y.flip(-1)))
    model.set_train_data(x, y, strict=False)
    model.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(batch_shape=torch.Size([2])),
                                                     num_tasks=T).double()
    test_x = torch.rand(300, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    results = []
    for budget in (WHOLE, DATA_CHUNKED):
        model.train().eval()
        with rfgp.settings.memory_budget(budget), torch.no_grad():
            latent = model(test_x)
            results.append((latent.mean, latent.variance, model.likelihood(latent).variance,
                            latent.covariance_matrix[..., :40, :40]))
    expected_type = ChunkedKroneckerPosteriorCovariance if kernel == "multitask" else ChunkedPosteriorCovariance
    assert type(latent.lazy_covariance_matrix) is expected_type
    assert latent.lazy_covariance_matrix.shape == (2, 300 * T, 300 * T)
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_an_eagerly_evaluated_chunked_test_block_keeps_its_factors(noise_rank):
    """``gpytorch.settings.lazily_evaluate_kernels(False)``: ExactGP slices the test block out of the joint chunked
    covariance, which keeps φ and B, so its posterior contracts the blocks' factors with no triangular solve of the
    test rows, as a lazily evaluated one.  Before, the block was a plain chunked root (ChunkedPosteriorCovariance,
    the roots Φ*_cL⁻ᵀ: n*·T·(F·m)² flops); the values were the same."""
    model, x, _ = _model(noise_rank)
    test_x = torch.rand(300, 2, generator=torch.Generator().manual_seed(4), dtype=F64)
    results = []
    for eager in (False, True):
        moments, latent, flops = _test_moments(model, x, test_x, rfgp.settings.memory_budget(DATA_CHUNKED),
                                               gpytorch.settings.lazily_evaluate_kernels(not eager))
        assert isinstance(latent.lazy_covariance_matrix, ChunkedKroneckerPosteriorCovariance)
        assert flops == 0
        results.append(moments)
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
