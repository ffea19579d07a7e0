"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels."""

from . import features, kernels, models
from .conversion import register_converter, sketch
from . import datasets, multioutput, operator_valued_conversion, vector_fields  # noqa: E402  (registers converters)
from .multioutput import MultiOutputGPModel, MultitaskFeatureSpacePredictionStrategy
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy
from .training import fit_mll

__version__ = "0.1.0"

__all__ = [
    "FeatureRootAddedDiagLinearOperator",
    "FeatureRootLinearOperator",
    "FeatureSpacePredictionStrategy",
    "MultiOutputGPModel",
    "MultitaskFeatureSpacePredictionStrategy",
    "datasets",
    "features",
    "fit_mll",
    "kernels",
    "models",
    "multioutput",
    "register_converter",
    "sketch",
    "vector_fields",
]
