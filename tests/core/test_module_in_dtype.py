"""rfgp.core.module_in_dtype: a module evaluated in another dtype without converting it."""

import threading

import pytest
import torch
from gpytorch.kernels import PolynomialKernel, RBFKernel, ScaleKernel
from gpytorch.priors import GammaPrior

from rfgp.core.module_in_dtype import module_in_dtype


def _kernel():
    kernel = ScaleKernel(PolynomialKernel(power=2, offset_prior=GammaPrior(2.0, 1.0)))
    kernel.outputscale = 1.7
    kernel.base_kernel.offset = 0.3
    return kernel


def test_view_evaluates_as_the_converted_module_and_leaves_the_original_unchanged():
    kernel = _kernel()
    before = {name: tensor.clone() for name, tensor in kernel.state_dict().items()}
    versions = [parameter._version for parameter in kernel.parameters()]
    x = torch.randn(7, 3, dtype=torch.float64)
    with pytest.raises(RuntimeError, match="same dtype"):  # what the view is for: addmm does not promote
        kernel(x, x).to_dense()
    view = module_in_dtype(kernel, torch.float64)
    converted = _kernel().double()
    torch.testing.assert_close(view(x, x).to_dense(), converted(x, x).to_dense(), rtol=1e-12, atol=0)
    assert all(torch.equal(before[name], tensor) for name, tensor in kernel.state_dict().items())
    assert all(tensor.dtype == torch.float32 for tensor in kernel.state_dict().values() if tensor.is_floating_point())
    assert versions == [parameter._version for parameter in kernel.parameters()]


def test_gradient_through_the_view_reaches_the_original_parameters():
    kernel = _kernel()
    x = torch.randn(5, 2, dtype=torch.float64)
    module_in_dtype(kernel, torch.float64)(x, x).to_dense().sum().backward()
    reference = _kernel().double()
    reference(x, x).to_dense().sum().backward()
    for (name, parameter), expected in zip(kernel.named_parameters(), reference.parameters()):
        assert parameter.grad is not None and parameter.grad.dtype == torch.float32, name
        torch.testing.assert_close(parameter.grad.double(), expected.grad, rtol=1e-6, atol=1e-7)


def test_module_already_in_the_dtype_is_returned_itself_and_shared_submodules_stay_shared():
    kernel = _kernel()
    assert module_in_dtype(kernel, torch.float32) is kernel
    shared = RBFKernel()
    tree = shared + shared * RBFKernel()
    view = module_in_dtype(tree, torch.float64)
    assert view.kernels[0] is view.kernels[1].kernels[0] and view.kernels[0] is not shared
    assert view.kernels[0].raw_lengthscale.dtype == torch.float64


def test_non_floating_dtype_is_refused_by_name():
    with pytest.raises(ValueError, match="dtype must be a floating dtype, got torch.int64"):
        module_in_dtype(_kernel(), torch.int64)


def test_views_from_several_threads_see_the_original_values():
    """The reason for a view rather than swapping the module's parameters during the call: another thread evaluating
    the original at the same time sees its own parameters throughout."""
    kernel = _kernel()
    x32 = torch.randn(50, 3)
    expected = kernel(x32, x32).to_dense()
    failures = []

    def evaluate_original():
        for _ in range(200):
            if not torch.equal(kernel(x32, x32).to_dense(), expected):
                failures.append("original")

    def evaluate_view():
        for _ in range(200):
            module_in_dtype(kernel, torch.float64)(x32.double(), x32.double()).to_dense()

    threads = [threading.Thread(target=evaluate_original), threading.Thread(target=evaluate_view)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures
