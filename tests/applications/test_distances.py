"""Kernel distance, two-sample test and kernel PCA from random features vs the exact computations."""

import math

import pytest
import torch

from rfgp.applications.distances import (
    exact_gaussian_kernel_distance,
    exact_kernel_distance,
    exact_kernel_pca_eigenvalues,
    gaussian_kernel,
    kernel_distance,
    kernel_mean_embedding,
    kernel_pca,
    mean_kernel,
    permutation_statistics,
    projection_residual,
    two_sample_test,
    two_sketch_kernel_pca,
)
from rfgp.features import RandomFourierFeatures


def _sets(n=150, shift=0.5, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.randn(n, d, generator=g, dtype=torch.float64)
    q = torch.randn(n + 20, d, generator=g, dtype=torch.float64) + shift
    return p, q


def test_exact_distance_matches_dense_formula_and_is_chunk_invariant():
    p, q = _sets()
    k = gaussian_kernel(0.7)
    beta = torch.cat((torch.full((p.shape[0],), 1 / p.shape[0]), torch.full((q.shape[0],), -1 / q.shape[0]))).double()
    z = torch.cat((p, q))
    dense = beta @ k(z, z) @ beta  # signed-weight form, paper 003 §1
    assert torch.allclose(exact_kernel_distance(k, p, q, squared=True, chunk_size=7), dense, rtol=1e-12)
    assert torch.allclose(exact_kernel_distance(k, p, q), dense.sqrt(), rtol=1e-12)
    assert exact_kernel_distance(k, p, p, squared=True).abs() < 1e-12
    assert torch.allclose(mean_kernel(k, p, q, 5), k(p, q).mean(), rtol=1e-12)


@pytest.mark.parametrize("chunk_size", [7, 64, 4096])
def test_gemm_gaussian_distance_matches_dense_formula(chunk_size):
    """Upper-triangular blocks (diagonal once, off-diagonal twice) give exactly βᵀKβ for any chunking."""
    p, q = _sets()
    k = gaussian_kernel(0.7)
    beta = torch.cat((torch.full((p.shape[0],), 1 / p.shape[0]), torch.full((q.shape[0],), -1 / q.shape[0]))).double()
    z = torch.cat((p, q))
    dense = beta @ k(z, z) @ beta
    value = exact_gaussian_kernel_distance(p.float(), q.float(), 0.7, squared=True, chunk_size=chunk_size)
    assert value.dtype == torch.float64  # float64 whatever the input dtype
    assert torch.allclose(value, beta @ k(z.float().double(), z.float().double()) @ beta, rtol=1e-10)
    assert torch.allclose(exact_gaussian_kernel_distance(p, q, 0.7, chunk_size=chunk_size), dense.sqrt(), rtol=1e-10)
    assert exact_gaussian_kernel_distance(p, p, 0.7, squared=True, chunk_size=chunk_size).abs() < 1e-12


def test_mean_embedding_is_chunk_invariant():
    p, q = _sets()
    phi = RandomFourierFeatures(64, input_dim=2, seed=0).double()
    assert torch.allclose(kernel_mean_embedding(phi, p, chunk_size=11), phi(p).mean(0), rtol=1e-12)
    assert torch.allclose(kernel_distance(phi, p, q, chunk_size=5), kernel_distance(phi, p, q), rtol=1e-12)


def test_sketched_distance_is_unbiased_and_converges_to_exact():
    p, q = _sets()
    exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
    errors = {}
    for width in (64, 4096):
        estimates = torch.stack([
            kernel_distance(RandomFourierFeatures(width, input_dim=2, seed=s).double(), p, q, squared=True)
            for s in range(60)
        ])
        se = estimates.std() / math.sqrt(len(estimates))
        assert (estimates.mean() - exact).abs() <= 4 * se + 1e-12  # unbiased: βᵀK̂β with E K̂ = K
        errors[width] = (estimates - exact).abs().mean()
    assert errors[4096] < errors[64] / 4  # RMS error ∝ F^{-1/2}: ratio 8 expected
    assert errors[4096] / exact < 0.05


def test_one_shared_draw_is_required():
    """Independent draws for P and Q do not estimate D² (the cross term loses its correlation)."""
    p, q = _sets(shift=0.0)
    exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
    shared = kernel_distance(RandomFourierFeatures(2048, input_dim=2, seed=1).double(), p, q, squared=True)
    a = kernel_mean_embedding(RandomFourierFeatures(2048, input_dim=2, seed=1).double(), p)
    b = kernel_mean_embedding(RandomFourierFeatures(2048, input_dim=2, seed=2).double(), q)
    assert (shared - exact).abs() < 0.02
    assert (a - b).square().sum() > 20 * exact


def test_permutation_statistics_match_direct_relabelling():
    p, q = _sets(n=30)
    phi = RandomFourierFeatures(64, input_dim=2, seed=0).double()
    features = phi(torch.cat((p, q)))
    orders = torch.stack([torch.randperm(features.shape[0]) for _ in range(5)])
    stats = permutation_statistics(features, p.shape[0], orders)
    for order, stat in zip(orders, stats):
        z = torch.cat((p, q))[order]
        direct = kernel_distance(phi, z[:30], z[30:], squared=True)
        assert torch.allclose(stat, direct, rtol=1e-12)


def test_two_sample_test_size_under_null():
    level, trials = 0.05, 200
    phi = RandomFourierFeatures(128, input_dim=2, seed=0).double()
    g = torch.Generator().manual_seed(3)
    rejections = 0
    for t in range(trials):
        z = torch.randn(80, 2, generator=g, dtype=torch.float64)
        rejections += two_sample_test(phi, z[:40], z[40:], num_permutations=199, level=level, seed=t).reject
    se = math.sqrt(level * (1 - level) / trials)
    assert abs(rejections / trials - level) <= 4 * se  # binomial tolerance around the nominal size


def test_two_sample_test_power_under_mean_shift_and_agreement_with_exact():
    phi = RandomFourierFeatures(512, input_dim=2, seed=0).double()
    g = torch.Generator().manual_seed(4)
    decisions = []
    for t in range(20):
        p = torch.randn(200, 2, generator=g, dtype=torch.float64)
        q = torch.randn(200, 2, generator=g, dtype=torch.float64) + torch.tensor([0.5, 0.0], dtype=torch.float64)
        result = two_sample_test(phi, p, q, num_permutations=199, seed=t)
        decisions.append(result.reject)
        exact = exact_kernel_distance(gaussian_kernel(1.0), p, q, squared=True)
        assert (result.statistic - exact).abs() < 0.1 * exact
        assert result.statistic >= result.threshold or not result.reject
    assert sum(decisions) >= 19


def test_kernel_pca_eigenvalues_close_to_exact():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 3, generator=g, dtype=torch.float64)
    exact = exact_kernel_pca_eigenvalues(gaussian_kernel(1.0), x, 5)
    small = kernel_pca(RandomFourierFeatures(64, input_dim=3, seed=0).double(), x, 5).eigenvalues
    big = kernel_pca(RandomFourierFeatures(16384, input_dim=3, seed=0).double(), x, 5).eigenvalues
    assert ((big - exact).abs() / exact).max() < 0.05
    assert ((big - exact).abs() / exact).max() < ((small - exact).abs() / exact).max()


