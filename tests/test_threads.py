"""One model served from several threads at once: lazy first-use state is built once, and every thread gets the
prediction a single-threaded call gives, bit for bit (rfgp.core.locks).

The races are made reliable by widening the window of the lazy build with a short sleep (a spy around the builder).
"""

from __future__ import annotations

import copy
import pickle
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import gpytorch
import pytest
import torch

from rfgp.features import OptimizedMaclaurin
from rfgp.features.base import FeatureMap
from rfgp.inference.prediction import FeatureSpacePredictionStrategy
from rfgp.kernels import SketchedCurlFreeKernel, SketchedRBFKernel
from rfgp.models import ExactGPModel, MultiOutputGPModel
from rfgp.models.feature_width import set_num_features

THREADS = 8


def _together(call, threads: int = THREADS) -> list:
    """``call()`` from ``threads`` threads released together by a barrier; their results (exceptions re-raised)."""
    barrier = threading.Barrier(threads)

    def run(_):
        barrier.wait()
        return call()

    with ThreadPoolExecutor(threads) as pool:
        return [future.result() for future in [pool.submit(run, i) for i in range(threads)]]


def _slowed(monkeypatch, cls, name: str, counter: list) -> None:
    """``cls.name`` counted and sleeping 20 ms before it runs: the window another thread could enter widened."""
    original = getattr(cls, name)

    def slow(self, *args, **kwargs):
        counter.append(self)
        time.sleep(0.02)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(cls, name, slow)


def _regression(kernel, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(80, 3, generator=generator, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    model = ExactGPModel(x, y, likelihood, kernel).double().eval()
    return model, likelihood.eval(), torch.rand(7, 3, generator=generator, dtype=torch.float64)


def _prediction(model, likelihood, x):
    with torch.no_grad():
        predictive = likelihood(model(x))
        return predictive.mean, predictive.variance


def _assert_all_equal(results, reference):
    for result in results:
        for got, want in zip(result, reference):
            assert torch.equal(got, want)


def _mean_cache_spy(monkeypatch) -> list:
    """Count the builds of the weight-space posterior caches (widened by a sleep)."""
    built = []
    original = FeatureSpacePredictionStrategy._mean_covar_cache.__wrapped__

    def slow(self, nan_policy):
        built.append(self)
        time.sleep(0.02)
        return original(self, nan_policy)

    monkeypatch.setattr(FeatureSpacePredictionStrategy, "_mean_covar_cache",
                        gpytorch.utils.memoize.cached(name="mean_covar_cache")(slow))
    return built


def test_lazy_draws_are_made_once_and_seen_whole(monkeypatch):
    """A kernel without input_dim draws at its first call: threads calling a fresh eval-mode model at once raised
    AttributeError (input_dim was set before the draws were registered)."""
    drawn = []
    _slowed(monkeypatch, FeatureMap, "_materialize", drawn)
    reference = _prediction(*_regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=1))))
    drawn.clear()
    model, likelihood, x = _regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, seed=1)))
    model.eval()
    results = _together(lambda: _prediction(model, likelihood, x))
    assert len(drawn) == 1
    _assert_all_equal(results, reference)


@pytest.mark.parametrize("retrain", [False, True])
def test_posterior_caches_are_built_once(monkeypatch, retrain):
    """rfgp's ExactGP models build one prediction strategy and its caches once for threads predicting at once after
    eval() (caches dropped), also after a training step changed the hyperparameters, with every thread's prediction
    equal to the single-threaded one."""
    model, likelihood, x = _regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, input_dim=3, seed=2)))
    if retrain:
        model.train()
        model.covar_module.outputscale = 1.5
        model.eval()
    reference = _prediction(copy.deepcopy(model), likelihood, x)
    model.train(), model.eval()
    built = _mean_cache_spy(monkeypatch)
    results = _together(lambda: _prediction(model, likelihood, x))
    assert len(built) == 1
    _assert_all_equal(results, reference)


def test_strategy_cache_is_built_once_per_policy(monkeypatch):
    """Threads sharing a built prediction strategy build a cache it has not yet got (here the one of another NaN
    policy) once."""
    model, likelihood, x = _regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, input_dim=3, seed=9)))
    with gpytorch.settings.observation_nan_policy("mask"):
        reference = _prediction(copy.deepcopy(model), likelihood, x)
    _prediction(model, likelihood, x)  # the strategy and its "ignore" caches
    built = _mean_cache_spy(monkeypatch)
    with gpytorch.settings.observation_nan_policy("mask"):
        results = _together(lambda: _prediction(model, likelihood, x))
    assert len(built) == 1
    _assert_all_equal(results, reference)


def test_set_num_features_then_threads(monkeypatch):
    """After set_num_features (maps redrawn, caches cleared) the next concurrent predictions build once."""
    model, likelihood, x = _regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, input_dim=3, seed=3)))
    model.eval()
    _prediction(model, likelihood, x)
    set_num_features(model, 32)
    reference = _prediction(copy.deepcopy(model), likelihood, x)
    set_num_features(model, 32)
    built = _mean_cache_spy(monkeypatch)
    results = _together(lambda: _prediction(model, likelihood, x))
    assert len(built) == 1
    _assert_all_equal(results, reference)


def test_multi_output_model(monkeypatch):
    """A curl-free model builds one prediction strategy for threads that predict at once after eval()."""
    generator = torch.Generator().manual_seed(4)
    x = torch.randn(40, 2, generator=generator, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).double().eval()
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(64, input_dim=2, seed=5))
    model = MultiOutputGPModel(x, -2 * x, likelihood, kernel).double().eval()
    reference = _prediction(model, likelihood, x[:5] + 0.1)
    model.train(), model.eval()
    built = []
    original = kernel.prediction_strategy

    def slow(*args, **kwargs):
        built.append(1)
        time.sleep(0.02)
        return original(*args, **kwargs)

    monkeypatch.setattr(kernel, "prediction_strategy", slow)
    results = _together(lambda: _prediction(model, likelihood, x[:5] + 0.1))
    assert len(built) == 1
    _assert_all_equal(results, reference)


def test_maclaurin_allocation_is_made_once(monkeypatch):
    """An optimized Maclaurin map allocates its widths on its first input: threads that came together each
    allocated, or used sketches not yet drawn for the widths another had set."""
    fitted = []
    _slowed(monkeypatch, OptimizedMaclaurin, "fit", fitted)
    x = torch.rand(30, 4, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    reference = OptimizedMaclaurin(gpytorch_free_kernel(), 64, seed=7).double()(x)
    fitted.clear()
    feature_map = OptimizedMaclaurin(gpytorch_free_kernel(), 64, seed=7).double()
    results = _together(lambda: (feature_map(x),))
    assert len(fitted) == 1
    _assert_all_equal(results, (reference,))


def gpytorch_free_kernel():
    from rfgp.features import dot_product
    return dot_product.exponential()


def test_lock_is_not_part_of_the_state():
    """The locks live outside the objects: pickle, deepcopy and state_dict of a model served from threads work."""
    model, likelihood, x = _regression(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=8)))
    model.eval()
    results = _together(lambda: _prediction(model, likelihood, x))
    assert all(not isinstance(value, type(threading.RLock())) for value in vars(model.covar_module.base_kernel
                                                                                     .feature_map).values())
    copied = copy.deepcopy(model)
    unpickled = pickle.loads(pickle.dumps(model))
    assert model.state_dict().keys() == copied.state_dict().keys()
    _assert_all_equal([_prediction(copied, likelihood, x), _prediction(unpickled, likelihood, x)], results[0])
