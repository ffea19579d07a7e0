"""Spherical Random Features: Ω_d, the fitted radial density, the feature map and its state."""

import math

import mpmath
import pytest
import scipy.special
import torch

from rfgp.core.config_state import draw_key
from rfgp.features.radial_density import RadialDensity, clear_memory_cache, fit_radial_density
from rfgp.features.sphere_characteristic import sphere_characteristic
from rfgp.features.spherical import SphericalRandomFeatures

F64 = torch.float64

# Stated fit tolerances: max over τ ∈ [0, 2] of |K̂(τ) − (1 − τ²/a²)^p|.  The best non-negative
# radial density cannot do better by much — k is not positive definite on ℝ^d — and the worst
# case is small p with a = 2 at large d (measured: 0.045 at p = 3, d = 1024).
FIT_TOLERANCE = {3: 0.05, 7: 0.02, 10: 0.015, 20: 0.01}
DEFAULT_FITS = [(2.0, 3, 8), (4.0, 7, 64), (2.0, 10, 64), (2.0, 20, 1024)]
ALL_FITS = [(a, p, d) for a in (2.0, 4.0) for p in (3, 7, 10, 20) for d in (8, 64, 1024)]


def sphere_points(num, dim, seed=0, dtype=F64):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(num, dim, generator=g, dtype=dtype), dim=-1)


def pairs_at_distances(dim, taus, seed=0):
    """A unit vector x and unit vectors y with ‖x − y‖ = τ for each τ."""
    x, v = sphere_points(2, dim, seed)
    v = torch.nn.functional.normalize(v - (v @ x) * x, dim=0)
    angle = 2 * torch.asin(taus / 2)
    return x.unsqueeze(0), torch.cos(angle)[:, None] * x + torch.sin(angle)[:, None] * v


# ------------------------------------------------------------------------- Ω_d
def test_sphere_characteristic_closed_forms():
    z = torch.linspace(0, 300, 3001, dtype=F64)
    j0 = torch.from_numpy(scipy.special.j0(z.numpy()))  # torch.special.bessel_j0 is only ~1e-7 accurate
    assert torch.allclose(sphere_characteristic(z, 2), j0, atol=1e-12)
    sinc = torch.where(z == 0, torch.ones_like(z), torch.sin(z) / z)
    assert torch.allclose(sphere_characteristic(z, 3), sinc, atol=1e-5)  # d = 3: kinked weight, slower


@pytest.mark.parametrize("dim", [8, 64, 1024])
def test_sphere_characteristic_matches_hypergeometric(dim):
    z = torch.tensor([0.0, 0.5, 5.0, 20.0, 40.0, 80.0, 200.0, 600.0], dtype=F64)
    reference = torch.tensor([float(mpmath.hyp0f1(dim / 2, -(float(v) ** 2) / 4)) for v in z], dtype=F64)
    assert torch.allclose(sphere_characteristic(z, dim), reference, atol=1e-12, rtol=0)


def test_sphere_characteristic_follows_dtype():
    z = torch.linspace(0, 10, 11, dtype=torch.float32)
    assert sphere_characteristic(z, 16).dtype == torch.float32


# -------------------------------------------------------------------- the fit
def _check_fit(a, power, dim):
    density = fit_radial_density(a, power, dim)
    tau = torch.rand(3000, generator=torch.Generator().manual_seed(1), dtype=F64) * 2  # not the fit grid
    error = (density.kernel(tau) - density.target(tau)).abs().max()
    assert error <= FIT_TOLERANCE[power]
    assert density.max_error <= FIT_TOLERANCE[power]
    assert abs(float(error) - density.max_error) < 0.1 * density.max_error + 1e-6  # reported error is real
    assert bool((density.weights >= 0).all())
    assert math.isclose(float(density.kernel(torch.zeros(1, dtype=F64))), density.mass, rel_tol=1e-10)


@pytest.mark.parametrize("a,power,dim", DEFAULT_FITS)
def test_fit_within_tolerance(a, power, dim):
    _check_fit(a, power, dim)


@pytest.mark.slow
@pytest.mark.parametrize("a,power,dim", ALL_FITS)
def test_fit_within_tolerance_full_grid(a, power, dim):
    _check_fit(a, power, dim)


def test_fit_is_reproducible_and_disk_cached(tmp_path):
    clear_memory_cache()
    first = fit_radial_density(2.0, 7, 16, cache_dir=tmp_path)
    assert len(list(tmp_path.glob("srf_a2_p7_d16_v*.pt"))) == 1
    clear_memory_cache()
    refit = fit_radial_density(2.0, 7, 16)  # fresh computation
    clear_memory_cache()
    loaded = fit_radial_density(2.0, 7, 16, cache_dir=tmp_path)
    assert torch.equal(first.weights, refit.weights) and first.spacing == refit.spacing
    assert torch.equal(first.weights, loaded.weights) and loaded.max_error == first.max_error
    assert fit_radial_density(2.0, 7, 16) is loaded  # memory cache