def test_kernel_pca_basis_and_transform():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(100, 2, generator=g, dtype=torch.float64)
    phi = RandomFourierFeatures(4096, input_dim=2, seed=0).double()
    pca = kernel_pca(phi, x, 4, center=False)
    assert torch.allclose(pca.basis.T @ pca.basis, torch.eye(4, dtype=torch.float64), atol=1e-10)
    assert torch.allclose(pca.transform(phi, x), pca.scores, atol=1e-8)
    # paper 003 App. A: Tr(K) − Tr(VᵀKV) vs the optimal residual Σ_{i>k} λᵢ(K)
    gram = gaussian_kernel(1.0)(x, x)
    residual = gram.trace() - (pca.basis.T @ gram @ pca.basis).trace()
    optimal = torch.linalg.eigvalsh(gram).flip(0)[4:].sum()
    assert optimal <= residual <= 1.1 * optimal


@pytest.mark.parametrize("bad, error", [(torch.zeros(0, 2), ValueError), (torch.zeros(3), ValueError),
                                        ("points", TypeError)])
def test_bad_points_rejected(bad, error):
    with pytest.raises(error, match="p must (be|have shape)"):
        kernel_distance(RandomFourierFeatures(8, input_dim=2, seed=0), bad, torch.zeros(3, 2))


