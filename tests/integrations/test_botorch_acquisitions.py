"""BoTorch acquisition functions, transforms and optimisers with rfgp kernels, against the exact model.

The reference is the exact-kernel BoTorch model at the same hyperparameters.  A Nyström map whose landmarks are every
point the kernel sees (training inputs, candidates, optima, the evaluated X — in the kernel's coordinates, after the
input transform) reproduces k exactly on those points, and k̂(x, z) = k(x, z) for every x when z is a landmark, so
values *and* gradients with respect to X equal the exact model's (up to the Nyström factor's round-off, 1e-8 here).
Random features are checked to approach the exact values as F grows (MES, GIBBON), to train as GPyTorch's generic
computation with the same k̂ does (``lazily_evaluate_kernels(False)``, its N × N algebra; Warp), to have the finite
difference's gradient (qNIPV), to optimise, and to factorise nothing larger than F × F over many raw samples and
while pruning qLogNEI's baseline (:mod:`rfgp.integrations.botorch_pruning`).
"""

import copy

import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.acquisition import (  # noqa: E402
    LogExpectedImprovement,
    PosteriorMean,
    UpperConfidenceBound,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
    qProbabilityOfImprovement,
    qSimpleRegret,
    qUpperConfidenceBound,
)
from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance  # noqa: E402
from botorch.acquisition.analytic import LogProbabilityOfImprovement  # noqa: E402
from botorch.acquisition.cost_aware import InverseCostWeightedUtility  # noqa: E402
from botorch.acquisition.joint_entropy_search import qJointEntropySearch  # noqa: E402
from botorch.acquisition.knowledge_gradient import qKnowledgeGradient  # noqa: E402
from botorch.acquisition.max_value_entropy_search import (  # noqa: E402
    qLowerBoundMaxValueEntropy,
    qMaxValueEntropy,
    qMultiFidelityMaxValueEntropy,
)
from botorch.acquisition.multi_objective.parego import qLogNParEGO  # noqa: E402
from botorch.acquisition.objective import GenericMCObjective  # noqa: E402
from botorch.acquisition.predictive_entropy_search import qPredictiveEntropySearch  # noqa: E402
from botorch.acquisition.preference import qExpectedUtilityOfBestOption  # noqa: E402
from botorch.acquisition.risk_measures import CVaR, Expectation  # noqa: E402
from botorch.acquisition.utils import get_optimal_samples, project_to_target_fidelity  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models import ModelListGP, PairwiseGP, SingleTaskGP  # noqa: E402
from botorch.models.cost import AffineFidelityCostModel  # noqa: E402
from botorch.models.transforms.input import (  # noqa: E402
    AppendFeatures,
    ChainedInputTransform,
    FilterFeatures,
    InputPerturbation,
    Normalize,
    Warp,
)
from botorch.models.transforms.outcome import (  # noqa: E402
    Bilog,
    ChainedOutcomeTransform,
    Log,
    Power,
    Standardize,
    StratifiedStandardize,
)
from botorch.optim import optimize_acqf, optimize_acqf_discrete, optimize_acqf_mixed  # noqa: E402
from botorch.optim.initializers import gen_batch_initial_conditions  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402
from gpytorch.priors import LogNormalPrior  # noqa: E402


from ._converted_models import landmark_copy, nystrom, sketched_copy  # noqa: E402

D = 2
BOUNDS = torch.tensor([[0.0] * D, [1.0] * D], dtype=torch.float64)
ACQF_OPTIONS = {"num_restarts": 2, "raw_samples": 16, "options": {"maxiter": 5}}


