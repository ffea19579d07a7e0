"""Feature-space (weight-space) GP prediction in O(N·F² + F³) time and O(N·F) memory.

With K̂ = ΦΦᵀ and noise D, the posterior at test features Φ* is (Searle/Woodbury):

    mean  = Φ* A⁻¹ ΦᵀD⁻¹(y − μ),          A = I + ΦᵀD⁻¹Φ  (F × F),
    covar = Φ* A⁻¹ Φ*ᵀ  (+ diag c(x*)),

where c(x*) = k(x*, x*) − E[k̂(x*, x*)] ≥ 0 is the bias correction of paper 000 §5.6:
feature maps whose expected diagonal falls short of the kernel's (truncated Maclaurin,
fitted SRF densities) would otherwise report a posterior variance that collapses away
from the data.  The Cholesky factor of A is computed once and cached, as in GPyTorch's
``LinearPredictionStrategy``, which this class extends with the correction and with
``gpytorch.settings.skip_posterior_variances``.
"""

from __future__ import annotations

import gpytorch
from gpytorch.models.exact_prediction_strategies import LinearPredictionStrategy
from gpytorch.utils.memoize import cached
from linear_operator.operators import ConstantMulLinearOperator, DiagLinearOperator, ZeroLinearOperator


class FeatureSpacePredictionStrategy(LinearPredictionStrategy):
    """GPyTorch prediction strategy for kernels that return :class:`~rfgp.operators.FeatureRootLinearOperator`."""

    def exact_prediction(self, test_mean, test_test_covar, test_train_covar):
        if hasattr(test_test_covar, "evaluate_kernel"):
            test_test_covar = test_test_covar.evaluate_kernel()
        correction = _variance_correction(test_test_covar)
        mean, covar = super().exact_prediction(test_mean, test_test_covar, test_train_covar)
        if gpytorch.settings.skip_posterior_variances.on():
            return mean, ZeroLinearOperator(*covar.shape, dtype=mean.dtype, device=mean.device)
        if correction is not None:
            covar = covar + DiagLinearOperator(correction.expand(covar.shape[:-1]))
        return mean, covar

    @property
    @cached(name="mean_covar_cache")
    def mean_covar_cache(self):
        # Hook: noise-added operators with extra structure (rfgp.classification) build the
        # feature-space caches themselves; everything else takes GPyTorch's Woodbury path.
        structured = getattr(self.lik_train_train_covar, "feature_space_caches", None)
        caches = None if structured is None else structured(self.train_labels - self.train_prior_dist.mean)
        return caches if caches is not None else super().mean_covar_cache


def _variance_correction(covar):
    """The bias correction carried by a (possibly constant-scaled) feature-root operator."""
    if isinstance(covar, ConstantMulLinearOperator):
        inner = _variance_correction(covar.base_linear_op)
        return None if inner is None else inner * covar.expanded_constant.unsqueeze(-1)
    return getattr(covar, "variance_correction", None)
