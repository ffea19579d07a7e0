"""Batched feature-space solve for C regressions that share Φ and have two-valued noise per class.

The Dirichlet-based classifier (Milios et al. 2018; paper 000 App. D.4, Eqs. 91–92) fits one
heteroscedastic GP regression per class c with the same kernel K̂ = ΦΦᵀ and noise
D_c = diag(σ²_{c,i}), where σ²_{c,i} takes one of two values: σ²_{c,on} if point i carries
label c, σ²_{c,off} otherwise.  With β = 1/σ² the capacitance matrix of class c is

    A_c = I + ΦᵀD_c⁻¹Φ = I + β_{c,off} ΦᵀΦ + (β_{c,on} − β_{c,off}) Φ_cᵀΦ_c,

Φ_c holding the rows labelled c.  The per-label Gram matrices G_k = Φ_kᵀΦ_k partition the
rows, so all of them (and ΦᵀΦ = Σ_k G_k) cost O(N·F²) together — independent of C — and
the C factorisations are one batched (C, F, F) Cholesky.  Memory is O(N·F + C·F²): Φ is
never replicated per class.  The marginal likelihood (Woodbury identity and the matrix
determinant lemma) and the posterior caches (Searle identity, paper 000 Eqs. 88–90) then
need only batched F-dimensional work and one Φᵀ(C right-hand sides) product.

The per-label Grams are computed without a Python loop over classes: rows are sorted by
label into fixed-size, label-pure blocks (zero-padded), one batched Gram runs over the
blocks and a block-to-class membership product sums blocks into their class.  The block plan depends only on
the labels and is built once (:class:`LabelBlockPlan`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from .linalg import weighted_gram
from .operators import FeatureRootAddedDiagLinearOperator


@dataclass(frozen=True)
class LabelBlockPlan:
    """Rows of Φ regrouped into ``num_blocks`` label-pure blocks of ``block_size`` rows.

    Attributes:
        index: ``(num_blocks·block_size,)`` row of Φ for every slot; ``N`` marks a zero padding row.
        block_class: ``(num_blocks,)`` label of every block.
        counts: ``(C,)`` number of points per label.
    """

    index: Tensor
    block_class: Tensor
    counts: Tensor
    num_blocks: int
    block_size: int

    @classmethod
    def from_labels(cls, labels: Tensor, num_classes: int) -> "LabelBlockPlan":
        """Plan for integer ``labels`` (N,) in 0..C−1; padding stays below N/8 + C rows."""
        num_data = labels.shape[-1]
        # Blocks of ≈ N/(8C) rows: at most N/8 padding rows (≤ 12.5 % extra flops) and ≤ 9C blocks.
        block_size = max(1, -(-num_data // (8 * num_classes)))
        counts = torch.bincount(labels, minlength=num_classes)
        blocks_per_class = (counts + block_size - 1) // block_size
        num_blocks = int(blocks_per_class.sum())
        order = torch.argsort(labels, stable=True)
        sorted_labels = labels[order]
        class_start = torch.cumsum(counts, 0) - counts
        rank = torch.arange(num_data, device=labels.device) - class_start[sorted_labels]
        block_start = torch.cumsum(blocks_per_class, 0) - blocks_per_class
        slot = (block_start[sorted_labels] + rank // block_size) * block_size + rank % block_size
        index = torch.full((num_blocks * block_size,), num_data, dtype=torch.long, device=labels.device)
        index[slot] = order
        block_class = torch.repeat_interleave(torch.arange(num_classes, device=labels.device), blocks_per_class)
        return cls(index, block_class, counts, num_blocks, block_size)


def label_grams(features: Tensor, plan: LabelBlockPlan, blocks_per_step: int | None = None) -> Tensor:
    """G_k = Φ_kᵀΦ_k for every label k, shape ``(C, F, F)``, in O(N·F²) total work.

    Args:
        features: Φ of shape ``(N, F)`` (shared by all classes).
        plan: the label blocks of the N rows.
        blocks_per_step: blocks whose Grams are formed at once (default 2C), bounding the
            transient memory to ``blocks_per_step·F²`` on top of the ``C·F²`` result.
    """
    num_features = features.shape[-1]
    num_classes = plan.counts.shape[0]
    step = blocks_per_step or 2 * num_classes
    padded = torch.cat((features, features.new_zeros(1, num_features)), 0)
    index = plan.index.view(plan.num_blocks, plan.block_size)
    membership = torch.nn.functional.one_hot(plan.block_class, num_classes).to(features.dtype)
    grams = features.new_zeros(num_classes, num_features * num_features)
    for start in range(0, plan.num_blocks, step):  # a few steps over blocks, not over classes
        blocks = padded[index[start : start + step]]
        block_grams = weighted_gram(blocks, features.new_ones(blocks.shape[:-1]))
        # sum the blocks into their classes (a small matmul; CPU index_add is far slower here)
        grams = grams + membership[start : start + step].mT @ block_grams.flatten(1)
    return grams.view(num_classes, num_features, num_features)


@dataclass(frozen=True)
class TwoLevelNoise:
    """σ²_{c,i} = ``on[c]`` if label_i = c else ``off[c]``: the noise of the C Dirichlet regressions."""

    labels: Tensor
    on: Tensor
    off: Tensor
    plan: LabelBlockPlan

    def per_point(self) -> Tensor:
        """The ``(C, N)`` noise matrix."""
        classes = torch.arange(self.on.shape[-1], device=self.labels.device).unsqueeze(-1)
        return torch.where(self.labels == classes, self.on.unsqueeze(-1), self.off.unsqueeze(-1))


class ClassNoiseFeatureLinearOperator(FeatureRootAddedDiagLinearOperator):
    """ΦΦᵀ + D_c for C classes sharing Φ ``(N, F)`` with two-valued noise D_c, solved in feature space.

    Behaves exactly like :class:`~rfgp.operators.FeatureRootAddedDiagLinearOperator` (it is one,
    with diagonal ``(C, N)``); when built through :meth:`from_parts` it also carries the label
    structure, which :meth:`inv_quad_logdet` and :meth:`feature_space_caches` exploit.  Operators
    derived from it by slicing or reshaping lose the structure and take the generic path.
    """

    structure: TwoLevelNoise | None = None

    @classmethod
    def from_parts(cls, generic: FeatureRootAddedDiagLinearOperator, structure: TwoLevelNoise):
        op = cls(generic._linear_op, generic._diag_tensor)
        op.structure = structure
        return op

    def evaluate_kernel(self):
        # LinearOperator.evaluate_kernel rebuilds the operator from its representation, which would
        # drop the label structure; both components are already evaluated, so it is the identity.
        return self

    def _structured_features(self) -> Tensor | None:
        """Φ when the structured path applies (shared 2-D Φ with fewer features than points)."""
        if self.structure is None:
            return None
        features = self._linear_op.root.to_dense()
        if features.dim() != 2 or features.shape[-1] >= features.shape[-2]:
            return None
        return features

    def _capacitance_cholesky(self, features: Tensor) -> Tensor:
        """Batched Cholesky factors of A_c = I + β_off ΦᵀΦ + (β_on − β_off) G_c, shape (C, F, F)."""
        structure = self.structure
        grams = label_grams(features, structure.plan)
        w_on, w_off = structure.on.reciprocal(), structure.off.reciprocal()
        total = grams.sum(0)
        capacitance = w_off[:, None, None] * total + (w_on - w_off)[:, None, None] * grams
        eye = torch.eye(features.shape[-1], dtype=features.dtype, device=features.device)
        return psd_safe_cholesky(capacitance + eye)

    def _weighted_projection(self, features: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        """(D_c⁻¹ r_c, ΦᵀD_c⁻¹ r_c) for right-hand sides ``rhs`` of shape (C, N, k)."""
        weighted = rhs * self.structure.per_point().reciprocal().unsqueeze(-1)
        num_classes, num_data, width = weighted.shape
        # one (F × N)(N × C·k) product instead of a broadcast batched matmul over the classes
        stacked = weighted.permute(1, 0, 2).reshape(num_data, num_classes * width)
        projected = (features.mT @ stacked).view(-1, num_classes, width).permute(1, 0, 2)
        return weighted, projected

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        features = self._structured_features()
        if features is None:
            return super().inv_quad_logdet(inv_quad_rhs, logdet, reduce_inv_quad)
        chol = self._capacitance_cholesky(features)
        num_classes = chol.shape[0]
        inv_quad = logdet_term = torch.zeros(0, dtype=features.dtype, device=features.device)
        if inv_quad_rhs is not None:
            rhs = inv_quad_rhs.unsqueeze(-1) if inv_quad_rhs.dim() == 1 else inv_quad_rhs
            rhs = rhs.expand(num_classes, *rhs.shape[-2:])
            weighted, projected = self._weighted_projection(features, rhs)
            projected = torch.linalg.solve_triangular(chol, projected, upper=False)
            inv_quad = (rhs * weighted).sum(-2) - projected.pow(2).sum(-2)
            if reduce_inv_quad:
                inv_quad = inv_quad.sum(-1)
        if logdet:
            structure = self.structure
            counts = structure.plan.counts.to(features.dtype)
            noise_logdet = counts * structure.on.log() + (features.shape[0] - counts) * structure.off.log()
            logdet_term = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1) + noise_logdet
        return inv_quad, logdet_term

    def feature_space_caches(self, residual: Tensor) -> tuple[Tensor, Tensor] | None:
        """(A_c⁻¹ΦᵀD_c⁻¹(ỹ_c − μ_c), chol A_c) — the caches of GPyTorch's ``LinearPredictionStrategy``.

        Posterior at test features φ*: mean_c = φ*ᵀ mean_cache_c, covar_c = φ*ᵀA_c⁻¹φ*
        (paper 000 Eqs. 88–89).  ``None`` when the structured path does not apply.
        """
        features = self._structured_features()
        if features is None:
            return None
        chol = self._capacitance_cholesky(features)
        residual = residual.expand(chol.shape[0], residual.shape[-1]).unsqueeze(-1)
        _, projected = self._weighted_projection(features, residual)
        return torch.cholesky_solve(projected, chol, upper=False), chol
