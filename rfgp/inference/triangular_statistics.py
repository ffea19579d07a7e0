r"""Feature statistics of Φ = K·L⁻ᵀ (Nyström features) whose backward pass skips one N·M² product.

Nyström features are Φ = K L⁻ᵀ with K = K(X, Z) (N × M) and L the lower Cholesky factor of the
landmark Gram matrix (M × M).  Autograd through Φ = solve(L, Kᵀ)ᵀ followed by the statistics
G = ΦᵀWΦ and H = ΦᵀWR (:mod:`rfgp.inference.linalg`) costs ≈ 7.25·N·M² flops per gradient: the
triangular solve (N·M²), the symmetric Gram matrix (≈ 1.25·N·M² in blocks), ∂Φ = Φ̄ = W(2ΦS + RH̄ᵀ)
(2·N·M², S = ½(Ḡ + Ḡᵀ)), the solve's backward K̄ = Φ̄L⁻¹ (N·M²) and its factor cotangent
L̄ = −tril(L⁻ᵀΦ̄ᵀΦ) (2·N·M²).  The last product is not needed: Φ̄ᵀΦ = (2SΦᵀ + H̄Rᵀ)WΦ is made of the
forward outputs,

    L̄ = −tril(L⁻ᵀ(2SG + H̄Hᵀ)),

an M × M computation, so a gradient costs ≈ 5.25·N·M².  The other cotangents are those of
:func:`~rfgp.inference.linalg.statistics_backward` (Φ̄, per-point w̄, R̄) followed by K̄ = Φ̄L⁻¹.

Two cheaper forms of K̄ are exact in real arithmetic but not in float32, and are not used.
K̄ = W(2KĜ + RĤᵀ) with Ĝ = L⁻ᵀSL⁻¹ (one N·M² product, no Φ̄) multiplies rounding errors by
κ(L): at N = 14 016, M = 1024 (d = 4, float32, relative jitter 10⁻⁶) its lengthscale gradients were
off by up to 2.2 times their value, one with the wrong sign.  K̄ = W(2Φ(SL⁻¹) + R(L⁻ᵀH̄)ᵀ) (one
product, no solve with N rows) raised the largest relative float32 hyperparameter-gradient error
against float64 from 2.8·10⁻⁴ to 1.3·10⁻³ there; with the triangular solve of Φ̄ it stays at the
autograd path's (``benchmarks/nystrom_statistics.py``).  Likewise the forward pass keeps the
triangular solve: forming KᵀWK and solving on both sides would square the conditioning of L in the
statistics themselves.  Uniform weights ``(..., 1)`` take ∂w from the unit statistics as in
:mod:`rfgp.inference.linalg`; second derivatives (``create_graph=True``) recompute the statistics
with autograd (:func:`~rfgp.inference.linalg.differentiable_backward`).

:class:`TriangularFeatures` is the root ``LinearOperator`` through which
:class:`~rfgp.kernels.NystromKernel` hands Φ, K and L to
:class:`~rfgp.inference.operators.FeatureRootLinearOperator`: it behaves as the dense Φ everywhere
(products, indexing, posterior caches, the kernel-space path), and its feature statistics take this
backward.  Chunked operators (Φ over the memory budget) recompute Φ per chunk with autograd as before.
"""

from __future__ import annotations

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator
from torch import Tensor

from .linalg import (
    _add_matmul,
    _is_uniform,
    _sum_to_shape,
    differentiable_backward,
    plain_statistics,
    statistics_backward,
    uniform_weight_grad,
    unit_statistics,
    weighted_statistics,
)


def triangular_features(cross: Tensor, chol: Tensor) -> Tensor:
    """Φ = K·L⁻ᵀ for K ``(..., N, M)`` and a lower-triangular L ``(..., M, M)`` (batch shapes broadcast)."""
    return torch.linalg.solve_triangular(chol, cross.mT, upper=False).mT


def _solve_lower_transpose(chol: Tensor, matrix: Tensor, overwrite: bool = False) -> Tensor:
    """L⁻ᵀ·matrix, in the memory of ``matrix`` if ``overwrite``.

    For B·L⁻¹ pass ``matrix`` = Bᵀ of a row-major B: the column-major layout the solver works in
    (a right-sided solve is ~1.8× slower on CPU at N = 14 016, M = 1024; overwriting saves the
    copy of the right-hand side, 13 ms there).
    """
    return torch.linalg.solve_triangular(chol.mT, matrix, upper=True, out=matrix if overwrite else None)


