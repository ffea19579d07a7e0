"""T independent outputs in GPyTorch's interleaved layout, kept as T feature roots: T times the cost of one output.

GPyTorch's batch-independent multi-output GP (:mod:`rfgp.kernels.independent_outputs`) joins T covariances
Φ_tΦ_tᵀ (a batch ``(..., T, N, N)``) in the interleaved layout, row n·T + t.  As one feature root that is R
(N·T × T·F), R[n·T + t, s·F + f] = δ_ts Φ_t(x_n)_f (:func:`block_root`), on which the multi-output algebra
forms and factorises the (T·F)² matrix RᵀD⁻¹R, zero blocks included: O(N·T·(T·F)² + (T·F)³), T² times the flops
of T separate GPs.  Correlated task noise (``MultitaskGaussianLikelihood(rank ≥ 1)``, :mod:`rfgp.inference.task_noise`)
couples the outputs and needs that root; :class:`IndependentTasksLinearOperator` (and
:class:`ChunkedIndependentTasksOperator` over the memory budget) still is it, materialised only when asked for.

With a diagonal noise D (``MultitaskGaussianLikelihood(rank=0)``, with or without its global or per-task noise;
a fixed noise) RRᵀ + D is block diagonal up to the interleaving permutation, with blocks Φ_tΦ_tᵀ + D_t, so

    rᵀ(RRᵀ + D)⁻¹r = Σ_t r_tᵀ(Φ_tΦ_tᵀ + D_t)⁻¹r_t,     log|RRᵀ + D| = Σ_t log|Φ_tΦ_tᵀ + D_t|,

and the posterior of output t reads output t's data only.  :class:`IndependentTasksAddedDiagLinearOperator` is
RRᵀ + D computed as one batch of T single-output operators
(:meth:`~IndependentTasksAddedDiagLinearOperator.task_system`:
:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator`, or its chunked counterpart): T statistics
and Cholesky factors of F × F (or, N ≲ F, of N × N in kernel space), O(N·T·F² + T·F³), with their lean gradients;
:class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy` predicts through the single-output
strategy of that batch.

Missing entries (``observation_nan_policy("mask")``/``("fill")``) differ between outputs, so they cannot be dropped
from one batch: a missing entry of output t stays a row of output t's system, with features 0, noise 1 and residual
0 (:func:`zero_rows`).  Its block of the system is then the 1 × 1 identity, decoupled from the rest: it adds 0 to
the quadratic form and log 1 = 0 to the log-determinant, and leaves the posterior unchanged — exactly the system of
the observed entries.
"""

from __future__ import annotations

import torch
from linear_operator import to_linear_operator
from linear_operator.operators import (
    AddedDiagLinearOperator,
    BlockInterleavedLinearOperator,
    ConstantDiagLinearOperator,
    ConstantMulLinearOperator,
    DiagLinearOperator,
    KroneckerProductDiagLinearOperator,
    LinearOperator,
    MaskedLinearOperator,
)
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from torch import Tensor

from .chunking import Featurizer, row_points
from .complex_posterior import ComplexFeatureRootLinearOperator
from .linalg import scales_root
from .multioutput_chunking import ChunkedMultiOutputFeatureOperator
from .operators import ChunkedFeatureRootLinearOperator, FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .triangular_statistics import TriangularFeatures


def block_root(root: Tensor) -> Tensor:
    """``(..., T, n, F)`` roots Φ_t → the ``(..., n·T, T·F)`` interleaved root R[n·T + t, s·F + f] = δ_ts Φ_t[n, f]."""
    num_tasks, num_points, width = root.shape[-3:]
    eye = torch.eye(num_tasks, dtype=root.dtype, device=root.device)
    blocks = root.movedim(-3, -2).unsqueeze(-2) * eye.unsqueeze(-1)  # (..., n, T, T, F)
    return blocks.reshape(*root.shape[:-3], num_points * num_tasks, num_tasks * width)


def split_tasks(values: Tensor, num_tasks: int) -> Tensor:
    """Interleaved ``(..., n·T)`` → ``(..., T, n)`` (output t's n values in row t)."""
    return values.unflatten(-1, (-1, num_tasks)).movedim(-1, -2)


