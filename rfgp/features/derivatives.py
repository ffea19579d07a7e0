"""Input derivatives of random feature maps: the roots of derivative-observation kernels.

For a GP f with k(x, y) ≈ Φ(x)ᵀΦ(y), differentiation is linear, so the joint covariance of
f and its partial derivatives is estimated by the derivatives of the features
(Rasmussen & Williams 2006, §9.4; Solak et al. 2003):

    Cov(∂ᵢf(x), ∂ⱼf(y)) = ∂²k/∂xᵢ∂yⱼ ≈ ∂ᵢΦ(x)ᵀ ∂ⱼΦ(y),

and likewise for ∂ᵢ²f.  Stacking [Φ, ∂₁Φ, …, ∂_dΦ (, ∂₁²Φ, …, ∂_d²Φ)] per point gives the
root of the whole joint Gram, with the same F columns as Φ itself.  The estimate is
unbiased when the spectral measure has the moments the derivatives need (E‖ω‖² for
gradients, E‖ω‖⁴ for second derivatives: the Gaussian, and Student-t with 2ν = 5 degrees
of freedom for Matérn-5/2).

Both functions return ``(..., n, K, F)`` with K = 1 + d (gradients) or 1 + 2d (gradients
and the diagonal second derivatives), in GPyTorch's per-point output order of
``RBFKernelGrad``/``RBFKernelGradGrad``: value, ∂₁ … ∂_d, ∂₁² … ∂_d².
"""

from __future__ import annotations

import itertools
from typing import Callable

import torch
from torch import Tensor


def sincos_derivatives(features: Tensor, frequencies: Tensor, second: bool = False) -> Tensor:
    """Rows [Φ, ∂ⱼΦ, (∂ⱼ²Φ)] of sin/cos features Φ(x) = s[cos(Wx), sin(Wx)].

    ∂ⱼ s cos(wᵀx) = −wⱼ s sin(wᵀx) and ∂ⱼ s sin(wᵀx) = wⱼ s cos(wᵀx), so
    ∂ⱼΦ = [−Φ_sin, Φ_cos] ⊙ [wⱼ, wⱼ] (Φ's halves swapped) and ∂ⱼ²Φ = −Φ ⊙ [wⱼ², wⱼ²]:
    no sin or cos beyond those of Φ.

    Args:
        features: Φ of shape ``(..., n, 2m)``, cos block first.
        frequencies: W of shape ``(..., m, d)`` (∂(Wx)/∂x).
        second: also return the diagonal second derivatives.
    """
    m = features.shape[-1] // 2
    doubled = torch.cat((frequencies, frequencies), dim=-2).mT.unsqueeze(-3)  # (..., 1, d, 2m)
    swapped = torch.cat((-features[..., m:], features[..., :m]), dim=-1).unsqueeze(-2)
    value = features.unsqueeze(-2)
    rows = [value, swapped * doubled]
    if second:
        rows.append(-value * doubled.square())
    return torch.cat(rows, dim=-2)


def multilinear_derivatives(
    apply_to: Callable[[list[Tensor]], Tensor], point: Tensor, directions: Tensor, degree: int, second: bool = False
) -> Tensor:
    """Rows [Φ, ∂ⱼΦ, (∂ⱼ²Φ)] of a sketch Φ(x) = S(x̃ ⊗ … ⊗ x̃) that is linear in each of its p factors.

    With the direction eⱼ = ∂x̃/∂xⱼ, the product rule over the p factors gives
    ∂ⱼΦ = Σᵢ S(x̃ ⊗ … ⊗ eⱼ (factor i) ⊗ … ⊗ x̃) and
    ∂ⱼ²Φ = 2 Σ_{i<k} S(… eⱼ at factors i and k …) — exact, one sketch evaluation per term,
    and it holds for every projection (Rademacher, Gaussian, TensorSRHT, TensorSketch, the
    hierarchical tree), since all are multilinear in their factors.

    Args:
        apply_to: the sketch of a list of p factors, each ``(..., rows, d̃)`` broadcastable.
        point: x̃ of shape ``(..., n, d̃)``.
        directions: ``(d, d̃)`` rows eⱼ = ∂x̃/∂xⱼ.
        degree: p.
        second: also return the diagonal second derivatives.
    """
    x = point.unsqueeze(-2)  # (..., n, 1, d̃), against the directions' (d, d̃)
    value = apply_to([point] * degree).unsqueeze(-2)
    shape = (*value.shape[:-2], directions.shape[0], value.shape[-1])
    rows = [value, _sum_with_directions(apply_to, x, directions, degree, 1, shape)]
    if second:
        rows.append(2.0 * _sum_with_directions(apply_to, x, directions, degree, 2, shape))
    return torch.cat(rows, dim=-2)


def _sum_with_directions(apply_to, x: Tensor, directions: Tensor, degree: int, count: int, shape) -> Tensor:
    """Σ over the ``count``-subsets of factors of S(factors in the subset = eⱼ, the others = x̃), per j.

    Returns ``shape`` = (..., n, d, F); a degree below ``count`` has a vanishing derivative.
    """
    total = torch.zeros(shape, dtype=x.dtype, device=x.device) if degree < count else None
    for subset in itertools.combinations(range(degree), count):
        term = apply_to([directions if i in subset else x for i in range(degree)])
        total = term if total is None else total + term
    return total.expand(shape)
