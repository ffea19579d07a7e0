r"""Spectral measure of the periodic (exp-sine-squared) kernel: Bessel-weighted harmonics.

GPyTorch's ``PeriodicKernel`` is k(τ) = Π_i exp(−2 sin²(πτ_i/p_i)/ℓ_i) (lengthscale not
squared).  With sin²θ = (1 − cos 2θ)/2 and the generating function
e^{z cos θ} = I₀(z) + 2 Σ_{k≥1} I_k(z) cos kθ (Abramowitz & Stegun 9.6.34), each factor is

    exp(−2 sin²(πτ/p)/ℓ) = Σ_{k≥0} q_k(z) cos(2πkτ/p),   z = 1/ℓ,
    q₀ = I₀(z)e^{−z},  q_k = 2 I_k(z)e^{−z} (k ≥ 1),  Σ_k q_k = 1,

so the spectral measure of each dimension is discrete: harmonics ±2πk/p with probabilities
q_k (Solin & Särkkä 2014, "Explicit link between periodic covariance functions and state
space models": the Bessel series of the canonical periodic covariance, there with z = ℓ⁻²
for the squared-lengthscale convention).  Over d dimensions the measure is the product:
ω = (s_i 2πk_i/p_i)_i with independent harmonics k_i and signs s_i = ±1 (the signs make
E[cos ωᵀτ] factorise).

Sampler — importance-weighted harmonics (chosen over sampling k from q directly, whose
discrete inverse CDF has zero derivative in ℓ, and over a deterministic set of top
harmonics, which grows like K^d over d dimensions and does not compose with other measures):

* the harmonic multi-indices are drawn once, per dimension from the proposal
  r = ⅓[q(z₀/4) + q(z₀) + q(4z₀)] at the reference z₀ = 1/ℓ₀ (ℓ at draw time), with Latin
  hypercube uniforms (so in 1-D the harmonic counts are within one of m·r_k);
* each frequency carries the weight w = Π_i q_{k_i}(1/ℓ_i)/r(k_i): E_r[w cos ωᵀτ] = k(τ) for
  every ℓ (unbiased), smooth in ℓ, and w ≤ 3 per dimension at ℓ = ℓ₀;
* ω depends on the period p only through 2πk/p: the frequencies are differentiable in p.

The proposal covers the harmonics k < K with K such that q(4z₀) has less than 1e-16 mass
beyond K; a lengthscale so small that q(1/ℓ) puts more than ``TAIL_TOLERANCE`` mass beyond K
raises (``resample()`` of the kernel re-centres the proposal at the current ℓ).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import DrawCoverageError, has_values
from . import random
from .bessel import scaled_bessel_i
from .weighted_fourier import SpectralMeasure

#: the proposal is the equal mixture of q(f·z₀) over these factors f
PROPOSAL_FACTORS = (0.25, 1.0, 4.0)
#: the largest target mass allowed on harmonics the proposal never draws
TAIL_TOLERANCE = 1e-9


#: recurrence start K + this: float64-accurate for z up to 3× the argument K was chosen for
#: (:func:`num_harmonics_for`), beyond which the tail check refuses anyway (see the tests)
RECURRENCE_MARGIN = 40


def harmonic_probabilities(z: Tensor, num_harmonics: int) -> Tensor:
    """q_k(z) = (2 − δ_{k0}) I_k(z)e^{−z} for k = 0, …, K − 1, shape ``(*z.shape, K)``."""
    bessel = scaled_bessel_i(z, num_harmonics, start=num_harmonics + RECURRENCE_MARGIN)
    doubling = torch.where(torch.arange(num_harmonics, device=z.device) == 0, 1.0, 2.0).to(z.dtype)
    return bessel * doubling


def num_harmonics_for(z: float) -> int:
    """K with Σ_{k≥K} q_k(z) < 1e-16: q is ≈ N(0, z) in k for large z, so z + 12√z + 20 orders suffice."""
    return int(math.ceil(z + 12.0 * math.sqrt(z) + 20.0))


def latin_hypercube(num: int, dim: int, generator: torch.Generator) -> Tensor:
    """``(num, dim)`` uniforms, each column a random permutation of one draw per stratum [j/num, (j+1)/num)."""
    strata = torch.stack([torch.randperm(num, generator=generator) for _ in range(dim)], dim=-1)
    return (strata.to(torch.float64) + torch.rand(num, dim, generator=generator, dtype=torch.float64)) / num


class PeriodicSpectralMeasure(SpectralMeasure):
    """Harmonics 2πk/p with importance weights q_k(1/ℓ)/r(k); hyperparameters ``period`` and ``lengthscale``.

    ``reference["lengthscale"]`` (ℓ₀, shape ``(..., d)`` or scalar) centres the proposal.
    """

    name = "periodic"

    def draw(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        lengthscale = self.reference.get("lengthscale")
        if lengthscale is None:
            raise RuntimeError("PeriodicSpectralMeasure needs reference['lengthscale'] before drawing")
        lengthscale = lengthscale.detach().to(torch.float64).cpu().reshape(-1, lengthscale.shape[-1])
        z_ref = 1.0 / lengthscale.min(0).values  # the smallest ℓ over the batch: the widest measure
        z_ref = z_ref.expand(input_dim)  # one value per dimension (ARD) or shared
        num_harmonics = num_harmonics_for(max(PROPOSAL_FACTORS) * float(z_ref.max()))
        factors = torch.tensor(PROPOSAL_FACTORS, dtype=torch.float64)
        proposal = harmonic_probabilities(z_ref.unsqueeze(-1) * factors, num_harmonics).mean(-2)  # (d, K)
        proposal = proposal / proposal.sum(-1, keepdim=True)
        cdf = proposal.cumsum(-1)
        uniforms = latin_hypercube(num_frequencies, input_dim, generator)  # (m, d)
        harmonics = torch.searchsorted(cdf, uniforms.mT.contiguous()).clamp_max(num_harmonics - 1).mT  # (m, d)
        log_proposal = proposal.log().gather(-1, harmonics.mT).sum(0)  # (m,)
        return {
            "harmonics": harmonics.contiguous(),
            "signs": random.rademacher((num_frequencies, input_dim), generator),
            "log_proposal": log_proposal,
            "harmonic_orders": torch.arange(num_harmonics, dtype=torch.float64),  # carries K in its shape
        }

    def frequencies(self, draws: dict[str, Tensor], period: Tensor, **others: Tensor) -> Tensor:
        """ω = s·2πk/p, shape ``(*batch, m, d)`` for ``period`` ``(*batch, 1, d or 1)``."""
        return draws["signs"] * draws["harmonics"].to(period.dtype) * (2 * math.pi / period)

    def log_weights(self, draws: dict[str, Tensor], lengthscale: Tensor, **others: Tensor) -> Tensor:
        """log w = Σ_i log q_{k_i}(1/ℓ_i) − log r(k), shape ``(*batch, m)``."""
        harmonics = draws["harmonics"]
        num_harmonics = int(draws["harmonic_orders"].shape[-1])  # an int under torch.jit.trace too
        # the Bessel table and the log-weights in float64 (the table is tiny): the tail check is exact
        # and log q_k stays finite in float32 too, where q_k(1/ℓ) of a high harmonic can underflow
        probabilities = harmonic_probabilities(lengthscale.to(torch.float64).reciprocal(), num_harmonics)
        missing = (1.0 - probabilities.detach().sum(-1)).max()
        if has_values(missing) and bool(missing > TAIL_TOLERANCE):
            raise DrawCoverageError(
                f"lengthscale {float(lengthscale.detach().min()):.4g} is too small for the drawn harmonics (the "
                f"periodic measure puts {float(missing):.2e} of its mass beyond the {num_harmonics} harmonics the "
                "proposal covers): call resample() on the kernel to re-centre the proposal at the current lengthscale"
            )
        batch = probabilities.shape[:-3]  # (*batch, 1, d|1, K)
        shape = (*batch, *harmonics.shape)
        picked = probabilities.expand(*shape, num_harmonics).gather(-1, harmonics.expand(shape).unsqueeze(-1))
        log_q = picked.squeeze(-1).clamp_min(torch.finfo(torch.float64).tiny).log().sum(-1)
        return (log_q - draws["log_proposal"].to(torch.float64)).to(lengthscale.dtype)
