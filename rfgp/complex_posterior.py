"""GP posterior with complex random features (paper 000, Appendix D), in real arithmetic.

With complex features Φ_C (N × m), K̂ = Φ_C Φ_Cᴴ and noise Σ, the complex GP posterior
(Boloix-Tortosa et al. 2018; paper 000 Eqs. 84–90) is

    μ(x)      = Re[ φ(x)ᵀ B⁻¹ Φ_Cᴴ Σ⁻¹ y ],         B = I_m + Φ_Cᴴ Σ⁻¹ Φ_C,
    k_N(x, x') = Re[ φ(x)ᵀ B⁻¹ conj φ(x') ].

It is *not* the real GP on Re K̂ (which [Re Φ, Im Φ] features give).  Writing Ψ = [Re Φ_C, Im Φ_C]
(the real output of a complex :class:`~rfgp.features.PolynomialSketch`) and Ψ° = [−Im Φ_C, Re Φ_C]
(the features of iΦ_C), the real 2m × 2m representation of conj B is

    A = I + ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°,    and   μ(x) = ψ(x)ᵀA⁻¹ΨᵀΣ⁻¹y,   k_N(x, x') = ψ(x)ᵀA⁻¹ψ(x'),

i.e. a real Bayesian linear model whose precision also counts every training point's
"imaginary" feature vector with target 0.  Cost O(N m²) to build A and O(m³) for its
Cholesky factor; no complex tensors and no N × N matrices.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .kernels.combinations import kernel_features
from .linalg import weighted_gram


def _rotate(features: Tensor) -> Tensor:
    """[Re, Im] of iΦ from [Re, Im] of Φ: [−Im, Re]."""
    real, imag = features.chunk(2, dim=-1)
    return torch.cat((-imag, real), dim=-1)


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
    precision = noise.reciprocal().expand(train_targets.shape)
    width = train_features.shape[-1]
    a = weighted_gram(train_features, precision) + weighted_gram(_rotate(train_features), precision)
    a = a + torch.eye(width, dtype=a.dtype, device=a.device)
    chol = torch.linalg.cholesky(a)
    rhs = (train_features * (precision * train_targets).unsqueeze(-1)).sum(-2).unsqueeze(-1)
    weights = torch.cholesky_solve(rhs, chol).squeeze(-1)
    mean = (test_features @ weights.unsqueeze(-1)).squeeze(-1)
    half = torch.linalg.solve_triangular(chol, test_features.mT, upper=False)  # L⁻¹ψ*
    if full_covariance:
        return mean, half.mT @ half
    return mean, half.pow(2).sum(-2)


def complex_kernel_posterior(kernel, train_x: Tensor, train_y: Tensor, noise, test_x: Tensor, full_covariance=False):
    """:func:`complex_feature_posterior` with the features of a kernel built on complex weights.

    ``kernel`` is e.g. ``ScaleKernel(SketchedPolynomialKernel(p, F, weights="complex"))``
    (its outputscale is folded into the features), evaluated with its current hyperparameters.
    """
    return complex_feature_posterior(
        kernel_features(kernel, train_x), train_y, noise, kernel_features(kernel, test_x), full_covariance
    )
