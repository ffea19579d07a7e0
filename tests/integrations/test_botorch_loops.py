"""BoTorch tutorials' loops with rfgp kernels, written as a BoTorch user would: TuRBO (trust-region Thompson sampling),
SCBO (constrained Thompson sampling), Boltzmann sampling, the multi-objective loop (qLogNEHVI, qLogEHVI, qLogNParEGO)
and the fitting alternatives (BoTorch's torch optimiser, optimizer_kwargs, fold-batched and efficient cross-validation,
the MAP-SAAS ensemble).

The reference is the exact BoTorch model at the same hyperparameters.  A Nyström map whose landmarks are every point the
kernel sees reproduces k on them (and against them), so the converted model is the exact one up to the Nyström
factor's round-off (see test_botorch_acquisitions.py): its values and gradients are compared to tolerance, its random
choices (Thompson sampling) by their frequencies within 4 standard errors.  Random features are checked to approach the
exact values as F grows and to factorise nothing larger than F × F where the exact model factorises N × N or n × n.
"""


import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.acquisition import UpperConfidenceBound, qLogExpectedImprovement  # noqa: E402
from botorch.acquisition.multi_objective.logei import (  # noqa: E402
    qLogExpectedHypervolumeImprovement,
    qLogNoisyExpectedHypervolumeImprovement,
)
from botorch.acquisition.multi_objective.parego import qLogNParEGO  # noqa: E402
from botorch.cross_validation import batch_cross_validation, gen_loo_cv_folds, loo_cv  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.generation.sampling import (  # noqa: E402
    BoltzmannSampling,
    ConstrainedMaxPosteriorSampling,
    MaxPosteriorSampling,
)
from botorch.models import ModelListGP, SingleTaskGP  # noqa: E402
from botorch.models.map_saas import EnsembleMapSaasSingleTaskGP  # noqa: E402
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.optim.fit import fit_gpytorch_mll_torch  # noqa: E402
from botorch.sampling import SobolQMCNormalSampler  # noqa: E402
from botorch.utils.multi_objective.box_decompositions.non_dominated import FastNondominatedPartitioning  # noqa: E402
from botorch.utils.multi_objective.hypervolume import Hypervolume  # noqa: E402
from botorch.utils.multi_objective.pareto import is_non_dominated  # noqa: E402
from gpytorch.constraints import Interval  # noqa: E402
from gpytorch.kernels import MaternKernel, ScaleKernel  # noqa: E402
from gpytorch.likelihoods import GaussianLikelihood  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood, SumMarginalLogLikelihood  # noqa: E402
from torch.quasirandom import SobolEngine  # noqa: E402

import rfgp  # noqa: E402

from ._converted_models import landmark_copy, nystrom, sketched_copy  # noqa: E402

F64 = torch.float64


def uniform(*shape, d, seed):
    return torch.rand(*shape, d, generator=torch.Generator().manual_seed(seed), dtype=F64)


def frequencies(choices, candidates):
    """How often each candidate was chosen (rows of ``choices`` are rows of ``candidates``)."""
    index = (choices.unsqueeze(-2) == candidates).all(-1).to(F64).argmax(-1)
    return torch.bincount(index, minlength=candidates.shape[0]).to(F64) / choices.shape[0]


def assert_same_frequencies(actual, expected, draws):
    """Two multinomial frequency vectors of ``draws`` draws each agree within 4 standard errors (floor 1e-3)."""
    se = ((actual * (1 - actual) + expected * (1 - expected)) / draws).sqrt().clamp_min(1e-3)
    assert ((actual - expected).abs() <= 4 * se).all()


# ----------------------------------------------------------------------------------------------------------------------
# TuRBO: trust-region Thompson sampling (BoTorch's TuRBO-1 tutorial), SCBO and Boltzmann sampling


def turbo_model(X, Y, covar_module=None):
    """The TuRBO tutorial's model: Matérn-5/2 ARD with lengthscales in [0.005, 4], noise in [1e-8, 1e-3]."""
    if covar_module is None:
        covar_module = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=X.shape[-1],
                                                lengthscale_constraint=Interval(0.005, 4.0)))
    likelihood = GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))
    return SingleTaskGP(X, Y, covar_module=covar_module, likelihood=likelihood)


