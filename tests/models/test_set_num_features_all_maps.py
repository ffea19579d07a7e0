"""rfgp.set_num_features on every kernel family: widths, hyperparameters, convergence to the exact GP, state loads.

Every case is an exact GPyTorch model with fixed hyperparameters and its rfgp counterpart at width F (the
same model with ``covar_module`` replaced, mostly by :func:`rfgp.sketch`).  After
``set_num_features(model, 4F)`` the widths are those documented (proportions kept, granularity
rounding), no hyperparameter moved, the posterior mean is at least as close to the exact one as at F, and
the state saved at 4F loads strictly into a model built at 4F and predicts the same, bit for bit.
"""

from __future__ import annotations

import copy
import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import (
    AdditiveKernel,
    LCMKernel,
    LinearKernel,
    MaternKernel,
    MultitaskKernel,
    PeriodicKernel,
    PolynomialKernel,
    ProductKernel,
    RBFKernel,
    RQKernel,
    ScaleKernel,
    SpectralMixtureKernel,
)
from gpytorch.likelihoods import GaussianLikelihood, MultitaskGaussianLikelihood

import rfgp
from rfgp import kernels
from rfgp.models import ExactGPModel

F64 = torch.float64
N, D = 60, 2


def _inputs(n, seed, kind="box"):
    g = torch.Generator().manual_seed(seed)
    if kind == "sphere":
        return torch.nn.functional.normalize(torch.randn(n, D, generator=g, dtype=F64), dim=-1)
    if kind == "mixed":
        return torch.cat([torch.rand(n, D, generator=g, dtype=F64), torch.randint(0, 3, (n, 1), generator=g).to(F64)],
                         -1)
    if kind == "categorical":
        return torch.randint(0, 3, (n, D), generator=g).to(F64)
    return torch.rand(n, D, generator=g, dtype=F64)


def _targets(x, outputs):
    g = torch.Generator().manual_seed(1)
    signal = torch.stack([torch.sin(3 * x[:, :D].sum(-1) + k) for k in range(outputs)], -1)
    y = signal + 0.05 * torch.randn(signal.shape, generator=g, dtype=F64)
    return y[:, 0] if outputs == 1 else y


class GradientGP(gpytorch.models.ExactGP):
    """GPyTorch's GP with derivative observations."""

    def __init__(self, x, y, kernel):
        super().__init__(x, y, MultitaskGaussianLikelihood(num_tasks=y.shape[-1]))
        second = y.shape[-1] > x.shape[-1] + 1
        self.mean_module = gpytorch.means.ConstantMeanGradGrad() if second else gpytorch.means.ConstantMeanGrad()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


class ExponentialDotKernel(gpytorch.kernels.Kernel):
    """exp(xᵀy/ℓ²), the target of the exponential Maclaurin kernels."""

    has_lengthscale = True

    def forward(self, x1, x2, diag=False, **params):
        x1, x2 = x1.div(self.lengthscale), x2.div(self.lengthscale)
        if diag:
            return (x1 * x2).sum(-1).exp()
        return (x1 @ x2.mT).exp()


def _scalar_model(kernel, kind="box"):
    x = _inputs(N, 0, kind)
    model = ExactGPModel(x, _targets(x, 1), GaussianLikelihood(), kernel).to(F64)
    model.likelihood.noise = 0.01
    return model


def _multi_output_model(kernel, outputs=2):
    x = _inputs(N, 0)
    return rfgp.MultiOutputGPModel(x, _targets(x, outputs), MultitaskGaussianLikelihood(num_tasks=outputs, rank=0),
                                   kernel).to(F64)


def _gradient_model(kernel, outputs):
    x = _inputs(N, 0)
    return GradientGP(x, _targets(x, outputs), kernel).to(F64)


def _with_lengthscale(kernel, value=0.4):
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    base.lengthscale = value
    return kernel


def _mixed_single_task_gp():
    botorch_models = pytest.importorskip("botorch.models")
    x = _inputs(N, 0, "mixed")
    model = botorch_models.MixedSingleTaskGP(x, _targets(x, 1).unsqueeze(-1), cat_dims=[D])
    for kernel in model.covar_module.kernels:
        kernel.outputscale = 0.8
    model.likelihood.noise = 1e-2
    return model


