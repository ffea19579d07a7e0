"""state_dict of every rfgp feature map and kernel: tensors only, bit-exact round trips, refused mismatches.

Every public FeatureMap of :mod:`rfgp.features` and every public kernel of :mod:`rfgp.kernels` is
built from a table (a coverage test keeps the tables complete).  A state saved with
``torch.save`` and read back with ``torch.load(weights_only=True)`` must reproduce the features
and the covariance bit for bit in a fresh module built with another seed (lazy or not), and a
state saved from a differently configured module must raise a ``ValueError`` naming the field.
"""

from __future__ import annotations

import inspect
import io
import math

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp import features, kernels
from rfgp.core.config_state import CONFIG_PREFIX, decode, encode
from rfgp.features import (
    GaussianSketch,
    GaussianSketchHD,
    MaternSpectralDensity,
    OperatorValuedFourierFeatures,
    OptimizedMaclaurin,
    PolynomialSketch,
    RandomFourierFeatures,
    RandomMaclaurin,
    RationalQuadraticSpectralDensity,
    SphericalRandomFeatures,
    dot_product,
)
from rfgp.kernels import (
    ConstantFeatureKernel,
    CosineFeatureKernel,
    CurlFreeRBFKernel,
    DecomposableKernel,
    DivFreeRBFKernel,
    FeatureProductKernel,
    FeatureSumKernel,
    LinearFeatureKernel,
    MultiOutputFeatureSumKernel,
    NystromKernel,
    RandomFeatureKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedExponentialKernel,
    SketchedMatern52KernelGrad,
    SketchedMaternKernel,
    SketchedPeriodicKernel,
    SketchedPolynomialKernel,
    SketchedPolynomialKernelGrad,
    SketchedProductKernel,
    SketchedRBFKernel,
    SketchedRBFKernelGrad,
    SketchedRBFKernelGradGrad,
    SketchedRQKernel,
    SketchedSpectralMixtureKernel,
    SketchedSphericalPolynomialKernel,
    SpectralProductKernel,
)
from rfgp.likelihoods import DirichletClassificationLikelihood

F64 = torch.float64


def _inputs(d: int, sphere: bool = False) -> torch.Tensor:
    x = torch.randn(7, d, dtype=F64, generator=torch.Generator().manual_seed(3))
    return torch.nn.functional.normalize(x, dim=-1) if sphere else 0.5 * x


# name -> (build(seed, input_dim) -> feature map, input dimension, inputs on the unit sphere)
FEATURE_MAPS = {
    "rff": (lambda s, d: RandomFourierFeatures(16, input_dim=d, seed=s), 3, False),
    "orf_matern": (lambda s, d: RandomFourierFeatures(16, input_dim=d, sampler="orthogonal",
                                                      spectral_density=MaternSpectralDensity(1.5), seed=s), 3, False),
    "sorf_rq": (lambda s, d: RandomFourierFeatures(16, input_dim=d, sampler="structured",
                                                   spectral_density=RationalQuadraticSpectralDensity(2.0), seed=s),
                3, False),
    "polynomial_srht_ctr": (lambda s, d: PolynomialSketch(3, 16, input_dim=d, offset=1.0, projection="srht",
                                                          weights="ctr", seed=s), 3, False),
    "polynomial_hierarchical": (lambda s, d: PolynomialSketch(2, 16, input_dim=d, projection="hierarchical", seed=s),
                                3, False),
    "optimized_maclaurin": (lambda s, d: OptimizedMaclaurin(dot_product.gaussian(), 21, input_dim=d,
                                                            projection="srht", weights="ctr", seed=s), 3, False),
    "random_maclaurin": (lambda s, d: RandomMaclaurin(dot_product.polynomial(3), 20, input_dim=d, seed=s), 3, False),
    "srf": (lambda s, d: SphericalRandomFeatures(16, power=3, input_dim=d, seed=s), 3, True),
    "srf_orth": (lambda s, d: SphericalRandomFeatures(16, power=3, input_dim=d, direction_sampler="structured",
                                                      seed=s), 3, True),
    "gaussian_sketch": (lambda s, d: GaussianSketch(64, order=3, mode="tree", input_dim=d, seed=s), 3, False),
    "gaussian_sketch_hd": (lambda s, d: GaussianSketchHD(64, radius=1.0, alpha=1e-2, input_dim=d, seed=s), 3, False),
    "operator_valued": (lambda s, d: OperatorValuedFourierFeatures(16, input_dim=2 if d is None else d,
                                                                   family="divergence_free", seed=s), 2, False),
}
LAZY_MAPS = [name for name in FEATURE_MAPS if name != "operator_valued"]  # ORFF needs its d up front


