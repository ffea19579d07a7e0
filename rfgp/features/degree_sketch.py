"""Degree-n tensor sketches: random maps Φₙ: Rᵈ → R^D or C^D with E[Φₙ(x)ᵀ conj Φₙ(y)] = (xᵀy)ⁿ.

These are the building blocks of every polynomial and dot-product feature map
(:class:`~rfgp.features.PolynomialSketch`, Maclaurin features, GaussianSketchHD).  Each is
a plain description of *what is drawn* and *how it is applied*; the owning
:class:`~rfgp.features.FeatureMap` stores the draws as buffers (under a name prefix, so
one map can hold several sketches of different degrees and widths).

Projections of one degree (papers 000 §3–4 and 001 §5):

* ``"rademacher"``/``"gaussian"``: Φ(x) = D^{-1/2} ⊙ᵢ (x Wᵢ), Wᵢ ∈ R^{d×D} i.i.d. entries
  (paper 000 Eq. 5; complex Eq. 10 with {±1, ±i} or CN(0, 1) entries, Examples 3–4).
* ``"srht"``: TensorSRHT, wᵢ,ₗ = zᵢ ∘ h_{πᵢ(l)} with the *unnormalised* Hadamard matrix on
  the zero-padded input (paper 000 Algorithm 1).  Two samplings of the stacked blocks:
  ``"tiled"`` (paper 001 §5.1: one diagonal zᵢ per degree shared by all ⌈D/d⌉ blocks and one
  shuffle of the tiled index vector per degree; variance with M = ⌈D/d⌉d) and
  ``"independent"`` (paper 000 Algorithm 1 read literally: a fresh zᵢ and permutation per
  degree *and* block; variance with c(D, d), Table 1).  Permutations are always independent
  across degrees — sharing them breaks the closed forms (paper 000 notes, pitfall 1).
* ``"countsketch"``: TensorSketch (Pham & Pagh 2013): CountSketches Cᵢx, combined by FFT
  convolution, Φ(x) = IFFT(⊙ᵢ FFT(Cᵢx)); unbiased without a 1/√D factor.

:class:`HierarchicalSketch` is the tree sketch of Ahle et al. (2020) used as a baseline in
paper 000 (Fig. 6 "Ahle TensorSRHT"): degree-1 SRHT leaves, degree-2 TensorSRHT nodes.

Complex weights are stored as real buffers (``Module.to(dtype)`` would otherwise discard the
imaginary part).  The dense Rademacher/Gaussian projections keep (Re, Im) pairs interleaved in one
``weight_pairs`` buffer of shape ``(degree, d, D, 2)``: a real input is then projected by ONE real
matmul x @ W.view(d, 2D), whose (N, 2D) result is viewed as complex without a copy — half the flops
of the complex matmul x.to(complex) @ W that dp-rfs (the seed authors' code) uses, and no complex
weight is rebuilt per call.  {±1, ±i} entries are drawn by one ``randint`` into the table of the four
units, as dp-rfs draws them.  The SRHT diagonals and CountSketch signs are small (O(d)) and keep
separate ``_real``/``_imag`` buffers.
"""

from __future__ import annotations

import functools
import math
from typing import Callable

import torch
from torch import Tensor

from ..core.dtypes import device_constant
from . import random
from .gather_product import gather_product, suffix_gather_product
from .hadamard import fwht, next_power_of_two

PROJECTIONS = ("rademacher", "gaussian", "srht", "countsketch")
SRHT_BLOCKS = ("tiled", "independent")

Getter = Callable[[str], Tensor]


def srht_padded_dim(input_dim: int) -> int:
    """The Hadamard size of TensorSRHT: the next power of two ≥ max(d, 2) (the variance divides by d − 1)."""
    return next_power_of_two(max(input_dim, 2))


def _unit_weights(shape, complex_weights: bool, generator: torch.Generator) -> dict[str, Tensor]:
    """Entries uniform on {±1} (real) or {±1, ±i} (complex; paper 000 Example 4) as real/imag parts."""
    signs = random.rademacher(shape, generator)
    if not complex_weights:
        return {"real": signs}
    imaginary = torch.randint(0, 2, shape, generator=generator, dtype=torch.bool)
    return {"real": torch.where(imaginary, 0.0, signs), "imag": torch.where(imaginary, signs, 0.0)}


#: the four complex units 1, −1, i, −i
_UNITS = torch.tensor([1, -1, 1j, -1j], dtype=torch.complex128)


