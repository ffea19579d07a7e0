"""Offline datasets: synthetic Helmholtz vector fields and the IGRF geomagnetic field.

* :func:`helmholtz_field` — f = ∇g + f_div on [−1, 1]^d (d = 2, 3), with g and the div-free
  part built from Gaussian bumps (the operalib-style test field of the ORFF digest, Part IV):
  2-D f_div = R∇h (R = 90° rotation), 3-D f_div = ∇ × a.  Both parts are returned separately
  so a Helmholtz decomposition can be scored.  Derivatives are exact (autograd).
* :func:`igrf_magnetic_field` — the Earth's main magnetic field from the IGRF model shipped in
  the ``ppigrf`` package (coefficient files inside the wheel, no download).  Above the Earth's
  surface B = −∇V is curl-free, a real-world test of curl-free GPs.
* :func:`mauna_loa_co2` — monthly mean atmospheric CO₂ at Mauna Loa, 1958–2001 (the weekly
  record shipped in ``statsmodels.datasets.co2``), split into a training period and a held-out
  forecast period: the classic kernel-composition example (Rasmussen & Williams 2006, §5.4.3).
"""

from __future__ import annotations

import datetime
import functools

import torch
from torch import Tensor

from .core.validation import (
    check_dtype_argument,
    check_finite,
    check_positive_float,
    check_positive_int,
    check_seed,
    check_tensor_dtype,
)

#: IGRF reference radius (km)
EARTH_RADIUS_KM = 6371.2


def _bumps(x: Tensor, centers: Tensor, signs: Tensor, width: float) -> Tensor:
    """Σₖ sₖ exp(−‖x − cₖ‖²/(2w²)), shape (n,)."""
    centers, signs = centers.to(x.device), signs.to(x.device)  # drawn on the CPU; the field is evaluated anywhere
    sq = (x.unsqueeze(-2) - centers).pow(2).sum(-1)
    return (signs * torch.exp(-0.5 * sq / width**2)).sum(-1)


def _gradient(fn, x: Tensor) -> Tensor:
    """∇fn at every row of x (fn of a row depends on that row only); differentiable in x where x records a gradient."""
    if x.requires_grad and torch.is_grad_enabled():
        return torch.autograd.grad(fn(x).sum(), x, create_graph=True)[0]
    with torch.enable_grad():
        leaf = x.detach().requires_grad_(True)
        return torch.autograd.grad(fn(leaf).sum(), leaf)[0]


