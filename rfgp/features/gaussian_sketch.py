r"""GaussianSketch and GaussianSketchHD: truncated-Taylor sketches of the Gaussian kernel (paper 003).

Both maps target the RBF kernel of their (lengthscale-divided) input, exp(−‖u − v‖²/2).  The
paper's kernel has a FIXED bandwidth, K(z, z') = exp(−‖z − z'‖²), so the maps work on
z = (u − c)/√2, with c an optional centre: the expansions are around the origin, so the data
should be centred (the kernel is shift-invariant, the features are not).  All radii L (box,
‖z‖_∞ ≤ L) and R (ball, ‖z‖₂ ≤ R) below are in these rescaled units.

* :class:`GaussianSketch` (paper 003 Lemma 2.1, §3.1): per coordinate the s Taylor monomials
  y_z^{(j)}[t] = e^{−z_j²} √(2^t/t!) z_j^t (t < s); G(z) = T(y^{(1)} ⊗ … ⊗ y^{(d)}) with T the
  tree sketch of Ahle et al. (:class:`~rfgp.features.HierarchicalSketch`, leaf j sketches
  y^{(j)}), or the explicit s^d Kronecker features when s^d ≤ F ("Taylor features", no sketch
  variance).  Truncated kernel: K_s^GS(z, z') = e^{−‖z‖²−‖z'‖²} ∏_j e_{s−1}(2 z_j z'_j).
* :class:`GaussianSketchHD` (Lemma 2.3, §3.2): block j < s is √(2^j/j!) e^{−‖z‖²} T_j(z^{⊗j}),
  T_j a degree-j tree sketch of width m_j ∝ j (explicit z^{⊗j} when d^j ≤ m_j; block 0 is the
  scalar e^{−‖z‖²}).  Truncated kernel: K_s^HD(z, z') = e^{−‖z‖²−‖z'‖²} e_{s−1}(2⟨z, z'⟩).

e_n(w) = Σ_{t≤n} w^t/t! is the truncated exponential.  Both sketches are unbiased for K_s, and
K − K_s is PSD (sums of squares of the omitted terms), so the truncation error is one-sided and
the prior variance is under-estimated: ``has_variance_bias`` feeds k(x, x) − K_s(x, x) to the
kernels' variance correction.  Monomials are computed in float64 as (z/c)^t·exp(t log c +
½(t log 2 − log t!) − z²) with c = max(|z|, 1) (c = max(‖z‖, 1) for the HD blocks): the scaled
power stays in [−1, 1] and the exponent finite for large s and radii, and near z = 0, where c = 1,
it is the plain polynomial, so derivatives of every order are exact there too (a log|z| would
make them 0 or NaN at z = 0).

The truncation order s follows Lemmas 2.9/2.11 (:func:`truncation_order`).
"""

from __future__ import annotations

import math

import torch
from scipy.special import gammainc
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..core.config_state import LAZY, METHOD
from ..core.settings import memory_budget
from ..core.validation import (
    check_choice,
    check_features_input,
    check_finite,
    check_positive_float,
    check_positive_int,
)
from .base import FeatureMap
from .degree_sketch import HierarchicalSketch

RULES = ("exact", "paper")
MODES = ("auto", "tree", "explicit")


# --------------------------------------------------------------------------- truncation order
def truncation_bound(order: int, radius: float, input_dim: int | None = None, xi: float = 4.0,
                     rule: str = "exact") -> float:
    r"""Upper bound on wᵀ(K − K_s)w for (Σ|wᵢ|)² ≤ ξ (paper 003 Lemmas 2.9 and 2.11).

    GaussianSketch (``input_dim`` = d, box radius L): ξ d e^{2dL²} τ_s(2L²).
    GaussianSketchHD (``input_dim=None``, ball radius R): ξ e^{2R²} τ_s(2R²).
    The tail factor τ_s(η) is ``"exact"``: P(s, η) = e^{−η} Σ_{t≥s} η^t/t! (P = regularised lower
    incomplete gamma; notes I.6, tighter) or ``"paper"``: its bound (eη/s)^s (from
    Σ_{t≥s} η^t/t! ≤ e^η η^s/s! and s! ≥ (s/e)^s).  ξ = 4 for a kernel distance.
    """
    check_choice(rule, "rule", RULES)
    radius = check_positive_float(radius, "radius", allow_zero=True)
    d = 1 if input_dim is None else check_positive_int(input_dim, "input_dim")
    eta = 2 * radius**2
    log_front = math.log(xi) + math.log(d) + d * eta
    if eta == 0:
        return 0.0
    if rule == "paper":
        log_tail = order * math.log(math.e * eta / order)
    else:
        tail = float(gammainc(order, eta))
        if tail == 0.0:
            return 0.0
        log_tail = math.log(tail)
    return math.exp(min(log_front + log_tail, 700.0))


