"""``IndexKernel`` as exact finite features, so task covariances combine in feature space.

GPyTorch's ``IndexKernel`` is k(i, j) = B[i, j] with B = LLᵀ + diag(v) (L the T × r
``covar_factor``, v > 0 the ``var``).  Its exact features are the rows of the T × (r + T) root
R = [L, diag(√v)], Φ(i) = R[i] (RRᵀ = B): no randomness, no variance.  Inside a product
(GPyTorch's Hadamard multitask pattern, ``k_x(x, x')·B[i, i']`` with the task index as one
input column) they multiply the data features by a row-wise Kronecker product
(:class:`~rfgp.kernels.FeatureProductKernel`).
"""

from __future__ import annotations

import inspect

import torch
from gpytorch.kernels import IndexKernel
from torch import Tensor

from ..core.validation import check_finite, check_task_indices
from .families import check_kernel_kwargs
from .random_feature_kernel import FeatureKernel


class IndexFeatureKernel(FeatureKernel, IndexKernel):
    r"""``gpytorch.kernels.IndexKernel`` with features Φ(i) = [L[i], √v[i]·e_i] (width r + T, exact).

    Same parameters (``covar_factor``, ``raw_var`` and its constraint, ``IndexKernelPrior``) and
    arguments as ``IndexKernel``; the input is one column of task indices 0..T−1, as an integer
    tensor (GPyTorch's Hadamard multitask tutorial) or floats holding integers (a task column of
    BoTorch's ``MultiTaskGP``), whatever the kernel's float dtype.  A value that is not such an
    index raises (GPyTorch's ``IndexKernel`` would truncate 0.5 to task 0).

    Example:
        >>> import torch
        >>> from rfgp.kernels import IndexFeatureKernel
        >>> tasks = IndexFeatureKernel(num_tasks=3, rank=1)
        >>> tasks(torch.tensor([[0.0], [2.0]])).to_dense().shape
        torch.Size([2, 2])
    """

    #: Φ(i)ᵀΦ(j) = k(i, j) exactly, at a width fixed by the kernel (not by ``num_features``)
    is_exact = True

    def __init__(self, *args, **kwargs) -> None:
        """The arguments of the exact kernel computed (``IndexKernel``'s, or a subclass's such as BoTorch's
        ``PositiveIndexKernel``) and GPyTorch's ``Kernel`` arguments; any other keyword raises a ``TypeError``
        naming it (``IndexKernel`` would drop it silently)."""
        exact = next(base for base in type(self).__mro__
                     if issubclass(base, IndexKernel) and not issubclass(base, FeatureKernel))
        own = inspect.signature(exact.__init__).parameters
        check_kernel_kwargs(type(self).__name__, {name: value for name, value in kwargs.items() if name not in own})
        super().__init__(*args, **kwargs)

    @property
    def num_features(self) -> int:
        num_tasks, rank = self.covar_factor.shape[-2:]
        return rank + num_tasks

    def check_call_inputs(self, x1: Tensor, x2: Tensor) -> None:
        return self.check_inputs(x1, x2)

    def check_inputs(self, x1: Tensor, x2: Tensor, finite: bool = True) -> None:
        """Types only, whatever ``finite``: the values are checked where they are read, in :meth:`featurize` (also as
        a part of a product or sum, or of BoTorch's ``MultiTaskGP`` input).  Task indices are not promoted (``None``):
        the features are rows of the task factor, in its dtype."""
        num_tasks = self.covar_factor.shape[-2]
        check_task_indices(x1, "x1", num_tasks, values=False)
        check_task_indices(x2, "x2", num_tasks, values=False)
        return None

    def featurize(self, x: Tensor) -> Tensor:
        root = self.checked_root()
        return self._task_rows(x, root) @ root

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖R[i]‖² = B[i, i] = Σ_r L[i, r]² + v[i], read for each index without forming the rows R[i] (so that a
        product with data features, GPyTorch's Hadamard multitask pattern, keeps a closed-form diagonal)."""
        root = self.checked_root()
        return (self._task_rows(x, root) @ root.pow(2).sum(-1, keepdim=True)).squeeze(-1)

    def _task_rows(self, x: Tensor, root: Tensor) -> Tensor:
        """One-hot rows of the task indices x ``(..., n, 1)``, in R's dtype: they select R[i] differentiably."""
        if x.shape[-1] != 1:
            raise ValueError(
                f"IndexFeatureKernel takes one column of task indices, got {x.shape[-1]} columns "
                "(set active_dims to the task column)"
            )
        check_task_indices(x, "the task indices", root.shape[-2])
        return torch.nn.functional.one_hot(x.squeeze(-1).long(), root.shape[-2]).to(root.dtype)

    def checked_root(self) -> Tensor:
        """:meth:`task_root`, checked finite (one reduction over its T·(r + T) entries): a NaN or infinite
        ``covar_factor`` or ``var`` would make Φ and k NaN silently."""
        root = self.task_root()
        check_finite(root, "the task covariance root R = [covar_factor, diag(√var)]")
        return root

    def task_root(self) -> Tensor:
        """R = [L, diag(√v)] ``(*batch_shape, T, r + T)`` with RRᵀ = B."""
        return torch.cat((self.covar_factor, torch.diag_embed(self.var.sqrt())), dim=-1)

    def diag_moments(self, x: Tensor) -> None:
        return None
