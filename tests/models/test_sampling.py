"""rfgp.models.sampling.posterior_paths: weight-space function draws reproduce the model's posterior mean and
covariance (within Monte-Carlo standard errors), batched and chunked, with the bias correction as noise."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.inference.kernel_space import kernel_space_posterior_caches
from rfgp.inference.prediction import FeatureSpacePredictionStrategy
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel
from rfgp.models.sampling import posterior_paths
from tests._feature_maps import ShrunkFourierFeatures

NUM_PATHS = 4000


def fitted(kernel, n=60, d=2, batch=torch.Size()):
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    y = y.expand(*batch, n) * torch.arange(1, batch.numel() + 1, dtype=torch.float64).reshape(*batch, 1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch)
    gp = ExactGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(kernel, batch_shape=batch)).double()
    gp.mean_module = gpytorch.means.ConstantMean(batch_shape=batch).double()
    gp.mean_module.constant.data.fill_(0.2)
    gp.covar_module.outputscale = 1.5
    gp.likelihood.noise = 0.05
    return gp.eval()


def assert_matches_posterior(gp, xs, values):
    """Sample mean and covariance of the draws against the posterior, |error| ≤ 4·SE entrywise."""
    with torch.no_grad():
        posterior = gp(xs)
        mean, covar = posterior.mean, posterior.covariance_matrix
    num = values.shape[0]
    variance = covar.diagonal(dim1=-1, dim2=-2)
    assert ((values.mean(0) - mean).abs() <= 4 * (variance / num).sqrt()).all()
    centred = values - values.mean(0)
    sample_covar = centred.unsqueeze(-1).mul(centred.unsqueeze(-2)).sum(0) / (num - 1)
    se = ((variance.unsqueeze(-1) * variance.unsqueeze(-2) + covar.pow(2)) / num).sqrt()
    assert ((sample_covar - covar).abs() <= 4 * se).all()


@pytest.mark.parametrize("method", ["rff", "sorf"])
def test_paths_match_posterior_mean_and_covariance(method):
    gp = fitted(SketchedRBFKernel(64, method=method, ard_num_dims=2, seed=0))
    xs = torch.linspace(-2.5, 2.5, 7, dtype=torch.float64).unsqueeze(-1).expand(7, 2).contiguous()
    paths = posterior_paths(gp, NUM_PATHS, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        values = paths(xs)
    assert values.shape == (NUM_PATHS, 7)
    assert_matches_posterior(gp, xs, values)


@pytest.mark.parametrize("num_features, kernel_space", [(32, False), (256, True)])
def test_batched_model_paths(num_features, kernel_space):
    batch = torch.Size([2])
    gp = fitted(SketchedRBFKernel(num_features, ard_num_dims=2, seed=1, batch_shape=batch), batch=batch)
    xs = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        values = posterior_paths(gp, NUM_PATHS, generator=torch.Generator().manual_seed(1))(xs)
    assert gp.prediction_strategy.uses_kernel_space == kernel_space  # N = 60: F = 256 is cheaper in kernel space
    assert values.shape == (NUM_PATHS, 2, 5)
    assert_matches_posterior(gp, xs, values)


def test_wide_features_over_few_points_draw_in_kernel_space_without_an_f_by_f_matrix(monkeypatch):
    """N = 30, F = 2048: Matheron's rule with the 30 × 30 factor of ΦΦᵀ + D; the F × F caches are never built."""
    gp = fitted(SketchedRBFKernel(2048, ard_num_dims=2, seed=4), n=30)

    def refuse(self, nan_policy):
        raise AssertionError("the F × F caches were built")

    monkeypatch.setattr(FeatureSpacePredictionStrategy, "_mean_covar_cache", refuse)
    xs = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(7)) * 4 - 2
    paths = posterior_paths(gp, 3000, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        values = paths(xs)
    assert gp.prediction_strategy.uses_kernel_space and paths.weights.shape == (3000, 2048)
    assert_matches_posterior(gp, xs, values)


def test_many_paths_of_a_wide_feature_space_model_take_one_triangular_solve():
    """S = 4000 draws at F = 1024 (N = 1500: feature space): the draws are the columns of one solve with L, not a
    batch of S solves that would broadcast L to S × F × F (32 GiB)."""
    gp = fitted(SketchedRBFKernel(1024, ard_num_dims=2, seed=6), n=1500)
    paths = posterior_paths(gp, 4000, generator=torch.Generator().manual_seed(6))
    strategy = gp.prediction_strategy
    assert not strategy.uses_kernel_space and paths.weights.shape == (4000, 1024)
    mean, chol = strategy.mean_covar_cache
    normal = torch.randn(4000, 1024, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    expected = mean.squeeze(-1) + torch.linalg.solve_triangular(chol.mT, normal.mT, upper=True).mT
    torch.testing.assert_close(paths.weights, expected, rtol=1e-10, atol=1e-10)


def test_kernel_space_factor_is_a_root_of_the_posterior_weight_covariance():
    """R = I − WᵀQ (W = L⁻¹Φ, Q = (L + D^{1/2})⁻¹Φ) satisfies RRᵀ = A⁻¹ = (I + ΦᵀD⁻¹Φ)⁻¹, and its posterior root at
    test features reproduces Φ*A⁻¹Φ*ᵀ — for heteroscedastic, tiny and batched noise."""
    gen = torch.Generator().manual_seed(8)
    features = torch.randn(2, 5, 12, generator=gen, dtype=torch.float64) / 2
    test = torch.randn(7, 12, generator=gen, dtype=torch.float64)
    heteroscedastic = torch.rand(2, 5, generator=gen, dtype=torch.float64) + 0.1
    for noise in (heteroscedastic, torch.full((2, 1), 1e-6, dtype=torch.float64)):
        _, factor = kernel_space_posterior_caches(features, noise, torch.zeros(2, 5, 1, dtype=torch.float64))
        weights = noise.expand(2, 5).reciprocal().unsqueeze(-1)
        covar = torch.linalg.inv(torch.eye(12, dtype=torch.float64) + features.mT @ (features * weights))
        root = factor.weight_root_product(torch.eye(12, dtype=torch.float64))
        torch.testing.assert_close(root @ root.mT, covar, rtol=1e-9, atol=1e-9)
        posterior_root = factor.posterior_root(test)
        torch.testing.assert_close(posterior_root @ posterior_root.mT, test @ covar @ test.mT, rtol=1e-9, atol=1e-9)


def test_paths_of_a_model_with_missing_targets_condition_on_the_observed_points():
    """Under observation_nan_policy("mask") the draws follow the posterior of the points whose target is observed,
    in either algebra (N = 60: F = 32 feature space, F = 256 kernel space)."""
    for num_features in (32, 256):
        gp = fitted(SketchedRBFKernel(num_features, ard_num_dims=2, seed=5))
        labels = gp.train_targets.clone()
        labels[::4] = float("nan")
        xs = torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(9)) * 4 - 2
        with gpytorch.settings.observation_nan_policy("mask"), torch.no_grad():
            gp.set_train_data(targets=labels, strict=False)
            values = posterior_paths(gp, NUM_PATHS, generator=torch.Generator().manual_seed(5))(xs)
            assert_matches_posterior(gp, xs, values)
        assert torch.isfinite(values).all()


def test_chunked_evaluation_and_chunked_training_operator_agree():
    gp = fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=2))
    xs = torch.rand(50, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    paths = posterior_paths(gp, 8, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        whole = paths(xs)
        with rfgp.settings.chunk_size(7):
            chunked = paths(xs)
            gp_chunked = fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=2))
            chunked_weights = posterior_paths(gp_chunked, 8, generator=torch.Generator().manual_seed(2)).weights
    torch.testing.assert_close(chunked, whole, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(chunked_weights, paths.weights, rtol=1e-10, atol=1e-12)


def test_variance_correction_is_added_as_independent_noise():
    gp = fitted(rfgp.kernels.RandomFeatureKernel(ShrunkFourierFeatures(64, shrink=0.6, input_dim=2, seed=0)))
    xs = torch.tensor([[4.0, 4.0], [-4.0, 3.0], [0.0, 0.0]], dtype=torch.float64)  # far from data: large correction
    generator = torch.Generator().manual_seed(3)
    with torch.no_grad():
        corrected = posterior_paths(gp, NUM_PATHS, generator=generator)(xs)
        plain = posterior_paths(gp, NUM_PATHS, generator=generator, variance_correction=False)(xs)
    assert_matches_posterior(gp, xs, corrected)  # the model's variance includes c(x) = 1.5·(1 − 0.6)
    with torch.no_grad():
        variance = gp(xs).variance
    plain_se = variance * (2 / NUM_PATHS) ** 0.5
    assert ((variance - 1.5 * 0.4 - plain.var(0)).abs() <= 4 * plain_se).all()
    assert (variance - plain.var(0) > 0.4).all()  # without the noise the draws miss c(x)


def test_operator_valued_kernel_paths():
    """A curl-free field: draws of shape (S, n, p) against the interleaved multitask posterior."""
    gen = torch.Generator().manual_seed(4)
    x = torch.rand(40, 2, generator=gen, dtype=torch.float64) * 2 - 1
    y = torch.stack((torch.cos(x[:, 0]), torch.sin(x[:, 1])), -1)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedCurlFreeKernel(32, input_dim=2, seed=0))
    gp = rfgp.MultiOutputGPModel(x, y, likelihood, kernel).double().eval()
    xs = torch.tensor([[0.1, 0.2], [-0.5, 0.7]], dtype=torch.float64)
    with torch.no_grad():
        values = posterior_paths(gp, NUM_PATHS, generator=torch.Generator().manual_seed(4))(xs)
        posterior = gp(xs)
    assert values.shape == (NUM_PATHS, 2, 2)
    flat = values.flatten(-2)  # interleaved, as the posterior covariance
    mean, covar = posterior.mean.flatten(-2), posterior.covariance_matrix
    variance = covar.diagonal()
    assert ((flat.mean(0) - mean).abs() <= 4 * (variance / NUM_PATHS).sqrt()).all()
    sample_covar = torch.cov(flat.T)
    se = ((variance.unsqueeze(-1) * variance.unsqueeze(-2) + covar.pow(2)) / NUM_PATHS).sqrt()
    assert ((sample_covar - covar).abs() <= 4 * se).all()


