"""Random draws made with an explicit ``torch.Generator`` (no global or NumPy state).

``torch.distributions`` samplers do not accept a generator, so the few non-Gaussian
draws rfgp needs are built here from ``torch.randn``/``torch.rand`` with a generator.
All draws are made on the CPU and moved by the caller: in float64, except :func:`normal_single`.
"""

from __future__ import annotations

import torch
from torch import Tensor

_DTYPE = torch.float64


def normal(shape, generator: torch.Generator) -> Tensor:
    return torch.randn(shape, generator=generator, dtype=_DTYPE)


def normal_single(shape, generator: torch.Generator) -> Tensor:
    """Standard normals drawn in float32, for draws where float64 generation is the bottleneck.

    Every float32 value is exact in float64, so a map holding these draws is the same map, value
    for value, in float32 and float64 (and the rounding of it in half precision): "same seed →
    same map in every dtype" without float64 generation, which costs 4–7× torch's vectorised
    float32 Box–Muller on the CPU.  Each value is a float32 rounding of a normal draw (relative
    error ≤ 2⁻²⁴; the 24-bit uniforms bound |z| ≤ √(48 ln 2) ≈ 5.8, a tail of mass < 10⁻⁸).
    """
    return torch.randn(shape, generator=generator, dtype=torch.float32)


def rademacher(shape, generator: torch.Generator) -> Tensor:
    """i.i.d. ±1 entries."""
    return torch.randint(0, 2, shape, generator=generator).to(_DTYPE).mul_(2).sub_(1)


def chi(shape, dof: int, generator: torch.Generator) -> Tensor:
    """χ-distributed draws with ``dof`` degrees of freedom (norms of standard normal vectors)."""
    return normal((*shape, dof), generator).norm(dim=-1)


def gamma(shape, concentration: float, generator: torch.Generator) -> Tensor:
    """Gamma(concentration, rate 1) draws by Marsaglia & Tsang (2000), vectorised rejection.

    For concentration < 1 the boost Gamma(a) = Gamma(a + 1)·U^{1/a} is used.
    """
    draws, boost_uniforms = _marsaglia_tsang(shape, concentration, generator)
    if boost_uniforms is not None:
        draws = draws * boost_uniforms.pow(1.0 / concentration)
    return draws.reshape(shape)


def log_gamma(shape, concentration: float, generator: torch.Generator) -> Tensor:
    """log of :func:`gamma`'s draws (the same generator stream), finite where the draws themselves underflow.

    Below concentration a ≈ 0.01 the boost factor U^{1/a} underflows float64 for a noticeable share of U (U < 10^{−3}
    at a = 0.01), and float32 already at a ≈ 0.1; log U/a does not.
    """
    draws, boost_uniforms = _marsaglia_tsang(shape, concentration, generator)
    log_draws = draws.log()
    if boost_uniforms is not None:
        log_draws = log_draws + boost_uniforms.log() / concentration
    return log_draws.reshape(shape)


def _marsaglia_tsang(shape, concentration: float, generator: torch.Generator) -> tuple[Tensor, Tensor | None]:
    """Flat Gamma(a, 1) draws for a = concentration ≥ 1, else Gamma(a + 1, 1) draws and the boost uniforms U."""
    if concentration <= 0:
        raise ValueError(f"concentration must be > 0, got {concentration}")
    boost = concentration < 1
    a = concentration + 1.0 if boost else concentration
    d = a - 1.0 / 3.0
    c = 1.0 / (9.0 * d) ** 0.5
    numel = int(torch.Size(shape).numel())
    out = torch.empty(numel, dtype=_DTYPE)
    pending = torch.arange(numel)
    while pending.numel() > 0:
        k = pending.numel()
        z = normal((k,), generator)
        u = torch.rand(k, generator=generator, dtype=_DTYPE)
        v = (1.0 + c * z) ** 3
        accept = (v > 0) & (torch.log(u) < 0.5 * z**2 + d - d * v + d * torch.log(v.clamp_min(1e-300)))
        out[pending[accept]] = d * v[accept]
        pending = pending[~accept]
    if not boost:
        return out, None
    return out, torch.rand(numel, generator=generator, dtype=_DTYPE)


def haar_orthogonal(num_blocks: int, d: int, generator: torch.Generator) -> Tensor:
    """``num_blocks`` independent Haar-distributed d × d orthogonal matrices, shape (B, d, d).

    QR of a Gaussian matrix with the columns of Q multiplied by sign(diag R)
    (Mezzadri 2007); without the sign fix LAPACK's Q is not Haar distributed.
    """
    q, r = torch.linalg.qr(normal((num_blocks, d, d), generator))
    signs = torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))
    signs[signs == 0] = 1.0
    return q * signs.unsqueeze(-2)