def test_inverse_cdf_sampling_matches_density():
    density = fit_radial_density(2.0, 20, 8)  # a spread-out density (many active hats)
    r = torch.linspace(0, density.support, 40001, dtype=F64)
    mu = torch.from_numpy(
        __import__("numpy").interp(r.numpy(), (torch.arange(density.weights.numel() + 1) * density.spacing).numpy(),
                                   torch.cat((density.weights, torch.zeros(1, dtype=F64))).numpy())
    )
    samples = density.sample(200_000, torch.Generator().manual_seed(0))
    for k in (1, 2):
        exact = torch.trapezoid(mu * r**k, r) / density.mass
        se = samples.pow(k).std() / math.sqrt(samples.numel())
        assert abs(samples.pow(k).mean() - exact) <= 4 * se
    median = samples.median()
    assert abs(torch.trapezoid(mu * (r <= median), r) / density.mass - 0.5) < 0.005


# --------------------------------------------------------------- feature map
def _per_block_estimates(sampler, dim, power, taus, blocks=512, seed=1):
    """Kernel estimates at width F = 2d from ``blocks`` independent blocks of d frequencies each."""
    phi = SphericalRandomFeatures(2 * blocks * dim, power=power, input_dim=dim, direction_sampler=sampler, seed=seed)
    phi = phi.double()
    x, ys = pairs_at_distances(dim, taus)
    cosines = torch.cos(phi.project(ys) - phi.project(x))
    return phi, cosines.reshape(len(taus), blocks, dim).mean(-1) * phi.density.mass


@pytest.mark.parametrize("sampler", ["iid", "structured"])
def test_monte_carlo_mean_is_the_fitted_kernel(sampler):
    taus = torch.tensor([0.3, 0.7, 1.0, 1.4, 1.8], dtype=F64)
    phi, estimates = _per_block_estimates(sampler, 64, 3, taus)
    mean, se = estimates.mean(-1), estimates.std(-1) / math.sqrt(estimates.shape[-1])
    fitted, target = phi.fitted_kernel(taus), phi.target_kernel(taus)
    assert bool(((mean - fitted).abs() <= 4 * se).all())
    # The fitted kernel, not the target: the MC mean separates the two at several distances.
    assert int(((mean - target).abs() > 4 * se).sum()) >= 3


def test_feature_inner_products_are_the_estimates():
    taus = torch.tensor([0.5, 1.2], dtype=F64)
    phi = SphericalRandomFeatures(64, power=7, input_dim=16, seed=3).double()
    x, ys = pairs_at_distances(16, taus)
    direct = phi(ys) @ phi(x).mT
    via_projection = torch.cos(phi.project(ys) - phi.project(x)).mean(-1, keepdim=True) * phi.density.mass
    assert torch.allclose(direct, via_projection, atol=1e-12)


def test_orthogonal_directions_reduce_variance_at_equal_width():
    taus = torch.tensor([0.3, 0.7, 1.0], dtype=F64)
    _, iid = _per_block_estimates("iid", 64, 7, taus)
    _, structured = _per_block_estimates("structured", 64, 7, taus)
    # relative SE of each variance estimate ≈ √(2/512) ≈ 6%: a 0.7 margin is ≥ 5 SE
    assert bool((structured.var(-1) < 0.7 * iid.var(-1)).all())


def test_complex_features_are_eq60():
    phi = SphericalRandomFeatures(32, power=3, input_dim=8, direction_sampler="structured", seed=0).double()
    x = sphere_points(5, 8)
    complex_phi = phi.complex_features(x)
    assert complex_phi.shape == (5, 16) and complex_phi.is_complex()
    expected = torch.exp(1j * phi.project(x)) * math.sqrt(phi.density.mass / 16)
    assert torch.allclose(complex_phi, expected, atol=1e-12)
    assert torch.allclose((complex_phi @ complex_phi.conj().mT).real, phi(x) @ phi(x).mT, atol=1e-12)


def test_structured_frequencies_are_orthogonal_within_a_block():
    phi = SphericalRandomFeatures(2 * 16, power=3, input_dim=16, direction_sampler="structured", seed=0).double()
    directions = phi.project(torch.eye(16, dtype=F64)).mT / phi.radii.unsqueeze(-1)
    assert torch.allclose(directions @ directions.mT, torch.eye(16, dtype=F64), atol=1e-12)


def test_diagonal_hooks():
    phi = SphericalRandomFeatures(64, power=3, input_dim=8, seed=0).double()
    x = sphere_points(4, 8)
    assert phi.has_variance_bias
    assert torch.allclose(phi.expected_diag(x), (phi(x) ** 2).sum(-1), atol=1e-12)
    assert torch.allclose(phi.expected_diag(x), torch.full((4,), phi.density.mass, dtype=F64))
    assert torch.equal(phi.target_diag(x), torch.ones(4, dtype=F64))


def test_float32_matches_float64(device):
    phi = SphericalRandomFeatures(256, power=7, input_dim=64, seed=0).to(device)
    x = sphere_points(6, 64).to(device)
    out32 = phi(x.float())
    assert out32.dtype == torch.float32 and out32.device.type == device.type
    assert torch.allclose(out32.double(), phi.double()(x), atol=1e-4)


