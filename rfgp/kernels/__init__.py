"""GPyTorch kernels backed by random features."""

from .exact_features import ConstantFeatureKernel, CosineFeatureKernel, LinearFeatureKernel
from .combinations import FeatureProductKernel, FeatureSumKernel, is_feature_kernel, kernel_features
from .derivative import (
    SketchedMatern52KernelGrad,
    SketchedPolynomialKernelGrad,
    SketchedRBFKernelGrad,
    SketchedRBFKernelGradGrad,
)
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .maclaurin import SketchedExponentialKernel, refit_allocation
from .nystrom import NystromKernel
from .periodic import SketchedPeriodicKernel
from .rational_quadratic import SketchedRQKernel
from .spectral_mixture import SketchedSpectralMixtureKernel
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
    "SketchedSpectralMixtureKernel",
    "SketchedRQKernel",
    "SketchedPeriodicKernel",
    "LinearFeatureKernel",
    "CosineFeatureKernel",
    "ConstantFeatureKernel",
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