def uniform(*shape, seed):
    return torch.rand(*shape, D, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def data(n, seed=0):
    x = uniform(n, seed=seed)
    noise = 0.05 * torch.randn(n, 1, generator=torch.Generator().manual_seed(seed + 100), dtype=torch.float64)
    return x, torch.sin(6 * x).sum(-1, keepdim=True) + noise


def exact_model(x, y, **options):
    """BoTorch's default SingleTaskGP (RBF kernel, Standardize unless told) at fixed hyperparameters, in eval mode."""
    model = SingleTaskGP(x, y, **options).double()
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 1e-2
    return model.eval()


def value_and_grad(acquisition, X):
    X = X.clone().requires_grad_(True)
    value = acquisition(X)
    return value.detach(), torch.autograd.grad(value.sum(), X)[0]


def assert_same_value_and_grad(actual, expected, rtol=1e-3, atol=1e-6):
    """Values and gradients equal up to the Nyström map's round-off: it reproduces k to 1e-8 (its jittered factor of
    K_ZZ, condition number up to 1e12 here), which the solve with K + σ²I (σ² = 1e-2, standardised) amplifies up to
    100-fold per training point; observed: values within 2e-5, gradients within 2e-4 relative.  Random features at
    these widths are off by 1e-2 to 1e-1."""
    torch.testing.assert_close(actual[0], expected[0], rtol=rtol, atol=atol)
    torch.testing.assert_close(actual[1], expected[1], rtol=rtol, atol=atol)


# ----------------------------------------------------------------------------------------------------------------------
# information-theoretic acquisitions


@pytest.mark.parametrize("acquisition", [qMaxValueEntropy, qLowerBoundMaxValueEntropy])
def test_max_value_entropy_is_the_exact_models_and_approaches_it_with_random_features(acquisition):
    x, y = data(12)
    model = exact_model(x, y)
    candidates, X = uniform(40, seed=5), uniform(6, 1, seed=7)

    def evaluate(m):
        torch.manual_seed(0)  # the Gumbel quantiles of the max-value samples
        return value_and_grad(acquisition(m, candidate_set=candidates, num_mv_samples=16), X)

    expected = evaluate(model)
    assert expected[0].max() > 0.1  # informative points
    assert_same_value_and_grad(evaluate(landmark_copy(model, x, candidates, X)), expected, atol=1e-5)
    errors = [(evaluate(sketched_copy(model, width))[0] - expected[0]).abs().max() for width in (64, 16384)]
    assert errors[1] < 0.02 and errors[1] < errors[0] / 4


def _fixed_noise_refit(model, optimal_inputs, optimal_outputs, noise):
    """The conditional model qJointEntropySearch means: the model refitted on its data plus each optimum (a batch of
    num_optima models) with the optima's noise, at the same hyperparameters (no outcome transform); observation noise
    at new points is the model's."""
    x, y = model.train_inputs[0], model.train_targets.unsqueeze(-1)
    count = optimal_inputs.shape[0]
    inputs = torch.cat([x.expand(count, *x.shape), optimal_inputs.unsqueeze(-2)], -2)
    targets = torch.cat([y.expand(count, *y.shape), optimal_outputs.unsqueeze(-2)], -2)
    noise = torch.cat([model.likelihood.noise.expand(count, *y.shape), torch.full_like(optimal_outputs, noise)
                       .unsqueeze(-2)], -2)
    refit = SingleTaskGP(inputs, targets, train_Yvar=noise, covar_module=copy.deepcopy(model.covar_module),
                         outcome_transform=None).double()
    refit.mean_module.initialize(constant=model.mean_module.constant.detach().expand(count))
    posterior = refit.eval().posterior

    def model_noise_at_new_points(X, observation_noise=False, **options):  # not the mean of train_Yvar
        if observation_noise is True:
            observation_noise = model.likelihood.noise.expand(*X.shape[:-1], 1)
        return posterior(X, observation_noise=observation_noise, **options)

    refit.posterior = model_noise_at_new_points
    return refit


def test_joint_entropy_search_is_the_exact_fixed_noise_conditioning_on_sampled_optima():
    """qJointEntropySearch conditions the model on each sampled optimum with noise 1e-4 (condition_on_observations with
    ``noise=``): with all points as landmarks its values and gradients are those of the exact kernel refitted with that
    noise.  (BoTorch's exact model itself is not that reference: GPyTorch's ``DefaultPredictionStrategy`` conditions its
    mean on the likelihood's noise instead of the given one — rfgp's strategy uses the given noise in both.)"""
    from botorch.models.utils.gpytorch_modules import MIN_INFERRED_NOISE_LEVEL

    x, y = data(12)
    model = exact_model(x, y, outcome_transform=None)
    torch.manual_seed(0)
    optimal_inputs, optimal_outputs = get_optimal_samples(model, BOUNDS, num_optima=4, raw_samples=64, num_restarts=2)
    optimal_inputs, optimal_outputs = optimal_inputs.detach(), optimal_outputs.detach()
    X = uniform(3, 2, seed=7)
    converted = landmark_copy(model, x, optimal_inputs, X)
    reference = qJointEntropySearch(model, optimal_inputs, optimal_outputs, estimation_type="LB")
    reference.conditional_model = _fixed_noise_refit(model, optimal_inputs, optimal_outputs, MIN_INFERRED_NOISE_LEVEL)
    expected = value_and_grad(reference, X)
    actual = value_and_grad(qJointEntropySearch(converted, optimal_inputs, optimal_outputs, estimation_type="LB"), X)
    assert expected[0].abs().max() > 0.05
    assert_same_value_and_grad(actual, expected, atol=1e-5)


def test_predictive_entropy_search_is_the_exact_models():
    """Up to the tolerance of BoTorch's expectation propagation, whose iterations stop at a relative change of 1e-4.

    Its gradient with respect to X is NaN at some points for the exact model as well (BoTorch 0.18.1:
    ``log_cdf_robust`` differentiates ``torch.where(x < 5, log(Φ(x)), …)`` through log(0)), so ``optimize_acqf`` may
    stop with an ``OptimizationGradientError`` whatever the kernel."""
    x, y = data(12)
    model = exact_model(x, y)
    optimal_inputs = uniform(3, seed=3)
    X = uniform(4, 1, seed=7)
    with torch.no_grad():
        expected = qPredictiveEntropySearch(model, optimal_inputs)(X)
        actual = qPredictiveEntropySearch(landmark_copy(model, x, optimal_inputs, X), optimal_inputs)(X)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("acquisition", ["JES", "MES"])
def test_entropy_search_optimises_on_pathwise_optima_of_the_random_feature_model(acquisition):
    """get_optimal_samples draws Matheron paths of the kernel's own features and maximises them; the acquisition
    functions built on those optima optimise with finite values and gradients (qPredictiveEntropySearch: see above)."""
    x, y = data(12)
    model = sketched_copy(exact_model(x, y), 256)
    torch.manual_seed(0)
    optimal_inputs, optimal_outputs = get_optimal_samples(model, BOUNDS, num_optima=4, raw_samples=64, num_restarts=2)
    assert optimal_inputs.shape == (4, D) and ((optimal_inputs >= 0) & (optimal_inputs <= 1)).all()
    with torch.no_grad():
        paths_max = model.posterior(optimal_inputs).mean.max()
    assert torch.isfinite(optimal_outputs).all() and optimal_outputs.max() > paths_max - 1.0
    build = {
        "JES": lambda: qJointEntropySearch(model, optimal_inputs.detach(), optimal_outputs.detach()),
        "MES": lambda: qMaxValueEntropy(model, candidate_set=uniform(64, seed=4)),
    }[acquisition]
    _, grad = value_and_grad(build(), uniform(3, 1, seed=8))
    assert torch.isfinite(grad).all()
    candidates, value = optimize_acqf(build(), BOUNDS, q=1, **ACQF_OPTIONS)
    assert candidates.shape == (1, D) and torch.isfinite(value)


def test_multi_fidelity_max_value_entropy_is_the_exact_models():
    """qMultiFidelityMaxValueEntropy on a GP over (x, fidelity) with an ordinary kernel (BoTorch's fidelity kernels have
    no random features, see test_botorch_multi_fidelity.py), cost-aware and projected to the target fidelity."""
    x, y = data(16)
    fidelity = torch.rand(16, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    inputs = torch.cat([x, fidelity], -1)
    model = exact_model(inputs, y - 0.5 * (1 - fidelity))
    candidates = torch.rand(40, D + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    X = torch.rand(5, 1, D + 1, dtype=torch.float64, generator=torch.Generator().manual_seed(7))

    def project(points):
        return project_to_target_fidelity(points, {D: 1.0}, D + 1)

    def evaluate(m):
        torch.manual_seed(0)
        cost = InverseCostWeightedUtility(AffineFidelityCostModel({D: 1.0}, fixed_cost=0.5))
        return value_and_grad(qMultiFidelityMaxValueEntropy(m, candidate_set=candidates, num_mv_samples=8,
                                                            cost_aware_utility=cost, project=project), X)

    expected = evaluate(model)
    assert expected[0].max() > 0.01
    converted = landmark_copy(model, inputs, candidates, project(candidates), X, project(X))
    assert_same_value_and_grad(evaluate(converted), expected, atol=1e-6)


# ----------------------------------------------------------------------------------------------------------------------
# active learning and the other acquisition families


def test_integrated_posterior_variance_has_the_finite_difference_gradient():
    """qNegIntegratedPosteriorVariance differentiates the fantasy model's posterior variance at its MC points with
    respect to X.  rfgp's fantasy strategy builds its caches at its first prediction, inside BoTorch's
    ``propagate_grads(True)``, so the gradient is the finite difference's, and with all points as landmarks the exact
    model's once GPyTorch keeps the graph of its fantasy covariance cache.  Under GPyTorch's default
    ``detach_test_caches`` BoTorch's exact model detaches that cache in ``get_fantasy_strategy`` (BoTorch 0.18.1,
    GPyTorch 1.15.2): its autograd gradient misses the variance's dependence on X (0.29 away from the finite
    difference, whose entries are at most 0.046, here)."""
    x, y = data(20)
    model = exact_model(x, y)
    mc_points, X = uniform(32, seed=5), uniform(4, 2, seed=7)
    acquisition = qNegIntegratedPosteriorVariance(sketched_copy(model, 256), mc_points=mc_points)
    value, grad = value_and_grad(acquisition, X)
    step, finite_difference = 1e-6, torch.zeros_like(X)
    with torch.no_grad():
        for index in range(X.numel()):
            shift = torch.zeros(X.numel(), dtype=X.dtype)
            shift[index] = step
            shift = shift.view_as(X)
            finite_difference.view(-1)[index] = (acquisition(X + shift) - acquisition(X - shift)).sum() / (2 * step)
    assert finite_difference.abs().max() > 1e-3
    torch.testing.assert_close(grad, finite_difference, rtol=1e-5, atol=1e-8)
    with gpytorch.settings.detach_test_caches(False):
        expected = value_and_grad(qNegIntegratedPosteriorVariance(model, mc_points=mc_points), X)
    converted = landmark_copy(model, x, X, mc_points)
    assert_same_value_and_grad(value_and_grad(qNegIntegratedPosteriorVariance(converted, mc_points=mc_points), X),
                               expected, atol=1e-7)


@pytest.mark.parametrize("name", ["qKnowledgeGradient", "qNegIntegratedPosteriorVariance"])
def test_fantasy_gradients_update_the_training_caches_featurised_once(name, monkeypatch):
    """Inside BoTorch's ``propagate_grads(True)`` (``detach_test_caches(False)``) the fantasy caches are the training
    caches updated by the new rows: the value and the gradient w.r.t. X equal the recomputation's from all N + q
    points per fantasy (1e-8) and the central difference, without featurising the training points (the gradient w.r.t.
    X, as gen_candidates_scipy takes it, does not need their caches' graph; before: (3, N + q) rows per t-batch, then
    N rows once per step); a gradient w.r.t. the hyperparameters too featurises them once, without the t-batch, and
    equals the recomputation's."""
    from rfgp.features.base import FeatureMap
    from rfgp.inference.prediction import RankUpdatedFantasyStrategy

    x, y = data(60)  # N > F: the feature-space caches
    model = sketched_copy(exact_model(x, y), 32)
    if name == "qKnowledgeGradient":
        acquisition, X = qKnowledgeGradient(model, num_fantasies=4), uniform(3, 1 + 4, seed=7)
    else:
        acquisition, X = qNegIntegratedPosteriorVariance(model, mc_points=uniform(16, seed=5)), uniform(3, 2, seed=7)
    parameters = [p for p in model.parameters() if p.requires_grad]

    def all_gradients():
        inputs = X.clone().requires_grad_(True)
        return torch.autograd.grad(acquisition(inputs).sum(), [inputs, *parameters], allow_unused=True)

    with monkeypatch.context() as patch:
        patch.setattr(RankUpdatedFantasyStrategy, "of", classmethod(lambda cls, *args: None))
        expected, expected_all = value_and_grad(acquisition, X), all_gradients()
    shapes, forward = [], FeatureMap.__call__
    with monkeypatch.context() as patch:
        patch.setattr(FeatureMap, "__call__", lambda self, z, *a, **kw: shapes.append(tuple(z.shape)) or
                      forward(self, z, *a, **kw))
        actual = value_and_grad(acquisition, X)
        assert [shape for shape in shapes if shape[-2] >= len(x)] == []
        actual_all = all_gradients()
        assert [shape for shape in shapes if shape[-2] >= len(x)] == [(len(x), D)]
    assert expected[1].abs().max() > 1e-3
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=1e-8)
    torch.testing.assert_close(actual[1], expected[1], rtol=0, atol=1e-8)
    assert any(g is not None and g.abs().max() > 1e-3 for g in expected_all[1:])
    for a, b, parameter in zip(actual_all, expected_all, [X, *parameters], strict=True):  # None: no path, 0
        zero = torch.zeros_like(parameter)
        torch.testing.assert_close(zero if a is None else a, zero if b is None else b, rtol=0, atol=1e-10)
    step, direction = 1e-6, uniform(*X.shape[:-1], seed=11) - 0.5
    with torch.no_grad():
        difference = (acquisition(X + step * direction) - acquisition(X - step * direction)).sum() / (2 * step)
    torch.testing.assert_close(difference, (actual[1] * direction).sum(), rtol=1e-5, atol=1e-8)


def _sampler():
    return SobolQMCNormalSampler(torch.Size([64]), seed=0)


SINGLE_MODEL_ACQUISITIONS = {
    "PosteriorMean": (lambda m, y: PosteriorMean(m), 1),
    "UpperConfidenceBound": (lambda m, y: UpperConfidenceBound(m, beta=0.5), 1),
    "LogExpectedImprovement": (lambda m, y: LogExpectedImprovement(m, best_f=y.max()), 1),
    "LogProbabilityOfImprovement": (lambda m, y: LogProbabilityOfImprovement(m, best_f=y.max()), 1),
    "qUpperConfidenceBound": (lambda m, y: qUpperConfidenceBound(m, beta=0.5, sampler=_sampler()), 2),
    "qSimpleRegret": (lambda m, y: qSimpleRegret(m, sampler=_sampler()), 2),
    "qProbabilityOfImprovement": (lambda m, y: qProbabilityOfImprovement(m, best_f=y.max(), sampler=_sampler()), 2),
    "qLogExpectedImprovement": (lambda m, y: qLogExpectedImprovement(m, best_f=y.max(), sampler=_sampler()), 2),
}


@pytest.mark.parametrize("name", list(SINGLE_MODEL_ACQUISITIONS))
def test_acquisition_is_the_exact_models_and_optimises_with_random_features(name):
    build, q = SINGLE_MODEL_ACQUISITIONS[name]
    x, y = data(20)
    model = exact_model(x, y)
    X = uniform(5, q, seed=7)
    expected = value_and_grad(build(model, y), X)
    assert_same_value_and_grad(value_and_grad(build(landmark_copy(model, x, X), y), X), expected)
    candidates, value = optimize_acqf(build(sketched_copy(model, 64), y), BOUNDS, q=q, **ACQF_OPTIONS)
    assert candidates.shape == (q, D) and torch.isfinite(value)


def _objective_and_constraint_models(convert=None):
    x, y = data(20)
    models = [exact_model(x, y), exact_model(x, x[:, :1] - 0.5)]  # feasible where x₀ ≤ 0.5
    return x, ModelListGP(*(models if convert is None else [convert(m) for m in models]))


MODEL_LIST_ACQUISITIONS = {
    "constrained qLogNEI": lambda models, x: qLogNoisyExpectedImprovement(
        models, X_baseline=x, sampler=_sampler(), objective=GenericMCObjective(lambda Z, X=None: Z[..., 0]),
        constraints=[lambda Z: Z[..., 1]]),
    "qLogNParEGO": lambda models, x: qLogNParEGO(
        models, X_baseline=x, sampler=_sampler(), scalarization_weights=torch.tensor([0.3, 0.7], dtype=torch.float64)),
}


@pytest.mark.parametrize("name", list(MODEL_LIST_ACQUISITIONS))
def test_model_list_acquisition_is_the_exact_models_and_optimises_with_random_features(name):
    """A ModelListGP of an objective and a constraint (or of two objectives), pruned baseline included."""
    build = MODEL_LIST_ACQUISITIONS[name]
    X = uniform(4, 2, seed=7)
    x, exact = _objective_and_constraint_models()
    expected = value_and_grad(build(exact, x), X)
    assert expected[0].max() - expected[0].min() > 1  # the candidates differ
    _, converted = _objective_and_constraint_models(lambda m: landmark_copy(m, x, X))
    assert_same_value_and_grad(value_and_grad(build(converted, x), X), expected, atol=1e-5)
    _, sketched = _objective_and_constraint_models(lambda m: sketched_copy(m, 64))
    candidates, value = optimize_acqf(build(sketched, x), BOUNDS, q=2, **ACQF_OPTIONS)
    assert candidates.shape == (2, D) and torch.isfinite(value)


def test_expected_utility_of_best_option_of_a_preference_model_is_the_exact_models():
    """qExpectedUtilityOfBestOption on PairwiseGP (its Laplace approximation reads the dense covariance of the
    datapoints, which the Nyström map reproduces; PairwiseGP requires a ScaleKernel on top, which the conversion of
    the whole tree keeps: ScaleKernel(NystromKernel(k)))."""
    x, _ = data(16)
    utility = torch.sin(6 * x).sum(-1)
    pairs = torch.randint(0, 16, (30, 2), generator=torch.Generator().manual_seed(0))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    comparisons = torch.where((utility[pairs[:, 0]] > utility[pairs[:, 1]]).unsqueeze(-1), pairs, pairs.flip(-1))
    exact = PairwiseGP(x, comparisons).double().eval()
    X = uniform(4, 2, seed=7)
    converted = PairwiseGP(x, comparisons, covar_module=nystrom(exact.covar_module, x, X)).double().eval()

    def evaluate(m):
        return value_and_grad(qExpectedUtilityOfBestOption(m, sampler=_sampler()), X)

    assert_same_value_and_grad(evaluate(converted), evaluate(exact))


# ----------------------------------------------------------------------------------------------------------------------
# input and outcome transforms


def _warp(indices=(0, 1)):
    warp = Warp(d=D, indices=list(indices), concentration1_prior=LogNormalPrior(0.0, 0.75**0.5),
                concentration0_prior=LogNormalPrior(0.0, 0.75**0.5))
    warp._set_concentration(1, torch.tensor([2.0, 0.7][: len(indices)]))  # not the identity warp (1, 1)
    warp._set_concentration(0, torch.tensor([0.5, 1.5][: len(indices)]))
    return warp


PERTURBATIONS = 0.05 * torch.tensor([[0.0, 0.0], [1.0, -0.5], [-0.6, 0.4]], dtype=torch.float64)

INPUT_TRANSFORMS = {  # name: (training inputs from x, test inputs from xs, transform)
    "Warp": (lambda x: x, lambda xs: xs, _warp),
    "InputPerturbation": (lambda x: x, lambda xs: xs, lambda: InputPerturbation(PERTURBATIONS)),
    "AppendFeatures": (lambda x: torch.cat([x, x[:, :1]], -1), lambda xs: xs,
                       lambda: AppendFeatures(feature_set=torch.tensor([[0.2], [0.7]], dtype=torch.float64))),
    "ChainedInputTransform": (lambda x: 3 * x, lambda xs: 3 * xs,
                              lambda: ChainedInputTransform(normalize=Normalize(D), warp=_warp([0]))),
    "FilterFeatures": (lambda x: torch.cat([x, x[:, :1] ** 2], -1), lambda xs: torch.cat([xs, xs[:, :1] ** 2], -1),
                       lambda: FilterFeatures(feature_indices=torch.tensor([0, 1]))),
}


@pytest.mark.parametrize("name", list(INPUT_TRANSFORMS))
def test_input_transformed_posterior_is_the_exact_models(name):
    """The kernel sees the transformed inputs (n → n·P for InputPerturbation, n → n·k for AppendFeatures): with those
    as landmarks the posterior — mean and covariance, observation noise included — is the exact model's."""
    train, test, transform = INPUT_TRANSFORMS[name]
    x, y = data(15)
    xs = uniform(4, seed=11)
    model = exact_model(train(x), y, input_transform=transform())
    converted = landmark_copy(model, model.train_inputs[0], model.transform_inputs(test(xs)))
    for observation_noise in (False, True):
        with torch.no_grad():
            expected = model.posterior(test(xs), observation_noise=observation_noise)
            actual = converted.posterior(test(xs), observation_noise=observation_noise)
        assert actual.mean.shape == expected.mean.shape
        torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(actual.distribution.covariance_matrix, expected.distribution.covariance_matrix,
                                   rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("objective", ["Expectation", "CVaR"])
def test_robust_acquisition_over_input_perturbations_is_the_exact_models(objective):
    """Robust BO: InputPerturbation expands each candidate to P perturbed points, a risk measure reduces them."""
    x, y = data(15)
    model = exact_model(x, y, input_transform=InputPerturbation(PERTURBATIONS))
    X = uniform(3, 2, seed=7)
    risk = Expectation(n_w=3) if objective == "Expectation" else CVaR(alpha=0.5, n_w=3)

    def build(m):
        return qLogNoisyExpectedImprovement(m, X_baseline=x, sampler=_sampler(), objective=risk)

    expected = value_and_grad(build(model), X)
    # InputPerturbation acts at evaluation only: the kernel sees the data x, the perturbed baseline and candidates;
    # the 45 perturbed baseline points' posterior covariance, whose Cholesky factor qLogNEI caches, has eigenvalues
    # down to 1e-10, which amplifies the map's round-off (3e-5 in one gradient entry)
    converted = landmark_copy(model, model.train_inputs[0], model.transform_inputs(x), model.transform_inputs(X))
    assert_same_value_and_grad(value_and_grad(build(converted), X), expected, atol=1e-4)


def test_learned_warping_trains_jointly_with_random_features():
    """Warp's concentrations train with the kernel: the marginal likelihood and its gradient with respect to them are
    those of GPyTorch's generic computation with the same k̂, and a fit moves them as the exact model's fit does."""
    x = uniform(40, seed=0)
    y = torch.sin(6 * x[:, :1] ** 3) + 0.05 * torch.randn(40, 1, generator=torch.Generator().manual_seed(1),
                                                          dtype=torch.float64)
    model = sketched_copy(exact_model(x, y, input_transform=_warp()), 128).train()
    reference = copy.deepcopy(model)

    def loss_and_grad(m):
        mll = ExactMarginalLogLikelihood(m.likelihood, m)
        loss = -mll(m(*m.train_inputs), m.train_targets)
        warp = m.input_transform
        return loss.detach(), torch.autograd.grad(loss, [warp.concentration0, warp.concentration1])

    expected = loss_and_grad(reference)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        generic = loss_and_grad(reference)
    actual = loss_and_grad(model)
    assert expected[1][0].abs().max() > 0.1
    torch.testing.assert_close(actual, generic, rtol=1e-9, atol=1e-10)
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model),
                     optimizer_kwargs={"options": {"maxiter": 50}})
    assert loss_and_grad(model.train())[0] < actual[0] - 0.1
    assert model.input_transform.concentration1[0] > 1.5  # the steep first input (sin(6x³)) stays warped


OUTCOME_TRANSFORMS = {  # name: (targets from y, transform)
    "Log": (torch.exp, lambda: Log()),
    "Power": (lambda y: y + 3.0, lambda: Power(0.5)),
    "Bilog": (lambda y: 3 * y, lambda: Bilog()),
    "Log+Standardize": (torch.exp, lambda: ChainedOutcomeTransform(log=Log(), standardize=Standardize(1))),
    "StratifiedStandardize": (lambda y: y, lambda: StratifiedStandardize(
        stratification_idx=D, all_task_values=torch.tensor([0, 1]))),
}


@pytest.mark.parametrize("name", list(OUTCOME_TRANSFORMS))
def test_outcome_transformed_posterior_is_the_exact_models(name):
    """Log, Power, Bilog and chains give a TransformedPosterior (samples of the transformed Gaussian), Standardize and
    StratifiedStandardize a rescaled Gaussian: the same samples from the same base samples, the same moments where
    BoTorch has them, and the same qLogEI."""
    targets, transform = OUTCOME_TRANSFORMS[name]
    x, y = data(16)
    xs = uniform(5, seed=11)
    if name == "StratifiedStandardize":
        strata = (torch.arange(16) % 2).to(x).unsqueeze(-1)
        x, y, xs = torch.cat([x, strata], -1), y + 3 * strata, torch.cat([xs, strata[:5]], -1)
    model = exact_model(x, targets(y), outcome_transform=transform())
    converted = landmark_copy(model, x, xs)
    with torch.no_grad():
        expected, actual = model.posterior(xs), converted.posterior(xs)
        samples = [_sampler()(p) for p in (expected, actual)]
    assert type(actual) is type(expected)
    torch.testing.assert_close(samples[1], samples[0], rtol=1e-5, atol=1e-6)
    if name in ("Log", "Log+Standardize", "StratifiedStandardize"):
        torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-5, atol=1e-6)
    X = xs.unsqueeze(-2)

    def build(m):
        return qLogExpectedImprovement(m, best_f=targets(y).max(), sampler=_sampler())

    assert_same_value_and_grad(value_and_grad(build(converted), X), value_and_grad(build(model), X), atol=1e-5)


