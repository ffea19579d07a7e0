"""GPyTorch kernels backed by random features."""

from .combinations import FeatureProductKernel, FeatureSumKernel, is_feature_kernel, kernel_features
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .polynomial import SketchedPolynomialKernel, register_polynomial_method
from .random_feature_kernel import FeatureKernel, RandomFeatureKernel
from .spherical import SketchedSphericalPolynomialKernel

__all__ = [
    "FeatureKernel",
    "FeatureProductKernel",
    "FeatureSumKernel",
    "RandomFeatureKernel",
    "SketchedMaternKernel",
    "SketchedPolynomialKernel",
    "SketchedRBFKernel",
    "SketchedSphericalPolynomialKernel",
    "is_feature_kernel",
    "kernel_features",
    "register_polynomial_method",
]
