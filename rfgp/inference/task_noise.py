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
uses the same whitened Φ̃ and r̃.
"""

from __future__ import annotations

import torch
from linear_operator.operators import (
    ConstantDiagLinearOperator,
    DiagLinearOperator,
    KroneckerProductLinearOperator,
    LinearOperator,
    SumLinearOperator,
)
from linear_operator.utils.memoize import cached
from torch import Tensor

from .operators import FeatureRootLinearOperator


def is_interleaved_task_noise(operator: LinearOperator) -> bool:
    """Whether ``operator`` is D_N ⊗ Σ_T (a diagonal N × N factor first: GPyTorch's interleaved layout)."""
    return (
        isinstance(operator, KroneckerProductLinearOperator)
        and len(operator.linear_ops) == 2
        and isinstance(operator.linear_ops[0], DiagLinearOperator)
    )


def masked_task_noise_error() -> ValueError:
    """Missing targets (``observation_nan_policy("mask" | "fill")``) with correlated task noise: not supported."""
    return ValueError(
        "gpytorch.settings.observation_nan_policy('mask'/'fill') with correlated multitask noise "
        "(MultitaskGaussianLikelihood with rank ≥ 1) is not supported: the noise of a point's observed tasks is a "
        "sub-block of Σ_T that the per-point whitening does not form; accepted: rank=0 (independent task noises), "
        "or training data without NaN targets"
    )


class FeatureRootAddedTaskNoiseLinearOperator(SumLinearOperator):
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

    def whiten(self, matrix: Tensor) -> Tensor:
        """W·M = (D_N^{-1/2} ⊗ C⁻¹)M for an interleaved ``(..., N·T, k)`` matrix M."""
        point_noise, chol = self._factors()
        num_tasks = chol.shape[-1]
        blocks = matrix.unflatten(-2, (-1, num_tasks))  # (..., N, T, k)
        batch = torch.broadcast_shapes(blocks.shape[:-3], chol.shape[:-2])
        blocks = blocks.expand(*batch, *blocks.shape[-3:])
        whitened = torch.linalg.solve_triangular(chol.unsqueeze(-3), blocks, upper=False)
        whitened = whitened * point_noise.rsqrt().unsqueeze(-1).unsqueeze(-1)
        return whitened.flatten(-3, -2)

    def noise_logdet(self) -> Tensor:
        """log|D_N ⊗ Σ_T| = T·Σ log dᵢ + 2N·Σ log Cₜₜ."""
        point_noise, chol = self._factors()
        num_points, num_tasks = point_noise.shape[-1], chol.shape[-1]
        chol_logdet = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
        return num_tasks * point_noise.log().sum(-1) + num_points * chol_logdet

    def whitened_operator(self) -> LinearOperator:
        """Φ̃Φ̃ᵀ + I, an rfgp noise-added feature operator with the fast marginal-likelihood path."""
        features = self.whiten(self.feature_operator.root.to_dense())
        unit = torch.ones(*features.shape[:-2], 1, dtype=features.dtype, device=features.device)
        return FeatureRootLinearOperator(features) + ConstantDiagLinearOperator(unit, diag_shape=features.shape[-2])

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        rhs = inv_quad_rhs
        if rhs is not None:
            rhs = self.whiten(rhs.unsqueeze(-1) if rhs.dim() == 1 else rhs)
        inv_quad, logdet_term = self.whitened_operator().inv_quad_logdet(rhs, logdet, reduce_inv_quad)
        if logdet:
            logdet_term = logdet_term + self.noise_logdet()
        return inv_quad, logdet_term
