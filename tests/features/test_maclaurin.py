"""Maclaurin features: MC moments vs closed forms, allocation (Algorithms 2–3), bias correction, state."""

import itertools
import math

import pytest
import torch

from rfgp.features import OptimizedMaclaurin, RandomMaclaurin, dot_product, variance
from rfgp.features.degree_sketch import srht_padded_dim
from rfgp.features.maclaurin_allocation import AllocationObjective, incremental_allocation
from tests._oracles import mean_and_se, variance_and_se


def _pair(d=8):
    x = torch.nn.functional.normalize(torch.randn(d, dtype=torch.float64).abs(), dim=0) * 0.9
    y = torch.nn.functional.normalize(torch.randn(d, dtype=torch.float64).abs(), dim=0) * 0.8
    return x, y


def _redraws(phi, x, y, draws):
    """k̂(x, y) over independent redraws of the map (the widths stay fixed)."""
    generator = torch.Generator().manual_seed(1)
    values = []
    for _ in range(draws):
        phi.resample(generator)
        features = phi(torch.stack((x, y)))
        values.append(features[0] @ features[1])
    return torch.stack(values)


@pytest.mark.parametrize("projection, weights", [("rademacher", "real"), ("srht", "ctr"), ("gaussian", "complex")])
def test_fixed_allocation_mean_and_variance_match_closed_forms(projection, weights):
    """E k̂ = s(x)s(y)Σ_{Dₙ>0} aₙGⁿ and V k̂ = s(x)²s(y)² Σ aₙ² Vₙ(Dₙ) (notes check 14); degree 2 is skipped."""
    x, y = _pair()
    widths = (3, 0, 4)
    complex_weights = weights != "real"
    budget = 1 + (2 if complex_weights else 1) * sum(widths)
    phi = OptimizedMaclaurin(dot_product.gaussian(), budget, input_dim=8, projection=projection, weights=weights,
                             widths=widths, seed=0).double()
    samples = _redraws(phi, x, y, 2500)
    g = float(x @ y)
    prefactor = math.exp(-0.5 * float(x @ x + y @ y))
    mean = prefactor * (1 + g + g**3 / 6)
    estimate, se = mean_and_se(samples)
    assert abs(estimate - mean) <= 4 * se
    assert abs(estimate - math.exp(-0.5 * float((x - y) @ (x - y)))) > 4 * se  # the truncation bias is visible
    padded = srht_padded_dim(8)
    per_degree = {"real": variance.complex_estimator_variance, "ctr": variance.real_part_variance,
                  "complex": variance.real_part_variance}[weights]
    theory = sum(
        a**2 * float(per_degree(x, y, n, width, projection, complex_weights, padded, "tiled"))
        for n, width, a in ((1, 3, 1.0), (3, 4, 1 / 6))
    ) * prefactor**2
    var, var_se = variance_and_se(samples)
    assert abs(var - theory) <= 4 * var_se


def test_random_maclaurin_is_unbiased_for_the_polynomial_kernel():
    """Degrees drawn from μ(n) ∝ 2^{−(n+1)} on {1..p} plus the constant: E k̂ = (ν + xᵀy)^p (notes check 15)."""
    x, y = _pair()
    y = y * torch.tensor([1, -1] * 4, dtype=torch.float64)
    spec = dot_product.polynomial(3, 0.5)
    phi = RandomMaclaurin(spec, 9, input_dim=8, seed=0).double()
    samples = _redraws(phi, x, y, 6000)
    estimate, se = mean_and_se(samples)
    assert abs(estimate - (0.5 + float(x @ y)) ** 3) <= 4 * se
    assert torch.allclose(phi.expected_diag(x[None]), spec.diag(x[None]))


def test_one_dimensional_toy_selects_order_nine_with_one_feature_each():
    """Paper 000 §5.6 / notes check 16: d = 1, Rademacher, D = 10 with the constant → p* = 9, D₁..₉ = 1."""
    x = torch.linspace(-1.5, 1.5, 40, dtype=torch.float64).unsqueeze(-1) / 0.7
    phi = OptimizedMaclaurin(dot_product.gaussian(), 10, max_order=15, x_sample=x, seed=0, projection="rademacher", weights="real").double()
    assert phi.order == 9 and phi.widths == (1,) * 9
    features = phi(x)
    expected = torch.exp(-0.5 * (x**2 + x.T**2)) * dot_product.truncated_series(dot_product.gaussian(), x @ x.T, 9)
    assert torch.allclose(features @ features.T, expected, rtol=1e-12, atol=1e-14)  # deterministic in d = 1


