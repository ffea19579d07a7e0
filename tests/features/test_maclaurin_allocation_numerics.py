"""Allocation statistics in signed log space: equal to the direct float64 forms where those are finite,
finite (and equal to a 50-digit computation) at high degree and large ‖x‖/ℓ, where the direct forms
overflow or underflow (issue 4: "numerics in float64 for the allocation, stable for high p and large norms")."""

import math

import pytest
import torch

from rfgp.features import OptimizedMaclaurin, dot_product, signed_log, variance
from rfgp.features.maclaurin_allocation import AllocationObjective, extended_allocation

CASES = [("rademacher", "real"), ("gaussian", "complex"), ("srht", "real"), ("srht", "ctr")]


def _sample(m, d, squared_norm, seed=0):
    x = torch.randn(m, d, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(x, dim=-1) * math.sqrt(squared_norm)


def _direct(spec, x, degree, width, projection, weights):
    """aₙ² mean_{i≠j} sᵢ²sⱼ² V[Φₙ(xᵢ)ᵀΦₙ(xⱼ)] by rfgp.features.variance's direct (non-log) formulas."""
    m = x.shape[0]
    off = ~torch.eye(m, dtype=torch.bool)
    i, j = torch.nonzero(off, as_tuple=True)
    padded = 2 ** math.ceil(math.log2(x.shape[-1]))
    if weights == "ctr":  # the real-part variance ½(V + P); "complex" uses the complex variance V
        per_pair = variance.real_part_variance(x[i], x[j], degree, width, projection, True, padded)
    else:
        per_pair = variance.complex_estimator_variance(x[i], x[j], degree, width, projection, weights == "complex",
                                                       padded)
    log_s = spec.log_prefactor(x)
    weight = (2 * (log_s[i] + log_s[j])).exp()
    return float(spec.coefficients(degree)[degree]) ** 2 * float((weight * per_pair).mean())


@pytest.mark.parametrize("projection, weights", CASES)
def test_statistics_equal_the_direct_computation_where_it_is_finite(projection, weights):
    x = _sample(40, 6, 1.5)
    spec = dot_product.gaussian()
    objective = AllocationObjective(spec, x, 10, projection, weights)
    for degree in (1, 2, 5, 10):
        for width in (1, 3, 5, 12):
            expected = _direct(spec, x, degree, width, projection, weights)
            got = objective.absolute(objective.degree_variance(degree, width))
            assert got == pytest.approx(expected, rel=1e-9, abs=1e-15 * objective.absolute(1.0))
    off = ~torch.eye(40, dtype=torch.bool)
    residual = spec(x, x) - (spec.log_prefactor(x)[:, None] + spec.log_prefactor(x)[None]).exp() * \
        dot_product.truncated_series(spec, x @ x.T, 4)
    assert objective.absolute(objective.squared_bias([1, 2, 3, 4])) == pytest.approx(
        float(residual[off].pow(2).mean()), rel=1e-10)


def _mp_statistics(x, degree, order):
    """50-digit mean_{i≠j} sᵢ²sⱼ² aₙ²((N + 2G² − 2S)ⁿ − G²ⁿ) (real Rademacher) and the squared bias
    mean_{i≠j}(k − sᵢsⱼ Σ_{n ≤ order} Gⁿ/n!)² for the Gaussian kernel."""
    import mpmath

    mpmath.mp.dps = 50
    rows = [[mpmath.mpf(float(v)) for v in row] for row in x]
    variance_sum, bias_sum, count = mpmath.mpf(0), mpmath.mpf(0), 0
    for a in range(len(rows)):
        for b in range(len(rows)):
            if a == b:
                continue
            xa, xb = rows[a], rows[b]
            g = sum(p * q for p, q in zip(xa, xb))
            n = sum(p * p for p in xa) * sum(q * q for q in xb)
            s = sum((p * q) ** 2 for p, q in zip(xa, xb))
            prefactor = mpmath.exp(-(sum(p * p for p in xa) + sum(q * q for q in xb)) / 2)
            base = n + 2 * g**2 - 2 * s
            variance_sum += prefactor**2 * (base**degree - g ** (2 * degree)) / mpmath.factorial(degree) ** 2
            k = mpmath.exp(-sum((p - q) ** 2 for p, q in zip(xa, xb)) / 2)
            series = sum(g**k_ / mpmath.factorial(k_) for k_ in range(order + 1))
            bias_sum += (k - prefactor * series) ** 2
            count += 1
    return variance_sum / count, bias_sum / count


@pytest.mark.parametrize("squared_norm, degree", [(100.0, 50), (400.0, 60)])
def test_log_space_statistics_match_50_digit_arithmetic_at_large_norms(squared_norm, degree):
    """‖x‖²/ℓ² = 100, 400 and degrees 50, 60: at 400 sᵢ²sⱼ² = e^{−1600} underflows and Bⁿ overflows."""
    mpmath = pytest.importorskip("mpmath")
    x = _sample(5, 3, squared_norm, seed=1)
    objective = AllocationObjective(dot_product.gaussian(), x, degree, "rademacher", "real")
    expected_variance, expected_bias = _mp_statistics(x, degree, degree)
    log_variance = math.log(objective.single_variance(degree)) + objective.log_scale
    log_bias = math.log(objective.squared_bias(list(range(1, degree + 1)))) + objective.log_scale
    assert log_variance == pytest.approx(float(mpmath.log(expected_variance)), abs=1e-9)
    assert log_bias == pytest.approx(float(mpmath.log(expected_bias)), abs=1e-9)
    if squared_norm == 400.0:  # the direct float64 computation breaks down here (0·inf)
        assert not math.isfinite(_direct(dot_product.gaussian(), x, degree, 1, "rademacher", "real"))


@pytest.mark.parametrize("spec, squared_norm, order", [
    (dot_product.gaussian(), 100.0, 50),
    (dot_product.gaussian(), 50.0, 30),
    (dot_product.polynomial(50, 1.0), 100.0, 50),
    (dot_product.exponential(), 60.0, 40),
])
@pytest.mark.parametrize("projection, weights", [("rademacher", "real"), ("srht", "ctr")])
def test_allocation_is_finite_at_high_degree_and_large_norms(spec, squared_norm, order, projection, weights):
    x = _sample(60, 8, squared_norm, seed=2)
    phi = OptimizedMaclaurin(spec, 201, projection=projection, weights=weights, max_order=order, x_sample=x, seed=0)
    assert sum(phi.widths) == phi.total_width and min(phi.widths) >= 0
    assert math.isfinite(phi.objective) and phi.objective > 0
    objective = AllocationObjective(spec, x, order, projection, weights)
    values = [objective.degree_variance(n, w) for n in range(1, order + 1) for w in (1, 10, 100)]
    values += [objective.squared_bias(list(range(1, p + 1))) for p in range(1, order + 1)]
    assert all(math.isfinite(v) and v >= 0 for v in values)
    features = phi(x[:5])
    assert torch.isfinite(features).all() and torch.isfinite(phi.variance_correction(x[:5])).all()


def test_extreme_norms_keep_the_allocation_valid_beyond_float64_range():
    """‖x‖² = 1000 with p = 50 (Gaussian): g itself exceeds float64 only in absolute units; the search runs."""
    x = _sample(30, 4, 1000.0, seed=3)
    objective = AllocationObjective(dot_product.polynomial(50, 1.0), x, 50, "srht", "real")
    result = extended_allocation(objective, 1, 50, 300)
    assert sum(result.widths) == 300 and not math.isnan(result.objective)
    assert math.isfinite(objective.log_scale)
    gaussian = OptimizedMaclaurin(dot_product.gaussian(), 101, max_order=50, x_sample=x, seed=0, projection="rademacher",
                                 weights="real")
    assert sum(gaussian.widths) == 100 and math.isfinite(gaussian.objective)


def test_signed_log_helpers():
    g2 = torch.tensor([4.0, 0.0, 1.0, 1.0, 9.0], dtype=torch.float64)
    delta = torch.tensor([1e-12, 2.0, -3.0, -1.0, 0.0], dtype=torch.float64)
    log_c, sign = signed_log.power_gap(g2, delta, 3)
    c = sign * log_c.exp()
    expected = torch.tensor([3 * 16 * 1e-12, 8.0, -8.0 - 1.0, -1.0, 0.0], dtype=torch.float64)
    assert torch.allclose(c, expected, rtol=1e-9, atol=0)
    log_sum, sign_sum = signed_log.sum_exp(torch.tensor([800.0, 800.0, 799.0]), torch.tensor([1.0, -1.0, 1.0]))
    assert float(log_sum) == pytest.approx(799.0) and float(sign_sum) == 1.0
    assert signed_log.to_float(800.0) == math.inf
