r"""Spectral measure of the rational quadratic kernel with a trainable shape α.

GPyTorch's ``RQKernel`` is k(r) = (1 + r²/(2α))^{−α}, r² = (x − y)ᵀΘ⁻²(x − y).  It is a
Gamma scale mixture of squared-exponential kernels (Rasmussen & Williams 2006, Eq. 4.20):
with τ ~ Gamma(α, rate α), E[exp(−τr²/2)] = (1 + r²/(2α))^{−α}, so the frequencies are
ω = g·√τ/ℓ with g ~ N(0, I_d) — a variance-gamma (symmetric generalised Laplace) law with
exponential tails, so every moment of ω is finite (Student-t frequencies, whose heavy tails would
leave a reparameterised Matérn-½ ∂Φ/∂ℓ without a mean, are the Matérn kernel's, where 1/τ is Gamma
distributed; Matérn-½ carries ℓ in importance weights instead, see ``SketchedMaternKernel``).

Sampler — importance weights against a fixed proposal.  Reparameterising τ by its inverse
CDF would need the derivative of the inverse regularised incomplete gamma function in α (and
its second derivative for Hessians), which torch does not provide.  Instead τ is drawn once
from the defensive mixture r(τ) = ½Gamma(τ; α₀, α₀) + ½Gamma(τ; α₀/4, α₀/4) at the reference
shape α₀ (α at draw time), and each frequency carries the weight

    w(τ) = Gamma(τ; α, α)/r(τ),   log Gamma(τ; a, a) = a log a − log Γ(a) + (a − 1) log τ − aτ,

so E_r[w cos ωᵀτ] = k for every α (unbiased), w is smooth in α to every order (autograd
agrees with finite differences, Hessians exist), w ≤ 2 at α = α₀, and E_r[w²] < ∞ for every
α > α₀/8 (the tails of the Gamma(α₀/4) component).  Below that bound the weights have infinite
variance, so a smaller α raises; far above α₀ the target concentrates near τ = 1 and the
variance grows (roughly like √(α/α₀)).  ``resample()`` of the kernel re-centres the proposal.
The lengthscale enters only through ω = g√τ/ℓ.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import DrawCoverageError
from . import random
from .weighted_fourier import SpectralMeasure

#: the proposal is the equal mixture of Gamma(f·α₀, rate f·α₀) over these factors f
PROPOSAL_FACTORS = (1.0, 0.25)
#: the weights have finite variance for α > α₀·MIN_ALPHA_RATIO
MIN_ALPHA_RATIO = 0.125


def log_gamma_density(tau: Tensor, shape: Tensor) -> Tensor:
    """log of the Gamma(shape, rate = shape) density at τ (mean 1)."""
    return shape * torch.log(shape) - torch.lgamma(shape) + (shape - 1) * torch.log(tau) - shape * tau


class RationalQuadraticSpectralMeasure(SpectralMeasure):
    """ω = g√τ/ℓ with importance weights Gamma(τ; α, α)/r(τ); hyperparameters ``lengthscale`` and ``alpha``.

    ``reference["alpha"]`` (α₀, any shape) centres the proposal; its smallest value is used.
    """

    name = "rational quadratic"

    def draw(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        alpha = self.reference.get("alpha")
        if alpha is None:
            raise RuntimeError("RationalQuadraticSpectralMeasure needs reference['alpha'] before drawing")
        alpha_ref = float(alpha.detach().min())
        shapes = [alpha_ref * factor for factor in PROPOSAL_FACTORS]
        candidates = torch.stack([random.gamma((num_frequencies,), a, generator) / a for a in shapes])
        component = torch.randint(len(shapes), (num_frequencies,), generator=generator)
        tau = candidates.gather(0, component.unsqueeze(0)).squeeze(0)
        shape_tensor = torch.tensor(shapes, dtype=torch.float64).unsqueeze(-1)
        log_proposal = torch.logsumexp(log_gamma_density(tau, shape_tensor), dim=0) - math.log(len(shapes))
        return {
            "directions": random.normal((num_frequencies, input_dim), generator),
            "precisions": tau,
            "log_proposal": log_proposal,
            "reference_alpha": torch.tensor(alpha_ref, dtype=torch.float64),
        }

    def frequencies(self, draws: dict[str, Tensor], lengthscale: Tensor, **others: Tensor) -> Tensor:
        """ω = g√τ/ℓ, shape ``(*batch, m, d)`` for ``lengthscale`` ``(*batch, 1, d or 1)``."""
        return draws["directions"] * draws["precisions"].sqrt().unsqueeze(-1) / lengthscale

    def log_weights(self, draws: dict[str, Tensor], alpha: Tensor, **others: Tensor) -> Tensor:
        """log Gamma(τ; α, α) − log r(τ), shape ``(*batch, m)`` for ``alpha`` ``(*batch, 1)``."""
        bound = draws["reference_alpha"] * MIN_ALPHA_RATIO
        if bool((alpha <= bound).any()):
            raise DrawCoverageError(
                f"alpha {float(alpha.min()):.4g} is at or below {float(bound):.4g} = alpha_at_draw_time/8, where "
                "the importance weights of the drawn precisions have infinite variance: call resample() on the "
                "kernel to re-centre the proposal at the current alpha"
            )
        return log_gamma_density(draws["precisions"], alpha) - draws["log_proposal"]
