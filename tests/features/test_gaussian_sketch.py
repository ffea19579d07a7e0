"""GaussianSketch / GaussianSketchHD (paper 003) against their truncated kernels and the exact Gaussian kernel."""

import math

import pytest
import torch

from rfgp.applications.distances import exact_kernel_distance, gaussian_kernel, kernel_distance
from rfgp.features.gaussian_sketch import (
    GaussianSketch,
    GaussianSketchHD,
    taylor_monomials,
    truncated_exp,
    truncation_bound,
    truncation_order,
)


def _box(n, d, half_width, seed, shift=0.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1) * half_width + shift


def _beta(n1, n2):
    return torch.cat((torch.full((n1,), 1.0 / n1), torch.full((n2,), -1.0 / n2))).double()


def test_truncation_orders_match_the_notes_table():
    # notes I.6, d = 2: (paper bound / exact tail) for L ∈ {0.25, 0.5, 1}, α ∈ {1e-2, 1e-4, 1e-6}
    table = {0.25: [(4, 3), (5, 4), (6, 6)], 0.5: [(6, 5), (8, 7), (9, 9)], 1.0: [(13, 11), (16, 13), (18, 16)]}
    for radius, expected in table.items():
        got = [(truncation_order(radius, a, 2, rule="paper"), truncation_order(radius, a, 2)) for a in (1e-2, 1e-4, 1e-6)]
        assert got == expected
    # the exact tail is never looser than the paper's bound
    assert truncation_bound(8, 0.7, 3) <= truncation_bound(8, 0.7, 3, rule="paper")
    with pytest.raises(ValueError, match="alpha"):
        truncation_order(10.0, 1e-8, 8, max_order=20)


def test_truncated_exp_and_monomials():
    w = torch.linspace(-3, 3, 11, dtype=torch.float64)
    explicit = sum(w**t / math.factorial(t) for t in range(6))
    assert torch.allclose(truncated_exp(w, 6), explicit, rtol=1e-14)
    z = torch.tensor([[-0.7, 0.0, 1.3]], dtype=torch.float64)
    naive = torch.stack([torch.exp(-z**2) * math.sqrt(2**t / math.factorial(t)) * z**t for t in range(7)], -1)
    assert torch.allclose(taylor_monomials(z, 7), naive, rtol=1e-13, atol=1e-300)
    big = taylor_monomials(torch.tensor([[3.0, -3.0]], dtype=torch.float64), 60)  # notes check 7
    assert torch.isfinite(big).all() and big.abs().max() <= 1


@pytest.mark.parametrize("cls,kwargs", [(GaussianSketch, {"mode": "explicit"}), (GaussianSketchHD, {})])
def test_explicit_features_reproduce_truncated_kernel(cls, kwargs):
    x = _box(20, 3, 1.0, 0)
    phi = cls(4096, order=6, input_dim=3, seed=0, **kwargs).double()
    features = phi(x)
    assert torch.allclose(features @ features.T, phi.truncated_kernel(x, x), atol=1e-13)
    # the closed forms tend to the RBF kernel exp(−‖u − v‖²/2) as s grows
    far = cls(128, order=40, input_dim=3, seed=0, **({"mode": "tree"} if kwargs else {}))
    assert torch.allclose(far.truncated_kernel(x, x), gaussian_kernel(1.0)(x, x), atol=1e-12)


