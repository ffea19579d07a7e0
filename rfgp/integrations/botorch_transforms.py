"""BoTorch's ``Standardize`` on an rfgp posterior, keeping the posterior's n × F root.

A model with ``Standardize`` (``SingleTaskGP``'s default outcome transform) reports the posterior of
y = μ_y + s·f, whose covariance at n points is SΣ*S with S = diag(s).  BoTorch builds it as
``DiagLinearOperator(s) @ Σ* @ DiagLinearOperator(s)``, a generic product that linear_operator samples
through the dense n × n Cholesky factor: for an rfgp posterior Σ* = RRᵀ
(:class:`~rfgp.inference.posterior_covariance.LowRankPosteriorCovariance`) that is O(n³) per call instead of
O(n·F) per draw, on a matrix of rank F < n that needs jitter (``MaxPosteriorSampling`` over 6000 candidates,
N = 100, F = 512: 4.4 s against 0.24 s without the transform).  Since SΣ*S = (SR)(SR)ᵀ — and
S(RRᵀ + D)S = (SR)(SR)ᵀ + S²D with observation noise or a variance correction — the rescaled covariance is
the same low-rank operator with root SR, so ``rsample`` stays O(n·F) per draw.

Registered when BoTorch is imported (:mod:`rfgp.integrations`): ``Standardize.untransform_posterior``
(hence ``StratifiedStandardize`` and ``ChainedOutcomeTransform`` chains that contain them) is wrapped.
BoTorch's own method runs first, unchanged (its checks, the mean μ_y + s·μ*); only the covariance of a
single-output ``GPyTorchPosterior`` whose covariance is an rfgp low-rank posterior is replaced by its
rescaled root; for a multi-output posterior of independent outputs whose blocks are one stacked rfgp operator
(:mod:`rfgp.integrations.botorch_multioutput`: a batched multi-output ``SingleTaskGP``), every block k is rescaled
by output k's scale.  Every other posterior (exact kernels, correlated multi-task, mixtures) is BoTorch's result as
it was.
"""

from __future__ import annotations

import functools

from botorch.models.transforms.outcome import Standardize
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.posteriors.posterior import Posterior
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator
from torch import Tensor

from ..inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance

#: BoTorch's method, which :func:`_untransform_posterior` runs first
_botorch_untransform_posterior = Standardize.untransform_posterior


@functools.wraps(_botorch_untransform_posterior)
def _untransform_posterior(self: Standardize, posterior: Posterior, X: Tensor | None = None) -> Posterior:
    untransformed = _botorch_untransform_posterior(self, posterior, X=X)
    if type(untransformed) is not GPyTorchPosterior or not posterior.distribution.islazy:
        return untransformed
    covariance = posterior.distribution.lazy_covariance_matrix
    mean = untransformed.distribution.mean
    _, scale, _ = self._get_per_input_means_stdvs(X=X, include_stdvs_sq=False)  # what BoTorch scaled the mean by
    if not untransformed._is_mt:
        if not isinstance(covariance, _LOW_RANK):
            return untransformed
        return GPyTorchPosterior(type(untransformed.distribution)(mean, covariance.rescaled(
            scale.squeeze(-1).expand_as(mean))))
    # independent outputs (BlockDiag: ModelListGP, batched outputs; BlockInterleaved: GPyTorch's from_batch_mvn):
    # block k is output k at the n points, rescaled by output k's scale, whatever the layout of the joint vector
    if type(covariance) not in (BlockDiagLinearOperator, BlockInterleavedLinearOperator) or not isinstance(
        covariance.base_linear_op, _LOW_RANK
    ):
        return untransformed
    blocks = covariance.base_linear_op.rescaled(scale.expand_as(mean).mT)  # (*batch, n, m) -> (*batch, m, n)
    distribution = type(untransformed.distribution)(mean, type(covariance)(blocks),
                                                    interleaved=untransformed.distribution._interleaved)
    return GPyTorchPosterior(distribution)


_LOW_RANK = (LowRankPosteriorCovariance, LowRankPosteriorAddedDiag)


Standardize.untransform_posterior = _untransform_posterior