@pytest.mark.parametrize("sampler", ["iid", "structured"])
def test_state_dict_round_trip_with_density(sampler):
    phi = SphericalRandomFeatures(64, power=7, a=4.0, input_dim=12, direction_sampler=sampler, seed=0).double()
    fresh = SphericalRandomFeatures(64, power=7, a=4.0, direction_sampler=sampler, seed=1).double()
    fresh.load_state_dict(phi.state_dict())
    x = sphere_points(5, 12)
    assert torch.equal(fresh(x), phi(x))
    assert torch.equal(fresh.density.weights, phi.density.weights)
    tau = torch.linspace(0, 2, 7, dtype=F64)
    assert torch.equal(fresh.fitted_kernel(tau), phi.fitted_kernel(tau))
    assert fresh.max_fit_error == phi.max_fit_error


def test_draw_key_holds_the_density_version_and_still_sees_a_new_density():
    """The prediction caches' draw check keyed the density by its 96 weights, read into a tuple at every prediction;
    the key now holds a version bumped when the density is replaced, and a load of the same density keeps it."""
    phi = SphericalRandomFeatures(64, power=7, a=4.0, input_dim=12, seed=0).double()
    key = draw_key(phi)
    weights_entry = dict(key)["density_weights"]
    assert weights_entry[0] == "density version"  # not (shape, the 96 weights)
    same = SphericalRandomFeatures(64, power=7, a=4.0, input_dim=12, seed=0).double()
    phi.load_state_dict(same.state_dict())  # the same density and draws: the key stays
    assert draw_key(phi) == key
    state = same.state_dict()
    state["config_density_weights"] = state["config_density_weights"] * 1.5
    phi.load_state_dict(state)  # another density: the key changes
    assert draw_key(phi) != key and torch.equal(phi.density.weights, state["config_density_weights"])
    moved = draw_key(phi)
    phi.density = RadialDensity.from_state(phi.density.state())  # replaced, even by equal values: a new version
    assert draw_key(phi) != moved


def test_state_dict_of_another_kernel_is_refused():
    phi = SphericalRandomFeatures(64, power=7, input_dim=8, seed=0)
    other = SphericalRandomFeatures(64, power=3, input_dim=8, seed=0)
    with pytest.raises(ValueError, match="power is 7 in the state dict but 3"):
        other.load_state_dict(phi.state_dict())


# ---------------------------------------------------------------- bad input
def test_non_unit_inputs_raise_unless_normalisation_is_requested():
    phi = SphericalRandomFeatures(32, power=3, input_dim=8, seed=0).double()
    x = sphere_points(4, 8)
    with pytest.raises(ValueError, match="unit sphere"):
        phi(2 * x)
    normalising = SphericalRandomFeatures(32, power=3, input_dim=8, normalize_inputs=True, seed=0).double()
    assert torch.allclose(normalising(3 * x), phi(x), atol=1e-12)
    with pytest.raises(ValueError, match="all-zero row"):
        normalising(torch.zeros(2, 8, dtype=F64))


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        ({"power": 0}, ValueError, "power"),
        ({"power": 2.5}, TypeError, "power"),
        ({"power": 3, "a": 1.5}, ValueError, "a must be"),
        ({"power": 3, "a": float("inf")}, ValueError, "a must be"),
        ({"power": 3, "direction_sampler": "haar"}, ValueError, "direction_sampler"),
        ({"power": 3, "input_dim": 1}, ValueError, "input_dim"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        SphericalRandomFeatures(32, **kwargs)


def test_odd_width_is_refused():
    with pytest.raises(ValueError, match="even"):
        SphericalRandomFeatures(33, power=3)


def test_radial_density_state_round_trip():
    density = fit_radial_density(4.0, 3, 8)
    copy = RadialDensity.from_state(density.state())
    tau = torch.linspace(0, 2, 5, dtype=F64)
    assert torch.equal(copy.kernel(tau), density.kernel(tau))


def test_disk_cache_keeps_values_of_a_apart(tmp_path):
    # f"{a:g}" named both fits srf_a2_p2_d3: the second call loaded the fit of a = 2.0000001 for a = 2.0000004.
    clear_memory_cache()
    fit_radial_density(2.0000001, 2, 3, cache_dir=tmp_path)
    clear_memory_cache()
    second = fit_radial_density(2.0000004, 2, 3, cache_dir=tmp_path)
    assert second.a == 2.0000004
    assert len(list(tmp_path.glob("srf_*.pt"))) == 2
    clear_memory_cache()


def test_disk_cache_refuses_a_file_fitted_for_other_parameters(tmp_path):
    clear_memory_cache()
    fit_radial_density(2.0, 2, 3, cache_dir=tmp_path)
    (saved,) = tmp_path.glob("srf_a2_p2_d3_v*.pt")
    saved.rename(tmp_path / saved.name.replace("srf_a2_", "srf_a3_"))
    clear_memory_cache()
    with pytest.raises(ValueError, match="a=2.0, power=2, dim=3, not the requested a=3.0"):
        fit_radial_density(3.0, 2, 3, cache_dir=tmp_path)
    clear_memory_cache()
