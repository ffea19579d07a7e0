"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels."""

from . import features, kernels, likelihoods, metrics, models
from .conversion import register_converter, sketch
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy
from .training import fit_mll

__version__ = "0.1.0"

__all__ = [
    "FeatureRootAddedDiagLinearOperator",
    "FeatureRootLinearOperator",
    "FeatureSpacePredictionStrategy",
    "features",
    "fit_mll",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "register_converter",
    "sketch",
]
