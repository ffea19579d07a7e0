"""Complex-feature GP posterior (paper 000 App. D): real-arithmetic form against direct complex algebra."""

import gpytorch
import pytest
import torch

from rfgp.complex_posterior import complex_feature_posterior, complex_kernel_posterior
from rfgp.features import PolynomialSketch
from rfgp.kernels import SketchedPolynomialKernel


def _direct(phi_train, y, noise, phi_test):
    """Eqs. 84–85 in complex arithmetic with N × N matrices, then real parts (Eqs. 86–87)."""
    k_train = phi_train @ phi_train.conj().mT  # K̂ᵢⱼ = φᵢᵀ conj φⱼ
    k_cross = phi_train @ phi_test.conj().mT  # k̂(xᵢ, x*)
    k_test = phi_test @ phi_test.conj().mT
    system = k_train + torch.diag(noise.to(k_train.dtype))
    mean = k_cross.conj().mT @ torch.linalg.solve(system, y.to(k_train.dtype))
    covar = k_test - k_cross.conj().mT @ torch.linalg.solve(system, k_cross)
    return mean.real, covar.real


@pytest.mark.parametrize("projection", ["rademacher", "gaussian", "srht"])
def test_real_arithmetic_form_equals_complex_gp(projection):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(25, 4, generator=g, dtype=torch.float64)
    x_test = torch.rand(7, 4, generator=g, dtype=torch.float64)
    y = torch.randn(25, generator=g, dtype=torch.float64)
    noise = 0.05 + torch.rand(25, generator=g, dtype=torch.float64)  # heteroscedastic
    phi = PolynomialSketch(3, 16, input_dim=4, offset=1.0, projection=projection, weights="complex", seed=1).double()
    mean, covar = complex_feature_posterior(phi(x), y, noise, phi(x_test), full_covariance=True)
    mean_direct, covar_direct = _direct(phi.complex_features(x), y, noise, phi.complex_features(x_test))
    assert torch.allclose(mean, mean_direct, rtol=1e-8, atol=1e-10)
    assert torch.allclose(covar, covar_direct, rtol=1e-8, atol=1e-10)
    _, variance = complex_feature_posterior(phi(x), y, noise, phi(x_test))
    assert torch.allclose(variance, covar.diagonal())


def test_complex_posterior_differs_from_real_gp_on_re_k():
    """The notes' warning: the complex GP is a different estimator from the GP on Re K̂."""
    g = torch.Generator().manual_seed(1)
    x, x_test = torch.rand(20, 3, generator=g, dtype=torch.float64), torch.rand(5, 3, generator=g, dtype=torch.float64)
    y = torch.randn(20, generator=g, dtype=torch.float64)
    psi = PolynomialSketch(2, 8, input_dim=3, offset=1.0, weights="complex", seed=0).double()
    mean, _ = complex_feature_posterior(psi(x), y, 0.1, psi(x_test))
    k = psi(x) @ psi(x).T + 0.1 * torch.eye(20, dtype=torch.float64)
    real_mean = psi(x_test) @ psi(x).T @ torch.linalg.solve(k, y)
    assert (mean - real_mean).abs().max() > 1e-3


def test_kernel_wrapper_folds_outputscale_and_float32_runs():
    x = torch.rand(30, 3)
    y = torch.randn(30)
    kernel = gpytorch.kernels.ScaleKernel(SketchedPolynomialKernel(2, 32, weights="complex", seed=0))
    kernel.outputscale = 2.0
    mean, variance = complex_kernel_posterior(kernel, x, y, 0.1, x[:5])
    assert mean.dtype == torch.float32 and mean.shape == (5,) and (variance > 0).all()
    phi = kernel.base_kernel.featurize(x) * 2.0**0.5
    mean64, _ = complex_feature_posterior(phi.double(), y.double(), 0.1, phi[:5].double())
    assert torch.allclose(mean.double(), mean64, rtol=1e-3, atol=1e-4)


def test_bad_shapes():
    with pytest.raises(ValueError, match="even width"):
        complex_feature_posterior(torch.rand(5, 3), torch.rand(5), 0.1, torch.rand(2, 3))
    with pytest.raises(ValueError, match="points"):
        complex_feature_posterior(torch.rand(5, 4), torch.rand(6), 0.1, torch.rand(2, 4))
