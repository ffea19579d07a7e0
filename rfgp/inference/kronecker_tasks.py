r"""The sketched multitask covariance (φ ⊗ Bᵀ)(φ ⊗ Bᵀ)ᵀ = φφᵀ ⊗ A with its Kronecker factors.

A sketched ``MultitaskKernel`` (:class:`~rfgp.kernels.SketchedDecomposableKernel`) returns the low-rank root
R = φ ⊗ Bᵀ of its training covariance (interleaved rows, GPyTorch's order), which the marginal likelihood and
rfgp's prediction strategies keep factored.  Code written for GPyTorch's ``KroneckerProductLinearOperator``
K_XX ⊗ K_TT takes that covariance apart instead: BoTorch's ``KroneckerMultiTaskGP.posterior`` reads
``train_full_covar.linear_ops[0]``, eigendecomposes it (``diagonalization``), appends the test rows to it
(``cat_rows(..., method="diagonalization")``) and samples with Matheron's rule from the root of the joint
train/test covariance (Maddox et al. 2021, "Bayesian optimization with high-dimensional outputs", §3).

* :class:`KroneckerFeatureRootLinearOperator` — RRᵀ as before (same root, same algebra), whose ``linear_ops``
  are the factors (φφᵀ, A), its root a :class:`KroneckerRootLinearOperator` formed only where a path needs it;
* :class:`DataFeatureRootLinearOperator` — the data factor φφᵀ (N × N, rank ≤ F), whose eigendecomposition
  comes from the thin SVD φ = USVᵀ, φφᵀ = U·S²·Uᵀ, in O(N·F·min(N, F)) instead of O(N³), and whose
  ``cat_rows`` returns the feature root [φ; φ*] of the joint covariance;
* :class:`KroneckerFeatureRootAddedDiagLinearOperator`, :class:`KroneckerFeatureRootAddedTaskNoiseLinearOperator` —
  RRᵀ plus a likelihood's noise, whose ``solve`` (BoTorch's mean cache and every Matheron sample) goes through
  both factors' eigendecompositions where the noise is c·I_N ⊗ Σ_T (:class:`_KroneckerSolve`), and whose marginal
  likelihood and posterior statistics come from the factors where the noise is D_N ⊗ Σ_T (:class:`KroneckerStatistics`,
  :mod:`rfgp.inference.kronecker_statistics`): an MLL step then never forms the root.

Its eigenpairs are computed without a graph, so under ``gpytorch.settings.detach_test_caches(False)`` (BoTorch then
keeps the training covariance's graph) the posterior is refused by name, outside ``torch.no_grad()``.

The eigenpairs are the r = min(N, F) of the range of φ, returned square as BoTorch's posterior uses a partial
diagonalization (linear_operator's Lanczos): eigenvalues S² followed by N − r zeros, and N × N "eigenvectors"
[U, 0] (:class:`ZeroPaddedColumnsLinearOperator`) whose N − r zero columns are implicit — exact for its use, the
products K(x*, X)·Q of cross-covariances whose rows φ(x*)φᵀ lie in the range of φ, so orthogonal to the complement
(the noise BoTorch adds to the zero eigenvalues then meets zero weights).  Given an (N, r) matrix BoTorch pads it
itself, a dense N × (N − r) zero tensor concatenated to it; its product with the test–train covariance still forms
the N × N matrix (linear_operator's ``MatmulLinearOperator.to_dense`` densifies both factors), once instead of twice.
"""

from __future__ import annotations

import torch
from linear_operator import to_linear_operator
from linear_operator.operators import (
    DenseLinearOperator,
    LinearOperator,
    RootLinearOperator,
)
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.getitem import _is_noop_index
from linear_operator.utils.memoize import cached
from torch import Tensor

from ..core.dtypes import FullPrecisionOperator, factor_dtype
from ..core.grad_mode_cache import cached_per_grad_mode
from ..core.settings import validate_inputs
from ..core.validation import check_noise, check_targets
from ..features.operator_valued import decomposable_features
from . import distributed
from .chunking import row_points
from .kernel_evaluation import evaluated_covariance
from .kronecker_statistics import (
    diagonal_task_cholesky,
    kronecker_noise,
    kronecker_noise_logdet,
    kronecker_statistics,
    prefers_kernel_space_kronecker,
    statistics_batches,
)
from .linalg import woodbury_inv_quad_logdet
from .operators import (
    FeatureRootAddedDiagLinearOperator,
    FeatureRootLinearOperator,
    _as_matrix,
    _finish_inv_quad_logdet,
)
from .task_noise import FeatureRootAddedTaskNoiseLinearOperator