def turbo_candidates(model, X, Y, length, num_candidates, seed):
    """The tutorial's candidates: Sobol points in the trust region around the best point, each coordinate perturbed
    with probability min(20/d, 1) (at least one per candidate); the region's sides scale with the lengthscales."""
    d = X.shape[-1]
    center = X[Y.argmax()]
    weights = model.covar_module.base_kernel.lengthscale.squeeze().detach()
    weights = weights / weights.mean() / torch.prod(weights / weights.mean()).pow(1.0 / d)
    lower = (center - weights * length / 2).clamp(0.0, 1.0)
    upper = (center + weights * length / 2).clamp(0.0, 1.0)
    generator = torch.Generator().manual_seed(seed)
    perturbed = lower + (upper - lower) * SobolEngine(d, scramble=True, seed=seed).draw(num_candidates).to(F64)
    mask = torch.rand(num_candidates, d, generator=generator, dtype=F64) <= min(20.0 / d, 1.0)
    none = mask.sum(-1) == 0
    mask[none, torch.randint(0, d, (int(none.sum()),), generator=generator)] = True
    candidates = center.expand(num_candidates, d).clone()
    candidates[mask] = perturbed[mask]
    return candidates


def turbo_data(n, d=3, seed=0):
    X = uniform(n, d=d, seed=seed)
    Y = -((X - 0.3) ** 2).sum(-1, keepdim=True) + 0.1 * torch.sin(9 * X).sum(-1, keepdim=True)
    return X, (Y - Y.mean()) / Y.std()  # the tutorial standardises Y itself


def fixed_turbo_model(X, Y, covar_module=None):
    model = turbo_model(X, Y, covar_module)
    model.covar_module.base_kernel.lengthscale = torch.tensor([0.3, 0.5, 0.8], dtype=F64)
    model.covar_module.outputscale = 1.5
    model.likelihood.noise = 1e-3
    return model.eval()


def test_turbo_kernel_converts_with_its_constraints():
    """The tutorial's kernel converts to a sketched Matérn-5/2 that keeps the lengthscale's Interval(0.005, 4): a
    value outside it is refused as by the exact kernel, and the trust region reads the same lengthscales."""
    X, Y = turbo_data(10)
    exact = fixed_turbo_model(X, Y)
    converted = sketched_copy(exact, 64)
    base = converted.covar_module.base_kernel
    assert isinstance(base, rfgp.kernels.SketchedMaternKernel) and base.nu == 2.5
    constraint = base.raw_lengthscale_constraint
    assert isinstance(constraint, Interval) and torch.allclose(
        torch.stack([constraint.lower_bound, constraint.upper_bound]).double(), torch.tensor([0.005, 4.0], dtype=F64))
    torch.testing.assert_close(base.lengthscale, exact.covar_module.base_kernel.lengthscale)
    torch.testing.assert_close(turbo_candidates(converted, X, Y, 0.8, 50, seed=1),
                               turbo_candidates(exact, X, Y, 0.8, 50, seed=1))
    with pytest.raises(RuntimeError, match=r"out of bounds.*Interval\(5.000E-03, 4.000E\+00\)"):
        exact.covar_module.base_kernel.lengthscale = 5.0
    with pytest.raises(ValueError, match=r"lengthscale must be .* in \(0.005, 4\).*Interval\(5.000E-03, 4.000E\+00\)"):
        base.lengthscale = 5.0


def test_turbo_trust_region_reads_and_sets_the_lengthscales_of_a_nystrom_model():
    """rfgp.sketch(..., method="nystrom") of the tutorial's ScaleKernel(Matérn) is ScaleKernel(NystromKernel(Matérn)):
    the trust region reads model.covar_module.base_kernel.lengthscale as on the exact model (it read the whole
    tree's ScaleKernel, which has none), and lengthscales and outputscale set at the exact model's paths (after
    model.train(), GPyTorch's cache rule) reach the next posterior as on the exact model."""
    X, Y = turbo_data(20)
    exact = fixed_turbo_model(X, Y)
    candidates = turbo_candidates(exact, X, Y, 0.8, 100, seed=1)
    converted = landmark_copy(exact, X, candidates)
    torch.testing.assert_close(turbo_candidates(converted, X, Y, 0.8, 100, seed=1), candidates, rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"lengthscale must be .* in \(0.005, 4\)"):
        converted.covar_module.base_kernel.lengthscale = 5.0
    for model in (exact, converted):
        with torch.no_grad():
            model.posterior(candidates)  # caches of the old hyperparameters
        model.train()
        model.covar_module.base_kernel.lengthscale = torch.tensor([0.6, 0.2, 0.4], dtype=F64)
        model.covar_module.outputscale = 0.8
        model.eval()
    with torch.no_grad():
        expected, actual = exact.posterior(candidates), converted.posterior(candidates)
    torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(actual.variance, expected.variance, rtol=1e-6, atol=1e-6)


