"""rfgp.sketch on kernel trees: total width ≤ F (sums split F, products keep it), per-part widths,
RBF×Matérn on same/disjoint dims, polynomial×RBF, the Hadamard multitask pattern, the Mauna Loa and
locally periodic trees, hyperparameters and priors carried, a trained exact
tree predicting like its conversion, state_dict round trips."""

import copy
import math
import warnings

import gpytorch
import pytest
import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import (
    AdditiveKernel,
    ConstantKernel,
    IndexKernel,
    LinearKernel,
    MaternKernel,
    PeriodicKernel,
    PolynomialKernel,
    ProductKernel,
    RBFKernel,
    RQKernel,
    ScaleKernel,
)
from gpytorch.priors import GammaPrior, LogNormalPrior

import rfgp
from rfgp.kernels import (
    FeatureProductKernel,
    FeatureSumKernel,
    IndexFeatureKernel,
    MaclaurinRBFKernel,
    SketchedProductKernel,
    SpectralProductKernel,
    has_spectral_protocol,
    kernel_features,
)
from rfgp.models import ExactGPModel

F64 = torch.float64


def mauna_loa_tree():
    """The classic CO2 tree: long-term trend + locally periodic seasonality + medium-term irregularities."""
    trend = ScaleKernel(RBFKernel(lengthscale_prior=GammaPrior(4.0, 0.1)))
    seasonal = ScaleKernel(ProductKernel(PeriodicKernel(), RBFKernel()))
    irregular = ScaleKernel(RQKernel())
    trend.base_kernel.lengthscale = 50.0
    seasonal.base_kernel.kernels[0].period_length = 1.0
    seasonal.base_kernel.kernels[0].lengthscale = 1.5
    seasonal.base_kernel.kernels[1].lengthscale = 90.0
    irregular.base_kernel.lengthscale = 1.2
    irregular.base_kernel.alpha = 0.8
    trend.outputscale, seasonal.outputscale, irregular.outputscale = 40.0, 4.0, 0.5
    return trend + seasonal + irregular


def width(kernel, x) -> int:
    return kernel_features(kernel, x).shape[-1]


# ---------------------------------------------------------------------------------------- widths
def trees():
    a, b = RBFKernel(active_dims=[0]), MaternKernel(nu=1.5, active_dims=[1])
    return {
        "sum": ScaleKernel(a) + ScaleKernel(b),
        "product": ScaleKernel(RBFKernel() * MaternKernel(nu=0.5)),
        "sum of products": ScaleKernel(RBFKernel() * MaternKernel()) + RBFKernel() + PolynomialKernel(2) * RBFKernel(),
        "nested sum": AdditiveKernel(RBFKernel(), AdditiveKernel(MaternKernel(), RBFKernel())),
        "hadamard": ProductKernel(RBFKernel(active_dims=[0]), IndexKernel(num_tasks=3, rank=1, active_dims=[1])),
    }


@pytest.mark.parametrize("name", list(trees()))
@pytest.mark.parametrize("num_features", [64, 101, 512])
def test_converted_width_is_at_most_f_and_reported(name, num_features):
    sketched = rfgp.sketch(trees()[name], num_features=num_features, seed=0)
    x = torch.cat((torch.randn(5, 1), torch.randint(0, 3, (5, 1)).float()), dim=-1)
    reported = rfgp.kernels.kernel_num_features(sketched)
    assert reported == width(sketched, x) <= num_features
    assert reported >= num_features - 4 * 3  # the split loses at most a pair per part (or the Kronecker remainder)


def test_sums_split_f_equally_in_even_shares_and_products_keep_it():
    sketched = rfgp.sketch(trees()["sum of products"], num_features=100, seed=0)
    widths = [rfgp.kernels.kernel_num_features(k) for k in sketched.kernels]
    assert widths == [34, 34, 32]
    assert isinstance(sketched.kernels[0].base_kernel, SpectralProductKernel)
    assert isinstance(sketched.kernels[2], SketchedProductKernel)
    # exact finite parts take their own width first (IndexKernel: rank + num_tasks)
    with_tasks = AdditiveKernel(RBFKernel(active_dims=[0]), MaternKernel(active_dims=[0]),
                                IndexKernel(num_tasks=3, rank=1, active_dims=[1]))
    widths = [rfgp.kernels.kernel_num_features(k) for k in rfgp.sketch(with_tasks, num_features=64, seed=0).kernels]
    assert widths == [30, 30, 4]