class DataFeatureRootLinearOperator(FeatureRootLinearOperator):
    r"""φφᵀ, the data factor of a sketched multitask covariance, with an O(N·F·min(N, F)) eigendecomposition.

    Args:
        root: φ, ``(..., N, F)``.
    """

    @cached(name="thin_svd")
    def thin_svd(self) -> tuple[Tensor, Tensor, Tensor]:
        """(U, S, Vᵀ) of the thin SVD φ = USVᵀ in :func:`~rfgp.core.dtypes.factor_dtype` (float64 for float32 φ),
        without a graph: ``(..., N, r)``, ``(..., r)``, ``(..., r, F)`` with r = min(N, F)."""
        features = self.features().detach()
        return torch.linalg.svd(features.to(factor_dtype(features.dtype, features.device)), full_matrices=False)

    def range_eigenpairs(self) -> tuple[Tensor, Tensor]:
        """(S², U): the eigenpairs of φφᵀ on the range of φ, from :meth:`thin_svd`."""
        left, singular, _ = self.thin_svd()
        return singular.square(), left

    def diagonalization(self, method: str | None = None) -> tuple[Tensor, LinearOperator]:
        """(S² then N − r zeros ``(..., N)``, [U, 0] ``(..., N, N)``) from the thin SVD φ = USVᵀ in φ's dtype: the
        r = min(N, F) eigenpairs of φφᵀ on the range of φ, every other eigenvalue being 0, with zero columns in
        place of the complement's eigenvectors (:class:`ZeroPaddedColumnsLinearOperator`; see the module docstring).
        ``method`` ("symeig", "lanczos") is accepted and ignored: both ask for the same pairs, which this computes
        exactly.  Without gradients (BoTorch detaches its training caches); a φ that requires a gradient is refused."""
        if torch.is_grad_enabled() and self.root.requires_grad:
            raise RuntimeError(
                f"{type(self).__name__}.diagonalization computes its eigenpairs without a graph, but φ requires a "
                "gradient: call it under torch.no_grad() or on a detached operator (BoTorch's KroneckerMultiTaskGP "
                "does so under gpytorch.settings.detach_test_caches(), its default)"
            )
        evals, evecs = self.range_eigenpairs()
        num_points = evecs.shape[-2]
        evals = torch.nn.functional.pad(evals, (0, num_points - evals.shape[-1]))
        return evals.to(self.dtype), ZeroPaddedColumnsLinearOperator(evecs.to(self.dtype), num_points)

    def cat_rows(self, cross_mat, new_mat, generate_roots: bool = True, generate_inv_roots: bool = True,
                 **root_decomp_kwargs) -> LinearOperator:
        r"""[[φφᵀ, φφ*ᵀ], [φ*φᵀ, φ*φ*ᵀ + C*]] as the feature root [[φ, 0], [φ*, C*^½]] (narrowed to N + n* columns where
        it is wider, :meth:`_narrow_joint_root`).

        C* = diag(c(x*)) is the variance correction that ``new_mat`` carries (a Nyström data kernel's FITC-style
        k(x*, x*) − ‖φ(x*)‖², :class:`~rfgp.kernels.NystromKernel`), absent (C* = 0, root [φ; φ*]) for unbiased maps:
        the prior at the new rows is the corrected one, as in rfgp's own posterior, so BoTorch's Matheron samples of
        ``KroneckerMultiTaskGP.posterior`` have its variance.  Before, they fell to zero away from the landmarks.

        φ* is the root of ``new_mat`` (the data kernel at the new rows, an rfgp feature covariance), and
        ``cross_mat`` must be φ*φᵀ: the rows appended are those of the same feature map.  Its shape is checked,
        and its values on one product with a fixed probe vector (relative error ≤ √eps; a host synchronisation,
        skipped under ``rfgp.settings.validate_inputs(False)``).  ``generate_roots``/``generate_inv_roots`` and the
        decomposition keywords are accepted and ignored: the root is exact, and no inverse root is formed.
        """
        new = evaluated_covariance(to_linear_operator(new_mat))
        if not isinstance(new, FeatureRootLinearOperator) or new.shape[-2] != new.root.shape[-2]:
            raise TypeError(
                f"new_mat must be an rfgp feature covariance φ*φ*ᵀ (the data kernel at the new rows), got "
                f"{type(new).__name__}: {type(self).__name__}.cat_rows appends the rows of the same feature map"
            )
        features, new_features = self.features(), new.features()
        if new_features.shape[-1] != features.shape[-1]:
            raise ValueError(
                f"new_mat has {new_features.shape[-1]} features per row, this data covariance {features.shape[-1]}: "
                "cat_rows appends the rows of the same feature map"
            )
        batch = torch.broadcast_shapes(features.shape[:-2], new_features.shape[:-2])
        cross = to_linear_operator(cross_mat)
        if cross.shape[-2:] != torch.Size((new_features.shape[-2], features.shape[-2])):
            raise ValueError(
                f"cross_mat has shape {tuple(cross.shape)}, expected (..., {new_features.shape[-2]}, "
                f"{features.shape[-2]}) (new rows × the {features.shape[-2]} rows of this data covariance). A "
                "KroneckerMultiTaskGP returned by condition_on_observations or fantasize keeps BoTorch's cached "
                "training covariance (train_full_covar) of the data before conditioning: call .train() on the "
                "conditioned model before .posterior, which clears that cache"
            )
        if validate_inputs.on():
            _check_cross(cross, new_features, features)
        correction = new.variance_correction
        if correction is not None:
            batch = torch.broadcast_shapes(batch, correction.shape[:-1])
        num_rows = features.shape[-2] + new_features.shape[-2]
        width = features.shape[-1] + (0 if correction is None else new_features.shape[-2])
        if width <= num_rows:
            root = torch.cat((features.expand(*batch, *features.shape[-2:]),
                              new_features.expand(*batch, *new_features.shape[-2:])), -2)
            if correction is not None:
                added = torch.diag_embed(correction.clamp_min(0).sqrt().to(root).expand(*batch, -1))
                root = torch.cat((root, torch.cat((added.new_zeros(*batch, features.shape[-2], added.shape[-1]),
                                                   added), -2)), -1)
            return FeatureRootLinearOperator(root)
        return FeatureRootLinearOperator(self._narrow_joint_root(new_features, batch, correction))

    def _narrow_joint_root(self, new_features: Tensor, batch: torch.Size, correction: Tensor | None = None) -> Tensor:
        r"""A root of [φ; φ*][φ; φ*]ᵀ + diag(0, C*) with N + n* columns where it is wider: [[U·S, 0], [φ*V, C]],
        C = chol(BBᵀ + C*) of the part B = φ* − φ*VVᵀ of the new rows outside φ's row space and the new rows'
        ``correction`` C* (φ = USVᵀ, so φ*Vᵀ·(US)ᵀ = φ*φᵀ and φ*VVᵀφ*ᵀ + BBᵀ + C* = φ*φ*ᵀ + C*).

        BoTorch's Matheron sampler draws one base sample per row of the joint covariance and uses the first
        root-width of them, so a root wider than tall must be narrowed.  Only the n* × n* block is factorised (in
        :func:`~rfgp.core.dtypes.factor_dtype`; linear_operator's ``psd_safe_cholesky``, which adds jitter, and
        warns, where BBᵀ is singular: new rows that repeat training rows, as qLogNEI's baseline); the training
        block is the SVD's, exact however ill-conditioned φφᵀ is, and the gradient in φ* stays finite (an SVD of
        the whole root has NaN gradients where singular values repeat).
        """
        left, singular, right = self.thin_svd()
        work = new_features.to(singular.dtype)
        inside = work @ right.mT  # φ*V, (..., n*, N)
        outside = work - inside @ right  # B
        schur = outside @ outside.mT
        if correction is not None:
            schur = schur + torch.diag_embed(correction.clamp_min(0).to(schur))
        schur_root = psd_safe_cholesky(schur)
        top = left * singular.unsqueeze(-2)
        top = torch.cat((top, top.new_zeros(*top.shape[:-1], work.shape[-2])), -1)
        bottom = torch.cat((inside, schur_root), -1)
        root = torch.cat((top.expand(*batch, *top.shape[-2:]), bottom.expand(*batch, *bottom.shape[-2:])), -2)
        return root.to(new_features.dtype)


