"""Low-rank LinearOperators that keep Φ factored from the kernel to the solve.

* :class:`FeatureRootLinearOperator` — K̂ = ΦΦᵀ, optionally carrying the per-point
  variance correction k(x, x) − E[k̂(x, x)] that the prediction strategy adds to the
  posterior variance.  ``ScaleKernel`` scaling and sums of such operators stay in
  this form.
* :class:`FeatureRootAddedDiagLinearOperator` — ΦΦᵀ + D, produced when a Gaussian
  likelihood adds its noise.  ``inv_quad_logdet`` (the marginal-likelihood hot path)
  runs in O(N·F² + F³) time through the capacitance matrix A = I + ΦᵀD⁻¹Φ
  (Woodbury identity and the matrix determinant lemma), with the lean Gram backward
  of :func:`rfgp.inference.linalg.feature_statistics` (of
  :func:`rfgp.inference.triangular_statistics.triangular_statistics` for a Nyström root Φ = K·L⁻ᵀ,
  :class:`~rfgp.inference.triangular_statistics.TriangularFeatures`); when the N × N matrix is cheaper by flop count
  (always when N ≤ F) it runs in O(N²·F + N³) through :mod:`rfgp.inference.kernel_space` instead.
* :class:`ChunkedFeatureRootLinearOperator` / :class:`ChunkedFeatureRootAddedDiagLinearOperator`
  — the same matrices when Φ does not fit :class:`rfgp.settings.memory_budget`: they
  hold x and the feature function instead of Φ and evaluate the feature statistics
  ΦᵀD⁻¹Φ and ΦᵀD⁻¹r chunk by chunk (:mod:`rfgp.inference.chunking`), so that the MLL, its
  gradients and the posterior caches need O(chunk·F + F²) memory.
* :class:`ChunkedFeatureCrossLinearOperator` — Φ(x₁)Φ(x₂)ᵀ without materialising either Φ
  (the test–train covariance that GPyTorch builds at prediction time).

Inside :class:`rfgp.inference.distributed.data_parallel` the statistics are summed over processes.
"""

from __future__ import annotations

import math
from collections.abc import Iterator

import torch
from linear_operator import to_linear_operator
from linear_operator.operators import (
    AddedDiagLinearOperator,
    ConstantDiagLinearOperator,
    ConstantMulLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    MaskedLinearOperator,
)
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from torch import Tensor

from ..core.batch_copies import distinct_members, narrow_broadcast
from ..core.draws import standard_normal
from ..core.dtypes import FullPrecisionOperator, factor_dtype
from ..core.grad_mode_cache import cached_per_grad_mode
from ..core.memory import warn_statistics_over_budget
from ..core.validation import check_finite, check_noise, check_targets
from . import distributed
from .chunking import (
    Featurizer,
    backprop_chunks,
    chunk_slices,
    chunked_feature_statistics,
)
from .kernel_evaluation import evaluated_covariance
from .kernel_space import kernel_space_inv_quad_logdet, prefers_kernel_space
from .linalg import (
    diagonal_logdet,
    feature_statistics,
    fold_constant,
    project,
    scales_root,
    squared_row_norms,
    woodbury_inv_quad_logdet,
)
from .statistics_precision import statistics_dtype, weighted_square_norm
from .triangular_statistics import TriangularFeatures, TriangularFeaturizer, chunked_triangular_statistics


class _NoKroneckerFactors:
    """A feature-root covariance asked for Kronecker factors (``linear_ops``) raises an error that says why.

    Code written for GPyTorch's ``MultitaskKernel`` may take the training covariance K_XX ⊗ K_TT
    apart (BoTorch's ``KroneckerMultiTaskGP.posterior`` reads ``train_full_covar.linear_ops[0]``).  The training
    covariance of a sketched ``MultitaskKernel`` has them
    (:class:`~rfgp.inference.kronecker_tasks.KroneckerFeatureRootLinearOperator`); other feature roots do not, and
    without this property the caller would fail on a bare ``AttributeError``.  An ``AttributeError`` still, so
    ``hasattr(op, "linear_ops")`` stays ``False``.
    """

    @property
    def linear_ops(self):
        raise AttributeError(
            f"{type(self).__name__} (an rfgp feature-root covariance ΦΦᵀ) has no Kronecker factors (linear_ops): the "
            "caller expects GPyTorch's MultitaskKernel covariance K_XX ⊗ K_TT, as BoTorch's KroneckerMultiTaskGP."
            "posterior does. rfgp hands them over for the training covariance of a sketched MultitaskKernel "
            "(rfgp.sketch of it, or rfgp.kernels.SketchedDecomposableKernel) whose features are materialised; this "
            "covariance is not one (another kernel, features chunked under rfgp.settings.memory_budget, or an "
            "operator derived from one). Use a model whose posterior is GPyTorch's: BoTorch's MultiTaskGP (a task "
            "column), or a GPyTorch ExactGP returning MultitaskMultivariateNormal (rfgp.models.MultiOutputGPModel)"
        )


def _expanded_correction(correction: Tensor | None, batch_shape) -> Tensor | None:
    """A variance correction ``(..., n)`` expanded to ``batch_shape`` without copying (``None`` stays ``None``)."""
    return None if correction is None else correction.expand(*batch_shape, correction.shape[-1])


