"""Sketched RBF and Matérn kernels: GPyTorch's ``RBFKernel``/``MaternKernel`` with random Fourier features.

:class:`SketchedRBFKernel` is also the root of the RBF kernel's other approximation families
(:class:`~rfgp.kernels.MaclaurinRBFKernel`, :class:`~rfgp.kernels.GaussianSketchRBFKernel`), which
its ``method=`` argument selects.

The hyperparameters are named, constrained and initialised exactly like GPyTorch's
(``raw_lengthscale`` with a ``Positive`` constraint, ``lengthscale_prior``, ARD via
``ard_num_dims``), so priors, constraints and saved hyperparameters carry over; only
the covariance is replaced by Φ(x/ℓ)Φ(y/ℓ)ᵀ.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.config_state import METHOD
from ..core.validation import check_choice
from ..features import random
from ..features.base import FeatureMap
from ..features.fourier import RandomFourierFeatures
from ..features.spectral import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    SpectralDensity,
)
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .families import MethodDispatch, refuse_other_family_options
from .random_feature_kernel import RandomFeatureKernel

#: ``method`` names of the Fourier kernels and the frequency sampler each uses.
FOURIER_METHODS = {"rff": "iid", "orf": "orthogonal", "sorf": "structured"}


class ScaleMixtureSpectrum:
    r"""The spectral protocol of :class:`~rfgp.kernels.SpectralProductKernel` for Gaussian scale mixtures.

    Bochner: k(x − y) = a·E_ω[cos(ωᵀ(x − y))]; for RBF and Matérn, ω = s·g/ℓ with g ~ N(0, I_d)
    and an independent scalar s (s ≡ 1 for the RBF, s = √(2ν/u), u ~ χ²_{2ν} for Matérn-ν:
    multivariate Student-t, Rasmussen & Williams 2006 Eq. 4.15), a = k(x, x) = 1.

    * ``spectral_draws(m, d, generator)``: the hyperparameter-free draws g (and s), float64 CPU;
    * ``spectral_frequencies(draws)``: ω = s·g/ℓ, shape ``(*batch, m, d)``, differentiable in ℓ;
    * ``spectral_weights(draws)``: ``None`` (the draws follow the spectral measure exactly);
    * ``spectral_amplitude()``: k(x, x) = 1, batch-shaped.

    Products draw these i.i.d. even when the kernel's own map is ORF/SORF (the convolution
    ω₁ + ω₂ of orthogonal blocks is no longer orthogonal, so nothing would be gained), and
    for every RBF family (the protocol describes the kernel, not its approximation).
    """

    def spectral_density(self) -> SpectralDensity:
        raise NotImplementedError

    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        draws = {"normal": random.normal((num_frequencies, input_dim), generator)}
        scales = self.spectral_density().sample_scales(num_frequencies, generator)
        if scales is not None:
            draws["scale"] = scales
        return draws

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        frequencies = draws["normal"]
        if "scale" in draws:
            frequencies = frequencies * draws["scale"].unsqueeze(-1)
        return frequencies / self.lengthscale  # (*batch, 1, d or 1) broadcasts over the m rows

    def spectral_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        return None

    def spectral_amplitude(self) -> Tensor:
        return torch.ones(self.batch_shape, dtype=self.lengthscale.dtype, device=self.lengthscale.device)


class SketchedRBFKernel(MethodDispatch, ScaleMixtureSpectrum, ComplexPosteriorMixin, RandomFeatureKernel):
    r"""RBF kernel exp(−‖x − y‖²/(2ℓ²)) approximated by random Fourier features; the root of the RBF families.

    Φ(x) = m^{−1/2}[cos(Ωx/ℓ), sin(Ωx/ℓ)] with m = F/2 frequencies Ω ~ N(0, I) (Rahimi & Recht
    2007; Bochner's theorem, Rasmussen & Williams 2006 Eq. 4.10).

    Other approximation families of the RBF kernel are subclasses with their own options, and
    ``method=`` picks one (``SketchedRBFKernel.__new__`` returns the family's class, so
    ``isinstance(kernel, SketchedRBFKernel)`` holds for all of them, see :mod:`rfgp.kernels.families`):

    ================================================  ================================================
    ``method``                                        class
    ================================================  ================================================
    ``"rff"``, ``"orf"``, ``"sorf"``                  :class:`SketchedRBFKernel` (this class)
    ``"maclaurin"``                                   :class:`~rfgp.kernels.MaclaurinRBFKernel`
    ``"gaussian_sketch"``, ``"gaussian_sketch_hd"``   :class:`~rfgp.kernels.GaussianSketchRBFKernel`
    ================================================  ================================================

    Args:
        num_features: output width F of the feature map (F = 2m for m frequencies).
        method: ``"rff"`` (i.i.d. frequencies), ``"orf"`` (orthogonal, Yu et al. 2016 Eq. 2) or
            ``"sorf"`` (structured HD₁HD₂HD₃, Eq. 5; O(d log d) per frequency block); or the
            ``method`` of another family in the table above.
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed: seed of the frequencies (``None``: drawn from ``generator`` or torch's global one).
        generator: a ``torch.Generator`` for the frequencies, instead of ``seed``.
        **kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernel``; with the ``method`` of
            another family, that family's options.

    Raises:
        ValueError: an unknown ``method``, or an option of another family (naming the option
            and the class that takes it).
        TypeError: any other unexpected keyword argument.

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import SketchedRBFKernel, GaussianSketchRBFKernel
        >>> covar_module = gpytorch.kernels.ScaleKernel(
        ...     SketchedRBFKernel(num_features=256, method="sorf", ard_num_dims=3, seed=0))
        >>> covar_module(torch.rand(10, 3)).shape
        torch.Size([10, 10])
        >>> taylor = SketchedRBFKernel(256, method="gaussian_sketch", radius=1.0, alpha=1e-4,
        ...     min_lengthscale=0.5, input_dim=2, seed=0)
        >>> type(taylor).__name__, isinstance(taylor, SketchedRBFKernel)
        ('GaussianSketchRBFKernel', True)
    """

    family_methods = tuple(FOURIER_METHODS)
    # min_lengthscale and complex_posterior are saved for every family: states saved before the
    # families were split (one class, all fields) load into each family class bit for bit.
    config_fields = {"method": METHOD, "min_lengthscale": METHOD, "complex_posterior": METHOD}

    def __init__(
        self,
        num_features: int,
        method: str = "rff",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> None:
        check_choice(method, "method", self.all_methods())
        kwargs = refuse_other_family_options(self, method, kwargs)
        feature_map = RandomFourierFeatures(
            num_features, input_dim=_input_dim(input_dim, kwargs), spectral_density=GaussianSpectralDensity(),
            sampler=FOURIER_METHODS[method], seed=seed, generator=generator,
        )
        self._setup_rbf(method, feature_map, kwargs)

    def _setup_rbf(self, method: str, feature_map: FeatureMap, kwargs: dict, complex_posterior: bool = False,
                   min_lengthscale: float | None = None) -> None:
        """What every RBF family's ``__init__`` does once its map is built (families call it, not ``__init__``)."""
        self.method = method
        self.min_lengthscale = min_lengthscale
        weights = getattr(feature_map, "weights", "real")
        self.complex_posterior = check_complex_posterior(
            complex_posterior, getattr(feature_map, "is_complex", False), f"method={method!r}, weights={weights!r}"
        )
        RandomFeatureKernel.__init__(self, feature_map, **kwargs)

    def spectral_density(self) -> SpectralDensity:
        return GaussianSpectralDensity()


def _input_dim(input_dim: int | None, kwargs: dict) -> int | None:
    """``input_dim``, defaulting to ``ard_num_dims``."""
    return input_dim if input_dim is not None else kwargs.get("ard_num_dims")


class SketchedMaternKernel(ScaleMixtureSpectrum, RandomFeatureKernel):
    r"""Matérn kernel (ν ∈ {1/2, 3/2, 5/2}) approximated by random Fourier features.

    k(r) = 2^{1−ν}/Γ(ν)(√(2ν) r)^ν K_ν(√(2ν) r), r = ‖x − y‖/ℓ, as in
    ``gpytorch.kernels.MaternKernel``; frequencies are multivariate Student-t with 2ν
    degrees of freedom (Rasmussen & Williams 2006 Eq. 4.15).

    The lengthscale derivative of a feature, (ωᵀx/ℓ²)·sin(ωᵀx/ℓ) up to sign, needs E‖ω‖ < ∞ to
    estimate ∂k/∂ℓ and E‖ω‖² < ∞ for a variance: ν = 3/2 and 5/2 have both, but ν = ½ (Cauchy
    frequencies) has neither, so its marginal likelihood's lengthscale gradient — exact for this
    kernel — does not approach the exact Matérn-½ model's as F grows (see the README).

    Args:
        num_features: output width F of the feature map (F = 2m for m frequencies).
        nu: the smoothness ν, ``0.5``, ``1.5`` or ``2.5``.
        method: ``"rff"``, ``"orf"`` or ``"sorf"`` (the frequency sampler, as :class:`SketchedRBFKernel`).
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed: seed of the frequencies.
        generator: a ``torch.Generator`` for the frequencies, instead of ``seed``.
        **kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.MaternKernel``.

    Raises:
        ValueError: an unknown ``method`` or ``nu``.
        TypeError: an unexpected keyword argument.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedMaternKernel
        >>> kernel = SketchedMaternKernel(128, nu=1.5, method="orf", input_dim=2, seed=0)
        >>> kernel(torch.rand(5, 2)).shape
        torch.Size([5, 5])
    """

    config_fields = {"method": METHOD, "nu": METHOD}

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
        feature_map = RandomFourierFeatures(
            num_features,
            input_dim=_input_dim(input_dim, kwargs),
            spectral_density=MaternSpectralDensity(nu),
            sampler=FOURIER_METHODS[method],
            seed=seed,
            generator=generator,
        )
        self.nu = feature_map.spectral_density.nu
        super().__init__(feature_map, **kwargs)

    def spectral_density(self) -> SpectralDensity:
        return MaternSpectralDensity(self.nu)
