r"""Sketched spectral mixture kernel: GPyTorch's ``SpectralMixtureKernel`` with reparameterised mixture features.

k(τ) = Π_i Σ_q w_q exp(−2π²τ_i²σ_{qi}²) cos(2πτ_iμ_{qi}) (GPyTorch's form of Wilson & Adams 2013), with
GPyTorch's parameter names and shapes (``mixture_weights`` ``(*batch, Q)``, ``mixture_means``
and ``mixture_scales`` ``(*batch, Q, 1, d)``).  Features: √A, A = (Σw)^d, times the weighted Fourier
features of :mod:`rfgp.features.spectral_mixture` — unbiased, gradients in all three.
"""

from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import SpectralMixtureKernel
from gpytorch.priors import Prior
from torch import Tensor

from ..core.validation import NonFiniteHyperparameterError, check_positive_int, reads_values
from ..features.spectral_mixture import SpectralMixtureSpectralMeasure
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .spectral_kernel import SpectralFeatureKernel


class SketchedSpectralMixtureKernel(SpectralFeatureKernel):
    r"""Spectral mixture kernel with Q components approximated by F = 2m features (m ≥ Q).

    Args:
        num_mixtures: Q.
        num_features: F = 2m.
        ard_num_dims: the input dimension d (GPyTorch requires it to match the data; default 1).
        method, seed, generator: randomness (``"rff"``).
        mixture_{weights,means,scales}_{prior,constraint}: as in ``gpytorch.kernels.SpectralMixtureKernel``.
        kwargs: ``batch_shape``, ``active_dims``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedSpectralMixtureKernel
        >>> kernel = SketchedSpectralMixtureKernel(num_mixtures=3, num_features=512, ard_num_dims=1, seed=0)
        >>> kernel(torch.rand(10, 1)).shape
        torch.Size([10, 10])
    """

    is_stationary = True

    def __init__(self, num_mixtures: int, num_features: int, ard_num_dims: int = 1, method: str = "rff",
                 seed: int | None = None, generator: torch.Generator | None = None,
                 mixture_weights_prior: Prior | None = None, mixture_weights_constraint: Interval | None = None,
                 mixture_means_prior: Prior | None = None, mixture_means_constraint: Interval | None = None,
                 mixture_scales_prior: Prior | None = None, mixture_scales_constraint: Interval | None = None,
                 **kwargs) -> None:
        self.num_mixtures = check_positive_int(num_mixtures, "num_mixtures")
        ard_num_dims = check_positive_int(ard_num_dims, "ard_num_dims")
        super().__init__(SpectralMixtureSpectralMeasure(num_mixtures), num_features, method=method, seed=seed,
                         generator=generator, ard_num_dims=ard_num_dims, **kwargs)
        shape = (*self.batch_shape, num_mixtures, 1, ard_num_dims)
        register_positive_hyperparameter(self, "mixture_weights", (*self.batch_shape, num_mixtures),
                                         mixture_weights_prior, mixture_weights_constraint)
        register_positive_hyperparameter(self, "mixture_means", shape, mixture_means_prior, mixture_means_constraint)
        register_positive_hyperparameter(self, "mixture_scales", shape, mixture_scales_prior, mixture_scales_constraint)

    mixture_weights = PositiveHyperparameter()

    mixture_means = PositiveHyperparameter()

    mixture_scales = PositiveHyperparameter()

    def initialize_from_data(self, train_x: Tensor, train_y: Tensor, **kwargs) -> None:
        """GPyTorch's ``SpectralMixtureKernel.initialize_from_data``: scales 1/abs(N(0, max_dist²)), means
        U(0, 0.5/min_dist) per input column, weights std(y)/Q.

        The kernel has GPyTorch's parameter names, shapes, constraints and ``active_dims``, so GPyTorch's routine runs
        on it unchanged and draws exactly what it draws for the exact kernel from the same torch random state; the
        features are reparameterised in these hyperparameters (fixed draws), so no re-draw is needed afterwards.
        """
        SpectralMixtureKernel.initialize_from_data(self, train_x, train_y, **kwargs)

    def initialize_from_data_empspect(self, train_x: Tensor, train_y: Tensor) -> None:
        """GPyTorch's ``SpectralMixtureKernel.initialize_from_data_empspect`` (a Gaussian mixture fitted to the
        empirical spectrum of evenly spaced data, with NumPy's global random state as GPyTorch uses it), run on this
        kernel's hyperparameters as :meth:`initialize_from_data` is."""
        SpectralMixtureKernel.initialize_from_data_empspect(self, train_x, train_y)

    def measure_hyperparameters(self) -> dict[str, Tensor]:
        return {"means": self.mixture_means, "scales": self.mixture_scales, "weights": self.mixture_weights}

    def spectral_amplitude(self) -> Tensor:
        """k(x, x) = (Σ_q w_q)^d."""
        return self.mixture_weights.sum(-1).pow(self.ard_num_dims)

    def spectral_log_amplitude(self) -> Tensor:
        """log k(x, x) = d·log Σ_q w_q: finite where (Σw)^d under- or overflows (float32 at d = 50 already)."""
        return self.mixture_weights.sum(-1).log() * self.ard_num_dims

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√(s·A)·Φ(x): an outputscale s (log s = ``log_amplitude``, ``None``: s = 1) and the mixture's
        A = (Σ_q w_q)^d in the same pair scales."""
        self._check_input_dim(x)
        return super().folded_features(x, self._checked_log_amplitude(log_amplitude))

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² = A·mean(w), A = (Σ_q w_q)^d, without featurising x: differentiable in the mixture weights (the
        amplitude and the importance weights), and with the checks of :meth:`featurize`."""
        self._check_input_dim(x)
        return self.measure_squared_norm(x) * self._checked_log_amplitude().exp().unsqueeze(-1)

    def _checked_log_amplitude(self, log_scale: Tensor | None = None) -> Tensor:
        """log(s·A) = log s + d·log Σ_q w_q (not log A: A = 0.05^50 = 0 in float32 made every gradient NaN), refused
        where s·A = k(x, x) itself exceeds the dtype's range (the covariance would be inf and NaN; not checked under
        ``rfgp.settings.validate_inputs(False)``)."""
        log_total = self.spectral_log_amplitude() if log_scale is None else self.spectral_log_amplitude() + log_scale
        largest = torch.finfo(log_total.dtype).max
        if reads_values(log_total) and bool((log_total.detach() >= math.log(largest)).any()):  # one host read
            raise NonFiniteHyperparameterError(
                f"k(x, x) = (Σ_q mixture_weights)^ard_num_dims{'' if log_scale is None else ' × outputscale'} = "
                f"exp({float(log_total.detach().max()):.4g}) exceeds {log_total.dtype}'s largest value {largest:.3g} "
                f"(mixture_weights summing to {float(self.mixture_weights.detach().sum(-1).max()):.4g}, "
                f"ard_num_dims={self.ard_num_dims}); accepted is a k(x, x) below it: smaller mixture weights or float64"
            )
        return log_total

    def _check_input_dim(self, x: Tensor) -> None:
        if x.shape[-1] != self.ard_num_dims:
            raise ValueError(
                f"SketchedSpectralMixtureKernel expects inputs with ard_num_dims={self.ard_num_dims} dimensions "
                f"(as GPyTorch's SpectralMixtureKernel), got {x.shape[-1]}"
            )
