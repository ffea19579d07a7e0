"""Operator-valued random Fourier features (ORFF) for matrix-valued kernels (paper 004).

A shift-invariant matrix-valued kernel K(x, y) = K₀(x − y) ∈ R^{p×p} has the Bochner form
K₀(δ) = E_ω[cos(ωᵀδ) A(ω)] with A(ω) = B(ω)B(ω)ᵀ ⪰ 0 (Brault et al. 2016, Prop. 3 / supplement
§D.1).  With m frequencies the ORFF map stacks, for every frequency j, the p × p' blocks

    Φ(x)ᵀ = m^{−1/2} [cos(ωⱼᵀx) B(ωⱼ), sin(ωⱼᵀx) B(ωⱼ)]ⱼ   ∈ R^{p × 2mp'},

so Φ(x)ᵀΦ(y)-style products give K̃(x, y) = m^{−1} Σⱼ cos(ωⱼᵀ(x − y)) A(ωⱼ).  Here the
result is returned per point as a ``(..., n, p, F)`` tensor with F = 2mp'; reshaped to
``(..., n·p, F)`` it is the low-rank root of the (n·p) × (n·p) Gram matrix in GPyTorch's
interleaved multitask order (row i·p + t = output t of point i).

Gaussian scalar kernel k₀(δ) = exp(−½δᵀΛ⁻¹δ), ω ~ N(0, Λ⁻¹), Λ = diag(ℓ²):

* curl-free, K = −∇∇ᵀk₀:       A(ω) = ωωᵀ,             B(ω) = ω                (p' = 1);
* divergence-free, K = (∇∇ᵀ − ΔI)k₀: A(ω) = ‖ω‖²I − ωωᵀ,  B(ω) = ‖ω‖·U⊥(ω)     (p' = d − 1),

with U⊥(ω) an orthonormal basis of ω^⊥, so B Bᵀ = ‖ω‖²(I − ω̂ω̂ᵀ) = A(ω) and ωᵀB = 0 (every
sample is exactly divergence-free).  This is the corrected factor of the digest's pitfall
list (the supplement's (I − ωωᵀ)^{1/2} is indefinite for ‖ω‖ > 1 and the thesis's
‖ω‖I − ωωᵀ does not square to A); U⊥ is the (d − 1)-column form of ‖ω‖(I − ω̂ω̂ᵀ), i.e.
±ω⊥ in 2-D, and it works for every d ≥ 2.

Frequencies come from :class:`~rfgp.features.RandomFourierFeatures` (``"iid"``,
``"orthogonal"`` or ``"structured"``) at unit lengthscale; the lengthscale enters as
ω = ε/ℓ, so gradients flow to ℓ and the draws stay fixed buffers.

Vector fields live in d = 2 or 3 dimensions, where SORF blocks √d·HD₁HD₂HD₃ are far from
Gaussian (in d = 2 every row has norm √2; paper 002 Lemma 5 puts the bias at O(1/d)).  The
``"structured"`` sampler therefore runs in the input zero-padded to
max(next power of two ≥ d, 64) dimensions: the first d coordinates of those rows are
nearly N(0, I_d) (bias O(1/64)), at O(log 64) cost per frequency.  The bias stays visible:
the mean of 200 curl-free draws at F = 2048 in d = 2, ℓ = 0.69, ‖δ‖ = 1.3 missed the entry −0.716 of K(δ) by
0.040 (5.5 % of it, 2 % of K(0)'s diagonal, 8 standard errors), where ``"iid"`` and ``"orthogonal"`` are unbiased.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.config_state import METHOD, ConfigState
from ..core.validation import check_features_input, check_positive_int
from .fourier import SAMPLERS, RandomFourierFeatures
from .hadamard import next_power_of_two

#: supported operator-valued families
FAMILIES = ("curl_free", "divergence_free")

#: the structured (SORF) sampler runs in a zero-padded space of at least this dimension
STRUCTURED_MIN_DIM = 64


def curl_free_factor(frequencies: Tensor) -> Tensor:
    """B(ω) = ω as ``(..., m, d, 1)``: A(ω) = ωωᵀ (curl-free, paper 004 §D.1.2)."""
    return frequencies.unsqueeze(-1)


def divergence_free_factor(frequencies: Tensor) -> Tensor:
    """B(ω) = ‖ω‖·U⊥(ω) as ``(..., m, d, d − 1)`` with B Bᵀ = ‖ω‖²I − ωωᵀ and ωᵀB = 0.

    U⊥ = columns 2..d of the Householder reflection H = I − 2vvᵀ/‖v‖² with
    v = ω̂ + sign(ω̂₁)e₁ (the sign choice avoids cancellation): H is orthogonal with first
    column ∝ ω̂, so its other columns are an orthonormal basis of ω^⊥.
    """
    norm = frequencies.norm(dim=-1, keepdim=True)
    # ω = 0 has B = 0; the clamp only keeps ω̂ finite there.
    unit = frequencies / norm.clamp_min(torch.finfo(frequencies.dtype).tiny)
    d = frequencies.shape[-1]
    sign = torch.where(unit[..., :1] >= 0, 1.0, -1.0).to(unit.dtype)
    e1 = (torch.arange(d, device=unit.device) == 0).to(unit.dtype)  # made on the device: no host copy
    v = unit + sign * e1
    eye = torch.eye(d, dtype=unit.dtype, device=unit.device)
    householder = eye - 2.0 * v.unsqueeze(-1) * v.unsqueeze(-2) / (v * v).sum(-1, keepdim=True).unsqueeze(-1)
    return norm.unsqueeze(-1) * householder[..., 1:]


_FACTORS = {"curl_free": curl_free_factor, "divergence_free": divergence_free_factor}


def factor_width(family: str, input_dim: int) -> int:
    """p', the number of columns of B(ω) for the family in dimension d."""
    return 1 if family == "curl_free" else input_dim - 1


