"""A practitioner's pass over many independent GPs in one batched model (GPyTorch's "Batch GP regression" recipe:
``batch_shape`` on the mean, kernel and likelihood; train_x ``(B, N, d)``, train_y ``(B, N)``) with rfgp kernels.

Each member of the batch must be the GP that a separately built rfgp model with the same draws and hyperparameters
is: marginal likelihood, gradients and posterior, materialised or chunked, after ``set_num_features`` and with
fantasies; the members share the kernel's draws (one set of buffers in the state dict)."""

import math
import warnings

import gpytorch
import pytest
import torch
from linear_operator.utils.errors import NotPSDError

import rfgp
import rfgp.inference.chunking as chunking
import rfgp.inference.linalg as linalg

from ._models import LikelihoodGP

F64 = torch.float64
B, N, D = 4, 30, 2
BATCH = torch.Size([B])


def _GP(x, y, kernel, batch_shape):
    """GPyTorch's batch GP regression model: constant means and a Gaussian likelihood of ``batch_shape``."""
    return LikelihoodGP(x, y, kernel, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch_shape), batch_shape)


def _data(num_members=B, num_points=N):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(num_members, num_points, D, generator=gen, dtype=F64)
    y = torch.sin(3 * x).sum(-1) + 0.1 * torch.randn(num_members, num_points, generator=gen, dtype=F64)
    return x, y


def _kernel(batch_shape, method, x_sample):
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch_shape, ard_num_dims=D),
                                         batch_shape=batch_shape)
    if method == "nystrom":
        return rfgp.sketch(exact, 16, method="nystrom", seed=0, x_sample=x_sample)
    return rfgp.sketch(exact, 64, method=method, seed=0)


def _batched(x, y, method="rff", seed_hypers=0):
    """The batched model with distinct hyperparameters per member."""
    model = _GP(x, y, _kernel(BATCH, method, x.reshape(-1, D)), BATCH).double()
    gen = torch.Generator().manual_seed(seed_hypers)
    model.covar_module.base_kernel.lengthscale = 0.3 + torch.rand(B, 1, D, generator=gen, dtype=F64)
    model.covar_module.outputscale = 0.5 + torch.rand(B, generator=gen, dtype=F64)
    model.likelihood.noise = 0.01 + 0.1 * torch.rand(B, 1, generator=gen, dtype=F64)
    model.mean_module.constant = torch.randn(B, generator=gen, dtype=F64)
    return model


def _member(model, x, y, b, method="rff"):
    """Member b of ``model`` built on its own: the same draws (seed, landmarks) and member b's hyperparameters."""
    single = _GP(x[b], y[b], _kernel(torch.Size([]), method, x.reshape(-1, D)), torch.Size([])).double()
    single.load_state_dict({name: value[b] if value.dim() and value.shape[0] == B and "config" not in name
                            and "feature_map" not in name and "landmarks" not in name else value
                            for name, value in model.state_dict().items()})
    return single


def _loss_and_grads(model, x, y):
    model.train()
    model.zero_grad()
    loss = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y)
    loss.sum().backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("method", ["rff", "orf", "sorf", "nystrom"])
def test_every_member_is_the_separately_built_gp(method):
    x, y = _data()
    model = _batched(x, y, method)
    losses, grads = _loss_and_grads(model, x, y)
    assert losses.shape == BATCH
    x_test = torch.rand(7, D, generator=torch.Generator().manual_seed(2), dtype=F64)
    model.eval()
    with torch.no_grad():
        batched = model(x_test)
    for b in range(B):
        single = _member(model, x, y, b, method)
        loss, single_grads = _loss_and_grads(single, x[b], y[b])
        assert math.isclose(loss.item(), losses[b].item(), rel_tol=0, abs_tol=1e-10)
        for name, grad in single_grads.items():
            torch.testing.assert_close(grads[name][b].reshape(grad.shape), grad, rtol=0, atol=1e-10)
        single.eval()
        with torch.no_grad():
            prediction = single(x_test)
        torch.testing.assert_close(batched.mean[b], prediction.mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(batched.variance[b], prediction.variance, rtol=0, atol=1e-10)


def test_members_share_one_set_of_draws_and_the_state_round_trips_bit_for_bit():
    x, y = _data()
    model = _batched(x, y)
    state = model.state_dict()
    frequencies = state["covar_module.base_kernel.feature_map.frequencies"]
    assert frequencies.shape[0] != B  # one (d, m) draw for all members, not one per member
    other = _GP(x, y, rfgp.sketch(gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel(batch_shape=BATCH, ard_num_dims=D), batch_shape=BATCH), 64, seed=7), BATCH).double()
    other.load_state_dict(state)
    x_test = torch.rand(5, D, generator=torch.Generator().manual_seed(3), dtype=F64)
    model.eval()
    other.eval()
    with torch.no_grad():
        expected, loaded = model(x_test), other(x_test)
    assert torch.equal(expected.mean, loaded.mean) and torch.equal(expected.variance, loaded.variance)