def test_per_part_widths_and_their_errors():
    tree = trees()["sum of products"]
    sketched = rfgp.sketch(tree, num_features=[256, 64, 128], seed=0)
    assert [rfgp.kernels.kernel_num_features(k) for k in sketched.kernels] == [256, 64, 128]
    nested = rfgp.sketch(trees()["nested sum"], num_features=[32, [16, 64]], seed=0)
    assert nested.num_features == 112 and nested.kernels[1].kernels[1].num_features == 64
    with pytest.raises(ValueError, match=r"num_features=\[256, 64\] has 2 widths but the AdditiveKernel has 3 parts"):
        rfgp.sketch(tree, num_features=[256, 64])
    with pytest.raises(ValueError, match=r"num_features=\[256, 0, 64\]: every width must be a positive int, got 0"):
        rfgp.sketch(tree, num_features=[256, 0, 64])
    with pytest.raises(ValueError, match=r"every width must be a positive int, got 12.5"):
        rfgp.sketch(tree, num_features=[256, 12.5, 64])
    with pytest.raises(ValueError, match=r"gives per-part widths of an AdditiveKernel, but it reached a ProductKernel"):
        rfgp.sketch(tree, num_features=[256, 64, [32, 32]])
    with pytest.raises(ValueError, match=r"num_features=4 is too small for this AdditiveKernel"):
        rfgp.sketch(tree, num_features=4)
    with pytest.raises(ValueError, match=r"num_features: every width must be a positive int, got -8"):
        rfgp.sketch(trees()["product"], num_features=-8)



@pytest.mark.parametrize("tree, num_features, match, enough", [
    (lambda: LinearKernel(ard_num_dims=3) + RBFKernel(), [1, 64], r"num_features=\[1, 64\]: LinearKernel has exactly 3",
     [3, 64]),
    (lambda: ScaleKernel(IndexKernel(num_tasks=5, rank=2, active_dims=[0])) + RBFKernel(active_dims=[1]), [2, 64],
     r"num_features=\[2, 64\]: IndexKernel has exactly 7", [7, 64]),
    (lambda: LinearKernel(ard_num_dims=3) + ConstantKernel(), 2,
     r"num_features=2 is too small for this AdditiveKernel: its exact parts take 4 features", 4),
])
def test_exact_parts_wider_than_their_width_raise(tree, num_features, match, enough):
    """A converted sum is at most F wide (F the sum of a list's entries): an exact part (Linear, Index, Constant,
    Cosine features) cannot be cut below its width, so a width too small for it raises, as a SpectralDeltaKernel's
    does; before, [1, 64] for Linear(d=3) + RBF gave a 67-wide tree, Linear(d=3) + Constant at F=2 a 4-wide one."""
    with pytest.raises(ValueError, match=match):
        rfgp.sketch(tree(), num_features=num_features, seed=0)
    total = sum(enough) if isinstance(enough, list) else enough
    assert rfgp.kernels.kernel_num_features(rfgp.sketch(tree(), num_features=enough, seed=0)) == total


# --------------------------------------------------------------------------- products vs exact
def relative_error(sketched, exact, x) -> float:
    target = exact(x).to_dense().detach()
    return float((sketched(x).to_dense().detach() - target).norm() / target.norm())


@pytest.mark.parametrize("dims", ["same", "disjoint"])
def test_rbf_times_matern_converts_to_one_spectral_product(dims):
    active = ([0, 1], [0, 1]) if dims == "same" else ([0], [1])
    exact = ScaleKernel(ProductKernel(RBFKernel(active_dims=active[0], ard_num_dims=len(active[0])),
                                      MaternKernel(nu=2.5, active_dims=active[1]))).double()
    exact.base_kernel.kernels[0].lengthscale = torch.tensor([[0.7] * len(active[0])])
    exact.outputscale = 2.5
    x = torch.randn(40, 2, dtype=F64)
    errors = []
    for num_features in (64, 4096):
        sketched = rfgp.sketch(exact, num_features=num_features, seed=1).double()
        assert isinstance(sketched.base_kernel, SpectralProductKernel)
        assert width(sketched, x) == num_features
        errors.append(relative_error(sketched, exact, x))
    # relative Frobenius error falls like F^-1/2: 64× the width, ≈ 8× smaller
    assert errors[1] < errors[0] / 4 and errors[1] < 0.1, errors


def test_polynomial_times_rbf_uses_tensor_srht_at_width_f():
    exact = ProductKernel(PolynomialKernel(2), RBFKernel()).double()
    x = torch.nn.functional.normalize(torch.randn(30, 3, dtype=F64), dim=-1)
    errors = []
    for num_features in (64, 2048):
        sketched = rfgp.sketch(exact, num_features=num_features, seed=0).double()
        assert isinstance(sketched, SketchedProductKernel) and width(sketched, x) == num_features
        errors.append(relative_error(sketched, exact, x))
    assert errors[1] < errors[0] / 3 and errors[1] < 0.15, errors


def test_scale_kernel_inside_a_product_folds_into_the_amplitude():
    inner = ScaleKernel(RBFKernel())
    inner.outputscale = 3.0
    exact = ProductKernel(inner, MaternKernel(nu=0.5)).double()
    sketched = rfgp.sketch(exact, num_features=32, seed=0).double()
    assert isinstance(sketched, SpectralProductKernel) and isinstance(sketched.kernels[0], ScaleKernel)
    x = torch.randn(4, 2, dtype=F64)
    torch.testing.assert_close(sketched(x, diag=True), torch.full((4,), 3.0, dtype=F64))


