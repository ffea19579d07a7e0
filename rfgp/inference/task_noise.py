"""ΦΦᵀ + D_N ⊗ Σ_T: multi-output features with correlated (multitask, rank ≥ 1) observation noise.

``gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=T, rank=r ≥ 1)`` adds, in GPyTorch's
interleaved layout (row i·T + t for point i, task t), the noise I_N ⊗ Σ_T with Σ_T = BBᵀ + σ²I
(GPyTorch's ``_shaped_noise_covar``).  It is not diagonal, so the Woodbury path of
:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator` does not apply as such;
whitening each point's T rows by Σ_T's Cholesky factor C (and by √dᵢ for a diagonal D_N) makes it
apply again:

    W = D_N^{-1/2} ⊗ C⁻¹,   W(ΦΦᵀ + D_N ⊗ Σ_T)Wᵀ = Φ̃Φ̃ᵀ + I,   Φ̃ = WΦ,  r̃ = Wr,

    rᵀ(ΦΦᵀ + D_N ⊗ Σ_T)⁻¹r = r̃ᵀ(Φ̃Φ̃ᵀ + I)⁻¹r̃,
    log|ΦΦᵀ + D_N ⊗ Σ_T| = log|Φ̃Φ̃ᵀ + I| + T·log|D_N| + 2N·Σ log Cₜₜ.

Whitening costs O(N·T²·F); the rest is the diagonal-noise path (feature or kernel space, whichever
is cheaper), so the marginal likelihood and the posterior stay O(N·T·F² + F³) instead of GPyTorch's
dense O((N·T)³).  The posterior of :class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy`
uses the same whitened Φ̃ and r̃.  Where Φ = φ ⊗ B (a sketched ``MultitaskKernel``), Φ̃ = φ̃ ⊗ C⁻¹B keeps that
structure, and Φ̃ᵀΦ̃, Φ̃ᵀr̃ come from the factors without forming Φ̃ (:mod:`rfgp.inference.kronecker_statistics`).

Missing targets (``gpytorch.settings.observation_nan_policy("mask" | "fill")``): the noise of point i's
observed tasks Oᵢ (#Oᵢ of them) is dᵢ·Σ_T[Oᵢ, Oᵢ].  Its Cholesky factor is the Oᵢ block of Cᵢ = chol(Σ̃ᵢ) with
Σ̃ᵢ = Σ_T ∘ oᵢoᵢᵀ + diag(1 − oᵢ) (oᵢ the 0/1 indicator of Oᵢ): Σ̃ᵢ couples no observed task to a missing
one, so neither does Cᵢ, and its missing diagonal is 1.  Whitening point i's rows, zeroed at the missing
tasks, by Cᵢ⁻¹ gives zero rows there, which add nothing to Φ̃ᵀΦ̃, r̃ or log|Φ̃Φ̃ᵀ + I|; so the whitened
formulas above hold for the observed entries alone, with log|D_N ⊗ Σ_T| replaced by
Σᵢ (#Oᵢ·log dᵢ + 2·Σ log diag Cᵢ).  The N factors cost O(N·T³), the whitening O(N·T²·F) as before.
"""

from __future__ import annotations

import math

import torch
from linear_operator.operators import (
    ConstantDiagLinearOperator,
    DiagLinearOperator,
    KroneckerProductLinearOperator,
    LinearOperator,
    MaskedLinearOperator,
    SumLinearOperator,
)
from linear_operator.utils.memoize import cached
from torch import Tensor

from ..core.dtypes import FullPrecisionOperator
from . import distributed
from .kernel_space import prefers_kernel_space
from .operators import FeatureRootLinearOperator


def is_interleaved_task_noise(operator: LinearOperator) -> bool:
    """Whether ``operator`` is D_N ⊗ Σ_T (a diagonal N × N factor first: GPyTorch's interleaved layout)."""
    return (
        isinstance(operator, KroneckerProductLinearOperator)
        and len(operator.linear_ops) == 2
        and isinstance(operator.linear_ops[0], DiagLinearOperator)
    )