def test_test_inputs_broadcast_against_the_member_batch_and_t_batches():
    x, y = _data()
    model = _batched(x, y)
    model.eval()
    gen = torch.Generator().manual_seed(4)
    shared = torch.rand(6, D, generator=gen, dtype=F64)
    t_batches = torch.rand(3, B, 6, D, generator=gen, dtype=F64)
    with torch.no_grad():
        on_shared = model(shared)
        on_members = model(shared.expand(B, 6, D))
        on_t_batches = model(t_batches)
        assert on_shared.mean.shape == (B, 6) and on_t_batches.mean.shape == (3, B, 6)
        torch.testing.assert_close(on_shared.mean, on_members.mean, rtol=0, atol=1e-12)
        for t in range(3):
            alone = model(t_batches[t])
            torch.testing.assert_close(on_t_batches.mean[t], alone.mean, rtol=0, atol=1e-12)
            torch.testing.assert_close(on_t_batches.covariance_matrix[t], alone.covariance_matrix, rtol=0, atol=1e-12)


def test_a_non_finite_target_names_its_member():
    x, y = _data()
    y[2, 5] = math.nan
    model = _batched(x, y)
    with pytest.raises(ValueError, match=r"1 NaN .* the first at index \(2, 5"):
        rfgp.fit_mll(model, num_iterations=1)


def test_chunked_backward_forms_the_gram_gradient_factor_once(monkeypatch):
    """The F × F factor ½(Ḡ + Ḡᵀ) of the chunked statistics' backward pass is the same for every chunk: formed once
    (it was formed per chunk, an O(B·F²) pass each, which at B = 100 members, F = 256 and a 16 MiB budget was as
    long as the chunks' products)."""
    calls = []
    original = linalg.gram_gradient

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(linalg, "gram_gradient", counted)
    monkeypatch.setattr(chunking, "gram_gradient", counted, raising=False)
    x, y = _data()
    model = _batched(x, y)
    expected, expected_grads = _loss_and_grads(model, x, y)
    calls.clear()
    x_test = torch.rand(5, D, generator=torch.Generator().manual_seed(7), dtype=F64)
    model.eval()
    with torch.no_grad():
        expected_prediction = model(x_test)
    with rfgp.settings.chunk_size(7):
        losses, grads = _loss_and_grads(model, x, y)
        assert len(calls) == 1
        model.eval()
        with torch.no_grad():
            prediction = model(x_test)
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-12)
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-12)
    torch.testing.assert_close(prediction.mean, expected_prediction.mean, rtol=0, atol=1e-12)
    torch.testing.assert_close(prediction.variance, expected_prediction.variance, rtol=0, atol=1e-12)


def test_fit_mll_names_the_batch_members_that_stopped_away_from_their_own_optimum():
    """The summed loss's stopping rules test the sum: a member can stop far from its own optimum.  fit_mll checks
    each member's gradient against its own stationary bound max(gtol, √(2κ·ftol·max(|f_b|, 1))) and names them."""
    x, y = _data()
    model = _GP(x, y, _kernel(BATCH, "rff", None), BATCH).double()
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="batch members stopped away") as caught:
        rfgp.fit_mll(model, num_iterations=2)
    losses, grads = _loss_and_grads(model, x, y)
    worst = torch.stack([grad.abs().reshape(B, -1).amax(-1) for grad in grads.values()]).amax(0)
    bounds = (2 * 50 * 1e-6 * losses.abs().clamp(min=1.0)).sqrt().clamp(min=1e-5)
    message = next(str(w.message) for w in caught if "batch members" in str(w.message))
    assert f"{int((worst > bounds).sum())} of {B} batch members" in message
    assert f"member {int((worst / bounds).argmax())}:" in message
    alone = _GP(x[0], y[0], _kernel(torch.Size([]), "rff", None), torch.Size([])).double()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rfgp.fit_mll(alone, num_iterations=2)
    assert not [w for w in caught if "batch members" in str(w.message)]


