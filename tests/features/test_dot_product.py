"""Dot-product kernel specifications: closed-form coefficients, exact evaluation, bad input."""

import math

import pytest
import torch

from rfgp.features import OptimizedMaclaurin, dot_product


def test_polynomial_coefficients_are_binomial_and_finite():
    spec = dot_product.polynomial(4, 0.5)
    expected = [math.comb(4, n) * 0.5 ** (4 - n) for n in range(5)] + [0.0, 0.0]
    assert torch.allclose(spec.coefficients(6), torch.tensor(expected, dtype=torch.float64), rtol=1e-14)
    assert spec.coefficients(3)[:4].tolist() == pytest.approx(expected[:4], rel=1e-14)
    homogeneous = dot_product.polynomial(3, 0.0).coefficients(4)
    assert homogeneous.tolist() == [0.0, 0.0, 0.0, 1.0, 0.0]


def test_exponential_and_gaussian_coefficients_are_inverse_factorials():
    for spec in (dot_product.exponential(), dot_product.gaussian()):
        expected = torch.tensor([1 / math.factorial(n) for n in range(25)], dtype=torch.float64)
        assert torch.allclose(spec.coefficients(24), expected, rtol=1e-13)


@pytest.mark.parametrize(
    "spec, exact",
    [
        (dot_product.polynomial(3, 0.7), lambda x, y: (x @ y.T + 0.7) ** 3),
        (dot_product.exponential(), lambda x, y: torch.exp(x @ y.T)),
        (dot_product.gaussian(), lambda x, y: torch.exp(-0.5 * torch.cdist(x, y) ** 2)),
    ],
)
def test_exact_evaluation_matches_closed_form_and_series(spec, exact):
    x, y = 0.5 * torch.randn(6, 4, dtype=torch.float64), 0.5 * torch.randn(5, 4, dtype=torch.float64)
    assert torch.allclose(spec(x, y), exact(x, y), rtol=1e-12)
    assert torch.allclose(spec.diag(x), exact(x, x).diagonal(), rtol=1e-12)
    prefactor = (spec.log_prefactor(x)[:, None] + spec.log_prefactor(y)[None, :]).exp()
    series = prefactor * dot_product.truncated_series(spec, x @ y.T, 40)
    assert torch.allclose(series, exact(x, y), rtol=1e-12)


def test_gaussian_gram_is_formed_in_log_space_at_large_norms():
    """e^{−‖x‖²/2} underflows and e^{xᵀy} overflows for ‖x‖² = 1600; k = e^{−‖x − y‖²/2} is still exact."""
    x = torch.tensor([[40.0, 0.0], [39.9, 0.5], [0.0, 40.0]], dtype=torch.float64)
    spec = dot_product.gaussian()
    assert torch.allclose(spec(x, x), torch.exp(-0.5 * torch.cdist(x, x) ** 2), rtol=1e-10)
    assert torch.equal(spec.diag(x), torch.ones(3, dtype=torch.float64))
    log_abs, sign = dot_product.polynomial(3, 1.0).log_gram(-x, x)
    assert torch.allclose(sign * log_abs.exp(), (1 - x @ x.T) ** 3, rtol=1e-12)  # signs of odd powers


def test_degree_terms_are_stable_for_large_arguments():
    t = torch.tensor([-60.0, 0.0, 60.0], dtype=torch.float64)
    terms = dot_product.degree_terms(dot_product.exponential(), t, 200)
    assert torch.isfinite(terms).all()
    assert terms[1, 0] == 1 and (terms[1, 1:] == 0).all()  # 0⁰ = 1
    assert torch.allclose(terms[2].sum(), torch.exp(t[2]), rtol=1e-12)


def test_user_coefficients_finite_and_infinite():
    spec = dot_product.from_coefficients(lambda n: [1.0, 2.0, 0.0, 3.0][n], max_degree=3)
    t = torch.tensor([0.3, -0.2], dtype=torch.float64)
    assert torch.allclose(spec.function(t), 1 + 2 * t + 3 * t**3)
    cosh = dot_product.from_coefficients(lambda n: 0.0 if n % 2 else 1 / math.factorial(n), torch.cosh)
    assert torch.allclose(dot_product.truncated_series(cosh, t, 30), torch.cosh(t), rtol=1e-13)


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="power"):
        dot_product.polynomial(0)
    with pytest.raises(ValueError, match="offset"):
        dot_product.polynomial(2, -1.0)
    with pytest.raises(TypeError, match="coefficient must be a callable"):
        dot_product.from_coefficients(3.0)
    with pytest.raises(ValueError, match="needs its exact function"):
        dot_product.from_coefficients(lambda n: 1.0)
    with pytest.raises(ValueError, match=r"must be finite and ≥ 0.*a_0 = -1.0"):
        dot_product.from_coefficients(lambda n: -1.0, max_degree=2).coefficients(2)


@pytest.mark.parametrize("value", [math.inf, math.nan])
def test_non_finite_user_coefficient_is_named(value):
    """a₂ = inf had log aₙ = inf, which the allocation read as aₙ = 0 (``has_degree`` tests finiteness): degree 2
    got no feature and the map approximated another kernel, silently."""
    spec = dot_product.from_coefficients(lambda n: value if n == 2 else 1 / math.factorial(n), torch.exp)
    with pytest.raises(ValueError, match=r"must be finite.*a_2 = (inf|nan)"):
        spec.log_coefficients(3)
    phi = OptimizedMaclaurin(spec, 33, max_order=4, seed=0)
    with pytest.raises(ValueError, match=r"a_2 = (inf|nan)"):
        phi(torch.randn(20, 3, dtype=torch.float64))
