"""BoTorch round 6: the hypervolume knowledge gradient (also multi-fidelity), preference learning's EUBO and Bayesian
active learning by disagreement with rfgp kernels.

As in ``test_botorch_acquisitions.py``, a Nyström map with every point the kernel sees as a landmark is the exact model,
so its values and gradients are the exact model's; ORF features approach them as F grows and run at F < N and F ≥ N;
the cost checks count the largest tensor: N × F where the exact model builds N × N.
"""


import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.acquisition.bayesian_active_learning import qBayesianActiveLearningByDisagreement  # noqa: E402
from botorch.acquisition.cost_aware import InverseCostWeightedUtility  # noqa: E402
from botorch.acquisition.multi_objective.hypervolume_knowledge_gradient import (  # noqa: E402
    _get_hv_value_function,
    qHypervolumeKnowledgeGradient,
    qMultiFidelityHypervolumeKnowledgeGradient,
)
from botorch.acquisition.preference import (  # noqa: E402
    AnalyticExpectedUtilityOfBestOption,
    qExpectedUtilityOfBestOption,
)
from botorch.acquisition.utils import project_to_target_fidelity  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models import ModelListGP, PairwiseGP, SingleTaskGP, SingleTaskMultiFidelityGP  # noqa: E402
from botorch.models.cost import AffineFidelityCostModel  # noqa: E402
from botorch.models.deterministic import FixedSingleSampleModel  # noqa: E402
from botorch.models.map_saas import EnsembleMapSaasSingleTaskGP  # noqa: E402
from botorch.models.pairwise_gp import PairwiseLaplaceMarginalLogLikelihood  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from botorch.sampling.list_sampler import ListSampler  # noqa: E402

import rfgp  # noqa: E402

from .._cost import LargestTensor  # noqa: E402
from ._converted_models import landmark_copy, nystrom, sketched_copy  # noqa: E402
from .test_botorch_acquisitions import (  # noqa: E402
    BOUNDS,
    D,
    assert_same_value_and_grad,
    data,
    uniform,
    value_and_grad,
)

F64 = torch.float64
#: one-shot optimisation kept small: the inner (Pareto set) problem of the HVKG initial conditions too
HVKG_OPTIONS = {"num_restarts": 2, "raw_samples": 16,
                "options": {"maxiter": 5, "num_inner_restarts": 2, "raw_inner_samples": 16}}


# ----------------------------------------------------------------------------------------------------------------------
# qHypervolumeKnowledgeGradient


REF_POINT = torch.tensor([-2.0, -2.0], dtype=F64)
NUM_FANTASIES, NUM_PARETO = 2, 3


def _objectives(x):
    return torch.cat([torch.sin(6 * x).sum(-1, keepdim=True), torch.cos(5 * x).prod(-1, keepdim=True)], -1)


def _at_fixed_hyperparameters(model):
    model.covar_module.lengthscale = 0.3
    model.likelihood.noise = 1e-2
    return model.eval()


def two_objective_model(n, convert=lambda m: m):
    """The HVKG tutorial's ModelListGP of SingleTaskGPs (HVKG requires a ModelList), converted by ``convert``."""
    x = uniform(n, seed=0)
    y = _objectives(x)
    return x, ModelListGP(*(convert(_at_fixed_hyperparameters(SingleTaskGP(x, y[:, i:i + 1]).double()))
                            for i in range(2))).eval()


def _hvkg(model, use_posterior_mean=True, current_value=None, **options):
    sampler = ListSampler(*(SobolQMCNormalSampler(torch.Size([NUM_FANTASIES]), seed=i) for i in range(2)))
    return qHypervolumeKnowledgeGradient(
        model, ref_point=REF_POINT, num_fantasies=NUM_FANTASIES, num_pareto=NUM_PARETO, sampler=sampler,
        inner_sampler=SobolQMCNormalSampler(torch.Size([16]), seed=5), use_posterior_mean=use_posterior_mean,
        current_value=current_value, **options)


