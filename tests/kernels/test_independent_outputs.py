"""GPyTorch's "Batch Independent Multioutput GP" (a ``batch_shape=[T]`` kernel, ``from_batch_mvn``,
``MultitaskGaussianLikelihood``) with a sketched kernel: the marginal likelihood, its gradient and the posterior of
the T independent GPs on the same features, through rfgp's multi-output feature algebra."""

import gpytorch
import pytest
import torch
from linear_operator.operators import BlockInterleavedLinearOperator

import rfgp
from rfgp.inference.independent_tasks import IndependentTasksLinearOperator
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.kernels.independent_outputs import IndependentOutputsKernel

from .._dense import DenseKernel
from .._models import BatchIndependentGP, UserGP

F64 = torch.float64
TASKS = torch.Size([2])
N = 450  # N·T = 900 > max_cholesky_size: linear_operator's generic path was CG and stochastic Lanczos


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


@pytest.mark.parametrize("rank, missing", [(0, False), (0, True), (1, False), (1, True)])
def test_batch_independent_outputs_over_the_memory_budget_train_and_predict_block_by_block(rank, missing):
    """A block root (N·T × T·F) over ``rfgp.settings.memory_budget`` is evaluated a block of points at a time: loss,
    gradient and predictions equal the unchunked ones (it fell back to GPyTorch's generic operator); with diagonal
    noise the T outputs' roots (N × F each) serve, materialised where they fit the budget (2 MiB), chunked otherwise
    (128 KiB; NaN targets' rows zeroed block by block)."""
    x, y, test_x = data()
    if missing:
        y[::5, 0] = float("nan")
        y[1::7, 1] = float("nan")
    results = []
    for budget in (2**30, 2**21, 2**17):  # the whole root is 900 × 128 float64 = 0.9 MiB, the T roots half of it
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=rank).double()
        model = BatchIndependentGP(x, y, sketched_batch_kernel(), likelihood)
        with rfgp.settings.memory_budget(budget), gpytorch.settings.observation_nan_policy("mask"):
            model.train()
            covariance = model(x).lazy_covariance_matrix.evaluate_kernel()
            kinds = type(covariance).__name__, type(getattr(covariance, "tasks", None)).__name__
            results.append((*fit_and_predict(model, x, y, test_x), kinds))
            assert model.prediction_strategy.independent_tasks is (rank == 0)
    (*whole, whole_kinds), *chunked = results
    assert [whole_kinds] + [kinds for *_, kinds in chunked] == [
        ("IndependentTasksLinearOperator", "FeatureRootLinearOperator"),
        ("ChunkedIndependentTasksOperator", "FeatureRootLinearOperator"),
        ("ChunkedIndependentTasksOperator", "ChunkedFeatureRootLinearOperator")]
    for *values, _ in chunked:
        for value, expected in zip(values, whole):
            torch.testing.assert_close(value, expected, rtol=1e-9, atol=1e-11)


def _likelihood(options):
    torch.manual_seed(2)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, **options).double()
    if likelihood.has_global_noise:
        likelihood.noise = 0.01
    if likelihood.has_task_noise:
        likelihood.task_noises = torch.tensor([0.02, 0.05])
    return likelihood


def _loss_gradients_posterior(model, x, y, test_x):
    """(loss, gradient of every parameter, predictive mean and covariance)."""
    model.train()
    loss = -gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y)
    parameters = [p for _, p in sorted(model.named_parameters()) if p.requires_grad]
    gradients = torch.autograd.grad(loss, parameters)
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(test_x))
    return loss.detach(), *gradients, predictive.mean, predictive.covariance_matrix


class InterleavedKernel(IndependentOutputsKernel):
    """The outputs as one interleaved root R of width T·F (the multi-output algebra of correlated outputs)."""

    def forward(self, x1, x2, diag=False, **params):
        covar = super().forward(x1, x2, diag=diag, **params)
        return covar.interleaved() if isinstance(covar, IndependentTasksLinearOperator) else covar


class InterleavedGP(BatchIndependentGP):
    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(
            self.mean_module(x).mT, InterleavedKernel(self.covar_module, 0)(x))


