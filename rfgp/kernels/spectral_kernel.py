"""Base of the kernels whose features come from a trainable spectral measure, and the spectral protocol.

A stationary kernel k(τ) = A·E_ω[w·cos(ωᵀτ)] exposes its spectral measure so that other
kernels can combine measures (a product of stationary kernels on the same inputs is the
convolution of their measures: ω = ω₁ + ω₂ with independent draws, weights and amplitudes
multiplied).  The protocol, implemented by every kernel here:

* ``spectral_draws(num_frequencies, input_dim, generator) -> dict[str, Tensor]``: the base
  randomness of m frequencies (float64 or integer CPU tensors, no gradient).  Each
  frequency is marginally distributed as the measure (stratified samplers make them
  exchangeable rather than independent, which keeps every unbiasedness argument intact);
* ``spectral_frequencies(draws) -> Tensor`` ``(*batch_shape, m, d)``: ω in units of the
  kernel's raw (active-dims) inputs, hyperparameters applied differentiably;
* ``spectral_weights(draws) -> Tensor | None``: ``(*batch_shape, m)`` nonnegative weights with
  E[w] = 1 (``None``: all ones), so k(x, y) = A·E[w cos(ωᵀ(x − y))]; ``spectral_log_weights(draws)`` their logs
  (finite where a weight underflows);
* ``spectral_amplitude() -> Tensor``: A = k(x, x), shape ``batch_shape`` (the spectral mixture also has
  ``spectral_log_amplitude()``).
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.config_state import METHOD
from ..core.dtypes import promoted_dtype
from ..core.validation import check_choice
from ..features.weighted_fourier import SpectralMeasure, WeightedFourierFeatures
from .families import check_kernel_kwargs
from .random_feature_kernel import FeatureKernel

#: ``method`` names of the spectral-measure kernels
SPECTRAL_METHODS = ("rff",)


class SpectralFeatureKernel(FeatureKernel):
    """k̂(x, y) = A·Φ(x)ᵀΦ(y) with Φ the :class:`~rfgp.features.WeightedFourierFeatures` of a measure.

    Subclasses register their GPyTorch hyperparameters and implement
    :meth:`measure_hyperparameters` (θ passed to the measure) and, when the amplitude is not
    1, :meth:`spectral_amplitude`.  The draws are made lazily at the first call (or
    :meth:`resample`), with the proposal centred on the hyperparameters at that time.
    """

    config_fields = {"method": METHOD}
    #: the spectral draws are centred on the hyperparameters at draw time: a product keeps them when widened
    spectral_draws_follow_seed = False

    def __init__(self, measure: SpectralMeasure, num_features: int, method: str = "rff", seed: int | None = None,
                 generator: torch.Generator | None = None, **kwargs) -> None:
        self.method = check_choice(method, "method", SPECTRAL_METHODS)
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.feature_map = WeightedFourierFeatures(measure, num_features, seed=seed, generator=generator)

    @property
    def num_features(self) -> int:
        return self.feature_map.num_features

    @property
    def measure(self) -> SpectralMeasure:
        return self.feature_map.measure

    def measure_hyperparameters(self) -> dict[str, Tensor]:
        raise NotImplementedError

    def spectral_amplitude(self) -> Tensor:
        return torch.ones(self.batch_shape, dtype=self._dtype(), device=self._device())

    def _dtype(self) -> torch.dtype:
        return next(self.parameters()).dtype

    def _device(self) -> torch.device:
        return next(self.parameters()).device

    def _centre_proposal(self) -> None:
        self.measure.reference = {name: value.detach() for name, value in self.measure_hyperparameters().items()}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._centre_proposal()  # the feature map (loaded next) may redraw to re-create its buffers

    def resample(self, generator: torch.Generator | None = None) -> SpectralFeatureKernel:
        """Redraw the frequencies, with the proposal re-centred on the current hyperparameters."""
        self._centre_proposal()
        self.feature_map.resample(generator)
        return self

    def state_fixed_at_first_evaluation(self) -> str | None:
        if not self.feature_map.is_initialized:
            return "the proposal its frequencies are drawn from, centred on its hyperparameters"
        return None

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√A·Φ(x) of the normalised measure, the amplitude in the features' pair scales; ``log_amplitude`` log A
        ``(*batch)``, ``None`` for A = 1 (subclasses with k(x, x) ≠ 1 add its log)."""
        if not self.feature_map.is_initialized:
            self._centre_proposal()
        return self.feature_map(x, log_amplitude, **self.measure_hyperparameters())

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """‖Φ(x)‖² = mean(w) without featurising x (:meth:`~rfgp.features.WeightedFourierFeatures.squared_norm`);
        ``None`` for a subclass that changes the features (it provides its own)."""
        if not self.keeps_features_of(SpectralFeatureKernel):
            return None
        return self.measure_squared_norm(x)

    def measure_squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² of the normalised measure's features, after the checks of x and θ that :meth:`featurize` makes
        (and its draws)."""
        if not self.feature_map.is_initialized:
            self._centre_proposal()
        self.feature_map.prepare(x)
        return self.feature_map.squared_norm(x, **self.measure_hyperparameters())

    def diag_moments(self, x: Tensor) -> None:
        return None  # E[w] = 1: unbiased on the diagonal too

    # ---------------------------------------------------------------- protocol
    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        self._centre_proposal()
        return self.measure.draw(num_frequencies, input_dim, generator)

    def _cast(self, draws: dict[str, Tensor]) -> dict[str, Tensor]:
        """The draws on the kernel's device, in the promoted dtype of theirs and the kernel's (never lowered)."""
        dtype, device = self._dtype(), self._device()
        return {k: v.to(device=device, dtype=promoted_dtype(dtype, v.dtype)) if v.is_floating_point() else v.to(device)
                for k, v in draws.items()}

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        return self.measure.frequencies(self._cast(draws), **self.measure_hyperparameters())

    def spectral_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        log_weights = self.spectral_log_weights(draws)
        return None if log_weights is None else log_weights.exp()

    def spectral_log_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        return self.measure.log_weights(self._cast(draws), **self.measure_hyperparameters())
