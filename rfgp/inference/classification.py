"""Batched feature-space solve for C regressions that share Φ and have two-valued noise per class.

The Dirichlet-based classifier (Milios et al. 2018; paper 000 App. D.4, Eqs. 91–92) fits one
heteroscedastic GP regression per class c with the same kernel K̂ = ΦΦᵀ and noise
D_c = diag(σ²_{c,i}), where σ²_{c,i} takes one of two values: σ²_{c,on} if point i carries
label c, σ²_{c,off} otherwise.  With β = 1/σ² the capacitance matrix of class c is

    A_c = I + ΦᵀD_c⁻¹Φ = I + β_{c,off} ΦᵀΦ + (β_{c,on} − β_{c,off}) Φ_cᵀΦ_c,

Φ_c holding the rows labelled c.  The per-label Gram matrices G_k = Φ_kᵀΦ_k partition the
rows, so all of them (and ΦᵀΦ = Σ_k G_k) cost O(N·F²) together — independent of C — and
the C factorisations are one batched (C, F, F) Cholesky (in float64 for float32 statistics, like the
regression MLL's: :func:`rfgp.inference.linalg.capacitance_inv_quad_logdet`).  float32 features form the
statistics in float64 where u·max_c tr(ΦᵀD_c⁻¹Φ) exceeds ``rfgp.settings.float32_statistics_tolerance``
(:mod:`rfgp.inference.statistics_precision`).  Under :class:`rfgp.inference.distributed.data_parallel` the class
statistics (after their products with the noise levels), the noise log-determinants and the per-label traces of that
decision are summed over processes.  The right-hand sides enter only
through ΦᵀD_c⁻¹r_c for all c, one product of Φ with an (N × C) matrix.  The marginal likelihood
(Woodbury identity and the matrix determinant lemma) and the posterior caches (Searle
identity, paper 000 Eqs. 88–90) then need only batched F-dimensional work.

The per-label Grams are computed without a Python loop over classes: rows are sorted by
label into fixed-size, label-pure blocks (zero-padded), one batched Gram runs over the
blocks and a block-to-class membership product sums blocks into their class.  The block plan
depends only on the labels and is built once (:class:`LabelBlockPlan`).  A pass visits a
few blocks at a time, so when the kernel returns a chunked ΦΦᵀ (``rfgp.settings.memory_budget``)
the features are computed per step — and recomputed in the backward pass — and memory is
O(chunk·F + C·F²); otherwise O(N·F + C·F²).  Φ is never replicated per class.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..core.dtypes import factor_dtype, refuse_autocast_backward
from . import distributed
from .chunking import Featurizer, backprop_chunks
from .linalg import accumulated_project, capacitance_solve, woodbury_inv_quad_logdet
from .operators import ChunkedFeatureRootAddedDiagLinearOperator, FeatureRootAddedDiagLinearOperator
from .statistics_precision import statistics_dtype


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
    num_data: int

    @classmethod
    def from_labels(cls, labels: Tensor, num_classes: int, max_block_size: int | None = None) -> "LabelBlockPlan":
        """Plan for integer ``labels`` (N,) in 0..C−1; padding stays below N/8 + C·block_size rows.

        ``max_block_size`` caps the block size (a chunked feature operator's chunk size).
        """
        num_data = labels.shape[-1]
        # Blocks of ≈ N/(8C) rows: at most N/8 padding rows (≤ 12.5 % extra flops) and ≤ 9C blocks.
        block_size = max(1, -(-num_data // (8 * num_classes)))
        if max_block_size is not None:
            block_size = min(block_size, max_block_size)
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
        return cls(index, block_class, counts, num_blocks, block_size, num_data)


class _LabelStatistics(torch.autograd.Function):
    """(G_k = Φ_kᵀΦ_k for every label k, VᵀΦ) in one pass over steps of label-pure row blocks.

    The rows come either from a materialised Φ (``featurizer is None``, ``source`` = Φ) or are
    recomputed per step as φ(x) (``source`` = x arranged in block slots, padding included).
    With Ḡ, P̄ the incoming gradients, row i of label k receives
    ∂Φ_i = Φ_i(Ḡ_k + Ḡ_kᵀ) + V_i P̄ and ∂V_i = Φ_i P̄ᵀ: one batched block product per step.
    """

    @staticmethod
    def forward(ctx, plan, featurizer, step_blocks, rhs, source, *params):
        grams, projection = _label_statistics(plan, featurizer, step_blocks, rhs, source)
        ctx.plan, ctx.featurizer, ctx.step_blocks = plan, featurizer, step_blocks
        ctx.save_for_backward(rhs, source)
        return grams, projection

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_grams, grad_projection):
        if torch.is_grad_enabled():
            # the backward below works in place and through per-step autograd calls: its result
            # would carry no (or a partial) graph, i.e. silently wrong second derivatives
            raise NotImplementedError(
                "second derivatives (create_graph=True) through the Dirichlet per-label feature statistics "
                "are not supported; differentiate the classifier once"
            )
        rhs, source = ctx.saved_tensors
        plan, featurizer, step_blocks = ctx.plan, ctx.featurizer, ctx.step_blocks
        needs = ctx.needs_input_grad
        sym = grad_grams + grad_grams.mT
        grad_rhs = rhs.new_zeros(rhs.shape[0] + 1, rhs.shape[1]) if needs[3] else None

        def slot_grad(features: Tensor, start: int, slots: Tensor, pad: Tensor) -> Tensor:
            blocks = features.view(-1, plan.block_size, features.shape[-1])
            block_sym = sym[plan.block_class[start : start + blocks.shape[0]]]
            grad = torch.bmm(blocks, block_sym).view_as(features)
            grad.addmm_(_gather_rows(rhs, slots, pad), grad_projection)
            if grad_rhs is not None:
                grad_rhs[slots] = features @ grad_projection.mT
            return grad.masked_fill_(pad.unsqueeze(-1), 0.0)

        if featurizer is None:
            grad_source = None
            if needs[4]:
                grad_source = source.new_zeros(source.shape[0] + 1, source.shape[1])
                for start, slots, pad, features in _block_steps(plan, None, step_blocks, source):
                    grad_source[slots] = slot_grad(features, start, slots, pad)
                grad_source = grad_source[:-1]
            param_grads = []
        else:
            rows_per_step = step_blocks * plan.block_size

            def chunk_grad(features: Tensor, rows: slice) -> Tensor:
                start = rows.start // plan.block_size
                slots = plan.index[rows]
                pad = slots == plan.num_data
                return slot_grad(features.masked_fill(pad.unsqueeze(-1), 0.0), start, slots, pad)

            grad_source, param_grads = backprop_chunks(
                featurizer, source, rows_per_step, chunk_grad, needs[4], needs[5:]
            )
        if grad_rhs is not None:
            grad_rhs = grad_rhs[:-1]
        return (None, None, None, grad_rhs, grad_source, *param_grads)


def _label_statistics(plan, featurizer, step_blocks: int, rhs: Tensor, source: Tensor) -> tuple[Tensor, Tensor]:
    """The forward of :class:`_LabelStatistics`: (G ``(C, F, F)``, VᵀΦ ``(k, F)``), step by step."""
    num_classes = plan.counts.shape[0]
    membership = torch.nn.functional.one_hot(plan.block_class, num_classes).to(rhs.dtype).mT
    num_features = source.shape[-1] if featurizer is None else featurizer.num_features
    grams = rhs.new_zeros(num_classes, num_features * num_features)
    # VᵀΦ summed in float64 for float32 rows (accumulated_project within a step, the steps' sums added in float64):
    # one float32 sum over the N rows rounds coherently where the columns have a large mean (Maclaurin, Nyström)
    projection = rhs.new_zeros(rhs.shape[-1], num_features, dtype=factor_dtype(rhs.dtype, rhs.device))
    for start, slots, pad, features in _block_steps(plan, featurizer, step_blocks, source):
        blocks = features.view(-1, plan.block_size, num_features)
        block_grams = torch.bmm(blocks.mT, blocks).view(blocks.shape[0], -1)
        # sum the blocks into their classes (a small matmul; CPU index_add is far slower here)
        grams.addmm_(membership[:, start : start + blocks.shape[0]], block_grams)
        projection += accumulated_project(features, _gather_rows(rhs, slots, pad)).mT  # formed as VᵀΦ
    return grams.view(num_classes, num_features, num_features), projection.to(rhs.dtype)


def _label_statistics_apply(plan, featurizer, step_blocks: int, rhs: Tensor, source: Tensor, *params):
    """:class:`_LabelStatistics`, or its forward as plain operations under ``torch.jit.trace`` (which cannot export
    a Python autograd.Function)."""
    if torch.jit.is_tracing():
        return _label_statistics(plan, featurizer, step_blocks, rhs, source)
    return _LabelStatistics.apply(plan, featurizer, step_blocks, rhs, source, *params)


def _gather_rows(values: Tensor, slots: Tensor, pad: Tensor) -> Tensor:
    """``values[slots]`` with the padding slots (index N) as zero rows."""
    return values.index_select(0, slots.clamp(max=values.shape[0] - 1)).masked_fill_(pad.unsqueeze(-1), 0.0)


def _block_steps(plan, featurizer, step_blocks: int, source: Tensor):
    """(first block, slots, padding mask, features) for every step of ``step_blocks`` blocks."""
    for start in range(0, plan.num_blocks, step_blocks):
        rows = slice(start * plan.block_size, min(start + step_blocks, plan.num_blocks) * plan.block_size)
        slots = plan.index[rows]
        pad = slots == plan.num_data
        if featurizer is None:
            features = _gather_rows(source, slots, pad)
        else:
            features = featurizer(source[rows]).masked_fill_(pad.unsqueeze(-1), 0.0)
        yield start, slots, pad, features


def label_feature_statistics(features, plan: "LabelBlockPlan", rhs: Tensor, blocks_per_step: int | None = None,
                             dtype: torch.dtype | None = None):
    """(G, VᵀΦ): the per-label Grams G_k = Φ_kᵀΦ_k ``(C, F, F)`` and the projection ``(k, F)`` of V ``(N, k)``.

    O(N·F²) total work whatever C, exact gradients with respect to Φ (or the feature map's
    parameters) and V.  ``dtype`` (default V's): the dtype they are formed in, Φ's rows and V cast to it
    (differentiably) step by step.

    Args:
        features: Φ ``(N, F)``, or a :class:`~rfgp.inference.operators.ChunkedFeatureRootLinearOperator`
            whose rows are then recomputed chunk by chunk (forward and backward), so that
            memory stays O(chunk·F + C·F²).
        plan: the label blocks of the N rows.
        rhs: V ``(N, k)`` (k may be 0).
        blocks_per_step: blocks processed at once (default: 2C, or the operator's chunk size),
            bounding the transient memory to ``blocks_per_step·(block_size·F + F²)``.
    """
    num_classes = plan.counts.shape[0]
    rhs = rhs if dtype is None else rhs.to(dtype)
    if torch.is_tensor(features):
        step = blocks_per_step or 2 * num_classes
        return _label_statistics_apply(plan, None, step, rhs, features.to(rhs.dtype))
    featurizer = features.featurizer
    if features.dtype != rhs.dtype:
        cast = featurizer
        featurizer = Featurizer(lambda x: cast(x).to(rhs.dtype), cast.params, cast.num_features, cast.batch_shape)
    step = blocks_per_step or max(1, min(2 * num_classes, features.chunk_size // plan.block_size))
    inputs = features.inputs
    # x in block-slot order; padding slots repeat row 0 (their features are zeroed)
    slot_inputs = inputs[plan.index.clamp(max=inputs.shape[-2] - 1)]
    return _label_statistics_apply(plan, featurizer, step, rhs, slot_inputs, *featurizer.params)


def label_square_norms(features: Tensor, structure: "TwoLevelNoise") -> Tensor:
    """tr(Φ_kᵀΦ_k) = Σ_{label_i = k} ‖φᵢ‖² for every label k ``(C,)``, without a graph (O(N·F))."""
    with torch.no_grad():
        norms = torch.linalg.vector_norm(features, dim=-1).square()
        return norms.new_zeros(structure.on.shape[-1]).index_add_(0, structure.labels, norms)


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


class _ClassNoiseSolve:
    """The structured marginal likelihood and posterior caches, shared by the dense and chunked operators."""

    structure: TwoLevelNoise | None = None

    @classmethod
    def from_parts(cls, generic, structure: TwoLevelNoise):
        op = cls(generic._linear_op, generic._diag_tensor)
        op.structure = structure
        return op

    def evaluate_kernel(self):
        # LinearOperator.evaluate_kernel rebuilds the operator from its representation, which would
        # drop the label structure; both components are already evaluated, so it is the identity.
        return self

    def _feature_source(self):
        """Φ (or the chunked ΦΦᵀ) when the structured path applies: shared 2-D Φ, cheaper than kernel space."""
        raise NotImplementedError

    def _solve_statistics(self, source, rhs: Tensor | None):
        """(ΦᵀD_c⁻¹Φ ``(C, F, F)``, ΦᵀD_c⁻¹r_c ``(C, F, t)``, r_cᵀD_c⁻¹r_c ``(C, t)``, dtype) for r ``(C, N, t)``.

        float32 features form the statistics in float64 where u·max_c tr(ΦᵀD_c⁻¹Φ) exceeds the tolerance
        (:func:`~rfgp.inference.statistics_precision.statistics_dtype`; tr(ΦᵀD_c⁻¹Φ) = β_{c,on}t_c + β_{c,off}(Σ_k t_k −
        t_c) from the label traces t_k = tr(Φ_kᵀΦ_k): one O(N·F) pass over a materialised Φ before the products, read
        off the float32 Grams of a chunked one, which are then recomputed); ``dtype``: the model's, to round the
        results back to.  The capacitances A_c = I + ΦᵀD_c⁻¹Φ are factorised by the callers through
        :mod:`rfgp.inference.linalg`'s capacitance helpers, in float64 for float32 statistics.
        """
        structure = self.structure
        w_on, w_off = structure.on.reciprocal(), structure.off.reciprocal()
        num_classes, num_data = w_on.shape[0], structure.labels.shape[0]
        width = 0 if rhs is None else rhs.shape[-1]
        weights = None if rhs is None else structure.per_point().reciprocal().unsqueeze(-1)
        dtype = torch.promote_types(source.dtype, w_on.dtype if rhs is None else
                                    torch.promote_types(rhs.dtype, weights.dtype))

        def weighted(rhs: Tensor | None, weights: Tensor | None) -> Tensor:  # the columns r_c D_c⁻¹, (N, C·t)
            if rhs is None:
                return w_on.new_zeros(num_data, 0)
            return (rhs * weights).permute(1, 0, 2).reshape(num_data, num_classes * width)

        def widened(rhs: Tensor | None, weights: Tensor | None, work: torch.dtype):
            # r and D⁻¹ cast once, shared by the projections and r_cᵀD_c⁻¹r_c: their gradients, which cancel, meet in
            # ``work``, and r_cD_c⁻¹ is not rounded to float32 before the float64 projections
            return (None, None) if rhs is None else (rhs.to(work), weights.to(work))

        def class_traces(label_traces: Tensor) -> Tensor:  # of all processes' points under data_parallel
            label_traces = distributed.reduce_statistics(label_traces)[0]
            return w_on * label_traces + w_off * (label_traces.sum() - label_traces)

        if torch.is_tensor(source):
            work = statistics_dtype(dtype, source.device, lambda: class_traces(label_square_norms(source, structure)))
            rhs, weights = widened(rhs, weights, work)
            grams, projection = label_feature_statistics(source, structure.plan, weighted(rhs, weights), dtype=work)
        else:
            grams, projection = label_feature_statistics(source, structure.plan, weighted(rhs, weights))
            work = statistics_dtype(dtype, grams.device,
                                    lambda: class_traces(grams.detach().diagonal(dim1=-2, dim2=-1).sum(-1)))
            if work != dtype:
                rhs, weights = widened(rhs, weights, work)
                grams, projection = label_feature_statistics(source, structure.plan, weighted(rhs, weights),
                                                             dtype=work)
        w_on, w_off = w_on.to(work), w_off.to(work)
        # r_cᵀD_c⁻¹r_c in the statistics' precision: it cancels against the projections' quadratic form
        weighted_square = None if rhs is None else (rhs.to(work).pow(2) * weights.to(work)).sum(-2)
        num_features = grams.shape[-1]
        projection = projection.view(num_classes, width, num_features).mT
        # A_c − I = β_off ΦᵀΦ + (β_on − β_off) G_c; the callers factorise A_c in one batched Cholesky over the classes
        gram = grams * (w_on - w_off).view(-1, 1, 1) + w_off.view(-1, 1, 1) * grams.sum(0)
        # summed over processes after the products with the noise parameters (rfgp.inference.distributed)
        if weighted_square is None:
            gram, projection = distributed.reduce_statistics(gram, projection)
        else:
            gram, projection, weighted_square = distributed.reduce_statistics(gram, projection, weighted_square)
        return gram, projection, weighted_square, dtype

    def _noise_variances(self) -> Tensor:
        """The C·2 noise variances, named when a capacitance cannot be factorised."""
        return torch.cat((self.structure.on, self.structure.off)).detach()

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        source = self._feature_source()
        if source is None:
            return super().inv_quad_logdet(inv_quad_rhs, logdet, reduce_inv_quad)
        structure = self.structure
        num_classes = structure.on.shape[0]
        rhs = None
        if inv_quad_rhs is not None:
            rhs = inv_quad_rhs.unsqueeze(-1) if inv_quad_rhs.dim() == 1 else inv_quad_rhs
            rhs = rhs.expand(num_classes, *rhs.shape[-2:])
        gram, projection, weighted_square, dtype = self._solve_statistics(source, rhs)
        noise_logdet = None
        if logdet:
            counts = structure.plan.counts.to(dtype)
            num_data = structure.labels.shape[0]
            noise_logdet = counts * structure.on.log() + (num_data - counts) * structure.off.log()
            noise_logdet = distributed.reduce_statistics(noise_logdet)[0]
        # Woodbury and the determinant lemma per class, A_c factorised in float64 for float32 statistics
        inv_quad, logdet_term = woodbury_inv_quad_logdet(gram, projection, weighted_square, noise_logdet, logdet,
                                                         self._noise_variances(), dtype)
        empty = torch.zeros(0, dtype=dtype, device=gram.device)
        if inv_quad is not None and reduce_inv_quad:
            inv_quad = inv_quad.sum(-1)
        return (empty if inv_quad is None else inv_quad), (empty if logdet_term is None else logdet_term)

    def feature_space_caches(self, residual: Tensor) -> tuple[Tensor, Tensor] | None:
        """(A_c⁻¹ΦᵀD_c⁻¹(ỹ_c − μ_c), chol A_c) — the caches of GPyTorch's ``LinearPredictionStrategy``.

        Posterior at test features φ*: mean_c = φ*ᵀ mean_cache_c, covar_c = φ*ᵀA_c⁻¹φ*
        (paper 000 Eqs. 88–89).  ``None`` when the structured path does not apply.
        """
        source = self._feature_source()
        if source is None:
            return None
        num_classes = self.structure.on.shape[0]
        residual = residual.expand(num_classes, residual.shape[-1]).unsqueeze(-1)
        gram, projection, _, dtype = self._solve_statistics(source, residual)
        return capacitance_solve(gram, projection, self._noise_variances(), dtype)  # factorised in float64 for float32


class ClassNoiseFeatureLinearOperator(_ClassNoiseSolve, FeatureRootAddedDiagLinearOperator):
    """ΦΦᵀ + D_c for C classes sharing Φ ``(N, F)`` with two-valued noise D_c, solved in feature space.

    Behaves exactly like :class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator` (it is one,
    with diagonal ``(C, N)``); when built through :meth:`from_parts` it also carries the label
    structure, which :meth:`inv_quad_logdet` and :meth:`feature_space_caches` exploit.  Operators
    derived from it by slicing or reshaping lose the structure and take the generic path.
    """

    def _feature_source(self):
        if self.structure is None:
            return None
        features = self._linear_op.root.to_dense()
        if features.dim() != 2 or self.uses_kernel_space():
            return None
        return features

    def uses_kernel_space(self, statistics_batch: int | None = None) -> bool:
        # the structured feature path forms the per-label Grams once for all classes
        if statistics_batch is None and self.structure is not None:
            statistics_batch = 1
        return super().uses_kernel_space(statistics_batch)


class ChunkedClassNoiseFeatureLinearOperator(_ClassNoiseSolve, ChunkedFeatureRootAddedDiagLinearOperator):
    """The same for a chunked ΦΦᵀ (:class:`~rfgp.inference.operators.ChunkedFeatureRootLinearOperator`): the
    per-label Grams and projections are accumulated chunk by chunk (features recomputed in the
    backward pass), so memory is O(chunk·F + C·F²) instead of O(N·F)."""

    def _feature_source(self):
        if self.structure is None:
            return None
        root = self._linear_op
        if root.inputs.dim() != 2 or len(root.featurizer.batch_shape):
            return None
        # N ≤ F: the generic path; not inside data_parallel, where every rank must take the path of all ranks'
        # points whatever its own shard's N (a rank that took the other path sent other collectives: gloo aborted)
        if root.featurizer.num_features >= root.shape[-1] and not distributed.is_active():
            return None
        return root