def test_turbo_thompson_choices_have_the_exact_models_distribution():
    """MaxPosteriorSampling over the trust-region candidates: with the candidates and training points as landmarks,
    the posterior over the candidates is the exact one and each candidate is chosen as often (8192 draws)."""
    X, Y = turbo_data(20)
    exact = fixed_turbo_model(X, Y)
    candidates = turbo_candidates(exact, X, Y, 0.8, 200, seed=1)
    converted = landmark_copy(exact, X, candidates)
    with torch.no_grad():
        expected, actual = exact.posterior(candidates), converted.posterior(candidates)
        torch.testing.assert_close(actual.mean, expected.mean, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(actual.distribution.covariance_matrix, expected.distribution.covariance_matrix,
                                   rtol=1e-6, atol=1e-6)
        draws = 8192
        counts = []
        for model in (exact, converted):
            torch.manual_seed(0)
            counts.append(frequencies(MaxPosteriorSampling(model)(candidates, num_samples=draws), candidates))
        torch.manual_seed(0)
        batch = MaxPosteriorSampling(converted, replacement=False)(candidates, num_samples=4)
    assert counts[1].max() > 0.05 and (counts[1] > 0).sum() > 5  # a spread of likely maximisers
    assert_same_frequencies(counts[0], counts[1], draws)
    assert batch.shape == (4, 3) and batch.unique(dim=0).shape[0] == 4  # distinct points without replacement


def test_turbo_loop_with_random_features_factorises_nothing_larger_than_the_features(factorised):
    """Two iterations of the tutorial's loop at N = 100 > F = 32: fit (under max_cholesky_size(inf), as the tutorial
    does), trust-region candidates (2000), a Thompson batch of 4 without replacement, the region's update.  Nothing
    larger than F × F is factorised (the exact GP factorises N × N to fit and 2000 × 2000 to sample)."""
    X, Y = turbo_data(100)
    length = 0.8

    def objective(x):
        y = -((x - 0.3) ** 2).sum(-1, keepdim=True) + 0.1 * torch.sin(9 * x).sum(-1, keepdim=True)
        return y

    raw = objective(X)
    for iteration in range(2):
        train_Y = (raw - raw.mean()) / raw.std()
        kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=3, lengthscale_constraint=Interval(0.005, 4.0)))
        model = turbo_model(X, train_Y, rfgp.sketch(kernel, 32, seed=iteration))
        with gpytorch.settings.max_cholesky_size(float("inf")):
            fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model),
                             optimizer_kwargs={"options": {"maxiter": 20}})
            candidates = turbo_candidates(model, X, train_Y, length, 2000, seed=iteration)
            with torch.no_grad():
                batch = MaxPosteriorSampling(model, replacement=False)(candidates, num_samples=4)
        assert batch.shape == (4, 3) and batch.unique(dim=0).shape[0] == 4
        assert ((candidates.unsqueeze(0) == batch.unsqueeze(1)).all(-1).any(-1)).all()  # chosen among the candidates
        new = objective(batch)
        length = length * 2 if new.max() > raw.max() else length / 2  # (success/failure counters folded to one step)
        X, raw = torch.cat([X, batch]), torch.cat([raw, new])
    assert isinstance(model.covar_module.base_kernel, rfgp.kernels.SketchedMaternKernel)
    assert 0.005 <= model.covar_module.base_kernel.lengthscale.min() <= model.covar_module.base_kernel.lengthscale.max()
    assert model.likelihood.noise <= 1e-3
    assert factorised and max(factorised) <= 32
    assert torch.isfinite(raw).all() and X.shape == (108, 3)


def constraint_models(X, convert=None):
    """SCBO's constraint models c(x) ≤ 0: x₀ − 0.5 and 0.4 − x₁ (feasible where x₀ ≤ 0.5 ≤ 0.6 ≤ x₁ + 0.2)."""
    models = [fixed_turbo_model(X, c) for c in (X[:, :1] - 0.5, 0.4 - X[:, 1:2])]
    return ModelListGP(*(models if convert is None else [convert(m) for m in models]))


