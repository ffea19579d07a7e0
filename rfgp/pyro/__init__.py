"""Pyro integration: weight-space random-feature GPs with any likelihood, and fully Bayesian hyperparameters.

* :class:`RandomFeatureGP` — f = m + σΦ(x/ℓ)w, w ~ N(0, I), with the likelihoods of
  :mod:`rfgp.pyro.likelihoods`; inference by :func:`fit_svi` with :func:`weight_guide`,
  or by :func:`run_nuts`; predictions by :func:`posterior_predictive`.
"""

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
    "fit_svi",
    "posterior_predictive",
    "run_nuts",
    "weight_guide",
]
