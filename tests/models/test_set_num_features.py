"""rfgp.set_num_features: re-draw feature maps at a new width, keeping hyperparameters and configuration."""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import GaussianLikelihood, MultitaskGaussianLikelihood

import rfgp
from rfgp.features import OptimizedMaclaurin, dot_product
from rfgp.kernels import FeatureSumKernel, SketchedCurlFreeKernel, SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel

F64 = torch.float64


def _data(n=60, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    return x, torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(n, generator=g, dtype=F64)


def _model(x, y, kernel):
    model = ExactGPModel(x, y, GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel)).to(F64)
    model.covar_module.outputscale, model.likelihood.noise = 1.3, 0.02
    model.covar_module.base_kernel.lengthscale = 0.3
    model.mean_module.constant.data.fill_(0.2)
    return model


def _hyperparameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def _predict(model, x_test):
    model.eval()
    with torch.no_grad():
        posterior = model(x_test)
        return posterior.mean, posterior.covariance_matrix


def test_resized_model_equals_a_model_built_at_the_new_width():
    x, y = _data()
    x_test = torch.rand(5, 2, dtype=F64)
    model = _model(x, y, SketchedRBFKernel(32, method="orf", seed=3, ard_num_dims=2))
    before = _hyperparameters(model)
    _predict(model, x_test)
    assert model.prediction_strategy is not None
    assert rfgp.set_num_features(model, 256) is model
    assert model.prediction_strategy is None  # caches cleared, rebuilt at the next prediction
    assert model.covar_module.base_kernel.num_features == 256
    assert model.covar_module.base_kernel.feature_map.sampler == "orthogonal"
    after = _hyperparameters(model)
    assert all(torch.equal(before[name], after[name]) for name in before)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # draws made at construction in float64, as the resized ones are
    try:
        reference = _model(x, y, SketchedRBFKernel(256, method="orf", seed=3, ard_num_dims=2))
    finally:
        torch.set_default_dtype(previous)
    with torch.no_grad():
        for name, value in reference.named_parameters():
            value.copy_(after[name])
    for got, expected in zip(_predict(model, x_test), _predict(reference, x_test)):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


class _SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points, covar_module):
        distribution = gpytorch.variational.CholeskyVariationalDistribution(inducing_points.shape[-2])
        super().__init__(gpytorch.variational.VariationalStrategy(self, inducing_points, distribution))
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _svgp(x, num_features):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(F64)  # draws made at construction in float64, as resized ones are
    try:
        model = _SVGP(x[:10].clone(), SketchedRBFKernel(num_features, seed=3, ard_num_dims=2))
    finally:
        torch.set_default_dtype(previous)
    distribution = model.variational_strategy._variational_distribution
    distribution.variational_mean.data = torch.sin(5 * x[:10, 0])
    distribution.chol_variational_covar.data = 0.5 * torch.eye(10, dtype=F64)
    model.variational_strategy.variational_params_initialized.fill_(1)
    model.covar_module.lengthscale = 0.3
    return model


def test_resizing_a_variational_model_in_eval_mode_clears_its_inducing_point_factor():
    """GPyTorch's VariationalStrategy memoises chol(K_ZZ) in eval mode: after a resize it belongs to the old
    features, and predictions mixed it with the new K_xZ (mean off by 0.39 here) instead of being the model built
    at the new width."""
    x, _ = _data()
    x_test = torch.rand(5, 2, dtype=F64, generator=torch.Generator().manual_seed(1))
    model = _svgp(x, 32)
    _predict(model, x_test)  # caches chol(K_ZZ) at F = 32
    rfgp.set_num_features(model, 512)
    for got, expected in zip(_predict(model, x_test), _predict(_svgp(x, 512), x_test)):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-10)


def test_iid_draws_at_the_new_width_extend_the_old_ones():
    kernel = SketchedRBFKernel(64, seed=5, input_dim=3)
    old = kernel.feature_map.frequencies.clone()
    rfgp.set_num_features(kernel, 512)
    assert torch.equal(kernel.feature_map.frequencies[:32], old)


