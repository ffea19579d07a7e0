"""BoTorch round 7: more of BoTorch's tutorials' code paths, with only the kernel swapped.

Closed-loop constrained batch BO (``train_Yvar`` + ``Normalize`` models in a ``ModelListGP``, qLogEI/qLogNEI with a
``GenericMCObjective`` and ``constraints``), constrained multi-objective BO (qLogNEHVI with constraints, the qParEGO
scalarisation through qEI with constraints), multi-objective multi-fidelity BO (``MOMF``), cost-aware BO (EI per unit
cost of a ``Log``-transformed cost GP called directly), composite BO with a ``HigherOrderGP``, meta-learning's RGPE
(a custom ``GPyTorchModel`` summing its members' posteriors), constraint active search (a custom acquisition reading
``covar_module.covar_dist``), robust multi-objective BO (``InputPerturbation`` + ``MARS``), robust relevance pursuit
(``RobustRelevancePursuitSingleTaskGP``'s sparse outlier noise), ROBOT's variational GP with Thompson sampling, and the
Thompson-sampling tutorial's sampler settings (CIQ, Lanczos).

As in ``test_botorch_acquisitions.py``, a Nyström map with every point the kernel sees as a landmark is the exact model,
so values and gradients are the exact model's up to the Nyström factor's round-off; where the tutorial samples from a
numerically singular joint covariance (MARS over perturbed points) only the distribution, not the draw, is the exact
one, and the comparison is to Monte-Carlo tolerance.
"""

import copy
from contextlib import ExitStack

import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
import gpytorch.settings as gpts  # noqa: E402
from botorch.acquisition import (  # noqa: E402
    AnalyticAcquisitionFunction,
    ExpectedImprovement,
    qExpectedImprovement,
    qLogExpectedImprovement,
    qLogNoisyExpectedImprovement,
)
from botorch.acquisition.monte_carlo import MCAcquisitionFunction  # noqa: E402
from botorch.acquisition.multi_objective.logei import qLogNoisyExpectedHypervolumeImprovement  # noqa: E402
from botorch.acquisition.multi_objective.multi_fidelity import MOMF  # noqa: E402
from botorch.acquisition.multi_objective.multi_output_risk_measures import MARS  # noqa: E402
from botorch.acquisition.multi_objective.objective import IdentityMCMultiOutputObjective  # noqa: E402
from botorch.acquisition.objective import GenericMCObjective, IdentityMCObjective  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.generation import MaxPosteriorSampling  # noqa: E402
from botorch.models import HigherOrderGP, ModelListGP, SingleTaskGP  # noqa: E402
from botorch.models.gpytorch import GPyTorchModel  # noqa: E402
from botorch.models.higher_order_gp import FlattenedStandardize  # noqa: E402
from botorch.models.robust_relevance_pursuit_model import RobustRelevancePursuitSingleTaskGP  # noqa: E402
from botorch.models.transforms.input import InputPerturbation, Normalize  # noqa: E402
from botorch.models.transforms.outcome import Log  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.posteriors.gpytorch import GPyTorchPosterior  # noqa: E402
from botorch.sampling import IIDNormalSampler, SobolQMCNormalSampler  # noqa: E402
from botorch.utils.constraints import NonTransformedInterval  # noqa: E402
from botorch.utils.multi_objective.box_decompositions.non_dominated import FastNondominatedPartitioning  # noqa: E402
from botorch.utils.multi_objective.scalarization import get_chebyshev_scalarization  # noqa: E402
from botorch.utils.sampling import sample_hypersphere  # noqa: E402
from botorch.utils.transforms import t_batch_mode_transform  # noqa: E402
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel  # noqa: E402
from gpytorch.likelihoods import LikelihoodList  # noqa: E402
from gpytorch.means import ZeroMean  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402
from linear_operator.operators import PsdSumLinearOperator  # noqa: E402

import rfgp  # noqa: E402

from ._converted_models import nystrom  # noqa: E402
from .test_botorch_acquisitions import assert_same_value_and_grad, value_and_grad  # noqa: E402
from .test_botorch_loops import uniform  # noqa: E402

F64 = torch.float64


