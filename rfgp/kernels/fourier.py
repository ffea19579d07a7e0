"""Sketched RBF and Matérn kernels: GPyTorch's ``RBFKernel``/``MaternKernel`` with random Fourier features.

The RBF kernel also accepts the truncated-Taylor GaussianSketch/GaussianSketchHD maps of paper 003
(``method="gaussian_sketch"``/``"gaussian_sketch_hd"``).

The hyperparameters are named, constrained and initialised exactly like GPyTorch's
(``raw_lengthscale`` with a ``Positive`` constraint, ``lengthscale_prior``, ARD via
``ard_num_dims``), so priors, constraints and saved hyperparameters carry over; only
the covariance is replaced by Φ(x/ℓ)Φ(y/ℓ)ᵀ.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import check_choice, check_positive_float
from ..core.config_state import METHOD
from ..features.fourier import RandomFourierFeatures
from ..features.gaussian_sketch import GaussianSketch, GaussianSketchHD
from ..features import random
from ..features.spectral import GaussianSpectralDensity, MaternSpectralDensity, SpectralDensity
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .random_feature_kernel import RandomFeatureKernel

#: ``method`` names of the Fourier kernels and the frequency sampler each uses.
FOURIER_METHODS = {"rff": "iid", "orf": "orthogonal", "sorf": "structured"}
#: options of ``SketchedRBFKernel(method="maclaurin")`` passed to :class:`~rfgp.features.OptimizedMaclaurin`
MACLAURIN_OPTIONS = ("projection", "weights", "srht_blocks", "min_order", "max_order", "sample_size", "bias_correction")
#: ``method`` names of the truncated-Taylor sketches of the RBF kernel (paper 003).
GAUSSIAN_SKETCH_METHODS = {"gaussian_sketch": GaussianSketch, "gaussian_sketch_hd": GaussianSketchHD}


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
    ω₁ + ω₂ of orthogonal blocks is no longer orthogonal, so nothing would be gained).
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


class SketchedRBFKernel(ScaleMixtureSpectrum, ComplexPosteriorMixin, RandomFeatureKernel):
    r"""RBF kernel exp(−‖x − y‖²/(2ℓ²)) approximated by random Fourier features.

    Args:
        num_features: output width F of the feature map (F = 2m for m frequencies).
        method: ``"rff"`` (i.i.d. frequencies), ``"orf"`` (orthogonal, Yu et al. 2016 Eq. 2),
            ``"sorf"`` (structured HD₁HD₂HD₃, Eq. 5; O(d log d) per frequency block);
            ``"maclaurin"``: optimized Maclaurin features of e^{−‖x‖²/2}e^{−‖y‖²/2}e^{xᵀy}
            (paper 000 §5.4, :class:`~rfgp.features.OptimizedMaclaurin`, by default TensorSRHT
            with CtR weights — 2–3× lower Gram error than Rademacher real weights and 3–4× lower
            than RFF in ``benchmarks/results/maclaurin_defaults.md``; keyword options
            ``projection``, ``weights``, ``max_order``, ``bias_correction``, … go to it;
            the allocation is fitted on the first inputs, refit with
            :func:`rfgp.kernels.refit_allocation`);
            ``"gaussian_sketch"``/``"gaussian_sketch_hd"``: GaussianSketch(HD) of paper 003, a
            sketch of the Taylor expansion truncated at order s (only these take the arguments
            below; the truncation bias k(x, x) − K_s(x, x) goes to the variance correction).
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed, generator: randomness of the frequencies / sketches.
        order: the truncation order s; or ``None`` to derive it from ``radius`` and ``alpha``.
        radius: bound on ‖x − center‖_∞ (GaussianSketch) or ‖x − center‖₂ (HD) in INPUT units.
        alpha: target additive error of the kernel distance (paper 003 Thms 3.1/3.3).
        center: c, subtracted from the inputs before scaling (the expansion is around 0).
        min_lengthscale: the smallest lengthscale s is chosen for (radius/min_lengthscale in
            lengthscale units; default ln 2, GPyTorch's initial lengthscale).  A lengthscale
            below it raises an error instead of silently exceeding the truncation bound;
            ``lengthscale_constraint=gpytorch.constraints.GreaterThan(min_lengthscale)`` prevents it.
        mode: GaussianSketch only: ``"auto"``, ``"tree"`` or ``"explicit"``.
        complex_posterior: with ``method="maclaurin"`` and ``weights="complex"``/``"ctr"``, the
            complex-feature GP of paper 000 App. D (see :class:`~rfgp.kernels.SketchedPolynomialKernel`);
            ``ValueError`` for every real-weight map.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernel``.

    Example:
        >>> covar_module = gpytorch.kernels.ScaleKernel(
        ...     SketchedRBFKernel(num_features=1024, method="sorf", ard_num_dims=3))
        >>> taylor = SketchedRBFKernel(1024, method="gaussian_sketch", radius=2.0, alpha=1e-4,
        ...     min_lengthscale=0.5, input_dim=2)
    """

    config_fields = {"method": METHOD, "min_lengthscale": METHOD, "complex_posterior": METHOD}

    def __init__(
        self,
        num_features: int,
        method: str = "rff",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        order: int | None = None,
        radius: float | None = None,
        alpha: float | None = None,
        center=None,
        min_lengthscale: float | None = None,
        mode: str | None = None,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        check_choice(method, "method", (*FOURIER_METHODS, "maclaurin", *GAUSSIAN_SKETCH_METHODS))
        self.method = method
        input_dim = input_dim if input_dim is not None else kwargs.get("ard_num_dims")
        taylor = {"order": order, "radius": radius, "alpha": alpha, "center": center,
                  "min_lengthscale": min_lengthscale, "mode": mode}
        self.min_lengthscale = None
        given = [name for name, value in taylor.items() if value is not None]
        if given and method not in GAUSSIAN_SKETCH_METHODS:
            raise ValueError(f"{given} only apply to method='gaussian_sketch'/'gaussian_sketch_hd', got method={method!r}")
        if method == "maclaurin":
            from ..features import dot_product
            from ..features.maclaurin import OptimizedMaclaurin

            options = {key: kwargs.pop(key) for key in MACLAURIN_OPTIONS if key in kwargs}
            feature_map = OptimizedMaclaurin(
                dot_product.gaussian(), num_features, input_dim=input_dim, seed=seed, generator=generator, **options
            )
        elif method in FOURIER_METHODS:
            feature_map = RandomFourierFeatures(
                num_features, input_dim=input_dim, spectral_density=GaussianSpectralDensity(),
                sampler=FOURIER_METHODS[method], seed=seed, generator=generator,
            )
        else:
            if radius is not None:
                self.min_lengthscale = check_positive_float(
                    math.log(2) if min_lengthscale is None else min_lengthscale, "min_lengthscale")
                radius = check_positive_float(radius, "radius", allow_zero=True) / self.min_lengthscale
            options = {"mode": mode} if mode is not None else {}
            feature_map = GAUSSIAN_SKETCH_METHODS[method](
                num_features, order=order, radius=radius, alpha=alpha, input_dim=input_dim,
                seed=seed, generator=generator, **options,
            )
        weights = getattr(feature_map, "weights", "real")
        self.complex_posterior = check_complex_posterior(
            complex_posterior, getattr(feature_map, "is_complex", False), f"method={method!r}, weights={weights!r}"
        )
        super().__init__(feature_map, **kwargs)
        # a None buffer when absent: GPyTorch's batch expansion (__getitem__) walks every buffer
        center = None if center is None else torch.as_tensor(center, dtype=torch.get_default_dtype()).reshape(-1)
        self.register_buffer("input_center", center)

    def scale_inputs(self, x: Tensor) -> Tensor:
        """(x − c)/ℓ; for the Taylor sketches, refuses a lengthscale below the one s was chosen for."""
        if self.min_lengthscale is not None and bool((self.lengthscale < self.min_lengthscale * (1 - 1e-6)).any()):
            raise ValueError(
                f"lengthscale {self.lengthscale.min().item():.4g} is below min_lengthscale={self.min_lengthscale:.4g} "
                f"for which the truncation order s={self.feature_map.order} was chosen (radius/lengthscale grew, so "
                "the truncation bound no longer holds): rebuild the kernel with a smaller min_lengthscale or "
                "constrain it with lengthscale_constraint=gpytorch.constraints.GreaterThan(min_lengthscale)"
            )
        if self.input_center is not None:
            x = x - self.input_center.to(x)
        return super().scale_inputs(x)

    def spectral_density(self) -> SpectralDensity:
        return GaussianSpectralDensity()


class SketchedMaternKernel(ScaleMixtureSpectrum, RandomFeatureKernel):
    r"""Matérn kernel (ν ∈ {1/2, 3/2, 5/2}) approximated by random Fourier features.

    k(r) = 2^{1−ν}/Γ(ν)(√(2ν) r)^ν K_ν(√(2ν) r), r = ‖x − y‖/ℓ, as in
    ``gpytorch.kernels.MaternKernel``; frequencies are multivariate Student-t with 2ν
    degrees of freedom.  Arguments as :class:`SketchedRBFKernel`, plus ``nu``.
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
            input_dim=input_dim if input_dim is not None else kwargs.get("ard_num_dims"),
            spectral_density=MaternSpectralDensity(nu),
            sampler=FOURIER_METHODS[method],
            seed=seed,
            generator=generator,
        )
        self.nu = feature_map.spectral_density.nu
        super().__init__(feature_map, **kwargs)

    def spectral_density(self) -> SpectralDensity:
        return MaternSpectralDensity(self.nu)
