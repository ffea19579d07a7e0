"""Landmark selection for Nyström features: seeded, valid rows of x, the selectors' defining properties."""

import pytest
import torch

from rfgp.features.landmarks import (
    approximate_ridge_leverage_scores,
    kmeanspp_landmarks,
    ridge_leverage_landmarks,
    select_landmarks,
    uniform_landmarks,
)

METHODS = ("uniform", "kmeans++", "rls")


def rbf(lengthscale=1.0):
    def kernel(x1, x2, diag=False):
        if diag:
            return torch.ones(x1.shape[:-1], dtype=x1.dtype)
        return torch.exp(-0.5 * torch.cdist(x1, x2).pow(2) / lengthscale**2)

    return kernel


def data(n=200, d=2, seed=0):
    return torch.randn(n, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def row_indices(x, z):
    """Index of each row of z in x (asserting it is one)."""
    match = (z.unsqueeze(1) == x.unsqueeze(0)).all(-1)
    assert bool((match.sum(1) == 1).all())
    return match.float().argmax(1)


@pytest.mark.parametrize("method", METHODS)
def test_distinct_rows_of_x_and_seeded(method):
    x = data()
    z = select_landmarks(x, 30, method, kernel=rbf(), seed=3)
    assert z.shape == (30, 2) and z.dtype == x.dtype
    assert row_indices(x, z).unique().numel() == 30
    assert torch.equal(z, select_landmarks(x, 30, method, kernel=rbf(), seed=3))
    assert not torch.equal(z, select_landmarks(x, 30, method, kernel=rbf(), seed=4))
    generated = select_landmarks(x, 30, method, kernel=rbf(), generator=torch.Generator().manual_seed(3))
    assert torch.equal(z, generated)


def test_uniform_with_the_same_seed_is_nested():
    x = data()
    assert torch.equal(uniform_landmarks(x, 10, seed=1), uniform_landmarks(x, 40, seed=1)[:10])


def test_all_rows_when_m_equals_n():
    x = data(20)
    for method in METHODS:
        z = select_landmarks(x, 20, method, kernel=rbf(), seed=0)
        assert torch.equal(row_indices(x, z).sort().values, torch.arange(20))


def clusters():
    """9 tight clusters of 2 points and one big cluster of 500: uniform sampling misses the small ones."""
    gen = torch.Generator().manual_seed(0)
    centers = torch.arange(10, dtype=torch.float64).unsqueeze(-1) * 10.0
    sizes = [500] + [2] * 9
    points = [c + 0.01 * torch.randn(s, 1, generator=gen, dtype=torch.float64) for c, s in zip(centers, sizes)]
    return torch.cat(points), centers


@pytest.mark.parametrize("kernel", [None, rbf()], ids=["euclidean", "kernel"])
def test_kmeanspp_covers_every_cluster(kernel):
    x, centers = clusters()
    for seed in range(5):
        z = kmeanspp_landmarks(x, 10, kernel=kernel, seed=seed)
        nearest = (z - centers.mT).abs().argmin(-1)
        assert nearest.unique().numel() == 10
    covered = [(uniform_landmarks(x, 10, seed=s) - centers.mT).abs().argmin(-1).unique().numel() for s in range(5)]
    assert max(covered) < 10


def test_rls_prefers_the_rare_clusters():
    """The 18 rare points have the large leverage scores; uniform draws land almost all in the big cluster."""
    x, centers = clusters()
    for seed in range(5):
        rare = (ridge_leverage_landmarks(x, 10, rbf(), seed=seed) - centers.mT).abs().argmin(-1) > 0
        assert int(rare.sum()) >= 8
        assert int(((uniform_landmarks(x, 10, seed=seed) - centers.mT).abs().argmin(-1) > 0).sum()) <= 2


def test_rls_scores_exact_with_full_pilot_and_upper_bounds_otherwise():
    x = data(60)
    kernel, lam = rbf(0.7), 0.3
    gram = kernel(x, x)
    exact = torch.linalg.solve(gram + lam * torch.eye(60, dtype=x.dtype), gram).diagonal()
    full = approximate_ridge_leverage_scores(x, kernel, lam, x)
    torch.testing.assert_close(full, exact, rtol=1e-10, atol=1e-12)
    for seed in range(3):
        pilot = uniform_landmarks(x, 15, seed=seed)
        assert bool((approximate_ridge_leverage_scores(x, kernel, lam, pilot) >= exact - 1e-12).all())


def test_batched_kernel_outputs_are_averaged():
    x = data(50)

    def batched(x1, x2, diag=False):
        single = rbf()(x1, x2, diag)
        return torch.stack((single, single))

    assert torch.equal(ridge_leverage_landmarks(x, 10, batched, seed=0), ridge_leverage_landmarks(x, 10, rbf(), seed=0))
    assert torch.equal(kmeanspp_landmarks(x, 10, batched, seed=0), kmeanspp_landmarks(x, 10, rbf(), seed=0))


def test_kmeanspp_raises_instead_of_repeating_points():
    x = data(3).repeat(4, 1)
    assert kmeanspp_landmarks(x, 3, seed=0).unique(dim=0).shape[0] == 3
    with pytest.raises(ValueError, match="only 3 distinct rows"):
        kmeanspp_landmarks(x, 5, seed=0)


def duplicated(distinct=32, copies=4, dtype=torch.float64):
    """``distinct`` points, each repeated ``copies`` times, rows shuffled (as mtcars with every row 4×)."""
    x = data(distinct, d=3).repeat(copies, 1).to(dtype)
    return x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))]


