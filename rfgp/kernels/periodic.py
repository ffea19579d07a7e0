r"""Sketched periodic kernel: GPyTorch's ``PeriodicKernel`` with Bessel-weighted harmonic features.

k(x, y) = Π_i exp(−2 sin²(π(x_i − y_i)/p_i)/ℓ_i) (GPyTorch's convention: ℓ not squared), with
per-dimension period p and lengthscale ℓ under ``ard_num_dims``.  The features are
m^{−1/2}[√w cos ωᵀx, √w sin ωᵀx] over harmonics ω = s·2πk/p with importance weights
q_k(1/ℓ)/r(k), see :mod:`rfgp.features.periodic`: unbiased, differentiable in p and ℓ.
"""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval
from gpytorch.priors import Prior
from torch import Tensor

from ..features.periodic import PeriodicSpectralMeasure
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .spectral_kernel import SpectralFeatureKernel


class SketchedPeriodicKernel(SpectralFeatureKernel):
    r"""Periodic kernel exp(−2 Σ_i sin²(π(x_i − y_i)/p_i)/ℓ_i) approximated by F = 2m weighted harmonic features.

    Args:
        num_features: F = 2m.
        method: ``"rff"`` (the only sampler).
        seed, generator: randomness of the harmonics.
        period_length_prior, period_length_constraint: as in ``gpytorch.kernels.PeriodicKernel``.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedPeriodicKernel
        >>> kernel = SketchedPeriodicKernel(512, seed=0)
        >>> kernel.period_length = 2.0
        >>> kernel(torch.rand(10, 1)).shape
        torch.Size([10, 10])
    """

    has_lengthscale = True

    def __init__(self, num_features: int, method: str = "rff", seed: int | None = None,
                 generator: torch.Generator | None = None, period_length_prior: Prior | None = None,
                 period_length_constraint: Interval | None = None, **kwargs) -> None:
        super().__init__(PeriodicSpectralMeasure(), num_features, method=method, seed=seed, generator=generator,
                         **kwargs)
        ard_num_dims = kwargs.get("ard_num_dims") or 1
        register_positive_hyperparameter(self, "period_length", (*self.batch_shape, 1, ard_num_dims),
                                         period_length_prior, period_length_constraint)

    period_length = PositiveHyperparameter()

    def measure_hyperparameters(self) -> dict[str, Tensor]:
        return {"period": self.period_length, "lengthscale": self.lengthscale}
