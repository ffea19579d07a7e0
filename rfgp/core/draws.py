"""Standard normal draws from an optional ``torch.Generator`` on any device.

A generator produces numbers on its own device only, and users seed CPU generators for models on
CUDA as often as not: :func:`standard_normal` draws on the generator's device and moves the result,
so the same seed gives the same draws wherever the model lives.
"""

from __future__ import annotations

import torch
from torch import Tensor


def standard_normal(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """N(0, I) draws of ``shape`` in ``like``'s dtype and on its device, from ``generator`` (``None``: torch's)."""
    device = like.device if generator is None else generator.device
    return torch.randn(shape, generator=generator, dtype=like.dtype, device=device).to(like.device)
