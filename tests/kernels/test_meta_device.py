"""Shape inference on the ``meta`` device: every kernel and feature map moved there returns outputs of the shapes
it returns on the CPU.

A meta tensor has a shape and a dtype but no values; the value checks (finite inputs, unit rows, hyperparameters
inside their constraints, draw coverage of the periodic, rational-quadratic and spectral-mixture proposals) read
values with ``bool(...)`` and failed with PyTorch's "Tensor.item() cannot be called on meta tensors".
"""

import copy

import gpytorch
import pytest
import torch

import rfgp
from rfgp.core.validation import check_gaussian_moments, check_noise

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


def _exact_trees():
    """name -> an exact GPyTorch tree of a family rfgp.sketch converts, in float64."""
    with_prior = gpytorch.kernels.RBFKernel(lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 6.0))
    return {
        "scaled_rbf": gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
        "rbf_with_prior": with_prior,
        "matern": gpytorch.kernels.MaternKernel(nu=2.5),
        "polynomial": gpytorch.kernels.PolynomialKernel(power=2),
        "rbf_plus_matern": gpytorch.kernels.RBFKernel() + gpytorch.kernels.MaternKernel(nu=1.5),
    }


@pytest.mark.parametrize("name", list(_exact_trees()))
def test_sketch_of_an_exact_tree_on_meta_draws_on_meta_and_takes_a_cpu_state_after_to_empty(name):
    # memory estimation: the exact tree (small) moved to meta, its conversion drawn there without storage; before,
    # the value checks of the conversion (positive hyperparameters, the polynomial offset's lower bound, the prior
    # terms compared, the outputscale's √c) raised "Tensor.item() cannot be called on meta tensors"
    exact = _exact_trees()[name].double()
    cpu = rfgp.sketch(exact, 64, seed=0)
    meta = rfgp.sketch(copy.deepcopy(exact).to("meta"), 64, seed=0)
    assert {t.device.type for t in (*meta.parameters(), *meta.buffers())} == {"meta"}
    assert [(k, v.shape) for k, v in meta.state_dict().items()] == [(k, v.shape) for k, v in cpu.state_dict().items()]
    x = _inputs(3)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        assert meta(x.to("meta")).to_dense().shape == (7, 7)
        meta.to_empty(device="cpu")
        meta.load_state_dict(cpu.state_dict())
        assert torch.equal(meta(x).to_dense(), cpu(x).to_dense())


def test_feature_map_built_under_the_meta_device_takes_a_cpu_state_after_to_empty():
    with torch.device("meta"):
        meta = rfgp.features.RandomFourierFeatures(4096, input_dim=3, seed=0).double()
        assert meta(torch.zeros(5, 3, dtype=torch.float64)).shape == (5, 4096)
    assert {t.device.type for t in meta.buffers()} == {"meta"}
    cpu = rfgp.features.RandomFourierFeatures(4096, input_dim=3, seed=0).double()
    meta.to_empty(device="cpu")
    meta.load_state_dict(cpu.state_dict())
    x = _inputs(3)
    assert torch.equal(meta(x), cpu(x))


@pytest.mark.parametrize("exact", [gpytorch.kernels.PeriodicKernel(), gpytorch.kernels.RQKernel()],
                         ids=["periodic", "rq"])
def test_draws_centred_on_hyperparameter_values_are_refused_on_meta_by_name(exact):
    # the proposal reads the hyperparameters' values (and its number of harmonics follows them): PyTorch's
    # "Cannot copy out of meta tensor; no data!" before
    meta = rfgp.sketch(exact.double().to("meta"), 64, seed=0)
    with pytest.raises(ValueError, match=r"cannot draw on the meta device: its proposal is centred on the "):
        meta(_inputs(3).to("meta")).to_dense()


def test_value_checks_of_moments_and_noise_pass_meta_tensors():
    # "Tensor.item() cannot be called on meta tensors" before: the variance sign and the noise were read
    meta = torch.ones(4, dtype=torch.float64, device="meta")
    check_gaussian_moments(mean=meta, variance=meta)
    assert check_noise(meta) is meta
    with pytest.raises(ValueError, match="variance must be ≥ 0"):
        check_gaussian_moments(mean=torch.zeros(2), variance=torch.tensor([1.0, -1.0]))
