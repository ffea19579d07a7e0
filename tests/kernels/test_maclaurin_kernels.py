"""Maclaurin kernels: GPyTorch contract, agreement with exact kernels, bias-corrected posterior, training."""

import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

import rfgp
from rfgp.kernels import (
    MaclaurinRBFKernel,
    SketchedExponentialKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
    refit_allocation,
)


class TestMaclaurinRBFContract(BaseKernelTestCase, unittest.TestCase):
    """GPyTorch's kernel harness; seeded kernels fitted on the same first inputs share their draws."""

    def create_kernel_no_ard(self, **kwargs):
        return SketchedRBFKernel(33, method="maclaurin", seed=0, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return SketchedRBFKernel(33, method="maclaurin", ard_num_dims=num_dims, seed=0, **kwargs)


def _relative_error(kernel, exact, x):
    return ((kernel(x).to_dense() - exact(x).to_dense()).norm() / exact(x).to_dense().norm()).item()


def test_maclaurin_rbf_approaches_the_exact_kernel():
    x = torch.randn(60, 4, dtype=torch.float64)
    x = x - x.mean(0)
    exact = gpytorch.kernels.RBFKernel().double()
    exact.lengthscale = 2.0
    errors = []
    for budget in (17, 513):
        kernel = rfgp.sketch(exact, budget, method="maclaurin", seed=0, projection="srht", weights="ctr").double()
        errors.append(_relative_error(kernel, exact, x))
    assert errors[1] < 0.05 and errors[1] < errors[0] / 3


@pytest.mark.parametrize("method", ["maclaurin", "random_maclaurin"])
def test_polynomial_maclaurin_approaches_the_exact_kernel(method):
    x = torch.nn.functional.normalize(torch.randn(40, 6, dtype=torch.float64), dim=-1)
    exact = gpytorch.kernels.PolynomialKernel(3).double()
    errors = [
        _relative_error(SketchedPolynomialKernel(3, F, method=method, projection="rademacher", weights="real",
                                                 seed=1).double(), exact, x)
        for F in (32, 4096)
    ]
    assert errors[1] < 0.1 and errors[1] < errors[0] / 3


def test_exponential_kernel_expectation_and_lengthscale():
    x = 0.5 * torch.randn(20, 3, dtype=torch.float64)
    kernel = SketchedExponentialKernel(2049, projection="srht", weights="ctr", max_order=8, seed=0).double()
    kernel.lengthscale = 1.5
    exact = torch.exp(x @ x.T / 1.5**2)
    assert ((kernel(x).to_dense() - exact).norm() / exact.norm()).item() < 0.05
    assert kernel.feature_map.order >= 3


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ZeroMean()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _sinc_gp(bias_correction):
    x = torch.linspace(-1.5, 1.5, 30, dtype=torch.float64).unsqueeze(-1)
    y = torch.sin(2 * x.squeeze(-1)) / x.squeeze(-1)
    kernel = SketchedRBFKernel(10, method="maclaurin", max_order=12, bias_correction=bias_correction, seed=0,
                               projection="rademacher", weights="real")
    model = _GP(x, y, kernel).double()
    model.covar_module.base_kernel.lengthscale = 0.5
    model.covar_module.outputscale = 2.0
    model.likelihood.noise = 0.01
    refit_allocation(model.covar_module, x)  # allocate on the training inputs (not train + test)
    model.eval()
    return model


def test_corrected_posterior_variance_returns_to_the_prior_far_from_the_data():
    """Paper 000 §5.6: without the correction the variance collapses to 0 away from x = 0."""
    test = torch.tensor([[0.0], [5.0]], dtype=torch.float64)  # ‖x‖/ℓ = 10 at x = 5
    corrected, uncorrected = _sinc_gp(True), _sinc_gp(False)
    assert corrected.covar_module.base_kernel.feature_map.order == 9
    with torch.no_grad():
        var_c = corrected(test).variance
        var_u = uncorrected(test).variance
        mean_c, mean_u = corrected(test).mean, uncorrected(test).mean
    assert var_c[1] > 0.999 * 2.0 and var_u[1] < 1e-3
    assert torch.allclose(mean_c, mean_u)  # the correction touches the variance only
    assert abs(var_c[0] - var_u[0]) < 1e-6  # near the data it is negligible


def test_training_by_marginal_likelihood_moves_lengthscale_with_fixed_draws():
    x = torch.randn(40, 2, dtype=torch.float64)
    y = torch.sin(x.sum(-1))
    model = _GP(x, y, SketchedRBFKernel(41, method="maclaurin", projection="srht", weights="ctr", seed=0)).double()
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    model(x)  # the lazily initialised map allocates and draws on the first inputs
    buffers = {k: v.clone() for k, v in model.covar_module.base_kernel.feature_map.named_buffers()}
    assert buffers
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    start = model.covar_module.base_kernel.lengthscale.item()
    for _ in range(5):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        assert model.covar_module.base_kernel.raw_lengthscale.grad.abs().item() > 0
        assert model.covar_module.raw_outputscale.grad.abs().item() > 0
        optimizer.step()
    assert model.covar_module.base_kernel.lengthscale.item() != start
    after = dict(model.covar_module.base_kernel.feature_map.named_buffers())
    assert all(torch.equal(after[k], v) for k, v in buffers.items())
    widths = model.covar_module.base_kernel.feature_map.widths
    model.covar_module.base_kernel.lengthscale = 5.0
    refit_allocation(model.covar_module, x)
    assert model.covar_module.base_kernel.feature_map.widths != widths  # allocation follows ℓ


def test_polynomial_offset_gradient_and_refit():
    x = torch.nn.functional.normalize(torch.randn(20, 3, dtype=torch.float64), dim=-1)
    kernel = SketchedPolynomialKernel(3, 33, method="maclaurin", seed=0).double()
    kernel(x).to_dense().sum().backward()
    assert kernel.raw_offset.grad.abs().item() > 0
    kernel.offset = 3.0
    refit_allocation(kernel, x)
    assert kernel.feature_map.kernel.offset == pytest.approx(3.0)


def test_kernel_state_dict_round_trip():
    x = torch.randn(25, 3)
    kernel = SketchedRBFKernel(21, method="maclaurin", projection="srht", weights="ctr", seed=0)
    before = kernel(x).to_dense()
    fresh = SketchedRBFKernel(21, method="maclaurin", projection="srht", weights="ctr", seed=7, input_dim=3)
    fresh.load_state_dict(kernel.state_dict())
    assert torch.equal(fresh(x).to_dense(), before)


def test_bad_input():
    with pytest.raises(ValueError, match="method must be one of 'maclaurin', 'random_maclaurin'; got 'srf'"):
        SketchedExponentialKernel(16, method="srf")
    with pytest.raises(TypeError, match="no OptimizedMaclaurin feature map"):
        refit_allocation(SketchedRBFKernel(16), torch.randn(5, 2))
    with pytest.raises(ValueError, match="projection must be one of"):
        SketchedRBFKernel(16, method="maclaurin", projection="hierarchical")


def test_rbf_map_that_carries_no_share_of_the_kernel_is_refused():
    """26 standardised columns at GPyTorch's initial lengthscale (‖x‖²/ℓ² ≈ 54): order ≤ 10 carries ~1e-10 of
    k(x, x), the features are numerically zero, and fit_mll "converged" at the mean prediction (diamonds: test RMSE
    1.02 against 0.19 exact). Every allocation fit refuses such a map; a refused refit leaves the map as it was."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 26, generator=g, dtype=torch.float64)
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=26)).double()
    with pytest.raises(ValueError, match=r"carries a share .* of k\(x, x\) .*below min_share"):
        rfgp.sketch(exact, 512, method="maclaurin", x_sample=x)
    with pytest.raises(ValueError, match="carries a share"):
        MaclaurinRBFKernel(512, ard_num_dims=26, seed=0).double()(x).to_dense()  # fitted at the first call
    kernel = MaclaurinRBFKernel(512, ard_num_dims=26, seed=0).double()
    kernel.lengthscale = 6.0
    features = kernel.featurize(x)
    assert float(features.pow(2).sum(-1).median()) > 0.5
    widths = kernel.feature_map.widths
    kernel.lengthscale = 0.69
    with pytest.raises(ValueError, match="carries a share"):
        refit_allocation(kernel, x)
    assert kernel.feature_map.widths == widths
    kernel.lengthscale = 6.0
    torch.testing.assert_close(kernel.featurize(x), features)


def test_exponential_and_polynomial_maps_that_carry_no_share_of_the_kernel_are_refused():
    """exp(xᵀy/ℓ²) on 26 standardised columns at GPyTorch's initial lengthscale: order ≤ 10 carries 1e-13 of
    k(x, x) = e^{‖x‖²/ℓ²}. The polynomial allocation may pick an order below the power: (xᵀy + 1)^20 on 26 columns of
    scale 3 kept degrees ≤ 15, 1e-9 of k(x, x). Both trained another kernel, and the bias-corrected variance added
    the rest back as uninformed prior variance; both are refused, and min_order=power gives the exact expansion."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(300, 26, generator=g, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"exponential kernel .*carries a share .*raise max_order"):
        SketchedExponentialKernel(512, ard_num_dims=26, seed=0).double()(x).to_dense()
    exact = gpytorch.kernels.PolynomialKernel(20).double()
    with pytest.raises(ValueError, match=r"polynomial\(p=20.*carries a share .*min_order=20"):
        rfgp.sketch(exact, 512, method="maclaurin", x_sample=3 * x)
    with pytest.raises(ValueError, match="carries a share"):
        SketchedPolynomialKernel(20, 512, method="maclaurin", seed=0).double()(3 * x).to_dense()
    kernel = SketchedPolynomialKernel(20, 512, method="maclaurin", min_order=20, seed=0).double()
    kernel.featurize(3 * x)
    assert kernel.feature_map.order == 20



@pytest.mark.parametrize("make", [
    lambda: MaclaurinRBFKernel(129, seed=0),
    lambda: MaclaurinRBFKernel(129, seed=0),
    lambda: SketchedExponentialKernel(129, seed=0),
    lambda: SketchedPolynomialKernel(3, 65, method="maclaurin", seed=0),
], ids=["rbf", "rbf_skipped_degree", "exponential", "polynomial"])
def test_posterior_variance_derivatives_at_the_origin(make, request):
    """The gradient and Hessian of the bias-corrected posterior variance at x = 0 against finite differences: the
    correction's n·log‖x‖² (and the incomplete gamma's (a − 1)·log t) gave NaN there."""
    from .._models import UserGP

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(30, 3, generator=gen, dtype=torch.float64)
    model = UserGP(x, torch.sin(3 * x).sum(-1), gpytorch.kernels.ScaleKernel(make())).double().eval()
    with torch.no_grad():
        model(x[:2])
    if request.node.callspec.id == "rbf_skipped_degree":  # degree 2's features moved to degree 3
        feature_map = model.covar_module.base_kernel.feature_map
        widths = list(feature_map.widths)
        widths[2], widths[1] = widths[2] + widths[1], 0
        feature_map.set_widths(tuple(widths))
        model.train()
        model.eval()
    variance = lambda z: model(z.unsqueeze(0)).variance.sum()  # noqa: E731
    origin = torch.zeros(3, dtype=torch.float64)
    gradient = lambda z: torch.autograd.grad(variance(z.requires_grad_()), z)[0]  # noqa: E731
    hessian = torch.autograd.functional.hessian(variance, origin)
    steps = 1e-5 * torch.eye(3, dtype=torch.float64)
    assert torch.isfinite(gradient(origin.clone())).all()
    expected = torch.stack([(gradient(origin + e) - gradient(origin - e)) / 2e-5 for e in steps], dim=-1)
    torch.testing.assert_close(hessian, expected, rtol=1e-5, atol=1e-7)


def test_a_first_call_on_one_row_names_the_first_call_and_the_remedies():
    """The allocation is fitted on the first call's inputs (≥ 2 rows): one row was refused naming an x_sample the
    caller never passed; with x_sample given, one row is fine."""
    kernel = rfgp.sketch(gpytorch.kernels.RBFKernel(), 257, method="maclaurin")
    with pytest.raises(ValueError, match=r"first call had x of shape \(1, 2\).*x_sample=train_x"):
        kernel(torch.rand(1, 2)).to_dense()
    assert kernel.feature_map.widths is None  # nothing was allocated
    fitted = rfgp.sketch(gpytorch.kernels.RBFKernel(), 257, method="maclaurin", x_sample=torch.rand(50, 2))
    assert fitted(torch.rand(1, 2)).to_dense().shape == (1, 1)