def _categorical_model():
    categorical = pytest.importorskip("botorch.models.kernels.categorical")
    kernel = ScaleKernel(categorical.CategoricalKernel(ard_num_dims=D))
    kernel.base_kernel.lengthscale = torch.tensor([[0.5, 2.0]])
    return _scalar_model(kernel, "categorical")


class Case:
    """An exact model, how its rfgp counterpart is built at width F, and the width that counts.

    ``sketch(exact_covar_module, F)`` returns the rfgp kernel; ``fresh_width(F)`` the argument that
    builds the model at the width ``set_num_features(model, F)`` reaches (differs where exact parts
    take fixed widths of their own); ``target()`` the exact model whose kernel the rfgp one approximates
    (default: ``exact``, whose ``covar_module`` is converted).
    """

    def __init__(self, exact, width, sketch=None, fresh_width=None, factor=4, target=None, map_factor=None):
        self.exact, self.width, self.factor = exact, width, factor
        self.map_factor = map_factor or factor  # how much each map grows when the total grows by ``factor``
        self.target = target or exact  # the exact model the posterior means are compared with
        self.sketch = sketch or _sketch()
        self.fresh_width = fresh_width or (lambda f: f)

    def build(self, width, seed=0):
        exact = self.exact()
        model = copy.deepcopy(exact)
        previous = torch.get_default_dtype()
        torch.set_default_dtype(F64)  # draws made at construction in float64, as set_num_features makes them
        try:
            model.covar_module = self.sketch(exact.covar_module, self.fresh_width(width), seed).to(F64)
        finally:
            torch.set_default_dtype(previous)
        return exact, model


def _sketch(**options):
    return lambda kernel, f, seed: rfgp.sketch(kernel, f, seed=seed, **options)


def _exact_rbf(kind="box"):
    return lambda: _scalar_model(_with_lengthscale(ScaleKernel(RBFKernel())), kind)


def _polynomial_model():
    kernel = ScaleKernel(PolynomialKernel(power=2))
    kernel.base_kernel.offset = 0.5
    kernel.outputscale = 0.5
    return _scalar_model(kernel)


def _exponential_model():
    kernel = ScaleKernel(ExponentialDotKernel())
    kernel.base_kernel.lengthscale = 1.5
    return _scalar_model(kernel)


def _exponential(cls):
    def build(kernel, f, seed):
        sketched = ScaleKernel(cls(f, seed=seed))
        sketched.base_kernel.lengthscale = kernel.base_kernel.lengthscale
        return sketched
    return build


def _spherical_model():
    kernel = ScaleKernel(PolynomialKernel(power=3))
    kernel.base_kernel.offset = 7.0
    kernel.outputscale = 8.0 ** -3  # (1 − ‖x − y‖²/16)³ = ((7 + xᵀy)/8)³ on the unit sphere
    return _scalar_model(kernel, "sphere")


def _spherical(method):
    def build(kernel, f, seed):
        sketched = ScaleKernel(kernels.SketchedSphericalPolynomialKernel(3, f, a=4.0, method=method, seed=seed))
        sketched.outputscale = 1.0
        return sketched
    return build


def _tree(exact_kernel, kind="box"):
    def build():
        kernel = exact_kernel()
        for leaf in kernel.modules():
            if getattr(leaf, "has_lengthscale", False) and leaf.lengthscale is not None:
                leaf.lengthscale = 0.5
        return _scalar_model(kernel, kind)
    return build


def _periodic():
    kernel = PeriodicKernel()
    kernel.period_length = 0.8
    return kernel


def _spectral_mixture():
    kernel = SpectralMixtureKernel(num_mixtures=2, ard_num_dims=D)
    kernel.mixture_weights = torch.tensor([0.6, 0.4])
    kernel.mixture_means = torch.tensor([[[0.2, 0.1]], [[0.5, 0.3]]])
    kernel.mixture_scales = torch.tensor([[[0.5, 0.4]], [[0.3, 0.6]]])
    return kernel