@pytest.mark.parametrize("projection, weights", [("rademacher", "real"), ("srht", "real"), ("srht", "ctr")])
def test_objective_matches_its_monte_carlo_estimate(projection, weights):
    """g(p*, D*) = mean_{i≠j} E(k̂ − k)² over redraws (notes check 13)."""
    x = torch.randn(40, 8, dtype=torch.float64)
    x = (x - x.mean(0)) / torch.cdist(x, x).median()
    budget = 1 + (2 if weights != "real" else 1) * 24
    phi = OptimizedMaclaurin(dot_product.gaussian(), budget, projection=projection, weights=weights,
                             max_order=6, x_sample=x, seed=0).double()
    exact = dot_product.gaussian()(x, x)
    off = ~torch.eye(40, dtype=torch.bool)
    generator = torch.Generator().manual_seed(3)
    errors = []
    for _ in range(300):
        phi.resample(generator)
        features = phi(x)
        errors.append((features @ features.T - exact)[off].pow(2).mean())
    estimate, se = mean_and_se(torch.stack(errors))
    assert abs(estimate - phi.objective) <= 4 * se + 1e-3 * phi.objective


def test_srht_surrogate_caps_degree_one_at_the_input_dimension():
    """Appendix C: the surrogate is 0 for n = 1, D ≥ d, so D₁ ≤ d; with 3d features D₁ = d (notes check 12)."""
    x = torch.randn(60, 8, dtype=torch.float64)
    x = (x - x.mean(0)) / torch.cdist(x, x).median()
    # p ≥ 2: with p = 1 every feature must go to degree 1 (Algorithm 3 may legitimately pick it)
    for budget in (9, 17, 25, 41):
        phi = OptimizedMaclaurin(dot_product.gaussian(), budget, projection="srht", min_order=2, x_sample=x, seed=0)
        assert phi.widths[0] <= 8 and phi.order >= 2
    assert OptimizedMaclaurin(dot_product.gaussian(), 25, projection="srht", min_order=2, x_sample=x,
                              seed=0).widths[0] == 8
    rademacher = OptimizedMaclaurin(dot_product.gaussian(), 25, min_order=2, x_sample=x, seed=0, projection="rademacher", weights="real")
    assert rademacher.widths[0] > 8  # without the surrogate degree 1 keeps taking features


def test_incremental_allocation_equals_brute_force():
    """Algorithm 2 is optimal for unstructured sketches: compare with all compositions (notes check 11)."""
    x = 0.8 * torch.randn(30, 5, dtype=torch.float64)
    objective = AllocationObjective(dot_product.exponential(), x, 3, "rademacher", "real")
    for total in (3, 5, 9):
        greedy = incremental_allocation(objective, 3, total)
        assert sum(greedy) == total and min(greedy) >= 1
        best = min(
            (w for w in itertools.product(range(1, total + 1), repeat=3) if sum(w) == total),
            key=lambda w: sum(objective.degree_variance(n, w[n - 1]) for n in (1, 2, 3)),
        )
        value = lambda w: sum(objective.degree_variance(n, w[n - 1]) for n in (1, 2, 3))  # noqa: E731
        assert value(greedy) <= value(best) * (1 + 1e-12)
    homogeneous = AllocationObjective(dot_product.polynomial(2, 0.0), x, 3, "rademacher", "real")
    assert incremental_allocation(homogeneous, 3, 6) == (0, 6, 0)  # aₙ = 0 gets nothing


def test_gaussian_bias_vanishes_as_the_order_grows():
    """E[Φ(x)ᵀΦ(y)] → exp(−‖x − y‖²/2): |bias| < 1e-6 at p* = 15 for ‖x‖, ‖y‖ ≤ 1 (notes check 18)."""
    x, y = _pair()
    k = math.exp(-0.5 * float((x - y) @ (x - y)))
    biases = []
    for order in (3, 6, 9, 15):
        phi = OptimizedMaclaurin(dot_product.gaussian(), 1 + order, input_dim=8, widths=(1,) * order, seed=0, projection="rademacher", weights="real")
        prefactor = math.exp(-0.5 * float(x @ x + y @ y))
        mean = prefactor * float(dot_product.truncated_series(phi.kernel, x @ y, order))
        biases.append(abs(k - mean))
        assert float(phi.variance_correction(x[None].double())) >= 0
    assert biases == sorted(biases, reverse=True) and biases[-1] < 1e-6


