"""Products of stationary kernels at width F by convolving their spectral measures.

If k₁(τ) = a₁E_{ω₁~μ₁}[cos(ω₁ᵀτ)] and k₂(τ) = a₂E_{ω₂~μ₂}[cos(ω₂ᵀτ)] (Bochner), then with
independent ω₁, ω₂

    k₁(τ)·k₂(τ) = a₁a₂E[cos(ω₁ᵀτ)cos(ω₂ᵀτ)] = a₁a₂E[cos((ω₁ + ω₂)ᵀτ)]

(cos A cos B = ½[cos(A + B) + cos(A − B)] and ω₂ ↦ −ω₂ leaves a symmetric μ₂ unchanged): the
product's spectral measure is the convolution μ₁ * μ₂ (Rahimi & Recht 2007 §3; Wilson & Adams
2013 use the same identity for products of spectral mixtures).  So m i.i.d. draws of
ω = Σᵢ ωᵢ give the ordinary sin/cos features

    Φ(x) = √(a/m)·[√wⱼ cos(ωⱼᵀx), √wⱼ sin(ωⱼᵀx)]ⱼ,   a = Πᵢaᵢ,   wⱼ = Πᵢwᵢⱼ,

of width F = 2m whatever the number of factors, unbiased for the product (the importance
weights wᵢ of a factor have E[wᵢ] = 1 and are independent across factors).  Factors on
different or overlapping ``active_dims`` are the same construction: ωᵀx = Σᵢωᵢᵀx[aᵢ] is the
inner product with one joint frequency vector that embeds each ωᵢ at its factor's columns.

**Protocol** — a factor kernel (optionally inside ``ScaleKernel``, whose outputscale multiplies
the amplitude) is usable here when it implements

* ``spectral_draws(num_frequencies, input_dim, generator) -> dict[str, Tensor]``: base
  randomness that does not depend on hyperparameters (float64 or integer CPU tensors; stored
  here as buffers, so ``state_dict`` reproduces them);
* ``spectral_frequencies(draws) -> Tensor``: ω of shape ``(*batch, m, d)`` in units of the
  factor's raw (``active_dims``-selected) inputs, hyperparameters applied differentiably;
* ``spectral_weights(draws) -> Tensor | None`` (optional): per-frequency nonnegative importance
  weights ``(*batch, m)`` with expectation 1, or ``None``;
* ``spectral_log_weights(draws) -> Tensor | None`` (optional): their logs, finite where a weight underflows
  (the product of the factors' weights is formed as the sum of these); default the log of ``spectral_weights``;
* ``spectral_amplitude() -> Tensor``: k(x, x), batch-shaped;
* ``spectral_log_amplitude() -> Tensor`` (optional): log k(x, x), for a factor whose k(x, x) can leave the floating
  range (the spectral mixture's (Σw)^d); default the log of ``spectral_amplitude()``;
* ``spectral_draws_follow_seed`` (optional, default ``False``): whether the draws depend on the seed alone, so
  that ``.double()`` of a product that drew in float32 makes them again in float64 (every factor's must);
* ``spectral_draws_made()`` (optional): called once the product has drawn (Matérn-½ fixes its anchor ℓ₀ there).

The draws are always i.i.d. (a factor built with ORF/SORF is convolved with i.i.d. draws: the
sum of orthogonal blocks is not orthogonal).  Variance: that of m-frequency RFF for the product
kernel, Var[k̂(τ)] = a²(E[w²cos²(ωᵀτ)] − k̃(τ)²)/m with k̃ = k/a; with w ≡ 1 it is
a²(½ + ½k̃(2τ) − k̃(τ)²)/m (Sutherland & Schneider 2015, Prop. 1), the same as sketching the
product kernel directly and independent of the number of factors.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel
from torch import Tensor, nn

from ..core.config_state import DRAW, LAZY, METHOD, SavedDrawShapes
from ..core.draws import register_draw
from ..core.dtypes import cast_to
from ..core.locks import init_lock
from ..core.validation import check_finite, check_positive_int
from ..features.base import _new_seed, widen_draws
from ..features.weighted_fourier import projection_features
from .combinations import refuse_multi_output_factors, select_active, unwrap_scale
from .families import check_kernel_kwargs
from .random_feature_kernel import FeatureKernel

SPECTRAL_PROTOCOL = ("spectral_draws", "spectral_frequencies", "spectral_amplitude")


def has_spectral_protocol(kernel: Kernel) -> bool:
    """Whether ``kernel`` (or the base of a ``ScaleKernel``) implements the spectral protocol above."""
    base, _ = unwrap_scale(kernel)
    return all(callable(getattr(base, name, None)) for name in SPECTRAL_PROTOCOL)


def _log_weights(kernel: Kernel, draws: dict[str, Tensor]) -> Tensor | None:
    """A factor's log importance weights: its ``spectral_log_weights``, else the log of its ``spectral_weights``."""
    log_weights = getattr(kernel, "spectral_log_weights", None)
    if log_weights is not None:
        return log_weights(draws)
    weights = getattr(kernel, "spectral_weights", lambda _: None)(draws)
    return None if weights is None else weights.log()


