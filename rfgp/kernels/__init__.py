"""GPyTorch kernels backed by random features."""

from .arc import SketchedArcKernel
from .categorical import SketchedCategoricalKernel
from .combinations import (
    FeatureProductKernel,
    FeatureSumKernel,
    SketchedProductKernel,
    is_feature_kernel,
    kernel_features,
    kernel_num_features,
)
from .derivative import (
    SketchedMatern52KernelGrad,
    SketchedPolynomialKernelGrad,
    SketchedRBFKernelGrad,
    SketchedRBFKernelGradGrad,
)
from .exact_features import ConstantFeatureKernel, CosineFeatureKernel, LinearFeatureKernel
from .fidelity import DownsamplingFeatureKernel, ExponentialDecayFeatureKernel
from .fourier import SketchedMaternKernel, SketchedRBFKernel
from .gaussian_sketch import GaussianSketchRBFKernel
from .hamming_imq import SketchedHammingIMQKernel
from .index import IndexFeatureKernel
from .maclaurin import MaclaurinRBFKernel, RandomMaclaurinExponentialKernel, SketchedExponentialKernel, refit_allocation
from .newton_girard import SketchedNewtonGirardAdditiveKernel
from .nystrom import NystromKernel
from .operator_valued import CurlFreeRBFKernel, DecomposableKernel, DivFreeRBFKernel
from .periodic import SketchedPeriodicKernel
from .polynomial import SketchedPolynomialKernel, register_polynomial_method
from .random_feature_kernel import FeatureKernel, RandomFeatureKernel
from .rational_quadratic import SketchedRQKernel
from .sketched_operator_valued import (
    MultiOutputFeatureSumKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedLCMKernel,
)
from .spectral_delta import SpectralDeltaFeatureKernel
from .spectral_mixture import SketchedSpectralMixtureKernel
from .spectral_product import SpectralProductKernel, has_spectral_protocol
from .spherical import SketchedSphericalPolynomialKernel

__all__ = [
    "SketchedNewtonGirardAdditiveKernel",
    "SketchedArcKernel",
    "SketchedSpectralMixtureKernel",
    "SpectralDeltaFeatureKernel",
    "SketchedCategoricalKernel",
    "SketchedHammingIMQKernel",
    "SketchedRQKernel",
    "SketchedPeriodicKernel",
    "LinearFeatureKernel",
    "MaclaurinRBFKernel",
    "CosineFeatureKernel",
    "ConstantFeatureKernel",
    "CurlFreeRBFKernel",
    "DecomposableKernel",
    "DivFreeRBFKernel",
    "DownsamplingFeatureKernel",
    "ExponentialDecayFeatureKernel",
    "FeatureKernel",
    "FeatureProductKernel",
    "FeatureSumKernel",
    "GaussianSketchRBFKernel",
    "IndexFeatureKernel",
    "MultiOutputFeatureSumKernel",
    "NystromKernel",
    "RandomFeatureKernel",
    "RandomMaclaurinExponentialKernel",
    "SketchedCurlFreeKernel",
    "SketchedDecomposableKernel",
    "SketchedLCMKernel",
    "SketchedDivFreeKernel",
    "SketchedExponentialKernel",
    "SketchedMatern52KernelGrad",
    "SketchedMaternKernel",
    "SketchedPolynomialKernel",
    "SketchedPolynomialKernelGrad",
    "SketchedProductKernel",
    "SketchedRBFKernel",
    "SketchedRBFKernelGrad",
    "SketchedRBFKernelGradGrad",
    "SketchedSphericalPolynomialKernel",
    "SpectralProductKernel",
    "has_spectral_protocol",
    "is_feature_kernel",
    "kernel_features",
    "kernel_num_features",
    "refit_allocation",
    "register_polynomial_method",
]
