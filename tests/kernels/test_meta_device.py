"""Shape inference on the ``meta`` device: every kernel and feature map moved there returns outputs of the shapes
it returns on the CPU.

A meta tensor has a shape and a dtype but no values; the value checks (finite inputs, unit rows, hyperparameters
inside their constraints, draw coverage of the periodic, rational-quadratic and spectral-mixture proposals) read
values with ``bool(...)`` and failed with PyTorch's "Tensor.item() cannot be called on meta tensors".
"""

import copy

import gpytorch
import pytest

from ..core.test_state_dict import FEATURE_MAPS, KERNELS, _inputs

# GPyTorch's own RBFKernel (the Nyström base kernel, the exact decomposable kernel's factor) calls torch.equal,
# which has no meta implementation: a limitation of GPyTorch's kernel, outside rfgp
GPYTORCH_LIMITED = {"nystrom", "exact_decomposable"}


@pytest.mark.parametrize("name", [name for name in KERNELS if name not in GPYTORCH_LIMITED])
def test_kernels_on_the_meta_device_return_the_cpu_shapes(name):
    build, d, sphere = KERNELS[name]
    kernel = build(0).double()
    x = _inputs(d, sphere)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        expected = [kernel(x).to_dense(), kernel(x, x[:3]).to_dense(), kernel(x, diag=True)]
        meta, z = copy.deepcopy(kernel).to("meta"), x.to("meta")
        results = [meta(z).to_dense(), meta(z, z[:3]).to_dense(), meta(z, diag=True)]
    for result, cpu in zip(results, expected):
        assert result.device.type == "meta"
        assert (result.shape, result.dtype) == (cpu.shape, cpu.dtype)


@pytest.mark.parametrize("name", list(FEATURE_MAPS))
def test_feature_maps_on_the_meta_device_return_the_cpu_shapes(name):
    build, d, sphere = FEATURE_MAPS[name]
    feature_map = build(0, d).double()
    x = _inputs(d, sphere)
    expected = feature_map(x)
    result = copy.deepcopy(feature_map).to("meta")(x.to("meta"))
    assert result.device.type == "meta"
    assert (result.shape, result.dtype) == (expected.shape, expected.dtype)