class SpectralProductKernel(SavedDrawShapes, FeatureKernel):
    r"""k̂ ≈ Πᵢ kᵢ for stationary factors, sin/cos features of ω = Σᵢωᵢ (width F = 2m, see module doc).

    Args:
        kernels: factor kernels with the spectral protocol (``SketchedRBFKernel``,
            ``SketchedMaternKernel``, …), optionally inside ``ScaleKernel``; each keeps its own
            hyperparameters (its own feature map is not used).
        num_features: output width F; m = ⌊F/2⌋ joint frequencies (width 2m ≤ F).
        seed, generator: randomness of the draws (one seed for all factors; the factors' draws
            are consecutive and independent).
        kwargs: GPyTorch ``Kernel`` arguments (``active_dims``, …).

    Example:
        >>> import torch
        >>> from gpytorch.kernels import ScaleKernel
        >>> from rfgp.kernels import SketchedMaternKernel, SketchedRBFKernel, SpectralProductKernel
        >>> a = SketchedRBFKernel(2, active_dims=[0]); b = SketchedMaternKernel(2, nu=1.5)
        >>> product = SpectralProductKernel(a, ScaleKernel(b), num_features=1024, seed=0)
        >>> product(torch.randn(10, 3)).shape
        torch.Size([10, 10])
    """

    #: saved in ``state_dict`` (:mod:`rfgp.core.config_state`): the width, the factors' input dims, the seed
    config_fields = {"num_frequencies": METHOD, "input_dims": LAZY, "seed": DRAW}

    def __init__(self, *kernels: Kernel, num_features: int, seed: int | None = None,
                 generator: torch.Generator | None = None, **kwargs) -> None:
        if len(kernels) < 1:
            raise ValueError("SpectralProductKernel needs at least one factor kernel")
        for i, kernel in enumerate(kernels):
            if not has_spectral_protocol(kernel):
                raise TypeError(
                    f"kernels[{i}] ({type(unwrap_scale(kernel)[0]).__name__}) does not implement the spectral "
                    f"protocol ({', '.join(SPECTRAL_PROTOCOL)}); combine it with rfgp.kernels.SketchedProductKernel"
                )
        refuse_multi_output_factors(kernels, "SpectralProductKernel")
        check_positive_int(num_features, "num_features")
        if num_features < 2:
            raise ValueError(f"num_features must be ≥ 2 (one sin/cos pair), got {num_features}")
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.kernels = nn.ModuleList(kernels)
        self.num_frequencies = num_features // 2
        self.seed = int(seed) if seed is not None else _new_seed(generator)
        self.input_dims: tuple[int, ...] | None = None

    @property
    def num_features(self) -> int:
        return 2 * self.num_frequencies

    # ------------------------------------------------------------------ draws
    def _seed_draws(self, input_dims: tuple[int, ...]) -> dict[str, Tensor]:
        """The factors' draws from the seed, named as buffers (``draws{i}_{name}``), float64 or integer CPU tensors."""
        generator = torch.Generator().manual_seed(self.seed)
        return {f"draws{i}_{name}": value
                for i, (kernel, dim) in enumerate(zip(self.kernels, input_dims))
                for name, value in unwrap_scale(kernel)[0].spectral_draws(self.num_frequencies, dim, generator).items()}

    @torch.inference_mode(False)  # the draws stay usable by training, also when made under inference mode
    def _materialize(self, input_dims: tuple[int, ...]) -> None:
        anchor = next(iter(self.parameters()), None)
        for name, value in self._seed_draws(input_dims).items():
            if anchor is not None:  # integer draws too: a CPU buffer would be copied to the device at every call
                value = value.to(device=anchor.device, dtype=anchor.dtype if value.is_floating_point() else value.dtype)
            register_draw(self, name, value)
        for kernel in self.kernels:
            getattr(unwrap_scale(kernel)[0], "spectral_draws_made", lambda: None)()
        self.input_dims = tuple(input_dims)
        self._adopt_saved_shapes()  # a periodic factor's number of harmonics follows its lengthscale at draw time

    def _draws_dtype(self) -> torch.dtype | None:
        """The dtype of the floating draws (``None`` before they are made)."""
        return next((value.dtype for name, value in self.named_buffers(recurse=False)
                     if name.startswith("draws") and value.is_floating_point()), None)

    def _apply(self, fn, *args, **kwargs):
        """``.double()``, ``.to(...)``: draws made in float32 (at a first call under torch's default dtype) are made
        again from the seed in the wider dtype, as a feature map's (:meth:`rfgp.features.FeatureMap._apply`), where
        every factor's draws follow the seed alone (``spectral_draws_follow_seed``)."""
        drawn_in = self._draws_dtype()
        result = super()._apply(fn, *args, **kwargs)
        if drawn_in is None or self.input_dims is None:
            return result
        widened = torch.finfo(self._draws_dtype()).bits > torch.finfo(drawn_in).bits
        if widened and all(getattr(unwrap_scale(kernel)[0], "spectral_draws_follow_seed", False)
                           for kernel in self.kernels):
            with torch.inference_mode(False), torch.no_grad():
                widen_draws(self, self._seed_draws(self.input_dims), drawn_in)
        return result

    def resample(self, generator: torch.Generator | None = None) -> SpectralProductKernel:
        """Redraw the joint frequencies (from ``generator`` if given, else torch's global RNG)."""
        self.seed = _new_seed(generator)
        if self.input_dims is not None:
            self._materialize(self.input_dims)
        return self

    def _draws(self, i: int, like: Tensor) -> dict[str, Tensor]:
        prefix = f"draws{i}_"
        return {
            name[len(prefix):]: value.to(dtype=like.dtype if value.is_floating_point() else value.dtype,
                                         device=like.device)
            for name, value in self.named_buffers(recurse=False) if name.startswith(prefix)
        }

    # ---------------------------------------------------------------- features
    #: the factors' own feature maps are never evaluated (:mod:`rfgp.kernels.first_evaluation`)
    draws_for_its_factors = True

    def state_fixed_at_first_evaluation(self) -> str | None:
        if self.input_dims is None:
            return "its factors' frequency draws, centred on their hyperparameters"
        return None

    def spectrum(self, x: Tensor) -> tuple[list[tuple[Tensor, Tensor]], Tensor, Tensor | None]:
        """The factors' inputs and frequencies [(uᵢ, ωᵢ)], the log amplitude log a = Σᵢ log aᵢ (outputscales included)
        and the log weights Σᵢ log wᵢ (``None``: all 1) — sums of logs, finite where the products a and Πᵢwᵢ under- or
        overflow (a float32 periodic factor over 50 dimensions) — each checked (a NaN hyperparameter would make Φ NaN
        silently)."""
        inputs = [select_active(kernel, x) for kernel in self.kernels]
        if self.input_dims is None:  # drawn once by threads calling at once (see FeatureMap._draw_at_first_call)
            with init_lock(self):
                if self.input_dims is None:
                    self._materialize(tuple(u.shape[-1] for u in inputs))
        terms, log_amplitude, log_weights = [], 0.0, None
        for i, (kernel, u) in enumerate(zip(self.kernels, inputs)):
            base, outputscale = unwrap_scale(kernel)
            draws = self._draws(i, u)
            frequencies = cast_to(base.spectral_frequencies(draws), u.dtype)
            check_finite(frequencies, f"the frequencies of kernels[{i}]")
            terms.append((u, frequencies))
            factor_log_amplitude = getattr(base, "spectral_log_amplitude", None)
            log_amplitude = log_amplitude + (base.spectral_amplitude().log() if factor_log_amplitude is None
                                             else factor_log_amplitude())
            if outputscale is not None:
                log_amplitude = log_amplitude + outputscale.log()
            factor_log_weights = _log_weights(base, draws)
            if factor_log_weights is not None:
                check_finite(factor_log_weights.exp(), f"the spectral weights of kernels[{i}]")
                log_weights = factor_log_weights if log_weights is None else log_weights + factor_log_weights
        # an amplitude that underflows is allowed (its log stays finite); NaN or one beyond the floating range is not
        check_finite(log_amplitude.exp(), "the amplitude (the factors' k(x, x) and outputscales)")
        return terms, log_amplitude, log_weights

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√s·Φ(x) for log s (an outputscale around the product; ``None``: s = 1), with the pair scales √(s·a·wⱼ/m)."""
        terms, log_product_amplitude, log_weights = self.spectrum(x)
        projection = 0.0
        for u, frequencies in terms:
            projection = projection + u @ frequencies.mT
        log_total = log_product_amplitude if log_amplitude is None else log_product_amplitude + log_amplitude
        return projection_features(projection, log_weights, log_total)  # √(a·wⱼ/m)

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² = (a/m)Σⱼ wⱼ(cos² + sin²) = a·mean(w) without featurising x: the same for every x, differentiable
        in the amplitudes, outputscales and importance weights (Matérn-½'s r(ℓ), a periodic factor's q(1/ℓ))."""
        terms, log_amplitude, log_weights = self.spectrum(x)
        amplitude = log_amplitude.exp()
        norms = amplitude if log_weights is None else amplitude * log_weights.exp().mean(-1)
        rows = torch.broadcast_shapes(*((*u.shape[:-1],) for u, _ in terms),
                                      *((*frequencies.shape[:-2], 1) for _, frequencies in terms))
        norms = norms.unsqueeze(-1)
        return norms.to(torch.promote_types(x.dtype, norms.dtype)).expand(torch.broadcast_shapes(rows, norms.shape))

    def diag_moments(self, x: Tensor) -> None:
        # Φ(x)ᵀΦ(x) = a·mean(w), whose expectation is a = k(x, x): unbiased on the diagonal.
        return None

    # -------------------------------------------------------------- state dict
    def _adopt_config(self, values: dict) -> None:
        """Adopt the saved seed and factor input dimensions, then re-draw so the saved draws load into place."""
        super()._adopt_config(values)
        if self.input_dims is not None:
            self._materialize(self.input_dims)

    def extra_repr(self) -> str:
        return f"num_features={self.num_features}, seed={self.seed}"
