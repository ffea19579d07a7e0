"""The training inputs as a model's ``covar_module`` receives them, which need not be ``model.train_inputs``.

A model's ``forward`` may transform its inputs before the kernel sees them: deep kernel learning (Wilson et al.
2016) passes x through a neural network g and ``gpytorch.utils.grid.ScaleToBounds``, so the kernel's inputs are
z = g(x), of another width and scale, changing with every training step; BoTorch models apply input transforms.
What rfgp fits to "the training inputs" — the data-scale check of :func:`rfgp.fit_mll`, optimized Maclaurin
allocations, Nyström landmarks re-chosen by :func:`rfgp.set_num_features` — must see z, not x (x of width 3 against
a kernel on the network's 2 outputs made ``fit_mll`` fail with a shape error; an x of the kernel's width would have
been used silently).

:func:`covar_module_inputs` runs ``model.forward`` on the training inputs and stops it where it calls its
``covar_module``, returning that call's first argument.  The forward runs without a gradient, and leaves no trace:
buffers it updates (``ScaleToBounds``' bounds, batch-norm statistics) are restored, and random numbers it draws
(dropout) come from a forked generator.
"""

from __future__ import annotations

import gpytorch
import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn


class _KernelCalled(Exception):
    """Raised by the kernel's temporary ``__call__`` to stop ``forward`` there, carrying the kernel's input."""

    def __init__(self, x: Tensor):
        super().__init__()
        self.x = x


def _stop_at_call(kernel: Kernel, x1: Tensor, *args, **kwargs):
    raise _KernelCalled(x1)


@torch.inference_mode(False)  # the buffers' saved copies are restored into the model: no inference tensors
def covar_module_inputs(model: nn.Module, inputs: Tensor) -> Tensor:
    """The first argument ``model.forward(inputs)`` passes to ``model.covar_module`` (detached); ``inputs`` itself
    for a model without a GPyTorch kernel as ``covar_module``, or whose ``forward`` does not call it.

    Args:
        model: a GPyTorch model (``ExactGP`` or any module with ``covar_module`` and ``forward``).
        inputs: its training inputs, e.g. ``model.train_inputs[0]``.
    """
    kernel = getattr(model, "covar_module", None)
    if not isinstance(kernel, Kernel) or not isinstance(model, gpytorch.Module):
        return inputs
    kernel_type = type(kernel)
    buffers = [(module, name, buffer, buffer.detach().clone()) for module in model.modules()
               for name, buffer in module._buffers.items() if buffer is not None]
    devices = [inputs.device.index or 0] if inputs.device.type == "cuda" else []
    kernel.__class__ = type(kernel_type.__name__, (kernel_type,), {"__call__": _stop_at_call})
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model.forward(inputs)
    except _KernelCalled as called:
        return inputs if called.x is inputs else called.x.detach()
    finally:
        kernel.__class__ = kernel_type
        for module, name, buffer, saved in buffers:
            buffer.data = saved
            module._buffers[name] = buffer
    return inputs