def _sum_kernel(s):
    return FeatureSumKernel(ScaleKernel(SketchedRBFKernel(8, input_dim=3, seed=s)),
                            SketchedMaternKernel(8, nu=0.5, input_dim=3, seed=s + 1))


def _product_kernel(s):
    return FeatureProductKernel(SketchedRBFKernel(8, input_dim=3, seed=s),
                                SketchedPolynomialKernel(2, 8, input_dim=3, seed=s + 1))


def _spectral_product(s):
    return SpectralProductKernel(SketchedRBFKernel(8, input_dim=3, seed=s), ScaleKernel(SketchedMaternKernel(8, seed=s)),
                                 num_features=16, seed=s)


def _tensor_srht_product(s):
    return SketchedProductKernel(SketchedRBFKernel(8, input_dim=3, seed=s),
                                 SketchedPolynomialKernel(2, 8, input_dim=3, seed=s + 1), num_features=16, seed=s + 2)


def _helmholtz(s):
    return MultiOutputFeatureSumKernel(ScaleKernel(SketchedCurlFreeKernel(16, 2, seed=s)),
                                       ScaleKernel(SketchedDivFreeKernel(16, 2, seed=s + 1)))


# name -> (build(seed) -> kernel, input dimension, inputs on the unit sphere)
KERNELS = {
    "rbf_rff": (lambda s: SketchedRBFKernel(16, input_dim=3, seed=s), 3, False),
    "rbf_orf": (lambda s: SketchedRBFKernel(16, method="orf", input_dim=3, seed=s), 3, False),
    "rbf_sorf": (lambda s: SketchedRBFKernel(16, method="sorf", input_dim=3, seed=s), 3, False),
    "rbf_maclaurin": (lambda s: SketchedRBFKernel(21, method="maclaurin", input_dim=3, seed=s), 3, False),
    "rbf_gaussian_sketch": (lambda s: SketchedRBFKernel(64, method="gaussian_sketch", order=3, mode="tree",
                                                        input_dim=3, seed=s), 3, False),
    "matern": (lambda s: SketchedMaternKernel(16, nu=1.5, method="orf", input_dim=3, seed=s), 3, False),
    "polynomial": (lambda s: SketchedPolynomialKernel(3, 16, input_dim=3, seed=s), 3, False),
    "polynomial_maclaurin": (lambda s: SketchedPolynomialKernel(3, 21, method="maclaurin", weights="real",
                                                                input_dim=3, seed=s), 3, False),
    "exponential": (lambda s: SketchedExponentialKernel(21, method="random_maclaurin", input_dim=3, seed=s), 3, False),
    "exponential_maclaurin": (lambda s: SketchedExponentialKernel(21, input_dim=3, seed=s), 3, False),
    "spherical": (lambda s: SketchedSphericalPolynomialKernel(3, 16, input_dim=3, seed=s), 3, True),
    "random_feature": (lambda s: RandomFeatureKernel(RandomFourierFeatures(16, input_dim=3, seed=s)), 3, False),
    "sum": (_sum_kernel, 3, False),
    "product": (_product_kernel, 3, False),
    "spectral_product": (_spectral_product, 3, False),
    "tensor_srht_product": (_tensor_srht_product, 3, False),
    "curl_free": (lambda s: SketchedCurlFreeKernel(16, 2, seed=s), 2, False),
    "div_free": (lambda s: SketchedDivFreeKernel(16, 2, method="orf", seed=s), 2, False),
    "decomposable": (lambda s: SketchedDecomposableKernel(SketchedRBFKernel(16, input_dim=2, seed=s), 2), 2, False),
    "helmholtz": (_helmholtz, 2, False),
    "lcm": (lambda s: kernels.SketchedLCMKernel(
        SketchedDecomposableKernel(SketchedRBFKernel(16, input_dim=2, seed=s), 2),
        SketchedDecomposableKernel(SketchedRBFKernel(8, input_dim=2, seed=s + 1), 2, rank=2)), 2, False),
    "exact_curl_free": (lambda s: CurlFreeRBFKernel(2), 2, False),
    "exact_div_free": (lambda s: DivFreeRBFKernel(2), 2, False),
    "exact_decomposable": (lambda s: DecomposableKernel(RBFKernel(), num_outputs=2), 2, False),
    "periodic": (lambda s: SketchedPeriodicKernel(16, ard_num_dims=3, seed=s), 3, False),
    "rq": (lambda s: SketchedRQKernel(16, seed=s), 3, False),
    "spectral_mixture": (lambda s: SketchedSpectralMixtureKernel(2, 16, ard_num_dims=3, seed=s), 3, False),
    "linear": (lambda s: LinearFeatureKernel(ard_num_dims=3), 3, False),
    "constant": (lambda s: ConstantFeatureKernel(), 3, False),
    "cosine": (lambda s: CosineFeatureKernel(), 1, False),
    "spectral_delta": (lambda s: kernels.SpectralDeltaFeatureKernel(3, 8, ard_num_dims=3, seed=s), 3, False),
    "arc": (lambda s: kernels.SketchedArcKernel(SketchedMaternKernel(16, nu=2.5, input_dim=6, seed=s), ard_num_dims=3),
            3, False),
    "newton_girard": (lambda s: kernels.SketchedNewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=3), 3, 16, seed=s),
                      3, False),
    "rbf_grad": (lambda s: SketchedRBFKernelGrad(16, input_dim=3, seed=s), 3, False),
    "rbf_gradgrad": (lambda s: SketchedRBFKernelGradGrad(16, method="orf", input_dim=3, seed=s), 3, False),
    "matern52_grad": (lambda s: SketchedMatern52KernelGrad(16, input_dim=3, seed=s), 3, False),
    "polynomial_grad": (lambda s: SketchedPolynomialKernelGrad(2, 16, input_dim=3, seed=s), 3, False),
    "categorical": (lambda s: kernels.SketchedCategoricalKernel(16, ard_num_dims=3, seed=s), 3, False),
    "nystrom": (lambda s: NystromKernel(RBFKernel(), torch.randn(8, 3, generator=torch.Generator().manual_seed(s))),
                3, False),
}


