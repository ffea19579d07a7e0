"""GP posterior with complex random features (paper 000, Appendix D), in real arithmetic.

With complex features Φ_C (N × m), K̂ = Φ_C Φ_Cᴴ and noise Σ, the complex GP posterior
(Boloix-Tortosa et al. 2018; paper 000 Eqs. 84–90) is

    μ(x)      = Re[ φ(x)ᵀ B⁻¹ Φ_Cᴴ Σ⁻¹ y ],         B = I_m + Φ_Cᴴ Σ⁻¹ Φ_C,
    k_N(x, x') = Re[ φ(x)ᵀ B⁻¹ conj φ(x') ].

It is *not* the real GP on Re K̂ (which [Re Φ, Im Φ] features give).  Writing Ψ = [Re Φ_C, Im Φ_C]
(the real output of a complex :class:`~rfgp.features.PolynomialSketch`) and Ψ° = [−Im Φ_C, Re Φ_C]
(the features of iΦ_C), the real 2m × 2m representation of conj B is

    A = I + ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°,    and   μ(x) = ψ(x)ᵀA⁻¹ΨᵀΣ⁻¹y,   k_N(x, x') = ψ(x)ᵀA⁻¹ψ(x'),

i.e. a real Bayesian linear model, weights v ~ N(0, I), whose 2N observations are the targets y
(features Ψ) *and* a zero "imaginary part" for every training point (features Ψ°), each with
noise Σ.  Cost O(N m²) to build A and O(m³) for its Cholesky factor (in float64 for float32 input, as the
real GP's: :mod:`rfgp.inference.linalg`); no complex tensors and no
N × N matrices.

That real model is exactly the proper complex GP f ~ CGP(0, 2K̂), ε ~ CN(0, 2Σ) observed at the
complex targets y + 0i: its real part has prior covariance Re K̂ ≈ k and noise Σ, and its posterior
is Eqs. 86–87.  Its marginal likelihood, the complex-GP evidence

    log CN(y + 0i; 0, 2(K̂ + Σ)) = log N([y; 0]; 0, M),   M = [Ψ; Ψ°][Ψ; Ψ°]ᵀ + diag(Σ, Σ),

is what :class:`ComplexFeatureRootAddedDiagLinearOperator` returns to GPyTorch's
``ExactMarginalLogLikelihood``, so that hyperparameters are trained for the same model whose
posterior is predicted (Woodbury: yᵀΣ⁻¹y − bᵀA⁻¹b with b = ΨᵀΣ⁻¹y; determinant lemma:
log|M| = log|A| + 2 log|Σ|).  The kernels' ``complex_posterior=True`` option
(:mod:`rfgp.kernels.complex_posterior_option`) routes GPyTorch models through these operators.
"""

from __future__ import annotations

import math

import torch
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from ..core.validation import InvalidValueError, check_noise, check_targets
from . import distributed
from .linalg import capacitance_solve, feature_statistics, weighted_gram, woodbury_inv_quad_logdet
from .operators import (
    FeatureRootAddedDiagLinearOperator,
    FeatureRootLinearOperator,
    _as_matrix,
    _finish_inv_quad_logdet,
    select_noise,
)
from .statistics_precision import statistics_dtype, weighted_square_norm


def rotate(features: Tensor) -> Tensor:
    """Ψ° = [−Im Φ_C, Re Φ_C] (the features of iΦ_C) from Ψ = [Re Φ_C, Im Φ_C]."""
    real, imag = features.chunk(2, dim=-1)
    return torch.cat((-imag, real), dim=-1)


