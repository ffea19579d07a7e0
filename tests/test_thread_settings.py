"""GPyTorch's process-wide settings that rfgp used to enter around its own calls, under threads: a thread's rfgp call
changes nothing another thread reads, and leaves no setting changed (guide/conventions.md, "Threads").

As in tests/test_threads.py, the threads are released together by a barrier and the windows are widened by a sleep
inside the calls (a spy around a method that runs while a setting was entered).
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gpytorch
import linear_operator
import pytest
import torch

from rfgp.applications.vector_fields import posterior_component_fields, posterior_field_samples, posterior_mean_field
from rfgp.datasets import helmholtz_field
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.inference.operators import FeatureRootAddedDiagLinearOperator
from rfgp.inference.prediction import FeatureSpacePredictionStrategy
from rfgp.kernels import MultiOutputFeatureSumKernel, SketchedCurlFreeKernel, SketchedDivFreeKernel, SketchedRBFKernel
from rfgp.models import GPRegressor, MultiOutputGPModel
from rfgp.models.sampling import posterior_paths

from .test_threads import _regression, _slowed

THREADS = 8


@pytest.fixture(autouse=True)
def _settings_restored(monkeypatch):
    """GPyTorch's own kernel evaluation enters ``lazily_evaluate_kernels(False)`` process-wide, so threads evaluating
    kernels at once can leave it off (GPyTorch's race, documented in guide/conventions.md "Threads"): the flags are
    restored after each test, so that later tests in the process run with the settings they expect."""
    for flag in (gpytorch.settings.lazily_evaluate_kernels, gpytorch.settings.skip_posterior_variances,
                 linear_operator.settings.fast_computations.log_prob):
        monkeypatch.setattr(flag, "_state", flag._state)


def _sleeping(monkeypatch, cls, name: str, seconds: float) -> None:
    """``cls.name`` sleeping ``seconds`` before it runs."""
    original = getattr(cls, name)

    def slow(self, *args, **kwargs):
        time.sleep(seconds)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, slow)


def _interleaved(calls) -> list:
    """``calls[i]()`` in thread i, released together by a barrier, thread i starting 5·(i mod 4) ms later: entries and
    exits of a setting interleaved."""
    barrier = threading.Barrier(len(calls))

    def run(i):
        barrier.wait()
        time.sleep(0.005 * (i % 4))
        return calls[i]()

    with ThreadPoolExecutor(len(calls)) as pool:
        return list(pool.map(run, range(len(calls))))


def _assert_settings_untouched():
    assert gpytorch.settings.skip_posterior_variances.is_default()
    assert gpytorch.settings.skip_posterior_variances.off()


def test_estimator_predictions_in_threads_keep_each_ones_variances(monkeypatch):
    """``GPRegressor.predict(X)`` entered ``skip_posterior_variances(True)`` for the process: a thread's
    ``predict(X, return_std=True)`` at the same time got skipped variances, and the flag could stay on for every later
    GPyTorch model.  Now no setting is entered: every thread gets its single-threaded result, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(60, 2, generator=generator, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    test_x = torch.rand(9, 2, generator=generator, dtype=torch.float64)
    reg = GPRegressor(num_iterations=3, dtype=torch.float64, progress=False).fit(x, y)
    mean_only = reg.predict(test_x)
    mean, std = reg.predict(test_x, return_std=True)
    assert (std > 1e-3).all()
    _sleeping(monkeypatch, FeatureSpacePredictionStrategy, "exact_prediction", 0.02)
    calls = [(lambda: reg.predict(test_x, return_std=True)) if i % 2 else (lambda: reg.predict(test_x))
             for i in range(THREADS)]
    for _ in range(3):
        results = _interleaved(calls)
        _assert_settings_untouched()
        for i, result in enumerate(results):
            if i % 2:
                assert torch.equal(result[0], mean) and torch.equal(result[1], std)
            else:
                assert torch.equal(result, mean_only)


def _helmholtz_model():
    kernel = MultiOutputFeatureSumKernel(ScaleKernel(SketchedCurlFreeKernel(64, 2, seed=0)),
                                         ScaleKernel(SketchedDivFreeKernel(64, 2, seed=1)))
    data = helmholtz_field(40, input_dim=2, noise=0.05, seed=3)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).double()
    return MultiOutputGPModel(data["x"].double(), data["y"].double(), likelihood, kernel).double().eval()


ScaleKernel = gpytorch.kernels.ScaleKernel
HELPERS = {
    "posterior_paths": lambda: posterior_paths(_regression(ScaleKernel(SketchedRBFKernel(64, seed=1)))[0], 2),
    "posterior_field_samples": lambda: posterior_field_samples(_helmholtz_model(), 2),
    "posterior_component_fields": lambda: posterior_component_fields(_helmholtz_model()),
    "posterior_mean_field": lambda: posterior_mean_field(_helmholtz_model())(torch.rand(3, 2, dtype=torch.float64)),
}


@pytest.mark.parametrize("helper", list(HELPERS))
def test_posterior_weight_helpers_in_a_thread_leave_other_threads_variances(monkeypatch, helper):
    """``posterior_paths`` (its first prediction), ``posterior_field_samples``, ``posterior_component_fields`` and
    ``posterior_mean_field`` entered ``skip_posterior_variances(True)`` for the process: another thread's prediction
    at the same time got zero variances.  Now the other threads' variances are their single-threaded ones."""
    model, likelihood, test_x = _regression(ScaleKernel(SketchedRBFKernel(64, seed=0)))
    with torch.no_grad():
        reference = model(test_x).variance
    assert (reference > 0).all()
    _sleeping(monkeypatch, FeatureSpacePredictionStrategy, "exact_prediction", 0.02)
    _sleeping(monkeypatch, MultitaskFeatureSpacePredictionStrategy, "exact_prediction", 0.02)

    def variance():
        with torch.no_grad():
            return model(test_x).variance

    for _ in range(2):
        results = _interleaved([HELPERS[helper]] + [variance] * (THREADS - 1))
        _assert_settings_untouched()
        for result in results[1:]:
            assert torch.equal(result, reference)


def test_marginal_likelihoods_in_threads_leave_fast_log_prob_as_botorch_set_it(monkeypatch):
    """After ``import botorch`` (fast log-prob off for the process) rfgp entered ``fast_computations.log_prob(True)``
    around each rfgp marginal likelihood: threads leaving it in another order than they entered left it on for every
    GPyTorch model of the process.  Now rfgp's log-density enters no setting: the flag stays off, and every thread's
    value and gradients equal a single-threaded call's, bit for bit."""
    monkeypatch.setattr(linear_operator.settings._fast_log_prob, "_default", False)  # what import botorch does
    model, likelihood, _ = _regression(ScaleKernel(SketchedRBFKernel(64, seed=0)))
    model.train(), likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)

    def value_and_gradient():
        loss = mll(model(*model.train_inputs), model.train_targets)
        return (loss.detach(), *torch.autograd.grad(loss, list(model.parameters())))

    reference = value_and_gradient()
    _slowed(monkeypatch, FeatureRootAddedDiagLinearOperator, "inv_quad_logdet", [])
    for _ in range(3):
        results = _interleaved([value_and_gradient] * THREADS)
        assert gpytorch.settings.fast_computations.log_prob.off()
        for result in results:
            for got, want in zip(result, reference, strict=True):
                assert torch.equal(got, want)


