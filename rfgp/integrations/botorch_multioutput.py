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

BoTorch's ``subset_output`` of a batched multi-output model (``SingleTaskGP`` with m > 1 outputs) indexes the
parameters its ``_subset_batch_dict`` names (``"covar_module.raw_lengthscale"``) and sets every module's batch shape to
the subset's.  A converted tree keeps its hyperparameters under other names (a Nyström kernel's lengthscale is
``covar_module.base_kernel.raw_lengthscale``, learned landmarks are a ``(m, M, d)`` parameter), which were left with
all m outputs under a subset batch shape, so the subset failed on shapes.  It is wrapped: BoTorch's method
runs unchanged on the rest of the model, and where the model's kernel holds an rfgp kernel batched over the outputs,
the subset's kernel is the full kernel's outputs ``idcs`` (the kernel's own ``kernel[..., idcs]``, which indexes every
batched hyperparameter and keeps the shared draws and landmarks).
"""

from __future__ import annotations

import copy
import functools

import botorch.posteriors.gpytorch as botorch_posteriors
import torch
from botorch.models.gpytorch import BatchedMultiOutputGPyTorchModel
from gpytorch.distributions import MultitaskMultivariateNormal
from gpytorch.kernels import Kernel
from linear_operator.operators import BlockDiagLinearOperator, BlockInterleavedLinearOperator

from ..inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance, stack_independent
from ..kernels.combinations import holds_feature_kernel

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


#: BoTorch's method, which :func:`_subset_output` runs first
_botorch_subset_output = BatchedMultiOutputGPyTorchModel.subset_output


@functools.wraps(_botorch_subset_output)
def _subset_output(self, idcs):
    kernel = getattr(self, "covar_module", None)
    outputs_batch = self._aug_batch_shape
    if (not isinstance(kernel, Kernel) or not holds_feature_kernel(kernel) or kernel.batch_shape != outputs_batch
            or list(idcs) == list(range(self.num_outputs))):  # BoTorch's copy of the whole model
        return _botorch_subset_output(self, idcs)
    subset = _botorch_subset_output(_without_kernel(self), idcs)
    output_index = idcs[0] if len(idcs) == 1 else torch.tensor(idcs, device=self.train_targets.device)
    subset.covar_module = kernel[(slice(None),) * (len(outputs_batch) - 1) + (output_index,)]
    return subset


def _without_kernel(model):
    """A shallow copy of ``model`` without its ``covar_module`` (``model`` itself unchanged), for BoTorch's subset.

    BoTorch sets the batch shape of every module that owns a parameter to the subset's, parent kernels after their
    children, and a converted tree's parent then broadcasts its own batch shape with its changed children's (a Nyström
    kernel: ``Attempting to broadcast a dimension of length 2 at -1``); the kernel is indexed by itself instead."""
    shell = copy.copy(model)
    shell._modules = {name: module for name, module in model._modules.items() if name != "covar_module"}
    return shell


BatchedMultiOutputGPyTorchModel.subset_output = _subset_output
