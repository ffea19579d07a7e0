"""Standard normal draws from an optional ``torch.Generator`` on any device, and draws registered as buffers.

A generator produces numbers on its own device only, and users seed CPU generators for models on
CUDA as often as not: :func:`standard_normal` draws on the generator's device and moves the result,
so the same seed gives the same draws wherever the model lives.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def standard_normal(shape: tuple[int, ...], like: Tensor, generator: torch.Generator | None = None) -> Tensor:
    """N(0, I) draws of ``shape`` in ``like``'s dtype and on its device, from ``generator`` (``None``: torch's)."""
    device = like.device if generator is None else generator.device
    return torch.randn(shape, generator=generator, dtype=like.dtype, device=device).to(like.device)


def register_draw(module: nn.Module, name: str, value: Tensor) -> None:
    """``module.register_buffer(name, value)`` for a random draw, or a ``RuntimeError`` saying why it cannot be.

    A module that draws at its first call has no buffer ``name`` before it.  ``torch.func.functional_call`` with a
    state that holds the draw (that of a module already called) sets a missing buffer as a plain attribute for the
    call, and ``register_buffer`` then failed with a bare ``KeyError: "attribute 'name' already exists"``.
    """
    if name in module.__dict__:
        raise RuntimeError(
            f"{type(module).__name__} makes its draws at its first call, and {name!r} is already a plain attribute "
            "(torch.func.functional_call with a state holding draws this module has not made yet): call the module "
            "once, or load the state with load_state_dict, before calling it through functional_call"
        )
    module.register_buffer(name, value)
