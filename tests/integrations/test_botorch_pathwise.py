"""BoTorch pathwise (Matheron) sampling with rfgp kernels: the kernel's own Φ, an update in the cheaper algebra
(F × F at N > F, N × N at N ≲ F), draws matching model.posterior within Monte-Carlo standard errors."""

import warnings

import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.exceptions.errors import UnsupportedError  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.sampling.pathwise import draw_matheron_paths, get_matheron_path_model  # noqa: E402
from gpytorch.kernels import ScaleKernel  # noqa: E402

import rfgp  # noqa: E402
from rfgp.kernels import (  # noqa: E402
    SketchedMaternKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
    SketchedSphericalPolynomialKernel,
    kernel_features,
)

NUM_PATHS = 3000
KERNELS = {
    "rff": lambda: SketchedRBFKernel(64, ard_num_dims=2, seed=0),
    "sorf": lambda: SketchedRBFKernel(64, method="sorf", ard_num_dims=2, seed=0),
    "matern": lambda: SketchedMaternKernel(64, nu=2.5, method="orf", ard_num_dims=2, seed=0),
    "maclaurin": lambda: SketchedRBFKernel(64, method="maclaurin", ard_num_dims=2, seed=0),
    "polynomial": lambda: SketchedPolynomialKernel(2, 64, seed=0),
    "spherical": lambda: SketchedSphericalPolynomialKernel(3, 64, normalize_inputs=True, seed=0),
}


def single_task_gp(kernel, n=50, d=2, num_outputs=1, **options):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = torch.cat([torch.sin(4 * x[:, :1] * (k + 1)) + x[:, 1:] for k in range(num_outputs)], -1)
    y = y + 0.05 * torch.randn(n, num_outputs, generator=gen, dtype=torch.float64)
    model = SingleTaskGP(x, y, covar_module=kernel, **options).double()
    model.likelihood.noise = 0.01
    return model.eval()


def assert_matches_posterior(model, xs, values, diagonal_correction=0.0):
    """Sample mean/covariance against the posterior's (less a diagonal the paths do not carry), |error| ≤ 4·SE."""
    with torch.no_grad():
        posterior = model.posterior(xs)
        mean, covar = posterior.mean.squeeze(-1), posterior.distribution.covariance_matrix
        covar = covar - torch.diag_embed(torch.as_tensor(diagonal_correction, dtype=covar.dtype).expand(mean.shape))
    variance = covar.diagonal(dim1=-1, dim2=-2)
    assert ((values.mean(0) - mean).abs() <= 4 * (variance / NUM_PATHS).sqrt()).all()
    sample_covar = torch.cov(values.T)
    se = ((variance.unsqueeze(-1) * variance.unsqueeze(-2) + covar.pow(2)) / NUM_PATHS).sqrt()
    assert ((sample_covar - covar).abs() <= 4 * se).all()


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_matheron_paths_match_posterior(name):
    kernel = ScaleKernel(KERNELS[name]())
    biased = kernel.base_kernel.feature_map.has_variance_bias
    # biased maps: no outcome transform, so that the model's diagonal correction c(x) is in output units
    model = single_task_gp(kernel, **({"outcome_transform": None} if biased else {}))
    xs = 2 * torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))  # [0, 2]²: data in [0, 1]²
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(xs)
    assert any("variance bias" in str(w.message) for w in caught) == biased
    assert values.shape == (NUM_PATHS, 6)
    correction = 0.0
    if biased:  # the paths sample the posterior of k̂; the model's variance adds c(x)
        with torch.no_grad():
            target, expected = rfgp.kernels.combinations.kernel_diag_moments(model.covar_module, xs)
        correction = (target - expected).clamp_min(0.0)
        assert name != "maclaurin" or (correction > 0.05).any()  # exercised where the map truncates
    assert_matches_posterior(model, xs, values, correction)


def test_prior_features_are_the_kernels_own():
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(64, method="orf", ard_num_dims=2, seed=0)))
    paths = draw_matheron_paths(model, sample_shape=torch.Size([2]))
    xs = torch.rand(4, 2, dtype=torch.float64)
    feature_map = paths["prior_paths"].feature_map
    assert feature_map.num_outputs == 64
    with torch.no_grad():
        torch.testing.assert_close(feature_map(xs), kernel_features(model.covar_module, xs), rtol=1e-12, atol=1e-14)


def test_update_factorises_nothing_larger_than_the_features(factorised):
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(32, ard_num_dims=2, seed=0)), n=800)
    with torch.no_grad():
        model.posterior(model.train_inputs[0][:2])  # prediction caches
        factorised.clear()
        paths = draw_matheron_paths(model, sample_shape=torch.Size([16]))
        paths(torch.rand(10_000, 2, dtype=torch.float64))
    assert factorised and max(factorised) <= 32


