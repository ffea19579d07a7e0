"""Spherical Random Features (SRF) for the polynomial kernel on the unit sphere.

Target (paper 000, Eq. 57; the outputscale σ² lives in GPyTorch's ``ScaleKernel``), for
‖x‖ = ‖y‖ = 1 and τ = ‖x − y‖:

    k(x, y) = (1 − ‖x − y‖²/a²)^p = ((1 − 2/a²) + (2/a²) xᵀy)^p,    p ∈ ℕ, a ≥ 2.

Pennington et al. (2015) draw m frequencies ωᵢ = rᵢuᵢ with directions uᵢ on the unit sphere
and radii from a fitted density μ (:mod:`.radial_density`), and use the sin/cos map of
paper 000, Eq. 59:

    Φ(x) = √(c/m) [cos(ω₁ᵀx), …, cos(ω_mᵀx), sin(ω₁ᵀx), …, sin(ω_mᵀx)],   F = 2m,

with c = ∫μ = K̂(0), so that E[Φ(x)ᵀΦ(y)] = K̂(τ) = ∫μ(r)Ω_d(rτ) dr exactly — the *fitted*
kernel, within :attr:`SphericalRandomFeatures.max_fit_error` of k (biased by construction:
k is not positive definite on ℝ^d).  Φ(x)ᵀΦ(x) = c, and the kernels add k(x, x) − c when
positive to the posterior variance (paper 000, §5.6).

Direction samplers (paper 000, §6.4):

* ``"iid"`` ("SRF"): Gaussian vectors normalised to unit length (uniform on S^{d−1}).
* ``"structured"`` ("SRF Orth."): the rows of the SORF matrix H D₁ H D₂ H D₃ (normalised
  Hadamard H, Rademacher diagonals Dᵢ; paper 002, Eq. 5) — orthonormal within each block of
  d' = 2^⌈log₂ d⌉ rows, independent blocks beyond, applied in O(d' log d') by the FWHT.  The
  input is zero-padded to d' (it stays on the unit sphere of ℝ^{d'}), so the density is fitted
  for d'.  Like SORF, directions are only approximately uniform: a small bias for small d'.

The complex map of paper 000, Eq. 60 ("SRF Orth. Comp.") is Φ_C(x) = √(c/m)[exp(iωⱼᵀx)]ⱼ
with m complex features; its real and imaginary parts *are* the cos/sin halves of Φ, so
Re Φ_C(x)ᵀconj Φ_C(y) = Φ(x)ᵀΦ(y) (footnote 19).  :meth:`SphericalRandomFeatures.complex_features`
returns Φ_C; at equal real width F both maps carry the same m = F/2 frequencies.
"""

from __future__ import annotations

import itertools
import math
import os

import torch
from torch import Tensor

from ..core.config_state import DRAW, METHOD
from ..core.validation import check_choice, check_unit_rows, normalize_rows
from . import random
from .base import FeatureMap
from .hadamard import fwht, next_power_of_two, pad_to_power_of_two
from .radial_density import RadialDensity, check_sphere_polynomial, fit_radial_density

DIRECTION_SAMPLERS = ("iid", "structured")


UNIT_ROWS_HINT = ("Spherical random features need unit-norm inputs: normalise them "
                  "(x / x.norm(dim=-1, keepdim=True)) or pass normalize_inputs=True")

#: versions of fitted radial densities (:meth:`SphericalRandomFeatures._draw_key_value`), unique in the process
_DENSITY_VERSIONS = itertools.count(1)