# ----------------------------------------------------------------------------------------------------------------------
# optimisers


def test_discrete_optimisation_picks_the_exact_models_choices():
    x, y = data(20)
    model = exact_model(x, y)
    choices = uniform(30, seed=4)
    converted = landmark_copy(model, x, choices)
    for build, q in ((lambda m: UpperConfidenceBound(m, beta=0.5), 1),
                     (lambda m: qLogNoisyExpectedImprovement(m, X_baseline=x, sampler=_sampler()), 2)):
        expected = optimize_acqf_discrete(build(model), q=q, choices=choices)
        actual = optimize_acqf_discrete(build(converted), q=q, choices=choices)
        torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0)  # the same choices, in the same order
        torch.testing.assert_close(actual[1], expected[1], rtol=1e-4, atol=1e-6)


def test_mixed_and_constrained_optimisation_with_random_features():
    x, y = data(20)
    model = sketched_copy(exact_model(x, y), 64)
    acquisition = qLogNoisyExpectedImprovement(model, X_baseline=x, sampler=_sampler())
    fixed = [{1: 0.0}, {1: 0.5}]
    candidates, value = optimize_acqf_mixed(acquisition, BOUNDS, q=2, fixed_features_list=fixed, **ACQF_OPTIONS)
    assert candidates.shape == (2, D) and torch.isfinite(value)
    assert all(float(c[1]) in (0.0, 0.5) for c in candidates)
    below_diagonal = [(torch.tensor([0, 1]), torch.tensor([-1.0, -1.0], dtype=torch.float64), -0.8)]  # x₀ + x₁ ≤ 0.8
    candidates, value = optimize_acqf(acquisition, BOUNDS, q=2, inequality_constraints=below_diagonal,
                                      **ACQF_OPTIONS)
    assert torch.isfinite(value) and (candidates.sum(-1) <= 0.8 + 1e-6).all()