def _save_and_load(state: dict) -> dict:
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return torch.load(io.BytesIO(buffer.getvalue()), weights_only=True)


def _perturb(module: torch.nn.Module) -> None:
    """Move every hyperparameter away from its default, so that a load that skipped it would show."""
    with torch.no_grad():
        for i, parameter in enumerate(module.parameters()):
            parameter.add_(0.1 * (i + 1))


# ----------------------------------------------------------------------------- coverage
def test_tables_cover_every_public_feature_map_and_kernel():
    map_types = {type(FEATURE_MAPS[name][0](0, 3 if name != "operator_valued" else 2)) for name in FEATURE_MAPS}
    public_maps = {cls for cls in map(features.__dict__.get, features.__all__)
                   if inspect.isclass(cls) and issubclass(cls, (features.FeatureMap, OperatorValuedFourierFeatures))}
    # CategoricalFeatures takes the constant shares besides x (round trip: tests/features/test_categorical.py);
    # HammingIMQFeatures takes α and β besides x, its kernel one-hot rows (tests/kernels/test_hamming_imq.py)
    exempt_maps = {features.FeatureMap, features.CategoricalFeatures, features.HammingIMQFeatures}
    assert public_maps - exempt_maps <= map_types
    kernel_types = {type(build(0)) for build, _, _ in KERNELS.values()}
    public_kernels = {cls for cls in map(kernels.__dict__.get, kernels.__all__)
                      if inspect.isclass(cls) and issubclass(cls, gpytorch.kernels.Kernel)}
    # IndexFeatureKernel takes integer task indices: its round trip is in tests/test_conversion_trees.py; the
    # fidelity kernels take fidelities (≤ 1, ≥ 0): theirs are in tests/integrations/test_botorch_fidelity_kernels.py
    fidelity = {kernels.DownsamplingFeatureKernel, kernels.ExponentialDecayFeatureKernel}
    one_hot = {kernels.SketchedHammingIMQKernel}
    assert public_kernels - {kernels.FeatureKernel, kernels.IndexFeatureKernel, *fidelity, *one_hot} <= kernel_types


