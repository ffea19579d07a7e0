"""GPyTorch kernels backed by random features."""

from .combinations import FeatureProductKernel, FeatureSumKernel, is_feature_kernel, kernel_features
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .maclaurin import SketchedExponentialKernel, refit_allocation
from .nystrom import NystromKernel
from .operator_valued import CurlFreeRBFKernel, DecomposableKernel, DivFreeRBFKernel
from .polynomial import SketchedPolynomialKernel, register_polynomial_method
from .random_feature_kernel import FeatureKernel, RandomFeatureKernel
from .sketched_operator_valued import (
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
)
from .spherical import SketchedSphericalPolynomialKernel

__all__ = [
    "CurlFreeRBFKernel",
    "DecomposableKernel",
    "DivFreeRBFKernel",
    "FeatureKernel",
    "FeatureProductKernel",
    "FeatureSumKernel",
    "MultiOutputFeatureSumKernel",
    "NystromKernel",
    "RandomFeatureKernel",
    "SketchedCurlFreeKernel",
    "SketchedDecomposableKernel",
    "SketchedDivFreeKernel",
    "SketchedExponentialKernel",
    "SketchedMaternKernel",
    "SketchedPolynomialKernel",
    "SketchedRBFKernel",
    "SketchedSphericalPolynomialKernel",
    "is_feature_kernel",
    "kernel_features",
    "refit_allocation",
    "register_polynomial_method",
]
