"""rfgp's hyperparameter setters take a Python number in the kernel's own dtype (GPyTorch's setters make it a
float32 tensor first, so that 0.1 set on a float64 kernel became 0.1 + 1.5e-9)."""

import pytest
import torch
from gpytorch.kernels import RBFKernel

from rfgp.kernels import (
    CurlFreeRBFKernel,
    DivFreeRBFKernel,
    NystromKernel,
    SketchedHammingIMQKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
    SketchedRQKernel,
)


@pytest.mark.parametrize("build, name", [
    (lambda: SketchedRQKernel(16, seed=0), "alpha"),
    (lambda: SketchedRQKernel(16, seed=0), "lengthscale"),
    (lambda: SketchedRBFKernel(16, seed=0), "lengthscale"),
    (lambda: SketchedHammingIMQKernel(3, 16, seed=0), "beta"),
    (lambda: SketchedPolynomialKernel(2, 16, seed=0), "offset"),
    (lambda: CurlFreeRBFKernel(input_dim=2), "lengthscale"),
    (lambda: DivFreeRBFKernel(input_dim=2), "lengthscale"),
    (lambda: NystromKernel(RBFKernel(), torch.rand(5, 2)), "lengthscale"),
])
def test_a_python_float_is_set_in_the_kernel_dtype(build, name):
    kernel = build().double()
    setattr(kernel, name, 0.1)
    value = getattr(kernel, name)
    assert value.dtype == torch.float64
    torch.testing.assert_close(value, torch.full_like(value, 0.1), rtol=1e-15, atol=0)
