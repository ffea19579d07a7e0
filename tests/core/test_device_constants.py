"""Constants of a forward pass are made on the input's device once, not copied from the host at every call."""

import pytest
import torch
from gpytorch.kernels import PolynomialKernel

import rfgp
from rfgp.core.dtypes import device_constant
from rfgp.features import OptimizedMaclaurin, RandomMaclaurin
from rfgp.features.dot_product import gaussian
from rfgp.kernels import SketchedCurlFreeKernel, SketchedDivFreeKernel


class Owner:
    pass


def test_device_constant_is_converted_once_per_dtype_and_device():
    owner, built = Owner(), []

    def build():
        built.append(1)
        return torch.tensor([1.0, 2.0], dtype=torch.float64)

    first = device_constant(owner, "k", build, torch.zeros(1))
    assert first.dtype == torch.float32 and torch.equal(first, torch.tensor([1.0, 2.0]))
    assert device_constant(owner, "k", build, torch.zeros(3)) is first and len(built) == 1
    assert device_constant(owner, "k", build, torch.zeros(1, dtype=torch.float64)).dtype == torch.float64
    assert len(built) == 2


def test_constant_first_made_under_inference_mode_serves_autograd_later():
    feature_map = OptimizedMaclaurin(gaussian(), 64, input_dim=2, seed=0)
    x = torch.randn(5, 2, dtype=torch.float64) * 0.3
    with torch.inference_mode():
        feature_map(x)
    x.requires_grad_(True)
    feature_map(x).sum().backward()  # an inference tensor saved for backward would raise here
    assert torch.isfinite(x.grad).all()


def _feature_calls():
    x = torch.randn(40, 3, dtype=torch.float64, device="cuda") * 0.3
    polynomial = rfgp.sketch(PolynomialKernel(power=3), 64, method="maclaurin", seed=0).double().cuda()
    return {
        "optimized Maclaurin": (OptimizedMaclaurin(gaussian(), 64, input_dim=3, seed=0).double().cuda(), x),
        "random Maclaurin": (RandomMaclaurin(gaussian(), 64, input_dim=3, seed=0).double().cuda(), x),
        "polynomial, learnable offset": (polynomial.featurize, x),
        "curl-free": (SketchedCurlFreeKernel(32, input_dim=3, seed=0).double().cuda().featurize, x),
        "divergence-free": (SketchedDivFreeKernel(32, input_dim=3, seed=0).double().cuda().featurize, x),
    }


@pytest.mark.skipif(not torch.cuda.is_available(), reason="host synchronisations exist on CUDA only")
@pytest.mark.parametrize("name", ["optimized Maclaurin", "random Maclaurin", "polynomial, learnable offset",
                                  "curl-free", "divergence-free"])
def test_feature_forward_does_not_synchronise_with_the_host(name):
    call, x = _feature_calls()[name]
    call(x)  # draws and cached constants made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        # The finiteness checks of the input are deliberate synchronisations (a NaN raises); no other one is.
        with torch.no_grad(), rfgp.settings.validate_inputs(False):
            call(x)
    finally:
        torch.cuda.set_sync_debug_mode("default")