class FeatureRootLinearOperator(FullPrecisionOperator, _NoKroneckerFactors, LowRankRootLinearOperator):
    """ΦΦᵀ for a feature matrix Φ of shape ``(..., n, F)``.

    A positive constant s (``ScaleKernel``'s outputscale) is carried by the root as
    Φ = √s·Φ₀ (a ``ConstantMulLinearOperator``), not multiplied into the N × F features:
    the feature statistics fold it into their weights.

    Args:
        root: the features Φ (a tensor, or √s times one).
        variance_correction: optional ``(..., n)`` tensor k(x, x) − E[Φ(x)ᵀΦ(x)].
    """

    def __init__(self, root: Tensor, variance_correction: Tensor | None = None) -> None:
        root = to_linear_operator(root)
        # LinearOperator keeps the keyword so that operator copies (representation trees,
        # detach, device moves) carry the correction along.
        LinearOperator.__init__(self, root, variance_correction=variance_correction)
        self.root = root
        self.variance_correction = variance_correction

    def scaled_root(self) -> tuple[LinearOperator, Tensor | None]:
        """(Φ₀, c) with Φ = c·Φ₀, Φ₀ as an operator; c (batch-shaped or scalar) is ``None`` when the root carries
        no constant."""
        if isinstance(self.root, ConstantMulLinearOperator):
            return self.root.base_linear_op, self.root._constant
        return self.root, None

    def scaled_features(self) -> tuple[Tensor, Tensor | None]:
        """(Φ₀, c) with Φ = c·Φ₀ and Φ₀ a tensor, see :meth:`scaled_root`."""
        root, constant = self.scaled_root()
        return root.to_dense(), constant

    def feature_statistics(self, weights: Tensor, rhs: Tensor, adaptive_precision: bool = False,
                           model_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """(ΦᵀWΦ, ΦᵀWR) for diagonal weights ``(..., N)`` (or uniform ``(..., 1)``) and R ``(..., N, t)``.

        A root Φ₀ = K·L⁻ᵀ (:class:`~rfgp.inference.triangular_statistics.TriangularFeatures`, Nyström) takes the
        backward fused through its triangular solve.  Statistics that alone exceed
        :class:`rfgp.settings.memory_budget` warn (:func:`~rfgp.core.memory.warn_statistics_over_budget`).
        ``adaptive_precision``: float32 features form the statistics in
        float64 (and return them so) where their float32 rounding would not be negligible
        (:func:`~rfgp.inference.statistics_precision.statistics_dtype`; the casts are differentiable, gradients
        reach Φ — or a Nyström root's K and L — in its own dtype).  ``model_dtype``: the dtype decided about, where the
        weights and R come already widened (:func:`adaptive_feature_statistics`; default: theirs and Φ's).
        """
        root, constant = self.scaled_root()
        features = root.features if isinstance(root, TriangularFeatures) else root.to_dense()
        gradient = torch.is_grad_enabled() and any(torch.is_tensor(t) and t.requires_grad
                                                   for t in (features, weights, constant))
        warn_statistics_over_budget(torch.broadcast_shapes(features.shape[:-2], weights.shape[:-1]).numel(),
                                    features.shape[-1], features.dtype, features.device, gradient)
        if adaptive_precision:
            def trace() -> Tensor:
                scaled = fold_constant(constant, weights, rhs[..., :0])[0]
                return distributed.reduce_statistics(weighted_square_norm(features, scaled))[0]

            decided = torch.promote_types(features.dtype, weights.dtype) if model_dtype is None else model_dtype
            work = statistics_dtype(decided, features.device, trace)
            # c folded in the statistics' precision: c²W and R/c rounded to float32 would scale B = Φ₀ᵀ(c²W)(R/c)
            # by up to 2u, which rᵀD⁻¹r − ‖L⁻¹B‖² (formed from the unfolded W and R) amplifies at a high
            # signal-to-noise ratio (N = 3 000, outputscale 0.69, noise 10⁻⁴, y ≈ 5: 17 of 3 412 in rᵀ(K + D)⁻¹r)
            weights, rhs = fold_constant(constant.to(work) if torch.is_tensor(constant) else constant,
                                         weights.to(work), rhs.to(work))
            if isinstance(root, TriangularFeatures):
                root = TriangularFeatures(features.to(work), root.cross.to(work), root.chol.to(work))
            else:  # Φ is cast one row block at a time, not copied whole
                return feature_statistics(features, weights, rhs, dtype=work)
        else:
            weights, rhs = fold_constant(constant, weights, rhs)
        if isinstance(root, TriangularFeatures):
            return root.feature_statistics(weights, rhs)
        return feature_statistics(features, weights, rhs)

    def statistics_dtype(self, weights: Tensor) -> torch.dtype:
        """The dtype of :meth:`feature_statistics` without ``adaptive_precision``: Φ's, √c's and the weights'."""
        root, constant = self.scaled_root()
        dtype = torch.promote_types(root.dtype, weights.dtype)
        return torch.promote_types(dtype, constant.dtype) if torch.is_tensor(constant) else dtype

    def features(self) -> Tensor:
        """Φ, ``(..., N, F)``."""
        return self.root.to_dense()

    def select_rows(self, observed: Tensor) -> "FeatureRootLinearOperator":
        """Φ[observed]Φ[observed]ᵀ for a boolean mask ``(N,)``: the covariance of the observed points only.

        Used under ``gpytorch.settings.observation_nan_policy("mask")`` (:func:`select_observed`).  The
        constant and a Nyström root's factors K and L stay factored (K loses the rows, L is kept).
        """
        root, constant = self.scaled_root()
        if isinstance(root, TriangularFeatures):
            root = TriangularFeatures(root.features[..., observed, :], root.cross[..., observed, :], root.chol)
        else:
            root = to_linear_operator(root.to_dense()[..., observed, :])
        if constant is not None:
            root = ConstantMulLinearOperator(root, constant)
        correction = None if self.variance_correction is None else self.variance_correction[..., observed]
        return self.__class__(root, correction)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """A principal block Φ[I]Φ[I]ᵀ keeps the correction of its rows; other blocks are linear_operator's.

        linear_operator's ``RootLinearOperator._getitem`` rebuilt the block without it, and ``ExactGP`` takes its
        test covariance as the block ``[n:, n:]`` of the joint one when the kernels are evaluated eagerly
        (``gpytorch.settings.lazily_evaluate_kernels(False)``): a biased map's posterior variance lost its correction.
        """
        block = super()._getitem(row_index, col_index, *batch_indices)
        if self.variance_correction is None or not isinstance(block, FeatureRootLinearOperator):
            return block
        correction = self.variance_correction.expand(*self.batch_shape, self.shape[-1])
        return self.__class__(block.root, correction[(*batch_indices, row_index)])

    def _expand_batch(self, batch_shape) -> "FeatureRootLinearOperator":
        """The same operator over ``batch_shape``: Φ and the correction expanded without copying (linear_operator's
        version rebuilt the operator from the root alone, dropping the variance correction)."""
        return self.__class__(self.root._expand_batch(batch_shape),
                              _expanded_correction(self.variance_correction, batch_shape))

    @cached_per_grad_mode("dense")
    def to_dense(self) -> Tensor:
        """ΦΦᵀ, the Gram of each distinct batch member once: the members of an expanded Φ (stride 0, see
        :mod:`rfgp.core.batch_copies`) share one, expanded to the batch.  Cached once per grad mode
        (:mod:`rfgp.core.grad_mode_cache`; linear_operator's ``RootLinearOperator`` caches one for both)."""
        base, constant = self.scaled_root()
        features = narrow_broadcast(base.to_dense(), base.dim() - 2)
        if constant is not None:
            features = features * narrow_broadcast(constant, constant.dim())[..., None, None]
        return (features @ features.mT).expand(self.shape)

    def _matmul(self, rhs: Tensor) -> Tensor:
        """ΦΦᵀR in the cheaper of its two exact orders: Φ(ΦᵀR) costs 2·N·F·k flops, (ΦΦᵀ)R costs N²·(F + k).

        Generic linear_operator algebra multiplies through here (a Kronecker product's dense form and its autograd
        derivative: BoTorch's HigherOrderGP trains with GPyTorch's dense log-prob, multiplying its data covariance by
        k = N·(outputs) columns), so with N ≪ F the N × N Gram is formed first (HigherOrderGP, N = 40, 3 × 4
        outputs, F = 4096: 1.86 s → 0.19 s per MLL and gradient; the exact kernel's 0.10 s).
        """
        num_data, num_features = self.root.shape[-2:]
        columns = rhs.shape[-1] if rhs.dim() > 1 else 1
        if num_data * num_data * (num_features + columns) < 2 * num_data * num_features * columns:
            features = self.root.to_dense()
            return (features @ features.mT) @ rhs
        return super()._matmul(rhs)

    def _mul_constant(self, other):
        if not scales_root(other):
            return super()._mul_constant(other)
        base, constant = self.scaled_root()  # the base root stays an operator (a TriangularFeatures keeps K and L)
        root_constant = torch.as_tensor(other, dtype=base.dtype, device=base.device).sqrt()
        if constant is not None:
            root_constant = constant * root_constant
        root = ConstantMulLinearOperator(base, root_constant)
        return self.__class__(root, scaled_correction(self.variance_correction, other))

    def _mul_matrix(self, other):
        """K̂ ∘ B, a feature root when B has a small exact root (:mod:`rfgp.inference.elementwise_product`), or
        scaled per batch member when B is a batch of constants (:func:`batch_constants`)."""
        from .elementwise_product import face_splitting_product  # imports this module

        constants = batch_constants(self, other)
        if constants is not None:
            return self._expand_batch(constants.shape)._mul_constant(constants)
        return face_splitting_product(self, evaluated_covariance(other))

    def __add__(self, other):
        from .task_noise import FeatureRootAddedTaskNoiseLinearOperator, is_interleaved_task_noise  # imports this

        if isinstance(other, DiagLinearOperator):
            return FeatureRootAddedDiagLinearOperator(self, other)
        if is_interleaved_task_noise(other):
            return FeatureRootAddedTaskNoiseLinearOperator(self, other)
        if isinstance(other, FeatureRootLinearOperator):
            left, right = self.root.to_dense(), other.root.to_dense()
            batch = torch.broadcast_shapes(left.shape[:-2], right.shape[:-2])
            root = torch.cat((left.expand(*batch, *left.shape[-2:]), right.expand(*batch, *right.shape[-2:])), -1)
            return self.__class__(root, _add_optional(self.variance_correction, other.variance_correction))
        return super().__add__(other)


def noise_weights(noise: DiagLinearOperator) -> Tensor:
    """D⁻¹ of a noise operator: ``(..., N)``, or ``(..., 1)`` for a homoscedastic (constant) diagonal."""
    if isinstance(noise, ConstantDiagLinearOperator):
        return check_noise(noise.diag_values).reciprocal()
    return check_noise(noise.diagonal(dim1=-1, dim2=-2)).reciprocal()


def select_noise(noise: DiagLinearOperator, observed: Tensor) -> DiagLinearOperator:
    """The noise diagonal restricted to the points where the boolean mask ``(N,)`` is ``True``."""
    if isinstance(noise, ConstantDiagLinearOperator):
        return ConstantDiagLinearOperator(noise.diag_values, diag_shape=int(observed.sum()))
    return DiagLinearOperator(noise.diagonal(dim1=-1, dim2=-2)[..., observed])


def select_observed(covar: LinearOperator) -> LinearOperator | None:
    """An rfgp noise-added operator for GPyTorch's masked covariance, ``None`` if ``covar`` is not one.

    Under ``gpytorch.settings.observation_nan_policy("mask")`` GPyTorch's ``ExactMarginalLogLikelihood``
    (and ``GaussianLikelihood.log_marginal``) wrap the noise-added training covariance in a
    ``MaskedLinearOperator`` that drops the rows and columns of NaN targets.  That wrapper has no
    feature-space algebra: its log density would fall back to a dense N × N Cholesky factor or, above
    ``max_cholesky_size`` with ``fast_computations`` on, to stochastic CG/Lanczos estimates.  The same
    matrix is the noise-added feature operator of the observed rows (Φ and D with those rows removed),
    whose ``inv_quad_logdet`` is exact and O(N·F² + F³) (or kernel-space) again.
    """
    if not isinstance(covar, MaskedLinearOperator) or not covar.row_eq_col_mask or covar.row_mask.dim() != 1:
        return None
    base = evaluated_covariance(covar.base)
    from .independent_tasks import IndependentTasksAddedDiagLinearOperator  # imports this module
    from .task_noise import FeatureRootAddedTaskNoiseLinearOperator  # imports this module

    if not isinstance(base, (FeatureRootAddedDiagLinearOperator, ChunkedFeatureRootAddedDiagLinearOperator,
                             FeatureRootAddedTaskNoiseLinearOperator, IndependentTasksAddedDiagLinearOperator)):
        return None
    return base.select_rows(covar.row_mask)


def _add_optional(a: Tensor | None, b: Tensor | None) -> Tensor | None:
    if a is None:
        return b
    return a if b is None else a + b


class FeatureRootAddedDiagLinearOperator(FullPrecisionOperator, LowRankRootAddedDiagLinearOperator):
    """ΦΦᵀ + D with a feature-space marginal-likelihood path.

    GPyTorch builds it when a Gaussian likelihood adds its noise D to an rfgp kernel's
    :class:`FeatureRootLinearOperator` (``likelihood(model(x))``); users rarely construct it.
    ``inv_quad_logdet`` — the marginal likelihood's hot path — uses the capacitance
    A = I + ΦᵀD⁻¹Φ (F × F), by the Woodbury identity and the matrix determinant lemma::

        rᵀ(ΦΦᵀ + D)⁻¹r = rᵀD⁻¹r − bᵀA⁻¹b,  b = ΦᵀD⁻¹r,
        log|ΦΦᵀ + D| = log|A| + Σᵢ log dᵢ,

    in O(N·F² + F³); when the N × N matrix is cheaper by flop count (always when N ≤ F,
    :meth:`uses_kernel_space`) it factorises ΦΦᵀ + D in O(N²·F + N³) instead.

    Args:
        linear_ops: the root operator ΦΦᵀ (:class:`FeatureRootLinearOperator`) and the noise D
            (a ``DiagLinearOperator``), in that order, as GPyTorch's ``AddedDiagLinearOperator`` takes them.
        preconditioner_override: linear_operator's preconditioner hook for iterative solves, passed on
            to ``AddedDiagLinearOperator`` unchanged.

    Example:
        >>> import torch, rfgp
        >>> from linear_operator.operators import DiagLinearOperator
        >>> phi = torch.randn(6, 4, dtype=torch.float64)
        >>> noise = torch.full((6,), 0.1, dtype=torch.float64)
        >>> covar = rfgp.FeatureRootAddedDiagLinearOperator(
        ...     rfgp.FeatureRootLinearOperator(phi), DiagLinearOperator(noise))
        >>> r = torch.randn(6, 1, dtype=torch.float64)
        >>> inv_quad, logdet = covar.inv_quad_logdet(r, logdet=True)
        >>> dense = phi @ phi.T + torch.diag(noise)
        >>> bool(torch.allclose(inv_quad, (r.T @ torch.linalg.solve(dense, r)).squeeze()))
        True
        >>> bool(torch.allclose(logdet, torch.logdet(dense)))
        True
    """

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return self.__class__(self._linear_op, self._diag_tensor + other)
        return super().__add__(other)

    def select_rows(self, observed: Tensor) -> "FeatureRootAddedDiagLinearOperator":
        """Φ[o]Φ[o]ᵀ + D[o] for a boolean mask o ``(N,)`` (see :func:`select_observed`).

        A plain noise-added operator: structure tied to all N rows (the Dirichlet classifier's label
        blocks) is dropped, the generic feature-space algebra gives the same values.
        """
        return FeatureRootAddedDiagLinearOperator(self._linear_op.select_rows(observed),
                                                  select_noise(self._diag_tensor, observed))

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        check_targets(inv_quad_rhs, point_axis=-2, allow_empty=distributed.is_active())
        if self.uses_kernel_space():
            features, constant = self._linear_op.scaled_features()
            features = narrow_broadcast(features, features.dim() - 2)  # one Gram for copies (T targets of one kernel)
            noise = check_noise(self._diag_tensor.diagonal(dim1=-1, dim2=-2))
            scale = None if constant is None else constant**2
            inv_quad, logdet_term = kernel_space_inv_quad_logdet(
                features, noise, _as_matrix(inv_quad_rhs), logdet, scale
            )
            return _finish_inv_quad_logdet(inv_quad, logdet_term, reduce_inv_quad, features)
        return _statistics_inv_quad_logdet(self, inv_quad_rhs, logdet, reduce_inv_quad)

    def uses_kernel_space(self, statistics_batch: int | None = None) -> bool:
        """Whether the N × N path (:mod:`rfgp.inference.kernel_space`) is cheaper than the F × F capacitance.

        ``statistics_batch``: F × F statistics the feature path would form (default: one per distinct Φ for
        homoscedastic noise, else one per batch member).  A Φ expanded to a batch (stride 0: T targets of one kernel)
        counts once, as both paths form its Gram once (:func:`~rfgp.core.batch_copies.narrow_broadcast`); counted per
        copy, 8 copies of Φ (N = 600, F = 512) under per-point noise took the F × F path at twice the N × N path's
        flops (an MLL with gradient: 0.72 s against 0.35 s, float64, one thread).  Never inside
        :class:`rfgp.inference.distributed.data_parallel`, whose statistics are sums over each process's points.
        """
        if distributed.is_active():
            return False
        root = self._linear_op.root
        feature_batch, solve_batch = _distinct_members(self._linear_op), math.prod(self.batch_shape)
        if statistics_batch is None:
            uniform = isinstance(self._diag_tensor, ConstantDiagLinearOperator)
            statistics_batch = feature_batch if uniform else solve_batch
        return prefers_kernel_space(root.shape[-2], root.shape[-1], feature_batch, solve_batch, statistics_batch)


def _distinct_members(operator: FeatureRootLinearOperator) -> int:
    """The number of distinct batch members of a feature root's Φ₀ (:meth:`FeatureRootLinearOperator.scaled_root`):
    its batch size less the stride-0 copies of a materialised Φ₀; every member of other roots."""
    base = operator.scaled_root()[0]
    if not isinstance(base, DenseLinearOperator):
        return math.prod(base.shape[:-2])
    return distinct_members(base.tensor, base.tensor.dim() - 2)


def _as_matrix(rhs: Tensor | None) -> Tensor | None:
    return rhs.unsqueeze(-1) if rhs is not None and rhs.dim() == 1 else rhs


def _finish_inv_quad_logdet(inv_quad, logdet_term, reduce_inv_quad, like: Tensor):
    if inv_quad is not None and reduce_inv_quad:
        inv_quad = inv_quad.sum(-1)
    if inv_quad is None:
        inv_quad = torch.zeros(0, dtype=like.dtype, device=like.device)
    if logdet_term is None:
        logdet_term = torch.zeros(0, dtype=like.dtype, device=like.device)
    return inv_quad, logdet_term


def adaptive_feature_statistics(linear_op, weights: Tensor, rhs: Tensor,
                                model_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor, torch.dtype | None]:
    """(ΦᵀWΦ, ΦᵀWR, dtype) of a feature-root operator, with float32 features' statistics formed in float64 where their
    float32 rounding would not be negligible (:mod:`rfgp.inference.statistics_precision`): a materialised or chunked
    Φ (:class:`FeatureRootLinearOperator`, :class:`ChunkedFeatureRootLinearOperator`, the chunked multi-output roots
    of :mod:`rfgp.inference.multioutput_chunking`: the operators with a ``statistics_dtype``, Nyström roots
    included).  ``dtype``: the dtype the statistics would have had, to round the results derived from them
    back to (``None`` where nothing changed).  ``model_dtype``: that dtype, where the caller hands W and R already
    widened (:func:`widened_statistics_inputs`; default: ``linear_op.statistics_dtype(weights)``)."""
    if not hasattr(linear_op, "statistics_dtype"):  # the chunked multi-output roots have it too
        return (*linear_op.feature_statistics(weights, rhs), None)
    dtype = linear_op.statistics_dtype(weights) if model_dtype is None else model_dtype
    return (*linear_op.feature_statistics(weights, rhs, adaptive_precision=True, model_dtype=model_dtype), dtype)


def widened_statistics_inputs(linear_op, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor, torch.dtype | None]:
    """(W, R, model dtype): the weights and right-hand side of a feature-root operator's statistics cast once to
    :func:`~rfgp.core.dtypes.factor_dtype` (float64 for a float32 model; unchanged, with dtype ``None``, where that
    is their own or the operator has no adaptive precision), for :func:`adaptive_feature_statistics` and every other
    term formed from them.

    The marginal likelihood uses W and R beside the statistics — rᵀD⁻¹r and log|D| — and these terms cancel against
    the statistics' at a high signal-to-noise ratio (rᵀD⁻¹r − ‖L⁻¹B‖²; ∂/∂w of rᵀD⁻¹r and of BᵀA⁻¹B are both about
    ‖r‖², their sum the residual's ‖r − Φα‖²).  Cast to float64 separately for each use, each term's gradient was
    rounded to float32 before they were added: a float32 model whose statistics were float64 had its noise gradient
    up to 21 % and its mean's 0.35 % off the float64 model's (N = 500, F = 256, noise 10⁻⁴).  Cast once, the
    gradients meet in float64 and are rounded once.  The values are the model's (float32 W and R widened exactly), so
    statistics kept in float32 see the same W and R as rᵀD⁻¹r, which is now summed in float64."""
    if not hasattr(linear_op, "statistics_dtype"):
        return weights, rhs, None
    dtype = linear_op.statistics_dtype(weights)
    wide = factor_dtype(torch.promote_types(dtype, rhs.dtype), weights.device)
    if wide == torch.promote_types(dtype, rhs.dtype):
        return weights, rhs, None
    return weights.to(wide), rhs.to(wide), torch.promote_types(dtype, rhs.dtype)


def _statistics_inv_quad_logdet(operator, inv_quad_rhs, logdet: bool, reduce_inv_quad: bool):
    """rᵀ(ΦΦᵀ + D)⁻¹r and log|ΦΦᵀ + D| from the feature statistics of ``operator._linear_op``.

    Woodbury and the determinant lemma with A = I + ΦᵀD⁻¹Φ, B = ΦᵀD⁻¹r and L = chol(A):
    rᵀ(ΦΦᵀ + D)⁻¹r = rᵀD⁻¹r − ‖L⁻¹B‖² and log|ΦΦᵀ + D| = 2Σ log Lᵢᵢ + Σ log dᵢ.  The N·F² statistics are
    formed in the input dtype — for a materialised or chunked float32 Φ, in float64 where the a-priori bound of their
    float32 rounding is not negligible beside the identity in A (:mod:`rfgp.inference.statistics_precision`) — L and
    everything after it (forward and backward) in
    :func:`~rfgp.core.dtypes.factor_dtype` (float64 for float32), rounded back to the model's dtype; W and r are cast
    to float64 once for the statistics, rᵀD⁻¹r and log|D| (:func:`widened_statistics_inputs`).  Every
    data-dependent quantity is a sum over points, reduced over processes when
    :class:`rfgp.inference.distributed.data_parallel` is active.
    """
    weights = noise_weights(operator._diag_tensor)
    num_data = operator.shape[-1]
    rhs = _as_matrix(inv_quad_rhs)
    stats_rhs = rhs if rhs is not None else weights.new_zeros(*operator.shape[:-1], 0)
    # W and R widened once for all their uses, so that the terms' gradients, which cancel, meet in float64
    weights, stats_rhs, model_dtype = widened_statistics_inputs(operator._linear_op, weights, stats_rhs)
    gram, cross, dtype = adaptive_feature_statistics(operator._linear_op, weights, stats_rhs, model_dtype)
    # rᵀD⁻¹r, in float64 for a float32 model: it cancels against ‖L⁻¹B‖²
    weighted_square = (stats_rhs.pow(2) * weights.unsqueeze(-1)).sum(-2)
    noise_logdet = -diagonal_logdet(weights, num_data)  # log|D| = −log|D⁻¹|
    gram, cross, weighted_square, noise_logdet = distributed.reduce_statistics(
        gram, cross, weighted_square, noise_logdet
    )
    inv_quad, logdet_term = woodbury_inv_quad_logdet(gram, cross, weighted_square if rhs is not None else None,
                                                     noise_logdet, logdet, weights.detach().reciprocal(),
                                                     dtype=dtype)
    like = gram if dtype is None else gram.new_empty(0, dtype=dtype)
    return _finish_inv_quad_logdet(inv_quad, logdet_term, reduce_inv_quad, like)


class ChunkedFeatureRootLinearOperator(FullPrecisionOperator, _NoKroneckerFactors, LinearOperator):
    """ΦΦᵀ with Φ = φ(x) recomputed chunk by chunk instead of stored: O(chunk·F) memory.

    Args:
        inputs: x, ``(..., N, d)``.
        params: the featurizer's differentiable tensors (part of the representation, so
            that GPyTorch's matmul gradients reach them).
        featurizer: the :class:`~rfgp.inference.chunking.Featurizer` φ.
        chunk_size: rows per chunk.
        variance_correction: optional ``(..., N)`` k(x, x) − E[φ(x)ᵀφ(x)].
    """

    def __init__(self, inputs: Tensor, *params: Tensor, featurizer: Featurizer, chunk_size: int,
                 variance_correction: Tensor | None = None) -> None:
        super().__init__(inputs, *params, featurizer=featurizer, chunk_size=chunk_size,
                         variance_correction=variance_correction)
        self.inputs = inputs
        self.featurizer = featurizer
        self.chunk_size = chunk_size
        self.variance_correction = variance_correction

    @classmethod
    def from_featurizer(cls, inputs, featurizer, chunk_size, variance_correction=None):
        return cls(inputs, *featurizer.params, featurizer=featurizer, chunk_size=chunk_size,
                   variance_correction=variance_correction)

    def _size(self) -> torch.Size:
        batch = torch.broadcast_shapes(self.featurizer.batch_shape, self.inputs.shape[:-2])
        n = self.inputs.shape[-2]
        return torch.Size((*batch, n, n))

    def _transpose_nonbatch(self):
        return self

    def _chunks(self):
        return chunk_slices(self.inputs.shape[-2], self.chunk_size)

    def feature_chunks(self) -> Iterator[tuple[slice, Tensor]]:
        """(rows, Φ_c) for every chunk of ``chunk_size`` rows of x, Φ_c ``(..., c, F)``."""
        for rows in self._chunks():
            yield rows, self.featurizer(self.inputs[..., rows, :])

    def features(self) -> Tensor:
        """Φ materialised, ``(..., N, F)`` (for small test sets)."""
        return torch.cat([features for _, features in self.feature_chunks()], -2)

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        """Φε, one ε ~ N(0, I_F) for every chunk: ``(num_samples, *batch, N)`` samples of N(0, ΦΦᵀ), exact, in
        O(chunk·F) memory besides them (linear_operator's default takes a Lanczos root of at most 100 columns)."""
        normal, blocks = None, []
        for rows in self._chunks():
            features = self.featurizer(self.inputs[..., rows, :])
            if normal is None:
                normal = standard_normal((*self.batch_shape, features.shape[-1], num_samples), features)
            blocks.append(features @ normal)
        return torch.cat(blocks, -2).movedim(-1, 0)

    def select_rows(self, observed: Tensor) -> "ChunkedFeatureRootLinearOperator":
        """The same operator on the rows of x where the boolean mask ``(N,)`` is ``True``."""
        correction = None if self.variance_correction is None else self.variance_correction[..., observed]
        return self.from_featurizer(self.inputs[..., observed, :], self.featurizer, self.chunk_size, correction)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """Rows and columns of ΦΦᵀ are rows of x: Φ(x[I])Φ(x[J])ᵀ, still chunked (the same operator on x[I] with its
        correction for a principal block I = J, else a :class:`ChunkedFeatureCrossLinearOperator`); see
        :func:`_dense_getitem` for batch indices."""
        if not _only_rows_and_columns(batch_indices):
            return _dense_getitem(self, row_index, col_index, batch_indices)
        if _is_noop_index(row_index) and _is_noop_index(col_index):
            return self
        if isinstance(row_index, slice) and row_index == col_index:
            correction = None if self.variance_correction is None else self.variance_correction[..., row_index]
            return self.from_featurizer(self.inputs[..., row_index, :], self.featurizer, self.chunk_size, correction)
        return ChunkedFeatureCrossLinearOperator.from_featurizer(
            self.inputs[..., row_index, :], self.inputs[..., col_index, :], self.featurizer, self.chunk_size)

    def _get_indices(self, row_index, col_index, *batch_indices) -> Tensor:
        return _dense_get_indices(self, row_index, col_index, batch_indices)

    def feature_statistics(self, weights: Tensor, rhs: Tensor, adaptive_precision: bool = False,
                           model_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
        """(ΦᵀWΦ, ΦᵀWR), accumulated over chunks, with chunk-recomputing gradients (fused through the triangular
        solve for Nyström features, :class:`~rfgp.inference.triangular_statistics.TriangularFeaturizer`).
        ``adaptive_precision``, ``model_dtype``: as :meth:`FeatureRootLinearOperator.feature_statistics`
        (:func:`~rfgp.inference.chunking.chunked_feature_statistics`,
        :func:`~rfgp.inference.triangular_statistics.chunked_triangular_statistics`)."""
        if isinstance(self.featurizer, TriangularFeaturizer):
            return chunked_triangular_statistics(self.featurizer, self.inputs, weights, rhs, self.chunk_size,
                                                 adaptive_precision, model_dtype)
        return chunked_feature_statistics(self.featurizer, self.inputs, weights, rhs, self.chunk_size,
                                          adaptive_precision=adaptive_precision, model_dtype=model_dtype)

    def statistics_dtype(self, weights: Tensor) -> torch.dtype:
        """The dtype of :meth:`feature_statistics` without ``adaptive_precision``: x's (the kernel's compute dtype),
        the constant's and the weights'."""
        constant = self.featurizer.constant
        dtype = torch.promote_types(self.inputs.dtype, weights.dtype)
        return torch.promote_types(dtype, constant.dtype) if torch.is_tensor(constant) else dtype

    def _project(self, rhs: Tensor) -> Tensor:
        """ΦᵀR accumulated over chunks."""
        return sum(project(self.featurizer(self.inputs[..., rows, :]), rhs[..., rows, :]) for rows in self._chunks())

    def _matmul(self, rhs: Tensor) -> Tensor:
        projected = self._project(rhs)
        return torch.cat([self.featurizer(self.inputs[..., rows, :]) @ projected for rows in self._chunks()], -2)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor):
        # ∂⟨L, ΦΦᵀR⟩/∂Φ_c = L_c (ΦᵀR)ᵀ + R_c (ΦᵀL)ᵀ, backpropagated chunk by chunk.
        with torch.no_grad():
            left_proj, right_proj = self._project(left_vecs), self._project(right_vecs)

        def chunk_grad(features: Tensor, rows: slice) -> Tensor:
            return left_vecs[..., rows, :] @ right_proj.mT + right_vecs[..., rows, :] @ left_proj.mT

        params = self.featurizer.params
        input_grad, param_grads = backprop_chunks(
            self.featurizer, self.inputs, self.chunk_size, chunk_grad, self.inputs.requires_grad,
            [p.requires_grad for p in params],
        )
        correction = () if self.variance_correction is None else (None,)
        return (input_grad, *param_grads, *correction)

    def _diagonal(self) -> Tensor:
        return torch.cat([squared_row_norms(self.featurizer(self.inputs[..., rows, :])) for rows in self._chunks()], -1)

    def to_dense(self) -> Tensor:
        """ΦΦᵀ, featurising each distinct batch member of x once (stride-0 members share one Gram, expanded)."""
        inputs = narrow_broadcast(self.inputs, self.inputs.dim() - 2)
        features = torch.cat([self.featurizer(inputs[..., rows, :]) for rows in self._chunks()], -2)
        return (features @ features.mT).expand(self.shape)

    def _expand_batch(self, batch_shape) -> "ChunkedFeatureRootLinearOperator":
        """The same operator over ``batch_shape``: x and the correction expanded without copying."""
        return self.from_featurizer(self.inputs.expand(*batch_shape, *self.inputs.shape[-2:]), self.featurizer,
                                    self.chunk_size, _expanded_correction(self.variance_correction, batch_shape))

    def _mul_constant(self, other):
        if not scales_root(other):
            return super()._mul_constant(other)
        correction = scaled_correction(self.variance_correction, other)
        return self.from_featurizer(self.inputs, self.featurizer.scaled(other), self.chunk_size, correction)

    def _mul_matrix(self, other):
        """Scaled per batch member when ``other`` is a batch of constants (:func:`batch_constants`); linear_operator's
        generic product otherwise (dense with a dense operand, else lazy), which keeps the variance correction
        (:mod:`rfgp.inference.combined_covariances`; it had been dropped: a chunked Nyström kernel times an exact or
        an index kernel predicted 1e-10 far from the data)."""
        from .combined_covariances import (  # imports this module
            dense_product_keeping_corrections,
            lazy_product_keeping_corrections,
        )

        constants = batch_constants(self, other)
        if constants is not None:
            return self._expand_batch(constants.shape)._mul_constant(constants)
        other = evaluated_covariance(other)
        if isinstance(other, DenseLinearOperator):
            return dense_product_keeping_corrections(self, other, self.to_dense() * other.to_dense())
        return lazy_product_keeping_corrections(self, other)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return ChunkedFeatureRootAddedDiagLinearOperator(self, other)
        if isinstance(other, ChunkedFeatureRootLinearOperator) and other.inputs is self.inputs:
            return self.from_featurizer(
                self.inputs, self.featurizer.concatenated(other.featurizer),
                min(self.chunk_size, other.chunk_size),
                _add_optional(self.variance_correction, other.variance_correction),
            )
        return super().__add__(other)


def batch_constants(operator: LinearOperator, other) -> Tensor | None:
    """The constants c of ``other`` as a tensor of the broadcast batch shape if ``other`` has shape (..., 1, 1), else
    ``None``.

    GPyTorch's ``ScaleKernel(batch_shape=b)`` around a kernel of a smaller batch multiplies its covariance by
    outputscales of shape ``(*b, 1, 1)``, and linear_operator's ``mul`` routes a constant per batch member to
    ``_mul_constant`` only when the operator already has the whole batch; otherwise to ``_mul_matrix``, whose generic
    product formed the dense N × N covariance (an O(N³) model behind a feature kernel).  A feature root instead
    expands its batch and scales Φ by √c per member.

    Only a tensor (or its dense wrapper) is taken for constants: a 1 × 1 covariance of one point per batch member
    (a product of rfgp kernels at BoTorch's q = 1 candidates ``(b, 1, d)``) is a kernel matrix, whose product keeps
    its face-splitting root and correction (scaled by its value, the product had the first factor's root).
    """
    if other.shape[-2:] != (1, 1) or not (torch.is_tensor(other) or type(other) is DenseLinearOperator):
        return None
    values = other.to_dense() if isinstance(other, LinearOperator) else other
    batch = torch.broadcast_shapes(operator.batch_shape, other.shape[:-2])
    return values.reshape(other.shape[:-2]).expand(batch)


def scaled_correction(correction: Tensor | None, constant) -> Tensor | None:
    """The per-point variance correction of c·K: c times it (a batch constant broadcasts over points)."""
    if correction is None:
        return None
    return correction * (constant.unsqueeze(-1) if torch.is_tensor(constant) else constant)


class ChunkedFeatureRootAddedDiagLinearOperator(FullPrecisionOperator, AddedDiagLinearOperator):
    """ΦΦᵀ + D with Φ never materialised: MLL terms from chunked feature statistics."""

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return self.__class__(self._linear_op, self._diag_tensor + other)
        return super().__add__(other)

    def select_rows(self, observed: Tensor) -> "ChunkedFeatureRootAddedDiagLinearOperator":
        """Φ[o]Φ[o]ᵀ + D[o] for a boolean mask o ``(N,)``, still chunked (see :func:`select_observed`)."""
        return ChunkedFeatureRootAddedDiagLinearOperator(self._linear_op.select_rows(observed),
                                                         select_noise(self._diag_tensor, observed))

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        check_targets(inv_quad_rhs, point_axis=-2, allow_empty=distributed.is_active())
        return _statistics_inv_quad_logdet(self, inv_quad_rhs, logdet, reduce_inv_quad)


class ChunkedFeatureCrossLinearOperator(FullPrecisionOperator, LinearOperator):
    """Φ(x₁)Φ(x₂)ᵀ evaluated chunk by chunk (a test–train covariance that never stores Φ(x₂)).

    Its products are exact, and differentiable in x₁, x₂ and the featurizer's tensors (:meth:`_bilinear_derivative`),
    also chunk by chunk.  ``unchecked`` — names of x₁ and x₂ for the error message — makes the operator check every
    block of rows it featurises for NaN/Inf instead of the kernel checking x₁ and x₂ whole when it builds the
    operator: a prediction never reads its test–train covariance, so the N training rows (sliced by GPyTorch from
    the joint inputs, expanded to every t-batch, at every call) are not scanned for it.
    """

    def __init__(self, inputs1: Tensor, inputs2: Tensor, *params: Tensor, featurizer: Featurizer,
                 chunk_size: int, unchecked: tuple[str, str] | None = None) -> None:
        super().__init__(inputs1, inputs2, *params, featurizer=featurizer, chunk_size=chunk_size, unchecked=unchecked)
        self.inputs1, self.inputs2 = inputs1, inputs2
        self.featurizer = featurizer
        self.chunk_size = chunk_size
        self.unchecked = unchecked

    @classmethod
    def from_featurizer(cls, inputs1, inputs2, featurizer, chunk_size, unchecked=None):
        return cls(inputs1, inputs2, *featurizer.params, featurizer=featurizer, chunk_size=chunk_size,
                   unchecked=unchecked)

    def _size(self) -> torch.Size:
        batch = torch.broadcast_shapes(self.featurizer.batch_shape, self.inputs1.shape[:-2], self.inputs2.shape[:-2])
        return torch.Size((*batch, self.inputs1.shape[-2], self.inputs2.shape[-2]))

    def _transpose_nonbatch(self):
        unchecked = None if self.unchecked is None else self.unchecked[::-1]
        return self.from_featurizer(self.inputs2, self.inputs1, self.featurizer, self.chunk_size, unchecked)

    def _row_blocks(self, side: int) -> Iterator[tuple[slice, Tensor]]:
        """(rows, x[rows]) of x₁ (``side`` 0) or x₂ (1) by chunks, each checked finite if :attr:`unchecked`."""
        inputs = self.inputs2 if side else self.inputs1
        for rows in chunk_slices(inputs.shape[-2], self.chunk_size):
            block = inputs[..., rows, :]
            if self.unchecked is not None:
                check_finite(block, self.unchecked[side])
            yield rows, block

    def _features(self, side: int) -> Iterator[tuple[slice, Tensor]]:
        """(rows, Φ(x[rows])) of x₁ (``side`` 0) or x₂ (1) by chunks."""
        return ((rows, self.featurizer(block)) for rows, block in self._row_blocks(side))

    def _matmul(self, rhs: Tensor) -> Tensor:
        projected = sum(project(features, rhs[..., rows, :]) for rows, features in self._features(1))
        return torch.cat([features @ projected for _, features in self._features(0)], -2)

    def _bilinear_derivative(self, left_vecs: Tensor, right_vecs: Tensor) -> tuple[Tensor | None, ...]:
        """∂ tr(UᵀΦ₁Φ₂ᵀV) w.r.t. x₁, x₂ and the featurizer's tensors (this operator's representation, in order).

        linear_operator's generic derivative rebuilds the operator from detached copies of the representation, which
        the featurizer's closure does not read (it uses the kernel's own parameters): its gradients would be zero.
        Here the product rule with the other factor's projection held fixed — P = Φ₂ᵀV, Q = Φ₁ᵀU, then
        ∂⟨Φ₁, UPᵀ⟩ + ∂⟨Φ₂, VQᵀ⟩ — is differentiated through the very tensors the featurizer uses, one chunk of rows
        at a time (O(chunk·F) memory, as the products).
        """
        args = (self.inputs1, self.inputs2, *self.featurizer.params)
        wanted = [i for i, arg in enumerate(args) if arg.requires_grad]
        grads: list[Tensor | None] = [None] * len(args)
        if not wanted:
            return tuple(grads)
        with torch.no_grad():
            fixed2 = sum(project(features, right_vecs[..., rows, :]) for rows, features in self._features(1))
            fixed1 = sum(project(features, left_vecs[..., rows, :]) for rows, features in self._features(0))
        for side, vecs, fixed in ((0, left_vecs, fixed2), (1, right_vecs, fixed1)):
            with torch.enable_grad():  # the blocks are sliced from x in the graph
                blocks = list(self._row_blocks(side))
            for rows, block in blocks:
                with torch.enable_grad():
                    part = (self.featurizer(block) * (vecs[..., rows, :] @ fixed.mT)).sum()
                    chunk_grads = torch.autograd.grad(part, [args[i] for i in wanted], allow_unused=True)
                for i, grad in zip(wanted, chunk_grads):
                    if grad is not None:
                        grads[i] = grad if grads[i] is None else grads[i] + grad
        return tuple(grads)

    def to_dense(self) -> Tensor:
        left = torch.cat([features for _, features in self._features(0)], -2)
        return torch.cat([left @ features.mT for _, features in self._features(1)], -1)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """Rows select rows of x₁, columns rows of x₂: Φ(x₁[I])Φ(x₂[J])ᵀ, still chunked and differentiable.

        linear_operator's generic version wraps the operator in an ``InterpolatedLinearOperator``, whose ``.to(device)``
        (which ``CatLinearOperator`` indexing calls: BoTorch's ``HigherOrderGP.posterior`` slices the joint train/test
        covariance) raised an ``AttributeError``, and whose batch indexing rebuilt this operator from indexed copies
        of the featurizer's tensors, which the featurizer does not read (a ``RuntimeError`` on the shapes).  Batch
        indices give the dense entries (see :func:`_dense_getitem`).
        """
        if not _only_rows_and_columns(batch_indices):
            return _dense_getitem(self, row_index, col_index, batch_indices)
        return self.from_featurizer(self.inputs1[..., row_index, :], self.inputs2[..., col_index, :], self.featurizer,
                                    self.chunk_size, self.unchecked)

    def _get_indices(self, row_index, col_index, *batch_indices) -> Tensor:
        return _dense_get_indices(self, row_index, col_index, batch_indices)

    def _mul_constant(self, other):
        if not scales_root(other):
            return super()._mul_constant(other)
        return self.from_featurizer(self.inputs1, self.inputs2, self.featurizer.scaled(other), self.chunk_size,
                                    self.unchecked)

    def _mul_matrix(self, other):
        """The dense elementwise product, as GPyTorch gives an exact kernel's: linear_operator's generic product
        multiplies root decompositions, which a cross covariance (x₁ ≠ x₂) does not have
        (:meth:`root_decomposition`)."""
        return DenseLinearOperator(self.to_dense() * evaluated_covariance(other).to_dense())

    def root_decomposition(self, method=None):
        """Refused: Φ(x₁)Φ(x₂)ᵀ with x₁ ≠ x₂ (the kernel returns a feature root for equal inputs) is no symmetric
        positive semi-definite matrix, so it has no root RRᵀ; linear_operator's Lanczos returned a wrong one for a
        square cross covariance (``InterpolatedLinearOperator.mul`` of an eagerly evaluated one, up to 1.8 off)."""
        raise ValueError(
            f"root_decomposition of a {tuple(self.shape)} rfgp cross covariance Φ(x1)Φ(x2)ᵀ at different inputs x1 and "
            "x2: it is not symmetric, so it has no root; use to_dense(), or multiply it elementwise as "
            "cross.mul(other) (the dense product)")


def _only_rows_and_columns(batch_indices) -> bool:
    """Whether an index of a chunked operator leaves its batch dimensions whole (rows and columns are rows of x)."""
    return all(_is_noop_index(index) for index in batch_indices)


def _dense_getitem(operator: LinearOperator, row_index, col_index, batch_indices) -> LinearOperator:
    """``operator[*batch_indices, row_index, col_index]`` from its dense entries.

    A chunked operator's featurizer is a closure over the kernel's batch of hyperparameters and cannot be indexed by
    batch, so batch members are taken from the dense matrix (differentiable, the size an exact kernel's covariance
    has); its rows and columns (the common case) are selected first, on x, so only the selected block is formed.
    """
    rows, cols = (index if isinstance(index, slice) else _noop_index for index in (row_index, col_index))
    block = operator._getitem(rows, cols)  # Φ(x₁[rows])Φ(x₂[cols])ᵀ, batch whole
    rest = (_noop_index if isinstance(index, slice) else index for index in (row_index, col_index))
    return DenseLinearOperator(block.to_dense())._getitem(*rest, *batch_indices)


def _dense_get_indices(operator: LinearOperator, row_index: Tensor, col_index: Tensor, batch_indices) -> Tensor:
    """Entries ``operator[*batch_indices, row_index, col_index]`` for k broadcast tensor indices: the diagonal of the
    k × k block Φ(x₁[row_index])Φ(x₂[col_index])ᵀ at the k batch members (not the whole dense matrix; batch members
    cannot be taken from the featurizer, see :func:`_dense_getitem`)."""
    shape = torch.broadcast_shapes(row_index.shape, col_index.shape, *(index.shape for index in batch_indices))
    rows, cols = row_index.expand(shape).reshape(-1), col_index.expand(shape).reshape(-1)
    block = operator._getitem(rows, cols).to_dense()  # (*batch, k, k)
    entries = torch.arange(rows.numel(), device=rows.device)
    batch = tuple(index.expand(shape).reshape(-1) for index in batch_indices)
    return block[(*batch, entries, entries)].reshape(shape)