class ZeroPaddedColumnsLinearOperator(LinearOperator):
    r"""[U, 0] ``(..., N, M)``: the columns U ``(..., N, r)`` followed by M − r implicit zero columns.

    The eigenvectors of φφᵀ (:meth:`DataFeatureRootLinearOperator.diagonalization`) padded to a square matrix as
    BoTorch's ``KroneckerMultiTaskGP.posterior`` pads a partial diagonalization, without the zeros: [U, 0]·M = U·M₁
    (M₁ the first r rows of M) and [U, 0]ᵀ·M = [UᵀM; 0] cost O(N·r) per column; ``to_dense`` forms the N × M
    matrix (one allocation).

    Args:
        columns: U, ``(..., N, r)``.
        num_columns: M ≥ r.
    """

    def __init__(self, columns: Tensor, num_columns: int) -> None:
        if num_columns < columns.shape[-1]:
            raise ValueError(f"num_columns must be at least the {columns.shape[-1]} columns given, got {num_columns}")
        super().__init__(columns, num_columns=num_columns)
        self.columns, self.num_columns = columns, num_columns

    def _size(self) -> torch.Size:
        return torch.Size((*self.columns.shape[:-1], self.num_columns))

    def to_dense(self) -> Tensor:
        return torch.nn.functional.pad(self.columns, (0, self.num_columns - self.columns.shape[-1]))

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.columns @ rhs[..., : self.columns.shape[-1], :]

    def _t_matmul(self, rhs: Tensor) -> Tensor:
        product = self.columns.mT @ rhs
        return torch.nn.functional.pad(product, (0, 0, 0, self.num_columns - self.columns.shape[-1]))

    def _transpose_nonbatch(self) -> LinearOperator:
        return DenseLinearOperator(self.to_dense().mT)

    def _expand_batch(self, batch_shape) -> "ZeroPaddedColumnsLinearOperator":
        return self.__class__(self.columns.expand(*batch_shape, *self.columns.shape[-2:]), self.num_columns)