def test_update_over_few_points_with_wide_features_factorises_only_n_by_n(factorised):
    """N = 20 observations under F = 4096 features (a BO loop's regime): the update is Φᵀ(ΦΦᵀ + D)⁻¹r from the
    20 × 20 factor, never the 4096 × 4096 capacitance, and the paths still follow the posterior."""
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(4096, ard_num_dims=2, seed=0)), n=20)
    xs = 2 * torch.rand(5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        model.posterior(xs)  # prediction caches
        factorised.clear()
        values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(xs)
    assert factorised and max(factorised) <= 20
    assert_matches_posterior(model, xs, values)


def test_prior_weights_beyond_sobols_dimension_limit():
    """F = 22 000 > SobolEngine's 21 201 dimensions: i.i.d. normal prior weights (BoTorch's Sobol draw would raise);
    the paths follow the posterior."""
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(22_000, ard_num_dims=2, seed=0)), n=10)
    xs = 2 * torch.rand(3, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        paths = draw_matheron_paths(model, sample_shape=torch.Size([800]))
        values = paths(xs)
    weight = paths["prior_paths"].weight
    assert weight.shape == (800, 22_000)
    assert abs(float(weight.var()) - 1.0) < 0.01  # N(0, 1) entries: SE of the variance √(2/1.76e7) ≈ 3e-4
    with torch.no_grad():
        posterior = model.posterior(xs)
    mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert ((values.mean(0) - mean).abs() <= 4 * (variance / 800).sqrt()).all()
    assert ((values.var(0) - variance).abs() <= 4 * variance * (2 / 800) ** 0.5).all()


def test_prior_weights_within_sobols_limit_are_botorchs_own():
    from botorch.sampling.pathwise.prior_samplers import _draw_kernel_feature_paths_ExactGP

    model = single_task_gp(ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0)))
    torch.manual_seed(5)
    ours = draw_matheron_paths(model, sample_shape=torch.Size([4]))["prior_paths"].weight
    torch.manual_seed(5)
    botorchs = _draw_kernel_feature_paths_ExactGP(model, sample_shape=torch.Size([4])).weight
    torch.testing.assert_close(ours, botorchs, rtol=0, atol=0)


def test_prior_weights_of_each_batch_member_are_an_unbiased_normal_sample():
    """A two-output model's prior weights: each member's (S, F) weights have coordinate means within 4/√S of 0.

    Before, BoTorch's single Sobol sequence of S·2 points reshaped to (S, 2, F) gave each member every other point,
    whose first coordinate is of one sign (mean ±0.8): path means 10 standard errors off at 20 000 paths."""
    batch = torch.Size([2])
    kernel = ScaleKernel(SketchedRBFKernel(32, ard_num_dims=2, seed=0, batch_shape=batch), batch_shape=batch)
    model = single_task_gp(kernel, num_outputs=2)
    torch.manual_seed(0)
    weight = draw_matheron_paths(model, sample_shape=torch.Size([8, 128]))["prior_paths"].weight
    assert weight.shape == (8, 128, 2, 32)
    weight = weight.flatten(0, 1)
    assert (weight.mean(0).abs() <= 4 / 1024**0.5).all()
    assert ((weight.var(0) - 1).abs() <= 4 * (2 / 1024) ** 0.5).all()
    assert torch.corrcoef(torch.stack([weight[:, 0, 0], weight[:, 1, 0]])).abs()[0, 1] <= 4 / 1024**0.5


def test_path_model_batched_outputs_and_gradients():
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(32, ard_num_dims=2, seed=0, batch_shape=torch.Size([2])),
                                       batch_shape=torch.Size([2])), num_outputs=2)
    path_model = get_matheron_path_model(model)
    xs = torch.rand(3, 5, 2, dtype=torch.float64, requires_grad=True)
    values = path_model(xs)
    assert values.shape == (3, 5, 2)
    values.sum().backward()
    assert torch.isfinite(xs.grad).all()


