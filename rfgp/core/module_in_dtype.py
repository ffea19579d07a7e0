"""A module evaluated in another floating dtype without converting it: a differentiable cast view.

Some GPyTorch kernels do not promote their parameters to their inputs' dtype: ``PolynomialKernel`` calls
``torch.addmm(offset, x1, x2ᵀ)``, which refuses a float32 offset with float64 inputs ("self and mat2 must have the
same dtype").  rfgp evaluates exact kernels of float32 models in float64 where float32 loses too much (the Nyström
factor K(Z, Z), :mod:`rfgp.kernels.nystrom`), so it needs the kernel *as if* converted by ``.double()``, with the
gradient still reaching the float32 parameters and the module itself untouched.

:func:`module_in_dtype` builds that view: a shallow copy of every module of the tree whose floating parameters and
buffers are ``tensor.to(dtype)`` of the originals (differentiable casts, no copy where the dtype already agrees) and
whose other attributes are shared.  Nothing is written to the original modules, so a model served from several
threads is safe, unlike swapping its parameters for the call (``torch.func.functional_call``), and the original's
``state_dict`` and parameter versions never change.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn


def module_in_dtype(module: nn.Module, dtype: torch.dtype) -> nn.Module:
    """``module`` as ``module.to(dtype)`` would make it, without changing ``module``: ``module`` itself where every
    floating parameter and buffer of its tree already has ``dtype``, else a view whose floating tensors are
    differentiable casts of the originals (a gradient through the view reaches the original parameters).

    Shared submodules stay shared in the view.  The view is for evaluation: assigning to it or to its tensors does not
    reach the original.
    """
    if not dtype.is_floating_point:
        raise ValueError(f"module_in_dtype: dtype must be a floating dtype, got {dtype}")
    if all(tensor.dtype == dtype for tensor in _floating_tensors(module)):
        return module
    views: dict[int, nn.Module] = {}

    def view(original: nn.Module) -> nn.Module:
        if id(original) in views:
            return views[id(original)]
        # a new object sharing the original's attributes, its dicts of tensors and modules replaced below; not
        # copy.copy: GPyTorch's Kernel.__getstate__ sets the original's distance_module to None and hands over its
        # very __dict__, which the copy then shares
        result = type(original).__new__(type(original))
        result.__dict__.update(vars(original))
        views[id(original)] = result
        result.__dict__["_parameters"] = {name: _cast(tensor, dtype) for name, tensor in original._parameters.items()}
        result.__dict__["_buffers"] = {name: _cast(tensor, dtype) for name, tensor in original._buffers.items()}
        result.__dict__["_modules"] = {name: None if child is None else view(child)
                                       for name, child in original._modules.items()}
        return result

    return view(module)


def _floating_tensors(module: nn.Module):
    yield from (tensor for tensor in module.parameters() if tensor.is_floating_point())
    yield from (tensor for tensor in module.buffers() if tensor.is_floating_point())


def _cast(tensor: Tensor | None, dtype: torch.dtype) -> Tensor | None:
    if tensor is None or not tensor.is_floating_point():
        return tensor
    return tensor.to(dtype)
