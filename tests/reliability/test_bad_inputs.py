"""Table of bad and edge inputs across the public API: a clear error naming the argument, or a finite result.

Every row builds a situation and states the outcome a careful user should get:

* ``Raises(types, *substrings)``: a ``ValueError``/``TypeError`` whose message contains every
  substring (the argument's name first), raised before any NaN reaches a result;
* ``Finite()``: the call returns, and every tensor in the result is finite;
* ``Foreign(types, *substrings)``: an error raised inside torch/gpytorch with a message rfgp
  does not control (at GPyTorch's own entry points, before rfgp code runs).  Kept to a handful
  and listed in :data:`FOREIGN`.
"""

from __future__ import annotations

import datetime
import math
from dataclasses import dataclass

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal

import rfgp
from rfgp import features, kernels, metrics
from rfgp.applications import distances
from rfgp.likelihoods import DirichletClassificationLikelihood

from ._builders import (
    FEATURE_MAPS,
    SCALAR_KERNELS,
    VECTOR_KERNELS,
    D,
    data,
    dirichlet_model,
    mll_value,
    multioutput_model,
    predict,
    regression_model,
    streaming_model,
    unit_rows,
)


@dataclass
class Raises:
    types: tuple
    substrings: tuple

    def __init__(self, types, *substrings):
        self.types = types if isinstance(types, tuple) else (types,)
        self.substrings = substrings


class Foreign(Raises):
    """An error from inside torch/gpytorch that rfgp cannot intercept (listed in the report)."""


@dataclass
class Finite:
    dtype = None


class Promoted(Finite):
    """A finite result in ``dtype``: float32 and float64 meet under torch type promotion, as in GPyTorch."""

    def __init__(self, dtype):
        self.dtype = dtype


CASES: list[tuple[str, object, object]] = []


def case(name, build, expected):
    CASES.append((name, build, expected))


def nan_at(x, index=(0, 0), value=float("nan")):
    x = x.clone()
    x[index] = value
    return x


def _tensors(result):
    if torch.is_tensor(result):
        yield result
    elif isinstance(result, MultivariateNormal):
        yield result.mean
        yield result.variance
    elif hasattr(result, "to_dense"):
        yield result.to_dense()
    elif isinstance(result, dict):
        for value in result.values():
            yield from _tensors(value)
    elif isinstance(result, (tuple, list)):
        for value in result:
            yield from _tensors(value)
    elif hasattr(result, "__dataclass_fields__"):
        for name in result.__dataclass_fields__:
            yield from _tensors(getattr(result, name))


# --------------------------------------------------------------------------- scalar kernels
def _kernel_inputs(unit: bool, n: int = 6, dtype=torch.float64):
    return unit_rows(n, dtype=dtype) if unit else data(n, dtype=dtype)


for name, (build_kernel, unit) in SCALAR_KERNELS.items():
    def k(build_kernel=build_kernel):
        return build_kernel().double()

    x = _kernel_inputs(unit)
    case(f"{name}/ok", lambda k=k, x=x: k()(x).to_dense(), Finite())
    case(f"{name}/ok_cross_diag", lambda k=k, x=x: k()(x, x[:3] * 1.0, diag=False).to_dense(), Finite())
    # the optimized Maclaurin allocation is fitted on the first inputs, which must hold ≥ 2 points
    case(f"{name}/empty_rows", lambda k=k, x=x: k()(x[:0]).to_dense(),
         Raises(ValueError, "m ≥ 2") if name in ("rbf_maclaurin", "exponential") else Finite())
    case(f"{name}/nan_x1", lambda k=k, x=x: k()(nan_at(x)).to_dense(), Raises(ValueError, "x1", "NaN"))
    case(f"{name}/inf_x2", lambda k=k, x=x: k()(x, nan_at(x, value=math.inf)).to_dense(), Raises(ValueError, "x2", "Inf"))
    case(f"{name}/nan_diag", lambda k=k, x=x: k()(nan_at(x), diag=True), Raises(ValueError, "x1", "NaN"))
    case(f"{name}/float16", lambda k=k, x=x: k().half()(x.half()).to_dense(), Raises(TypeError, "float16", "float32"))
    case(f"{name}/bfloat16", lambda k=k, x=x: k()(x.bfloat16()).to_dense(), Raises(TypeError, "bfloat16"))
    case(f"{name}/integer", lambda k=k, x=x: k()(x.round().long()).to_dense(), Raises(TypeError, "x1", "int64"))
    case(f"{name}/x2_wrong_dim", lambda k=k, x=x: k()(x, torch.ones(3, D + 1, dtype=x.dtype)).to_dense(),
         Raises(ValueError, "x2", str(D + 1)))
    case(f"{name}/x1_x2_dtypes", lambda k=k, x=x: k()(x, x.float()).to_dense(), Promoted(torch.float64))
    case(f"{name}/model_data_dtypes", lambda k=k, x=x: k()(x.float()).to_dense(), Promoted(torch.float64))
    case(f"{name}/float32_model_float64_data", lambda b=build_kernel, x=x: b().float()(x).to_dense(),
         Promoted(torch.float64))

for name in ("rbf_rff", "rbf_sorf", "rbf_maclaurin", "matern", "random_feature", "exponential"):
    build_kernel = SCALAR_KERNELS[name][0]
    for label, value in (("zero", 0.0), ("negative", -1.0), ("nan", math.nan), ("inf", math.inf)):
        def set_lengthscale(build_kernel=build_kernel, value=value):
            kernel = build_kernel().double()
            kernel.lengthscale = value
        case(f"{name}/lengthscale_{label}", set_lengthscale, Raises(ValueError, "lengthscale", str(value)))
    # a bool had been taken as 1.0 (tensor(True) refused), a half-precision tensor accepted against the dtype
    # policy, a string answered with torch's "new(): invalid data type 'str'"
    for label, value in (("bool", True), ("float16", torch.tensor(0.5, dtype=torch.float16)), ("string", "0.5")):
        def set_lengthscale(build_kernel=build_kernel, value=value):
            kernel = build_kernel().double()
            kernel.lengthscale = value
        case(f"{name}/lengthscale_{label}", set_lengthscale, Raises(TypeError, "lengthscale", "real number"))


def _set(name, attribute, value):
    def run():
        setattr(SCALAR_KERNELS[name][0]().double(), attribute, value)
    return run


for _name, _attribute in (("periodic", "period_length"), ("rational_quadratic", "alpha"),
                          ("spectral_mixture", "mixture_scales"), ("linear_features", "variance")):
    for _label, _value in (("zero", 0.0), ("negative", -2.0), ("nan", math.nan)):
        case(f"{_name}/{_attribute}_{_label}", _set(_name, _attribute, _value), Raises(ValueError, _attribute, str(_value)))


