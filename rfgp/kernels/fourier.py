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
from ..core.validation import check_choice, check_finite
from ..features import random
from ..features.base import FeatureMap, widen_draws
from ..features.fourier import RandomFourierFeatures
from ..features.spectral import (
    GaussianSpectralDensity,
    MaternSpectralDensity,
    SpectralDensity,
)
from ..features.weighted_fourier import scale_sincos_pairs
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .families import MethodDispatch, refuse_other_family_options
from .first_evaluation import refuse_unfixed_state
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
      Matérn-½ divides by its anchor ℓ₀ instead (see :class:`SketchedMaternKernel`);
    * ``spectral_weights(draws)``: ``None`` (the draws follow the spectral measure exactly), or
      Matérn-½'s importance weights r(ℓ) (``spectral_log_weights(draws)``: log r);
    * ``spectral_amplitude()``: k(x, x) = 1, batch-shaped.

    Products draw these i.i.d. even when the kernel's own map is ORF/SORF (the convolution
    ω₁ + ω₂ of orthogonal blocks is no longer orthogonal, so nothing would be gained), and
    for every RBF family (the protocol describes the kernel, not its approximation).
    """

    #: the draws g (and s) depend on the seed alone (:meth:`SpectralProductKernel._apply` makes them again in float64)
    spectral_draws_follow_seed = True

    def spectral_density(self) -> SpectralDensity:
        raise NotImplementedError

    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        draws = {"normal": random.normal((num_frequencies, input_dim), generator)}
        scales = self.spectral_density().sample_scales(num_frequencies, generator)
        if scales is not None:
            draws["scale"] = scales
        return draws

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        return unit_frequencies(draws) / self.frequency_lengthscale()  # (*batch, 1, d or 1) broadcasts over m rows

    def spectral_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        return None

    def frequency_lengthscale(self) -> Tensor:
        """The lengthscale the frequencies are divided by: the kernel's (reparameterised frequencies)."""
        return self.lengthscale

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
        check_choice(method, "method", self.method_choices())
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


def unit_frequencies(draws: dict[str, Tensor]) -> Tensor:
    """ξ = s·g, the ``(m, d)`` frequencies at unit lengthscale of a scale mixture's draws."""
    frequencies = draws["normal"]
    return frequencies * draws["scale"].unsqueeze(-1) if "scale" in draws else frequencies


def _input_dim(input_dim: int | None, kwargs: dict) -> int | None:
    """``input_dim``, defaulting to ``ard_num_dims``."""
    return input_dim if input_dim is not None else kwargs.get("ard_num_dims")


