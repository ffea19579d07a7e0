"""The posterior covariance Σ* = RRᵀ of a feature-space GP, low-rank for products and sampling.

The weight-space posterior θ | y ~ N(m, A⁻¹) (A = I + ΦᵀD⁻¹Φ = LLᵀ, paper 000 §5.6) gives the
latent covariance at n test points as Σ* = Φ*A⁻¹Φ*ᵀ = RRᵀ with the n × F root R = Φ*L⁻ᵀ — or, when the
posterior runs in kernel space (N ≲ F), R = Φ*(I − WᵀQ) (:class:`~rfgp.inference.kernel_space.KernelSpaceFactor`).
:class:`LowRankPosteriorCovariance` keeps R: matrix products cost O(n·F) per column, the
variance is the row norms of R, and ``MultivariateNormal.rsample()`` draws R·ε with
ε ~ N(0, I_F) in O(n·F) per sample (Thompson sampling over many candidates stays cheap).
A prediction's posterior (:class:`LazyRootPosteriorCovariance`: :class:`FeatureSpacePosteriorCovariance` from
L_A, :class:`KernelSpacePosteriorCovariance` from the kernel-space factor) forms R only where it is read, and blocks
of rows Σ*[r, :] = Φ_rA⁻¹Φ*ᵀ without it: Φ_rA⁻¹ from two triangular solves of the r rows with L_A (2·r·F²) or four
r × N × F products in kernel space, then one r × F × n product — what BoTorch's cached-root qLogNEI/qNEI reads at
every evaluation (the q candidates' rows of the joint posterior with the baseline), instead of the whole root's
n·F² solve or 2·n·N·F products, forward and backward.  Output scalings keep the root: c·RRᵀ = (√c·R)(√c·R)ᵀ
for a constant c > 0 (``_mul_constant``) and SRRᵀS = (SR)(SR)ᵀ for a diagonal S
(:meth:`LowRankPosteriorCovariance.rescaled`, which BoTorch's ``Standardize`` reaches through
:mod:`rfgp.integrations.botorch_transforms`).  Batch members and principal slices keep the root
too; independent outputs (a BoTorch ``ModelListGP``, a batched multi-output model) are one stacked operator
(:func:`stack_independent`, roots zero-padded to the widest F) whose weighted sum Σₖ wₖ²RₖRₖᵀ has the root
[w₁R₁ … w_mR_m] (``output_sum``; :mod:`rfgp.integrations.botorch_multioutput`).

Adding a diagonal (observation noise, the bias correction of paper 000 §5.6) gives a
:class:`LowRankPosteriorAddedDiag`, whose log-density (``gpytorch.metrics.negative_log_predictive_density``,
a predictive ``log_prob``) is exact and takes the cheaper of the Woodbury form, O(n·F² + F³), and the dense
Cholesky factor, O(n²·F + n³) — instead of linear_operator's iterative (CG/Lanczos) default beyond
``max_cholesky_size`` (n = 4000 test points, F = 256: 5.2 s and a relative error of 1e-4).

It is deliberately *not* a ``RootLinearOperator``, whose ``root_decomposition()`` returns the
n × F factor itself: code that reads a root decomposition as a square Cholesky factor
(BoTorch's cached-root qNEI/qLogNEI, ``CachedCholeskyMCSamplerMixin``, solves triangular systems
with it; base samples are drawn with the distribution's ``base_sample_shape``, n for a
non-root operator) gets the lower-triangular n × n factor of the dense Σ*, as from an exact
GP: ``root_decomposition()`` follows linear_operator's default policy (Cholesky, with jitter
when n > F makes Σ* singular, up to ``max_cholesky_size``).
"""

from __future__ import annotations

import torch
from linear_operator.operators import (
    DenseLinearOperator,
    DiagLinearOperator,
    LinearOperator,
    LowRankRootAddedDiagLinearOperator,
    LowRankRootLinearOperator,
    MatmulLinearOperator,
    SumLinearOperator,
)
from linear_operator.utils.getitem import _is_noop_index, _noop_index
from torch import Tensor

from ..core.dtypes import FullPrecisionOperator, in_full_precision
from ..core.grad_mode_cache import cached_per_grad_mode
from .kernel_space import KernelSpaceFactor, kernel_space_inv_quad_logdet, prefers_kernel_space
from .linalg import CapacitanceFactor, is_positive, squared_row_norms
from .task_noise import is_interleaved_task_noise