def helmholtz_field(
    n: int,
    input_dim: int = 2,
    noise: float = 0.0,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
    width: float = 0.35,
    num_bumps: int = 6,
) -> dict[str, Tensor]:
    """A random smooth vector field f = f_curl + f_div on [−1, 1]^d sampled at n uniform points.

    Args:
        n: number of points.
        input_dim: 2 or 3.
        noise: standard deviation of Gaussian noise added to ``y``.
        seed: seed of the bump layout, the points and the noise.
        dtype: floating dtype of the tensors (the draws are made in float64 and rounded, so float32 and
            float64 give the same data set up to rounding).
        width: bump width (the field's length scale).
        num_bumps: bumps per potential.

    Returns:
        dict with ``x`` (n, d), ``y`` = f + noise (n, d), ``f``, ``curl_free`` (= ∇g) and
        ``divergence_free`` parts (n, d) each, and ``field``, a callable x ↦ (f_curl, f_div)
        to evaluate the noise-free parts anywhere (e.g. on a plotting grid); differentiable in x (for
        :func:`rfgp.applications.vector_fields.curl` and ``divergence``).
    """
    n = check_positive_int(n, "n")
    if check_positive_int(input_dim, "input_dim") not in (2, 3):
        raise ValueError(f"input_dim must be 2 or 3 for helmholtz_field, got {input_dim}")
    noise = check_positive_float(noise, "noise", allow_zero=True)
    width = check_positive_float(width, "width")
    num_bumps = check_positive_int(num_bumps, "num_bumps")
    check_dtype_argument(dtype)
    generator = torch.Generator().manual_seed(check_seed(seed, allow_none=False))

    # every draw is made in float64 and rounded to ``dtype``: one seed gives one data set in both dtypes

    def layout():
        centers = (torch.rand(num_bumps, input_dim, generator=generator, dtype=torch.float64) * 1.6 - 0.8).to(dtype)
        signs = torch.randint(0, 2, (num_bumps,), generator=generator).to(dtype) * 2 - 1
        return centers, signs

    scalar = layout()
    potentials = [layout() for _ in range(1 if input_dim == 2 else 3)]

    def field(x: Tensor) -> tuple[Tensor, Tensor]:
        check_tensor_dtype(x, "x")
        if x.dim() != 2 or x.shape[-1] != input_dim:
            raise ValueError(f"x must have shape (n, {input_dim}) for this input_dim={input_dim} field, "
                             f"got {tuple(x.shape)}")
        check_finite(x, "x")
        x = x.to(dtype)
        curl_free = _gradient(lambda z: _bumps(z, *scalar, width), x) * width
        grads = [_gradient(lambda z, p=p: _bumps(z, *p, width), x) * width for p in potentials]
        if input_dim == 2:
            div_free = torch.stack((-grads[0][:, 1], grads[0][:, 0]), -1)  # R∇h
        else:  # ∇ × a with a = (a₁, a₂, a₃): (∂₂a₃ − ∂₃a₂, ∂₃a₁ − ∂₁a₃, ∂₁a₂ − ∂₂a₁)
            div_free = torch.stack(
                (
                    grads[2][:, 1] - grads[1][:, 2],
                    grads[0][:, 2] - grads[2][:, 0],
                    grads[1][:, 0] - grads[0][:, 1],
                ),
                -1,
            )
        return curl_free, div_free

    x = (torch.rand(n, input_dim, generator=generator, dtype=torch.float64) * 2 - 1).to(dtype)
    curl_free, div_free = field(x)
    f = curl_free + div_free
    y = f + noise * torch.randn(f.shape, generator=generator, dtype=torch.float64).to(dtype)
    return {"x": x, "y": y, "f": f, "curl_free": curl_free, "divergence_free": div_free, "field": field}


def igrf_magnetic_field(
    n: int,
    altitude_km: tuple[float, float] = (0.0, 1000.0),
    date: datetime.datetime | None = None,
    max_degree: int = 13,
    seed: int = 0,
    dtype: torch.dtype = torch.float64,
) -> tuple[Tensor, Tensor]:
    """The IGRF main field at n random points of a spherical shell, in Earth-centred Cartesian axes.

    Args:
        n: number of points (uniform on the sphere, altitude uniform in ``altitude_km``).
        altitude_km: (low, high) altitude above the IGRF reference radius 6371.2 km.
        date: model epoch (default 2020-01-01; IGRF-14 covers 1900–2030).
        max_degree: truncation degree of the spherical-harmonic expansion (1 = dipole, ≤ 13).
        seed: seed of the positions.
        dtype: dtype of the returned tensors.

    Returns:
        ``positions`` (n, 3) in Earth radii and ``field`` (n, 3) in µT, both Earth-centred
        Cartesian (x towards 0° longitude on the equator, z to the north pole).  The field is
        curl-free in the shell (no sources between the Earth's core and the ionosphere).
    """
    n = check_positive_int(n, "n")
    if not isinstance(altitude_km, (tuple, list)) or len(altitude_km) != 2:
        raise ValueError(f"altitude_km must be a (low, high) pair in km, got {altitude_km!r}")
    low, high = (check_positive_float(a, "altitude_km", allow_zero=True) for a in altitude_km)
    if high < low:
        raise ValueError(f"altitude_km must be (low, high) with low ≤ high, got {altitude_km}")
    check_dtype_argument(dtype)
    _check_max_degree(max_degree)
    generator = torch.Generator().manual_seed(check_seed(seed, allow_none=False))
    direction = torch.randn(n, 3, generator=generator, dtype=torch.float64)
    direction = direction / direction.norm(dim=-1, keepdim=True)
    radius_km = EARTH_RADIUS_KM + low + (high - low) * torch.rand(n, generator=generator, dtype=torch.float64)
    positions = direction * (radius_km / EARTH_RADIUS_KM).unsqueeze(-1)
    field = igrf_field_at(positions, date=date, max_degree=max_degree)
    return positions.to(dtype), field.to(dtype)


