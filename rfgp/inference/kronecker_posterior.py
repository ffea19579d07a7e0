r"""The test side of a sketched multitask posterior from the Kronecker factors of its test root.

At n* test points a sketched ``MultitaskKernel`` (:class:`~rfgp.kernels.SketchedDecomposableKernel`) has the test root
Φ* = φ* ⊗ B (n*·T × F·m interleaved: row i·T + t, column f·m + k; φ* the n* × F data features, B the T × m task
factor, m = rank + T).  With the weight posterior θ | y ~ N(w, A⁻¹) (F·m wide, :mod:`rfgp.inference.multioutput`)
the predictive mean and variance are contracted factor by factor instead of pushing Φ* through the F·m-wide
posterior (the row-major rule (X ⊗ Y)vec_r(W) = vec_r(X·W·Yᵀ); Van Loan, "The ubiquitous Kronecker product",
J. Comput. Appl. Math. 123, 2000, §2):

    mean[i, t] = (φ*ᵢ ⊗ B_t)·w = (φ*·W·Bᵀ)[i, t],   W = w as F × m             O(n*·F·m + n*·m·T),
    var[i, t]  = (φ*ᵢ ⊗ B_t)·C·(φ*ᵢ ⊗ B_t)ᵀ = B_t·Mᵢ·B_tᵀ,
    Mᵢ[k, l]   = Σ_{f,g} φ*_{if}·C[(f, k), (g, l)]·φ*_{ig}   (C = A⁻¹ as F × m × F × m)  O(n*·(F·m)² + n*·F·m²),

where the root path costs n*·T·(F·m)² (the triangular solve Φ*L⁻ᵀ, L = chol(A)), plus (F·m)³ once for C = L⁻ᵀL⁻¹.
The variance takes the contraction where its flops, (F·m)³ + n*·(F·m)² + n*·F·m² + n*·T·m² (the products weighted
by their measured cost per flop), are fewer than the root's n*·T·(F·m)² (:func:`prefers_kronecker_variance`: about
n*·(T − 1.5) > F·m), the points in blocks whose n*_b × m × F·m intermediate is no larger than C; the mean always (it
costs no more than the root's product Φ*w, n*·T·F·m).  Both are the same numbers to rounding, with the same
gradients w.r.t. the test inputs and the hyperparameters (plain autograd through both orders).  The covariance keeps
the lazy root Φ*L⁻ᵀ for everything else (products, joint samples, rows, log-densities); an added diagonal noise
(``MultitaskGaussianLikelihood`` of rank 0) keeps the contraction for the variance and forms the root only where it is
read (:class:`DeferredPosteriorRoot`).  The kernel-space posterior (N·T ≲ F·m) takes the mean from the factors and
keeps its root for the variance.  A test covariance over :class:`rfgp.settings.memory_budget` does the same a block of
points at a time (:class:`ChunkedKroneckerPosteriorCovariance`, φ*_c from the kernel's data featurizer).
"""

from __future__ import annotations

import torch
from linear_operator.operators import DenseLinearOperator, DiagLinearOperator, LinearOperator, LowRankRootLinearOperator
from torch import Tensor

from ..core.dtypes import FullPrecisionOperator
from .multioutput_chunking import ChunkedPosteriorCovariance
from .posterior_covariance import FeatureSpacePosteriorCovariance, LowRankPosteriorAddedDiag


def kronecker_mean(data_features: Tensor, task_factor: Tensor, weights: Tensor) -> Tensor:
    """(φ* ⊗ B)·w ``(..., n*·T)`` interleaved, as φ*·W·Bᵀ with W the ``(..., F·m, 1)`` weights w as F × m."""
    matrix = weights.squeeze(-1).unflatten(-1, (data_features.shape[-1], task_factor.shape[-1]))
    return ((data_features @ matrix) @ task_factor.mT).flatten(-2)


#: the cost of the contraction's n*·(F·m)² products per flop relative to the root's triangular solve, measured on the
#: variances alone (one thread, paired, F·m = 768 and 1 280, n* = 100–3 000: 1.1–1.9); C = A⁻¹ (LAPACK's potri) costs
#: about a solve's flop.  End to end: ``benchmarks/results/kronecker_gram.md``, third table
CONTRACTION_WEIGHT = 1.5


def prefers_kronecker_variance(num_points: int, num_tasks: int, data_width: int, task_width: int) -> bool:
    """Whether the contraction (module docstring) costs less than the root Φ*L⁻ᵀ for the variances of ``num_points``
    test points: (F·m)³ (C = A⁻¹) + w·(n*·(F·m)² + n*·F·m² + n*·T·m²) < n*·T·(F·m)², its products weighted by the
    measured :data:`CONTRACTION_WEIGHT` w against the root's triangular-solve flops (about n*·(T − 1.5) > F·m)."""
    width = data_width * task_width
    products = num_points * (width * width + data_width * task_width**2 + num_tasks * task_width**2)
    return width**3 + CONTRACTION_WEIGHT * products < num_points * num_tasks * width * width