class LowRankPosteriorCovariance(FullPrecisionOperator, MatmulLinearOperator):
    """Σ* = RRᵀ for a root R of shape ``(*batch, n, F)``; any F, including F > n.

    Args:
        root: the dense root R, e.g. Φ*L⁻ᵀ of a feature-space posterior.
    """

    def __init__(self, root: Tensor):
        if not torch.is_tensor(root) or root.dim() < 2:
            raise ValueError(f"root must be a tensor of shape (*batch, n, F), got {getattr(root, 'shape', root)!r}")
        LinearOperator.__init__(self, root)  # one argument, R: reconstruction, .to(), .detach() keep the symmetry
        self.low_rank_root = root
        self.left_linear_op = DenseLinearOperator(root)
        self.right_linear_op = DenseLinearOperator(root.mT)

    def _size(self) -> torch.Size:
        """``(*batch, n, n)`` from R's shape (``MatmulLinearOperator`` broadcasts its two factors' shapes at every
        ``shape`` query, dozens of times per BoTorch acquisition evaluation)."""
        return self.low_rank_root.shape[:-1] + self.low_rank_root.shape[-2:-1]

    def _expand_batch(self, batch_shape) -> LowRankPosteriorCovariance:
        return self.__class__(self.low_rank_root.expand(*batch_shape, *self.low_rank_root.shape[-2:]))

    def _permute_batch(self, *dims: int) -> LowRankPosteriorCovariance:
        return self.__class__(self.low_rank_root.permute(*dims, -2, -1))

    def _transpose_nonbatch(self) -> LowRankPosteriorCovariance:
        return self

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """Batch members and principal slices Σ*[I, I] = R[I]R[I]ᵀ keep the root (BoTorch takes a batched
        multi-output posterior apart with ``covar[..., t, :, :]``); other indices as linear_operator."""
        if _is_principal(row_index, col_index, batch_indices):
            return self.__class__(self.low_rank_root[(*batch_indices, row_index, _noop_index)])
        return super()._getitem(row_index, col_index, *batch_indices)

    # The product rule through R by autograd, over this operator's one argument (MatmulLinearOperator's
    # version returns one gradient per factor, i.e. two).
    _bilinear_derivative = LinearOperator._bilinear_derivative

    def _diagonal(self) -> Tensor:
        return squared_row_norms(self.low_rank_root)

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        """R·ε, ε ~ N(0, I_F): ``(num_samples, *batch, n)`` samples of N(0, RRᵀ) in O(num_samples·n·F)."""
        return _low_rank_samples(self.low_rank_root, None, num_samples)

    def rescaled(self, scale: Tensor) -> LowRankPosteriorCovariance:
        """SΣ*S = (SR)(SR)ᵀ with S = diag(``scale``), ``scale`` of shape ``(..., n)``: the covariance of s ⊙ f."""
        return LowRankPosteriorCovariance(scale.unsqueeze(-1) * self.low_rank_root)

    def output_sum(self, weights: Tensor) -> LowRankPosteriorCovariance:
        """Σₖ wₖ²RₖRₖᵀ = [w₁R₁ … w_mR_m][w₁R₁ … w_mR_m]ᵀ, the covariance of Σₖ wₖfₖ for independent outputs
        f₁ … f_m stacked in batch dimension -3 (roots ``(*batch, m, n, F)``, ``weights`` of shape ``(m,)``): a root
        of width m·F."""
        return LowRankPosteriorCovariance(_weighted_roots(self.low_rank_root, weights))

    def _mul_constant(self, other: Tensor) -> LinearOperator:
        """c·RRᵀ = (√c·R)(√c·R)ᵀ for constants c > 0 (``other`` a scalar or one per batch member): the covariance
        of √c·f, e.g. under BoTorch's ``ScalarizedPosteriorTransform`` of one output; linear_operator's generic
        product otherwise (as for its ``RootLinearOperator``)."""
        if is_positive(other):
            return LowRankPosteriorCovariance(other.sqrt().unsqueeze(-1).unsqueeze(-1) * self.low_rank_root)
        return super()._mul_constant(other)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return LowRankPosteriorAddedDiag(LowRankRootLinearOperator(self.low_rank_root), other)
        if is_interleaved_task_noise(other):
            return PosteriorAddedTaskNoise(self, other)
        return super().__add__(other)