def test_widened_and_conditioned_batches_are_their_members_widened_and_conditioned():
    """Train small, predict big (``set_num_features``) and GPyTorch's fantasy update act on every member as on the
    member built alone."""
    x, y = _data()
    model = _batched(x, y)
    gen = torch.Generator().manual_seed(5)
    x_new, y_new = torch.rand(B, 3, D, generator=gen, dtype=F64), torch.randn(B, 3, generator=gen, dtype=F64)
    x_test = torch.rand(6, D, generator=gen, dtype=F64)
    members = [_member(model, x, y, b) for b in range(B)]
    for m in (model, *members):
        rfgp.set_num_features(m, 128)
        m.eval()
        with torch.no_grad():
            m(x_test)  # the caches the fantasy updates
    with torch.no_grad():
        widened = model(x_test)
        conditioned = model.get_fantasy_model(x_new, y_new)(x_test)
    for b, member in enumerate(members):
        with torch.no_grad():
            alone = member(x_test)
            alone_conditioned = member.get_fantasy_model(x_new[b], y_new[b])(x_test)
        torch.testing.assert_close(widened.mean[b], alone.mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(widened.variance[b], alone.variance, rtol=0, atol=1e-10)
        torch.testing.assert_close(conditioned.mean[b], alone_conditioned.mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(conditioned.variance[b], alone_conditioned.variance, rtol=0, atol=1e-10)


def test_botorch_single_task_gp_on_batched_training_data_is_its_members():
    pytest.importorskip("botorch")
    from botorch.models import SingleTaskGP
    from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior

    x, y = _data(num_points=15)

    def kernel(batch_shape):
        return rfgp.sketch(get_covar_module_with_dim_scaled_prior(ard_num_dims=D, batch_shape=batch_shape), 64, seed=0)

    model = SingleTaskGP(x, y.unsqueeze(-1), covar_module=kernel(BATCH))
    gen = torch.Generator().manual_seed(6)
    model.covar_module.lengthscale = 0.3 + torch.rand(B, 1, D, generator=gen, dtype=F64)
    model.likelihood.noise = 0.01 + 0.1 * torch.rand(B, 1, generator=gen, dtype=F64)
    x_test = torch.rand(2, B, 5, D, generator=gen, dtype=F64)  # t-batches of an acquisition
    with torch.no_grad():
        batched = model.posterior(x_test)
    assert batched.mean.shape == (2, B, 5, 1)
    for b in range(B):
        member = SingleTaskGP(x[b], y[b].unsqueeze(-1), covar_module=kernel(torch.Size([])))
        member.load_state_dict({name: value[b] if value.dim() and value.shape[0] == B and "config" not in name
                                and "feature_map" not in name else value
                                for name, value in model.state_dict().items()})
        with torch.no_grad():
            alone = member.posterior(x_test[:, b])
        torch.testing.assert_close(batched.mean[:, b], alone.mean, rtol=0, atol=1e-10)
        torch.testing.assert_close(batched.variance[:, b], alone.variance, rtol=0, atol=1e-10)


def test_targets_below_the_noise_floor_are_named_by_their_batch_member():
    x, y = _data()
    y[1] = 1e-4 * y[1]  # variance ≈ 10⁻⁸ against GPyTorch's noise floor 10⁻⁴
    y[3] = 2.0  # constant: no signal to lose, not reported
    model = _GP(x, y, _kernel(BATCH, "rff", None), BATCH).double()
    with pytest.warns(rfgp.training.DataScaleWarning, match=r"the training targets of batch member 1 vary with"):
        rfgp.fit_mll(model, num_iterations=1)


def _member_losses(model):
    model.train()
    with torch.no_grad():
        return -gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs),
                                                                                  model.train_targets)


def test_member_lbfgs_trains_every_member_to_its_own_optimum():
    """optimizer="member_lbfgs": one L-BFGS per member (own curvature pairs, own Armijo step, own stopping rule) on
    the batch's evaluations; each member ends where fit_mll takes it alone."""
    x, y = _data(num_points=25)
    y = y * torch.tensor([0.5, 1.0, 2.0, 4.0], dtype=F64).unsqueeze(-1)
    alone = []
    for b in range(B):
        single = _GP(x[b], y[b], _kernel(torch.Size([]), "rff", None), torch.Size([])).double()
        rfgp.fit_mll(single)
        alone.append(_member_losses(single).item())
    model = _GP(x, y, _kernel(BATCH, "rff", None), BATCH).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error", gpytorch.utils.warnings.NumericalWarning)  # no member left short
        history = rfgp.fit_mll(model, optimizer="member_lbfgs")
    assert history.converged and history.stop_reason.startswith(f"converged: each of the {B} batch members")
    torch.testing.assert_close(_member_losses(model), torch.tensor(alone, dtype=F64), rtol=0, atol=1e-4)
    assert history.losses[-1] == pytest.approx(sum(alone), abs=4e-4)