def weight_covariance(chol: Tensor) -> Tensor:
    """C = A⁻¹ = L⁻ᵀL⁻¹ ``(..., F·m, F·m)`` from L = chol(A), row-major: ``torch.cholesky_inverse`` returns it
    column-major, and every block of :func:`kronecker_variance` would otherwise copy it to reshape it (a chunked test
    covariance's variance took twice the root path's time)."""
    return torch.cholesky_inverse(chol).contiguous()


def kronecker_variance(data_features: Tensor, task_factor: Tensor, weight_covariance: Tensor) -> Tensor:
    """diag((φ* ⊗ B)·C·(φ* ⊗ B)ᵀ) ``(..., n*·T)`` interleaved for C ``(..., F·m, F·m)`` (module docstring), in blocks
    of points whose ``(b, m, F·m)`` intermediate has no more entries than C."""
    num_features, task_width = data_features.shape[-1], task_factor.shape[-1]
    width = num_features * task_width
    covariance = weight_covariance.unflatten(-2, (num_features, task_width)).flatten(-2, -1)  # (..., F, m·F·m)
    block = max(1, width // task_width)
    variances = []
    for start in range(0, data_features.shape[-2], block):
        points = data_features[..., start:start + block, :]
        projected = (points @ covariance).unflatten(-1, (task_width, num_features, task_width))  # (..., b, m, F, m)
        # Mᵢ as a batch of (1 × F)·(F × m) products over P's contiguous blocks (an einsum permuted P: 5–8× slower)
        inner = (points.unsqueeze(-2).unsqueeze(-3) @ projected).squeeze(-2)  # (..., b, m, m)
        variances.append(((task_factor.unsqueeze(-3) @ inner) * task_factor.unsqueeze(-3)).sum(-1))  # B_t·Mᵢ·B_tᵀ
    return torch.cat(variances, -2).flatten(-2)


class KroneckerFeatureSpacePosteriorCovariance(FeatureSpacePosteriorCovariance):
    """:class:`~rfgp.inference.posterior_covariance.FeatureSpacePosteriorCovariance` Σ* = SΦ*A⁻¹Φ*ᵀS of a test root
    Φ* = φ* ⊗ B that keeps its factors: its diagonal (the predictive variance) is contracted factor by factor where
    that costs fewer flops (:func:`prefers_kronecker_variance`), everything else reads the lazy root.

    Args:
        features: Φ* ``(*batch, n*·T, F·m)``, broadcast to the factor's batch.
        scale: S's diagonal ``(*batch, n*·T)``.
        factor: L = chol(A) ``(*batch, F·m, F·m)``.
        data_features: φ* ``(..., n*, F)``.
        task_factor: B ``(..., T, m)``.
    """

    def __init__(self, features: Tensor, scale: Tensor, *factor: Tensor, data_features: Tensor,
                 task_factor: Tensor) -> None:
        LinearOperator.__init__(self, features, scale, *factor, data_features=data_features, task_factor=task_factor)
        self.test_features, self.scale = features, scale
        self.factor = self.factor_type(*factor)
        self.data_features, self.task_factor = data_features, task_factor

    def uses_kronecker_variance(self) -> bool:
        """Whether :meth:`_diagonal` contracts the factors (fewer flops than the root, per batch member)."""
        (num_points, data_width), (num_tasks, task_width) = self.data_features.shape[-2:], self.task_factor.shape[-2:]
        return prefers_kronecker_variance(num_points, num_tasks, data_width, task_width)

    def _diagonal(self) -> Tensor:
        if not self.uses_kronecker_variance():
            return super()._diagonal()
        chol = self.factor.cholesky
        covariance = weight_covariance(chol)
        data, task = self.data_features.to(chol.dtype), self.task_factor.to(chol.dtype)
        variance = kronecker_variance(data, task, covariance) * self.scale.to(chol.dtype).square()
        return variance.expand(self.shape[:-1]).to(self.test_features.dtype)

    def rescaled(self, scale: Tensor) -> KroneckerFeatureSpacePosteriorCovariance:
        scale = scale * self.scale
        features = self.test_features.expand(*scale.shape, self.test_features.shape[-1])
        return self.__class__(features, scale, *self.factor, data_features=self.data_features,
                              task_factor=self.task_factor)

    def __add__(self, other):
        """Σ* + D for a diagonal D (noise) as :class:`~rfgp.inference.posterior_covariance.LowRankPosteriorAddedDiag`
        whose root is formed only where it is read (its diagonal this operator's plus D's)."""
        if isinstance(other, DiagLinearOperator):
            return LowRankPosteriorAddedDiag(DeferredPosteriorRoot(self), other)
        return super().__add__(other)


def kronecker_posterior_covariance(features: Tensor, chol: Tensor, data_features: Tensor,
                                   task_factor: Tensor) -> KroneckerFeatureSpacePosteriorCovariance:
    """Σ* = Φ*A⁻¹Φ*ᵀ at the test root Φ* = φ* ⊗ B ``(..., n*·T, F·m)`` from L = chol(A), keeping φ* and B, as
    :func:`~rfgp.inference.posterior_covariance.feature_posterior_covariance` builds it in feature space."""
    batch = torch.broadcast_shapes(features.shape[:-2], chol.shape[:-2])
    features = features.expand(*batch, *features.shape[-2:])
    return KroneckerFeatureSpacePosteriorCovariance(features, features.new_ones(features.shape[:-1]), chol,
                                                    data_features=data_features, task_factor=task_factor)


class ChunkedKroneckerPosteriorCovariance(ChunkedPosteriorCovariance):
    """:class:`~rfgp.inference.multioutput_chunking.ChunkedPosteriorCovariance` of a test covariance over the memory
    budget that keeps its factors (:class:`~rfgp.inference.chunked_kronecker.ChunkedKroneckerFeatureOperator`): its
    diagonal contracts each block's φ*_c with B and C = A⁻¹ where that costs fewer flops for all n* points
    (:func:`prefers_kronecker_variance`), everything else reads the blocks of the root Φ*_cL⁻ᵀ.

    Args:
        prior: the chunked test covariance.
        root: Φ*_c ↦ Φ*_cL⁻ᵀ.
        noise: optional diagonal ``(..., n*·T)``.
        chol: L = chol(A) ``(..., F·m, F·m)``.
        batch_shape: the posterior's batch where it is wider than the prior's (an unbatched kernel under batched
            targets: L carries their batch); ``None``: the prior's.
    """

    def __init__(self, prior, *params: Tensor, root, noise: Tensor | None = None, chol: Tensor,
                 batch_shape: torch.Size | None = None) -> None:
        LinearOperator.__init__(self, prior, *params, root=root, noise=noise, chol=chol, batch_shape=batch_shape)
        self.prior, self.params, self.root, self.noise, self.chol = prior, params, root, noise, chol
        self._posterior_batch_shape = prior.batch_shape if batch_shape is None else torch.Size(batch_shape)

    def _diagonal(self) -> Tensor:
        task = self.prior.task_factor
        if not prefers_kronecker_variance(self.prior.inputs1.shape[-2], task.shape[-2],
                                          self.prior.data_featurizer.num_features, task.shape[-1]):
            return super()._diagonal()
        covariance = weight_covariance(self.chol)
        task = task.to(covariance.dtype)
        blocks = []
        for rows, data in self.prior.data_chunks():
            block = kronecker_variance(data.to(covariance.dtype), task, covariance).to(self.dtype)
            block = block.expand(*self.batch_shape, block.shape[-1])
            noise = self._noise(rows)
            blocks.append(block if noise is None else block + noise)
        return torch.cat(blocks, -1)


class DeferredPosteriorRoot(FullPrecisionOperator, LowRankRootLinearOperator):
    """RRᵀ of a lazy-root posterior covariance Σ* (:class:`KroneckerFeatureSpacePosteriorCovariance`) as the
    ``LowRankRootLinearOperator`` that linear_operator's low-rank-plus-diagonal algebra needs, its root R read from Σ*
    (formed there at the first read) and its diagonal Σ*'s own; derived operators (expanded, indexed, scaled) are
    plain ones of R.

    Args:
        posterior: Σ*.
    """

    def __init__(self, posterior: KroneckerFeatureSpacePosteriorCovariance) -> None:
        LinearOperator.__init__(self, posterior)
        self.posterior = posterior

    @property
    def root(self) -> DenseLinearOperator:
        return DenseLinearOperator(self.posterior.low_rank_root)

    def _size(self) -> torch.Size:
        return self.posterior.shape

    def _diagonal(self) -> Tensor:
        return self.posterior._diagonal()

    def _plain(self) -> LowRankRootLinearOperator:
        return LowRankRootLinearOperator(self.posterior.low_rank_root)

    def _expand_batch(self, batch_shape) -> LinearOperator:
        return self._plain()._expand_batch(batch_shape)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        return self._plain()._getitem(row_index, col_index, *batch_indices)

    def _mul_constant(self, other) -> LinearOperator:
        return self._plain()._mul_constant(other)


__all__ = [
    "ChunkedKroneckerPosteriorCovariance",
    "DeferredPosteriorRoot",
    "KroneckerFeatureSpacePosteriorCovariance",
    "kronecker_mean",
    "kronecker_posterior_covariance",
    "kronecker_variance",
    "prefers_kronecker_variance",
    "weight_covariance",
]
