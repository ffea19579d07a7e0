"""GPyTorch's ``LeaveOneOutPseudoLikelihood`` in O(N·F² + F³) for rfgp covariances.

The leave-one-out pseudo-likelihood (Rasmussen & Williams 2006, §5.4.2, Eq. 5.11)

    L_LOO = (1/N) Σᵢ log N(yᵢ | μ₋ᵢ, σ²₋ᵢ)  (+ the priors' log densities / N, as GPyTorch adds them)

is a training objective users pick instead of the exact marginal likelihood.  GPyTorch's
``gpytorch.mlls.LeaveOneOutPseudoLikelihood.forward`` takes the Cholesky factor of the N × N noise-added covariance
and solves it against the N × N identity for diag(K⁻¹): O(N³) time and O(N²) memory whatever the kernel (one
value and gradient of an rfgp model, F = 256, float64, 2 shared cores: 3.9 s at N = 2000 and 64 s at N = 5000, now
0.20 s and 0.51 s; ``benchmarks/leave_one_out.py``).  :func:`install` (run at ``import rfgp``) wraps that method: when
the latent covariance is an rfgp feature operator and the noise-added one is accepted by
:func:`~rfgp.inference.leave_one_out.feature_covariance`, μ₋ᵢ and σ²₋ᵢ come from
:func:`~rfgp.inference.leave_one_out.leave_one_out_moments` (Woodbury, F × F factor; those of the training covariance
ΦΦᵀ + D, which the marginal likelihood trains, without a map's variance correction) and the objective is formed
as GPyTorch forms it; its value and gradients are those of the dense path up to rounding.  Every other model —
multitask distributions, covariances without a feature root — runs GPyTorch's unchanged method.
"""

from __future__ import annotations

import functools
import math

from gpytorch.distributions import MultivariateNormal
from gpytorch.mlls import LeaveOneOutPseudoLikelihood
from linear_operator.operators import LinearOperator

from .kernel_evaluation import evaluated_covariance
from .leave_one_out import feature_covariance, leave_one_out_moments
from .operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator


def _has_feature_root(distribution) -> bool:
    covar = distribution.lazy_covariance_matrix
    return isinstance(covar, LinearOperator) and isinstance(
        evaluated_covariance(covar), (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator))


def _feature_space_forward(gpytorch_forward):
    @functools.wraps(gpytorch_forward)
    def forward(self, function_dist, target, *params):
        if type(function_dist) is not MultivariateNormal or not _has_feature_root(function_dist):
            return gpytorch_forward(self, function_dist, target, *params)
        output = self.likelihood(function_dist, *params)
        covar = feature_covariance(output.lazy_covariance_matrix) if type(output) is MultivariateNormal else None
        if covar is None:
            return gpytorch_forward(self, function_dist, target, *params)
        mean, variance = leave_one_out_moments(covar, target, output.mean.reshape(*target.shape))
        log_density = -0.5 * variance.log() - 0.5 * (target - mean).pow(2) / variance
        result = self._add_other_terms(log_density.sum(-1), params)
        return result.div_(target.size(-1)) - 0.5 * math.log(2 * math.pi)

    forward.gpytorch_forward = gpytorch_forward
    return forward


def install() -> None:
    """Wrap ``gpytorch.mlls.LeaveOneOutPseudoLikelihood.forward`` (idempotent)."""
    current = LeaveOneOutPseudoLikelihood.forward
    if getattr(current, "gpytorch_forward", None) is None:
        LeaveOneOutPseudoLikelihood.forward = _feature_space_forward(current)