class SketchedMaternKernel(ScaleMixtureSpectrum, RandomFeatureKernel):
    r"""Matérn kernel (ν ∈ {1/2, 3/2, 5/2}) approximated by random Fourier features.

    k(r) = 2^{1−ν}/Γ(ν)(√(2ν) r)^ν K_ν(√(2ν) r), r = ‖x − y‖/ℓ, as in
    ``gpytorch.kernels.MaternKernel``; frequencies are multivariate Student-t with 2ν
    degrees of freedom (Rasmussen & Williams 2006 Eq. 4.15).

    The lengthscale derivative of a feature of ω = ξ/ℓ, (ξᵀx/ℓ²)·sin(ξᵀx/ℓ) up to sign, needs
    E‖ξ‖ < ∞ to estimate ∂k/∂ℓ and E‖ξ‖² < ∞ for a variance: ν = 3/2 and 5/2 have both, but ν = ½
    (multivariate Cauchy ξ) has neither.  So for ν = ½ the lengthscale enters through *anchored
    importance weights* instead: the frequencies are fixed at ω = ξ/ℓ₀ for an anchor ℓ₀ (the
    buffer ``lengthscale_anchor``) and feature pair f is scaled by √r_f,

        r_f = p_ℓ(ω_f)/p_ℓ₀(ω_f) = Πᵢ(ℓᵢ/ℓ₀ᵢ)·[(1 + ‖ℓ₀⊙ω_f‖²)/(1 + ‖ℓ⊙ω_f‖²)]^{(d+1)/2}

    (:meth:`~rfgp.features.MaternSpectralDensity.lengthscale_log_weights`), so E[k̂] = k for every ℓ,
    r and ∂r/∂ℓ are bounded for ℓ/ℓ₀ in a compact range, and the lengthscale gradient converges
    like 1/√F.  r = 1 exactly at ℓ = ℓ₀, where Φ equals the reparameterised features bit for bit.
    ℓ₀ is set to the lengthscale (detached) at the first evaluation after the frequencies are drawn
    or redrawn (the first call, ``feature_map.resample()``; also when ``state_dict()`` is taken
    before that evaluation), when a spectral product draws this factor's frequencies, and by
    :func:`rfgp.set_num_features` (at any width).  A state saved without the anchor (before rfgp had
    it) loads with ℓ₀ = the loaded lengthscale, which reproduces that state's kernel.  Far from ℓ₀
    the weights' variance grows (E[r²] = 2.7 at ℓ/ℓ₀ = 3, d = 2; see guide/gpytorch.md): after training
    far from the initial lengthscale, :func:`rfgp.set_num_features` re-anchors at the trained one.

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
    #: ν = ½: the anchor ℓ₀ has the lengthscale's shape, one per batch member
    batched_buffers = ("lengthscale_anchor",)

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
        self._nu = feature_map.spectral_density.nu
        super().__init__(feature_map, **kwargs)
        if self.is_anchored:
            self.register_buffer("lengthscale_anchor", self.lengthscale.detach().clone())
            self._anchored_draws = None  # (seed, width) of the feature map's draws ℓ₀ was set for
            self.register_state_dict_pre_hook(_anchor_before_saving)
            self.register_load_state_dict_post_hook(_anchored_after_loading)

    @property
    def nu(self) -> float:
        """The smoothness ν, fixed at construction: the frequencies were drawn from its spectral density."""
        return self._nu

    @nu.setter
    def nu(self, value) -> None:
        raise AttributeError(
            f"{type(self).__name__}.nu is fixed at construction (its frequencies were drawn from the ν = {self._nu:g} "
            f"spectral density), so assigning nu = {value!r} would change nothing: build a new kernel with "
            f"nu={value!r} (rfgp.sketch converts a GPyTorch MaternKernel with its ν)"
        )

    @property
    def is_anchored(self) -> bool:
        """Whether ℓ enters through anchored importance weights (ν = ½) rather than the frequencies."""
        return self.nu == 0.5

    def spectral_density(self) -> SpectralDensity:
        return MaternSpectralDensity(self.nu)

    # ------------------------------------------------------------ ν = ½: anchored weights
    def anchor_lengthscale(self) -> None:
        """ℓ₀ ← ℓ (detached), for the feature map's current draws (made outside inference mode, like the draws, at a
        first call under ``torch.inference_mode()``: see :meth:`rfgp.features.FeatureMap._draw_at_first_call`)."""
        with torch.inference_mode(False):
            self.lengthscale_anchor = self.lengthscale.detach().clone()
        self._anchored_draws = self._draw_key()

    def _apply(self, fn, *args, **kwargs):
        """``.double()``, ``.to(...)``: an anchor ℓ₀ set in float32 that is the current ℓ rounded becomes the current ℓ
        in the wider dtype, as the seed's draws are made again in it (:meth:`rfgp.features.FeatureMap._apply`): the
        kernel is then the one built in float64 (before, kernel values 6·10⁻⁹ apart).  An anchor that ℓ has moved
        away from since (training) keeps its converted value."""
        drawn_in = self.lengthscale_anchor.dtype if self.is_anchored else None
        result = super()._apply(fn, *args, **kwargs)
        self._widen_anchor(drawn_in)
        return result

    def _widen_anchor(self, drawn_in: torch.dtype | None) -> None:
        """ℓ₀ ← ℓ in the anchor's dtype where ℓ₀ is ℓ rounded to the narrower ``drawn_in`` (``None``: nothing to do)."""
        if drawn_in is not None and torch.finfo(self.lengthscale_anchor.dtype).bits > torch.finfo(drawn_in).bits:
            with torch.inference_mode(False), torch.no_grad():
                widen_draws(self, {"lengthscale_anchor": self.lengthscale.detach().clone()}, drawn_in)

    def _draw_key(self) -> tuple[int, int]:
        return self.feature_map.seed, self.feature_map.num_features

    def state_fixed_at_first_evaluation(self) -> str | None:
        if self.is_anchored and self._anchored_draws != self._draw_key():
            return "its lengthscale anchor ℓ₀"
        return super().state_fixed_at_first_evaluation()

    def _anchor_if_redrawn(self) -> None:
        if self._anchored_draws != self._draw_key():
            self.anchor_lengthscale()

    def frequency_lengthscale(self) -> Tensor:
        return self.lengthscale_anchor if self.is_anchored else self.lengthscale

    def scale_inputs(self, x: Tensor) -> Tensor:
        """x/ℓ, or x/ℓ₀ for ν = ½ (ℓ then enters :meth:`featurize` through the weights)."""
        if not self.is_anchored:
            return super().scale_inputs(x)
        self._anchor_if_redrawn()
        return x.div(self.lengthscale_anchor)

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√A·Φ(x) (``None``: Φ(x)); for ν = ½ Φ's pair f times √r_f, and √A folded with the importance weights
        r(ℓ) into the same pair scales √(A·r_f/m)."""
        if not self.is_anchored:
            return super().folded_features(x, log_amplitude)
        scaled = self.scale_inputs(x)
        if log_amplitude is None:
            features = self.feature_map(scaled)
            xi = self.feature_map.frequency_matrix().to(features)
            return scale_sincos_pairs(features, (0.5 * self._log_weights(xi)).exp().to(features.dtype))
        self.feature_map.prepare(scaled)  # the draws, before the weights of their frequencies
        log_weights = self._log_weights(self.feature_map.frequency_matrix().to(scaled))
        return self.sincos_amplitude_features(scaled, log_amplitude, log_weights)

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """‖Φ(x)‖² without featurising x: 1 for ν = 3/2, 5/2 (cos² + sin² = 1); for ν = ½, whose pair f is
        √r_f·m^{−1/2}[cos, sin], (1/m)·Σ_f r_f(ℓ), the same for every x and differentiable in ℓ like the features."""
        norms = self.map_squared_norm(x)
        if norms is None or not self.is_anchored:
            return norms
        xi = self.feature_map.frequency_matrix().to(norms)
        return norms * self._log_weights(xi).exp().to(norms.dtype).mean(-1, keepdim=True)

    def _log_weights(self, unit_frequencies: Tensor) -> Tensor:
        """log r of the frequencies ξ/ℓ₀, ``(*batch, m)``; finite exactly when ℓ is finite and positive.

        x/ℓ₀ stays finite whatever ℓ is, so this check stands in for the feature map's check of x/ℓ: a NaN,
        infinite or zero ℓ raises (the kernel's call names the hyperparameter) instead of NaN or zero features.
        """
        ratio = self.lengthscale / self.lengthscale_anchor.to(self.lengthscale)
        log_weights = self.spectral_density().lengthscale_log_weights(unit_frequencies, ratio)
        check_finite(log_weights, "the Matérn-½ importance weights log r(ℓ/ℓ₀)")
        return log_weights

    def spectral_draws_made(self) -> None:
        """A product drew this factor's frequencies: ξ/ℓ₀ are fixed from here on (ℓ₀ ← ℓ for ν = ½)."""
        if self.is_anchored:
            self.anchor_lengthscale()

    def spectral_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        log_weights = self.spectral_log_weights(draws)
        return None if log_weights is None else log_weights.exp()

    def spectral_log_weights(self, draws: dict[str, Tensor]) -> Tensor | None:
        if not self.is_anchored:
            return None
        return self._log_weights(unit_frequencies(draws).to(self.lengthscale))

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        key = prefix + "lengthscale_anchor"
        if self.is_anchored and key not in state_dict:
            # saved before the anchor existed (or GPyTorch's MaternKernel, strict=False): its features were those of
            # ℓ₀ = ℓ (r ≡ 1), ℓ just loaded
            if key in missing_keys:
                missing_keys.remove(key)
            self.lengthscale_anchor = self.lengthscale.detach().clone()
        elif self.is_anchored and state_dict[key].is_floating_point():
            self._widen_anchor(state_dict[key].dtype)  # a float32 state in a float64 kernel: as .double() after it


def _anchor_before_saving(module: SketchedMaternKernel, prefix: str, keep_vars: bool) -> None:
    """A state saved between a redraw and the next evaluation holds the anchor that evaluation would set (refused,
    as that evaluation is, in a copy or a holder of loaded samples: :mod:`rfgp.kernels.first_evaluation`)."""
    refuse_unfixed_state(module)
    module._anchor_if_redrawn()


def _anchored_after_loading(module: SketchedMaternKernel, incompatible_keys) -> None:
    """The loaded anchor belongs to the loaded draws (the feature map, a child, has adopted their seed by now)."""
    module._anchored_draws = module._draw_key()
