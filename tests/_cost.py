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