# ------------------------------------------------------------------------------ Hadamard multitask
def test_index_kernel_in_a_product_is_exact_in_the_task_part():
    exact = ProductKernel(RBFKernel(active_dims=[0]), IndexKernel(num_tasks=3, rank=2, active_dims=[1],
                                                                  prior=LogNormalPrior(0.0, 1.0))).double()
    sketched = rfgp.sketch(exact, num_features=100, seed=0).double()
    assert isinstance(sketched, FeatureProductKernel)
    rff, tasks = sketched.kernels
    assert isinstance(tasks, IndexFeatureKernel) and tasks.num_features == 5 and rff.num_features == 20
    assert torch.equal(tasks.covar_factor, exact.kernels[1].covar_factor)
    assert [n for n, *_ in sketched.named_priors()] == ["kernels.1.IndexKernelPrior"]
    x = torch.cat((torch.randn(8, 1, dtype=F64), torch.randint(0, 3, (8, 1)).to(F64)), dim=-1)
    task_gram = exact.kernels[1](x).to_dense().detach()
    torch.testing.assert_close(tasks(x).to_dense().detach(), task_gram)
    torch.testing.assert_close(sketched(x).to_dense().detach(), (rff(x).to_dense() * task_gram).detach())


class HadamardGP(gpytorch.models.ExactGP):
    """GPyTorch's Hadamard multitask model: covar_x(x) * covar_i(i)."""

    def __init__(self, x, i, y, covar_module):
        super().__init__((x, i), y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module
        self.task_covar_module = IndexKernel(num_tasks=2, rank=1)

    def forward(self, x, i):
        covar = self.covar_module(x).mul(self.task_covar_module(i))
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), covar)


@pytest.mark.parametrize("sketch_tasks", [False, True], ids=["data kernel", "data and task kernels"])
def test_hadamard_multitask_model_with_a_converted_data_kernel_predicts_like_the_exact_one(sketch_tasks):
    torch.manual_seed(0)
    x = torch.rand(60, 1, dtype=F64)
    i = torch.randint(0, 2, (60, 1))  # int64 task indices, as in GPyTorch's tutorial
    y = torch.sin(6 * x).squeeze(-1) + 0.5 * i.squeeze(-1) + 0.05 * torch.randn(60, dtype=F64)
    exact = HadamardGP(x, i, y, RBFKernel()).double()
    exact.covar_module.lengthscale = 0.3
    sketched = HadamardGP(x, i, y, rfgp.sketch(RBFKernel(), num_features=4096, seed=0)).double()
    if sketch_tasks:
        sketched.task_covar_module = rfgp.sketch(IndexKernel(num_tasks=2, rank=1), num_features=3).double()
    sketched.load_state_dict(exact.state_dict(), strict=False)
    if sketch_tasks:
        torch.testing.assert_close(sketched.task_covar_module(i).to_dense(), exact.task_covar_module(i).to_dense())
    x_test, i_test = torch.linspace(0, 1, 7, dtype=F64).unsqueeze(-1), torch.tensor([[0], [1]] * 3 + [[0]])
    means = []
    for model in (exact, sketched):
        model.eval()
        with torch.no_grad():
            means.append(model.likelihood(model(x_test, i_test)).mean)
    assert float((means[0] - means[1]).abs().max()) < 0.05


# --------------------------------------------------------------- hyperparameters, training, state
def exact_tree():
    trend = ScaleKernel(RBFKernel(lengthscale_prior=GammaPrior(3.0, 2.0), lengthscale_constraint=Interval(0.05, 10.0)),
                        outputscale_prior=LogNormalPrior(0.0, 1.0))
    local = ScaleKernel(ProductKernel(MaternKernel(nu=2.5), RBFKernel()))
    local.base_kernel.kernels[0].lengthscale = 0.15
    local.base_kernel.kernels[1].lengthscale = 0.6
    return trend + local


def test_hyperparameters_constraints_and_priors_carry_over():
    exact = exact_tree()
    sketched = rfgp.sketch(exact, num_features=256, seed=0)
    exact_values = dict(exact.named_hyperparameters())
    sketched_values = dict(sketched.named_hyperparameters())
    assert exact_values.keys() == sketched_values.keys()
    for name, value in sketched_values.items():
        assert torch.equal(value, exact_values[name]), name
    assert {n: type(p) for n, _, p, *_ in sketched.named_priors()} == {
        n: type(p) for n, _, p, *_ in exact.named_priors()}
    constraint = sketched.kernels[0].base_kernel.raw_lengthscale_constraint
    assert isinstance(constraint, Interval) and float(constraint.upper_bound) == 10.0




