r"""A sketched multitask covariance over the memory budget: Kronecker statistics from φ, block by block if need be.

The interleaved root R = φ ⊗ B of a sketched ``MultitaskKernel`` (:class:`~rfgp.kernels.SketchedDecomposableKernel`;
N·T × F·m, m = rank + T) is T·m times the size of its data features φ (N × F).  Under a noise D_N ⊗ Σ_T its marginal
likelihood and posterior caches need only φ and F·m × F·m statistics (:mod:`rfgp.inference.kronecker_statistics`),
so the kernel sizes them by φ: where R exceeds :class:`rfgp.settings.memory_budget` it returns
:class:`ChunkedKroneckerFeatureOperator`, a chunked multi-output root
(:class:`~rfgp.inference.multioutput_chunking.ChunkedMultiOutputFeatureOperator`) that also keeps the data
featurizer and B.  With a noise D_N ⊗ Σ_T (GPyTorch's ``MultitaskGaussianLikelihood`` of any rank) the noise-added
operators take the Kronecker statistics (:class:`~rfgp.inference.kronecker_tasks.KroneckerStatistics`):

* from φ whole where φ's working set fits the budget (:func:`~rfgp.core.settings.resolve_chunk_size` on its N rows
  and F columns): the same computation as a materialised root's, never forming R;
* else from φ in row blocks (:class:`~rfgp.inference.kronecker_statistics.ChunkedDataFeatures`): φ_cᵀD_c⁻¹φ_c and
  φ_cᵀD_c⁻¹R̃_cB̃ summed over blocks, the backward recomputing each block
  (:func:`~rfgp.inference.chunking.chunked_feature_statistics`), O(chunk·F + F²·m²) memory.

Both equal the unchunked path to rounding, in value and gradient.  Every other case keeps the chunked whitened-root
path of :mod:`rfgp.inference.multioutput_chunking` (R block by block, O(N·T·F²·m²)): other noises (per-entry), missing
targets (``observation_nan_policy`` "mask"/"fill": the masked operators are the plain chunked ones), and operators
derived from the covariance (transposed, indexed, summed) — as for a materialised root.  Expanded over a batch (a mean
or likelihood with a batch of its own) it keeps its factors.  As a test covariance it gives the blocks' data features
(:meth:`ChunkedKroneckerFeatureOperator.data_chunks`) to the Kronecker test side
(:mod:`rfgp.inference.kronecker_posterior`).  A chunked covariance never takes the N·T × N·T kernel-space path.
Where φ fits, it also hands its Kronecker factors (φφᵀ, BBᵀ) to code that takes K_XX ⊗ K_TT apart (BoTorch's
``KroneckerMultiTaskGP.posterior``: ``linear_ops``), as an unchunked root does.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from linear_operator.operators import DiagLinearOperator, LinearOperator, RootLinearOperator
from torch import Tensor

from ..core.grad_mode_cache import cached_per_grad_mode
from ..core.settings import resolve_chunk_size
from .chunking import Featurizer, chunk_slices, output_rows
from .kronecker_statistics import ChunkedDataFeatures
from .kronecker_tasks import (
    DataFeatureRootLinearOperator,
    DiagonalNoiseKroneckerStatistics,
    KroneckerStatistics,
    TaskNoiseKroneckerStatistics,
)
from .linalg import scales_root
from .multioutput_chunking import ChunkedAddedTaskNoiseLinearOperator, ChunkedMultiOutputFeatureOperator
from .operators import ChunkedFeatureRootAddedDiagLinearOperator, scaled_correction
from .task_noise import is_interleaved_task_noise


class ChunkedKroneckerFeatureOperator(ChunkedMultiOutputFeatureOperator):
    """R(x)R(x)ᵀ for R = φ ⊗ B over the budget: a chunked multi-output root that keeps its Kronecker factors.

    Args:
        inputs: x ``(..., N, d)``.
        params: the root featurizer's differentiable tensors.
        featurizer: x ↦ R ``(*batch, c·T, F·m)`` (the chunked whitened-root path's).
        chunk_size: points per block of R.
        num_outputs: T.
        data_featurizer: x ↦ φ ``(*batch, c, F)``.
        task_factor: B ``(..., T, m)``.
        data_chunk_size: points per block of φ, ``None`` where φ fits the budget whole.
        variance_correction: as for :class:`~rfgp.inference.multioutput_chunking.ChunkedMultiOutputFeatureOperator`.
    """

    def __init__(self, inputs: Tensor, *params: Tensor, featurizer: Featurizer, chunk_size: int, num_outputs: int,
                 data_featurizer: Featurizer, task_factor: Tensor, data_chunk_size: int | None,
                 variance_correction: Tensor | None = None) -> None:
        LinearOperator.__init__(self, inputs, *params, featurizer=featurizer, chunk_size=chunk_size,
                                num_outputs=num_outputs, data_featurizer=data_featurizer, task_factor=task_factor,
                                data_chunk_size=data_chunk_size, variance_correction=variance_correction)
        self.inputs1 = self.inputs2 = inputs
        self.featurizer, self.chunk_size, self.num_outputs = featurizer, chunk_size, num_outputs
        self.data_featurizer, self.task_factor, self.data_chunk_size = data_featurizer, task_factor, data_chunk_size
        self.variance_correction = variance_correction

    @classmethod
    def from_root(cls, root: ChunkedMultiOutputFeatureOperator, data_featurizer: Featurizer, task_factor: Tensor,
                  data_chunk_size: int | None) -> ChunkedKroneckerFeatureOperator:
        """The symmetric chunked root ``root`` with its factors φ (``data_featurizer``) and B."""
        return cls(root.inputs1, *root.featurizer.params, featurizer=root.featurizer, chunk_size=root.chunk_size,
                   num_outputs=root.num_outputs, data_featurizer=data_featurizer, task_factor=task_factor,
                   data_chunk_size=data_chunk_size, variance_correction=root.variance_correction)

    @classmethod
    def from_featurizer(cls, inputs1, inputs2, featurizer, chunk_size, num_outputs, variance_correction=None):
        """Other derived operators (transposed, whitened, summed) are plain chunked roots."""
        return ChunkedMultiOutputFeatureOperator.from_featurizer(inputs1, inputs2, featurizer, chunk_size,
                                                                 num_outputs, variance_correction)

    def _expand_batch(self, batch_shape) -> ChunkedKroneckerFeatureOperator:
        """The same covariance over ``batch_shape`` (a mean or likelihood with a batch of its own: linear_operator's
        sums expand their terms), x and B expanded without copying: the Kronecker statistics stay (a plain
        expanded root took the chunked whitened root's O(N·T·F²·m²) statistics)."""
        inputs = self.inputs1.expand(*batch_shape, *self.inputs1.shape[-2:])
        task = self.task_factor.expand(*batch_shape, *self.task_factor.shape[-2:])
        correction = self.variance_correction
        if correction is not None:
            correction = correction.expand(*batch_shape, correction.shape[-1])
        return self._with_inputs(inputs, task, correction)

    def _points(self, rows: slice, columns: slice) -> ChunkedMultiOutputFeatureOperator:
        """A principal block of whole points (the test block that ``ExactGP`` slices out of an eagerly evaluated
        joint covariance) keeps its factors, so that its posterior contracts them
        (:class:`~rfgp.inference.kronecker_posterior.ChunkedKroneckerPosteriorCovariance`); other blocks are plain
        chunked operators."""
        if rows != columns:
            return super()._points(rows, columns)
        correction = self.variance_correction
        if correction is not None:
            correction = correction[..., output_rows(rows, self.num_outputs)]
        return self._with_inputs(self.inputs1[..., rows, :], self.task_factor, correction)

    def _with_inputs(self, inputs: Tensor, task_factor: Tensor,
                     variance_correction: Tensor | None) -> ChunkedKroneckerFeatureOperator:
        """This covariance at ``inputs`` (expanded or a block of x), φ's blocks sized for them as the kernel sizes
        them (:func:`~rfgp.core.settings.resolve_chunk_size`)."""
        data = self.data_featurizer
        batch = math.prod(torch.broadcast_shapes(data.batch_shape, inputs.shape[:-2]))
        data_chunk = resolve_chunk_size(inputs.shape[-2], data.num_features, batch, inputs.dtype)
        return ChunkedKroneckerFeatureOperator(inputs, *self.featurizer.params, featurizer=self.featurizer,
                                               chunk_size=self.chunk_size, num_outputs=self.num_outputs,
                                               data_featurizer=data, task_factor=task_factor,
                                               data_chunk_size=data_chunk, variance_correction=variance_correction)

    def data_chunks(self) -> Iterator[tuple[slice, Tensor]]:
        """(rows, φ_c) for the blocks of :meth:`feature_chunks` (``chunk_size`` points of x), φ_c their data features
        ``(*batch, c, F)``, rows indexing the n·T interleaved rows."""
        for points in chunk_slices(self.inputs1.shape[-2], self.chunk_size):
            yield output_rows(points, self.num_outputs), self.data_featurizer(self.inputs1[..., points, :])

    @property
    def data_features(self) -> Tensor | ChunkedDataFeatures:
        """φ(x) whole where it fits the budget (once per grad mode), else its :class:`ChunkedDataFeatures`."""
        if self.data_chunk_size is None:
            return self._whole_data_features()
        return ChunkedDataFeatures(self.data_featurizer, self.inputs1, self.data_chunk_size)

    @cached_per_grad_mode("data_features")
    def _whole_data_features(self) -> Tensor:
        return self.data_featurizer(self.inputs1)

    @property
    def linear_ops(self) -> tuple[LinearOperator, LinearOperator]:
        """(φφᵀ, BBᵀ), K_XX ⊗ K_TT's factors as
        :class:`~rfgp.inference.kronecker_tasks.KroneckerFeatureRootLinearOperator` gives them (BoTorch's
        ``KroneckerMultiTaskGP.posterior`` reads them), where φ fits the budget whole; a φ chunked too is refused by
        name (its eigendecomposition would need the whole N × F matrix)."""
        if self.data_chunk_size is not None:
            return super().linear_ops  # raises, saying why
        return self._factors()

    @cached_per_grad_mode("kronecker_factors")  # φ's graph per grad mode
    def _factors(self) -> tuple[LinearOperator, LinearOperator]:
        return DataFeatureRootLinearOperator(self.data_features), RootLinearOperator(self.task_factor)

    def _mul_constant(self, other):
        """c·RRᵀ = (√c·φ ⊗ B)(√c·φ ⊗ B)ᵀ for c > 0 (``ScaleKernel`` around the multitask kernel): both featurizers
        scaled, the factors kept, the variance correction scaled by c."""
        if not scales_root(other):
            return super()._mul_constant(other)
        return ChunkedKroneckerFeatureOperator(
            self.inputs1, *self.featurizer.scaled(other).params, featurizer=self.featurizer.scaled(other),
            chunk_size=self.chunk_size, num_outputs=self.num_outputs,
            data_featurizer=self.data_featurizer.scaled(other), task_factor=self.task_factor,
            data_chunk_size=self.data_chunk_size,
            variance_correction=scaled_correction(self.variance_correction, other))

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return ChunkedKroneckerAddedDiagLinearOperator(self, other)
        if is_interleaved_task_noise(other):
            return ChunkedKroneckerAddedTaskNoiseLinearOperator(self, other)
        return super().__add__(other)


class _ChunkedKroneckerStatistics(KroneckerStatistics):
    """:class:`~rfgp.inference.kronecker_tasks.KroneckerStatistics` of a chunked covariance: always the F·m × F·m
    capacitance (the kernel-space path needs the whole root)."""

    def _kernel_space_given(self, parts, *args) -> bool:
        return False


class ChunkedKroneckerAddedDiagLinearOperator(_ChunkedKroneckerStatistics, DiagonalNoiseKroneckerStatistics,
                                              ChunkedFeatureRootAddedDiagLinearOperator):
    """RRᵀ + D of a :class:`ChunkedKroneckerFeatureOperator`: Kronecker statistics where D = D_N ⊗ diag(t), the
    chunked root's statistics otherwise (and under a mask: :meth:`select_rows` gives the plain chunked operator)."""


class ChunkedKroneckerAddedTaskNoiseLinearOperator(_ChunkedKroneckerStatistics, TaskNoiseKroneckerStatistics,
                                                   ChunkedAddedTaskNoiseLinearOperator):
    """RRᵀ + D_N ⊗ Σ_T of a :class:`ChunkedKroneckerFeatureOperator`: Kronecker statistics (the chunked whitened
    root's under a mask)."""


__all__ = [
    "ChunkedKroneckerAddedDiagLinearOperator",
    "ChunkedKroneckerAddedTaskNoiseLinearOperator",
    "ChunkedKroneckerFeatureOperator",
]
