"""Cost checks: the largest tensor a computation creates, to show that no N × N matrix is built."""

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class LargestTensor(TorchDispatchMode):
    """The largest number of elements of any tensor (of ``dtype``, if given) an ATen operation returns inside the
    context."""

    def __init__(self, dtype: torch.dtype | None = None):
        super().__init__()
        self.numel = 0
        self.dtype = dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and self.dtype in (None, tensor.dtype):
                self.numel = max(self.numel, tensor.numel())
        return out


class TensorsOfSize(TorchDispatchMode):
    """How many tensors of ``dtype`` with at least ``numel`` elements the ATen operations inside the context return
    (in-place operations count too: each is a pass over the tensor)."""

    def __init__(self, numel: int, dtype: torch.dtype):
        super().__init__()
        self.count, self.numel, self.dtype = 0, numel, dtype

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor) and tensor.dtype == self.dtype and tensor.numel() >= self.numel:
                self.count += 1
        return out


class TriangularSolveFlops(TorchDispatchMode):
    """The flops of the triangular solves (``torch.linalg.solve_triangular``, forward and backward) inside the context,
    n²·k for each n × n factor and k right-hand sides, batch members counted: what ``FlopCounterMode`` leaves out."""

    def __init__(self):
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.linalg_solve_triangular.default:
            matrix, rhs = args[0], args[1]
            columns = rhs.shape[-1] if (kwargs or {}).get("left", True) else rhs.shape[-2]
            batch = torch.broadcast_shapes(matrix.shape[:-2], rhs.shape[:-2]).numel()
            self.flops += batch * matrix.shape[-1] ** 2 * columns
        return func(*args, **(kwargs or {}))
