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

The ``GaussianMixturePosterior`` of an ensemble (``EnsembleMapSaasSingleTaskGP``) is a batch of member posteriors
whose samples the pruning averages over the members (``marginalize_dim``).  BoTorch's samplers share their base
samples over the posterior's batch range, the member dimension included (common random numbers: identical members
give identical samples, so their average has a member's variance, not a third of it); :class:`SharedRootSampler`
does the same in feature space, f_k = μ_k + R_k·ε (+ √d_k·ε′) with one ε (and ε′) for all members — the members'
features are one draw — instead of independent draws per member.  Before, such a posterior was sampled through a
dense n × n factor per member (qLogNEI's construction at n = 200, F = 16, 3 members: two 200 × 200 factorisations).
"""

from __future__ import annotations

import functools

import botorch.acquisition.utils as botorch_acquisition_utils
import torch
from botorch.posteriors.fully_bayesian import GaussianMixturePosterior
from botorch.posteriors.gpytorch import GPyTorchPosterior
from botorch.sampling.stochastic_samplers import StochasticSampler
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator
from torch import Tensor

from ..inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance

#: BoTorch's function, which :func:`_get_sampler` calls for every other posterior
_botorch_get_sampler = botorch_acquisition_utils.get_sampler


@functools.wraps(_botorch_get_sampler)
def _get_sampler(posterior, sample_shape, **kwargs):
    if kwargs or not samples_through_its_root(posterior):
        return _botorch_get_sampler(posterior, sample_shape, **kwargs)
    if type(posterior) is GaussianMixturePosterior:
        return SharedRootSampler(sample_shape=sample_shape)
    return StochasticSampler(sample_shape=sample_shape)


class SharedRootSampler(StochasticSampler):
    """Samples ``(*sample_shape, *batch, n, 1)`` of a single-output rfgp posterior with batch members (an ensemble's
    ``GaussianMixturePosterior``) as μ_k + R_k·ε (+ √d_k·ε′), one ε ~ N(0, I_F) (and ε′ ~ N(0, I_n)) per sample
    shared by every batch member, as BoTorch's samplers share their base samples over the batch range."""

    def forward(self, posterior: GaussianMixturePosterior) -> Tensor:
        distribution = posterior.distribution
        root, diag = _root_and_diagonal(distribution.lazy_covariance_matrix)
        num_samples = self.sample_shape.numel()
        normal = torch.randn(root.shape[-1], num_samples, dtype=root.dtype, device=root.device)
        samples = root @ normal  # (*batch, n, S)
        if diag is not None:
            independent = torch.randn(root.shape[-2], num_samples, dtype=root.dtype, device=root.device)
            samples = samples + diag.sqrt().unsqueeze(-1) * independent
        samples = distribution.mean.unsqueeze(0) + samples.movedim(-1, 0)
        return samples.reshape(*self.sample_shape, *samples.shape[1:]).unsqueeze(-1)


def _root_and_diagonal(covariance) -> tuple[Tensor, Tensor | None]:
    if isinstance(covariance, LowRankPosteriorCovariance):
        return covariance.low_rank_root, None
    return covariance._expanded_root_and_diag()


def samples_through_its_root(posterior) -> bool:
    """Whether ``posterior`` is a ``GPyTorchPosterior`` whose covariance (or, for independent outputs, whose stacked
    blocks) is an rfgp low-rank posterior with a root narrower than the number of points, or a single-output
    ``GaussianMixturePosterior`` whose members' covariances are."""
    if type(posterior) not in (GPyTorchPosterior, GaussianMixturePosterior) or not posterior.distribution.islazy:
        return False
    covariance = posterior.distribution.lazy_covariance_matrix
    if type(posterior) is GPyTorchPosterior and type(covariance) in (BlockDiagLinearOperator,
                                                                     BlockInterleavedLinearOperator):
        covariance = covariance.base_linear_op
    if isinstance(covariance, LowRankPosteriorCovariance):
        root = covariance.low_rank_root
    elif isinstance(covariance, LowRankPosteriorAddedDiag):
        root = covariance._linear_op.root
    else:
        return False
    return root.shape[-1] < root.shape[-2]


botorch_acquisition_utils.get_sampler = _get_sampler
