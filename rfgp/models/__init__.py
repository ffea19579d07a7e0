"""Thin, ready-made GPyTorch models."""

from .regression import ExactGPModel

__all__ = ["ExactGPModel"]
