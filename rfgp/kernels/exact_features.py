r"""Kernels with exact finite feature maps: GPyTorch's ``LinearKernel``, ``ConstantKernel`` and ``CosineKernel``.

No randomness and no approximation: k(x, y) = Φ(x)ᵀΦ(y) exactly, with

* linear   k = v·xᵀy (per-dimension v under ARD):  Φ(x) = x ⊙ √v,        width d;
* constant k = c:                                  Φ(x) = √c,            width 1;
* cosine   k = cos(π‖x − y‖/p):                    Φ(x) = [cos(πx/p), sin(πx/p)], width 2 —
  exact for one input dimension by cos(a − b) = cos a cos b + sin a sin b.  For d > 1,
  cos(π‖τ‖/p) is not positive definite (a radial function is positive definite on ℝᵈ, d ≥ 2,
  only as a mixture of Bessel-type functions Ω_d, Schoenberg 1938; cos = Ω₁), so it has no
  feature map: such inputs raise.

Hyperparameters have GPyTorch's names, shapes, constraints and priors.  Their features are
exact, so their variance correction is zero and ``num_features`` is the exact width.
"""

from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval
from gpytorch.priors import Prior
from torch import Tensor

from ..core.config_state import LAZY
from ..core.validation import check_finite, check_positive_int
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .random_feature_kernel import FeatureKernel


class _ExactFeatureKernel(FeatureKernel):
    #: Φ(x)ᵀΦ(y) = k(x, y) exactly, at a width fixed by the kernel: sums reserve it before splitting F
    is_exact = True
    #: the spectral draws (zeros, random signs) depend on the seed alone
    spectral_draws_follow_seed = True

    def diag_moments(self, x: Tensor) -> None:
        return None