@pytest.mark.parametrize("cls,kwargs", [(GaussianSketch, {"mode": "explicit"}), (GaussianSketchHD, {})])
def test_explicit_features_have_the_truncated_kernels_derivatives_at_the_centre(cls, kwargs):
    # rows with a coordinate at the centre (GaussianSketch) or at the centre itself (HD): the features' first and
    # second derivatives are those of the truncated kernel they reproduce exactly (once 0 and NaN at z = 0)
    phi = cls(4096, order=5, input_dim=3, seed=0, **kwargs).double()
    y = _box(4, 3, 1.0, 1)
    for row in ([0.0, 0.5, -0.3], [0.0, 0.0, 0.0]):
        x = torch.tensor([row], dtype=torch.float64, requires_grad=True)
        (grad,) = torch.autograd.grad((phi(x) @ phi(y).T).sum(), x, create_graph=True)
        (exact,) = torch.autograd.grad(phi.truncated_kernel(x, y).sum(), x, create_graph=True)
        assert torch.allclose(grad, exact, atol=1e-13)
        for i in range(3):
            hessian_row = torch.autograd.grad(grad[0, i], x, retain_graph=True)[0]
            exact_row = torch.autograd.grad(exact[0, i], x, retain_graph=True)[0]
            assert torch.allclose(hessian_row, exact_row, atol=1e-12)
    tree = GaussianSketch(64, order=5, mode="tree", input_dim=3, seed=0)
    at_zero = torch.tensor([[0.0, 0.5, -0.3], [0.0, 0.0, 0.0]], dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradgradcheck(tree, (at_zero,))


def test_truncated_kernels_match_expansions_term_by_term():
    x, y = _box(6, 2, 1.0, 1), _box(5, 2, 1.0, 2)
    gs = GaussianSketch(64, order=4, input_dim=2, seed=0, mode="explicit")
    hd = GaussianSketchHD(64, order=4, input_dim=2, seed=0)
    z, w = x / math.sqrt(2), y / math.sqrt(2)
    front = torch.exp(-(z**2).sum(-1)[:, None] - (w**2).sum(-1)[None])
    inner = z @ w.T
    expected_hd = front * sum((2 * inner) ** t / math.factorial(t) for t in range(4))
    expected_gs = front * torch.ones_like(inner)
    for j in range(2):
        expected_gs = expected_gs * sum((2 * z[:, j, None] * w[None, :, j]) ** t / math.factorial(t) for t in range(4))
    assert torch.allclose(hd.truncated_kernel(x, y), expected_hd, rtol=1e-13)
    assert torch.allclose(gs.truncated_kernel(x, y), expected_gs, rtol=1e-13)


@pytest.mark.parametrize("cls", [GaussianSketch, GaussianSketchHD])
def test_truncation_error_is_one_sided_within_bound_and_monotone(cls):
    half = 0.6  # box half-width in the map's input units
    p, q = _box(40, 2, half, 3), _box(50, 2, half, 4, shift=0.1)
    exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
    z, beta = torch.cat((p, q)), _beta(40, 50)
    radius = half / math.sqrt(2) * (1.0 if cls is GaussianSketch else math.sqrt(2))  # box L or ball R
    gaps = []
    for order in range(2, 10):
        phi = cls(64, order=order, input_dim=2, seed=0, **({"mode": "tree"} if cls is GaussianSketch else {}))
        gap = exact - beta @ phi.truncated_kernel(z, z) @ beta
        bound = truncation_bound(order, radius, 2 if cls is GaussianSketch else None)
        assert -1e-15 <= gap <= bound
        gaps.append(gap)
        assert (phi.expected_diag(z) <= 1 + 1e-15).all()
    assert all(a >= b - 1e-15 for a, b in zip(gaps, gaps[1:]))


@pytest.mark.parametrize("cls,kwargs", [(GaussianSketch, {"mode": "tree"}), (GaussianSketchHD, {})])
def test_sketch_is_unbiased_for_the_truncated_distance(cls, kwargs):
    p, q = _box(30, 3, 0.8, 5), _box(30, 3, 0.8, 6, shift=0.2)
    z, beta = torch.cat((p, q)), _beta(30, 30)
    estimates = []
    for seed in range(80):
        phi = cls(64, order=5, input_dim=3, seed=seed, **kwargs).double()
        estimates.append(kernel_distance(phi, p, q, squared=True))
    estimates = torch.stack(estimates)
    target = beta @ phi.truncated_kernel(z, z) @ beta
    se = estimates.std() / math.sqrt(len(estimates))
    assert (estimates.mean() - target).abs() <= 4 * se
    assert estimates.std() > 0  # really sketched, not explicit


def test_relative_error_guarantee_and_median_boosting():
    """|D̂² − D²| ≤ εD² + α in ≥ 90 % of draws (Thm 3.1 with calibrated m); the median of 5 copies fails less."""
    d, half = 3, 0.7
    p, q = _box(60, d, half, 7), _box(60, d, half, 8, shift=0.15)
    exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
    eps, alpha = 0.2, 1e-3 * exact.item()

    def estimate(width, seed):
        phi = GaussianSketch(width, radius=half, alpha=alpha, input_dim=d, mode="tree", seed=seed).double()
        return kernel_distance(phi, p, q, squared=True)

    def fails(values):
        return ((values - exact).abs() > eps * exact + alpha).float()

    trials = 30
    large = torch.stack([estimate(1024, s) for s in range(trials)])
    assert fails(large).mean() <= 0.1
    singles = torch.stack([estimate(128, s) for s in range(5 * trials)]).reshape(trials, 5)
    single_failure = fails(singles).mean()
    median_failure = fails(singles.median(-1).values).mean()
    assert single_failure > 0.1  # the small sketch alone misses the guarantee often ...
    assert median_failure < single_failure / 2  # ... the median of independent copies much less


@pytest.mark.parametrize("cls,kwargs", [(GaussianSketch, {"mode": "tree"}), (GaussianSketchHD, {})])
def test_state_dict_round_trip_and_dtypes(cls, kwargs, dtype):
    x = _box(7, 3, 0.5, 9)
    phi = cls(64, order=5, input_dim=3, seed=1, center=[0.1, 0.0, -0.1], **kwargs).to(dtype)
    other = cls(64, order=5, input_dim=3, seed=2, center=[0.0, 0.0, 0.0], **kwargs).to(dtype)
    other.load_state_dict(phi.state_dict())
    out = phi(x.to(dtype))
    assert out.dtype == dtype and torch.equal(out, other(x.to(dtype)))


def test_tree_sketch_runs_in_row_blocks_under_the_memory_budget(monkeypatch):
    """The tree holds 2·num_leaves ≥ 2d nodes of width F per row (O(n·d·F) memory, 22 GiB at d = 300, n = 2000,
    F = 1024 with its autograd graph): rows go through it in blocks, recomputed in the backward pass, with the
    same features and gradients as all rows at once."""
    from rfgp.core.settings import memory_budget
    from rfgp.features.degree_sketch import HierarchicalSketch

    x = _box(40, 6, 0.5, 13)
    phi = GaussianSketch(64, order=3, input_dim=6, seed=0, mode="tree")
    row_bytes = 8 * 8 * 64 * 8  # 8·num_leaves numbers of width F in float64
    seen = []
    apply_to = HierarchicalSketch.apply_to
    monkeypatch.setattr(HierarchicalSketch, "apply_to", lambda self, inputs, get: seen.append(inputs[0].shape[-2])
                        or apply_to(self, inputs, get))
    results = []
    for budget in (2**30, 7 * row_bytes):
        scale = torch.tensor(1.3, dtype=torch.float64, requires_grad=True)
        with memory_budget(budget):
            features = phi(x / scale)
        (features.sum(0) ** 2).sum().backward()
        results.append((features.detach(), scale.grad))
    assert seen[0] == 40 and max(seen[1:]) == 7  # blocks of 7 rows, forward and backward recomputation
    assert torch.allclose(results[1][0], results[0][0], rtol=1e-12, atol=1e-14)
    assert torch.allclose(results[1][1], results[0][1], rtol=1e-10)


def test_tree_sketch_in_row_blocks_has_input_derivatives_by_autograd_grad():
    """torch.autograd.grad (BoTorch's acquisition optimisers) and second derivatives through the row blocks: the
    same as all rows at once (a reentrant checkpoint refused .grad() and create_graph)."""
    from rfgp.core.settings import memory_budget

    phi = GaussianSketch(64, order=4, input_dim=3, seed=0, mode="tree")
    x = _box(5, 3, 0.5, 2).requires_grad_()
    results = []
    for budget in (2**30, 2 * phi.sketch().num_leaves * 64 * 64):
        with memory_budget(budget):
            features = phi(x)
        (grad,) = torch.autograd.grad(features.square().sum(), x, create_graph=True)
        results.append((grad, torch.autograd.grad(grad.sum(), x)[0]))
    assert torch.allclose(results[1][0], results[0][0], rtol=1e-12, atol=1e-14)
    assert torch.allclose(results[1][1], results[0][1], rtol=1e-10, atol=1e-13)


def test_for_data_centres_and_picks_order():
    x = _box(50, 2, 0.5, 10, shift=5.0)
    phi = GaussianSketch.for_data(x, 256, alpha=1e-4, seed=0)
    assert torch.allclose(phi.center, (x.min(0).values + x.max(0).values) / 2)
    assert phi.order == truncation_order(phi.radius / math.sqrt(2), 1e-4, 2)
    # shift-invariance: far-away data give the same features as the centred data
    assert torch.allclose(phi(x), GaussianSketch(256, order=phi.order, input_dim=2, seed=0)(x - phi.center))
    hd = GaussianSketchHD.for_data(x, 256, alpha=1e-4, seed=0)
    assert hd.radius == pytest.approx(float((x - hd.center).norm(dim=-1).max()))
    # batched data: the bounding box of all rows (it had been taken per row index, a centre of n·d entries)
    batched = GaussianSketchHD.for_data(x.reshape(2, 25, 2), 256, alpha=1e-4, seed=0)
    assert torch.equal(batched.center, hd.center) and batched.radius == hd.radius


def test_bad_arguments():
    with pytest.raises(ValueError, match="order"):
        GaussianSketch(64, input_dim=2)
    with pytest.raises(ValueError, match="mode"):
        GaussianSketch(64, order=3, mode="flat")
    with pytest.raises(ValueError, match="explicit"):
        GaussianSketch(64, order=5, input_dim=3, mode="explicit")
    with pytest.raises(ValueError, match="too small"):
        GaussianSketchHD(4, order=8, input_dim=5)
    # a centre of the wrong length or with NaN raises by name (once a raw RuntimeError at the call, or NaN features)
    with pytest.raises(ValueError, match=r"center must be .* input_dim=3 .* shape \(2,\)"):
        GaussianSketch(64, order=3, center=[0.0, 0.0], input_dim=3)
    with pytest.raises(ValueError, match="center contains NaN"):
        GaussianSketchHD(64, order=3, center=[0.0, math.nan])


def test_independent_draws_for_p_and_q_break_the_estimate():
    """Sign-randomised sketches: E⟨T₁a, T₂b⟩ = 0, so separate draws estimate κ_s(P,P) + κ_s(Q,Q) (notes check 5)."""
    p, q = _box(40, 3, 0.6, 11), _box(40, 3, 0.6, 12)
    exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
    mean_pp = gaussian_kernel(1.0)(p, p).mean() + gaussian_kernel(1.0)(q, q).mean()
    separate = torch.stack([
        (GaussianSketch(256, order=5, input_dim=3, mode="tree", seed=2 * s).double()(p).mean(0)
         - GaussianSketch(256, order=5, input_dim=3, mode="tree", seed=2 * s + 1).double()(q).mean(0)).square().sum()
        for s in range(20)
    ]).mean()
    assert (separate - mean_pp).abs() < 0.1 * mean_pp
    assert separate > 10 * exact
