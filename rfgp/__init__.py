"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels."""

from . import (
    complex_posterior,
    datasets,
    distances,
    distributed,
    features,
    kernels,
    likelihoods,
    metrics,
    models,
    multioutput,
    settings,
    streaming,
    variance,
    vector_fields,
)
from .conversion import register_converter, sketch
from .feature_width import set_num_features
from .multioutput import MultiOutputGPModel, MultitaskFeatureSpacePredictionStrategy
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy
from .streaming import StreamingFeatureGP, fit_from_batches
from .training import NonFiniteLossError, TrainingHistory, fit_mll

__version__ = "0.1.0"

__all__ = [
    "FeatureRootAddedDiagLinearOperator",
    "FeatureRootLinearOperator",
    "FeatureSpacePredictionStrategy",
    "MultiOutputGPModel",
    "MultitaskFeatureSpacePredictionStrategy",
    "NonFiniteLossError",
    "StreamingFeatureGP",
    "TrainingHistory",
    "complex_posterior",
    "datasets",
    "distances",
    "distributed",
    "features",
    "fit_from_batches",
    "fit_mll",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "multioutput",
    "register_converter",
    "set_num_features",
    "settings",
    "sketch",
    "streaming",
    "variance",
    "vector_fields",
]
