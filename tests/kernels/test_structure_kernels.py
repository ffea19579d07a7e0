"""rfgp.sketch of GPyTorch's AdditiveStructureKernel / ProductStructureKernel (rfgp/kernels/structure.py):
unbiased per-column features against the exact structure kernel, the product of RBFs as the isotropic RBF,
one tied set of hyperparameters (gradients, priors counted once, state_dict), widths, columns, Nyström,
training and BoTorch use, and the refusals."""

import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import (
    AdditiveStructureKernel,
    GridInterpolationKernel,
    LinearKernel,
    MaternKernel,
    PeriodicKernel,
    PolynomialKernel,
    ProductStructureKernel,
    RBFKernel,
    RBFKernelGrad,
    RQKernel,
    ScaleKernel,
)
from gpytorch.priors import GammaPrior

import rfgp
from rfgp.kernels import (
    FeatureSumKernel,
    SketchedRBFKernel,
    SpectralProductKernel,
    kernel_features,
    kernel_num_features,
)
from rfgp.models import ExactGPModel

F64 = torch.float64
X = torch.rand(6, 3, dtype=F64, generator=torch.Generator().manual_seed(0))

pytestmark = pytest.mark.filterwarnings("ignore:(AdditiveStructureKernel|ProductStructureKernel|The last_dim_is_batch)"
                                        ".*:DeprecationWarning")


def scaled(base, outputscale=1.7):
    kernel = ScaleKernel(base)
    kernel.outputscale = outputscale
    return kernel


def periodic():
    kernel = PeriodicKernel()
    kernel.period_length, kernel.lengthscale = 0.8, 1.1
    return kernel


def rq():
    kernel = RQKernel()
    kernel.lengthscale, kernel.alpha = 0.6, 1.5
    return kernel


STRUCTURES = {
    "sum-scaled-rbf": lambda: AdditiveStructureKernel(scaled(RBFKernel(lengthscale_prior=GammaPrior(3.0, 6.0))), 3),
    "sum-periodic": lambda: AdditiveStructureKernel(periodic(), 3),
    "sum-matern+linear": lambda: AdditiveStructureKernel(MaternKernel(nu=2.5) + LinearKernel(), 3),
    "product-scaled-rq": lambda: ProductStructureKernel(scaled(rq(), 1.2), 3),
    "product-matern": lambda: ProductStructureKernel(MaternKernel(nu=2.5), 3),
    "product-polynomial": lambda: ProductStructureKernel(PolynomialKernel(power=2), 3),
}


def exact_gram(kernel, x=X):
    return kernel(x).to_dense().detach()


@pytest.mark.parametrize("name", STRUCTURES)
def test_converted_structure_kernel_is_unbiased_for_the_exact_one(name):
    exact = STRUCTURES[name]().double()
    target = exact_gram(exact)
    estimates = torch.stack([rfgp.sketch(exact, num_features=96, seed=seed)(X).to_dense().detach()
                             for seed in range(50)])
    mean, se = estimates.mean(0), estimates.std(0) / math.sqrt(len(estimates))
    assert bool(((mean - target).abs() <= 4 * se + 1e-10).all())
    errors = [float((rfgp.sketch(exact, num_features=f, seed=1)(X).to_dense().detach() - target).norm()
                    / target.norm()) for f in (16, 4096)]
    assert errors[1] < errors[0] and errors[1] < 0.1


def test_additive_structure_is_per_column_features_splitting_f():
    exact = STRUCTURES["sum-scaled-rbf"]().double()
    sketched = rfgp.sketch(exact, num_features=100, seed=0)
    assert isinstance(sketched, FeatureSumKernel) and len(sketched.kernels) == 3
    assert [kernel_num_features(part) for part in sketched.kernels] == [34, 34, 32]
    assert [part.active_dims.tolist() for part in sketched.kernels] == [[0], [1], [2]]
    same_columns = X[:, :1].expand(6, 3)
    features = [kernel_features(part, same_columns)[:, :32] for part in sketched.kernels]
    assert not torch.allclose(features[0], features[1])  # independent draws per column
    widths = rfgp.sketch(exact, num_features=[64, 32, 16], seed=0)
    assert [kernel_num_features(part) for part in widths.kernels] == [64, 32, 16]
    with pytest.raises(ValueError, match="too small for this AdditiveStructureKernel: .* its 3 random parts"):
        rfgp.sketch(exact, num_features=4)