class _TriangularStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, cross: Tensor, chol: Tensor, weights: Tensor, rhs: Tensor):
        if _is_uniform(weights):
            unit = unit_statistics(features, rhs)
            w = weights.unsqueeze(-1)
            gram, projection = unit[0] * w, unit[1] * w
        else:
            unit = ()
            gram, projection = weighted_statistics(features, weights, rhs)
        ctx.save_for_backward(features, cross, chol, weights, rhs, gram, projection, *unit)
        return gram, projection

    @staticmethod
    def backward(ctx, grad_gram: Tensor, grad_projection: Tensor):
        features, cross, chol, weights, rhs, gram, projection, *unit = ctx.saved_tensors
        needs = ctx.needs_input_grad
        if torch.is_grad_enabled():  # create_graph=True
            grads = differentiable_backward(
                lambda: plain_statistics(triangular_features(cross, chol), weights, rhs), (cross, chol, weights, rhs),
                needs[1:], (grad_gram, grad_projection),
            )
        else:
            grad_features, grad_weights, grad_rhs = statistics_backward(
                features, weights, rhs, grad_gram, grad_projection, (needs[1], needs[3], needs[4])
            )
            grad_cross = grad_chol = None
            if needs[1]:  # K̄ = Φ̄L⁻¹, in the memory of Φ̄
                grad_cross = _solve_lower_transpose(chol, grad_features.mT, overwrite=True).mT
            if needs[2]:  # L̄ = −tril(L⁻ᵀ(2SG + H̄Hᵀ)), S = ½(Ḡ + Ḡᵀ)
                grad_chol = _add_matmul((grad_gram + grad_gram.mT) @ gram, grad_projection, projection.mT)
                grad_chol = _solve_lower_transpose(chol, grad_chol).tril_().neg_()
            if needs[3] and unit:
                grad_weights = uniform_weight_grad(*unit, grad_gram, grad_projection)
            grads = (grad_cross, grad_chol, grad_weights, grad_rhs)
        return (None, *(None if g is None else _sum_to_shape(g, t.shape)
                        for g, t in zip(grads, (cross, chol, weights, rhs))))


def triangular_statistics(features: Tensor, cross: Tensor, chol: Tensor, weights: Tensor,
                          rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for Φ = K·L⁻ᵀ, differentiable with respect to K, L, the weights and R.

    Args:
        features: Φ = :func:`triangular_features` (K, L), ``(..., N, M)``, already formed (by the
            kernel); only its value is used: gradients flow through ``cross`` and ``chol``.
        cross: K, ``(..., N, M)``.
        chol: L, lower triangular, ``(..., M, M)``.
        weights: diagonal of W, ``(..., N)``, or uniform ``(..., 1)``.
        rhs: R, ``(..., N, t)``.
    """
    batch = torch.broadcast_shapes(features.shape[:-2], cross.shape[:-2], chol.shape[:-2], weights.shape[:-1],
                                   rhs.shape[:-2])
    return _TriangularStatistics.apply(
        features.detach().expand(*batch, *features.shape[-2:]), cross, chol,
        weights.expand(*batch, weights.shape[-1]), rhs.expand(*batch, *rhs.shape[-2:]),
    )


class TriangularFeatures(LinearOperator):
    """The feature matrix Φ = K·L⁻ᵀ ``(..., N, M)`` together with its factors K and L.

    Every operation sees the dense Φ (products, indexing, ``to_dense``; its autograd graph reaches K
    and L as usual); :meth:`feature_statistics` takes the fused backward of :func:`triangular_statistics`.
    K and L are expanded to Φ's batch shape (views), so that batch operations (indexing, permuting,
    unsqueezing) transform all three alike.

    Args:
        features: Φ = :func:`triangular_features` (cross, chol).
        cross: K, ``(..., N, M)``.
        chol: L, ``(..., M, M)``.
    """

    def __init__(self, features: Tensor, cross: Tensor, chol: Tensor) -> None:
        batch = features.shape[:-2]
        cross = cross.expand(*batch, *cross.shape[-2:])
        chol = chol.expand(*batch, *chol.shape[-2:])
        super().__init__(features, cross, chol)
        self.features, self.cross, self.chol = features, cross, chol

    def feature_statistics(self, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        """(ΦᵀWΦ, ΦᵀWR), see :func:`triangular_statistics`."""
        return triangular_statistics(self.features, self.cross, self.chol, weights, rhs)

    def _size(self) -> torch.Size:
        return self.features.shape

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.features @ rhs

    def _transpose_nonbatch(self) -> LinearOperator:
        return DenseLinearOperator(self.features.mT)

    def _get_indices(self, row_index, col_index, *batch_indices) -> Tensor:
        return DenseLinearOperator(self.features)._get_indices(row_index, col_index, *batch_indices)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        return DenseLinearOperator(self.features)._getitem(row_index, col_index, *batch_indices)

    def to_dense(self) -> Tensor:
        return self.features
