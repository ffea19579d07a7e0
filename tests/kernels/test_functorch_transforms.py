"""torch.func transforms over rfgp kernels: refused with a NotImplementedError that names the alternative.

Without the check, ``vmap`` over stacked hyperparameters failed inside the feature map with PyTorch's "an
autograd.Function ... must override the setup_context staticmethod", or with "data-dependent control flow"
from the input checks; ``functional_call`` alone (no transform) is no transform and runs.
"""

import copy

import gpytorch
import pytest
import torch
from gpytorch.kernels import PolynomialKernel, RBFKernel, ScaleKernel
from torch.func import functional_call, grad, stack_module_state, vmap

import rfgp


@pytest.mark.parametrize("make", [
    lambda: ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, seed=0, ard_num_dims=2)),
    lambda: rfgp.sketch(ScaleKernel(RBFKernel()) + PolynomialKernel(power=2), 16, seed=0),
], ids=["rff", "tree"])
def test_vmap_and_grad_over_stacked_hyperparameters_are_refused_naming_batch_shape(make):
    x = torch.rand(10, 2, dtype=torch.float64)
    kernels = [make().double() for _ in range(3)]
    for i, kernel in enumerate(kernels):
        kernel(x).to_dense()  # the draws are made at the first evaluation
        with torch.no_grad():
            for parameter in kernel.parameters():
                parameter.add_(0.3 * i)
    params, buffers = stack_module_state(kernels)
    base = copy.deepcopy(kernels[0])

    def gram(p, b):
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return functional_call(base, (p, b), (x,)).to_dense()

    first = gram({k: v[1] for k, v in params.items()}, {k: v[1] for k, v in buffers.items()})
    torch.testing.assert_close(first, kernels[1](x).to_dense().detach(), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="torch.func transforms.*batch_shape=torch.Size"):
        vmap(gram)(params, buffers)
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        vmap(grad(lambda p, b: gram(p, b).sum()))(params, buffers)
