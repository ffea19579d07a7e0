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

from collections.abc import Callable, Hashable

import torch
from torch import Tensor

_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}
#: dtypes whose F × F / M × M factors are worked in float64 (and rounded back), where the device has float64
_WIDENED = (torch.float32, torch.float16, torch.bfloat16)


def factor_dtype(dtype: torch.dtype, device: torch.device) -> torch.dtype:
    """The working precision of F × F / M × M factors (and landmark selection) for ``dtype`` inputs: float64 for
    float32/half, except on devices without float64 (Apple MPS), which keep ``dtype``."""
    return torch.float64 if dtype in _WIDENED and device.type != "mps" else dtype


def promoted_dtype(*dtypes: torch.dtype | None) -> torch.dtype:
    """``torch.promote_types`` over the given dtypes (``None`` entries, e.g. a module without floats, are skipped)."""
    given = [dtype for dtype in dtypes if dtype is not None]
    result = given[0]
    for dtype in given[1:]:
        result = torch.promote_types(result, dtype)
    return result


def complex_dtype(dtype: torch.dtype) -> torch.dtype:
    """The complex dtype with real part ``dtype`` (float32 → complex64, float64 → complex128)."""
    return _COMPLEX[dtype]


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