@pytest.mark.parametrize("options", [{}, {"has_global_noise": False}, {"has_task_noise": False}])
@pytest.mark.parametrize("missing", [False, True])
def test_independent_outputs_with_diagonal_noise_factorise_one_f_by_f_matrix_per_output(options, missing, factorised):
    """Diagonal task noise (``rank=0``, with or without the global or per-task noise): the T outputs are T single-output
    systems, so nothing larger than F × F is factorised (the interleaved root R factorised (T·F)², T² times the flops),
    and loss, the gradient of every parameter, the predictive mean and covariance (cross-output blocks 0) and a fantasy
    model's posterior equal those of R and, for the loss and gradients, GPyTorch's dense algebra on the same covariance
    (NaN targets under "mask" too); without NaN targets also GPyTorch's dense posterior (its multitask fantasy fails:
    the reference is the dense model of the training and fantasy points)."""
    x, y, test_x = data()
    if missing:
        y[::5, 0] = float("nan")
        y[1::7, 1] = float("nan")
    new_x, new_y = test_x[:5], y[:5] + 0.3
    kernel = sketched_batch_kernel()
    results = []
    with gpytorch.settings.observation_nan_policy("mask" if missing else "ignore"):
        for model_type in (BatchIndependentGP, InterleavedGP):
            model = model_type(x, y, kernel, _likelihood(options))
            factorised.clear()
            with gpytorch.settings.max_cholesky_size(800):  # N·T = 900 above it: rfgp's algebra at any setting
                values = _loss_gradients_posterior(model, x, y, test_x)
                with torch.no_grad():
                    fantasy = model.get_fantasy_model(new_x, new_y)(test_x[5:])
            results.append((*values, fantasy.mean, fantasy.covariance_matrix))
            independent = model_type is BatchIndependentGP
            assert factorised and max(factorised) == (64 if independent else 128), factorised  # F, not T·F
            assert model.prediction_strategy.independent_tasks is independent
        dense = BatchIndependentGP(x, y, DenseKernel(kernel), _likelihood(options))
        with gpytorch.settings.max_cholesky_size(10 ** 6):
            expected = _loss_gradients_posterior(dense, x, y, test_x)
            dense.set_train_data(torch.cat((x, new_x)), torch.cat((y, new_y)), strict=False)
            with torch.no_grad():
                expected_fantasy = dense(test_x[5:])
    expected = (*expected, expected_fantasy.mean, expected_fantasy.covariance_matrix)
    if missing:  # GPyTorch's dense posterior keeps NaN targets' points in its covariance
        expected = expected[:-4]
    for value, interleaved, reference in zip(*results, expected):
        torch.testing.assert_close(value, reference, rtol=1e-8, atol=1e-10)
    for value, interleaved in zip(*results):
        torch.testing.assert_close(value, interleaved, rtol=1e-10, atol=1e-10)
    test_points = test_x.shape[0]
    cross = results[0][-3].reshape(test_points, 2, test_points, 2)[:, 0, :, 1]  # interleaved: output 0 against 1
    assert torch.equal(cross, torch.zeros_like(cross))


