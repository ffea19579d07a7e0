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
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same products, plainly
        out = _gather(values, index[0])
        for i in range(1, index.shape[0]):
            out = out * _gather(values, index[i])
        return out
    return _GatherProduct.apply(values, index)


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


def _multiply_gathers_in_row_blocks(out: Tensor, values: Tensor, index: Tensor) -> None:
    """out ⊙= Π_i values[..., index[i]] for shared 1-D indices, a block of rows at a time."""
    rows, width = out.reshape(-1, out.shape[-1]), index.shape[-1]
    values = values.reshape(-1, values.shape[-1])
    step = max(1, _BLOCK_BYTES // (width * out.element_size()))
    buffer = torch.empty(min(step, rows.shape[0]), width, dtype=out.dtype, device=out.device)
    for start in range(0, rows.shape[0], step):  # blocks of memory, not a loop over data points
        block, source = rows[start : start + step], values[start : start + step]
        for idx in index:
            block.mul_(torch.index_select(source, -1, idx, out=buffer[: block.shape[0]]))


class _GatherProduct(torch.autograd.Function):
    @staticmethod
    def forward(ctx, values: Tensor, index: Tensor) -> Tensor:
        out = _gather(values, index[0])
        if index.shape[0] > 1 and index.dim() == 2 and not out.is_cuda:
            _multiply_gathers_in_row_blocks(out, values, index[1:])
        elif index.shape[0] > 1:  # CUDA's caching allocator, or one index per draw: one full-size buffer
            buffer = torch.empty_like(out)
            for i in range(1, index.shape[0]):
                out.mul_(_gather(values, index[i], out=buffer))
        ctx.save_for_backward(values, index)
        return out

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad: Tensor):
        # ∂out/∂values at index_i is Π_{j≠i} gathered_j (conjugated: PyTorch's complex convention);
        # suffix products of the upstream gradient and prefix products of the gathers give all
        # k leave-one-out products in O(k) multiplications.  Plain differentiable ops, so the
        # backward is itself differentiable (double backward).
        values, index = ctx.saved_tensors
        gathered = [_gather(values, index[i]).conj() for i in range(index.shape[0])]
        suffixes = [grad]
        for g in reversed(gathered[1:]):
            suffixes.append(suffixes[-1] * g)
        suffixes.reverse()  # suffixes[i] = grad · Π_{j>i} conj(gathered_j)
        grad_values, prefix = torch.zeros_like(values), None
        for i, suffix in enumerate(suffixes):
            grad_values = _scatter_add(grad_values, index[i], suffix if prefix is None else suffix * prefix)
            prefix = gathered[i] if prefix is None else prefix * gathered[i]
        return grad_values, None
