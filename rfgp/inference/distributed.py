"""Data-parallel random-feature GPs over ``torch.distributed`` (gloo on CPU, NCCL on GPU).

The exact marginal likelihood of a random-feature GP depends on the data only through
sums over points (paper-independent Woodbury algebra, see :mod:`rfgp.inference.chunking`):

    G = ΦᵀD⁻¹Φ,  B = ΦᵀD⁻¹r,  q = rᵀD⁻¹r,  ℓ = Σ log dᵢ,  N,

    −2 log p(y) = q − BᵀA⁻¹B + log|A| + ℓ + N log 2π,   A = I + G.

Each process holds a shard of the data; inside :class:`data_parallel` rfgp's operators
all-reduce (sum) these statistics, so every rank computes the same global MLL and
posterior.  The all-reduce passes gradients through unchanged, so each rank
backpropagates its own shard's contribution; :func:`sync_gradients` then sums the parameter gradients over ranks,
giving exactly the single-process gradient.  For that, every parameter must reach the loss only through the reduced
sums (otherwise each rank adds its gradient once more): statistics are reduced after their products with parameters
(a multitask model's task Gram B̃ᵀB̃ multiplies each rank's φᵀD_N⁻¹φ before the sum,
:mod:`rfgp.inference.kronecker_statistics`), and so are the noise log-determinants and point counts.  Multi-output
models (correlated task noise, missing targets, chunked roots) reduce the same statistics; the N × N kernel-space
path is never taken under :class:`data_parallel`.  What is no sum over each process's points — leave-one-out
terms, fantasies, the Kronecker eigen-solve, a covariance without rfgp statistics — is refused by name
(:func:`refuse`).

A rank's shard may be empty (N points over more ranks): its model, built after ``init_process_group``
(:func:`rfgp.core.validation.empty_shards_allowed`), adds G = 0, B = 0, q = 0, ℓ = 0 and no points, and takes the same
path as the other ranks.  No observed point on any rank is refused on every rank by the marginal likelihood (0/0);
inside :class:`data_parallel` the posterior of no point is then the prior.

An error that one rank raises inside :class:`DistributedExactMarginalLogLikelihood` or :class:`data_parallel` — a NaN
or Inf in its targets, a bad fixed noise, any check of its shard, which rfgp makes before its first collective — is
raised on every rank (:class:`every_rank_raises`): the failing rank raises its own, the others an
:class:`OtherRankError` (a ``ValueError``) with its message.  Before, the others waited for it in their next
collective until the process group's timeout (30 minutes by default), or gloo aborted the process when that
collective met another of a different length.  The ranks agree once per marginal likelihood, in the all-reduce of its
counts of targets (no more collectives than before), and once per :class:`data_parallel` block (one all-reduce of 4
numbers).  Where some ranks reach a collective and the others leave the section without one (posterior caches
built on some ranks only), every rank raises :class:`CollectiveMismatchError`.  Errors outside these sections
(building the model, a ``model(x)`` before the marginal likelihood) are the script's: wrap them in
:class:`every_rank_raises`.

Launch with ``torchrun --nproc_per_node=2 train.py``; in the script::

    torch.distributed.init_process_group("gloo")          # "nccl" on GPUs
    x, y = shard(full_x, full_y)                           # this rank's rows
    model = ExactGPModel(x, y, likelihood, kernel)         # same seed on every rank
    mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(likelihood, model)
    loss = -mll(model(x), y); loss.backward()
    rfgp.inference.distributed.sync_gradients(model); optimizer.step()
    with rfgp.inference.distributed.data_parallel():                 # collective: every rank calls it
        prediction = likelihood(model(x_test))
"""

from __future__ import annotations

import functools
import math

import gpytorch
import torch
import torch.distributed as dist
from linear_operator.operators import MaskedLinearOperator
from torch import Tensor, nn

from .kernel_evaluation import evaluated_covariance

_active_groups: list = []