def test_paths_are_differentiable_in_x():
    gp = fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=0))
    xs = torch.zeros(3, 2, dtype=torch.float64, requires_grad=True)
    paths = posterior_paths(gp, 4)
    paths(xs).sum().backward()
    assert torch.isfinite(xs.grad).all() and not paths.weights.requires_grad


def test_errors_name_the_problem():
    exact = fitted(gpytorch.kernels.RBFKernel())
    with pytest.raises(TypeError, match="rfgp feature kernel"):
        posterior_paths(exact, 4)
    gp = fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=0))
    with pytest.raises(ValueError, match="num_paths"):
        posterior_paths(gp, 0)
    gp.train()
    with pytest.raises(ValueError, match="model.eval"):
        posterior_paths(gp, 4)
    complex_gp = fitted(rfgp.kernels.SketchedPolynomialKernel(2, 32, weights="complex", complex_posterior=True, seed=0))
    with pytest.raises(ValueError, match="complex_posterior"):
        posterior_paths(complex_gp, 4)


def test_paths_refuse_redrawn_features_and_follow_a_loaded_state():
    """Paths whose kernel was re-drawn raise (they paired their weights with the new features: values of no
    posterior); a state loaded into paths, weights and kernel together, gives the source paths' values."""
    xs = torch.tensor([[0.3, -0.2], [1.0, 0.5]], dtype=torch.float64)
    gp = fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=0))
    paths = posterior_paths(gp, 4, generator=torch.Generator().manual_seed(0), variance_correction=False)
    with torch.no_grad():
        values = paths(xs)
        other = posterior_paths(fitted(SketchedRBFKernel(32, ard_num_dims=2, seed=1)), 4, variance_correction=False)
        other.load_state_dict(paths.state_dict())
        torch.testing.assert_close(other(xs), values, rtol=0, atol=0)
        gp.covar_module.base_kernel.feature_map.resample(torch.Generator().manual_seed(5))
        with pytest.raises(RuntimeError, match="re-drawn after these posterior paths were drawn"):
            paths(xs)


