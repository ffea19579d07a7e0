"""SketchedRBFKernel(method="gaussian_sketch"/"gaussian_sketch_hd") vs GPyTorch's exact RBF kernel."""

import math

import gpytorch
import pytest
import torch

from rfgp.features.gaussian_sketch import truncation_order
from rfgp.kernels.fourier import SketchedRBFKernel
from rfgp.kernels.gaussian_sketch import GaussianSketchRBFKernel


def _data(n=40, d=2, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, d, generator=g, dtype=torch.float64) * 2 + 3.0  # far from 0: needs the centre


@pytest.mark.parametrize("method", ["gaussian_sketch", "gaussian_sketch_hd"])
def test_kernel_matches_exact_rbf_and_reports_truncation_bias(method):
    x = _data()
    kernel = SketchedRBFKernel(4096, method=method, radius=math.sqrt(2) if method.endswith("hd") else 1.0,
                               alpha=1e-8, center=[4.0, 4.0], min_lengthscale=0.8, input_dim=2, seed=0).double()
    kernel.lengthscale = 0.9
    exact = gpytorch.kernels.RBFKernel().double()
    exact.lengthscale = 0.9
    scaled = kernel.scale_inputs(x)
    truncation = (kernel.feature_map.truncated_kernel(scaled, scaled) - exact(x).to_dense()).abs().max()
    assert truncation < 1e-7
    error = (kernel(x).to_dense() - exact(x).to_dense()).abs().max()
    if method == "gaussian_sketch":  # s^d ≤ F: explicit Taylor features, only the truncation error remains
        assert kernel.feature_map.explicit and error < 1e-7
    else:  # the high-degree blocks are sketched
        assert error < 0.02
    target, expected = kernel.diag_moments(x)
    assert torch.allclose(target, torch.ones_like(target))
    assert ((target - expected) >= -1e-14).all() and (target - expected).max() < 1e-6


def test_order_chosen_for_min_lengthscale_and_refuses_smaller_lengthscale():
    kernel = SketchedRBFKernel(256, method="gaussian_sketch", radius=1.0, alpha=1e-4, min_lengthscale=0.5,
                               input_dim=2, seed=0, mode="tree")
    assert kernel.feature_map.order == truncation_order(1.0 / 0.5 / math.sqrt(2), 1e-4, 2)
    kernel.lengthscale = 0.6
    kernel(_data().float()).to_dense()
    kernel.lengthscale = 0.4
    with pytest.raises(ValueError, match="min_lengthscale"):
        kernel(_data().float()).to_dense()
    # a lengthscale just below its bound is printed apart from it ("11.32 is below min_lengthscale=11.32" before)
    kernel.lengthscale = 0.5 * (1 - 1e-5)
    with pytest.raises(ValueError, match=r"lengthscale 0\.499995 is below min_lengthscale=0\.5 "):
        kernel(_data().float()).to_dense()


def test_gp_posterior_close_to_exact_gp():
    x = _data(60)
    y = torch.sin(3 * x[:, 0]) + torch.cos(2 * x[:, 1])
    test = _data(20, seed=1)

    def posterior(covar):
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        likelihood.noise = 1e-2

        class GP(gpytorch.models.ExactGP):
            def __init__(self):
                super().__init__(x, y, likelihood)
                self.mean_module = gpytorch.means.ZeroMean()
                self.covar_module = covar

            def forward(self, z):
                return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

        model = GP().double().eval()
        with torch.no_grad():
            out = model(test)
        return out.mean, out.variance

    sketched = SketchedRBFKernel(4096, method="gaussian_sketch", radius=1.0, alpha=1e-8, center=[4.0, 4.0],
                                 min_lengthscale=0.5, input_dim=2, seed=0)
    sketched.lengthscale = 0.6
    exact = gpytorch.kernels.RBFKernel()
    exact.lengthscale = 0.6
    mean, var = posterior(sketched)
    mean_exact, var_exact = posterior(exact)
    assert torch.allclose(mean, mean_exact, atol=1e-4)
    assert torch.allclose(var, var_exact, atol=1e-4)


def test_taylor_arguments_rejected_for_fourier_methods():
    with pytest.raises(ValueError, match="order=5 is an option of GaussianSketchRBFKernel"):
        SketchedRBFKernel(64, method="rff", order=5)
    with pytest.raises(ValueError, match="method"):
        SketchedRBFKernel(64, method="taylor")


@pytest.mark.parametrize("method", ["gaussian_sketch", "gaussian_sketch_hd"])
def test_lengthscale_gradient_matches_finite_difference(method):
    x = _data(15)
    kernel = SketchedRBFKernel(256, method=method, order=12, center=[4.0, 4.0], input_dim=2, seed=0).double()
    kernel.lengthscale = 0.9

    def value():
        return kernel(x).to_dense().sum()

    value().backward()
    grad = kernel.raw_lengthscale.grad.clone()
    step = 1e-6
    with torch.no_grad():
        kernel.raw_lengthscale += step
        plus = value()
        kernel.raw_lengthscale -= 2 * step
        minus = value()
    assert torch.isfinite(grad).all()
    assert torch.allclose(grad, (plus - minus) / (2 * step), rtol=1e-5)


def test_state_dict_round_trip():
    x = _data(10)
    a = SketchedRBFKernel(128, method="gaussian_sketch", order=6, center=[4.0, 4.0], input_dim=2, seed=0, mode="tree")
    b = SketchedRBFKernel(128, method="gaussian_sketch", order=6, center=[0.0, 0.0], input_dim=2, seed=5, mode="tree")
    a.lengthscale = 1.3
    b.load_state_dict(a.state_dict())
    assert torch.equal(a(x.float()).to_dense(), b(x.float()).to_dense())


def test_center_is_checked_by_name():
    """A centre of the wrong length or with NaN raises naming ``center`` (once a raw RuntimeError at the call, or a
    kernel of NaN)."""
    x = torch.rand(4, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="center must be"):
        GaussianSketchRBFKernel(64, order=4, center=[0.5, 0.5], ard_num_dims=3)
    with pytest.raises(ValueError, match="center contains NaN"):
        GaussianSketchRBFKernel(64, order=4, center=[0.5, math.nan, 0.5])
    kernel = GaussianSketchRBFKernel(64, order=4, center=[0.5, 0.5], seed=0).double()
    with pytest.raises(ValueError, match="center has 2 entries but the inputs have 3 columns"):
        kernel(x).to_dense()
