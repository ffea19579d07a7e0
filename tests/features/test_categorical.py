"""CategoricalFeatures: unbiasedness and variance against the closed forms, the category hash, validation."""

import math

import pytest
import torch

from rfgp.features import CategoricalFeatures
from rfgp.features.categorical import categorical_kernel, categorical_variance, category_words

from .._cost import TensorsOfSize

F64 = torch.float64

# equal and unequal entries, integral and fractional floats, −0.0 vs 0.0, a large value
CATEGORIES = torch.tensor([
    [0.0, 1.0, 0.5],
    [-0.0, 1.0, 0.5],  # the same point as row 0
    [0.0, 2.0, 0.5],
    [1.0, 2.0, 3.0],
    [0.5, 1e10, -2.0],
    [1.0, 1.0, 0.5],
    [0.5, 2.0, 3.0],
], dtype=F64)
SHARES = torch.tensor([0.2, 0.5, 0.85], dtype=F64)  # c_i (ARD)


def group_estimates(phi: torch.Tensor, groups: int) -> torch.Tensor:
    """k̂ of ``groups`` independent width-F/groups estimators: the features are i.i.d. across f."""
    n, width = phi.shape
    parts = phi.reshape(n, groups, width // groups).transpose(0, 1)  # (R, n, F0)
    return parts @ parts.mT * groups


def test_mean_and_variance_match_the_closed_forms():
    groups, width = 4000, 8
    phi = CategoricalFeatures(groups * width, input_dim=3, seed=0)(CATEGORIES, SHARES.log())
    estimates = group_estimates(phi, groups)  # (R, n, n), each at width F0 = 8
    truth = categorical_kernel(CATEGORIES, CATEGORIES, SHARES)
    variance = categorical_variance(CATEGORIES, CATEGORIES, SHARES, width)
    mean = estimates.mean(0)
    standard_error = (variance / groups).sqrt()
    assert ((mean - truth).abs() <= 5 * standard_error + 1e-12).all(), ((mean - truth) / standard_error).abs().max()
    empirical = estimates.var(0)
    fourth = (estimates - mean).pow(4).mean(0)
    variance_se = ((fourth - empirical.pow(2)).clamp_min(0) / groups).sqrt()
    assert ((empirical - variance).abs() <= 5 * variance_se + 1e-12).all()
    # the closed form is not trivially satisfied: unequal pairs have a different variance than equal ones
    assert variance[0, 0] > 2 * variance[0, 3] > 0
    torch.testing.assert_close(truth[0], truth[1], rtol=0, atol=0)  # −0.0 is 0.0


def test_each_column_makes_two_n_by_f_float_passes():
    """Per categorical column the factor √c·ε + √(1 − c)·h is a choice between two rows (one n × F pass) and the
    product with the running features another; forming h = ±1 as floats and the two products took six
    (``MixedSingleTaskGP``'s converted tree evaluates the map twice per marginal-likelihood step)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.stack([torch.randint(0, k, (50,), generator=gen) for k in (3, 3, 2)], -1).double()
    features = CategoricalFeatures(64, seed=0)
    for per_feature, share in ((False, torch.rand(3, dtype=torch.float64)),
                               (True, torch.rand(3, 64, dtype=torch.float64))):
        with TensorsOfSize(50 * 64, torch.float64) as counter:
            features(x, share.log(), per_feature=per_feature)
        assert counter.count <= 2 * 3 + 1  # + the final division by √F


def test_shared_constant_share_is_the_ard_one_repeated():
    phi = CategoricalFeatures(64, input_dim=3, seed=1)
    shared = phi(CATEGORIES, torch.tensor([0.4], dtype=F64).log())
    repeated = phi(CATEGORIES, torch.full((3,), 0.4, dtype=F64).log())
    torch.testing.assert_close(shared, repeated, rtol=0, atol=0)


def test_hash_is_pairwise_independent_and_equal_for_equal_values():
    """E[h(a)h(b)] = 1[a = b] and E[h(a)] = 0: with c = 0 the features are the hashes themselves."""
    values = torch.tensor([[0.0], [-0.0], [1.0], [1.0 + 2**-52], [0.5], [2.0**32], [-1.0], [1e300]], dtype=F64)
    width = 20000
    hashes = CategoricalFeatures(width, input_dim=1, seed=2)(values, torch.tensor([-math.inf], dtype=F64))
    hashes = hashes * math.sqrt(width)
    assert set(hashes.unique().tolist()) == {-1.0, 1.0}
    products = hashes @ hashes.T / width
    expected = torch.eye(len(values), dtype=F64)
    expected[0, 1] = expected[1, 0] = 1.0  # −0.0 and 0.0 are one category
    assert (products - expected).abs().max() < 5 / math.sqrt(width)
    assert hashes.mean(-1).abs().max() < 5 / math.sqrt(width)


def test_same_category_hashes_alike_in_every_dtype():
    phi = CategoricalFeatures(256, input_dim=3, seed=3)
    integral = torch.tensor([[0, 1, 2], [7, -3, 2**40]])
    zero_shares = torch.full((3,), -math.inf)  # c = 0: the features are products of hash signs
    signs = {dtype: torch.sign(phi(integral.to(dtype), zero_shares.to(dtype))) for dtype in (torch.float32, F64)}
    torch.testing.assert_close(signs[torch.float32].to(F64), signs[F64], rtol=0, atol=0)
    for dtype in (torch.int64, torch.int32):
        if dtype == torch.int32:
            integral = integral[:1]
        from_ints = torch.sign(phi(integral.to(dtype), zero_shares.to(F64)))
        torch.testing.assert_close(from_ints, signs[F64][: len(integral)], rtol=0, atol=0)
    # and the features themselves agree up to float32 rounding
    x = CATEGORIES
    torch.testing.assert_close(phi(x.float(), SHARES.log().float()).double(), phi(x, SHARES.log()),
                               rtol=1e-5, atol=1e-6)


def test_category_words_split_the_float64_bits():
    lo, hi = category_words(torch.tensor([0.0, -0.0, 1.0, 0.5]))
    assert lo.dtype == hi.dtype == torch.int64 and (lo >= 0).all() and (hi >= 0).all() and (hi < 2**32).all()
    assert hi.tolist() == [0, 0, 0x3FF00000, 0x3FE00000] and lo.tolist() == [0, 0, 0, 0]


def test_no_gradient_in_x_and_gradient_in_the_share():
    log_share = SHARES.log().requires_grad_()
    x = CATEGORIES.clone().requires_grad_()
    phi = CategoricalFeatures(32, input_dim=3, seed=4)(x, log_share)
    grad_share, grad_x = torch.autograd.grad(phi.sum(), (log_share, x), allow_unused=True)
    assert torch.isfinite(grad_share).all() and grad_share.abs().sum() > 0
    assert grad_x is None  # piecewise constant in the categories, as BoTorch's kernel


def test_batched_shares_broadcast_with_the_inputs():
    phi = CategoricalFeatures(16, input_dim=3, seed=5)
    shares = torch.stack([SHARES, SHARES.flip(0)]).log()  # (2, 3): a batch of two kernels
    batched = phi(CATEGORIES, shares)
    assert batched.shape == (2, len(CATEGORIES), 16)
    torch.testing.assert_close(batched[1], phi(CATEGORIES, shares[1]), rtol=0, atol=0)


def test_state_dict_round_trip_is_bit_for_bit():
    phi = CategoricalFeatures(64, seed=6)
    before = phi(CATEGORIES, SHARES.log())  # draws made lazily at the first call
    state = phi.state_dict()
    assert state["hash_lo"].dtype == torch.int64 and state["signs"].dtype == torch.float32
    loaded = CategoricalFeatures(64, seed=99)
    loaded.load_state_dict(state)
    assert loaded.seed == 6 and loaded.input_dim == 3
    for name in ("signs", "hash_lo", "hash_hi", "hash_offset"):
        assert torch.equal(getattr(loaded, name), state[name])
    torch.testing.assert_close(loaded(CATEGORIES, SHARES.log()), before, rtol=0, atol=0)
    with pytest.raises(ValueError, match="num_features"):
        CategoricalFeatures(32).load_state_dict(state)


def test_doubled_map_keeps_integer_draws():
    phi = CategoricalFeatures(8, input_dim=2, seed=7).double()
    assert phi.signs.dtype == F64 and phi.hash_lo.dtype == torch.int64


@pytest.mark.parametrize("bad, error, match", [
    (torch.tensor([[float("nan"), 0.0, 1.0]], dtype=F64), ValueError, "NaN"),
    (torch.tensor([[True, False, True]]), TypeError, "categories"),
    (torch.zeros(3, dtype=F64), ValueError, "shape"),
    (torch.zeros(2, 2, dtype=F64), ValueError, "input_dim=3"),
    (torch.tensor([[2**60, 0, 1]]), ValueError, "2\\*\\*53"),
    # uint64 (no comparisons in torch to check it against 2⁵³): 2⁵³ and 2⁵³ + 1 had hashed alike
    (torch.tensor([[2**53, 2**53 + 1, 0]], dtype=torch.uint64), TypeError, "other than uint64"),
])
def test_bad_categories_raise(bad, error, match):
    with pytest.raises(error, match=match):
        CategoricalFeatures(8, input_dim=3, seed=0)(bad, SHARES.log())


@pytest.mark.parametrize("share, error, match", [
    (torch.tensor([0.1], dtype=F64), ValueError, "≤ 0"),
    (torch.zeros(2, dtype=F64), ValueError, "shape"),
    (torch.zeros(3, dtype=torch.float16), TypeError, "float32 or float64"),
    (0.5, TypeError, "float32 or float64 tensor"),
])
def test_bad_log_constant_share_raises(share, error, match):
    with pytest.raises(error, match=match):
        CategoricalFeatures(8, input_dim=3, seed=0)(CATEGORIES, share)