class SphericalRandomFeatures(FeatureMap):
    """SRF / SRF Orth. features of k(x, y) = (1 − ‖x − y‖²/a²)^p on the unit sphere.

    Args:
        num_features: output width F = 2m (even).
        power: the degree p (integer ≥ 1).
        a: the kernel's scale a ≥ 2 (a = 2 gives ((1 + xᵀy)/2)^p).
        input_dim: input dimension d ≥ 2 (``None``: set, and the density fitted, at the first call).
        direction_sampler: ``"iid"`` (SRF) or ``"structured"`` (SRF Orth., SORF directions).
        normalize_inputs: divide every input row by its norm (an explicit opt-in); otherwise
            inputs must already be unit-norm and anything else raises a ``ValueError``.
        cache_dir: optional directory where fitted densities are cached across processes.
        seed, generator: randomness, see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features import SphericalRandomFeatures
        >>> phi = SphericalRandomFeatures(512, power=3, input_dim=8, seed=0)
        >>> x = torch.nn.functional.normalize(torch.randn(5, 8, dtype=torch.float64), dim=-1)
        >>> phi(x).shape
        torch.Size([5, 512])
    """

    has_variance_bias = True
    has_closed_form_squared_norm = True
    #: the fitted radial density is saved with the draws (``density_*``), so a load needs no refit
    config_fields = {"power": METHOD, "a": METHOD, "direction_sampler": METHOD, "normalize_inputs": METHOD,
                     "density_dim": DRAW, "density_spacing": DRAW, "density_weights": DRAW,
                     "density_max_error": DRAW}

    def __init__(
        self,
        num_features: int,
        power: int,
        a: float = 2.0,
        input_dim: int | None = None,
        direction_sampler: str = "iid",
        normalize_inputs: bool = False,
        cache_dir: str | os.PathLike | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(num_features, int) and not isinstance(num_features, bool) and num_features % 2:
            raise ValueError(f"num_features must be even for sin/cos features (F = 2m), got {num_features}")
        self.power, self.a = check_sphere_polynomial(power, a)
        self.direction_sampler = check_choice(direction_sampler, "direction_sampler", DIRECTION_SAMPLERS)
        if not isinstance(normalize_inputs, bool):
            raise TypeError(f"normalize_inputs must be a bool, got {normalize_inputs!r}")
        if input_dim is not None and input_dim < 2:
            raise ValueError(f"input_dim must be ≥ 2 for spherical random features, got {input_dim}")
        self.normalize_inputs = normalize_inputs
        self.cache_dir = cache_dir
        self.density: RadialDensity | None = None
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    @property
    def density(self) -> RadialDensity | None:
        """The fitted radial density μ (``None`` before the first draw).  It is replaced, never changed in place, and
        each replacement takes a new version, which keys it in the prediction caches' draw check."""
        return self._density

    @density.setter
    def density(self, value: RadialDensity | None) -> None:
        self._density = value
        self._density_version = next(_DENSITY_VERSIONS)

    @property
    def num_frequencies(self) -> int:
        return self.num_features // 2

    def density_dim(self, input_dim: int) -> int:
        """The dimension the radial density is fitted for (the padded one for structured directions)."""
        return next_power_of_two(input_dim) if self.direction_sampler == "structured" else input_dim

    # ------------------------------------------------------------------ draws
    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        if input_dim < 2:
            raise ValueError(f"spherical random features need inputs of dimension ≥ 2, got {input_dim}")
        dim = self.density_dim(input_dim)
        if self.density is None or self.density.dim != dim:
            self.density = fit_radial_density(self.a, self.power, dim, cache_dir=self.cache_dir)
        m = self.num_frequencies
        if self.direction_sampler == "iid":
            directions = random.normal((m, dim), generator)
            directions = directions / directions.norm(dim=-1, keepdim=True)
            return {"frequencies": directions * self.density.sample(m, generator).unsqueeze(-1)}
        signs = random.rademacher((math.ceil(m / dim), 3, dim), generator)
        return {"signs": signs, "radii": self.density.sample(m, generator)}

    # ---------------------------------------------------------------- forward
    def _checked_input(self, x: Tensor) -> Tensor:
        if self.normalize_inputs:
            return normalize_rows(x, "x")
        check_unit_rows(x, "x", UNIT_ROWS_HINT)
        return x

    def project(self, x: Tensor) -> Tensor:
        """The projections ωⱼᵀx of shape ``(..., n, m)`` (x on the unit sphere)."""
        if self.direction_sampler == "iid":
            return x @ self._buffer("frequencies", x).mT
        signs = self._buffer("signs", x)
        num_blocks, _, padded = signs.shape
        z = pad_to_power_of_two(x).unsqueeze(-2)  # (..., n, 1, padded)
        for stage in (2, 1, 0):  # H D₁ H D₂ H D₃ x, D₃ first: orthonormal rows
            z = fwht(z * signs[:, stage], normalized=True)
        z = z.reshape(*z.shape[:-2], num_blocks * padded)[..., : self.num_frequencies]
        return z * self._buffer("radii", x)

    def _features(self, x: Tensor) -> Tensor:
        projection = self.project(self._checked_input(x))
        scale = math.sqrt(self.density.mass / self.num_frequencies)
        return torch.cat((torch.cos(projection), torch.sin(projection)), dim=-1) * scale

    def complex_features(self, x: Tensor) -> Tensor:
        """Φ_C(x) = √(c/m)[exp(iωⱼᵀx)]ⱼ (paper 000, Eq. 60), complex of shape ``(..., n, m)``."""
        real = self(x)
        m = self.num_frequencies
        return torch.complex(real[..., :m], real[..., m:])

    def complex_layout(self) -> Tensor:
        """Columns of the output holding [Re Φ_C, Im Φ_C] = [cos, sin]: all of them, in order."""
        return torch.arange(self.num_features)

    # ----------------------------------------------------- fitted kernel, bias
    def _fitted_density(self) -> RadialDensity:
        if self.density is None:
            raise RuntimeError("the radial density is fitted at the first call: pass input_dim or call the map first")
        return self.density

    def fitted_kernel(self, tau: Tensor) -> Tensor:
        """K̂(τ) = E[Φ(x)ᵀΦ(y)] for ‖x − y‖ = τ (the kernel these features are unbiased for)."""
        return self._fitted_density().kernel(tau)

    def target_kernel(self, tau: Tensor) -> Tensor:
        """k(τ) = (1 − τ²/a²)^p."""
        return self._fitted_density().target(tau)

    @property
    def max_fit_error(self) -> float:
        """max over τ ∈ [0, 2] of ``|K̂(τ) − k(τ)|`` (on a 1001-point grid)."""
        return self._fitted_density().max_error

    def target_diag(self, x: Tensor) -> Tensor:
        return torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)

    def expected_diag(self, x: Tensor) -> Tensor:
        # cos² + sin² = 1 for every frequency: Φ(x)ᵀΦ(x) = c = K̂(0) exactly.
        return torch.full(x.shape[:-1], self._fitted_density().mass, dtype=x.dtype, device=x.device)

    def squared_norm(self, x: Tensor) -> Tensor:
        """Φ = √(c/m)[cos, sin]: ‖Φ(x)‖² = c for every x on the sphere (whose rows are checked as by the features)."""
        x = self._checked_input(x)
        return self.expected_diag(x)

    # ------------------------------------------------------------- state dict
    _DENSITY_FIELDS = {"density_dim": "dim", "density_spacing": "spacing", "density_weights": "weights",
                       "density_max_error": "max_error"}

    def _config_value(self, name: str):
        if name in self._DENSITY_FIELDS:
            return None if self.density is None else getattr(self.density, self._DENSITY_FIELDS[name])
        return super()._config_value(name)

    def _draw_key_value(self, name: str):
        """The density's version instead of its weights, which the draw check of every prediction read into the key
        (96 values: 2 µs of a 15–25 µs key on a CPU)."""
        if name == "density_weights":
            return None if self.density is None else ("density version", self._density_version)
        return super()._draw_key_value(name)

    def _adopt_config(self, values: dict) -> None:
        density = {attribute: values.pop(name) for name, attribute in self._DENSITY_FIELDS.items() if name in values}
        # before the draws: _draw reuses a density of the right dimension; the same density is kept (and its version)
        if density.get("weights") is not None and not self._holds_density(density):
            self.density = RadialDensity(a=self.a, power=self.power, **density)
        super()._adopt_config(values)

    def _holds_density(self, fields: dict) -> bool:
        """Whether this map's density has the saved ``fields`` (dim, spacing, weights, max_error)."""
        current = self.density
        return current is not None and all(
            torch.equal(value, current.weights) if name == "weights" else value == getattr(current, name)
            for name, value in fields.items())

    def _legacy_config(self, extra: dict) -> dict:
        config = super()._legacy_config(extra)
        density = extra.get("density")
        if density is not None:
            if (density["a"], density["power"]) != (self.a, self.power):
                raise ValueError(
                    f"cannot load state: the saved radial density was fitted for a={density['a']}, "
                    f"power={density['power']}, but this map has a={self.a}, power={self.power}"
                )
            config.update({name: density[attribute] for name, attribute in self._DENSITY_FIELDS.items()})
        return config

    def extra_repr(self) -> str:
        return (
            f"{super().extra_repr()}, power={self.power}, a={self.a}, "
            f"direction_sampler={self.direction_sampler!r}, normalize_inputs={self.normalize_inputs}"
        )