def test_gaussian_correction_is_the_incomplete_gamma_and_the_direct_sum():
    """k(x,x) − E k̂(x,x) = P(p*+1, ‖x‖²) = 1 − e^{−t}Σ_{n≤p*}tⁿ/n! (notes check 17)."""
    t = torch.tensor([0.25, 1.0, 5.0, 30.0, 100.0], dtype=torch.float64)
    x = torch.stack((t.sqrt(), torch.zeros_like(t)), dim=-1)
    phi = OptimizedMaclaurin(dot_product.gaussian(), 10, input_dim=2, widths=(1,) * 9, seed=0, projection="rademacher", weights="real").double()
    correction = phi.variance_correction(x)
    direct = 1 - torch.exp(-t) * sum(t**n / math.factorial(n) for n in range(10))
    assert torch.allclose(correction, torch.special.gammainc(torch.tensor(10.0, dtype=torch.float64), t), rtol=1e-12)
    assert torch.allclose(correction[:3], direct[:3], rtol=1e-9)
    assert correction[1] == pytest.approx(1.1e-7, rel=0.05) and correction[2] == pytest.approx(3.2e-2, rel=0.05)
    assert correction[-1] > 0.999999
    gap = OptimizedMaclaurin(dot_product.gaussian(), 10, input_dim=2, widths=(2, 0, 7), seed=0, projection="rademacher", weights="real").double()
    expected_gap = 1 - torch.exp(-t) * (1 + t + t**3 / 6)  # the omitted degree 2 is part of the correction
    assert torch.allclose(gap.variance_correction(x)[:3], expected_gap[:3], rtol=1e-10)


def test_general_correction_sums_the_omitted_terms():
    spec = dot_product.polynomial(4, 1.0)
    phi = OptimizedMaclaurin(spec, 8, input_dim=3, widths=(3, 0, 4), seed=0, projection="rademacher", weights="real").double()
    x = torch.randn(5, 3, dtype=torch.float64)
    t = x.pow(2).sum(-1)
    assert torch.allclose(phi.variance_correction(x), 6 * t**2 + t**4, rtol=1e-12)


def test_state_dict_round_trip_restores_order_widths_and_draws():
    x = torch.randn(50, 4, dtype=torch.float64) * 0.5
    phi = OptimizedMaclaurin(dot_product.gaussian(), 21, projection="srht", weights="ctr", x_sample=x, seed=0).double()
    other = OptimizedMaclaurin(dot_product.gaussian(), 21, projection="srht", weights="ctr", widths=(10,), input_dim=4,
                               seed=5).double()
    other.load_state_dict(phi.state_dict())
    assert other.widths == phi.widths and other.order == phi.order and other.objective == phi.objective
    assert torch.equal(other(x), phi(x))
    random = RandomMaclaurin(dot_product.polynomial(3), 20, input_dim=4, seed=0)
    copy = RandomMaclaurin(dot_product.polynomial(3), 20, input_dim=4, seed=9)
    copy.load_state_dict(random.state_dict())
    assert copy.widths == random.widths and torch.equal(copy(x.float()), random(x.float()))


def test_fit_recomputes_and_follows_dtype(dtype):
    x = torch.randn(30, 3, dtype=dtype)
    phi = OptimizedMaclaurin(dot_product.gaussian(), 11, seed=0, projection="rademacher", weights="real").to(dtype)
    out = phi(x)  # allocated on the first inputs
    assert out.dtype == dtype and out.shape == (30, 11) and sum(phi.widths) == 10
    first = phi.widths
    phi.fit(x * 5)
    assert phi.widths != first


def test_bad_input_names_the_argument():
    spec = dot_product.gaussian()
    with pytest.raises(ValueError, match="projection must be one of"):
        OptimizedMaclaurin(spec, 10, projection="countsketch")
    with pytest.raises(ValueError, match=r"widths must .* D_total=9, got \(1, 2\)"):
        OptimizedMaclaurin(spec, 10, widths=(1, 2), projection="rademacher", weights="real")
    with pytest.raises(ValueError, match="max_order must be ≥ min_order"):
        OptimizedMaclaurin(spec, 10, min_order=4, max_order=2)
    with pytest.raises(TypeError, match="kernel must be"):
        OptimizedMaclaurin("gaussian", 10)
    with pytest.raises(ValueError, match="x_sample must be a tensor"):
        OptimizedMaclaurin(spec, 10).fit(torch.randn(1, 3))
    with pytest.raises(ValueError, match="leaves no feature"):
        OptimizedMaclaurin(spec, 2, weights="ctr")
    with pytest.raises(ValueError, match="no truncation order"):
        OptimizedMaclaurin(dot_product.polynomial(3), 3, min_order=3, x_sample=torch.randn(5, 2))