def test_bad_test_arguments_rejected():
    phi = RandomFourierFeatures(8, input_dim=2, seed=0)
    with pytest.raises(ValueError, match="level"):
        two_sample_test(phi, torch.zeros(3, 2), torch.zeros(3, 2), level=1.5)
    with pytest.raises(ValueError, match="same dimension"):
        kernel_distance(phi, torch.zeros(3, 2), torch.zeros(3, 3))
    with pytest.raises(ValueError, match="num_components"):
        kernel_pca(phi, torch.zeros(3, 2), 5)


def test_gemm_gaussian_distance_keeps_its_digits_far_from_the_origin():
    """‖z‖² + ‖z'‖² − 2zᵀz' cancelled ‖z‖² ~ 10¹² down to a 10⁻⁴ relative error of D_K (2·10⁻³ at 10⁷):
    points far from the origin (coordinates in metres, timestamps) now give the value of the centred points."""
    p, q = _sets(n=60, shift=0.3)
    offset = torch.tensor([1e6, -3e6], dtype=torch.float64)
    reference = exact_gaussian_kernel_distance(p, q, 0.7)
    torch.testing.assert_close(exact_gaussian_kernel_distance(p + offset, q + offset, 0.7), reference,
                               rtol=1e-8, atol=0)


def test_exact_pca_eigenvalues_refuse_more_components_than_points():
    """k > n silently returned n eigenvalues (kernel_pca refuses it by name)."""
    with pytest.raises(ValueError, match=r"num_components must be ≤ n = 3 .*got 10"):
        exact_kernel_pca_eigenvalues(gaussian_kernel(1.0), torch.zeros(3, 2, dtype=torch.float64), 10)


def test_projection_residual_refuses_nonfinite_or_integer_basis():
    """A NaN basis gave a silent NaN residual."""
    x = torch.randn(5, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="basis contains NaN"):
        projection_residual(gaussian_kernel(1.0), x, torch.full((5, 2), math.nan, dtype=torch.float64))
    with pytest.raises(TypeError, match="basis must be a floating-point tensor"):
        projection_residual(gaussian_kernel(1.0), x, torch.ones(5, 2, dtype=torch.long))


def test_mean_kernel_refuses_mixed_dtypes_by_name():
    """torch.cdist's 'expected m1 and m2 to have the same dtype' named neither set."""
    p, q = _sets()
    with pytest.raises(TypeError, match="y has dtype torch.float32 but x is torch.float64"):
        mean_kernel(gaussian_kernel(1.0), p, q.float())


def test_two_sample_threshold_is_the_critical_value_of_reject():
    """threshold was the interpolated (1 − level) quantile of the null statistics: `statistic > threshold`
    disagreed with `reject` (p ≤ level, with its +1) in ~3% of tests near the boundary."""
    phi = RandomFourierFeatures(64, input_dim=2, seed=0).double()
    g = torch.Generator().manual_seed(5)
    decisions = []
    for t in range(120):
        z = torch.randn(40, 2, generator=g, dtype=torch.float64)
        for level, permutations in ((0.05, 39), (0.1, 19), (0.05, 19)):
            result = two_sample_test(phi, z[:20], z[20:] + 0.3, num_permutations=permutations, level=level, seed=t)
            assert result.reject == bool(result.statistic > result.threshold)
            decisions.append(result.reject)
    assert 0 < sum(decisions) < len(decisions)


def test_two_sample_test_refuses_too_few_permutations_and_non_numeric_levels():
    """With B + 1 < 1/level the smallest p-value 1/(B + 1) exceeds level: the test silently never rejected."""
    phi = RandomFourierFeatures(8, input_dim=2, seed=0).double()
    p, q = _sets(n=5, shift=3.0)
    with pytest.raises(ValueError, match=r"num_permutations=10 can never reject at level=0.05.*num_permutations ≥ 19"):
        two_sample_test(phi, p, q, num_permutations=10, seed=0)
    assert two_sample_test(phi, p, q, num_permutations=19, seed=0).p_value >= 1 / 20
    with pytest.raises(TypeError, match="level must be a real number"):
        two_sample_test(phi, p, q, level="0.05")
    with pytest.raises(ValueError, match=r"seed must be an int in \[-2\*\*63, 2\*\*63\)"):
        two_sample_test(phi, p, q, seed=2**64)


