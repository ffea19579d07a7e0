r"""Sketched rational quadratic kernel: GPyTorch's ``RQKernel`` with importance-weighted Gamma-mixture features.

k(x, y) = (1 + (x − y)ᵀΘ⁻²(x − y)/(2α))^{−α}; frequencies ω = g√τ/ℓ with τ from a fixed
Gamma-mixture proposal and weights Gamma(τ; α, α)/r(τ), see
:mod:`rfgp.features.rational_quadratic`: unbiased, smooth in α and ℓ.
"""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval
from gpytorch.priors import Prior
from torch import Tensor

from ..features.rational_quadratic import RationalQuadraticSpectralMeasure
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .spectral_kernel import SpectralFeatureKernel


class SketchedRQKernel(SpectralFeatureKernel):
    r"""Rational quadratic kernel (1 + r²/(2α))^{−α}, r = ‖Θ⁻¹(x − y)‖, with F = 2m random features, α trainable.

    Args:
        num_features: F = 2m.
        method: ``"rff"``.
        seed, generator: randomness.
        alpha_constraint: as in ``gpytorch.kernels.RQKernel`` (default ``Positive``);
            ``alpha_prior`` (GPyTorch's RQKernel has none) may be given too.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedRQKernel
        >>> kernel = SketchedRQKernel(1024, ard_num_dims=2, seed=0)
        >>> kernel.alpha = 0.5
        >>> kernel(torch.rand(10, 2)).shape
        torch.Size([10, 10])
    """

    has_lengthscale = True

    def __init__(self, num_features: int, method: str = "rff", seed: int | None = None,
                 generator: torch.Generator | None = None, alpha_constraint: Interval | None = None,
                 alpha_prior: Prior | None = None, **kwargs) -> None:
        super().__init__(RationalQuadraticSpectralMeasure(), num_features, method=method, seed=seed,
                         generator=generator, **kwargs)
        register_positive_hyperparameter(self, "alpha", (*self.batch_shape, 1), alpha_prior, alpha_constraint)

    alpha = PositiveHyperparameter()

    def measure_hyperparameters(self) -> dict[str, Tensor]:
        return {"lengthscale": self.lengthscale, "alpha": self.alpha}