def _initialize_lengthscale():
    SCALAR_KERNELS["rbf_rff"][0]().initialize(lengthscale=0.0)


case("rbf_rff/initialize_lengthscale_zero", _initialize_lengthscale, Raises(ValueError, "lengthscale"))


def _set_offset(value):
    def run():
        kernel = SCALAR_KERNELS["polynomial"][0]().double()
        kernel.offset = value
    return run


for label, value in (("negative", -1.0), ("nan", math.nan), ("inf", math.inf)):
    case(f"polynomial/offset_{label}", _set_offset(value), Raises(ValueError, "offset", str(value)))
case("polynomial/offset_zero_allowed", lambda: _set_offset(0.0)() or torch.zeros(1), Finite())


def _zero_lengthscale_forward():
    kernel = SCALAR_KERNELS["rbf_rff"][0]().double()
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(-1e4)  # softplus underflows to 0: reached by training, not by a setter
    return kernel(data()).to_dense()


case("rbf_rff/underflowed_lengthscale_forward", _zero_lengthscale_forward, Raises(ValueError, "lengthscale"))


def _nan_raw_lengthscale_forward():
    kernel = SCALAR_KERNELS["matern"][0]().double()
    with torch.no_grad():
        kernel.raw_lengthscale.fill_(math.nan)
    return kernel(data()).to_dense()


case("matern/nan_raw_lengthscale_forward", _nan_raw_lengthscale_forward, Raises(ValueError, "lengthscale", "NaN"))


# --------------------------------------------------------------------------- vector kernels
for name, build_kernel in VECTOR_KERNELS.items():
    def k(build_kernel=build_kernel):
        return build_kernel().double()

    x = data()
    case(f"{name}/ok", lambda k=k, x=x: k()(x).to_dense(), Finite())
    case(f"{name}/nan_x1", lambda k=k, x=x: k()(nan_at(x)).to_dense(), Raises(ValueError, "x1", "NaN"))
    case(f"{name}/float16", lambda k=k, x=x: k()(x.half()).to_dense(), Raises(TypeError, "float16"))
    case(f"{name}/x2_wrong_dim", lambda k=k, x=x: k()(x, torch.ones(3, D + 1, dtype=x.dtype)).to_dense(),
         Raises(ValueError, "x2", str(D + 1)))
    case(f"{name}/model_data_dtypes", lambda k=k, x=x: k()(x.float()).to_dense(), Promoted(torch.float64))


# --------------------------------------------------------------------------- feature maps
for name, (build_map, unit) in FEATURE_MAPS.items():
    def m(build_map=build_map):
        return build_map().double()

    x = _kernel_inputs(unit)
    case(f"map_{name}/ok", lambda m=m, x=x: m()(x), Finite())
    case(f"map_{name}/empty_rows", lambda m=m, x=x: m()(x[:0]),
         Raises(ValueError, "m ≥ 2") if name == "optimized_maclaurin" else Finite())
    case(f"map_{name}/float32", lambda m=m, x=x: m().float()(x.float()), Finite())
    case(f"map_{name}/nan", lambda m=m, x=x: m()(nan_at(x)), Raises(ValueError, "x", "NaN"))
    case(f"map_{name}/inf", lambda m=m, x=x: m()(nan_at(x, value=-math.inf)), Raises(ValueError, "x", "Inf"))
    case(f"map_{name}/float16", lambda m=m, x=x: m()(x.half()), Raises(TypeError, "float16", "float32"))
    case(f"map_{name}/bfloat16", lambda m=m, x=x: m()(x.bfloat16()), Raises(TypeError, "bfloat16"))
    case(f"map_{name}/complex", lambda m=m, x=x: m()(x.to(torch.complex128)), Raises(TypeError, "x", "complex"))
    case(f"map_{name}/wrong_dim", lambda m=m: m()(torch.ones(3, D + 1, dtype=torch.float64)), Raises(ValueError, "x", str(D + 1)))
    case(f"map_{name}/one_dimensional", lambda m=m: m()(torch.ones(D, dtype=torch.float64)), Raises(ValueError, "x", "shape"))

# constructors and the memory guard
case("rff/num_features_float", lambda: features.RandomFourierFeatures(32.5, input_dim=D), Raises(TypeError, "num_features"))
case("rff/num_features_zero", lambda: features.RandomFourierFeatures(0, input_dim=D), Raises(ValueError, "num_features"))
case("rff/num_features_odd", lambda: features.RandomFourierFeatures(33, input_dim=D), Raises(ValueError, "num_features", "even"))
case("rff/num_features_bool", lambda: features.RandomFourierFeatures(True, input_dim=D), Raises(TypeError, "num_features"))
case("rff/input_dim_zero", lambda: features.RandomFourierFeatures(32, input_dim=0), Raises(ValueError, "input_dim"))
case("rff/seed_string", lambda: features.RandomFourierFeatures(32, input_dim=D, seed="0"), Raises(TypeError, "seed"))
case("rff/sampler_typo", lambda: features.RandomFourierFeatures(32, input_dim=D, sampler="orthogonl"), Raises(ValueError, "sampler", "orthogonal"))
case("rff/memory_guard", lambda: features.RandomFourierFeatures(10**9, input_dim=64, seed=0),
     Raises(ValueError, "num_features=1000000000", "input_dim=64", "GiB"))
case("rff/memory_guard_lazy", lambda: features.RandomFourierFeatures(10**9, seed=0)(torch.ones(2, 64, dtype=torch.float64)),
     Raises(ValueError, "num_features=1000000000", "GiB"))
case("kernel/memory_guard", lambda: kernels.SketchedRBFKernel(10**9, input_dim=64, seed=0),
     Raises(ValueError, "num_features", "GiB"))
case("polynomial_map/memory_guard", lambda: features.PolynomialSketch(3, 10**9, input_dim=64, projection="gaussian", seed=0),
     Raises(ValueError, "num_features", "GiB"))