def _weight_pairs(projection: str, shape, generator: torch.Generator, dtype: torch.dtype) -> Tensor:
    """Complex projection entries as (Re, Im) pairs, shape ``(*shape, 2)``: uniform on {±1, ±i}
    (paper 000 Example 4; exact in ``dtype``, so made in it directly) or CN(0, 1) with Re and Im
    each N(0, ½), so that E|w|² = 1 (paper 001 check 6).  The Gaussian pairs are drawn and scaled in
    float32 (:func:`~rfgp.features.random.normal_single`), exact in float64: the same map in every
    dtype, drawn as fast as dp-rfs's complex64 ``randn`` (a float64 draw cost 4–10× more)."""
    if projection == "rademacher":
        # a gather from a complex table viewed as pairs: as fast as dp-rfs's draw (a gather of pair rows is ~1.7× slower)
        units = _UNITS.to(torch.complex64 if dtype == torch.float32 else torch.complex128)
        return torch.view_as_real(units[torch.randint(0, 4, shape, generator=generator)])
    return random.normal_single((*shape, 2), generator).mul_(math.sqrt(0.5))


def _combine(parts: dict[str, Tensor], prefix: str) -> dict[str, Tensor]:
    return {f"{prefix}_{part}": value for part, value in parts.items()}


def _weight(get: Getter, name: str, complex_weights: bool) -> Tensor:
    real = get(f"{name}_real")
    return torch.complex(real, get(f"{name}_imag")) if complex_weights else real


def _hadamard(x: Tensor) -> Tensor:
    """Unnormalised FWHT of a real or complex tensor (torch has no complex FWHT: Re and Im in one call)."""
    if x.is_complex():
        parts = fwht(torch.stack((x.real, x.imag)))
        return torch.complex(parts[0], parts[1])
    return fwht(x)


def _shuffle_keys(shape, generator: torch.Generator) -> Tensor:
    """Uniform sort keys of random permutations, in float32 whatever torch's default dtype.

    With the default dtype the same seed gave other permutations under ``torch.set_default_dtype(torch.float64)``
    (so a map re-drawn by :func:`rfgp.set_num_features` differed from one built at that width); float32 keeps the
    permutations drawn under the usual default.
    """
    return torch.rand(shape, generator=generator, dtype=torch.float32)


