"""The fitted radial density of Spherical Random Features (Pennington et al. 2015; paper 000 §6.4).

Target (paper 000, Eq. 57, outputscale σ² excluded): on the unit sphere, with τ = ‖x − y‖ ∈ [0, 2],

    k(τ) = (1 − τ²/a²)^p,    p ∈ ℕ, a ≥ 2.

SRF draws frequencies ω = r·u with u uniform on S^{d−1} and r from a radial density μ, so
that E[cos(ωᵀ(x − y))] = K̂(τ) = ∫ μ(r) Ω_d(rτ) dr (Ω_d: :mod:`.sphere_characteristic`).
k is not positive definite on ℝ^d, so no μ ≥ 0 reproduces it exactly: μ is *fitted* and K̂
is biased by construction.

Fit (deterministic, convex; replaces the L-BFGS fit of a clipped mixture used by the paper's
code): μ is a non-negative combination of M hat functions on the uniform grid rⱼ = j·h,
0 ≤ j < M, spanning [0, 3·r_ref] with r_ref = √(2dp)/a (the frequency scale that matches the
curvature of k at τ = 0, since Ω_d(z) ≈ exp(−z²/2d) there).  A hat's cosine transform is
closed-form, ∫ hatⱼ(r) cos(ωr) dr = h·sinc²(ωh/2)·cos(ω rⱼ) (half of it for j = 0), so
K̂(τ) = Σⱼ wⱼ E_t[h sinc²(τth/2) cos(τ t rⱼ)] is exact up to the Ω_d quadrature over t = u₁.
The weights w ≥ 0 solve a non-negative least-squares problem on 400 points τ ∈ [0, 2]
(Lawson–Hanson active set, with a 1e−8 ridge that makes the solution unique).  The density
is piecewise linear, so radii are drawn by exact inverse-CDF sampling.

Fits are cached per (a, p, d) in memory and, when a directory is given, on disk.
"""

from __future__ import annotations

import math
import numbers
import os

import torch
from torch import Tensor

from ..core.validation import check_positive_int
from .sphere_characteristic import default_num_nodes, direction_quadrature

#: bump when the fit changes, so stale disk caches are not reused
FIT_VERSION = 1
_NUM_FIT_POINTS = 400
_NUM_CHECK_POINTS = 1001
_NUM_HATS = 96
_SUPPORT_IN_REF_SCALES = 3.0
_RIDGE = 1e-8
_DTYPE = torch.float64

_MEMORY_CACHE: dict[tuple, RadialDensity] = {}


def check_sphere_polynomial(power, a) -> tuple[int, float]:
    """Validate the kernel parameters: integer p ≥ 1 and finite a ≥ 2."""
    power = check_positive_int(power, "power")
    if isinstance(a, bool) or not isinstance(a, numbers.Real):
        raise TypeError(f"a must be a real number ≥ 2, got {a!r} of type {type(a).__name__}")
    a = float(a)
    if not (a >= 2.0 and math.isfinite(a)):
        raise ValueError(
            f"a must be a finite number ≥ 2 (so that 1 − ‖x − y‖²/a² ≥ 0 on the unit sphere), got {a}"
        )
    return power, a


def polynomial_sphere_kernel(tau: Tensor, a: float, power: int) -> Tensor:
    """k(τ) = (1 − τ²/a²)^p, the polynomial kernel (ν + xᵀy·2/a²)^p on the unit sphere (Eq. 57)."""
    return (1.0 - tau.square() / a**2).pow(power)


