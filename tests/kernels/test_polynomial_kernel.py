"""SketchedPolynomialKernel: GPyTorch kernel contract, agreement with PolynomialKernel, conversion, errors."""

import math
import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.kernels import SketchedPolynomialKernel


class TestSketchedPolynomialKernelContract(BaseKernelTestCase, unittest.TestCase):
    """GPyTorch's kernel harness; kernels are seeded so that two instances share their draws."""

    def create_kernel_no_ard(self, **kwargs):
        return SketchedPolynomialKernel(2, 64, seed=0, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return SketchedPolynomialKernel(2, 64, lengthscale=True, ard_num_dims=num_dims, seed=0, **kwargs)

    def create_data_no_batch(self):
        return torch.rand(50, 10)

    def create_data_single_batch(self):
        return torch.rand(2, 3, 2)

    def create_data_double_batch(self):
        return torch.rand(3, 2, 50, 2)


def _relative_frobenius(kernel, exact, x):
    k_hat = kernel(x).to_dense()
    k = exact(x).to_dense()
    return ((k_hat - k).norm() / k.norm()).item()


@pytest.mark.parametrize("projection", ["rademacher", "srht", "countsketch", "hierarchical"])
def test_converges_to_gpytorch_polynomial_kernel(projection):
    x = torch.nn.functional.normalize(torch.rand(30, 6, dtype=torch.float64), dim=-1)
    exact = gpytorch.kernels.PolynomialKernel(3).double()
    errors = [
        _relative_frobenius(rfgp.sketch(exact, F, projection=projection, seed=1).double(), exact, x)
        for F in (64, 4096)
    ]
    assert errors[1] < 0.1 and errors[1] < errors[0] / 3  # error ∝ F^{-1/2}


def test_sketch_converter_copies_offset_constraint_prior_and_batch():
    prior = gpytorch.priors.GammaPrior(2.0, 1.0)
    exact = gpytorch.kernels.PolynomialKernel(
        4, offset_prior=prior, offset_constraint=gpytorch.constraints.Interval(0.0, 5.0), batch_shape=torch.Size([2])
    )
    exact.offset = torch.tensor([[0.5], [2.0]])
    sketched = rfgp.sketch(gpytorch.kernels.ScaleKernel(exact), 32, seed=0).base_kernel
    assert isinstance(sketched, SketchedPolynomialKernel) and sketched.power == 4
    assert torch.allclose(sketched.offset, exact.offset)
    assert isinstance(sketched.raw_offset_constraint, gpytorch.constraints.Interval)
    assert "offset_prior" in dict(sketched.named_priors.__self__._priors)
    assert sketched(torch.rand(2, 5, 3)).shape == (2, 5, 5)


def test_lengthscale_scales_inner_product():
    x = torch.rand(8, 3, dtype=torch.float64)
    kernel = SketchedPolynomialKernel(2, 16, lengthscale=True, ard_num_dims=3, seed=0).double()
    kernel.lengthscale = torch.tensor([[0.5, 1.0, 2.0]])
    plain = SketchedPolynomialKernel(2, 16, seed=0).double()
    plain.offset = kernel.offset.detach()
    assert torch.allclose(kernel(x).to_dense(), plain(x / torch.tensor([0.5, 1.0, 2.0])).to_dense())


def test_gradients_reach_offset_and_lengthscale():
    x = torch.rand(10, 4, dtype=torch.float64)
    kernel = SketchedPolynomialKernel(3, 32, lengthscale=True, seed=0).double()
    kernel(x).to_dense().sum().backward()
    assert kernel.raw_offset.grad.abs().item() > 0 and kernel.raw_lengthscale.grad.abs().item() > 0


def test_state_dict_round_trip_bit_for_bit():
    x = torch.rand(7, 4)
    kernel = SketchedPolynomialKernel(3, 32, lengthscale=True, projection="srht", weights="ctr", seed=0)
    kernel(x)  # lazy draws
    kernel.offset = 1.3
    other = SketchedPolynomialKernel(3, 32, lengthscale=True, projection="srht", weights="ctr", seed=123)
    other.load_state_dict(kernel.state_dict())
    assert torch.equal(kernel(x).to_dense(), other(x).to_dense())


def test_from_sphere_matches_eq_57_and_guards_the_sphere():
    a, p = 2.0, 3
    x = torch.nn.functional.normalize(torch.randn(20, 5, dtype=torch.float64), dim=-1)
    kernel = SketchedPolynomialKernel.from_sphere(a, p, 8192, seed=0).double()
    exact = (1 - torch.cdist(x, x).pow(2) / a**2).pow(p)
    k_hat = kernel(x).to_dense()
    assert ((k_hat - exact).norm() / exact.norm()).item() < 0.1
    assert kernel.offset.item() == pytest.approx(1 - 2 / a**2, rel=1e-5)
    assert kernel.lengthscale.item() == pytest.approx(a / math.sqrt(2), rel=1e-5)
    with pytest.raises(ValueError, match="unit sphere"):
        kernel(2 * x).to_dense()
    normalising = SketchedPolynomialKernel.from_sphere(a, p, 8192, normalize_inputs=True, seed=0).double()
    assert torch.allclose(normalising(3 * x).to_dense(), k_hat)
    with pytest.raises(ValueError, match="a must be"):
        SketchedPolynomialKernel.from_sphere(1.0, 3, 64)


def _posterior_mean(covar, x, y, x_test):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    likelihood.noise = 0.01
    model = rfgp.models.ExactGPModel(x, y, likelihood, covar).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    model.train()
    loss = -mll(model(x), y)
    model.eval()
    with torch.no_grad():
        return likelihood(model(x_test)).mean, loss


def test_gp_posterior_approaches_exact_gp_as_features_grow():
    g = torch.Generator().manual_seed(0)
    x = torch.nn.functional.normalize(torch.rand(80, 3, generator=g, dtype=torch.float64), dim=-1)
    x_test = torch.nn.functional.normalize(torch.rand(20, 3, generator=g, dtype=torch.float64), dim=-1)
    w = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    y, y_test = (x @ w) ** 2, (x_test @ w) ** 2
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.PolynomialKernel(2)).double()
    reference, exact_loss = _posterior_mean(exact, x, y, x_test)
    errors = []
    for F in (32, 2048):
        mean, loss = _posterior_mean(rfgp.sketch(exact, F, seed=0).double(), x, y, x_test)
        assert torch.isfinite(loss)
        errors.append(((mean - reference).norm() / reference.norm()).item())
    assert errors[1] < 0.05 and errors[1] < errors[0]
    assert ((reference - y_test).norm() / y_test.norm()).item() < 0.1