def fixed(model, lengthscale=0.3, noise=None):
    """A BoTorch model (or each of a list's) at fixed hyperparameters, in eval mode."""
    for member in getattr(model, "models", [model]):
        kernel = member.covar_module
        getattr(kernel, "base_kernel", kernel).lengthscale = lengthscale
        if noise is not None:
            member.likelihood.noise = noise
    return model.eval()


def landmark_copy(model, *points):
    """``model`` (a ``ModelListGP``'s every member) with its kernel on Nyström landmarks at its training inputs and at
    ``points`` in that member's input coordinates (after its input transform)."""
    converted = copy.deepcopy(model).eval()
    for member in getattr(converted, "models", [converted]):
        seen = [member.train_inputs[0]] + [member.transform_inputs(p) for p in points]
        member.covar_module = nystrom(member.covar_module, *seen)
    return converted.eval()


# ----------------------------------------------------------------------------------------------------------------------
# acquisition functions of the tutorials: values and gradients of the landmark copy are the exact model's


def _closed_loop(acquisition):
    """closed_loop_botorch_only: objective and constraint models with known noise and ``Normalize``."""
    x = uniform(10, d=3, seed=0)
    objective_y, constraint_y = torch.sin(5 * x).sum(-1, keepdim=True), x.sum(-1, keepdim=True) - 1.5
    model = fixed(ModelListGP(*(SingleTaskGP(x, y, torch.full_like(y, 1e-2), input_transform=Normalize(d=3)).double()
                                for y in (objective_y, constraint_y))))
    options = {"objective": GenericMCObjective(lambda Z, X=None: Z[..., 0]), "constraints": [lambda Z: Z[..., 1]]}
    if acquisition == "qLogEI":
        return model, lambda m: qLogExpectedImprovement(m, best_f=objective_y.median(), sampler=_sampler(), **options)
    return model, lambda m: qLogNoisyExpectedImprovement(m, X_baseline=x, sampler=_sampler(), **options)


def _constrained_multi_objective(acquisition):
    """constrained_multi_objective_bo: two objectives and a constraint (negative is feasible) in a ModelListGP."""
    x = uniform(10, d=3, seed=1)
    y = torch.cat([torch.sin(4 * x).sum(-1, keepdim=True), torch.cos(3 * x).prod(-1, keepdim=True),
                   x[:, :1] - 0.6], -1)
    model = fixed(ModelListGP(*(SingleTaskGP(x, y[:, i:i + 1]).double() for i in range(3))))
    if acquisition == "qLogNEHVI":
        return model, lambda m: qLogNoisyExpectedHypervolumeImprovement(
            m, ref_point=[-2.0, -1.0], X_baseline=x, sampler=_sampler(), prune_baseline=True,
            objective=IdentityMCMultiOutputObjective(outcomes=[0, 1]), constraints=[lambda Z: Z[..., -1]])
    scalarization = get_chebyshev_scalarization(weights=torch.tensor([0.3, 0.7], dtype=F64), Y=y[:, :2])
    objective = GenericMCObjective(lambda Z, X=None: scalarization(Z[..., :-1]))
    return model, lambda m: qExpectedImprovement(m, best_f=objective(y).quantile(0.3), objective=objective,
                                                 constraints=[lambda Z: Z[..., -1]], sampler=_sampler())


def _momf(_):
    """Multi_objective_multi_fidelity_BO: two objectives and the fidelity objective, Matérn models with priors."""
    x = uniform(10, d=3, seed=2)
    y = torch.cat([torch.sin(4 * x[:, :2]).sum(-1, keepdim=True), torch.cos(3 * x).prod(-1, keepdim=True),
                   x[:, -1:]], -1)
    model = fixed(ModelListGP(*(SingleTaskGP(
        x, y[:, i:i + 1], torch.full_like(y[:, :1], 1e-6),
        covar_module=ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=3, lengthscale_prior=gpytorch.priors.GammaPrior(
            2.0, 2.0)), outputscale_prior=gpytorch.priors.GammaPrior(2.0, 0.15))).double() for i in range(3))))
    reference = torch.zeros(3, dtype=F64)
    partitioning = FastNondominatedPartitioning(ref_point=reference, Y=y)
    return model, lambda m: MOMF(m, ref_point=reference, partitioning=partitioning, sampler=_sampler(),
                                 cost_call=lambda X: torch.exp(X[..., -1:]))