def _rq():
    kernel = RQKernel()
    kernel.alpha = 1.5
    return kernel


def _multitask(rank=1):
    kernel = MultitaskKernel(_with_lengthscale(RBFKernel()), num_tasks=2, rank=rank)
    kernel.task_covar_module.covar_factor.data = torch.tensor([[0.8], [0.5]])
    kernel.task_covar_module.var = torch.tensor([0.3, 0.2])  # IndexKernel draws its initial raw_var at random
    return kernel


def _lcm():
    kernel = LCMKernel([_with_lengthscale(RBFKernel()), _with_lengthscale(MaternKernel(nu=2.5), 0.6)], num_tasks=2)
    for part, factor in zip(kernel.covar_module_list, ([[0.8], [0.5]], [[-0.3], [0.6]])):
        part.task_covar_module.covar_factor.data = torch.tensor(factor)
        part.task_covar_module.var = torch.tensor([0.3, 0.2])
    return kernel


def _gradient(cls, outputs=D + 1, **kwargs):
    return lambda: _gradient_model(_with_lengthscale(ScaleKernel(cls(**kwargs)), 0.5), outputs)


def _curl_free(cls):
    def build():
        kernel = cls(D)
        kernel.lengthscale = 0.5
        return _multi_output_model(ScaleKernel(kernel))
    return build


def _helmholtz():
    curl, div = kernels.CurlFreeRBFKernel(D), kernels.DivFreeRBFKernel(D)
    curl.lengthscale, div.lengthscale = 0.5, 0.7
    return _multi_output_model(AdditiveKernel(ScaleKernel(curl), ScaleKernel(div)))


def _two_random_factor_kronecker(kernel, f, seed):
    """Φ₁ ⊙ Φ₂ of two random maps of width √F (not what rfgp.sketch builds: both factors scale by 2 at 4F)."""
    width = 2 * round(math.sqrt(f) / 2)
    factors = [kernels.SketchedRBFKernel(width, active_dims=[i], seed=seed + i) for i in range(2)]
    for factor, exact in zip(factors, kernel.base_kernel.kernels):
        factor.lengthscale = exact.lengthscale
    product = ScaleKernel(kernels.FeatureProductKernel(*factors))
    product.outputscale = kernel.outputscale
    return product