def test_priors_registered_on_a_sum_or_product_carry_over():
    """A prior on an AdditiveKernel or an order-keeping ProductKernel (its closure reads m.kernels[i]) is carried with
    the same log-density (it was refused as lost); a product that reorders its factors still refuses it by name."""
    total = ScaleKernel(RBFKernel()) + ScaleKernel(MaternKernel())
    total.register_prior("total_prior", LogNormalPrior(0.0, 1.0),
                         lambda m: m.kernels[0].outputscale + m.kernels[1].outputscale)
    product = ProductKernel(RBFKernel(), PeriodicKernel())
    product.register_prior("product_prior", GammaPrior(2.0, 1.0), lambda m: m.kernels[1].period_length)
    for exact in (total, product, AdditiveKernel(product, LinearKernel(ard_num_dims=1))):
        sketched = rfgp.sketch(exact, num_features=256, seed=0)
        terms = {name: prior.log_prob(closure(module)) for name, module, prior, closure, _ in exact.named_priors()}
        for name, module, prior, closure, _ in sketched.named_priors():
            torch.testing.assert_close(prior.log_prob(closure(module)), terms.pop(name))
        assert terms == {}
    reordered = ProductKernel(LinearKernel(ard_num_dims=1), RBFKernel(), PolynomialKernel(power=2))
    reordered.register_prior("product_prior", GammaPrior(2.0, 1.0), lambda m: m.kernels[1].lengthscale)
    with pytest.raises(TypeError, match="product_prior"):
        rfgp.sketch(reordered, num_features=256, seed=0)


def test_fixed_hyperparameters_stay_fixed():
    """A hyperparameter the user fixed with requires_grad_(False) is not trained after conversion either (it came
    back trainable, so an optimiser over model.parameters() silently moved it)."""
    exact = (ScaleKernel(RBFKernel(ard_num_dims=2)) + ScaleKernel(PeriodicKernel() * RQKernel())
             + LinearKernel(ard_num_dims=2) + gpytorch.kernels.SpectralMixtureKernel(num_mixtures=2, ard_num_dims=2)
             + ProductKernel(RBFKernel(active_dims=[0]), IndexKernel(3, rank=1, active_dims=[1])))
    fixed = {name for i, (name, parameter) in enumerate(exact.named_parameters()) if i % 2 == 0}
    for name, parameter in exact.named_parameters():
        parameter.requires_grad_(name not in fixed)
    sketched = rfgp.sketch(exact, num_features=256, seed=0)
    trainable = {name for name, parameter in sketched.named_parameters() if parameter.requires_grad}
    assert dict(sketched.named_parameters()).keys() == dict(exact.named_parameters()).keys()
    assert trainable == {name for name, _ in exact.named_parameters()} - fixed


def test_a_module_used_twice_keeps_one_set_of_hyperparameters():
    """One RBF in a sum and in a product, one scaled Matérn alone and inside another ScaleKernel: the exact tree has
    one lengthscale each (6 parameters), and so has the converted one (it had 9, trained apart)."""
    rbf, scaled = RBFKernel(lengthscale_prior=GammaPrior(3.0, 6.0)), ScaleKernel(MaternKernel(nu=2.5))
    exact = AdditiveKernel(rbf, ProductKernel(rbf, PeriodicKernel()), scaled, ScaleKernel(scaled))
    sketched = rfgp.sketch(exact, num_features=512, seed=0)
    assert dict(sketched.named_parameters()).keys() == dict(exact.named_parameters()).keys()
    assert len(list(sketched.parameters())) == len(list(exact.parameters())) == 6
    with torch.no_grad():
        sketched.kernels[0].lengthscale = 0.3
        scaled.base_kernel.lengthscale = 0.7  # the exact module, not the conversions
    rbfs = [m for m in sketched.modules() if type(m).__name__ == "SketchedRBFKernel"]
    lengthscales = [float(m.lengthscale.detach()) for m in rbfs]
    assert lengthscales == pytest.approx([0.3, 0.3])
    matern = sketched.kernels[2].base_kernel
    assert sketched.kernels[3].base_kernel.base_kernel.raw_lengthscale is matern.raw_lengthscale
    assert len(list(sketched.named_priors())) == len(list(exact.named_priors())) == 2  # GPyTorch counts it twice
    x = torch.rand(8, 1, generator=torch.Generator().manual_seed(0))
    rbf.lengthscale = 0.3
    sketched.load_state_dict(exact.state_dict(), strict=False)  # both occurrences carry the same value
    copy_ = copy.deepcopy(sketched)
    assert copy_.kernels[1].kernels[0].raw_lengthscale is copy_.kernels[0].raw_lengthscale
    error = (sketched(x).to_dense() - exact(x).to_dense()).norm() / exact(x).to_dense().norm()
    assert error < 0.2


@pytest.mark.parametrize("build", [lambda k: k * k, lambda k: k + k, lambda k: (k * k) + ScaleKernel(k * k),
                                   lambda k: ScaleKernel(k * k * MaternKernel(nu=2.5)) + k])
def test_a_module_held_twice_by_one_parent_carries_its_prior_as_often_as_gpytorch_counts_it(build):
    """GPyTorch's named_priors lists a child held twice by the same parent once (k * k has one prior term): the
    conversion, two occurrences with independent draws and one lengthscale, keeps the prior on the first of them
    (it was refused as a prior that "cannot carry over"); under two parents the prior counts twice, as in GPyTorch."""
    rbf = RBFKernel(lengthscale_prior=GammaPrior(3.0, 6.0))
    exact = build(rbf)
    sketched = rfgp.sketch(exact, num_features=256, seed=0)
    names = [name for name, *_ in exact.named_priors()]
    assert [name for name, *_ in sketched.named_priors()] == names
    occurrences = [m for m in sketched.modules() if type(m).__name__ == "SketchedRBFKernel"]
    assert len(occurrences) > len(names) and all(m.raw_lengthscale is occurrences[0].raw_lengthscale
                                                  for m in occurrences)
    with torch.no_grad():
        rbf.lengthscale = 0.4
        occurrences[0].lengthscale = 0.4
    log_prior = [sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in tree.named_priors())
                 for tree in (exact, sketched)]
    assert float(log_prior[1]) == pytest.approx(float(log_prior[0]), rel=1e-12)
    restored = rfgp.sketch(exact, num_features=256, seed=0)
    restored.load_state_dict(sketched.state_dict())
    assert [name for name, *_ in restored.named_priors()] == names