@pytest.mark.parametrize(
    "kwargs,error,match",
    [
        (dict(power=0), ValueError, "power"),
        (dict(power=2.5), ValueError, "power"),
        (dict(method="magic"), ValueError, "method"),
        (dict(ard_num_dims=3), ValueError, "lengthscale=True"),
        (dict(lengthscale="yes"), TypeError, "lengthscale"),
        (dict(input_normalization="scale"), ValueError, "input_normalization"),
        (dict(weights="ctr", num_features=7), ValueError, "even"),
    ],
)
def test_bad_arguments(kwargs, error, match):
    args = dict(power=2, num_features=8)
    with pytest.raises(error, match=match):
        SketchedPolynomialKernel(**{**args, **kwargs})


def test_bad_inputs():
    kernel = SketchedPolynomialKernel(2, 8, input_dim=3, seed=0)
    with pytest.raises(ValueError, match="input_dim=3"):
        kernel(torch.rand(4, 5)).to_dense()
    with pytest.raises(TypeError, match="real"):
        kernel(torch.rand(4, 3, dtype=torch.complex64)).to_dense()
    with pytest.raises(ValueError, match="offset must be finite and ≥ 0"):
        kernel.offset = -1.0


@pytest.mark.parametrize("method", ["sketch", "maclaurin", "random_maclaurin"])
def test_an_offset_constraint_admitting_negative_offsets_is_refused(method):
    """Interval(−1, 1) accepted offset = −0.5 and every feature of [x; √c] was NaN, silently: refused when built
    (directly or converted from GPyTorch's PolynomialKernel), naming the constraint."""
    constraint = gpytorch.constraints.Interval(-1.0, 1.0)
    with pytest.raises(ValueError, match="offset_constraint must keep the offset ≥ 0"):
        SketchedPolynomialKernel(2, 8, method=method, offset_constraint=constraint)
    with pytest.raises(ValueError, match="offset_constraint must keep the offset ≥ 0"):
        rfgp.sketch(gpytorch.kernels.PolynomialKernel(2, offset_constraint=constraint), 8, method=method)
    assert SketchedPolynomialKernel(2, 8, offset_constraint=gpytorch.constraints.Interval(0.0, 1.0)).offset >= 0