def igrf_field_at(
    positions: Tensor, date: datetime.datetime | None = None, max_degree: int = 13
) -> Tensor:
    """The IGRF field (µT, Earth-centred Cartesian) at ``positions`` (n, 3) given in Earth radii.

    The result has the dtype and device of ``positions`` and is not differentiable (positions that require grad are
    refused outside ``torch.no_grad()``).  On the polar axis (x = y = 0), where the spherical basis is undefined
    and ppigrf's eastward component divides by sin θ = 0, the field is the mean of its values at colatitude
    δ = 1e-7 rad on two opposite meridians, equal to the value on the axis up to O(δ²) ≈ 1e-14 relative.
    """
    check_tensor_dtype(positions, "positions")
    if positions.dim() != 2 or positions.shape[-1] != 3:
        raise ValueError(f"positions must have shape (n, 3) (Cartesian, in Earth radii), got {tuple(positions.shape)}")
    check_finite(positions, "positions")
    if positions.requires_grad and torch.is_grad_enabled():
        # ppigrf evaluates in NumPy: a result detached from positions would add a silent zero to their gradient
        raise ValueError("positions require grad, but igrf_field_at is not differentiable (ppigrf evaluates the model "
                         "in NumPy); pass positions.detach(), or call it under torch.no_grad()")
    _check_max_degree(max_degree)
    if date is not None and not isinstance(date, datetime.datetime):
        raise TypeError(f"date must be a datetime.datetime (or None for 2020-01-01), got {date!r} of type "
                        f"{type(date).__name__}")
    # the model's epochs are naive datetimes: comparing an aware one with them raised a TypeError naming no argument
    if date is not None and date.utcoffset() is not None:
        raise ValueError(f"date must be a naive datetime (UTC, as IGRF's epochs), got the timezone-aware {date}; "
                         "pass date.astimezone(datetime.timezone.utc).replace(tzinfo=None)")
    date = date or datetime.datetime(2020, 1, 1)
    first, last = _igrf_span()
    if not first <= date <= last:  # ppigrf returns NaN outside them
        raise ValueError(f"date must lie within the IGRF model's span {first:%Y-%m-%d} to {last:%Y-%m-%d}, got {date}")
    dtype, device = positions.dtype, positions.device
    positions = positions.detach().to(torch.float64).cpu()  # ppigrf evaluates in NumPy
    radius = positions.norm(dim=-1)
    if not (radius > 0).all():
        raise ValueError(f"positions must be away from the Earth's centre (the field is singular there), got a zero "
                         f"row at index {int((radius == 0).nonzero()[0])}")
    horizontal = positions[:, :2].norm(dim=-1)
    # atan2 rather than arccos(z / r): arccos rounded colatitudes below 1e-8 rad to exactly 0, where ppigrf gave NaN
    colatitude = torch.atan2(horizontal, positions[:, 2])
    longitude = torch.atan2(positions[:, 1], positions[:, 0])
    field = torch.empty_like(positions)
    axis = horizontal == 0
    if not axis.all():
        off = ~axis
        field[off] = _igrf_cartesian(radius[off], colatitude[off], longitude[off], date, max_degree)
    if axis.any():
        # before: NaN at the north pole (colatitude 0), silently
        delta = 1e-7
        shifted = torch.where(colatitude[axis] > 1.0, torch.pi - delta, delta)
        meridians = [torch.zeros_like(shifted), torch.full_like(shifted, torch.pi)]
        field[axis] = sum(_igrf_cartesian(radius[axis], shifted, phi, date, max_degree) for phi in meridians) / 2
    return field.to(device=device, dtype=dtype)  # where the positions are: a GPU tensor came back on the CPU