def test_constrained_thompson_sampling_is_the_exact_models_and_low_rank(factorised):
    """SCBO's ConstrainedMaxPosteriorSampling with a ModelListGP of constraint models: with landmarks, each candidate
    is chosen as often as with the exact models; with random features at N = 60 > F = 16 over 1500 candidates,
    nothing larger than F × F is factorised."""
    X, Y = turbo_data(20)
    exact = fixed_turbo_model(X, Y)
    candidates = turbo_candidates(exact, X, Y, 1.0, 150, seed=2)

    def choices(objective, constraints, num_samples, points):
        torch.manual_seed(0)
        with torch.no_grad():
            return ConstrainedMaxPosteriorSampling(objective, constraints)(points, num_samples=num_samples)

    expected = frequencies(choices(exact, constraint_models(X), 4096, candidates), candidates)
    convert = lambda m: landmark_copy(m, X, candidates)  # noqa: E731
    actual = frequencies(choices(convert(exact), constraint_models(X, convert), 4096, candidates), candidates)
    assert (candidates[expected > 0, 0] <= 0.5 + 0.1).all()  # the choices are (nearly) feasible
    assert_same_frequencies(actual, expected, 4096)

    X, Y = turbo_data(60)
    exact = fixed_turbo_model(X, Y)
    many = turbo_candidates(exact, X, Y, 1.0, 1500, seed=3)
    factorised.clear()
    torch.manual_seed(0)
    with torch.no_grad():  # replacement=False, as in the SCBO tutorial
        batch = ConstrainedMaxPosteriorSampling(sketched_copy(exact, 16), constraint_models(
            X, lambda m: sketched_copy(m, 16, seed=1)), replacement=False)(many, num_samples=3)
    assert batch.shape == (3, 3) and batch.unique(dim=0).shape[0] == 3
    assert factorised and max(factorised) <= 16


@pytest.mark.parametrize("name", ["UpperConfidenceBound", "qLogExpectedImprovement"])
def test_boltzmann_sampling_is_the_exact_models(name):
    """BoltzmannSampling draws candidates with weights exp(η·standardize(acquisition)): with landmarks the weights
    are the exact model's, and the same seed draws the same points."""
    X, Y = turbo_data(20)
    exact = fixed_turbo_model(X, Y)
    candidates = turbo_candidates(exact, X, Y, 1.0, 100, seed=4)
    build = {"UpperConfidenceBound": lambda m: UpperConfidenceBound(m, beta=0.5),
             "qLogExpectedImprovement": lambda m: qLogExpectedImprovement(
                 m, best_f=Y.max(), sampler=SobolQMCNormalSampler(torch.Size([64]), seed=0))}[name]
    converted = landmark_copy(exact, X, candidates)
    with torch.no_grad():
        values = [build(m)(candidates.unsqueeze(-2)) for m in (exact, converted)]
        torch.testing.assert_close(values[1], values[0], rtol=1e-5, atol=1e-6)
        picks = []
        for model in (exact, converted):
            torch.manual_seed(0)
            picks.append(BoltzmannSampling(build(model), eta=2.0)(candidates, num_samples=16))
    assert values[0].std() > 0.1
    torch.testing.assert_close(picks[1], picks[0], rtol=0, atol=0)


# ----------------------------------------------------------------------------------------------------------------------
# the multi-objective loop (BoTorch's qNEHVI / qNParEGO tutorial)


def two_objectives(X):
    return torch.stack([torch.sin(6 * X).sum(-1), -((X - 0.6) ** 2).sum(-1) * 4], -1)


REF_POINT = [-2.0, -3.0]


def multi_objective_models(X, Y, kind):
    """A ModelListGP of one SingleTaskGP per objective, or one multi-output SingleTaskGP (batched, m = 2), both at
    fixed hyperparameters."""
    if kind == "batched":
        model = SingleTaskGP(X, Y)
        model.covar_module.lengthscale = 0.3
        model.likelihood.noise = 1e-2
        return model.eval()
    models = [SingleTaskGP(X, Y[:, k:k + 1]) for k in range(2)]
    for model, lengthscale in zip(models, (0.3, 0.4)):
        model.covar_module.lengthscale = lengthscale
        model.likelihood.noise = 1e-2
    return ModelListGP(*models).eval()


def convert_multi_objective(model, convert):
    if isinstance(model, ModelListGP):
        return ModelListGP(*[convert(m, k) for k, m in enumerate(model.models)]).eval()
    return convert(model, 0)


def _sampler():
    return SobolQMCNormalSampler(torch.Size([128]), seed=0)


MULTI_OBJECTIVE_ACQUISITIONS = {
    "qLogNEHVI": lambda model, X, Y: qLogNoisyExpectedHypervolumeImprovement(
        model, ref_point=REF_POINT, X_baseline=X, sampler=_sampler()),
    "qLogEHVI": lambda model, X, Y: qLogExpectedHypervolumeImprovement(
        model, ref_point=REF_POINT, sampler=_sampler(),
        partitioning=FastNondominatedPartitioning(ref_point=torch.tensor(REF_POINT, dtype=F64), Y=Y)),
    "qLogNParEGO": lambda model, X, Y: qLogNParEGO(
        model, X_baseline=X, sampler=_sampler(), scalarization_weights=torch.tensor([0.3, 0.7], dtype=F64)),
}


def value_and_grad(acquisition, X):
    X = X.clone().requires_grad_(True)
    value = acquisition(X)
    return value.detach(), torch.autograd.grad(value.sum(), X)[0]


