"""rfgp.datasets: argument checks and reproducibility under seeds."""

import datetime
import warnings

import pytest
import torch

from rfgp.datasets import helmholtz_field, igrf_field_at, igrf_magnetic_field, mauna_loa_co2


@pytest.mark.parametrize("input_dim", [2, 3])
def test_helmholtz_field_is_one_data_set_in_both_dtypes(input_dim):
    """float32 drew the layout, the points and the noise from a different random stream than float64, so
    comparing float32 with float64 training meant comparing two different data sets."""
    single = helmholtz_field(30, input_dim=input_dim, noise=0.1, seed=3, dtype=torch.float32)
    double = helmholtz_field(30, input_dim=input_dim, noise=0.1, seed=3, dtype=torch.float64)
    for key in ("x", "y", "curl_free", "divergence_free"):
        torch.testing.assert_close(single[key], double[key].float(), rtol=1e-5, atol=1e-5)
    again = helmholtz_field(30, input_dim=input_dim, noise=0.1, seed=3, dtype=torch.float32)
    assert torch.equal(single["y"], again["y"])


@pytest.mark.parametrize("seed", [1.5, None, True, "0"])
@pytest.mark.parametrize("make", [lambda seed: helmholtz_field(5, seed=seed),
                                  lambda seed: igrf_magnetic_field(5, seed=seed)])
def test_dataset_seeds_are_checked_by_name(make, seed):
    """torch's manual_seed raised 'manual_seed expected a long, but got float', naming no argument."""
    with pytest.raises(TypeError, match="seed must be an int"):
        make(seed)


def test_dataset_seed_beyond_64_bits_is_refused_by_name():
    with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*63, 2\*\*63\)"):
        helmholtz_field(5, seed=2**64)


@pytest.mark.parametrize("dtype", [torch.float16, torch.int64, "float64"])
def test_mauna_loa_co2_refuses_unsupported_dtypes(dtype):
    """int64 returned the years truncated to whole years (and ppm to integers), float16 rounded them, silently."""
    pytest.importorskip("statsmodels")
    with pytest.raises(TypeError, match="dtype must be torch.float32 or torch.float64"):
        mauna_loa_co2(dtype=dtype)


def test_mauna_loa_co2_split_and_missing_months():
    pytest.importorskip("statsmodels")
    data = mauna_loa_co2(holdout_years=1.0)
    x = torch.cat((data["train_x"], data["test_x"])).squeeze(-1)
    assert x.numel() == 521 and data["test_x"].shape == (12, 1)  # 526 months, 5 without a measurement
    assert bool((torch.diff(x) > 0).all()) and data["train_x"].max() < data["test_x"].min()
    single = mauna_loa_co2(holdout_years=1.0, dtype=torch.float32)
    assert single["test_x"].shape == (12, 1) and single["train_y"].dtype == torch.float32
    with pytest.raises(ValueError, match="holdout_years=44.0 leaves no training"):
        mauna_loa_co2(holdout_years=44.0)


def test_igrf_refuses_timezone_aware_dates_by_name():
    """Comparing an aware date with the model's naive epochs raised "can't compare offset-naive and
    offset-aware datetimes", naming no argument."""
    pytest.importorskip("ppigrf")
    aware = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)
    with pytest.raises(ValueError, match="date must be a naive datetime"):
        igrf_magnetic_field(5, date=aware)
    naive = aware.astimezone(datetime.timezone.utc).replace(tzinfo=None)
    assert torch.isfinite(igrf_magnetic_field(5, date=naive)[1]).all()


def test_igrf_field_on_and_near_the_polar_axis_is_the_limit_of_its_neighbours():
    """Before: NaN, silently, at the north pole and within 1e-8 Earth radii of the axis above it (arccos(z / r)
    rounded the colatitude to 0, where ppigrf divides by sin θ); a float32 input also came back in float64."""
    pytest.importorskip("ppigrf")
    offsets = 1e-4 * torch.tensor([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0], [0.0, -1.0]], dtype=torch.float64)
    for height in (1.0, -1.0, 1.1, -1.05):
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # ppigrf's "invalid value encountered in divide" of the NaN it gave
            on_axis = igrf_field_at(torch.tensor([[0.0, 0.0, height], [0.0, 0.5, height]], dtype=torch.float64))[:1]
        around = torch.cat((offsets, torch.full((4, 1), height, dtype=torch.float64)), -1)
        limit = igrf_field_at(around).mean(0, keepdim=True)  # the mean of the 4 neighbours: O(offset²) off the axis
        torch.testing.assert_close(on_axis, limit, rtol=1e-6, atol=1e-6 * limit.norm().item())
    near = igrf_field_at(torch.tensor([[1e-9, 0.0, 1.0], [0.0, 1e-12, -1.0]], dtype=torch.float64))
    assert torch.isfinite(near).all()
    assert igrf_field_at(torch.tensor([[0.0, 0.0, 1.0]])).dtype == torch.float32


def test_igrf_field_refuses_positions_that_require_grad():
    """Before: positions that required grad gave a field detached from them (ppigrf evaluates in NumPy), so a loss
    mixing it with differentiable terms got a silent zero from it in its gradient; now a ValueError naming them."""
    pytest.importorskip("ppigrf")
    positions = torch.tensor([[0.3, -0.4, 1.0]], dtype=torch.float64, requires_grad=True)
    with pytest.raises(ValueError, match="positions require grad, but igrf_field_at is not differentiable"):
        igrf_field_at(positions)
    with torch.no_grad():
        under_no_grad = igrf_field_at(positions)
    torch.testing.assert_close(under_no_grad, igrf_field_at(positions.detach()), rtol=0, atol=0)


@pytest.mark.parametrize("input_dim", [2, 3])
def test_helmholtz_field_parts_are_differentiable_and_curl_or_divergence_free(input_dim):
    """Before: the field's parts were detached from x, so rfgp's own autograd checks (jacobian, curl, divergence)
    refused them; now they are differentiable, the curl-free part has a symmetric Jacobian and the divergence-free
    part zero divergence, to round-off."""
    from rfgp.applications.vector_fields import jacobian

    data = helmholtz_field(20, input_dim=input_dim, seed=4)
    x = data["x"]
    curl_free = jacobian(lambda z: data["field"](z)[0], x)
    div_free = jacobian(lambda z: data["field"](z)[1], x)
    assert curl_free.abs().max() > 0.1 and div_free.abs().max() > 0.1
    assert (curl_free - curl_free.mT).abs().max() < 1e-12
    assert div_free.diagonal(dim1=-2, dim2=-1).sum(-1).abs().max() < 1e-12
    assert (div_free - div_free.mT).abs().max() > 0.1  # a rotational field, not a second gradient
    with torch.no_grad():  # unchanged values without a gradient
        torch.testing.assert_close(data["field"](x)[0], data["curl_free"], rtol=0, atol=0)