@pytest.mark.parametrize("cls", [OptimizedMaclaurin, RandomMaclaurin])
def test_device_and_dtype_follow_the_input(cls, device, dtype):
    x = 0.5 * torch.randn(12, 5, dtype=torch.float64)
    options = dict(projection="srht", weights="ctr", seed=0)
    reference = cls(dot_product.gaussian(), 21, input_dim=5, **options).double()
    if cls is OptimizedMaclaurin:
        reference.fit(x)
    phi = cls(dot_product.gaussian(), 21, input_dim=5, **options)
    phi.load_state_dict(reference.state_dict())
    phi = phi.to(device=device, dtype=dtype)
    out = phi(x.to(device, dtype))
    assert out.device.type == device.type and out.dtype == dtype
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    assert torch.allclose(out.cpu().double(), reference(x), atol=tolerance, rtol=tolerance)
    correction = phi.variance_correction(x.to(device, dtype))
    assert correction.device.type == device.type
    assert torch.allclose(correction.cpu().double(), reference.variance_correction(x), atol=tolerance)


def test_features_follow_a_replaced_polynomial_offset_at_the_same_order():
    """fit(x, kernel=polynomial(3, 4.0)) at an unchanged order kept √aₙ of the first offset (ν = 1) in the features
    (cached per order on the map) while expected_diag used the new one: Φ's constant column stayed 1 instead of 8."""
    x = torch.rand(10, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    phi = OptimizedMaclaurin(dot_product.polynomial(3, 1.0), 41, input_dim=3, widths=(5, 5, 10), min_order=3,
                             max_order=3, seed=0).double()
    phi(x)
    phi.fit(x, kernel=dot_product.polynomial(3, 4.0))
    fresh = OptimizedMaclaurin(dot_product.polynomial(3, 4.0), 41, input_dim=3, widths=phi.widths, min_order=3,
                               max_order=3, seed=0).double()
    torch.testing.assert_close(phi(x), fresh(x), rtol=0, atol=0)


def test_first_call_under_torch_compile_allocates_without_recompiling():
    """The allocation (Algorithms 2–3) and the draws of an optimized Maclaurin map's first call are host-side Python:
    traced by TorchDynamo they recompiled at every candidate order (guards on ``len(self._cache)`` of the pair
    statistics, on the degree) and at every degree's draw.  They now run untraced (twice: a second compiled fit reuses
    the frame), and give the map an uncompiled build gives."""
    import torch._dynamo

    x = torch.randn(30, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    phi, reference = (OptimizedMaclaurin(dot_product.gaussian(), 33, max_order=5, seed=0) for _ in range(2))
    torch._dynamo.reset()
    try:
        with torch._dynamo.config.patch(error_on_recompile=True):
            torch.compile(phi.prepare, backend="eager")(x)
            torch.compile(phi.fit, backend="eager")(0.5 * x)
    finally:
        torch._dynamo.reset()
    reference.prepare(x)
    reference.fit(0.5 * x)
    assert phi.widths == reference.widths and len(set(phi.widths)) > 1
    for name, value in reference.state_dict().items():
        assert torch.equal(phi.state_dict()[name], value), name


def test_random_maclaurin_degrees_and_sketches_are_independent():
    """Over seeds, k̂ is unbiased for (ν + xᵀy)^p with Gaussian projections too (Eq. 43 needs the degree draw and
    the sketches independent).  The sketches were drawn from a second generator of the map's seed, i.e. from the
    random numbers that had chosen the degrees: z ≈ −4.6 at this size (mean 0.06 where k = 0.15 at 6·10⁴ seeds)."""
    x = torch.tensor([0.8, 0.5], dtype=torch.float64)
    y = torch.tensor([0.6, -0.9], dtype=torch.float64)
    spec = dot_product.polynomial(3, 0.5)
    phi = RandomMaclaurin(spec, 3, input_dim=2, seed=0, projection="gaussian", weights="real").double()
    samples = []
    for seed in range(8000):
        phi.seed = seed
        phi._materialize()
        features = phi(torch.stack((x, y)))
        samples.append(features[0] @ features[1])
    estimate, se = mean_and_se(torch.stack(samples))
    assert abs(estimate - (0.5 + float(x @ y)) ** 3) <= 4 * se


def test_refused_refit_keeps_the_target_kernel_and_the_features():
    """``fit(x, kernel=...)`` refused by ``min_share`` left the new target on the map with the old widths: its
    features (√aₙ of the target) became those of another kernel, silently, although the error said nothing
    changed."""
    x = torch.nn.functional.normalize(torch.randn(30, 3, generator=torch.Generator().manual_seed(0),
                                                  dtype=torch.float64), dim=-1)
    spec = dot_product.polynomial(3, 1.0)
    phi = OptimizedMaclaurin(spec, 41, max_order=2, min_share=0.5, seed=0, x_sample=x)
    features, widths = phi(x), phi.widths
    with pytest.raises(ValueError, match="min_share"):
        phi.fit(x, kernel=dot_product.polynomial(3, 0.01))
    assert phi.kernel is spec and phi.widths == widths
    assert torch.equal(phi(x), features)
