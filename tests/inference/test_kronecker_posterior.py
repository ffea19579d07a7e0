"""The test side of a sketched multitask posterior from the factors φ* and B of its test root
(rfgp.inference.kronecker_posterior), against the root path Φ*L⁻ᵀ of the same model.

Before, the predictive mean was Φ*·w and the variance the row norms of Φ*L⁻ᵀ, n*·T·(F·m)² flops of triangular
solves; now the mean is φ*·W·Bᵀ and the variance contracts C = A⁻¹ with φ* and B where that is cheaper.
"""

import gpytorch
import pytest
import torch

from rfgp.inference import kronecker_posterior, multioutput
from rfgp.inference.kronecker_posterior import KroneckerFeatureSpacePosteriorCovariance, prefers_kronecker_variance
from tests._cost import LargestTensor, TriangularSolveFlops
from tests._models import MultitaskGP
from tests.inference.test_kronecker_statistics import _kernel, _likelihood

F64 = torch.float64


def _model(num_tasks, rank, noise_rank, batch_shape=torch.Size(), num_features=16, scaled=False, num_points=60):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(*batch_shape, num_points, 2, generator=gen, dtype=F64)
    y = torch.randn(*batch_shape, num_points, num_tasks, generator=gen, dtype=F64)
    kernel = _kernel(num_tasks, rank, num_features=num_features, batch_shape=batch_shape)
    if scaled:
        kernel = gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch_shape).double()
        with torch.no_grad():
            kernel.outputscale = 1.7
    model = MultitaskGP(x, y, _likelihood(num_tasks, noise_rank), kernel)
    if batch_shape:
        model.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(batch_shape=batch_shape),
                                                         num_tasks=num_tasks).double()
    return model.eval()


def _predict(model, test_x, fast=False, flops=None):
    """(latent mean, latent variance, predictive variance, latent covariance), and the gradients of the first three's
    sum w.r.t. the test inputs and every parameter (through the posterior caches: ``detach_test_caches(False)``),
    their triangular-solve flops counted in ``flops``."""
    params = [p for p in model.parameters() if p.requires_grad]
    test_x = test_x.clone().requires_grad_(True)
    model.train().eval()
    with gpytorch.settings.detach_test_caches(False), gpytorch.settings.fast_pred_var(fast):
        with flops or TriangularSolveFlops():
            latent = model(test_x)
            values = (latent.mean, latent.variance, model.likelihood(latent).variance)
            grads = torch.autograd.grad(sum(v.sum() for v in values), [test_x, *params], allow_unused=True)
        values = (*values, latent.covariance_matrix)
    return values, grads, latent.lazy_covariance_matrix


def _root_path(monkeypatch):
    monkeypatch.setattr(multioutput, "kronecker_test_factors", lambda covar: None)