class _ExpectedImprovementWithCost(AnalyticAcquisitionFunction):
    """cost_aware_bayesian_optimization's EI(x) / c(x)^α, c the exponentiated mean of the cost GP called directly."""

    def __init__(self, model, best_f, cost_model, alpha=1.0):
        super().__init__(model=model)
        self.ei, self.cost_model, self.alpha = ExpectedImprovement(model=model, best_f=best_f), cost_model, alpha

    def forward(self, X):
        return self.ei(X) / torch.exp(self.cost_model(X).mean)[:, 0] ** self.alpha


def _cost_aware(_):
    x = uniform(10, d=2, seed=3)
    y, cost = torch.sin(5 * x).sum(-1, keepdim=True), torch.exp(x[:, :1]) + 0.1
    model = fixed(SingleTaskGP(x, y).double())
    cost_model = fixed(SingleTaskGP(x, cost, outcome_transform=Log()).double())
    return (model, cost_model), lambda m: _ExpectedImprovementWithCost(m[0], y.median(), m[1], alpha=0.5)


class _RGPE(gpytorch.models.GP, GPyTorchModel):
    """meta_learning_with_rgpe's rank-weighted ensemble: Σ wᵢμᵢ, Σ wᵢ²Σᵢ of its members' posteriors."""

    _num_outputs = 1

    def __init__(self, models, weights):
        super().__init__()
        self.models, self.weights = torch.nn.ModuleList(models), weights
        self.likelihood = LikelihoodList(*[m.likelihood for m in models])

    def forward(self, x):
        weights = self.weights / self.weights.sum()
        posteriors = [m.posterior(x) for m in self.models]
        mean = sum(w * p.mean.squeeze(-1) for w, p in zip(weights, posteriors))
        covariance = PsdSumLinearOperator(*[p.mvn.lazy_covariance_matrix * w ** 2 for w, p in zip(weights, posteriors)])
        return gpytorch.distributions.MultivariateNormal(mean, covariance)


def _rgpe(_):
    members = []
    for task in range(3):
        x = uniform(8, d=2, seed=10 + task)
        y = torch.sin(6 * (x - 0.05 * task)).sum(-1, keepdim=True)
        members.append(fixed(SingleTaskGP(x, y, torch.full_like(y, 1e-3)).double()))
    weights = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    return ModelListGP(*members), lambda m: qLogNoisyExpectedImprovement(
        _RGPE(list(m.models), weights), X_baseline=members[-1].train_inputs[0], sampler=_sampler())


