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
    sampling,
    settings,
    streaming,
    variance,
    vector_fields,
)
from . import log_prob as _log_prob
from .conversion import register_converter, sketch
from .feature_width import set_num_features
from .multioutput import MultiOutputGPModel, MultitaskFeatureSpacePredictionStrategy
from .operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy
from .streaming import StreamingFeatureGP, fit_from_batches
from .training import NonFiniteLossError, TrainingHistory, fit_mll

# BoTorch (and anyone) may switch GPyTorch's fast log-prob off globally: keep rfgp operators in feature space.
_log_prob.install()
# last: registers BoTorch hooks now if BoTorch is already imported, else when it is
from . import integrations  # noqa: E402

__version__ = "0.1.0"  # the one version source: pyproject.toml reads it (setuptools dynamic version)

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
    "integrations",
    "fit_from_batches",
    "fit_mll",
    "kernels",
    "likelihoods",
    "metrics",
    "models",
    "multioutput",
    "register_converter",
    "sampling",
    "set_num_features",
    "settings",
    "sketch",
    "streaming",
    "variance",
    "vector_fields",
]