def _assert_same(actual, expected):
    (values, grads, _), (expected_values, expected_grads, _) = actual, expected
    for value, expected_value in zip(values, expected_values):
        torch.testing.assert_close(value, expected_value, rtol=1e-10, atol=1e-12)
    for grad, expected_grad in zip(grads, expected_grads):
        assert (grad is None) == (expected_grad is None)
        if grad is not None:
            torch.testing.assert_close(grad, expected_grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("num_tasks,rank,noise_rank,scaled,fast", [
    (2, 1, 0, False, False), (3, 2, 1, True, False), (4, 1, 2, False, True), (3, 0, 0, True, True),
])
def test_mean_and_variance_from_the_factors_equal_the_root_path(monkeypatch, num_tasks, rank, noise_rank, scaled,
                                                                 fast):
    """n* = 150 test points, T·(rank + T) columns per feature: the variance contracts C = A⁻¹ with φ* and B, in fewer
    triangular-solve flops than the root Φ*L⁻ᵀ, and the values and gradients (mean, variances, covariance) are the
    root path's."""
    model = _model(num_tasks, rank, noise_rank, scaled=scaled)
    test_x = torch.rand(150, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    width = 16 * (rank + num_tasks)
    assert prefers_kronecker_variance(150, num_tasks, 16, rank + num_tasks)
    new = _predict(model, test_x, fast, flops := TriangularSolveFlops())
    assert isinstance(new[2], KroneckerFeatureSpacePosteriorCovariance)
    _root_path(monkeypatch)
    old = _predict(model, test_x, fast, root_flops := TriangularSolveFlops())
    assert not isinstance(old[2], KroneckerFeatureSpacePosteriorCovariance)
    _assert_same(new, old)
    assert root_flops.flops >= 150 * num_tasks * width**2  # the root Φ*L⁻ᵀ
    assert flops.flops < 150 * num_tasks * width**2


def test_few_test_points_keep_the_root_and_a_batch_of_models_contracts_per_member(monkeypatch):
    """n* = 2 points: the root costs fewer flops than C = A⁻¹ and is kept (the covariance's diagonal reads it); a
    batch of two kernels and training sets gives the batch's predictions either way."""
    calls = []
    contract = kronecker_posterior.kronecker_variance
    monkeypatch.setattr(kronecker_posterior, "kronecker_variance", lambda *a: calls.append(1) or contract(*a))
    gen = torch.Generator().manual_seed(3)
    model, few_x = _model(3, 1, 1), torch.rand(2, 2, generator=gen, dtype=F64)
    assert not prefers_kronecker_variance(2, 3, 16, 4)
    few = _predict(model, few_x)
    assert calls == []
    batched = _model(3, 1, 0, batch_shape=torch.Size([2]))
    test_x = torch.rand(2, 100, 2, generator=gen, dtype=F64)
    batch = _predict(batched, test_x)
    assert len(calls) == 2  # latent and predictive variance
    _root_path(monkeypatch)
    _assert_same(few, _predict(model, few_x))
    _assert_same(batch, _predict(batched, test_x))
    assert len(calls) == 2


def test_skipped_variances_never_form_the_test_root():
    """Under ``skip_posterior_variances`` the mean φ*·W·Bᵀ needs no n*·T × F·m matrix."""
    model = _model(3, 1, 1)
    test_x = torch.rand(500, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    with torch.no_grad():
        model(test_x[:2])
        expected = model(test_x).mean
        with gpytorch.settings.skip_posterior_variances(), LargestTensor() as largest:
            mean = model(test_x).mean
    torch.testing.assert_close(mean, expected, rtol=1e-10, atol=1e-12)
    assert largest.numel < 500 * 3 * model.covar_module.num_features


def test_the_kernel_space_posterior_takes_the_mean_from_the_factors(monkeypatch):
    """N·T = 40 rows for F·m = 192 columns: the posterior runs in kernel space, whose mean φ*·W·Bᵀ and variance (its
    own root) are the root path's."""
    model = _model(2, 1, 1, num_features=64, num_points=20)
    test_x = torch.rand(200, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    new = _predict(model, test_x)
    assert model.prediction_strategy.uses_kernel_space
    _root_path(monkeypatch)
    _assert_same(new, _predict(model, test_x))


@pytest.mark.parametrize("noise_rank", [0, 1])
def test_log_densities_samples_and_scalings_read_the_same_posterior(monkeypatch, noise_rank):
    """The predictive log-density (and its gradient w.r.t. the test inputs), a scaled covariance (``c·Σ*``, BoTorch's
    ``Standardize`` rescaling) and its variance, and joint samples from the same seed equal the root path's."""
    model = _model(3, 1, noise_rank)
    gen = torch.Generator().manual_seed(5)
    test_x, test_y = torch.rand(100, 2, generator=gen, dtype=F64), torch.randn(100, 3, generator=gen, dtype=F64)
    scale = torch.linspace(0.5, 2.0, 300, dtype=F64)

    def reads():
        inputs = test_x.clone().requires_grad_(True)
        model.train().eval()
        latent = model(inputs)
        covar = latent.lazy_covariance_matrix
        log_prob = model.likelihood(latent).log_prob(test_y)
        grad = torch.autograd.grad(log_prob, inputs)[0]
        with torch.no_grad():
            torch.manual_seed(7)
            samples = model.likelihood(model(test_x)).rsample(torch.Size([4]))
        return (log_prob, grad, (covar * 2.5).diagonal(), covar.rescaled(scale).diagonal(), samples)

    new = reads()
    _root_path(monkeypatch)
    for actual, expected in zip(new, reads()):
        torch.testing.assert_close(actual, expected, rtol=1e-9, atol=1e-10)


def test_eagerly_evaluated_kernels_index_whole_points_and_keep_the_factors():
    """Under ``lazily_evaluate_kernels(False)`` GPyTorch takes the test covariance as the principal block [n·T:, n·T:]
    of the joint train/test covariance: whole points, whose factors φ*[points] and B the block keeps, so the
    prediction contracts them as the lazily evaluated model does (before, the block was a plain root)."""
    model = _model(3, 1, 0)
    test_x = torch.rand(150, 2, generator=torch.Generator().manual_seed(3), dtype=F64)
    expected = _predict(model, test_x)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        actual = _predict(model, test_x)
    assert isinstance(actual[2], KroneckerFeatureSpacePosteriorCovariance)
    _assert_same(actual, expected)


def test_a_batched_multitask_fantasy_differentiates_in_its_new_inputs():
    """A fantasy of a batch of multitask models, differentiated w.r.t. its new inputs: its caches are rebuilt with
    their graph from the strategy evaluated again, which took GPyTorch's flattened (batch, N·T) labels as targets of
    shape (N, T) (before: 'Flattening the training labels failed' for any batch).  Reference: the models with the
    points appended to their training data, their caches differentiated (``detach_test_caches(False)``)."""
    gen = torch.Generator().manual_seed(5)
    test_x = torch.rand(2, 4, 2, generator=gen, dtype=F64)
    new_x = torch.rand(2, 2, 2, generator=gen, dtype=F64)
    new_y = torch.randn(2, 2, 3, generator=gen, dtype=F64)
    results = []
    for appended in (False, True):
        model, inputs = _model(3, 1, 0, batch_shape=torch.Size([2])), new_x.clone().requires_grad_(True)
        if appended:
            model.set_train_data(torch.cat([model.train_inputs[0], inputs], -2),
                                 torch.cat([model.train_targets, new_y], -2), strict=False)
        else:
            with torch.no_grad():
                model(test_x)
            model = model.get_fantasy_model(inputs, new_y)
        with gpytorch.settings.detach_test_caches(not appended):  # the reference's caches differentiated too
            mean = model(test_x).mean
        results.append((mean.detach(), torch.autograd.grad(mean.sum(), inputs)[0]))
    torch.testing.assert_close(results[0][0], results[1][0], rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(results[0][1], results[1][1], rtol=1e-8, atol=1e-10)
    assert results[1][1].abs().max() > 1e-2
