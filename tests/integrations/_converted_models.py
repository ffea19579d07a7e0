"""Copies of a BoTorch model with its kernel converted: the exact model through Nyström landmarks, or random features.

A Nyström map whose landmarks are every point the kernel sees reproduces k on them and against them, so the landmark
copy is the exact model up to the Nyström factor's round-off; the sketched copy is the random-feature model at width F.
"""

import copy

import torch

import rfgp


def nystrom(kernel, *points):
    """``kernel`` converted to a Nyström map whose landmarks are the distinct rows of ``points``."""
    landmarks = torch.cat([p.reshape(-1, p.shape[-1]) for p in points]).unique(dim=0)  # distinct rows
    return rfgp.sketch(kernel, landmarks.shape[0], method="nystrom", x_sample=landmarks)


def landmark_copy(model, *points):
    """The model with its kernel converted to the Nyström map on ``points`` (the exact model there), in eval mode."""
    converted = copy.deepcopy(model)
    converted.covar_module = nystrom(model.covar_module, *points)
    return converted.eval()


def sketched_copy(model, num_features, seed=0):
    """The model with its kernel converted to ORF features of width ``num_features``, in eval mode."""
    converted = copy.deepcopy(model)
    converted.covar_module = rfgp.sketch(model.covar_module, num_features, method="orf", seed=seed)
    return converted.eval()
