"""RFF / ORF / SORF: unbiasedness, exact variances (notes Part B, Part C checks 9–17), structure.

Vectorisation: one map with B·D frequencies holds B independent D-row blocks (ORF and SORF
draw each d × d block independently; RFF rows are i.i.d.), so a single forward pass gives B
independent draws of the D-frequency estimator k̂(x, y) = D⁻¹Σ cos(wᵢᵀ(x − y)).
"""

import math

import pytest
import torch

from rfgp.features import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    RandomFourierFeatures,
    RationalQuadraticSpectralDensity,
)
from rfgp.features.fourier import MIN_STRUCTURED_DIM
from rfgp.features.hadamard import next_power_of_two

from .._oracles import mean_and_se, orf_prime_mean, orf_prime_mse, orf_variance, rff_variance, variance_and_se

SAMPLERS = ["iid", "orthogonal", "structured"]


def unit_vector(d, seed):
    u = torch.randn(d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return u / u.norm()


def block_estimates(feature_map, zs, direction, device, block, dtype=torch.float64):
    """B independent estimates of k̂(x₀, x₀ + z·direction), one column per z: shape (B, len(zs))."""
    d = direction.shape[0]
    x0 = 0.3 * torch.randn(d, generator=torch.Generator().manual_seed(99), dtype=torch.float64)
    points = torch.stack([x0] + [x0 + z * direction for z in zs]).to(device, dtype)
    phi = feature_map.to(device, dtype)(points)
    m = feature_map.num_frequencies
    product = m * phi[:1] * phi[1:]
    terms = product[:, :m] + product[:, m:]  # cos(wᵢᵀ(x − y)) per frequency
    num_blocks = m // block
    return terms[:, : num_blocks * block].reshape(len(zs), num_blocks, block).mean(-1).T.cpu()


def rbf(z):
    return math.exp(-(z**2) / 2)


# ------------------------------------------------------------------ structure
@pytest.mark.parametrize("sampler", SAMPLERS)
@pytest.mark.parametrize("batch_shape", [(), (3,), (2, 2)])
def test_shape_dtype_device_follow_input(sampler, batch_shape, device, dtype):
    fm = RandomFourierFeatures(10, input_dim=3, sampler=sampler, seed=0).to(device)
    x = torch.randn(*batch_shape, 7, 3, dtype=dtype, device=device)
    phi = fm(x)
    assert phi.shape == (*batch_shape, 7, 10)
    assert phi.dtype == dtype and phi.device.type == device.type
    # sin² + cos² = 1 per frequency: Φ(x)ᵀΦ(x) = 1 exactly, matching expected/target diag.
    torch.testing.assert_close(phi.pow(2).sum(-1), fm.expected_diag(x))
    torch.testing.assert_close(fm.target_diag(x), torch.ones(*batch_shape, 7, dtype=dtype, device=device))


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_features_are_sin_cos_of_projection(sampler, device):
    fm = RandomFourierFeatures(12, sampler=sampler, seed=1).double().to(device)
    x = torch.randn(5, 3, dtype=torch.float64, device=device)
    phi = fm(x)
    w = fm.frequency_matrix()
    assert w.shape == (6, 3)
    projection = x @ w.T
    torch.testing.assert_close(fm.project(x), projection)
    torch.testing.assert_close(phi, torch.cat((projection.cos(), projection.sin()), -1) / math.sqrt(6))


@pytest.mark.parametrize("d", [3, 4, 5])
def test_orf_blocks_are_orthogonal_with_chi_norms(d):
    fm = RandomFourierFeatures(2 * 3 * d, sampler="orthogonal", seed=2).double()
    fm(torch.zeros(1, d, dtype=torch.float64))
    w = fm.frequency_matrix().reshape(3, d, d)
    gram = w @ w.mT
    off_diagonal = gram - torch.diag_embed(torch.diagonal(gram, dim1=-2, dim2=-1))
    assert off_diagonal.abs().max() < 1e-10
    # Rows are not all of the same norm (χ_d scale draws, not ORF's constant √d).
    assert w.norm(dim=-1).std() > 0.1
    # Independent blocks: rows of different blocks are not orthogonal.
    assert (w[0] @ w[1].T).abs().max() > 0.1


@pytest.mark.parametrize("d", [4, 20, 32, 64])
def test_sorf_rows_have_norm_sqrt_padded_d(d):
    padded = max(next_power_of_two(d), MIN_STRUCTURED_DIM)
    fm = RandomFourierFeatures(2 * 2 * padded, sampler="structured", seed=3).double()
    x = torch.zeros(1, d, dtype=torch.float64)
    fm(x)
    # W acts on the zero-padded input; on the padded space its rows have norm √padded exactly.
    full = torch.cat([fm.project(e.unsqueeze(0)) for e in torch.eye(d, dtype=torch.float64)], 0)
    assert full.shape == (d, 2 * padded)
    if d == padded:
        torch.testing.assert_close(full.norm(dim=0), torch.full((2 * padded,), math.sqrt(padded), dtype=torch.float64))
        block = full[:, :padded]
        torch.testing.assert_close(block.T @ block, padded * torch.eye(padded, dtype=torch.float64))
    else:
        assert bool((full.norm(dim=0) <= math.sqrt(padded) + 1e-12).all())


# ------------------------------------------------------------ unbiasedness
@pytest.mark.parametrize("sampler", ["iid", "orthogonal"])
@pytest.mark.parametrize("d", [1, 3, 4, 8])
def test_rff_and_orf_unbiased_for_rbf(sampler, d, device):
    zs = [0.5, 1.0, 2.0, 3.0]
    fm = RandomFourierFeatures(2 * 4000 * d, sampler=sampler, seed=10 + d)
    est = block_estimates(fm, zs, unit_vector(d, d), device, block=d)
    for j, z in enumerate(zs):
        mc, se = mean_and_se(est[:, j])
        assert abs(mc - rbf(z)) <= 4 * se, (sampler, d, z, mc, rbf(z), se)


def test_orf_with_truncated_rows_unbiased_and_exact_variance():
    # D < d: the first D rows of one orthogonal block (notes B2; check 16).
    d, D, zs, seeds = 8, 3, [0.5, 1.0, 2.0], 1500
    direction = unit_vector(d, 0)
    est = torch.stack(
        [block_estimates(RandomFourierFeatures(2 * D, sampler="orthogonal", seed=s), zs, direction, "cpu", D)[0]
         for s in range(seeds)]
    )
    for j, z in enumerate(zs):
        mc, se = mean_and_se(est[:, j])
        assert abs(mc - rbf(z)) <= 4 * se
        var, var_se = variance_and_se(est[:, j])
        assert abs(var - orf_variance(z, d, D)) <= 4 * var_se, (z, var, orf_variance(z, d, D))


def test_partial_last_block_is_unbiased(device):
    # m = 4·B + 2 frequencies at d = 4: B full blocks and one truncated block; every row is N(0, I).
    d = 4
    fm = RandomFourierFeatures(2 * (4 * 5000 + 2), sampler="orthogonal", seed=5)
    est = block_estimates(fm, [1.0], unit_vector(d, 1), device, block=1)[:, 0]
    mc, se = mean_and_se(est)
    assert abs(mc - rbf(1.0)) <= 4 * se
    assert fm.frequency_matrix().shape == (4 * 5000 + 2, d)


# -------------------------------------------------------------- variances
ZS = [0.25, 0.5, 1.0, 1.5, 2.0, 3.0]


@pytest.mark.parametrize("D", [1, 4])
def test_rff_variance_closed_form(D, device):
    # Check 9: Var = (1 − e^{−z²})²/(2D) for sin/cos pairs.
    fm = RandomFourierFeatures(2 * 20000 * D, sampler="iid", seed=20 + D)
    est = block_estimates(fm, ZS, unit_vector(3, 2), device, block=D)
    for j, z in enumerate(ZS):
        var, se = variance_and_se(est[:, j])
        assert abs(var - rff_variance(z, D)) <= 4 * se, (z, var, rff_variance(z, D))


def test_orf_variance_oracle_reproduces_table():
    # Exact ORF/RFF variance ratios, D = d (notes §B5 table).
    table = {(4, 1.0): 0.4092, (8, 0.5): 0.2742, (8, 3.0): 1.0023, (32, 0.1): 0.0877, (32, 1.5): 0.3297,
             (32, 3.0): 0.9920, (128, 2.0): 0.6934, (64, 2.5): 0.9246}
    for (d, z), ratio in table.items():
        assert abs(orf_variance(z, d, d) / rff_variance(z, d) - ratio) < 6e-5, (d, z)
    # Small-z floor 3/(d + 2) set by the χ-norm noise.
    assert abs(orf_variance(0.1, 16, 16) / rff_variance(0.1, 16) - 3 / 18) < 2e-3


@pytest.mark.parametrize("d, num_blocks", [(4, 20000), (8, 20000), (32, 4000)])
def test_orf_variance_equals_exact_finite_d_series(d, num_blocks, device):
    # Check 11: one D = d block; MC variance vs the B5 series.
    fm = RandomFourierFeatures(2 * num_blocks * d, sampler="orthogonal", seed=30 + d)
    est = block_estimates(fm, ZS, unit_vector(d, 3), device, block=d)
    for j, z in enumerate(ZS):
        var, se = variance_and_se(est[:, j])
        assert abs(var - orf_variance(z, d, d)) <= 4 * se, (d, z, var, orf_variance(z, d, d), se)


@pytest.mark.parametrize("d", [4, 8, 16])
def test_orf_variance_below_rff(d, device):
    # Check 12: ORF < RFF for z ∈ (0, 2.5] (not asserted for z ≥ 3 at d ≤ 8: ratio 1.0023 at d = 8).
    zs = [0.25, 0.5, 1.0, 1.5, 2.0, 2.5]
    num_blocks = 20000 if d < 16 else 8000  # the gap to RFF at z = 2.5 is 14%, 9%, 8%
    fm = RandomFourierFeatures(2 * num_blocks * d, sampler="orthogonal", seed=40 + d)
    est = block_estimates(fm, zs, unit_vector(d, 4), device, block=d)
    for j, z in enumerate(zs):
        var, se = variance_and_se(est[:, j])
        assert var + 4 * se < rff_variance(z, d), (d, z, var, rff_variance(z, d))
    assert orf_variance(3.0, 8, 8) > rff_variance(3.0, 8)


def test_stacked_blocks_divide_variance(device):
    # Check 16: D = m·d stacks m independent blocks, so Var(m blocks) = Var(1 block)/m.
    d, m, zs = 4, 4, [0.5, 1.0, 2.0]
    fm = RandomFourierFeatures(2 * 20000 * m * d, sampler="orthogonal", seed=50)
    est = block_estimates(fm, zs, unit_vector(d, 5), device, block=m * d)
    for j, z in enumerate(zs):
        var, se = variance_and_se(est[:, j])
        assert abs(var - orf_variance(z, d, d) / m) <= 4 * se, (z, var, orf_variance(z, d, d) / m)


# ------------------------------------------------------------------- SORF
@pytest.mark.parametrize("axis_aligned", [False, True])
def test_sorf_bias_matches_lemma5_at_d32(axis_aligned, device):
    # Check 13: bias ≈ −e^{−z²/2} z⁴/(4d); one HD block would give k̂ ≡ cos z on z·e₁ (check 15).
    d, zs = 32, [1.0, 1.5, 2.0]
    direction = torch.eye(d, dtype=torch.float64)[0] if axis_aligned else unit_vector(d, 6)
    fm = RandomFourierFeatures(2 * 5000 * d, sampler="structured", seed=60 + axis_aligned)
    est = block_estimates(fm, zs, direction, device, block=d)
    for j, z in enumerate(zs):
        mc, se = mean_and_se(est[:, j])
        approx = -rbf(z) * z**4 / (4 * d)
        bias = mc - rbf(z)
        assert abs(bias - approx) <= 4 * se + 0.1 * abs(approx), (z, bias, approx, se)
        assert bias + 4 * se < 0  # SORF underestimates: never assert unbiasedness at small d
        assert est[:, j].std() > 0.005  # a random estimate, not the deterministic cos z of one block


def test_sorf_pads_and_uses_padded_dimension(device):
    # d = 20 is padded to 32; the √d scale must use the padded d (pitfall 5).
    d, zs = 20, [1.0, 2.0]
    fm = RandomFourierFeatures(2 * 5000 * 32, sampler="structured", seed=70)
    est = block_estimates(fm, zs, unit_vector(d, 7), device, block=32)
    for j, z in enumerate(zs):
        mc, se = mean_and_se(est[:, j])
        approx = -rbf(z) * z**4 / (4 * 32)
        assert abs(mc - rbf(z) - approx) <= 4 * se + 0.15 * abs(approx), (z, mc - rbf(z), approx)


def test_sorf_nearly_unbiased_at_d1024(device):
    # Check 13: at d = 1024 the bias is below 10⁻³ for z ≤ 2 (Lemma 5: ≤ 5.3e-4).
    d, zs = 1024, [0.5, 1.0, 2.0]
    fm = RandomFourierFeatures(2 * 600 * d, sampler="structured", seed=80)
    est = block_estimates(fm, zs, unit_vector(d, 8), device, block=d, dtype=torch.float32)
    for j, z in enumerate(zs):
        mc, se = mean_and_se(est[:, j])
        lemma5 = rbf(z) * z**4 / (4 * d)
        assert abs(mc - rbf(z)) <= 4 * se + lemma5, (z, mc - rbf(z), se)
        if z <= 1.0:  # small per-block variance there: the MC resolves the 10⁻³ claim
            assert 4 * se + lemma5 < 1e-3


def test_sorf_error_matches_orf_prime_and_is_close_to_orf(device):
    # Check 14: at d = 64 the SORF MSE ≈ the exact ORF' MSE, and close to ORF's variance.
    d, zs = 64, [1.0, 1.5, 2.0]
    fm = RandomFourierFeatures(2 * 3000 * d, sampler="structured", seed=90)
    est = block_estimates(fm, zs, unit_vector(d, 9), device, block=d)
    for j, z in enumerate(zs):
        assert abs(mean_and_se(est[:, j])[0] - orf_prime_mean(z, d)) <= 4 * mean_and_se(est[:, j])[1] + 2e-4
        squared_error, se = mean_and_se((est[:, j] - rbf(z)) ** 2)
        assert abs(squared_error - orf_prime_mse(z, d, d)) <= 4 * se + 0.05 * orf_prime_mse(z, d, d)
        ratio_to_orf = squared_error / orf_variance(z, d, d)
        assert 0.6 < ratio_to_orf < 1.4, (z, ratio_to_orf)
        assert squared_error < rff_variance(z, d)


# ------------------------------------------------------- other densities
DENSITIES = [MaternSpectralDensity(0.5), MaternSpectralDensity(1.5), MaternSpectralDensity(2.5),
             RationalQuadraticSpectralDensity(0.5), RationalQuadraticSpectralDensity(3.0)]


@pytest.mark.parametrize("density", DENSITIES, ids=repr)
@pytest.mark.parametrize("sampler", ["iid", "orthogonal"])
def test_non_gaussian_densities_unbiased(density, sampler, device):
    d, zs = 3, [0.3, 1.0, 2.5]
    fm = RandomFourierFeatures(2 * 20000 * d, spectral_density=density, sampler=sampler, seed=100)
    est = block_estimates(fm, zs, unit_vector(d, 10), device, block=d)
    truth = density.correlation(torch.tensor(zs, dtype=torch.float64))
    for j in range(len(zs)):
        mc, se = mean_and_se(est[:, j])
        assert abs(mc - truth[j].item()) <= 4 * se, (density, zs[j], mc, truth[j].item(), se)


@pytest.mark.parametrize("density", DENSITIES[:3], ids=repr)
def test_structured_matern_close_at_d64(density, device):
    d, zs = 64, [0.5, 1.0, 2.0]
    fm = RandomFourierFeatures(2 * 500 * d, spectral_density=density, sampler="structured", seed=110)
    est = block_estimates(fm, zs, unit_vector(d, 11), device, block=d)
    truth = density.correlation(torch.tensor(zs, dtype=torch.float64))
    for j in range(len(zs)):
        mc, se = mean_and_se(est[:, j])
        assert abs(mc - truth[j].item()) <= 4 * se + 0.01


@pytest.mark.parametrize("nu", [0.5, 1.5, 2.5])
def test_matern_correlation_matches_gpytorch(nu):
    import gpytorch

    x = torch.randn(6, 3, dtype=torch.float64)
    kernel = gpytorch.kernels.MaternKernel(nu=nu).double()
    kernel.lengthscale = 1.0
    r = torch.cdist(x, x)
    torch.testing.assert_close(MaternSpectralDensity(nu).correlation(r), kernel.forward(x, x).detach())
    assert GaussianSpectralDensity().correlation(torch.tensor(1.0)).item() == pytest.approx(math.exp(-0.5))


@pytest.mark.parametrize("alpha", [0.5, 3.0])
def test_rq_correlation_matches_gpytorch(alpha):
    import gpytorch

    x = torch.randn(6, 3, dtype=torch.float64)
    kernel = gpytorch.kernels.RQKernel().double()
    kernel.alpha = alpha
    kernel.lengthscale = 1.0
    torch.testing.assert_close(RationalQuadraticSpectralDensity(alpha).correlation(torch.cdist(x, x)),
                               kernel.forward(x, x).detach())


@pytest.mark.parametrize("d", [1, 2, 3])
def test_sorf_in_low_dimension_approximates_rbf(d):
    # Without padding to MIN_STRUCTURED_DIM every frequency would have norm √d (at d = 2 all
    # rows are (±1, ±1)), a kernel far from the RBF whatever the width (error ≈ 1.6 at d = 2).
    x = torch.randn(60, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    exact = torch.exp(-0.5 * torch.cdist(x, x) ** 2)
    fm = RandomFourierFeatures(4096, sampler="structured", seed=0).double()
    approx = fm(x) @ fm(x).T
    assert ((approx - exact).norm() / exact.norm()).item() < 0.1


def test_sorf_dense_and_fwht_paths_agree():
    from rfgp.features.fourier import DENSE_STRUCTURED_MAX_DIM

    fm = RandomFourierFeatures(512, input_dim=20, sampler="structured", seed=1).double()
    x = torch.randn(7, 20, dtype=torch.float64)
    assert x.shape[-1] <= DENSE_STRUCTURED_MAX_DIM
    torch.testing.assert_close(fm.project(x), fm._structured_transform(x), rtol=1e-12, atol=1e-12)


def test_sin_cos_features_gradient():
    from rfgp.features.fourier import _SinCosFeatures

    projection = torch.randn(5, 3, 4, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda p: _SinCosFeatures.apply(p, 0.7), (projection,))


def test_sin_cos_features_forward_mode():
    """Forward mode (jvp) against finite differences and reverse mode, its generated vmap rule (batched forward
    grads, jacfwd) and forward-over-reverse second derivatives: the Function had no jvp ("You must implement the jvp
    function"), so a forward-mode Hessian of an RFF posterior failed."""
    from rfgp.features.fourier import _SinCosFeatures

    projection = torch.randn(2, 3, 4, dtype=torch.float64, requires_grad=True)

    def features(p):
        return _SinCosFeatures.apply(p, 0.7)

    torch.autograd.gradcheck(features, (projection,), check_forward_ad=True, check_batched_forward_grad=True)
    torch.autograd.gradgradcheck(features, (projection,), check_fwd_over_rev=True)
    forward = torch.func.jacfwd(features)(projection.detach())
    torch.testing.assert_close(forward, torch.func.jacrev(features)(projection.detach()), rtol=1e-14, atol=1e-15)