def test_batched_multi_output_paths_match_posterior():
    batch = torch.Size([2])
    kernel = ScaleKernel(SketchedRBFKernel(32, ard_num_dims=2, seed=0, batch_shape=batch), batch_shape=batch)
    model = single_task_gp(kernel, num_outputs=2)
    xs = torch.rand(4, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(xs)  # (S, 2, 4)
        posterior = model.posterior(xs)
    for output in range(2):
        mean = posterior.mean[..., output]
        variance = posterior.variance[..., output]
        assert ((values[:, output].mean(0) - mean).abs() <= 4 * (variance / NUM_PATHS).sqrt()).all()
        assert ((values[:, output].var(0) - variance).abs() <= 4 * variance * (2 / NUM_PATHS) ** 0.5).all()


@pytest.mark.parametrize("fixed_noise", [False, True])
def test_paths_of_a_model_conditioned_with_noise_match_its_posterior(fixed_noise):
    """condition_on_observations(X, Y, noise=1e-4) on a model at noise 0.01: the paths condition the new points on
    the given noise, as the posterior does (before, a GaussianLikelihood model's paths used its noise 0.01 there)."""
    model = single_task_gp(ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0)), outcome_transform=None)
    if fixed_noise:
        (x,), y = model.train_inputs, model.train_targets.unsqueeze(-1)
        model = SingleTaskGP(x, y, torch.full_like(y, 0.01), covar_module=model.covar_module,
                             outcome_transform=None).eval()
    xs = torch.tensor([[1.5, 1.5], [1.6, 1.4], [1.2, 1.8], [2.0, 2.0]], dtype=torch.float64)
    with torch.no_grad():
        model.posterior(xs)  # prediction caches, which conditioning updates
        conditioned = model.condition_on_observations(xs[:1], torch.tensor([[3.0]], dtype=torch.float64),
                                                      noise=torch.tensor([[1e-4]], dtype=torch.float64))
        torch.manual_seed(0)
        values = draw_matheron_paths(conditioned, sample_shape=torch.Size([NUM_PATHS]))(xs)
    assert_matches_posterior(conditioned, xs, values)


def test_other_kernels_keep_botorch_update():
    model = single_task_gp(ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)))
    update = draw_matheron_paths(model, sample_shape=torch.Size([2]))["update_paths"]
    assert type(update.feature_map).__name__ == "KernelEvaluationMap"


def test_unsupported_kernels_are_refused():
    operator_valued = rfgp.kernels.SketchedCurlFreeKernel(32, input_dim=2, seed=0)
    with pytest.raises(UnsupportedError, match="outputs per input"):
        botorch.sampling.pathwise.gen_kernel_features(operator_valued, num_inputs=2, num_outputs=32)
    # a derivative kernel's rows are (f, ∇f) per point: the refusal named it an operator-valued kernel
    derivative = rfgp.sketch(gpytorch.kernels.RBFKernelGrad(), 32, seed=0)
    with pytest.raises(UnsupportedError, match="3 outputs per input .*derivative.*posterior_paths for derivative"):
        botorch.sampling.pathwise.gen_kernel_features(derivative, num_inputs=2, num_outputs=32)
    complex_kernel = SketchedPolynomialKernel(2, 32, weights="complex", complex_posterior=True, seed=0)
    with pytest.raises(ValueError, match="complex_posterior"):
        botorch.sampling.pathwise.gen_kernel_features(complex_kernel, num_inputs=2, num_outputs=32)


@pytest.mark.parametrize("num_features, num_points", [(512, 1500), (2048, 600)], ids=["feature", "kernel_space"])
def test_float32_update_at_a_high_signal_to_noise_ratio_matches_float64(monkeypatch, num_features, num_points):
    """The IGRF fit of tests/inference/test_float32_training.py (N = 1500, F = 512, outputscale 84, noise 4.4e-4;
    ‖ΦᵀD⁻¹Φ‖ ≈ 10⁷).  Before: the float32 factor of I + ΦᵀD⁻¹Φ in the Matheron update broke down (linear_operator's
    'not positive definite after repeatedly adding jitter up to 1e-1').  Now it is factorised in float64
    (capacitance_solve), and the statistics ΦᵀD⁻¹Φ, ΦᵀD⁻¹r are formed in float64 where u·tr(ΦᵀD⁻¹Φ) exceeds 10⁻¹
    (rfgp.inference.statistics_precision, as for the MLL): the updated paths match float64's to 1.1·10⁻⁶ relative (same
    noise draw ε in both dtypes; with the statistics in float32 whatever the estimate, before: 2.7·10⁻⁴).
    N = 600 ≤ F = 2048 takes the N × N update Φᵀ(ΦΦᵀ + D)⁻¹r: u·tr(ΦᵀD⁻¹Φ) ≈ 7 > 10⁻¹, so K is formed and factorised in
    float64 (rfgp.inference.kernel_space.kernel_cholesky): 7·10⁻⁷ from float64's paths (before, in float32: 8·10⁻³)."""
    from botorch.sampling.pathwise.update_strategies import gaussian_update

    from tests.inference.test_float32_training import igrf_model

    randn = torch.randn

    def same_draws(*args, **kwargs):  # the update's ε ~ N(0, D), drawn alike for both dtypes
        if "generator" in kwargs:
            return randn(*args, **kwargs)
        return randn(args[0], generator=torch.Generator().manual_seed(0), dtype=torch.float64).to(kwargs["dtype"])

    values = []
    for dtype in (torch.float32, torch.float64):
        model = igrf_model(dtype, False, num_features, num_points).eval()
        x, y = model.train_inputs[0], model.train_targets
        with torch.no_grad(), monkeypatch.context() as patch:
            patch.setattr(torch, "randn", same_draws)
            path = gaussian_update(model, torch.zeros(4, len(x), dtype=dtype), model.likelihood,
                                   target_values=y, points=x)
            values.append(path(x[:50] * 1.01))
    assert values[0].dtype == torch.float32
    assert (values[0].double() - values[1]).norm() <= 1e-5 * values[1].norm()