def test_uniform_draws_distinct_points_of_repeated_rows():
    """Before: uniform drew rows, so M = 32 among 32 points × 4 gave 20–25 distinct landmarks and M = 48 no error."""
    x = duplicated()
    for seed in range(5):
        z = uniform_landmarks(x, 32, seed=seed)
        assert z.unique(dim=0).shape[0] == 32
        assert torch.equal(z[:12], uniform_landmarks(x, 12, seed=seed))  # still nested in M
    with pytest.raises(ValueError, match=r"only 32 distinct rows, fewer than num_landmarks=48 .*at most 32"):
        uniform_landmarks(x, 48, seed=0)
    # without repeated rows: the first M rows of one uniform permutation, as before
    y = data()
    order = torch.randperm(200, generator=torch.Generator().manual_seed(5))
    assert torch.equal(uniform_landmarks(y, 30, seed=5), y[order[:30]])


def expanded_rbf(lengthscale=1.0, scale=1.0):
    """RBF through ‖x‖² + ‖z‖² − 2xᵀz in the input dtype, as GPyTorch computes distances: equal rows are at a
    rounding distance > 0 (up to ≈ eps·‖x‖²/ℓ²)."""
    def kernel(x1, x2, diag=False):
        if diag:
            return torch.full(x1.shape[:-1], scale, dtype=x1.dtype)
        x1, x2 = x1 / lengthscale, x2 / lengthscale
        squared = x1.pow(2).sum(-1, keepdim=True) + x2.pow(2).sum(-1).unsqueeze(-2) - 2 * x1 @ x2.mT
        return scale * torch.exp(-0.5 * squared.clamp_min(0))

    return kernel


def test_kmeanspp_never_draws_a_copy_of_a_chosen_point():
    """float32 points near 100 repeated 20×: the rounding of k(x, x) + k(z, z) − 2k(x, z) left copies of chosen points
    a positive D² (up to ≈ 1e-3 here), and 5 of 10 seeds drew a copy (14-15 distinct landmarks of 16)."""
    x = (100 + 0.5 * torch.randn(16, 2, generator=torch.Generator().manual_seed(0))).repeat(20, 1)
    for seed in range(10):
        assert kmeanspp_landmarks(x, 16, kernel=expanded_rbf(), seed=seed).unique(dim=0).shape[0] == 16
    with pytest.raises(ValueError, match=r"only 16 distinct rows, fewer than num_landmarks=17"):
        kmeanspp_landmarks(x, 17, kernel=expanded_rbf(), seed=0)


@pytest.mark.parametrize("method", ["kmeans++", "rls"])
def test_selection_does_not_depend_on_the_dtype(method):
    """32 points repeated 4×, scale 0.7: rls's default λ is the floor 1e-6·mean k, so the residuals λ·τ of the
    points the pilot explains (≈ 2e-7) were float32 rounding noise: 100-128 of 128 rows had a positive score in
    float32, all 128 in float64, and the draws differed.  Scores and distances are now worked in float64."""
    x = duplicated(dtype=torch.float32)
    kernel = expanded_rbf(scale=0.7)
    for seed in range(5):
        z32 = select_landmarks(x, 24, method, kernel=kernel, seed=seed)
        assert z32.dtype == torch.float32 and z32.unique(dim=0).shape[0] == 24
        assert torch.equal(z32, select_landmarks(x.double(), 24, method, kernel=kernel, seed=seed).float())
    pilot = uniform_landmarks(x, 30, seed=0)
    scores = approximate_ridge_leverage_scores(x, kernel, 7e-7, pilot)
    assert scores.dtype == torch.float32 and bool((scores > 0).all())
    wide = approximate_ridge_leverage_scores(x.double(), kernel, 7e-7, pilot.double())
    torch.testing.assert_close(scores.double(), wide, rtol=1e-6, atol=0)


