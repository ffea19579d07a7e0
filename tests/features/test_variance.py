"""Closed-form variances: regression values of the notes, identities, expected_error."""

import math

import pytest
import torch

from rfgp.features import PolynomialSketch, variance

# Paper 000 §5 pair (d = 4): G = 2/3, N = 1, S = 0.1155555556.
X4 = torch.nn.functional.normalize(torch.tensor([1.0, 2.0, 3.0, 4.0], dtype=torch.float64), dim=0)
Y4 = torch.nn.functional.normalize(torch.tensor([4.0, 3.0, 2.0, 1.0], dtype=torch.float64), dim=0)

TABLE = {  # n: (RealRad, CompRad, RealGauss, CompGauss, Cov_real, Cov_comp), D = 1
    1: (1.2133333333, 0.8844444444, 1.4444444444, 1.0000000000, -0.4044444444, -0.2948148148),
    2: (2.5506962963, 1.5684148148, 3.3703703704, 1.8888888889, -0.1959308642, -0.1751418381),
    3: (4.4681584198, 2.2589540960, 6.6515775034, 2.9259259259, -0.0877274952, -0.0844414335),
}
SRHT_TABLE = [  # (n, D, real, complex), paper 000 Algorithm 1 sampling (c(D, d))
    (1, 3, 0.1348148148, 0.0982716049),
    (1, 4, 0.0, 0.0),
    (1, 6, 0.0449382716, 0.0327572016),
    (2, 3, 0.7196115226, 0.4060437128),
    (2, 4, 0.4907259259, 0.2607473251),
    (2, 6, 0.3489207133, 0.1932917543),
    (2, 8, 0.2453629630, 0.1303736626),
]


@pytest.mark.parametrize("n", [1, 2, 3])
def test_table_1_reference_values(n):
    rr, cr, rg, cg, cov_r, cov_c = TABLE[n]
    v = variance.complex_estimator_variance
    assert v(X4, Y4, n, 1, "rademacher", False).item() == pytest.approx(rr, abs=1e-9)
    assert v(X4, Y4, n, 1, "rademacher", True).item() == pytest.approx(cr, abs=1e-9)
    assert v(X4, Y4, n, 1, "gaussian", False).item() == pytest.approx(rg, abs=1e-9)
    assert v(X4, Y4, n, 1, "gaussian", True).item() == pytest.approx(cg, abs=1e-9)
    stats = variance.pair_statistics(X4, Y4)
    for q, expected in ((1.0, cov_r), (0.5, cov_c)):
        v1 = variance.single_feature_variance(stats, 1, 1.0, q)
        assert variance.srht_covariance(stats, n, v1, 3).item() == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("n,D,real,cplx", SRHT_TABLE)
def test_tensor_srht_reference_values(n, D, real, cplx):
    v = variance.complex_estimator_variance
    assert v(X4, Y4, n, D, "srht", False, 4, "independent").item() == pytest.approx(real, abs=1e-9)
    assert v(X4, Y4, n, D, "srht", True, 4, "independent").item() == pytest.approx(cplx, abs=1e-9)


def test_tiled_and_independent_sampling_agree_up_to_d_and_differ_beyond():
    v = variance.complex_estimator_variance
    for D in (1, 3, 4):
        assert torch.allclose(v(X4, Y4, 3, D, "srht", False, 4, "tiled"), v(X4, Y4, 3, D, "srht", False, 4, "independent"))
    assert not torch.allclose(v(X4, Y4, 3, 6, "srht", False, 4, "tiled"), v(X4, Y4, 3, 6, "srht", False, 4, "independent"))
    # paper 001: p = 1 and D = kd gives zero variance for the tiled sampling too
    assert v(X4, Y4, 1, 8, "srht", True, 4, "tiled").item() == pytest.approx(0.0, abs=1e-12)


def test_block_pair_count():
    assert [variance.block_pair_count(D, 8) for D in (3, 8, 12, 20)] == [6, 56, 68, 124]


