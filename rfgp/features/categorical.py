r"""Random features of the categorical (Hamming) product kernel, by hashing the categories.

Target: k(x, y) = Πᵢ kᵢ(xᵢ, yᵢ) with kᵢ(a, b) = cᵢ + (1 − cᵢ)·1[a = b], 0 ≤ cᵢ ≤ 1 — BoTorch's
``CategoricalKernel`` exp(−(1/d) Σᵢ 1[xᵢ ≠ yᵢ]/ℓᵢ) has cᵢ = exp(−1/(d·ℓᵢ)).  Derivation:

* Per dimension the exact features of kᵢ are [√cᵢ, √(1 − cᵢ)·e(a)], e(a) the one-hot of the
  category; the category set is unknown in advance, so e(a)ᵀe(b) = 1[a = b] is replaced by a
  random sign hash h(a) ∈ {±1} from a pairwise independent family: E[h(a)h(b)] = 1[a = b].
* The product over dimensions is sketched as a Rademacher product: with independent draws per
  feature f and dimension i, ψ_{f,i}(a) = √cᵢ·ε_{f,i} + √(1 − cᵢ)·h_{f,i}(a), ε a Rademacher sign
  independent of h, and Φ_f(x) = Πᵢ ψ_{f,i}(xᵢ)/√F.  E[ψ(a)ψ(b)] = cᵢ + (1 − cᵢ)1[a = b], so
  E[Φ(x)ᵀΦ(y)] = k(x, y): unbiased, also on the diagonal (no variance correction).
* Variance: per feature E[(Πᵢ ψᵢ(x)ψᵢ(y))²] = Πᵢ mᵢ, mᵢ = 1 + 4cᵢ(1 − cᵢ) if xᵢ = yᵢ and 1
  otherwise (pairwise independence suffices), so Var[k̂(x, y)] = (Πᵢ mᵢ − k(x, y)²)/F
  (:func:`categorical_variance`).

The hash of a category a (any finite float; −0.0 is 0.0, as for ``!=``): its float64 bit
pattern (exact for float32 and for integers up to 2⁵³, so the same value hashes alike in every
dtype) split into 32-bit halves lo, hi, then v = a₁·lo + a₂·hi + b mod 2⁶⁴ with uniform 64-bit
a₁, a₂, b drawn per (f, i), and h = +1 if the top bit of v is 0 else −1: Dietzfelbinger's
multiply-add-shift family for vectors of two 32-bit words, which is strongly universal
("Universal hashing and k-wise independent random variables via integer arithmetic without
primes", STACS 1996, Thm 3), so h is pairwise independent.  All in int64 arithmetic on the
input's device: no host synchronisation.

The features are evaluated one dimension at a time, keeping the running product: O(n·F)
working memory (autograd keeps one n × F factor per dimension for the gradient in c).  They are
piecewise constant in x: no gradient with respect to the inputs (as BoTorch's kernel).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.dtypes import promoted_dtype
from ..core.validation import SUPPORTED_DTYPES, NonFiniteError, check_input_shape, nonfinite_message, reads_values
from .base import FeatureMap

_LOW_WORD = 0xFFFFFFFF


def category_words(x: Tensor) -> tuple[Tensor, Tensor]:
    """(lo, hi): the two 32-bit halves (as non-negative int64) of the float64 bit pattern of x + 0.0 (−0.0 → 0.0)."""
    bits = (x.to(torch.float64) + 0.0).view(torch.int64)
    return bits & _LOW_WORD, (bits >> 32) & _LOW_WORD


def random_int64(shape, generator: torch.Generator) -> Tensor:
    """Uniform 64-bit words (every bit pattern equally likely) as int64, from eight random bytes each."""
    return torch.randint(0, 256, (*shape, 8), generator=generator, dtype=torch.uint8).view(torch.int64).squeeze(-1)


def categorical_kernel(x: Tensor, y: Tensor, constant_share: Tensor) -> Tensor:
    """k(x, y) = Πᵢ (cᵢ + (1 − cᵢ)·1[xᵢ = yᵢ]), shape ``(..., n, m)`` (the target, for tests and checks)."""
    equal = x.unsqueeze(-2) == y.unsqueeze(-3)
    c = constant_share.unsqueeze(-2)
    return torch.where(equal, torch.ones_like(c), c).prod(-1)


def categorical_variance(x: Tensor, y: Tensor, constant_share: Tensor, num_features: int) -> Tensor:
    """Var[k̂(x, y)] = (Πᵢ mᵢ − k(x, y)²)/F, mᵢ = 1 + 4cᵢ(1 − cᵢ) if xᵢ = yᵢ else 1, shape ``(..., n, m)``."""
    equal = x.unsqueeze(-2) == y.unsqueeze(-3)
    c = constant_share.unsqueeze(-2)
    second = torch.where(equal, 1 + 4 * c * (1 - c), torch.ones_like(c)).prod(-1)
    return (second - categorical_kernel(x, y, constant_share).pow(2)) / num_features


class CategoricalFeatures(FeatureMap):
    r"""Φ_f(x) = Πᵢ (√cᵢ·ε_{f,i} + √(1 − cᵢ)·h_{f,i}(xᵢ))/√F for k(x, y) = Πᵢ (cᵢ + (1 − cᵢ)·1[xᵢ = yᵢ]).

    Unbiased with Var[k̂(x, y)] = (Πᵢ mᵢ − k²)/F (see the module docstring for the derivation).

    ``forward(x, log_constant_share, per_feature=False)``: x ``(..., n, d)`` holds categories — float32/float64
    (any finite value; equal values are the same category, −0.0 = 0.0) or integers, the same value hashing alike
    in every dtype; ``log_constant_share`` is log cᵢ ≤ 0, shape ``(*batch, d)`` or ``(*batch, 1)`` (shared),
    ``batch`` broadcasting with x's batch dimensions ``x.shape[:-2]``; with ``per_feature=True`` it is log c_{f,i},
    shape ``(*batch, d or 1, F or 1)``: feature f then estimates Πᵢ (c_{f,i} + (1 − c_{f,i})·1[xᵢ = yᵢ]), its own
    kernel (a mixture over f, as :class:`~rfgp.features.hamming_imq.HammingIMQFeatures` draws it).  It is a log so
    that 1 − cᵢ = −expm1(log cᵢ) keeps its precision as cᵢ → 1 (long lengthscales); for BoTorch's
    kernel log cᵢ = −1/(d·ℓᵢ).  Φ has x's dtype for float x, log_constant_share's for integer x.

    Args:
        num_features: F.
        input_dim, seed, generator: see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features import CategoricalFeatures
        >>> phi = CategoricalFeatures(4096, input_dim=2, seed=0)
        >>> x = torch.tensor([[0.0, 1.0], [0.0, 2.0]], dtype=torch.float64)
        >>> log_c = torch.log(torch.tensor([0.25, 0.5], dtype=torch.float64))
        >>> k = phi(x, log_c) @ phi(x, log_c).T  # exact: [[1, 0.5], [0.5, 1]]
        >>> bool(abs(k[0, 1] - 0.5) < 0.1)
        True
    """

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        shape = (input_dim, self.num_features)
        signs = torch.randint(0, 2, shape, generator=generator).to(torch.float64).mul_(2).sub_(1)
        return {
            "signs": signs,  # ε: the constant part's Rademacher signs
            "hash_lo": random_int64(shape, generator),  # a₁
            "hash_hi": random_int64(shape, generator),  # a₂
            "hash_offset": random_int64(shape, generator),  # b
        }

    def forward(self, x: Tensor, log_constant_share: Tensor, per_feature: bool = False) -> Tensor:
        self._prepare(x)
        log_share = self._check_log_share(log_constant_share, x, per_feature)
        if not per_feature:
            log_share = log_share.unsqueeze(-1)  # (..., d or 1, 1): one share for every feature
        # torch type promotion of the categories' and the shares' dtypes (integer categories: the shares')
        dtype = promoted_dtype(x.dtype, log_share.dtype) if x.is_floating_point() else log_share.dtype
        log_share = log_share.to(dtype)
        root_constant = torch.exp(0.5 * log_share)  # √c, differentiable also where c underflows
        root_match = torch.sqrt(-torch.expm1(log_share))  # √(1 − c)
        signs = self._buffer("signs", log_share).to(dtype)
        a_lo, a_hi, offset = (self._buffer(name, x) for name in ("hash_lo", "hash_hi", "hash_offset"))
        lo, hi = category_words(x.detach())
        features = None
        for i in range(x.shape[-1]):
            index = min(i, log_share.shape[-2] - 1)  # a shared c has one entry
            words = lo[..., i, None] * a_lo[i] + hi[..., i, None] * a_hi[i] + offset[i]  # int64, wraps mod 2⁶⁴
            # √c·ε + √(1 − c)·h with h = ±1 the top bit of v as a sign: a choice between the two (..., 1, 1 or F)
            # rows √c·ε ± √(1 − c) (the same values) instead of forming h and two (..., n, F) products
            constant = root_constant[..., index, None, :] * signs[i]
            match = root_match[..., index, None, :]
            factor = torch.where(words >= 0, constant + match, constant - match)
            features = factor if features is None else features * factor
        return features / math.sqrt(self.num_features)

    def _prepare(self, x: Tensor) -> None:
        check_category_input(x, "x", self.input_dim)
        self._draw_at_first_call(x)

    def _check_log_share(self, log_share: Tensor, x: Tensor, per_feature: bool) -> Tensor:
        if not torch.is_tensor(log_share) or log_share.dtype not in SUPPORTED_DTYPES:
            kind = log_share.dtype if torch.is_tensor(log_share) else type(log_share).__name__
            raise TypeError(f"log_constant_share must be a float32 or float64 tensor, got {kind}")
        bad = log_share.dim() < (2 if per_feature else 1)
        if not bad:
            columns = log_share.shape[-2] if per_feature else log_share.shape[-1]
            bad = columns not in (1, x.shape[-1]) or (per_feature and log_share.shape[-1] not in (1, self.num_features))
        if bad:
            expected = (f"(..., d or 1, F or 1) with F = {self.num_features} (per_feature=True)" if per_feature
                        else "(..., d) or (..., 1)")
            raise ValueError(
                f"log_constant_share must have shape {expected} for x with d = {x.shape[-1]} columns, "
                f"got shape {tuple(log_share.shape)}"
            )
        if reads_values(log_share) and bool((torch.isnan(log_share) | (log_share > 0)).any()):
            raise ValueError(
                f"log_constant_share must hold log cᵢ ≤ 0 (constant shares cᵢ in [0, 1]), got {log_share.detach()}"
            )
        return log_share


def check_category_input(x: Tensor, name: str, input_dim: int | None) -> None:
    """Categories: a float32/float64 tensor of finite values or an integer tensor (not uint64), shape (..., n, d)."""
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor of categories, got {type(x).__name__}")
    integer = not (x.is_floating_point() or x.is_complex()) and x.dtype != torch.bool
    # uint64: torch has no comparisons to check it against 2⁵³, beyond which float64 merges integers
    if (not integer and x.dtype not in SUPPORTED_DTYPES) or x.dtype == torch.uint64:
        raise TypeError(f"{name} must hold categories as float32, float64 or an integer dtype other than uint64 "
                        f"(convert it to int64), got {x.dtype}")
    check_input_shape(x, name, input_dim)
    if not reads_values(x):
        return
    if integer:
        if x.dtype == torch.int64 and bool((x.abs() > 2**53).any()):  # beyond 2⁵³ float64 merges integers
            raise ValueError(f"{name} holds integer categories beyond ±2**53, which float64 cannot tell apart")
    elif not bool(torch.isfinite(x).all()):
        raise NonFiniteError(nonfinite_message(x, name, "categories must be finite values (NaN is no category)"))