@pytest.mark.parametrize("kind", ["list", "batched"])
@pytest.mark.parametrize("name", list(MULTI_OBJECTIVE_ACQUISITIONS))
def test_multi_objective_acquisition_is_the_exact_models_and_approaches_it_with_random_features(name, kind):
    """Values and gradients at 4 q = 2 batches: the exact model's with landmarks (training points and the batches).
    Random features approach them at the kernel's O(F^-1/2) rate; measured (largest error over the informative
    points, mean over 3 draws, F = 32 / 512 / 4096 / 16384 / 65536): qLogNEHVI and qLogEHVI 0.19–0.60 / 0.04–0.14 /
    0.04–0.11 / 0.01–0.02 / 0.005–0.02, qLogNParEGO (log-improvements of -5 to -11, almost nothing to improve) 1–25 /
    0.4–25 / 0.2–0.6 / 0.14–0.4 / 0.03–0.16; so at F = 16384 within 0.1 (qLogNParEGO 0.5) and twice as close as at
    F = 32.
    With landmarks, values agree to 1e-5; gradients, up to 1e3 in size where qLogNParEGO's improvement is tiny (the
    central differences' too), to 1e-5 of the largest."""
    X = uniform(16, d=2, seed=0)
    Y = two_objectives(X)
    build = MULTI_OBJECTIVE_ACQUISITIONS[name]
    exact = multi_objective_models(X, Y, kind)
    points = 0.3 + 0.5 * uniform(4, 2, d=2, seed=3)
    expected = value_and_grad(build(exact, X, Y), points)
    informative = expected[0] > -15  # qLogNParEGO's log-improvement is about -38 where nothing improves
    assert informative.sum() >= 3 and expected[0][informative].max() - expected[0][informative].min() > 0.5
    landmarks = convert_multi_objective(exact, lambda m, k: landmark_copy(m, X, points))
    actual = value_and_grad(build(landmarks, X, Y), points)
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-4, atol=1e-5)
    scale = expected[1].abs().max()  # up to 1e3 where the log-improvement is tiny (both the central differences')
    torch.testing.assert_close(actual[1], expected[1], rtol=1e-3, atol=1e-5 * scale)
    errors = []
    for width in (32, 16384):
        error = 0.0
        for draw in range(3):
            sketched = convert_multi_objective(exact, lambda m, k: sketched_copy(m, width, seed=k + 2 * draw))
            with torch.no_grad():
                error += float((build(sketched, X, Y)(points) - expected[0])[informative].abs().max()) / 3
        errors.append(error)
    assert errors[1] < (0.5 if name == "qLogNParEGO" else 0.1) and errors[1] < errors[0] / 2


@pytest.mark.parametrize("kind", ["list", "batched"])
def test_multi_objective_loop_with_random_features(kind, factorised):
    """Two iterations of the tutorial's loop at N = 40 > F = 16: fit (SumMarginalLogLikelihood for the list), qLogNEHVI
    optimised with sequential=True for q = 2, the new points observed; the Pareto front's hypervolume does not
    decrease, and nothing larger than F × F is factorised but the cached root of the pruned baseline joined with the
    candidate point (qLogNEHVI's cached-root update, as for the exact model; pruning keeps all 40 points here)."""
    X = uniform(40, d=2, seed=1)
    Y = two_objectives(X)
    ref = torch.tensor(REF_POINT, dtype=F64)
    volumes = [Hypervolume(ref).compute(Y[is_non_dominated(Y)])]
    bounds = torch.tensor([[0.0, 0.0], [1.0, 1.0]], dtype=F64)
    kept = []
    for iteration in range(2):
        if kind == "list":
            models = [SingleTaskGP(X, Y[:, k:k + 1]) for k in range(2)]
            for k, model in enumerate(models):
                model.covar_module = rfgp.sketch(model.covar_module, 16, seed=k + 2 * iteration)
            model = ModelListGP(*models)
            mll = SumMarginalLogLikelihood(model.likelihood, model)
        else:
            model = SingleTaskGP(X, Y)
            model.covar_module = rfgp.sketch(model.covar_module, 16, seed=iteration)
            mll = ExactMarginalLogLikelihood(model.likelihood, model)
        fit_gpytorch_mll(mll, optimizer_kwargs={"options": {"maxiter": 10}})
        torch.manual_seed(iteration)
        acquisition = qLogNoisyExpectedHypervolumeImprovement(model, ref_point=REF_POINT, X_baseline=X,
                                                              sampler=SobolQMCNormalSampler(torch.Size([32]), seed=0))
        kept.append(acquisition.X_baseline.shape[0])
        batch, _ = optimize_acqf(acquisition, bounds, q=2, num_restarts=2, raw_samples=16, sequential=True,
                                 options={"maxiter": 5})
        assert batch.shape == (2, 2) and ((batch >= 0) & (batch <= 1)).all()
        X, Y = torch.cat([X, batch]), torch.cat([Y, two_objectives(batch)])
        volumes.append(Hypervolume(ref).compute(Y[is_non_dominated(Y)]))
    assert volumes[0] > 0 and volumes[2] >= volumes[1] >= volumes[0]
    assert factorised and max(factorised) <= max(16, max(kept) + 1)  # F, or the cached baseline root and a new point


