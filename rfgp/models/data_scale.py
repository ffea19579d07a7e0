"""Warn before :func:`rfgp.fit_mll` trains a random Fourier map from a lengthscale far below the data's spacing.

Raw columns (ages in years, serum levels in mg/dl, calendar years, incomes) at GPyTorch's initial lengthscale
ℓ = 0.69 put the training points hundreds of lengthscales apart.  The exact kernel is then ≈ 0 between all of them:
its marginal likelihood is flat in ℓ and an exact GP stays a white-noise model around the mean.  The random-feature
estimate k̂(x, x') = Φ(x)ᵀΦ(x') is not ≈ 0 there but Monte-Carlo noise of size ≈ 1/√F, and its lengthscale derivative,
Σ (ωᵀτ/ℓ)·sin(ωᵀτ)/m, grows like the squared scaled distance ‖τ/ℓ‖²; training follows that noise, drives
lengthscales towards 0 and stops at a loss far above the exact GP's (scikit-learn's raw diabetes, N = 200, F = 256:
2202 per point against 5.80, test RMSE 173 against 76, where the mean predicts with 76; from ℓ = the columns'
standard deviations both reach 5.5, RMSE 56).  Standardised data rarely come close: 10 standard-normal columns are
≈ 6.5 lengthscales apart at ℓ = 0.69; raw co2 or elnino time in years ≈ 20–30, where rfgp trained as the exact GP
(``benchmarks/raw_data_sweep.py``).
"""

from __future__ import annotations

import warnings

import gpytorch
import torch

from ..training import DataScaleWarning, register_start_check
from .feature_width import fourier_units
from .kernel_inputs import covar_module_inputs

#: warn when the median distance between training points exceeds this many lengthscales
MEDIAN_SCALED_DISTANCE = 50.0
#: the median is taken over the pairs of at most this many training rows (evenly spaced)
_SAMPLE_ROWS = 256


def median_scaled_distance(x: torch.Tensor, lengthscale: torch.Tensor) -> float:
    """The median of ‖(xᵢ − xⱼ)/ℓ‖ over pairs of rows of ``x`` (at most ``_SAMPLE_ROWS`` of them, evenly spaced);
    ``lengthscale`` of shape ``(..., 1, d or 1)``, the largest over a batch (the mildest case) is used."""
    rows = x.detach().reshape(-1, x.shape[-1]).to(torch.float64)
    rows = rows[torch.linspace(0, rows.shape[0] - 1, min(rows.shape[0], _SAMPLE_ROWS)).round().long().unique()]
    ell = lengthscale.detach().to(torch.float64).reshape(-1, lengthscale.shape[-1]).amax(0)
    if rows.shape[0] < 2:
        return 0.0
    return float(torch.pdist(rows / ell).median())


def warn_lengthscale_below_data_scale(model: gpytorch.models.ExactGP) -> None:
    """Warn (:class:`~rfgp.training.DataScaleWarning`) for each random Fourier kernel whose training inputs lie a median
    of more than ``MEDIAN_SCALED_DISTANCE`` lengthscales apart (its inputs as ``model.forward`` passes them on, e.g.
    a deep kernel's network outputs: :func:`~rfgp.models.kernel_inputs.covar_module_inputs`)."""
    train_inputs = getattr(model, "train_inputs", None)
    if not train_inputs or not torch.is_tensor(train_inputs[0]) or not train_inputs[0].is_floating_point():
        return
    for _, kernel, x in fourier_units(model, covar_module_inputs(model, train_inputs[0])):
        distance = median_scaled_distance(x, kernel.lengthscale)
        if distance > MEDIAN_SCALED_DISTANCE:
            values = kernel.lengthscale.detach().flatten().tolist()
            shown = ", ".join(f"{v:.3g}" for v in values[:4]) + (", …" if len(values) > 4 else "")
            warnings.warn(
                f"fit_mll: the training inputs of {type(kernel).__name__} lie a median {distance:.3g} "
                f"lengthscales apart (lengthscale {shown}; more than "
                f"{MEDIAN_SCALED_DISTANCE:g}): the kernel is ≈ 0 between almost all of them, where its marginal "
                "likelihood is flat and the random-feature estimate is Monte-Carlo noise whose lengthscale gradient "
                "grows with the squared distance, so training follows the noise (raw diabetes, F = 256: loss 2202 "
                "per point against the exact GP's 5.8). Standardise the inputs, or start from a lengthscale on the "
                "data's scale, e.g. kernel.lengthscale = train_x.std(0)",
                DataScaleWarning, stacklevel=4,
            )


register_start_check(warn_lengthscale_below_data_scale)
