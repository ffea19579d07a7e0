"""Unconstrained coordinates of a value inside bounds, for optimisers that take none (``torch.optim``).

A value θ with lower bound a and/or upper bound b (either may be infinite, per element) is written
as a function of a free coordinate u, the transforms GPyTorch's constraints use:

    θ = a + softplus(u)          (a finite, b = ∞)
    θ = b − softplus(u)          (a = −∞, b finite)
    θ = a + (b − a)·sigmoid(u)   (both finite)
    θ = u                        (neither)

Used where a constraint has no transform of its own (GPyTorch's ``transform=None``, BoTorch's noise
bound) and by closed-form fits that optimise a value directly.
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn.functional import softplus


def bounded_value(u: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """θ(u) inside [lower, upper] (broadcast to u); differentiable, with finite gradients in every case."""
    has_lower, has_upper = torch.isfinite(lower), torch.isfinite(upper)
    a = torch.where(has_lower, lower, torch.zeros_like(lower))  # finite stand-ins: the unselected branches of
    b = torch.where(has_upper, upper, torch.zeros_like(upper))  # torch.where must not carry inf into gradients
    return torch.where(has_lower & has_upper, a + (b - a) * torch.sigmoid(u),
                       torch.where(has_lower, a + softplus(u), torch.where(has_upper, b - softplus(u), u)))


def bounded_coordinate(theta: Tensor, lower: Tensor, upper: Tensor) -> Tensor:
    """u(θ), the inverse of :func:`bounded_value`; a θ on or outside a bound is taken just inside it."""
    tiny = torch.finfo(theta.dtype).eps
    has_lower, has_upper = torch.isfinite(lower), torch.isfinite(upper)
    a = torch.where(has_lower, lower, torch.zeros_like(lower))
    b = torch.where(has_upper, upper, torch.ones_like(upper))
    fraction = ((theta - a) / (b - a)).clamp(tiny, 1 - tiny)
    return torch.where(has_lower & has_upper, torch.logit(fraction),
                       torch.where(has_lower, _inverse_softplus(theta - a, tiny),
                                   torch.where(has_upper, _inverse_softplus(b - theta, tiny), theta)))


def _inverse_softplus(gap: Tensor, tiny: float) -> Tensor:
    """softplus⁻¹(max(gap, tiny)) = g + log(1 − e^{−g}), stable for small and large g."""
    gap = gap.clamp_min(tiny)
    return gap + torch.log(-torch.expm1(-gap))
