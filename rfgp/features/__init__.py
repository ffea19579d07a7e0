"""Random feature maps Φ with k(x, y) ≈ Φ(x)ᵀΦ(y): pure torch, no GPyTorch import."""

from .base import FeatureMap
from .bessel import scaled_bessel_i
from .periodic import PeriodicSpectralMeasure
from .rational_quadratic import RationalQuadraticSpectralMeasure
from .spectral_mixture import SpectralMixtureSpectralMeasure
from .weighted_fourier import SpectralMeasure, fourier_features
from .degree_sketch import DegreeSketch, HierarchicalSketch
from .categorical import CategoricalFeatures
from .hamming_imq import HammingIMQFeatures
from .fourier import RandomFourierFeatures
from .gaussian_sketch import GaussianSketch, GaussianSketchHD
from .hadamard import fwht, hadamard_matrix, next_power_of_two, pad_to_power_of_two
from .landmarks import (
    approximate_ridge_leverage_scores,
    kmeanspp_landmarks,
    ridge_leverage_landmarks,
    select_landmarks,
    uniform_landmarks,
)
from .maclaurin import OptimizedMaclaurin, RandomMaclaurin
from .operator_valued import OperatorValuedFourierFeatures
from .polynomial import PolynomialSketch
from .radial_density import RadialDensity, fit_radial_density
from .sphere_characteristic import sphere_characteristic
from .spectral import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    RationalQuadraticSpectralDensity,
    SpectralDensity,
)
from .spherical import SphericalRandomFeatures

__all__ = [
    "approximate_ridge_leverage_scores",
    "scaled_bessel_i",
    "fourier_features",
    "SpectralMeasure",
    "SpectralMixtureSpectralMeasure",
    "RationalQuadraticSpectralMeasure",
    "PeriodicSpectralMeasure",
    "DegreeSketch",
    "HierarchicalSketch",
    "PolynomialSketch",
    "CategoricalFeatures",
    "HammingIMQFeatures",
    "FeatureMap",
    "GaussianSketch",
    "GaussianSketchHD",
    "GaussianSpectralDensity",
    "MaternSpectralDensity",
    "OperatorValuedFourierFeatures",
    "OptimizedMaclaurin",
    "RandomMaclaurin",
    "RandomFourierFeatures",
    "RadialDensity",
    "RationalQuadraticSpectralDensity",
    "SpectralDensity",
    "SphericalRandomFeatures",
    "fit_radial_density",
    "fwht",
    "hadamard_matrix",
    "kmeanspp_landmarks",
    "next_power_of_two",
    "pad_to_power_of_two",
    "ridge_leverage_landmarks",
    "select_landmarks",
    "sphere_characteristic",
    "uniform_landmarks",
]
