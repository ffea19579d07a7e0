"""Argument validation shared by every public constructor and forward path.

Each check raises a ``ValueError``/``TypeError`` that names the argument, what
was given and what is accepted, so a user never has to read a stack trace to
find out which input was wrong.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an ``int`` after checking that it is an integer ≥ 1."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be a positive integer, got {value!r} of type {type(value).__name__}")
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value}")
    return int(value)


def check_choice(value, name: str, choices) -> str:
    """Return ``value`` after checking it is one of ``choices``."""
    if value not in choices:
        accepted = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {accepted}; got {value!r}")
    return value


def check_positive_float(value, name: str, allow_zero: bool = False) -> float:
    """Return ``value`` as a ``float`` after checking it is finite and > 0 (or ≥ 0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    value = float(value)
    ok = value >= 0 if allow_zero else value > 0
    if not ok or value != value or value == float("inf"):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return value


def check_features_input(x: Tensor, name: str, input_dim: int | None) -> None:
    """Check a feature-map input: a real floating tensor of shape (..., n, d) with finite entries."""
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor, got dtype {x.dtype}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (float32 or float64), got dtype {x.dtype}")
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., n, d), got shape {tuple(x.shape)}")
    if input_dim is not None and x.shape[-1] != input_dim:
        raise ValueError(
            f"{name} has {x.shape[-1]} input dimensions (last axis) but this feature map was built for "
            f"input_dim={input_dim}"
        )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf entries; random-feature maps need finite inputs")