case("polynomial_map/degree_float", lambda: features.PolynomialSketch(2.5, 32, input_dim=D), Raises(ValueError, "degree", "2.5"))
case("polynomial_map/degree_zero", lambda: features.PolynomialSketch(0, 32, input_dim=D), Raises(ValueError, "degree"))
case("polynomial_map/projection_typo", lambda: features.PolynomialSketch(2, 32, projection="srth"), Raises(ValueError, "projection", "srht"))
case("polynomial_map/negative_offset", lambda: features.PolynomialSketch(2, 32, offset=-1.0), Raises(ValueError, "offset"))
case("polynomial_kernel/power_float", lambda: kernels.SketchedPolynomialKernel(1.5, 32), Raises(ValueError, "power", "1.5"))
case("polynomial_kernel/power_string", lambda: kernels.SketchedPolynomialKernel("2", 32), Raises(TypeError, "power"))
case("polynomial_kernel/from_sphere_small_a", lambda: kernels.SketchedPolynomialKernel.from_sphere(1.0, 2, 32), Raises(ValueError, "a"))
case("matern/nu", lambda: kernels.SketchedMaternKernel(32, nu=1.0), Raises(ValueError, "nu", "1.5"))
case("rbf/method_typo", lambda: kernels.SketchedRBFKernel(32, method="sorff"), Raises(ValueError, "method", "sorf"))
case("rbf/num_features_float", lambda: kernels.SketchedRBFKernel(64.0), Raises(TypeError, "num_features"))
case("spherical_kernel/small_a", lambda: kernels.SketchedSphericalPolynomialKernel(2, 32, a=1.0), Raises(ValueError, "a"))
case("spherical_kernel/power_float", lambda: kernels.SketchedSphericalPolynomialKernel(2.5, 32), Raises((TypeError, ValueError), "power", "2.5"))
case("rq_density/alpha_zero", lambda: features.RationalQuadraticSpectralDensity(0.0), Raises(ValueError, "alpha"))
case("rq_density/alpha_nan", lambda: features.RationalQuadraticSpectralDensity(math.nan), Raises(ValueError, "alpha"))
case("gaussian_sketch/order_float", lambda: features.GaussianSketch(32, order=2.5, input_dim=D), Raises((ValueError, TypeError), "order"))
case("gaussian_sketch/no_order", lambda: features.GaussianSketch(32, input_dim=D), Raises(ValueError, "order"))
case("maclaurin/max_order_zero", lambda: features.RandomMaclaurin(rfgp.features.dot_product.exponential(), 32, max_order=0),
     Raises(ValueError, "max_order"))
case("random_feature_kernel/not_a_map", lambda: kernels.RandomFeatureKernel(torch.nn.Linear(2, 2)), Raises(TypeError, "feature_map"))
case("sum_kernel/exact_part", lambda: kernels.FeatureSumKernel(gpytorch.kernels.RBFKernel()), Raises(TypeError, "kernels[0]"))
case("curl_free/input_dim_float", lambda: kernels.SketchedCurlFreeKernel(32, input_dim=2.0), Raises(TypeError, "input_dim"))
case("decomposable/exact_base", lambda: kernels.SketchedDecomposableKernel(gpytorch.kernels.RBFKernel(), 2),
     Raises(TypeError, "data_covar_module"))
case("sketch/num_features_float", lambda: rfgp.sketch(gpytorch.kernels.RBFKernel(), 64.5), Raises(TypeError, "num_features"))


# unit sphere: tolerance from the dtype, message with enough digits
def _sphere_float32(name):
    def run():
        build, _ = SCALAR_KERNELS[name] if name in SCALAR_KERNELS else FEATURE_MAPS[name]
        x = torch.nn.functional.normalize(torch.randn(50, 64, generator=torch.Generator().manual_seed(1)) * 30, dim=-1)
        module = build().float() if name in FEATURE_MAPS else build()
        if name in FEATURE_MAPS:
            module = features.SphericalRandomFeatures(32, power=2, input_dim=64, seed=0).float()
            return module(x)
        module = kernels.SketchedPolynomialKernel.from_sphere(2.0, 2, 32, input_dim=64, seed=0).float()
        return module(x).to_dense()
    return run


case("polynomial_sphere/float32_normalised_rows", _sphere_float32("polynomial_sphere"), Finite())
case("spherical/float32_normalised_rows", _sphere_float32("spherical"), Finite())
case("polynomial_sphere/off_sphere_digits",
     lambda: SCALAR_KERNELS["polynomial_sphere"][0]().double()(unit_rows() * 1.0001).to_dense(),
     Raises(ValueError, "unit sphere", "1.0001"))
case("spherical/off_sphere_digits", lambda: FEATURE_MAPS["spherical"][0]().double()(unit_rows() * (1 - 3e-5)),
     Raises(ValueError, "unit sphere", "0.99997"))
case("spherical/normalize_zero_row", lambda: features.SphericalRandomFeatures(32, power=2, input_dim=D, normalize_inputs=True,
                                                                            seed=0).double()(torch.zeros(2, D, dtype=torch.float64)),
     Raises(ValueError, "all-zero row"))
case("polynomial_normalize/zero_row", lambda: kernels.SketchedPolynomialKernel(
    2, 16, input_dim=D, input_normalization="normalize", seed=0).double()(torch.zeros(2, D, dtype=torch.float64)).to_dense(),
     Raises(ValueError, "all-zero row"))
case("polynomial_normalize/ok", lambda: kernels.SketchedPolynomialKernel(
    2, 16, input_dim=D, input_normalization="normalize", seed=0).double()(data()).to_dense(), Finite())
for _name, _spec in (("lengthscale", 0.0), ("outputscale", -1.0), ("lengthscale", math.nan)):
    case(f"pyro/{_name}_{_spec}", lambda _name=_name, _spec=_spec: rfgp.pyro.RandomFeatureGP(
        FEATURE_MAPS["rff"][0](), rfgp.pyro.Gaussian(0.1), **{_name: _spec}), Raises(ValueError, _name))


# --------------------------------------------------------------------------- regression models
def _targets(value, own=True, rows=(0,)):
    def run():
        x = data(8)
        y = torch.sin(x.sum(-1))
        y[list(rows)] = value
        return mll_value(regression_model(x, y, own=own))
    return run


for own in (True, False):
    tag = "own" if own else "user"
    case(f"{tag}_gp/mll_ok", _targets(0.5, own), Finite())
    case(f"{tag}_gp/mll_nan_target", _targets(math.nan, own), Raises(ValueError, "target", "NaN"))
    case(f"{tag}_gp/mll_inf_target", _targets(math.inf, own, rows=(3,)), Raises(ValueError, "target", "Inf"))

    def _predict_nan_target(own=own):
        x = data(8)
        y = torch.sin(x.sum(-1))
        y[2] = math.nan
        return predict(regression_model(x, y, own=own), data(3, seed=1))

    case(f"{tag}_gp/predict_nan_target", _predict_nan_target, Raises(ValueError, "target", "NaN"))

    def _empty(own=own):
        return mll_value(regression_model(data(8)[:0], torch.zeros(0, dtype=torch.float64), own=own))

    case(f"{tag}_gp/mll_empty", _empty, Raises(ValueError, "empty"))

    def _predict_nan_x(own=own):
        return predict(regression_model(own=own), nan_at(data(3, seed=1)))

    case(f"{tag}_gp/predict_nan_test_x", _predict_nan_x, Raises(ValueError, "NaN"))

    def _predict_half(own=own):
        return predict(regression_model(own=own), data(3, seed=1).half())

    # a user's ExactGP concatenates train and test inputs before rfgp sees them (promoting to float64)
    case(f"{tag}_gp/predict_float16", _predict_half, Raises(TypeError, "float16") if own else Finite())

    def _predict_float32(own=own):
        return predict(regression_model(own=own), data(3, seed=1).float())

    case(f"{tag}_gp/predict_float32_on_float64_model", _predict_float32, Raises(TypeError, "float32") if own else Finite())

    def _predict_ok(own=own):
        return predict(regression_model(own=own), data(3, seed=1))

    case(f"{tag}_gp/predict_ok", _predict_ok, Finite())

    def _negative_noise(own=own):
        model = regression_model(own=own)
        model.likelihood.noise = -1.0