def test_rls_draws_distinct_points_with_their_rows_pooled():
    """Before: rls drew rows, so M = 16 among 32 points × 4 gave 10-15 distinct landmarks and M = 48 no error."""
    x = duplicated()
    for seed in range(5):
        assert ridge_leverage_landmarks(x, 32, rbf(), seed=seed).unique(dim=0).shape[0] == 32
    with pytest.raises(ValueError, match=r"only 32 distinct rows, fewer than num_landmarks=48"):
        ridge_leverage_landmarks(x, 48, rbf(), seed=0)
    with pytest.raises(ValueError, match=r"pilot_size=40 exceeds the number of distinct rows of x \(32 of 128\)"):
        ridge_leverage_landmarks(x, 8, rbf(), pilot_size=40, seed=0)


@pytest.mark.parametrize(
    "call, error, match",
    [
        (lambda x: uniform_landmarks(x, 201), ValueError, "num_landmarks=201 exceeds"),
        (lambda x: uniform_landmarks(x, 0), ValueError, "num_landmarks"),
        (lambda x: uniform_landmarks(x, 2.0), TypeError, "num_landmarks"),
        (lambda x: uniform_landmarks(x[:, 0], 2), ValueError, "x must have shape"),
        (lambda x: uniform_landmarks(x.long(), 2), TypeError, "x must be a floating-point tensor"),
        (lambda x: kmeanspp_landmarks(torch.where(x > 2, float("nan"), x), 2), ValueError, "NaN"),
        (lambda x: ridge_leverage_landmarks(x, 5, rbf(), regularization=-1.0), ValueError, "regularization"),
        (lambda x: ridge_leverage_landmarks(x, 5, rbf(), regularization=torch.tensor(0.0)), ValueError,
         "regularization must be a finite number > 0, got 0.0"),
        (lambda x: ridge_leverage_landmarks(x, 5, rbf(), regularization=torch.tensor(-0.5)), ValueError,
         "regularization must be a finite number > 0, got -0.5"),
        (lambda x: approximate_ridge_leverage_scores(x, rbf(), torch.tensor(float("nan")), x[:10]), ValueError,
         "regularization must be a finite number > 0"),
        (lambda x: approximate_ridge_leverage_scores(x, rbf(), torch.ones(2), x[:10]), TypeError,
         "one-element real floating-point tensor"),
        (lambda x: ridge_leverage_landmarks(x, 5, rbf(), pilot_size=500), ValueError, "pilot_size=500"),
        (lambda x: uniform_landmarks(x, 5, seed=0, generator=torch.Generator()), ValueError, "seed or generator"),
        (lambda x: select_landmarks(x, 5, "rls"), ValueError, "needs the kernel"),
        (lambda x: select_landmarks(x, 5, "greedy"), ValueError, "landmarks must be one of"),
    ],
)
def test_validation(call, error, match):
    with pytest.raises(error, match=match):
        call(data())


def test_weighted_draws_above_multinomials_category_limit(monkeypatch):
    """k-means++ and ridge-leverage selection among more than 2²⁴ points raised torch.multinomial's "number of
    categories cannot exceed 2^24"; above it the draw is an exponential race with the law of successive draws ∝ w:
    first draw ∝ w, second ∝ w among the rest (checked below the limit with the race forced, 4 standard errors)."""
    from rfgp.features import landmarks

    generator = torch.Generator().manual_seed(0)
    many = torch.rand(landmarks.MULTINOMIAL_CATEGORIES + 10, generator=generator, dtype=torch.float64)
    many[:5] = 0.0
    picked = landmarks._draw(many, 3, generator)
    assert picked.shape == (3,) and len(set(picked.tolist())) == 3 and bool((picked >= 5).all())

    weights = torch.tensor([1.0, 2.0, 3.0, 4.0, 0.0], dtype=torch.float64)
    draws = 6000
    monkeypatch.setattr(landmarks, "MULTINOMIAL_CATEGORIES", 3)
    pairs = torch.stack([landmarks._draw(weights, 2, generator) for _ in range(draws)])
    total = weights.sum()
    for first in range(4):
        for second in range(4):
            if first == second:
                continue
            expected = float(weights[first] / total * weights[second] / (total - weights[first]))
            observed = float(((pairs[:, 0] == first) & (pairs[:, 1] == second)).double().mean())
            assert abs(observed - expected) <= 4 * (expected * (1 - expected) / draws) ** 0.5, (first, second)
    assert not bool((pairs == 4).any())
