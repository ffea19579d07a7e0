"""The truncation order of the optimized Maclaurin map without a fixed p_max (``max_order=None``, opt-in).

In low dimension a degree-n sketch is exact with a few features, so extra width buys nothing and only a higher order
lowers the error; with the paper's p_max = 10 the 1-D Gaussian kernel kept its truncation error at every F.
"""

import math

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features import OptimizedMaclaurin, dot_product
from rfgp.features.maclaurin_allocation import (
    AUTO_MAX_ORDER,
    AllocationObjective,
    extended_allocation,
    incremental_allocation,
)
from rfgp.kernels import SketchedRBFKernel


def _inputs(n, d, seed=1):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _gram_error(kernel, x):
    with torch.no_grad():
        approx = kernel(x).to_dense()
    exact = torch.exp(-torch.cdist(x, x).pow(2) / 2)
    return float((approx - exact).norm() / exact.norm())


def test_one_dimensional_rbf_error_falls_with_the_order_instead_of_stalling_at_order_ten():
    """1-D standard-normal inputs, F = 2048: order 10 leaves a Gram error of 3.9·10⁻³ at every F (widths
    (2, …, 2, 1005)); the automatic order carries the kernel to round-off."""
    x = _inputs(120, 1)
    errors = {}
    for num_features in (256, 2048):
        kernel = SketchedRBFKernel(num_features, method="maclaurin", input_dim=1, seed=0, sample_size=120,
                                   max_order=None).double()
        kernel.lengthscale = 1.0
        errors[num_features] = _gram_error(kernel, x)
        feature_map = kernel.feature_map
        assert feature_map.order > 10
        assert sum(feature_map.widths) == feature_map.total_width
        assert all(width >= 1 for width in feature_map.widths)  # every degree ≤ p* with aₙ > 0 is sketched
    capped = SketchedRBFKernel(2048, method="maclaurin", input_dim=1, seed=0, sample_size=120).double()  # default 10
    capped.lengthscale = 1.0
    assert _gram_error(capped, x) > 1e-3
    assert errors[2048] < 1e-8 and errors[256] < 1e-8
    # the conversion passes the option on
    exact = gpytorch.kernels.RBFKernel().double()
    exact.lengthscale = 1.0
    converted = rfgp.sketch(exact, 2048, method="maclaurin", x_sample=x, seed=0, sample_size=120, max_order=None)
    assert converted.feature_map.order > 10 and _gram_error(converted, x) < 1e-8


@pytest.mark.parametrize("d", [1, 2, 3])
@pytest.mark.parametrize("projection, weights", [("srht", "ctr"), ("rademacher", "real")])
def test_automatic_search_finds_the_exhaustive_optimum(d, projection, weights):
    """The stop (variance term ≥ best g) loses nothing against the search over every order ≤ AUTO_MAX_ORDER.

    In 1-D the variances are zero up to the round-off of their closed forms (≈10⁻²⁶ of the objective's scale), so
    the two may differ there by 10⁻²⁰ of the scale (10⁻¹⁰ of the kernel values)."""
    objective = AllocationObjective(dot_product.gaussian(), _inputs(60, d, seed=d), AUTO_MAX_ORDER, projection, weights)
    round_off = 1e-20 * math.exp(objective.log_scale)
    for total in (20, 300):
        automatic = extended_allocation(objective, 1, None, total)
        exhaustive = extended_allocation(objective, 1, AUTO_MAX_ORDER, total)
        assert automatic.objective <= exhaustive.objective * (1 + 1e-9) + round_off
        assert sum(automatic.widths) == total and len(automatic.widths) == automatic.order


def test_high_dimension_keeps_the_order_of_the_paper_range():
    """d = 16, F = 513: the automatic search ends inside [1, 10] with the allocation the capped search gives."""
    x = _inputs(200, 16) / 4
    automatic = OptimizedMaclaurin(dot_product.gaussian(), 513, max_order=None, x_sample=x, seed=0)
    capped = OptimizedMaclaurin(dot_product.gaussian(), 513, max_order=10, x_sample=x, seed=0)
    assert automatic.order <= 10 and automatic.widths == capped.widths


def test_state_round_trip_of_an_automatic_order_and_a_saved_cap():
    x = _inputs(80, 1)
    phi = OptimizedMaclaurin(dot_product.gaussian(), 129, max_order=None, x_sample=x, seed=0).double()
    assert phi.order > 10
    other = OptimizedMaclaurin(dot_product.gaussian(), 129, max_order=None, input_dim=1, widths=(64,), seed=3).double()
    other.load_state_dict(phi.state_dict())
    assert other.widths == phi.widths and other.objective == phi.objective and other.max_order is None
    assert torch.equal(other(x), phi(x))
    # a state saved with a fixed cap (the default 10) keeps it in a map built with max_order=None
    capped = OptimizedMaclaurin(dot_product.gaussian(), 129, max_order=10, x_sample=x, seed=0).double()
    default = OptimizedMaclaurin(dot_product.gaussian(), 129, max_order=None, input_dim=1, widths=(64,), seed=3)
    default = default.double()
    default.load_state_dict(capped.state_dict())
    assert default.max_order == 10 and default.widths == capped.widths and torch.equal(default(x), capped(x))
    assert default.fit(x).order == 10
    # an automatic state does not load into a map with a fixed cap
    with pytest.raises(ValueError, match="max_order"):
        capped.load_state_dict(phi.state_dict())