def whiten_points(matrix: Tensor, point_noise: Tensor | None, factors: Tensor,
                  indicator: Tensor | None = None) -> Tensor:
    """(D_N^{-1/2} ⊗ C⁻¹)M for an interleaved ``(..., N·T, k)`` matrix M, point i's T rows by its factor Cᵢ.

    Args:
        matrix: M, ``(..., N·T, k)``.
        point_noise: the diagonal d of D_N, ``(..., N)``; ``None`` for D_N = I (or √dᵢ already in the factors).
        factors: lower Cholesky factors Cᵢ, ``(..., N, T, T)``, or one shared ``(..., 1, T, T)``.
        indicator: optional 0/1 ``(N, T)``, zero at missing entries, whose rows are zeroed first (module docstring).
    """
    num_tasks = factors.shape[-1]
    blocks = matrix.unflatten(-2, (-1, num_tasks))  # (..., N, T, k)
    if indicator is not None:
        blocks = blocks * indicator.unsqueeze(-1).to(blocks.dtype)
    batch = torch.broadcast_shapes(blocks.shape[:-3], factors.shape[:-3])
    blocks = blocks.expand(*batch, *blocks.shape[-3:])
    whitened = torch.linalg.solve_triangular(factors, blocks, upper=False)
    if point_noise is not None:
        whitened = whitened * point_noise.rsqrt().unsqueeze(-1).unsqueeze(-1)
    return whitened.flatten(-3, -2)