# ----------------------------------------------------------------------------------------------------------------------
# model fitting alternatives


def regression_data(n=20, seed=0):
    X = uniform(n, d=2, seed=seed)
    noise = 0.05 * torch.randn(n, 1, generator=torch.Generator().manual_seed(seed + 100), dtype=F64)
    return X, torch.sin(6 * X).sum(-1, keepdim=True) + noise


def fitted_hyperparameters(model):
    """The model's constrained hyperparameters by name, a Nyström map's base kernel named as the kernel itself."""
    values = {name.replace("base_kernel.", ""): (parameter if constraint is None else constraint.transform(parameter))
              for name, parameter, constraint in model.named_parameters_and_constraints()}
    return torch.cat([values[name].detach().reshape(-1) for name in sorted(values)])


@pytest.mark.parametrize("optimizer", ["torch", "scipy with options"])
def test_fit_alternatives_follow_the_exact_models_path(optimizer):
    """fit_gpytorch_mll(..., optimizer=fit_gpytorch_mll_torch, optimizer_kwargs={"step_limit": 20}) (Adam) and the
    default L-BFGS-B with optimizer_kwargs={"options": {"maxiter": 15}}: with the training points as landmarks the
    marginal likelihood and its gradient are the exact model's at every step, so both fits end at the exact model's
    hyperparameters."""
    X, Y = regression_data()
    kwargs = ({"optimizer": fit_gpytorch_mll_torch, "optimizer_kwargs": {"step_limit": 20}} if optimizer == "torch"
              else {"optimizer_kwargs": {"options": {"maxiter": 15}}})
    fitted = []
    for convert in (False, True):
        model = SingleTaskGP(X, Y)
        if convert:
            model.covar_module = nystrom(model.covar_module, X)
        before = fitted_hyperparameters(model)
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), **kwargs)
        fitted.append(fitted_hyperparameters(model))
    assert (fitted[0] - before).abs().max() > 1e-2  # the fit moved
    torch.testing.assert_close(fitted[1], fitted[0], rtol=1e-5, atol=1e-7)


def test_torch_optimizer_fit_factorises_nothing_larger_than_the_features(factorised):
    X, Y = regression_data(200)
    model = SingleTaskGP(X, Y)
    model.covar_module = rfgp.sketch(model.covar_module, 24, method="orf", seed=0)
    loss = []
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), optimizer=fit_gpytorch_mll_torch,
                     optimizer_kwargs={"step_limit": 20, "callback": lambda parameters, result: loss.append(
                         float(result.fval))})
    assert factorised and max(factorised) <= 24
    assert len(loss) == 20 and loss[-1] < loss[0]