def _check_cross(cross: LinearOperator, new_features: Tensor, features: Tensor) -> None:
    """Raises if ``cross`` ≠ φ*φᵀ, compared on one fixed probe vector w: ‖Cw − φ*(φᵀw)‖ ≤ √eps·‖φ*‖‖φᵀw‖."""
    with torch.no_grad():
        probe = torch.linspace(-1.0, 1.0, features.shape[-2], dtype=features.dtype, device=features.device)
        projected = features.mT @ probe.unsqueeze(-1)
        expected = new_features @ projected
        error = (cross.matmul(probe.unsqueeze(-1)) - expected).norm()
        scale = new_features.norm() * projected.norm()
        tolerance = torch.finfo(features.dtype).eps ** 0.5 * scale
        if bool(error > tolerance):
            raise ValueError(
                f"cross_mat is not φ*φᵀ for the features of new_mat and of this data covariance (relative "
                f"difference {float(error / scale):.3g} on a probe vector): cat_rows appends the rows of the same "
                "feature map"
            )


class KroneckerRootLinearOperator(FullPrecisionOperator, LinearOperator):
    r"""The interleaved root R = φ ⊗ B ``(..., N·p, F_s·r)`` (row i·p + t, column f·r + k: φ_f(xᵢ)·B[t, k]), formed only
    when asked (``to_dense``, cached).

    The marginal likelihood and the posterior caches of a sketched multitask covariance read its factors
    (:class:`KroneckerStatistics`), so an MLL step under a noise D_N ⊗ Σ_T never forms the N·p × F_s·r matrix;
    every other use (products, rows, the other noises' whitened statistics) takes the dense root.

    Args:
        data_features: φ, ``(..., N, F_s)``.
        task_factor: B, ``(..., p, r)``.
    """

    def __init__(self, data_features: Tensor, task_factor: Tensor) -> None:
        super().__init__(data_features, task_factor)
        self.data_features, self.task_factor = data_features, task_factor

    def _size(self) -> torch.Size:
        batch = torch.broadcast_shapes(self.data_features.shape[:-2], self.task_factor.shape[:-2])
        (points, width), (tasks, task_width) = self.data_features.shape[-2:], self.task_factor.shape[-2:]
        return torch.Size((*batch, points * tasks, width * task_width))

    @cached_per_grad_mode("kronecker_root")
    def to_dense(self) -> Tensor:
        """R, once per grad mode (:mod:`rfgp.core.grad_mode_cache`)."""
        return decomposable_features(self.data_features, self.task_factor).flatten(-3, -2)

    def _dense(self) -> DenseLinearOperator:
        return DenseLinearOperator(self.to_dense())

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.to_dense() @ rhs

    def _t_matmul(self, rhs: Tensor) -> Tensor:
        return self.to_dense().mT @ rhs

    def _transpose_nonbatch(self) -> LinearOperator:
        return DenseLinearOperator(self.to_dense().mT)

    def _expand_batch(self, batch_shape) -> "KroneckerRootLinearOperator":
        return self.__class__(self.data_features.expand(*batch_shape, *self.data_features.shape[-2:]),
                              self.task_factor.expand(*batch_shape, *self.task_factor.shape[-2:]))

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        return self._dense()._getitem(row_index, col_index, *batch_indices)

    def _get_indices(self, row_index, col_index, *batch_indices) -> Tensor:
        return self._dense()._get_indices(row_index, col_index, *batch_indices)