class LinearFeatureKernel(_ExactFeatureKernel):
    r"""k(x, y) = xᵀ diag(v) y with features x ⊙ √v (``gpytorch.kernels.LinearKernel``).

    Args:
        ard_num_dims: one variance per input dimension (else one shared).
        input_dim: d, the width of Φ (default ``ard_num_dims``; otherwise set at the first call).
        variance_prior, variance_constraint: as in GPyTorch.
        kwargs: ``batch_shape``, ``active_dims``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import LinearFeatureKernel
        >>> LinearFeatureKernel(input_dim=3).featurize(torch.rand(5, 3)).shape
        torch.Size([5, 3])
    """

    config_fields = {"input_dim": LAZY}

    def __init__(self, ard_num_dims: int | None = None, input_dim: int | None = None,
                 variance_prior: Prior | None = None, variance_constraint: Interval | None = None, **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(ard_num_dims=ard_num_dims, **kwargs)
        if ard_num_dims is not None and input_dim is not None and input_dim != ard_num_dims:
            raise ValueError(f"input_dim={input_dim} does not match ard_num_dims={ard_num_dims} (one variance per "
                             "input dimension): pass one of them, or equal values")
        input_dim = ard_num_dims if input_dim is None else input_dim
        self.input_dim = None if input_dim is None else check_positive_int(input_dim, "input_dim")
        register_positive_hyperparameter(self, "variance", (*self.batch_shape, 1, ard_num_dims or 1),
                                         variance_prior, variance_constraint)

    variance = PositiveHyperparameter()

    @property
    def num_features(self) -> int:
        if self.input_dim is None:
            raise RuntimeError("LinearFeatureKernel has width d = input_dim, unknown before the first call: "
                               "pass input_dim= (or ard_num_dims=), or x_sample= (points of the input space) to "
                               "rfgp.sketch, or call the kernel once")
        return self.input_dim

    def featurize(self, x: Tensor) -> Tensor:
        self._check_input_dim(x)
        return x * self._checked_variance().sqrt()

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖x ⊙ √v‖² = Σᵢ vᵢxᵢ² (as cheap as the features: sums and products with a linear part keep a closed form)."""
        self._check_input_dim(x)
        return (x.pow(2) * self._checked_variance()).sum(-1)

    def _checked_variance(self) -> Tensor:
        """v, checked finite (one reduction over its d entries): a NaN or infinite v would make Φ and k NaN."""
        variance = self.variance
        check_finite(variance, "variance")
        return variance

    def _check_input_dim(self, x: Tensor) -> None:
        if self.input_dim is None:
            self.input_dim = x.shape[-1]
        elif x.shape[-1] != self.input_dim:
            raise ValueError(f"x has {x.shape[-1]} input dimensions but LinearFeatureKernel has input_dim={self.input_dim}")


class ConstantFeatureKernel(_ExactFeatureKernel):
    r"""k(x, y) = c with the single feature √c (``gpytorch.kernels.ConstantKernel``).

    Args:
        constant_prior, constant_constraint: as in GPyTorch.
        kwargs: ``batch_shape``, ``active_dims``.
    """

    num_features = 1

    def __init__(self, constant_prior: Prior | None = None, constant_constraint: Interval | None = None,
                 **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        register_positive_hyperparameter(self, "constant", (*self.batch_shape, 1), constant_prior, constant_constraint)

    constant = PositiveHyperparameter()

    def featurize(self, x: Tensor) -> Tensor:
        root = self._checked_constant().sqrt().unsqueeze(-2)  # (*batch, 1, 1)
        return root.expand(*torch.broadcast_shapes(root.shape[:-2], x.shape[:-2]), x.shape[-2], 1)

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖√c‖² = c at every point."""
        constant = self._checked_constant()  # (*batch, 1)
        return constant.expand(*torch.broadcast_shapes(constant.shape[:-1], x.shape[:-2]), x.shape[-2])

    def _checked_constant(self) -> Tensor:
        """c, checked finite: a NaN or infinite c would make Φ and k NaN or Inf at every point."""
        constant = self.constant
        check_finite(constant, "constant")
        return constant

    # -------------------------------------------------------------- spectral
    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        return {"shape": torch.zeros(num_frequencies, input_dim, dtype=torch.float64)}

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        """ω = 0 (the measure is a point mass at the origin)."""
        zero = draws["shape"].to(self.raw_constant)
        return zero.expand(*self.batch_shape, *zero.shape)

    def spectral_weights(self, draws: dict[str, Tensor]) -> None:
        return None

    def spectral_amplitude(self) -> Tensor:
        return self.constant.squeeze(-1)


class CosineFeatureKernel(_ExactFeatureKernel):
    r"""k(x, y) = cos(π(x − y)/p) on 1-D inputs with features [cos(πx/p), sin(πx/p)] (GPyTorch's ``CosineKernel``).

    Args:
        period_length_prior, period_length_constraint: as in GPyTorch.
        kwargs: ``batch_shape``, ``active_dims``.

    Raises:
        ValueError: for inputs with more than one dimension (cos(π‖x − y‖/p) is not positive
            definite there, so no feature map exists).
    """

    num_features = 2
    is_stationary = True

    def __init__(self, period_length_prior: Prior | None = None, period_length_constraint: Interval | None = None,
                 **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        register_positive_hyperparameter(self, "period_length", (*self.batch_shape, 1, 1), period_length_prior,
                                         period_length_constraint)

    period_length = PositiveHyperparameter()

    @staticmethod
    def _check_one_dimensional(input_dim: int) -> None:
        if input_dim != 1:
            raise ValueError(
                f"CosineKernel cos(π‖x − y‖/p) is positive definite only on 1-D inputs, got input dimension "
                f"{input_dim}: select one column with active_dims, or use a product of per-dimension CosineKernels"
            )

    def featurize(self, x: Tensor) -> Tensor:
        phase = x * self._frequency(x)
        return torch.cat([torch.cos(phase), torch.sin(phase)], dim=-1)

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """cos² + sin² = 1 at every point (the period enters only the phase), with the checks of :meth:`featurize`."""
        frequency = self._frequency(x)
        shape = torch.broadcast_shapes(x.shape[:-1], frequency.shape[:-1])
        return torch.ones(shape, dtype=torch.promote_types(x.dtype, frequency.dtype), device=x.device)

    def _frequency(self, x: Tensor) -> Tensor:
        """π/p, ``(*batch, 1, 1)``, for 1-D inputs x; a NaN or infinite one raises (the features would be NaN)."""
        self._check_one_dimensional(x.shape[-1])
        frequency = math.pi / self.period_length
        check_finite(frequency, "π/period_length")
        return frequency

    # -------------------------------------------------------------- spectral
    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Random signs: the measure is the point pair ±π/p, and a product needs its symmetric draws — with ω = +π/p
        always, two cosine factors gave cos((π/p₁ + π/p₂)τ) instead of cos(πτ/p₁)·cos(πτ/p₂)."""
        self._check_one_dimensional(input_dim)
        signs = torch.randint(0, 2, (num_frequencies, 1), generator=generator, dtype=torch.int64)
        return {"shape": (2 * signs - 1).to(torch.float64)}

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        """ω = ±π/p, a random sign per frequency (the measure is the point pair ±π/p; cos is even)."""
        return draws["shape"].to(self.raw_period_length) * (math.pi / self.period_length)

    def spectral_weights(self, draws: dict[str, Tensor]) -> None:
        return None

    def spectral_amplitude(self) -> Tensor:
        return torch.ones(self.batch_shape, dtype=self.raw_period_length.dtype, device=self.raw_period_length.device)