class FeatureRootAddedTaskNoiseLinearOperator(FullPrecisionOperator, SumLinearOperator):
    """ΦΦᵀ + D_N ⊗ Σ_T for an interleaved multi-output feature root Φ ``(..., N·T, F)``.

    Products, diagonals and dense forms are those of the sum; ``inv_quad_logdet`` (the marginal
    likelihood) runs on the whitened features, see the module docstring.

    Args:
        features: an rfgp :class:`~rfgp.inference.operators.FeatureRootLinearOperator` ΦΦᵀ.
        task_noise: D_N ⊗ Σ_T as a ``KroneckerProductLinearOperator`` (diagonal D_N first).
    """

    def __init__(self, features: LinearOperator, task_noise: KroneckerProductLinearOperator):
        if not is_interleaved_task_noise(task_noise):
            raise TypeError(
                "task_noise must be a KroneckerProductLinearOperator D_N ⊗ Σ_T with a diagonal first factor "
                f"(GPyTorch's interleaved multitask noise), got {type(task_noise).__name__}"
            )
        super().__init__(features, task_noise)

    @property
    def feature_operator(self) -> LinearOperator:
        return self.linear_ops[0]

    @property
    def task_noise(self) -> KroneckerProductLinearOperator:
        return self.linear_ops[1]

    @cached(name="task_noise_factors")
    def _factors(self) -> tuple[Tensor, Tensor]:
        """(d ``(..., N)``, C ``(..., T, T)``): the diagonal of D_N and the Cholesky factor of Σ_T (once per operator:
        the features, the targets and the log-determinant all use it)."""
        point_noise, task_covariance = self.task_noise.linear_ops
        covariance = task_covariance.to_dense()
        chol, info = torch.linalg.cholesky_ex(covariance)
        if torch.any(info != 0):  # a host sync on the T × T factor, once per evaluation
            raise ValueError(
                "the multitask noise covariance Σ_T is singular (MultitaskGaussianLikelihood with rank < num_tasks "
                "and has_global_noise=False), so rfgp cannot whiten the features by it; accepted: a positive "
                "definite Σ_T, e.g. has_global_noise=True (the default) or rank=num_tasks"
            )
        return point_noise.diagonal(dim1=-1, dim2=-2), chol

    @cached(name="task_noise_point_factors")
    def _point_factors(self, observed: Tensor) -> Tensor:
        """Cᵢ = chol(Σ_T ∘ oᵢoᵢᵀ + diag(1 − oᵢ)) ``(..., N, T, T)`` for the interleaved mask ``(N·T,)`` (once per
        operator and mask: the features, the targets and the log-determinant all use them)."""
        _, chol = self._factors()
        indicator = observed.unflatten(-1, (-1, chol.shape[-1])).to(chol.dtype)  # (N, T)
        covariance = (chol @ chol.mT).unsqueeze(-3) * (indicator.unsqueeze(-1) * indicator.unsqueeze(-2))
        covariance = covariance + torch.diag_embed(1.0 - indicator)
        return torch.linalg.cholesky(covariance)  # positive definite: sub-blocks of Σ_T and ones

    def whiten(self, matrix: Tensor, observed: Tensor | None = None) -> Tensor:
        """W·M = (D_N^{-1/2} ⊗ C⁻¹)M for an interleaved ``(..., N·T, k)`` matrix M.

        With the boolean mask ``observed`` ``(N·T,)`` of non-missing entries, the rows of missing entries
        are zeroed and point i's rows are whitened by its own Cᵢ (module docstring): missing rows come out 0.
        """
        point_noise, factors, indicator = self.whitening_factors(observed)
        return whiten_points(matrix, point_noise, factors, indicator)

    def whitening_factors(self, observed: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor | None]:
        """(d ``(..., N)``, the factors ``(..., N or 1, T, T)``, the 0/1 indicator of observed entries ``(N, T)`` or
        ``None``) that :meth:`whiten` applies (:func:`whiten_points`)."""
        point_noise, chol = self._factors()
        if observed is None:
            return point_noise, chol.unsqueeze(-3), None
        indicator = observed.unflatten(-1, (-1, chol.shape[-1])).to(chol.dtype)
        return point_noise, self._point_factors(observed), indicator

    def noise_logdet(self, observed: Tensor | None = None) -> Tensor:
        """log|D_N ⊗ Σ_T| = T·Σ log dᵢ + 2N·Σ log Cₜₜ; with a mask, Σᵢ (#Oᵢ·log dᵢ + 2·Σ log diag Cᵢ)."""
        point_noise, chol = self._factors()
        num_points, num_tasks = point_noise.shape[-1], chol.shape[-1]
        if observed is not None:
            counts = observed.unflatten(-1, (-1, num_tasks)).sum(-1).to(point_noise.dtype)
            factors_logdet = 2.0 * torch.diagonal(self._point_factors(observed), dim1=-2, dim2=-1).log().sum((-1, -2))
            return (counts * point_noise.log()).sum(-1) + factors_logdet
        chol_logdet = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
        return num_tasks * point_noise.log().sum(-1) + num_points * chol_logdet

    def whitened_rows(self, matrix: Tensor, observed: Tensor | None = None) -> Tensor:
        """W·M at the rows of :meth:`whitened_operator`: the observed entries' under a mask (a missing entry's
        whitened row is 0)."""
        whitened = self.whiten(matrix, observed)
        return whitened if observed is None else whitened[..., observed, :]

    def whitened_operator(self, observed: Tensor | None = None) -> LinearOperator:
        """Φ̃Φ̃ᵀ + I, an rfgp noise-added feature operator with the fast marginal-likelihood path (observed rows only
        under a mask)."""
        features = self.whitened_rows(self.feature_operator.root.to_dense(), observed)
        unit = torch.ones(*features.shape[:-2], 1, dtype=features.dtype, device=features.device)
        return FeatureRootLinearOperator(features) + ConstantDiagLinearOperator(unit, diag_shape=features.shape[-2])

    def uses_kernel_space(self) -> bool:
        """Whether the whitened Φ̃Φ̃ᵀ + I is solved as an N·T × N·T matrix rather than through the F × F capacitance.

        :meth:`FeatureRootAddedDiagLinearOperator.uses_kernel_space` of :meth:`whitened_operator`, from the shapes
        alone (no whitening): Φ̃ has one member per batch member of this operator, and the unit noise is uniform.
        """
        if distributed.is_active():
            return False
        num_rows, num_features = self.feature_operator.root.shape[-2:]
        batch = math.prod(self.batch_shape)
        return prefers_kernel_space(num_rows, num_features, batch, batch, batch)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        rhs = inv_quad_rhs
        if rhs is not None and rhs.dim() == 1:
            rhs = rhs.unsqueeze(-1)
        return self.whitened_inv_quad_logdet(rhs, logdet, reduce_inv_quad)

    def whitened_inv_quad_logdet(self, rhs: Tensor | None, logdet: bool, reduce_inv_quad: bool,
                                 observed: Tensor | None = None):
        """``inv_quad_logdet`` through Φ̃Φ̃ᵀ + I, for an interleaved ``(..., N·T, k)`` right-hand side; with the mask
        ``observed``, that of the observed entries (``rhs`` is read there only)."""
        if rhs is not None:
            rhs = self.whitened_rows(rhs, observed)
        inv_quad, logdet_term = self.whitened_operator(observed).inv_quad_logdet(rhs, logdet, reduce_inv_quad)
        if logdet:  # the whitened operator sums its statistics over processes; log|D_N ⊗ Σ_T| is a sum over points too
            logdet_term = logdet_term + distributed.reduce_statistics(self.noise_logdet(observed))[0]
        return inv_quad, logdet_term

    def select_rows(self, observed: Tensor) -> "ObservedTaskNoiseLinearOperator":
        """The covariance of the entries where the interleaved boolean mask ``(N·T,)`` is ``True``."""
        if observed.dtype != torch.bool or observed.shape != self.shape[-1:]:
            raise ValueError(
                f"observed must be a boolean mask of shape ({self.shape[-1]},) (one entry per point and task), got "
                f"dtype {observed.dtype} and shape {tuple(observed.shape)}"
            )
        return ObservedTaskNoiseLinearOperator(self, observed, observed)