def test_more_features_bring_the_posterior_closer_to_the_exact_gp():
    x, y = _data(n=80, d=1)
    x_test = torch.linspace(0, 1, 25, dtype=F64).unsqueeze(-1)
    exact = _model(x, y, gpytorch.kernels.RBFKernel())
    target = _predict(exact, x_test)[0]
    errors = {16: [], 256: []}
    for seed in range(6):
        model = _model(x, y, SketchedRBFKernel(16, seed=seed))
        errors[16].append((_predict(model, x_test)[0] - target).pow(2).mean())
        rfgp.set_num_features(model, 256)
        errors[256].append((_predict(model, x_test)[0] - target).pow(2).mean())
    small, big = torch.stack(errors[16]).mean(), torch.stack(errors[256]).mean()
    assert big < small / 4, (small, big)  # 16× the features: ≈ 16× smaller kernel error variance


def test_sum_tree_keeps_the_proportions_of_its_parts():
    parts = [SketchedRBFKernel(32, seed=0, active_dims=[0]), SketchedRBFKernel(96, seed=1, active_dims=[1])]
    kernel = FeatureSumKernel(*parts)
    rfgp.set_num_features(kernel, 512)
    assert [p.num_features for p in parts] == [128, 384]
    x = torch.rand(4, 2, dtype=F64)
    assert kernel.to(F64).featurize(x).shape[-1] == 512


def test_sketched_additive_tree_is_resized():
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.AdditiveKernel(
        gpytorch.kernels.RBFKernel(active_dims=[0]), gpytorch.kernels.MaternKernel(nu=1.5, active_dims=[1])))
    kernel = rfgp.sketch(exact, num_features=64, seed=0)
    rfgp.set_num_features(kernel, 384)
    assert [k.num_features for k in kernel.base_kernel.kernels] == [192, 192]


def test_optimized_maclaurin_refits_its_allocation_on_the_training_inputs():
    x, y = _data()
    model = _model(x, y, SketchedRBFKernel(33, method="maclaurin", seed=0, input_dim=2))
    _predict(model, x[:3])
    rfgp.set_num_features(model, 128)  # default CtR weights: complex pairs, so an even width
    feature_map = model.covar_module.base_kernel.feature_map
    assert feature_map.num_features == 127 and sum(feature_map.widths) == 63  # the constant + 2·63 columns
    reference = OptimizedMaclaurin(dot_product.gaussian(), 128, seed=feature_map.seed, x_sample=x / 0.3)
    assert feature_map.widths == reference.widths
    assert _predict(model, x[:3])[0].shape == (3,)
    with pytest.raises(ValueError, match="x_sample"):
        rfgp.set_num_features(model.covar_module, 64)


def test_multi_output_and_dirichlet_models_are_resized():
    x, y = _data()
    field = torch.stack([y, y.flip(0)], -1)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(32, 2, seed=0))
    model = rfgp.MultiOutputGPModel(x, field, MultitaskGaussianLikelihood(num_tasks=2, rank=0), kernel).to(F64)
    rfgp.set_num_features(model, 128)
    assert kernel.base_kernel.feature_map.num_features == 128
    assert _predict(model, x[:4])[0].shape == (4, 2)

    labels = (x[:, 0] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=2, dtype=F64)
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([2]))
    classifier = ExactGPModel(x, likelihood.transformed_targets, likelihood,
                              gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0)), mean).to(F64)
    rfgp.set_num_features(classifier, 96)
    assert _predict(classifier, x[:4])[0].shape == (2, 4)


def test_invalid_requests_are_refused():
    with pytest.raises(ValueError, match="multiple of 2"):
        rfgp.set_num_features(SketchedRBFKernel(32, seed=0), 33)
    with pytest.raises(ValueError, match="no rfgp feature map"):
        rfgp.set_num_features(gpytorch.kernels.RBFKernel(), 64)
    with pytest.raises(TypeError, match="positive integer"):
        rfgp.set_num_features(SketchedRBFKernel(32, seed=0), 64.0)
    streaming = rfgp.StreamingFeatureGP(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0)), GaussianLikelihood())
    with pytest.raises(TypeError, match="StreamingFeatureGP"):
        rfgp.set_num_features(streaming, 64)