def join_tasks(values: Tensor) -> Tensor:
    """``(..., T, n)`` → interleaved ``(..., n·T)``, the inverse of :func:`split_tasks`."""
    return values.movedim(-2, -1).flatten(-2)


def _split_rows(matrix: Tensor, num_tasks: int) -> Tensor:
    """Interleaved rows ``(..., n·T, k)`` → ``(..., T, n, k)``."""
    return matrix.unflatten(-2, (-1, num_tasks)).movedim(-2, -3)


def _join_rows(matrix: Tensor) -> Tensor:
    """``(..., T, n, k)`` → interleaved rows ``(..., n·T, k)``."""
    return matrix.movedim(-3, -2).flatten(-3, -2)


def zero_rows(tasks: LinearOperator, keep: Tensor) -> LinearOperator:
    """The per-output covariances Φ_tΦ_tᵀ with the rows of Φ_t zeroed where ``keep`` ``(T, n)`` is ``False``.

    Φ = c·Φ₀ keeps c apart and a Nyström root Φ₀ = K·L⁻ᵀ its factors (K loses the rows); a chunked root multiplies
    each block's rows by their indicator, which travels with the points as T extra input columns.
    """
    indicator = keep.to(tasks.dtype).unsqueeze(-1)  # (T, n, 1)
    if isinstance(tasks, ChunkedFeatureRootLinearOperator):
        inputs, base = tasks.inputs, tasks.featurizer
        dim, num_tasks = inputs.shape[-1], keep.shape[-2]
        columns = keep.mT.to(inputs.dtype).expand(*inputs.shape[:-2], *keep.mT.shape)
        augmented = torch.cat((inputs, columns), -1)

        def kept_features(rows: Tensor) -> Tensor:
            x, kept = rows.split((dim, num_tasks), -1)
            return base(x) * kept.movedim(-1, -2).unsqueeze(-1)

        featurizer = Featurizer(kept_features, base.params, base.num_features, base.batch_shape)
        return ChunkedFeatureRootLinearOperator.from_featurizer(augmented, featurizer, tasks.chunk_size)
    root, constant = tasks.scaled_root()
    if isinstance(root, TriangularFeatures):
        root = TriangularFeatures(root.features * indicator, root.cross * indicator, root.chol)
    else:
        root = to_linear_operator(root.to_dense() * indicator)
    if constant is not None:
        root = ConstantMulLinearOperator(root, constant)
    return FeatureRootLinearOperator(root, tasks.variance_correction)


