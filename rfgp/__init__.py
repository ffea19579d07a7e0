"""rfgp: scalable Gaussian processes with random features, as drop-in GPyTorch kernels.

The folders are the layers, in the order data flows from inputs x to a posterior; each imports
only from the layers above it in this list:

* :mod:`rfgp.core` — validation, settings, tensor-only configuration state, memory guard;
* :mod:`rfgp.features` — random feature maps x ↦ Φ(x) in pure torch (RFF/ORF/SORF, SRF,
  polynomial sketches, optimized Maclaurin, Gaussian sketch, landmarks), with the closed-form
  variances that the Maclaurin allocation uses;
* :mod:`rfgp.inference` — Φ ↦ statistics ΦᵀWΦ, low-rank operators, the marginal likelihood and
  the weight-space posterior (feature space or, when cheaper, kernel space; chunked; streaming
  updates; distributed sums);
* :mod:`rfgp.kernels` — GPyTorch kernels whose covariance is ΦΦᵀ, and :func:`rfgp.sketch`, which
  converts an exact kernel tree;
* :mod:`rfgp.likelihoods` — Dirichlet classification and softmax expectations;
* :mod:`rfgp.training` — :func:`fit_mll`;
* :mod:`rfgp.models` — ready-made regression, classification, multi-output and streaming models,
  scikit-learn estimators, posterior function draws (:mod:`rfgp.models.sampling`, also ``rfgp.sampling``),
  and :func:`set_num_features` and :func:`fit_scale_and_noise` for trained models;
* :mod:`rfgp.applications` — vector-field tools, kernel distances;
* :mod:`rfgp.pyro` (Bayesian weight-space models) and :mod:`rfgp.integrations` (BoTorch) sit on top.

:mod:`rfgp.metrics` and :mod:`rfgp.datasets` are leaf utilities; :mod:`rfgp.demo` runs
``python -m rfgp demo``.  The flat module paths of rfgp 0.1 (``rfgp.operators``,
``rfgp.streaming``, ...) keep working (:mod:`rfgp._aliases`).
"""

from . import applications, core, datasets, features, inference, kernels, likelihoods, metrics, models, training
from .core import settings
from .inference import log_prob as _log_prob
from .inference import leave_one_out_likelihood as _leave_one_out_likelihood
from .inference import elementwise_product as _elementwise_product
from .inference import eager_covariances as _eager_covariances
from .inference import prior_samples as _prior_samples
from .kernels import batch_expansion as _batch_expansion
from .kernels import independent_outputs as _independent_outputs
from .inference.operators import FeatureRootAddedDiagLinearOperator, FeatureRootLinearOperator
from .inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from .inference.prediction import FeatureSpacePredictionStrategy
from .core.memory import MemoryBudgetWarning
from .inference.elementwise_product import SingularTaskMatrixWarning
from .kernels.conversion import register_converter, sketch
from .models import MultiOutputGPModel, StreamingFeatureGP, fit_from_batches, fit_scale_and_noise, set_num_features
from .training import (
    AllocationRefit,
    DataScaleWarning,
    NonFiniteLossError,
    TrainingHistory,
    TrainingRestart,
    TruncationWarning,
    fit_mll,
)
from . import _aliases

_aliases.install()  # rfgp.operators, rfgp.streaming, rfgp.variance, ... as before the layer folders
# BoTorch (and anyone) may switch GPyTorch's fast log-prob off globally: keep rfgp operators in feature space.
_log_prob.install()
# GPyTorch's LeaveOneOutPseudoLikelihood takes diag(K⁻¹) of an rfgp covariance through the F × F capacitance
_leave_one_out_likelihood.install()
# covar_module(x).mul(task_covar_module(i)) (GPyTorch's Hadamard multitask GP) keeps a feature root
_elementwise_product.install()
# MultivariateNormal(mean, covar_module(x)).rsample() (prior samples) draws Φε, not a truncated Lanczos root
_prior_samples.install()
# GPyTorch's batch-independent multi-output GP (from_batch_mvn) keeps one interleaved feature root
_independent_outputs.install()
# the sampled likelihoods' copies of x reach rfgp kernels as stride-0 views, featurised once
_batch_expansion.install()
# ExactGP under lazily_evaluate_kernels(False) predicts with rfgp's strategy, as with lazy kernels
_eager_covariances.install()
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
    "AllocationRefit",
    "DataScaleWarning",
    "MemoryBudgetWarning",
    "SingularTaskMatrixWarning",
    "StreamingFeatureGP",
    "TrainingHistory",
    "TrainingRestart",
    "TruncationWarning",
    "applications",
    "complex_posterior",
    "core",
    "datasets",
    "distances",
    "distributed",
    "features",
    "fit_from_batches",
    "fit_mll",
    "fit_scale_and_noise",
    "inference",
    "integrations",
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
