"""TensorSRHT of a tensor product of feature vectors: Φ(x) = S(Φ₁(x) ⊗ … ⊗ Φₙ(x)) of width D.

The product kernel k₁·…·kₙ with feature maps Φᵢ has the exact features Φ₁ ⊗ … ⊗ Φₙ of width
ΠFᵢ.  The degree-n TensorSRHT of paper 000 (Algorithm 1, here
:class:`~rfgp.features.DegreeSketch` with ``projection="srht"``) sketches that tensor product
without forming it: projection i is applied to Φᵢ (zero-padded to a common width, which keeps
every inner product), and the D projections are multiplied elementwise,

    Φ(x) = D^{−1/2} ⊙ᵢ (P Hᵢ Zᵢ Φᵢ(x)),

so that E_S[Φ(x)ᵀΦ(y)] = Πᵢ Φᵢ(x)ᵀΦᵢ(y) (independent diagonals Zᵢ and permutations per
factor and block: paper 000 pitfall 1), hence unbiased for Πkᵢ when the factors are
independent and unbiased.  Conditionally on the factor features uᵢ = Φᵢ(x), vᵢ = Φᵢ(y), the
variance is that of Theorem 6 of paper 000 with the n copies of x, y replaced by (uᵢ, vᵢ):
the Rademacher product-sketch variance

    D^{−1}[Πᵢ(‖uᵢ‖²‖vᵢ‖² + 2(uᵢᵀvᵢ)² − 2Σₖuᵢₖ²vᵢₖ²) − Πᵢ(uᵢᵀvᵢ)²]

minus the structured-block reduction term (Table 1, c(D, d)/D² · […]); so it is O(Πᵢk̂ᵢ(x, x)k̂ᵢ(y, y)/D),
on top of the factors' own variance.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.validation import check_positive_int
from .base import FeatureMap
from .degree_sketch import DegreeSketch


class TensorProductSketch(FeatureMap):
    """TensorSRHT of Φ₁(x) ⊗ … ⊗ Φₙ(x) to width ``num_features`` (see module doc).

    Args:
        num_factors: n ≥ 2, the number of feature vectors multiplied.
        num_features: output width D.
        input_dim: the largest factor width (the factors are zero-padded to it); ``None``: set
            at the first call.
        seed, generator: randomness, see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features.tensor_product import TensorProductSketch
        >>> sketch = TensorProductSketch(2, 256, seed=0)
        >>> u, v = torch.randn(5, 64), torch.randn(5, 16)
        >>> sketch([u, v]).shape            # ≈ the row-wise Kronecker product (width 1024)
        torch.Size([5, 256])
    """

    def __init__(self, num_factors: int, num_features: int, input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None) -> None:
        self.num_factors = check_positive_int(num_factors, "num_factors")
        if self.num_factors < 2:
            raise ValueError(f"num_factors must be ≥ 2 (a product), got {num_factors}")
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    def sketch(self) -> DegreeSketch:
        return DegreeSketch(self.num_factors, self.num_features, self.input_dim, "srht", False, "independent")

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        return self.sketch().draw(generator)

    def forward(self, factors: list[Tensor]) -> Tensor:
        """S(Φ₁ ⊗ … ⊗ Φₙ) of shape ``(..., n_points, D)`` for factor features ``(..., n_points, Fᵢ)``."""
        if len(factors) != self.num_factors:
            raise ValueError(f"factors must hold {self.num_factors} feature tensors, got {len(factors)}")
        width = self.input_dim if self.input_dim is not None else max(u.shape[-1] for u in factors)
        too_wide = [u.shape[-1] for u in factors if u.shape[-1] > width]
        if too_wide:
            raise ValueError(f"factor widths {too_wide} exceed input_dim={width} this sketch was drawn for")
        padded = [torch.nn.functional.pad(u, (0, width - u.shape[-1])) for u in factors]
        self._prepare(padded[0])
        return self.sketch().apply_to(padded, lambda name: self._buffer(name, like=padded[0]))

    def extra_repr(self) -> str:
        return f"num_factors={self.num_factors}, {super().extra_repr()}"
