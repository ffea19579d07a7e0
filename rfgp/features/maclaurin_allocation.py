"""Feature allocation of the optimized Maclaurin map (paper 000 §5.3–5.4, Algorithms 2–3, Appendix C).

For k(x, y) = s(x)s(y)Σₙaₙ(xᵀy)ⁿ and a sample x₁..x_m, the objective (Eqs. 51 and 55) is the
U-statistic over ordered pairs i ≠ j

    g(p, D) = Σ_{n ≤ p, Dₙ>0} aₙ² mean_{i≠j}[sᵢ²sⱼ² V(Φₙ(xᵢ)ᵀΦₙ(xⱼ); Dₙ)]
            + mean_{i≠j}[(k(xᵢ, xⱼ) − sᵢsⱼ Σ_{n ≤ p, Dₙ>0 or n=0} aₙ(xᵢᵀxⱼ)ⁿ)²],

with the closed-form variances of :mod:`rfgp.variance` (paper 000 Table 1; for CtR weights the
real-part variance ½(V + P), paper 001 Eq. 6).  Everything is computed once on the sample in
float64; afterwards each evaluation costs O(1) per degree.

* :func:`incremental_allocation` (Algorithm 2, read as in the notes: every degree with aₙ > 0
  starts at 1, then features are added greedily until Σ Dₙ = D_total; degrees with aₙ = 0
  get nothing; ties go to the larger degree).  TensorSRHT uses the convex surrogate of
  Appendix C (Eqs. 72–73), which gives degree 1 at most d features (automatic H0/1).
* :func:`extended_allocation` (Algorithm 3): the best truncation order p ∈ [p_min, p_max]
  by the exact objective g (ties to the larger p).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from ..dot_product import DotProductKernelSpec, degree_terms
from ..variance import (
    _FOURTH_MOMENT,
    _srht_pairs,
    gram_statistics,
    single_feature_pseudo_variance,
    single_feature_variance,
    srht_covariance,
)
from .degree_sketch import srht_padded_dim


class AllocationObjective:
    """The pair statistics of a data sample that g(p, D) needs, for one kernel and one sketch family.

    Args:
        kernel: the :class:`~rfgp.dot_product.DotProductKernelSpec`.
        x: ``(m, d)`` sample (inputs as the map sees them, i.e. divided by ℓ), m ≥ 2.
        max_degree: the largest degree that will be evaluated.
        projection: ``"rademacher"``, ``"gaussian"`` or ``"srht"``.
        weights: ``"real"``, ``"complex"`` (complex variance, paper 000) or ``"ctr"`` (real part, paper 001).
        srht_blocks: TensorSRHT block sampling (``"tiled"`` or ``"independent"``).
    """

    def __init__(self, kernel: DotProductKernelSpec, x: Tensor, max_degree: int, projection: str,
                 weights: str, srht_blocks: str = "tiled") -> None:
        x = x.detach().double()
        m = x.shape[0]
        self.kernel, self.max_degree, self.projection = kernel, max_degree, projection
        self.weights, self.srht_blocks = weights, srht_blocks
        self.padded_dim = srht_padded_dim(x.shape[-1])
        complex_weights = weights != "real"
        self._m4 = _FOURTH_MOMENT[projection][complex_weights]
        self._q = 0.5 if complex_weights else 1.0
        self._stats = gram_statistics(x)
        self._off = ~torch.eye(m, dtype=torch.bool)
        log_s = kernel.log_prefactor(x)
        log_pair = log_s.unsqueeze(-1) + log_s.unsqueeze(-2)
        self._pair_weight = (2 * log_pair).exp()  # s(xᵢ)²s(xⱼ)², Eq. 55
        self.log_coefficients = kernel.log_coefficients(max_degree)
        self.coefficients = self.log_coefficients.exp()
        # sᵢsⱼaₙGⁿ per pair and degree, for the bias curve
        self._terms = degree_terms(kernel, self._stats[0], max_degree, log_scale=log_pair)[self._off]
        self._exact = kernel(x, x)[self._off]
        self._cache: dict = {}

    # ------------------------------------------------------------- variances
    def _mean(self, values: Tensor) -> float:
        return float((self._pair_weight * values)[self._off].mean())

    def _single(self, degree: int, pseudo: bool = False) -> Tensor:
        fn = single_feature_pseudo_variance if pseudo else single_feature_variance
        return fn(self._stats, degree, self._m4, self._q)

    def single_variance(self, degree: int) -> float:
        """mean_{i≠j} sᵢ²sⱼ²·(variance of one feature) — V⁽ⁿ⁾, or ½(V + P) for CtR."""
        key = ("single", degree)
        if key not in self._cache:
            value = self._single(degree)
            if self.weights == "ctr":
                value = 0.5 * (value + self._single(degree, pseudo=True))
            self._cache[key] = self._mean(value)
        return self._cache[key]

    def covariance(self, degree: int, denominator: int) -> float:
        """mean_{i≠j} sᵢ²sⱼ²·Cov of two distinct TensorSRHT features (Cov_q⁽ⁿ⁾ with r = ``denominator``)."""
        key = ("cov", degree, denominator)
        if key not in self._cache:
            value = srht_covariance(self._stats, degree, self._single(1), denominator)
            if self.weights == "ctr":
                pseudo = srht_covariance(self._stats, degree, self._single(1, pseudo=True), denominator)
                value = 0.5 * (value + pseudo)
            self._cache[key] = self._mean(value)
        return self._cache[key]

    def degree_variance(self, degree: int, width: int) -> float:
        """aₙ²·mean_{i≠j} sᵢ²sⱼ² V[Φₙ(xᵢ)ᵀΦₙ(xⱼ)] with ``width`` features (exact closed form)."""
        a2 = float(self.coefficients[degree]) ** 2
        if width == 0 or a2 == 0:
            return 0.0
        variance = self.single_variance(degree) / width
        if self.projection == "srht":
            pairs, denominator = _srht_pairs(width, self.padded_dim, self.srht_blocks)
            variance += pairs / width**2 * self.covariance(degree, denominator)
        return a2 * max(variance, 0.0)

    def surrogate_variance(self, degree: int, width: int) -> float:
        """The convex surrogate used for the allocation: exact for unstructured sketches, Eqs. 72–73 for TensorSRHT."""
        if self.projection != "srht":
            return self.degree_variance(degree, width)
        d = self.padded_dim
        a2 = float(self.coefficients[degree]) ** 2
        v, cov = self.single_variance(degree), self.covariance(degree, d - 1)
        if cov > 0 or width > d:
            return a2 * max(v + (d - 1) * cov, 0.0) / width
        return a2 * ((v - cov) / width + cov)

    # ------------------------------------------------------------ objective
    def squared_bias(self, included: list[int]) -> float:
        """mean_{i≠j}(k − sᵢsⱼ Σ_{n ∈ {0} ∪ included} aₙGⁿ)²."""
        degrees = sorted({0, *included})
        residual = self._exact - self._terms[:, degrees].sum(-1)
        return float(residual.pow(2).mean())

    def __call__(self, allocation: tuple[int, ...]) -> float:
        """g(p, D) for D = (D₁, …, D_p) (exact closed-form variances)."""
        included = [n for n, width in enumerate(allocation, start=1) if width > 0]
        variance = sum(self.degree_variance(n, allocation[n - 1]) for n in included)
        return variance + self.squared_bias(included)


def incremental_allocation(objective: AllocationObjective, order: int, total: int) -> tuple[int, ...]:
    """Algorithm 2: the greedy allocation (D₁, …, D_order) with Σ Dₙ = ``total``."""
    active = [n for n in range(1, order + 1) if objective.coefficients[n] > 0]
    if len(active) > total:
        raise ValueError(f"order {order} needs at least {len(active)} features, the budget is {total}")
    allocation = [0] * order
    for n in active:
        allocation[n - 1] = 1
    current = {n: objective.surrogate_variance(n, 1) for n in active}
    for _ in range(total - len(active)):
        gains = {n: current[n] - objective.surrogate_variance(n, allocation[n - 1] + 1) for n in active}
        best = max(active, key=lambda n: (gains[n], n))  # ties → the larger degree
        allocation[best - 1] += 1
        current[best] = objective.surrogate_variance(best, allocation[best - 1])
    return tuple(allocation)


@dataclass(frozen=True)
class Allocation:
    """The result of Algorithm 3: truncation order p*, widths (D₁..D_p*) and objective g."""

    order: int
    widths: tuple[int, ...]
    objective: float


def extended_allocation(objective: AllocationObjective, min_order: int, max_order: int, total: int) -> Allocation:
    """Algorithm 3: min over p ∈ [min_order, max_order] of g(p, Algorithm 2(p)); ties go to the larger p."""
    best = None
    for order in range(min_order, max_order + 1):
        active = sum(1 for n in range(1, order + 1) if objective.coefficients[n] > 0)
        if active > total:
            break  # infeasible: every degree with aₙ > 0 needs a feature
        widths = incremental_allocation(objective, order, total)
        value = objective(widths)
        if best is None or value <= best.objective:
            best = Allocation(order, widths, value)
    if best is None:
        raise ValueError(f"no truncation order in [{min_order}, {max_order}] fits a budget of {total} features")
    return best


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


__all__ = ["Allocation", "AllocationObjective", "extended_allocation", "incremental_allocation", "random_degrees"]
