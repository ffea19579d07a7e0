"""Leave-one-out predictions of a noise-added feature covariance K = ΦΦᵀ + D in O(N·F² + F³).

With α = K⁻¹r (r = y − μ the residual) the Gaussian process fitted to all points but the i-th predicts y_i with

    μ₋ᵢ = y_i − αᵢ / [K⁻¹]ᵢᵢ,    σ²₋ᵢ = 1 / [K⁻¹]ᵢᵢ

(Rasmussen & Williams 2006, §5.4.2, Eqs. 5.12–5.13).  GPyTorch's ``LeaveOneOutPseudoLikelihood`` and BoTorch's
``loo_cv`` take diag(K⁻¹) from a dense N × N Cholesky factor (O(N³) time, O(N²) memory).  For K = ΦΦᵀ + D, D
diagonal with W = D⁻¹, Woodbury with the capacitance A = I + ΦᵀWΦ = LLᵀ and V = ΦL⁻ᵀ (N × F) gives

    [K⁻¹]ᵢᵢ = wᵢ − wᵢ²‖vᵢ‖²,    K⁻¹r = Wr − WV(L⁻¹ΦᵀWr),

so the cost is that of the marginal likelihood: the statistics ΦᵀWΦ and ΦᵀWr
(:meth:`~rfgp.inference.operators.FeatureRootLinearOperator.feature_statistics`; float32 features' in float64 where
:mod:`~rfgp.inference.statistics_precision` says so, as for the marginal likelihood), the F × F factor
(:func:`~rfgp.inference.linalg.capacitance_cholesky`, in :func:`~rfgp.core.dtypes.factor_dtype`) and one N × F
triangular solve.  The per-point differences wᵢ − wᵢ²‖vᵢ‖², which cancel at a high signal-to-noise ratio, are taken
in the factor's dtype and rounded back.  When the N × N matrix is cheaper (always when N ≤ F,
:meth:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator.uses_kernel_space`) K is factorised as it is
(:func:`~rfgp.inference.kernel_space.kernel_cholesky`: in float64 for float32 features where the rule of
:mod:`~rfgp.inference.statistics_precision` says so, the results rounded back).  Chunked operators
(:class:`rfgp.settings.memory_budget`) form V chunk by chunk; under autograd the chunks' solves are kept for the
backward pass (O(N·F) memory, never O(N²)).  D is the likelihood's noise only: K is the training covariance, which
the marginal likelihood and GPyTorch's ``LeaveOneOutPseudoLikelihood`` (:func:`leave_one_out_moments`) use.  A
feature map biased on the diagonal (truncated Maclaurin, fitted spherical densities; paper 000 §5.6) carries the
correction c(x) = k(x, x) − E k̂(x, x) beside Φ, which the model adds to every predictive variance: the model fitted to
all points but the i-th predicts y_i with variance σ²₋ᵢ + c(xᵢ), and :func:`leave_one_out_predictions` returns that.
Everything is differentiable by autograd.
"""

from __future__ import annotations

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor

from ..core.validation import check_noise, check_targets
from . import distributed
from .classification import ChunkedClassNoiseFeatureLinearOperator, ClassNoiseFeatureLinearOperator
from .kernel_evaluation import evaluated_covariance
from .kernel_space import kernel_cholesky
from .linalg import capacitance_cholesky
from .operators import (
    ChunkedFeatureRootAddedDiagLinearOperator,
    ChunkedFeatureRootLinearOperator,
    FeatureRootAddedDiagLinearOperator,
    adaptive_feature_statistics,
    noise_weights,
)
from .triangular_statistics import TriangularFeaturizer

#: noise-added covariances ΦΦᵀ + D whose leave-one-out terms are formed here — exact types: the Dirichlet
#: classifier's class-noise operators are the same matrices (their label structure only speeds up the marginal
#: likelihood), while the complex GP's operator defines a different covariance for its marginal likelihood
LEAVE_ONE_OUT_OPERATORS = (FeatureRootAddedDiagLinearOperator, ChunkedFeatureRootAddedDiagLinearOperator,
                           ClassNoiseFeatureLinearOperator, ChunkedClassNoiseFeatureLinearOperator)