def test_rgpe_leave_one_out_model_from_an_expanded_state_is_the_exact_models():
    """meta_learning_with_rgpe builds the target task's n leave-one-out models as one batch and loads the fitted
    model's state expanded to it. Expanding every tensor fails for the exact model in BoTorch 0.18.1 (the priors'
    and constraints' buffers keep their shapes) and, for rfgp, the configuration entries are refused by name; with
    the parameters and the outcome transform's statistics expanded, the sketched batch loads and is the exact one."""
    x = uniform(6, d=2, seed=0)
    y, noise = torch.sin(6 * x).sum(-1, keepdim=True), torch.full((6, 1), 1e-3, dtype=F64)
    masks = torch.eye(6, dtype=torch.bool)
    x_cv, y_cv, noise_cv = (torch.stack([t[~m] for m in masks]) for t in (x, y, noise))
    def landmarks(model):
        model.covar_module = nystrom(model.covar_module, x)
        return model

    posteriors = []
    for convert in (lambda model: model, landmarks):
        target = convert(fixed(SingleTaskGP(x, y, noise).double()))
        state = target.state_dict()
        batched = {"outcome_transform.means", "outcome_transform.stdvs", "outcome_transform._stdvs_sq",
                   *dict(target.named_parameters())}
        loo = convert(SingleTaskGP(x_cv, y_cv, noise_cv).double())
        if convert is landmarks:
            with pytest.raises(ValueError, match=r"config_type has shape \(6, \d+\).*expand only the parameters"):
                loo.load_state_dict({k: v.expand(6, *v.shape) for k, v in state.items()}, strict=False)
        loo.load_state_dict({k: v.expand(6, *v.shape) if k in batched else v for k, v in state.items()},
                            strict=False)
        with torch.no_grad():
            posteriors.append(loo.eval().posterior(x))
    torch.testing.assert_close(posteriors[1].mean, posteriors[0].mean, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(posteriors[1].variance, posteriors[0].variance, rtol=1e-4, atol=1e-6)


class _ExpectedCoverageImprovement(MCAcquisitionFunction):
    """constraint_active_search's acquisition (q = 1): the probability of satisfying the constraints, integrated over
    a ball of radius r around x, masked by the distance to the evaluated points from ``covar_module.covar_dist``."""

    def __init__(self, model, constraints, punchout_radius, bounds, ball):
        super().__init__(model=model, objective=IdentityMCObjective())
        self.constraints, self.punchout_radius, self.bounds, self.ball = constraints, punchout_radius, bounds, ball
        self.thresholds = torch.tensor([value for _, value in constraints], dtype=F64)

    @staticmethod
    def _mask(x, a, eps=2e-3):
        return torch.sigmoid((x - a) / eps)

    @t_batch_mode_transform(expected_q=1)
    def forward(self, X):
        points = self.ball + X
        domain = (self._mask(points, self.bounds[0]) - self._mask(points, self.bounds[1])).prod(-1)
        first = self.model.models[0]
        distances = first.covar_module.covar_dist(points, first.train_inputs[0])
        away = self._mask(distances, self.punchout_radius).prod(-1)
        posterior = self.model.posterior(points)
        cdf = torch.distributions.Normal(posterior.mean, posterior.variance.sqrt()).cdf(self.thresholds)
        probability = torch.ones_like(domain)
        for i, (direction, _) in enumerate(self.constraints):
            probability = probability * (cdf[..., i] if direction == "lt" else 1 - cdf[..., i])
        return (probability * domain * away).sum(-1) / domain.sum(-1)


BALL = 0.1 * sample_hypersphere(d=2, n=16, qmc=True, seed=0, dtype=F64) * torch.rand(
    16, 1, generator=torch.Generator().manual_seed(0), dtype=F64).sqrt()


def _constraint_active_search(_):
    x = uniform(8, d=2, seed=4)
    gp = fixed(SingleTaskGP(x, 1 - torch.exp(-4 * (x - 0.4).pow(2).sum(-1, keepdim=True))).double(), noise=1e-4)
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    return ModelListGP(gp, copy.deepcopy(gp)), lambda m: _ExpectedCoverageImprovement(
        m, [("lt", 0.3), ("gt", 0.05)], 0.03, bounds, BALL)


def _composite_hogp(_):
    """composite_bo_with_hogp: qEI of a composite objective of the HigherOrderGP's 3 × 4 output field."""
    x = uniform(10, d=2, seed=5)
    s, t = torch.linspace(0, 1, 3, dtype=F64), torch.linspace(0, 1, 4, dtype=F64)
    y = torch.sin(3 * x[:, :1, None] + s[:, None]) * torch.cos(2 * x[:, 1:, None] + t)
    torch.manual_seed(0)  # the latent dimensions' initial values (latent_init="gp")
    model = HigherOrderGP(x, y, outcome_transform=FlattenedStandardize(y.shape[1:]), input_transform=Normalize(2),
                          latent_init="gp").double()
    model.likelihood.noise = 1e-2
    model.eval()
    objective = GenericMCObjective(lambda Y, X=None: -(Y - y[0]).pow(2).sum(dim=(-1, -2)))
    return model, lambda m: qExpectedImprovement(m, best_f=objective(y).quantile(0.3), objective=objective,
                                                 sampler=IIDNormalSampler(torch.Size([16]), seed=0))


def _sampler():
    return SobolQMCNormalSampler(torch.Size([64]), seed=0)


def _hogp_landmark_copy(model, *points):
    converted = copy.deepcopy(model)
    converted.covar_modules[0] = nystrom(converted.covar_modules[0], converted.train_inputs[0],
                                         *[converted.transform_inputs(p) for p in points])
    return converted.eval()


TUTORIALS = {
    "closed_loop-qLogEI": (_closed_loop, "qLogEI", 3, 3),
    "closed_loop-qLogNEI": (_closed_loop, "qLogNEI", 3, 3),
    "constrained_multi_objective-qLogNEHVI": (_constrained_multi_objective, "qLogNEHVI", 2, 3),
    "constrained_multi_objective-qParEGO": (_constrained_multi_objective, "qEI", 2, 3),
    "multi_objective_multi_fidelity-MOMF": (_momf, None, 1, 3),
    "cost_aware-EIpu": (_cost_aware, None, 1, 2),
    "meta_learning_rgpe-qLogNEI": (_rgpe, None, 2, 2),
    "constraint_active_search-ECI": (_constraint_active_search, None, 1, 2),
    "composite_hogp-qEI": (_composite_hogp, None, 2, 2),
}


def _evaluated_points(name, model, X):
    """Every point the kernels see at X beyond their training inputs: the ball around each X (ECI), the target task's
    inputs, RGPE's baseline, for every member."""
    if name.startswith("constraint_active_search"):
        return (BALL + X).reshape(-1, X.shape[-1])
    if name.startswith("meta_learning_rgpe"):
        return torch.cat([X.reshape(-1, X.shape[-1]), model.models[-1].train_inputs[0]])
    return X


@pytest.mark.parametrize("name", list(TUTORIALS))
def test_tutorial_acquisition_is_the_exact_models(name):
    build, variant, q, d = TUTORIALS[name]
    model, acquisition = build(variant)
    X = uniform(3, q, d=d, seed=7)
    seen = _evaluated_points(name, model, X)
    if isinstance(model, HigherOrderGP):
        converted = _hogp_landmark_copy(model, seen)
    elif isinstance(model, tuple):
        converted = tuple(landmark_copy(m, seen) for m in model)
    else:
        converted = landmark_copy(model, seen)
    expected = value_and_grad(acquisition(model), X)
    assert expected[0].abs().max() > 1e-3 and expected[1].abs().max() > 1e-3  # informative points
    # the HigherOrderGP's gradients: its Nyström factor of K_ZZ (condition number ~1e6 on its training inputs alone)
    # reproduces k(x, x)'s derivative to ~1e-4 of the largest gradient
    atol = 1e-4 * expected[1].abs().max() if isinstance(model, HigherOrderGP) else 1e-5
    assert_same_value_and_grad(value_and_grad(acquisition(converted), X), expected, atol=atol)


@pytest.mark.parametrize("name", ["closed_loop-qLogNEI", "constrained_multi_objective-qLogNEHVI",
                                  "multi_objective_multi_fidelity-MOMF", "meta_learning_rgpe-qLogNEI"])
def test_tutorial_acquisition_optimises_with_random_features(name):
    build, variant, q, d = TUTORIALS[name]
    model, acquisition = build(variant)
    converted = copy.deepcopy(model)
    for member in converted.models:
        member.covar_module = rfgp.sketch(member.covar_module, 256, method="orf", seed=0)
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=F64)
    candidates, value = optimize_acqf(acquisition(converted.eval()), bounds, q=q, num_restarts=2, raw_samples=16,
                                      options={"maxiter": 5}, sequential=q > 1)
    assert candidates.shape == (q, d) and torch.isfinite(value).all()