def truncation_order(radius: float, alpha: float, input_dim: int | None = None, xi: float = 4.0,
                     rule: str = "exact", max_order: int = 256) -> int:
    """Smallest s with :func:`truncation_bound` ≤ α (paper 003 Thms 3.1/3.3 with Θ(·) made explicit).

    ``radius`` is in the fixed-bandwidth units of the module doc (box L for GaussianSketch with
    ``input_dim`` = d; ball R for GaussianSketchHD with ``input_dim=None``).  The bounds only bite
    once s > 2eL² (or 2eR²): the data radius in bandwidth units drives the cost.
    """
    alpha = check_positive_float(alpha, "alpha")
    for order in range(1, max_order + 1):
        if truncation_bound(order, radius, input_dim, xi, rule) <= alpha:
            return order
    raise ValueError(
        f"no truncation order ≤ max_order={max_order} reaches alpha={alpha} for radius={radius} "
        "(rescaled units): centre the data, use a larger lengthscale or a larger alpha"
    )


# --------------------------------------------------------------------------- closed forms
def truncated_exp(w: Tensor, order: int) -> Tensor:
    """e_{s−1}(w) = Σ_{t<s} w^t/t! (s = ``order`` terms), by Horner's rule."""
    out = torch.ones_like(w)
    for t in range(order - 1, 0, -1):
        out = 1 + out * w / t
    return out


def scale_at_least_one(squared: Tensor) -> Tensor:
    """c = max(√``squared``, 1), with derivatives of every order (√ only sees values ≥ 1: no 1/0 at 0)."""
    return torch.where(squared > 1, squared, torch.ones_like(squared)).sqrt()


def taylor_monomials(z: Tensor, order: int) -> Tensor:
    """y[..., j, t] = e^{−z_j²} √(2^t/t!) z_j^t for t < s, in float64 (paper 003 Lemma 2.1).

    Evaluated as (z/c)^t·exp(t log c + ½(t log 2 − log t!) − z²), c = max(|z|, 1): no overflow for
    large s and |z|, and the plain polynomial (exact derivatives of every order) for |z| ≤ 1.
    """
    z = z.double()
    t = torch.arange(order, dtype=z.dtype, device=z.device)
    log_coeff = 0.5 * (t * math.log(2) - torch.lgamma(t + 1))
    z = z.unsqueeze(-1)
    square = z.square()
    scale = scale_at_least_one(square)
    # (z/c)^t as a running product 1, z/c, (z/c)², …: a pow's second derivative is NaN at 0 (0·0^{−1})
    ratio = z / scale
    powers = torch.cat((torch.ones_like(ratio), ratio.expand(*ratio.shape[:-1], order - 1)), dim=-1).cumprod(-1)
    return powers * (t * scale.log() + log_coeff - square).exp()


def check_center(center, input_dim: int | None, dtype: torch.dtype) -> Tensor:
    """The expansion centre c as a finite vector of ``input_dim`` entries (a scalar: one shift for every column)."""
    value = torch.as_tensor(center, dtype=dtype)
    if value.dim() > 1 or (value.dim() == 1 and input_dim is not None and value.numel() != input_dim):
        raise ValueError(f"center must be a scalar or a vector of input_dim={input_dim} entries (one per input "
                         f"column), got shape {tuple(value.shape)}")
    check_finite(value, "center")
    return value.reshape(-1)


def bounding_box_center(x: Tensor) -> Tensor:
    """The centre (low + high)/2 of the bounding box of all rows of x ``(..., n, d)``, shape ``(d,)``."""
    rows = x.reshape(-1, x.shape[-1])  # every row of every batch member: one map serves them all
    return (rows.min(0).values + rows.max(0).values) / 2


def _kron_rows(factors: list[Tensor]) -> Tensor:
    """Row-wise Kronecker product of (..., n_i) factors → (..., ∏ n_i)."""
    out = factors[0]
    for factor in factors[1:]:
        out = (out.unsqueeze(-1) * factor.unsqueeze(-2)).flatten(-2)
    return out