def test_multi_task_gp_paths_are_refused_and_its_posterior_samples_are_the_sketched_posterior():
    """BoTorch has no pathwise MultiTaskGP (its exact kernel: NotImplementedError); with a sketched kernel the prior
    path added the MultitaskMean's (n, tasks) output to (S, n) draws and failed on a shape mismatch.  It is refused by
    name, and the sampling it points to, posterior(X).rsample, has the posterior's moments."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(30, 2, generator=gen, dtype=torch.float64)
    tasks = torch.arange(30, dtype=torch.float64).remainder(2).unsqueeze(-1)
    y = torch.sin(4 * x[:, :1]) + 0.3 * tasks + 0.05 * torch.randn(30, 1, generator=gen, dtype=torch.float64)
    inputs = torch.cat([x, tasks], -1)
    model = botorch.models.MultiTaskGP(inputs, y, task_feature=-1)
    model.covar_module = rfgp.sketch(model.covar_module, 256, seed=1, x_sample=inputs)
    model.eval()
    with pytest.raises(UnsupportedError, match="no MultiTaskGP support.*posterior\\(X\\).rsample"):
        draw_matheron_paths(model, sample_shape=torch.Size([2]))
    xs = torch.cat([torch.rand(4, 2, generator=gen, dtype=torch.float64), torch.tensor([[0.0], [1.0], [0.0], [1.0]],
                                                                                       dtype=torch.float64)], -1)
    torch.manual_seed(0)
    with torch.no_grad():
        values = model.posterior(xs).rsample(torch.Size([NUM_PATHS])).squeeze(-1)
    assert_matches_posterior(model, xs, values)


def test_multi_task_gp_built_with_a_sketched_data_kernel_is_refused_by_name():
    """MultiTaskGP(covar_module=rfgp.sketch(k)) multiplies the sketched kernel by an exact IndexKernel: refused with
    the pointer to posterior(X).rsample, not BoTorch's "Could not find signature for gen_kernel_features"."""
    gen = torch.Generator().manual_seed(0)
    inputs = torch.cat([torch.rand(12, 2, generator=gen, dtype=torch.float64),
                        torch.arange(12, dtype=torch.float64).remainder(2).unsqueeze(-1)], -1)
    y = torch.sin(4 * inputs[:, :1]) + 0.3 * inputs[:, 2:]
    model = botorch.models.MultiTaskGP(inputs, y, task_feature=-1, covar_module=rfgp.sketch(
        ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)), 64, seed=1)).eval()
    with pytest.raises(UnsupportedError, match="no MultiTaskGP support.*posterior\\(X\\).rsample"):
        draw_matheron_paths(model, sample_shape=torch.Size([2]))