# ----------------------------------------------------------------------------------------------------------------------
# robust multi-objective BO: MARS over InputPerturbation


def test_robust_mars_acquisition_has_the_exact_models_distribution():
    """robust_multi_objective_bo: models with known noise 10⁻⁷·var(y) and ``InputPerturbation``; the joint posterior
    over the perturbed baseline and candidates is the exact model's (10⁻⁵), but it is numerically singular (n_w
    perturbations of each point), so its Cholesky factor — the exact model's too — changes by O(1) under a 10⁻⁷
    change of the matrix: the draws from the same base samples differ while their distribution is the same. The
    informative value (−6 against −40 in the tails) agrees to Monte-Carlo accuracy."""
    x = 0.7 * uniform(8, d=1, seed=0)
    y = torch.cat([torch.sin(8 * x), torch.cos(5 * x)], -1)
    perturbations = 0.05 * torch.linspace(-1, 1, 5, dtype=F64).unsqueeze(-1)
    noise = 1e-7 * y.var(dim=0)
    model = fixed(ModelListGP(*(SingleTaskGP(x, y[:, i:i + 1], noise[i].expand(8, 1),
                                             input_transform=InputPerturbation(perturbations)).double()
                                for i in range(2))), lengthscale=0.2)
    X = torch.tensor([[[0.05]], [[0.15]], [[0.2]]], dtype=F64)
    converted = landmark_copy(model, X, x)

    def acquisition(m):
        mars = MARS(alpha=0.8, n_w=5, chebyshev_weights=torch.tensor([0.4, 0.6], dtype=F64),
                    ref_point=torch.tensor([-1.5, -1.5], dtype=F64))
        mars.set_baseline_Y(model=m, X_baseline=x)
        return mars, qLogNoisyExpectedImprovement(m, X_baseline=x, objective=mars, prune_baseline=True,
                                                  sampler=SobolQMCNormalSampler(torch.Size([1024]), seed=0))

    with torch.no_grad():
        joint = torch.cat([x, X.reshape(-1, 1)])
        expected, actual = model.posterior(joint), converted.posterior(joint)
        torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-3, atol=1e-5)  # noise 1e-7: Nyström round-off
        torch.testing.assert_close(actual.distribution.covariance_matrix, expected.distribution.covariance_matrix,
                                   rtol=1e-3, atol=1e-5)
        (mars_e, acq_e), (mars_a, acq_a) = acquisition(model), acquisition(converted)
        torch.testing.assert_close(mars_a.baseline_Y, mars_e.baseline_Y, rtol=0, atol=1e-5)
        values_e, values_a = acq_e(X), acq_a(X)
    best = values_e.argmax()
    assert values_e[best] > -10 and (values_a[best] - values_e[best]).abs() < 0.05