def _predict_wrong_dim(own):
    def run():
        model = regression_model(own=own)
        mll_value(model)
        return predict(model, torch.ones(3, D + 1, dtype=torch.float64))
    return run


case("own_gp/predict_wrong_dim", _predict_wrong_dim(True), Raises(ValueError, "x", str(D + 1), str(D)))
case("user_gp/predict_wrong_dim", _predict_wrong_dim(False), Foreign(RuntimeError, "Sizes of tensors must match"))
case("own_gp/nan_train_x", lambda: regression_model(nan_at(data(8))), Raises(ValueError, "train_x", "NaN"))
case("user_gp/nan_train_x_mll", lambda: mll_value(regression_model(nan_at(data(8)), own=False)),
     Foreign(RuntimeError, "You must train on the training inputs"))
case("own_gp/nan_train_y", lambda: regression_model(y=nan_at(torch.sin(data(8).sum(-1)), index=(1,))),
     Raises(ValueError, "train_y", "NaN"))
case("own_gp/train_x_half", lambda: regression_model(data(8).half()), Raises(TypeError, "train_x", "float16"))
case("own_gp/train_y_rows", lambda: regression_model(data(8), torch.zeros(5, dtype=torch.float64)), Raises(ValueError, "train_y", "5", "8"))
case("own_gp/train_y_batch", lambda: regression_model(data(8).expand(3, 8, D), torch.zeros(2, 8, dtype=torch.float64)),
     Raises(ValueError, "train_y", "(2,)", "(3,)"))
case("own_gp/kernel_ard_num_dims", lambda: regression_model(
    kernel=gpytorch.kernels.ScaleKernel(kernels.SketchedRBFKernel(32, ard_num_dims=D + 1, seed=0))),
     Raises(ValueError, "train_x", f"ard_num_dims={D + 1}", f"sees {D} columns"))
case("own_gp/exact_kernel_ard_broadcast", lambda: regression_model(
    data(8, d=1), kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=3))),
     Raises(ValueError, "train_x", "ard_num_dims=3", "sees 1 columns"))
case("own_gp/kernel_active_dims_outside", lambda: regression_model(
    kernel=kernels.SketchedRBFKernel(32, active_dims=[0, D], seed=0)),
     Raises(ValueError, "train_x", f"active_dims=[0, {D}]", f"0..{D - 1}"))


def _fit_nan_target():
    x = data(8)
    y = torch.sin(x.sum(-1))
    y[4] = math.nan
    model = regression_model(x, y, own=False)
    return rfgp.fit_mll(model, num_iterations=2)


case("fit_mll/nan_target", _fit_nan_target, Raises(ValueError, "target", "NaN"))


def _chunked_nan_target():
    with rfgp.settings.chunk_size(3):
        return _targets(math.nan, own=False, rows=(6,))()


case("chunked_gp/mll_nan_target", _chunked_nan_target, Raises(ValueError, "target", "NaN"))


def _dense_path_nan_target():
    # F ≥ N: the operator takes its dense Cholesky path
    x = data(4)
    y = torch.sin(x.sum(-1))
    y[1] = math.nan
    return mll_value(regression_model(x, y, own=False))


case("dense_gp/mll_nan_target", _dense_path_nan_target, Raises(ValueError, "target", "NaN"))


def _fixed_noise(value):
    def run():
        x = data(8)
        likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise=torch.full((8,), value, dtype=torch.float64))
        kernel = gpytorch.kernels.ScaleKernel(kernels.SketchedRBFKernel(4, input_dim=D, seed=0))
        from ._builders import GP

        return mll_value(GP(x, torch.sin(x.sum(-1)), kernel, likelihood).double())
    return run


case("fixed_noise/ok", _fixed_noise(0.1), Finite())
# GPyTorch's FixedGaussianNoise rounds noise below 1e-6 up to 1e-6 itself, with a NumericalWarning
case("fixed_noise/zero", _fixed_noise(0.0), Finite())
case("fixed_noise/nan", _fixed_noise(math.nan), Raises(ValueError, "noise", "NaN"))


def _maclaurin_fit(x):
    return lambda: features.OptimizedMaclaurin(rfgp.features.dot_product.exponential(), 32, input_dim=D, seed=0).double().fit(x)


case("maclaurin_fit/ok", lambda: _maclaurin_fit(data(8))()(data()), Finite())
case("maclaurin_fit/nan", _maclaurin_fit(nan_at(data(8))), Raises(ValueError, "x_sample", "NaN"))
case("refit_allocation/nan", lambda: kernels.refit_allocation(SCALAR_KERNELS["rbf_maclaurin"][0]().double(), nan_at(data(8))),
     Raises(ValueError, "x_sample", "NaN"))
case("gaussian_sketch_for_data/nan", lambda: features.GaussianSketch.for_data(nan_at(data(8)), 32, alpha=1e-3),
     Raises(ValueError, "x", "NaN"))
case("cholesky_update/nan", lambda: rfgp.inference.cholesky_update.cholesky_update(
    torch.eye(3, dtype=torch.float64), torch.full((3, 1), math.nan, dtype=torch.float64)), Raises(ValueError, "vectors", "NaN"))
case("cholesky_update/ok", lambda: rfgp.inference.cholesky_update.cholesky_update(
    torch.eye(3, dtype=torch.float64), torch.ones(3, 1, dtype=torch.float64)), Finite())


# --------------------------------------------------------------------------- streaming
def _stream(*batches, predict_at=None):
    def run():
        gp = streaming_model()
        for x, y in batches:
            gp.update(x, y)
        if predict_at is not None:
            return gp(predict_at)
        return gp.log_marginal_likelihood()
    return run


