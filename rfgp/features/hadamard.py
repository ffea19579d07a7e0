"""Fast Walsh–Hadamard transform (FWHT) in pure torch, with an optional CUDA backend.

The Sylvester–Hadamard matrix H_d (d = 2^k, entries ±1) is applied in O(d log d) by
log₂ d butterfly stages.  The pure-torch path works for any leading batch shape, any
floating dtype, on CPU and CUDA, and is differentiable (each stage is linear, and
autograd's backward is the same transform because H_d is symmetric).  When the
``fast_hadamard_transform`` package (Dao-AILab) is installed, the input is on CUDA and
in a dtype it supports, its kernel is used instead.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

try:  # pragma: no cover - only on machines with the CUDA extension
    from fast_hadamard_transform import hadamard_transform as _cuda_hadamard_transform
except ImportError:  # pragma: no cover
    _cuda_hadamard_transform = None

_CUDA_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def next_power_of_two(n: int) -> int:
    """The smallest power of two ≥ ``n`` (and ≥ 1)."""
    return 1 << max(0, math.ceil(math.log2(max(n, 1))))


def pad_to_power_of_two(x: Tensor) -> Tensor:
    """Zero-pad the last axis of ``x`` to the next power of two (a no-op if it already is one)."""
    d = x.shape[-1]
    return F.pad(x, (0, next_power_of_two(d) - d))


def fwht(x: Tensor, normalized: bool = False, pad: bool = False) -> Tensor:
    """Apply the Walsh–Hadamard matrix along the last axis: ``x @ H_d`` (H_d symmetric).

    Args:
        x: tensor of shape ``(..., d)``; d must be a power of two unless ``pad=True``.
        normalized: divide by √d, making the transform orthogonal (H_d/√d).
        pad: zero-pad the last axis to the next power of two first.
    """
    if pad:
        x = pad_to_power_of_two(x)
    d = x.shape[-1]
    if d & (d - 1) != 0 or d == 0:
        raise ValueError(f"fwht needs a power-of-two size along the last axis, got {d} (use pad=True)")
    scale = 1.0 / math.sqrt(d) if normalized else 1.0
    if _cuda_hadamard_transform is not None and x.is_cuda and x.dtype in _CUDA_DTYPES:
        return _cuda_hadamard_transform(x.contiguous(), scale=scale)
    batch_shape = x.shape[:-1]
    y = x.reshape(-1, d)
    # H_d = H_{s₁} ⊗ … ⊗ H_{s_k} (Sylvester order): apply small explicit factors (s ≤ 32) along
    # each axis of y viewed as (n, s₁, …, s_k).  Each factor is one batched matmul, which is far
    # faster on CPU than log₂ d butterfly stages of tiny strided copies.
    done = 1
    while done < d:
        size = min(_FACTOR, d // done)
        y = torch.matmul(_small_hadamard(size, y), y.reshape(-1, size, d // (done * size)))
        done *= size
    y = y.reshape(*batch_shape, d)
    return y * scale if normalized else y


_FACTOR = 32


def _small_hadamard(size: int, like: Tensor) -> Tensor:
    """Explicit Sylvester H_size (size ≤ 32) in the dtype and on the device of ``like``."""
    h = torch.ones(1, 1, dtype=like.dtype, device=like.device)
    while h.shape[0] < size:
        h = torch.cat((torch.cat((h, h), 1), torch.cat((h, -h), 1)), 0)
    return h


def hadamard_matrix(d: int, dtype: torch.dtype = torch.float64, device=None) -> Tensor:
    """The explicit d × d Sylvester–Hadamard matrix (entries ±1), for tests and small problems."""
    return fwht(torch.eye(d, dtype=dtype, device=device))
