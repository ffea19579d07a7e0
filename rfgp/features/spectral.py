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
