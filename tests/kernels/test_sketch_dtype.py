"""rfgp.sketch returns a kernel in the source kernel's dtype and device."""

import gpytorch
import torch

import rfgp


def test_sketch_follows_source_dtype_and_device(device, dtype):
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)).to(device, dtype)
    exact.base_kernel.lengthscale = torch.tensor([[0.6, 0.9]], dtype=dtype, device=device)
    sketched = rfgp.sketch(exact, num_features=64, method="orf", seed=0)
    for parameter in sketched.parameters():
        assert parameter.dtype == dtype and parameter.device.type == device.type
    assert torch.equal(sketched.base_kernel.lengthscale, exact.base_kernel.lengthscale)
    x = torch.randn(5, 2, dtype=dtype, device=device)
    assert sketched(x).to_dense().dtype == dtype
