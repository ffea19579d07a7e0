"""Random feature maps Φ with k(x, y) ≈ Φ(x)ᵀΦ(y): pure torch, no GPyTorch import."""

from .base import FeatureMap
from .fourier import RandomFourierFeatures
from .operator_valued import OperatorValuedFourierFeatures
from .hadamard import fwht, hadamard_matrix, next_power_of_two, pad_to_power_of_two
from .spectral import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    RationalQuadraticSpectralDensity,
    SpectralDensity,
)

__all__ = [
    "FeatureMap",
    "GaussianSpectralDensity",
    "MaternSpectralDensity",
    "OperatorValuedFourierFeatures",
    "RandomFourierFeatures",
    "RationalQuadraticSpectralDensity",
    "SpectralDensity",
    "fwht",
    "hadamard_matrix",
    "next_power_of_two",
    "pad_to_power_of_two",
]
