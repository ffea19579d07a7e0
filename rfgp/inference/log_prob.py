"""The feature-space marginal likelihood whatever ``gpytorch.settings.fast_computations`` says.

GPyTorch's ``MultivariateNormal.log_prob`` has two branches, chosen by the global flag
``fast_computations.log_prob``: the "fast" one hands the covariance operator to its own
``inv_quad_logdet`` — for rfgp's ΦΦᵀ + D that is the O(N·F² + F³) Woodbury/determinant-lemma
path of :mod:`rfgp.inference.operators` (exact, not iterative) — while the "slow" one asks for a dense
N × N Cholesky factor.  ``import botorch`` switches the flag off for the whole process
(linear_operator's ``_fast_log_prob._default = False``), so from then on an rfgp model's
marginal likelihood would cost O(N³) time and O(N²) memory (N = 2000, F = 256: 1.5 s instead
of 0.05 s per MLL and gradient) and fail with ``NotPSDError`` where ΦΦᵀ + D is ill-conditioned.

:func:`install` (run at ``import rfgp``) wraps ``MultivariateNormal.log_prob`` so that, **only
when the evaluated covariance is an rfgp noise-added feature operator**
(:data:`FEATURE_SPACE_OPERATORS`), the density is rfgp's own :func:`feature_space_log_prob`, which asks the
covariance for its ``inv_quad_logdet`` (the structured algebra, as GPyTorch's "fast" branch would) with or without
the flag.  It enters no GPyTorch setting: entering ``fast_computations.log_prob(True)`` around the call — as rfgp
did — is process-wide, so threads training rfgp models at once could leave it on for the process's other models.
Every other covariance goes to GPyTorch's unchanged method, so no other model changes behaviour.

Under ``gpytorch.settings.observation_nan_policy("mask")`` GPyTorch hands ``log_prob`` the covariance
wrapped in a ``MaskedLinearOperator`` (NaN targets' rows and columns dropped), which has no
feature-space algebra; the wrapper replaces it by the rfgp operator of the observed rows
(:func:`rfgp.inference.operators.select_observed`), so the masked marginal likelihood is the exact
one of the NaN-free subset at feature-space cost.

``MultitaskMultivariateNormal.log_prob`` flattens its ``(…, N, T)`` targets before the covariance checks them, so
:func:`install` also wraps it: the residual of an rfgp multi-output covariance is checked there, and a NaN or Inf
target is named by its (point, task) instead of the flat index n·T + t (or, under ``"mask"``, its place among
the observed entries).  Under ``"mask"`` and ``"fill"`` a NaN target that reaches a log-density — a distribution's
``log_prob``, which takes every target, unlike ``ExactMarginalLogLikelihood`` — is refused saying so
(:func:`refuse_unmasked_nan`).
"""

from __future__ import annotations

import functools
import math

import gpytorch
import torch
from gpytorch.distributions import MultitaskMultivariateNormal, MultivariateNormal
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..core import settings
from ..core.validation import RESIDUAL, check_finite, check_targets
from . import distributed
from .independent_tasks import IndependentTasksAddedDiagLinearOperator, ObservedIndependentTasks
from .kernel_evaluation import evaluated_covariance
from .operators import ChunkedFeatureRootAddedDiagLinearOperator, FeatureRootAddedDiagLinearOperator, select_observed
from .posterior_covariance import LowRankPosteriorAddedDiag
from .prediction import target_batch_as_columns
from .task_noise import FeatureRootAddedTaskNoiseLinearOperator, ObservedTaskNoiseLinearOperator

#: noise-added covariances whose ``inv_quad_logdet`` works in feature space (their subclasses —
#: classification and complex-posterior operators — included), and posterior predictive covariances
#: whose ``inv_quad_logdet`` picks the cheaper exact algebra
FEATURE_SPACE_OPERATORS = (
    FeatureRootAddedDiagLinearOperator,
    ChunkedFeatureRootAddedDiagLinearOperator,
    FeatureRootAddedTaskNoiseLinearOperator,
    ObservedTaskNoiseLinearOperator,
    IndependentTasksAddedDiagLinearOperator,
    ObservedIndependentTasks,
    LowRankPosteriorAddedDiag,
)


def has_feature_space_covariance(distribution: MultivariateNormal) -> bool:
    """Whether the distribution's covariance, kernels evaluated, is one of :data:`FEATURE_SPACE_OPERATORS`."""
    covar = distribution.lazy_covariance_matrix
    if not isinstance(covar, LinearOperator):
        return False
    # evaluate_kernel is what both of GPyTorch's branches do first (and it is cached on lazy kernels)
    return isinstance(evaluated_covariance(covar), FEATURE_SPACE_OPERATORS)