@pytest.mark.parametrize("name", ["UpperConfidenceBound", "qLogExpectedImprovement", "qNegIntegratedPosteriorVariance",
                                  "qMaxValueEntropy"])
def test_initial_conditions_over_many_raw_samples_factorise_nothing_larger_than_the_features(name, factorised):
    """gen_batch_initial_conditions evaluates the acquisition at raw_samples t-batches of q points: with
    N = 300 > F = 32 nothing larger than F × F (the posterior caches, once) or q × q (the joint of a t-batch) is
    factorised — also for qNegIntegratedPosteriorVariance, which fantasises N + q training points per t-batch."""
    x, y = data(300)
    model = sketched_copy(exact_model(x, y), 32)
    build, q = {
        "UpperConfidenceBound": (lambda: UpperConfidenceBound(model, beta=0.5), 1),
        "qLogExpectedImprovement": (lambda: qLogExpectedImprovement(model, best_f=y.max()), 2),
        "qNegIntegratedPosteriorVariance": (lambda: qNegIntegratedPosteriorVariance(model, uniform(64, seed=3)), 2),
        "qMaxValueEntropy": (lambda: qMaxValueEntropy(model, candidate_set=uniform(500, seed=3)), 1),
    }[name]
    initial = gen_batch_initial_conditions(build(), BOUNDS, q=q, num_restarts=4, raw_samples=512)
    assert initial.shape == (4, q, D)
    assert factorised and max(factorised) <= 32


