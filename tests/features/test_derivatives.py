"""Input derivatives and second derivatives of the feature maps (deterministic, tight tolerances).

* ``input_derivatives`` (the roots of the derivative kernels) equals autograd's Jacobian and
  the diagonal of its Hessian, for sin/cos maps of every sampler and for every polynomial sketch.
* Every map is twice differentiable: Hessians w.r.t. the inputs, and of the marginal
  likelihood w.r.t. the hyperparameters (materialised and chunked statistics), match
  central finite differences.
"""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features import MaternSpectralDensity, PolynomialSketch, RandomFourierFeatures
from rfgp.kernels import SketchedMaternKernel, SketchedPolynomialKernel, SketchedRBFKernel

D = 3
SINCOS_MAPS = {
    "rff": lambda: RandomFourierFeatures(16, input_dim=D, sampler="iid", seed=0),
    "orf": lambda: RandomFourierFeatures(16, input_dim=D, sampler="orthogonal", seed=0),
    "sorf": lambda: RandomFourierFeatures(16, input_dim=D, sampler="structured", seed=0),
    "matern52": lambda: RandomFourierFeatures(16, input_dim=D, spectral_density=MaternSpectralDensity(2.5), seed=0),
}
PROJECTIONS = ["rademacher", "gaussian", "srht", "countsketch", "hierarchical"]


def finite_difference_hessian(f, x, h=1e-4):
    """Central second differences of a scalar function of a vector (float64)."""
    d = x.numel()
    steps = torch.eye(d, dtype=x.dtype) * h
    hessian = torch.empty(d, d, dtype=x.dtype)
    with torch.no_grad():
        for i in range(d):
            for j in range(d):
                a, b = steps[i], steps[j]
                hessian[i, j] = (f(x + a + b) - f(x + a - b) - f(x - a + b) + f(x - a - b)) / (4 * h * h)
    return hessian


def autograd_rows(feature_map, x, **kwargs):
    """[Φ, ∂ⱼΦ, ∂ⱼ²Φ] per point from autograd's Jacobian and Hessian diagonal: ``(n, 1 + 2d, F)``."""
    rows = []
    for point in x:
        def f(z):
            return feature_map(z.unsqueeze(0), **kwargs)[0]

        jacobian = torch.autograd.functional.jacobian(f, point)  # (F, d)
        second = torch.autograd.functional.jacobian(
            lambda z: torch.autograd.functional.jacobian(f, z, create_graph=True), point
        )  # (F, d, d)
        rows.append(torch.cat((f(point).unsqueeze(0), jacobian.T, torch.diagonal(second, dim1=-2, dim2=-1).T)))
    return torch.stack(rows)


@pytest.mark.parametrize("name", list(SINCOS_MAPS))
def test_sincos_input_derivatives_match_autograd(name):
    feature_map = SINCOS_MAPS[name]().double()
    x = torch.randn(2, D, dtype=torch.float64)
    expected = autograd_rows(feature_map, x)
    torch.testing.assert_close(feature_map.input_derivatives(x, second=True), expected, atol=1e-12, rtol=1e-10)
    torch.testing.assert_close(feature_map.input_derivatives(x), expected[:, : 1 + D], atol=1e-12, rtol=1e-10)


@pytest.mark.parametrize(
    "projection, weights, degree",
    [(p, "real", 3) for p in PROJECTIONS] + [("srht", "ctr", 2), ("rademacher", "complex", 2), ("gaussian", "real", 1)],
)
def test_polynomial_input_derivatives_match_autograd(projection, weights, degree):
    feature_map = PolynomialSketch(degree, 8, input_dim=D, offset=0.5, projection=projection, weights=weights,
                                   seed=1).double()
    x = torch.randn(2, D, dtype=torch.float64)
    offset = torch.tensor([0.7], dtype=torch.float64)
    expected = autograd_rows(feature_map, x, offset=offset)
    rows = feature_map.input_derivatives(x, offset=offset, second=True)
    torch.testing.assert_close(rows, expected, atol=1e-11, rtol=1e-10)