PENDING = uniform(1, seed=11)
HVKG_VARIANTS = {  # name: options
    "posterior mean": {},
    "Monte-Carlo hypervolume": {"use_posterior_mean": False},
    "log": {"log": True},
    "decoupled": {"X_evaluation_mask": torch.tensor([[True, False]])},  # the candidate evaluated on objective 0
    "pending": {"X_pending": PENDING},
}


@pytest.mark.parametrize("variant", HVKG_VARIANTS)
def test_hypervolume_knowledge_gradient_is_the_exact_models_with_every_point_a_landmark(variant):
    """One-shot X: the candidate and the fantasy models' Pareto sets (q + num_fantasies · num_pareto rows).  The exact
    model keeps the graph of its fantasy covariance cache only outside GPyTorch's default ``detach_test_caches``
    (see ``test_integrated_posterior_variance_has_the_finite_difference_gradient``): with it, the gradient of the
    Monte-Carlo value function with respect to the candidate is up to 0.1 off.  The decoupled fantasies go through
    GPyTorch's ``get_fantasy_model``, which needs a prediction first, for any kernel."""
    x, exact = two_objective_model(12)
    X = uniform(3, 1 + NUM_FANTASIES * NUM_PARETO, seed=7)
    _, converted = two_objective_model(12, lambda m: landmark_copy(m, x, X, PENDING))
    for model in (exact, converted):
        model.posterior(x)
    with gpytorch.settings.detach_test_caches(False):
        expected = value_and_grad(_hvkg(exact, **HVKG_VARIANTS[variant]), X)
    assert expected[0].max() - expected[0].min() > 0.1 and expected[1].abs().max() > 0.1  # informative points
    assert_same_value_and_grad(value_and_grad(_hvkg(converted, **HVKG_VARIANTS[variant]), X), expected, rtol=1e-5,
                               atol=1e-5)


@pytest.mark.parametrize("num_features", [8, 64])  # N = 12 > F and N ≤ F
def test_hypervolume_knowledge_gradient_runs_the_tutorials_optimisation_with_random_features(num_features):
    """The tutorial's loop: the current value maximises the posterior mean's hypervolume over num_pareto points
    (``_get_hv_value_function``), then ``optimize_acqf`` starts from ``gen_one_shot_hvkg_initial_conditions``."""
    _, model = two_objective_model(12, lambda m: sketched_copy(m, num_features))
    value_function = _get_hv_value_function(model=model, ref_point=REF_POINT, use_posterior_mean=True)
    _, current_value = optimize_acqf(value_function, BOUNDS, q=NUM_PARETO, num_restarts=2, raw_samples=16,
                                     options={"maxiter": 5})
    candidate, value = optimize_acqf(_hvkg(model, current_value=current_value), BOUNDS, q=1, **HVKG_OPTIONS)
    assert candidate.shape == (1, D) and ((candidate >= 0) & (candidate <= 1)).all()
    assert torch.isfinite(current_value) and current_value > 0 and torch.isfinite(value)


@pytest.mark.parametrize("use_posterior_mean", [True, False])
def test_hypervolume_knowledge_gradient_of_random_features_has_the_central_difference_gradient(use_posterior_mean):
    _, model = two_objective_model(12, lambda m: sketched_copy(m, 64))
    acquisition = _hvkg(model, use_posterior_mean)
    X = uniform(1, 1 + NUM_FANTASIES * NUM_PARETO, seed=7)
    _, grad = value_and_grad(acquisition, X)
    step, central = 1e-6, torch.zeros_like(X)
    with torch.no_grad():
        for index in range(X.numel()):
            shift = torch.zeros(X.numel(), dtype=F64)
            shift[index] = step
            shift = shift.view_as(X)
            central.view(-1)[index] = (acquisition(X + shift) - acquisition(X - shift)).sum() / (2 * step)
    assert central[:, 0].abs().max() > 1e-2  # the candidate row moves the value
    torch.testing.assert_close(grad, central, rtol=1e-5, atol=1e-7)


