"""Samples of a lazily evaluated rfgp covariance: Φε from the feature root, not a Lanczos root.

``MultivariateNormal(mean, covar_module(x)).rsample()`` — a prior sample, ``model(x).rsample()`` under
``gpytorch.settings.prior_mode`` — draws through ``LazyEvaluatedKernelTensor.zero_mean_mvn_samples``, which
linear_operator answers with the lazy tensor's own ``root_decomposition()``: a dense Cholesky factor up to
``max_cholesky_size`` (800) points (O(N³), with jitter where ΦΦᵀ of rank F < N is singular) and beyond it a
Lanczos root of at most ``max_root_decomposition_size`` (100) columns, which truncates a covariance of rank F > 100
(at ℓ = 0.05, N = 1500, F = 256 the samples had 45 % of the prior variance).  The evaluated rfgp covariance is
ΦΦᵀ with its root Φ at hand, so its samples Φε, ε ~ N(0, I_F), are exact and cost O(N·F) each (computed chunk by
chunk, with one ε, where Φ exceeds :class:`rfgp.settings.memory_budget`).
``root_decomposition()`` itself keeps linear_operator's policy (code such as BoTorch's cached-root acquisition
functions reads it as a square factor), as :mod:`rfgp.inference.posterior_covariance` does for the posterior.
"""

from __future__ import annotations

from gpytorch.lazy import LazyEvaluatedKernelTensor
from torch import Tensor

from .kernel_evaluation import evaluated_covariance
from .operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator


def install() -> None:
    """Route ``LazyEvaluatedKernelTensor.zero_mean_mvn_samples`` of rfgp kernels to the evaluated feature root
    (idempotent; other kernels keep linear_operator's method)."""
    current = LazyEvaluatedKernelTensor.zero_mean_mvn_samples
    if getattr(current, "generic_zero_mean_mvn_samples", None) is not None:
        return

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        evaluated = evaluated_covariance(self)
        if isinstance(evaluated, (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator)):
            return evaluated.zero_mean_mvn_samples(num_samples)
        return current(self, num_samples)

    zero_mean_mvn_samples.generic_zero_mean_mvn_samples = current
    LazyEvaluatedKernelTensor.zero_mean_mvn_samples = zero_mean_mvn_samples