@pytest.mark.parametrize("observation_noise", [False, True])
def test_fold_batched_cross_validation_is_the_exact_models(observation_noise):
    """batch_cross_validation over gen_loo_cv_folds fits one model with a fold batch shape (n folds of n − 1 points):
    a Nyström map of the batched default kernel, all points as landmarks, gives the exact model's fit and held-out
    posteriors; random features under the fold batch give each fold the GP of its own sketched kernel."""
    X, Y = regression_data(12)
    folds = gen_loo_cv_folds(X, Y)
    fit = {"optimizer": fit_gpytorch_mll_torch, "optimizer_kwargs": {"step_limit": 15}}

    def cross_validation(covar_module):
        return batch_cross_validation(SingleTaskGP, ExactMarginalLogLikelihood, folds, fit_args=fit,
                                      observation_noise=observation_noise,
                                      model_init_kwargs={"covar_module": covar_module})

    def batched_kernel():
        return get_covar_module_with_dim_scaled_prior(ard_num_dims=2, batch_shape=torch.Size([12]))

    expected = cross_validation(batched_kernel())
    actual = cross_validation(nystrom(batched_kernel(), X))
    assert expected.posterior.mean.shape == actual.posterior.mean.shape == (12, 1, 1)
    torch.testing.assert_close(actual.model.covar_module.base_kernel.lengthscale,
                               expected.model.covar_module.lengthscale, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(actual.posterior.mean, expected.posterior.mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(actual.posterior.variance, expected.posterior.variance, rtol=1e-5, atol=1e-7)

    sketched = cross_validation(rfgp.sketch(batched_kernel(), 16, method="orf", seed=0))
    model = sketched.model
    assert model.covar_module.lengthscale.shape == (12, 1, 2)  # a lengthscale per fold
    with torch.no_grad():
        x, y = model.train_inputs[0], model.train_targets.unsqueeze(-1)  # (12, 11, 2), standardised per fold
        noise = model.likelihood.noise.unsqueeze(-1)
        train = model.covar_module(x).to_dense() + noise * torch.eye(11, dtype=F64)
        cross = model.covar_module(folds.test_X, x).to_dense()
        mean = cross @ torch.linalg.solve(train, y - model.mean_module.constant.unsqueeze(-1).unsqueeze(-1))
        mean = mean + model.mean_module.constant.unsqueeze(-1).unsqueeze(-1)
        variance = model.covar_module(folds.test_X, diag=True) - (cross @ torch.linalg.solve(train, cross.mT)).squeeze(
            -1).squeeze(-1).unsqueeze(-1)
        if observation_noise:
            variance = variance + model.likelihood.noise
        stdvs, means = model.outcome_transform.stdvs, model.outcome_transform.means
    torch.testing.assert_close(sketched.posterior.mean, means + stdvs * mean, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(sketched.posterior.variance.squeeze(-1), stdvs.squeeze(-1) ** 2 * variance,
                               rtol=1e-8, atol=1e-10)


def test_efficient_loo_cv_is_the_exact_models():
    """loo_cv (BoTorch's closed-form leave-one-out, [K⁻¹]ᵢᵢ from the dense N × N factor, for any kernel) gives the
    exact model's held-out means and variances with the training points as landmarks."""
    X, Y = regression_data(15)
    exact = SingleTaskGP(X, Y)
    exact.covar_module.lengthscale = 0.3
    exact.likelihood.noise = 1e-2
    exact.eval()
    expected, actual = loo_cv(exact), loo_cv(landmark_copy(exact, X))
    torch.testing.assert_close(actual.posterior.mean, expected.posterior.mean, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(actual.posterior.variance, expected.posterior.variance, rtol=1e-6, atol=1e-8)
    torch.testing.assert_close(actual.observed_Y, expected.observed_Y)


def test_map_saas_ensemble_is_the_exact_models_and_fits_with_random_features():
    """EnsembleMapSaasSingleTaskGP: a batch of num_taus Matérn-5/2 models with fixed SAAS shrinkages τ, one mixture
    posterior.  Its kernel converts under the ensemble batch shape with each member's τ and prior; with landmarks its
    mixture posterior and marginal likelihood are the exact ensemble's; with random features it fits."""
    X, Y = regression_data(15)
    taus = torch.tensor([0.05, 0.1, 0.3], dtype=F64)
    exact = EnsembleMapSaasSingleTaskGP(X, Y, num_taus=3, taus=taus)
    exact.covar_module.base_kernel.lengthscale = torch.tensor([[[0.3, 0.5]], [[0.4, 0.4]], [[0.6, 0.2]]], dtype=F64)
    exact.eval()
    converted = landmark_copy(exact, X)
    sketched = sketched_copy(exact, 32)
    xs = uniform(6, d=2, seed=3)
    with torch.no_grad():
        expected, actual = exact.posterior(xs), converted.posterior(xs)
        # outputscale 10 and noise 1e-2: the Nyström factor's round-off (1e-8 of K) amplified up to 1e3-fold; seen 3e-6
        torch.testing.assert_close(actual.mixture_mean, expected.mixture_mean, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(actual.mixture_variance, expected.mixture_variance, rtol=1e-5, atol=1e-6)
        for model in (exact, converted):
            model.train()
        mlls = [ExactMarginalLogLikelihood(m.likelihood, m)(m(*m.train_inputs), m.train_targets).sum()
                for m in (exact, converted)]
    torch.testing.assert_close(mlls[1], mlls[0], rtol=1e-6, atol=1e-6)  # seen 2e-7, the same round-off
    log_priors = [sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in m.named_priors())
                  for m in (exact, sketched)]  # the SAAS prior HC(1) on τ/ℓ² with each member's fixed τ
    torch.testing.assert_close(log_priors[1], log_priors[0], rtol=1e-12, atol=1e-12)
    sketched.train()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(sketched.likelihood, sketched),
                     optimizer_kwargs={"options": {"maxiter": 20}})
    with torch.no_grad():
        posterior = sketched.posterior(xs)
    assert posterior.mixture_mean.shape == (6, 1) and torch.isfinite(posterior.mixture_variance).all()



@pytest.mark.parametrize("tau", [None, 0.1])
def test_saas_prior_added_to_a_sketched_kernel_is_the_converted_saas_kernel(tau):
    """add_saas_prior on an rfgp kernel (the user sketches first) registers the same τ, constraint and priors as on
    the exact kernel converted afterwards (test_botorch_priors.py): both fit to the same hyperparameters."""
    from botorch.models.map_saas import add_saas_prior

    X, Y = regression_data(30)
    fitted = []
    for sketch_first in (True, False):
        base = MaternKernel(nu=2.5, ard_num_dims=2)
        if sketch_first:
            base = rfgp.sketch(base, 64, seed=0)
        add_saas_prior(base, tau=tau)
        if not sketch_first:
            base = rfgp.sketch(base, 64, seed=0)
        model = SingleTaskGP(X, Y, covar_module=ScaleKernel(base))
        assert isinstance(model.covar_module.base_kernel, rfgp.kernels.SketchedMaternKernel)
        priors = sorted(name for name, *_ in model.named_priors())
        fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model),
                         optimizer_kwargs={"options": {"maxiter": 20}})
        fitted.append((priors, fitted_hyperparameters(model)))
    assert fitted[0][0] == fitted[1][0] and any("tau" in name for name in fitted[0][0]) == (tau is None)
    torch.testing.assert_close(fitted[0][1], fitted[1][1], rtol=1e-6, atol=1e-8)


def test_ensemble_baseline_pruning_samples_through_the_root(factorised):
    """qLogNEI on an EnsembleMapSaasSingleTaskGP prunes X_baseline from samples of its GaussianMixturePosterior (3
    members, averaged over them): at N = 200 > F = 16 these are drawn as R_k·ε from the members' roots with one ε for
    all members, as BoTorch's samplers share their base samples over the members — before, through BoTorch's dense
    200 × 200 Cholesky factor per member.  Identical members (the unfitted ensemble) thus give identical samples, and
    the probability of each point being the best of the member average agrees with BoTorch's within 4 standard errors
    (independent draws per member: 0.04 instead of 0.16 for the second most likely point); members with different
    lengthscales each keep their own posterior (means and variances within 4 standard errors)."""
    from botorch.acquisition import qLogNoisyExpectedImprovement

    from rfgp.integrations.botorch_pruning import SharedRootSampler, _botorch_get_sampler, _get_sampler

    X, Y = turbo_data(200)
    ensemble = EnsembleMapSaasSingleTaskGP(X, Y, num_taus=3, taus=torch.tensor([0.05, 0.1, 0.3], dtype=F64))
    ensemble.covar_module = rfgp.sketch(ensemble.covar_module, 16, method="orf", seed=0)
    ensemble.eval()
    factorised.clear()
    torch.manual_seed(0)
    kept = qLogNoisyExpectedImprovement(ensemble, X_baseline=X).X_baseline
    assert 1 <= kept.shape[0] <= 20
    assert factorised and max(factorised) <= 16
    shape = torch.Size([8192])
    with torch.no_grad():
        posterior = ensemble.posterior(X[:100])
        assert isinstance(_get_sampler(posterior, shape), SharedRootSampler)
        torch.manual_seed(1)
        ours = _get_sampler(posterior=posterior, sample_shape=shape)(posterior).squeeze(-1)
        botorchs = _botorch_get_sampler(posterior=posterior, sample_shape=shape)(posterior).squeeze(-1)
    assert ours.shape == botorchs.shape == (8192, 3, 100)
    torch.testing.assert_close(ours[:, 1:], ours[:, :1].expand(-1, 2, -1), rtol=0, atol=0)
    counts = [torch.bincount(s.mean(-2).argmax(-1), minlength=100).to(F64) / 8192 for s in (ours, botorchs)]
    assert counts[1].max() > 0.1 and counts[1].sort().values[-2] > 0.1
    assert_same_frequencies(counts[0], counts[1], 8192)

    ensemble.covar_module.base_kernel.lengthscale = torch.tensor([[[0.3, 0.5, 0.4]], [[0.6, 0.2, 1.0]],
                                                                  [[1.5, 1.5, 0.1]]], dtype=F64)
    with torch.no_grad():
        posterior = ensemble.posterior(X[:30])
        samples = _get_sampler(posterior=posterior, sample_shape=shape)(posterior).squeeze(-1)
        mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert (variance[0] - variance[2]).abs().max() > 1e-3  # the members differ
    assert ((samples.mean(0) - mean).abs() <= 4 * (variance / 8192).sqrt()).all()
    assert ((samples.var(0) - variance).abs() <= 4 * variance * (2 / 8192) ** 0.5).all()