def test_member_lbfgs_refuses_parameters_the_members_share():
    x, y = _data()
    model = _GP(x, y, _kernel(torch.Size([]), "rff", None), BATCH).double()  # one kernel for all members
    with pytest.raises(ValueError, match=r"member_lbfgs.* batch shape \(4,\).*\[\(\), \(1, 2\)"):
        rfgp.fit_mll(model, optimizer="member_lbfgs")


def _statistics_warnings(budget, evaluate):
    with warnings.catch_warnings(record=True) as caught, rfgp.settings.memory_budget(budget):
        warnings.simplefilter("always")
        result = evaluate()
    return result, [str(w.message) for w in caught if issubclass(w.category, rfgp.MemoryBudgetWarning)]


def test_statistics_over_the_memory_budget_are_named_with_their_batch_and_width():
    """The budget chunks the (B, N, F) features but not the (B, F, F) statistics: where those alone exceed it, a
    MemoryBudgetWarning names B, F, the bytes and the budget (B = 100, F = 256 under 16 MiB had grown by 304 MB
    without a word).  B = 4, F = 64, float64: 6 (B, F, F) matrices for an MLL and its gradient, 786 432 bytes; 3 for a
    posterior, 393 216; the features (4 copies of 4 × 200 × 64) 1 638 400 bytes, chunked under every budget here."""
    assert issubclass(rfgp.MemoryBudgetWarning, UserWarning)  # shown by default, unlike a ResourceWarning
    x, y = _data(num_points=200)
    model = _batched(x, y)
    expected, expected_grads = _loss_and_grads(model, x, y)
    (losses, grads), messages = _statistics_warnings(500_000, lambda: _loss_and_grads(model, x, y))
    assert len(messages) == 1
    assert "B = 4 batch member(s) at num_features F = 64 need about 786432 bytes" in messages[0]
    assert "500000 bytes" in messages[0] and "separate models of at most 2 (batch_shape=[2])" in messages[0]
    torch.testing.assert_close(losses, expected, rtol=0, atol=1e-12)  # warned, not changed
    for name, grad in grads.items():
        torch.testing.assert_close(grad, expected_grads[name], rtol=0, atol=1e-12)
    # no member fits: the advice is the width
    _, messages = _statistics_warnings(150_000, lambda: _loss_and_grads(model, x, y))
    assert len(messages) == 1 and "reduce num_features, or raise the budget above 786432 bytes" in messages[0]
    # statistics within the budget (features still chunked): no warning
    _, messages = _statistics_warnings(1_000_000, lambda: _loss_and_grads(model, x, y))
    assert messages == []

    def posterior():
        model.eval()
        with torch.no_grad():
            return model(x[:, :5]).variance

    _, messages = _statistics_warnings(500_000, posterior)  # a posterior's 393 216 bytes fit
    assert messages == []
    model.train()
    _, messages = _statistics_warnings(300_000, posterior)
    assert len(messages) == 1
    assert "a posterior for B = 4 batch member(s)" in messages[0] and "393216 bytes" in messages[0]


def test_unchunked_statistics_over_the_memory_budget_are_named_too():
    """Features within the budget are not chunked, but their (B, F, F) statistics can still exceed it on their own
    (N a little above F, where the feature path is taken): B = 4, N = 80, F = 64, float64, features 655 360 bytes
    (4 copies) within 700 000, an MLL and its gradient 786 432 bytes; the posterior's 393 216 fit."""
    x, y = _data(num_points=80)
    model = _batched(x, y)
    expected, _ = _loss_and_grads(model, x, y)
    (losses, _), messages = _statistics_warnings(700_000, lambda: _loss_and_grads(model, x, y))
    assert len(messages) == 1 and "B = 4 batch member(s) at num_features F = 64 need about 786432 bytes" in messages[0]
    torch.testing.assert_close(losses, expected, rtol=0, atol=0)
    model.eval()
    with torch.no_grad():
        _, messages = _statistics_warnings(700_000, lambda: model(x[:, :5]).variance)
    assert messages == []
    model.train()


