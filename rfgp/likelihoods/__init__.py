"""Likelihoods: Dirichlet-based GP classification and its class-probability estimators."""

from .dirichlet import DirichletClassificationLikelihood
from .softmax import softmax_expectation_mc, softmax_expectation_mean_field

__all__ = ["DirichletClassificationLikelihood", "softmax_expectation_mc", "softmax_expectation_mean_field"]