def _lazy_evaluation_lost(monkeypatch, times: float) -> None:
    """The first ``times`` entries of ``lazily_evaluate_kernels(False)`` leave the flag on, as when another thread
    leaves the setting at that moment and restores the value it found (GPyTorch's flag is one class attribute)."""
    flag = gpytorch.settings.lazily_evaluate_kernels
    lost = {"left": times}

    def set_state(cls, state):
        if state is False and lost["left"] > 0:
            lost["left"] -= 1
            state = True
        cls._state = state

    monkeypatch.setattr(flag, "_set_state", classmethod(set_state))


PREDICTIONS = {
    "regression variance": lambda: _regression(ScaleKernel(SketchedRBFKernel(64, seed=0)))[::2],
    "vector field": lambda: (_helmholtz_model(), torch.rand(3, 2, dtype=torch.float64,
                                                            generator=torch.Generator().manual_seed(5))),
}


@pytest.mark.parametrize("times", [1, 3])
@pytest.mark.parametrize("case", list(PREDICTIONS))
def test_a_kernel_evaluation_another_thread_left_lazy_is_evaluated_again(monkeypatch, case, times):
    """GPyTorch's ``evaluate_kernel`` calls the kernel under ``lazily_evaluate_kernels(False)``, a process-wide flag:
    a thread leaving that setting at the same moment restored it on, the kernel returned one more
    ``LazyEvaluatedKernelTensor``, and rfgp's prediction strategies refused their own model ("expected a low-rank
    feature operator for the test covariance, got LazyEvaluatedKernelTensor"; one of 8 threads in a CI run).  Now
    the covariance is evaluated again: the prediction and the marginal likelihood equal an undisturbed call's."""
    model, test_x = PREDICTIONS[case]()
    with torch.no_grad():
        reference = model(test_x)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    reference_mll = mll(model(*model.train_inputs), model.train_targets)
    model.eval()
    _lazy_evaluation_lost(monkeypatch, times)
    with torch.no_grad():
        disturbed = model(test_x)
        assert torch.equal(disturbed.mean, reference.mean) and torch.equal(disturbed.variance, reference.variance)
    model.train()
    _lazy_evaluation_lost(monkeypatch, times)
    assert torch.equal(mll(model(*model.train_inputs), model.train_targets), reference_mll)


def test_a_kernel_left_lazily_evaluated_every_time_is_named(monkeypatch):
    """A covariance that stays lazily evaluated through every evaluation (a kernel whose ``forward`` returns one) is
    refused by kernel name instead of looping."""
    model, _, test_x = _regression(ScaleKernel(SketchedRBFKernel(64, seed=0)))
    _lazy_evaluation_lost(monkeypatch, float("inf"))
    with pytest.raises(RuntimeError, match="ScaleKernel returned a LazyEvaluatedKernelTensor from 64 evaluations"):
        model(test_x)