def feature_covariance(covar) -> LinearOperator | None:
    """``covar`` with its kernels evaluated if it is one of :data:`LEAVE_ONE_OUT_OPERATORS`, else ``None``.

    Refused inside :class:`~rfgp.inference.distributed.data_parallel`: leave-one-out terms need (K⁻¹)ᵢᵢ over all
    points, which no process holds (GPyTorch's dense fallback would use its own shard only)."""
    distributed.refuse("leave-one-out terms (LeaveOneOutPseudoLikelihood, cross-validation, the classifier check)")
    if not isinstance(covar, LinearOperator):
        return None
    covar = evaluated_covariance(covar)
    return covar if type(covar) in LEAVE_ONE_OUT_OPERATORS else None


def leave_one_out_terms(covar: LinearOperator, residual: Tensor) -> tuple[Tensor, Tensor]:
    """(K⁻¹r, diag K⁻¹), both ``(*batch, N)``, for a covariance K accepted by :func:`feature_covariance` and a
    residual r ``(*batch, N)`` (broadcast against K's batch).  Non-finite residuals raise a ``ValueError``
    (:func:`~rfgp.core.validation.check_targets`), non-positive noise an ``InvalidValueError``."""
    check_targets(residual)
    if isinstance(covar, FeatureRootAddedDiagLinearOperator) and covar.uses_kernel_space():
        return _kernel_space_terms(covar, residual)
    weights = noise_weights(covar._diag_tensor)  # (..., N), or (..., 1) for homoscedastic noise
    # float32 features' statistics in float64 where their rounding matters, as the marginal likelihood's
    gram, cross, _ = adaptive_feature_statistics(covar._linear_op, weights, residual.unsqueeze(-1))
    chol = capacitance_cholesky(gram, weights.detach().reciprocal())
    work = chol.dtype
    projected = torch.linalg.solve_triangular(chol, cross.to(work), upper=False)  # L⁻¹ΦᵀWr, (..., F, 1)
    square_norms, correction = _root_terms(covar._linear_op, chol, projected)  # ‖vᵢ‖², V·L⁻¹ΦᵀWr
    weights = weights.to(work)
    inv_diag = weights - weights.pow(2) * square_norms
    inv_residual = weights * (residual.to(work) - correction)
    return inv_residual.to(residual.dtype), inv_diag.to(residual.dtype)


def _root_terms(root_operator, chol: Tensor, projected: Tensor) -> tuple[Tensor, Tensor]:
    """(‖vᵢ‖², V·``projected``) for V = ΦL⁻ᵀ, over all rows at once or chunk by chunk.

    A chunked operator's features are formed one chunk at a time, each used and released before the next: a list of
    all chunks held the whole N × F matrix (2 GB at N = 400 000, F = 1 024 under a 64 MiB budget)."""
    if isinstance(root_operator, ChunkedFeatureRootLinearOperator):
        chunks = (root_operator.featurizer(root_operator.inputs[..., rows, :]) for rows in root_operator._chunks())
    else:
        chunks = [root_operator.features()]
    norms, products = [], []
    for features in chunks:
        rows = torch.linalg.solve_triangular(chol, features.to(chol.dtype).mT, upper=False).mT  # (..., n, F)
        norms.append(rows.pow(2).sum(-1))
        products.append((rows @ projected).squeeze(-1))
    return torch.cat(norms, -1), torch.cat(products, -1)


def _kernel_space_terms(covar: FeatureRootAddedDiagLinearOperator, residual: Tensor) -> tuple[Tensor, Tensor]:
    """(K⁻¹r, diag K⁻¹) from the N × N factor of K = sΦ₀Φ₀ᵀ + D (N ≲ F, the cheaper factorisation)."""
    features, constant = covar._linear_op.scaled_features()
    noise = check_noise(covar._diag_tensor.diagonal(dim1=-1, dim2=-2))
    chol = kernel_cholesky(features, noise, None if constant is None else constant**2)
    inverse = torch.cholesky_inverse(chol)
    batch = torch.broadcast_shapes(residual.shape[:-1], chol.shape[:-2])
    inv_residual = (inverse @ residual.to(chol.dtype).expand(*batch, residual.shape[-1]).unsqueeze(-1)).squeeze(-1)
    inv_diag = inverse.diagonal(dim1=-2, dim2=-1).expand(*batch, residual.shape[-1])
    return inv_residual.to(residual.dtype), inv_diag.to(residual.dtype)


