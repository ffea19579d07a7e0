"""Maclaurin random features for dot-product kernels k(x, y) = s(x)s(y)Σₙaₙ(xᵀy)ⁿ (paper 000 §5).

Φ(x) = s(x)·[√a₀, √a₁ Φ₁(x), …, √a_p Φ_p(x)] with independent unbiased degree-n sketches Φₙ
of width Dₙ (:class:`~rfgp.features.DegreeSketch`; any projection and real, complex or CtR
weights — complex blocks are output as [Re Φₙ, Im Φₙ], so Φ(x)ᵀΦ(y) = Re k̂).  Then

    E[Φ(x)ᵀΦ(y)] = s(x)s(y) Σ_{n ≤ p, Dₙ>0 or n=0} aₙ(xᵀy)ⁿ          (Algorithm 4, Eq. 48).

* :class:`OptimizedMaclaurin`: (p*, Dₙ) chosen by Algorithms 2–3 on a data sample
  (:mod:`~rfgp.features.maclaurin_allocation`) — biased by the truncation, which
  :meth:`expected_diag` reports so that the kernels correct the posterior variance (§5.6).
* :class:`RandomMaclaurin`: Kar & Karnick (2012): the degrees of the D features are drawn
  from μ(n) ∝ 2^{−(n+1)} on {1..p} and block n is scaled by √(Dₙ/(Dμ(n))) (Eqs. 40–43);
  unbiased for kernels of degree ≤ p.

The constant √a₀ (times s(x)) is one deterministic real column counted in ``num_features``
(paper 000 §5.6: "one feature is always allocated to the degree n = 0").
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.config_state import DRAW, METHOD
from ..core.dtypes import device_constant, refuse_autocast_backward
from ..core.locks import init_lock, untraced_build
from ..core.validation import check_choice, check_features_input, check_positive_float, check_positive_int
from . import dot_product
from .base import FeatureMap
from .degree_sketch import PROJECTIONS, SRHT_BLOCKS, DegreeSketch, srht_of_degrees
from .dot_product import DotProductKernelSpec, degree_terms
from .maclaurin_allocation import AUTO_MAX_ORDER, AllocationObjective, extended_allocation, random_degrees, total_width
from .polynomial import WEIGHTS

#: projections the allocation has closed-form variances for
ALLOCATION_PROJECTIONS = ("rademacher", "gaussian", "srht")

#: at most this many input rows go through :func:`~rfgp.features.degree_sketch.srht_of_degrees` (all TensorSRHT
#: degrees in one transform and one product, a fixed ~20 ops: 2–5× faster than one sketch per degree at N ≤ 500);
#: more rows go degree by degree, whose smaller temporaries stay in cache (one thread, F = 255, p = 7–10, value and
#: gradient: about equal at 1 000 rows, the batched path 10–30 % slower at 1 700–4 000 rows)
BATCHED_DEGREES_MAX_ROWS = 1024


def regularized_upper_gamma(a: float, t: Tensor) -> Tensor:
    """Q(a, t) = Γ(a, t)/Γ(a) (``torch.special.gammaincc``), differentiable in ``t`` in reverse and forward mode.

    ``gammaincc`` has no forward-mode derivative in PyTorch ("Trying to use forward AD with igammac"), so a
    forward-over-reverse Hessian (``torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")``)
    of a bias-corrected Maclaurin posterior failed there; :class:`_RegularizedUpperGamma` adds it.
    """
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function
        return torch.special.gammaincc(t.new_full((), a), t)
    return _RegularizedUpperGamma.apply(t, a)


class _RegularizedUpperGamma(torch.autograd.Function):
    """Q(a, t) for a fixed ``a``; ∂Q/∂t = −t^{a−1}e^{−t}/Γ(a) in both modes (PyTorch's own igammac backward formula),
    as plain ops: differentiable again (Hessians), and the generated vmap rule serves batched tangents."""

    generate_vmap_rule = True

    @staticmethod
    def forward(t: Tensor, a: float) -> Tensor:
        return torch.special.gammaincc(t.new_full((), a), t)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        t, ctx.a = inputs
        ctx.save_for_backward(t)
        ctx.save_for_forward(t)

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad: Tensor):
        return grad * _upper_gamma_derivative(*ctx.saved_tensors, ctx.a), None

    @staticmethod
    def jvp(ctx, tangent: Tensor, _a_tangent: None) -> Tensor:
        return tangent * _upper_gamma_derivative(*ctx.saved_tensors, ctx.a)


def _upper_gamma_derivative(t: Tensor, a: float) -> Tensor:
    """−t^{a−1}e^{−t}/Γ(a) for t ≥ 0: as a power below t = 1 (PyTorch's exp((a − 1)·log t − …) has NaN derivatives
    at t = 0, the Hessian of a bias-corrected posterior variance at x = 0), in log space above (no overflow)."""
    small = t < 1
    log_scale = -t - math.lgamma(a)
    near = torch.where(small, t, 0.0).pow(a - 1) * log_scale.exp()
    far = ((a - 1) * torch.where(small, 1.0, t).log() + log_scale).exp()
    return -torch.where(small, near, far)


class _MaclaurinFeatures(FeatureMap):
    """Shared feature computation: the constant, the per-degree sketch blocks and the diagonal moments.

    Saved configuration: the target kernel's family (``kernel``; for the polynomial kernel
    without its offset ν, which :func:`~rfgp.kernels.refit_allocation` may change and which is
    saved as ``kernel_offset``; a spec from :func:`~rfgp.features.dot_product.from_coefficients` is saved as
    ``"custom"`` with its coefficients log aₙ up to its degree, or to ``AUTO_MAX_ORDER`` for an infinite series, as
    ``kernel_coefficients``), the sketch options, the allocation ``widths`` (D₁..D_p) and the
    ``num_features`` the map was built with (``requested_num_features``: the saved width ``num_features`` drops an
    unusable column, so a load error reports the argument the user passed).
    """

    config_fields = {"kernel": METHOD, "projection": METHOD, "weights": METHOD, "srht_blocks": METHOD,
                     "bias_correction": METHOD, "kernel_coefficients": METHOD, "kernel_offset": DRAW, "widths": DRAW,
                     "requested_num_features": DRAW}
    optional_config_fields = frozenset({"requested_num_features", "kernel_coefficients"})

    def __init__(self, kernel, num_features, input_dim, projection, weights, srht_blocks, bias_correction,
                 seed, generator, projections=PROJECTIONS) -> None:
        if not isinstance(kernel, DotProductKernelSpec):
            raise TypeError(f"kernel must be a rfgp.features.dot_product.DotProductKernelSpec, got {type(kernel).__name__}")
        if not isinstance(bias_correction, bool):
            raise TypeError(f"bias_correction must be True or False, got {bias_correction!r}")
        self.kernel = kernel
        self.projection = check_choice(projection, "projection", projections)
        self.weights = check_choice(weights, "weights", WEIGHTS)
        self.srht_blocks = check_choice(srht_blocks, "srht_blocks", SRHT_BLOCKS)
        self.bias_correction = bias_correction
        self.has_constant = bool(kernel.coefficients(0)[0] > 0)
        self.requested_num_features = check_positive_int(num_features, "num_features")
        self.total_width = total_width(num_features, self.has_constant, self.is_complex)
        if self.total_width < 1:
            raise ValueError(f"num_features={num_features} leaves no feature for the sketches (weights={weights!r})")
        self.widths: tuple[int, ...] | None = None  # (D₁, …, D_p)
        super().__init__(self._output_width(), input_dim=input_dim, seed=seed, generator=generator)

    @property
    def is_complex(self) -> bool:
        return self.weights != "real"

    def _output_width(self) -> int:
        return self.has_constant + (2 if self.is_complex else 1) * self.total_width

    @property
    def order(self) -> int | None:
        """The truncation order p (the last degree with a feature)."""
        if self.widths is None:
            return None
        return max((n for n, width in enumerate(self.widths, start=1) if width > 0), default=0)

    @property
    def has_variance_bias(self) -> bool:
        return self.bias_correction

    def _blocks(self):
        return [(n, width) for n, width in enumerate(self.widths or (), start=1) if width > 0]

    def complex_layout(self) -> Tensor:
        """Output columns holding [Re Φ_C, Im Φ_C] (F = ``num_features`` marks a zero), length 2m.

        The output is [constant, Re Φ₁, Im Φ₁, Re Φ₂, Im Φ₂, …]; the real constant is a complex
        feature with zero imaginary part (paper 000 App. D treats real features as complex ones).
        """
        if not self.is_complex:
            raise ValueError(f"complex_layout needs weights='complex' or 'ctr', this map has weights={self.weights!r}")
        if self.widths is None:
            raise RuntimeError("the Maclaurin allocation is not fitted yet: call the map on data first")
        real, imag = ([0], [self.num_features]) if self.has_constant else ([], [])
        start = int(self.has_constant)
        for _, width in self._blocks():
            real.extend(range(start, start + width))
            imag.extend(range(start + width, start + 2 * width))
            start += 2 * width
        return torch.tensor(real + imag)

    def _sketch(self, degree: int, width: int) -> DegreeSketch:
        return DegreeSketch(degree, width, self.input_dim, self.projection, self.is_complex, self.srht_blocks)

    def _draw_sketches(self, generator: torch.Generator) -> dict[str, Tensor]:
        draws = {}
        for n, width in self._blocks():
            draws.update(self._sketch(n, width).draw(generator, prefix=f"degree{n}_", dtype=self._anchor.dtype))
        return draws

    def _block_scales(self) -> Tensor:
        """Extra scale of block n (1 for the optimized map; √(Dₙ/(Dμ(n))) for Random Maclaurin)."""
        return torch.ones(len(self.widths or ()), dtype=torch.float64)

    def _sqrt_coefficients(self, like: Tensor, offset: Tensor | None) -> Tensor:
        """√aₙ for n = 0..p, shape ``(p + 1,)`` or ``(*offset.shape[:-1], p + 1)`` for a tensor offset ν."""
        order = len(self.widths)
        if offset is None:
            # kept on the spec: fit(kernel=...) and a loaded kernel_offset replace it (a key on the map kept √aₙ of
            # the old offset at the same order)
            return device_constant(self.kernel, ("sqrt_coefficients", order),
                                   lambda: (0.5 * self.kernel.log_coefficients(order)).exp(), like)
        # polynomial kernel with a learnable offset: √aₙ = √C(p, n)·ν^{(p−n)/2} (Eq. 37), differentiable in ν
        power = getattr(self.kernel, "power", None)
        if power is None:
            raise ValueError(f"offset is only accepted for the polynomial kernel, this map targets {self.kernel.name}")
        n = torch.arange(order + 1, dtype=like.dtype, device=like.device)
        binomial = device_constant(self, ("binomial", power, order), lambda: torch.tensor(
            [math.comb(power, k) if k <= power else 0 for k in range(order + 1)], dtype=torch.float64), like)
        exponent = ((power - n) / 2).clamp_min(0)
        return binomial.sqrt() * offset.to(like).pow(exponent)

    def forward(self, x: Tensor, offset: Tensor | None = None) -> Tensor:
        """Φ(x), shape ``(..., n, num_features)``; ``offset`` overrides ν of a polynomial kernel (tensor)."""
        self._prepare(x)
        return self._features(x, offset)

    def _features(self, x: Tensor, offset: Tensor | None = None) -> Tensor:
        roots = self._sqrt_coefficients(x, offset)
        scales = device_constant(self, ("block_scales", self.widths, self.total_width), self._block_scales, x)
        # √aₙ times the block scale, per output column of the sketches (the constant column apart)
        degrees = device_constant(self, ("column_degrees", self.widths, self.is_complex), self._column_degrees,
                                  self._anchor.new_empty((), dtype=torch.long))
        factors = (roots[..., 1:] * scales).index_select(-1, degrees.to(x.device)).unsqueeze(-2)
        parts = [self._sketch_columns(x) * factors]
        if self.has_constant:
            parts.insert(0, x.new_ones(*x.shape[:-1], 1) * roots[..., :1].unsqueeze(-2))
        if len({p.shape[:-1] for p in parts}) > 1:
            shape = torch.broadcast_shapes(*(p.shape[:-1] for p in parts))
            parts = [p.expand(*shape, p.shape[-1]) for p in parts]
        features = torch.cat(parts, dim=-1)
        if self.kernel.has_prefactor:
            features = features * self.kernel.log_prefactor(x).exp().unsqueeze(-1)
        return features

    def _column_degrees(self) -> Tensor:
        """n − 1 for every output column of the sketches (two per complex feature)."""
        copies = 2 if self.is_complex else 1
        return torch.tensor([n - 1 for n, width in self._blocks() for _ in range(copies * width)])

    def _sketch_columns(self, x: Tensor) -> Tensor:
        """[Φ₁(x), Φ₂(x), …] of the degrees with a feature, unscaled; complex blocks as [Re Φₙ, Im Φₙ]."""
        blocks = self._blocks()
        sketches = [self._sketch(n, width) for n, width in blocks]
        gets = [lambda name, n=n: self._buffer(f"degree{n}_{name}", like=x) for n, _ in blocks]
        if self.projection == "srht" and x.shape[:-1].numel() <= BATCHED_DEGREES_MAX_ROWS:
            phi = srht_of_degrees(x, sketches, gets, self)
            if not phi.is_complex():
                return phi
            interleaved = device_constant(self, ("complex_columns", self.widths), self._complex_columns,
                                          self._anchor.new_empty((), dtype=torch.long))
            return torch.view_as_real(phi).flatten(-2).index_select(-1, interleaved.to(x.device))
        parts = [sketch.apply(x, get) for sketch, get in zip(sketches, gets)]
        return torch.cat([torch.cat((p.real, p.imag), dim=-1) if p.is_complex() else p for p in parts], dim=-1)

    def _complex_columns(self) -> Tensor:
        """Positions of [Re Φ₁, Im Φ₁, Re Φ₂, …] in the interleaved (Re, Im) pairs of [Φ₁, Φ₂, …]."""
        columns, start = [], 0
        for _, width in self._blocks():
            columns += [2 * (start + j) for j in range(width)] + [2 * (start + j) + 1 for j in range(width)]
            start += width
        return torch.tensor(columns)

    # ------------------------------------------------------- bias correction
    def target_diag(self, x: Tensor) -> Tensor:
        return self.kernel.diag(x)

    def expected_diag(self, x: Tensor) -> Tensor:
        """E[Φ(x)ᵀΦ(x)] = s(x)² Σ_{n ∈ {0} ∪ {n: Dₙ>0}} aₙ‖x‖²ⁿ (Eq. 48 at y = x).

        For the Gaussian kernel with every degree ≤ p present this is Q(p+1, ‖x‖²) (regularised
        upper incomplete gamma), so k(x, x) − E k̂(x, x) = P(p+1, ‖x‖²) without cancellation (§5.6).
        """
        order = len(self.widths)
        t = x.pow(2).sum(-1)
        if self.kernel.name == "gaussian":
            missing = [n for n, width in enumerate(self.widths, start=1) if width == 0]
            value = regularized_upper_gamma(order + 1.0, t)
            if missing:
                value = value - degree_terms(self.kernel, t, order, log_scale=-t)[..., missing].sum(-1)
            return value
        terms = degree_terms(self.kernel, t, order, log_scale=2 * self.kernel.log_prefactor(x))
        return terms[..., self.expected_degrees()].sum(-1)

    def expected_degrees(self) -> list[int]:
        """The degrees n whose terms aₙ‖x‖²ⁿ make up E[Φ(x)ᵀΦ(x)]: the constant and those with features."""
        return [0] + [n for n, _ in self._blocks()]

    def variance_correction(self, x: Tensor) -> Tensor:
        """k(x, x) − E[Φ(x)ᵀΦ(x)] ≥ 0 (for the Gaussian kernel P(p+1, ‖x‖²) minus omitted inner degrees)."""
        return (self.target_diag(x) - self.expected_diag(x)).clamp_min(0.0)

    # ------------------------------------------------------------- state dict
    def _config_value(self, name: str):
        power = getattr(self.kernel, "power", None)
        if name == "kernel":
            return self.kernel.name if power is None else f"polynomial(p={power})"
        if name == "kernel_offset":
            return None if power is None else self.kernel.offset
        if name == "kernel_coefficients":  # every spec of from_coefficients is named "custom"
            if self.kernel.name != "custom":
                return None
            return self.kernel.log_coefficients(AUTO_MAX_ORDER if self.kernel.max_degree is None
                                                else self.kernel.max_degree)
        return super()._config_value(name)

    def _adopt_config(self, values: dict) -> None:
        offset = values.pop("kernel_offset", None)
        if offset is not None:
            self.kernel = dot_product.polynomial(self.kernel.power, offset)
        if values.get("widths") is not None:
            values["widths"] = tuple(values["widths"])
        super()._adopt_config(values)

    def _reported_config(self, name: str, values: dict):
        if name == "num_features" and values.get("requested_num_features") is not None:
            return values["requested_num_features"]
        if name == "kernel_coefficients" and torch.is_tensor(values[name]):
            coefficients = values[name].exp().tolist()
            shown = ", ".join(f"{value:.6g}" for value in coefficients[:6])
            return f"a_0..a_{len(coefficients) - 1} = {shown}{', ...' if len(coefficients) > 6 else ''}"
        return super()._reported_config(name, values)

    def _legacy_config(self, extra: dict) -> dict:
        config = super()._legacy_config(extra)
        if config.get("widths") is not None:
            config["widths"] = tuple(config["widths"])
        return config

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, kernel={self.kernel.name}, widths={self.widths}, projection={self.projection!r}"


class OptimizedMaclaurin(_MaclaurinFeatures):
    r"""Optimized Maclaurin features (paper 000 Algorithms 2–4) for a dot-product kernel.

    Args:
        kernel: a :class:`~rfgp.features.dot_product.DotProductKernelSpec` (``dot_product.gaussian()``, …).
        num_features: real output width budget F: one constant column (when a₀ > 0) plus
            D_total sketch features (two real columns each for complex/CtR weights; an
            unusable odd column is dropped, ``num_features`` reports the real width).
        input_dim: d (``None``: at the first call).
        projection: ``"srht"`` (default: TensorSRHT, with the Appendix C surrogate in the
            allocation), ``"rademacher"`` or ``"gaussian"``.
        weights: ``"ctr"`` (default; objective: real-part variance ½(V + P), paper 001),
            ``"real"`` or ``"complex"`` (objective: complex variance).  The defaults are the
            most accurate sketch measured (``benchmarks/maclaurin_defaults.py``, Gram relative
            Frobenius error of the Gaussian kernel at F = 512, 1 000 points, 4 seeds): TensorSRHT
            + CtR 0.0107 / 0.0146 / 0.0095 on digits / breast_cancer / diabetes, against 0.0299 /
            0.0355 / 0.0299 for Rademacher real weights (the former default) and 0.045 / 0.046 /
            0.038 for RFF (0.064 / 0.066 / 0.062 for scikit-learn's ``RBFSampler``); TensorSRHT
            real weights are within the standard error on digits and 1.1–1.2× worse elsewhere.
            At half that lengthscale: 0.124 / 0.100 / 0.113 against 0.165 / 0.161 / 0.171
            (Rademacher real) and 0.205 / 0.137 / 0.158 (RFF); TensorSRHT real is 4 % better on
            digits only.  For the polynomial kernel (x̃ᵀỹ)³ TensorSRHT + CtR is best or tied as well.  An odd ``num_features`` is used in full; an even one leaves one
            column unused (one constant column plus pairs), reported by ``num_features``.
        min_order, max_order: the search range [p_min, p_max] of Algorithm 3 (default p_max = 10, the paper's).
            ``max_order=None``: no fixed p_max, the search runs upward until no higher order can lower the
            objective g (at most ``AUTO_MAX_ORDER`` = 60;
            :func:`~rfgp.features.maclaurin_allocation.extended_allocation`).
            In high dimension this ends near 10 with the same allocation; in low dimension, where a few features make
            a degree exact and extra width buys nothing, it raises the order instead: the Gaussian kernel on 1-D
            standard-normal inputs (ℓ = 1, 500 points) has Gram relative error 3.9·10⁻³ at every F = 64…4096 with
            p_max = 10 (widths (2, …, 2, 1005) at F = 2048 before the rule below), 5·10⁻⁸ at F = 64 and ≤ 6·10⁻¹¹
            from F = 256 with the automatic search (orders 31–41).  The search also stops once g is below what float64
            resolves (``RESOLUTION`` = ε² of the objective's scale), and width whose gain is below that goes to
            degree 1, the cheapest (round-off had pulled it onto high degrees).  Its cost there: on a 1-D sample of
            2 000 standard-normal points at F = 2049 (one thread, float64, a loaded shared machine) the search ends at
            order 37 (before: 60) in 55 s against 18 s for p_max = 10 (before, unloaded: 16.2 s against 1.4 s), Gram
            error 8·10⁻¹¹ against 3.8·10⁻³, and features of 10⁴ points take 0.69 s against 0.35 s (F = 256: order 36,
            81 s against 26 s, features 0.40 s against 0.05 s); at d = 2, 3, 4 it ends at the capped order with the
            same widths, error and times.  The remaining fit cost is the per-degree pair statistics.  Not the default
            for that cost.
        widths: a fixed allocation (D₁, …, D_p) instead of the search (Σ Dₙ = D_total).
        x_sample: the data sample for the allocation; ``None`` fits on the first call's
            inputs.  :meth:`fit` refits (e.g. after the lengthscale changed).
        sample_size: at most this many rows of the sample are used (O(m²) statistics).
            (``min_order``, ``max_order`` and ``sample_size`` are saved and checked on load; the
            fitted ``widths`` and ``objective`` are adopted, and so is a saved fixed ``max_order`` by a map
            built with ``max_order=None``: it keeps that cap for later refits.  ``min_share`` is saved and checked
            too; a state saved before it was does not carry it and loads into a map of any ``min_share``.)
        bias_correction: report k(x, x) − E k̂(x, x) to the kernels' posterior variance (§5.6).
        min_share: :meth:`fit` raises a ``ValueError`` when the fitted map carries less than this share
            E k̂(x, x)/k(x, x) of the kernel at the median sample point (0, the default, never raises;
            :class:`~rfgp.kernels.MaclaurinRBFKernel`, :class:`~rfgp.kernels.SketchedExponentialKernel` and
            ``SketchedPolynomialKernel(method="maclaurin")`` set float32's ε: an RBF map whose features are
            numerically zero cannot be trained, and an exponential or polynomial map that leaves out nearly all of
            k(x, x) trains another kernel).
        seed, generator: randomness of the sketches (and of the subsample).

    Attributes:
        order: p*; ``widths``: (D₁..D_p*); ``objective``: g(p*, D*) on the fitted sample.

    Example:
        >>> import torch
        >>> from rfgp.features import OptimizedMaclaurin, dot_product
        >>> x = torch.rand(100, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
        >>> lengthscale = 1.0
        >>> phi = OptimizedMaclaurin(dot_product.gaussian(), 65, projection="srht", weights="ctr", seed=0)
        >>> phi = phi.fit(x / lengthscale)               # truncation order and widths for this data
        >>> k_hat = phi(x / lengthscale) @ phi(x[:10] / lengthscale).T
        >>> k_hat.shape
        torch.Size([100, 10])
    """

    config_fields = {"min_order": METHOD, "max_order": METHOD, "sample_size": METHOD, "objective": DRAW,
                     "min_share": METHOD}
    optional_config_fields = _MaclaurinFeatures.optional_config_fields | {"min_share"}

    def __init__(
        self,
        kernel: DotProductKernelSpec,
        num_features: int,
        input_dim: int | None = None,
        projection: str = "srht",
        weights: str = "ctr",
        srht_blocks: str = "tiled",
        min_order: int = 1,
        max_order: int | None = 10,
        widths: tuple[int, ...] | None = None,
        x_sample: Tensor | None = None,
        sample_size: int = 500,
        bias_correction: bool = True,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        min_share: float = 0.0,
    ) -> None:
        self.min_share = check_positive_float(min_share, "min_share", allow_zero=True)
        self.min_order = check_positive_int(min_order, "min_order")
        self.max_order = None if max_order is None else check_positive_int(max_order, "max_order")
        if self.max_order is not None and self.max_order < self.min_order:
            raise ValueError(f"max_order must be ≥ min_order={min_order} (or None), got {max_order}")
        if self.max_order is None and self.min_order > AUTO_MAX_ORDER:
            raise ValueError(f"min_order must be ≤ {AUTO_MAX_ORDER} with max_order=None, got {min_order}")
        self.sample_size = check_positive_int(sample_size, "sample_size")
        self.objective = None
        super().__init__(kernel, num_features, None, projection, weights, srht_blocks, bias_correction, seed,
                         generator, projections=ALLOCATION_PROJECTIONS)
        if widths is not None:
            self.set_widths(widths)
        if input_dim is not None:
            self.input_dim = check_positive_int(input_dim, "input_dim")
            self._materialize()
        if x_sample is not None:
            self.fit(x_sample)

    def set_widths(self, widths) -> OptimizedMaclaurin:
        """Use a fixed allocation (D₁, …, D_p) (Σ Dₙ must equal D_total; Dₙ = 0 skips degree n)."""
        widths = tuple(int(w) for w in widths)
        if not widths or any(w < 0 for w in widths) or sum(widths) != self.total_width:
            raise ValueError(
                f"widths must be non-negative integers summing to D_total={self.total_width}, got {widths}"
            )
        self.widths = widths
        if self.input_dim is not None:
            self._materialize()
        return self

    @untraced_build
    def fit(self, x_sample: Tensor, kernel: DotProductKernelSpec | None = None) -> OptimizedMaclaurin:
        """Recompute (p*, D*) by Algorithm 3 on ``x_sample`` (as the map sees it: divided by ℓ), then redraw.

        ``kernel`` replaces the target (e.g. a polynomial spec with the current offset).
        """
        if not torch.is_tensor(x_sample) or x_sample.dim() < 2 or x_sample.shape[-2] < 2:
            shape = tuple(x_sample.shape) if torch.is_tensor(x_sample) else type(x_sample).__name__
            raise ValueError(f"x_sample must be a tensor of shape (..., m, d) with m ≥ 2, got {shape}")
        check_features_input(x_sample, "x_sample", self.input_dim)
        if kernel is not None and not isinstance(kernel, DotProductKernelSpec):
            raise TypeError(f"kernel must be a DotProductKernelSpec, got {type(kernel).__name__}")
        kept, self.kernel = self.kernel, kernel if kernel is not None else self.kernel
        try:
            x, result = self._allocate(x_sample)
            widths = tuple(result.widths[: result.order])
            if self.min_share > 0:
                self._check_share(x, widths)  # before the map changes: a refused refit leaves it as it was
        except BaseException:
            # the target too: left replaced, it gave the features (√aₙ, offset=None) its coefficients on the old widths
            self.kernel = kept
            raise
        self.objective = result.objective
        self.input_dim = x.shape[-1]
        return self.set_widths(widths)

    def _allocate(self, x_sample: Tensor):
        """(the float64 CPU subsample, Algorithm 3's result) for ``x_sample``; the map is not changed."""
        x = x_sample.detach().reshape(-1, x_sample.shape[-1]).to("cpu", torch.float64)
        if self.input_dim is not None and x.shape[-1] != self.input_dim:
            raise ValueError(f"x_sample has {x.shape[-1]} columns, the map has input_dim={self.input_dim}")
        if x.shape[0] > self.sample_size:
            generator = torch.Generator().manual_seed(self.seed)
            x = x[torch.randperm(x.shape[0], generator=generator)[: self.sample_size]]
        objective = AllocationObjective(self.kernel, x, self.order_limit, self.projection, self.weights,
                                        self.srht_blocks)
        return x, extended_allocation(objective, self.min_order, self.max_order, self.total_width)

    @property
    def order_limit(self) -> int:
        """The highest order :meth:`fit` may choose: ``max_order``, or ``AUTO_MAX_ORDER`` for the automatic search."""
        return AUTO_MAX_ORDER if self.max_order is None else self.max_order

    @property
    def order_option(self) -> str:
        """The option that raises the truncation order: ``max_order`` (the cap), or ``min_order`` for the automatic
        search, which stops where the objective over pairs of distinct points (k(x, x) is not among them) stops
        improving."""
        return "min_order" if self.max_order is None else "max_order"

    def _checked_adoptions(self, saved: dict, prefix: str) -> dict:
        """A state saved with a fixed ``max_order`` (before the automatic search, 10 by default) loads into a map
        with ``max_order=None`` and keeps its cap for later refits; any other difference raises as usual."""
        if self.max_order is None and isinstance(saved.get("max_order"), int):
            cap = saved["max_order"]
            adopt = super()._checked_adoptions({k: v for k, v in saved.items() if k != "max_order"}, prefix)
            return {**adopt, "max_order": cap}
        return super()._checked_adoptions(saved, prefix)

    def carried_share(self, x: Tensor, refit: bool = False, kernel: DotProductKernelSpec | None = None) -> Tensor:
        """E k̂(x, x)/k(x, x) per row of ``x`` (as the map sees it, divided by ℓ; 1 where k(x, x) = 0), in float64.

        ``refit``: the share of the allocation :meth:`fit` would choose on ``x`` instead of the current one;
        ``kernel``: another target (a polynomial spec with the current offset).  The map is not changed.
        """
        if self.widths is None and not refit:
            raise RuntimeError("the Maclaurin allocation is not fitted yet: call the map on data first")
        x = x.detach().reshape(-1, x.shape[-1]).to("cpu", torch.float64)
        kept = self.kernel
        try:
            self.kernel = kernel if kernel is not None else self.kernel
            widths = self.widths
            if refit:
                result = self._allocate(x)[1]
                widths = tuple(result.widths[: result.order])
            share, positive = self._share_at(x, widths)
        finally:
            self.kernel = kept
        return torch.where(positive, share, torch.ones_like(share)).nan_to_num(0.0)

    def _share_at(self, x: Tensor, widths: tuple[int, ...]) -> tuple[Tensor, Tensor]:
        """(E k̂(x, x)/k(x, x), k(x, x) > 0) per row of the float64 ``x`` for the allocation ``widths`` in place of
        the map's own (``expected_diag`` reads the widths only); the map is not changed."""
        kept, self.widths = self.widths, widths
        try:
            target = self.target_diag(x)
            return self.expected_diag(x) / target, target > 0
        finally:
            self.widths = kept

    def _check_share(self, x: Tensor, widths: tuple[int, ...]) -> None:
        """Raise when E k̂(x, x)/k(x, x) at the median point of the (float64, CPU) sample is below ``min_share``.

        For the Gaussian and exponential kernels the share is the Poisson probability P(n ≤ p) at mean ‖x‖²/ℓ²: on 26
        standardised columns at GPyTorch's initial lengthscale (‖x‖²/ℓ² ≈ 45) order 10 carries 4·10⁻¹⁰ of the
        kernel, the marginal likelihood is flat in the lengthscale, and fit_mll "converged" at the mean
        prediction (diamonds: test RMSE 1.02 against 0.19 for the exact GP).
        """
        shares, positive = self._share_at(x, widths)
        if not bool(positive.any()):
            return
        share = float(shares[positive].median())
        if share < self.min_share:
            norm = float(x.pow(2).sum(-1).median())
            raise ValueError(
                f"the optimized Maclaurin map of the {self.kernel.name} kernel (order {len(widths)} ≤ "
                f"max_order={self.order_limit}, {self.num_features} features) carries a share {share:.2g} of k(x, x) "
                f"at the median sample point (‖x‖²/ℓ² = {norm:.3g} there), below min_share={self.min_share:.2g}: "
                f"{self._share_advice()}"
            )

    def _share_advice(self) -> str:
        """What a map that carries almost nothing of k(x, x) means for this kernel family, and what to do."""
        if self.kernel.name == "gaussian":
            return ("its features are numerically zero and the marginal likelihood is flat in the lengthscale. Start "
                    "from a larger lengthscale (‖x‖²/ℓ² of a few units; standardise the inputs), raise "
                    f"{self.order_option}, or use method='rff', 'orf' or 'sorf'")
        dropped = ("the degrees it leaves out hold the rest, so it trains a different kernel, and the bias-corrected "
                   "posterior variance adds them back as prior variance that no data informs")
        power = getattr(self.kernel, "power", None)
        if power is not None:
            return (f"{dropped}. Pass min_order={power} (every degree ≤ {power} sketched: the exact expansion), use a "
                    "larger lengthscale or offset (standardise the inputs), or method='sketch'")
        return (f"{dropped}. Start from a larger lengthscale (‖x‖²/ℓ² of a few units; standardise the inputs) or "
                f"raise {self.order_option}")

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        return self._draw_sketches(generator)

    @property
    def fits_on_first_input(self) -> bool:
        return self.widths is None

    def _prepare(self, x: Tensor) -> None:
        """Validate ``x``; at the first call, draw and allocate on it (under the map's
        :func:`~rfgp.core.locks.init_lock`: a thread that came during another's allocation found the widths set
        before the sketches were drawn for them, or allocated a second time)."""
        if self.widths is not None and self.is_initialized:
            super()._prepare(x)
            return
        with init_lock(self):
            super()._prepare(x)
            if self.widths is None:
                if x.shape[-2] < 2:  # fit's own message would name an x_sample the caller never passed
                    raise ValueError(
                        f"the optimized Maclaurin map allocates its features to degrees (Algorithm 3) on the inputs of "
                        f"its first call, which needs m ≥ 2 rows; the first call had x of shape {tuple(x.shape)}. "
                        "Make the first call on the training inputs, or allocate beforehand: rfgp.sketch(kernel, F, "
                        "method='maclaurin', x_sample=train_x), or feature_map.fit(train_x / lengthscale)"
                    )
                with torch.inference_mode(False):  # the draws stay usable by training (FeatureMap._draw_at_first_call)
                    self.fit(x)  # no sample given: allocate on the first inputs


class RandomMaclaurin(_MaclaurinFeatures):
    r"""Random Maclaurin features (Kar & Karnick 2012; paper 000 §5.2, Eqs. 40–43).

    The degrees of the D_total features are drawn i.i.d. from μ(n) = 2^{−(n+1)}/(½ − 2^{−(p+1)})
    on {1..p} (paper 000 footnote 15), Dₙ = #{j: nⱼ = n}; block n is √(aₙDₙ/(D_total μ(n)))Φₙ
    and the constant √a₀ is appended deterministically.  Unbiased for kernels of degree ≤ p;
    for infinite series the degrees above p are omitted (reported by :meth:`expected_diag`).

    Args: as :class:`OptimizedMaclaurin`, with ``max_order`` = p (default: the kernel's degree,
    or 10) and any projection of :class:`~rfgp.features.DegreeSketch` (default Rademacher).
    """

    config_fields = {"max_order": METHOD}

    def __init__(
        self,
        kernel: DotProductKernelSpec,
        num_features: int,
        input_dim: int | None = None,
        projection: str = "rademacher",
        weights: str = "real",
        srht_blocks: str = "tiled",
        max_order: int | None = None,
        bias_correction: bool = True,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if max_order is None:
            max_order = kernel.max_degree if getattr(kernel, "max_degree", None) else 10
        self.max_order = check_positive_int(max_order, "max_order")
        super().__init__(kernel, num_features, input_dim, projection, weights, srht_blocks, bias_correction,
                         seed, generator)

    def _draw_degrees(self, generator: torch.Generator) -> None:
        """The widths Dₙ = #{j: nⱼ = n} of D_total degrees nⱼ ∼ μ, and μ itself (for the block scales)."""
        counts, self._probabilities = random_degrees(self.total_width, self.max_order, generator)
        self.widths = tuple(int(c) for c in counts)

    def _materialize(self) -> None:
        self._draw_degrees(torch.Generator().manual_seed(self.seed))  # the widths size the draws' memory check
        super()._materialize()

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        """The degrees (the same as :meth:`_materialize`'s), then the sketches from the rest of the same stream.

        The two stages must be independent (Eq. 43).  The sketches were drawn from a second generator of the same
        seed, i.e. from the very random numbers that had chosen the degrees: over seeds, E k̂ of (0.5 + xᵀy)³ with
        Gaussian projections was 0.062 where k = 0.149 (D_total = 4, z = −9 over 6·10⁴ seeds).
        """
        self._draw_degrees(generator)
        return self._draw_sketches(generator)

    def _block_scales(self) -> Tensor:
        counts = torch.tensor(self.widths, dtype=torch.float64)
        return (counts / (self.total_width * self._probabilities)).sqrt()

    def expected_degrees(self) -> list[int]:
        """The degrees n whose terms aₙ‖x‖²ⁿ make up E[Φ(x)ᵀΦ(x)]: every n ≤ p has positive probability."""
        return list(range(self.max_order + 1))

    def expected_diag(self, x: Tensor) -> Tensor:
        """E over degrees and sketches: s(x)² Σ_{n ≤ p} aₙ‖x‖²ⁿ (every degree ≤ p has positive probability)."""
        t = x.pow(2).sum(-1)
        return degree_terms(self.kernel, t, self.max_order, log_scale=2 * self.kernel.log_prefactor(x)).sum(-1)
