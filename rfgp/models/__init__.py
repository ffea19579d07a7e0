"""GPyTorch models built on rfgp kernels, and operations on trained models.

* :class:`ExactGPModel` — a constant-mean regression ``ExactGP`` with input checks;
* :class:`DirichletGPClassifier` — Dirichlet-based GP classification with a ``fit``/``predict`` API;
* :class:`MultiOutputGPModel` — p outputs per input (vector fields) in feature space;
* :class:`StreamingFeatureGP`, :func:`fit_from_batches` — online regression from data batches;
* :func:`set_num_features` — re-draw a trained model's feature maps at a new width.
"""

from .classifier import DirichletGPClassifier
from .feature_width import set_num_features
from .multioutput import MultiOutputGPModel
from .regression import ExactGPModel
from .streaming import StreamingFeatureGP, fit_from_batches

__all__ = [
    "DirichletGPClassifier",
    "ExactGPModel",
    "MultiOutputGPModel",
    "StreamingFeatureGP",
    "fit_from_batches",
    "set_num_features",
]