@pytest.mark.parametrize("n", [1, 2, 3, 5])
def test_d2_toy(n):
    """x = y = (1/√2, 1/√2), d = 2 (paper 000 Fig. 12 setting)."""
    x = torch.full((2,), math.sqrt(0.5), dtype=torch.float64)
    v = variance.complex_estimator_variance
    assert v(x, x, n, 1, "rademacher", False).item() == pytest.approx(2**n - 1)
    assert v(x, x, n, 1, "rademacher", True).item() == pytest.approx(1.5**n - 1)
    assert v(x, x, n, 1, "gaussian", False).item() == pytest.approx(3**n - 1)
    assert v(x, x, n, 1, "gaussian", True).item() == pytest.approx(2**n - 1)
    stats = variance.pair_statistics(x, x)
    for q, expected in ((1.0, -1.0), (0.5, 0.5**n - 1)):
        v1 = variance.single_feature_variance(stats, 1, 1.0, q)
        assert variance.srht_covariance(stats, n, v1, 1).item() == pytest.approx(expected)


@pytest.mark.parametrize("p", [1, 2, 3, 4, 5])
def test_ctr_gain_over_real_gaussian_equals_theorem_4_2(p):
    """V_R(2D) − V_CtR(D) = (1/2D) Σ_{k<p} C(p,k)(2^k − 1) c^{2k} N^{p−k} for any x, y (paper 001 Thm 4.2)."""
    g = torch.Generator().manual_seed(p)
    x, y = torch.randn(2, 6, generator=g, dtype=torch.float64)
    D = 5
    real = variance.complex_estimator_variance(x, y, p, 2 * D, "gaussian", False)
    ctr = variance.real_part_variance(x, y, p, D, "gaussian")
    c, N = x @ y, x.pow(2).sum() * y.pow(2).sum()
    gap = sum(math.comb(p, k) * (2**k - 1) * c ** (2 * k) * N ** (p - k) for k in range(p)) / (2 * D)
    assert (real - ctr).item() == pytest.approx(gap.item(), rel=1e-10, abs=1e-12)


def test_vectorised_float64_and_clamped():
    x = torch.rand(7, 5, 8, dtype=torch.float32)
    y = torch.rand(7, 5, 8, dtype=torch.float32)
    out = variance.sketch_variance(x, y, 3, 16, "srht", "ctr")
    assert out.shape == (7, 5) and out.dtype == torch.float64
    single = variance.sketch_variance(x[2, 3], y[2, 3], 3, 16, "srht", "ctr")
    assert out[2, 3] == pytest.approx(single.item())
    # p = 1, D = d: exactly zero in exact arithmetic; rounding must not make it negative
    u = torch.nn.functional.normalize(torch.rand(50, 8, dtype=torch.float64), dim=-1)
    assert (variance.sketch_variance(u, u.flip(0), 1, 8, "srht") >= 0).all()


def test_expected_error_matches_monte_carlo_frobenius():
    """E over draws of mean_{i≠j}(k̂ − k)² equals the closed form averaged over pairs."""
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.rand(12, 6, generator=g, dtype=torch.float64), dim=-1)
    spec = dict(degree=3, num_features=20, projection="srht", weights="ctr", offset=1.0)
    predicted = variance.expected_error(x, spec)["sketch"]
    exact = (x @ x.T + 1.0) ** 3
    off = ~torch.eye(12, dtype=torch.bool)
    errors = []
    for seed in range(400):
        phi = PolynomialSketch(input_dim=6, seed=seed, **spec).double()
        f = phi(x)
        errors.append(((f @ f.T - exact)[off] ** 2).mean())
    errors = torch.stack(errors)
    assert abs(errors.mean() - predicted) < 4 * errors.std() / math.sqrt(errors.numel())


def test_expected_error_orders_methods_and_accepts_maps():
    x = torch.nn.functional.normalize(torch.rand(40, 8, dtype=torch.float64), dim=-1)  # non-negative
    specs = {
        "real": dict(degree=3, num_features=32, projection="rademacher"),
        "ctr": dict(degree=3, num_features=32, projection="rademacher", weights="ctr"),
        "srht ctr": PolynomialSketch(3, 32, projection="srht", weights="ctr"),
    }
    errors = variance.expected_error(x, specs)
    assert set(errors) == set(specs)
    assert errors["ctr"] < errors["real"]


@pytest.mark.parametrize(
    "sketches,error,match",
    [
        (dict(degree=3, num_features=8, projection="countsketch"), ValueError, "closed-form"),
        (dict(degree=0, num_features=8), ValueError, "degree"),
        ({"a": 3}, TypeError, "PolynomialSketch"),
    ],
)
def test_expected_error_bad_input(sketches, error, match):
    with pytest.raises(error, match=match):
        variance.expected_error(torch.rand(5, 3), sketches)
    with pytest.raises(ValueError, match="x_sample"):
        variance.expected_error(torch.rand(5), dict(degree=2, num_features=4))
