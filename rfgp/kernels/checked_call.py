"""Input checks at a kernel's entry point, before GPyTorch's own shape handling."""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.validation import check_kernel_inputs, module_dtype


class CheckedCallMixin:
    """``kernel(x1, x2)`` checks dtypes (supported) and trailing dimensions first.

    GPyTorch's ``Kernel.__call__`` would otherwise answer a dimension mismatch with its own
    ``RuntimeError``.  Inputs of different float dtypes (x1, x2, the kernel's) are promoted by
    ``forward``, as in GPyTorch (:mod:`rfgp.core.dtypes`), after ``active_dims`` are applied.
    """

    def __call__(self, x1: Tensor, x2: Tensor | None = None, diag: bool = False, last_dim_is_batch: bool = False,
                 **params):
        self.check_call_inputs(x1, x1 if x2 is None else x2)
        return super().__call__(x1, x2, diag=diag, last_dim_is_batch=last_dim_is_batch, **params)

    def check_call_inputs(self, x1: Tensor, x2: Tensor) -> torch.dtype | None:
        """The free checks of a call (no host synchronisation); returns the dtype the call computes in (``None``
        for kernels whose inputs are not points, e.g. task indices)."""
        return check_kernel_inputs(x1, x2, module_dtype(self))


def refuse_last_dim_is_batch(kernel) -> None:
    """The NotImplementedError for ``last_dim_is_batch=True``, naming the GPyTorch wrappers that ask for it.

    With it GPyTorch evaluates k(xᵢ, yᵢ) on each input column i separately (inputs ``(..., d, n, 1)``):
    ``AdditiveStructureKernel`` sums, ``ProductStructureKernel`` multiplies those, and ``GridKernel`` (inside
    ``GridInterpolationKernel``) builds its per-dimension grid factors from them.  rfgp kernels are defined on
    their whole input (random features drawn for all its columns; vector-field kernels couple the columns), so
    they have no per-column evaluation, and answering with another covariance would be a silent change of model.
    """
    raise NotImplementedError(
        f"{type(kernel).__name__} does not support last_dim_is_batch=True, which GPyTorch's AdditiveStructureKernel, "
        "ProductStructureKernel, NewtonGirardAdditiveKernel and GridInterpolationKernel ask of their base kernel (to "
        "evaluate it on each input column separately); rfgp kernels are defined on their whole input. Put the exact "
        "base kernel in AdditiveStructureKernel/ProductStructureKernel and rfgp.sketch the structure kernel "
        "(per-column features, hyperparameters tied), or use AdditiveKernel(*(kernel with active_dims=[i] for each "
        "column i)); for KISS-GP keep the exact base kernel (random features replace SKI, they do not go inside it)"
    )