_x = data(8)
_y = torch.sin(_x.sum(-1))
case("streaming/ok", _stream((_x, _y)), Finite())
case("streaming/predict_ok", _stream((_x, _y), predict_at=data(3, seed=1)), Finite())
case("streaming/nan_y", _stream((_x, nan_at(_y, index=(2,)))), Raises(ValueError, "y", "NaN"))
case("streaming/inf_y", _stream((_x, nan_at(_y, index=(2,), value=math.inf))), Raises(ValueError, "y", "Inf"))
case("streaming/nan_x", _stream((nan_at(_x), _y)), Raises(ValueError, "x", "NaN"))
case("streaming/float32_after_float64", _stream((_x, _y), (_x.float(), _y.float())), Raises(TypeError, "float32", "float64"))
case("streaming/float32_y", _stream((_x, _y.float())), Raises(TypeError, "y", "float32"))
case("streaming/half_batch", _stream((_x.half(), _y.half())), Raises(TypeError, "float16"))
case("streaming/empty_batch", _stream((_x, _y), (_x[:0], _y[:0])), Finite())  # a no-op, as a filtering DataLoader's
case("streaming/empty_batch_wrong_dim", _stream((_x, _y), (torch.ones(0, D + 1, dtype=torch.float64), _y[:0])),
     Raises(ValueError, "x", str(D + 1)))
case("streaming/empty_batch_float32", _stream((_x, _y), (_x[:0].float(), _y[:0].float())),
     Raises(TypeError, "float32", "float64"))
case("streaming/predict_wrong_dim", _stream((_x, _y), predict_at=torch.ones(2, D + 1, dtype=torch.float64)),
     Raises(ValueError, "x", str(D + 1)))
case("streaming/y_shape", _stream((_x, _y[:5])), Raises(ValueError, "y"))
case("streaming/integer_y", _stream((_x, _y.round().long())), Raises(TypeError, "y", "int64"))
case("fit_from_batches/not_pairs", lambda: rfgp.fit_from_batches(streaming_model(), [(_x,)]), Raises(ValueError, "(x, y)"))
case("fit_from_batches/nan_batch", lambda: rfgp.fit_from_batches(streaming_model(), [(_x, _y), (_x, nan_at(_y, index=(0,)))]),
     Raises(ValueError, "y", "NaN"))
case("streaming/exact_kernel", lambda: rfgp.StreamingFeatureGP(gpytorch.kernels.RBFKernel(), gpytorch.likelihoods.GaussianLikelihood()),
     Raises(TypeError, "covar_module"))
case("streaming/rank_update_typo", lambda: rfgp.StreamingFeatureGP(SCALAR_KERNELS["rbf_rff"][0](),
                                                                  gpytorch.likelihoods.GaussianLikelihood(), rank_update="alway"),
     Raises(ValueError, "rank_update"))


# --------------------------------------------------------------------------- multi-output
def _multi_mll(**kwargs):
    def run():
        model = multioutput_model(**kwargs)
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        return mll(model(*model.train_inputs), model.train_targets)
    return run


def _multi_predict(x_test):
    def run():
        model = multioutput_model()
        _multi_mll()()
        model.eval()
        with torch.no_grad():
            return model(x_test).mean
    return run


_y2 = torch.stack((torch.sin(_x[:, 0]), torch.cos(_x[:, 1])), -1)
case("multioutput/mll_ok", _multi_mll(), Finite())
case("multioutput/predict_ok", _multi_predict(data(3, seed=1)), Finite())
case("multioutput/nan_y", _multi_mll(y=nan_at(_y2)), Raises(ValueError, "train_y", "NaN"))
case("multioutput/inf_y", _multi_mll(y=nan_at(_y2, value=-math.inf)), Raises(ValueError, "train_y", "Inf"))
case("multioutput/nan_x", _multi_mll(x=nan_at(_x)), Raises(ValueError, "train_x", "NaN"))
case("multioutput/predict_wrong_dim", _multi_predict(torch.ones(3, D + 1, dtype=torch.float64)), Raises(ValueError, "x", str(D + 1)))
case("multioutput/predict_nan", _multi_predict(nan_at(data(3, seed=1))), Raises(ValueError, "NaN"))
case("multioutput/y_columns", _multi_mll(y=_y2[:, :1]), Raises(ValueError, "train_y", "num_outputs_per_input"))
case("multioutput/y_rows", _multi_mll(y=_y2[:5]), Raises(ValueError, "train_y", "5"))
case("multioutput/y_one_dimensional", _multi_mll(y=_y2[:, 0]), Raises(ValueError, "train_y"))
case("multioutput/empty", _multi_mll(x=_x[:0], y=_y2[:0]), Raises(ValueError, "empty"))
case("multioutput/kernel_input_dim",
     lambda: multioutput_model(kernel=kernels.SketchedCurlFreeKernel(32, D + 1, seed=0)),
     Raises(ValueError, "train_x", f"input_dim={D + 1}", f"sees {D} columns"))
case("multioutput/decomposable_ard_num_dims", lambda: multioutput_model(kernel=kernels.SketchedDecomposableKernel(
    kernels.SketchedRBFKernel(32, ard_num_dims=D + 1, seed=0), num_tasks=D)),
     Raises(ValueError, "train_x", f"ard_num_dims={D + 1}", f"sees {D} columns"))
case("multioutput/mean_num_tasks", lambda: rfgp.MultiOutputGPModel(
    _x, _y2, gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=D, rank=0),
    kernels.SketchedCurlFreeKernel(32, D, seed=0), gpytorch.means.MultitaskMean(gpytorch.means.ZeroMean(), D + 1)),
     Raises(ValueError, "mean_module", f"num_tasks={D + 1}", f"{D} outputs"))


# --------------------------------------------------------------------------- Dirichlet classification
_labels = torch.tensor([0, 1, 2, 1, 0, 2, 1, 0])


def _dirichlet_mll(labels, **kwargs):
    def run():
        model = dirichlet_model(labels, **kwargs)
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        return mll(model(*model.train_inputs), model.train_targets).sum()
    return run


case("dirichlet/mll_ok", _dirichlet_mll(_labels), Finite())
case("dirichlet/label_out_of_range", lambda: DirichletClassificationLikelihood(_labels, num_classes=2),
     Raises(ValueError, "targets", "0..1"))
case("dirichlet/negative_label", lambda: DirichletClassificationLikelihood(_labels - 1, num_classes=3),
     Raises(ValueError, "targets", "-1"))
case("dirichlet/nan_label", lambda: DirichletClassificationLikelihood(nan_at(_labels.double(), index=(0,))),
     Raises(ValueError, "targets", "nan"))
case("dirichlet/fractional_label", lambda: DirichletClassificationLikelihood(_labels.double() + 0.5),
     Raises(ValueError, "targets", "0.5"))
