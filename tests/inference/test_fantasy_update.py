"""Fantasy strategies update their parent's F × F caches by the q new rows (RankUpdatedFantasyStrategy): the same
posterior as recomputing from all N + q points, without featurising or factorising the N training points again."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features.base import FeatureMap
from rfgp.inference import prediction
from rfgp.inference.prediction import FeatureSpacePredictionStrategy, RankUpdatedFantasyStrategy
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

N, D, F = 120, 2, 48  # N > F: the feature-space caches


def model_of(train_noise=None, n=N, dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, D, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    if train_noise is None:
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        likelihood.noise = 0.05
    else:
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(train_noise)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(F, method="orf", seed=0))
    model = ExactGPModel(x, y, likelihood, kernel).double()
    model.covar_module.outputscale = 1.7
    model.covar_module.base_kernel.lengthscale = 0.6
    model.mean_module.constant.data.fill_(0.3)
    model = model.to(dtype).eval()
    with torch.no_grad():
        model(x[:2].to(dtype))  # the parent's caches
    return model


def new_points(*batch, q=3, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return torch.rand(*batch, q, D, generator=gen, dtype=torch.float64) * 4 - 2


def predict(model, xs):
    with torch.no_grad():
        output = model(xs)
        return output.mean, output.covariance_matrix


def recomputed(monkeypatch, model, inputs, targets, **kwargs):
    """The fantasy model of the full recomputation (the strategy before the update)."""
    with monkeypatch.context() as patch:
        patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
        return model.get_fantasy_model(inputs, targets, **kwargs)


XS = torch.linspace(-2.5, 2.5, 7, dtype=torch.float64).unsqueeze(-1).expand(7, D).contiguous()


@pytest.mark.parametrize("case", ["single", "input batch", "fantasy samples", "noise", "fixed training noise"])
def test_updated_fantasy_equals_recomputation(case, monkeypatch):
    gen = torch.Generator().manual_seed(2)
    train_noise = 0.02 + 0.1 * torch.rand(N, generator=gen, dtype=torch.float64) if case.startswith("fixed") else None
    model = model_of(train_noise)
    inputs = new_points(5) if case in ("input batch", "fantasy samples") else new_points()
    targets = torch.randn(*((4,) if case == "fantasy samples" else ()), *inputs.shape[:-1], generator=gen,
                          dtype=torch.float64)
    kwargs = {}
    if case == "noise":
        kwargs["noise"] = torch.tensor([0.3, 1e-4, 0.01], dtype=torch.float64)
    if case == "fixed training noise":
        kwargs["noise"] = torch.full((3,), 0.07, dtype=torch.float64)
    fantasy = model.get_fantasy_model(inputs, targets, **kwargs)
    expected = predict(recomputed(monkeypatch, model, inputs, targets, **kwargs), XS)
    actual = predict(fantasy, XS)
    assert type(fantasy.prediction_strategy) is RankUpdatedFantasyStrategy
    assert fantasy.prediction_strategy._full_strategy is None  # answered without the kernel at all N + q points
    assert actual[0].shape == expected[0].shape and actual[1].shape == expected[1].shape
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=1e-10)
    torch.testing.assert_close(actual[1], expected[1], rtol=0, atol=1e-10)


def test_fantasy_of_a_fantasy_and_float32(monkeypatch):
    """A fantasy of an updated fantasy updates again; float32 caches update in float64, to float32 rounding."""
    model = model_of()
    first, second = (new_points(seed=3), torch.randn(3, dtype=torch.float64)), (new_points(seed=4), torch.randn(3))
    chained = model.get_fantasy_model(*first)
    predict(chained, XS)
    chained = chained.get_fantasy_model(second[0], second[1].double())
    expected = recomputed(monkeypatch, model, torch.cat([first[0], second[0]]),
                          torch.cat([first[1], second[1].double()]))
    assert type(chained.prediction_strategy.parent) is RankUpdatedFantasyStrategy
    for a, b in zip(predict(chained, XS), predict(expected, XS), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    single = model_of(dtype=torch.float32)
    fantasy = single.get_fantasy_model(first[0].float(), first[1].float())
    reference = recomputed(monkeypatch, single, first[0].float(), first[1].float())
    for a, b in zip(predict(fantasy, XS.float()), predict(reference, XS.float()), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=2e-5)


def test_updated_fantasy_featurises_only_the_new_points(monkeypatch):
    """No features of the N training points and no factorisation: only the q new rows, then the test points."""
    model = model_of()
    rows, factorised = [], []
    forward = FeatureMap.__call__

    def spy(self, x, *args, **kwargs):
        rows.append(x.shape[-2])
        return forward(self, x, *args, **kwargs)

    cholesky_ex = torch.linalg.cholesky_ex
    monkeypatch.setattr(FeatureMap, "__call__", spy)
    monkeypatch.setattr(torch.linalg, "cholesky_ex", lambda a, *args, **kw: factorised.append(a.shape) or
                        cholesky_ex(a, *args, **kw))
    fantasy = model.get_fantasy_model(new_points(5), torch.randn(5, 3, dtype=torch.float64))
    predict(fantasy, XS)
    assert rows and max(rows) <= len(XS) and factorised == []


def test_gradient_with_a_graph_and_masked_targets_recompute(monkeypatch):
    """Caches built while a gradient is recorded (BoTorch's propagate_grads) give the recomputation's gradient w.r.t.
    the new inputs; with NaN targets under the "mask" policy they come from the full recomputation."""
    model = model_of()
    inputs = new_points()

    def variance_and_grad(update):
        x = inputs.clone().requires_grad_(True)
        with monkeypatch.context() as patch:
            if not update:
                patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
            fantasy = model.get_fantasy_model(x, torch.zeros(3, dtype=torch.float64))
        with gpytorch.settings.detach_test_caches(False):
            variance = fantasy(XS).variance.sum()
        return variance.detach(), torch.autograd.grad(variance, x)[0]

    expected, actual = variance_and_grad(False), variance_and_grad(True)
    assert expected[1].abs().max() > 1e-3
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the same inputs, caches by the update: the value the gradient belongs to
        updated = model.get_fantasy_model(inputs, torch.zeros(3, dtype=torch.float64))
        torch.testing.assert_close(updated(XS).variance.sum(), expected[0], rtol=1e-12, atol=1e-12)
    assert updated.prediction_strategy._full_strategy is None
    targets = torch.tensor([0.1, float("nan"), -0.2], dtype=torch.float64)
    with gpytorch.settings.observation_nan_policy("mask"):
        fantasy = model.get_fantasy_model(inputs, targets)
        expected = predict(model.get_fantasy_model(inputs[[0, 2]], targets[[0, 2]]), XS)
        actual = predict(fantasy, XS)
    assert fantasy.prediction_strategy._full_strategy is not None
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("batch", [(), (4, 5)])
def test_graph_mode_update_gives_the_recomputations_gradient(batch, detach, monkeypatch):
    """A gradient through a fantasy posterior comes from the update differentiated in the new rows, equal to the full
    recomputation's under detach_test_caches(False) (1e-8) and to central differences:

    * under detach_test_caches (the default) w.r.t. the new inputs X and targets, the parent's caches constant, the
      N training points neither featurised nor factorised (before: the caches held no graph, gradient zero);
    * under detach_test_caches(False) (BoTorch's propagate_grads(True)) also w.r.t. every hyperparameter, through the
      parent's caches with a deferred graph: the N training points are featurised and factorised once, without the
      batch of the new inputs and targets, in the backward pass that asks for the hyperparameters' gradient only (a
      gradient w.r.t. X alone, as BoTorch's gen_candidates_scipy takes, rebuilds nothing; before, every forward pass
      rebuilt them)."""
    model = model_of()
    inputs = new_points(*batch[1:])
    targets = torch.sin(3 * torch.arange(3, dtype=torch.float64)).expand(*batch, 3).contiguous()

    def value(x, y, update=True):
        with monkeypatch.context() as patch:
            if not update:
                patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
            fantasy = model.get_fantasy_model(x, y)
            with gpytorch.settings.detach_test_caches(detach if update else False):
                output = fantasy(XS)
        return (output.variance + output.mean ** 2).sum(), fantasy

    x, y = inputs.clone().requires_grad_(True), targets.clone().requires_grad_(True)
    wrt = [x, y] + ([] if detach else [p for p in model.parameters() if p.requires_grad])
    expected = torch.autograd.grad(value(x, y, update=False)[0], wrt, allow_unused=True)
    shapes, factorised = [], []
    forward, cholesky_ex = FeatureMap.__call__, torch.linalg.cholesky_ex

    def training_work():
        work = [shape for shape in shapes if shape[-2] >= N], [tuple(shape) for shape in factorised]
        shapes.clear()
        factorised.clear()
        return work

    with monkeypatch.context() as patch:
        patch.setattr(FeatureMap, "__call__", lambda self, z, *a, **kw: shapes.append(tuple(z.shape)) or
                      forward(self, z, *a, **kw))
        patch.setattr(torch.linalg, "cholesky_ex", lambda a, *args, **kw: factorised.append(a.shape) or
                      cholesky_ex(a, *args, **kw))
        actual, fantasy = value(x, y)
        assert training_work() == ([], [])
        gradients = torch.autograd.grad(actual, wrt, allow_unused=True, retain_graph=True)
        assert training_work() == (([], []) if detach else ([(N, D)], [(F, F)]))
        inputs_only = torch.autograd.grad(actual, x)[0]
        assert training_work() == ([], [])
    assert fantasy.prediction_strategy._full_strategy is None
    assert all(b.abs().max() > 1e-2 for b in expected if b is not None) and (detach or len(expected) > 4)
    for a, b in zip(gradients, expected, strict=True):
        assert (a is None) == (b is None)
        if b is not None:
            torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    torch.testing.assert_close(inputs_only, expected[0], rtol=0, atol=1e-10)
    step, direction = 1e-5, torch.randn(inputs.shape, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    with torch.no_grad():
        plus, minus = (value(inputs + sign * step * direction, targets)[0] for sign in (1, -1))
    torch.testing.assert_close((plus - minus) / (2 * step), (gradients[0] * direction).sum(), rtol=1e-6, atol=1e-8)


def test_eager_kernels_update_and_chunked_parents_recompute(monkeypatch):
    """Under lazily_evaluate_kernels(False) the new rows come from the evaluated covariance; a training operator
    chunked under a memory budget has no materialised Φ to update from: the fantasy recomputes (same values)."""
    inputs, targets = new_points(5), torch.randn(5, 3, dtype=torch.float64)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        model = model_of()
        fantasy = model.get_fantasy_model(inputs, targets)
        expected = predict(recomputed(monkeypatch, model, inputs, targets), XS)
        actual = predict(fantasy, XS)
    assert type(fantasy.prediction_strategy) is RankUpdatedFantasyStrategy
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)
    with rfgp.settings.memory_budget(8 * F * 16):
        model = model_of()
        assert not model.prediction_strategy.updatable_caches()
        fantasy = model.get_fantasy_model(inputs, targets)
        assert type(fantasy.prediction_strategy) is FeatureSpacePredictionStrategy


def test_kernel_space_parents_recompute():
    """N + q ≲ F: the (N + q) × (N + q) algebra is cheaper, the strategy is the recomputed one."""
    model = model_of(n=20)
    fantasy = model.get_fantasy_model(new_points(), torch.zeros(3, dtype=torch.float64))
    assert type(fantasy.prediction_strategy) is FeatureSpacePredictionStrategy
    assert prediction.RankUpdatedFantasyStrategy.of(model.prediction_strategy, None, None, None, None) is None


def _central_difference(function, x, eps=1e-6):
    grad = torch.zeros_like(x)
    with torch.no_grad():
        for index in range(x.numel()):
            step = torch.zeros_like(x).view(-1)
            step[index] = eps
            step = step.view_as(x)
            grad.view(-1)[index] = (function(x + step) - function(x - step)) / (2 * eps)
    return grad


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("kind", ["kernel space", "masked targets", "updated"])
def test_fantasy_differentiates_in_its_new_inputs_at_every_prediction(kind, detach):
    """A fantasy, recomputed (N + q ≲ F: kernel space; NaN targets under "mask") or updated: the gradient of its
    posterior mean and variance w.r.t. the new inputs is the central difference's, at every differentiated prediction
    of the same fantasy model, each a backward pass over every leaf (hyperparameters included), under GPyTorch's
    default detach_test_caches and under detach_test_caches(False). Before: a recomputed fantasy's caches were built
    without a graph under detach_test_caches (gradient exactly 0, silently); then the first gradient was right and
    the second raised 'Trying to backward through the graph a second time' (the kernel at the new inputs and the new
    points' noise weights evaluated once, at get_fantasy_model, with their graph; a recomputed fantasy's caches cached
    with theirs under detach_test_caches(False))."""
    model = model_of(n=20) if kind == "kernel space" else model_of()
    targets = torch.tensor([0.3, -0.2, float("nan") if kind == "masked targets" else 0.1], dtype=torch.float64)
    parameters = [p for p in model.parameters() if p.requires_grad]
    x = new_points().requires_grad_(True)
    with gpytorch.settings.observation_nan_policy("mask"):
        fantasy = model.get_fantasy_model(x, targets)
    expected_type = RankUpdatedFantasyStrategy if kind != "kernel space" else FeatureSpacePredictionStrategy
    assert type(fantasy.prediction_strategy) is expected_type
    for test_inputs in (XS, XS[::2] + 0.3, XS[1:4] - 0.2):

        def objective(inputs, test_inputs=test_inputs):
            with gpytorch.settings.observation_nan_policy("mask"), gpytorch.settings.detach_test_caches(detach):
                output = (fantasy if inputs is x else model.get_fantasy_model(inputs, targets))(test_inputs)
                return output.mean.sum() + output.variance.sum()

        grad = torch.autograd.grad(objective(x), [x, *parameters], allow_unused=True)[0]
        expected = _central_difference(objective, new_points())
        assert expected.abs().max() > 1e-2
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


SHIFT = torch.tensor([0.1, -0.05], dtype=torch.float64)


@pytest.mark.parametrize("detach", [True, False])
@pytest.mark.parametrize("kind", ["kernel space", "updated"])
def test_fantasy_of_inputs_with_their_own_graph_differentiates_at_every_prediction(kind, detach):
    """The new inputs are a function of the differentiated x, as where BoTorch's condition_on_observations applies
    an input transform to the fantasy points (qKG's X through Normalize, Warp, InputPerturbation): each
    differentiated prediction of the same fantasy gives the central difference's gradient w.r.t. x.  Here the
    inputs' own graph (z = x + s) saves no tensors, so it can be traversed twice, and rfgp rebuilds its graph at each
    prediction; GPyTorch's exact fantasy raises 'backward through the graph a second time' at the second one under
    detach_test_caches(False) (BoTorch's propagate_grads), its caches holding a graph of the new inputs."""
    model = model_of(n=20) if kind == "kernel space" else model_of()
    targets = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    x = new_points().requires_grad_(True)
    fantasy = model.get_fantasy_model(x + SHIFT, targets)
    expected_type = RankUpdatedFantasyStrategy if kind == "updated" else FeatureSpacePredictionStrategy
    assert type(fantasy.prediction_strategy) is expected_type
    for test_inputs in (XS, XS[::2] + 0.3):

        def objective(inputs, test_inputs=test_inputs):
            with gpytorch.settings.detach_test_caches(detach):
                output = (fantasy if inputs is x else model.get_fantasy_model(inputs + SHIFT, targets))(test_inputs)
                return output.mean.sum() + output.variance.sum()

        (grad,) = torch.autograd.grad(objective(x), x)
        expected = _central_difference(objective, new_points())
        assert expected.abs().max() > 1e-2
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


def test_fantasy_inputs_whose_graph_saved_tensors_raise_at_a_second_backward_as_gpytorchs():
    """Where the new inputs' own graph saves tensors (z = x·a, as Normalize's division or Warp's CDF), the first
    backward frees them: a second differentiated prediction raises torch's 'backward through the graph a second time'
    — not a silent or stale gradient — for rfgp's fantasy as for GPyTorch's exact one (the graph was recorded once,
    before either sees the inputs: rebuild the fantasy per backward, as qKG does at each evaluation, or pass
    retain_graph=True to the first); with retain_graph=True both gradients are the central difference's."""
    scale = torch.tensor([1.1, 0.9], dtype=torch.float64)
    targets = torch.tensor([0.3, -0.2, 0.1], dtype=torch.float64)
    exact = model_of().train()
    exact.covar_module.base_kernel = gpytorch.kernels.RBFKernel().double()
    exact.covar_module.base_kernel.lengthscale = 0.6
    with torch.no_grad():
        exact.eval()(XS[:2])
    for model in (model_of(), exact):
        x = new_points().requires_grad_(True)
        fantasy = model.get_fantasy_model(x * scale, targets)
        torch.autograd.grad(fantasy(XS).mean.sum(), x)
        with pytest.raises(RuntimeError, match="backward through the graph a second time"):
            torch.autograd.grad(fantasy(XS).mean.sum(), x)
    model = model_of()
    x = new_points().requires_grad_(True)
    fantasy = model.get_fantasy_model(x * scale, targets)
    expected = _central_difference(lambda inputs: model.get_fantasy_model(inputs * scale, targets)(XS).mean.sum(),
                                   new_points())
    for retain in (True, False):
        (grad,) = torch.autograd.grad(fantasy(XS).mean.sum(), x, retain_graph=retain)
        torch.testing.assert_close(grad, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("detach", [True, False])
def test_fantasy_of_a_fantasy_differentiates_as_the_recomputation(detach, monkeypatch):
    """A fantasy of an updated fantasy, differentiated: the value and the gradients w.r.t. both fantasies' inputs and
    targets equal the recomputation's from all N + q₁ + q₂ points (1e-10), under detach_test_caches (before: those of
    the first fantasy were silently 0, its caches taken as constants) and detach_test_caches(False) (and then every
    hyperparameter's too). Neither building it nor its value nor its gradient w.r.t. its new inputs featurises the
    N + q₁ training points (before: get_fantasy_model read the parent's train_prior_dist, which featurised them, and
    every differentiated call under detach_test_caches(False) again); only a gradient w.r.t. the hyperparameters
    rebuilds the parent's caches from them, once (its graph must reach the fantasy model's own copies of the modules,
    as the recomputation's does, not the parent's)."""
    model = model_of()
    rows, forward = [], FeatureMap.__call__

    def training_rows():
        found = [shape for shape in rows if shape[-2] >= N]
        rows.clear()
        return found

    def gradients(update):
        first, second = new_points(seed=3).requires_grad_(True), new_points(seed=4).requires_grad_(True)
        targets = [torch.randn(3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
                   .requires_grad_(True) for seed in (1, 2)]
        with monkeypatch.context() as patch:
            if not update:
                patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
            patch.setattr(FeatureMap, "__call__", lambda self, z, *a, **kw: rows.append(tuple(z.shape)) or
                          forward(self, z, *a, **kw))
            parent = model.get_fantasy_model(first, targets[0])
            predict(parent, XS)
            training_rows()
            fantasy = parent.get_fantasy_model(second, targets[1])
            with gpytorch.settings.detach_test_caches(detach):
                output = fantasy(XS)
                value = (output.mean ** 2 + output.variance).sum()
            built = training_rows()
            (new_inputs,) = torch.autograd.grad(value, second, retain_graph=True)
            assert training_rows() == []
            parameters = [] if detach else [p for p in parent.parameters() if p.requires_grad]
            result = torch.autograd.grad(value, [first, second, *targets, *parameters], allow_unused=True)
            rebuilt = training_rows()
        if update:
            assert type(fantasy.prediction_strategy.parent) is RankUpdatedFantasyStrategy
            assert built == [] and rebuilt == ([] if detach else [(N + 3, D)])
        torch.testing.assert_close(new_inputs, result[1], rtol=0, atol=1e-12)
        return value.detach(), result

    (value, actual), (expected_value, expected) = gradients(True), gradients(False)
    torch.testing.assert_close(value, expected_value, rtol=0, atol=1e-10)
    assert min(g.abs().max() for g in expected[:4]) > 1e-2 and len(expected) == (4 if detach else 8)
    for a, b in zip(actual, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10)


@pytest.mark.parametrize("num_targets", [5, 2])
def test_fantasy_targets_of_another_number_of_points_are_refused(num_targets):
    """3 new inputs with 5 (or 2) targets: the updated strategy read the number of new points off the targets and
    predicted from 53 inputs and 55 labels, silently (the recomputation failed in GPyTorch's reshape of the labels)."""
    model = model_of()
    with pytest.raises(ValueError, match=rf"targets.*{num_targets}.*3 new input points"):
        model.get_fantasy_model(new_points(), torch.zeros(num_targets, dtype=torch.float64))
    fantasy = model.get_fantasy_model(new_points(), torch.zeros(2, 3, dtype=torch.float64))  # 2 fantasies of 3
    assert predict(fantasy, XS)[0].shape == (2, 7)