@pytest.mark.parametrize("method", ["sketch", "maclaurin", "random_maclaurin"])
def test_a_nan_offset_set_in_place_is_named_not_propagated(method):
    """A NaN written into raw_offset in place (past the setter's check) made every feature NaN silently; the kernel
    call now names it, as it names a NaN lengthscale — the derivative kernel too."""
    x = torch.rand(6, 3, dtype=torch.float64)
    kernels = [rfgp.sketch(gpytorch.kernels.PolynomialKernel(power=3), 32, method=method).double()]
    if method == "sketch":
        kernels.append(rfgp.sketch(gpytorch.kernels.PolynomialKernelGrad(power=2), 32).double())
    for kernel in kernels:
        with torch.no_grad():
            kernel.raw_offset.fill_(math.nan)
        with pytest.raises(NonFiniteHyperparameterError, match="offset = nan"):
            kernel(x).to_dense()


@pytest.mark.parametrize("method, options", [("maclaurin", {"min_order": 2}), ("random_maclaurin", {})])
def test_maclaurin_variance_moments_follow_the_kernels_current_offset(method, options):
    """The Maclaurin maps' k(x, x) and E[Φ(x)ᵀΦ(x)] used the offset of the map's allocation fit (ν = 1 at
    construction, whatever the kernel's offset: GPyTorch's default is softplus(0) = 0.693), while the features use
    the kernel's current offset: the bias correction was the wrong offset's (after k.offset = 3: k(x, x) = 8
    reported where it is 64).  Now both moments are the current offset's: E[Φ(x)ᵀΦ(x)] equals the Monte-Carlo mean
    of ‖Φ(x)‖² over draws within 4 standard errors, and k(x, x) = (ν + ‖x‖²)^p."""
    x = torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

    def kernel(seed):
        return SketchedPolynomialKernel(3, 40, method=method, weights="real", projection="rademacher",
                                        bias_correction=True, seed=seed, input_dim=3, **options).double()

    for offset in (None, 3.0):
        norms = []
        for seed in range(600):
            k = kernel(seed)
            if offset is not None:
                k.offset = offset
            with torch.no_grad():
                norms.append(k.featurize(x).pow(2).sum(-1))
        norms = torch.stack(norms)
        with torch.no_grad():
            target, expected = k.diag_moments(x)
        assert torch.allclose(target, (k.offset + x.pow(2).sum(-1)).pow(3), rtol=1e-12, atol=0)
        error = norms.std(0) / len(norms) ** 0.5
        assert ((norms.mean(0) - expected).abs() < 4 * error + 1e-12).all(), (norms.mean(0), expected, error)


def test_maclaurin_variance_moments_copy_no_constant_from_the_host(monkeypatch):
    """The binomials C(p, n) of the bias correction were a new host tensor at every call (a copy to the device, which
    waits for the stream on CUDA); they are made once per dtype and device (:func:`~rfgp.core.dtypes.device_constant`).
    """
    kernel = SketchedPolynomialKernel(3, 41, method="maclaurin", min_order=3, seed=0, input_dim=2).double()
    x = torch.rand(6, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    first = kernel.diag_moments(x)
    made, tensor = [], torch.tensor
    monkeypatch.setattr(torch, "tensor", lambda *args, **kwargs: made.append(args) or tensor(*args, **kwargs))
    again = kernel.diag_moments(x)
    assert not made
    assert all(torch.equal(a, b) for a, b in zip(first, again))