def test_trained_exact_tree_converted_predicts_like_the_exact_model():
    torch.manual_seed(0)
    x = torch.rand(80, 1, dtype=F64)
    y = (torch.sin(12 * x) * torch.exp(-x) + x).squeeze(-1) + 0.05 * torch.randn(80, dtype=F64)
    exact = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), exact_tree()).double()
    optimizer = torch.optim.Adam(exact.parameters(), lr=0.05)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(exact.likelihood, exact)
    exact.train()
    for _ in range(40):
        optimizer.zero_grad()
        (-mll(exact(x), y)).backward()
        optimizer.step()
    sketched = ExactGPModel(x, y, exact.likelihood, rfgp.sketch(exact.covar_module, num_features=2048, seed=0)).double()
    sketched.mean_module.load_state_dict(exact.mean_module.state_dict())
    x_test = torch.linspace(0, 1.1, 25, dtype=F64).unsqueeze(-1)
    predictions = []
    for model in (exact, sketched):
        model.eval()
        with torch.no_grad():
            predictions.append(model.likelihood(model(x_test)))
    (exact_pred, sketched_pred) = predictions
    assert isinstance(sketched.prediction_strategy, rfgp.FeatureSpacePredictionStrategy)
    assert float((exact_pred.mean - sketched_pred.mean).abs().max()) < 0.1 * float(y.std())
    ratio = sketched_pred.variance / exact_pred.variance
    assert float(ratio.min()) > 0.7 and float(ratio.max()) < 1.3


def test_state_dict_round_trip_of_a_converted_tree():
    x = torch.randn(6, 2, dtype=F64)
    tree = exact_tree() + PolynomialKernel(2) * RBFKernel()
    original = rfgp.sketch(tree, num_features=96, seed=0).double()
    expected = original(x).to_dense().detach()
    restored = rfgp.sketch(tree, num_features=96, seed=7).double()
    restored.load_state_dict(original.state_dict())
    torch.testing.assert_close(restored(x).to_dense().detach(), expected, rtol=0, atol=0)


# ---------------------------------------------------------------- Periodic / RQ trees
def test_locally_periodic_product_is_unbiased_at_width_f():
    periodic = PeriodicKernel()
    periodic.period_length, periodic.lengthscale = 0.7, 1.2
    exact = ScaleKernel(ProductKernel(periodic, RBFKernel())).double()
    exact.base_kernel.kernels[1].lengthscale = 2.0
    x = torch.linspace(-2, 2, 6, dtype=F64).unsqueeze(-1)
    estimates = []
    for seed in range(150):
        sketched = rfgp.sketch(exact, num_features=32, seed=seed).double()
        assert rfgp.kernels.kernel_num_features(sketched) <= 32
        estimates.append(sketched(x).to_dense().detach())
    # periodic and RBF both have the spectral protocol: one convolved set of harmonics + Gaussian frequencies
    assert isinstance(sketched.base_kernel, SpectralProductKernel)
    assert all(has_spectral_protocol(k) for k in sketched.base_kernel.kernels)
    estimates = torch.stack(estimates)
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(len(estimates))
    target = exact(x).to_dense().detach()
    assert bool(((mean - target).abs() <= 4 * se + 1e-8).all())


def test_mauna_loa_tree_converts_at_width_f_and_approximates_the_exact_gram():
    exact = mauna_loa_tree().double()
    x = torch.linspace(0, 30, 60, dtype=F64).unsqueeze(-1)
    sketched = rfgp.sketch(exact, num_features=4096, seed=0).double()
    assert isinstance(sketched, FeatureSumKernel) and len(sketched.kernels) == 3
    assert rfgp.kernels.kernel_num_features(sketched) <= 4096
    assert dict(exact.named_hyperparameters()).keys() == dict(sketched.named_hyperparameters()).keys()
    assert relative_error(sketched, exact, x) < 0.05


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, F64])
def test_index_feature_kernel_takes_integer_and_integral_float_indices_of_any_dtype(dtype):
    exact = IndexKernel(num_tasks=3, rank=1).double()
    tasks = rfgp.sketch(exact, num_features=4).double()
    indices = torch.tensor([[0], [2], [1], [2]]).to(dtype)
    torch.testing.assert_close(tasks(indices).to_dense(), exact(indices).to_dense())


