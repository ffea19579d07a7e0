"""Sketched RBF and Matérn kernels: GPyTorch's ``RBFKernel``/``MaternKernel`` with random Fourier features.

The hyperparameters are named, constrained and initialised exactly like GPyTorch's
(``raw_lengthscale`` with a ``Positive`` constraint, ``lengthscale_prior``, ARD via
``ard_num_dims``), so priors, constraints and saved hyperparameters carry over; only
the covariance is replaced by Φ(x/ℓ)Φ(y/ℓ)ᵀ.
"""

from __future__ import annotations

import torch

from .._validation import check_choice
from ..features.fourier import RandomFourierFeatures
from ..features.spectral import GaussianSpectralDensity, MaternSpectralDensity
from .random_feature_kernel import RandomFeatureKernel

#: ``method`` names of the Fourier kernels and the frequency sampler each uses.
FOURIER_METHODS = {"rff": "iid", "orf": "orthogonal", "sorf": "structured"}
#: options of ``SketchedRBFKernel(method="maclaurin")`` passed to :class:`~rfgp.features.OptimizedMaclaurin`
MACLAURIN_OPTIONS = ("projection", "weights", "srht_blocks", "min_order", "max_order", "sample_size", "bias_correction")


class SketchedRBFKernel(RandomFeatureKernel):
    r"""RBF kernel exp(−‖x − y‖²/(2ℓ²)) approximated by random Fourier features.

    Args:
        num_features: output width F of the feature map (F = 2m for m frequencies).
        method: ``"rff"`` (i.i.d. frequencies), ``"orf"`` (orthogonal, Yu et al. 2016 Eq. 2),
            ``"sorf"`` (structured HD₁HD₂HD₃, Eq. 5; O(d log d) per frequency block) or
            ``"maclaurin"``: optimized Maclaurin features of e^{−‖x‖²/2}e^{−‖y‖²/2}e^{xᵀy}
            (paper 000 §5.4, :class:`~rfgp.features.OptimizedMaclaurin`; keyword options
            ``projection``, ``weights``, ``max_order``, ``bias_correction``, … go to it;
            the allocation is fitted on the first inputs, refit with
            :func:`rfgp.kernels.refit_allocation`).
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed, generator: randomness of the frequencies.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernel``.

    Example:
        >>> covar_module = gpytorch.kernels.ScaleKernel(
        ...     SketchedRBFKernel(num_features=1024, method="sorf", ard_num_dims=3))
    """

    def __init__(
        self,
        num_features: int,
        method: str = "rff",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> None:
        check_choice(method, "method", (*FOURIER_METHODS, "maclaurin"))
        self.method = method
        input_dim = input_dim if input_dim is not None else kwargs.get("ard_num_dims")
        if method == "maclaurin":
            from .. import dot_product
            from ..features.maclaurin import OptimizedMaclaurin

            options = {key: kwargs.pop(key) for key in MACLAURIN_OPTIONS if key in kwargs}
            feature_map = OptimizedMaclaurin(
                dot_product.gaussian(), num_features, input_dim=input_dim, seed=seed, generator=generator, **options
            )
            super().__init__(feature_map, **kwargs)
            return
        feature_map = RandomFourierFeatures(
            num_features,
            input_dim=input_dim,
            spectral_density=GaussianSpectralDensity(),
            sampler=FOURIER_METHODS[method],
            seed=seed,
            generator=generator,
        )
        super().__init__(feature_map, **kwargs)


class SketchedMaternKernel(RandomFeatureKernel):
    r"""Matérn kernel (ν ∈ {1/2, 3/2, 5/2}) approximated by random Fourier features.

    k(r) = 2^{1−ν}/Γ(ν)(√(2ν) r)^ν K_ν(√(2ν) r), r = ‖x − y‖/ℓ, as in
    ``gpytorch.kernels.MaternKernel``; frequencies are multivariate Student-t with 2ν
    degrees of freedom.  Arguments as :class:`SketchedRBFKernel`, plus ``nu``.
    """

    def __init__(
        self,
        num_features: int,
        nu: float = 2.5,
        method: str = "rff",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> None:
        check_choice(method, "method", tuple(FOURIER_METHODS))
        self.method = method
        self.nu = nu
        feature_map = RandomFourierFeatures(
            num_features,
            input_dim=input_dim if input_dim is not None else kwargs.get("ard_num_dims"),
            spectral_density=MaternSpectralDensity(nu),
            sampler=FOURIER_METHODS[method],
            seed=seed,
            generator=generator,
        )
        super().__init__(feature_map, **kwargs)