class OperatorValuedFourierFeatures(ConfigState, nn.Module):
    """ORFF map of the curl-free or divergence-free Gaussian kernel, with p = d outputs.

    Args:
        num_features: real output width F = 2·m·p' (p' = 1 curl-free, d − 1 div-free);
            must be a multiple of 2p'.
        input_dim: d ≥ 2 (also the number of outputs p).
        family: ``"curl_free"`` or ``"divergence_free"``.
        sampler: frequency sampler of :class:`~rfgp.features.RandomFourierFeatures`.
        seed, generator: randomness of the frequencies.

    ``forward(x, lengthscale)`` takes x already divided by the lengthscale (the rfgp
    convention) and the lengthscale itself (shape ``(..., 1, d)`` or ``(..., 1, 1)``,
    ``None`` for ℓ = 1), because B(ω) depends on ω = ε/ℓ; it returns ``(..., n, d, F)``.

    Example:
        >>> import torch
        >>> from rfgp.features import OperatorValuedFourierFeatures
        >>> phi = OperatorValuedFourierFeatures(512, input_dim=2, family="divergence_free", seed=0)
        >>> phi(torch.randn(10, 2)).shape
        torch.Size([10, 2, 512])
    """

    # the frequencies (and their seed and sampler) are saved by the inner RandomFourierFeatures
    config_fields = {"family": METHOD, "num_features": METHOD, "input_dim": METHOD}

    def __init__(
        self,
        num_features: int,
        input_dim: int,
        family: str,
        sampler: str = "iid",
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        if family not in FAMILIES:
            raise ValueError(f"family must be one of {', '.join(map(repr, FAMILIES))}; got {family!r}")
        num_features = check_positive_int(num_features, "num_features")
        input_dim = check_positive_int(input_dim, "input_dim")
        if input_dim < 2:
            raise ValueError(
                f"input_dim must be ≥ 2 for {family} features (curl and divergence need a vector field "
                f"with p = d ≥ 2 outputs); got input_dim={input_dim}"
            )
        width = factor_width(family, input_dim)
        if num_features % (2 * width):
            raise ValueError(
                f"num_features must be a multiple of 2·p' = {2 * width} for {family} features in d={input_dim} "
                f"(F = 2·m·p' with m frequencies), got {num_features}"
            )
        self.family = family
        self.num_features = num_features
        self.input_dim = input_dim
        self.num_outputs = input_dim
        self.factor_width = width
        self.embedding_dim = input_dim
        if sampler == "structured":
            self.embedding_dim = max(next_power_of_two(input_dim), STRUCTURED_MIN_DIM)
        self.fourier = RandomFourierFeatures(
            num_features // width, input_dim=self.embedding_dim, sampler=sampler, seed=seed, generator=generator
        )

    @property
    def sampler(self) -> str:
        return self.fourier.sampler

    @property
    def num_frequencies(self) -> int:
        return self.fourier.num_frequencies

    def resample(self, generator: torch.Generator | None = None) -> OperatorValuedFourierFeatures:
        self.fourier.resample(generator)
        return self

    def factors(self, lengthscale: Tensor | None = None, like: Tensor | None = None) -> Tensor:
        """B(ωⱼ) for ω = ε/ℓ, shape ``(..., m, d, p')``."""
        frequencies = self.fourier.frequency_matrix()[..., : self.input_dim]
        if like is not None:
            frequencies = frequencies.to(dtype=like.dtype, device=like.device)
        if lengthscale is not None:
            frequencies = frequencies / lengthscale
        return _FACTORS[self.family](frequencies)

    def forward(self, x: Tensor, lengthscale: Tensor | None = None) -> Tensor:
        """Φ(x) of shape ``(..., n, d, F)`` for ``x`` (= inputs / ℓ) of shape ``(..., n, d)``."""
        check_features_input(x, "x", self.input_dim)
        if self.embedding_dim > self.input_dim:
            x = torch.nn.functional.pad(x, (0, self.embedding_dim - self.input_dim))
        trig = self.fourier(x)  # (..., n, 2m) = m^{-1/2}[cos(Wx), sin(Wx)]
        factors = self.factors(lengthscale, like=trig)  # (..., m, d, p')
        factors = torch.cat((factors, factors), dim=-3).transpose(-3, -2)  # (..., d, 2m, p')
        features = trig.unsqueeze(-2).unsqueeze(-1) * factors.unsqueeze(-4)  # (..., n, d, 2m, p')
        return features.flatten(-2)

    def extra_repr(self) -> str:
        return f"family={self.family!r}, input_dim={self.input_dim}, num_features={self.num_features}"


def decomposable_features(scalar_features: Tensor, factor: Tensor) -> Tensor:
    """ORFF of a decomposable kernel k(x, y)·A with A = BBᵀ: Φ(x) = φ(x) ⊗ Bᵀ (paper 004 §D.1.2).

    Args:
        scalar_features: φ(x) of shape ``(..., n, F_s)`` (any rfgp scalar feature kernel).
        factor: B of shape ``(..., p, r)``.

    Returns:
        ``(..., n, p, F_s·r)`` with entry [i, t, (f, k)] = φ_f(xᵢ)·B[t, k], so that
        Φ(x)Φ(y)ᵀ = φ(x)ᵀφ(y)·A.
    """
    features = scalar_features.unsqueeze(-2).unsqueeze(-1) * factor.unsqueeze(-2).unsqueeze(-4)
    return features.flatten(-2)


__all__ = [
    "FAMILIES",
    "OperatorValuedFourierFeatures",
    "SAMPLERS",
    "curl_free_factor",
    "decomposable_features",
    "divergence_free_factor",
    "factor_width",
]