def _igrf_cartesian(radius: Tensor, colatitude: Tensor, longitude: Tensor, date: datetime.datetime,
                    max_degree: int) -> Tensor:
    """ppigrf's (B_r, B_θ, B_φ) at (r in Earth radii, θ, φ in radians, float64) rotated to Earth-centred axes (µT)."""
    import numpy as np
    import ppigrf

    b_r, b_theta, b_phi = ppigrf.igrf_gc(
        (radius * EARTH_RADIUS_KM).numpy(),
        np.degrees(colatitude.numpy()),
        np.degrees(longitude.numpy()),
        date,
        max_degree=int(max_degree),
    )
    spherical = torch.as_tensor(np.stack([b_r[0], b_theta[0], b_phi[0]], -1), dtype=torch.float64) / 1000.0
    # Unit vectors e_r, e_θ (south), e_φ (east) in Cartesian axes.
    st, ct = torch.sin(colatitude), torch.cos(colatitude)
    sp, cp = torch.sin(longitude), torch.cos(longitude)
    e_r = torch.stack((st * cp, st * sp, ct), -1)
    e_theta = torch.stack((ct * cp, ct * sp, -st), -1)
    e_phi = torch.stack((-sp, cp, torch.zeros_like(sp)), -1)
    return spherical[:, :1] * e_r + spherical[:, 1:2] * e_theta + spherical[:, 2:] * e_phi


@functools.cache
def _igrf_span() -> tuple[datetime.datetime, datetime.datetime]:
    """The first and last epochs of the IGRF model ppigrf ships (its coefficient file read once per process)."""
    import ppigrf

    epochs = ppigrf.ppigrf.read_shc(ppigrf.ppigrf.shc_fn)[0].index
    return epochs.min(), epochs.max()


def _check_max_degree(max_degree) -> None:
    if check_positive_int(max_degree, "max_degree") > 13:
        raise ValueError(f"max_degree must be in 1..13 (IGRF's highest degree is 13), got {max_degree}")


__all__ = ["EARTH_RADIUS_KM", "helmholtz_field", "igrf_field_at", "igrf_magnetic_field", "mauna_loa_co2"]


def mauna_loa_co2(holdout_years: float = 5.0, dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
    """Monthly mean CO₂ (ppm) at Mauna Loa from ``statsmodels.datasets.co2``, the last years held out.

    The weekly record (March 1958 – December 2001) is averaged per calendar month; months without
    any measurement (5 of 526) are dropped.  Time is in years since January 1958.

    Args:
        holdout_years: length of the forecast period at the end of the record (test set).
        dtype: floating dtype of the tensors.

    Returns:
        dict with ``train_x``/``test_x`` (n, 1) in years and ``train_y``/``test_y`` (n,) in ppm.
    """
    holdout_years = check_positive_float(holdout_years, "holdout_years")
    check_dtype_argument(dtype)
    from statsmodels.datasets import co2  # an optional dependency: only this dataset needs it

    monthly = co2.load_pandas().data["co2"].resample("MS").mean().dropna()
    years = torch.tensor(monthly.index.year + (monthly.index.month - 1) / 12.0 - 1958.0, dtype=dtype)
    ppm = torch.tensor(monthly.to_numpy(), dtype=dtype)
    train = years <= years.max() - holdout_years
    if int(train.sum()) < 2 or bool(train.all()):
        raise ValueError(f"holdout_years={holdout_years} leaves no training or no test months (record: 44 years)")
    return {"train_x": years[train].unsqueeze(-1), "train_y": ppm[train],
            "test_x": years[~train].unsqueeze(-1), "test_y": ppm[~train]}