class IndependentTasksLinearOperator(FeatureRootLinearOperator):
    """RRᵀ of T independent outputs, interleaved (module docstring), from their covariances Φ_tΦ_tᵀ.

    A :class:`~rfgp.inference.operators.FeatureRootLinearOperator` whose root R (N·T × T·F) is materialised only
    when asked for (correlated task noise, generic products); a diagonal noise added gives
    :class:`IndependentTasksAddedDiagLinearOperator`, products and the diagonal run per output.

    Args:
        tasks: a :class:`~rfgp.inference.operators.FeatureRootLinearOperator` with the T outputs in its last batch
            dimension ``(..., T, N, N)``.
    """

    def __init__(self, tasks: FeatureRootLinearOperator) -> None:
        LinearOperator.__init__(self, tasks)
        self.tasks = tasks
        self.variance_correction = None if tasks.variance_correction is None else join_tasks(tasks.variance_correction)
        self._root = None

    @property
    def num_tasks(self) -> int:
        return self.tasks.shape[-3]

    @property
    def root(self) -> LinearOperator:
        """R = :func:`block_root` of the T roots (materialised at the first call)."""
        if self._root is None:
            self._root = to_linear_operator(block_root(self.tasks.features()))
        return self._root

    def interleaved(self) -> FeatureRootLinearOperator:
        """The same matrix as a plain feature root operator of R."""
        return FeatureRootLinearOperator(self.root, self.variance_correction)

    def _size(self) -> torch.Size:
        *batch, _, num_points, _ = self.tasks.shape
        return torch.Size((*batch, num_points * self.num_tasks, num_points * self.num_tasks))

    def _transpose_nonbatch(self):
        return self

    def _diagonal(self) -> Tensor:
        return join_tasks(self.tasks.diagonal(dim1=-2, dim2=-1))

    def _matmul(self, rhs: Tensor) -> Tensor:
        return _join_rows(self.tasks.matmul(_split_rows(rhs, self.num_tasks)))

    def _expand_batch(self, batch_shape):
        return self.__class__(self.tasks._expand_batch((*batch_shape, self.num_tasks)))

    def _getitem(self, row_index, col_index, *batch_indices):
        """A block of whole points (all T rows of each: the test blocks that ``ExactGP`` slices out of an eagerly
        evaluated joint covariance) stays per output, Φ_t[I]Φ_t[I]ᵀ or the cross covariances Φ_t[I]Φ_t[J]ᵀ; other
        indices are R's (materialised)."""
        rows = row_points(row_index, self.shape[-2], self.num_tasks)
        columns = row_points(col_index, self.shape[-1], self.num_tasks)
        if rows is None or columns is None or not all(map(_is_noop_index, batch_indices)):
            return self.interleaved()._getitem(row_index, col_index, *batch_indices)
        tasks = self.tasks._getitem(rows, columns, *batch_indices, _noop_index)
        return self.__class__(tasks) if rows == columns else BlockInterleavedLinearOperator(tasks)

    def _permute_batch(self, *dims):
        return self.__class__(self.tasks._permute_batch(*dims, len(dims)))

    def _unsqueeze_batch(self, dim):
        return self.__class__(self.tasks._unsqueeze_batch(dim))

    def select_rows(self, observed: Tensor) -> FeatureRootLinearOperator:
        """R[observed]R[observed]ᵀ for an interleaved boolean mask ``(N·T,)`` (correlated task noise's mask)."""
        return self.interleaved().select_rows(observed)

    def _mul_constant(self, other):
        if not scales_root(other):
            return self.interleaved()._mul_constant(other)
        if torch.is_tensor(other) and other.dim() > 0:
            other = other.unsqueeze(-1)  # a batch constant, the same for every output
        return self.__class__(self.tasks._mul_constant(other))

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return IndependentTasksAddedDiagLinearOperator(self, other)
        if isinstance(other, IndependentTasksLinearOperator) and other.num_tasks == self.num_tasks:
            return self.__class__(self.tasks + other.tasks)  # per output [Φ_t, Ψ_t]
        if isinstance(self.tasks, ComplexFeatureRootLinearOperator):
            # R of the outputs' Ψ_t is the real model on Re K̂: the complex GP's evidence would be lost silently
            raise ValueError(
                "the independent outputs of a kernel with complex_posterior=True take a diagonal noise only "
                "(MultitaskGaussianLikelihood(rank=0), or a fixed noise), whose outputs are separate complex GPs; "
                f"got {type(other).__name__} (correlated task noise, rank >= 1, which would couple them through the "
                "real model on Re K̂): use rank=0, or complex_posterior=False"
            )
        return self.interleaved() + other


