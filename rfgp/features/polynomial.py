"""Polynomial sketches: random features of the polynomial kernel (xᵀy + ν)^p.

The inhomogeneous kernel is reduced to the homogeneous one by appending √ν to the input,
x̃ = [x; √ν], so that (xᵀy + ν)^p = (x̃ᵀỹ)^p (paper 000 Eq. 2; paper 001 Eq. 2).  The
degree-p sketch of x̃ is one of the :mod:`~rfgp.features.degree_sketch` projections.

Weights (``num_features`` F is always the real output width):

* ``"real"``: real weights, Φ(x) ∈ R^F; k̂ = Φ(x)ᵀΦ(y) (paper 000 Eq. 5–6).
* ``"complex"``: complex weights ({±1, ±i} or CN(0, 1)), m = F/2 complex features Φ_C(x) ∈ C^m,
  k̂_C = Φ_C(x)ᵀ conj Φ_C(y) (paper 000 Eq. 10–11).  The real output [Re Φ_C, Im Φ_C]
  reproduces Re k̂_C exactly; :meth:`PolynomialSketch.complex_features` returns Φ_C for the
  complex-feature GP posterior of paper 000 Appendix D (:mod:`rfgp.inference.complex_posterior`).
* ``"ctr"``: Complex-to-Real (paper 001 Algorithm 1): the same m = F/2 complex features,
  output [Re Φ_C, Im Φ_C] with the 1/√m scale, used as an ordinary real feature map.

``"complex"`` and ``"ctr"`` therefore produce the same real features for the same draws;
they differ in intent: the complex sketch's error is E|k̂_C − k|² (paper 000 Table 1) and its
GP posterior is the complex one, the CtR sketch's error is V[Re k̂_C] = ½(V + PV)
(paper 001 Eq. 6) and its GP is the ordinary real one.
"""

from __future__ import annotations

import numbers

import torch
from torch import Tensor

from ..core import settings
from ..core.config_state import METHOD
from ..core.validation import check_choice, check_hyperparameter, check_positive_float, check_positive_int
from .base import FeatureMap
from .degree_sketch import PROJECTIONS as DEGREE_PROJECTIONS
from .degree_sketch import SRHT_BLOCKS, DegreeSketch, HierarchicalSketch
from .derivatives import multilinear_derivatives

PROJECTIONS = (*DEGREE_PROJECTIONS, "hierarchical")
WEIGHTS = ("real", "complex", "ctr")


def check_degree(value, name: str = "degree") -> int:
    """An integer polynomial degree ≥ 1 (floats with an integer value are accepted)."""
    if isinstance(value, numbers.Real) and not isinstance(value, (bool, numbers.Integral)):
        if float(value).is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer ≥ 1, got {value}")
    return check_positive_int(value, name)