# ----------------------------------------------------------------------------------------------------------------------
# pruning X_baseline


def test_baseline_pruning_samples_through_the_root_without_factorising(factorised):
    """qLogNEI prunes X_baseline (all N = 300 training points, F = 32) from 2048 joint posterior samples; BoTorch's
    Sobol sampler took them through the dense 300 × 300 Cholesky factor (with jitter, rank 32), now R·ε.  Only the
    F × F caches and the pruned baseline's cached root are factorised."""
    x, y = data(300)
    model = sketched_copy(exact_model(x, y), 32)
    with torch.no_grad():
        mean = model.posterior(x).mean.squeeze(-1)
    factorised.clear()
    torch.manual_seed(0)
    acquisition = qLogNoisyExpectedImprovement(model, X_baseline=x)
    kept = acquisition.X_baseline
    assert factorised and max(factorised) <= 32 and max(factorised) >= kept.shape[0]
    assert 1 <= kept.shape[0] <= 20 and (kept == x[mean.argmax()]).all(-1).any()  # the best mean survives


def test_pruning_samples_have_the_distribution_of_botorchs_samples():
    """The probability of each baseline point being the best, estimated from the root's i.i.d. draws and from
    BoTorch's Sobol draws through the dense Cholesky factor, agree within 4 standard errors."""
    from rfgp.integrations.botorch_pruning import _botorch_get_sampler, _get_sampler, samples_through_its_root

    x, y = data(100)
    model = sketched_copy(exact_model(x, y), 32)
    with torch.no_grad():
        posterior = model.posterior(x)
        shape = torch.Size([8192])
        torch.manual_seed(1)
        ours = _get_sampler(posterior=posterior, sample_shape=shape)(posterior).squeeze(-1)
        botorchs = _botorch_get_sampler(posterior=posterior, sample_shape=shape)(posterior).squeeze(-1)
    assert samples_through_its_root(posterior) and isinstance(_get_sampler(posterior, shape),
                                                              botorch.sampling.StochasticSampler)
    counts = [torch.bincount(s.argmax(-1), minlength=100).to(torch.float64) / 8192 for s in (ours, botorchs)]
    assert counts[1].max() > 0.1
    se = ((counts[0] * (1 - counts[0]) + counts[1] * (1 - counts[1])) / 8192).sqrt().clamp_min(1e-3)
    assert ((counts[0] - counts[1]).abs() <= 4 * se).all()