@pytest.mark.parametrize("transform", ["warp", "filter"])
def test_paths_through_learned_and_filtering_input_transforms_match_posterior(transform):
    """Paths evaluate the kernel's features on the transformed inputs: a Warp with non-identity concentrations, and
    FilterFeatures (the kernel sees 2 of 3 columns; BoTorch 0.18.1's own paths of the exact kernel fail there, their
    feature map being built for all 3 input columns)."""
    from botorch.models.transforms.input import FilterFeatures, Warp

    if transform == "warp":
        input_transform, d = Warp(d=2, indices=[0, 1]), 2
        input_transform._set_concentration(1, torch.tensor([2.0, 0.7]))
        input_transform._set_concentration(0, torch.tensor([0.5, 1.5]))
    else:
        input_transform, d = FilterFeatures(feature_indices=torch.tensor([0, 1])), 3
    x = torch.rand(50, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(4 * x[:, :1]) + x[:, 1:2]
    model = SingleTaskGP(x, y, covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0),
                         input_transform=input_transform).double()
    model.likelihood.noise = 0.01
    model.eval()
    xs = torch.rand(5, d, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    torch.manual_seed(0)
    paths = draw_matheron_paths(model, torch.Size([NUM_PATHS]))
    with torch.no_grad():
        values = paths(xs)
    assert_matches_posterior(model, xs, values)


class DeepKernelGP(SingleTaskGP):
    """A SingleTaskGP whose forward passes x through a network before mean_module and covar_module (DKL)."""

    def __init__(self, x, y, kernel):
        super().__init__(x, y, covar_module=kernel)
        self.net = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Tanh())
        with torch.no_grad():
            self.net[0].weight.copy_(torch.tensor([[1.5, -2.0], [0.5, 2.5]]))

    def forward(self, x):
        z = self.net(x)
        return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))


