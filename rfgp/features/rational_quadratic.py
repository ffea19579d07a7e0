r"""Spectral measure of the rational quadratic kernel with a trainable shape α.

GPyTorch's ``RQKernel`` is k(r) = (1 + r²/(2α))^{−α}, r² = (x − y)ᵀΘ⁻²(x − y).  It is a
Gamma scale mixture of squared-exponential kernels (Rasmussen & Williams 2006, Eq. 4.20):
with τ ~ Gamma(α, rate α), E[exp(−τr²/2)] = (1 + r²/(2α))^{−α}, so the frequencies are
ω = g·√τ/ℓ with g ~ N(0, I_d) — a variance-gamma (symmetric generalised Laplace) law with
exponential tails, so every moment of ω is finite (Student-t frequencies, whose heavy tails would
leave a reparameterised Matérn-½ ∂Φ/∂ℓ without a mean, are the Matérn kernel's, where 1/τ is Gamma
distributed; Matérn-½ carries ℓ in importance weights instead, see ``SketchedMaternKernel``).

Sampler — importance weights against a fixed proposal (:mod:`rfgp.features.gamma_proposal`): τ drawn once from
a defensive Gamma mixture at the reference shape α₀ (α at draw time), each frequency weighted by
Gamma(τ; α, α)/r(τ): unbiased for every α, smooth in α to every order, finite variance for α > α₀/8 (a smaller α
raises).  ``resample()`` of the kernel re-centres the proposal.  The lengthscale enters only through ω = g√τ/ℓ.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import random
from .gamma_proposal import draw_gamma_proposal, gamma_log_weights, upgrade_saved_precisions
from .weighted_fourier import SpectralMeasure


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
        log_tau, log_proposal = draw_gamma_proposal(num_frequencies, alpha_ref, generator)
        return {
            "directions": random.normal((num_frequencies, input_dim), generator),
            "log_precisions": log_tau,
            "log_proposal": log_proposal,
            "reference_alpha": torch.tensor(alpha_ref, dtype=torch.float64),
        }

    def upgrade_saved_draws(self, state_dict: dict, prefix: str) -> None:
        upgrade_saved_precisions(state_dict, prefix)

    def frequencies(self, draws: dict[str, Tensor], lengthscale: Tensor, **others: Tensor) -> Tensor:
        """ω = g√τ/ℓ, shape ``(*batch, m, d)`` for ``lengthscale`` ``(*batch, 1, d or 1)``."""
        return draws["directions"] * (0.5 * draws["log_precisions"]).exp().unsqueeze(-1) / lengthscale

    def log_weights(self, draws: dict[str, Tensor], alpha: Tensor, **others: Tensor) -> Tensor:
        """log Gamma(τ; α, α) − log r(τ), shape ``(*batch, m)`` for ``alpha`` ``(*batch, 1)``."""
        return gamma_log_weights(draws["log_precisions"], draws["log_proposal"], alpha, draws["reference_alpha"],
                                 "alpha")