class PolynomialSketch(FeatureMap):
    r"""Random features for (xᵀy + ν)^p (or (xᵀy)^p), x already divided by the lengthscale.

    Args:
        degree: p ≥ 1.
        num_features: real output width F (even for complex/CtR weights: m = F/2 complex features).
        input_dim: d (``None``: set at the first call).
        offset: ν ≥ 0, appended as √ν; ``None`` sketches the homogeneous kernel (xᵀy)^p on
            x itself.  :meth:`forward` accepts a tensor ``offset`` overriding the value (the
            kernels pass their learnable offset that way).
        projection: ``"rademacher"``, ``"gaussian"``, ``"srht"`` (TensorSRHT), ``"countsketch"``
            (TensorSketch) or ``"hierarchical"`` (Ahle et al. 2020 tree of TensorSRHTs).
        weights: ``"real"``, ``"complex"`` or ``"ctr"``.
        srht_blocks: ``"tiled"`` (paper 001, default) or ``"independent"`` (paper 000 Alg. 1); ``"independent"``
            needs ``projection="srht"`` (the hierarchical tree's nodes are tiled).
        seed, generator: randomness, see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features import PolynomialSketch
        >>> phi = PolynomialSketch(3, 256, input_dim=8, offset=1.0, projection="srht", weights="ctr", seed=0)
        >>> x = torch.nn.functional.normalize(torch.rand(5, 8), dim=-1)
        >>> k_hat = phi(x) @ phi(x).T          # ≈ (x xᵀ + 1)³
        >>> k_hat.shape
        torch.Size([5, 5])
    """

    config_fields = {"degree": METHOD, "offset": METHOD, "projection": METHOD, "weights": METHOD,
                     "srht_blocks": METHOD}

    def __init__(
        self,
        degree: int,
        num_features: int,
        input_dim: int | None = None,
        offset: float | None = None,
        projection: str = "rademacher",
        weights: str = "real",
        srht_blocks: str = "tiled",
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        self.degree = check_degree(degree)
        self.projection = check_choice(projection, "projection", PROJECTIONS)
        self.weights = check_choice(weights, "weights", WEIGHTS)
        self.srht_blocks = check_choice(srht_blocks, "srht_blocks", SRHT_BLOCKS)
        if self.srht_blocks != "tiled" and self.projection != "srht":
            # only DegreeSketch's TensorSRHT reads it; the hierarchical tree's SRHT nodes are always tiled
            raise ValueError(
                f"srht_blocks={srht_blocks!r} is a TensorSRHT block sampling and needs projection='srht', "
                f"got projection={projection!r} (accepted with it: srht_blocks='tiled', the default)"
            )
        self.offset = None if offset is None else check_positive_float(offset, "offset", allow_zero=True)
        check_positive_int(num_features, "num_features")
        if self.is_complex and num_features % 2:
            raise ValueError(
                f"num_features must be even for weights={weights!r} (F/2 complex features → [Re, Im]), "
                f"got {num_features}"
            )
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    @property
    def is_complex(self) -> bool:
        return self.weights != "real"

    @property
    def width(self) -> int:
        """Number of sketch features: F for real weights, F/2 complex features otherwise."""
        return self.num_features // 2 if self.is_complex else self.num_features

    @property
    def sketch_dim(self) -> int:
        """Dimension of the sketched vector x̃ (d + 1 when an offset is appended)."""
        return self.input_dim + (self.offset is not None)

    def sketch(self) -> DegreeSketch | HierarchicalSketch:
        """The degree-p sketch applied to x̃ (needs ``input_dim``)."""
        if self.input_dim is None:
            raise RuntimeError("the feature map has no input_dim yet: pass input_dim or call it on data first")
        if self.projection == "hierarchical":
            return HierarchicalSketch(self.degree, self.width, self.sketch_dim, self.is_complex)
        return DegreeSketch(
            self.degree, self.width, self.sketch_dim, self.projection, self.is_complex, self.srht_blocks
        )

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        return self.sketch().draw(generator, dtype=self._anchor.dtype)

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor, offset: Tensor | float | None = None) -> Tensor:
        """[Re Φ_C, Im Φ_C] (complex/CtR) or Φ (real), shape ``(..., n, F)``."""
        phi = self.complex_features(x, offset) if self.is_complex else self._sketch(x, offset)
        return torch.cat((phi.real, phi.imag), dim=-1) if self.is_complex else phi

    def complex_features(self, x: Tensor, offset: Tensor | float | None = None) -> Tensor:
        """The complex features Φ_C(x) ∈ C^{F/2} with Φ_C(x)ᵀ conj Φ_C(y) unbiased for the kernel."""
        if not self.is_complex:
            raise ValueError(f"complex_features needs weights='complex' or 'ctr', this map has weights={self.weights!r}")
        return self._sketch(x, offset)

    def complex_layout(self) -> Tensor:
        """Columns of the output holding [Re Φ_C, Im Φ_C] (for the complex-feature GP): all of them, in order."""
        if not self.is_complex:
            raise ValueError(f"complex_layout needs weights='complex' or 'ctr', this map has weights={self.weights!r}")
        return torch.arange(self.num_features)

    def _sketch(self, x: Tensor, offset) -> Tensor:
        self._prepare(x)
        return self.sketch().apply(self.augment(x, offset), lambda name: self._buffer(name, like=x))

    def input_derivatives(self, x: Tensor, offset: Tensor | float | None = None, second: bool = False) -> Tensor:
        """[Φ, ∂Φ/∂x₁, …, ∂Φ/∂x_d (, ∂²Φ/∂x₁², …)] of shape ``(..., n, 1 + d (+ d), F)``.

        Exact product rule over the p sketched factors of x̃ = [x; √ν]
        (:func:`~rfgp.features.derivatives.multilinear_derivatives`; ∂x̃/∂xⱼ = eⱼ, the offset
        coordinate is constant).  Complex and CtR weights give [Re, Im] of the complex derivatives.
        """
        self._prepare(x)
        point = self.augment(x, offset)
        directions = torch.eye(self.input_dim, point.shape[-1], dtype=x.dtype, device=x.device)
        sketch = self.sketch()
        rows = multilinear_derivatives(
            lambda factors: sketch.apply_to(factors, lambda name: self._buffer(name, like=x)),
            point, directions, self.degree, second,
        )
        return torch.cat((rows.real, rows.imag), dim=-1) if self.is_complex else rows

    def augment(self, x: Tensor, offset: Tensor | float | None = None) -> Tensor:
        """x̃ = [x; √ν] (paper 000 Eq. 2); ``offset`` may be a tensor broadcastable to ``x.shape[:-1]``."""
        if offset is None:
            offset = self.offset
        elif self.offset is None:
            raise ValueError("this map sketches the homogeneous kernel (offset=None); it cannot take an offset")
        if offset is None:
            return x
        if torch.is_tensor(offset):  # a kernel's constrained (≥ 0) hyperparameter
            if settings.validate_inputs.on():  # one host read: √ν of ν < 0 or NaN made every feature NaN silently
                check_hyperparameter(offset, "offset", allow_bound=True)
            root = offset.to(dtype=x.dtype, device=x.device).sqrt()
        else:
            root = torch.tensor(check_positive_float(offset, "offset", allow_zero=True), dtype=x.dtype, device=x.device).sqrt()
        shape = torch.broadcast_shapes(x.shape[:-1], root.shape)
        return torch.cat((x.expand(*shape, x.shape[-1]), root.expand(shape).unsqueeze(-1)), dim=-1)

    # ---------------------------------------------------------- diagonal terms
    def target_diag(self, x: Tensor) -> Tensor:
        x = self.augment(x)
        return x.pow(2).sum(-1).pow(self.degree)

    expected_diag = target_diag  # every sketch here is unbiased

    def extra_repr(self) -> str:
        return (
            f"degree={self.degree}, {super().extra_repr()}, offset={self.offset}, "
            f"projection={self.projection!r}, weights={self.weights!r}"
            + (f", srht_blocks={self.srht_blocks!r}" if self.projection == "srht" else "")
        )
