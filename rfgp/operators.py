"""Low-rank LinearOperators that keep Φ factored from the kernel to the solve.

* :class:`FeatureRootLinearOperator` — K̂ = ΦΦᵀ, optionally carrying the per-point
  variance correction k(x, x) − E[k̂(x, x)] that the prediction strategy adds to the
  posterior variance.  ``ScaleKernel`` scaling and sums of such operators stay in
  this form.
* :class:`FeatureRootAddedDiagLinearOperator` — ΦΦᵀ + D, produced when a Gaussian
  likelihood adds its noise.  ``inv_quad_logdet`` (the marginal-likelihood hot path)
  runs in O(N·F² + F³) time through the capacitance matrix A = I + ΦᵀD⁻¹Φ
  (Woodbury identity and the matrix determinant lemma), with the lean Gram backward
  of :func:`rfgp.linalg.weighted_gram`; when F ≥ N a dense Cholesky is cheaper and used.
"""

from __future__ import annotations

import torch
from linear_operator import to_linear_operator
from linear_operator.operators import (
    DiagLinearOperator,
    LinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
)
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .linalg import weighted_gram


class FeatureRootLinearOperator(LowRankRootLinearOperator):
    """ΦΦᵀ for a feature matrix Φ of shape ``(..., n, F)``.

    Args:
        root: the features Φ.
        variance_correction: optional ``(..., n)`` tensor k(x, x) − E[Φ(x)ᵀΦ(x)].
    """

    def __init__(self, root: Tensor, variance_correction: Tensor | None = None) -> None:
        root = to_linear_operator(root)
        # LinearOperator keeps the keyword so that operator copies (representation trees,
        # detach, device moves) carry the correction along.
        LinearOperator.__init__(self, root, variance_correction=variance_correction)
        self.root = root
        self.variance_correction = variance_correction

    def _mul_constant(self, other):
        if torch.is_tensor(other) and not bool((other > 0).all()):
            return super()._mul_constant(other)
        if not torch.is_tensor(other) and other <= 0:
            return super()._mul_constant(other)
        correction = self.variance_correction
        if correction is not None:
            correction = correction * (other.unsqueeze(-1) if torch.is_tensor(other) else other)
        scale = other.sqrt().unsqueeze(-1).unsqueeze(-1) if torch.is_tensor(other) else other**0.5
        return self.__class__(self.root.to_dense() * scale, correction)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return FeatureRootAddedDiagLinearOperator(self, other)
        if isinstance(other, FeatureRootLinearOperator):
            left, right = self.root.to_dense(), other.root.to_dense()
            batch = torch.broadcast_shapes(left.shape[:-2], right.shape[:-2])
            root = torch.cat((left.expand(*batch, *left.shape[-2:]), right.expand(*batch, *right.shape[-2:])), -1)
            return self.__class__(root, _add_optional(self.variance_correction, other.variance_correction))
        return super().__add__(other)


def _add_optional(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


class FeatureRootAddedDiagLinearOperator(LowRankRootAddedDiagLinearOperator):
    """ΦΦᵀ + D with a feature-space marginal-likelihood path."""

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return self.__class__(self._linear_op, self._diag_tensor + other)
        return super().__add__(other)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        features = self._linear_op.root.to_dense()
        noise = self._diag_tensor.diagonal(dim1=-1, dim2=-2)
        vector_rhs = inv_quad_rhs is not None and inv_quad_rhs.dim() == 1
        rhs = inv_quad_rhs.unsqueeze(-1) if vector_rhs else inv_quad_rhs
        num_data, num_features = features.shape[-2:]
        if num_features >= num_data:
            inv_quad, logdet_term = _dense_inv_quad_logdet(features, noise, rhs, logdet)
        else:
            inv_quad, logdet_term = _woodbury_inv_quad_logdet(features, noise, rhs, logdet)
        if inv_quad is not None and reduce_inv_quad:
            inv_quad = inv_quad.sum(-1)
        if inv_quad is None:
            inv_quad = torch.zeros(0, dtype=features.dtype, device=features.device)
        if logdet_term is None:
            logdet_term = torch.zeros(0, dtype=features.dtype, device=features.device)
        return inv_quad, logdet_term


def _woodbury_inv_quad_logdet(features: Tensor, noise: Tensor, rhs: Tensor | None, logdet: bool):
    """rᵀ(ΦΦᵀ + D)⁻¹r and log|ΦΦᵀ + D| through A = I + ΦᵀD⁻¹Φ, O(N·F² + F³)."""
    weights = noise.reciprocal()
    capacitance = weighted_gram(features, weights)
    capacitance = capacitance + torch.eye(capacitance.shape[-1], dtype=capacitance.dtype, device=capacitance.device)
    chol = psd_safe_cholesky(capacitance)
    inv_quad = logdet_term = None
    if rhs is not None:
        weighted_rhs = rhs * weights.unsqueeze(-1)
        projected = torch.linalg.solve_triangular(chol, features.mT @ weighted_rhs, upper=False)
        inv_quad = (rhs * weighted_rhs).sum(-2) - projected.pow(2).sum(-2)
    if logdet:
        logdet_term = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1) + noise.log().sum(-1)
    return inv_quad, logdet_term


def _dense_inv_quad_logdet(features: Tensor, noise: Tensor, rhs: Tensor | None, logdet: bool):
    """The same quantities through a dense N × N Cholesky (cheaper when F ≥ N)."""
    covar = features @ features.mT + torch.diag_embed(noise)
    chol = psd_safe_cholesky(covar)
    inv_quad = logdet_term = None
    if rhs is not None:
        inv_quad = torch.linalg.solve_triangular(chol, rhs, upper=False).pow(2).sum(-2)
    if logdet:
        logdet_term = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
    return inv_quad, logdet_term