# ----------------------------------------------------------------------------- encoding
@pytest.mark.parametrize("value", [None, True, False, 0, 2**62 - 1, 1.5, 0.1, "orthogonal", "", (3, 0, 4), ()])
def test_encoding_round_trips_every_value_type(value):
    tensor = encode(value)
    assert torch.is_tensor(tensor)
    decoded = decode(tensor)
    assert type(decoded) is type(value) and decoded == value


def test_seed_outside_int64_is_refused():
    with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*63, 2\*\*63\), got 18446744073709551616"):
        RandomFourierFeatures(16, 3, seed=2**64)


def test_encoding_refuses_other_types():
    with pytest.raises(TypeError, match="configuration value must be"):
        encode([1, 2])


# ----------------------------------------------------------------------------- feature maps
@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_feature_map_round_trip_is_bit_exact(name):
    build, d, sphere = FEATURE_MAPS[name]
    x = _inputs(d, sphere)
    source = build(1, d).double()
    expected = source(x)  # data-fitted maps (optimized Maclaurin) allocate here
    state = _save_and_load(source.state_dict())
    assert all(torch.is_tensor(value) for value in state.values())
    assert any(key.startswith(CONFIG_PREFIX) for key in state)
    target = build(2, d).double()
    target.load_state_dict(state)
    assert torch.equal(target(x), expected)


@pytest.mark.parametrize("name", LAZY_MAPS)
@pytest.mark.parametrize("called", [False, True])
def test_lazily_initialised_map_round_trips(name, called):
    build, d, sphere = FEATURE_MAPS[name]
    x = _inputs(d, sphere)
    source = build(1, None).double()
    if called:
        source(x)
    state = _save_and_load(source.state_dict())
    for target_dim in (None, d):
        target = build(2, target_dim).double()
        target.load_state_dict(state)
        assert target.seed == source.seed
        assert torch.equal(target(x), source(x))


@pytest.mark.parametrize("name", FEATURE_MAPS)
def test_dtype_moves_keep_the_configuration(name):
    build, d, _ = FEATURE_MAPS[name]
    phi = build(1, d)
    before = {k: v for k, v in phi.state_dict().items() if CONFIG_PREFIX in k}
    for move in (torch.nn.Module.double, torch.nn.Module.float, torch.nn.Module.half):
        after = {k: v for k, v in move(phi).state_dict().items() if CONFIG_PREFIX in k}
        assert after.keys() == before.keys()
        assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())


# ----------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("name", KERNELS)
def test_kernel_round_trip_is_bit_exact(name):
    build, d, sphere = KERNELS[name]
    x = _inputs(d, sphere)
    source = build(1).double()
    _perturb(source)
    with torch.no_grad():
        expected = source(x).to_dense()
    state = _save_and_load(source.state_dict())
    assert all(torch.is_tensor(value) for value in state.values())
    target = build(2).double()
    target.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(target(x).to_dense(), expected)
    if hasattr(target, "featurize"):
        assert torch.equal(target.featurize(x), source.featurize(x))


@pytest.mark.parametrize("name", KERNELS)
def test_float32_state_in_a_float64_kernel_is_the_seeds_float64_kernel(name):
    """A float32 state loaded into a float64 kernel holds the draws the seed gives in float64 (and a ν = ½ Matérn
    anchor ℓ₀ = ℓ in float64), as ``.double()`` of the saved kernel does: it held the float32 draws converted (kernel
    values up to 4·10⁻⁷ apart), while the same load into a float32 kernel followed by ``.double()`` did not."""
    build, d, sphere = KERNELS[name]
    x = _inputs(d, sphere)
    source = build(1).float()
    _perturb(source)
    state = _save_and_load(source.state_dict())
    target = build(2).double()
    target.load_state_dict(state)
    with torch.no_grad():
        assert torch.equal(target(x).to_dense(), source.double()(x).to_dense())