CASES = {
    "rff": Case(_exact_rbf(), 256),
    "orf": Case(_exact_rbf(), 256, _sketch(method="orf")),
    "sorf": Case(_exact_rbf(), 256, _sketch(method="sorf")),
    "gpytorch_rff_kernel": Case(lambda: _scalar_model(_with_lengthscale(ScaleKernel(gpytorch.kernels.RFFKernel(8)))),
                                256, target=_exact_rbf()),
    "matern12": Case(lambda: _scalar_model(_with_lengthscale(ScaleKernel(MaternKernel(nu=0.5)))), 256),
    "matern52_orf": Case(lambda: _scalar_model(_with_lengthscale(ScaleKernel(MaternKernel(nu=2.5)))), 256,
                         _sketch(method="orf")),
    "maclaurin_optimized": Case(_exact_rbf(), 256, _sketch(method="maclaurin")),
    "maclaurin_real_rademacher": Case(_exact_rbf(), 256,
                                      _sketch(method="maclaurin", weights="real", projection="rademacher")),
    "random_maclaurin": Case(_exponential_model, 256, _exponential(kernels.RandomMaclaurinExponentialKernel)),
    "exponential_maclaurin": Case(_exponential_model, 256, _exponential(kernels.SketchedExponentialKernel)),
    "polynomial_ctr": Case(_polynomial_model, 256),
    "polynomial_real_srht": Case(_polynomial_model, 256, _sketch(weights="real")),
    "polynomial_complex_gaussian": Case(_polynomial_model, 256, _sketch(weights="complex", projection="gaussian")),
    "polynomial_rademacher": Case(_polynomial_model, 256, _sketch(weights="real", projection="rademacher")),
    "polynomial_hierarchical": Case(_polynomial_model, 256, _sketch(projection="hierarchical")),
    "polynomial_maclaurin": Case(_polynomial_model, 256, _sketch(method="maclaurin")),
    "polynomial_random_maclaurin": Case(_polynomial_model, 256, _sketch(method="random_maclaurin")),
    "gaussian_sketch": Case(_exact_rbf(), 256, _sketch(method="gaussian_sketch", x_sample=_inputs(N, 0), alpha=1e-3,
                                                       mode="tree")),
    "gaussian_sketch_hd": Case(_exact_rbf(), 256, _sketch(method="gaussian_sketch_hd", x_sample=_inputs(N, 0),
                                                          alpha=1e-2)),
    "spherical": Case(_spherical_model, 256, _spherical("srf")),
    "spherical_orth_complex": Case(_spherical_model, 256, _spherical("srf_orth_complex")),
    "periodic": Case(_tree(lambda: ScaleKernel(_periodic())), 256),
    "rational_quadratic": Case(_tree(lambda: ScaleKernel(_rq())), 256),
    "spectral_mixture": Case(_tree(_spectral_mixture), 256),
    "sum": Case(_tree(lambda: ScaleKernel(RBFKernel()) + ScaleKernel(MaternKernel(nu=1.5))), 256),
    "sum_with_exact_part": Case(_tree(lambda: AdditiveKernel(ScaleKernel(RBFKernel(active_dims=[0])),
                                                             ScaleKernel(PeriodicKernel(active_dims=[1])),
                                                             LinearKernel(active_dims=[0]))),
                                256, fresh_width=lambda f: f + 1),
    "spectral_product": Case(_tree(lambda: ScaleKernel(ProductKernel(RBFKernel(), _periodic()))), 256),
    "tensor_product": Case(_tree(lambda: ScaleKernel(ProductKernel(PolynomialKernel(power=2), RBFKernel()))), 256),
    "kronecker_product": Case(_tree(lambda: ScaleKernel(ProductKernel(LinearKernel(active_dims=[0]),
                                                                      RBFKernel(active_dims=[1])))), 256),
    "kronecker_of_random_factors": Case(_tree(lambda: ScaleKernel(ProductKernel(RBFKernel(active_dims=[0]),
                                                                                RBFKernel(active_dims=[1])))),
                                        256, _two_random_factor_kronecker, map_factor=2),
    "polynomial_complex_posterior": Case(_polynomial_model, 256, _sketch(complex_posterior=True)),
    "nested_sum_of_products": Case(_tree(lambda: ScaleKernel(RBFKernel()) + ScaleKernel(
        ProductKernel(PolynomialKernel(power=1), MaternKernel(nu=2.5)))), 256),
    "rbf_grad": Case(_gradient(gpytorch.kernels.RBFKernelGrad), 256),
    "rbf_gradgrad": Case(_gradient(gpytorch.kernels.RBFKernelGradGrad, outputs=2 * D + 1), 256),
    "matern52_grad": Case(_gradient(gpytorch.kernels.Matern52KernelGrad), 256),
    "polynomial_grad": Case(lambda: _gradient_model(ScaleKernel(gpytorch.kernels.PolynomialKernelGrad(power=2)),
                                                    D + 1), 256),
    "curl_free": Case(_curl_free(kernels.CurlFreeRBFKernel), 256),
    "div_free": Case(_curl_free(kernels.DivFreeRBFKernel), 256),
    "helmholtz_sum": Case(_helmholtz, 256),
    "decomposable": Case(lambda: _multi_output_model(_multitask()), 256),
    "lcm": Case(lambda: _multi_output_model(_lcm()), 256),
    "nystrom": Case(_exact_rbf(), 24, _sketch(method="nystrom", x_sample=_inputs(N, 0), landmarks="kmeans++"),
                    factor=2),
    "categorical": Case(_categorical_model, 256),
    "mixed_single_task_gp": Case(_mixed_single_task_gp, 256),
}


def _units(model):
    """{name: width} of the feature maps, Nyström landmarks and product sketches of a model."""
    widths = {}
    for name, module in model.named_modules():
        if isinstance(module, (rfgp.features.FeatureMap, rfgp.features.operator_valued.OperatorValuedFourierFeatures,
                               kernels.NystromKernel, kernels.SpectralProductKernel)):
            widths[name] = module.num_features
    return widths