class LazyRootPosteriorCovariance(LowRankPosteriorCovariance):
    """Σ* = SΦ*A⁻¹Φ*ᵀS from a factor of the posterior weight covariance A⁻¹, whose n × F root SΦ*R (RRᵀ = A⁻¹) is
    formed at its first use, and whose blocks of rows Σ*[r, :] = S_r(Φ_rA⁻¹)Φ*ᵀS never form it.

    BoTorch's cached-root qLogNEI/qNEI (``botorch.utils.low_rank.sample_cached_cholesky``) asks the joint posterior at
    the pruned baseline and the q candidates, n = n_b + q per t-batch, only for its q bottom rows Σ*[-q:, :] at every
    evaluation: through the factor's ``rows_times_weight_covariance`` (Φ_rA⁻¹) they cost what q rows of the root cost,
    plus q·n·F for the product with Φ*ᵀ, instead of the whole root, forward and backward.  S = diag(``scale``) is the
    row scaling of BoTorch's ``Standardize`` (:meth:`rescaled`).  Everything else — variances, samples, principal
    slices, batch operations — reads the root.  The algebra of A⁻¹ is the subclass's ``factor_type``.

    Args:
        features: test features Φ* ``(*batch, n, F)``, already broadcast to the factor's batch.
        scale: the diagonal of S, ``(*batch, n)``.
        factor: the tensors of a ``factor_type`` (a named tuple with ``posterior_root`` and
            ``rows_times_weight_covariance``).
    """

    factor_type: type

    def __init__(self, features: Tensor, scale: Tensor, *factor: Tensor):
        # all are arguments, so that linear_operator's autograd (representation) reaches the factor's graph
        LinearOperator.__init__(self, features, scale, *factor)
        # (not ``features``: rfgp's prediction reads ``features()`` as the method of a feature operator)
        self.test_features, self.scale = features, scale
        self.factor = self.factor_type(*factor)

    @property
    @cached_per_grad_mode("lazy_posterior_root")
    @in_full_precision  # formed where it is first read, maybe under the caller's autocast (a likelihood's noise sum)
    def low_rank_root(self) -> Tensor:
        """The n × F root SΦ*R, formed at its first read in each grad mode (:mod:`rfgp.core.grad_mode_cache`)."""
        return self.scale.unsqueeze(-1) * self.factor.posterior_root(self.test_features)

    @property
    def left_linear_op(self) -> DenseLinearOperator:
        return DenseLinearOperator(self.low_rank_root)

    @property
    def right_linear_op(self) -> DenseLinearOperator:
        return DenseLinearOperator(self.low_rank_root.mT)

    def _size(self) -> torch.Size:
        return self.test_features.shape[:-1] + self.test_features.shape[-2:-1]

    def _with_root(self) -> LowRankPosteriorCovariance:
        return LowRankPosteriorCovariance(self.low_rank_root)

    def _expand_batch(self, batch_shape) -> LowRankPosteriorCovariance:
        return self._with_root()._expand_batch(batch_shape)

    def _permute_batch(self, *dims: int) -> LowRankPosteriorCovariance:
        return self._with_root()._permute_batch(*dims)

    def _unsqueeze_batch(self, dim: int) -> LinearOperator:
        return self._with_root()._unsqueeze_batch(dim)

    @in_full_precision
    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """Rows Σ*[r, :] (a slice of rows, all columns and batch members) without the root; else the root's."""
        if isinstance(row_index, slice) and _is_noop_index(col_index) and all(map(_is_noop_index, batch_indices)):
            rows = self.factor.rows_times_weight_covariance(self.test_features[..., row_index, :])
            block = rows @ self.test_features.to(rows.dtype).mT  # S on the r × n block, not on the n × F features
            scale = self.scale.to(rows.dtype)
            block = scale[..., row_index].unsqueeze(-1) * block * scale.unsqueeze(-2)
            return DenseLinearOperator(block.to(self.test_features.dtype))
        return self._with_root()._getitem(row_index, col_index, *batch_indices)

    def rescaled(self, scale: Tensor) -> LazyRootPosteriorCovariance:
        scale = scale * self.scale
        features = self.test_features.expand(*scale.shape, self.test_features.shape[-1])
        return self.__class__(features, scale, *self.factor)

    def _mul_constant(self, other: Tensor) -> LinearOperator:
        if is_positive(other):
            return self.rescaled(other.sqrt().unsqueeze(-1).expand(self.scale.shape))
        return super()._mul_constant(other)


