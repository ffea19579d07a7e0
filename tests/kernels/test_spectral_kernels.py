"""Sketched Periodic / RQ / spectral mixture kernels against GPyTorch's exact kernels, and the spectral protocol."""

import unittest

import gpytorch
import pytest
import torch
from gpytorch.test.base_kernel_test_case import BaseKernelTestCase

from rfgp.kernels.periodic import SketchedPeriodicKernel
from rfgp.kernels.rational_quadratic import SketchedRQKernel
from rfgp.kernels.spectral_mixture import SketchedSpectralMixtureKernel
from tests._spectral_checks import assert_unbiased

F64 = torch.float64
BATCH = torch.Size([2])
GEN = torch.Generator().manual_seed(0)
X = torch.rand(7, 2, generator=GEN, dtype=F64) * 2


def periodic_pair(seed=0, num_features=64):
    exact = gpytorch.kernels.PeriodicKernel(ard_num_dims=2, batch_shape=BATCH).double()
    exact.lengthscale = torch.tensor([[[0.6, 1.4]], [[1.1, 0.9]]], dtype=F64)
    exact.period_length = torch.tensor([[[0.9, 1.6]], [[1.3, 0.7]]], dtype=F64)
    sketched = SketchedPeriodicKernel(num_features, seed=seed, ard_num_dims=2, batch_shape=BATCH).double()
    sketched.lengthscale, sketched.period_length = exact.lengthscale, exact.period_length
    return exact, sketched


def rq_pair(seed=0, num_features=64):
    exact = gpytorch.kernels.RQKernel(ard_num_dims=2, batch_shape=BATCH).double()
    exact.lengthscale = torch.tensor([[[0.6, 1.4]], [[1.1, 0.9]]], dtype=F64)
    exact.alpha = torch.tensor([[0.5], [2.0]], dtype=F64)
    sketched = SketchedRQKernel(num_features, seed=seed, ard_num_dims=2, batch_shape=BATCH).double()
    sketched.lengthscale, sketched.alpha = exact.lengthscale, exact.alpha
    return exact, sketched