def _posterior_mean(model, x):
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var(False):
        return model(x).mean


def _assert_same_predictions(model, other, x):
    got, expected = _posterior_mean(model, x), _posterior_mean(other, x)
    if hasattr(model, "outcome_transform"):  # BoTorch re-standardises the targets at load time (≈ 1e-16 changes)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    else:
        assert torch.equal(got, expected)


def _check_resize(case, model, x_test):
    """set_num_features(model, 4F): widths, hyperparameters, the model built at 4F, state round trip."""
    big = case.factor * case.width
    before = {key: value.detach().clone() for key, value in model.named_parameters()}
    widths_before = _units(model)

    assert rfgp.set_num_features(model, big) is model

    after = dict(model.named_parameters())
    assert after.keys() == before.keys()
    for key, value in before.items():
        assert torch.equal(after[key], value), key
    widths_after = _units(model)
    assert widths_after.keys() == widths_before.keys()
    for key, width in widths_before.items():  # every map scaled by the same factor (up to its granularity)
        assert abs(widths_after[key] - case.map_factor * width) <= max(2, 0.02 * case.map_factor * width), (key, width)
    reference = case.build(big)[1]
    assert _units(reference) == widths_after
    _assert_same_predictions(model, reference, x_test)  # the same draws as a model built at 4F

    state = model.state_dict()
    fresh = case.build(big, seed=12345)[1]  # other draws, replaced by the saved ones
    fresh.load_state_dict(state)
    for key, value in fresh.state_dict().items():
        assert torch.equal(value, state[key]), key
    _assert_same_predictions(model, fresh, x_test)


#: kernels whose sketch is biased for the exact kernel at every width (the error has a floor)
_BIASED = {"spherical": 1.1, "spherical_orth_complex": 1.1}  # SRF: a fitted radial density (Pennington et al.)


@pytest.mark.parametrize("name", list(CASES))
def test_set_num_features_on_every_family(name):
    case = CASES[name]
    exact = case.target()
    x_test = exact.train_inputs[0]  # valid inputs of every kind (GPyTorch's RBFKernelGradGrad needs n_test = n_train)
    target = _posterior_mean(exact, x_test)
    errors = {"small": [], "big": []}
    for seed in range(3):  # RMSE to the exact posterior mean, summed over three draws: one is too noisy a judge
        model = case.build(case.width, seed)[1]
        errors["small"].append((_posterior_mean(model, x_test) - target).pow(2).mean().sqrt())
        if seed == 0:
            _check_resize(case, model, x_test)
        else:
            rfgp.set_num_features(model, case.factor * case.width)
        errors["big"].append((_posterior_mean(model, x_test) - target).pow(2).mean().sqrt())
    small, big = sum(errors["small"]), sum(errors["big"])
    assert big <= _BIASED.get(name, 1.0) * small, (errors["small"], errors["big"])


def test_mixed_single_task_gp_keeps_the_split_of_rfgp_sketch():
    exact = _mixed_single_task_gp()
    model = copy.deepcopy(exact)
    model.covar_module = rfgp.sketch(exact.covar_module, 256, seed=0)
    rfgp.set_num_features(model, 1024)
    product = model.covar_module.kernels[1].base_kernel
    assert isinstance(product, kernels.SketchedProductKernel)
    assert product.num_features == 512 and [k.num_features for k in product.kernels] == [512, 512]
    assert product.sketch.input_dim == 512
    assert model.covar_module.num_features == 1024


@pytest.mark.parametrize("blocks", ["tiled", "independent"])
def test_srht_permutations_do_not_depend_on_the_default_dtype(blocks):
    """A map re-drawn by set_num_features (in its own dtype) equals one built at that width under any default."""
    drawn = []
    for default in (torch.float32, F64):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            sketch = rfgp.features.PolynomialSketch(3, 64, input_dim=5, projection="srht", srht_blocks=blocks, seed=4)
            drawn.append(sketch.index)
        finally:
            torch.set_default_dtype(previous)
    assert torch.equal(*drawn)
