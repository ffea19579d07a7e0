"""BoTorch's baseline pruning samples an rfgp posterior through its n × F root, not an n × n Cholesky factor.

qLogNEI, qNEI, qLogNParEGO and the multi-objective noisy acquisitions prune ``X_baseline`` at construction
(``botorch.acquisition.utils.prune_inferior_points``, ``prune_inferior_points_multi_objective``): they draw
``num_samples = 2048`` joint samples of the posterior at all n baseline points — usually every training point — and
keep the points that are best in some sample.  BoTorch's default sampler (``get_sampler``: scrambled Sobol base
samples, n-dimensional) reparameterises them with a square root of the n × n posterior covariance, a dense Cholesky
factor, which for an rfgp posterior Σ = RRᵀ of rank F < n needs jitter too: O(n³) time, O(n²) memory and an n × n
by n × 2048 product, although the pruned set that remains is a handful of points.  qLogNEI's construction with
F = 256 (``benchmarks/botorch_acquisitions.py``, one thread, shared machine): n = 3000: 4.0 s → 0.54 s (the exact GP:
10.0 s); n = 6000: 12.7 s → 0.75 s.

Registered when BoTorch is imported (:mod:`rfgp.integrations`), ``get_sampler`` as the pruning functions of
``botorch.acquisition.utils`` look it up is wrapped: for a ``GPyTorchPosterior`` whose covariance is an rfgp low-rank
posterior (one output, or the stacked roots of independent outputs, :mod:`rfgp.integrations.botorch_multioutput`)
with a root narrower than the number of points, the samples are ``posterior.rsample`` (BoTorch's
``StochasticSampler``): R·ε with ε ~ N(0, I_F), O(n·F) per sample, no factorisation.  They are draws of the same
posterior, i.i.d. instead of quasi-random — the pruning step is random in BoTorch too (its Sobol seed is drawn from
torch's global generator, as these normals are).  Every other posterior, and every sampler passed explicitly, is
BoTorch's own; the acquisition functions' samplers (``MCSamplerMixin``, the cached-root base samples that qLogNEI's
Cholesky factor of the *pruned* baseline is used with) are not touched.
"""

from __future__ import annotations

import functools

import botorch.acquisition.utils as botorch_acquisition_utils
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.stochastic_samplers import StochasticSampler
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator

from ..inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance

#: BoTorch's function, which :func:`_get_sampler` calls for every other posterior
_botorch_get_sampler = botorch_acquisition_utils.get_sampler


@functools.wraps(_botorch_get_sampler)
def _get_sampler(posterior, sample_shape, **kwargs):
    if kwargs or not samples_through_its_root(posterior):
        return _botorch_get_sampler(posterior, sample_shape, **kwargs)
    return StochasticSampler(sample_shape=sample_shape)


def samples_through_its_root(posterior) -> bool:
    """Whether ``posterior`` is a ``GPyTorchPosterior`` whose covariance (or, for independent outputs, whose stacked
    blocks) is an rfgp low-rank posterior with a root narrower than the number of points."""
    if type(posterior) is not GPyTorchPosterior or not posterior.distribution.islazy:
        return False
    covariance = posterior.distribution.lazy_covariance_matrix
    if type(covariance) in (BlockDiagLinearOperator, BlockInterleavedLinearOperator):
        covariance = covariance.base_linear_op
    if isinstance(covariance, LowRankPosteriorCovariance):
        root = covariance.low_rank_root
    elif isinstance(covariance, LowRankPosteriorAddedDiag):
        root = covariance._linear_op.root
    else:
        return False
    return root.shape[-1] < root.shape[-2]


botorch_acquisition_utils.get_sampler = _get_sampler