@pytest.mark.parametrize("bad, match", [
    (torch.tensor([[0.5]]), "the task indices must hold task indices 0..2 .* got 0.5 at index \\(0, 0\\)"),
    (torch.tensor([[0], [3]]), "got 3(\\.0)? at index \\(1, 0\\)"),
    (torch.tensor([[-1.0]]), "got -1.0"),
    (torch.tensor([[float("nan")]]), "got nan|contains NaN"),  # a product's input check finds it first
])
def test_index_feature_kernel_refuses_what_is_not_a_task_index(bad, match):
    tasks = rfgp.sketch(IndexKernel(num_tasks=3, rank=1), num_features=4)
    with pytest.raises(ValueError, match=match):
        tasks(bad).to_dense()
    product = rfgp.sketch(ProductKernel(RBFKernel(active_dims=[0]), IndexKernel(num_tasks=3, rank=1, active_dims=[1])),
                          num_features=64)
    with pytest.raises(ValueError, match=match):  # also as a part, reading a float column of the inputs
        product(torch.cat([torch.zeros_like(bad, dtype=torch.float32), bad.float()], -1)).to_dense()
    with pytest.raises(TypeError, match="x1 must hold task indices .* got dtype torch.bool"):
        tasks(torch.tensor([[True]]))


def test_index_feature_kernel_state_dict_round_trip():
    exact = IndexKernel(num_tasks=3, rank=1)
    source = rfgp.sketch(exact, num_features=8).double()
    with torch.no_grad():
        source.covar_factor.add_(0.3)
    i = torch.tensor([[0.0], [2.0], [1.0]], dtype=F64)
    target = rfgp.sketch(IndexKernel(num_tasks=3, rank=1), num_features=8).double()
    target.load_state_dict(source.state_dict())
    assert torch.equal(target(i).to_dense(), source(i).to_dense())


def test_exact_linear_and_constant_parts_take_their_width_first():
    tree = ScaleKernel(RBFKernel()) + LinearKernel(ard_num_dims=3) + ConstantKernel()
    sketched = rfgp.sketch(tree, num_features=64, seed=0)
    assert [rfgp.kernels.kernel_num_features(k) for k in sketched.kernels] == [60, 3, 1]
    # Linear × RBF: the exact factor multiplies by Kronecker, the random part at ⌊F/d⌋ (even)
    product = rfgp.sketch(ProductKernel(LinearKernel(active_dims=[0, 1]), RBFKernel()), num_features=64, seed=0)
    x = torch.randn(5, 2, dtype=F64)
    assert isinstance(product, FeatureProductKernel) and width(product.double(), x) == 64
    with pytest.raises(ValueError, match="width of LinearFeatureKernel .* is unknown at conversion"):
        rfgp.sketch(ProductKernel(LinearKernel(), RBFKernel()), num_features=64)


def test_a_sum_whose_linear_width_is_unknown_warns_that_it_exceeds_f():
    """RBF + Linear without ard_num_dims/active_dims/x_sample: the linear part's d cannot be reserved, so the sum is
    F + d wide after its first call (69 for F = 64, d = 5): it was silent; now a warning says so and how to avoid it."""
    with pytest.warns(UserWarning, match=r"width d of LinearFeatureKernel .* is up to 64 \+ d wide"):
        sketched = rfgp.sketch(ScaleKernel(RBFKernel()) + LinearKernel(), num_features=64, seed=0).double()
    assert width(sketched, torch.randn(4, 5, dtype=F64)) == 69
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        known = rfgp.sketch(ScaleKernel(RBFKernel()) + LinearKernel(), 64, seed=0, x_sample=torch.randn(4, 5)).double()
    assert width(known, torch.randn(4, 5, dtype=F64)) <= 64


@pytest.mark.parametrize("method, options", [
    ("rff", {}), ("orf", {}), ("sorf", {}), ("maclaurin", {}), (None, {}),
    ("gaussian_sketch", {"alpha": 1e-2}), ("nystrom", {}),
])
def test_x_sample_is_accepted_for_every_method_and_gives_the_linear_part_its_width(method, options):
    x = torch.randn(80, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    tree = ScaleKernel(RBFKernel()) + LinearKernel()
    sketched = rfgp.sketch(tree, 64, method=method, seed=0, x_sample=x, **options).double()
    assert sketched.num_features <= 64  # known before any call: the linear part reserved its d = 3
    assert width(sketched, x) == sketched.num_features
    if method != "nystrom":  # the linear part is exact: its block of the covariance is x·vxᵀ
        linear = sketched.kernels[-1]
        assert linear.num_features == 3
        torch.testing.assert_close(linear(x).to_dense(), LinearKernel().double()(x).to_dense())


def test_the_columns_of_x_sample_must_match_the_leaves():
    x = torch.randn(20, 3, dtype=F64)
    with pytest.raises(ValueError, match=r"ard_num_dims=2\) sees 3 columns \(all columns of x_sample"):
        rfgp.sketch(LinearKernel(ard_num_dims=2), 16, x_sample=x)
    with pytest.raises(ValueError, match=r"active_dims=\[0, 5\], but it is given 3 columns \(all columns of x_sample"):
        rfgp.sketch(LinearKernel(active_dims=[0, 5]), 16, x_sample=x)
    assert rfgp.sketch(LinearKernel(active_dims=[0, 2]), 16, x_sample=x).num_features == 2
    with pytest.raises(ValueError, match="x_sample must be a floating tensor"):
        rfgp.sketch(LinearKernel(), 16, x_sample=x.numpy())
    with pytest.raises(ValueError, match="x_sample contains NaN"):
        rfgp.sketch(LinearKernel(), 16, x_sample=x.clone().fill_(float("nan")))


def test_without_x_sample_the_linear_width_is_named_then_known_after_the_first_call():
    sketched = rfgp.sketch(ScaleKernel(RBFKernel()) + LinearKernel(), 64, seed=0).double()
    with pytest.raises(RuntimeError, match="x_sample= .* to rfgp.sketch"):
        sketched.num_features
    x = torch.randn(6, 3, dtype=F64)
    sketched(x).to_dense()
    assert sketched.num_features == 64 + 3  # the documented F + d when d is unknown at conversion


def test_the_linear_width_comes_from_a_leaf_with_ard_num_dims_on_the_same_columns():
    sketched = rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=3)) + LinearKernel(), 64, seed=0)
    assert sketched.num_features == 60 + 3  # d = 3 from the RBF part on the same columns, reserved within F