def test_pruning_keeps_botorchs_sampler_elsewhere():
    """Exact models, rfgp posteriors whose root is as wide as the points (n ≤ F), and explicit options keep BoTorch's
    sampler; a ModelListGP of rfgp models (multi-objective pruning) samples through its stacked roots."""
    from botorch.acquisition.multi_objective.utils import prune_inferior_points_multi_objective

    from rfgp.integrations.botorch_pruning import _get_sampler, samples_through_its_root

    x, y = data(60)
    exact = exact_model(x, y)
    with torch.no_grad():
        assert not samples_through_its_root(exact.posterior(x))
        assert not samples_through_its_root(sketched_copy(exact, 64).posterior(x))  # 60 points, root 64 wide
        posterior = sketched_copy(exact, 16).posterior(x)
    assert samples_through_its_root(posterior)
    assert isinstance(_get_sampler(posterior, torch.Size([4]), seed=3), SobolQMCNormalSampler)
    models = ModelListGP(sketched_copy(exact, 16), sketched_copy(exact_model(x, -y), 16, seed=1))
    with torch.no_grad():
        assert samples_through_its_root(models.posterior(x))
    kept = prune_inferior_points_multi_objective(models, x, ref_point=torch.tensor([-3.0, -3.0], dtype=torch.float64))
    assert 1 <= kept.shape[0] < 60