class ChunkedIndependentTasksOperator(ChunkedMultiOutputFeatureOperator):
    """:class:`IndependentTasksLinearOperator` over the memory budget: the interleaved R(x)R(x)ᵀ evaluated a block of
    points at a time (correlated task noise), with the T outputs' covariances ``tasks`` for a diagonal one (materialised
    where the T roots fit the budget, chunked otherwise).

    Operators derived from it (``from_featurizer``: whitened, transposed) are plain
    :class:`~rfgp.inference.multioutput_chunking.ChunkedMultiOutputFeatureOperator` s.
    """

    def __init__(self, inputs1: Tensor, inputs2: Tensor, *params: Tensor, featurizer: Featurizer, chunk_size: int,
                 num_outputs: int, tasks: LinearOperator) -> None:
        LinearOperator.__init__(self, inputs1, inputs2, *params, featurizer=featurizer, chunk_size=chunk_size,
                                num_outputs=num_outputs, tasks=tasks)
        self.inputs1, self.inputs2 = inputs1, inputs2
        self.featurizer = featurizer
        self.chunk_size = chunk_size
        self.num_outputs = num_outputs
        self.tasks = tasks
        self.variance_correction = None  # bias-corrected maps' independent outputs are not chunked (the kernel refuses)

    @property
    def num_tasks(self) -> int:
        return self.num_outputs

    @classmethod
    def from_featurizer(cls, inputs1, inputs2, featurizer, chunk_size, num_outputs, variance_correction=None):
        return ChunkedMultiOutputFeatureOperator.from_featurizer(inputs1, inputs2, featurizer, chunk_size, num_outputs,
                                                                 variance_correction)

    @classmethod
    def from_tasks(cls, interleaved: ChunkedFeatureRootLinearOperator, chunk_size: int,
                   tasks: LinearOperator | None = None) -> ChunkedIndependentTasksOperator:
        """From the T outputs' chunked covariances ``interleaved`` (outputs in the last batch dimension), whose
        features give the interleaved root's rows ``chunk_size`` points at a time, and ``tasks``, the same T
        covariances for a diagonal noise (default ``interleaved``; materialised when the T roots fit the budget)."""
        base, inputs = interleaved.featurizer, interleaved.inputs
        num_tasks = base.batch_shape[-1]
        # the inputs' batch dimension of the outputs (their own inputs, or 1 broadcast against them; none for inputs
        # (n, d)) goes into the interleaved rows' columns, (..., T, n, d) → (..., n, T·d), so that it is not a batch
        # dimension of theirs (which are expanded to the batch without it); their featurizer puts it back
        per_output = inputs.shape[-3] if inputs.dim() > 2 else 1
        inputs = inputs.movedim(-3, -2).flatten(-2) if inputs.dim() > 2 else inputs

        def block_features(x: Tensor) -> Tensor:
            return block_root(base(x.unflatten(-1, (per_output, -1)).movedim(-2, -3)))

        featurizer = Featurizer(block_features, base.params, num_tasks * base.num_features, base.batch_shape[:-1])
        return cls(inputs, inputs, *featurizer.params, featurizer=featurizer,
                   chunk_size=chunk_size, num_outputs=num_tasks, tasks=interleaved if tasks is None else tasks)

    def _points(self, rows: slice, columns: slice) -> ChunkedMultiOutputFeatureOperator:
        """A principal block of whole points keeps the T outputs' covariances on those points; other blocks are
        plain chunked operators."""
        if not (self.symmetric and rows == columns):
            return super()._points(rows, columns)
        inputs = self.inputs1[..., rows, :]
        return self.__class__(inputs, inputs, *self.featurizer.params, featurizer=self.featurizer,
                              chunk_size=self.chunk_size, num_outputs=self.num_outputs,
                              tasks=self.tasks[..., rows, rows])

    def _mul_constant(self, other):
        if not scales_root(other):
            return super()._mul_constant(other)
        scaled = super()._mul_constant(other)  # the interleaved rows' featurizer scaled
        if torch.is_tensor(other) and other.dim() > 0:
            other = other.unsqueeze(-1)
        return self.__class__(scaled.inputs1, scaled.inputs2, *scaled.featurizer.params, featurizer=scaled.featurizer,
                              chunk_size=self.chunk_size, num_outputs=self.num_outputs,
                              tasks=self.tasks._mul_constant(other))

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return IndependentTasksAddedDiagLinearOperator(self, other)
        return super().__add__(other)