class KernelSpacePosteriorCovariance(LazyRootPosteriorCovariance):
    """:class:`LazyRootPosteriorCovariance` of a kernel-space posterior (N ≲ F), factor
    :class:`~rfgp.inference.kernel_space.KernelSpaceFactor` (W = L⁻¹Φ, Q = (L + D^{1/2})⁻¹Φ, both N × F).

    The root Φ*R = Φ* − (Φ*Wᵀ)Q costs 2·n·N·F; rows Φ_rA⁻¹ = (Φ_rR)Rᵀ cost 4·q·N·F
    (:meth:`~rfgp.inference.kernel_space.KernelSpaceFactor.rows_times_weight_covariance`): O(q·N·F + q·n·F) per
    t-batch of qLogNEI instead of O(n·N·F) (N = 1000, F = 1024, 64 baseline points, 4 × 2 candidates: 46.5 → 17.2 ms
    per value + gradient, ``benchmarks/results/small_n_botorch.md``).
    """

    factor_type = KernelSpaceFactor


class FeatureSpacePosteriorCovariance(LazyRootPosteriorCovariance):
    """:class:`LazyRootPosteriorCovariance` of a feature-space posterior (N > F), factor
    :class:`~rfgp.inference.linalg.CapacitanceFactor` (L_A = chol(A), F × F).

    The root Φ*L_A⁻ᵀ costs n·F² (one triangular solve of the n rows); rows Φ_rA⁻¹ = (Φ_rL_A⁻ᵀ)L_A⁻¹ cost 2·q·F²
    (:meth:`~rfgp.inference.linalg.CapacitanceFactor.rows_times_weight_covariance`): O(q·F² + q·n·F) per t-batch of
    qLogNEI instead of O(n·F²) (N = 5000, F = 1024, 256 baseline points, 4 × 2 candidates: 84.2 → 36.1 ms per value
    + gradient, the exact GP 2.2 s, ``benchmarks/results/small_n_botorch.md``).
    """

    factor_type = CapacitanceFactor


def _is_principal(row_index, col_index, batch_indices) -> bool:
    """Whether ``[*batch_indices, row_index, col_index]`` selects batch members and a principal submatrix, by
    integers and slices only (tensor indices follow linear_operator's broadcasting rules and stay with it)."""
    if not all(isinstance(index, (int, slice)) for index in batch_indices):
        return False
    return _is_noop_index(row_index) and _is_noop_index(col_index) or (
        isinstance(row_index, slice) and row_index == col_index)


class PosteriorAddedTaskNoise(FullPrecisionOperator, SumLinearOperator):
    """Σ* + D_n ⊗ Σ_T: a low-rank posterior covariance plus correlated (interleaved multitask) observation noise.

    ``MultitaskGaussianLikelihood(num_tasks=T, rank ≥ 1)`` adds I_n ⊗ Σ_T to the posterior; as a plain sum, a draw
    from it (``likelihood(posterior).rsample()``) took the dense Cholesky factor of the n·T × n·T matrix (3000 points,
    T = 2: 5.3 s; 10⁵ points: out of reach).  Here a draw is the posterior's own low-rank (or blockwise) draw plus
    √dᵢ·S_T ε′ᵢ per point, S_T S_Tᵀ = Σ_T (a T × T eigendecomposition, exact also for a singular Σ_T): O(n·T²) more.
    Products, the diagonal and dense forms are the sum's.

    Args:
        posterior: the posterior covariance (any operator with ``zero_mean_mvn_samples``).
        task_noise: D_n ⊗ Σ_T, a ``KroneckerProductLinearOperator`` with a diagonal first factor.
    """

    def __init__(self, posterior: LinearOperator, task_noise: LinearOperator):
        super().__init__(posterior, task_noise)

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        posterior, task_noise = self.linear_ops
        samples = posterior.zero_mean_mvn_samples(num_samples)  # (S, *batch, n·T)
        point_noise, task_covariance = task_noise.linear_ops
        covariance = task_covariance.to_dense()
        values, vectors = torch.linalg.eigh(covariance)
        root = vectors * values.clamp_min(0.0).sqrt().unsqueeze(-2)  # S_T, S_T S_Tᵀ = Σ_T
        scale = point_noise.diagonal(dim1=-2, dim2=-1).sqrt()  # (..., n)
        num_points, num_tasks = scale.shape[-1], root.shape[-1]
        batch = samples.shape[1:-1]
        normal = torch.randn(num_samples, *batch, num_points, num_tasks, dtype=samples.dtype, device=samples.device)
        noise = (normal @ root.mT) * scale.unsqueeze(-1)
        return samples + noise.expand(num_samples, *batch, num_points, num_tasks).flatten(-2)