def test_input_derivatives_keep_batch_shape():
    feature_map = SINCOS_MAPS["orf"]().double()
    x = torch.randn(2, 5, D, dtype=torch.float64)
    assert feature_map.input_derivatives(x, second=True).shape == (2, 5, 1 + 2 * D, 16)
    sketch = PolynomialSketch(2, 16, input_dim=D, offset=1.0, projection="srht", seed=0).double()
    assert sketch.input_derivatives(x).shape == (2, 5, 1 + D, 16)


@pytest.mark.parametrize("name", [*SINCOS_MAPS, "polynomial"])
def test_feature_hessian_matches_finite_differences(name):
    if name == "polynomial":
        feature_map = PolynomialSketch(3, 16, input_dim=D, offset=1.0, projection="srht", seed=0).double()
    else:
        feature_map = SINCOS_MAPS[name]().double()
    weights = torch.randn(16, dtype=torch.float64)

    def f(z):
        return feature_map(z.unsqueeze(0))[0] @ weights

    x = 0.5 * torch.randn(D, dtype=torch.float64)
    hessian = torch.autograd.functional.hessian(f, x)
    assert hessian.abs().max() > 1e-3  # not the silent zero of a once-differentiable backward
    torch.testing.assert_close(hessian, finite_difference_hessian(f, x), atol=1e-6, rtol=1e-5)


KERNELS = {
    "rff": lambda: SketchedRBFKernel(64, method="rff", ard_num_dims=2, seed=0),
    "orf": lambda: SketchedRBFKernel(64, method="orf", ard_num_dims=2, seed=0),
    "sorf": lambda: SketchedRBFKernel(64, method="sorf", ard_num_dims=2, seed=0),
    "matern": lambda: SketchedMaternKernel(64, nu=2.5, ard_num_dims=2, seed=0),
    "polynomial": lambda: SketchedPolynomialKernel(2, 64, seed=0),
}


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _model(name):
    x = torch.rand(30, 2, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) * x[:, 1]
    return _GP(x, y, KERNELS[name]()).double()


@pytest.mark.parametrize("name", list(KERNELS))
def test_predictive_mean_hessian_matches_finite_differences(name):
    model = _model(name)
    model.eval()

    def mean(z):
        return model(z.unsqueeze(0)).mean.squeeze()

    x = torch.tensor([0.4, 0.6], dtype=torch.float64)
    hessian = torch.autograd.functional.hessian(mean, x)
    assert hessian.abs().max() > 1e-3
    torch.testing.assert_close(hessian, finite_difference_hessian(mean, x), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("chunk", [None, 7])
def test_mll_hessian_in_hyperparameters_matches_finite_differences(chunk):
    """Second derivatives through the feature statistics (materialised and chunked) w.r.t. the lengthscale."""
    model = _model("rff")
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    raw = model.covar_module.base_kernel.raw_lengthscale

    def loss_at(value):
        with torch.no_grad():
            raw.copy_(value)
        with rfgp.settings.chunk_size(chunk):
            return -mll(model(*model.train_inputs), model.train_targets)

    start = raw.detach().clone().reshape(-1)
    with rfgp.settings.chunk_size(chunk):
        loss = -mll(model(*model.train_inputs), model.train_targets)
        (grad,) = torch.autograd.grad(loss, raw, create_graph=True)
        hessian = torch.stack([torch.autograd.grad(grad.reshape(-1)[i], raw, retain_graph=True)[0].reshape(-1)
                               for i in range(start.numel())])
    expected = finite_difference_hessian(lambda v: loss_at(v.reshape(raw.shape)), start)
    torch.testing.assert_close(hessian, expected, atol=1e-5, rtol=1e-4)


def test_dirichlet_label_statistics_refuse_second_derivatives():
    """Their lean backward has no differentiable form: create_graph raises instead of returning partial terms."""
    from rfgp.inference.classification import LabelBlockPlan, label_feature_statistics

    labels = torch.tensor([0, 1, 1, 0, 2, 2, 1])
    features = torch.randn(7, 4, dtype=torch.float64, requires_grad=True)
    grams, projection = label_feature_statistics(features, LabelBlockPlan.from_labels(labels, 3),
                                                  torch.randn(7, 1, dtype=torch.float64))
    (first,) = torch.autograd.grad(grams.sum() + projection.sum(), features)  # first order is fine
    assert first.shape == features.shape
    with pytest.raises(NotImplementedError, match="second derivatives"):
        torch.autograd.grad(grams.pow(2).sum(), features, create_graph=True)
