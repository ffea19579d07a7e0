"""GPyTorch models built on rfgp kernels, and operations on trained models.

* :class:`ExactGPModel` — a constant-mean regression ``ExactGP`` with input checks;
* :class:`DirichletGPClassifier` — Dirichlet-based GP classification with a ``fit``/``predict`` API;
* :class:`GPRegressor` — GP regression with scikit-learn's ``fit``/``predict`` API;
* :class:`MultiOutputGPModel` — p outputs per input (vector fields) in feature space;
* :class:`StreamingFeatureGP`, :func:`fit_from_batches` — online regression from data batches;
* :func:`~rfgp.models.sampling.posterior_paths` — posterior function draws in weight space (also ``rfgp.sampling``);
* :func:`set_num_features` — re-draw a trained model's feature maps at a new width;
* :func:`fit_scale_and_noise` — the outputscale, noise and constant mean for the current map, in closed form.
"""

# registered with fit_mll: the check of lengthscales against the inputs' spacing, the handlers of stale allocations
from . import data_scale, maclaurin_refit  # noqa: F401
from .classifier import DirichletGPClassifier
from .classifier_check import DegenerateFitWarning
from .feature_width import set_num_features
from .multioutput import MultiOutputGPModel
from .regression import ExactGPModel
from .regressor import GPRegressor
from .scale_and_noise import ScaleNoiseFit, fit_scale_and_noise
from .streaming import StreamingFeatureGP, fit_from_batches

__all__ = [
    "DegenerateFitWarning",
    "DirichletGPClassifier",
    "ExactGPModel",
    "GPRegressor",
    "MultiOutputGPModel",
    "ScaleNoiseFit",
    "StreamingFeatureGP",
    "fit_from_batches",
    "fit_scale_and_noise",
    "set_num_features",
]