@pytest.mark.parametrize("ard", [None, 3])
def test_product_of_rbfs_converts_to_the_rbf_of_all_columns(ard):
    base = RBFKernel(ard_num_dims=ard, lengthscale_prior=GammaPrior(3.0, 6.0)).double()
    base.lengthscale = torch.tensor([0.4, 0.9, 1.6])[: ard or 1]
    exact = ProductStructureKernel(base, 3)
    # the same covariance and hyperparameter: Πᵢ exp(−(xᵢ − yᵢ)²/2ℓᵢ²) = exp(−Σᵢ (xᵢ − yᵢ)²/2ℓᵢ²)
    torch.testing.assert_close(exact_gram(exact), base(X).to_dense().detach(), rtol=1e-13, atol=1e-14)
    sketched = rfgp.sketch(exact, num_features=64, seed=3)
    assert isinstance(sketched, SketchedRBFKernel)
    torch.testing.assert_close(sketched(X).to_dense(), rfgp.sketch(base, 64, seed=3)(X).to_dense(), rtol=0, atol=0)
    assert [name for name, *_ in sketched.named_priors()] == ["lengthscale_prior"]
    dims = [0, 1, 3] if ard else [0, 3]
    selected = ProductStructureKernel(base, len(dims), active_dims=dims)
    wide = torch.cat([X, X[:, :1] ** 2], dim=-1)
    torch.testing.assert_close(exact_gram(selected, wide), base(wide[:, dims]).to_dense().detach(), rtol=1e-13,
                               atol=1e-14)
    torch.testing.assert_close(rfgp.sketch(selected, 64, seed=3)(wide).to_dense(),
                               rfgp.sketch(base, 64, seed=3)(wide[:, dims]).to_dense(), rtol=0, atol=0)


def test_hyperparameters_are_one_tied_set_as_in_gpytorch():
    exact = STRUCTURES["sum-scaled-rbf"]().double()
    sketched = rfgp.sketch(exact, num_features=4096, seed=0)
    assert len(list(sketched.parameters())) == len(list(exact.parameters())) == 2
    lengthscales = {id(part.base_kernel.raw_lengthscale) for part in sketched.kernels}
    assert len(lengthscales) == 1
    # the gradient of the tied hyperparameter collects all columns: it matches the exact kernel's at large F
    gradients = []
    for kernel in (exact, sketched):
        kernel.zero_grad()
        kernel(X).to_dense().sum().backward()
        gradients.append(torch.cat([p.grad.flatten() for p in kernel.parameters()]))
    torch.testing.assert_close(gradients[1], gradients[0], rtol=0.05, atol=0.05 * float(gradients[0].abs().max()))
    before = sketched.kernels[2].base_kernel.lengthscale.clone()
    torch.optim.SGD(sketched.parameters(), lr=0.1).step()
    assert all(not torch.equal(part.base_kernel.lengthscale, before) for part in sketched.kernels)
    assert len({float(part.base_kernel.lengthscale.detach()) for part in sketched.kernels}) == 1


@pytest.mark.parametrize("name", ["sum-scaled-rbf", "product-scaled-rq"])
def test_priors_are_counted_once_as_gpytorch_does(name):
    exact = STRUCTURES[name]().double()
    exact.base_kernel.register_prior("outputscale_prior", GammaPrior(2.0, 1.0), "outputscale")
    sketched = rfgp.sketch(exact, num_features=64, seed=0)
    log_prior = [sum(prior.log_prob(closure(module)).sum() for _, module, prior, closure, _ in tree.named_priors())
                 for tree in (exact, sketched)]
    assert len(list(sketched.named_priors())) == len(list(exact.named_priors()))
    assert float(log_prior[1]) == pytest.approx(float(log_prior[0]), rel=1e-12)


@pytest.mark.parametrize("name", STRUCTURES)
def test_state_dict_round_trip_is_bit_for_bit_and_keeps_the_ties(name):
    exact = STRUCTURES[name]().double()
    original = rfgp.sketch(exact, num_features=48, seed=0)
    expected = original(X).to_dense().detach()
    restored = rfgp.sketch(exact, num_features=48, seed=7)
    restored.load_state_dict(original.state_dict())
    torch.testing.assert_close(restored(X).to_dense().detach(), expected, rtol=0, atol=0)
    assert len(list(restored.parameters())) == len(list(exact.parameters()))


