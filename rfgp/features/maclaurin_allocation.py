"""Feature allocation of the optimized Maclaurin map (paper 000 §5.3–5.4, Algorithms 2–3, Appendix C).

For k(x, y) = s(x)s(y)Σₙaₙ(xᵀy)ⁿ and a sample x₁..x_m, the objective (Eqs. 51 and 55) is the
U-statistic over ordered pairs i ≠ j

    g(p, D) = Σ_{n ≤ p, Dₙ>0} aₙ² mean_{i≠j}[sᵢ²sⱼ² V(Φₙ(xᵢ)ᵀΦₙ(xⱼ); Dₙ)]
            + mean_{i≠j}[(k(xᵢ, xⱼ) − sᵢsⱼ Σ_{n ≤ p, Dₙ>0 or n=0} aₙ(xᵢᵀxⱼ)ⁿ)²],

with the closed-form variances of :mod:`rfgp.features.variance` (paper 000 Table 1; for CtR weights the
real-part variance ½(V + P), paper 001 Eq. 6).  The pair terms are formed in float64 signed log
space (:mod:`rfgp.features.signed_log`), stable for high degrees and large ‖x‖/ℓ; each degree's pair mean is
computed once (O(m²)) and cached, so the greedy search costs O(1) per evaluation, plus O(m²p) for
the bias of each candidate order.

* :func:`incremental_allocation` (Algorithm 2, read as in the notes: every degree with aₙ > 0
  starts at 1, then features are added greedily until Σ Dₙ = D_total; degrees with aₙ = 0
  get nothing; ties go to the larger degree).  TensorSRHT uses the convex surrogate of
  Appendix C (Eqs. 72–73), which gives degree 1 at most d features (automatic H0/1).
* :func:`extended_allocation` (Algorithm 3): the best truncation order p ∈ [p_min, p_max]
  by the exact objective g (ties to the larger p); without p_max, upward from p_min until no higher order
  can beat the best g (the low-dimensional case: there extra width buys nothing, a higher order does).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from . import signed_log
from .degree_sketch import srht_padded_dim
from .dot_product import DotProductKernelSpec
from .variance import FOURTH_MOMENT, gram_statistics, srht_pairs


class AllocationObjective:
    """The pair statistics of a data sample that g(p, D) needs, for one kernel and one sketch family.

    Numerics: every per-pair term — aₙ²sᵢ²sⱼ²((G² + δ)ⁿ − G²ⁿ) for the variances, sᵢsⱼaₙGⁿ and
    k(xᵢ, xⱼ) for the bias — is formed in float64 log space with signs
    (:mod:`rfgp.features.signed_log`), and the pair means are signed logsumexps, so high degrees and
    large ‖x‖/ℓ neither overflow nor underflow (s² = e^{−‖x‖²} for the Gaussian kernel).  The
    differences (G² + δ)ⁿ − G²ⁿ use G²ⁿ·expm1(n·log1p(δ/G²)) with δ written out from (G, N, S),
    which also removes the cancellation of the direct form.  All values the methods return
    are in units of ``exp(log_scale)`` (the largest term magnitude on the sample; the
    allocation is invariant to this scale): multiply by it for the absolute g.

    Args:
        kernel: the :class:`~rfgp.features.dot_product.DotProductKernelSpec`.
        x: ``(m, d)`` sample (inputs as the map sees them, i.e. divided by ℓ), m ≥ 2.
        max_degree: the largest degree that will be evaluated.
        projection: ``"rademacher"``, ``"gaussian"`` or ``"srht"``.
        weights: ``"real"``, ``"complex"`` (complex variance, paper 000) or ``"ctr"`` (real part, paper 001).
        srht_blocks: TensorSRHT block sampling (``"tiled"`` or ``"independent"``).
    """

    def __init__(self, kernel: DotProductKernelSpec, x: Tensor, max_degree: int, projection: str,
                 weights: str, srht_blocks: str = "tiled") -> None:
        x = x.detach().double()
        self.kernel, self.max_degree, self.projection = kernel, max_degree, projection
        self.weights, self.srht_blocks = weights, srht_blocks
        self.padded_dim = srht_padded_dim(x.shape[-1])
        # The statistics are symmetric in (i, j): the mean over i < j equals the U-statistic over i ≠ j.
        rows, cols = torch.triu_indices(x.shape[0], x.shape[0], offset=1)
        g, n, s = (stat[rows, cols] for stat in gram_statistics(x))
        self._g2 = g * g
        # δ = base − G² of the single-feature variance and pseudo-variance (paper 000 Eq. 16, 001 Table 1):
        # base_V = m₄S + N − S + c(G² − S), c = (2q−1)² + 1;  base_P = m₄S + 2(G² − S) + (2q−1)²(N − S)
        m4 = FOURTH_MOMENT[projection][weights != "real"]
        phase = 0.0 if weights != "real" else 1.0  # (2q − 1)², q = ½ for complex weights
        c = phase + 1.0
        self._delta = {False: (c - 1) * self._g2 + n + (m4 - 1 - c) * s,
                       True: self._g2 + (m4 - 2 - phase) * s + phase * n}
        log_s = kernel.log_prefactor(x)
        log_pair = log_s[rows] + log_s[cols]
        self._log_weight = 2 * log_pair  # sᵢ²sⱼ², Eq. 55
        self.log_coefficients = kernel.log_coefficients(max_degree)
        self.coefficients = self.log_coefficients.exp()
        # for the bias: sᵢsⱼaₙGⁿ per pair, formed for the degrees a candidate order includes (a table of every degree
        # up to AUTO_MAX_ORDER would hold 61 values per pair), and k(xᵢ, xⱼ)
        self._log_pair, self._log_abs_g, self._g_negative = log_pair, g.abs().log(), g < 0
        log_k, sign_k = kernel.log_gram(x, x)
        self._log_exact, self._sign_exact = log_k[rows, cols], sign_k[rows, cols]
        self.log_scale = self._reference_scale()
        self._cache: dict = {}

    def _reference_scale(self) -> float:
        """log of the largest pair-mean magnitude any term can reach: max(mean k², aₙ²·mean sᵢ²sⱼ²·Bₙ)."""
        bound = (self._g2 + self._delta[False].abs() + self._delta[True].abs()).log()  # ≥ every |base|, G²
        ones = torch.ones_like(bound)
        scales = [signed_log.mean_exp(2 * self._log_exact, ones)[0]]
        for degree in range(1, self.max_degree + 1):
            if self.has_degree(degree):
                log_mean = signed_log.mean_exp(self._log_weight + degree * bound, ones)[0]
                scales.append(2 * float(self.log_coefficients[degree]) + log_mean)
        finite = [value for value in scales if math.isfinite(value)]
        return max(finite) if finite else 0.0

    def has_degree(self, degree: int) -> bool:
        """aₙ > 0 (decided in log space: 1/n! underflows to 0 in float64 beyond n = 170)."""
        return math.isfinite(float(self.log_coefficients[degree]))

    def _relative(self, log_abs: float, sign: float, degree: int) -> float:
        """sign·aₙ²·exp(log_abs) in units of exp(log_scale)."""
        return signed_log.to_float(log_abs + 2 * float(self.log_coefficients[degree]) - self.log_scale, sign)

    # ------------------------------------------------------------- variances
    def _gap_mean(self, degree: int, delta: Tensor) -> tuple[float, float]:
        """mean_{i≠j} sᵢ²sⱼ²((G² + δ)ⁿ − G²ⁿ) as (log|·|, sign)."""
        log_gap, sign = signed_log.power_gap(self._g2, delta, degree)
        return signed_log.mean_exp(self._log_weight + log_gap, sign)

    def single_variance(self, degree: int) -> float:
        """aₙ²·mean_{i≠j} sᵢ²sⱼ²·(variance of one feature) — V⁽ⁿ⁾, or ½(V + P) for CtR (relative units)."""
        key = ("single", degree)
        if key not in self._cache:
            value = self._relative(*self._gap_mean(degree, self._delta[False]), degree)
            if self.weights == "ctr":
                value = 0.5 * (value + self._relative(*self._gap_mean(degree, self._delta[True]), degree))
            self._cache[key] = value
        return self._cache[key]

    def covariance(self, degree: int, denominator: int) -> float:
        """aₙ²·mean_{i≠j} sᵢ²sⱼ²·Cov of two distinct TensorSRHT features, Cov = (G² − V⁽¹⁾/r)ⁿ − G²ⁿ (relative units).

        V⁽¹⁾ = δ (the degree-1 single-feature variance), so the base is G² + δ_cov with δ_cov = −δ/r.
        """
        key = ("cov", degree, denominator)
        if key not in self._cache:
            value = self._relative(*self._gap_mean(degree, -self._delta[False] / denominator), degree)
            if self.weights == "ctr":
                pseudo = self._gap_mean(degree, -self._delta[True] / denominator)
                value = 0.5 * (value + self._relative(*pseudo, degree))
            self._cache[key] = value
        return self._cache[key]

    def degree_variance(self, degree: int, width: int) -> float:
        """aₙ²·mean_{i≠j} sᵢ²sⱼ² V[Φₙ(xᵢ)ᵀΦₙ(xⱼ)] with ``width`` features (exact closed form, relative units)."""
        if width == 0 or not self.has_degree(degree):
            return 0.0
        variance = self.single_variance(degree) / width
        if self.projection == "srht":
            pairs, denominator = srht_pairs(width, self.padded_dim, self.srht_blocks)
            variance += pairs / width**2 * self.covariance(degree, denominator)
        return max(variance, 0.0)

    def surrogate_variance(self, degree: int, width: int) -> float:
        """The convex surrogate used for the allocation: exact for unstructured sketches, Eqs. 72–73 for TensorSRHT."""
        if self.projection != "srht":
            return self.degree_variance(degree, width)
        if not self.has_degree(degree):
            return 0.0
        d = self.padded_dim
        v, cov = self.single_variance(degree), self.covariance(degree, d - 1)
        if cov > 0 or width > d:
            return max(v + (d - 1) * cov, 0.0) / width
        return (v - cov) / width + cov

    # ------------------------------------------------------------ objective
    def squared_bias(self, included: list[int]) -> float:
        """mean_{i≠j}(k − sᵢsⱼ Σ_{n ∈ {0} ∪ included} aₙGⁿ)² (relative units)."""
        log_residual, _ = self._residual(tuple(sorted({0, *included})))
        log_mean, _ = signed_log.mean_exp(2 * log_residual, torch.ones_like(log_residual))
        return signed_log.to_float(log_mean - self.log_scale)

    def _residual(self, degrees: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """(log|·|, sign) per pair of k − sᵢsⱼ Σ_{n ∈ degrees} aₙGⁿ.

        The last residual is kept: a call whose degrees extend it (the upward order search) adds only the new
        degrees' terms, O(m²) per order instead of O(m²p).
        """
        known, log_abs, sign = self._cache.get("residual", ((), self._log_exact, self._sign_exact))
        if degrees[: len(known)] != known:
            known, log_abs, sign = (), self._log_exact, self._sign_exact
        if len(degrees) > len(known):
            new = torch.tensor(degrees[len(known):], dtype=torch.float64)
            log_abs_g = torch.where(new == 0, 0.0, new * self._log_abs_g.unsqueeze(-1))
            log_terms = self._log_pair.unsqueeze(-1) + self.log_coefficients[new.long()] + log_abs_g
            sign_terms = torch.where(self._g_negative.unsqueeze(-1) & (new % 2 == 1), -1.0, 1.0).double()
            log_abs, sign = signed_log.sum_exp(torch.cat((log_abs.unsqueeze(-1), log_terms), dim=-1),
                                               torch.cat((sign.unsqueeze(-1), -sign_terms), dim=-1))
            self._cache["residual"] = (degrees, log_abs, sign)
        return log_abs, sign

    def __call__(self, allocation: tuple[int, ...]) -> float:
        """g(p, D) for D = (D₁, …, D_p) (exact closed-form variances; relative units)."""
        included = [n for n, width in enumerate(allocation, start=1) if width > 0]
        variance = sum(self.degree_variance(n, allocation[n - 1]) for n in included)
        return variance + self.squared_bias(included)

    def absolute(self, value: float) -> float:
        """A value of this objective in absolute units, value·exp(log_scale) (inf beyond float64)."""
        return 0.0 if value <= 0 else signed_log.to_float(math.log(value) + self.log_scale)


#: the smallest objective value, in units of the objective's scale exp(log_scale), that the float64 objective resolves:
#: ε² with ε the float64 machine epsilon, i.e. a root-mean-square error of ε·scale^½.  The squared bias, a difference
#: k − Σ aₙGⁿ rounded to ≈ ε·k, floors there (≈ 2.4·10⁻³² on 1-D standard-normal data, Gaussian kernel), and the
#: computed features (float64 at best) carry a rounding error of at least ε·k(x, y) per pair.
RESOLUTION = torch.finfo(torch.float64).eps ** 2


def incremental_allocation(objective: AllocationObjective, order: int, total: int) -> tuple[int, ...]:
    """Algorithm 2: the greedy allocation (D₁, …, D_order) with Σ Dₙ = ``total``.

    A heap of the marginal gains (only the degree that received a feature changes its gain): O(total·log order).
    Gains below :data:`RESOLUTION` of the objective's scale count as zero (the surrogate variances are convex in the
    width, so then every later gain is too): the remaining features go to the lowest degree with aₙ > 0, the
    cheapest to compute, instead of following the round-off of near-zero variances (in 1-D, TensorSRHT gains of
    10⁻³⁷ of the scale had pulled 900 of 2 048 features onto degrees 14–16).
    """
    active = [n for n in range(1, order + 1) if objective.has_degree(n)]
    if len(active) > total:
        raise ValueError(f"order {order} needs at least {len(active)} features, the budget is {total}")
    allocation = [0] * order
    for n in active:
        allocation[n - 1] = 1

    def entry(n: int) -> tuple[float, int]:  # the smallest entry is the largest gain, ties → the larger degree
        width = allocation[n - 1]
        return (objective.surrogate_variance(n, width + 1) - objective.surrogate_variance(n, width), -n)

    heap = [entry(n) for n in active]
    heapq.heapify(heap)
    for _ in range(total - len(active)):
        if -heap[0][0] < RESOLUTION:  # no gain left that g resolves: the rest goes to the cheapest degree
            allocation[active[0] - 1] += total - sum(allocation)
            break
        best = -heap[0][1]
        allocation[best - 1] += 1
        heapq.heapreplace(heap, entry(best))
    return tuple(allocation)


@dataclass(frozen=True)
class Allocation:
    """The result of Algorithm 3: truncation order p*, widths (D₁..D_p*) and objective g (absolute units)."""

    order: int
    widths: tuple[int, ...]
    objective: float


#: the highest order the automatic search (``max_order=None``) may reach: the signed-log pair statistics are checked
#: against 50-digit arithmetic up to degree 60 (tests/features/test_maclaurin_allocation_numerics.py)
AUTO_MAX_ORDER = 60


def extended_allocation(objective: AllocationObjective, min_order: int, max_order: int | None,
                        total: int) -> Allocation:
    """Algorithm 3: min over p ∈ [min_order, max_order] of g(p, Algorithm 2(p)); ties go to the larger p.

    ``max_order=None`` lifts the paper's p_max = 10 (an experimental setting, §6.1.4, chosen where the degrees
    above 3 receive few features): the search runs upward from ``min_order`` (to at most :data:`AUTO_MAX_ORDER`
    and ``objective.max_degree``) and stops at the first order p whose variance term alone reaches the best g so
    far.  The optimal variance V*(p) of Eq. 53 does not decrease with p (an order q > p must give each new degree
    a feature, taken from the first p), so g(q) ≥ V*(q) ≥ V*(p) ≥ g* for every q ≥ p: the stop loses nothing
    (for TensorSRHT this holds for the Appendix C surrogate that Algorithm 2 minimises).
    This matters in low dimension, where a degree-n sketch reaches its exact value with few features (in 1-D
    the real Rademacher and the TensorSRHT variances vanish at one or two features, paper 000 §5.5) and every
    further feature can only lower the truncation bias through a higher order; in high dimension the variance
    term reaches g* near the paper's orders and the result is the same.  The search also stops once g* ≤
    :data:`RESOLUTION` of the objective's scale, below which float64 resolves neither g nor the features: in 1-D
    every degree's variance is zero up to round-off, so the variance stop never fires there, and the search
    ran to order 60 with a squared bias of 10⁻¹⁹ of the scale at order 30 (it now ends near order 44).
    """
    upper = min(AUTO_MAX_ORDER, objective.max_degree) if max_order is None else max_order
    best, best_value = None, math.inf
    for order in range(min_order, upper + 1):
        active = [n for n in range(1, order + 1) if objective.has_degree(n)]
        if len(active) > total:
            break  # infeasible: every degree with aₙ > 0 needs a feature
        widths = incremental_allocation(objective, order, total)
        variance = sum(objective.degree_variance(n, widths[n - 1]) for n in active)
        if max_order is None and best is not None and variance >= best_value:
            break  # no order ≥ this one can beat g*
        value = objective(widths)
        if best is None or value <= best_value:
            best, best_value = (order, widths), value
        if max_order is None and best_value <= RESOLUTION:
            break  # g is at the float64 resolution: no higher order can lower it measurably
    if best is None:
        raise ValueError(f"no truncation order in [{min_order}, {upper}] fits a budget of {total} features")
    return Allocation(*best, objective.absolute(best_value))


def random_degrees(num: int, max_order: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """Kar & Karnick's degree measure μ(n) ∝ 2^{−(n+1)} truncated to {1..max_order} (paper 000 Eq. 40, fn. 15).

    Returns (counts Dₙ for n = 1..max_order, probabilities μ(n)).
    """
    probabilities = torch.tensor([2.0 ** -(n + 1) for n in range(1, max_order + 1)], dtype=torch.float64)
    probabilities = probabilities / probabilities.sum()
    draws = torch.multinomial(probabilities, num, replacement=True, generator=generator)
    return torch.bincount(draws, minlength=max_order), probabilities


def total_width(num_features: int, has_constant: bool, complex_weights: bool) -> int:
    """D_total: sketch features left after the constant column; complex features take two real columns."""
    return (num_features - has_constant) // (2 if complex_weights else 1)


__all__ = ["AUTO_MAX_ORDER", "RESOLUTION", "Allocation", "AllocationObjective", "extended_allocation",
           "incremental_allocation", "random_degrees"]