class IndependentTasksAddedDiagLinearOperator(AddedDiagLinearOperator):
    """RRᵀ + D for T independent outputs and a diagonal noise D: T single-output systems (module docstring)."""

    @property
    def num_tasks(self) -> int:
        return self._linear_op.num_tasks

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return self.__class__(self._linear_op, self._diag_tensor + other)
        return super().__add__(other)

    def task_system(self, observed: Tensor | None = None) -> LinearOperator:
        """The batch of T systems Φ_tΦ_tᵀ + D_t ``(..., T, N, N)``, a (chunked) feature-root operator plus a diagonal.

        ``observed``: an optional interleaved boolean mask ``(N·T,)``; a missing entry's row gets features 0 and
        noise 1 (module docstring).
        """
        tasks = self._linear_op.tasks
        if observed is None:
            return tasks + _task_noise(self._diag_tensor, self.num_tasks, tasks.shape[-1])
        noise = split_tasks(self._diag_tensor.diagonal(dim1=-1, dim2=-2), self.num_tasks)
        keep = split_tasks(observed, self.num_tasks)
        noise = torch.where(keep, noise, torch.ones((), dtype=noise.dtype, device=noise.device))
        return zero_rows(tasks, keep) + DiagLinearOperator(noise)

    def uses_kernel_space(self) -> bool:
        """Whether the T systems run in kernel space (N × N each), the choice of :meth:`task_system`."""
        system = self.task_system()
        return isinstance(system, FeatureRootAddedDiagLinearOperator) and system.uses_kernel_space()

    def select_rows(self, observed: Tensor) -> ObservedIndependentTasks:
        """The covariance of the observed entries (interleaved boolean mask ``(N·T,)``), ``observation_nan_policy``."""
        return ObservedIndependentTasks(self, observed, observed)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        return self.task_inv_quad_logdet(inv_quad_rhs, logdet, reduce_inv_quad)

    def task_inv_quad_logdet(self, inv_quad_rhs, logdet, reduce_inv_quad, observed: Tensor | None = None):
        """Σ_t of the T systems' ``inv_quad_logdet`` (module docstring), ``inv_quad_rhs`` ``(..., N·T[, k])``
        interleaved (0 at entries that ``observed`` leaves out)."""
        system = self.task_system(observed)
        rhs = None
        if inv_quad_rhs is not None:
            rhs = inv_quad_rhs.unsqueeze(-1) if inv_quad_rhs.dim() == 1 else inv_quad_rhs
            rhs = _split_rows(rhs, self.num_tasks)
        inv_quad, logdet_term = system.inv_quad_logdet(rhs, logdet, reduce_inv_quad=False)
        if rhs is not None:
            inv_quad = inv_quad.sum(-2)  # (..., T, k) → (..., k)
            if reduce_inv_quad:
                inv_quad = inv_quad.sum(-1)
        if logdet:
            logdet_term = logdet_term.sum(-1)
        return inv_quad, logdet_term


def _task_noise(noise: DiagLinearOperator, num_tasks: int, num_points: int) -> DiagLinearOperator:
    """The interleaved noise diagonal ``(..., N·T)`` as T diagonals ``(..., T, N)``; constant per output (one value
    ``(..., T, 1)``, so that the statistics need no N × F pass) for GPyTorch's I_N ⊗ D_T
    (``MultitaskGaussianLikelihood`` rank 0) and a constant σ²I."""
    if isinstance(noise, ConstantDiagLinearOperator):
        values = noise.diag_values.unsqueeze(-2).expand(*noise.diag_values.shape[:-1], num_tasks, 1)
        return ConstantDiagLinearOperator(values, diag_shape=num_points)
    if (isinstance(noise, KroneckerProductDiagLinearOperator) and len(noise.linear_ops) == 2
            and isinstance(noise.linear_ops[0], ConstantDiagLinearOperator)):
        points, tasks = noise.linear_ops
        values = points.diag_values * tasks.diagonal(dim1=-1, dim2=-2)  # c·d_t, (..., T)
        return ConstantDiagLinearOperator(values.unsqueeze(-1), diag_shape=num_points)
    return DiagLinearOperator(split_tasks(noise.diagonal(dim1=-1, dim2=-2), num_tasks))


class ObservedIndependentTasks(MaskedLinearOperator):
    """The observed entries (interleaved boolean mask ``(N·T,)``) of an
    :class:`IndependentTasksAddedDiagLinearOperator`, whose log-density runs on its T systems with the missing rows
    decoupled (module docstring)."""

    def __init__(self, base: IndependentTasksAddedDiagLinearOperator, row_mask: Tensor, col_mask: Tensor) -> None:
        if row_mask is not col_mask and not torch.equal(row_mask, col_mask):
            raise ValueError("row_mask and col_mask must be the same mask of observed entries")
        super().__init__(base, row_mask, col_mask)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        rhs = inv_quad_rhs
        if rhs is not None:
            rhs = rhs.unsqueeze(-1) if rhs.dim() == 1 else rhs
            full = rhs.new_zeros(*rhs.shape[:-2], self.row_mask.shape[-1], rhs.shape[-1])
            full[..., self.row_mask, :] = rhs
            rhs = full
        return self.base.task_inv_quad_logdet(rhs, logdet, reduce_inv_quad, self.row_mask)