def test_columns_follow_active_dims_and_num_dims():
    wide = torch.rand(40, 5, dtype=F64, generator=torch.Generator().manual_seed(1))
    for exact in (AdditiveStructureKernel(scaled(RBFKernel()), 2, active_dims=[4, 1]),
                  AdditiveStructureKernel(scaled(RBFKernel(active_dims=[0, 3, 4])), 5)):
        exact = exact.double()
        sketched = rfgp.sketch(exact, num_features=4096, seed=0)
        target = exact_gram(exact, wide)
        assert float((sketched(wide).to_dense().detach() - target).norm() / target.norm()) < 0.03
    exact = AdditiveStructureKernel(RBFKernel(), 3).double()
    with pytest.raises(ValueError, match=r"AdditiveStructureKernel\(num_dims=3\) sees 5 columns.*set num_dims=5"):
        rfgp.sketch(exact, num_features=64, x_sample=wide)
    sketched = rfgp.sketch(exact, num_features=64)  # d = num_dims, checked at the call
    assert sketched(X).to_dense().shape == (6, 6)
    with pytest.raises(ValueError, match="x1 has 5 input dimensions .* built for input_dim=3"):
        sketched(wide).to_dense()
    product = rfgp.sketch(ProductStructureKernel(MaternKernel(nu=2.5), 1).double(), num_features=64)
    with pytest.raises(ValueError, match="x1 has 3 input dimensions .* built for input_dim=1"):
        product(X).to_dense()


@pytest.mark.parametrize("name", ["sum-periodic", "sum-matern+linear"])
def test_nystrom_with_all_points_as_landmarks_is_the_exact_structure_kernel(name):
    exact = STRUCTURES[name]().double()
    nystrom = rfgp.sketch(exact, num_features=len(X), method="nystrom", x_sample=X, seed=0)
    torch.testing.assert_close(nystrom(X).to_dense().detach(), exact_gram(exact), rtol=1e-6, atol=1e-7)


def test_nystrom_of_a_product_structure_is_refused_as_gpytorch_cannot_evaluate_its_diagonal():
    exact = STRUCTURES["product-scaled-rq"]().double()
    with pytest.raises(ValueError, match="DenseLinearOperator expects a matrix"):  # upstream: the exact kernel fails
        exact(X, diag=True)
    with pytest.raises(TypeError, match="method='nystrom'.* ProductStructureKernel.*diag=True.*without method"):
        rfgp.sketch(exact + RBFKernel(), num_features=6, method="nystrom", x_sample=X)


def test_training_the_converted_kernel_fits_the_exact_model():
    generator = torch.Generator().manual_seed(2)
    x = torch.rand(60, 3, dtype=F64, generator=generator)
    y = torch.sin(6 * x[:, 0]) + torch.cos(4 * x[:, 1]) + x[:, 2] + 0.05 * torch.randn(60, dtype=F64,
                                                                                        generator=generator)
    fits = {}
    for num_features in (None, 64, 2048):
        covar = AdditiveStructureKernel(ScaleKernel(RBFKernel()), 3).double()
        if num_features is not None:
            covar = rfgp.sketch(covar, num_features=num_features, seed=0)
        model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), covar).double()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        model.train()
        for _ in range(40):
            optimizer.zero_grad()
            (-mll(model(x), y)).backward()
            optimizer.step()
        fits[num_features] = torch.cat([p.detach().flatten() for p in model.parameters()])
    errors = [float((fits[f] - fits[None]).abs().max()) for f in (64, 2048)]
    assert errors[1] < errors[0] and errors[1] < 0.05


def test_single_task_gp_with_the_converted_structure_kernel_predicts_like_the_exact_one():
    botorch = pytest.importorskip("botorch")
    generator = torch.Generator().manual_seed(3)
    x = torch.rand(30, 3, dtype=F64, generator=generator)
    y = (x.sin().sum(-1, keepdim=True) + 0.05 * torch.randn(30, 1, dtype=F64, generator=generator))
    exact = AdditiveStructureKernel(scaled(RBFKernel()), 3).double()
    exact.base_kernel.base_kernel.lengthscale = 0.5
    means = []
    for covar in (exact, rfgp.sketch(exact, num_features=4096, seed=0)):
        model = botorch.models.SingleTaskGP(x, y, covar_module=covar)
        model.likelihood.noise = 0.01
        model.eval()
        with torch.no_grad():
            means.append(model.posterior(X).mean)
    assert float((means[1] - means[0]).abs().max()) < 0.05 * float(y.std())


@pytest.mark.parametrize("exact, message", [
    (lambda: AdditiveStructureKernel(GridInterpolationKernel(RBFKernel(), grid_size=8, num_dims=1), 3),
     r"AdditiveStructureKernel over a GridInterpolationKernel: that is KISS-GP .* AdditiveStructureKernel\(RBFKernel"),
    (lambda: AdditiveStructureKernel(ScaleKernel(RBFKernel(ard_num_dims=3)), 3),
     r"AdditiveStructureKernel over RBFKernel\(ard_num_dims=3\): GPyTorch divides each column .* ScaleKernel\("
     r"AdditiveKernel"),
    (lambda: ProductStructureKernel(PeriodicKernel(ard_num_dims=3), 3), r"over PeriodicKernel\(ard_num_dims=3\)"),
    (lambda: AdditiveStructureKernel(RBFKernelGrad(), 3),
     r"AdditiveStructureKernel over RBFKernelGrad, a kernel with 2 outputs per input .* without the structure wrapper"),
    (lambda: ProductStructureKernel(LinearKernel(), 3),
     r"ProductStructureKernel over a LinearKernel: GPyTorch's value .* ProductKernel\(\*\(LinearKernel"),
])
def test_structure_kernels_without_a_tied_conversion_are_refused_naming_the_alternative(exact, message):
    # ScaleKernel around them: the refusal of a structure kernel inside a tree names it
    with pytest.raises(TypeError, match=message):
        rfgp.sketch(ScaleKernel(exact()), num_features=64)


