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
