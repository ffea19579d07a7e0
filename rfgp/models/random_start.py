"""Random starting points for restarting a GP's hyperparameter optimisation (``n_restarts_optimizer``).

The marginal likelihood of a GP is not concave in its hyperparameters: it has the trivial optimum "all noise"
(outputscale → 0, noise → the targets' variance) and, for wiggly or periodic targets, several local optima in the
lengthscales (Rasmussen & Williams 2006, §5.4.1, Fig. 5.5).  A local optimiser ends in the one whose basin holds its
start, so scikit-learn's ``GaussianProcessRegressor`` restarts it from random points (``n_restarts_optimizer``) and
keeps the best optimum.  :func:`draw_random_start` makes such a point for a GPyTorch model.
"""

from __future__ import annotations

import math

import gpytorch
import torch
from torch import Tensor

#: a restart's lengthscales are the default start's times independent log-uniform factors in this range: mostly
#: shorter, since the default start (the median distance between inputs) is already near the longest scale of interest
LENGTHSCALE_FACTORS = (1e-2, 10.0)
#: a restart's Gaussian noise variance is log-uniform on this range, as a fraction of the targets' variance
NOISE_FRACTIONS = (1e-3, 1.0)


def draw_random_start(model: gpytorch.models.ExactGP, generator: torch.Generator, target_variance: float) -> None:
    """Move ``model``'s hyperparameters, in place, to a random starting point for another optimisation.

    - Every lengthscale entry ℓ of every kernel in ``model.covar_module`` (ARD entries and batch members
      independently) becomes ℓ·exp(u), u ~ U(log 10⁻², log 10): three decades, mostly below the given start, since
      the default one (the median distance between inputs) is near the longest scale of interest and wiggly targets
      want far shorter ones (sin(20x) on [0, 10]: a fiftieth of it).
    - A Gaussian likelihood's noise variance becomes v·exp(u'), u' ~ U(log 10⁻³, 0), with v = ``target_variance``:
      from nearly noise-free to all noise.

    Other hyperparameters (outputscale, mean, periods) keep their values, and no random feature is re-drawn, so every
    start trains the same approximate kernel and their final losses compare.  Values are kept inside their constraints'
    bounds.  The draws come from ``generator`` (a CPU generator: the same starts on every device).
    """
    for module in model.covar_module.modules():
        if getattr(module, "has_lengthscale", False) and module.lengthscale is not None:
            lengthscale = module.lengthscale.detach()
            low, high = (math.log(factor) for factor in LENGTHSCALE_FACTORS)
            factor = _log_uniform(lengthscale.shape, low, high, generator)
            module.lengthscale = _inside(lengthscale * factor.to(lengthscale), module.raw_lengthscale_constraint)
    noise_covar = getattr(model.likelihood, "noise_covar", None)
    if isinstance(noise_covar, gpytorch.likelihoods.noise_models.HomoskedasticNoise):
        noise = noise_covar.noise.detach()
        low, high = (math.log(target_variance * fraction) for fraction in NOISE_FRACTIONS)
        noise_covar.noise = _inside(_log_uniform(noise.shape, low, high, generator).to(noise),
                                    noise_covar.raw_noise_constraint)


def _log_uniform(shape: torch.Size, low: float, high: float, generator: torch.Generator) -> Tensor:
    """exp(u) with u ~ U(low, high) of ``shape``, in float64 on the CPU."""
    return (low + (high - low) * torch.rand(shape, generator=generator, dtype=torch.float64)).exp()


def _inside(value: Tensor, constraint: gpytorch.constraints.Interval) -> Tensor:
    """``value`` moved inside ``constraint``'s bounds by a relative margin of 10⁻³ of the interval (or of the bound
    where the interval is infinite), so that the constraint's inverse transform is finite."""
    lower, upper = (bound.to(value) for bound in (constraint.lower_bound, constraint.upper_bound))
    width = upper - lower
    margin = torch.where(width.isfinite(), 1e-3 * width, 1e-3 * lower.abs())
    low = torch.where(lower.isfinite(), lower + margin, torch.full_like(lower, -math.inf))
    high = torch.where(upper.isfinite(), upper - margin, torch.full_like(upper, math.inf))
    return torch.minimum(torch.maximum(value, low), high)