class RadialDensity:
    """A piecewise-linear radial density μ(r) = Σⱼ wⱼ hatⱼ(r) on the grid rⱼ = j·h.

    Not normalised: its mass c = ∫μ = K̂(0) is whatever fits the target best.

    Args:
        dim: ambient dimension d of the directions.
        spacing: grid spacing h.
        weights: non-negative node values wⱼ = μ(rⱼ), shape (M,); μ falls linearly to 0 at M·h.
        a, power: the target kernel's parameters (kept for :meth:`target` and the state).
        max_error: max ``|K̂ − k|`` on a fine τ grid (computed by :func:`fit_radial_density`).
    """

    def __init__(self, dim: int, spacing: float, weights: Tensor, a: float, power: int, max_error: float):
        self.dim = int(dim)
        self.spacing = float(spacing)
        self.weights = weights.detach().to(device="cpu", dtype=_DTYPE)
        self.a = float(a)
        self.power = int(power)
        self.max_error = float(max_error)

    @property
    def mass(self) -> float:
        """c = ∫μ(r) dr = K̂(0)."""
        w = self.weights
        return self.spacing * float(w.sum() - 0.5 * w[0])

    @property
    def support(self) -> float:
        return self.spacing * self.weights.numel()

    def kernel(self, tau: Tensor) -> Tensor:
        """The fitted kernel K̂(τ) = ∫μ(r)Ω_d(rτ) dr, in the dtype and on the device of ``tau``."""
        active = torch.nonzero(self.weights > 0).squeeze(-1)
        flat = tau.detach().reshape(-1).to(device="cpu", dtype=_DTYPE)
        values = _hat_transforms(flat, self.dim, self.spacing, active) @ self.weights[active]
        return values.reshape(tau.shape).to(device=tau.device, dtype=tau.dtype)

    def target(self, tau: Tensor) -> Tensor:
        return polynomial_sphere_kernel(tau, self.a, self.power)

    def sample(self, num: int, generator: torch.Generator) -> Tensor:
        """``num`` radii drawn by inverse-CDF sampling of μ/c (float64, CPU)."""
        f = torch.cat((self.weights, self.weights.new_zeros(1)))  # node values, μ(M·h) = 0
        h = self.spacing
        cell_mass = 0.5 * h * (f[:-1] + f[1:])
        cumulative = torch.cumsum(cell_mass, 0)
        u = torch.rand(num, generator=generator, dtype=_DTYPE) * cumulative[-1]
        cell = torch.searchsorted(cumulative, u, right=True).clamp_max(f.numel() - 2)
        residual = (u - (cumulative[cell] - cell_mass[cell])).clamp_min(0.0) / h
        left, slope = f[cell], f[cell + 1] - f[cell]
        # Solve left·s + slope·s²/2 = residual for s ∈ [0, 1]; this form is stable for slope → 0.
        root = torch.sqrt((left.square() + 2.0 * slope * residual).clamp_min(0.0))
        s = 2.0 * residual / (left + root).clamp_min(torch.finfo(_DTYPE).tiny)
        return (cell + s.clamp(0.0, 1.0)) * h

    # ------------------------------------------------------------------ state
    def state(self) -> dict:
        return {
            "dim": self.dim,
            "spacing": self.spacing,
            "weights": self.weights.clone(),
            "a": self.a,
            "power": self.power,
            "max_error": self.max_error,
            "version": FIT_VERSION,
        }

    @classmethod
    def from_state(cls, state: dict) -> RadialDensity:
        return cls(state["dim"], state["spacing"], state["weights"], state["a"], state["power"], state["max_error"])

    def __repr__(self) -> str:
        return (
            f"RadialDensity(dim={self.dim}, a={self.a}, power={self.power}, mass={self.mass:.4f}, "
            f"max_error={self.max_error:.2e})"
        )


def fit_radial_density(a: float, power: int, dim: int, cache_dir: str | os.PathLike | None = None) -> RadialDensity:
    """Fit (or fetch from the caches) the SRF radial density for k(τ) = (1 − τ²/a²)^p in ℝ^d.

    Args:
        a, power: kernel parameters (a ≥ 2, integer p ≥ 1).
        dim: ambient dimension d ≥ 2 of the frequencies.
        cache_dir: optional directory; fits are stored there as ``srf_a{a}_p{p}_d{d}_v{version}.pt``
            and reused across processes.
    """
    power, a = check_sphere_polynomial(power, a)
    dim = check_positive_int(dim, "dim")
    if dim < 2:
        raise ValueError(f"spherical random features need input dimension ≥ 2, got {dim}")
    key = (a, power, dim, FIT_VERSION)
    if key in _MEMORY_CACHE:
        return _MEMORY_CACHE[key]
    path = None
    if cache_dir is not None:
        path = os.path.join(os.fspath(cache_dir), f"srf_a{_exact_name(a)}_p{power}_d{dim}_v{FIT_VERSION}.pt")
        if os.path.exists(path):
            density = RadialDensity.from_state(torch.load(path, weights_only=True))
            if (density.a, density.power, density.dim) != (a, power, dim):
                raise ValueError(
                    f"the cached SRF fit {path} is for a={density.a!r}, power={density.power}, dim={density.dim}, "
                    f"not the requested a={a!r}, power={power}, dim={dim}: remove the file or use another cache_dir"
                )
            _MEMORY_CACHE[key] = density
            return density
    density = _fit(a, power, dim)
    _MEMORY_CACHE[key] = density
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        torch.save(density.state(), path)
    return density