case("dirichlet/bool_labels", lambda: DirichletClassificationLikelihood(_labels > 0), Raises(TypeError, "targets"))
case("dirichlet/empty_labels", lambda: DirichletClassificationLikelihood(_labels[:0]), Raises(ValueError, "targets"))
case("dirichlet/two_dim_labels", lambda: DirichletClassificationLikelihood(_labels.reshape(2, 4)), Raises(ValueError, "targets"))
case("dirichlet/one_class", lambda: DirichletClassificationLikelihood(torch.zeros(4, dtype=torch.long)), Raises(ValueError, "num_classes"))
case("dirichlet/alpha_zero", lambda: DirichletClassificationLikelihood(_labels, alpha_epsilon=0.0), Raises(ValueError, "alpha_epsilon"))
case("dirichlet/alpha_nan", lambda: DirichletClassificationLikelihood(_labels, alpha_epsilon=math.nan), Raises(ValueError, "alpha_epsilon"))
case("dirichlet/dtype_int", lambda: DirichletClassificationLikelihood(_labels, dtype=torch.int64), Raises(TypeError, "dtype"))
case("dirichlet/dtype_half", lambda: DirichletClassificationLikelihood(_labels, dtype=torch.float16), Raises(TypeError, "dtype", "float16"))
case("dirichlet/nan_x", _dirichlet_mll(_labels, x=nan_at(data(8))), Raises(ValueError, "train_x", "NaN"))


def _dirichlet_predict_proba(method):
    def run():
        model = dirichlet_model(_labels)
        model.eval()
        with torch.no_grad():
            return model.likelihood.predict_proba(model(data(3, seed=1)), method=method, num_samples=64)
    return run


case("dirichlet/predict_proba_mc", _dirichlet_predict_proba("mc"), Finite())
case("dirichlet/predict_proba_mean_field", _dirichlet_predict_proba("mean_field"), Finite())
case("dirichlet/predict_proba_method_typo", _dirichlet_predict_proba("meanfield"), Raises(ValueError, "method"))


def _classifier(x, y, **kwargs):
    return lambda: rfgp.models.DirichletGPClassifier(num_features=32, num_iterations=1, **kwargs).fit(x, y).predict_proba(x)


case("classifier/ok", _classifier(data(12), torch.arange(12) % 3), Finite())
case("classifier/nan_X", _classifier(nan_at(data(12)), torch.arange(12) % 3), Raises(ValueError, "X", "NaN"))
case("classifier/one_class", _classifier(data(12), torch.zeros(12)), Raises(ValueError, "y", "two classes"))
case("classifier/y_rows", _classifier(data(12), torch.arange(10) % 3), Raises(ValueError, "y", "12"))
case("classifier/X_1d", _classifier(torch.ones(12, dtype=torch.float64), torch.arange(12) % 3), Raises(ValueError, "X"))
# the arguments are checked by fit (scikit-learn's contract: the constructor and set_params only store them)
_labels12 = torch.arange(12) % 3
case("classifier/validation_fraction", _classifier(data(12), _labels12, validation_fraction=1.5), Raises(ValueError, "validation_fraction"))
case("classifier/dtype_half", _classifier(data(12), _labels12, dtype=torch.float16), Raises(TypeError, "dtype", "float16"))
case("classifier/alpha_empty", _classifier(data(12), _labels12, alpha_epsilon=[]), Raises(ValueError, "alpha_epsilon"))
case("classifier/continuous_y", _classifier(data(12), torch.linspace(0, 1, 12)), Raises(ValueError, "y", "continuous"))


# --------------------------------------------------------------------------- distances
def _rff():
    return features.RandomFourierFeatures(64, input_dim=D, seed=0).double()


_p, _q = data(10), data(9, seed=1) + 0.5
case("distance/ok", lambda: distances.kernel_distance(_rff(), _p, _q), Finite())
case("distance/identical_sets", lambda: distances.kernel_distance(_rff(), _p, _p), Finite())
case("distance/nan_p", lambda: distances.kernel_distance(_rff(), nan_at(_p), _q), Raises(ValueError, "p", "NaN"))
case("distance/inf_q", lambda: distances.kernel_distance(_rff(), _p, nan_at(_q, value=math.inf)), Raises(ValueError, "q", "Inf"))
case("distance/empty_p", lambda: distances.kernel_distance(_rff(), _p[:0], _q), Raises(ValueError, "p"))
case("distance/q_wrong_dim", lambda: distances.kernel_distance(_rff(), _p, torch.ones(3, D + 1, dtype=torch.float64)),
     Raises(ValueError, "q", str(D + 1)))
case("distance/half", lambda: distances.kernel_distance(_rff(), _p.half(), _q.half()), Raises(TypeError, "float16"))
case("distance/p_q_dtypes", lambda: distances.kernel_distance(_rff(), _p, _q.float()), Raises(TypeError, "q", "float32"))
case("distance/chunk_size_zero", lambda: distances.kernel_distance(_rff(), _p, _q, chunk_size=0), Raises(ValueError, "chunk_size"))
case("exact_distance/ok", lambda: distances.exact_gaussian_kernel_distance(_p, _q), Finite())
case("exact_distance/nan_q", lambda: distances.exact_gaussian_kernel_distance(_p, nan_at(_q)), Raises(ValueError, "q", "NaN"))
case("exact_distance/lengthscale_zero", lambda: distances.exact_gaussian_kernel_distance(_p, _q, lengthscale=0.0),
     Raises(ValueError, "lengthscale"))
case("exact_kernel_distance/nan_p", lambda: distances.exact_kernel_distance(distances.gaussian_kernel(), nan_at(_p), _q),
     Raises(ValueError, "p", "NaN"))
case("gaussian_kernel/lengthscale_negative", lambda: distances.gaussian_kernel(-1.0), Raises(ValueError, "lengthscale"))
case("two_sample/ok", lambda: distances.two_sample_test(_rff(), _p, _q, num_permutations=20, seed=0).statistic, Finite())
case("two_sample/level", lambda: distances.two_sample_test(_rff(), _p, _q, level=1.5), Raises(ValueError, "level"))
case("two_sample/level_nan", lambda: distances.two_sample_test(_rff(), _p, _q, level=math.nan), Raises(ValueError, "level"))
case("two_sample/nan_p", lambda: distances.two_sample_test(_rff(), nan_at(_p), _q), Raises(ValueError, "p", "NaN"))
case("two_sample/seed_float", lambda: distances.two_sample_test(_rff(), _p, _q, seed=1.5), Raises(TypeError, "seed"))
case("kernel_pca/ok", lambda: distances.kernel_pca(_rff(), _p, 3), Finite())
case("kernel_pca/too_many", lambda: distances.kernel_pca(_rff(), _p, 11), Raises(ValueError, "num_components"))
case("kernel_pca/nan_x", lambda: distances.kernel_pca(_rff(), nan_at(_p), 2), Raises(ValueError, "x", "NaN"))
case("two_sketch_pca/nan_x", lambda: distances.two_sketch_kernel_pca(_rff(), _rff(), nan_at(_p), 2), Raises(ValueError, "x", "NaN"))
case("mean_embedding/nan_x", lambda: distances.kernel_mean_embedding(_rff(), nan_at(_p)), Raises(ValueError, "x", "NaN"))
case("projection_residual/basis_rows", lambda: distances.projection_residual(distances.gaussian_kernel(), _p, torch.ones(3, 2)),
     Raises(ValueError, "basis"))


