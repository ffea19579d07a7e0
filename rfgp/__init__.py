"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels."""

from . import features, kernels
from .conversion import register_converter, sketch
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy

__version__ = "0.1.0"

__all__ = [
    "FeatureRootAddedDiagLinearOperator",
    "FeatureRootLinearOperator",
    "FeatureSpacePredictionStrategy",
    "features",
    "kernels",
    "register_converter",
    "sketch",
]