class ObservedTaskNoiseLinearOperator(FullPrecisionOperator, MaskedLinearOperator):
    """(ΦΦᵀ + D_N ⊗ Σ_T)[o, o]: the observed entries of a :class:`FeatureRootAddedTaskNoiseLinearOperator`.

    What ``gpytorch.settings.observation_nan_policy("mask")`` asks of the marginal likelihood.  Products and
    dense forms are GPyTorch's masked ones; ``inv_quad_logdet`` whitens point by point with the factors of
    the observed sub-blocks of Σ_T (module docstring), exactly and at feature-space cost.

    Args:
        base: the operator over all N·T entries.
        row_mask, col_mask: the same boolean mask ``(N·T,)`` of observed entries, in GPyTorch's interleaved order.
    """

    def __init__(self, base: FeatureRootAddedTaskNoiseLinearOperator, row_mask: Tensor, col_mask: Tensor):
        if not isinstance(base, FeatureRootAddedTaskNoiseLinearOperator):
            raise TypeError(f"base must be a FeatureRootAddedTaskNoiseLinearOperator, got {type(base).__name__}")
        if row_mask is not col_mask and not torch.equal(row_mask, col_mask):
            raise ValueError("row_mask and col_mask must be the same mask of observed entries")
        super().__init__(base, row_mask, col_mask)

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        observed = self.row_mask
        rhs = inv_quad_rhs
        if rhs is not None:  # the observed entries' values in the full interleaved layout
            rhs = rhs.unsqueeze(-1) if rhs.dim() == 1 else rhs
            scattered = rhs.new_zeros(*rhs.shape[:-2], observed.shape[-1], rhs.shape[-1])
            scattered[..., observed, :] = rhs
            rhs = scattered
        return self.base.whitened_inv_quad_logdet(rhs, logdet, reduce_inv_quad, observed)