def _exact_name(a: float) -> str:
    """a in a cache file name: ``f"{a:g}"`` where that reads back as a (the names of earlier rfgp), else ``repr(a)``
    (exact): ``:g`` keeps 6 significant digits, so a = 2.0000001 and 2.0000004 shared one file."""
    short = f"{a:g}"
    return short if float(short) == a else repr(a)


def clear_memory_cache() -> None:
    """Forget the in-memory fits (disk caches are untouched)."""
    _MEMORY_CACHE.clear()


def _fit(a: float, power: int, dim: int) -> RadialDensity:
    reference_radius = math.sqrt(2.0 * dim * power) / a
    spacing = _SUPPORT_IN_REF_SCALES * reference_radius / (_NUM_HATS - 1)
    tau = torch.linspace(0.0, 2.0, _NUM_FIT_POINTS, dtype=_DTYPE)
    design = _hat_transforms(tau, dim, spacing, torch.arange(_NUM_HATS))
    target = polynomial_sphere_kernel(tau, a, power)
    gram = design.T @ design
    gram += _RIDGE * float(gram.diagonal().mean()) * torch.eye(_NUM_HATS, dtype=_DTYPE)
    weights = _nonnegative_least_squares(gram, design.T @ target)
    density = RadialDensity(dim, spacing, weights, a, power, max_error=math.nan)
    check = torch.linspace(0.0, 2.0, _NUM_CHECK_POINTS, dtype=_DTYPE)
    density.max_error = float((density.kernel(check) - density.target(check)).abs().max())
    return density


def _hat_transforms(tau: Tensor, dim: int, spacing: float, indices: Tensor) -> Tensor:
    """Matrix (T, J) of E_t[∫ hatⱼ(r) cos(rτt) dr] for the hats ``indices`` (float64, CPU)."""
    max_radius = spacing * (int(indices.max()) + 1) if indices.numel() else 0.0
    max_tau = float(tau.abs().max()) if tau.numel() else 0.0
    t, q = direction_quadrature(dim, default_num_nodes(max_tau * max_radius, dim))
    radii = indices.to(_DTYPE) * spacing
    half_at_origin = torch.where(indices == 0, 0.5, 1.0).to(_DTYPE)
    rows = []
    for chunk in tau.split(64):  # bounds the (chunk, nodes, hats) temporary
        frequency = chunk.unsqueeze(-1) * t  # ω = τ·t, shape (chunk, nodes)
        envelope = spacing * torch.sinc(frequency * (spacing / (2 * math.pi))).square() * q
        rows.append(torch.einsum("tn,tnj->tj", envelope, torch.cos(frequency.unsqueeze(-1) * radii)))
    return torch.cat(rows) * half_at_origin if rows else tau.new_zeros(0, indices.numel())


def _nonnegative_least_squares(gram: Tensor, moment: Tensor) -> Tensor:
    """argmin_{x ≥ 0} ‖Ax − b‖ from G = AᵀA and Aᵀb, by the Lawson–Hanson active-set method.

    Working on the (ridge-regularised, hence well-conditioned) normal equations makes every
    sub-problem a tiny k × k solve instead of a tall least-squares problem.
    """
    n = gram.shape[0]
    x = gram.new_zeros(n)
    passive = torch.zeros(n, dtype=torch.bool)
    tol = 10 * torch.finfo(gram.dtype).eps * float(gram.diagonal().max()) * n
    gradient = moment.clone()
    for _ in range(3 * n):
        candidates = torch.where(passive, -math.inf, gradient)
        if float(candidates.max()) <= tol:
            break
        passive[candidates.argmax()] = True
        while True:
            trial = gram.new_zeros(n)
            trial[passive] = torch.linalg.solve(gram[passive][:, passive], moment[passive])
            if bool((trial[passive] > 0).all()):
                break
            # Step back to the boundary and release the variables that hit zero.
            blocked = passive & (trial <= 0)
            step = float((x[blocked] / (x[blocked] - trial[blocked])).min())
            x = x + step * (trial - x)
            passive &= x > tol
            x[~passive] = 0.0
        x = trial
        gradient = moment - gram @ x
    return x
