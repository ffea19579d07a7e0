"""Fantasy conditioning as a rank-q update of the feature-space posterior caches.

Appending q observations — features Φₙ ``(q, F)``, noise weights Dₙ⁻¹, residuals rₙ = yₙ − μₙ — to the N
training points of a posterior with caches m = A⁻¹b and A = I + ΦᵀD⁻¹Φ = LLᵀ, b = ΦᵀD⁻¹r, changes them by the
new rows only:

    A' = A + VVᵀ,           V = Φₙᵀ Dₙ^{-1/2}  (F × q),
    b' = b + Φₙᵀ Dₙ⁻¹ rₙ,    b = A m = L (Lᵀ m),

so L' = chol(A') is the blocked rank-q update of L (:func:`rfgp.inference.cholesky_update.cholesky_update`,
O(max(q, 32)·F²), backward stable) and m' = A'⁻¹b' two triangular solves with L': O(q·F + F²) per fantasy, instead of
the features of all N + q points, their (N + q)·F² statistics and an F³/3 factorisation
(cf. the rank-one updates of recursive least squares / the Kalman filter in weight space, and GPyTorch's
``DefaultPredictionStrategy.get_fantasy_strategy``, which updates its N × N caches by a Schur complement).

Where a gradient is recorded through the new rows (V, Dₙ, rₙ: BoTorch differentiates an acquisition value w.r.t. the
new inputs X), the blocked update (a Householder QR) has no derivative; L' = chol(LLᵀ + VVᵀ) is then factorised
directly with ``torch.linalg.cholesky`` (differentiable, F³/3 per fantasy, still independent of N), and m' through
the same solves, with the parent's (m, L) the constants they are as functions of X.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.dtypes import factor_dtype
from .cholesky_update import cholesky_update
from .linalg import cholesky_solve


def updated_capacitance_caches(mean_cache: Tensor, chol: Tensor, features: Tensor, weights: Tensor,
                               residual: Tensor) -> tuple[Tensor, Tensor]:
    """(m', L') of the posterior with q more observations, from its caches (m, L) and the new rows.

    Differentiable in every argument where a gradient is recorded through one of them (then L' = chol(LLᵀ + VVᵀ),
    F³/3 instead of the blocked update's O(max(q, 32)·F²)). Runs in :func:`rfgp.core.dtypes.factor_dtype` (float64
    for float32 caches), rounded back, as :func:`rfgp.inference.linalg.capacitance_solve`.

    Args:
        mean_cache: m = A⁻¹ΦᵀD⁻¹r ``(*extra, *batch, F, 1)`` (``extra``: target-only batch dimensions).
        chol: L = chol(A) ``(*batch, F, F)``.
        features: Φₙ ``(*batch', q, F)``; ``batch'`` broadcasts with ``batch`` (a batch of new inputs).
        weights: Dₙ⁻¹ ``(*batch', q)``, or ``(*batch', 1)`` for a homoscedastic noise.
        residual: yₙ − μₙ ``(*extra', *batch', q)`` (``extra'``: fantasy samples over the same new inputs).

    Returns:
        m' ``(*extra', *batch'', F, 1)`` and L' ``(*batch'', F, F)``, ``batch''`` the broadcast batch.
    """
    dtype, work = chol.dtype, factor_dtype(chol.dtype, chol.device)
    chol, features, weights = chol.to(work), features.to(work), weights.to(work)
    root = (features * weights.sqrt().unsqueeze(-1)).mT
    if torch.is_grad_enabled() and any(t.requires_grad for t in (mean_cache, chol, root, residual)):
        updated = torch.linalg.cholesky(chol @ chol.mT + root @ root.mT)  # A' ⪰ I: raises, never silently, if not
    else:
        updated = cholesky_update(chol, root)
    rhs = chol @ (chol.mT @ mean_cache.to(work)) + features.mT @ (weights * residual.to(work)).unsqueeze(-1)
    # target-only batch dimensions as columns: one solve per factor, not an F × F factor broadcast per fantasy
    extra = rhs.shape[: rhs.dim() - updated.dim()]
    if extra:
        columns = rhs.squeeze(-1).flatten(0, len(extra) - 1).movedim(0, -1)
        mean = cholesky_solve(columns, updated).movedim(-1, 0).unflatten(0, extra).unsqueeze(-1)
    else:
        mean = cholesky_solve(rhs, updated)
    return mean.to(dtype), updated.to(dtype)
