r"""Spectral measure of the spectral mixture kernel (Wilson & Adams 2013) as GPyTorch defines it.

GPyTorch's ``SpectralMixtureKernel`` (gpytorch/kernels/spectral_mixture_kernel.py, ``forward``:
sum over components, then product over dimensions) is

    k(τ) = Π_i Σ_q w_q exp(−2π²τ_i²σ_{qi}²) cos(2πτ_iμ_{qi}),

(weights w_q, means μ_q, scales σ_q; per dimension the 1-D kernel of Wilson & Adams 2013,
"Gaussian process kernels for pattern discovery and extrapolation", the SM kernel), so
k(0) = (Σ_q w_q)^d.  Each 1-D term w_q·exp(·)cos(·) is w_q times the characteristic function
of the symmetrised Gaussian 2π(±μ_{qi} + σ_{qi}z), so k = A·E[cos ωᵀτ] with amplitude
A = (Σ_q w_q)^d and, independently per dimension i, a component c_i drawn with probability
w_q/Σw, a sign s_i = ±1 and z_i ~ N(0, 1): ω_i = 2π(s_iμ_{c_i i} + σ_{c_i i}z_i).

Sampler — stratified components with weights as amplitudes: per dimension the m frequencies
are split as evenly as possible over the Q components (an independent ``randperm(m) mod Q``
per dimension, so each c_i is marginally uniform with share π_q = m_q/m), and a frequency
carries the weight Π_i (w_{c_i}/Σw)/π_{c_i}, E[w] = 1.  Means and scales enter by
reparameterisation, the mixture weights through the (smooth) weights: unbiased, with
gradients in all three.  Needs m ≥ Q.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import check_positive_int
from . import random
from .weighted_fourier import SpectralMeasure


class SpectralMixtureSpectralMeasure(SpectralMeasure):
    """ω_i = 2π(s_iμ_{c_i i} + σ_{c_i i}z_i) with weights Π_i(w_{c_i}/Σw)/π_{c_i}.

    Hyperparameters ``means``, ``scales``, ``weights`` (GPyTorch's shapes).

    Args:
        num_mixtures: Q.
    """

    name = "spectral mixture"

    def __init__(self, num_mixtures: int) -> None:
        super().__init__()
        self.num_mixtures = check_positive_int(num_mixtures, "num_mixtures")
        self.name = f"spectral mixture (Q={self.num_mixtures})"

    def draw(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        if num_frequencies < self.num_mixtures:
            raise ValueError(
                f"num_features must give at least one frequency per mixture component: F/2 = {num_frequencies} "
                f"< num_mixtures = {self.num_mixtures} (use num_features ≥ {2 * self.num_mixtures})"
            )
        component = torch.stack(
            [torch.randperm(num_frequencies, generator=generator) % self.num_mixtures for _ in range(input_dim)], -1
        )  # (m, d)
        share = torch.bincount(component[:, 0], minlength=self.num_mixtures).to(torch.float64) / num_frequencies
        return {
            "component": component,
            "component_share": share,
            "normals": random.normal((num_frequencies, input_dim), generator),
            "signs": random.rademacher((num_frequencies, input_dim), generator),
        }

    def frequencies(self, draws: dict[str, Tensor], means: Tensor, scales: Tensor, **others: Tensor) -> Tensor:
        """ω of shape ``(*batch, m, d)`` for ``means``/``scales`` ``(*batch, Q, 1, d)``."""
        mu, sigma = _per_frequency(means, draws["component"]), _per_frequency(scales, draws["component"])
        return 2 * math.pi * (draws["signs"] * mu + sigma * draws["normals"])

    def log_weights(self, draws: dict[str, Tensor], weights: Tensor, **others: Tensor) -> Tensor:
        """Σ_i log[(w_{c_i}/Σw)/π_{c_i}], shape ``(*batch, m)`` for ``weights`` ``(*batch, Q)``."""
        component = draws["component"]
        log_ratio = torch.log(weights) - torch.log(weights.sum(-1, keepdim=True)) - torch.log(draws["component_share"])
        picked = log_ratio.index_select(-1, component.flatten())
        return picked.reshape(*log_ratio.shape[:-1], *component.shape).sum(-1)


def _per_frequency(parameter: Tensor, component: Tensor) -> Tensor:
    """parameter[..., c_{ji}, 0, i] of shape ``(*batch, m, d)`` for ``parameter`` ``(*batch, Q, 1, d)``."""
    table = parameter.squeeze(-2)  # (*batch, Q, d)
    index = component.expand(*table.shape[:-2], *component.shape)
    return table.gather(-2, index)