class KroneckerFeatureRootLinearOperator(FeatureRootLinearOperator):
    r"""RRᵀ with R = φ ⊗ Bᵀ interleaved (``(..., N·p, F_s·r)``), whose Kronecker factors are ``linear_ops``.

    The operator is the :class:`~rfgp.inference.operators.FeatureRootLinearOperator` of R (marginal likelihood,
    solves and rfgp's multi-output prediction unchanged); ``linear_ops`` = (φφᵀ, BBᵀ) as
    (:class:`DataFeatureRootLinearOperator`, ``RootLinearOperator``), the factors of
    GPyTorch's K_XX ⊗ K_TT.  Expanded over a batch, scaled by c > 0 or indexed by whole points (a principal block)
    it keeps them; other derived operators are plain feature roots.

    Args:
        root: R, ``(..., N·p, F_s·r)``.
        variance_correction: as for :class:`~rfgp.inference.operators.FeatureRootLinearOperator`.
        data_features: φ, ``(..., N, F_s)``.
        task_factor: B, ``(..., p, r)``, A = BBᵀ.
    """

    def __init__(self, root, variance_correction: Tensor | None = None, data_features: Tensor | None = None,
                 task_factor: Tensor | None = None) -> None:
        root = to_linear_operator(root)
        LinearOperator.__init__(self, root, variance_correction=variance_correction, data_features=data_features,
                                task_factor=task_factor)
        self.root = root
        self.variance_correction = variance_correction
        self.data_features = data_features
        self.task_factor = task_factor

    @property
    def linear_ops(self) -> tuple[LinearOperator, LinearOperator]:
        """(φφᵀ, BBᵀ): K_XX ⊗ K_TT's factors, the data factor cached with its eigendecomposition."""
        if self.data_features is None or self.task_factor is None:
            return super().linear_ops  # raises, saying why
        return self._factors()

    @cached(name="kronecker_factors")
    def _factors(self) -> tuple[LinearOperator, LinearOperator]:
        return DataFeatureRootLinearOperator(self.data_features), RootLinearOperator(self.task_factor)

    def _mul_constant(self, other):
        """c·RRᵀ = (√c·φ ⊗ B)(√c·φ ⊗ B)ᵀ for c > 0 (``ScaleKernel`` around the multitask kernel): the root carries √c
        as for any feature root, and the factors stay, the data factor √c·φ."""
        scaled = super()._mul_constant(other)
        if type(scaled) is not type(self) or self.data_features is None or self.task_factor is None:
            return scaled
        features = self.data_features
        root_constant = torch.as_tensor(other, dtype=features.dtype, device=features.device).sqrt()
        root_constant = root_constant.unsqueeze(-1).unsqueeze(-1) if root_constant.dim() else root_constant
        return type(self)(scaled.root, scaled.variance_correction, features * root_constant, self.task_factor)

    def _expand_batch(self, batch_shape) -> FeatureRootLinearOperator:
        """The same covariance over ``batch_shape`` (a mean or likelihood with a batch of its own: linear_operator's
        sums expand their terms), its factors φ and B expanded without copying, so that the Kronecker statistics
        stay (a plain expanded root took the whitened root's O(N·T·F²·m²) statistics)."""
        expanded = super()._expand_batch(batch_shape)
        if self.data_features is None or self.task_factor is None:
            return expanded
        data, task = self.data_features, self.task_factor
        return type(self)(expanded.root, expanded.variance_correction, data.expand(*batch_shape, *data.shape[-2:]),
                          task.expand(*batch_shape, *task.shape[-2:]))

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """A principal block whose rows are whole points (all T rows of each, a slice of step 1 over every batch
        member: the training block of an eagerly evaluated joint covariance) keeps its factors φ[points] and B;
        other blocks are plain (:meth:`FeatureRootLinearOperator._getitem`)."""
        points = self._whole_points(row_index, col_index, batch_indices)
        if points is None:
            return super()._getitem(row_index, col_index, *batch_indices)
        data, task = self.data_features[..., points, :], self.task_factor
        correction = None if self.variance_correction is None else self.variance_correction[..., row_index]
        return type(self)(KroneckerRootLinearOperator(data, task), correction, data, task)

    def _whole_points(self, row_index, col_index, batch_indices) -> slice | None:
        """The points of a principal block [r, r] whose rows r are whole points (see :meth:`_getitem`), else
        ``None``."""
        if (self.data_features is None or self.task_factor is None or not isinstance(row_index, slice)
                or row_index != col_index or not all(map(_is_noop_index, batch_indices))):
            return None
        return row_points(row_index, self.shape[-1], self.task_factor.shape[-2])

    def __add__(self, other):
        """RRᵀ + noise as rfgp adds it (:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator`,
        :class:`~rfgp.inference.task_noise.FeatureRootAddedTaskNoiseLinearOperator`), whose ``solve`` goes through
        the factors' eigendecompositions where the noise is c·I_N ⊗ Σ_T (:class:`_KroneckerSolve`)."""
        total = super().__add__(other)
        if self.data_features is None or self.task_factor is None:
            return total
        if type(total) is FeatureRootAddedDiagLinearOperator:
            return KroneckerFeatureRootAddedDiagLinearOperator(total._linear_op, total._diag_tensor)
        if type(total) is FeatureRootAddedTaskNoiseLinearOperator:
            return KroneckerFeatureRootAddedTaskNoiseLinearOperator(*total.linear_ops)
        return total


