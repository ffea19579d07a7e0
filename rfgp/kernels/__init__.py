"""GPyTorch kernels backed by random features."""

from .combinations import FeatureProductKernel, FeatureSumKernel, is_feature_kernel, kernel_features
from .derivative import (
    SketchedMatern52KernelGrad,
    SketchedPolynomialKernelGrad,
    SketchedRBFKernelGrad,
    SketchedRBFKernelGradGrad,
)
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .maclaurin import SketchedExponentialKernel, refit_allocation
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
    "RandomFeatureKernel",
    "SketchedCurlFreeKernel",
    "SketchedDecomposableKernel",
    "SketchedDivFreeKernel",
    "SketchedExponentialKernel",
    "SketchedMatern52KernelGrad",
    "SketchedMaternKernel",
    "SketchedPolynomialKernel",
    "SketchedPolynomialKernelGrad",
    "SketchedRBFKernel",
    "SketchedRBFKernelGrad",
    "SketchedRBFKernelGradGrad",
    "SketchedSphericalPolynomialKernel",
    "is_feature_kernel",
    "kernel_features",
    "refit_allocation",
    "register_polynomial_method",
]
