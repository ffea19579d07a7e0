"""Thin, ready-made GPyTorch models."""

from .classifier import DirichletGPClassifier
from .regression import ExactGPModel

__all__ = ["DirichletGPClassifier", "ExactGPModel"]