def leave_one_out_predictions(covar: LinearOperator, targets: Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
    """(μ₋ᵢ, σ²₋ᵢ + c(xᵢ)), ``(*batch, N)``: each point's predictive mean and variance (noise included) given all
    others, for the prior mean ``mean`` and covariance ``covar`` (noise added), e.g. leave-one-out cross-validation of
    a trained model (kriging cross-validation)::

        model.eval()  # model.forward: the prior at the training inputs (model(train_x) is the posterior)
        prior = model.likelihood(model.forward(train_x))
        loo_mean, loo_variance = leave_one_out_predictions(prior.lazy_covariance_matrix, train_y, prior.mean)

    ``covar`` may be lazily evaluated (:func:`feature_covariance` evaluates it).  The variance is the one the model
    fitted to the other points reports at xᵢ: with the variance correction c(xᵢ) = k(xᵢ, xᵢ) − E k̂(xᵢ, xᵢ) that the
    covariance carries for a map biased on the diagonal (truncated Maclaurin: without it, 0.012 instead of 1.18 at a
    point where the truncation leaves out most of k(x, x)) and for Nyström (its FITC term
    k(x, x) − ‖Φ(x)‖²: 0.028 instead of 0.143 at a point that is not a landmark).  The prior of a model in train mode
    (``model.train(); model.likelihood(model(train_x))``) gives the same means and variances, except a chunked
    Nyström covariance (over :class:`rfgp.settings.memory_budget`), which forms that term in eval mode only.

    Raises:
        TypeError: ``covar`` is not a noise-added rfgp feature covariance ΦΦᵀ + D (an exact kernel's, or a
            posterior covariance of a model in eval mode).
        ValueError: ``covar`` is a chunked Nyström covariance of a model in train mode (take the prior in eval mode).
    """
    covar = _feature_covariance_or_raise(covar)
    correction = covar._linear_op.variance_correction
    if correction is None and isinstance(getattr(covar._linear_op, "featurizer", None), TriangularFeaturizer):
        raise ValueError(
            "leave_one_out_predictions: covar is a chunked Nyström training covariance of a model in train mode, "
            "which does not form the FITC term k(x, x) − ‖Φ(x)‖² (one more pass over the data per training step) "
            "that the refitted model adds to its variance; take the prior in eval mode: model.eval(); "
            "prior = model.likelihood(model.forward(train_x))"
        )
    loo_mean, variance = leave_one_out_moments(covar, targets, mean)
    return loo_mean, variance if correction is None else variance + correction


def leave_one_out_moments(covar: LinearOperator, targets: Tensor, mean: Tensor) -> tuple[Tensor, Tensor]:
    """(μ₋ᵢ, σ²₋ᵢ) = (yᵢ − [K⁻¹r]ᵢ/[K⁻¹]ᵢᵢ, 1/[K⁻¹]ᵢᵢ), ``(*batch, N)``, of the training covariance K = ΦΦᵀ + D
    itself, without a map's variance correction: the terms of the leave-one-out pseudo-likelihood, which trains the
    covariance the marginal likelihood trains.  Arguments and errors as :func:`leave_one_out_predictions`."""
    covar = _feature_covariance_or_raise(covar)
    inv_residual, inv_diag = leave_one_out_terms(covar, targets - mean)
    variance = inv_diag.reciprocal()
    return targets - inv_residual * variance, variance


def _feature_covariance_or_raise(covar) -> LinearOperator:
    """``covar`` evaluated (:func:`feature_covariance`), or the ``TypeError`` of :func:`leave_one_out_predictions`."""
    if type(covar) not in LEAVE_ONE_OUT_OPERATORS:
        evaluated = feature_covariance(covar)
        if evaluated is None:
            raise TypeError(
                f"leave_one_out_predictions: covar must be a noise-added rfgp feature covariance ΦΦᵀ + D of one "
                f"output (the lazy_covariance_matrix of model.likelihood(model.forward(train_x)), the prior at the "
                f"training inputs of a model in eval mode with an rfgp kernel), got {type(covar).__name__}; an exact "
                "kernel's covariance, a posterior covariance (model(train_x) in eval mode) and a multi-output one "
                "(several outputs per input) have no such root"
            )
        covar = evaluated
    return covar