# ----------------------------------------------------------------------------------------------------------------------
# robust relevance pursuit, ROBOT's variational GP, the Thompson-sampling tutorial's sampler settings


def test_relevance_pursuit_model_is_the_exact_models():
    """RobustRelevancePursuitSingleTaskGP: the sparse outlier noise (a per-point ρᵢ added to the support found by
    relevance pursuit) enters the sketched model's marginal likelihood and posterior as the exact model's, and a fit
    with the sketched kernel finds the same outliers."""
    x = uniform(30, d=1, seed=0)
    y = torch.sin(6 * x) + 0.02 * torch.randn(30, 1, generator=torch.Generator().manual_seed(1), dtype=F64)
    y[-3:] = torch.tensor([[0.9], [-0.8], [1.2]], dtype=F64)

    def model(kernel=None):
        kernel = kernel or ScaleKernel(RBFKernel(lengthscale_constraint=NonTransformedInterval(
            0.05, torch.inf, initial_value=0.2)), outputscale_constraint=NonTransformedInterval(0.01, 10.0,
                                                                                                  initial_value=0.1))
        return RobustRelevancePursuitSingleTaskGP(train_X=x, train_Y=y, input_transform=Normalize(d=1),
                                                  mean_module=ZeroMean(), covar_module=kernel)

    def fit(m):
        fit_gpytorch_mll(ExactMarginalLogLikelihood(m.likelihood, m), numbers_of_outliers=[0, 3],
                         optimizer_kwargs={"options": {"maxiter": 30}})
        return m

    exact = fit(model())
    assert sorted(exact.likelihood.noise_covar.support) == [27, 28, 29]
    test = torch.linspace(0, 1, 7, dtype=F64).unsqueeze(-1)
    results = []
    landmarks = nystrom(exact.covar_module, exact.train_inputs[0], exact.transform_inputs(test))
    for kernel in (exact.covar_module, landmarks):
        exact.covar_module = kernel
        exact.train()
        with torch.no_grad():
            inputs = [exact.transform_inputs(x) for x in exact.train_inputs]  # as BoTorch's fit: ρ applies to them
            mll = ExactMarginalLogLikelihood(exact.likelihood, exact)(exact(*exact.train_inputs), exact.train_targets,
                                                                      *inputs)
            exact.eval()
            posterior, noisy = exact.posterior(test), exact.posterior(x, observation_noise=True)
        results.append((mll, posterior.mean, posterior.variance, noisy.variance))
    for actual, expected in zip(results[1], results[0]):
        torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-5)
    sketched = fit(model(rfgp.sketch(model().covar_module, 512, method="orf", seed=0)))
    assert sorted(sketched.likelihood.noise_covar.support) == [27, 28, 29]


