"""Batch expansion of a lazily evaluated rfgp covariance: stride-0 copies of its inputs, not real ones.

``likelihood(model(x))`` of a likelihood without an analytic marginal (Beta, Poisson, Student-t, softmax, ...)
draws ``num_likelihood_samples`` S samples inside a ``pyro.plate``, which expands the predictive
``MultivariateNormal`` to a batch of S.  Its lazily evaluated covariance K(x, x) (a ``LazyEvaluatedKernelTensor``,
alone or inside the sum of a variational posterior) expands through linear_operator's generic ``_expand_batch``,
i.e. ``LazyEvaluatedKernelTensor.repeat`` and ``torch.Tensor.repeat``: the kernel received S real copies of x,
which nothing but a comparison of their values (a host synchronisation) tells apart from distinct inputs.

For a kernel tree that holds an rfgp feature kernel, :func:`install` expands x₁ and x₂ instead
(``Tensor.expand``: the operator batch B → B' repeats a dimension only where B has size 1, where x₁ and x₂ have
size 1 too), the same lazily evaluated tensor — same class, kernel, parameters and recorded grad state — with the
same values.  The copies then reach the kernel as stride-0 views, which :mod:`rfgp.core.batch_copies` recognises
from the tensor's metadata, and a feature kernel computes Φ(x) and its Gram once.  Other kernels keep
linear_operator's method.

A batch of copies made by the caller with ``Tensor.repeat`` (or ``LazyEvaluatedKernelTensor.repeat``) holds real
copies: the kernel computes every member, with the right values, without this saving; ``expand`` the input to
have it.
"""

from __future__ import annotations

import torch
from gpytorch.lazy import LazyEvaluatedKernelTensor
from gpytorch.lazy.lazy_evaluated_kernel_tensor import recall_grad_state
from torch import Tensor

from .combinations import holds_feature_kernel


def install() -> None:
    """Route ``LazyEvaluatedKernelTensor._expand_batch`` of kernel trees holding an rfgp feature kernel to
    :func:`expand_inputs` (idempotent; other kernels keep linear_operator's method)."""
    current = LazyEvaluatedKernelTensor._expand_batch
    if getattr(current, "generic_expand_batch", None) is not None:
        return

    @recall_grad_state
    def _expand_batch(self, batch_shape):
        if self.last_dim_is_batch or not holds_feature_kernel(self.kernel):
            return current(self, batch_shape)
        return expand_inputs(self, torch.Size(batch_shape))

    _expand_batch.generic_expand_batch = current
    LazyEvaluatedKernelTensor._expand_batch = _expand_batch


def expand_inputs(covariance: LazyEvaluatedKernelTensor, batch_shape: torch.Size) -> LazyEvaluatedKernelTensor:
    """``covariance`` over ``batch_shape`` with x₁ and x₂ expanded (stride 0; one tensor stays one tensor)."""
    x1 = _expand_input(covariance.x1, covariance.batch_shape, batch_shape)
    x2 = x1 if covariance.x2 is covariance.x1 else _expand_input(covariance.x2, covariance.batch_shape, batch_shape)
    return covariance.__class__(x1, x2, kernel=covariance.kernel, last_dim_is_batch=covariance.last_dim_is_batch,
                                **covariance.params)


def _expand_input(x: Tensor, operator_batch: torch.Size, batch_shape: torch.Size) -> Tensor:
    """x ``(..., n, d)`` with each batch dimension where ``operator_batch`` (aligned to the right) differs from
    ``batch_shape`` expanded to the new size: the dimensions ``repeat`` would have multiplied."""
    leading = len(batch_shape)
    padded_x = (1,) * (leading - (x.dim() - 2)) + tuple(x.shape[:-2])
    padded_operator = (1,) * (leading - len(operator_batch)) + tuple(operator_batch)
    sizes = [size if now == new else new for size, now, new in zip(padded_x, padded_operator, batch_shape)]
    return x.expand(*sizes, *x.shape[-2:])