#: :class:`every_rank_raises` sections entered and not yet agreed, outermost first
_pending: list = []

#: numbers that an agreement sums over the ranks besides the counts of failed ranks and of ranks agreeing at a
#: collective (the marginal likelihood's targets, all and observed): the same for every section, so that a failing
#: rank's agreement meets the others' wherever they stand (another section, or the first collective of theirs)
_AGREED_COUNTS = 2

#: characters of a failing rank's message that an agreement passes to the other ranks
_MESSAGE_CHARS = 2000


class OtherRankError(ValueError):
    """Raised on the ranks whose own evaluation passed where another rank raised inside an :class:`every_rank_raises`
    section (:class:`data_parallel`, :class:`DistributedExactMarginalLogLikelihood`) before its next collective: a
    ``ValueError`` whatever that rank raised, its message saying which rank raised what, with the message."""


class CollectiveMismatchError(RuntimeError):
    """Raised on every rank where some ranks reached an rfgp collective inside an :class:`every_rank_raises` section
    and the others left it without one (posterior caches built on some ranks only): they would meet different
    collectives."""


def _check_initialised(what: str) -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            f"rfgp.inference.distributed.{what} needs an initialised process group: call "
            "torch.distributed.init_process_group(...) first (e.g. under torchrun)"
        )


class every_rank_raises:
    """Context in which an exception that one rank of ``group`` raises is raised on every rank.

    A rank that raises where the others go on would leave them waiting in their next collective until the process
    group's timeout (30 minutes by default): a NaN target, a bad fixed noise, any check of one rank's shard.  So the
    ranks agree before going on: at the first rfgp collective inside the section (:func:`reduce_statistics`,
    :func:`check_same_parameters`, :func:`sync_gradients`), or at its exit if none came, every rank all-reduces the
    number of ranks that failed (one all-reduce of 4 numbers, which the marginal likelihood
    shares with its count of targets; one for all the sections then open); a rank that raises before that point
    makes the same all-reduce on its way out.  If any failed, the ranks gather the failing ones' messages
    (``all_gather_object``, on the failure path only): a failing rank raises its own exception, every other an
    :class:`OtherRankError` naming the failing rank, its exception's class and its message.  If none failed but some
    ranks agree at a collective and others at the section's exit (posterior caches rebuilt on some ranks only), every
    rank raises :class:`CollectiveMismatchError`: the first would wait for the others in that collective.

    Errors after the agreement (a check between two later collectives) are not agreed: rfgp makes its checks of a
    rank's data before its first collective.  ``on_agreed``: called with the summed counts once the ranks agreed
    that none failed (it may raise: every rank raises alike).
    """

    def __init__(self, group=None, on_agreed=None) -> None:
        self.group = group
        self.on_agreed = on_agreed
        #: numbers this rank adds to the agreement (``_AGREED_COUNTS`` of them), and their sums once agreed
        self.counts = (0,) * _AGREED_COUNTS
        self.totals = None

    def __enter__(self):
        _check_initialised(type(self).__name__)
        _pending.append(self)
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if not any(section is self for section in _pending):  # agreed already, or an agreed error on its way out
            return False
        if error is None:
            _agree()
        elif isinstance(error, Exception):
            _agree(error)  # then the error goes on
        else:  # KeyboardInterrupt, SystemExit: no collective on the way out
            del _pending[[section is self for section in _pending].index(True):]
        return False


