"""A temperature for a Dirichlet GP classifier's class probabilities, chosen by the leave-one-out NLL of its labels.

The Dirichlet-based GP (Milios et al. 2018) regresses the transformed labels ỹ_{c,i} = log α_{c,i} − σ²_{c,i}/2 with
the fixed noise σ²_{c,i} = log(1/α_{c,i} + 1), α_{c,i} = α_ε + 1[y_i = c]; its class probabilities E[softmax(f)] are
calibrated only as far as α_ε suits the data, which the paper leaves to validation.  On scikit-learn's digits
(α_ε = 0.01) the off-class noise σ² = log 101 = 4.6 pulls the posterior means towards the prior mean and the
probabilities are too flat (mean confidence 0.90 at 98 % accuracy, ECE 0.08); on the Pima diabetes data they are too
sharp (ECE 0.11–0.18, test NLL 0.55–0.66 over five 70/30 splits).  A temperature T (Guo et al. 2017, "On
calibration of modern neural networks", Sec. 4.2) rescales the latent before the softmax, p = E[softmax(f/T)] with
f/T ~ N(μ/T, σ²/T²), and leaves the most probable class of a point with little latent variance unchanged.

:func:`leave_one_out_temperature` chooses T without a held-out split: each training point's C latent predictions
given all other points (μ₋ᵢ, σ²₋ᵢ − σ²_{c,i}: :func:`~rfgp.models.classifier_check.leave_one_out_latents`, O(N·F²)
for a feature kernel) give its class probabilities at T by the classifier's own integration (seeded Monte Carlo with
the same draws at every T, or mean field), and T minimises their mean negative log probability of the held-out label
over T ∈ [0.1, 10] (:data:`TEMPERATURE_RANGE`): a grid of 9 log-spaced values (T = 1 among them, so that the chosen
T is never worse than 1 by this measure), then a golden-section search around the best one.
``benchmarks/results/classifier_calibration.md`` measures it.
"""

from __future__ import annotations

import math

import gpytorch
import torch

from ..core.user_warnings import warn as warn_user
from ..likelihoods.dirichlet import class_probabilities
from ..metrics import mean_negative_log_likelihood
from .classifier_check import leave_one_out_latents

#: the temperatures searched: a leave-one-out NLL still falling at a bound (training labels that every left-out
#: point predicts correctly, say) stops there, with a warning
TEMPERATURE_RANGE = (0.1, 10.0)
_GRID_POINTS = 9
_GOLDEN_STEPS = 10
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def leave_one_out_temperature(
    model: gpytorch.models.ExactGP, method: str = "mc", num_samples: int = 1000, seed: int | None = 0
) -> tuple[float, dict[float, float]]:
    """(T, {T: leave-one-out NLL} of every temperature tried) for a trained Dirichlet GP ``model``.

    ``model`` holds a :class:`~rfgp.likelihoods.DirichletClassificationLikelihood` and C latent GPs trained on its
    transformed targets; ``method``, ``num_samples`` and ``seed`` are the class-probability integration of
    :meth:`~rfgp.likelihoods.DirichletClassificationLikelihood.predict_proba` (the Monte-Carlo draws are seeded
    afresh at every T: common random numbers, a smooth objective).  The likelihood's own temperature is not read:
    the latents are rescaled from T = 1.

    Raises:
        ValueError: the model's training covariance has no feature root (an exact GPyTorch kernel: its leave-one-out
            predictions would cost O(N³)).
    """
    latents = leave_one_out_latents(model)
    if latents is None:
        raise ValueError(
            "leave_one_out_temperature needs a model whose kernel has random features (an rfgp feature kernel: its "
            "leave-one-out predictions cost O(N·F²)); this model's training covariance has no feature root (an "
            "exact GPyTorch kernel); pass temperature as a number instead"
        )
    mean, variance = latents
    labels = model.likelihood.targets
    tried: dict[float, float] = {}

    def loo_nll(log_temperature: float) -> float:
        temperature = math.exp(log_temperature)
        if temperature not in tried:
            with torch.no_grad():
                probs = class_probabilities(mean, variance, method, num_samples, seed=seed, temperature=temperature)
                tried[temperature] = float(mean_negative_log_likelihood(probs, labels))
        return tried[temperature]

    low, high = (math.log(t) for t in TEMPERATURE_RANGE)
    grid = [low + (high - low) * k / (_GRID_POINTS - 1) for k in range(_GRID_POINTS)]
    grid[_GRID_POINTS // 2] = 0.0  # T = 1 exactly
    best = min(range(_GRID_POINTS), key=lambda k: loo_nll(grid[k]))
    _golden_section(loo_nll, grid[max(best - 1, 0)], grid[min(best + 1, _GRID_POINTS - 1)])
    temperature = min(tried, key=tried.get)
    if temperature in (math.exp(low), math.exp(high)):
        warn_user(
            f"leave_one_out_temperature: the leave-one-out NLL of the training labels is lowest at the bound "
            f"T = {temperature:g} of the temperatures searched {TEMPERATURE_RANGE} ({tried[temperature]:.4g}, against "
            f"{tried[1.0]:.4g} at T = 1), and may fall further beyond it: "
            + ("every training label left out is predicted well, and the data cannot say how much sharper the "
               "probabilities may be; T stops at the bound" if temperature < 1 else
               "the probabilities are too sharp for the data by a factor above the bound (check the fit: "
               "leave_one_out_nll_, class_prior_nll_); T stops at the bound")
        )
    return temperature, tried


def _golden_section(objective, low: float, high: float) -> None:
    """Golden-section search of a unimodal ``objective`` on [low, high] (its values are recorded by ``objective``)."""
    left, right = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    left_value, right_value = objective(left), objective(right)
    for _ in range(_GOLDEN_STEPS):
        if left_value <= right_value:
            high, right, right_value = right, left, left_value
            left = high - _GOLDEN * (high - low)
            left_value = objective(left)
        else:
            low, left, left_value = left, right, right_value
            right = low + _GOLDEN * (high - low)
            right_value = objective(right)