class _VariationalGP(gpytorch.models.ApproximateGP):
    """robot: GPyTorch's SVGP with a BoTorch posterior (the likelihood applied), for MaxPosteriorSampling."""

    num_outputs = 1

    def __init__(self, inducing_points, covar_module):
        strategy = gpytorch.variational.VariationalStrategy(
            self, inducing_points, gpytorch.variational.CholeskyVariationalDistribution(inducing_points.shape[0]),
            learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module, self.covar_module = gpytorch.means.ConstantMean(), covar_module
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def posterior(self, X, output_indices=None, observation_noise=False, *args, **kwargs):
        self.eval()
        return GPyTorchPosterior(self.likelihood(self(X)))


def test_variational_gp_posterior_and_thompson_sampling_are_the_exact_models():
    x = uniform(24, d=3, seed=0)
    y = torch.sin(3 * x).sum(-1)
    model = _VariationalGP(x.clone(), ScaleKernel(RBFKernel())).double()
    mll = gpytorch.mlls.PredictiveLogLikelihood(model.likelihood, model, num_data=24)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(10):
        optimizer.zero_grad()
        (-mll(model(x), y)).backward()
        optimizer.step()
    model.eval()
    candidates = uniform(50, d=3, seed=1)
    converted = copy.deepcopy(model)
    converted.covar_module = nystrom(model.covar_module, model.variational_strategy.inducing_points.detach(),
                                     candidates)
    with torch.no_grad():
        expected, actual = model.posterior(candidates), converted.posterior(candidates)
        torch.testing.assert_close(actual.mean, expected.mean, rtol=0, atol=1e-6)
        torch.testing.assert_close(actual.distribution.covariance_matrix, expected.distribution.covariance_matrix,
                                   rtol=0, atol=1e-6)
        picks = []
        for m in (model, converted):
            torch.manual_seed(1)
            picks.append(MaxPosteriorSampling(model=m, replacement=False)(candidates, num_samples=4))
    torch.testing.assert_close(picks[1], picks[0])


def _sampler_settings(stack, sampler):
    """thompson_sampling's settings for each sampler (Cholesky, CIQ, Lanczos)."""
    if sampler == "cholesky":
        stack.enter_context(gpts.max_cholesky_size(float("inf")))
    elif sampler == "ciq":
        for setting in (gpts.fast_computations(covar_root_decomposition=True), gpts.max_cholesky_size(0),
                        gpts.ciq_samples(True), gpts.minres_tolerance(2e-3), gpts.num_contour_quadrature(15)):
            stack.enter_context(setting)
    else:
        for setting in (gpts.fast_computations(covar_root_decomposition=True, log_prob=True, solves=True),
                        gpts.max_lanczos_quadrature_iterations(10), gpts.max_cholesky_size(0),
                        gpts.ciq_samples(False)):
            stack.enter_context(setting)


@pytest.mark.parametrize("sampler", ["cholesky", "ciq", "lanczos"])
def test_thompson_sampling_settings_draw_from_the_exact_posterior(sampler):
    """Under each of the tutorial's sampler settings the landmark model's draws have the exact posterior's mean and
    covariance (within 4 standard errors of 8000 draws at 5 points)."""
    x = uniform(20, d=6, seed=0)
    model = fixed(SingleTaskGP(x, torch.sin(3 * x).sum(-1, keepdim=True),
                               covar_module=ScaleKernel(RBFKernel(ard_num_dims=6))).double(), lengthscale=0.5,
                  noise=1e-3)
    candidates = uniform(5, d=6, seed=3)
    with torch.no_grad():
        exact = model.posterior(candidates).distribution
    converted = landmark_copy(model, candidates)
    with ExitStack() as stack:
        _sampler_settings(stack, sampler)
        stack.enter_context(torch.no_grad())
        torch.manual_seed(0)
        draws = converted.posterior(candidates).rsample(torch.Size([8000])).squeeze(-1)
    variance = exact.covariance_matrix.diagonal()
    count = draws.shape[0]
    mean_se = (variance / count).sqrt()
    covariance_se = ((variance[:, None] * variance[None, :] + exact.covariance_matrix ** 2) / count).sqrt()
    assert ((draws.mean(0) - exact.mean).abs() <= 4 * mean_se).all()
    assert ((torch.cov(draws.T) - exact.covariance_matrix).abs() <= 4 * covariance_se).all()