class LowRankPosteriorAddedDiag(FullPrecisionOperator, LowRankRootAddedDiagLinearOperator):
    """RRᵀ + D for a posterior root R ``(*batch, n, F)`` and a diagonal D (noise, variance correction).

    ``inv_quad_logdet`` is exact by whichever algebra costs fewer flops (:func:`rfgp.inference.kernel_space.
    prefers_kernel_space`): the capacitance matrix I + RᵀD⁻¹R (linear_operator's Woodbury form) or the Cholesky
    factor of the n × n matrix; ``rsample()`` draws R·ε + √D·ε′ in O(n·F).  Like
    :class:`LowRankPosteriorCovariance` it is not a ``RootLinearOperator`` (n-dimensional base samples).
    """

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        root = self._linear_op.root.to_dense()
        if not prefers_kernel_space(*root.shape[-2:]):
            return super().inv_quad_logdet(inv_quad_rhs, logdet, reduce_inv_quad)
        noise = self._diag_tensor.diagonal(dim1=-2, dim2=-1).expand(*self.batch_shape, root.shape[-2])
        rhs = inv_quad_rhs
        if rhs is not None and rhs.dim() == self.dim() - 1:
            rhs = rhs.unsqueeze(-1)
        inv_quad, logdet_term = kernel_space_inv_quad_logdet(root, noise, rhs, logdet)
        if inv_quad is not None and reduce_inv_quad:
            inv_quad = inv_quad.sum(-1)
        return inv_quad, logdet_term

    def evaluate_kernel(self) -> LowRankPosteriorAddedDiag:
        """Itself: both parts are evaluated.  linear_operator's ``AddedDiagLinearOperator.evaluate_kernel`` returns
        ``root + diag``, a plain ``LowRankRootAddedDiagLinearOperator``, and GPyTorch's ``log_prob`` calls it first:
        log-densities of n* ≪ F test points then factorised the F × F capacitance (n* = 6, F = 16 384: 59 s)."""
        return self

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        """R·ε + √D·ε′, ε ~ N(0, I_F), ε′ ~ N(0, I_n): ``(num_samples, *batch, n)`` samples in O(num_samples·n·F)."""
        return _low_rank_samples(*self._expanded_root_and_diag(), num_samples)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """Batch members and principal slices keep the root and the diagonal, as for
        :class:`LowRankPosteriorCovariance`."""
        if _is_principal(row_index, col_index, batch_indices):
            root, diag = self._expanded_root_and_diag()
            return LowRankPosteriorAddedDiag(LowRankRootLinearOperator(root[(*batch_indices, row_index, _noop_index)]),
                                             DiagLinearOperator(diag[(*batch_indices, row_index)]))
        return super()._getitem(row_index, col_index, *batch_indices)

    def _expanded_root_and_diag(self) -> tuple[Tensor, Tensor]:
        root = self._linear_op.root.to_dense()
        root = root.expand(*self.batch_shape, *root.shape[-2:])
        return root, self._diag_tensor.diagonal(dim1=-2, dim2=-1).expand(*self.batch_shape, root.shape[-2])

    def output_sum(self, weights: Tensor) -> LowRankPosteriorAddedDiag:
        """Σₖ wₖ²(RₖRₖᵀ + Dₖ) for outputs in batch dimension -3, as :meth:`LowRankPosteriorCovariance.output_sum`."""
        root, diag = self._expanded_root_and_diag()
        return LowRankPosteriorAddedDiag(LowRankRootLinearOperator(_weighted_roots(root, weights)),
                                         DiagLinearOperator((weights.pow(2).unsqueeze(-1) * diag).sum(-2)))

    def rescaled(self, scale: Tensor) -> LowRankPosteriorAddedDiag:
        """S(RRᵀ + D)S = (SR)(SR)ᵀ + S²D with S = diag(``scale``), ``scale`` of shape ``(..., n)``."""
        root = scale.unsqueeze(-1) * self._linear_op.root.to_dense()
        diag = scale.pow(2) * self._diag_tensor.diagonal(dim1=-2, dim2=-1)
        return LowRankPosteriorAddedDiag(LowRankRootLinearOperator(root), DiagLinearOperator(diag))