def test_kernels_and_non_feature_outputs_are_refused_as_feature_maps():
    """A sketched kernel passed for its feature map gave the two-sample test an n × n kernel matrix as
    'features': a silently wrong statistic and p-value (kernel_pca: an AttributeError, kernel_distance: a
    size-mismatch RuntimeError)."""
    import gpytorch

    import rfgp

    kernel = rfgp.sketch(gpytorch.kernels.RBFKernel(), 64, seed=0).double()
    p, q = _sets(n=20)
    for call in (lambda: two_sample_test(kernel, p, q, num_permutations=19, seed=0),
                 lambda: kernel_distance(kernel, p, q), lambda: kernel_pca(kernel, p, 2)):
        with pytest.raises(TypeError, match="feature_map must be a feature map .* got the kernel"):
            call()
    with pytest.raises(ValueError, match=r"feature_map must map the \(20, d\) points to an \(20, F\) feature tensor"):
        kernel_mean_embedding(lambda x: x.sum(), p)
    phi = RandomFourierFeatures(64, input_dim=2, seed=0).double()
    with pytest.raises(TypeError, match="projection_map must be a feature map"):
        two_sketch_kernel_pca(phi, kernel, p, 2)


def test_permutation_statistics_checks_its_split_and_orders():
    """num_p = 0 or n raised a bare ZeroDivisionError; a 1-D order silently gave one scalar."""
    features = torch.randn(5, 4, dtype=torch.float64)
    for num_p in (0, 5):
        with pytest.raises(ValueError, match="num_p must"):
            permutation_statistics(features, num_p, torch.arange(5)[None])
    for orders in (torch.arange(5), torch.arange(4)[None], torch.arange(5.0)[None]):
        with pytest.raises(ValueError, match=r"permutations must be a \(B, n = 5\) integer tensor"):
            permutation_statistics(features, 2, orders)


def test_maps_fitted_on_first_input_see_all_the_points():
    """A fresh optimized Maclaurin map allocated its degrees on P alone (D(P, Q) ≠ D(Q, P): widths (4, 28)
    against (4, 18, 10)), and kernel_mean_embedding on its first chunk only."""
    from rfgp.features import OptimizedMaclaurin, dot_product

    def fresh():
        return OptimizedMaclaurin(dot_product.gaussian(), 65, seed=0).double()

    g = torch.Generator().manual_seed(0)
    p = torch.randn(200, 3, generator=g, dtype=torch.float64) * 0.3
    q = torch.randn(150, 3, generator=g, dtype=torch.float64) * 0.6 + 0.2
    forward, backward = fresh(), fresh()
    torch.testing.assert_close(kernel_distance(forward, p, q), kernel_distance(backward, q, p), rtol=1e-12, atol=0)
    assert forward.widths == backward.widths
    pooled = torch.cat((q, p))
    whole, chunked = fresh(), fresh()
    torch.testing.assert_close(kernel_mean_embedding(chunked, pooled, chunk_size=7),
                               kernel_mean_embedding(whole, pooled), rtol=1e-12, atol=1e-15)
    assert chunked.widths == whole.widths


def test_exact_kernel_distance_keeps_its_digits_far_from_the_origin():
    """gaussian_kernel's cdist expands ‖x‖² + ‖y‖² − 2xᵀy: D_K was off by 10⁻⁴ (relative) at an offset of 10⁶."""
    p, q = _sets(n=60, shift=0.3)
    offset = torch.tensor([1e6, -3e6], dtype=torch.float64)
    reference = exact_kernel_distance(gaussian_kernel(0.7), p, q)
    torch.testing.assert_close(exact_kernel_distance(gaussian_kernel(0.7), p + offset, q + offset), reference,
                               rtol=1e-8, atol=0)


def test_the_distance_of_a_set_to_itself_has_a_finite_gradient():
    """D(P, Q) was √(‖F(P) − F(Q)‖²), whose gradient at D = 0 is 0·∞ = NaN (a NaN step for anyone minimising the
    distance to reach it); now the norm's subgradient 0, and the gradient away from 0 is unchanged."""
    phi = RandomFourierFeatures(256, input_dim=2, seed=0).double()
    g = torch.Generator().manual_seed(0)
    p = torch.randn(30, 2, generator=g, dtype=torch.float64, requires_grad=True)
    kernel_distance(phi, p, p.detach()).backward()
    assert torch.equal(p.grad, torch.zeros_like(p))
    q = torch.randn(20, 2, generator=g, dtype=torch.float64) + 1.0
    x = p.detach().clone().requires_grad_(True)
    (gradient,) = torch.autograd.grad(kernel_distance(phi, x, q), x)
    (reference,) = torch.autograd.grad(kernel_distance(phi, x, q, squared=True).sqrt(), x)
    assert torch.allclose(gradient, reference, rtol=1e-12, atol=0)