def feature_space_log_prob(distribution: MultivariateNormal, value: Tensor) -> Tensor:
    """log N(y; μ, K) = −½[rᵀK⁻¹r + log|K| + N log 2π], r = y − μ, by the covariance's own ``inv_quad_logdet``.

    For a covariance of :data:`FEATURE_SPACE_OPERATORS` that is the exact feature-space (Woodbury and
    determinant-lemma) or kernel-space algebra, whatever ``gpytorch.settings.fast_computations`` says, and no
    process-wide setting is entered (threads).  Batch dimensions of ``value`` beyond the covariance's (fantasies,
    BoTorch's sample batches) are folded into right-hand-side columns, so one factorisation serves them all; a
    covariance batch dimension of size 1 is expanded to the residual's.  Returns the ``(*batch)`` log densities.
    """
    if distribution._validate_args:
        distribution._validate_sample(value)
    covar = evaluated_covariance(distribution.lazy_covariance_matrix)
    residual = value - distribution.loc
    refuse_unmasked_nan(residual, RESIDUAL)
    batch = torch.broadcast_shapes(residual.shape[:-1], covar.batch_shape)
    residual = residual.expand(*batch, residual.shape[-1])
    operator_batch = batch[len(batch) - len(covar.batch_shape):]
    if operator_batch != covar.batch_shape:
        covar = covar.expand(*operator_batch, *covar.shape[-2:])
    columns, extra = target_batch_as_columns(residual, len(operator_batch))
    inv_quad, logdet = covar.inv_quad_logdet(inv_quad_rhs=columns, logdet=True, reduce_inv_quad=False)
    inv_quad = inv_quad.movedim(-1, 0).reshape(batch) if extra else inv_quad.squeeze(-1)
    return -0.5 * (inv_quad + logdet + residual.shape[-1] * math.log(2 * math.pi))


def refuse_unmasked_nan(residual: Tensor, name: str) -> None:
    """Under ``observation_nan_policy("mask"/"fill")``, raise :class:`~rfgp.core.validation.NonFiniteError` for a
    NaN in the ``residual`` of a log-density (indexed as given), saying what leaves NaN targets out.

    GPyTorch's ``ExactMarginalLogLikelihood`` masks them before it asks for the density (of the observed entries);
    a distribution's ``log_prob`` takes every target under any policy (GPyTorch's own returns NaN), where the
    covariance's check advised the policy already in use."""
    policy = gpytorch.settings.observation_nan_policy.value()
    if policy != "ignore" and settings.validate_inputs.on() and bool(residual.isnan().any()):
        check_finite(residual, name, f"under observation_nan_policy('{policy}') GPyTorch's ExactMarginalLogLikelihood "
                     "leaves NaN targets out, but a distribution's log_prob takes every target (GPyTorch's returns "
                     "NaN): pass the observed entries only, or use ExactMarginalLogLikelihood")


def _feature_space_log_prob(gpytorch_log_prob):
    @functools.wraps(gpytorch_log_prob)
    def log_prob(self, value):
        observed = select_observed(self.lazy_covariance_matrix)
        if observed is not None:  # observation_nan_policy("mask"): the feature operator of the observed rows
            self = MultivariateNormal(self.loc, observed)
        if not has_feature_space_covariance(self):
            return gpytorch_log_prob(self, value)
        return feature_space_log_prob(self, value)

    log_prob.gpytorch_log_prob = gpytorch_log_prob
    return log_prob


def _checked_multitask_log_prob(gpytorch_log_prob):
    @functools.wraps(gpytorch_log_prob)
    def log_prob(self, value):
        # GPyTorch flattens the (…, N, T) targets before the covariance sees them, whose check would name the entry
        # n·T + t (or, under "mask", its place among the observed entries): checked here while the (point, task)
        # index exists; under "mask" and "fill" an Inf first, then the NaN targets, which log_prob does not leave out
        if has_feature_space_covariance(self):
            if not torch.is_tensor(value) or value.shape[-2:] != self.mean.shape[-2:]:
                # before: "The size of tensor a (90) must match the size of tensor b (3)" from the subtraction
                points, tasks = self.mean.shape[-2:]
                shape = tuple(value.shape) if torch.is_tensor(value) else type(value).__name__
                raise ValueError(f"the targets must have shape (..., n, T) = (..., {points}, {tasks}), one row per "
                                 f"point and one column per task (output), got {shape}; reshape a flat interleaved "
                                 f"vector with .reshape(-1, {tasks}) and transpose a (T, n) array")
            residual = value - self.mean
            if gpytorch.settings.observation_nan_policy.value() != "ignore":
                check_targets(torch.where(value.isnan(), residual.new_zeros(()), residual).flatten(-2), RESIDUAL,
                              self.num_tasks, allow_empty=distributed.is_active())
                refuse_unmasked_nan(residual, f"{RESIDUAL}, indexed (…, point, task),")
            else:
                check_targets(residual.flatten(-2), RESIDUAL, self.num_tasks, allow_empty=distributed.is_active())
        return gpytorch_log_prob(self, value)

    log_prob.gpytorch_log_prob = gpytorch_log_prob
    return log_prob


def install() -> None:
    """Wrap ``gpytorch.distributions.MultivariateNormal.log_prob`` (idempotent; subclasses inherit it), and
    ``MultitaskMultivariateNormal.log_prob`` so that a non-finite target of an rfgp multi-output covariance is named
    by its (point, task)."""
    current = MultivariateNormal.log_prob
    if getattr(current, "gpytorch_log_prob", None) is None:
        MultivariateNormal.log_prob = _feature_space_log_prob(current)
    current = MultitaskMultivariateNormal.log_prob
    if getattr(current, "gpytorch_log_prob", None) is None:
        MultitaskMultivariateNormal.log_prob = _checked_multitask_log_prob(current)
