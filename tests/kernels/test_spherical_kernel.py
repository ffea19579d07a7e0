"""SketchedSphericalPolynomialKernel: GPyTorch contract, accuracy against the exact kernel, state."""

import math
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.kernels import SketchedSphericalPolynomialKernel
from rfgp.models import ExactGPModel

F64 = torch.float64


def unit_rows(*shape, seed=0, dtype=None):
    g = torch.Generator().manual_seed(seed)
    return torch.nn.functional.normalize(torch.randn(*shape, generator=g, dtype=dtype), dim=-1)


class TestSketchedSphericalPolynomialKernel(BaseKernelTestCase, unittest.TestCase):
    # The harness slices active_dims out of its data; the sliced rows are not unit-norm,
    # so the harness kernels opt in to normalisation (the explicit-opt-in path).
    def create_kernel_no_ard(self, **kwargs):
        return SketchedSphericalPolynomialKernel(
            power=3, num_features=64, method="srf_orth", normalize_inputs=True, seed=0, **kwargs
        )

    def create_data_no_batch(self):
        return unit_rows(50, 10)

    def create_data_single_batch(self):
        return unit_rows(2, 3, 4)

    def create_data_double_batch(self):
        return unit_rows(3, 2, 50, 4)


@pytest.mark.parametrize("method", ["srf", "srf_orth", "srf_orth_complex"])
def test_converges_to_the_fitted_kernel_and_stays_within_fit_error(method):
    x = unit_rows(60, 16, dtype=F64)
    kernel = SketchedSphericalPolynomialKernel(power=7, num_features=2**14, method=method, seed=0).double()
    approx = kernel(x).to_dense()
    fitted = kernel.feature_map.fitted_kernel(torch.cdist(x, x))
    exact = kernel.exact(x, x)
    # MC error with m = 8192 frequencies is ≈ 0.01 per entry at most; K̂ is within max_fit_error of k.
    assert (approx - fitted).abs().max() < 0.05
    assert (approx - exact).abs().max() < 0.05 + kernel.feature_map.max_fit_error
    errors = []
    for width in (64, 1024):
        small = SketchedSphericalPolynomialKernel(power=7, num_features=width, method=method, seed=1).double()
        errors.append(torch.linalg.matrix_norm(small(x).to_dense() - fitted) / torch.linalg.matrix_norm(fitted))
    assert errors[1] < 0.5 * errors[0]


def test_returns_low_rank_operator_with_bias_correction():
    x = unit_rows(20, 8, dtype=F64)
    kernel = SketchedSphericalPolynomialKernel(power=3, num_features=64, seed=0).double()
    covar = kernel(x).evaluate_kernel()
    assert isinstance(covar, FeatureRootLinearOperator)
    target, expected = kernel.diag_moments(x)
    assert torch.equal(target, torch.ones(20, dtype=F64))
    assert torch.allclose(expected, kernel(x, diag=True))
    assert torch.allclose(expected, torch.full((20,), kernel.feature_map.density.mass, dtype=F64))


def test_gp_prediction_runs_in_scale_kernel():
    x, y = unit_rows(40, 8, dtype=F64), torch.randn(40, dtype=F64)

    kernel = gpytorch.kernels.ScaleKernel(SketchedSphericalPolynomialKernel(power=3, num_features=128, seed=0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, kernel, mean_module=gpytorch.means.ZeroMean()).double().eval()
    with torch.no_grad():
        prediction = model.likelihood(model(unit_rows(7, 8, seed=1, dtype=F64)))
    assert torch.isfinite(prediction.mean).all() and (prediction.variance > 0).all()


def test_state_dict_round_trip():
    x = unit_rows(9, 12, dtype=F64)
    kernel = SketchedSphericalPolynomialKernel(power=10, num_features=64, a=4.0, method="srf", seed=0).double()
    reference = kernel(x).to_dense()
    fresh = SketchedSphericalPolynomialKernel(power=10, num_features=64, a=4.0, method="srf", seed=5).double()
    fresh.load_state_dict(kernel.state_dict())
    assert torch.equal(fresh(x).to_dense(), reference)
    assert torch.equal(fresh.feature_map.density.weights, kernel.feature_map.density.weights)


def test_batch_shape_kernel_on_unbatched_inputs_gives_the_batch():
    # no hyperparameter carries the batch: the output was (n, n) and GPyTorch raised "expected (2, n, n) ... likely a
    # bug in GPyTorch"
    kernel = SketchedSphericalPolynomialKernel(power=3, num_features=64, seed=0, batch_shape=torch.Size([2]))
    single = SketchedSphericalPolynomialKernel(power=3, num_features=64, seed=0)
    x = unit_rows(5, 3, dtype=F64)
    covariance = kernel(x).to_dense()
    assert covariance.shape == (2, 5, 5)
    assert torch.equal(covariance[0], single(x).to_dense()) and torch.equal(covariance[1], covariance[0])
    assert torch.equal(kernel(x, diag=True), single(x, diag=True).expand(2, 5))


def test_bad_input():
    kernel = SketchedSphericalPolynomialKernel(power=3, num_features=64, seed=0)
    with pytest.raises(ValueError, match="unit sphere"):
        kernel(torch.randn(5, 4)).to_dense()
    with pytest.raises(ValueError, match="method"):
        SketchedSphericalPolynomialKernel(power=3, num_features=64, method="rff")
    with pytest.raises(ValueError, match="power"):
        SketchedSphericalPolynomialKernel(power=0, num_features=64)
    with pytest.raises(ValueError, match="a must be"):
        SketchedSphericalPolynomialKernel(power=3, num_features=64, a=1.0)
    assert not kernel.has_lengthscale and not math.isnan(kernel.a)


def test_polynomial_from_sphere_dispatches_to_spherical_random_features():
    from rfgp.kernels import SketchedPolynomialKernel

    kernel = SketchedPolynomialKernel.from_sphere(2.0, 3, 64, method="srf_orth", input_dim=8, seed=0)
    assert isinstance(kernel, SketchedSphericalPolynomialKernel)
    assert kernel.method == "srf_orth" and kernel.feature_map.power == 3
    x = torch.nn.functional.normalize(torch.randn(5, 8, dtype=torch.float64), dim=-1)
    with pytest.raises(ValueError, match="unit"):
        kernel.double()(2 * x).to_dense()
