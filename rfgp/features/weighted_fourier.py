"""Random Fourier features of a spectral measure whose hyperparameters are trainable.

Bochner: a stationary kernel with k(0) = A is k(τ) = A·E_ω[cos(ωᵀτ)] for its normalised
spectral measure.  When the measure depends on hyperparameters θ (a period, a mixture
weight, an RQ shape α) the random draws ξ stay fixed and θ enters differentiably, either
through the frequencies, ω = ω_θ(ξ) (reparameterisation), or through per-frequency
importance weights w_θ(ξ) = p_θ(ξ)/r(ξ) against the proposal r the draws came from, with
E_r[w_θ] = 1 (Owen 2013, *Monte Carlo theory, methods and examples*, Ch. 9).  Then

    k̂(x, y) = (A/m) Σⱼ wⱼ cos(ωⱼᵀ(x − y)) = Φ(x)ᵀΦ(y),
    Φ(x) = √(A/m)·[√wⱼ cos(ωⱼᵀx), √wⱼ sin(ωⱼᵀx)]ⱼ,

unbiased for every θ, and value and gradient are the same smooth function of θ (so autograd
agrees with finite differences and second derivatives exist).  Width F = 2m.

A :class:`SpectralMeasure` says how to draw ξ, and how θ turns ξ into frequencies and
log-weights; :class:`WeightedFourierFeatures` keeps ξ as buffers and evaluates Φ.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.config_state import METHOD, SavedDrawShapes
from ..core.dtypes import refuse_autocast_backward
from ..core.validation import check_finite, has_values
from .base import FeatureMap
from .fourier import _SinCosFeatures, sincos_projection_grad, sincos_projection_jvp


class SpectralMeasure:
    """The normalised spectral measure of a stationary kernel family, with hyperparameters θ.

    Subclasses implement :meth:`draw`, :meth:`frequencies` and (for importance-weighted
    samplers) :meth:`log_weights`.  ``reference`` holds detached hyperparameter values a
    proposal may be centred on when drawing (set by the kernel before every draw).
    """

    name = "spectral measure"

    def __init__(self) -> None:
        self.reference: dict[str, Tensor] = {}

    def draw(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Base randomness ξ for m frequencies (CPU tensors; floating ones float64)."""
        raise NotImplementedError

    def frequencies(self, draws: dict[str, Tensor], **hyperparameters: Tensor) -> Tensor:
        """ω of shape ``(*batch, m, d)``, in units of the raw inputs."""
        raise NotImplementedError

    def log_weights(self, draws: dict[str, Tensor], **hyperparameters: Tensor) -> Tensor | None:
        """log wⱼ of shape ``(*batch, m)`` with E[wⱼ] = 1, or ``None`` for uniform weights."""
        return None

    def upgrade_saved_draws(self, state_dict: dict, prefix: str) -> None:
        """Bring the draws of a state saved by an earlier rfgp (keys under ``prefix``) to the current form, in the
        copy ``load_state_dict`` hands to the feature map; nothing to do by default."""

    def __repr__(self) -> str:
        return self.name


def fourier_features(x: Tensor, frequencies: Tensor, log_weights: Tensor | None = None,
                     log_amplitude: Tensor | None = None) -> Tensor:
    """Φ(x) = √(A/m)[√w cos(xWᵀ), √w sin(xWᵀ)], shape ``(*batch, n, 2m)``.

    ``frequencies`` W is ``(*batch, m, d)`` and broadcasts with ``x`` ``(..., n, d)``; ``log_weights`` log w is
    ``(*batch, m)`` (``None``: w = 1) and ``log_amplitude`` log A ``(*batch)`` (``None``: A = 1, a normalised
    measure; a kernel with k(0) = A ≠ 1 passes it here rather than multiplying Φ by √A afterwards, a pass over
    Φ each way).  sin, cos and the per-pair amplitudes √(Aw/m) are one custom autograd Function
    (:class:`_WeightedSinCosFeatures`) whose backward reuses Φ; it is built of differentiable operations, so
    Φ stays twice differentiable in x and in the hyperparameters W, w and A depend on.
    """
    return projection_features(x @ frequencies.mT, log_weights, log_amplitude)


def projection_features(projection: Tensor, log_weights: Tensor | None = None,
                        log_amplitude: Tensor | None = None) -> Tensor:
    """:func:`fourier_features` from the projections P = xWᵀ ``(..., n, m)`` (a map that projects its own way,
    e.g. SORF's structured blocks): √(A/m)[√w cos P, √w sin P]."""
    m = projection.shape[-1]
    if log_weights is None and log_amplitude is None:
        if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same values, plainly
            return torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1) / math.sqrt(m)
        return _SinCosFeatures.apply(projection, 1.0 / math.sqrt(m))
    log_amplitudes = (projection.new_zeros(m) if log_weights is None else log_weights) - math.log(m)
    if log_amplitude is not None:
        log_amplitudes = log_amplitudes + log_amplitude.unsqueeze(-1)
    return scaled_sincos_features(projection, 0.5 * log_amplitudes)


