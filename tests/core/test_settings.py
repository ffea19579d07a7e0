"""rfgp.settings: a context's override ends when it is left, whatever the order contexts are left in."""

import math
import threading

import numpy as np
import pytest

from rfgp.core.settings import chunk_size, float32_statistics_tolerance, memory_budget, validate_inputs


def test_an_instance_entered_twice_restores_the_default():
    """The second entry of one instance overwrote the value it restored: the budget stayed at 1000 for the process."""
    default = memory_budget.value()
    small = memory_budget(1000)
    with small:
        with small:
            assert memory_budget.value() == 1000
        assert memory_budget.value() == 1000
    assert memory_budget.value() == default


def test_overlapping_contexts_of_two_threads_leave_no_value_behind():
    """A enters, B enters, A leaves, B leaves: B restored the value it saw on entry (A's), which stayed set for the
    process — as where threads evaluate independent-outputs kernels, which enter memory_budget(budget // T)."""
    default = memory_budget.value()
    a_entered, b_entered, a_left = threading.Event(), threading.Event(), threading.Event()
    seen = {}

    def first():
        with memory_budget(1000):
            a_entered.set()
            b_entered.wait(10)
        seen["after A left"] = memory_budget.value()  # B's context is still entered
        a_left.set()

    def second():
        a_entered.wait(10)
        with memory_budget(2000):
            b_entered.set()
            a_left.wait(10)

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert seen["after A left"] == 2000
    assert memory_budget.value() == default


def test_contexts_left_by_an_error_or_out_of_order_and_set_global_inside_one():
    default, outer, inner = memory_budget.value(), memory_budget(3000), memory_budget(4000)
    with pytest.raises(RuntimeError, match="inside"):
        with outer:
            raise RuntimeError("inside")
    assert memory_budget.value() == default
    outer.__enter__()
    inner.__enter__()
    outer.__exit__(None, None, None)  # left before the inner one: the inner one's value holds until it is left
    assert memory_budget.value() == 4000
    inner.__exit__(None, None, None)
    assert memory_budget.value() == default
    try:
        with memory_budget(5000):
            memory_budget.set_global(6000)  # the process value, seen once the context is left (was undone by it)
            assert memory_budget.value() == 5000
        assert memory_budget.value() == 6000
    finally:
        memory_budget.set_global(default)
    with validate_inputs(False), chunk_size(7):  # each setting keeps its own contexts
        assert (validate_inputs.on(), chunk_size.value(), memory_budget.value()) == (False, 7, default)
    assert validate_inputs.on() is True and chunk_size.value() is None


@pytest.mark.parametrize("value, expected", [(np.float32(0.5), 0.5), (np.int64(2), 2.0), (10**400, math.inf)],
                         ids=["np.float32", "np.int64", "10**400"])
def test_float32_statistics_tolerance_takes_every_real_number(value, expected):
    """NumPy's float32 and integers were refused as no number; an int beyond float's range raised OverflowError."""
    with float32_statistics_tolerance(value):
        assert float32_statistics_tolerance.value() == expected


@pytest.mark.parametrize("value", [-(10**400), math.nan, np.float32("nan"), -1],
                         ids=["-10**400", "nan", "np.float32 nan", "-1"])
def test_float32_statistics_tolerance_refuses_negative_and_nan_by_name(value):
    with pytest.raises(ValueError, match="float32_statistics_tolerance must be a real number ≥ 0"):
        float32_statistics_tolerance(value)