def test_kernel_dtype_moves_keep_the_configuration():
    kernel = ScaleKernel(SketchedMaternKernel(16, nu=1.5, input_dim=3, seed=0))
    before = {k: v for k, v in kernel.state_dict().items() if CONFIG_PREFIX in k}
    after = {k: v for k, v in kernel.double().float().state_dict().items() if CONFIG_PREFIX in k}
    assert before.keys() == after.keys()
    assert all(after[k].dtype == v.dtype and torch.equal(after[k], v) for k, v in before.items())
    assert after["base_kernel.config_nu"].dtype == F64


# ----------------------------------------------------------------------------- refused loads
def _dirichlet(alpha):
    return DirichletClassificationLikelihood(torch.tensor([0, 1, 2, 1]), alpha_epsilon=alpha)


def _custom(rate, max_degree=None):
    """f(t) = Σ aₙtⁿ with aₙ = rateⁿ/n! (exp(rate·t)), or its first terms."""
    coefficient = lambda n: rate**n / math.factorial(n)  # noqa: E731
    return dot_product.from_coefficients(coefficient, None if max_degree else lambda t: torch.exp(rate * t), max_degree)


def _nystrom(base):
    return NystromKernel(base, torch.randn(8, 3, generator=torch.Generator().manual_seed(0)))


def _newton_girard(base):
    return kernels.SketchedNewtonGirardAdditiveKernel(base, 3, 16, seed=0)