@pytest.mark.parametrize("tree", [
    lambda: ScaleKernel(RBFKernel()) + LinearKernel(),
    lambda: (RBFKernel() + PeriodicKernel()) + ConstantKernel(),
    lambda: gpytorch.kernels.MultitaskKernel(RBFKernel() + LinearKernel(), num_tasks=2),
], ids=["sum", "nested sum", "multitask"])
def test_an_optimized_maclaurin_part_fits_its_allocation_on_the_whole_first_input(tree):
    """The 1-row probe that sizes a tree's features must not be what a data-dependent part fits on."""
    x = torch.rand(40, 3, dtype=F64, generator=torch.Generator().manual_seed(0))
    sketched = rfgp.sketch(tree(), 64, method={"RBFKernel": "maclaurin"}, seed=0).double()
    part = next(m for m in sketched.modules() if isinstance(m, MaclaurinRBFKernel))
    reference = copy.deepcopy(part.feature_map)
    assert not part.feature_map.is_initialized
    sketched(x).to_dense()
    reference.fit(part.scale_inputs(x).detach())
    assert part.feature_map.widths == reference.widths and len(reference.widths) > 1


def test_x_sample_fits_the_maclaurin_allocation_at_conversion_as_the_first_call_would():
    x = torch.rand(60, 3, dtype=F64, generator=torch.Generator().manual_seed(1))
    exact = ScaleKernel(RBFKernel(active_dims=[0, 2])) + LinearKernel(active_dims=[1])
    exact.kernels[0].base_kernel.lengthscale = 0.4
    eager = rfgp.sketch(exact, 64, method={"RBFKernel": "maclaurin"}, seed=0, x_sample=x).double()
    lazy = rfgp.sketch(exact, 64, method={"RBFKernel": "maclaurin"}, seed=0).double()
    eager_map, lazy_map = (next(m for m in k.modules() if isinstance(m, MaclaurinRBFKernel)).feature_map
                           for k in (eager, lazy))
    assert eager_map.widths is not None and lazy_map.widths is None  # fitted on the leaf's columns [0, 2] of x
    lazy(x).to_dense()
    assert eager_map.widths == lazy_map.widths
    torch.testing.assert_close(eager(x).to_dense(), lazy(x).to_dense(), rtol=1e-12, atol=1e-12)


# ------------------------------------------------------------ exact state_dict → converted tree
_STATE_TREES = {
    "scale": lambda: ScaleKernel(RBFKernel(ard_num_dims=2)),
    "additive": lambda: AdditiveKernel(ScaleKernel(RBFKernel()), ScaleKernel(MaternKernel(nu=2.5)),
                                       LinearKernel(ard_num_dims=2)),
    "sum_of_scaled": lambda: ScaleKernel(RBFKernel()) + ScaleKernel(PeriodicKernel()),
    "spectral_product": lambda: ProductKernel(RBFKernel(active_dims=[0]), MaternKernel(nu=0.5, active_dims=[1])),
    "product_random_index": lambda: ProductKernel(RBFKernel(active_dims=[0]), IndexKernel(3, rank=1, active_dims=[1])),
    "product_index_random": lambda: ProductKernel(IndexKernel(3, rank=1, active_dims=[1]), RBFKernel(active_dims=[0])),
    "product_linear_constant": lambda: ProductKernel(LinearKernel(active_dims=[0]), ConstantKernel()),
    "polynomial_product": lambda: ProductKernel(RBFKernel(), PolynomialKernel(power=2)),
    "scaled_product_of_sum": lambda: ScaleKernel(
        ProductKernel(AdditiveKernel(RBFKernel(), LinearKernel(ard_num_dims=2)), RQKernel())),
    "multitask": lambda: gpytorch.kernels.MultitaskKernel(ScaleKernel(MaternKernel(nu=1.5)), num_tasks=2, rank=1),
    "spectral_mixture": lambda: gpytorch.kernels.SpectralMixtureKernel(num_mixtures=2, ard_num_dims=2),
    "one_factor_product": lambda: ProductKernel(ScaleKernel(RBFKernel(ard_num_dims=2))),  # becomes its factor
    # the spectral factors are convolved into one SpectralProductKernel (kernels.0.kernels.i)
    "grouped_spectral_product_with_index": lambda: ProductKernel(
        RBFKernel(active_dims=[0]), MaternKernel(nu=2.5, active_dims=[0]), IndexKernel(3, rank=1, active_dims=[1])),
    "grouped_spectral_product_with_polynomial": lambda: ProductKernel(
        RBFKernel(active_dims=[0]), PolynomialKernel(power=2, active_dims=[1]), MaternKernel(nu=1.5, active_dims=[1])),
    # the exact factor moves behind the random ones (kernels.0 -> kernels.1) while the scaled RBF moves from kernels.1
    # to kernels.0.kernels.0: both have raw_outputscale, so moving keys one by one overwrote the RBF's with the Linear's
    "exact_factor_first_with_scaled_random_factors": lambda: ProductKernel(
        ScaleKernel(LinearKernel(ard_num_dims=2)), ScaleKernel(RBFKernel()), PolynomialKernel(power=2)),
}


