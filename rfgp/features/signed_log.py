"""Signed log-space arithmetic: a real number b is held as (log|b|, sign b) (sign ∈ {−1, 1}; b = 0 ↔ log = −inf).

Used where powers such as aₙ·s(x)²s(y)²·(xᵀy)²ⁿ over- or underflow float64 long before the
quantity of interest does (paper 000 §5.3's allocation statistics at high degree or large
‖x‖/ℓ).  Sums are taken "logsumexp-style": divide by the largest magnitude, add in linear
arithmetic, multiply back in log space — as accurate as the direct sum, without its overflow.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def log_abs_expm1(r: Tensor) -> Tensor:
    """log|eʳ − 1| for any finite r (no overflow for large r: r + log(1 − e^{−r}))."""
    positive = r > 0
    return torch.where(positive, r + torch.log(-torch.expm1(-r.abs())), torch.log(-torch.expm1(-r.abs())))


def subtract(log_a: Tensor, sign_a: Tensor, log_b: Tensor) -> tuple[Tensor, Tensor]:
    """(log|c|, sign c) of c = a − b for signed a and b ≥ 0 (given as log b)."""
    top, low = torch.maximum(log_a, log_b), torch.minimum(log_a, log_b)
    finite = torch.isfinite(top)
    gap = torch.where(finite, low - top, -math.inf)  # ≤ 0; both −inf means a = b = 0
    same_sign = top + torch.log(-torch.expm1(gap))  # |a − b| for a ≥ 0
    opposite = top + torch.log1p(gap.exp())  # |a| + b for a < 0
    log_c = torch.where(sign_a > 0, same_sign, opposite)
    sign_c = torch.where((sign_a > 0) & (log_a > log_b), 1.0, -1.0).to(log_a.dtype)
    return torch.where(finite, log_c, -math.inf), sign_c


def power_gap(g2: Tensor, delta: Tensor, degree: int) -> tuple[Tensor, Tensor]:
    """(log|c|, sign c) of c = (g² + δ)ⁿ − g²ⁿ for g² ≥ 0, without forming either power.

    Where g² > 0 and g² + δ > 0: c = g²ⁿ·expm1(n·log1p(δ/g²)), exact also for small δ
    (the direct difference cancels).  Elsewhere (the base is ≤ 0 or g = 0) the two powers are
    combined by :func:`subtract`.
    """
    base = g2 + delta
    log_g2n = degree * g2.log()
    relative = (g2 > 0) & (base > 0)
    r = degree * torch.log1p(torch.where(relative, delta / g2.clamp_min(torch.finfo(g2.dtype).tiny), 0.0))
    log_rel, sign_rel = log_g2n + log_abs_expm1(r), torch.sign(r)
    sign_base = torch.where((base < 0) & (degree % 2 == 1), -1.0, 1.0).to(g2.dtype)
    log_dir, sign_dir = subtract(degree * base.abs().log(), sign_base, log_g2n)
    return torch.where(relative, log_rel, log_dir), torch.where(relative, sign_rel, sign_dir)


def sum_exp(log_abs: Tensor, sign: Tensor, dim: int = -1) -> tuple[Tensor, Tensor]:
    """(log|Σ|, sign Σ) of Σ signᵢ·exp(log_absᵢ) along ``dim`` (signed logsumexp)."""
    top = log_abs.amax(dim, keepdim=True)
    top = torch.where(torch.isfinite(top), top, 0.0)
    total = (sign * (log_abs - top).exp()).sum(dim)
    return total.abs().log() + top.squeeze(dim), torch.where(total < 0, -1.0, 1.0).to(total.dtype)


def mean_exp(log_abs: Tensor, sign: Tensor) -> tuple[float, float]:
    """(log|mean|, sign) of the mean of sign·exp(log_abs) over all entries, as Python floats."""
    log_sum, total_sign = sum_exp(log_abs.reshape(-1), sign.reshape(-1), dim=0)
    return float(log_sum) - math.log(log_abs.numel()), float(total_sign)


def to_float(log_abs: float, sign: float = 1.0) -> float:
    """sign·exp(log_abs) as a Python float (±inf beyond float64 instead of OverflowError)."""
    return sign * math.exp(log_abs) if log_abs < 709.0 else sign * math.inf


__all__ = ["log_abs_expm1", "mean_exp", "power_gap", "subtract", "sum_exp", "to_float"]
