"""A lazily evaluated kernel covariance evaluated whatever other threads do to GPyTorch's process-wide flag.

GPyTorch's ``LazyEvaluatedKernelTensor.evaluate_kernel`` calls the kernel inside
``gpytorch.settings.lazily_evaluate_kernels(False)``, a class attribute shared by the whole process.  A thread that
leaves the same setting at that moment (GPyTorch's own ``evaluate_kernel`` in another thread, or an rfgp model's
prediction, which enters ``lazily_evaluate_kernels(True)``) restores the value it found: the kernel call then sees the
flag on and returns one more ``LazyEvaluatedKernelTensor`` (memoised as the "evaluated" covariance) instead of the
kernel's operator.  rfgp's prediction strategies, which need the feature operator, refused it
("expected a low-rank feature operator for the test covariance, got LazyEvaluatedKernelTensor") (one of 8 predicting
threads in a CI run of tests/test_thread_settings.py).

:func:`evaluated_covariance` evaluates again while the result is still lazily evaluated: each retry is GPyTorch's
own evaluation of the same kernel at the same inputs (``active_dims`` already applied), so the result is the one a
single thread gets, and it replaces the memoised lazy one, so that GPyTorch's later ``evaluate_kernel`` calls on the
same covariance (its prediction strategies' constructors, ``LinearOperator.__add__``) return it too.

Kernels nested inside GPyTorch's ``AdditiveKernel``/``ProductKernel`` evaluate their children through the same flag;
a child caught by the race stays lazily evaluated inside the sum (the operators still give exact values;
guide/conventions.md, "Threads").
"""

from __future__ import annotations

from gpytorch.lazy import LazyEvaluatedKernelTensor
from gpytorch.utils.memoize import add_to_cache

#: Evaluations of one covariance before :func:`evaluated_covariance` gives up: each retry fails only when another
#: thread changes the flag during that very kernel call, so reaching this many means a kernel whose ``forward``
#: itself returns a lazily evaluated covariance.
MAX_EVALUATIONS = 64


def evaluated_covariance(covariance):
    """``covariance.evaluate_kernel()``, evaluated again while another thread's ``lazily_evaluate_kernels`` left the
    result lazily evaluated; anything without ``evaluate_kernel`` (a tensor) is returned as given.

    Raises:
        RuntimeError: the kernel still returned a ``LazyEvaluatedKernelTensor`` after :data:`MAX_EVALUATIONS`
            evaluations (its ``forward`` returns one).
    """
    if not hasattr(covariance, "evaluate_kernel"):
        return covariance
    result = covariance.evaluate_kernel()
    for _ in range(MAX_EVALUATIONS - 1):
        if not isinstance(result, LazyEvaluatedKernelTensor):
            return result
        result = result.evaluate_kernel()
        if not isinstance(result, LazyEvaluatedKernelTensor) and isinstance(covariance, LazyEvaluatedKernelTensor):
            add_to_cache(covariance, "kernel_eval", result)  # the key of GPyTorch's @cached(name="kernel_eval")
    if isinstance(result, LazyEvaluatedKernelTensor):
        raise RuntimeError(
            f"the kernel {type(result.kernel).__name__} returned a LazyEvaluatedKernelTensor from {MAX_EVALUATIONS} "
            "evaluations under gpytorch.settings.lazily_evaluate_kernels(False): its forward must return the "
            "covariance (a tensor or LinearOperator), not a lazily evaluated one"
        )
    return result
