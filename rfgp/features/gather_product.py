"""Products of gathered columns, Π_i values[..., index_i], without materialising every gather.

TensorSRHT (paper 000 Algorithm 1) ends with Φ(x)_l = Π_i (H Dᵢ x)[πᵢ(l)]: n gathers of
width D from small (≤ n·blocks·d wide) transforms, multiplied together.  Done with plain
ops, autograd keeps all n gathered (N × D) tensors alive and every product allocates a
fresh one; on CPU these large fresh allocations (page faults on first touch) cost more
than the gathers themselves.  :func:`gather_product` writes the first gather into the
output, multiplies the others in place through a reused row-block buffer, and saves only the small
``values`` for the backward pass, which recomputes the gathers.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.dtypes import refuse_autocast_backward


def gather_product(values: Tensor, index: Tensor) -> Tensor:
    """out[..., l] = Π_{i<k} values[..., index[i, ..., l]] for ``values`` ``(..., M)`` and ``index`` ``(k, *draws, D)``.

    A 1-D ``index[i]`` is shared by every leading position; a batched one ``(*draws, D)``
    (one per independent draw) broadcasts against ``values.shape[:-2]`` (the row axis −2 is
    shared).  Differentiable to any order in ``values`` (real or complex).
    """
    return suffix_gather_product(values, list(index.unbind(0)), (0,) * index.shape[0])


def suffix_gather_product(values: Tensor, indices: list[Tensor], starts: tuple[int, ...]) -> Tensor:
    """out[..., l] = Π_{i: starts[i] ≤ l} values[..., indices[i][..., l − starts[i]]]: factor i multiplies the
    columns from ``starts[i]`` on (``starts[0] = 0``, non-decreasing; ``indices[i]`` has D − starts[i] entries).

    Products of different lengths in one call: the degree-n TensorSRHT blocks of a Maclaurin map, ordered by degree,
    are the columns that the first n factors reach (one op per factor for all degrees, instead of one per factor and
    degree).  Each column's factors are multiplied in the order i = 0, 1, …, as :func:`gather_product` does.
    Indices as in :func:`gather_product`; differentiable to any order in ``values`` (real or complex).
    """
    if len(indices) != len(starts) or starts[0] != 0:
        raise ValueError(f"starts must begin with 0 and name one start per index, got starts={starts} for "
                         f"{len(indices)} indices")
    # TorchScript cannot export a Python autograd.Function, and TorchDynamo's fake tensors failed in its backward on
    # complex values (a CtR Maclaurin training step under torch.compile: "Tensor must have a last dimension of size
    # 2"): the same products, plainly, which both record
    if torch.jit.is_tracing() or torch.compiler.is_compiling():
        out = _gather(values, indices[0])
        for start, index in zip(starts[1:], indices[1:]):
            out = _multiply_from(out, start, _gather(values, index))
        return out
    return _GatherProduct.apply(values, tuple(starts), *indices)


def _multiply_from(target: Tensor, start: int, factor: Tensor) -> Tensor:
    """target with its columns from ``start`` on multiplied by ``factor``, out of place (differentiable)."""
    if start == 0:
        return target * factor
    return torch.cat((target[..., :start], target[..., start:] * factor), dim=-1)


def _gather(values: Tensor, index: Tensor, out: Tensor | None = None) -> Tensor:
    if index.dim() == 1:
        return torch.index_select(values, -1, index, out=out) if out is not None else values.index_select(-1, index)
    expanded = index.unsqueeze(-2).expand(*values.shape[:-1], index.shape[-1])
    return torch.gather(values, -1, expanded, out=out) if out is not None else values.gather(-1, expanded)


def _scatter_add(target: Tensor, index: Tensor, source: Tensor) -> Tensor:
    """The adjoint of :func:`_gather`: target + (source added at the gathered positions), out of place."""
    if index.dim() == 1:
        return target.index_add(-1, index, source)
    return target.scatter_add(-1, index.unsqueeze(-2).expand_as(source), source)


# Size of the reused buffer of the in-place products on CPU: below glibc's 32 MiB mmap limit, so
# the allocator recycles it instead of page-faulting a fresh (N × D) tensor in (measured ~25% of
# TensorSRHT's time at N = 1000, D = 10240), yet large enough for few blocks: each op is an
# OpenMP parallel region, and on an oversubscribed host every region waits for both threads.
_BLOCK_BYTES = 8 << 20


def _multiply_gathers_in_row_blocks(out: Tensor, values: Tensor, factors) -> None:
    """out[..., s:] ⊙= values[..., index] for each (s, index) of ``factors`` (shared 1-D indices), a block of rows
    at a time."""
    rows, width = out.reshape(-1, out.shape[-1]), out.shape[-1]
    values = values.reshape(-1, values.shape[-1])
    step = max(1, _BLOCK_BYTES // (width * out.element_size()))
    buffer = torch.empty(min(step, rows.shape[0]) * width, dtype=out.dtype, device=out.device)
    for start in range(0, rows.shape[0], step):  # blocks of memory, not a loop over data points
        block, source = rows[start : start + step], values[start : start + step]
        for first, index in factors:
            gathered = buffer[: block.shape[0] * index.shape[0]].view(block.shape[0], index.shape[0])
            block[:, first:].mul_(torch.index_select(source, -1, index, out=gathered))


class _GatherProduct(torch.autograd.Function):
    """The products of :func:`suffix_gather_product`: in place through reused buffers forward, the leave-one-out
    gradient (:func:`_leave_one_out_gradient`, itself differentiable) backward, and the product rule
    (:func:`_product_tangent`) in forward mode; ``setup_context`` and the generated vmap rule let forward-over-reverse
    Hessians (``torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")``) through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(values: Tensor, starts: tuple[int, ...], *indices: Tensor) -> Tensor:
        out = _gather(values, indices[0])
        factors = list(zip(starts[1:], indices[1:]))
        if factors and all(index.dim() == 1 for index in indices) and not out.is_cuda:
            _multiply_gathers_in_row_blocks(out, values, factors)
        elif factors:  # CUDA's caching allocator, or one index per draw: one full-size buffer
            buffer = torch.empty(out.numel(), dtype=out.dtype, device=out.device)
            for start, index in factors:
                target = out[..., start:]
                target.mul_(_gather(values, index, out=buffer[: target.numel()].view(target.shape)))
        return out

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        values, starts, *indices = inputs
        ctx.starts = starts
        ctx.save_for_backward(values, *indices)
        ctx.save_for_forward(values, *indices)

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad: Tensor):
        values, *indices = ctx.saved_tensors
        none = (None,) * (len(indices) + 1)
        rows, width = values.reshape(-1, values.shape[-1]), grad.shape[-1]
        step = max(1, _BLOCK_BYTES // (width * grad.element_size()))
        if all(index.dim() == 1 for index in indices) and not values.is_cuda and rows.shape[0] > step:
            # shared indices: rows are independent; blocks of rows keep the O(k) temporaries below glibc's mmap
            # limit (a (N × D) temporary per factor page-faulted in fresh at every call otherwise)
            grads = grad.reshape(-1, width)
            blocks = [_leave_one_out_gradient(rows[a : a + step], grads[a : a + step], indices, ctx.starts)
                      for a in range(0, rows.shape[0], step)]
            return torch.cat(blocks).view(values.shape), *none
        return _leave_one_out_gradient(values, grad, indices, ctx.starts), *none

    @staticmethod
    def jvp(ctx, tangent: Tensor, _starts_tangent: None, *_index_tangents: None) -> Tensor:
        values, *indices = ctx.saved_tensors
        return _product_tangent(values, tangent, indices, ctx.starts)


def _product_tangent(values: Tensor, tangent: Tensor, indices: list[Tensor], starts: tuple[int, ...]) -> Tensor:
    """The forward-mode derivative of :func:`suffix_gather_product` along ``tangent`` (shaped as ``values``).

    The product rule, factor by factor: with P the product of the factors so far and Ṗ its derivative, a factor
    g (gathered from ``values``) and ġ (the same gather of ``tangent``) turn them into P·g and Ṗ·g + P·ġ on its
    columns starts[i]:; complex values are holomorphic products, so no conjugate enters.
    """
    out, derivative = _gather(values, indices[0]), _gather(tangent, indices[0])
    for start, index in zip(starts[1:], indices[1:]):
        factor, factor_tangent = _gather(values, index), _gather(tangent, index)
        if start == 0:  # no slice: a [..., 0:] alias has no batching rule for vmapped tangents
            derivative = derivative * factor + out * factor_tangent
        else:
            changed = derivative[..., start:] * factor + out[..., start:] * factor_tangent
            derivative = torch.cat((derivative[..., :start], changed), dim=-1)
        out = _multiply_from(out, start, factor)
    return derivative


def _leave_one_out_gradient(values: Tensor, grad: Tensor, indices: list[Tensor], starts: tuple[int, ...]) -> Tensor:
    """The gradient of :func:`suffix_gather_product` w.r.t. ``values`` for the upstream ``grad``.

    ∂out/∂values at indices[i] is Π_{j≠i} gathered_j (conjugated: PyTorch's complex convention); suffix products of
    the upstream gradient and prefix products of the gathers give all k leave-one-out products in O(k)
    multiplications, factor i over its columns starts[i]:.  Plain differentiable ops, so the backward is itself
    differentiable (double backward).
    """
    # conj() is a view: under forward-over-reverse its vmapped tangent failed PyTorch's internal layout assert
    # (has_fw_view); one physical conjugate of the small ``values`` instead
    conjugate = values.conj_physical() if values.is_complex() else values
    gathered = [_gather(conjugate, index) for index in indices]
    suffixes, running = [], grad  # suffixes[i] = grad · Π_{j>i} conj(gathered_j), on the columns starts[i]:
    for i in reversed(range(len(indices))):
        suffixes.append(running[..., starts[i]:])
        if i > 0:
            running = _multiply_from(running, starts[i], gathered[i])
    suffixes.reverse()
    grad_values, prefix = torch.zeros_like(values), None
    for i, suffix in enumerate(suffixes):
        grad_values = _scatter_add(grad_values, indices[i], suffix if prefix is None else suffix * prefix)
        if i + 1 < len(indices):
            step = starts[i + 1] - starts[i]
            prefix = gathered[i][..., step:] if prefix is None else (prefix * gathered[i])[..., step:]
    return grad_values
