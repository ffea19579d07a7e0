"""Spectral densities of isotropic shift-invariant kernels, as Gaussian scale mixtures.

Bochner: k(x − y) = E_ω[cos(ωᵀ(x − y))] with ω drawn from the kernel's normalised
spectral density (unit lengthscale).  Every density here is a Gaussian scale mixture,
ω = s·g with g ~ N(0, I_d) and an independent scalar s ≥ 0, so the same frequency
samplers (i.i.d., orthogonal, structured) serve all kernels: they produce rows with
Gaussian marginals and each row is multiplied by its own draw of s.

* RBF, k(r) = exp(−r²/2): s = 1.
* Matérn-ν, k(r) = 2^{1−ν}/Γ(ν)(√(2ν) r)^ν K_ν(√(2ν) r): ω is multivariate Student-t with
  2ν degrees of freedom, s = √(2ν/u), u ~ χ²_{2ν} (Rasmussen & Williams 2006, Eq. 4.15).
* Rational quadratic, k(r) = (1 + r²/(2α))^{−α}: a Gamma(α, rate α) mixture of RBF
  precisions, s = √τ (Rasmussen & Williams 2006, Eq. 4.20).

Each class also evaluates k(r) exactly, which tests and error metrics use.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import check_positive_float
from . import random

#: the configuration fields that save a module's spectral density (:meth:`SpectralDensity.config_value`): an RBF and
#: a Matérn of any ν have the same draws' keys
CONFIG_FIELDS = ("spectral_density", "spectral_parameter")


class SpectralDensity:
    """A Gaussian scale mixture ω = s·g; subclasses define the scale draws and k(r)."""

    name = "spectral density"

    @property
    def family(self) -> str:
        """The density's class name (saved in a feature map's ``state_dict``)."""
        return type(self).__name__

    @property
    def parameter(self) -> float | None:
        """The shape parameter of the family (Matérn ν, rational-quadratic α), ``None`` if it has none."""
        return None

    def config_value(self, name: str) -> str | float | None:
        """The value saved as the configuration field ``name`` of a module drawing from this density
        (:data:`CONFIG_FIELDS`): its family or its parameter."""
        return self.family if name == "spectral_density" else self.parameter

    def sample_scales(self, num: int, generator: torch.Generator) -> Tensor | None:
        """``num`` draws of the row scale s (float64), or ``None`` when s ≡ 1."""
        return None

    def correlation(self, r: Tensor) -> Tensor:
        """k(r) for distances r measured in lengthscales."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return self.name


class GaussianSpectralDensity(SpectralDensity):
    """Spectral density of the RBF kernel exp(−r²/2): ω ~ N(0, I)."""

    name = "rbf"

    def correlation(self, r: Tensor) -> Tensor:
        return torch.exp(-0.5 * r**2)


class MaternSpectralDensity(SpectralDensity):
    """Spectral density of the Matérn kernel with smoothness ν ∈ {1/2, 3/2, 5/2}."""

    def __init__(self, nu: float) -> None:
        if nu not in (0.5, 1.5, 2.5):
            raise ValueError(f"nu must be one of 0.5, 1.5, 2.5, got {nu!r}")
        self.nu = float(nu)
        self.name = f"matern{nu}"

    @property
    def parameter(self) -> float:
        return self.nu

    def sample_scales(self, num: int, generator: torch.Generator) -> Tensor:
        u = 2.0 * random.gamma((num,), self.nu, generator)  # χ²_{2ν}
        return torch.sqrt(2.0 * self.nu / u)

    def lengthscale_log_weights(self, unit_frequencies: Tensor, ratio: Tensor) -> Tensor:
        r"""log p_ℓ(ω)/p_ℓ₀(ω) at the frequencies ω = ξ/ℓ₀ drawn at an anchor lengthscale ℓ₀, ``ratio`` = ℓ/ℓ₀.

        ω = ξ/ℓ with ξ multivariate Student-t (2ν degrees of freedom) has the density
        p_ℓ(ω) = Πᵢℓᵢ·t(ℓ⊙ω), t(z) ∝ (1 + ‖z‖²/(2ν))^{−(ν + d/2)}, so at ℓ⊙ω = ρ⊙ξ, ρ = ℓ/ℓ₀,

            log r = Σᵢ log ρᵢ + (ν + d/2)·[log1p(‖ξ‖²/(2ν)) − log1p(‖ρ⊙ξ‖²/(2ν))],

        (ν = ½: r = Πᵢρᵢ·[(1 + ‖ξ‖²)/(1 + ‖ρ⊙ξ‖²)]^{(d+1)/2}).  Weighting the features of the fixed ω by √r
        gives E[r·cos(ωᵀτ)] = k_ℓ(τ) for every ℓ, and log r = 0 exactly at ρ = 1.  r is bounded uniformly in ξ
        (isotropic: r ≤ ρ^{−2ν} for ρ ≤ 1, r ≤ ρ^d for ρ ≥ 1), and so is ∂log r/∂ρ (by (2ν + d)/ρ), so the
        lengthscale gradient of the weighted features has finite variance whatever the tails of ξ.

        Args:
            unit_frequencies: ξ, ``(m, d)`` (the frequencies at unit lengthscale).
            ratio: ρ = ℓ/ℓ₀, ``(*batch, 1, d or 1)``.

        Returns:
            log r, ``(*batch, m)``.
        """
        d = unit_frequencies.shape[-1]
        log_jacobian = ratio.log().expand(*ratio.shape[:-1], d).sum(-1)  # (*batch, 1)
        dof = 2.0 * self.nu
        scaled = (unit_frequencies * ratio).pow(2).sum(-1)
        unit = unit_frequencies.pow(2).sum(-1)
        return log_jacobian + (self.nu + 0.5 * d) * (torch.log1p(unit / dof) - torch.log1p(scaled / dof))

    def correlation(self, r: Tensor) -> Tensor:
        s = math.sqrt(2.0 * self.nu) * r
        if self.nu == 0.5:
            poly = torch.ones_like(s)
        elif self.nu == 1.5:
            poly = 1.0 + s
        else:
            poly = 1.0 + s + s**2 / 3.0
        return poly * torch.exp(-s)


class RationalQuadraticSpectralDensity(SpectralDensity):
    """Spectral density of the rational quadratic kernel (1 + r²/(2α))^{−α} with fixed α."""

    def __init__(self, alpha: float) -> None:
        self.alpha = check_positive_float(alpha, "alpha")
        self.name = f"rq(alpha={self.alpha:g})"

    @property
    def parameter(self) -> float:
        return self.alpha

    def sample_scales(self, num: int, generator: torch.Generator) -> Tensor:
        return torch.sqrt(random.gamma((num,), self.alpha, generator) / self.alpha)

    def correlation(self, r: Tensor) -> Tensor:
        return (1.0 + r**2 / (2.0 * self.alpha)).pow(-self.alpha)
