"""PolynomialSketch: unbiasedness, Monte-Carlo variance = closed forms, TensorSRHT structure, state."""

import math

import pytest
import torch

import rfgp
from rfgp.features import PolynomialSketch, variance
from rfgp.features.degree_sketch import DegreeSketch

PROJECTIONS = ("rademacher", "gaussian", "srht", "countsketch", "hierarchical")
WEIGHTS = ("real", "complex", "ctr")


def _unit(v):
    return torch.nn.functional.normalize(v.double(), dim=-1)


def _pair(nonnegative: bool, d: int = 8, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(d, generator=g, dtype=torch.float64).abs()
    y = torch.randn(d, generator=g, dtype=torch.float64)
    return _unit(x), _unit(y.abs() if nonnegative else y)


def monte_carlo(phi: PolynomialSketch, xy: torch.Tensor, draws: int, seed: int = 0, chunk: int = 20000):
    """k̂(x, y) for ``draws`` independent draws of ``phi``, vectorised: the buffers get a leading draw axis.

    Returns the real estimate Φ(x)ᵀΦ(y) the feature output gives and, for complex weights, the
    complex estimate Φ_C(x)ᵀ conj Φ_C(y).
    """
    generator = torch.Generator().manual_seed(seed)
    sketch = phi.sketch()
    real, cplx = [], []
    for start in range(0, draws, chunk):
        for name, value in sketch.draw(generator, batch_shape=(min(chunk, draws - start),)).items():
            setattr(phi, name, value.to(xy.dtype) if value.is_floating_point() else value)
        f = phi(xy)
        real.append((f[..., 0, :] * f[..., 1, :]).sum(-1))
        if phi.is_complex:
            c = phi.complex_features(xy)
            cplx.append((c[..., 0, :] * c[..., 1, :].conj()).sum(-1))
    return torch.cat(real), (torch.cat(cplx) if cplx else None)


def z_score(samples: torch.Tensor, truth) -> float:
    return float((samples.mean() - truth) / (samples.std() / math.sqrt(samples.numel())))


# ------------------------------------------------------------------ unbiasedness
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_unbiased_every_projection_and_weights(projection, weights):
    x, y = _pair(nonnegative=False, d=5)
    xy = torch.stack((x, y))
    # width 10 > padded d = 8 (5 + offset coordinate): stacked TensorSRHT blocks
    for degree, width in ((1, 10), (2, 2), (3, 10)):
        phi = PolynomialSketch(degree, width, input_dim=5, offset=0.5, projection=projection, weights=weights, seed=1)
        real, cplx = monte_carlo(phi.double(), xy, draws=3000, seed=degree * 100 + width)
        truth = (x @ y + 0.5) ** degree
        assert abs(z_score(real, truth)) < 4, (degree, width)
        if cplx is not None:
            assert torch.allclose(cplx.real, real, atol=1e-12)  # [Re, Im] reproduces Re k̂ exactly
            assert abs(z_score(cplx.imag, 0.0)) < 4, (degree, width)


def test_complex_scale_is_one_over_sqrt_of_complex_count():
    """Paper 001 check 5: scaling by 1/√F instead of 1/√(F/2) would halve the kernel."""
    x, y = _pair(nonnegative=True)
    real, _ = monte_carlo(PolynomialSketch(2, 16, input_dim=8, weights="ctr", seed=0).double(), torch.stack((x, y)), 8000)
    assert abs(z_score(real, (x @ y) ** 2)) < 4
    assert abs(z_score(real, 0.5 * (x @ y) ** 2)) > 8


# ------------------------------------------------------ variance = closed form
def _slow_unless(case, fast_cases):
    return case if case in fast_cases else pytest.param(*case, marks=pytest.mark.slow)


_FAST_UNSTRUCTURED = {("rademacher", 1, "real", 4), ("rademacher", 3, "real", 1), ("rademacher", 3, "complex", 4),
                      ("rademacher", 4, "complex", 1), ("gaussian", 2, "real", 4), ("gaussian", 2, "complex", 1)}
UNSTRUCTURED = [_slow_unless((p, deg, w, D), _FAST_UNSTRUCTURED)
                for p, degrees in (("rademacher", (1, 2, 3, 4)), ("gaussian", (1, 2, 3)))
                for deg in degrees for w in ("real", "complex") for D in (1, 4)]


@pytest.mark.parametrize("projection,degree,weights,width", UNSTRUCTURED)
def test_unstructured_variance_matches_table_1(projection, degree, weights, width):
    x, y = _pair(nonnegative=False)
    xy = torch.stack((x, y))
    cplx = weights == "complex"
    phi = PolynomialSketch(degree, 2 * width if cplx else width, input_dim=8, projection=projection, weights=weights)
    real, complex_k = monte_carlo(phi.double(), xy, draws=50000, seed=degree)
    truth = (x @ y) ** degree
    errors = ((complex_k if cplx else real) - truth).abs() ** 2
    expected = variance.complex_estimator_variance(x, y, degree, width, projection, cplx)
    assert abs(z_score(errors, expected)) < 4
    if cplx:  # the real part the GPyTorch path uses: ½(V + P); the imaginary part ½(V − P)
        assert abs(z_score((real - truth) ** 2, variance.real_part_variance(x, y, degree, width, projection))) < 4
        pseudo = variance.complex_estimator_pseudo_variance(x, y, degree, width, projection, True)
        assert abs(z_score(complex_k.imag**2, 0.5 * (expected - pseudo))) < 4


_FAST_SRHT = {("tiled", "real", 3, 12), ("tiled", "complex", 3, 3), ("tiled", "complex", 2, 20),
              ("tiled", "real", 4, 20), ("independent", "real", 3, 20), ("independent", "complex", 2, 12)}
SRHT_CASES = [_slow_unless(("tiled", w, deg, D), _FAST_SRHT)
              for w in ("real", "complex") for deg in (1, 2, 3, 4) for D in (3, 12, 20)]
SRHT_CASES += [_slow_unless(("independent", w, deg, D), _FAST_SRHT)
               for w in ("real", "complex") for deg in (2, 3) for D in (12, 20)]


@pytest.mark.parametrize("blocks,weights,degree,width", SRHT_CASES)
def test_tensor_srht_variance_matches_closed_form(blocks, weights, degree, width):
    """Widths not multiples of d = 8 exercise c(D, d); a permutation shared across degrees fails this."""
    x, y = _pair(nonnegative=True)
    cplx = weights == "complex"
    phi = PolynomialSketch(
        degree, 2 * width if cplx else width, input_dim=8, projection="srht", weights=weights, srht_blocks=blocks
    )
    real, complex_k = monte_carlo(phi.double(), torch.stack((x, y)), draws=40000, seed=degree + width)
    truth = (x @ y) ** degree
    errors = ((complex_k if cplx else real) - truth).abs() ** 2
    expected = variance.complex_estimator_variance(x, y, degree, width, "srht", cplx, 8, blocks)
    assert abs(z_score(errors, expected)) < 4
    if cplx:
        ctr = variance.real_part_variance(x, y, degree, width, "srht", True, 8, blocks)
        assert abs(z_score((real - truth) ** 2, ctr)) < 4


def test_ctr_variance_below_real_at_equal_width_on_nonnegative_data():
    """Paper 001 Thm 4.1 (Rademacher) and its TensorSRHT analogue, as a Monte-Carlo test at F = 32."""
    x, y = _pair(nonnegative=True)
    xy = torch.stack((x, y))
    truth = (x @ y) ** 3
    for projection in ("rademacher", "srht"):
        errors = {}
        for weights in ("real", "ctr"):
            phi = PolynomialSketch(3, 32, input_dim=8, projection=projection, weights=weights).double()
            errors[weights] = (monte_carlo(phi, xy, draws=15000, seed=7)[0] - truth) ** 2
        se = math.sqrt(sum(e.var() / e.numel() for e in errors.values()))
        assert (errors["real"].mean() - errors["ctr"].mean()) / se > 4, projection


# --------------------------------------------------------- TensorSRHT structure
@pytest.mark.parametrize("blocks", ["tiled", "independent"])
@pytest.mark.parametrize("weights", ["real", "complex"])
def test_tensor_srht_degree_one_is_exact_for_multiples_of_d(blocks, weights):
    x, y = _pair(nonnegative=False, d=6)  # padded to d = 8
    xy = torch.stack((x, y))
    for width in (8, 16, 24):
        F = 2 * width if weights == "complex" else width
        phi = PolynomialSketch(1, F, input_dim=6, projection="srht", weights=weights, srht_blocks=blocks).double()
        real, cplx = monte_carlo(phi, xy, draws=200)
        k = cplx if cplx is not None else real
        assert torch.allclose(k, (x @ y).to(k.dtype).expand_as(k), rtol=1e-10, atol=1e-12)
    phi = PolynomialSketch(1, 12, input_dim=6, projection="srht", srht_blocks=blocks).double()
    assert monte_carlo(phi, xy, draws=200)[0].std() > 1e-3  # 1.5d: not exact


@pytest.mark.parametrize("blocks", ["tiled", "independent"])
@pytest.mark.parametrize("complex_weights", [False, True])
def test_tensor_srht_weights_are_unit_modulus_and_block_orthogonal(blocks, complex_weights):
    """Paper 000 check 6: per block and degree SᴴS = d I with unit-modulus entries (unnormalised H)."""
    d, width = 8, 20
    sketch = DegreeSketch(3, width, d, "srht", complex_weights, blocks)
    draws = sketch.draw(torch.Generator().manual_seed(3))
    block = torch.arange(width) // d
    same_block = block.unsqueeze(0) == block.unsqueeze(1)
    for i in range(3):
        w = sketch.project(torch.eye(d, dtype=torch.float64), i, draws.__getitem__)  # column l = w_{i,l}
        assert torch.allclose(w.abs(), torch.ones_like(w.abs()))
        gram = w.mT.conj() @ w
        index = draws["index"][i]
        if blocks == "tiled":  # one diagonal for all copies: orthogonal unless the Hadamard row repeats
            expected = d * (index.unsqueeze(0) == index.unsqueeze(1)).to(gram.dtype)
            assert torch.allclose(gram, expected, atol=1e-10)
        else:  # independent blocks: SᴴS = d I inside every block of d features
            expected = d * torch.eye(width, dtype=gram.dtype)
            assert torch.allclose(gram[same_block], expected[same_block], atol=1e-10)


def test_tensor_srht_permutations_are_independent_across_degrees():
    sketch = DegreeSketch(3, 24, 8, "srht", False)
    index = sketch.draw(torch.Generator().manual_seed(0))["index"]
    assert not torch.equal(index[0], index[1]) and not torch.equal(index[1], index[2])
    # tiled sampling: each Hadamard row appears ⌈D/d⌉ = 3 times per degree
    assert torch.equal(torch.bincount(index[0], minlength=8), torch.full((8,), 3))


# ------------------------------------------------------------- map behaviour
@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_state_dict_round_trip(projection, weights):
    x = torch.rand(6, 5, dtype=torch.float64)
    phi = PolynomialSketch(3, 16, input_dim=5, offset=1.0, projection=projection, weights=weights, seed=0).double()
    other = PolynomialSketch(3, 16, input_dim=5, offset=1.0, projection=projection, weights=weights, seed=99).double()
    assert not torch.equal(phi(x), other(x))
    other.load_state_dict(phi.state_dict())
    assert torch.equal(phi(x), other(x))


@pytest.mark.parametrize("weights", ["complex", "ctr"])
def test_gaussian_complex_weights_are_the_same_map_in_float32_and_float64(weights):
    """Drawn in float32 (exact in float64): a seed gives identical buffers in either dtype, CN(0, 1) entries."""
    single = PolynomialSketch(2, 4096, input_dim=8, projection="gaussian", weights=weights, seed=3)
    double = PolynomialSketch(2, 4096, input_dim=8, projection="gaussian", weights=weights, seed=3).double()
    double._materialize()  # re-draw with the float64 anchor
    pairs = single.weight_pairs
    assert pairs.dtype == torch.float32 and double.weight_pairs.dtype == torch.float64
    assert torch.equal(pairs.double(), double.weight_pairs)
    sq = pairs.double().square()  # Re² and Im² each have mean ½: E|w|² = 1
    assert abs(sq.mean() - 0.5) <= 4 * sq.std() / math.sqrt(sq.numel())
    x = torch.rand(5, 8, dtype=torch.float64)
    assert torch.allclose(single.double()(x), double(x), rtol=0, atol=0)


def test_lazy_input_dim_and_state_dict_into_fresh_map():
    x = torch.rand(4, 3)
    phi = PolynomialSketch(2, 8, projection="srht", seed=0)
    out = phi(x)
    fresh = PolynomialSketch(2, 8, projection="srht", seed=5)
    fresh.load_state_dict(phi.state_dict())
    assert torch.equal(fresh(x), out)


def test_dtype_and_device_follow_input(device, dtype):
    x = torch.rand(5, 4, dtype=dtype, device=device)
    for projection in PROJECTIONS:
        phi = PolynomialSketch(3, 12, input_dim=4, offset=1.0, projection=projection, weights="ctr", seed=0).to(device)
        out = phi(x)
        assert out.dtype == dtype and out.device == x.device and out.shape == (5, 12)


def test_tensor_offset_broadcasts_over_batch_and_carries_gradients():
    x = torch.rand(2, 5, 3, dtype=torch.float64)
    offset = torch.tensor([[0.5], [2.0]], dtype=torch.float64, requires_grad=True)
    phi = PolynomialSketch(2, 16, input_dim=3, offset=0.0, projection="srht", seed=0).double()
    out = phi(x, offset=offset)
    assert out.shape == (2, 5, 16)
    assert torch.allclose(out[1], phi(x[1], offset=2.0))
    out.pow(2).sum().backward()
    assert torch.isfinite(offset.grad).all() and (offset.grad != 0).all()


@pytest.mark.parametrize("bad", [-1.0, math.nan, math.inf])
def test_tensor_offset_outside_its_range_is_named(bad):
    """√ν of a negative or non-finite tensor offset made every feature NaN silently."""
    phi = PolynomialSketch(3, 16, input_dim=2, offset=1.0, seed=0)
    with pytest.raises(ValueError, match="offset must be finite and ≥ 0"):
        phi(torch.rand(4, 2), offset=torch.tensor([0.5, 1.0, bad, 2.0]))
    with rfgp.settings.validate_inputs(False):  # the value check is the one host read it skips
        assert phi(torch.rand(4, 2), offset=torch.tensor(bad)).shape == (4, 16)


def test_homogeneous_map_matches_padded_input():
    """Without an offset nothing is appended; zero-padding x does not change a dense sketch's law."""
    x = torch.rand(4, 3, dtype=torch.float64)
    phi = PolynomialSketch(2, 64, input_dim=3, seed=0).double()
    assert phi.sketch_dim == 3 and phi(x).shape == (4, 64)
    with pytest.raises(ValueError, match="homogeneous"):
        phi(x, offset=1.0)


def test_complex_features_shape_and_real_map_refuses():
    x = torch.rand(4, 3)
    phi = PolynomialSketch(2, 10, input_dim=3, weights="complex", seed=0)
    c = phi.complex_features(x)
    assert c.is_complex() and c.shape == (4, 5)
    assert torch.allclose(phi(x), torch.cat((c.real, c.imag), -1))
    with pytest.raises(ValueError, match="weights"):
        PolynomialSketch(2, 10, input_dim=3, seed=0).complex_features(x)
    assert all(not b.is_complex() for b in phi.buffers())


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(degree=0), ValueError, "degree"),
        (dict(degree=2.5), ValueError, "degree"),
        (dict(degree="3"), TypeError, "degree"),
        (dict(num_features=0), ValueError, "num_features"),
        (dict(num_features=7, weights="ctr"), ValueError, "even"),
        (dict(offset=-1.0), ValueError, "offset"),
        (dict(projection="fastfood"), ValueError, "projection"),
        (dict(weights="quaternion"), ValueError, "weights"),
        (dict(srht_blocks="shared"), ValueError, "srht_blocks"),
        # was silently ignored: the tree's SRHT nodes are tiled, the dense projections have no blocks
        (dict(srht_blocks="independent", projection="hierarchical"), ValueError, "needs projection='srht'"),
        (dict(srht_blocks="independent", projection="rademacher"), ValueError, "needs projection='srht'"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = dict(degree=2, num_features=8, input_dim=3)
    with pytest.raises(error, match=match):
        PolynomialSketch(**{**args, **kwargs})


def test_bad_inputs():
    phi = PolynomialSketch(2, 8, input_dim=3, seed=0)
    with pytest.raises(ValueError, match="input_dim=3"):
        phi(torch.rand(4, 5))
    with pytest.raises(TypeError, match="real"):
        phi(torch.rand(4, 3, dtype=torch.complex64))
    with pytest.raises(ValueError, match="NaN"):
        phi(torch.full((4, 3), float("nan")))


@pytest.mark.parametrize("projection", PROJECTIONS)
@pytest.mark.parametrize("weights", WEIGHTS)
def test_inputs_without_rows_give_features_without_rows(projection, weights):
    # CountSketch's FFT raised MKL's "DFTI ERROR: Inconsistent configuration" on (0, d) inputs
    phi = PolynomialSketch(2, 8, input_dim=3, projection=projection, weights=weights, seed=0).double()
    for shape in [(0, 3), (2, 0, 3)]:
        out = phi(torch.zeros(shape, dtype=torch.float64))
        assert out.shape == (*shape[:-1], 8) and out.dtype == torch.float64