def _pad_features(phi: Tensor, width: int) -> Tensor:
    return torch.nn.functional.pad(phi, (0, width - phi.shape[-1]))


class _TaylorSketchBase(FeatureMap):
    """Shared input handling: centre c (buffer), rescaling z = (u − c)/√2, order from radius/alpha."""

    has_variance_bias = True
    #: ``order`` is chosen from radius and alpha at the first draw when not given (checked after them: a load of
    #: another radius names the radius the user passed, not the order it gave)
    config_fields = {"radius": METHOD, "alpha": METHOD, "rule": METHOD, "order": LAZY}
    _degree_rule_dim: bool  # whether the order rule uses the input dimension (box vs ball)

    def __init__(self, num_features, order, radius, alpha, rule, center, input_dim, seed, generator):
        if order is None and (radius is None or alpha is None):
            raise ValueError("pass either order (the truncation order s) or both radius and alpha")
        self.order = None if order is None else check_positive_int(order, "order")
        self.radius = None if radius is None else check_positive_float(radius, "radius", allow_zero=True)
        self.alpha = None if alpha is None else check_positive_float(alpha, "alpha")
        self.rule = check_choice(rule, "rule", RULES)
        if center is not None:
            center = check_center(center, input_dim, torch.float64)
            if input_dim is None:
                input_dim = center.numel()
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)
        self.register_buffer("center", center if center is not None else torch.zeros(0, dtype=torch.float64))

    @classmethod
    def for_data(cls, x: Tensor, num_features: int, alpha: float, rule: str = "exact", **kwargs):
        """A map centred on the bounding box of the rows of x (``(..., n, d)``, lengthscale units), s chosen from
        their radius."""
        check_features_input(x, "x", None)
        center = bounding_box_center(x)
        radius = cls._data_radius(x - center)
        return cls(num_features, radius=radius, alpha=alpha, rule=rule, center=center,
                   input_dim=x.shape[-1], **kwargs)

    def _choose_order(self, input_dim: int) -> int:
        if self.order is None:
            dim = input_dim if self._degree_rule_dim else None
            self.order = truncation_order(self.radius / math.sqrt(2), self.alpha, dim, rule=self.rule)
        return self.order

    def rescale(self, u: Tensor) -> Tensor:
        """z = (u − c)/√2 in float64: the fixed-bandwidth coordinates of paper 003."""
        u = u.double()
        if self.center.numel():
            u = u - self.center.to(u.device)
        return u / math.sqrt(2)

    def _float64_buffer(self, name: str) -> Tensor:
        """The sketches run in float64 with the monomials (their signs are exact in any dtype)."""
        value = getattr(self, name)
        return value.double() if value.is_floating_point() else value

    def target_diag(self, x: Tensor) -> Tensor:
        return torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)

    def expected_diag(self, x: Tensor) -> Tensor:
        return self.truncated_kernel(x.unsqueeze(-2), x.unsqueeze(-2)).squeeze(-1).squeeze(-1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, order={self.order}, radius={self.radius}, alpha={self.alpha}"


class GaussianSketch(_TaylorSketchBase):
    r"""GaussianSketch_{m,s} (paper 003 §3.1) for exp(−‖u − v‖²/2), u already divided by the lengthscale.

    Args:
        num_features: F = m, the sketch width.
        order: s, Taylor terms per coordinate; or ``None`` with ``radius`` and ``alpha``.
        radius: ‖u − c‖_∞ bound of the data in the map's input units (lengthscale units); the
            order rule uses L = radius/√2.
        alpha: target additive error of D_K² (ξ = 4).
        rule: ``"exact"`` (exact Poisson tail, tighter) or ``"paper"`` (Lemma 2.9).
        center: c, subtracted from the inputs (``None``: no shift).  See :meth:`for_data`.
        mode: ``"tree"`` (Ahle et al. sketch), ``"explicit"`` (the s^d Kronecker features,
            zero-padded to F; needs s^d ≤ F) or ``"auto"`` (explicit when s^d ≤ F).
        input_dim, seed, generator: see :class:`~rfgp.features.FeatureMap`.

    The tree has one leaf per coordinate: 2·num_leaves ≥ 2d nodes of width F per row, O(d·F log F) time and
    O(d·F) memory per row.  Rows go through it in blocks that fit :class:`rfgp.settings.memory_budget`
    (:meth:`rows_per_chunk`), each recomputed in the backward pass; at high d :class:`GaussianSketchHD` is the
    variant of choice (paper 003 §3.2).

    Example:
        >>> import torch, rfgp
        >>> from rfgp.features import GaussianSketch
        >>> g = torch.Generator().manual_seed(0)
        >>> p = torch.randn(200, 2, generator=g, dtype=torch.float64)
        >>> q = torch.randn(150, 2, generator=g, dtype=torch.float64) + 1.0
        >>> lengthscale = 1.5
        >>> phi = GaussianSketch.for_data(torch.cat([p, q]) / lengthscale, 1024, alpha=1e-4, seed=0)
        >>> d2 = rfgp.distances.kernel_distance(phi, p / lengthscale, q / lengthscale, squared=True)
        >>> exact = rfgp.distances.exact_gaussian_kernel_distance(p, q, lengthscale, squared=True)
        >>> bool(abs(d2 - exact) < 0.1 * exact)
        True
    """

    _degree_rule_dim = True
    config_fields = {"mode": METHOD}

    def __init__(self, num_features: int, order: int | None = None, radius: float | None = None,
                 alpha: float | None = None, rule: str = "exact", center=None, mode: str = "auto",
                 input_dim: int | None = None, seed: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        self.mode = check_choice(mode, "mode", MODES)
        self.explicit = None
        super().__init__(num_features, order, radius, alpha, rule, center, input_dim, seed, generator)

    @staticmethod
    def _data_radius(x: Tensor) -> float:
        return float(x.abs().max())

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        order = self._choose_order(input_dim)
        fits = order**input_dim <= self.num_features
        if self.mode == "explicit" and not fits:
            raise ValueError(
                f"mode='explicit' needs order**input_dim = {order}**{input_dim} ≤ num_features={self.num_features}"
            )
        self.explicit = self.mode == "explicit" or (self.mode == "auto" and fits)
        return {} if self.explicit else self.sketch().draw(generator)

    def sketch(self) -> HierarchicalSketch:
        """T ~ RecursiveTensorSketch_{n=s, m=F, k=d} (degree d, one leaf per coordinate)."""
        return HierarchicalSketch(self.input_dim, self.num_features, self.order, complex_weights=False)

    def _features(self, x: Tensor) -> Tensor:
        z = self.rescale(x)
        if self.explicit:
            factors = list(taylor_monomials(z, self.order).unbind(-2))  # d factors (..., n, s)
            return _pad_features(_kron_rows(factors), self.num_features).to(x.dtype)
        rows = self.rows_per_chunk()
        if rows >= z.shape[-2]:
            return self._tree_features(z).to(x.dtype)
        # the tree holds 2·num_leaves ≥ 2d nodes of width F per row: O(n·d·F) memory at once (22 GiB with its
        # autograd graph at d = 300, n = 2000, F = 1024); row blocks, each recomputed in the backward pass, keep
        # it to one block's working set plus the n × F output
        grad = torch.is_grad_enabled() and z.requires_grad
        blocks = [checkpoint(self._tree_features, block, use_reentrant=False) if grad else self._tree_features(block)
                  for block in z.split(rows, dim=-2)]
        return torch.cat(blocks, dim=-2).to(x.dtype)

    def rows_per_chunk(self) -> int:
        """Rows whose tree-sketch working set fits :class:`rfgp.settings.memory_budget`: the tree holds
        2·num_leaves nodes of width F (float64) per row, num_leaves the power of two ≥ d, and the SRHTs'
        intermediates and the backward's recomputation about as much again twice over (peak RSS measured 3.5× the
        nodes alone at d = 300, F = 1024): 8·num_leaves·F numbers per row (at least one row)."""
        row_bytes = 8 * self.sketch().num_leaves * self.num_features * 8
        return max(1, memory_budget.value() // row_bytes)

    def _tree_features(self, z: Tensor) -> Tensor:
        """T(y^{(1)} ⊗ … ⊗ y^{(d)}) of the rescaled rows z (float64)."""
        factors = list(taylor_monomials(z, self.order).unbind(-2))  # d factors (..., n, s)
        return self.sketch().apply_to(factors, self._float64_buffer)

    def truncated_kernel(self, x: Tensor, y: Tensor) -> Tensor:
        """K_s^GS(z, z') = e^{−‖z‖²−‖z'‖²} ∏_j e_{s−1}(2 z_j z'_j), shape ``(..., n, m)`` (notes I.3)."""
        z, w = self.rescale(x).unsqueeze(-2), self.rescale(y).unsqueeze(-3)
        value = (-z.square().sum(-1) - w.square().sum(-1)).exp() * truncated_exp(2 * z * w, self.order).prod(-1)
        return value.to(x.dtype)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, mode={self.mode!r}"


class GaussianSketchHD(_TaylorSketchBase):
    r"""GaussianSketchHD_{m_1..m_s, s} (paper 003 §3.2) for exp(−‖u − v‖²/2), u divided by the lengthscale.

    Block j < s sketches √(2^j/j!) e^{−‖z‖²} z^{⊗j} = √(2^j/j!) e^{−‖z‖²}c^j (z/c)^{⊗j} (c = max(‖z‖, 1);
    the scalar factor in log space) with a degree-j tree sketch of width m_j ∝ j (paper:
    m_j = O(j/ε²)), or exactly when d^j ≤ m_j.  Block 0 is the scalar e^{−‖z‖²}.  Arguments as
    :class:`GaussianSketch`; ``radius`` bounds ‖u − c‖₂ and the order rule uses R = radius/√2
    (Lemma 2.11).  The widths sum to at most F (zero-padded to F).
    """

    _degree_rule_dim = False

    def __init__(self, num_features: int, order: int | None = None, radius: float | None = None,
                 alpha: float | None = None, rule: str = "exact", center=None,
                 input_dim: int | None = None, seed: int | None = None,
                 generator: torch.Generator | None = None) -> None:
        super().__init__(num_features, order, radius, alpha, rule, center, input_dim, seed, generator)

    @staticmethod
    def _data_radius(x: Tensor) -> float:
        return float(x.norm(dim=-1).max())

    def block_widths(self) -> list[tuple[int, int, bool]]:
        """(degree j, width m_j, explicit) for j = 1..s−1; m_j ∝ j of the F − 1 columns after block 0."""
        d, budget = self.input_dim, self.num_features - 1
        pending, blocks = list(range(1, self.order)), []
        while pending and d ** pending[0] <= budget * pending[0] / sum(pending):
            j = pending.pop(0)
            blocks.append((j, d**j, True))
            budget -= d**j
        if len(pending) > budget:
            raise ValueError(
                f"num_features={self.num_features} is too small for order={self.order} in dimension {d}: "
                f"at least {self.num_features - budget + len(pending)} are needed"
            )
        total = sum(pending)
        widths = [max(1, budget * j // total) for j in pending]
        return blocks + [(j, m, False) for j, m in zip(pending, widths)]

    def _sketches(self) -> list[tuple[int, int, HierarchicalSketch | None]]:
        return [(j, m, None if explicit else HierarchicalSketch(j, m, self.input_dim, complex_weights=False))
                for j, m, explicit in self.block_widths()]

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        self._choose_order(input_dim)
        draws = {}
        for j, _, sketch in self._sketches():
            if sketch is not None:
                draws.update(sketch.draw(generator, prefix=f"degree{j}_"))
        return draws

    def _features(self, x: Tensor) -> Tensor:
        z = self.rescale(x)
        squared = z.square().sum(-1, keepdim=True)
        scale = scale_at_least_one(squared)  # c = max(‖z‖, 1): (z/c)^{⊗j} has entries in [−1, 1]
        scaled, log_scale_norm = z / scale, scale.log()
        blocks = [(-squared).exp()]
        for j, _, sketch in self._sketches():
            log_scale = 0.5 * (j * math.log(2) - math.lgamma(j + 1)) + j * log_scale_norm - squared
            if sketch is None:
                power = _kron_rows([scaled] * j)
            else:
                power = sketch.apply(scaled, lambda name, j=j: self._float64_buffer(f"degree{j}_{name}"))
            blocks.append(log_scale.exp() * power)
        return _pad_features(torch.cat(blocks, dim=-1), self.num_features).to(x.dtype)

    def truncated_kernel(self, x: Tensor, y: Tensor) -> Tensor:
        """K_s^HD(z, z') = e^{−‖z‖²−‖z'‖²} e_{s−1}(2⟨z, z'⟩), shape ``(..., n, m)`` (notes I.3)."""
        z, w = self.rescale(x), self.rescale(y)
        scale = (-z.square().sum(-1).unsqueeze(-1) - w.square().sum(-1).unsqueeze(-2)).exp()
        return (scale * truncated_exp(2 * z @ w.transpose(-1, -2), self.order)).to(x.dtype)
