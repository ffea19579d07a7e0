"""Pyro integration: weight-space random-feature GPs with any likelihood, and fully Bayesian hyperparameters.

* :class:`RandomFeatureGP` — f = m + σΦ(x/ℓ)w, w ~ N(0, I), with the likelihoods of
  :mod:`rfgp.pyro.likelihoods`; inference by :func:`fit_svi` with :func:`weight_guide`,
  or by :func:`run_nuts`; predictions by :func:`posterior_predictive`.
* :func:`sample_hyperparameters` — NUTS over the priors of a GPyTorch ``ExactGP``'s
  hyperparameters (O(N·F²) per step with rfgp kernels); :func:`batched_predictive` and
  :func:`mixture_moments` give the fully Bayesian posterior predictive.
"""

from .bayesian_hyperparameters import batched_predictive, mixture_moments, sample_hyperparameters

from .inference import fit_svi, posterior_predictive, run_nuts, weight_guide
from .likelihoods import (
    Bernoulli,
    Categorical,
    CustomLikelihood,
    Gaussian,
    HeteroscedasticGaussian,
    Likelihood,
    Poisson,
    StudentT,
)
from .weight_space import RandomFeatureGP

__all__ = [
    "Bernoulli",
    "Categorical",
    "CustomLikelihood",
    "Gaussian",
    "HeteroscedasticGaussian",
    "Likelihood",
    "Poisson",
    "RandomFeatureGP",
    "StudentT",
    "batched_predictive",
    "fit_svi",
    "mixture_moments",
    "posterior_predictive",
    "run_nuts",
    "sample_hyperparameters",
    "weight_guide",
]