def scaled_sincos_features(projection: Tensor, log_amplitudes: Tensor) -> Tensor:
    """e^s·[cos P, sin P] per pair j, shape ``(..., n, 2m)``, for projections P ``(..., n, m)`` and log pair scales
    s ``(*batch, m)`` (s = ½ log(A·w/m) for Φ = √(A/m)[√w cos, √w sin]), broadcast against P's rows.

    One custom autograd Function (:class:`_WeightedSinCosFeatures`), twice differentiable in P and s.
    """
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same values, plainly
        return scale_sincos_pairs(torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1),
                                  torch.exp(log_amplitudes))
    dtype = torch.promote_types(projection.dtype, log_amplitudes.dtype)
    rows = torch.broadcast_shapes(projection.shape, (*log_amplitudes.shape[:-1], 1, projection.shape[-1]))
    return _WeightedSinCosFeatures.apply(projection.to(dtype).expand(rows), log_amplitudes.to(dtype))


class _WeightedSinCosFeatures(torch.autograd.Function):
    """Φ = e^s·[cos P, sin P] per pair j (amplitude e^{s_j}), whose backward reuses Φ.

    ∂L/∂P as in :func:`~rfgp.features.fourier.sincos_projection_grad`, and since ∂Φ_j/∂s_j = Φ_j for both
    halves of pair j, ∂L/∂s_j = Σ_rows (g_cos,j·Φ_cos,j + g_sin,j·Φ_sin,j) — with s = ½(log w − log m),
    ∂Φ_j/∂log w_j = ½Φ_j.  No second sin/cos, no concatenation or scaling pass in either direction, and no
    division by e^s (exact where a weight underflows to 0).  The backward is made of differentiable
    operations on the saved output, so autograd differentiates it again (double backward).

    ``projection`` ``(..., n, m)`` must already have the broadcast shape; ``log_amplitudes`` s
    ``(*batch, m)`` broadcasts against its rows and receives a gradient of its own shape.  The forward-mode
    derivative Φ̇ = [−Φ_sin·Ṗ, Φ_cos·Ṗ] + Φ·ṡ (ṡ per pair, both halves) is formed from Φ too, and the generated vmap
    rule lets forward-over-reverse Hessians through it (as :class:`~rfgp.features.fourier._SinCosFeatures`).
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(projection: Tensor, log_amplitudes: Tensor) -> Tensor:
        m = projection.shape[-1]
        features = projection.new_empty(*projection.shape[:-1], 2 * m)
        amplitudes = torch.exp(log_amplitudes).unsqueeze(-2)
        torch.cos(projection, out=features[..., :m])  # written in place: no concatenation pass
        torch.sin(projection, out=features[..., m:])
        features[..., :m].mul_(amplitudes)
        features[..., m:].mul_(amplitudes)
        return features

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)
        ctx.log_amplitudes_shape = inputs[1].shape

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad: Tensor):
        (features,) = ctx.saved_tensors
        grad_projection = grad_log_amplitudes = None
        if ctx.needs_input_grad[0]:
            grad_projection = sincos_projection_grad(grad, features)
        if ctx.needs_input_grad[1]:
            grad_log_amplitudes = _pair_row_sums(grad, features).sum_to_size(ctx.log_amplitudes_shape)
        return grad_projection, grad_log_amplitudes

    @staticmethod
    def jvp(ctx, projection_tangent: Tensor | None, log_amplitudes_tangent: Tensor | None) -> Tensor:
        (features,) = ctx.saved_tensors
        tangent = torch.zeros_like(features) if projection_tangent is None else sincos_projection_jvp(
            projection_tangent, features)
        if log_amplitudes_tangent is not None:  # ∂Φ_j/∂s_j = Φ_j for both halves of pair j
            tangent = tangent + features * torch.cat([log_amplitudes_tangent] * 2, -1).unsqueeze(-2)
        return tangent


#: row blocks of :func:`_pair_row_sums` hold about this many elements (2 MiB in float64): a product the size of Φ
#: would be a fresh allocation whose page faults cost twice the multiplication (measured: 0.19 s against 0.07 s
#: for 20 000 × 1024 float64, one thread); a block is reused from the allocator's cache.
ROW_BLOCK_ELEMENTS = 2**18


def _pair_row_sums(grad: Tensor, features: Tensor) -> Tensor:
    """Σ_rows (g_cos,j·Φ_cos,j + g_sin,j·Φ_sin,j) of shape ``(..., m)``, by row blocks (differentiable)."""
    rows, width = features.shape[-2:]
    block = max(1, ROW_BLOCK_ELEMENTS // width)
    sums = sum((grad[..., start:start + block, :] * features[..., start:start + block, :]).sum(-2)
               for start in range(0, rows, block))
    if rows == 0:
        sums = features.new_zeros(*features.shape[:-2], width)
    m = width // 2
    return sums[..., :m] + sums[..., m:]


def scale_sincos_pairs(features: Tensor, amplitudes: Tensor) -> Tensor:
    """sin/cos features ``(..., n, 2m)`` (cos block, then sin block) with pair j times ``amplitudes[..., j]``.

    ``amplitudes`` ``(*batch, m)`` are the square roots √wⱼ of per-frequency weights, so that
    Φ(x)ᵀΦ(y) = Σⱼ wⱼ·(cos·cos + sin·sin)ⱼ.
    """
    amplitudes = amplitudes.unsqueeze(-2)
    return features * torch.cat([amplitudes, amplitudes], dim=-1)


class WeightedFourierFeatures(SavedDrawShapes, FeatureMap):
    """Φ(x; θ) for a :class:`SpectralMeasure`: fixed draws ξ (buffers), hyperparameters θ at call time.

    Args:
        measure: the spectral measure (its draws become buffers of this module).
        num_features: F = 2m (even).
        input_dim, seed, generator: see :class:`~rfgp.features.FeatureMap`.

    ``forward(x, log_amplitude=None, **hyperparameters)`` passes θ to the measure; x is in raw input units;
    ``log_amplitude`` log A ``(*batch)`` scales Φ by √A (see :func:`fourier_features`).
    """

    config_fields = {"measure": METHOD}
    #: the proposal is centred on the hyperparameters at draw time
    draws_follow_seed = False
    has_closed_form_squared_norm = True

    def __init__(self, measure: SpectralMeasure, num_features: int, input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None) -> None:
        if not isinstance(measure, SpectralMeasure):
            raise TypeError(f"measure must be a rfgp.features.SpectralMeasure, got {type(measure).__name__}")
        if isinstance(num_features, int) and not isinstance(num_features, bool) and num_features % 2:
            raise ValueError(f"num_features must be even for sin/cos features (F = 2m), got {num_features}")
        self.measure = measure
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    @property
    def num_frequencies(self) -> int:
        return self.num_features // 2

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        return self.measure.draw(self.num_frequencies, input_dim, generator)

    def _config_value(self, name: str):
        if name == "measure":
            return repr(self.measure)
        return super()._config_value(name)

    def draws(self, like: Tensor) -> dict[str, Tensor]:
        """The drawn buffers, floating ones in the dtype and on the device of ``like``."""
        return {name: self._buffer(name, like) for name in self._buffer_names}

    def spectrum(self, x: Tensor, **hyperparameters: Tensor) -> tuple[Tensor, Tensor | None]:
        """(ω, log w) of the draws at θ = ``hyperparameters``, with the draws in x's dtype and on its device.

        Raises :class:`~rfgp.core.validation.NonFiniteError` where θ makes them NaN or ±Inf (a NaN period or
        mixture weight), which the kernel turns into an error naming the hyperparameter: Φ would be NaN silently.
        """
        draws = self.draws(x)
        frequencies = self.measure.frequencies(draws, **hyperparameters)
        log_weights = self.measure.log_weights(draws, **hyperparameters)
        check_finite(frequencies, "the spectral measure's frequencies")
        if log_weights is not None:
            check_finite(log_weights, "the spectral measure's log-weights")
        return frequencies, log_weights

    def forward(self, x: Tensor, log_amplitude: Tensor | None = None, **hyperparameters: Tensor) -> Tensor:
        self._prepare(x)
        return fourier_features(x, *self.spectrum(x, **hyperparameters), log_amplitude)

    def squared_norm(self, x: Tensor, **hyperparameters: Tensor) -> Tensor:
        """‖Φ(x)‖² = (1/m)Σⱼ wⱼ(cos² + sin²)(ωⱼᵀx) = mean(w), the same for every x; 1 for uniform weights.

        A function of θ through the weights only (a mixture weight, a periodic lengthscale, an RQ shape α), with
        the features' gradient; the frequencies are checked as :meth:`forward` checks them.
        """
        frequencies, log_weights = self.spectrum(x, **hyperparameters)
        rows = (*x.shape[:-1],)
        if log_weights is None:
            shape = torch.broadcast_shapes(rows, (*frequencies.shape[:-2], 1))
            return torch.ones(shape, dtype=torch.promote_types(x.dtype, frequencies.dtype), device=x.device)
        mean = log_weights.exp().mean(-1, keepdim=True)  # (*batch, 1)
        shape = torch.broadcast_shapes(rows, (*frequencies.shape[:-2], 1), mean.shape)
        return mean.to(torch.promote_types(x.dtype, mean.dtype)).expand(shape)

    def _materialize(self) -> None:
        if not has_values(self._anchor):  # the proposal reads θ's values (PyTorch: "Cannot copy out of meta tensor")
            raise ValueError(
                f"{type(self).__name__} ({self.measure!r}) cannot draw on the meta device: its proposal is centred "
                "on the hyperparameters' values at draw time, and how many harmonics it draws follows them; make the "
                "draws on a device with values (call the kernel once, or load a state that has them), then .to('meta')"
            )
        super()._materialize()
        self._adopt_saved_shapes()  # the number of harmonics follows the proposal's hyperparameters

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        self.measure.upgrade_saved_draws(state_dict, prefix)  # before the saved shapes are read
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, measure={self.measure!r}"
