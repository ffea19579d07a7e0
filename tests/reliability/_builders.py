"""Small, seeded builders of every public rfgp kernel, feature map and model for the reliability suites."""

from __future__ import annotations

import gpytorch
import torch

import rfgp
from rfgp import features, kernels

D = 2  # input dimension of every builder below


def unit_rows(n: int = 6, d: int = D, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    x = torch.randn(n, d, dtype=dtype, generator=torch.Generator().manual_seed(seed))
    return torch.nn.functional.normalize(x, dim=-1)


def data(n: int = 6, d: int = D, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, d, dtype=dtype, generator=torch.Generator().manual_seed(seed)) * 0.5


#: name -> (builder of a float64 scalar-output feature kernel, whether inputs must be unit-norm)
SCALAR_KERNELS = {
    "rbf_rff": (lambda: kernels.SketchedRBFKernel(32, "rff", input_dim=D, seed=0), False),
    "rbf_orf": (lambda: kernels.SketchedRBFKernel(32, "orf", input_dim=D, seed=0), False),
    "rbf_sorf": (lambda: kernels.SketchedRBFKernel(32, "sorf", input_dim=D, seed=0), False),
    "rbf_maclaurin": (lambda: kernels.SketchedRBFKernel(32, "maclaurin", input_dim=D, seed=0), False),
    "rbf_gaussian_sketch": (lambda: kernels.SketchedRBFKernel(32, "gaussian_sketch", order=3, input_dim=D, seed=0), False),
    "rbf_gaussian_sketch_hd": (
        lambda: kernels.SketchedRBFKernel(32, "gaussian_sketch_hd", order=3, input_dim=D, seed=0), False),
    "matern": (lambda: kernels.SketchedMaternKernel(32, nu=1.5, input_dim=D, seed=0), False),
    "polynomial": (lambda: kernels.SketchedPolynomialKernel(2, 32, input_dim=D, seed=0), False),
    "polynomial_sphere": (lambda: kernels.SketchedPolynomialKernel.from_sphere(2.0, 2, 32, input_dim=D, seed=0), True),
    "exponential": (lambda: kernels.SketchedExponentialKernel(32, input_dim=D, seed=0), False),
    "random_feature": (
        lambda: kernels.RandomFeatureKernel(features.RandomFourierFeatures(32, input_dim=D, seed=0)), False),
    "sum": (lambda: kernels.FeatureSumKernel(
        kernels.SketchedRBFKernel(16, input_dim=D, seed=1), kernels.SketchedMaternKernel(16, input_dim=D, seed=2)), False),
    "product": (lambda: kernels.FeatureProductKernel(
        kernels.SketchedRBFKernel(8, input_dim=D, seed=1), kernels.SketchedRBFKernel(4, input_dim=D, seed=2)), False),
    "periodic": (lambda: kernels.SketchedPeriodicKernel(32, seed=0, ard_num_dims=D), False),
    "rational_quadratic": (lambda: kernels.SketchedRQKernel(32, seed=0), False),
    "spectral_mixture": (lambda: kernels.SketchedSpectralMixtureKernel(2, 32, ard_num_dims=D, seed=0), False),
    "nystrom": (lambda: kernels.NystromKernel(gpytorch.kernels.RBFKernel(), data(4, seed=3)), False),
    "rbf_grad": (lambda: kernels.SketchedRBFKernelGrad(32, input_dim=D, seed=0), False),
    "linear_features": (lambda: kernels.LinearFeatureKernel(input_dim=D), False),
    "cosine_features": (lambda: kernels.CosineFeatureKernel(active_dims=torch.tensor([0])), False),
    "spectral_delta": (lambda: kernels.SpectralDeltaFeatureKernel(D, 8, seed=0), False),
    "arc": (lambda: kernels.SketchedArcKernel(kernels.SketchedMaternKernel(32, input_dim=2 * D, seed=0)), False),
    "newton_girard": (lambda: kernels.SketchedNewtonGirardAdditiveKernel(
        gpytorch.kernels.RBFKernel(ard_num_dims=D), D, 32, seed=0), False),
}

#: name -> builder of a float64 multi-output (vector-field) kernel with p = D outputs
VECTOR_KERNELS = {
    "curl_free": lambda: kernels.SketchedCurlFreeKernel(32, input_dim=D, seed=0),
    "div_free": lambda: kernels.SketchedDivFreeKernel(32, input_dim=D, seed=0),
    "decomposable": lambda: kernels.SketchedDecomposableKernel(kernels.SketchedRBFKernel(16, input_dim=D, seed=0), D),
    "exact_curl_free": lambda: kernels.CurlFreeRBFKernel(D),
    "exact_div_free": lambda: kernels.DivFreeRBFKernel(D),
}

#: name -> (builder of a feature map on D inputs, whether inputs must be unit-norm)
FEATURE_MAPS = {
    "rff": (lambda: features.RandomFourierFeatures(32, input_dim=D, seed=0), False),
    "orf": (lambda: features.RandomFourierFeatures(32, input_dim=D, sampler="orthogonal", seed=0), False),
    "sorf": (lambda: features.RandomFourierFeatures(32, input_dim=D, sampler="structured", seed=0), False),
    "polynomial_srht": (lambda: features.PolynomialSketch(2, 32, input_dim=D, seed=0), False),
    "polynomial_rademacher": (
        lambda: features.PolynomialSketch(2, 32, input_dim=D, projection="rademacher", weights="real", seed=0), False),
    "polynomial_hierarchical": (
        lambda: features.PolynomialSketch(2, 32, input_dim=D, projection="hierarchical", seed=0), False),
    "gaussian_sketch": (lambda: features.GaussianSketch(32, order=3, input_dim=D, seed=0), False),
    "gaussian_sketch_hd": (lambda: features.GaussianSketchHD(32, order=3, input_dim=D, seed=0), False),
    "random_maclaurin": (lambda: features.RandomMaclaurin(rfgp.features.dot_product.exponential(), 32, input_dim=D, seed=0), False),
    "optimized_maclaurin": (
        lambda: features.OptimizedMaclaurin(rfgp.features.dot_product.exponential(), 32, input_dim=D, seed=0), False),
    "spherical": (lambda: features.SphericalRandomFeatures(32, power=2, input_dim=D, seed=0), True),
}


class GP(gpytorch.models.ExactGP):
    """A user's own ExactGP around an rfgp kernel (not rfgp's ExactGPModel)."""

    def __init__(self, x, y, kernel, likelihood=None):
        super().__init__(x, y, likelihood if likelihood is not None else gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def regression_model(x=None, y=None, kernel=None, own=True, dtype=torch.float64):
    """rfgp's ExactGPModel (``own=True``) or a user's ExactGP, with a ScaleKernel(SketchedRBFKernel)."""
    x = data(8, dtype=dtype) if x is None else x
    y = torch.sin(x.sum(-1)) if y is None else y
    kernel = gpytorch.kernels.ScaleKernel(kernels.SketchedRBFKernel(32, input_dim=D, seed=0)) if kernel is None else kernel
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    if own:
        model = rfgp.models.ExactGPModel(x, y, likelihood, kernel)
    else:
        model = GP(x, y, kernel, likelihood)
    return model.to(dtype)


def mll_value(model):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    return mll(model(*model.train_inputs), model.train_targets)


def predict(model, x_test):
    model.eval()
    with torch.no_grad():
        out = model.likelihood(model(x_test))
        return out.mean, out.variance


def streaming_model(dtype=torch.float64):
    kernel = gpytorch.kernels.ScaleKernel(kernels.SketchedRBFKernel(32, input_dim=D, seed=0))
    return rfgp.StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood()).to(dtype)


def multioutput_model(x=None, y=None, kernel=None):
    x = data(8) if x is None else x
    y = torch.stack((torch.sin(x[:, 0]), torch.cos(x[:, 1])), -1) if y is None else y
    kernel = kernels.SketchedCurlFreeKernel(32, input_dim=D, seed=0) if kernel is None else kernel
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=D, rank=0)
    return rfgp.MultiOutputGPModel(x, y, likelihood, kernel).double()


def dirichlet_model(labels, x=None, num_classes=3):
    x = data(labels.shape[0]) if x is None else x
    likelihood = rfgp.likelihoods.DirichletClassificationLikelihood(labels, num_classes=num_classes, dtype=torch.float64)
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
    kernel = gpytorch.kernels.ScaleKernel(kernels.SketchedRBFKernel(32, input_dim=D, seed=0))
    return rfgp.models.ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).double()