def test_exact_product_structure_of_linear_kernels_is_not_the_documented_product():
    """Why ProductStructureKernel(LinearKernel()) is refused: GPyTorch's own value is not Πᵢ v xᵢ yᵢ (upstream:
    the per-column covariances are right, linear_operator's LowRankRootLinearOperator.prod of them is not)."""
    base = LinearKernel().double()
    base.variance = 0.7
    documented = torch.stack([0.7 * X[:, i:i + 1] @ X[:, i:i + 1].T for i in range(3)]).prod(0)
    per_column = base(X, last_dim_is_batch=True)
    torch.testing.assert_close(per_column.to_dense().detach().prod(0), documented, rtol=1e-6, atol=1e-7)
    assert float((exact_gram(ProductStructureKernel(base, 3)) - documented).abs().max()) > 1e-3


def test_spectral_bases_multiply_as_one_spectral_product():
    sketched = rfgp.sketch(STRUCTURES["product-scaled-rq"]().double(), num_features=64, seed=0)
    assert isinstance(sketched, SpectralProductKernel) and len(sketched.kernels) == 3
    assert kernel_num_features(sketched) == 64


def test_exact_structure_kernel_over_a_derivative_kernel_fails_in_gpytorch_too():
    with pytest.raises(RuntimeError, match="expand"):
        AdditiveStructureKernel(RBFKernelGrad(), 3).double()(X).to_dense()


@pytest.mark.parametrize("method", ["orf", "sorf", "maclaurin"])
def test_batched_bases_and_other_methods_convert(method):
    base = scaled(RBFKernel(batch_shape=torch.Size([2])), torch.tensor([1.0, 2.0])).double()
    base.base_kernel.lengthscale = torch.tensor([[[0.5]], [[1.5]]])
    exact = AdditiveStructureKernel(base, 3)
    sketched = rfgp.sketch(exact, num_features=1536, method=method, x_sample=X, seed=0)
    target = exact_gram(exact)
    assert sketched(X).to_dense().shape == target.shape == (2, 6, 6)
    assert float((sketched(X).to_dense().detach() - target).norm() / target.norm()) < 0.05


def test_a_base_module_used_elsewhere_in_the_tree_stays_one_set_of_hyperparameters():
    rbf = RBFKernel(lengthscale_prior=GammaPrior(3.0, 6.0)).double()
    exact = AdditiveStructureKernel(rbf, 3) + rbf
    sketched = rfgp.sketch(exact, num_features=4096, seed=0)
    assert len(list(sketched.parameters())) == 1
    assert len(list(sketched.named_priors())) == len(list(exact.named_priors())) == 2  # GPyTorch: once per parent
    target = exact_gram(exact)
    assert float((sketched(X).to_dense().detach() - target).norm() / target.norm()) < 0.03


@pytest.mark.parametrize("name", [*STRUCTURES, "product-rbf"])
def test_exact_state_dict_loads_into_the_converted_structure_kernel(name):
    """A trained exact structure kernel's state (base_kernel.*) loads into every column's conversion (strict=False
    leaves no key over), which then has the exact hyperparameters; a converted state still loads strictly."""
    make = STRUCTURES.get(name, lambda: ProductStructureKernel(RBFKernel(active_dims=[0, 2]), 2))
    exact = make().double()
    with torch.no_grad():
        for param in exact.parameters():
            param.add_(0.3 + 0.2 * torch.rand(param.shape, generator=torch.Generator().manual_seed(1), dtype=F64))
    sketched = rfgp.sketch(make().double(), num_features=4096, seed=0)
    assert sketched.load_state_dict(exact.state_dict(), strict=False).unexpected_keys == []
    values = [torch.cat([p.detach().flatten() for p in kernel.parameters()]) for kernel in (exact, sketched)]
    assert torch.equal(values[1].sort().values, values[0].sort().values)
    target = exact_gram(exact)
    assert float((sketched(X).to_dense().detach() - target).norm() / target.norm()) < 0.1
    rfgp.sketch(make().double(), num_features=4096, seed=0).load_state_dict(sketched.state_dict())