def test_hypervolume_knowledge_gradient_approaches_the_exact_one_as_f_grows():
    """Measured (mean over 3 seeds of the largest error on 3 one-shot points, values 4.9–6.5): 1.55 at F = 64,
    0.12 at F = 4096."""
    x, exact = two_objective_model(12)
    X = uniform(3, 1 + NUM_FANTASIES * NUM_PARETO, seed=7)
    with torch.no_grad():
        expected = _hvkg(exact)(X)
        errors = {width: torch.stack([(_hvkg(two_objective_model(12, lambda m: sketched_copy(m, width, seed))[1])
                                       (X) - expected).abs().max() for seed in range(3)]).mean()
                  for width in (64, 4096)}
    assert errors[4096] < 0.2 * errors[64] and errors[4096] < 0.25, errors


def test_hypervolume_knowledge_gradient_and_its_gradient_build_nothing_n_by_n():
    n, width = 400, 16
    X = uniform(1, 1 + 2 * 2, seed=7).requires_grad_(True)
    for convert, bound in ((lambda m: sketched_copy(m, width), 2 * n * width), (lambda m: m, n * n)):
        _, model = two_objective_model(n, convert)
        acquisition = qHypervolumeKnowledgeGradient(model, ref_point=REF_POINT, num_fantasies=2, num_pareto=2)
        with LargestTensor() as largest:
            acquisition(X).sum().backward()
        assert largest.numel <= bound if bound < n * n else largest.numel >= bound, largest.numel


def test_upstream_hypervolume_knowledge_gradient_mixes_the_pareto_sets_of_its_t_batches():
    """BoTorch 0.18.1's ``_split_hvkg_fantasy_points`` reshapes the b × (num_fantasies · num_pareto) × d fantasy rows
    into num_fantasies × b × num_pareto × d without moving the t-batch axis first, so for b > 1 a t-batch's fantasy
    models are evaluated at Pareto rows of other t-batches (qKnowledgeGradient's split permutes): the value of a
    t-batch depends on the others, whatever the kernel — here the exact model's.  ``optimize_acqf(...,
    options={"batch_limit": 1})`` evaluates one t-batch at a time."""
    _, exact = two_objective_model(12)
    X = uniform(3, 1 + NUM_FANTASIES * NUM_PARETO, seed=7)
    with torch.no_grad():
        together = _hvkg(exact)(X)
        alone = torch.cat([_hvkg(exact)(X[i:i + 1]) for i in range(3)])
    assert (together - alone).abs().max() > 1, (together, alone)



# ----------------------------------------------------------------------------------------------------------------------
# qMultiFidelityHypervolumeKnowledgeGradient on SingleTaskMultiFidelityGPs (linear_truncated=False) converted by sketch