def test_a_single_gp_whose_statistics_exceed_the_budget_is_not_warned():
    """One GP's F × F matrices are the width it was given (the recipe's re-draw at 8F exceeds the default budget):
    only batches, whose statistics grow with B, are warned.  N = 200, F = 64, float64: 196 608 bytes for an MLL."""
    x, y = _data(num_points=200)
    model = _batched(x, y)
    single = _member(model, x, y, 0)
    _, messages = _statistics_warnings(100_000, lambda: _loss_and_grads(single, x[0], y[0]))
    assert messages == []
    _, messages = _statistics_warnings(100_000, lambda: _loss_and_grads(model, x, y))
    assert len(messages) == 1



@pytest.mark.parametrize("num_members, failing", [(4, [0]), (8, [0, 5])])
def test_member_lbfgs_isolates_the_members_whose_trial_points_fail(monkeypatch, num_members, failing):
    """A failed evaluation of the batch names no member.  Halving every pending step let member 0, stepping towards a
    noise where its covariance fails, stall all four members (3 of them up to 0.1 nats per point above their own
    fits); the members it moved are bisected instead, and only the failing members stall."""
    x, y = _data(num_members, num_points=25)
    others = [b for b in range(num_members) if b not in failing]
    alone = []
    for b in others:
        single = _GP(x[b], y[b], _kernel(torch.Size([]), "rff", None), torch.Size([])).double()
        rfgp.fit_mll(single)
        alone.append(_member_losses(single).item())
    model = _GP(x, y, _kernel(torch.Size([num_members]), "rff", None), torch.Size([num_members])).double()
    floor = 0.02  # the failing members' own optima lie below it
    evaluate = gpytorch.mlls.ExactMarginalLogLikelihood.forward

    def failing_below_the_floor(self, *args, **kwargs):
        if bool((model.likelihood.noise.detach().flatten()[failing] < floor).any()):
            raise NotPSDError("a failing member's covariance at this trial point")
        return evaluate(self, *args, **kwargs)

    monkeypatch.setattr(gpytorch.mlls.ExactMarginalLogLikelihood, "forward", failing_below_the_floor)
    count, worst = f"{len(failing)} of {num_members} batch members", "|".join(map(str, failing))
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match=rf"{count} .* member ({worst}):.*train on"):
        history = rfgp.fit_mll(model, optimizer="member_lbfgs")
    assert history.stop_reason.startswith(f"stalled: {count}") and f"(members {failing}), the others" in (
        history.stop_reason)
    monkeypatch.undo()
    torch.testing.assert_close(_member_losses(model)[others], torch.tensor(alone, dtype=F64), rtol=0, atol=1e-4)


def test_member_lbfgs_stopped_by_its_budget_is_not_told_to_use_member_lbfgs():
    """The batch-member warning after optimizer="member_lbfgs" said "the fit stopped on the summed loss" and advised
    "train with optimizer='member_lbfgs'" — the optimizer it had used; it names the budget and says to train on."""
    x, y = _data()
    model = _GP(x, y, _kernel(BATCH, "rff", None), BATCH).double()
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="batch members stopped away") as caught:
        rfgp.fit_mll(model, optimizer="member_lbfgs", num_iterations=2)
    message = next(str(w.message) for w in caught if "batch members" in str(w.message))
    assert "stopped before they converged (iteration budget" in message and "train on" in message
    assert "summed loss" not in message and "optimizer='member_lbfgs'" not in message


def test_member_lbfgs_is_refused_where_there_is_no_batch_of_members():
    """The estimators accepted optimizer="member_lbfgs" (fit_mll's OPTIMIZERS) and failed in fit_mll, whose message
    for a model without a batch read "batch shape () ... got parameters of shapes without a batch shared by the
    members": the estimators refuse it with their choices, fit_mll says the loss is one number."""
    x, y = _data()
    regressor = rfgp.models.GPRegressor(optimizer="member_lbfgs", num_features=32, progress=False)
    with pytest.raises(ValueError, match="optimizer must be one of 'lbfgs', 'adam'; got 'member_lbfgs'"):
        regressor.fit(x[0], y[0])
    classifier = rfgp.models.DirichletGPClassifier(optimizer="member_lbfgs", num_features=32, progress=False)
    with pytest.raises(ValueError, match="optimizer must be one of 'lbfgs', 'adam'; got 'member_lbfgs'"):
        classifier.fit(x[0], (y[0] > 0).long())
    single = _GP(x[0], y[0], _kernel(torch.Size([]), "rff", None), torch.Size([])).double()
    with pytest.raises(ValueError, match=r"member_lbfgs.*marginal likelihood is one number \(no batch"):
        rfgp.fit_mll(single, optimizer="member_lbfgs")