def _agree(failure: BaseException | None = None, at_collective: bool = False) -> None:
    """Agree with the other ranks of every pending section's group whether any raised (:class:`every_rank_raises`);
    ``failure``: this rank's exception, if it raised; ``at_collective``: whether this rank agrees at an rfgp collective
    (else at a section's exit)."""
    sections = list(_pending)
    _pending.clear()
    others, mismatch = [], None
    for group in _distinct_groups(sections):
        mine = [section for section in sections if section.group is group]
        counts = [failure is not None, at_collective, *(sum(column) for column in zip(*(s.counts for s in mine)))]
        flags = torch.tensor(counts, dtype=torch.float64, device=_collective_device(group))
        dist.all_reduce(flags, group=group)
        failed, reached, *totals = flags.tolist()
        for section in mine:
            section.totals = tuple(int(total) for total in totals)
        if failed:
            others += _failing_messages(failure, group)
        elif 0 < reached < dist.get_world_size(group):
            mismatch = (int(reached), dist.get_world_size(group))
    if others and failure is None:
        raise OtherRankError("; ".join(others) + ". This rank's evaluation passed; every rank raises (rather than "
                             "wait for the failing rank in a collective until the process group's timeout)")
    if mismatch is not None and failure is None:
        raise CollectiveMismatchError(
            f"{mismatch[0]} of {mismatch[1]} ranks reached an rfgp collective (a sum of statistics) inside a "
            "data_parallel block or marginal likelihood that the other ranks left without one; this rank "
            f"{'reached one' if at_collective else 'left it without one'}. The ranks would meet different "
            "collectives (gloo aborts, or waits for the process group's timeout): posterior caches built on some "
            "ranks only (a prediction outside data_parallel, train()/eval(), other hyperparameters on some ranks)? "
            "Make the same calls on every rank")
    if failure is None:
        for section in reversed(sections):
            if section.on_agreed is not None:
                section.on_agreed(section.totals)


def _distinct_groups(sections: list) -> list:
    groups = []
    for section in sections:
        if not any(section.group is group for group in groups):
            groups.append(section.group)
    return groups


def _failing_messages(failure: BaseException | None, group) -> list[str]:
    """'rank r of R raised Class: message' of every rank of ``group`` that failed (a collective)."""
    mine = None
    if failure is not None:
        mine = f"{type(failure).__name__}: {failure}"
        mine = mine if len(mine) <= _MESSAGE_CHARS else mine[:_MESSAGE_CHARS] + "…"
    messages = [None] * dist.get_world_size(group)
    dist.all_gather_object(messages, mine, group=group)
    return [f"rank {rank} of {len(messages)} raised {message}" for rank, message in enumerate(messages)
            if message is not None]


def _before_collective() -> None:
    """Agree on the pending :class:`every_rank_raises` sections before an rfgp collective."""
    if _pending:
        _agree(at_collective=True)


class data_parallel(every_rank_raises):
    """Context in which rfgp feature statistics are summed over the ranks of ``group``.

    Every rank must enter it and evaluate the same operations (they are collectives); a rank's shard may be empty.
    An exception that one rank raises inside it before its first rfgp collective is raised on every rank
    (:class:`every_rank_raises`): one more all-reduce of 4 numbers per block.
    """

    def __init__(self, group=None) -> None:
        super().__init__(group)

    def __enter__(self):
        super().__enter__()
        _active_groups.append(self.group)
        return self

    def __exit__(self, *exc) -> bool:
        _active_groups.pop()
        return super().__exit__(*exc)


def is_active() -> bool:
    """Whether statistics are currently reduced over processes."""
    return bool(_active_groups)


def reduction_scope() -> tuple:
    """What statistics are currently summed over: ``()`` outside :class:`data_parallel` (this process's points),
    ``(group,)`` inside it.  Caches of statistics built in one scope do not answer in another."""
    return tuple(_active_groups[-1:])


#: what data_parallel supports, named in every refusal (:func:`refuse`)
SUPPORTED = (
    "DistributedExactMarginalLogLikelihood (loss and, after sync_gradients, gradients) and the posterior mean and "
    "covariance (model(x_test), likelihood(model(x_test))) of an ExactGP with an rfgp feature kernel: single-output "
    "(Gaussian, fixed-noise, Dirichlet classification, complex posterior, chunked), multi-output "
    "(MultitaskGaussianLikelihood of any rank, missing targets under observation_nan_policy('mask'))"
)


