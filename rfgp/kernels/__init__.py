"""GPyTorch kernels backed by random features."""

from .combinations import FeatureProductKernel, FeatureSumKernel, is_feature_kernel, kernel_features
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .operator_valued import CurlFreeRBFKernel, DecomposableKernel, DivFreeRBFKernel
from .random_feature_kernel import FeatureKernel, RandomFeatureKernel
from .sketched_operator_valued import (
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
)

__all__ = [
    "CurlFreeRBFKernel",
    "DecomposableKernel",
    "DivFreeRBFKernel",
    "SketchedCurlFreeKernel",
    "SketchedDecomposableKernel",
    "SketchedDivFreeKernel",
    "FeatureKernel",
    "FeatureProductKernel",
    "FeatureSumKernel",
    "MultiOutputFeatureSumKernel",
    "RandomFeatureKernel",
    "SketchedMaternKernel",
    "SketchedRBFKernel",
    "is_feature_kernel",
    "kernel_features",
]