def mixture_pair(seed=0, num_features=64):
    exact = gpytorch.kernels.SpectralMixtureKernel(num_mixtures=3, ard_num_dims=2, batch_shape=BATCH).double()
    exact.mixture_weights = torch.tensor([[0.2, 0.5, 0.3], [1.0, 0.4, 0.8]], dtype=F64)
    exact.mixture_means = torch.rand(2, 3, 1, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    exact.mixture_scales = 0.2 + torch.rand(2, 3, 1, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    sketched = SketchedSpectralMixtureKernel(3, num_features, ard_num_dims=2, batch_shape=BATCH, seed=seed).double()
    for name in ("mixture_weights", "mixture_means", "mixture_scales"):
        setattr(sketched, name, getattr(exact, name))
    return exact, sketched


PAIRS = {"periodic": periodic_pair, "rq": rq_pair, "spectral_mixture": mixture_pair}


@pytest.mark.parametrize("family", PAIRS)
def test_batched_ard_gram_is_unbiased_against_gpytorch(family):
    exact = PAIRS[family]()[0](X).to_dense().detach()
    assert_unbiased(lambda seed: PAIRS[family](seed)[1](X).to_dense(), exact, 60)


@pytest.mark.parametrize("family", PAIRS)
def test_spectral_protocol_reproduces_the_kernel(family):
    exact, kernel = PAIRS[family]()
    target = exact(X[:1], X).to_dense().detach()  # k(x₀, x), shape (2, 1, 7)
    tau = X[:1] - X  # (7, 2)

    def estimate(seed):
        draws = kernel.spectral_draws(64, 2, torch.Generator().manual_seed(seed))
        assert all(v.device.type == "cpu" and (v.dtype == F64 or not v.is_floating_point()) for v in draws.values())
        frequencies = kernel.spectral_frequencies(draws)
        assert frequencies.shape == (2, 64, 2)
        weights = kernel.spectral_weights(draws)
        weights = torch.ones(2, 64, dtype=F64) if weights is None else weights
        cosines = torch.cos(tau @ frequencies.mT)  # (2, 7, 64)
        return (kernel.spectral_amplitude()[:, None] * (weights.unsqueeze(-2) * cosines).mean(-1)).unsqueeze(-2)

    assert_unbiased(estimate, target, 80)


@pytest.mark.parametrize("family", PAIRS)
def test_hyperparameters_receive_gradients_and_state_dict_round_trips(family):
    _, kernel = PAIRS[family](seed=3)
    kernel(X).to_dense().sum().backward()
    for name, parameter in kernel.named_parameters():
        assert parameter.grad is not None and bool(parameter.grad.abs().sum() > 0), name
    _, other = PAIRS[family](seed=11)
    state = kernel.state_dict()
    assert all(torch.is_tensor(value) for value in state.values())
    other.load_state_dict(state)
    assert torch.equal(other(X).to_dense(), kernel(X).to_dense())


def test_state_of_another_family_is_refused():
    _, periodic = periodic_pair()
    _, rq = rq_pair()
    periodic(X).to_dense()
    with pytest.raises((ValueError, RuntimeError), match="SketchedPeriodicKernel|config_type"):
        rq.load_state_dict(periodic.state_dict())


def test_float32_and_diag():
    _, kernel = periodic_pair()
    kernel = kernel.float()
    x = X.float()
    assert kernel(x).to_dense().dtype == torch.float32
    assert torch.allclose(kernel(x, diag=True), kernel(x).to_dense().diagonal(dim1=-2, dim2=-1), atol=1e-5)


def test_float32_gradients_stay_finite_when_the_lengthscale_grows_far_from_the_proposal():
    kernel = SketchedPeriodicKernel(256, seed=0)
    x = X[:, :1].float()
    kernel(x).to_dense()
    kernel.lengthscale = 30.0  # high sampled harmonics now have q_k(1/ℓ) below float32's range
    kernel(x).to_dense().sum().backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in kernel.parameters())


def test_float32_spectral_mixture_amplitude_stays_finite_over_many_dimensions():
    # A = (Σw)^d = 0.05^50 underflows float32: log A = −inf made every gradient NaN; log A = d·log Σw stays finite
    dims = 50
    kernels = [SketchedSpectralMixtureKernel(num_mixtures=2, num_features=64, ard_num_dims=dims, seed=0).to(dtype)
               for dtype in (torch.float32, torch.float64)]
    x = torch.rand(3, dims, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 0.01
    values = []
    for kernel in kernels:
        kernel.mixture_weights = torch.tensor([0.02, 0.03])
        value = kernel(x.to(kernel.raw_mixture_weights.dtype)).to_dense()
        value.sum().backward()
        assert all(bool(torch.isfinite(p.grad).all()) for p in kernel.parameters())
        values.append(value.double())
    torch.testing.assert_close(values[0], values[1], rtol=0.0, atol=1e-30)  # k ≈ 1e-65: 0 in float32


@pytest.mark.parametrize("diag", [False, True])
def test_a_spectral_mixture_amplitude_beyond_float32_is_refused_naming_the_weights(diag):
    # k(x, x) = (Σw)^d = 10^50 overflows float32: the covariance was inf and NaN without a word
    kernel = SketchedSpectralMixtureKernel(num_mixtures=2, num_features=64, ard_num_dims=50, seed=0).float()
    kernel.mixture_weights = torch.tensor([4.0, 6.0])
    x = torch.rand(3, 50, generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match=r"mixture_weights\)\^ard_num_dims = exp\(115.1\) exceeds torch.float32"):
        output = kernel(x, diag=diag)
        if not diag:
            output.to_dense()  # the lazily evaluated covariance


def test_resample_recentres_the_proposal_after_the_lengthscale_shrinks():
    _, kernel = periodic_pair()
    kernel(X).to_dense()
    kernel.lengthscale = kernel.lengthscale / 100
    with pytest.raises(ValueError, match="resample"):
        kernel(X).to_dense()
    kernel.resample(torch.Generator().manual_seed(0))
    assert torch.isfinite(kernel(X).to_dense()).all()


@pytest.mark.parametrize("name, make", [("period_length", lambda: SketchedPeriodicKernel(8)),
                                        ("alpha", lambda: SketchedRQKernel(8)),
                                        ("mixture_weights", lambda: SketchedSpectralMixtureKernel(2, 8))])
def test_non_positive_hyperparameters_raise_naming_them(name, make):
    with pytest.raises(ValueError, match=f"{name} must be finite and > 0"):
        setattr(make(), name, 0.0)
    with pytest.raises(ValueError, match=f"{name} must be finite and > 0"):
        setattr(make(), name, -1.0)


def test_unknown_method_raises():
    with pytest.raises(ValueError, match="method must be one of 'rff'"):
        SketchedRQKernel(8, method="sorf")


class _Harness(BaseKernelTestCase):
    """GPyTorch's kernel contract; a fixed seed makes every instance of a test share its draws."""

    def create_kernel_no_ard(self, **kwargs):
        return self.kernel_type(64, seed=17, **kwargs)

    def create_kernel_ard(self, num_dims, **kwargs):
        return self.kernel_type(64, seed=17, ard_num_dims=num_dims, **kwargs)

    def create_data_no_batch(self):
        return torch.randn(50, 10)

    def create_data_single_batch(self):
        return torch.randn(2, 30, 2)

    def create_data_double_batch(self):
        return torch.randn(3, 2, 50, 2)


class TestSketchedPeriodicKernelHarness(_Harness, unittest.TestCase):
    kernel_type = SketchedPeriodicKernel


class TestSketchedRQKernelHarness(_Harness, unittest.TestCase):
    kernel_type = SketchedRQKernel


@pytest.mark.parametrize("initializer", ["initialize_from_data", "initialize_from_data_empspect"])
def test_spectral_mixture_initializes_from_data_as_gpytorch(initializer):
    """GPyTorch's spectral mixture recipe calls ``covar_module.initialize_from_data(train_x, train_y)`` (or the
    empirical-spectrum variant) on the kernel it built: on a sketched kernel, before or after ``rfgp.sketch``, it sets
    the same hyperparameters from the same random state, and the sketch then has the same Gram as one converted from
    the initialized exact kernel."""
    import numpy as np

    import rfgp

    evenly = initializer.endswith("empspect")
    train_x = (torch.linspace(0, 4, 40, dtype=F64) if evenly else torch.rand(40, 2, generator=GEN, dtype=F64))
    train_x = train_x.unsqueeze(-1).expand(-1, 2) if evenly else train_x
    train_y = torch.sin(6 * train_x[:, 0]) + train_x[:, 1]
    options = {} if evenly else {"batch_shape": BATCH}
    exact = gpytorch.kernels.SpectralMixtureKernel(num_mixtures=3, ard_num_dims=2, **options).double()
    sketched = rfgp.sketch(exact, 64, seed=0)
    for kernel in (exact, sketched):
        torch.manual_seed(3)
        np.random.seed(3)
        getattr(kernel, initializer)(train_x, train_y)
    for name in ("mixture_weights", "mixture_means", "mixture_scales"):
        torch.testing.assert_close(getattr(sketched, name), getattr(exact, name), rtol=1e-12, atol=0)
    converted = rfgp.sketch(exact, 64, seed=0)
    torch.testing.assert_close(sketched(train_x).to_dense(), converted(train_x).to_dense(), rtol=1e-12, atol=1e-12)