class BatchSingleOutputGP(gpytorch.models.ExactGP):
    """The T outputs as a batch of T single-output GPs (targets ``(T, N)``): rfgp's single-output posterior."""

    def __init__(self, x, y, kernel, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=TASKS)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_independent_outputs_of_a_bias_corrected_map_keep_the_variance_correction():
    """A truncated Maclaurin map underestimates k(x, x); its posterior variance adds c(x*) = k(x*, x*) − E[k̂(x*, x*)]
    (paper 000 §5.6), as T single-output GPs do.  The interleaved multi-output path dropped it (variances too small
    by c(x*), up to 0.69 here)."""
    x, y, test_x = data()
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=TASKS), batch_shape=TASKS)
    kernel = rfgp.sketch(exact, 64, method="maclaurin", seed=0).double()
    likelihood = _likelihood({})
    model = BatchIndependentGP(x, y, kernel, likelihood)
    single = BatchSingleOutputGP(x, y.mT, kernel, gpytorch.likelihoods.GaussianLikelihood(batch_shape=TASKS).double())
    single.likelihood.noise = (likelihood.noise + likelihood.task_noises).unsqueeze(-1).detach()
    for each in (model, single):
        each.eval()
    with torch.no_grad():
        predictive, expected = model(test_x), single(test_x)
        correction = kernel(test_x).evaluate_kernel().variance_correction
    assert correction.max() > 0.5
    torch.testing.assert_close(predictive.mean, expected.mean.mT, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(predictive.variance, expected.variance.mT, rtol=1e-10, atol=1e-10)


def test_independent_outputs_weight_posterior_is_the_interleaved_roots():
    """E[θ | y] and posterior weight draws of independent outputs, stacked output by output, are those of the
    interleaved root's columns s·F + f (its capacitance is block diagonal: its Cholesky factor is the T factors)."""
    x, y, test_x = data()
    kernel = sketched_batch_kernel()
    strategies = []
    for model_type in (BatchIndependentGP, InterleavedGP):
        model = model_type(x, y, kernel, _likelihood({}))
        model.eval()
        with torch.no_grad():
            model(test_x)
        strategies.append(model.prediction_strategy)
    independent, interleaved = strategies
    assert independent.independent_tasks and not interleaved.independent_tasks
    torch.testing.assert_close(independent.weight_mean, interleaved.weight_mean, rtol=1e-10, atol=1e-12)
    draws = [strategy.weight_samples(3, torch.Generator().manual_seed(5)) for strategy in strategies]
    torch.testing.assert_close(draws[0], draws[1], rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("method, rank, missing, budget", [
    ("orf", 0, False, 2**30), ("orf", 0, True, 2**30), ("orf", 1, False, 2**30), ("maclaurin", 0, False, 2**30),
    ("orf", 0, True, 2**17), ("orf", 1, False, 2**17)])
def test_eagerly_evaluated_batch_kernels_keep_the_independent_outputs(method, rank, missing, budget, monkeypatch):
    """Under ``gpytorch.settings.lazily_evaluate_kernels(False)`` ``from_batch_mvn`` gets the batch of T feature
    roots itself, not a lazily evaluated kernel: it joined them in GPyTorch's ``BlockInterleavedLinearOperator``,
    so the marginal likelihood ran linear_operator's CG and stochastic Lanczos (N·T = 900: loss off by 1e-5,
    lengthscale gradients by 0.1, 40× the time at N = 3000) and prediction its generic strategy.  Now loss, gradient
    and predictions (a bias-corrected map's correction included) equal the lazily evaluated model's, factorising
    nothing larger than the T·F features; the test blocks of whole points stay per output.  So do roots over
    ``rfgp.settings.memory_budget`` (128 KiB: evaluated a block of points at a time), which at N = 3000 had
    linear_operator's generic path run for minutes until the process was killed."""
    x, y, test_x = data()
    if missing:
        y[::5, 0] = float("nan")
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=TASKS), batch_shape=TASKS)
    exact.base_kernel.lengthscale = torch.tensor([[[0.4]], [[0.9]]])
    kernel = rfgp.sketch(exact, 64, method=method, seed=0).double()
    results, sizes, cholesky = [], [], torch.linalg.cholesky_ex
    monkeypatch.setattr(torch.linalg, "cholesky_ex", lambda a, **kw: sizes.append(a.shape[-1]) or cholesky(a, **kw))
    for lazy in (True, False):
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(2, rank=rank).double()
        model = BatchIndependentGP(x, y, kernel, likelihood)
        sizes.clear()
        with gpytorch.settings.lazily_evaluate_kernels(lazy), gpytorch.settings.observation_nan_policy("mask"), \
                rfgp.settings.memory_budget(budget):
            results.append(fit_and_predict(model, x, y, test_x))
        assert max(sizes, default=0) <= 128, sizes
        assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    for value, expected in zip(results[1], results[0]):
        torch.testing.assert_close(value, expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():
        joint = IndependentTasksLinearOperator(kernel(torch.cat([x, test_x])).evaluate_kernel())
    assert isinstance(joint[2 * N:, 2 * N:], IndependentTasksLinearOperator)
    assert isinstance(joint[2 * N:, :2 * N], BlockInterleavedLinearOperator)


def test_a_chunked_covariance_of_independent_outputs_scales_by_a_constant():
    """c·RRᵀ of T independent outputs over the budget (linear_operator's ``mul`` by a constant) is the chunked
    operator with its T covariances scaled, and c times the matrix.  Scaling a chunked multi-output root reads its
    variance correction, which this operator lacked (``AttributeError``); bias-corrected maps' independent outputs are
    not chunked, so it is none."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20, 2, generator=gen, dtype=F64)
    kernel = rfgp.kernels.SketchedRBFKernel(16, seed=0, batch_shape=torch.Size([3])).double()
    with rfgp.settings.memory_budget(2000):
        covariance = gpytorch.distributions.MultitaskMultivariateNormal.from_batch_mvn(
            gpytorch.distributions.MultivariateNormal(torch.zeros(3, 20, dtype=F64), kernel(x))).lazy_covariance_matrix
        covariance = covariance.evaluate_kernel()
        assert type(covariance).__name__ == "ChunkedIndependentTasksOperator"
        assert covariance.variance_correction is None
        scaled = covariance.mul(torch.tensor(2.5, dtype=F64))
        assert type(scaled) is type(covariance)
        torch.testing.assert_close(scaled.to_dense(), 2.5 * covariance.to_dense(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("setting, message", [
    (lambda: rfgp.settings.memory_budget(2000),
     r"over rfgp.settings.memory_budget \(2000 bytes\) .*raise rfgp.settings.memory"),
    (lambda: rfgp.settings.chunk_size(5),
     r"in chunks of rfgp.settings.chunk_size\(5\) rows .*leave rfgp.settings.chunk"),
])
def test_chunked_independent_outputs_of_a_biased_map_are_refused_naming_the_chunking(setting, message):
    """The refusal named the memory budget (1 GiB) where rfgp.settings.chunk_size had forced the chunking."""
    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=F64)
    kernel = rfgp.kernels.SketchedRBFKernel(16, method="maclaurin", seed=0, batch_shape=torch.Size([3])).double()
    with setting(), pytest.raises(NotImplementedError, match=message):
        gpytorch.distributions.MultitaskMultivariateNormal.from_batch_mvn(
            gpytorch.distributions.MultivariateNormal(torch.zeros(3, 20, dtype=F64), kernel(x))
        ).lazy_covariance_matrix.evaluate_kernel()


@pytest.mark.parametrize("rank, budget", [(0, 2**30), (1, 2**30), (0, 20_000), (1, 20_000)])
def test_a_batch_of_independent_output_models_predicts_like_the_dense_model(rank, budget):
    """A batch of B models of T outputs each (kernel ``batch_shape=[B, T]``, unbatched inputs): GPyTorch slices the
    joint train/test covariance with the inputs expanded to the batch B, which the T outputs' kernel must broadcast
    (its predictions raised a RuntimeError), also chunked over the memory budget (whose interleaved rows had a batch
    B × B); loss, gradient and predictions equal the dense model's."""
    x, y, test_x = data()
    x, test_x, batch = x[:60], test_x[:7], torch.Size([3, 2])
    y = torch.stack([y[:60], 2 * y[60:120], y[120:180] - 1])
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch, ard_num_dims=3),
                                         batch_shape=batch)
    kernel = rfgp.sketch(exact, 64, seed=0).double()
    kernel.base_kernel.lengthscale = torch.linspace(0.4, 1.5, 18, dtype=F64).reshape(3, 2, 1, 3)
    results = []
    for covariance, max_cholesky_size in ((kernel, 100), (DenseKernel(kernel), 10 ** 6)):
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=rank,
                                                                      batch_shape=batch[:1]).double()
        model = BatchIndependentGP(x, y, covariance, likelihood)
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=batch).double()
        with gpytorch.settings.max_cholesky_size(max_cholesky_size), rfgp.settings.memory_budget(budget):
            model.train()
            loss = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y).sum()
            (gradient,) = torch.autograd.grad(loss, kernel.base_kernel.raw_lengthscale)
            model.eval()
            with torch.no_grad():
                predictive = likelihood(model(test_x))
        results.append((loss.detach(), gradient, predictive.mean, predictive.variance))
    assert results[0][2].shape == (3, 7, 2)
    for value, expected in zip(*results):
        torch.testing.assert_close(value, expected, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("rank, lazy, budget", [(0, False, 20_000), (1, False, 20_000), (0, True, 2**30),
                                                (1, True, 20_000)])
def test_outputs_with_their_own_inputs_match_the_dense_model(rank, lazy, budget):
    """Each output with its own inputs (x ``(T, N, d)`` against a ``batch_shape=[T]`` kernel), N·T over GPyTorch's
    ``max_cholesky_size``: eagerly evaluated over the memory budget, the interleaved rows had the inputs' T as a batch
    dimension (a loss of a batch of T, its mean off by 1.4, silently); lazily evaluated, the outputs went through
    GPyTorch's generic operator (CG and stochastic Lanczos: loss off by 6e-3).  Loss and predictions equal the dense
    model's."""
    gen = torch.Generator().manual_seed(0)
    x, test_x = torch.rand(2, N, 3, generator=gen, dtype=F64), torch.rand(2, 7, 3, generator=gen, dtype=F64)
    y = torch.randn(N, 2, generator=gen, dtype=F64)
    kernel = sketched_batch_kernel()
    results = []
    for covariance, max_cholesky_size in ((kernel, 800), (DenseKernel(kernel), 10 ** 6)):
        torch.manual_seed(1)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=rank).double()
        model = BatchIndependentGP(x, y, covariance, likelihood)
        with (gpytorch.settings.max_cholesky_size(max_cholesky_size), rfgp.settings.memory_budget(budget),
              gpytorch.settings.lazily_evaluate_kernels(lazy or max_cholesky_size > 800)):
            loss = -gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
            model.eval()
            with torch.no_grad():
                predictive = likelihood(model(test_x))
        results.append((loss.detach(), predictive.mean, predictive.variance))
    for value, expected in zip(*results):
        torch.testing.assert_close(value, expected, rtol=1e-8, atol=1e-10)