def point_task_noise(noise: LinearOperator, num_tasks: int) -> Tensor | None:
    """Σ_T ``(..., p, p)`` of a noise c·I_N ⊗ Σ_T in GPyTorch's interleaved layout (``MultitaskGaussianLikelihood``
    of any rank: σ²I, c·I_N ⊗ diag(t) or c·I_N ⊗ (LLᵀ + σ²I)); ``None`` for any other noise (per-point noise)."""
    parts = kronecker_noise(noise, num_tasks)
    if parts is None or parts[0].shape[-1] != 1:
        return None
    return parts[0].unsqueeze(-1) * parts[1]


class _KroneckerSolve:
    r"""``solve`` of φφᵀ ⊗ A + I_N ⊗ Σ through the factors' eigendecompositions (Saatçi 2012, §5.3, with Σ whitened).

    With C = chol(Σ), C⁻¹AC⁻ᵀ = WΛWᵀ and T = C⁻ᵀW (so TᵀΣT = I, TᵀAT = Λ), and φφᵀ = U·S²·Uᵀ (thin SVD, cached
    on the data factor):  (φφᵀ ⊗ A + I ⊗ Σ)⁻¹ = (I ⊗ T)(I − (U ⊗ I)·diag(s²λ/(1 + s²λ))·(U ⊗ I)ᵀ)(I ⊗ Tᵀ), the
    complement of U (eigenvalue 0) contributing the identity.  In the interleaved layout a right-hand side is
    an N × p matrix Y per column: Z = YT, Z ← Z − U(D ∘ UᵀZ), X = ZTᵀ — O(N·p·(min(N, F) + p)) per column after the
    O(N·F·min(N, F)) SVD and O(p³) task factors, where Woodbury on the interleaved root costs O(N·p·F²·(rank + p)²)
    per operator (BoTorch's sampler builds a new one per call).  Differentiable in the right-hand side; where the
    operator's own tensors require a gradient (or the noise is not c·I_N ⊗ Σ) the rfgp solve it extends runs.
    """

    def _kronecker_parts(self) -> tuple[KroneckerFeatureRootLinearOperator, LinearOperator]:
        raise NotImplementedError

    def solve(self, right_tensor: Tensor, left_tensor: Tensor | None = None) -> Tensor:
        distributed.refuse("solves with the N·T × N·T training covariance (BoTorch's KroneckerMultiTaskGP posterior, "
                           "Matheron samples)")
        covariance, noise = self._kronecker_parts()
        data, task = covariance.linear_ops
        task_noise = point_task_noise(noise, task.shape[-1])
        tensors = (covariance.data_features, covariance.task_factor, *(() if task_noise is None else (task_noise,)))
        rows = right_tensor.shape[-1 if right_tensor.dim() == 1 else -2]
        if (task_noise is None or rows != self.shape[-1]  # the solve it extends names a wrong shape
                or (torch.is_grad_enabled() and any(t.requires_grad for t in tensors))):
            return super().solve(right_tensor, left_tensor)
        evals, evecs = data.range_eigenpairs()
        work = evals.dtype
        chol = torch.linalg.cholesky(task_noise.to(work))
        task_covar = covariance.task_factor.to(work)
        task_covar = task_covar @ task_covar.mT
        whitened = torch.linalg.solve_triangular(chol, task_covar, upper=False)
        whitened = torch.linalg.solve_triangular(chol, whitened.mT, upper=False)
        task_evals, task_evecs = torch.linalg.eigh(whitened)
        transform = torch.linalg.solve_triangular(chol.mT, task_evecs, upper=True)  # T = C⁻ᵀW
        scaled = evals.unsqueeze(-1) * task_evals.clamp(min=0).unsqueeze(-2)  # (..., r, p)
        shrink = scaled / (1 + scaled)
        vector = right_tensor.dim() == 1
        rhs = right_tensor.unsqueeze(-1) if vector else right_tensor
        blocks = rhs.to(work).unflatten(-2, (-1, task.shape[-1]))  # (..., N, p, k)
        rotated = torch.einsum("...npk,...pq->...nqk", blocks, transform)
        projected = torch.einsum("...nr,...nqk->...rqk", evecs, rotated)
        rotated = rotated - torch.einsum("...nr,...rqk->...nqk", evecs, shrink.unsqueeze(-1) * projected)
        result = torch.einsum("...nqk,...pq->...npk", rotated, transform).flatten(-3, -2).to(self.dtype)
        result = result.squeeze(-1) if vector else result
        return result if left_tensor is None else left_tensor @ result


