"""rfgp.core.state_cache.StateCache: a result reused while the state it came from is unchanged."""

import sys
import threading

import torch

from rfgp.core.state_cache import StateCache


def test_result_is_reused_while_the_state_is_unchanged_and_recomputed_after_a_change():
    cache, state, calls = StateCache(), torch.ones(3), []

    def compute():
        calls.append(1)
        return state.sum().item()

    assert cache.get((state,), "config", compute) == 3.0
    assert cache.get((state,), "config", compute) == 3.0 and len(calls) == 1
    state.data.mul_(2)  # GPyTorch's setters write through .data: no version change, a value change
    assert cache.get((state,), "config", compute) == 6.0 and len(calls) == 2
    assert cache.get((state,), "other config", compute) == 6.0 and len(calls) == 3


def test_threads_with_different_configurations_never_get_each_others_result():
    """Two threads sharing a module's cache under different configurations (a float32 and a float64 prediction,
    say).  The key and the result were three attribute writes: a thread switch between them let the other thread
    match the new key and return the old result (a few of 2 × 10⁴ calls at a 1 µs switch interval)."""
    cache, state, wrong = StateCache(), torch.zeros(1), []

    def run(config):
        for _ in range(10_000):
            result = cache.get((state,), config, lambda: config)
            if result != config:
                wrong.append((config, result))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(config,)) for config in ("float32", "float64")]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    finally:
        sys.setswitchinterval(interval)
    assert not wrong
