"""Memory guard: refuse an allocation that cannot fit before the allocator fails on it.

Random draws (F × d numbers for dense samplers) and the F × F or N × N matrices of a
feature-space solve cannot be chunked.  Before they are allocated their size is estimated
and compared with the memory the device has available — MemAvailable of ``/proc/meminfo``
(else ``SC_AVPHYS_PAGES · SC_PAGE_SIZE``) on the CPU, ``torch.cuda.mem_get_info`` on CUDA —
and a ``ValueError`` names ``num_features``, the sizes and the estimate instead of an
allocator crash (or a machine swapping to a halt).  N × F feature matrices are not refused:
they are chunked under :class:`rfgp.settings.memory_budget`.

Estimates below :data:`CHECK_THRESHOLD` bytes are not checked, so the common case costs
nothing (no ``/proc`` read, no CUDA call).

The budget bounds the feature matrices (chunked where they exceed it), not the F × F statistics of the solve,
which one chunk at a time cannot shrink: where those alone exceed it (a batch of B independent GPs forms B of them),
:func:`warn_statistics_over_budget` says so with a :class:`MemoryBudgetWarning`.
"""

from __future__ import annotations

import os

import torch

from .dtypes import factor_dtype
from .settings import memory_budget
from .user_warnings import warn as warn_user

#: allocations smaller than this (256 MiB) are never checked
CHECK_THRESHOLD = 2**28
#: bytes per drawn number: draws are made in float64 on the CPU, then converted
DRAW_BYTES = 8


def available_bytes(device: torch.device | str) -> int | None:
    """Memory the device can still allocate, or ``None`` when it cannot be determined."""
    device = torch.device(device)
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    if device.type != "cpu":
        return None
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def format_bytes(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.3g} GiB" if num_bytes >= 2**26 else f"{num_bytes / 2**20:.3g} MiB"


def check_allocation(num_bytes: int, what: str, device, advice: str) -> None:
    """Raise ``ValueError`` when ``num_bytes`` for ``what`` exceed the device's available memory."""
    if num_bytes < CHECK_THRESHOLD:
        return
    available = available_bytes(device)
    if available is not None and num_bytes > available:
        raise ValueError(
            f"{what} needs about {format_bytes(num_bytes)} but only {format_bytes(available)} is available on "
            f"{torch.device(device)}; {advice}"
        )


def draw_numel(feature_map, input_dim: int) -> int:
    """Numbers drawn by a feature map: F·d for dense projections (RFF, ORF, sketches), 3F for SORF-type ones.

    A lower bound for maps that draw one d-vector per feature and degree (polynomial sketches
    draw p of them), so the guard never refuses a map that would fit.
    """
    structured = "structured" in (getattr(feature_map, "sampler", None), getattr(feature_map, "direction_sampler", None))
    return feature_map.num_features * (3 if structured else max(input_dim, 1))


def check_draws(feature_map, input_dim: int, device) -> None:
    """Guard the random draws of ``feature_map`` for ``input_dim`` before they are made."""
    num_bytes = draw_numel(feature_map, input_dim) * DRAW_BYTES
    check_allocation(
        num_bytes,
        f"{type(feature_map).__name__} with num_features={feature_map.num_features} and input_dim={input_dim} "
        f"(random draws in float64)",
        device,
        "reduce num_features (or use a structured sampler such as method='sorf')",
    )


def check_solve(num_rows: int, num_features: int, batch: int, dtype: torch.dtype, device,
                size: int | None = None, advice: str | None = None) -> None:
    """Guard the square matrix of a feature-space solve (capacitance I + ΦᵀD⁻¹Φ or dense N × N) and its factor.

    ``size`` is the side of the matrix the solve forms: F for the capacitance, N for the kernel-space
    matrix; by default min(N, F), the cheaper of the two.  ``advice`` replaces the default advice.  The capacitance
    is factorised in :func:`~rfgp.core.dtypes.factor_dtype` (float64 for float32 features: counted in ``dtype``, the
    guard passed twice the memory there was); the kernel-space matrix is counted in the features' ``dtype``.
    """
    size = min(num_rows, num_features) if size is None else size
    if size == num_features:
        dtype = factor_dtype(dtype, torch.device(device))
    num_bytes = 2 * batch * size * size * torch.empty((), dtype=dtype).element_size()  # matrix and its Cholesky
    if advice is None:
        advice = "reduce num_features" if size == num_features else "reduce the number of training points (rows N)"
    check_allocation(
        num_bytes,
        f"the feature-space solve with N={num_rows} training rows, num_features={num_features}, batch={batch} "
        f"({size} × {size} {dtype} matrix and its Cholesky factor)",
        device,
        advice,
    )


class MemoryBudgetWarning(UserWarning):
    """The F × F statistics of a feature-space solve exceed :class:`rfgp.settings.memory_budget` on their own.

    The budget bounds the ``(B, N, F)`` features (chunking them where they exceed it); the ``(B, F, F)`` statistics,
    the capacitance, its Cholesky factor and their gradients are formed whole, B of them for a batch of B
    independent GPs.
    """


#: (B, F, F) matrices alive at the peak of one marginal likelihood and its gradient on chunked statistics, and of
#: one posterior's caches (no gradient): the peak memory growth over one (B, F, F) float64 matrix was 6.0–6.2 and
#: 3.1–3.8 at B = 100 members, F = 128–512, N = 1000 under budgets of 4–16 MiB, the chunks included
#: (:file:`benchmarks/results/batch_memory.md`); rounded down, so that a warning means the budget is exceeded
STATISTICS_COPIES_GRADIENT = 6
STATISTICS_COPIES = 3


def warn_statistics_over_budget(batch: int, num_features: int, dtype: torch.dtype, device, gradient: bool) -> None:
    """Warn (:class:`MemoryBudgetWarning`) where the ``(batch, F, F)`` statistics alone exceed the memory budget.

    Their size is :data:`STATISTICS_COPIES_GRADIENT` (``gradient``: an MLL and its backward pass) or
    :data:`STATISTICS_COPIES` (a posterior's caches) matrices of ``batch · F²`` numbers in the factors' precision
    (:func:`~rfgp.core.dtypes.factor_dtype`: float64 for float32 features).

    Only for batches (``batch`` > 1): one GP's F × F matrices are the width it was given (train small, predict big
    re-draws a single model at 4–8F: F = 8 192 needs 1.6 GB for a posterior, above the default 1 GiB budget, which
    bounds the N × F features), while a batch's grow with its number of members, which the budget does not see.
    """
    if batch <= 1:
        return
    budget = memory_budget.value()
    copies = STATISTICS_COPIES_GRADIENT if gradient else STATISTICS_COPIES
    member_bytes = copies * num_features**2 * factor_dtype(dtype, torch.device(device)).itemsize
    needed = batch * member_bytes
    if needed <= budget:
        return
    group = budget // member_bytes
    if group >= 1:
        advice = (f"fit the members in separate models of at most {group} (batch_shape=[{group}]), reduce "
                  f"num_features, or raise the budget above {needed} bytes")
    else:
        advice = f"reduce num_features, or raise the budget above {needed} bytes"
    what = "an MLL and its gradient" if gradient else "a posterior"
    warn_user(
        f"rfgp.settings.memory_budget is {budget} bytes ({format_bytes(budget)}) but the feature statistics of "
        f"{what} for B = {batch} batch member(s) at num_features F = {num_features} need about {needed} bytes "
        f"({format_bytes(needed)}: {copies} (B, F, F) matrices) on top of the features; the budget bounds only the "
        f"(B, N, F) features, in chunks where they exceed it: {advice}",
        MemoryBudgetWarning,
    )
