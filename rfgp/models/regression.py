"""A ready-made GPyTorch ``ExactGP`` for regression with any (sketched or exact) kernel."""

from __future__ import annotations

import gpytorch
from torch import Tensor


class ExactGPModel(gpytorch.models.ExactGP):
    """f ~ GP(m, k) with y = f + ε: the standard GPyTorch regression model, kernel supplied.

    With an rfgp kernel, training and prediction cost O(N·F² + F³) instead of O(N³).

    Args:
        train_x: inputs ``(n, d)``.
        train_y: targets ``(n,)``.
        likelihood: e.g. ``gpytorch.likelihoods.GaussianLikelihood()``.
        covar_module: the kernel, e.g. ``ScaleKernel(SketchedRBFKernel(1024, ard_num_dims=d))``.
        mean_module: defaults to ``gpytorch.means.ConstantMean()``.
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood, covar_module, mean_module=None) -> None:
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = mean_module if mean_module is not None else gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