class KroneckerStatistics:
    r"""The marginal likelihood and the posterior's capacitance statistics of (φ ⊗ B)(φ ⊗ B)ᵀ + D_N ⊗ Σ_T from the
    factors (:mod:`rfgp.inference.kronecker_statistics`): O(N·F² + F²·m²) instead of O(N·T·F²·m²).  Other noises,
    and the kernel-space path where it is cheaper, take the algebra of the operator it extends.

    A mixin: the operator gives :meth:`_kronecker_parts` (the covariance, whose ``data_features`` φ — a tensor or
    :class:`~rfgp.inference.kronecker_statistics.ChunkedDataFeatures` — and ``task_factor`` B it reads, and the
    noise) and :meth:`_task_cholesky`."""

    def _kronecker_parts(self) -> tuple[LinearOperator, LinearOperator]:
        raise NotImplementedError

    def _task_cholesky(self, task_noise: Tensor) -> Tensor:
        raise NotImplementedError

    def _kronecker_noise(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """(φ, d, B, Σ_T) where the covariance carries its factors and the noise is D_N ⊗ Σ_T, else ``None``."""
        covariance, noise = self._kronecker_parts()
        if getattr(covariance, "task_factor", None) is None:  # also a plain operator derived from a Kronecker one
            return None
        parts = kronecker_noise(noise, covariance.task_factor.shape[-2])
        if parts is None or covariance.data_features is None:  # the noise first: a chunked φ is formed on request
            return None
        return covariance.data_features, parts[0], covariance.task_factor, parts[1]

    def uses_kernel_space(self, *args) -> bool:
        """Whether the N·T × N·T path is cheaper than the capacitance with Kronecker statistics
        (:func:`~rfgp.inference.kronecker_statistics.prefers_kernel_space_kronecker`), where they apply."""
        return self._kernel_space_given(self._kronecker_noise(), *args)

    def _kernel_space_given(self, parts, *args) -> bool:
        """:meth:`uses_kernel_space` for the factors ``parts`` of :meth:`_kronecker_noise`."""
        if parts is None or distributed.is_active():
            return super().uses_kernel_space(*args)
        data, point_noise, task, _ = parts
        batches = statistics_batches(data, point_noise, task, self.batch_shape)
        return prefers_kernel_space_kronecker(data.shape[-2], task.shape[-2], data.shape[-1], task.shape[-1], *batches)

    def _statistics_parts(self) -> tuple[Tensor, Tensor, Tensor, Tensor] | None:
        """:meth:`_kronecker_noise`'s (φ, d, B, Σ_T) where the factors' statistics apply (not the kernel-space path)."""
        parts = self._kronecker_noise()
        return None if parts is None or self._kernel_space_given(parts) else parts

    def kronecker_statistics(self, rhs: Tensor) -> tuple[Tensor, Tensor, Tensor, torch.dtype] | None:
        """(Φ̃ᵀΦ̃, Φ̃ᵀr̃, r̃ᵀr̃, dtype) for interleaved residuals ``(..., N·T, k)`` from the factors
        (:func:`~rfgp.inference.kronecker_statistics.kronecker_statistics`), ``None`` where they do not apply (noise
        not D_N ⊗ Σ_T, no factors, or the kernel-space path is cheaper)."""
        parts = self._statistics_parts()
        if parts is None:
            return None
        data, point_noise, task, task_noise = parts
        return kronecker_statistics(data, check_noise(point_noise).reciprocal(), task, self._task_cholesky(task_noise),
                                    rhs)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        rhs = _as_matrix(inv_quad_rhs)
        rows = self.shape[-1]
        parts = None if rhs is not None and rhs.shape[-2] != rows else self._statistics_parts()
        if parts is None:
            return super().inv_quad_logdet(inv_quad_rhs, logdet, reduce_inv_quad)
        check_targets(inv_quad_rhs, point_axis=-2, allow_empty=distributed.is_active())
        data, point_noise, task, task_noise = parts
        point_noise, chol = check_noise(point_noise), self._task_cholesky(task_noise)
        stats_rhs = rhs if rhs is not None else task.new_zeros(*self.batch_shape, rows, 0)
        gram, cross, weighted_square, dtype = kronecker_statistics(data, point_noise.reciprocal(), task, chol,
                                                                   stats_rhs)
        noise_logdet = kronecker_noise_logdet(point_noise, chol, rows // task.shape[-2]) if logdet else None
        inv_quad, logdet_term = woodbury_inv_quad_logdet(gram, cross, None if rhs is None else weighted_square,
                                                         noise_logdet, logdet, point_noise.detach(), dtype=dtype)
        return _finish_inv_quad_logdet(inv_quad, logdet_term, reduce_inv_quad, gram.new_empty(0, dtype=dtype))


class DiagonalNoiseKroneckerStatistics(KroneckerStatistics):
    """:class:`KroneckerStatistics` of a covariance plus a diagonal noise (``_linear_op`` + ``_diag_tensor``, rfgp's
    feature roots plus a ``DiagLinearOperator``): Σ_T = diag(t), its Cholesky factor the square roots."""

    def _kronecker_parts(self):
        return self._linear_op, self._diag_tensor

    def _task_cholesky(self, task_noise: Tensor) -> Tensor:
        return diagonal_task_cholesky(task_noise)


class TaskNoiseKroneckerStatistics(KroneckerStatistics):
    """:class:`KroneckerStatistics` of a covariance plus a task noise D_N ⊗ Σ_T (``feature_operator`` +
    ``task_noise``, :class:`~rfgp.inference.task_noise.FeatureRootAddedTaskNoiseLinearOperator` and its chunked
    counterpart), Σ_T's Cholesky factor the operator's cached one (a singular Σ_T is refused by name)."""

    def _kronecker_parts(self):
        return self.feature_operator, self.task_noise

    def _task_cholesky(self, task_noise: Tensor) -> Tensor:
        return self._factors()[1]


class KroneckerFeatureRootAddedDiagLinearOperator(DiagonalNoiseKroneckerStatistics, _KroneckerSolve,
                                                  FeatureRootAddedDiagLinearOperator):
    """RRᵀ + D of a :class:`KroneckerFeatureRootLinearOperator` (diagonal noise), solved as :class:`_KroneckerSolve`
    where D = c·I_N ⊗ diag(t), its marginal likelihood and capacitance statistics from the factors where
    D = D_N ⊗ diag(t) (:class:`KroneckerStatistics`)."""


class KroneckerFeatureRootAddedTaskNoiseLinearOperator(TaskNoiseKroneckerStatistics, _KroneckerSolve,
                                                       FeatureRootAddedTaskNoiseLinearOperator):
    """RRᵀ + D_N ⊗ Σ_T of a :class:`KroneckerFeatureRootLinearOperator` (correlated task noise), solved as
    :class:`_KroneckerSolve`, its marginal likelihood and capacitance statistics from the factors
    (:class:`KroneckerStatistics`)."""


__all__ = [
    "DataFeatureRootLinearOperator",
    "DiagonalNoiseKroneckerStatistics",
    "KroneckerFeatureRootAddedDiagLinearOperator",
    "KroneckerFeatureRootAddedTaskNoiseLinearOperator",
    "KroneckerFeatureRootLinearOperator",
    "KroneckerRootLinearOperator",
    "KroneckerStatistics",
    "TaskNoiseKroneckerStatistics",
    "ZeroPaddedColumnsLinearOperator",
    "point_task_noise",
]