class DegreeSketch:
    """The degree-n sketch ⊙ᵢ₌₁ⁿ (projection i of x) of width D, for x ∈ Rᵈ or Cᵈ.

    Args:
        degree: n ≥ 1, the number of multiplied projections.
        width: D, the number of (real or complex) output features.
        input_dim: d, the dimension of the sketched vectors (before TensorSRHT padding).
        projection: one of :data:`PROJECTIONS`.
        complex_weights: draw complex weights ({±1, ±i} or CN(0, 1)); the output is then complex.
        srht_blocks: ``"tiled"`` or ``"independent"`` stacking of TensorSRHT blocks (see module doc).

    ``apply`` returns Φ scaled so that Φ(x)ᵀ conj Φ(y) is an unbiased estimate of (xᵀ conj y)ⁿ.
    """

    def __init__(
        self,
        degree: int,
        width: int,
        input_dim: int,
        projection: str,
        complex_weights: bool,
        srht_blocks: str = "tiled",
    ) -> None:
        self.degree = degree
        self.width = width
        self.input_dim = input_dim
        self.projection = projection
        self.complex_weights = complex_weights
        self.srht_blocks = srht_blocks

    @property
    def padded_dim(self) -> int:
        return srht_padded_dim(self.input_dim) if self.projection == "srht" else self.input_dim

    # ------------------------------------------------------------------ draws
    def draw(self, generator: torch.Generator, prefix: str = "", batch_shape=(),
             dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
        """The random quantities as real tensors named ``{prefix}{name}``, shaped ``(degree, *batch_shape, ...)``.

        A non-empty ``batch_shape`` draws that many independent sketches at once; :meth:`apply`
        then returns one output per draw (vectorised Monte Carlo, used by the tests).  ``dtype``:
        the floating dtype the complex {±1, ±i} weights are made in (exact in any dtype, so the
        owning map passes its own and skips a float64 copy); complex Gaussian weights are float32
        (exact in float64, see :func:`_weight_pairs`); every other draw is float64.
        """
        n, width, d, cplx = (self.degree, *batch_shape), self.width, self.input_dim, self.complex_weights
        if self.projection in ("rademacher", "gaussian") and cplx:
            draws = {"weight_pairs": _weight_pairs(self.projection, (*n, d, width), generator, dtype)}
        elif self.projection == "rademacher":
            draws = {"weight_real": random.rademacher((*n, d, width), generator)}
        elif self.projection == "gaussian":
            draws = {"weight_real": random.normal((*n, d, width), generator)}
        elif self.projection == "srht":
            draws = self._draw_srht(n, generator)
        else:
            draws = _combine(_unit_weights((*n, d), cplx, generator), "sign")
            draws["bucket"] = torch.randint(0, width, (*n, d), generator=generator)
        return {prefix + name: value for name, value in draws.items()}

    def _draw_srht(self, n: tuple[int, ...], generator: torch.Generator) -> dict[str, Tensor]:
        width, padded = self.width, self.padded_dim
        num_blocks = math.ceil(width / padded)
        if self.srht_blocks == "tiled":
            # One diagonal per degree; one shuffle of (1..d) tiled ⌈D/d⌉ times per degree (paper 001 §5.1).
            diagonals = _unit_weights((*n, 1, padded), self.complex_weights, generator)
            tiled = torch.arange(padded).repeat(num_blocks)
            order = torch.argsort(_shuffle_keys((*n, num_blocks * padded), generator), dim=-1)
            index = tiled[order][..., :width]
        else:
            # A fresh diagonal and permutation per degree and block (paper 000 Algorithm 1).
            diagonals = _unit_weights((*n, num_blocks, padded), self.complex_weights, generator)
            permutations = torch.argsort(_shuffle_keys((*n, num_blocks, padded), generator), dim=-1)
            offsets = torch.arange(num_blocks).unsqueeze(-1) * padded
            index = (permutations + offsets).flatten(-2)[..., :width]
        draws = _combine(diagonals, "diagonal")
        draws["index"] = index
        return draws

    # ------------------------------------------------------------- apply
    def project(self, x: Tensor, i: int, get: Getter) -> Tensor:
        """Projection i of x, shape ``(..., N, D)``, unscaled: (wᵢ,ₗᵀx)ₗ, or the CountSketch Cᵢx."""
        if self.projection in ("rademacher", "gaussian"):
            if not self.complex_weights:
                return x @ get("weight_real")[i]
            pairs = get("weight_pairs")[i]  # (*draws, d, D, 2)
            if x.is_complex():
                return x @ torch.view_as_complex(pairs)
            # one real matmul against [Re w₁, Im w₁, Re w₂, …]; its output pairs are the complex projections
            return torch.view_as_complex((x @ pairs.flatten(-2)).unflatten(-1, (self.width, 2)))
        if self.projection == "srht":
            return gather_product(*self._srht_transform(x.unsqueeze(-2), get, slice(i, i + 1)))
        sign = _weight(get, "sign", self.complex_weights)[i]  # (*draws, d)
        values = x * sign.unsqueeze(-2)
        out = torch.zeros((*values.shape[:-1], self.width), dtype=values.dtype, device=x.device)
        return out.scatter_add(-1, get("bucket")[i].unsqueeze(-2).expand_as(values), values)

    def apply(self, x: Tensor, get: Getter) -> Tensor:
        """Φₙ(x), shape ``(..., N, D)``, real or complex; Φₙ(x)ᵀ conj Φₙ(y) is unbiased for (xᵀ conj y)ⁿ."""
        return self.apply_to([x] * self.degree, get)

    def apply_to(self, inputs: list[Tensor], get: Getter) -> Tensor:
        """Sketch of inputs[0] ⊗ … ⊗ inputs[n−1]: projection i is applied to inputs[i]."""
        if self.projection == "srht":
            return self._srht_product(inputs, get)
        projections = [self.project(x, i, get) for i, x in enumerate(inputs)]
        # an empty batch (no rows) takes the plain product below: its shape and dtype, no values (MKL's FFT raised
        # "DFTI ERROR: Inconsistent configuration" on it)
        if self.projection == "countsketch" and all(p.numel() for p in projections):
            # Circular convolution of the CountSketches = CountSketch of the tensor product with
            # hash Σᵢhᵢ mod D (Pham & Pagh 2013), computed with FFTs.
            spectrum = torch.fft.fft(projections[0])
            for projection in projections[1:]:
                spectrum = spectrum * torch.fft.fft(projection)
            out = torch.fft.ifft(spectrum)
            return out if any(p.is_complex() for p in projections) else out.real
        out = projections[0]
        for projection in projections[1:]:
            out = out * projection
        return out / math.sqrt(self.width)

    def _srht_product(self, inputs: list[Tensor], get: Getter) -> Tensor:
        """D^{-1/2} ⊙ᵢ (TensorSRHT projection i of inputs[i]): every degree in one FWHT and one gather-product.

        The factor D^{-1/2} is spread as D^{-1/(2n)} over the n diagonals (d-sized, not D-sized, work).
        """
        if all(x is inputs[0] for x in inputs):
            stacked = inputs[0].unsqueeze(-2)  # (..., N, 1, d): broadcast over the degrees, no copy
        else:
            stacked = torch.stack(torch.broadcast_tensors(*inputs), dim=-2)  # (..., N, n, d)
        return gather_product(*self._srht_transform(stacked, get, slice(None), self.width ** (-0.5 / self.degree)))

    def _srht_transform(self, stacked: Tensor, get: Getter, degrees: slice, scale: float = 1.0):
        """H Dᵢ xᵢ for the k selected degrees, flattened to ``(..., N, k·blocks·padded)``, and the
        ``(k, *draws, D)`` positions of the projections (wᵢ,ₗᵀ xᵢ)ₗ in it.

        All k degrees and all blocks go through one FWHT of shape ``(..., N, k, blocks, padded)``
        (``stacked`` is ``(..., N, k or 1, d)``, size 1 broadcasting over the degrees).
        """
        diagonal = _weight(get, "diagonal", self.complex_weights)[degrees]  # (k, *draws, blocks, padded)
        index = get("index")[degrees]  # (k, *draws, D) into blocks·padded
        if scale != 1.0:
            diagonal = diagonal * scale
        k, num_blocks, padded = diagonal.shape[0], diagonal.shape[-2], diagonal.shape[-1]
        x = _pad(stacked, padded).unsqueeze(-2)  # (..., N, k or 1, 1, padded)
        blocks = _hadamard(x * diagonal.movedim(0, -3).unsqueeze(-4))  # (..., N, k, blocks, padded)
        offsets = torch.arange(k, device=index.device) * (num_blocks * padded)
        return blocks.flatten(-3), index + offsets.view(k, *[1] * (index.dim() - 1))


def srht_of_degrees(x: Tensor, sketches: list[DegreeSketch], gets: list[Getter], owner: object) -> Tensor:
    """[Φ_{n₁}(x), Φ_{n₂}(x), …], shape ``(..., N, ΣD)``, of TensorSRHT sketches of increasing degrees n₁ < n₂ < …
    of one input: every degree in one FWHT and one :func:`~rfgp.features.gather_product.suffix_gather_product`.

    Equal to ``torch.cat([s.apply(x, get) for s, get in zip(sketches, gets)], -1)``, product for product: the
    diagonals of all degrees (each scaled by D^{-1/(2n)}) are stacked into one transform of
    ``(..., N, Σ n·blocks, padded)``, and with the columns ordered by degree, factor i of the product reaches the
    columns of the degrees n > i, a suffix of them.  Per-degree calls cost O(Σ n) small ops, which dominate at the
    small N of a BO loop.  ``gets[j]`` reads the draws of ``sketches[j]``; the draws' layout (positions, not values)
    is kept on ``owner`` per device (:func:`~rfgp.core.dtypes.device_constant`).
    """
    first = sketches[0]
    reals = [get("diagonal_real") for get in gets]  # (n, blocks, padded) each
    indices = [get("index") for get in gets]  # (n, D) each
    shape = (tuple(s.degree for s in sketches), tuple(s.width for s in sketches), first.padded_dim,
             tuple(int(d.shape[-2]) for d in reals))  # ints even under torch.jit.trace, where sizes are tensors
    layout = _srht_layout(*shape)
    constant = lambda name, dtype, like: device_constant(  # noqa: E731
        owner, ("srht_of_degrees", shape, name), lambda: torch.tensor(layout[name], dtype=dtype), like)
    rows = constant("rows", torch.long, indices[0])
    scales = constant("scales", torch.float64, x).unsqueeze(-1)
    diagonal = torch.cat([d.flatten(0, -2) for d in reals])
    if first.complex_weights:
        diagonal = torch.complex(diagonal, torch.cat([get("diagonal_imag").flatten(0, -2) for get in gets]))
    diagonal = diagonal.index_select(0, rows) * scales
    positions = torch.cat([i.flatten() for i in indices]).index_select(0, constant("order", torch.long, rows))
    positions = positions + constant("shift", torch.long, rows)
    values = _hadamard(_pad(x, first.padded_dim).unsqueeze(-2) * diagonal).flatten(-2)  # (..., N, Σ n·blocks·padded)
    return suffix_gather_product(values, list(positions.split(layout["lengths"])), layout["starts"])


@functools.lru_cache(maxsize=64)
def _srht_layout(degrees: tuple[int, ...], widths: tuple[int, ...], padded: int, blocks: tuple[int, ...]) -> dict:
    """Where the draws of :func:`srht_of_degrees` go: Python numbers from the sketches' shapes, no draws.

    ``rows``: the stacked diagonal rows (degree n, factor i, block b) in the transform's order (factor, degree,
    block); ``scales``: D^{-1/(2n)} per transform row; ``order``: the entries of the concatenated flat indices
    (degree, factor, column) in product order (factor, degree, column); ``shift``: each ordered entry's offset (its
    first transform row × padded); ``starts``/``lengths``: the first column and the number of columns factor i
    reaches.
    """
    row, entry, column = 0, 0, 0
    rows, entries, columns = [], [], []
    for degree, width, count in zip(degrees, widths, blocks):
        rows.append(row)
        entries.append(entry)
        columns.append(column)
        row += degree * count
        entry += degree * width
        column += width
    layout = {"rows": [], "scales": [], "order": [], "shift": [], "starts": (), "lengths": []}
    for i in range(degrees[-1]):
        reached = [j for j, degree in enumerate(degrees) if degree > i]
        layout["starts"] += (columns[reached[0]],)
        layout["lengths"].append(column - columns[reached[0]])
        for j in reached:
            begin = entries[j] + i * widths[j]
            layout["order"] += range(begin, begin + widths[j])
            layout["shift"] += [len(layout["rows"]) * padded] * widths[j]
            layout["rows"] += range(rows[j] + i * blocks[j], rows[j] + (i + 1) * blocks[j])
            layout["scales"] += [widths[j] ** (-0.5 / degrees[j])] * blocks[j]
    return layout


def _pad(x: Tensor, size: int) -> Tensor:
    return torch.nn.functional.pad(x, (0, size - x.shape[-1]))


class HierarchicalSketch:
    """Tree sketch of x^{⊗n} (Ahle et al. 2020, "Oblivious sketching of high-degree polynomial kernels").

    The n leaves are independent degree-1 SRHTs of x into width D; ⌈log₂ n⌉ levels of
    degree-2 TensorSRHT nodes S(u ⊗ v) = D^{-1/2}(Sᵤu) ⊙ (Sᵥv) merge pairs of children.  When n
    is not a power of two the tree is completed with the constant unit vector e₁ ∈ R^D
    (Ahle et al. pad with e₁^{⊗(2^L − n)}; sketching e₁ in sketch space directly adds no
    variance).  Unbiased because each node is conditionally unbiased given its children.
    """

    def __init__(self, degree: int, width: int, input_dim: int, complex_weights: bool) -> None:
        self.degree = degree
        self.width = width
        self.input_dim = input_dim
        self.complex_weights = complex_weights
        self.num_leaves = next_power_of_two(degree)
        self.leaves = [DegreeSketch(1, width, input_dim, "srht", complex_weights) for _ in range(degree)]
        levels, count = [], self.num_leaves // 2
        while count >= 1:
            levels.append([DegreeSketch(2, width, width, "srht", complex_weights) for _ in range(count)])
            count //= 2
        self.levels = levels

    def _named(self):
        for j, leaf in enumerate(self.leaves):
            yield f"leaf{j}_", leaf
        for level, nodes in enumerate(self.levels):
            for j, node in enumerate(nodes):
                yield f"node{level}_{j}_", node

    def draw(self, generator: torch.Generator, prefix: str = "", batch_shape=(),
             dtype: torch.dtype = torch.float64) -> dict[str, Tensor]:
        draws = {}
        for name, sketch in self._named():
            draws.update(sketch.draw(generator, prefix + name, batch_shape, dtype))
        return draws

    def apply(self, x: Tensor, get: Getter) -> Tensor:
        return self.apply_to([x] * self.degree, get)

    def apply_to(self, inputs: list[Tensor], get: Getter) -> Tensor:
        """Sketch of inputs[0] ⊗ … ⊗ inputs[n−1]: leaf j sketches inputs[j] (GaussianSketch, paper 003)."""

        def scoped(name: str) -> Getter:
            return lambda key: get(name + key)

        x = inputs[0]
        nodes = [leaf.apply(u, scoped(f"leaf{j}_")) for j, (leaf, u) in enumerate(zip(self.leaves, inputs))]
        if self.num_leaves > self.degree:
            unit = torch.zeros(self.width, dtype=nodes[0].dtype, device=x.device)
            unit[0] = 1
            nodes += [unit.expand_as(nodes[0])] * (self.num_leaves - self.degree)
        for level, sketches in enumerate(self.levels):
            nodes = [
                sketch.apply_to([nodes[2 * j], nodes[2 * j + 1]], scoped(f"node{level}_{j}_"))
                for j, sketch in enumerate(sketches)
            ]
        return nodes[0]

