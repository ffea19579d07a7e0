"""Generator-based draws: Haar orthogonal matrices, Gamma, χ, Rademacher (moments within 4 SE)."""

import math

import pytest
import torch

from rfgp.features import random

from .._oracles import mean_and_se


def within(mc, se, truth, k=4.0):
    return abs(mc - truth) <= k * se


@pytest.mark.parametrize("d", [2, 4, 8])
def test_haar_orthogonal_is_orthogonal_and_haar(d):
    n = 20000
    q = random.haar_orthogonal(n, d, torch.Generator().manual_seed(d))
    assert q.shape == (n, d, d) and q.dtype == torch.float64
    eye = torch.eye(d, dtype=torch.float64)
    torch.testing.assert_close(q @ q.mT, eye.expand(n, d, d), rtol=0, atol=1e-12)
    # Haar moments: E[Q₁₁] = 0, E[Q₁₁²] = 1/d, E[tr Q] = 0.  Raw LAPACK QR (no sign fix)
    # gives E[Q₁₁] ≈ −0.29 and E[tr Q] ≈ −1.6 at d = 8 (notes, check 10).
    q11 = q[:, 0, 0]
    assert within(*mean_and_se(q11), 0.0)
    assert within(*mean_and_se(q11**2), 1.0 / d)
    assert within(*mean_and_se(torch.diagonal(q, dim1=-2, dim2=-1).sum(-1)), 0.0)
    # Every entry, not just Q₁₁, is centred with second moment 1/d.
    entries = q.reshape(n, d * d)
    means, ses = entries.mean(0), entries.std(0) / math.sqrt(n)
    assert bool(((means.abs()) <= 4.5 * ses).all())


def test_haar_orthogonal_is_seeded():
    a = random.haar_orthogonal(3, 5, torch.Generator().manual_seed(7))
    b = random.haar_orthogonal(3, 5, torch.Generator().manual_seed(7))
    c = random.haar_orthogonal(3, 5, torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


@pytest.mark.parametrize("concentration", [0.3, 0.5, 1.0, 1.5, 2.5, 7.0])
def test_gamma_mean_and_variance(concentration):
    n = 200_000
    x = random.gamma((n,), concentration, torch.Generator().manual_seed(3))
    assert x.shape == (n,) and x.dtype == torch.float64 and bool((x > 0).all())
    a = concentration
    assert within(*mean_and_se(x), a)
    # Var of (X − a)² for Gamma(a, 1): μ₄ − σ⁴ = (3a² + 6a) − a².
    sq = (x - a) ** 2
    assert within(sq.mean().item(), math.sqrt((2 * a**2 + 6 * a) / n), a)
    # Third central moment 2a distinguishes Gamma from other laws with the same mean and variance.
    cube = (x - a) ** 3
    assert within(*mean_and_se(cube), 2 * a)


def test_gamma_shape_and_rejects_bad_concentration():
    x = random.gamma((4, 5), 2.0, torch.Generator().manual_seed(0))
    assert x.shape == (4, 5)
    for bad in (0.0, -1.0):
        with pytest.raises(ValueError, match="concentration"):
            random.gamma((3,), bad, torch.Generator())


@pytest.mark.parametrize("concentration", [0.3, 2.5])
def test_log_gamma_is_the_log_of_the_same_gamma_draws(concentration):
    x = random.gamma((4, 5), concentration, torch.Generator().manual_seed(1))
    log_x = random.log_gamma((4, 5), concentration, torch.Generator().manual_seed(1))
    assert log_x.shape == (4, 5)
    torch.testing.assert_close(log_x, x.log(), rtol=1e-12, atol=1e-12)


def test_log_gamma_stays_finite_where_the_draws_underflow():
    # Gamma(a) = Gamma(a + 1)·U^{1/a}: at a = 0.001 a U below 0.5 already gives U^{1000} < 1e-301
    n = 20_000
    log_x = random.log_gamma((n,), 0.001, torch.Generator().manual_seed(2))
    assert bool(torch.isfinite(log_x).all()) and bool((log_x.exp() == 0).any())
    # a·log X → −Exp(1) in law as a → 0 (log X ≈ log U/a): mean −1, SE 1/√n
    assert within(*mean_and_se(0.001 * log_x), -1.0)


@pytest.mark.parametrize("dof", [1, 3, 16])
def test_chi_moments(dof):
    n = 100_000
    x = random.chi((n,), dof, torch.Generator().manual_seed(dof))
    assert bool((x >= 0).all())
    mean = math.sqrt(2) * math.exp(math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2))
    assert within(*mean_and_se(x), mean)
    assert within(*mean_and_se(x**2), float(dof))


def test_rademacher_values_and_mean():
    x = random.rademacher((100_000,), torch.Generator().manual_seed(0))
    assert set(x.unique().tolist()) == {-1.0, 1.0}
    assert within(*mean_and_se(x), 0.0)


def test_normal_is_standard():
    x = random.normal((100_000,), torch.Generator().manual_seed(0))
    assert within(*mean_and_se(x), 0.0)
    assert within(*mean_and_se(x**2), 1.0)


def test_normal_single_is_standard_float32_and_exact_in_float64():
    x = random.normal_single((100_000,), torch.Generator().manual_seed(0))
    assert x.dtype == torch.float32
    assert within(*mean_and_se(x.double()), 0.0)
    assert within(*mean_and_se(x.double() ** 2), 1.0)
    again = random.normal_single((100_000,), torch.Generator().manual_seed(0))
    assert torch.equal(x, again)