def _converted_name(name: str, paths) -> str:
    """Where an exact product's ``kernels.i.rest`` went in the converted one (``exact_factor_paths``)."""
    head, _, rest = name.partition(".")
    index, _, tail = rest.partition(".")
    if paths is None or head != "kernels" or not index.isdigit():
        return name
    return ".".join(part for part in (paths[int(index)], tail) if part)


@pytest.mark.parametrize("make", list(_STATE_TREES.values()), ids=list(_STATE_TREES))
def test_exact_state_dict_loads_into_the_converted_tree(make):
    """A trained exact tree's state loads into a freshly converted one (strict=False): no key is left over and
    every hyperparameter arrives under its own name; then both trees compute the same hyperparameter values."""
    exact = make().to(torch.float64)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in exact.parameters():
            param.add_(0.3 + 0.2 * torch.rand(param.shape, generator=generator, dtype=param.dtype))
    sketched = rfgp.sketch(make().to(torch.float64), 64, seed=0).to(torch.float64)
    result = sketched.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == []
    converted = dict(sketched.named_parameters())
    paths = getattr(sketched, "exact_factor_paths", None)
    for name, value in exact.named_parameters():
        assert _converted_name(name, paths) in converted, name
        assert torch.equal(converted[_converted_name(name, paths)], value), name
    for name in ("lengthscale", "outputscale", "variance", "alpha", "period_length"):
        for module_name, module in exact.named_modules():
            if hasattr(module, f"raw_{name}"):
                torch.testing.assert_close(getattr(sketched.get_submodule(_converted_name(module_name, paths)), name),
                                           getattr(module, name))
    again = rfgp.sketch(make().to(torch.float64), 64, seed=0).to(torch.float64)
    again.load_state_dict(sketched.state_dict())  # a converted state loads as it is, strictly


@pytest.mark.parametrize("name", ["scale", "sum_of_scaled", "multitask"])
def test_exact_state_dict_loads_into_the_nystrom_tree(name):
    """method="nystrom" keeps the exact tree under NystromKernel.base_kernel (a ScaleKernel on top stays above it): an
    exact state (no landmarks) loads there, every hyperparameter arrives, the landmarks stay; a Nyström state still
    loads as itself."""
    make = _STATE_TREES[name]
    exact = make().to(torch.float64)
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for param in exact.parameters():
            param.add_(0.3 + 0.2 * torch.rand(param.shape, generator=generator, dtype=param.dtype))
    x = torch.rand(40, 2, generator=generator, dtype=torch.float64)
    sketched = rfgp.sketch(make().to(torch.float64), 16, method="nystrom", x_sample=x, seed=0)
    inner, nystrom = next((path, module) for path, module in sketched.named_modules()
                          if isinstance(module, rfgp.kernels.NystromKernel))
    inner = inner and inner + "."  # where the NystromKernel sits: the exact tree's node it approximates sat there
    assert inner == {"scale": "base_kernel.", "sum_of_scaled": "", "multitask": "data_covar_module.base_kernel."}[name]
    landmarks = nystrom.landmarks.clone()
    result = sketched.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == []
    tree = nystrom.base_kernel
    converted = dict(sketched.named_parameters())
    for key, value in exact.named_parameters():
        nested = inner + "base_kernel." + key.removeprefix(inner) if key.startswith(inner) else key
        assert torch.equal(converted[nested], value), key
    assert torch.equal(nystrom.landmarks, landmarks)
    assert tree is nystrom.base_kernel
    again = rfgp.sketch(make().to(torch.float64), 16, method="nystrom", x_sample=x, seed=3)
    again.load_state_dict(sketched.state_dict())  # strict: a Nyström state is not remapped
    for (key, value), (_, expected) in zip(again.state_dict().items(), sketched.state_dict().items()):
        assert torch.equal(value, expected), key
