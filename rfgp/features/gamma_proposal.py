r"""Importance sampling of a Gamma(a, rate a) mixing variable whose shape a is a trainable hyperparameter.

Kernels that are Gamma scale mixtures — the rational quadratic (1 + r²/(2α))^{−α} = E[exp(−τr²/2)] and the
inverse multiquadric (1 + r/α)^{−β} = E[exp(−τβr/α)], τ ~ Gamma(a, rate a) with a = α resp. β — need τ draws that
stay fixed while a trains.  Reparameterising τ by its inverse CDF would need the derivative of the inverse
regularised incomplete gamma function in a, which torch does not provide.  Instead τ is drawn once from the
defensive mixture r(τ) = ½Gamma(τ; a₀, a₀) + ½Gamma(τ; a₀/4, a₀/4) at the reference shape a₀ (a at draw time), and
each draw carries the weight

    w(τ) = Gamma(τ; a, a)/r(τ),   log Gamma(τ; a, a) = a log a − log Γ(a) + (a − 1) log τ − aτ,

so E_r[w g(τ)] = E_a[g(τ)] for every a (unbiased), w is smooth in a to every order, w ≤ 2 at a = a₀, and
E_r[w²] < ∞ for every a > a₀/8 (the tails of the Gamma(a₀/4) component).  Below that bound the weights have infinite
variance, so a smaller a raises (:class:`~rfgp.core.validation.DrawCoverageError`); far above a₀ the target
concentrates near τ = 1 and the variance grows (roughly like √(a/a₀)).  Redrawing re-centres the proposal.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import DrawCoverageError, has_values
from . import random

#: the proposal is the equal mixture of Gamma(f·a₀, rate f·a₀) over these factors f
PROPOSAL_FACTORS = (1.0, 0.25)
#: the weights have finite variance for a > a₀·MIN_SHAPE_RATIO
MIN_SHAPE_RATIO = 0.125


def log_gamma_density(log_tau: Tensor, shape: Tensor) -> Tensor:
    """log of the Gamma(shape, rate = shape) density (mean 1) at τ, from log τ (finite where τ underflows)."""
    return shape * torch.log(shape) - torch.lgamma(shape) + (shape - 1) * log_tau - shape * log_tau.exp()


def draw_gamma_proposal(num_draws: int, reference_shape: float, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """(log τ, log r(τ)): ``num_draws`` draws from the proposal r at a₀ = ``reference_shape``, float64.

    The draws are kept as log τ: at a₀/4 ≲ 0.0025 a share of the τ underflow float64 (and float32 at a₀/4 ≲ 0.05),
    where log τ, the weights and their derivatives stay finite; the frequencies ∝ √τ = exp(½ log τ) then underflow
    to 0 harmlessly.

    a₀ is rounded to float32 first, so that a seed draws the same τ whether a₀ was read from a float32 or a float64
    hyperparameter: α = 1 set on a float64 kernel reads back as 0.9999999995 (softplus round trip), on a float32 one
    as 1.0, and :func:`~rfgp.features.random.gamma` samples shapes below 1 by another route, so the two dtypes drew
    unrelated τ.  Any a₀ gives an unbiased proposal; r is evaluated at the rounded one.
    """
    reference_shape = float(torch.tensor(reference_shape, dtype=torch.float32))
    shapes = [reference_shape * factor for factor in PROPOSAL_FACTORS]
    candidates = torch.stack([random.log_gamma((num_draws,), a, generator) - math.log(a) for a in shapes])
    component = torch.randint(len(shapes), (num_draws,), generator=generator)
    log_tau = candidates.gather(0, component.unsqueeze(0)).squeeze(0)
    shape_tensor = torch.tensor(shapes, dtype=torch.float64).unsqueeze(-1)
    return log_tau, torch.logsumexp(log_gamma_density(log_tau, shape_tensor), dim=0) - math.log(len(shapes))


def gamma_log_weights(log_tau: Tensor, log_proposal: Tensor, shape: Tensor, reference_shape: Tensor,
                      name: str) -> Tensor:
    """log w(τ) = log Gamma(τ; a, a) − log r(τ) of :func:`draw_gamma_proposal`'s draws log τ, shape ``(*batch, m)``
    for a = ``shape`` ``(*batch, 1)``; a ≤ a₀/8 (a₀ = ``reference_shape``) raises, naming the hyperparameter
    ``name``."""
    bound = reference_shape * MIN_SHAPE_RATIO
    if has_values(shape) and bool((shape <= bound).any()):
        raise DrawCoverageError(
            f"{name} {float(shape.detach().min()):.4g} is at or below {float(bound):.4g} = {name}_at_draw_time/8, "
            "where the importance weights of the drawn precisions have infinite variance: call resample() on the "
            f"kernel to re-centre the proposal at the current {name}"
        )
    # in float64 (the tensors are tiny): a log a − log Γ(a) cancels to O(log a) from O(a log a), which float32 loses
    # at large a (α = 1e5: every weight off by several per cent, α = 1e7: k̂(x, x) ≈ 8000)
    float64 = torch.float64
    log_weights = log_gamma_density(log_tau.to(float64), shape.to(float64)) - log_proposal.to(float64)
    return log_weights.to(shape.dtype)


def upgrade_saved_precisions(state_dict: dict, prefix: str) -> None:
    """Rename a state's precisions τ (``precisions``, saved before the draws were kept as log τ) to ``log_precisions``
    = log τ, in the copy ``load_state_dict`` hands to a module; a state with log τ is left as it is."""
    saved = state_dict.pop(prefix + "precisions", None)
    if saved is not None and prefix + "log_precisions" not in state_dict:
        state_dict[prefix + "log_precisions"] = saved.log()
