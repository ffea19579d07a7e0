"""Type promotion of a kernel call, as GPyTorch's kernels do it.

A GPyTorch kernel computes with its inputs and its float parameters together, so torch's
type promotion decides the result: ``RBFKernel()`` (float32) on float64 inputs returns a
float64 covariance, a float64 kernel on float32 inputs too.  rfgp kernels do the same:
a call computes in ``torch.promote_types`` of x1's, x2's and the kernel's dtype, and
every stored draw, parameter and cached factor is cast *per call* to that dtype (they are
small: d × F draws, F × F factors).  Inputs are never modified and the module's buffers and
parameters are never converted in place, so ``state_dict()`` is unchanged by any call.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
from collections.abc import Callable, Hashable

import torch
from torch import Tensor

_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
#: dtypes whose F × F / M × M factors are worked in float64 (and rounded back), where the device has float64
_WIDENED = (torch.float32, torch.float16, torch.bfloat16)
_HALF = (torch.float16, torch.bfloat16)


def _autocast_flags() -> dict[str, Callable[[], bool]]:
    """Per device type, the thread-local flag of ``torch.autocast``: ``torch.is_autocast_enabled(device)`` from
    torch 2.4 on; before, only the CPU and CUDA flags had functions (and autocast only those devices)."""
    try:
        torch.is_autocast_enabled("cpu")
    except TypeError:  # torch < 2.4
        return {"cpu": torch.is_autocast_cpu_enabled, "cuda": torch.is_autocast_enabled}
    return {device: functools.partial(torch.is_autocast_enabled, device)
            for device in ("cpu", "cuda", "xpu", "mps", "hpu")}


_AUTOCAST_FLAGS = _autocast_flags()


def autocast_devices() -> tuple[str, ...]:
    """The device types on which an enclosing ``torch.autocast`` is active (free: thread-local flags only)."""
    return tuple(device for device, enabled in _AUTOCAST_FLAGS.items() if enabled())


#: device types whose autocast :func:`full_precision` has switched off around the current rfgp computation
_SWITCHED_OFF: contextvars.ContextVar[tuple[str, ...]] = contextvars.ContextVar("rfgp_autocast_switched_off",
                                                                               default=())


@contextlib.contextmanager
def full_precision():
    """Switch off every enclosing ``torch.autocast`` for rfgp's own computations.

    Autocast runs the ops on its lower-precision list (``matmul``, ``mm``, ``bmm``, ``linear``, ``linalg_vecdot``,
    ``baddbmm``, …) in bfloat16/float16 whatever their inputs' dtype: the projections XΩᵀ, the statistics ΦᵀΦ and ΦᵀY,
    the Gram ΦΦᵀ would keep 2–3 digits (a float32 model at N = 2000, F = 512 then fails its F × F factorisation), a
    silently different model.  rfgp computes in its inputs' float32/float64 instead; outputs are returned in that dtype,
    and autocast goes on applying to the user's code around the call.  (float64 tensors are never lowered by autocast,
    so this changes nothing for them.)  Inside, :func:`lowered_by_autocast` still knows which devices had autocast on.
    """
    devices = autocast_devices()
    if not devices:
        yield
        return
    token = _SWITCHED_OFF.set(_SWITCHED_OFF.get() + devices)
    try:
        with contextlib.ExitStack() as stack:
            for device in devices:
                stack.enter_context(torch.autocast(device_type=device, enabled=False))
            yield
    finally:
        _SWITCHED_OFF.reset(token)


def lowered_by_autocast(x) -> bool:
    """``x`` is float16/bfloat16 while ``torch.autocast`` is on for its device (or was, until :func:`full_precision`
    switched it off for rfgp): the output of an op that autocast lowered, e.g. a network in front of the GP.

    rfgp kernels take such inputs by type promotion with their float32/float64 parameters (as GPyTorch's kernels do):
    they compute in float32 (or float64) from the half-precision values, never in half precision.  Outside autocast a
    half-precision input stays refused (:func:`rfgp.core.validation.check_tensor_dtype`).
    """
    if not torch.is_tensor(x):
        return False
    device = x.device.type
    enabled = _AUTOCAST_FLAGS.get(device)
    return x.dtype in _HALF and (enabled is not None and enabled() or device in _SWITCHED_OFF.get())


def in_full_precision(function: Callable) -> Callable:
    """``function`` run under :func:`full_precision` (a decorator for rfgp's forward and inference entry points)."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        if not autocast_devices():
            return function(*args, **kwargs)
        with full_precision():
            return function(*args, **kwargs)

    wrapper.in_full_precision = True
    return wrapper


def refuse_autocast_backward(backward: Callable) -> Callable:
    """A custom autograd Function's ``backward`` that raises when it runs under ``torch.autocast``.

    That happens only for a backward pass started inside an autocast block on the CPU: autograd runs CPU backward on
    the calling thread, where autocast then lowers the built-in ops' derivatives (matmul, mm, …) to bfloat16/float16
    too — gradients about 3e-3 off (N = 1000, F = 256), out of rfgp's reach.  CUDA backward runs on autograd's device
    threads, outside autocast, and PyTorch's autocast recipe calls ``backward`` after the block anyway.
    """

    @functools.wraps(backward)
    def wrapper(*args):
        devices = autocast_devices()
        if devices:
            raise RuntimeError(
                f"backward() was called inside torch.autocast (enabled for {', '.join(devices)}): autograd then runs "
                "the backward of built-in ops on this thread with autocast's lower precision (gradients of an rfgp "
                "model about 3e-3 off). Call loss.backward() after leaving the autocast block, as PyTorch's "
                "mixed-precision recipe does"
            )
        return backward(*args)

    return wrapper


class FullPrecisionMethods:
    """Mixin: the methods named in ``full_precision_methods`` run :func:`in_full_precision`, in the class that takes
    the mixin and in every subclass, inherited or overridden (a subclass's own ``forward`` too)."""

    full_precision_methods: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        for name in cls.full_precision_methods:
            method = cls.__dict__.get(name, getattr(cls, name, None))
            if callable(method) and not getattr(method, "in_full_precision", False):
                setattr(cls, name, in_full_precision(method))


class FullPrecisionOperator(FullPrecisionMethods):
    """Mixin for rfgp's linear operators: their products, diagonals, solves, factors and samples run
    :func:`in_full_precision`.

    GPyTorch and users evaluate a covariance lazily, after the kernel call (``covariance_matrix``, ``variance``,
    ``rsample``, ``log_prob``), maybe under an autocast that the kernel's forward no longer covers.
    """

    #: linear_operator's evaluation entry points (the private ones are what its public methods call)
    full_precision_methods = ("to_dense", "_matmul", "_t_matmul", "_diagonal", "_bilinear_derivative", "_solve",
                              "inv_quad_logdet", "root_decomposition", "_get_indices", "zero_mean_mvn_samples")


def factor_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The working precision of F × F / M × M factors (and landmark selection) for ``dtype`` inputs: float64 for
    float32/half, except on devices without float64 (Apple MPS): float32 there, for half inputs too (rfgp never
    factorises in half precision)."""
    if device.type == "mps":
        return torch.float32 if dtype in _HALF else dtype
    return torch.float64 if dtype in _WIDENED else dtype


def promoted_dtype(*dtypes: torch.dtype | None) -> torch.dtype:
    """``torch.promote_types`` over the given dtypes (``None`` entries, e.g. a module without floats, are skipped)."""
    given = [dtype for dtype in dtypes if dtype is not None]
    result = given[0]
    for dtype in given[1:]:
        result = torch.promote_types(result, dtype)
    return result


def cast_to(tensor: Tensor, dtype: torch.dtype) -> Tensor:
    """``tensor`` in the compute dtype ``dtype`` (a real float dtype): real floating tensors take ``dtype``,
    complex ones its complex counterpart, integer and boolean ones stay as they are.  A no-op (the same
    tensor) when nothing changes; differentiable otherwise, so gradients reach the stored parameter."""
    if tensor.is_complex():
        target = _COMPLEX[dtype]
    elif tensor.is_floating_point():
        target = dtype
    else:
        return tensor
    return tensor if tensor.dtype == target else tensor.to(target)


def promote_pair(x1: Tensor, x2: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """(x1, x2) in ``dtype``, keeping ``x2 is x1`` when it held (GPyTorch's training-covariance test)."""
    same = x2 is x1
    x1 = cast_to(x1, dtype)
    return x1, x1 if same else cast_to(x2, dtype)



def device_constant(owner: object, key: Hashable, build: Callable[[], Tensor], like: Tensor) -> Tensor:
    """``build()``, a constant made on the CPU from Python numbers, in ``like``'s dtype and on its device, converted
    once per (key, dtype, device) and kept on ``owner``.

    A forward pass then copies nothing from the host: on CUDA every copy of a fresh CPU tensor to the device waits
    for the stream (a host synchronisation), which ``torch.cuda.set_sync_debug_mode`` reports.  The entry is made
    outside inference mode, so that a constant first needed under ``torch.inference_mode()`` can still be saved for
    backward later.  ``key`` must name everything the constant depends on.
    """
    cache = owner.__dict__.setdefault("_device_constants", {})
    index = (key, like.dtype, like.device)
    constant = cache.get(index)
    if constant is None:
        with torch.inference_mode(False):
            constant = cache[index] = build().to(dtype=like.dtype, device=like.device)
    return constant
