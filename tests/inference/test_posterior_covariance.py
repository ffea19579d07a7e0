"""LowRankPosteriorCovariance: Σ* = RRᵀ behaves as the dense matrix, samples through R, and has a square root."""

import math

import gpytorch
import pytest
import torch
from gpytorch.distributions import MultivariateNormal
from linear_operator.operators import DiagLinearOperator, LowRankRootLinearOperator, MatmulLinearOperator
from linear_operator.utils.memoize import _is_in_cache_ignore_args

from rfgp.inference.kernel_space import kernel_space_posterior_caches
from rfgp.inference.linalg import capacitance_cholesky
from rfgp.inference.posterior_covariance import (
    FeatureSpacePosteriorCovariance,
    KernelSpacePosteriorCovariance,
    LowRankPosteriorAddedDiag,
    LowRankPosteriorCovariance,
    feature_posterior_covariance,
    stack_independent,
)


def _root(n, f, batch=(), seed=0):
    return torch.randn(*batch, n, f, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


@pytest.mark.parametrize("n, f", [(7, 3), (5, 5), (4, 9)])
def test_dense_matrix_diagonal_and_products_equal_rrt(n, f):
    root = _root(n, f, batch=(2,))
    covar = LowRankPosteriorCovariance(root)
    dense = root @ root.mT
    rhs = torch.randn(2, n, 3, dtype=torch.float64)
    torch.testing.assert_close(covar.to_dense(), dense)
    torch.testing.assert_close(covar.diagonal(), dense.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(covar @ rhs, dense @ rhs)
    torch.testing.assert_close(covar[..., 1:3, :].to_dense(), dense[..., 1:3, :])
    torch.testing.assert_close(covar.mT.to_dense(), dense)
    torch.testing.assert_close(covar.expand(3, 2, n, n).to_dense(), dense.expand(3, 2, n, n))
    torch.testing.assert_close(covar.detach().to(torch.float32).to_dense(), dense.float())


@pytest.mark.parametrize("n, f", [(7, 3), (5, 5), (4, 9)])
def test_root_decomposition_is_a_square_lower_triangular_factor(n, f):
    """Code that reads the root as a Cholesky factor (BoTorch's cached-root qNEI) needs L of shape n × n."""
    root = _root(n, f)
    with gpytorch.settings.fast_computations(covar_root_decomposition=False):
        factor = LowRankPosteriorCovariance(root).root_decomposition().root.to_dense()
    assert factor.shape == (n, n)
    torch.testing.assert_close(factor, factor.tril())
    torch.testing.assert_close(factor @ factor.mT, root @ root.mT, atol=1e-6, rtol=1e-6)  # jitter when n > F


def test_samples_go_through_the_low_rank_root_and_have_covariance_rrt():
    n, f, num_samples = 6, 3, 40_000
    root = _root(n, f)
    normal = MultivariateNormal(torch.zeros(n, dtype=torch.float64), LowRankPosteriorCovariance(root))
    assert normal.base_sample_shape == torch.Size([n])
    torch.manual_seed(0)
    samples = normal.rsample(torch.Size([num_samples]))
    assert samples.shape == (num_samples, n)
    # Samples lie in the column space of R (rank F): drawn as R·ε, not through a jittered n × n factor.
    residual = samples.mT - root @ torch.linalg.lstsq(root, samples.mT).solution
    assert residual.abs().max() < 1e-10
    dense = root @ root.mT
    empirical = samples.mT @ samples / num_samples
    standard_error = (dense.diagonal().outer(dense.diagonal()) + dense.pow(2)).sqrt() / math.sqrt(num_samples)
    assert ((empirical - dense).abs() < 5 * standard_error).all()


def test_samples_from_base_samples_of_the_event_shape():
    n, f = 6, 3
    root = _root(n, f, batch=(2,))
    normal = MultivariateNormal(torch.zeros(2, n, dtype=torch.float64), LowRankPosteriorCovariance(root))
    base = torch.randn(4, 2, n, dtype=torch.float64)
    samples = normal.rsample(torch.Size([4]), base_samples=base)
    with gpytorch.settings.fast_computations(covar_root_decomposition=False):
        factor = normal.lazy_covariance_matrix.root_decomposition().root.to_dense()
    torch.testing.assert_close(samples, (factor @ base.unsqueeze(-1)).squeeze(-1))


def test_log_prob_gradient_flows_to_the_root():
    n, f = 4, 6
    root = _root(n, f).requires_grad_(True)
    target = torch.randn(n, dtype=torch.float64)
    value = MultivariateNormal(torch.zeros(n, dtype=torch.float64), LowRankPosteriorCovariance(root)).log_prob(target)
    (grad,) = torch.autograd.grad(value, root)
    dense_root = root.detach().clone().requires_grad_(True)
    expected = torch.distributions.MultivariateNormal(torch.zeros(n, dtype=torch.float64),
                                                      dense_root @ dense_root.mT).log_prob(target)
    (expected_grad,) = torch.autograd.grad(expected, dense_root)
    torch.testing.assert_close(value, expected)
    torch.testing.assert_close(grad, expected_grad)


def test_root_must_be_a_matrix():
    with pytest.raises(ValueError, match="root must be a tensor of shape"):
        LowRankPosteriorCovariance(torch.ones(3))


@pytest.mark.parametrize("n, f", [(40, 8), (6, 30)])  # Woodbury (n > F) and dense Cholesky (n < F)
def test_added_diagonal_log_density_is_exact_by_the_cheaper_algebra(n, f):
    root = _root(n, f, batch=(2,))
    noise = 0.05 + torch.rand(2, n, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    covar = LowRankPosteriorCovariance(root) + DiagLinearOperator(noise)
    assert isinstance(covar, LowRankPosteriorAddedDiag)
    covar = covar + DiagLinearOperator(torch.full((n,), 0.01, dtype=torch.float64))  # noise on a correction
    assert isinstance(covar, LowRankPosteriorAddedDiag)
    dense = root @ root.mT + torch.diag_embed(noise + 0.01)
    target = torch.randn(2, n, dtype=torch.float64)
    mean = torch.zeros(2, n, dtype=torch.float64)
    expected = torch.distributions.MultivariateNormal(mean, dense).log_prob(target)
    with gpytorch.settings.max_cholesky_size(0):  # no dense fallback inside linear_operator either
        torch.testing.assert_close(MultivariateNormal(mean, covar).log_prob(target), expected)
    torch.testing.assert_close(covar.to_dense(), dense)


def test_added_diagonal_samples_have_covariance_rrt_plus_d():
    n, f, num_samples = 5, 2, 40_000
    root = _root(n, f)
    noise = torch.linspace(0.1, 0.5, n, dtype=torch.float64)
    normal = MultivariateNormal(torch.zeros(n, dtype=torch.float64), LowRankPosteriorCovariance(root)
                                + DiagLinearOperator(noise))
    torch.manual_seed(1)
    samples = normal.rsample(torch.Size([num_samples]))
    dense = root @ root.mT + torch.diag(noise)
    empirical = samples.mT @ samples / num_samples
    standard_error = (dense.diagonal().outer(dense.diagonal()) + dense.pow(2)).sqrt() / math.sqrt(num_samples)
    assert ((empirical - dense).abs() < 5 * standard_error).all()


@pytest.mark.parametrize("num_data, num_features, kernel_space", [(300, 64, False), (30, 256, True)])
def test_posterior_of_a_feature_gp_beyond_max_cholesky_size_is_exact(num_data, num_features, kernel_space):
    """n* = 900 > max_cholesky_size test points, in either algebra of the posterior: gpytorch.metrics take the exact
    Woodbury form, not CG (was 1e-4 off and slow), and joint draws go through the n × F root, not a Lanczos root
    decomposition (the kernel-space posterior was a difference of two roots: 64 approximate draws took 14 s)."""
    import rfgp

    g = torch.Generator().manual_seed(0)
    x = torch.rand(num_data, 2, generator=g, dtype=torch.float64)
    test_x = torch.rand(900, 2, generator=g, dtype=torch.float64)
    y, test_y = torch.sin(6 * x[:, 0]), torch.sin(6 * test_x[:, 0]) + 0.1
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(num_features, seed=0))
    model = rfgp.models.ExactGPModel(x, y, likelihood, kernel).double().eval()
    likelihood.noise = 0.01
    with torch.no_grad():
        latent = model(test_x)
        assert model.prediction_strategy.uses_kernel_space == kernel_space
        assert isinstance(latent.lazy_covariance_matrix, LowRankPosteriorCovariance)
        predictive = likelihood(latent)
        assert isinstance(predictive.lazy_covariance_matrix, LowRankPosteriorAddedDiag)
        value = gpytorch.metrics.negative_log_predictive_density(predictive, test_y)
        dense = torch.distributions.MultivariateNormal(predictive.mean, predictive.covariance_matrix)
        torch.testing.assert_close(value, -dense.log_prob(test_y) / test_y.numel(), rtol=1e-10, atol=1e-10)
        samples = latent.rsample(torch.Size([4000]))[:, :6]
    covar = latent.covariance_matrix[:6, :6]
    variance = covar.diagonal()
    se = ((variance.unsqueeze(-1) * variance.unsqueeze(-2) + covar.pow(2)) / 4000).sqrt()
    assert ((torch.cov(samples.mT) - covar).abs() <= 4 * se).all()


def test_batch_members_and_principal_slices_keep_the_root():
    """BoTorch takes a batched multi-output posterior apart with ``covar[..., t, :, :]``: each output keeps R."""
    root = _root(5, 3, batch=(2,))
    noise = torch.rand(2, 5, dtype=torch.float64)
    dense = root @ root.mT
    for covar, full in ((LowRankPosteriorCovariance(root), dense),
                        (LowRankPosteriorAddedDiag(LowRankRootLinearOperator(root), DiagLinearOperator(noise)),
                         dense + torch.diag_embed(noise))):
        for index in ((1,), (0, slice(1, 4), slice(1, 4)), (slice(None), slice(None, 2), slice(None, 2))):
            part = covar[index]
            assert type(part) is type(covar)
            torch.testing.assert_close(part.to_dense(), full[index])
        torch.testing.assert_close(covar[0, 1:3, 0:2].to_dense(), full[0, 1:3, 0:2])  # not principal: linear_operator


def test_stack_independent_pads_roots_of_different_widths():
    roots = [_root(5, 3, seed=0), _root(5, 7, seed=1)]
    stacked = stack_independent([LowRankPosteriorCovariance(r) for r in roots], torch.Size([4]))
    assert isinstance(stacked, LowRankPosteriorCovariance) and stacked.low_rank_root.shape == (4, 2, 5, 7)
    expected = torch.stack([r @ r.mT for r in roots]).expand(4, 2, 5, 5)
    torch.testing.assert_close(stacked.to_dense(), expected)
    noisy = [LowRankPosteriorAddedDiag(LowRankRootLinearOperator(r), DiagLinearOperator(torch.rand(5, dtype=r.dtype)))
             for r in roots]
    stacked = stack_independent(noisy, torch.Size())
    assert isinstance(stacked, LowRankPosteriorAddedDiag)
    torch.testing.assert_close(stacked.to_dense(), torch.stack([n.to_dense() for n in noisy]))
    assert stack_independent([LowRankPosteriorCovariance(roots[0]), noisy[1]], torch.Size()) is None  # mixed kinds


def test_t_batched_test_points_solve_with_one_factor(monkeypatch):
    """b sets of q test points (BoTorch's t-batches: ``(b, q, d)`` against an unbatched model) are solved against the
    one F × F factor L_A as b·q right-hand sides (the root and blocks of rows alike), not with L_A broadcast to b
    copies and b solves (0.31 s per acquisition evaluation at N = 3000, F = 1024, b = 8), with the values and
    test-input gradients of each set's own posterior and of the dense algebra of the same kernel."""
    import rfgp

    g = torch.Generator().manual_seed(0)
    x = torch.rand(300, 2, generator=g, dtype=torch.float64)
    y = torch.sin(6 * x[:, 0])
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(32, seed=0))
    model = rfgp.models.ExactGPModel(x, y, likelihood, kernel).double().eval()
    likelihood.noise = 0.01
    test_x = torch.rand(6, 3, 2, generator=g, dtype=torch.float64, requires_grad=True)
    broadcast = []
    solve = torch.linalg.solve_triangular

    def spy(matrix, rhs, *args, **kwargs):
        if matrix.shape[-1] == 32:
            broadcast.append(torch.broadcast_shapes(matrix.shape[:-2], rhs.shape[:-2]).numel())
        return solve(matrix, rhs, *args, **kwargs)

    model(x[:1])  # the caches
    monkeypatch.setattr(torch.linalg, "solve_triangular", spy)
    batched = model(test_x)
    batched.lazy_covariance_matrix[..., -2:, :].to_dense()  # rows Φ_rA⁻¹ without the root: two solves
    batched.lazy_covariance_matrix.low_rank_root  # formed where it is read
    assert broadcast == [1, 1, 1]
    monkeypatch.setattr(torch.linalg, "solve_triangular", solve)
    (batched.mean.sum() + batched.covariance_matrix.sum()).backward()
    gradient, test_x.grad = test_x.grad.clone(), None
    with torch.no_grad():
        train = kernel(x).to_dense() + 0.01 * torch.eye(300, dtype=torch.float64)
    for i in range(6):
        single = model(test_x[i])
        torch.testing.assert_close(batched.mean[i], single.mean, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(batched.covariance_matrix[i], single.covariance_matrix, rtol=1e-10, atol=1e-12)
        cross, prior = kernel(test_x[i], x).to_dense(), kernel(test_x[i]).to_dense()
        dense = prior - cross @ torch.linalg.solve(train, cross.mT)
        torch.testing.assert_close(batched.covariance_matrix[i], dense, rtol=1e-7, atol=1e-9)
        (single.mean.sum() + single.covariance_matrix.sum()).backward()
    torch.testing.assert_close(gradient, test_x.grad, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("shape", [(5, 7), (7, 5), (3, 4, 5, 7), (1, 5, 2)])
def test_shape_comes_from_the_root_as_for_the_matmul_operator(shape):
    """``shape`` (read dozens of times per BoTorch acquisition evaluation) from R alone, equal to the product's."""
    root = torch.randn(*shape, dtype=torch.float64)
    covariance = LowRankPosteriorCovariance(root)
    assert covariance.shape == MatmulLinearOperator(root, root.mT).shape == (root @ root.mT).shape
    assert covariance[..., 1:3, 1:3].shape == (root[..., 1:3, :] @ root[..., 1:3, :].mT).shape


def _posterior_factor(kernel_space: bool, batch: tuple, dtype=torch.float64):
    """(a prediction strategy's factor, the training features Φ, requiring a gradient, and the dense A⁻¹ =
    (I + ΦᵀD⁻¹Φ)⁻¹ in float64) at F = 50 features: N = 30 < F (kernel space) or N = 80 > F (feature space),
    D = 0.1·I."""
    gen = torch.Generator().manual_seed(0)
    train = torch.randn(*batch, 30 if kernel_space else 80, 50, generator=gen, dtype=torch.float64)
    train = train.to(dtype).requires_grad_(True)
    noise = torch.full(train.shape[:-1], 0.1, dtype=dtype)
    if kernel_space:
        _, factor = kernel_space_posterior_caches(train, noise, torch.zeros(train.shape[-2], 1, dtype=dtype))
    else:  # chol(A) in float64, rounded to the model's dtype, as the prediction strategy's cache
        factor = capacitance_cholesky(train.mT @ (train / noise.unsqueeze(-1))).to(dtype)
    wide = train.double()
    weight_covariance = torch.linalg.inv(torch.eye(50, dtype=torch.float64) + wide.mT @ wide / 0.1)
    return factor, train, weight_covariance


@pytest.mark.parametrize("factor_batch, features_batch", [((), (3,)), ((), (2, 3)), ((3,), (2, 3))])
@pytest.mark.parametrize("kernel_space", [True, False], ids=["kernel-space", "feature-space"])
def test_lazy_root_covariance_rows_rescaling_and_slices_equal_the_whole_root(kernel_space, factor_batch,
                                                                            features_batch):
    """A posterior's rows Σ*[r, :] (BoTorch's cached-root qLogNEI reads the q bottom rows of t-batches of
    candidates) come without the n × F root, in kernel space as (Φ_rR)Rᵀ and in feature space as (Φ_rL_A⁻ᵀ)L_A⁻¹,
    and equal Φ*A⁻¹Φ*ᵀ with the dense A⁻¹ — through ``rescaled`` (``Standardize``) and constants too, with the
    gradients of the test and the training features; principal slices, batch operations, the diagonal and the
    dense matrix read the root."""
    factor, train, weight_covariance = _posterior_factor(kernel_space, factor_batch)
    gen = torch.Generator().manual_seed(1)
    features = torch.randn(*features_batch, 7, 50, generator=gen, dtype=torch.float64, requires_grad=True)
    scale = torch.rand(*features_batch, 7, generator=gen, dtype=torch.float64) + 0.5
    covariance = feature_posterior_covariance(features, factor, kernel_space).rescaled(scale) * 2.0
    assert type(covariance) is (KernelSpacePosteriorCovariance if kernel_space else FeatureSpacePosteriorCovariance)
    scaled = math.sqrt(2.0) * scale.unsqueeze(-1) * features
    dense = scaled @ weight_covariance @ scaled.mT
    rows = covariance[..., -2:, :]
    assert not _is_in_cache_ignore_args(covariance, "lazy_posterior_root")  # the rows did not form the root
    assert rows.shape == dense[..., -2:, :].shape
    torch.testing.assert_close(rows.to_dense(), dense[..., -2:, :], rtol=1e-10, atol=1e-12)
    gradients = torch.autograd.grad(rows.to_dense().sum(), (features, train))
    expected = torch.autograd.grad(dense[..., -2:, :].sum(), (features, train))
    for gradient, reference in zip(gradients, expected):
        torch.testing.assert_close(gradient, reference, rtol=1e-9, atol=1e-10)
    index = (1,) * len(features_batch)
    torch.testing.assert_close(covariance[(*index, slice(2, 5), slice(2, 5))].to_dense(), dense[index][2:5, 2:5],
                               rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(covariance.diagonal(dim1=-2, dim2=-1), dense.diagonal(dim1=-2, dim2=-1))
    torch.testing.assert_close(covariance.to_dense(), dense)
    shape = (2, *dense.shape)
    torch.testing.assert_close(covariance.unsqueeze(0).expand(shape).to_dense(), dense.expand(shape))


@pytest.mark.parametrize("kernel_space", [True, False], ids=["kernel-space", "feature-space"])
def test_float32_rows_are_as_accurate_as_the_whole_roots_also_under_autocast(kernel_space):
    """Float32 rows Σ*[r, :] are float32, as close to the float64 posterior as the float32 whole root's products,
    and bit for bit the same under a bfloat16 autocast (formed in full precision)."""
    factor, _, weight_covariance = _posterior_factor(kernel_space, (), dtype=torch.float32)
    factor = factor.detach() if torch.is_tensor(factor) else type(factor)(*(part.detach() for part in factor))
    features = torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(1))
    dense = (features.double() @ weight_covariance.detach() @ features.double().mT)[..., -2:, :]
    covariance = feature_posterior_covariance(features, factor, kernel_space)
    rows = covariance[..., -2:, :].to_dense()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        mixed = covariance[..., -2:, :].to_dense()
    root = covariance.low_rank_root
    whole = (root @ root.mT)[..., -2:, :]
    assert rows.dtype == mixed.dtype == root.dtype == torch.float32
    error, whole_error = (rows.double() - dense).abs().max(), (whole.double() - dense).abs().max()
    assert error <= 2 * whole_error
    torch.testing.assert_close(mixed, rows, rtol=0, atol=0)


@pytest.mark.parametrize("kernel_space", [True, False], ids=["kernel-space", "feature-space"])
def test_a_root_first_read_without_gradients_is_formed_again_with_them(kernel_space):
    """Before: the lazily formed root was cached whatever the grad mode, so a posterior whose variance was first read
    under ``torch.no_grad()`` (a diagnostic print, say) gave a later sample or variance no graph — gradients w.r.t.
    the test points silently missing the covariance's part.  Now the root is formed once per grad mode."""
    factor, _, _ = _posterior_factor(kernel_space, ())
    features = torch.randn(7, 50, generator=torch.Generator().manual_seed(1), dtype=torch.float64,
                           requires_grad=True)
    fresh = feature_posterior_covariance(features, factor, kernel_space)
    (expected,) = torch.autograd.grad(fresh.diagonal(dim1=-2, dim2=-1).sum(), features)
    covariance = feature_posterior_covariance(features, factor, kernel_space)
    with torch.no_grad():
        without = covariance.diagonal(dim1=-2, dim2=-1)
    variance = covariance.diagonal(dim1=-2, dim2=-1)
    assert variance.requires_grad
    (gradient,) = torch.autograd.grad(variance.sum(), features)
    torch.testing.assert_close(gradient, expected, rtol=1e-12, atol=0)
    torch.testing.assert_close(without, variance.detach(), rtol=0, atol=0)