def test_min_order_beyond_the_automatic_limit_names_the_argument():
    with pytest.raises(ValueError, match=f"min_order must be ≤ {AUTO_MAX_ORDER} with max_order=None, got 61"):
        OptimizedMaclaurin(dot_product.gaussian(), 129, min_order=61, max_order=None)


def test_automatic_search_stops_at_the_float64_resolution_in_one_dimension():
    """1-D, 400 standard-normal points, F = 2049: every variance is zero up to round-off, so the variance stop never
    fired and the search ran to order 59 for a squared bias far below what float64 resolves; it ends well below
    AUTO_MAX_ORDER now, with the Gram error still at round-off."""
    x = _inputs(400, 1)
    kernel = SketchedRBFKernel(2049, method="maclaurin", input_dim=1, seed=0, sample_size=400, max_order=None).double()
    kernel.lengthscale = 1.0
    feature_map = kernel.feature_map.fit(x)
    objective = AllocationObjective(dot_product.gaussian(), x, AUTO_MAX_ORDER, "srht", "ctr")
    result = extended_allocation(objective, 1, None, feature_map.total_width)
    assert 20 < result.order <= 45 and sum(result.widths) == feature_map.total_width
    assert feature_map.order == result.order and feature_map.widths == result.widths
    assert _gram_error(kernel, x[:150]) < 1e-8


@pytest.mark.parametrize("projection, weights", [("srht", "ctr"), ("srht", "real")])
def test_unresolvable_gains_go_to_the_cheapest_degree(projection, weights):
    """1-D TensorSRHT at order 20, 2048 features: the gains of degrees ≥ 9 are round-off (≈10⁻³⁷ of the scale) and had
    pulled ~1 500 features onto degrees 9–20, the costliest to compute; they go to degree 1 now."""
    objective = AllocationObjective(dot_product.gaussian(), _inputs(120, 1), AUTO_MAX_ORDER, projection, weights)
    widths = incremental_allocation(objective, 20, 2048)
    assert sum(widths) == 2048 and all(width >= 1 for width in widths)
    assert max(widths[1:]) <= 2 and widths[0] == 2048 - sum(widths[1:])


def test_gains_above_the_resolution_are_allocated_as_before():
    """d = 3: every gain is resolvable, the greedy allocation spreads the width over the degrees (sum = total)."""
    objective = AllocationObjective(dot_product.gaussian(), _inputs(100, 3), 10, "srht", "ctr")
    widths = incremental_allocation(objective, 6, 500)
    assert sum(widths) == 500 and widths[0] <= 4 and min(widths[1:4]) > 20


def test_kept_bias_residual_matches_a_fresh_computation():
    """The upward search extends the cached residual; any other degree set is computed afresh."""
    x = _inputs(50, 2)
    kept = AllocationObjective(dot_product.gaussian(), x, 20, "srht", "ctr")
    values = [kept.squared_bias(list(range(1, p + 1))) for p in range(1, 21)]
    values.append(kept.squared_bias([1, 3, 5]))
    values.append(kept.squared_bias(list(range(1, 8))))
    for index, included in enumerate([list(range(1, p + 1)) for p in range(1, 21)] + [[1, 3, 5], list(range(1, 8))]):
        fresh = AllocationObjective(dot_product.gaussian(), x, 20, "srht", "ctr")
        assert values[index] == pytest.approx(fresh.squared_bias(included), rel=1e-9, abs=1e-30)


def test_min_share_is_saved_and_a_state_of_another_min_share_is_refused():
    x = _inputs(60, 2)
    phi = OptimizedMaclaurin(dot_product.gaussian(), 65, x_sample=x, seed=0, min_share=1e-3).double()
    assert float(phi.state_dict()["config_min_share"]) == 1e-3
    same = OptimizedMaclaurin(dot_product.gaussian(), 65, input_dim=2, widths=(32,), seed=3, min_share=1e-3).double()
    same.load_state_dict(phi.state_dict())
    assert same.widths == phi.widths and torch.equal(same(x), phi(x))
    other = OptimizedMaclaurin(dot_product.gaussian(), 65, input_dim=2, widths=(32,), seed=3, min_share=0.5).double()
    with pytest.raises(ValueError, match=r"min_share is 0\.001 in the state dict but 0\.5 in this module"):
        other.load_state_dict(phi.state_dict())
    assert other.min_share == 0.5 and other.widths == (32,)  # refused before anything changed
    # a state saved before min_share was saved (no config_min_share) still loads
    older = {key: value for key, value in phi.state_dict().items() if key != "config_min_share"}
    other.load_state_dict(older)
    assert other.widths == phi.widths and other.min_share == 0.5