def refuse(what: str) -> None:
    """Raise ``NotImplementedError`` naming ``what`` if a :class:`data_parallel` sum is active: an operation over all
    N points that is no sum over each process's points (a solve, leave-one-out terms, fantasies)."""
    if is_active():
        raise NotImplementedError(
            f"rfgp.inference.distributed.data_parallel does not support {what}: each process holds only its shard "
            f"of the training points; supported: {SUPPORTED}. Run it outside data_parallel on one process that "
            "holds all the data"
        )


class _AllReduceSum(torch.autograd.Function):
    @staticmethod
    def forward(ctx, group, *tensors):
        # One flat buffer: a single collective call per reduction.
        flat = torch.cat([t.reshape(-1) for t in tensors])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
        return tuple(part.view_as(t) for part, t in zip(flat.split([t.numel() for t in tensors]), tensors))

    @staticmethod
    def backward(ctx, *grads):
        # Identity: each rank keeps the gradient of its own summand; sync_gradients adds them.
        return (None, *grads)


def reduce_statistics(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Sum ``tensors`` over the ranks of the active :class:`data_parallel` group (identity outside)."""
    if not _active_groups:
        return tensors
    if torch.jit.is_tracing():  # a collective is no part of a deployable single-process model
        raise RuntimeError("rfgp.inference.distributed.data_parallel statistics cannot be traced (torch.jit.trace): "
                           "compute the posterior caches outside data_parallel before tracing")
    _before_collective()
    dtype = functools.reduce(torch.promote_types, (t.dtype for t in tensors))
    reduced = _AllReduceSum.apply(_active_groups[-1], *(t.to(dtype) for t in tensors))
    return tuple(r.to(t.dtype) for r, t in zip(reduced, tensors))


def sync_gradients(module: nn.Module, group=None) -> None:
    """Sum the ``.grad`` of the parameters of ``module`` over the ranks of ``group`` (after ``loss.backward()``).

    A collective: every rank calls it, with the same parameters (number, sizes, order).  A parameter whose ``.grad``
    is ``None`` on some ranks — their loss did not reach it (an empty shard, a branch their data never take) —
    counts as zeros there and receives the sum on every rank, so that every rank steps the same model; one without a
    gradient on any rank keeps ``None``.  Refused on every rank (``ValueError``) where the ranks' modules differ in
    their number of parameters or of parameter values, or where a parameter requires a gradient on some ranks and not
    on others (frozen on some: their optimisers would step different models), naming the first such parameter.
    Three all-reduces: the sizes, which parameters require and have gradients, the gradients of those that any rank
    has.
    """
    named = list(module.named_parameters())
    device = named[0][1].device if named else _collective_device(group)
    world = dist.get_world_size(group)
    _check_same_sizes(named, "parameters", device, group)
    flags = torch.tensor([[p.requires_grad, p.grad is not None] for _, p in named], dtype=torch.int64,
                         device=device).reshape(len(named), 2)
    dist.all_reduce(flags, group=group)
    requiring, holding = flags.unbind(-1)
    frozen_on_some = ((requiring > 0) & (requiring < world)).tolist()
    if any(frozen_on_some):
        index = frozen_on_some.index(True)
        raise ValueError(
            f"parameter {named[index][0]} requires a gradient on {int(requiring[index])} of {world} ranks: "
            "sync_gradients sums the gradients of one model trained on every rank; freeze it (requires_grad_(False)) "
            "on every rank or on none")
    params = [p for (_, p), held in zip(named, holding.tolist()) if held]
    if not params:
        return
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    for p, part in zip(params, flat.split([p.numel() for p in params])):
        if p.grad is None:
            p.grad = part.view_as(p).to(dtype=p.dtype, copy=True)
        else:
            p.grad.copy_(part.view_as(p.grad))


def _collective_device(group) -> torch.device:
    """Where tensors of a collective of ``group`` live: the current CUDA device for NCCL, else the CPU."""
    if dist.get_backend(group) == dist.Backend.NCCL:
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _check_same_sizes(named: list[tuple[str, Tensor]], what: str, device: torch.device, group) -> None:
    """Raise ``ValueError`` on every rank unless every rank holds as many tensors ``named`` (``what``: their kind),
    with as many values, as the others: one all-reduce of fixed length, so that ranks with different modules still
    meet, before collectives whose length is theirs."""
    _before_collective()
    sizes = torch.tensor([len(named), sum(p.numel() for _, p in named)], dtype=torch.int64, device=device)
    extremes = torch.cat([sizes, -sizes])  # max and −min in one collective
    dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
    if bool((extremes[:2] != -extremes[2:]).any()):
        (most, most_values), (least, least_values) = extremes[:2].tolist(), (-extremes[2:]).tolist()
        raise ValueError(
            f"the module has {len(named)} {what} ({int(sizes[1])} values) on this rank, and between {least} and "
            f"{most} ({least_values} to {most_values} values) over the ranks: data-parallel training needs one model "
            "built alike on every rank")


def check_same_parameters(module: nn.Module, group=None) -> None:
    """Raise ``ValueError`` naming the first parameter or buffer (outside the likelihoods, whose buffers may be data)
    of ``module`` whose value differs between ranks.

    Sharding is exact only for one model on every rank: a rank with other parameters (a ``MultitaskKernel``'s
    ``IndexKernel`` draws its factor from torch's global generator, so unseeded ranks differ) or other buffers (the
    random draws of an unseeded ``rfgp.sketch``, Nyström landmarks chosen from each rank's own shard) would silently
    sum the statistics of different models.  Compares each tensor's sum and sum of squares (float64) by one
    max-reduction, after one of their number and sizes (:func:`_check_same_sizes`); a sum that is NaN or ±Inf on every
    rank (a diverged optimiser step) is no difference between ranks, and is left to the evaluation, which names it as
    on one process.
    """
    named = [(f"parameter {name}", p) for name, p in module.named_parameters()]
    named += [(f"buffer {name}", b) for name, b in _model_buffers(module)]
    device = named[0][1].device if named else _collective_device(group)
    _check_same_sizes(named, "parameters and buffers (outside the likelihoods)", device, group)
    if not named:
        return
    with torch.no_grad():
        stats = torch.stack([torch.stack([t.double().sum(), t.double().square().sum()]).to(device) for _, t in named])
        finite = torch.isfinite(stats)  # NaN != NaN: a NaN on every rank read as a difference
        stats = torch.cat([torch.where(finite, stats, 0.0), (~finite).double()], -1)
        extremes = torch.cat([stats, -stats])  # max and −min in one collective
        dist.all_reduce(extremes, op=dist.ReduceOp.MAX, group=group)
        differ = (extremes[: len(named)] != -extremes[len(named):]).any(-1).tolist()
    if any(differ):
        name = named[differ.index(True)][0]
        raise ValueError(
            f"{name} differs between ranks; DistributedExactMarginalLogLikelihood needs the same model on every "
            "rank: build it with the same seeds (rfgp.sketch(..., seed=s) for the random draws, torch.manual_seed "
            "before construction — GPyTorch's IndexKernel draws its covar_factor at random; Nyström landmarks chosen "
            "on the full data or given by hand) or broadcast the parameters and buffers from rank 0"
        )


def _model_buffers(module: nn.Module) -> list[tuple[str, Tensor]]:
    """The buffers of ``module`` outside its likelihoods, whose buffers may hold each rank's own data (a Dirichlet
    likelihood's targets, a fixed-noise likelihood's noise)."""
    data_owners = [name + "." for name, sub in module.named_modules()
                   if isinstance(sub, gpytorch.likelihoods.Likelihood)]
    return [(name, b) for name, b in module.named_buffers() if not any(name.startswith(o) for o in data_owners)]


class DistributedExactMarginalLogLikelihood(gpytorch.mlls.ExactMarginalLogLikelihood):
    """GPyTorch's exact MLL per data point over data sharded across processes.

    Returns the same value on every rank, equal to the single-process
    ``ExactMarginalLogLikelihood`` on the concatenated data; after ``backward()`` and
    :func:`sync_gradients` the gradients match too.  Prior and added-loss terms enter
    once (their gradient is split evenly over ranks).  Needs an rfgp feature kernel, and the same parameters on
    every rank (:func:`check_same_parameters`, one small collective per call).
    """

    def __init__(self, likelihood, model, group=None) -> None:
        super().__init__(likelihood, model)
        self.group = group

    def forward(self, function_dist, target, *params, **kwargs):
        if not isinstance(function_dist, gpytorch.distributions.MultivariateNormal):
            raise TypeError(
                f"function_dist must be a MultivariateNormal, got {type(function_dist).__name__}"
            )
        check_same_parameters(self, self.group)
        # a rank whose own evaluation raises before the statistics' all-reduce: every rank raises (every_rank_raises);
        # the ranks agree at that all-reduce's start, summing their counts of targets
        with every_rank_raises(self.group, self._refuse_no_observed_target) as agreement:
            output, target, local = self._observed_output(function_dist, target, *params, **kwargs)
            agreement.counts = local
            with data_parallel(self.group):
                res = output.log_prob(target)
        total, observed_total = agreement.totals
        res = res - 0.5 * (observed_total - local[1]) * math.log(2 * math.pi)
        other = self._add_other_terms(torch.zeros_like(res), params)
        world = dist.get_world_size(self.group)
        # Exact value on every rank, 1/world of its gradient per rank: summed once by sync_gradients.
        other = other / world + (other - other / world).detach()
        return (res + other) / total

    def _observed_output(self, function_dist, target, *params, **kwargs):
        """(the likelihood's distribution of the observed targets, those targets, (the number of targets, the number
        observed)) on this rank: GPyTorch's ``ExactMarginalLogLikelihood`` under ``observation_nan_policy``."""
        output = self.likelihood(function_dist, *params, **kwargs)
        # at call time: log_prob's operators and prediction import this module
        from .log_prob import has_feature_space_covariance
        from .prediction import observed_entries

        if not has_feature_space_covariance(output):
            raise NotImplementedError(
                "rfgp.inference.distributed.data_parallel does not support a noise-added covariance of type "
                f"{type(evaluated_covariance(output.lazy_covariance_matrix)).__name__} (no rfgp feature-space "
                f"statistics to sum over processes); supported: {SUPPORTED}"
            )
        policy = gpytorch.settings.observation_nan_policy.value()
        if policy == "fill":
            raise ValueError("observation_nan_policy('fill') is not supported by DistributedExactMarginalLogLikelihood "
                             "(nor by GPyTorch's ExactMarginalLogLikelihood); accepted: 'ignore' or 'mask'")
        if policy == "mask":  # GPyTorch's ExactMarginalLogLikelihood: the observed entries' marginal
            observed = observed_entries(target, output.event_shape)
            output = gpytorch.distributions.MultivariateNormal(
                output.mean[..., observed],
                MaskedLinearOperator(output.lazy_covariance_matrix, observed.reshape(-1), observed.reshape(-1)))
            target = target[..., observed]
        # GPyTorch divides by the number of all targets (missing ones included); log_prob's constant counts the
        # observed ones of this rank, the statistics inside it are global
        return output, target, (function_dist.event_shape.numel(), output.event_shape.numel())

    def _refuse_no_observed_target(self, totals: tuple[int, int]) -> None:
        """Every rank refuses targets of which no rank observes one (the loss would be 0/0)."""
        total, observed_total = totals
        if observed_total == 0:
            raise ValueError(f"the targets of all {dist.get_world_size(self.group)} ranks hold no observed value "
                             f"({total} targets in all, every one NaN or none at all): the marginal likelihood needs "
                             "at least one")