def _biased_paths(generator):
    """Paths of a model whose map has a variance bias (their evaluations add correction noise), and three points."""
    gp = fitted(rfgp.kernels.RandomFeatureKernel(ShrunkFourierFeatures(64, shrink=0.6, input_dim=2, seed=0)))
    xs = torch.tensor([[4.0, 4.0], [-4.0, 3.0], [0.0, 0.0]], dtype=torch.float64)
    return posterior_paths(gp, 5, generator=generator), xs


def test_correction_noise_is_drawn_from_the_generator_on_its_device():
    """Paths on another device than their generator draw the correction noise from the generator, on its device, and
    move it (as the weights): on CUDA a CPU generator raised torch's "Expected a 'cuda' device type for generator".
    A CPU build has no such device; paths moved to 'meta' (shapes without values) stand in for it: their noise was
    drawn on 'meta', which torch allows with a CPU generator but which does not advance it — the noise was not the
    generator's.  The generator advances here by exactly the 3 × 5 normal draws of the noise."""
    generator = torch.Generator().manual_seed(3)
    paths, xs = _biased_paths(generator)
    paths.to("meta")
    expected = torch.Generator()
    expected.set_state(generator.get_state())
    torch.randn(3, 5, generator=expected, dtype=torch.float64)
    values = paths(xs.to("meta"))
    assert values.device.type == "meta" and values.shape == (5, 3)
    assert torch.equal(generator.get_state(), expected.get_state())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_paths_on_cuda_with_a_cpu_generator_are_those_on_the_cpu():
    """A CPU generator drives paths on CUDA: the same weights and correction noise as on the CPU (to rounding)."""
    on_cpu, xs = _biased_paths(torch.Generator().manual_seed(3))
    on_cuda, _ = _biased_paths(torch.Generator().manual_seed(3))
    on_cuda.to("cuda")
    with torch.no_grad():
        torch.testing.assert_close(on_cuda(xs.cuda()).cpu(), on_cpu(xs), rtol=1e-10, atol=1e-12)
