"""Closed-form oracles and Monte-Carlo helpers shared by the statistical tests.

The ORF formulas are the exact finite-d results of ``notes/papers-ctr-and-orf.md`` §B4–B5
(Yu et al. 2016, Lemma 1 and App. A.3), evaluated as float64 series; they reproduce the
table of exact ORF/RFF variance ratios in the notes to four decimals (tested).
"""

from __future__ import annotations

import math

import torch


def rff_variance(z: float, num_frequencies: int) -> float:
    """Var of the sin/cos RFF estimate of exp(−z²/2) with D frequencies: (1 − e^{−z²})²/(2D) (Lemma 1)."""
    return (1.0 - math.exp(-(z**2))) ** 2 / (2.0 * num_frequencies)


def _log_rising(a: float, n: int) -> float:
    """log of the rising factorial (a)_n = Γ(a + n)/Γ(a)."""
    return math.lgamma(a + n) - math.lgamma(a)


def orf_pair_moment(z: float, d: int, terms: int = 100) -> float:
    """E[cos(w₁ᵀz) cos(w₂ᵀz)] for two rows of one ORF block (χ_d norms, Haar directions).

    Σ_k (−z²/2)^k / k! · c_k,  c_k = Σ_{i=0}^{k} C(k, i) (d/2)_i (d/2)_{k−i} / (d/2)_k   (App. A.3).
    The c_k are sums of positive terms (no cancellation); the alternating outer series has
    terms of size ≤ e^{z²}, so float64 keeps ≳ 10 significant digits for z ≤ 3.
    """
    a, x = d / 2, z**2 / 2
    total = 0.0
    for k in range(terms):
        log_c = [
            math.lgamma(k + 1) - math.lgamma(i + 1) - math.lgamma(k - i + 1)
            + _log_rising(a, i) + _log_rising(a, k - i) - _log_rising(a, k)
            for i in range(k + 1)
        ]
        log_term = k * math.log(x) - math.lgamma(k + 1) if k else 0.0
        total += (-1) ** k * sum(math.exp(log_term + c) for c in log_c)
    return total


def orf_variance(z: float, d: int, num_frequencies: int) -> float:
    """Exact Var of the ORF estimate with D ≤ d rows of one block (notes §B5)."""
    D = num_frequencies
    return rff_variance(z, D) + (D - 1) / D * (orf_pair_moment(z, d) - math.exp(-(z**2)))


def hypergeometric_0f1(b: float, x: float, terms: int = 200) -> float:
    """₀F₁(; b; x) = Σ_k x^k / ((b)_k k!) (terms by recurrence; converges for every x)."""
    total, term = 0.0, 1.0
    for k in range(terms):
        total += term
        term *= x / ((b + k) * (k + 1))
    return total


def orf_prime_mean(z: float, d: int) -> float:
    """E[cos(wᵀz)] for w = √d·(uniform unit vector): φ_d(√d z) = ₀F₁(; d/2; −d z²/4) (ORF', notes §B5)."""
    return hypergeometric_0f1(d / 2, -d * z**2 / 4)


def orf_prime_mse(z: float, d: int, num_frequencies: int) -> float:
    """MSE of ORF' (rows √d·Q, D ≤ d) against exp(−z²/2): Var + bias² (notes §B5)."""
    D = num_frequencies

    def phi(t):
        return hypergeometric_0f1(d / 2, -(t**2) / 4)

    mean = phi(math.sqrt(d) * z)
    var = (0.5 * (1 + phi(2 * math.sqrt(d) * z)) - mean**2) / D + (D - 1) / D * (phi(math.sqrt(2 * d) * z) - mean**2)
    return var + (mean - math.exp(-(z**2) / 2)) ** 2


def mean_and_se(samples: torch.Tensor) -> tuple[float, float]:
    """Sample mean and its standard error along the first axis."""
    samples = samples.double()
    return samples.mean(0).item(), (samples.std(0) / math.sqrt(samples.shape[0])).item()


def variance_and_se(samples: torch.Tensor) -> tuple[float, float]:
    """Unbiased sample variance and its standard error √((m₄ − s⁴)/n)."""
    samples = samples.double()
    centred = samples - samples.mean()
    var = samples.var().item()
    fourth = centred.pow(4).mean().item()
    return var, math.sqrt(max(fourth - var**2, 0.0) / samples.shape[0])
