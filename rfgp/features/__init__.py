"""Random feature maps Φ with k(x, y) ≈ Φ(x)ᵀΦ(y): pure torch, no GPyTorch import."""

from .base import FeatureMap
from .degree_sketch import DegreeSketch, HierarchicalSketch
from .fourier import RandomFourierFeatures
from .polynomial import PolynomialSketch
from .hadamard import fwht, hadamard_matrix, next_power_of_two, pad_to_power_of_two
from .spectral import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    RationalQuadraticSpectralDensity,
    SpectralDensity,
)

__all__ = [
    "DegreeSketch",
    "HierarchicalSketch",
    "PolynomialSketch",
    "FeatureMap",
    "GaussianSpectralDensity",
    "MaternSpectralDensity",
    "RandomFourierFeatures",
    "RationalQuadraticSpectralDensity",
    "SpectralDensity",
    "fwht",
    "hadamard_matrix",
    "next_power_of_two",
    "pad_to_power_of_two",
]