# --------------------------------------------------------------------------- metrics
_K = torch.eye(4, dtype=torch.float64) + 0.1
_probs = torch.softmax(torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64), -1)
_lab = torch.tensor([0, 1, 2, 0, 1, 2])
_mean, _var = torch.zeros(5, dtype=torch.float64), torch.ones(5, dtype=torch.float64)
case("frobenius/ok", lambda: metrics.relative_frobenius_error(_K * 1.1, _K), Finite())
case("frobenius/zero_exact", lambda: metrics.relative_frobenius_error(_K, torch.zeros_like(_K)), Raises(ValueError, "exact", "zero"))
case("frobenius/nan_approx", lambda: metrics.relative_frobenius_error(nan_at(_K), _K), Raises(ValueError, "approx", "NaN"))
case("frobenius/shape", lambda: metrics.relative_frobenius_error(_K[:3, :3], _K), Raises(ValueError, "approx"))
case("kl/ok", lambda: metrics.gaussian_kl_divergence(_mean, _var, _mean + 1, _var * 2), Finite())
case("kl/nan_mean", lambda: metrics.gaussian_kl_divergence(nan_at(_mean, index=(0,)), _var, _mean, _var),
     Raises(ValueError, "mean_approx", "NaN"))
case("kl/negative_variance", lambda: metrics.gaussian_kl_divergence(_mean, -_var, _mean, _var), Raises(ValueError, "var_approx"))
case("kl/min_variance_negative", lambda: metrics.gaussian_kl_divergence(_mean, _var, _mean, _var, min_variance=-1.0),
     Raises(ValueError, "min_variance"))
case("mean_kernel/empty", lambda: distances.mean_kernel(distances.gaussian_kernel(), _p[:0], _q), Raises(ValueError, "x"))
case("kl/shape", lambda: metrics.gaussian_kl_divergence(_mean, _var[:3], _mean, _var), Raises(ValueError, "shape"))
case("gaussian_mnll/ok", lambda: metrics.gaussian_mnll(_mean, _var, _mean + 0.5), Finite())
case("gaussian_mnll/zero_variance", lambda: metrics.gaussian_mnll(_mean, _var * 0, _mean), Raises(ValueError, "variance"))
case("gaussian_mnll/nan_targets", lambda: metrics.gaussian_mnll(_mean, _var, nan_at(_mean, index=(1,))),
     Raises(ValueError, "targets", "NaN"))
case("gaussian_mnll/shape", lambda: metrics.gaussian_mnll(_mean, _var, _mean[:2]), Raises(ValueError, "targets"))
case("classification_error/ok", lambda: metrics.classification_error(_probs, _lab), Finite())
case("classification_error/nan_probs", lambda: metrics.classification_error(nan_at(_probs), _lab), Raises(ValueError, "probs", "NaN"))
case("mnll/label_range", lambda: metrics.mean_negative_log_likelihood(_probs, _lab + 1), Raises(ValueError, "labels", "0..2"))
case("mnll/float_labels", lambda: metrics.mean_negative_log_likelihood(_probs, _lab.double() + 0.5), Raises(ValueError, "labels"))
case("mnll/ok", lambda: metrics.mean_negative_log_likelihood(_probs, _lab), Finite())
case("ece/ok", lambda: metrics.expected_calibration_error(_probs, _lab), Finite())
case("ece/bins_zero", lambda: metrics.expected_calibration_error(_probs, _lab, num_bins=0), Raises(ValueError, "num_bins"))
case("ece/negative_probs", lambda: metrics.expected_calibration_error(_probs - 1, _lab), Raises(ValueError, "probs"))


# --------------------------------------------------------------------------- Pyro
def _pyro_model(likelihood=None):
    from rfgp import pyro as rpyro

    return rpyro.RandomFeatureGP(features.RandomFourierFeatures(16, input_dim=D, seed=0).double(),
                                 likelihood if likelihood is not None else rpyro.Gaussian(noise=0.1))


def _pyro_trace(x, y, likelihood=None):
    def run():
        import pyro

        pyro.set_rng_seed(0)
        trace = pyro.poutine.trace(_pyro_model(likelihood)).get_trace(x, y)
        return trace.log_prob_sum()
    return run


def _pyro_likelihood(name, *args):
    from rfgp import pyro as rpyro

    return getattr(rpyro, name)(*args)


case("pyro/ok", _pyro_trace(_x, _y), Finite())
case("pyro/nan_y", _pyro_trace(_x, nan_at(_y, index=(0,))), Raises(ValueError, "y", "NaN"))
case("pyro/nan_x", _pyro_trace(nan_at(_x), _y), Raises(ValueError, "x", "NaN"))
case("pyro/half_x", _pyro_trace(_x.half(), _y), Raises(TypeError, "float16"))
case("pyro/y_rows", _pyro_trace(_x, _y[:3]), Raises(ValueError, "y"))
case("pyro/bernoulli_y", _pyro_trace(_x, _y * 0 + 2, _pyro_likelihood("Bernoulli")), Raises(ValueError, "y"))
case("pyro/categorical_float", _pyro_trace(_x, _y, _pyro_likelihood("Categorical", 3)), Raises(TypeError, "y"))
case("pyro/categorical_range", _pyro_trace(_x, torch.full((8,), 3), _pyro_likelihood("Categorical", 3)), Raises(ValueError, "y", "0..2"))
case("pyro/poisson_negative", _pyro_trace(_x, -torch.ones(8, dtype=torch.float64), _pyro_likelihood("Poisson")), Raises(ValueError, "y"))
case("pyro/gaussian_noise_zero", lambda: _pyro_likelihood("Gaussian", 0.0), Raises(ValueError, "noise"))
case("pyro/fit_svi_steps", lambda: rfgp.pyro.fit_svi(_pyro_model(), rfgp.pyro.weight_guide(_pyro_model()), _x, _y, num_steps=0),
     Raises(ValueError, "num_steps"))


# --------------------------------------------------------------------------- vector fields and datasets
def _vector_field_model():
    model = multioutput_model()
    model.eval()
    return model


case("vector_fields/divergence_ok", lambda: rfgp.applications.vector_fields.divergence(rfgp.applications.vector_fields.posterior_mean_field(_vector_field_model()), data(3)),
     Finite())
case("vector_fields/divergence_nan", lambda: rfgp.applications.vector_fields.divergence(
    rfgp.applications.vector_fields.posterior_mean_field(_vector_field_model()), nan_at(data(3))), Raises(ValueError, "NaN"))
case("vector_fields/curl_4d", lambda: rfgp.applications.vector_fields.curl(lambda x: x * 2, torch.ones(3, 4, dtype=torch.float64)), Raises(ValueError, "curl"))
case("vector_fields/divergence_not_square", lambda: rfgp.applications.vector_fields.divergence(lambda x: x[..., :1], data(3)), Raises(ValueError))
case("vector_fields/prior_samples_zero", lambda: rfgp.applications.vector_fields.prior_field_samples(VECTOR_KERNELS["curl_free"](), 0, anchors=data(3)),
     Raises(ValueError, "num_samples"))