# (field, saved module, loading module)
MISMATCHES = [
    ("sampler", lambda: RandomFourierFeatures(16, 3, sampler="iid", seed=0),
     lambda: RandomFourierFeatures(16, 3, sampler="orthogonal", seed=0)),
    ("spectral_density", lambda: RandomFourierFeatures(16, 3, seed=0),
     lambda: RandomFourierFeatures(16, 3, spectral_density=MaternSpectralDensity(2.5), seed=0)),
    ("spectral_parameter", lambda: RandomFourierFeatures(16, 3, spectral_density=MaternSpectralDensity(1.5), seed=0),
     lambda: RandomFourierFeatures(16, 3, spectral_density=MaternSpectralDensity(2.5), seed=0)),
    ("input_dim", lambda: RandomFourierFeatures(16, 3, seed=0), lambda: RandomFourierFeatures(16, 4, seed=0)),
    ("num_features", lambda: RandomFourierFeatures(16, 3, seed=0), lambda: RandomFourierFeatures(32, 3, seed=0)),
    ("degree", lambda: PolynomialSketch(3, 16, 3, seed=0), lambda: PolynomialSketch(2, 16, 3, seed=0)),
    ("projection", lambda: PolynomialSketch(3, 16, 3, projection="srht", seed=0),
     lambda: PolynomialSketch(3, 16, 3, projection="rademacher", seed=0)),
    ("weights", lambda: PolynomialSketch(3, 16, 3, weights="real", seed=0),
     lambda: PolynomialSketch(3, 16, 3, weights="ctr", seed=0)),
    ("offset", lambda: PolynomialSketch(3, 16, 3, offset=1.0, seed=0), lambda: PolynomialSketch(3, 16, 3, seed=0)),
    ("type", lambda: RandomMaclaurin(dot_product.gaussian(), 21, 3, seed=0),
     lambda: OptimizedMaclaurin(dot_product.gaussian(), 21, 3, seed=0)),
    ("kernel", lambda: RandomMaclaurin(dot_product.gaussian(), 21, 3, seed=0),
     lambda: RandomMaclaurin(dot_product.exponential(), 21, 3, seed=0)),
    # user kernels f(t) = Σ aₙtⁿ are all named "custom": the coefficients tell them apart (they loaded silently)
    ("kernel_coefficients", lambda: RandomMaclaurin(_custom(1.0), 20, 3, seed=0),
     lambda: RandomMaclaurin(_custom(0.5), 20, 3, seed=0)),
    ("kernel_coefficients", lambda: OptimizedMaclaurin(_custom(1.0, max_degree=4), 21, 3, widths=(3, 3, 2, 2), seed=0),
     lambda: OptimizedMaclaurin(_custom(0.5, max_degree=4), 21, 3, widths=(3, 3, 2, 2), seed=0)),
    ("power", lambda: SphericalRandomFeatures(16, power=3, input_dim=3, seed=0),
     lambda: SphericalRandomFeatures(16, power=5, input_dim=3, seed=0)),
    ("order", lambda: GaussianSketch(64, order=3, mode="tree", input_dim=3, seed=0),
     lambda: GaussianSketch(64, order=4, mode="tree", input_dim=3, seed=0)),
    # the order follows from radius and alpha: a load named it (6 vs 15) where the user had passed another radius
    ("radius", lambda: GaussianSketchHD(64, radius=1.0, alpha=1e-2, input_dim=3, seed=0),
     lambda: GaussianSketchHD(64, radius=2.0, alpha=1e-2, input_dim=3, seed=0)),
    ("alpha", lambda: GaussianSketch(64, radius=1.0, alpha=1e-2, input_dim=3, seed=0),
     lambda: GaussianSketch(64, radius=1.0, alpha=1e-4, input_dim=3, seed=0)),
    ("mode", lambda: GaussianSketch(64, order=3, mode="tree", input_dim=3, seed=0),
     lambda: GaussianSketch(64, order=3, mode="explicit", input_dim=3, seed=0)),
    ("family", lambda: OperatorValuedFourierFeatures(16, 2, "curl_free", seed=0),
     lambda: OperatorValuedFourierFeatures(16, 2, "divergence_free", seed=0)),
    ("method", lambda: SketchedRBFKernel(16, method="rff", input_dim=3, seed=0),
     lambda: SketchedRBFKernel(16, method="orf", input_dim=3, seed=0)),
    ("nu", lambda: SketchedMaternKernel(16, nu=1.5, input_dim=3, seed=0),
     lambda: SketchedMaternKernel(16, nu=2.5, input_dim=3, seed=0)),
    ("type", lambda: SketchedMaternKernel(16, nu=2.5, input_dim=3, seed=0),
     lambda: SketchedRBFKernel(16, input_dim=3, seed=0)),
    ("input_normalization", lambda: SketchedPolynomialKernel(3, 16, input_dim=3, seed=0),
     lambda: SketchedPolynomialKernel(3, 16, input_dim=3, input_normalization="check", seed=0)),
    ("complex_posterior", lambda: SketchedPolynomialKernel(3, 16, input_dim=3, seed=0),
     lambda: SketchedPolynomialKernel(3, 16, input_dim=3, complex_posterior=True, seed=0)),
    ("method", lambda: SketchedSphericalPolynomialKernel(3, 16, input_dim=4, seed=0),
     lambda: SketchedSphericalPolynomialKernel(3, 16, method="srf_orth", input_dim=4, seed=0)),
    ("input_dim", lambda: CurlFreeRBFKernel(2), lambda: CurlFreeRBFKernel(3)),
    ("alpha_epsilon", lambda: _dirichlet(0.01), lambda: _dirichlet(0.1)),
    # the exact tree of a Nyström kernel, the base kernel of a Newton–Girard kernel: GPyTorch's RBF and Matérn
    # kernels of any ν have the same state keys, and these loads made another model silently
    ("base_kernel_tree", lambda: _nystrom(RBFKernel()), lambda: _nystrom(MaternKernel(nu=2.5))),
    ("base_kernel_tree", lambda: _nystrom(ScaleKernel(MaternKernel(nu=0.5))),
     lambda: _nystrom(ScaleKernel(MaternKernel(nu=2.5)))),
    ("spectral_density", lambda: _newton_girard(RBFKernel(ard_num_dims=3)),
     lambda: _newton_girard(MaternKernel(nu=1.5, ard_num_dims=3))),
    ("spectral_parameter", lambda: _newton_girard(MaternKernel(nu=1.5)), lambda: _newton_girard(MaternKernel(nu=2.5))),
]


