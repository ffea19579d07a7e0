"""Hyperparameter training by maximising GPyTorch's exact marginal log likelihood."""

from __future__ import annotations

import sys

import gpytorch
import torch
from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets inside notebooks

from ._validation import check_positive_float, check_positive_int


def fit_mll(
    model: gpytorch.models.ExactGP,
    num_iterations: int = 100,
    lr: float = 0.05,
    progress: bool | None = None,
    description: str = "training",
) -> list[float]:
    """Train ``model`` (and its likelihood) with Adam on the negative exact MLL.

    Args:
        model: an ``ExactGP`` holding its training data and likelihood.
        num_iterations: optimiser steps.
        lr: Adam learning rate.
        progress: show a tqdm progress bar; ``None`` shows it only on a terminal.
        description: label of the progress bar.

    Returns:
        The loss (negative MLL per data point) at every iteration.
    """
    num_iterations = check_positive_int(num_iterations, "num_iterations")
    lr = check_positive_float(lr, "lr")
    if progress is None:
        progress = sys.stderr.isatty()
    model.train()
    model.likelihood.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    train_x, train_y = model.train_inputs, model.train_targets
    losses = []
    bar = tqdm(range(num_iterations), desc=description, disable=not progress, leave=False)
    for _ in bar:
        optimizer.zero_grad()
        loss = -mll(model(*train_x), train_y).sum()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    model.eval()
    model.likelihood.eval()
    return losses
