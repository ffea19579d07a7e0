"""Multi-output BoTorch posteriors of rfgp models keep their low-rank roots.

BoTorch joins independent outputs — the models of a ``ModelListGP``, the output batch of a multi-output
``SingleTaskGP`` (``train_Y`` with m > 1 columns) — with GPyTorch's
``MultitaskMultivariateNormal.from_independent_mvns``, whose joint covariance is
``BlockDiagLinearOperator(CatLinearOperator(Σ₁.unsqueeze(0), …, Σ_m.unsqueeze(0)))``.  linear_operator's
``CatLinearOperator`` has no structure of its own for sampling: ``rsample`` went through a dense n × n Cholesky
factor of every output (with jitter, since an rfgp posterior Σₖ = RₖRₖᵀ has rank F < n), O(m·n³) instead of
O(m·n·F) (N = 200, F = 1024, 2 outputs, 6000 candidates, 64 draws: see ``benchmarks/results/multioutput_sampling_*``).

No hook reaches this: GPyTorch builds the ``CatLinearOperator`` itself, and its sampling and root decomposition
call only the generic linear_operator methods of the parts.  So, registered when BoTorch is imported
(:mod:`rfgp.integrations`), ``from_independent_mvns`` is wrapped: GPyTorch's own classmethod runs first,
unchanged (its checks, broadcasting and mean); when every output's covariance is an rfgp low-rank posterior
(all :class:`~rfgp.inference.posterior_covariance.LowRankPosteriorCovariance`, or all with an added diagonal —
observation noise, a variance correction), the ``CatLinearOperator`` is replaced by one stacked rfgp operator
(:func:`~rfgp.inference.posterior_covariance.stack_independent`; roots of different widths zero-padded) inside the
same ``BlockDiagLinearOperator``.  The joint covariance has the same values and layout (non-interleaved), its
``rsample`` draws R·ε per output, and ``root_decomposition()`` is, as for one output, the block-diagonal square
Cholesky factor that BoTorch's cached-root acquisition functions (qLogNEI, qLogNEHVI with
``extract_batch_covar``) solve with.  Any other list of distributions — exact GPs, mixed lists of rfgp and other
models — keeps GPyTorch's result.

BoTorch's ``ScalarizedPosteriorTransform`` (``scalarize_posterior_gpytorch``) turns the joint of independent
outputs into Σₖ wₖ²Σₖ, a ``SumLinearOperator`` that linear_operator again samples through a dense n × n Cholesky
factor.  It is wrapped the same way (BoTorch's function first, its mean kept): for q > 1 points of m > 1 outputs
whose blocks are one stacked rfgp operator, the covariance becomes the rfgp operator with root [w₁R₁ … w_mR_m]
(n × m·F; plus Σₖ wₖ²Dₖ with a diagonal), so ``MaxPosteriorSampling`` with a scalarization stays O(n·m·F) per draw.
"""

from __future__ import annotations

import functools

import botorch.posteriors.gpytorch as botorch_posteriors
from gpytorch.distributions import MultitaskMultivariateNormal
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator

from ..inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance, stack_independent

#: GPyTorch's function (the classmethod's ``__func__``), which :func:`_from_independent_mvns` runs first
_gpytorch_from_independent_mvns = MultitaskMultivariateNormal.__dict__["from_independent_mvns"].__func__


@functools.wraps(_gpytorch_from_independent_mvns)
def _from_independent_mvns(cls, mvns):
    joint = _gpytorch_from_independent_mvns(cls, mvns)
    if not all(mvn.islazy for mvn in mvns):
        return joint
    blocks = stack_independent([mvn.lazy_covariance_matrix for mvn in mvns], joint.batch_shape)
    if blocks is None:
        return joint
    return cls(mean=joint.mean, covariance_matrix=BlockDiagLinearOperator(blocks, block_dim=-3), interleaved=False)


MultitaskMultivariateNormal.from_independent_mvns = classmethod(_from_independent_mvns)


#: BoTorch's function, which :func:`_scalarize_posterior_gpytorch` runs first
_botorch_scalarize_posterior_gpytorch = botorch_posteriors.scalarize_posterior_gpytorch


@functools.wraps(_botorch_scalarize_posterior_gpytorch)
def _scalarize_posterior_gpytorch(posterior, weights, offset=0.0):
    mean, covariance = _botorch_scalarize_posterior_gpytorch(posterior, weights, offset)
    distribution = posterior.distribution
    if not posterior._is_mt or not distribution.islazy or mean.shape[-1] == 1 or weights.shape[-1] == 1:
        return mean, covariance  # one point (BoTorch's 1 × 1 covariance) or one output (its w²·Σ)
    joint = distribution.lazy_covariance_matrix
    if type(joint) not in (BlockDiagLinearOperator, BlockInterleavedLinearOperator) or not isinstance(
        joint.base_linear_op, (LowRankPosteriorCovariance, LowRankPosteriorAddedDiag)
    ):
        return mean, covariance
    return mean, joint.base_linear_op.output_sum(weights)


botorch_posteriors.scalarize_posterior_gpytorch = _scalarize_posterior_gpytorch