@pytest.mark.parametrize("field, saved, loading", MISMATCHES, ids=[f"{m[0]}-{i}" for i, m in enumerate(MISMATCHES)])
def test_mismatching_load_raises_naming_the_field(field, saved, loading):
    state = _save_and_load(saved().state_dict())
    module = loading()
    with pytest.raises(ValueError, match=rf"cannot load state: (\w+\.)*{field} is .* in the state dict but .* in this"):
        module.load_state_dict(state)


@pytest.mark.parametrize("saved, loading, hint", [
    (dict(ard_num_dims=2), dict(), r"raw_lengthscale has shape \(1, 2\) in the state dict but \(1, 1\) in this "
                                   r"module: the state holds lengthscales for 2 input dimensions.*ard_num_dims=2"),
    (dict(batch_shape=torch.Size([2])), dict(batch_shape=torch.Size([3])),
     r"raw_lengthscale has shape \(2, 1, 1\).*saved with batch_shape=\(2,\), this module has batch_shape=\(3,\)"),
    (dict(), dict(batch_shape=torch.Size([2])),
     r"raw_lengthscale has shape \(1, 1\).*saved with batch_shape=\(\), this module has batch_shape=\(2,\)"),
])
def test_hyperparameter_shape_mismatch_names_the_argument(saved, loading, hint):
    """Before, torch's bare "size mismatch for raw_lengthscale" left the user to guess ard_num_dims or batch_shape; the
    GPyTorch base kernel of a Nyström kernel (not a configured module) gets the hint too."""
    rff = lambda **kw: ScaleKernel(SketchedRBFKernel(num_features=16, seed=0, **kw),  # noqa: E731
                                   batch_shape=kw.get("batch_shape", torch.Size()))
    with pytest.raises(RuntimeError, match=hint):
        rff(**loading).load_state_dict(rff(**saved).state_dict())
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    nystrom = lambda **kw: NystromKernel(RBFKernel(**kw), x)  # noqa: E731
    if "ard_num_dims" not in saved:  # (the ard_num_dims of a base tree is a configuration field of its own)
        with pytest.raises(RuntimeError, match=r"base_kernel\." + hint):
            nystrom(**loading).load_state_dict(nystrom(**saved).state_dict())


def test_gpytorch_relaxed_shapes_still_load_into_a_nystrom_base_tree():
    """GPyTorch's ``load_strict_shapes(False)`` (BoTorch's fully Bayesian models load MCMC batches so) adopts the saved
    shapes in each module's pre-hook, which runs after the Nyström kernel checked its base tree: no hint there."""
    x = torch.randn(6, 2, generator=torch.Generator().manual_seed(0))
    batched = NystromKernel(RBFKernel(batch_shape=torch.Size([2])), x)
    single = NystromKernel(RBFKernel(), x)
    single.load_strict_shapes(False)
    single.load_state_dict(batched.state_dict())
    assert torch.equal(single.base_kernel.raw_lengthscale, batched.base_kernel.raw_lengthscale)


def test_state_expanded_to_a_batch_is_refused_naming_the_entry():
    """BoTorch's meta-learning (RGPE) tutorial expands every tensor of a fitted model's state dict to a batch of
    leave-one-out models (``t.expand(n, *t.shape)``); a configuration entry holds one value, and its expanded copy
    decoded to a TypeError from ``bytes`` (the class name) or a tuple (an int field) instead."""
    state = ScaleKernel(SketchedRBFKernel(16, input_dim=3, seed=0)).state_dict()
    expanded = {key: value.expand(4, *value.shape) for key, value in state.items()}
    kernel = ScaleKernel(SketchedRBFKernel(16, input_dim=3, seed=0, batch_shape=torch.Size([4])))
    with pytest.raises(ValueError, match=r"base_kernel\.config_type has shape \(4, 17\).*one value.*"
                                         r"expand only the parameters"):
        kernel.load_state_dict(expanded)
    for key, value in (("seed", 0), ("num_features", 16)):  # one entry expanded alone: an int vector is a tuple
        entry = "base_kernel.feature_map.config_" + key
        bad = dict(state, **{entry: state[entry].expand(4)})
        with pytest.raises(ValueError, match=rf"{key} is \({value}, {value}, {value}, {value}\) .*in the state dict"):
            ScaleKernel(SketchedRBFKernel(16, input_dim=3, seed=0)).load_state_dict(bad)


