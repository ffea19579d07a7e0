r"""Sketched categorical kernel: BoTorch's ``CategoricalKernel`` with hashed Rademacher-product features.

BoTorch's ``CategoricalKernel`` (the categorical kernel of ``MixedSingleTaskGP``) is

    k(x, y) = exp(−(1/d) Σᵢ 1[xᵢ ≠ yᵢ]/ℓᵢ) = Πᵢ (cᵢ + (1 − cᵢ)·1[xᵢ = yᵢ]),   cᵢ = exp(−1/(d·ℓᵢ)),

over the d columns it sees, with one lengthscale per column (ARD) or one shared.  Its features
are those of :class:`~rfgp.features.categorical.CategoricalFeatures` (derivation there): unbiased,
Var[k̂] = (Πᵢ mᵢ − k²)/F, no category set needed in advance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.validation import check_kernel_inputs, module_dtype
from ..features.categorical import CategoricalFeatures, check_category_input
from .families import check_kernel_kwargs
from .random_feature_kernel import FeatureKernel


class SketchedCategoricalKernel(FeatureKernel):
    r"""k(x, y) = exp(−(1/d) Σᵢ 1[xᵢ ≠ yᵢ]/ℓᵢ) (BoTorch's ``CategoricalKernel``) with F random features.

    Φ_f(x) = Πᵢ (√cᵢ·ε_{f,i} + √(1 − cᵢ)·h_{f,i}(xᵢ))/√F, cᵢ = exp(−1/(d·ℓᵢ)), ε Rademacher signs and h
    a pairwise independent sign hash of the category value (:class:`~rfgp.features.categorical.CategoricalFeatures`).
    Categories are the values of the columns (floats, as BoTorch passes them; equal values are one
    category, −0.0 = 0.0).  Like BoTorch's kernel it is not differentiable in x (the features are
    piecewise constant); the lengthscale gets its gradient through cᵢ.  ``last_dim_is_batch`` is refused,
    as by every rfgp kernel.

    Args:
        num_features: F.
        seed, generator: randomness of the signs and hashes.
        input_dim: d, the number of categorical columns (default ``ard_num_dims``; otherwise set at the first call).
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint``, as in GPyTorch/BoTorch.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedCategoricalKernel
        >>> kernel = SketchedCategoricalKernel(4096, ard_num_dims=2, seed=0).double()
        >>> x = torch.tensor([[0.0, 1.0], [0.0, 2.0], [1.0, 2.0]], dtype=torch.float64)
        >>> kernel(x).to_dense().shape
        torch.Size([3, 3])
    """

    has_lengthscale = True

    def __init__(self, num_features: int, seed: int | None = None, generator: torch.Generator | None = None,
                 input_dim: int | None = None, **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        ard_num_dims = kwargs.get("ard_num_dims")
        if input_dim is None:
            input_dim = ard_num_dims
        elif ard_num_dims is not None and ard_num_dims != input_dim:
            raise ValueError(f"ard_num_dims={ard_num_dims} does not match input_dim={input_dim}")
        super().__init__(**kwargs)
        self.feature_map = CategoricalFeatures(num_features, input_dim=input_dim, seed=seed, generator=generator)

    @property
    def num_features(self) -> int:
        return self.feature_map.num_features

    @property
    def input_dim(self) -> int | None:
        """The number d of categorical columns the draws were made for (``None`` until the first call if not given)."""
        return self.feature_map.input_dim

    def resample(self, generator: torch.Generator | None = None) -> SketchedCategoricalKernel:
        """Redraw the signs and hashes."""
        self.feature_map.resample(generator)
        return self

    def log_constant_share(self, num_columns: int) -> Tensor:
        """log cᵢ = −1/(d·ℓᵢ), shape ``(*batch_shape, d or 1)``."""
        return -self.lengthscale.squeeze(-2).reciprocal() / num_columns

    def check_inputs(self, x1: Tensor, x2: Tensor, finite: bool = True) -> torch.dtype:
        """Categories of x1 and x2 (finite values, any float being a category, as in BoTorch) whatever ``finite``:
        a lazy cross-covariance checks only finiteness, not categories, in the rows it featurises."""
        dtype = check_kernel_inputs(x1, x2, module_dtype(self))
        check_category_input(x1, "x1", self.input_dim)
        if x2 is not x1:
            check_category_input(x2, "x2", self.input_dim)
        return dtype

    def featurize(self, x: Tensor) -> Tensor:
        return self.feature_map(x, self.log_constant_share(x.shape[-1]))

    def prepare(self, x: Tensor) -> None:
        if not self.feature_map.is_initialized:
            self.feature_map.prepare(x)

    def diag_moments(self, x: Tensor) -> None:
        return None  # E[Φ(x)ᵀΦ(x)] = 1 = k(x, x)
