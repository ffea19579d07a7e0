"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels."""

from . import (
    complex_posterior,
    distributed,
    features,
    kernels,
    likelihoods,
    metrics,
    models,
    settings,
    streaming,
    variance,
)
from .conversion import register_converter, sketch
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy
from .streaming import StreamingFeatureGP, fit_from_batches
from .training import fit_mll

__version__ = "0.1.0"

__all__ = [
    "complex_posterior",
    "FeatureRootAddedDiagLinearOperator",
    "FeatureRootLinearOperator",
    "FeatureSpacePredictionStrategy",
    "StreamingFeatureGP",
    "distributed",
    "features",
    "fit_from_batches",
    "fit_mll",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "register_converter",
    "settings",
    "sketch",
    "streaming",
    "variance",
]