def complex_feature_statistics(features: Tensor, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΨᵀWΨ + Ψ°ᵀWΨ°, ΨᵀWR): the feature statistics of the observations (R, 0) (paper 000 Eq. 90).

    ``features`` Ψ ``(..., N, 2m)``, diagonal ``weights`` W = Σ⁻¹ ``(..., N)``, ``rhs`` R ``(..., N, t)``.
    """
    gram, cross = feature_statistics(features, weights, rhs)
    return gram + weighted_gram(rotate(features), weights), cross


def _check_complex_width(width: int, name: str) -> None:
    if width % 2:
        raise ValueError(f"{name} must have an even width 2m ([Re Φ_C, Im Φ_C]), got {width} columns")


def complex_feature_posterior(
    train_features: Tensor,
    train_targets: Tensor,
    noise: Tensor | float,
    test_features: Tensor,
    full_covariance: bool = False,
) -> tuple[Tensor, Tensor]:
    """Posterior mean and variance (or covariance) of the complex-feature GP, paper 000 Eqs. 86–90.

    Args:
        train_features: Ψ = [Re Φ_C(X), Im Φ_C(X)], shape ``(..., N, 2m)``.
        train_targets: y, shape ``(..., N)``.
        noise: observation noise variance σ², a scalar or shape ``(..., N)`` (heteroscedastic).
        test_features: [Re Φ_C(X*), Im Φ_C(X*)], shape ``(..., M, 2m)``.
        full_covariance: return the ``(..., M, M)`` covariance instead of the ``(..., M)`` variances.

    Returns:
        ``(mean, variance)`` of the latent function (add the noise for predictive y).
    """
    if train_features.shape[-1] % 2 or train_features.shape[-1] != test_features.shape[-1]:
        raise ValueError(
            "train_features and test_features must have the same even width 2m ([Re Φ, Im Φ]); got "
            f"{train_features.shape[-1]} and {test_features.shape[-1]}"
        )
    if train_targets.shape[-1] != train_features.shape[-2]:
        raise ValueError(
            f"train_targets has {train_targets.shape[-1]} points but train_features has {train_features.shape[-2]}"
        )
    noise = torch.as_tensor(noise, dtype=train_features.dtype, device=train_features.device)
    if not bool((torch.isfinite(noise) & (noise > 0)).all()):
        raise InvalidValueError(f"noise must be finite and > 0 (a variance; every point is weighted by 1/noise), got "
                                f"values in [{float(noise.min()):.6g}, {float(noise.max()):.6g}]"
                                f"{' including NaN' if bool(noise.isnan().any()) else ''}")
    precision = noise.reciprocal().expand(train_targets.shape)
    gram, cross = complex_feature_statistics(train_features, precision, train_targets.unsqueeze(-1))
    weights, chol = capacitance_solve(gram, cross, noise)  # A factorised in float64 for float32 input, rounded back
    mean = (test_features @ weights).squeeze(-1)
    half = torch.linalg.solve_triangular(chol, test_features.mT, upper=False)  # L⁻¹ψ*
    if full_covariance:
        return mean, half.mT @ half
    return mean, half.pow(2).sum(-2)


class ComplexFeatureRootLinearOperator(FeatureRootLinearOperator):
    """Re K̂ = ΨΨᵀ for Ψ = [Re Φ_C, Im Φ_C], marked for the complex-feature GP of paper 000 App. D.

    As a matrix it is the ordinary ΨΨᵀ; adding a Gaussian likelihood's noise gives a
    :class:`ComplexFeatureRootAddedDiagLinearOperator`, whose marginal likelihood and posterior
    caches are those of the complex GP.  Scaling (``ScaleKernel``) keeps the [Re, Im] layout;
    sums with other feature operators raise a ``ValueError``.
    """

    def __init__(self, root: Tensor, variance_correction: Tensor | None = None) -> None:
        _check_complex_width(root.shape[-1], "the complex-feature root")
        super().__init__(root, variance_correction)

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return ComplexFeatureRootAddedDiagLinearOperator(self, other)
        if isinstance(other, FeatureRootLinearOperator):
            # GPyTorch's AdditiveKernel would predict with its default (real-GP) strategy: refuse
            # rather than silently mix the complex evidence with a real posterior.
            raise ValueError(
                "kernels with complex_posterior=True cannot be summed with other feature kernels "
                "(AdditiveKernel); use one complex-weight kernel per model"
            )
        return super().__add__(other)

    # Python tries a subclass's reflected method first, so real + complex also lands here.
    def __radd__(self, other):
        return self.__add__(other)


class ComplexFeatureRootAddedDiagLinearOperator(FeatureRootAddedDiagLinearOperator):
    """ΨΨᵀ + Σ whose Gaussian log density and posterior caches are the complex GP's (paper 000 App. D).

    ``to_dense()`` and products are those of Re K̂ + Σ, the covariance of the real targets alone;
    :meth:`inv_quad_logdet` and :meth:`feature_space_caches` treat the targets as the complex
    observations y + 0i (module docstring), so that ``MultivariateNormal.log_prob`` — hence
    ``ExactMarginalLogLikelihood`` — is the complex-GP evidence log N([y; 0]; 0, M) exactly, and
    :class:`~rfgp.inference.prediction.FeatureSpacePredictionStrategy` predicts Eqs. 86–87.
    """

    def __add__(self, other):
        if isinstance(other, DiagLinearOperator):
            return self.__class__(self._linear_op, self._diag_tensor + other)
        return super().__add__(other)

    def select_rows(self, observed: Tensor) -> "ComplexFeatureRootAddedDiagLinearOperator":
        """The complex GP observed at the points where the boolean mask ``(N,)`` is ``True`` only (their real
        targets and zero imaginary parts), as ``gpytorch.settings.observation_nan_policy("mask")`` asks."""
        return ComplexFeatureRootAddedDiagLinearOperator(self._linear_op.select_rows(observed),
                                                         select_noise(self._diag_tensor, observed))

    def uses_kernel_space(self, statistics_batch: int | None = None) -> bool:
        return False  # the complex-GP evidence has its own feature-space algebra, whatever N and F

    def _capacitance(self, rhs: Tensor):
        """(ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°, ΨᵀΣ⁻¹R, RᵀΣ⁻¹R, log|Σ|, N, dtype), sums over the points of every process inside
        :class:`rfgp.inference.distributed.data_parallel` (N a tensor); float32 features form the statistics in
        float64 where u·tr(ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°) = 2u·Σᵢ‖ψᵢ‖²/σᵢ² (Ψ° has Ψ's row norms) exceeds the tolerance
        (:func:`~rfgp.inference.statistics_precision.statistics_dtype`); ``dtype``: the model's, to round back to."""
        noise = check_noise(self._diag_tensor.diagonal(dim1=-1, dim2=-2))  # a negative one gave a NaN evidence
        weights = noise.reciprocal()
        features = self._linear_op.root.to_dense()
        dtype = torch.promote_types(features.dtype, weights.dtype)
        work = statistics_dtype(dtype, features.device, lambda: 2 * distributed.reduce_statistics(
            weighted_square_norm(features, weights))[0])
        # W and R cast once: the gradients of their uses, which cancel, meet in ``work`` before one rounding
        weights, rhs = weights.to(work), rhs.to(work)
        gram, cross = complex_feature_statistics(features.to(work), weights, rhs)
        weighted_square = (rhs.pow(2) * weights.unsqueeze(-1)).sum(-2)  # cancels against B's form
        num_points = noise.new_tensor(float(noise.shape[-1]))
        gram, cross, weighted_square, noise_logdet, num_points = distributed.reduce_statistics(
            gram, cross, weighted_square, -weights.log().sum(-1), num_points
        )
        return gram, cross, weighted_square, noise_logdet, num_points, dtype

    def inv_quad_logdet(self, inv_quad_rhs=None, logdet=False, reduce_inv_quad=True):
        """[r; 0]ᵀM⁻¹[r; 0] and log|M| + N log 2π for the 2N × 2N covariance M of (Re y, Im y).

        The N log 2π normalises the N zero imaginary observations, which ``log_prob`` of an
        N-vector does not count; with it ``log_prob`` is the complex-GP evidence exactly.
        """
        check_targets(inv_quad_rhs, point_axis=-2, allow_empty=distributed.is_active())
        noise = self._diag_tensor.diagonal(dim1=-1, dim2=-2)
        rhs = _as_matrix(inv_quad_rhs)
        stats_rhs = rhs if rhs is not None else noise.new_zeros(*noise.shape, 0)
        gram, cross, weighted_square, noise_logdet, num_points, dtype = self._capacitance(stats_rhs)
        # log|M| = log|A| + 2 log|Σ| + N log 2π (A factorised in float64 for float32 statistics, as the real GP's)
        inv_quad, logdet_term = woodbury_inv_quad_logdet(
            gram, cross, weighted_square if rhs is not None else None,
            2.0 * noise_logdet + num_points * math.log(2 * math.pi), logdet, noise.detach(), dtype)
        return _finish_inv_quad_logdet(inv_quad, logdet_term, reduce_inv_quad, gram.new_empty(0, dtype=dtype))

    def feature_space_caches(self, residual: Tensor) -> tuple[Tensor, Tensor]:
        """(A⁻¹ΨᵀΣ⁻¹r, chol A) with A = I + ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ° (paper 000 Eqs. 88–90, real form), factorised in
        float64 for float32 input and rounded back (:func:`~rfgp.inference.linalg.capacitance_solve`)."""
        gram, cross, _, _, _, dtype = self._capacitance(residual.unsqueeze(-1))
        return capacitance_solve(gram, cross, self._diag_tensor.diagonal(dim1=-1, dim2=-2).detach(), dtype)