def feature_posterior_covariance(features: Tensor, factor, kernel_space: bool) -> LazyRootPosteriorCovariance:
    """Σ* = Φ*A⁻¹Φ*ᵀ at test features Φ* ``(..., n, F)`` from a prediction strategy's factor, its n × F root formed
    where it is read.

    Feature space (``factor`` = chol(A) = L_A, F × F): the root Φ*L_A⁻ᵀ, a :class:`FeatureSpacePosteriorCovariance`.
    Kernel space (``factor`` a :class:`~rfgp.inference.kernel_space.KernelSpaceFactor` of ΦΦᵀ + D): the root
    Φ*(I − WᵀQ), with no F × F matrix, a :class:`KernelSpacePosteriorCovariance`.  Either way O(n·F) per product
    column and per draw once the root is formed, and blocks of rows without it.
    """
    operator = KernelSpacePosteriorCovariance if kernel_space else FeatureSpacePosteriorCovariance
    factor = factor if kernel_space else CapacitanceFactor(factor)
    batch = torch.broadcast_shapes(features.shape[:-2], factor[0].shape[:-2])
    features = features.expand(*batch, *features.shape[-2:])
    return operator(features, features.new_ones(features.shape[:-1]), *factor)


def _weighted_roots(root: Tensor, weights: Tensor) -> Tensor:
    """``(*batch, m, n, F)`` roots -> ``(*batch, n, m·F)``: [w₁R₁ … w_mR_m]."""
    weighted = weights.to(root).unsqueeze(-1).unsqueeze(-1) * root
    return weighted.movedim(-3, -2).flatten(-2)


def _low_rank_samples(root: Tensor, diag: Tensor | None, num_samples: int) -> Tensor:
    """``(num_samples, *batch, n)`` draws of N(0, RRᵀ + diag(d)) as R·ε (+ √d·ε′), with no n × n matrix."""
    batch, (num_points, width) = root.shape[:-2], root.shape[-2:]
    samples = root @ torch.randn(*batch, width, num_samples, dtype=root.dtype, device=root.device)
    if diag is not None:
        independent = torch.randn(*batch, num_points, num_samples, dtype=root.dtype, device=root.device)
        samples = samples + diag.sqrt().unsqueeze(-1) * independent
    return samples.movedim(-1, 0).contiguous()


def stack_independent(covariances, batch_shape: torch.Size) -> LinearOperator | None:
    """The covariances Σ₁ … Σ_m of m independent outputs at the same n points as one ``(*batch, m, n, n)`` operator
    that keeps their roots, or ``None`` unless all are :class:`LowRankPosteriorCovariance` (or all
    :class:`LowRankPosteriorAddedDiag`).

    Roots of different widths F₁ … F_m are zero-padded to the widest, which changes no RRᵀ (nor the Woodbury
    algebra of an added diagonal).  ``BlockDiagLinearOperator(stack_independent(...), block_dim=-3)`` is then the
    joint covariance of the outputs, drawn as one batched R·ε in O(n·max F·m) per sample.
    """
    if all(isinstance(c, LowRankPosteriorCovariance) for c in covariances):
        roots, diags = [c.low_rank_root for c in covariances], None
    elif all(isinstance(c, LowRankPosteriorAddedDiag) for c in covariances):
        roots, diags = zip(*(c._expanded_root_and_diag() for c in covariances))
    else:
        return None
    width = max(root.shape[-1] for root in roots)
    roots = [torch.nn.functional.pad(root, (0, width - root.shape[-1])) for root in roots]
    root = torch.stack([r.expand(*batch_shape, *r.shape[-2:]) for r in roots], dim=-3)
    if diags is None:
        return LowRankPosteriorCovariance(root)
    diag = torch.stack([d.expand(*batch_shape, d.shape[-1]) for d in diags], dim=-2)
    return LowRankPosteriorAddedDiag(LowRankRootLinearOperator(root), DiagLinearOperator(diag))
