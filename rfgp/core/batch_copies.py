"""Inputs whose batch members are copies of one another: evaluate once, expand the result.

GPyTorch evaluates a kernel on copies of one input in a leading batch.  ``likelihood(model(x))`` of a likelihood
without an analytic marginal (Beta, Poisson, Student-t, softmax, ...) draws ``num_likelihood_samples`` S samples
inside a ``pyro.plate``, which expands the predictive ``MultivariateNormal`` to a batch of S; its lazily evaluated
covariance K(x, x) of an rfgp kernel expands x by ``Tensor.expand`` (:mod:`rfgp.kernels.batch_expansion`), so the
kernel receives S stride-0 copies of x (``(S, 1, n, d)``).  A feature kernel then computes Φ(x) — and, where the
covariance is evaluated densely, the n × n Gram ΦΦᵀ — once on one copy and returns it expanded (stride 0), with the
same values.

A batch dimension holds copies when it has stride 0 (an ``expand``ed view): seen from the tensor's metadata, no
data read, no host synchronisation.  Not taken for a leaf tensor that requires grad, whose own ``.grad`` would
otherwise gather the copies' gradients in the first member.  Real copies (``Tensor.repeat``) are not looked for:
telling them from distinct members needs their values on the host; the kernel computes each member, with the same
values, at S times the cost.

Only dimensions where the kernel's own batch has size 1 are candidates: elsewhere the features differ per member
anyway (one lengthscale per member) and nothing is saved.
"""

from __future__ import annotations

import math

import torch
from linear_operator.operators import LinearOperator
from torch import Tensor


def copied_batch_dims(x: Tensor, kernel_batch_shape: torch.Size) -> tuple[int, ...]:
    """The stride-0 batch dimensions of ``x`` ``(..., n, d)`` (negative indices) of size > 1 where
    ``kernel_batch_shape`` (aligned to the right with x's batch) has size 1; none for a leaf that requires grad
    (module docstring)."""
    return tuple(dim for dim in (dim - x.dim() for dim in broadcast_dims(x, x.dim() - 2))
                 if _kernel_size(kernel_batch_shape, dim) == 1)


def narrow_copies(x: Tensor, dims: tuple[int, ...]) -> Tensor:
    """``x`` with each of ``dims`` narrowed to its first member (a view)."""
    for dim in dims:
        x = x.narrow(dim, 0, 1)
    return x


def broadcast_dims(x: Tensor, num_batch_dims: int) -> tuple[int, ...]:
    """The stride-0 dimensions of size > 1 among the first ``num_batch_dims`` of ``x``: copies made by ``expand``;
    none for a leaf that requires grad, whose ``.grad`` holds one gradient per member (a stride-0 leaf,
    ``phi.expand(b, n, F).requires_grad_()``: computed once from its first member, every member's gradient would
    land in the first)."""
    if x.requires_grad and x.is_leaf:
        return ()
    return tuple(dim for dim in range(num_batch_dims) if x.shape[dim] > 1 and x.stride(dim) == 0)


def distinct_members(x: Tensor, num_batch_dims: int) -> int:
    """How many distinct members the first ``num_batch_dims`` dimensions of ``x`` hold: their batch size less the
    stride-0 copies (the batch size of :func:`narrow_broadcast`'s view, from the metadata alone)."""
    copies = broadcast_dims(x, num_batch_dims)
    return math.prod(size for dim, size in enumerate(x.shape[:num_batch_dims]) if dim not in copies)


def narrow_broadcast(x: Tensor, num_batch_dims: int) -> Tensor:
    """``x`` with every stride-0 dimension among its first ``num_batch_dims`` narrowed to size 1 (a view of the
    same memory): the distinct members of an expanded tensor, which broadcast back to ``x``'s shape.

    Differentiable: for a non-leaf ``x`` the backward returns the gradient spread evenly over the copies as a
    stride-0 tensor, which the ``expand`` that made them sums back to the gradient itself, where narrowing's backward
    writes a zero-filled gradient of x's whole shape (b·N·F writes for b copies of an N × F matrix) first.  A leaf
    that requires grad is returned whole (:func:`broadcast_dims`): its own ``.grad`` holds each copy's gradient."""
    copies = broadcast_dims(x, num_batch_dims)
    if not copies or not x.requires_grad:
        return narrow_copies(x, copies)
    return _DistinctMembers.apply(x, copies)


class _DistinctMembers(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, copies: tuple[int, ...]) -> Tensor:
        ctx.shape, ctx.copies = x.shape, copies
        return narrow_copies(x, copies)

    @staticmethod
    def backward(ctx, grad: Tensor):
        count = math.prod(ctx.shape[dim] for dim in ctx.copies)
        return (grad / count).expand(ctx.shape), None


def expand_batch(output: Tensor | LinearOperator, input_batch_shape: torch.Size) -> Tensor | LinearOperator:
    """A kernel's output on inputs without their copies — a diagonal ``(..., n)`` or a covariance operator
    ``(..., n, m)`` — expanded to its batch shape broadcast with the inputs' as given, without copying (stride-0
    tensors; an rfgp operator keeps its class)."""
    if isinstance(output, Tensor):
        return output.expand(*torch.broadcast_shapes(output.shape[:-1], input_batch_shape), output.shape[-1])
    batch_shape = torch.broadcast_shapes(output.batch_shape, input_batch_shape)
    if output.batch_shape == batch_shape:
        return output
    return output.expand(*batch_shape, *output.matrix_shape)


def _kernel_size(kernel_batch_shape: torch.Size, dim: int) -> int:
    """The kernel batch's size at input dimension ``dim`` (negative; the last two are n and d), 1 where it has none."""
    index = len(kernel_batch_shape) + dim + 2
    return kernel_batch_shape[index] if index >= 0 else 1