def test_refused_load_leaves_the_map_unchanged():
    phi = RandomFourierFeatures(16, 3, sampler="orthogonal", seed=5)
    before = {k: v.clone() for k, v in phi.state_dict().items()}
    with pytest.raises(ValueError, match="sampler"):
        phi.load_state_dict(RandomFourierFeatures(16, 3, seed=0).state_dict())
    assert phi.seed == 5 and all(torch.equal(v, phi.state_dict()[k]) for k, v in before.items())


def test_state_without_configuration_is_missing_keys_unless_not_strict():
    phi = RandomFourierFeatures(16, 3, seed=0)
    state = {k: v for k, v in phi.state_dict().items() if not k.startswith(CONFIG_PREFIX)}
    with pytest.raises(RuntimeError, match="Missing key.*config_seed"):
        RandomFourierFeatures(16, 3, seed=1).load_state_dict(state)
    result = RandomFourierFeatures(16, 3, seed=1).load_state_dict(state, strict=False)
    assert "config_seed" in result.missing_keys


@pytest.mark.parametrize("name", ["rff", "optimized_maclaurin", "srf"])
def test_legacy_extra_state_checkpoint_is_converted(name):
    build, d, sphere = FEATURE_MAPS[name]
    x = _inputs(d, sphere)
    source = build(1, d).double()
    expected = source(x)
    legacy = {k: v for k, v in source.state_dict().items() if not k.startswith(CONFIG_PREFIX)}
    legacy["_extra_state"] = {"input_dim": source.input_dim, "seed": source.seed}
    if name == "optimized_maclaurin":
        legacy["_extra_state"].update(widths=list(source.widths), objective=source.objective)
    if name == "srf":
        density = source.density
        legacy["_extra_state"]["density"] = {"dim": density.dim, "spacing": density.spacing,
                                             "weights": density.weights, "a": density.a, "power": density.power,
                                             "max_error": density.max_error, "version": 1}
    target = build(2, None).double()
    target.load_state_dict(legacy)
    assert torch.equal(target(x), expected)


def test_legacy_kernel_checkpoint_loads_strictly():
    x = _inputs(3)
    source = ScaleKernel(SketchedMaternKernel(16, nu=1.5, input_dim=3, seed=1)).double()
    _perturb(source)
    legacy = {k: v for k, v in source.state_dict().items() if CONFIG_PREFIX not in k}
    legacy["base_kernel.feature_map._extra_state"] = {"input_dim": 3, "seed": source.base_kernel.feature_map.seed}
    target = ScaleKernel(SketchedMaternKernel(16, nu=1.5, seed=2)).double()
    target.load_state_dict(legacy)
    with torch.no_grad():
        assert torch.equal(target(x).to_dense(), source(x).to_dense())


# ----------------------------------------------------------------------------- BoTorch
def test_botorch_fit_with_a_sketched_kernel_runs():
    botorch = pytest.importorskip("botorch")
    from botorch.fit import fit_gpytorch_mll

    torch.manual_seed(0)
    x = torch.rand(20, 2, dtype=F64)
    y = torch.sin(6 * x).sum(-1, keepdim=True)
    covar = rfgp.sketch(ScaleKernel(RBFKernel()), 128, seed=0)
    model = botorch.models.SingleTaskGP(x, y, covar_module=covar)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    fit_gpytorch_mll(mll)
    assert all(torch.is_tensor(value) for value in model.state_dict().values())


def test_a_state_saved_before_the_first_call_redraws_a_drawn_map_from_its_seed():
    # a drawn map kept its buffers where the loaded (undrawn) state had its own seed, trusting them to be the seed's
    # draws; after to_empty() they are uninitialised memory, and the kernel values were garbage
    x = _inputs(3)
    saved = RandomFourierFeatures(16, seed=0).double()
    expected = RandomFourierFeatures(16, seed=0).double()(x)
    loaded = RandomFourierFeatures(16, seed=0).double()
    loaded(x)
    loaded.to_empty(device="cpu")
    loaded.load_state_dict(saved.state_dict())
    assert torch.equal(loaded(x), expected)