case("vector_fields/prior_no_anchors", lambda: rfgp.applications.vector_fields.prior_field_samples(VECTOR_KERNELS["curl_free"](), 2),
     Raises(ValueError, "anchors"))
case("vector_fields/posterior_samples_ok", lambda: rfgp.applications.vector_fields.posterior_field_samples(
    _vector_field_model(), 2, generator=torch.Generator().manual_seed(0))(data(3)), Finite())
case("datasets/helmholtz_ok", lambda: rfgp.datasets.helmholtz_field(5)["y"], Finite())
case("datasets/helmholtz_n_zero", lambda: rfgp.datasets.helmholtz_field(0), Raises(ValueError, "n"))
case("datasets/helmholtz_dim", lambda: rfgp.datasets.helmholtz_field(5, input_dim=4), Raises(ValueError, "input_dim"))
case("datasets/helmholtz_noise", lambda: rfgp.datasets.helmholtz_field(5, noise=-1.0), Raises(ValueError, "noise"))
case("datasets/helmholtz_dtype", lambda: rfgp.datasets.helmholtz_field(5, dtype=torch.float16), Raises(TypeError, "dtype"))
case("datasets/helmholtz_dim_float", lambda: rfgp.datasets.helmholtz_field(5, input_dim=2.0),
     Raises(TypeError, "input_dim"))
case("datasets/helmholtz_width_zero", lambda: rfgp.datasets.helmholtz_field(5, width=0.0), Raises(ValueError, "width"))
case("datasets/helmholtz_width_nan", lambda: rfgp.datasets.helmholtz_field(5, width=math.nan),
     Raises(ValueError, "width"))
case("datasets/helmholtz_no_bumps", lambda: rfgp.datasets.helmholtz_field(5, num_bumps=0),
     Raises(ValueError, "num_bumps"))
case("datasets/helmholtz_bumps_float", lambda: rfgp.datasets.helmholtz_field(5, num_bumps=1.5),
     Raises(TypeError, "num_bumps"))
case("datasets/helmholtz_field_columns", lambda: rfgp.datasets.helmholtz_field(5)["field"](data(3, d=3)),
     Raises(ValueError, "x", "(n, 2)"))
case("datasets/igrf_altitude_triple", lambda: rfgp.datasets.igrf_magnetic_field(5, altitude_km=(0.0, 1.0, 2.0)),
     Raises(ValueError, "altitude_km"))
case("datasets/igrf_date_string", lambda: rfgp.datasets.igrf_magnetic_field(5, date="2020-01-01"),
     Raises(TypeError, "date"))
case("datasets/igrf_date_outside", lambda: rfgp.datasets.igrf_magnetic_field(5, date=datetime.datetime(1800, 1, 1)),
     Raises(ValueError, "date", "1900-01-01"))
case("datasets/igrf_at_centre", lambda: rfgp.datasets.igrf_field_at(torch.zeros(2, 3, dtype=torch.float64)),
     Raises(ValueError, "positions", "index 0"))
case("vector_fields/jacobian_detached_field", lambda: rfgp.applications.vector_fields.divergence(
    lambda z: torch.ones_like(z).detach(), data(3)), Raises(TypeError, "field", "detached"))
case("vector_fields/jacobian_non_tensor_field", lambda: rfgp.applications.vector_fields.divergence(
    lambda z: z.tolist(), data(3)), Raises(TypeError, "field", "list"))
case("vector_fields/prior_jitter_negative", lambda: rfgp.applications.vector_fields.prior_field_samples(
    rfgp.kernels.CurlFreeRBFKernel(2), 2, anchors=data(3), jitter=-1.0), Raises(ValueError, "jitter"))
case("vector_fields/prior_jitter_nan", lambda: rfgp.applications.vector_fields.prior_field_samples(
    rfgp.kernels.CurlFreeRBFKernel(2), 2, anchors=data(3), jitter=math.nan), Raises(ValueError, "jitter"))
case("vector_fields/sketched_active_dims", lambda: rfgp.kernels.SketchedCurlFreeKernel(64, 2, active_dims=[0, 1, 2]),
     Raises(ValueError, "active_dims", "input_dim=2"))


# --------------------------------------------------------------------------- settings
case("settings/memory_budget_zero", lambda: rfgp.settings.memory_budget(0), Raises(ValueError, "memory_budget"))
case("settings/chunk_size_float", lambda: rfgp.settings.chunk_size(2.5), Raises(TypeError, "chunk_size"))
case("settings/validate_inputs_string", lambda: rfgp.settings.validate_inputs("no"), Raises(TypeError, "validate_inputs"))
case("settings/float32_statistics_tolerance_negative", lambda: rfgp.settings.float32_statistics_tolerance(-1e-3),
     Raises(ValueError, "float32_statistics_tolerance"))
case("settings/float32_statistics_tolerance_nan", lambda: rfgp.settings.float32_statistics_tolerance(math.nan),
     Raises(ValueError, "float32_statistics_tolerance"))
case("settings/float32_statistics_tolerance_string", lambda: rfgp.settings.float32_statistics_tolerance("auto"),
     Raises(TypeError, "float32_statistics_tolerance"))


def _opt_out():
    with rfgp.settings.validate_inputs(False):
        phi = FEATURE_MAPS["rff"][0]().double()(nan_at(data()))
    assert torch.isnan(phi).any()  # the user opted out: no check, no error
    return torch.ones(1)


case("settings/validate_inputs_opt_out", _opt_out, Finite())
case("settings/validate_inputs_restored", lambda: FEATURE_MAPS["rff"][0]().double()(nan_at(data())), Raises(ValueError, "NaN"))


#: rows whose error comes from inside GPyTorch (its ``ExactGP.__call__``, before any rfgp code)
FOREIGN = [name for name, _, expected in CASES if isinstance(expected, Foreign)]


def test_table_size():
    assert len(CASES) >= 150
    assert len(FOREIGN) <= 6
    assert len({name for name, _, _ in CASES}) == len(CASES)


@pytest.mark.parametrize("name, build, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input(name, build, expected):
    torch.manual_seed(0)
    if isinstance(expected, Raises):
        with pytest.raises(expected.types) as info:
            build()
        message = str(info.value)
        for substring in expected.substrings:
            assert substring in message, f"{name}: {substring!r} not in {message!r}"
        return
    result = build()
    for tensor in _tensors(result):
        assert torch.isfinite(tensor).all(), f"{name}: non-finite result"
        assert expected.dtype is None or tensor.dtype == expected.dtype, f"{name}: {tensor.dtype}"