def test_paths_of_a_model_whose_forward_transforms_its_inputs_are_refused():
    """Before, draw_matheron_paths of a deep-kernel SingleTaskGP with an rfgp kernel drew paths of the GP on x, skipping
    the network (path means 5.6-43 posterior standard deviations off the posterior's at N = 40; BoTorch's paths of
    the exact kernel skip it the same way, upstream).  Now the prior sampler and the update refuse it by name."""
    from botorch.sampling.pathwise.update_strategies import gaussian_update

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=gen, dtype=torch.float64)
    model = DeepKernelGP(x, torch.sin(4 * x[:, :1]) + x[:, 1:], SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double()
    model.eval()
    with pytest.raises(UnsupportedError, match="DeepKernelGP.forward passes its inputs to covar_module transformed"):
        draw_matheron_paths(model, torch.Size([4]))
    with pytest.raises(UnsupportedError, match="DeepKernelGP.forward"):
        get_matheron_path_model(model)
    with pytest.raises(UnsupportedError, match="DeepKernelGP.forward"):
        gaussian_update(model, torch.zeros(4, 40, dtype=torch.float64), model.likelihood)


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_input_transforms_are_not_taken_for_a_transforming_forward(mode):
    """A BoTorch input transform (Normalize with learned bounds, applied by forward in train mode only) is what the
    paths apply themselves: drawn in either mode, matching the posterior in eval mode."""
    from botorch.models.transforms.input import Normalize

    x = 3 * torch.rand(50, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    y = torch.sin(2 * x[:, :1]) + x[:, 1:2]
    model = SingleTaskGP(x, y, covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0),
                         input_transform=Normalize(2, learn_bounds=True)).double()
    model.likelihood.noise = 0.01
    model.train(mode == "train")
    torch.manual_seed(0)
    paths = draw_matheron_paths(model, torch.Size([NUM_PATHS]))
    if mode == "eval":
        xs = 3 * torch.rand(5, 2, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
        with torch.no_grad():
            assert_matches_posterior(model, xs, paths(xs))


@pytest.mark.parametrize("name", ["nystrom", "sum_with_maclaurin"])
def test_paths_warn_of_a_correction_the_posterior_adds(name):
    """A Nyström kernel's posterior variance adds k(x, x) − ‖φ(x)‖², a sum with a biased map's term that map's
    c(x); BoTorch paths carry neither, and warned of neither (Nyström has no ``feature_map``, a sum kernel none of
    its own): the paths' variance was half the posterior's with no warning (M = 8 landmarks, N = 50)."""
    if name == "nystrom":
        x_sample = torch.rand(8, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        kernel = rfgp.sketch(ScaleKernel(gpytorch.kernels.RBFKernel()), 8, method="nystrom", x_sample=x_sample)
    else:
        kernel = rfgp.kernels.FeatureSumKernel(ScaleKernel(KERNELS["maclaurin"]()), ScaleKernel(KERNELS["rff"]()))
    model = single_task_gp(kernel, outcome_transform=None)
    xs = 2 * torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(xs)
    assert any("variance bias" in str(w.message) for w in caught)
    with torch.no_grad():
        target, expected = rfgp.kernels.combinations.kernel_diag_moments(model.covar_module, xs)
    correction = (target - expected).clamp_min(0.0)
    assert (correction > 0.05).any()  # exercised away from the landmarks / where the map truncates
    assert_matches_posterior(model, xs, values, correction)


@pytest.mark.parametrize("conditioned", [False, True])
def test_paths_condition_on_a_learned_second_noise(conditioned):
    """A ``FixedNoiseGaussianLikelihood(learn_additional_noise=True)``'s noise is the fixed noise plus a learned
    second noise; the update read ``noise_covar`` alone (as BoTorch's own update still does for exact kernels), so
    with a fixed noise of 1e-4 under a second noise of 0.5 the paths interpolated the data: their variance was 0.3–1 %
    of the posterior's and their means 100 standard errors off."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(10, 2, generator=gen, dtype=torch.float64)
    y = torch.sin(5 * x).sum(-1, keepdim=True)
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(
        noise=torch.full((10,), 1e-4, dtype=torch.float64), learn_additional_noise=True)
    model = SingleTaskGP(x, y, covar_module=ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0)),
                         likelihood=likelihood, outcome_transform=None).double()
    model.likelihood.second_noise = 0.5
    model.eval()
    xs = torch.rand(4, 2, generator=gen, dtype=torch.float64)
    if conditioned:
        model.posterior(xs)  # prediction caches
        model = model.condition_on_observations(xs[:2] + 0.1, torch.zeros(2, 1, dtype=torch.float64),
                                                noise=torch.full((2, 1), 1e-4, dtype=torch.float64))
    with torch.no_grad():
        values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(xs)
    assert_matches_posterior(model, xs, values)


def transformed_model(case):
    """A SingleTaskGP (F = 64) on raw inputs in [1, 5]² with the transforms of ``case``; y ≈ 2 + 5·Σ sin 2x, or
    exp((2 + Σ sin 2x)/4) for the Log outcomes, two such columns for "two_outputs"."""
    from botorch.models.transforms import Bilog, ChainedOutcomeTransform, Log, Normalize, Power, Standardize

    gen = torch.Generator().manual_seed(0)
    x = 4 * torch.rand(30, 2, generator=gen, dtype=torch.float64) + 1
    wave = torch.sin(2 * x).sum(-1, keepdim=True)
    y = 5 * wave + 2 + 0.1 * torch.randn(30, 1, generator=gen, dtype=torch.float64)
    num_outputs = 2 if case == "two_outputs" else 1
    input_transform = Normalize(2) if case in ("normalize", "both", "two_outputs", "batched_x") else None
    outcome_transform = {
        "normalize": None, "standardize": Standardize(1), "both": Standardize(1), "batched_x": Standardize(1),
        "two_outputs": Standardize(2), "log": Log(), "log_standardize": ChainedOutcomeTransform(
            log=Log(), standardize=Standardize(1)), "power": Power(0.5), "bilog": Bilog()}[case]
    if case in ("log", "log_standardize"):
        y = torch.exp((wave + 2) / 4)
    if case == "power":
        y = (wave + 3).square()
    if case == "two_outputs":
        y = torch.cat([y, -3 * y + 10], -1)
    batch = torch.Size([num_outputs]) if num_outputs > 1 else torch.Size([])
    kernel = ScaleKernel(SketchedRBFKernel(64, ard_num_dims=2, seed=0, batch_shape=batch), batch_shape=batch)
    model = SingleTaskGP(x, y, covar_module=kernel, input_transform=input_transform,
                         outcome_transform=outcome_transform).double()
    model.likelihood.noise = 0.01
    return model.eval()


def untransformed_moments(latent_mean, latent_variance, untransform, order=4):
    """E[u(f)^k], k = 1..order, of f ~ N(mean, variance) by 120-point Gauss–Hermite quadrature (exact to 10⁻¹⁰ for
    these smooth u at latent standard deviations below 1)."""
    import numpy

    nodes, weights = numpy.polynomial.hermite_e.hermegauss(120)
    nodes, weights = (torch.as_tensor(v, dtype=torch.float64) for v in (nodes, weights / weights.sum()))
    values = untransform(latent_mean.unsqueeze(-1) + latent_variance.sqrt().unsqueeze(-1) * nodes)
    return [(values.pow(k) * weights).sum(-1) for k in range(1, order + 1)]


def assert_moments_match(values, mean, variance, fourth_central_moment):
    """Path mean within 4 standard errors √(σ²/S) of ``mean``, sample variance within 4·√((μ₄ − σ⁴)/S) of
    ``variance``."""
    num_paths = values.shape[0]
    assert ((values.mean(0) - mean).abs() <= 4 * (variance / num_paths).sqrt()).all()
    assert ((values.var(0) - variance).abs() <= 4 * ((fourth_central_moment - variance**2) / num_paths).sqrt()).all()


@pytest.mark.parametrize("case", ["normalize", "standardize", "both", "log", "log_standardize", "two_outputs",
                                  "batched_x"])
def test_rfgp_posterior_paths_follow_the_posterior_through_botorch_transforms(case):
    """Paths of raw x on the outcome scale: 4000 paths' mean and variance at 6 raw points match
    model.posterior(x).mean/variance (Gaussian: 4th central moment 3σ⁴; Log: the log-normal's, by quadrature).
    Before: refused (earlier, the paths evaluated the transformed space: on "both", their mean was 1000 standard
    errors off the posterior's, the variance ratio 0.68–3.2)."""
    model = transformed_model(case)
    shape = (2, 6, 2) if case == "batched_x" else (6, 2)
    xs = 4.4 * torch.rand(*shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.8
    paths = rfgp.sampling.posterior_paths(model, 4000, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        values = paths(xs)
        posterior = model.posterior(xs)
        mean, variance = posterior.mean, posterior.variance
    if case == "two_outputs":  # paths (S, m, n), as BoTorch's; posterior (n, m)
        assert values.shape == (4000, 2, 6)
        mean, variance = mean.transpose(-1, -2), variance.transpose(-1, -2)
    else:
        assert values.shape == (4000, *shape[:-1])
        mean, variance = mean.squeeze(-1), variance.squeeze(-1)
    fourth = 3 * variance**2
    if case.startswith("log"):
        with torch.no_grad():
            latent = model(model.transform_inputs(xs))
        untransform = model.outcome_transform.untransform
        moments = untransformed_moments(latent.mean, latent.variance,
                                        lambda f: untransform(f.unsqueeze(-1))[0].squeeze(-1))
        first, second, third, fourth_raw = moments
        fourth = fourth_raw - 4 * third * first + 6 * second * first**2 - 3 * first**4
        torch.testing.assert_close(first, mean, rtol=1e-8, atol=0)  # BoTorch's log-normal moments
        torch.testing.assert_close(second - first**2, variance, rtol=1e-7, atol=0)
    assert_moments_match(values, mean, variance, fourth)


@pytest.mark.parametrize("case", ["power", "bilog"])
def test_rfgp_posterior_paths_untransform_power_and_bilog_samples(case):
    """Power and Bilog untransform samples, not moments (model.posterior(x).mean raises NotImplementedError): the
    paths' moments against u(f), f ~ the latent posterior, by quadrature, with u(f) = f² (Power(0.5)) and
    sign(f)(e^|f| − 1) (Bilog) written out."""
    model = transformed_model(case)
    xs = 4.4 * torch.rand(6, 2, generator=torch.Generator().manual_seed(1), dtype=torch.float64) + 0.8
    paths = rfgp.sampling.posterior_paths(model, 4000, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        values = paths(xs)
        latent = model(xs)
    untransform = (lambda f: f.square()) if case == "power" else (lambda f: f.sign() * f.abs().expm1())
    first, second, third, fourth = untransformed_moments(latent.mean, latent.variance, untransform)
    variance = second - first**2
    assert_moments_match(values, first, variance,
                         fourth - 4 * third * first + 6 * second * first**2 - 3 * first**4)


def test_rfgp_posterior_paths_add_the_variance_correction_before_untransforming():
    """A truncated Maclaurin map (variance bias c(x) up to 0.22 here) under Normalize and Standardize: the per-point
    noise √c(x)·ε is added in the model's standardised space, then untransformed with the path (σ_y²·c(x) on the
    outcome scale), so the paths' variance is the posterior's."""
    from botorch.models.transforms import Normalize, Standardize

    gen = torch.Generator().manual_seed(0)
    x = 4 * torch.rand(30, 2, generator=gen, dtype=torch.float64) + 1
    kernel = ScaleKernel(SketchedRBFKernel(64, method="maclaurin", ard_num_dims=2, seed=0))
    model = SingleTaskGP(x, 5 * torch.sin(2 * x).sum(-1, keepdim=True) + 2, covar_module=kernel,
                         input_transform=Normalize(2), outcome_transform=Standardize(1)).double()
    model.likelihood.noise = 0.01
    model.eval()
    xs = 6 * torch.rand(6, 2, generator=gen, dtype=torch.float64)
    paths = rfgp.sampling.posterior_paths(model, 4000, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        values = paths(xs)
        posterior = model.posterior(xs)
        target, expected = rfgp.kernels.combinations.kernel_diag_moments(model.covar_module, model.transform_inputs(xs))
    assert ((target - expected) > 0.05).any()  # exercised where the map truncates
    mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert_moments_match(values, mean, variance, 3 * variance**2)


def test_rfgp_posterior_paths_untransform_per_stratum():
    """StratifiedStandardize (a mean and scale per value of column 1, untransform reads them from X): the paths'
    moments match the posterior's in both strata (scales 1 and about 10)."""
    from botorch.models.transforms.outcome import StratifiedStandardize

    gen = torch.Generator().manual_seed(0)
    x = torch.cat([torch.rand(40, 1, generator=gen, dtype=torch.float64),
                   torch.arange(40, dtype=torch.float64).remainder(2).unsqueeze(-1)], -1)
    y = torch.sin(4 * x[:, :1]) * (1 + 9 * x[:, 1:]) + 5 * x[:, 1:]
    model = SingleTaskGP(x, y, covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0),
                         outcome_transform=StratifiedStandardize(1, all_task_values=torch.tensor([0, 1]))).double()
    model.likelihood.noise = 0.01
    model.eval()
    xs = torch.tensor([[0.3, 0.0], [0.3, 1.0], [0.7, 0.0], [0.7, 1.0]], dtype=torch.float64)
    paths = rfgp.sampling.posterior_paths(model, 4000, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        values = paths(xs)
        posterior = model.posterior(xs)
    mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert variance[1] > 10 * variance[0]  # the strata's scales differ
    assert_moments_match(values, mean, variance, 3 * variance**2)


def test_rfgp_posterior_paths_take_gradients_through_a_learned_input_transform():
    """A Warp (learned concentrations) between raw x and the kernel: values match the posterior; d/dx flows through
    the warp (against central differences, step 1e-6: error O(h²) ≈ 1e-12 plus rounding 1e-10)."""
    from botorch.models.transforms.input import Warp

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=gen, dtype=torch.float64)
    warp = Warp(d=2, indices=[0, 1])
    warp._set_concentration(1, torch.tensor([2.0, 0.7]))
    warp._set_concentration(0, torch.tensor([0.5, 1.5]))
    model = SingleTaskGP(x, torch.sin(4 * x[:, :1]) + x[:, 1:], input_transform=warp,
                         covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double()
    model.likelihood.noise = 0.01
    model.eval()
    xs = 0.9 * torch.rand(5, 2, generator=gen, dtype=torch.float64) + 0.05
    paths = rfgp.sampling.posterior_paths(model, 4000, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        values = paths(xs)
        posterior = model.posterior(xs)
    mean, variance = posterior.mean.squeeze(-1), posterior.variance.squeeze(-1)
    assert_moments_match(values, mean, variance, 3 * variance**2)
    point = xs[:1].clone().requires_grad_(True)
    paths(point)[0].sum().backward()
    step = torch.tensor([[1e-6, 0.0]], dtype=torch.float64)
    with torch.no_grad():
        difference = (paths(point + step)[0] - paths(point - step)[0]).sum() / 2e-6
    torch.testing.assert_close(point.grad[0, 0], difference, rtol=1e-6, atol=1e-8)


def test_rfgp_posterior_paths_refuse_an_input_transform_in_training_mode():
    """Calling the paths after model.train(): a Normalize(learn_bounds=True) in training mode would apply its training
    behaviour (re-learn its bounds from the candidates), not model.posterior's eval-mode one: refused by name."""
    from botorch.models.transforms import Normalize

    x = 4 * torch.rand(30, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64) + 1
    model = SingleTaskGP(x, torch.sin(2 * x).sum(-1, keepdim=True), input_transform=Normalize(2, learn_bounds=True),
                         covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double().eval()
    paths = rfgp.sampling.posterior_paths(model, 4)
    bounds = model.input_transform.bounds.clone()
    model.train()
    with pytest.raises(ValueError, match="input_transform .*Normalize.* training mode.*model.eval"):
        paths(x[:3])
    assert torch.equal(model.input_transform.bounds, bounds)
    model.eval()
    assert paths(x[:3]).shape == (4, 3)


def test_rfgp_posterior_paths_refuse_an_outcome_transform_without_sample_untransform():
    """An OutcomeTransform that does not define untransform (BoTorch's base raises NotImplementedError) has no
    outcome-scale value of a path: refused by name when the paths are drawn."""
    from botorch.models.transforms.outcome import OutcomeTransform

    class Clip(OutcomeTransform):
        def forward(self, Y, Yvar=None, X=None):
            return Y.clamp(-1, 1), Yvar

    x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    model = SingleTaskGP(x, torch.sin(4 * x[:, :1]), outcome_transform=Clip(),
                         covar_module=SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double().eval()
    with pytest.raises(ValueError, match="outcome_transform \\(Clip\\).*untransform"):
        rfgp.sampling.posterior_paths(model, 4)
