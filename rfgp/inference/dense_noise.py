"""Training covariances K + S with a dense noise covariance S: GPyTorch's online variational conditioning.

GPyTorch's ``VariationalStrategy.get_fantasy_model`` (the "SVGP model updating" recipe; Maddox, Stanton & Wilson,
"Conditioning Sparse Variational Gaussian Processes for Online Decision-Making", NeurIPS 2021) turns an SVGP into
an exact GP on its M inducing points Z with pseudo-targets ỹ and a full pseudo-noise covariance S = (S_q⁻¹ −
K_ZZ⁻¹)⁻¹, by replacing that model's ``prediction_strategy.lik_train_train_covar`` with K_ZZ + S, and then
conditions it on new observations (noise σ²), whose training covariance is K + blockdiag(S, σ²I).

With K = ΦΦᵀ (Φ the N × F training features, N = M + m small) the posterior follows from the N × N matrix
ΦΦᵀ + S = LLᵀ as in :mod:`rfgp.inference.kernel_space`: mean weights Φᵀ(ΦΦᵀ + S)⁻¹r, and the posterior weight
covariance I − Φᵀ(ΦΦᵀ + S)⁻¹Φ = RRᵀ with R = I − WᵀQ, W = L⁻¹Φ, Q = (L + C)⁻¹Φ, C = chol(S): the identity of
:class:`~rfgp.inference.kernel_space.KernelSpaceFactor` (derived there for C = D^{1/2}) needs only CCᵀ = S and
L + C invertible (both lower triangular with a positive diagonal), since M = L⁻¹C then gives WWᵀ + MMᵀ = I.
S must be positive definite (to linear_operator's jitter): otherwise the posterior covariance need not be.
"""

from __future__ import annotations

import torch
from linear_operator.operators import DenseLinearOperator, SumLinearOperator
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from .kernel_space import KernelSpaceFactor
from .linalg import cholesky_solve


def dense_training_noise(lik_train_train_covar, prior_covar) -> Tensor | None:
    """S ``(..., N, N)`` of a noise-added training covariance that is ``prior_covar + S`` (a ``SumLinearOperator``
    holding the prior covariance object itself, as GPyTorch's online variational conditioning and
    :func:`with_dense_noise` build it), ``None`` for any other operator — also for the likelihood's ``K + D``, an
    ``AddedDiagLinearOperator`` (a subclass), whose diagonal D the other paths take."""
    if type(lik_train_train_covar) is not SumLinearOperator:
        return None
    summands = list(lik_train_train_covar.linear_ops)
    index = next((i for i, op in enumerate(summands) if op is prior_covar), None)
    if index is None:
        return None
    del summands[index]
    return sum(op.to_dense() for op in summands)


def with_dense_noise(prior_covar, noise: Tensor) -> SumLinearOperator:
    """The training covariance ``prior_covar + S`` that :func:`dense_training_noise` reads back."""
    return SumLinearOperator(prior_covar, DenseLinearOperator(noise))


def appended_noise(noise: Tensor, new_noise: Tensor) -> Tensor:
    """blockdiag(S, diag(d)) ``(..., N + m, N + m)`` for S ``(..., N, N)`` and the new points' noise d ``(..., m)``."""
    batch = torch.broadcast_shapes(noise.shape[:-2], new_noise.shape[:-1])
    num_old, num_new = noise.shape[-1], new_noise.shape[-1]
    full = noise.new_zeros(*batch, num_old + num_new, num_old + num_new)
    full[..., :num_old, :num_old] = noise
    full[..., num_old:, num_old:] = torch.diag_embed(new_noise.to(noise).expand(*batch, num_new))
    return full


def dense_noise_posterior_caches(features: Tensor, noise: Tensor, residual: Tensor) -> tuple[Tensor, KernelSpaceFactor]:
    """(Φᵀ(ΦΦᵀ + S)⁻¹r ``(..., F, columns)``, the :class:`KernelSpaceFactor` of W = L⁻¹Φ and Q = (L + C)⁻¹Φ) for Φ
    ``(..., N, F)``, S ``(..., N, N)`` and residual columns r ``(..., N, columns)``.  A non-positive-definite S
    raises ``NotPSDError``."""
    dtype = torch.promote_types(torch.promote_types(features.dtype, noise.dtype), residual.dtype)
    work = torch.promote_types(dtype, torch.float64)  # N is small here (M inducing points + m new ones)
    features, noise, residual = features.to(work), noise.to(work), residual.to(work)
    batch = torch.broadcast_shapes(features.shape[:-2], noise.shape[:-2], residual.shape[:-2])
    features = features.expand(*batch, *features.shape[-2:])
    try:
        noise_root = psd_safe_cholesky(noise.expand(*batch, *noise.shape[-2:]))
    except NotPSDError as error:
        raise NotPSDError(
            "the training noise covariance S of this exact GP (GPyTorch's online variational conditioning: the "
            "pseudo-observation covariance (S_q⁻¹ − K_ZZ⁻¹)⁻¹ of the inducing points) is not positive definite, so "
            "neither is its posterior covariance: the variational covariance S_q exceeds the prior K_ZZ in some "
            f"direction; train the variational model further before conditioning it ({error})"
        ) from error
    chol = psd_safe_cholesky(features @ features.mT + noise)
    mean_cache = features.mT @ cholesky_solve(residual.expand(*batch, *residual.shape[-2:]), chol)
    projection = torch.linalg.solve_triangular(chol, features, upper=False)
    correction = torch.linalg.solve_triangular(chol + noise_root, features, upper=False)
    return mean_cache.to(dtype), KernelSpaceFactor(projection, correction)
