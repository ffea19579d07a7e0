"""GPyTorch kernels with Maclaurin features (paper 000 §5): the exponential kernel, the polynomial
kernel's ``method="maclaurin" | "random_maclaurin"``, and refitting the allocation.

``SketchedRBFKernel(method="maclaurin")`` (in :mod:`rfgp.kernels.fourier`) covers the Gaussian
kernel.  All of them are trainable by the marginal likelihood with the draws fixed: the
lengthscale divides the inputs (and the Gaussian prefactor e^{−‖x/ℓ‖²/2} is differentiable),
the polynomial offset ν enters through √aₙ = √C(p, n)ν^{(p−n)/2}.  The allocation (p*, Dₙ) is
chosen for the hyperparameters at fitting time; after training call :func:`refit_allocation`
on the training inputs (it redraws the sketches for the new widths).
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from ..features import dot_product
from ..core.config_state import METHOD
from ..core.validation import check_choice
from ..features.maclaurin import OptimizedMaclaurin, RandomMaclaurin
from .polynomial import SketchedPolynomialKernel, register_polynomial_method
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .random_feature_kernel import RandomFeatureKernel

MACLAURIN_METHODS = ("maclaurin", "random_maclaurin")


@register_polynomial_method("maclaurin")
def _optimized(power, num_features, input_dim, seed, generator, **options):
    return OptimizedMaclaurin(dot_product.polynomial(power, 1.0), num_features, input_dim=input_dim,
                              max_order=power, seed=seed, generator=generator, **options)


@register_polynomial_method("random_maclaurin")
def _random(power, num_features, input_dim, seed, generator, **options):
    return RandomMaclaurin(dot_product.polynomial(power, 1.0), num_features, input_dim=input_dim,
                           max_order=power, seed=seed, generator=generator, **options)


class SketchedExponentialKernel(ComplexPosteriorMixin, RandomFeatureKernel):
    r"""Exponential dot-product kernel k(x, y) = exp(xᵀy/ℓ²) with Maclaurin features (paper 000 Eq. 38).

    Args:
        num_features: real output width F (the constant column included).
        method: ``"maclaurin"`` (:class:`~rfgp.features.OptimizedMaclaurin`) or
            ``"random_maclaurin"`` (:class:`~rfgp.features.RandomMaclaurin`, degrees ≤ ``max_order``).
        input_dim, seed, generator: as the other sketched kernels.
        complex_posterior: with ``weights="complex"``/``"ctr"``, the complex-feature GP of paper 000
            App. D (see :class:`~rfgp.kernels.SketchedPolynomialKernel`); ``ValueError`` for real weights.
        kwargs: feature-map options (``projection``, ``weights``, ``max_order``,
            ``bias_correction``, …; optimized Maclaurin defaults to TensorSRHT + CtR, Random
            Maclaurin to Kar & Karnick's Rademacher real weights) and GPyTorch ``Kernel``
            arguments (``ard_num_dims``, …).
    """

    config_fields = {"method": METHOD, "complex_posterior": METHOD}

    def __init__(self, num_features: int, method: str = "maclaurin", input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None,
                 complex_posterior: bool = False, **kwargs) -> None:
        self.method = check_choice(method, "method", MACLAURIN_METHODS)
        cls = OptimizedMaclaurin if method == "maclaurin" else RandomMaclaurin
        names = cls.__init__.__code__.co_varnames[: cls.__init__.__code__.co_argcount]
        options = {key: kwargs.pop(key) for key in list(kwargs) if key in names}
        input_dim = input_dim if input_dim is not None else kwargs.get("ard_num_dims")
        feature_map = cls(dot_product.exponential(), num_features, input_dim=input_dim, seed=seed,
                          generator=generator, **options)
        self.complex_posterior = check_complex_posterior(
            complex_posterior, feature_map.is_complex, f"weights={feature_map.weights!r}"
        )
        super().__init__(feature_map, **kwargs)


def refit_allocation(kernel: Kernel, x: Tensor) -> Kernel:
    """Refit the optimized Maclaurin allocation of ``kernel`` (possibly inside a ScaleKernel) on inputs x.

    Uses the kernel's current lengthscale (and polynomial offset); the sketches are redrawn for
    the new widths from the map's seed.  Call it after (or between rounds of) hyperparameter
    training, e.g. ``refit_allocation(model.covar_module, train_x)``.
    """
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    feature_map = getattr(base, "feature_map", None)
    if not isinstance(feature_map, OptimizedMaclaurin):
        raise TypeError(f"kernel has no OptimizedMaclaurin feature map to refit, got {type(base).__name__}")
    if base.active_dims is not None:
        x = x.index_select(-1, base.active_dims)
    with torch.no_grad():
        scaled = base.scale_inputs(x)
        spec = None
        if isinstance(base, SketchedPolynomialKernel):
            spec = dot_product.polynomial(base.power, float(base.offset.mean()))
        feature_map.fit(scaled, kernel=spec)
    return kernel