def multi_fidelity_model(n, num_features=None, seed=0):
    """Two objectives of (x₀, x₁) whose amplitude grows with the data fidelity x₂; ``num_features``: each model's
    kernel (RBF × DownsamplingKernel) converted by ``rfgp.sketch``."""
    x = torch.rand(n, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
    ys = [torch.sin(5 * x[:, :2]).sum(-1, keepdim=True) * (0.5 + x[:, 2:]), torch.cos(3 * x[:, :1]) * (0.5 + x[:, 2:])]
    models = []
    for y in ys:
        model = SingleTaskMultiFidelityGP(x, y, data_fidelities=[2], linear_truncated=False)
        if num_features is not None:
            model.covar_module = rfgp.sketch(model.covar_module, num_features, seed=seed)
        models.append(model.eval())
    return ModelListGP(*models).eval()


def _multi_fidelity_hvkg(model, num_pareto=NUM_PARETO):
    """The MF-HVKG tutorial's acquisition: cost-aware, the Pareto sets projected to the target fidelity."""
    cost = InverseCostWeightedUtility(AffineFidelityCostModel(fidelity_weights={2: 1.0}, fixed_cost=0.1))
    sampler = ListSampler(*(SobolQMCNormalSampler(torch.Size([NUM_FANTASIES]), seed=i) for i in range(2)))
    return qMultiFidelityHypervolumeKnowledgeGradient(
        model, ref_point=REF_POINT, target_fidelities={2: 1.0}, num_fantasies=NUM_FANTASIES, num_pareto=num_pareto,
        sampler=sampler, current_value=torch.tensor(0.0, dtype=F64), cost_aware_utility=cost,
        project=lambda X: project_to_target_fidelity(X=X, target_fidelities={2: 1.0}, d=3))


def test_multi_fidelity_hvkg_is_the_exact_models_with_every_point_a_landmark():
    """The whole fidelity tree as one Nyström map (the route that also takes LinearTruncatedFidelityKernel), its
    landmarks the training points, the one-shot points and their projections to the target fidelity."""
    X = torch.rand(3, 1 + NUM_FANTASIES * NUM_PARETO, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    exact, converted = multi_fidelity_model(20), multi_fidelity_model(20)
    x = exact.models[0].train_inputs[0]
    projected = project_to_target_fidelity(X=X, target_fidelities={2: 1.0}, d=3)
    for model in converted.models:
        model.covar_module = nystrom(model.covar_module, x, X, projected)
    for model in (exact, converted):
        model.posterior(x)
    with gpytorch.settings.detach_test_caches(False):
        expected = value_and_grad(_multi_fidelity_hvkg(exact), X)
    assert expected[1].abs().max() > 1
    assert_same_value_and_grad(value_and_grad(_multi_fidelity_hvkg(converted), X), expected, rtol=1e-5, atol=1e-5)


def test_multi_fidelity_hvkg_of_converted_models_approaches_the_exact_one_as_f_grows():
    """Measured (mean over 4 seeds of the largest error on 3 one-shot points, values 11–18: divided by the cost
    0.1 + fidelity): 0.49 at F = 64, 0.10 at F = 16 384 (the posterior mean's largest error: 0.65, 0.037)."""
    X = torch.rand(3, 1 + NUM_FANTASIES * NUM_PARETO, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    with torch.no_grad():
        expected = _multi_fidelity_hvkg(multi_fidelity_model(20))(X)
        errors = {width: torch.stack([(_multi_fidelity_hvkg(multi_fidelity_model(20, width, seed))(X) - expected)
                                      .abs().max() for seed in range(4)]).mean() for width in (64, 16384)}
    assert errors[16384] < 0.4 * errors[64] and errors[16384] < 0.2, errors


def test_multi_fidelity_hvkg_optimises_converted_models_without_an_n_by_n_tensor():
    n, width = 400, 16
    X = torch.rand(1, 1 + NUM_FANTASIES * 2, 3, generator=torch.Generator().manual_seed(2), dtype=F64)
    for num_features, bound in ((width, 2 * n * width), (None, n * n)):
        acquisition = _multi_fidelity_hvkg(multi_fidelity_model(n, num_features), num_pareto=2)
        with LargestTensor() as largest:
            acquisition(X.clone().requires_grad_(True)).sum().backward()
        assert largest.numel <= bound if num_features else largest.numel >= bound, largest.numel
    bounds = torch.tensor([[0.0] * 3, [1.0] * 3], dtype=F64)
    sketched = _multi_fidelity_hvkg(multi_fidelity_model(n, width), num_pareto=2)
    candidate, value = optimize_acqf(sketched, bounds, q=1, **HVKG_OPTIONS)
    assert candidate.shape == (1, 3) and ((candidate >= 0) & (candidate <= 1)).all() and torch.isfinite(value)



# ----------------------------------------------------------------------------------------------------------------------
# preference learning: PairwiseGP with AnalyticExpectedUtilityOfBestOption (qExpectedUtilityOfBestOption on PairwiseGP
# alone: test_botorch_acquisitions.py); PairwiseGP's Laplace approximation is dense in its datapoints for any kernel


def preference_model(points, comparisons, convert=None):
    """PairwiseGP with BoTorch's default kernel, converted by ``convert`` (the whole ScaleKernel tree)."""
    exact = PairwiseGP(points, comparisons).double()
    if convert is None:
        return exact.eval()
    return PairwiseGP(points, comparisons, covar_module=convert(exact.covar_module)).double().eval()


def _comparisons(utility, seed=0):
    pairs = torch.randint(0, utility.shape[0], (30, 2), generator=torch.Generator().manual_seed(seed))
    pairs = pairs[pairs[:, 0] != pairs[:, 1]]
    return torch.where((utility[pairs[:, 0]] > utility[pairs[:, 1]]).unsqueeze(-1), pairs, pairs.flip(-1))


def _preferences(n=16):
    x = uniform(n, seed=0)
    return x, _comparisons(torch.sin(6 * x).sum(-1))


@pytest.mark.parametrize("previous_winner", [False, True])
def test_analytic_eubo_of_a_preference_model_is_the_exact_models_with_every_point_a_landmark(previous_winner):
    """EUBO compares q = 2 options, or q = 1 with the previous winner."""
    x, comparisons = _preferences()
    X = uniform(4, 1 if previous_winner else 2, seed=7)
    winner = uniform(1, seed=9) if previous_winner else None

    def evaluate(model):
        return value_and_grad(AnalyticExpectedUtilityOfBestOption(model, previous_winner=winner), X)

    expected = evaluate(preference_model(x, comparisons))
    points = [x, X] + ([winner] if previous_winner else [])
    actual = evaluate(preference_model(x, comparisons, lambda kernel: nystrom(kernel, *points)))
    assert_same_value_and_grad(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("acquisition", [AnalyticExpectedUtilityOfBestOption, qExpectedUtilityOfBestOption])
def test_eubo_on_an_outcome_model_is_the_exact_models_with_every_point_a_landmark(acquisition):
    """Preference exploration (BOPE): the preference model's utility is over the outcomes Y = f(X) of an outcome
    model, here one fixed posterior draw μ(X) + σ(X)·w of a two-output SingleTaskGP (``FixedSingleSampleModel``):
    both models converted, each with the points it sees as landmarks."""
    x = uniform(12, seed=3)
    outcome = _at_fixed_hyperparameters(SingleTaskGP(x, _objectives(x)).double())
    X = uniform(4, 2, seed=7)
    w = torch.tensor([0.7, -0.4], dtype=F64)
    with torch.no_grad():
        outcomes = FixedSingleSampleModel(outcome, w=w)(X)
        y = outcome.posterior(uniform(16, seed=0)).mean  # the outcomes the decision maker compared
    comparisons = _comparisons(y.sum(-1) - (y ** 2).sum(-1))
    analytic = acquisition is AnalyticExpectedUtilityOfBestOption
    options = {} if analytic else {"sampler": SobolQMCNormalSampler(torch.Size([64]), seed=0)}

    def evaluate(outcome_model, preference):
        return value_and_grad(acquisition(preference, outcome_model=FixedSingleSampleModel(outcome_model, w=w),
                                          **options), X)

    expected = evaluate(outcome, preference_model(y, comparisons))
    assert expected[1].abs().max() > 0.1  # the options' outcomes move the value
    actual = evaluate(landmark_copy(outcome, x, X),
                      preference_model(y, comparisons, lambda kernel: nystrom(kernel, y, outcomes)))
    assert_same_value_and_grad(actual, expected, rtol=1e-5, atol=1e-5)


def test_analytic_eubo_approaches_the_exact_one_and_a_fitted_preference_model_optimises_it():
    """Measured (largest error on 4 pairs, values 0.5–1.5): 0.17 at F = 16, 0.010 at F = 4096."""
    x, comparisons = _preferences()
    X = uniform(4, 2, seed=7)
    with torch.no_grad():
        expected = AnalyticExpectedUtilityOfBestOption(preference_model(x, comparisons))(X)
        errors = {width: (AnalyticExpectedUtilityOfBestOption(preference_model(
            x, comparisons, lambda kernel: rfgp.sketch(kernel, width, method="orf", seed=0)))(X) - expected).abs().max()
            for width in (16, 4096)}
    assert errors[4096] < 0.02 and errors[4096] < 0.2 * errors[16], errors
    model = preference_model(x, comparisons, lambda kernel: rfgp.sketch(kernel, 8, method="orf", seed=0)).train()
    fit_gpytorch_mll(PairwiseLaplaceMarginalLogLikelihood(model.likelihood, model))
    candidates, value = optimize_acqf(AnalyticExpectedUtilityOfBestOption(model.eval()), BOUNDS, q=2, num_restarts=2,
                                      raw_samples=16, options={"maxiter": 5})
    assert candidates.shape == (2, D) and torch.isfinite(value)


# ----------------------------------------------------------------------------------------------------------------------
# qBayesianActiveLearningByDisagreement: BoTorch's fully Bayesian models (SaasFullyBayesianSingleTaskGP) require JAX
# and NumPyro at construction (their NUTS runs in NumPyro on a JAX Matérn kernel); BALD refuses every model that is not
# marked ``_is_fully_bayesian``, BoTorch's MAP ensemble included.  The ensemble marked fully Bayesian is the batch of
# hyperparameter samples BALD's mixture entropy is defined on (BALD on a converted SaasFullyBayesianSingleTaskGP after a
# real NUTS fit: test_botorch_fully_bayesian.py).


class FullyBayesianEnsemble(EnsembleMapSaasSingleTaskGP):
    """BoTorch's MAP-SAAS ensemble (a batch of SingleTaskGPs with a GaussianMixturePosterior) taken as a fully
    Bayesian model: its members as the hyperparameter samples."""

    _is_fully_bayesian = True


def ensemble(n, convert=lambda model: model.eval(), seed=0):
    x, y = data(n, seed)
    model = FullyBayesianEnsemble(x, y, num_taus=3, taus=torch.tensor([0.05, 0.1, 0.3], dtype=F64))
    with torch.no_grad():  # members that disagree
        model.covar_module.base_kernel.lengthscale = torch.tensor([[[0.2, 0.5]], [[0.4, 0.3]], [[1.0, 0.8]]],
                                                                  dtype=F64)
    return x, convert(model.eval())


def _bald(model):
    return qBayesianActiveLearningByDisagreement(model, sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))


def test_upstream_bald_refuses_botorchs_ensemble():
    x, y = data(8)
    with pytest.raises(RuntimeError, match="Fully Bayesian acquisition functions require"):
        qBayesianActiveLearningByDisagreement(EnsembleMapSaasSingleTaskGP(x, y, num_taus=2))


def test_bald_of_an_ensemble_is_the_exact_models_with_every_point_a_landmark_and_approaches_it():
    """Measured (largest error on 4 pairs, values 0.30–0.40, mean over 3 seeds): 0.50 at F = 16, 0.035 at
    F = 4096."""
    x, exact = ensemble(16)
    X = uniform(4, 2, seed=7)
    expected = value_and_grad(_bald(exact), X)
    assert expected[0].min() > 0.1
    assert_same_value_and_grad(value_and_grad(_bald(landmark_copy(exact, x, X)), X), expected, rtol=1e-5, atol=1e-5)
    with torch.no_grad():
        errors = {width: torch.stack([(_bald(sketched_copy(exact, width, seed))(X) - expected[0]).abs().max()
                                      for seed in range(3)]).mean() for width in (16, 4096)}
    assert errors[4096] < 0.05 and errors[4096] < 0.2 * errors[16], errors


@pytest.mark.parametrize("num_features", [8, 64])  # N = 16 > F and N ≤ F
def test_bald_optimises_an_ensemble_of_random_features(num_features):
    _, model = ensemble(16, lambda m: sketched_copy(m, num_features))
    candidates, value = optimize_acqf(_bald(model), BOUNDS, q=2, num_restarts=2, raw_samples=16,
                                      options={"maxiter": 5})
    assert candidates.shape == (2, D) and torch.isfinite(value) and value > 0


def test_bald_and_its_gradient_build_nothing_n_by_n():
    n, width, members = 400, 16, 3
    X = uniform(1, 2, seed=7).requires_grad_(True)
    for convert, bound in ((lambda m: sketched_copy(m, width), members * n * width), (lambda m: m.eval(), n * n)):
        _, model = ensemble(n, convert)
        with LargestTensor() as largest:
            _bald(model)(X).sum().backward()
        assert largest.numel <= bound if bound < n * n else largest.numel >= bound, largest.numel
