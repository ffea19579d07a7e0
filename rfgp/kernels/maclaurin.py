"""GPyTorch kernels with Maclaurin features (paper 000 §5): the RBF and exponential kernels, the
polynomial kernel's ``method="maclaurin" | "random_maclaurin"``, and refitting the allocation.

All of them are trainable by the marginal likelihood with the draws fixed: the
lengthscale divides the inputs (and the Gaussian prefactor e^{−‖x/ℓ‖²/2} is differentiable),
the polynomial offset ν enters through √aₙ = √C(p, n)ν^{(p−n)/2}.  The allocation (p*, Dₙ) is
chosen for the hyperparameters at fitting time; :func:`rfgp.fit_mll` refits it when training made it
stale and trains on (``TrainingHistory.refits``); with another training loop call :func:`refit_allocation` on
the training inputs after training (it redraws the sketches for the new widths) and train on.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor

from ..core.config_state import METHOD
from ..core.user_warnings import warn as warn_user
from ..core.validation import check_choice
from ..features import dot_product
from ..features.base import FeatureMap
from ..features.maclaurin import OptimizedMaclaurin, RandomMaclaurin
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .families import MethodDispatch, refuse_other_family_options
from .fourier import SketchedRBFKernel, _input_dim
from .polynomial import SketchedPolynomialKernel, register_polynomial_method
from .random_feature_kernel import RandomFeatureKernel

#: the least share E k̂(x, x)/k(x, x) a fitted optimized Maclaurin map of an rfgp kernel (RBF, exponential,
#: polynomial) may carry at the median sample point (float32's ε; see OptimizedMaclaurin's min_share)
_MIN_SHARE = float(torch.finfo(torch.float32).eps)


@register_polynomial_method("maclaurin", options=("min_order", "sample_size", "bias_correction"))
def _optimized(power, num_features, input_dim, seed, generator, **options):
    return OptimizedMaclaurin(dot_product.polynomial(power, 1.0), num_features, input_dim=input_dim,
                              max_order=power, seed=seed, generator=generator, min_share=_MIN_SHARE, **options)


@register_polynomial_method("random_maclaurin", options=("bias_correction",))
def _random(power, num_features, input_dim, seed, generator, **options):
    return RandomMaclaurin(dot_product.polynomial(power, 1.0), num_features, input_dim=input_dim,
                           max_order=power, seed=seed, generator=generator, **options)


class MaclaurinRBFKernel(SketchedRBFKernel):
    r"""RBF kernel exp(−‖x − y‖²/(2ℓ²)) with optimized Maclaurin features (paper 000 §5.4).

    exp(−‖z − z'‖²/2) = e^{−‖z‖²/2} e^{−‖z'‖²/2} e^{zᵀz'} (z = x/ℓ): the dot-product factor
    e^{zᵀz'} = Σₙ (zᵀz')ⁿ/n! is sketched degree by degree (:class:`~rfgp.features.OptimizedMaclaurin`,
    widths Dₙ allocated to minimise the variance, paper 000 Eq. 38) and multiplied by the
    Gaussian prefactors.  By default TensorSRHT with CtR weights: 2–3× lower Gram error than
    Rademacher real weights and 3–4× lower than RFF (``benchmarks/results/maclaurin_defaults.md``).
    The allocation is fitted on the first inputs the kernel sees; :func:`rfgp.fit_mll` refits it when training
    made it stale (with another training loop, call :func:`refit_allocation` after training and train on).
    Also built by ``SketchedRBFKernel(F, method="maclaurin", ...)``.

    Args:
        num_features: real output width F (the constant column included).
        method: ``"maclaurin"`` (the only method of this family).
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed: seed of the sketches.
        generator: a ``torch.Generator`` for the sketches, instead of ``seed``.
        projection: the sketch of each degree, ``"srht"`` (TensorSRHT) or another projection of
            :class:`~rfgp.features.OptimizedMaclaurin`.
        weights: ``"ctr"``, ``"complex"``, ``"rademacher"``, ... (the random weights' distribution).
        srht_blocks: ``"tiled"`` or another SRHT block layout of the map.
        min_order, max_order: the degrees n the allocation may use, ``min_order ≤ n ≤ max_order``
            (``max_order=None``: the order rises while it can lower the objective, see ``OptimizedMaclaurin``).
        sample_size: number of inputs the allocation is fitted on.
        bias_correction: add the expected truncation bias to the variance correction.
        complex_posterior: with ``weights="complex"``/``"ctr"``, the complex-feature GP of paper 000
            App. D (see :class:`~rfgp.kernels.SketchedPolynomialKernel`); ``ValueError`` for real weights.
        **kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernel``.

    Raises:
        ValueError: an option of another RBF family (naming it and the class that takes it), or
            an invalid option value (named by the feature map).

    Example:
        >>> import torch
        >>> from rfgp.kernels import MaclaurinRBFKernel, SketchedRBFKernel
        >>> kernel = MaclaurinRBFKernel(64, input_dim=2, seed=0, max_order=4)
        >>> kernel(torch.rand(5, 2)).shape
        torch.Size([5, 5])
        >>> type(SketchedRBFKernel(64, method="maclaurin", input_dim=2, seed=0)).__name__
        'MaclaurinRBFKernel'
    """

    family_methods = ("maclaurin",)
    legacy_type_names = ("SketchedRBFKernel",)

    def __init__(
        self,
        num_features: int,
        method: str = "maclaurin",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        *,
        projection: str = "srht",
        weights: str = "ctr",
        srht_blocks: str = "tiled",
        min_order: int = 1,
        max_order: int | None = 10,
        sample_size: int = 500,
        bias_correction: bool = True,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        check_choice(method, "method", self.family_methods)
        kwargs = refuse_other_family_options(self, method, kwargs)
        feature_map = OptimizedMaclaurin(
            dot_product.gaussian(), num_features, input_dim=_input_dim(input_dim, kwargs), projection=projection,
            weights=weights, srht_blocks=srht_blocks, min_order=min_order, max_order=max_order,
            sample_size=sample_size, bias_correction=bias_correction, seed=seed, generator=generator,
            min_share=_MIN_SHARE,
        )
        self._setup_rbf(method, feature_map, kwargs, complex_posterior=complex_posterior)


class SketchedExponentialKernel(MethodDispatch, ComplexPosteriorMixin, RandomFeatureKernel):
    r"""Exponential dot-product kernel k(x, y) = exp(xᵀy/ℓ²) with optimized Maclaurin features (paper 000 Eq. 38).

    exp(zᵀz') = Σₙ (zᵀz')ⁿ/n! (z = x/ℓ), each degree n sketched with width Dₙ, the widths allocated
    to minimise the variance on the first inputs (:class:`~rfgp.features.OptimizedMaclaurin`;
    refit with :func:`refit_allocation`).  ``method="random_maclaurin"`` returns a
    :class:`RandomMaclaurinExponentialKernel` instead (``SketchedExponentialKernel.__new__``
    picks the family class, see :mod:`rfgp.kernels.families`).

    Args:
        num_features: real output width F (the constant column included).
        method: ``"maclaurin"``; or ``"random_maclaurin"`` for :class:`RandomMaclaurinExponentialKernel`.
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed: seed of the sketches.
        generator: a ``torch.Generator`` for the sketches, instead of ``seed``.
        projection: the sketch of each degree (default ``"srht"``, TensorSRHT).
        weights: ``"ctr"`` (default), ``"complex"`` or ``"real"``.
        srht_blocks: SRHT block layout, ``"tiled"`` or ``"independent"``.
        min_order, max_order: the degrees n the allocation may use, ``min_order ≤ n ≤ max_order``
            (``max_order=None``: the order rises while it can lower the objective, see ``OptimizedMaclaurin``).
        sample_size: number of inputs the allocation is fitted on.
        widths: a fixed allocation (D₁, …, D_p) instead of fitting one.
        x_sample: inputs (in scaled units) to fit the allocation on at construction.
        bias_correction: add the expected truncation bias to the variance correction.
        complex_posterior: with ``weights="complex"``/``"ctr"``, the complex-feature GP of paper 000
            App. D (see :class:`~rfgp.kernels.SketchedPolynomialKernel`); ``ValueError`` for real weights.
        **kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``, ``active_dims``,
            ``lengthscale_prior``, ``lengthscale_constraint``); with ``method="random_maclaurin"``,
            that family's options.

    Raises:
        ValueError: an unknown ``method`` or an option of the other family (naming it and its class).
        TypeError: any other unexpected keyword argument.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedExponentialKernel
        >>> kernel = SketchedExponentialKernel(64, input_dim=2, seed=0, max_order=4)
        >>> kernel(torch.rand(5, 2)).shape
        torch.Size([5, 5])
        >>> type(SketchedExponentialKernel(64, method="random_maclaurin", seed=0)).__name__
        'RandomMaclaurinExponentialKernel'
    """

    family_methods = ("maclaurin",)
    config_fields = {"method": METHOD, "complex_posterior": METHOD}

    def __init__(
        self,
        num_features: int,
        method: str = "maclaurin",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        *,
        projection: str = "srht",
        weights: str = "ctr",
        srht_blocks: str = "tiled",
        min_order: int = 1,
        max_order: int | None = 10,
        sample_size: int = 500,
        widths: tuple[int, ...] | None = None,
        x_sample: Tensor | None = None,
        bias_correction: bool = True,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        check_choice(method, "method", self.method_choices())
        kwargs = refuse_other_family_options(self, method, kwargs)
        feature_map = OptimizedMaclaurin(
            dot_product.exponential(), num_features, input_dim=_input_dim(input_dim, kwargs), projection=projection,
            weights=weights, srht_blocks=srht_blocks, min_order=min_order, max_order=max_order, widths=widths,
            x_sample=x_sample, sample_size=sample_size, bias_correction=bias_correction, seed=seed,
            generator=generator, min_share=_MIN_SHARE,
        )
        self._setup_exponential(method, feature_map, kwargs, complex_posterior)

    def _setup_exponential(self, method: str, feature_map: FeatureMap, kwargs: dict, complex_posterior: bool) -> None:
        """What both exponential families' ``__init__`` do once the map is built."""
        self.method = method
        self.complex_posterior = check_complex_posterior(
            complex_posterior, feature_map.is_complex, f"weights={feature_map.weights!r}"
        )
        RandomFeatureKernel.__init__(self, feature_map, **kwargs)


class RandomMaclaurinExponentialKernel(SketchedExponentialKernel):
    r"""k(x, y) = exp(xᵀy/ℓ²) with Random Maclaurin features (Kar & Karnick 2012; paper 000 §5.1).

    Each feature draws a degree n with probability ∝ 2^{−(n+1)} (up to ``max_order``) and
    sketches (zᵀz')ⁿ/n! with n random projections (:class:`~rfgp.features.RandomMaclaurin`).
    Also built by ``SketchedExponentialKernel(F, method="random_maclaurin", ...)``.

    Args:
        num_features: real output width F.
        method: ``"random_maclaurin"`` (the only method of this family).
        input_dim, seed, generator: as :class:`SketchedExponentialKernel`.
        projection: default ``"rademacher"`` (Kar & Karnick's real Rademacher weights).
        weights: default ``"real"``; ``"complex"``/``"ctr"`` for complex weights.
        srht_blocks: SRHT block layout, ``"tiled"`` or ``"independent"``.
        max_order: the largest degree drawn, p (``None``: 10 for the exponential kernel).
        bias_correction: add the expected truncation bias to the variance correction.
        complex_posterior: as :class:`SketchedExponentialKernel`.
        **kwargs: GPyTorch ``Kernel`` arguments.

    Raises:
        ValueError: an option of the optimized family (``min_order``, ``sample_size``, ``widths``,
            ``x_sample``), naming it and :class:`SketchedExponentialKernel`.

    Example:
        >>> import torch
        >>> from rfgp.kernels import RandomMaclaurinExponentialKernel
        >>> kernel = RandomMaclaurinExponentialKernel(64, input_dim=2, seed=0, max_order=3)
        >>> kernel(torch.rand(5, 2)).shape
        torch.Size([5, 5])
    """

    family_methods = ("random_maclaurin",)
    legacy_type_names = ("SketchedExponentialKernel",)

    def __init__(
        self,
        num_features: int,
        method: str = "random_maclaurin",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        *,
        projection: str = "rademacher",
        weights: str = "real",
        srht_blocks: str = "tiled",
        max_order: int | None = None,
        bias_correction: bool = True,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        check_choice(method, "method", self.family_methods)
        kwargs = refuse_other_family_options(self, method, kwargs)
        feature_map = RandomMaclaurin(
            dot_product.exponential(), num_features, input_dim=_input_dim(input_dim, kwargs), projection=projection,
            weights=weights, srht_blocks=srht_blocks, max_order=max_order, bias_correction=bias_correction,
            seed=seed, generator=generator,
        )
        self._setup_exponential(method, feature_map, kwargs, complex_posterior)


def refit_allocation(kernel: Kernel, x: Tensor) -> Kernel:
    """Refit the optimized Maclaurin allocation of ``kernel`` (possibly inside a ScaleKernel) on inputs x.

    Uses the kernel's current lengthscale (and polynomial offset); the sketches are redrawn for
    the new widths from the map's seed.  Call it after (or between rounds of) hyperparameter
    training, e.g. ``refit_allocation(model.covar_module, train_x)``.

    Args:
        kernel: a kernel with an :class:`~rfgp.features.OptimizedMaclaurin` map
            (:class:`MaclaurinRBFKernel`, :class:`SketchedExponentialKernel`,
            ``SketchedPolynomialKernel(method="maclaurin")``), or a ``ScaleKernel`` around one.
        x: the inputs to fit on, shape ``(n, d)`` (before ``active_dims``).

    Returns:
        ``kernel`` itself, refitted in place.

    Raises:
        TypeError: the kernel has no optimized Maclaurin map.

    Example:
        >>> import torch
        >>> from rfgp.kernels import MaclaurinRBFKernel, refit_allocation
        >>> kernel = MaclaurinRBFKernel(64, input_dim=2, seed=0, max_order=4)
        >>> x = torch.rand(20, 2, generator=torch.Generator().manual_seed(0))
        >>> kernel.lengthscale = 0.3
        >>> refit_allocation(kernel, x) is kernel
        True
        >>> sum(kernel.feature_map.widths) <= 64
        True
    """
    base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
    if base.active_dims is not None:
        x = x.index_select(-1, base.active_dims.to(x.device))
    fit_allocation_on_columns(base, x)
    return kernel


def fit_allocation_on_columns(kernel: Kernel, x: Tensor) -> None:
    """:func:`refit_allocation` of a kernel (not a ``ScaleKernel``) on ``x`` already restricted to its columns."""
    feature_map = getattr(kernel, "feature_map", None)
    if not isinstance(feature_map, OptimizedMaclaurin):
        raise TypeError(f"kernel has no OptimizedMaclaurin feature map to refit, got {type(kernel).__name__}")
    with torch.no_grad():
        feature_map.fit(kernel.scale_inputs(x), kernel=_current_spec(kernel))


def _current_spec(kernel: Kernel):
    """The target at the kernel's current hyperparameters: a polynomial spec with its offset, else the map's own."""
    if isinstance(kernel, SketchedPolynomialKernel):
        return dot_product.polynomial(kernel.power, float(kernel.offset.mean()))
    return None


class TruncationWarning(UserWarning):
    """An optimized Maclaurin map carries little of the kernel it approximates on the inputs it was fitted to at a
    conversion (:func:`warn_truncated_conversion`), or on the training inputs after :func:`rfgp.fit_mll` trained it
    there; the message says what to do."""


#: share of k(x, x) left out on average over the inputs above which a map is reported (:class:`TruncationWarning`)
TRUNCATION_WARN_MISSING = 0.1


def warn_truncated_conversion(kernel: Kernel, x: Tensor) -> None:
    """Warn (:class:`TruncationWarning`) when the optimized Maclaurin map of ``kernel`` (not a ``ScaleKernel``), just
    fitted on ``x`` (restricted to its columns) by ``rfgp.sketch(..., x_sample=x)``, leaves out more than
    :data:`TRUNCATION_WARN_MISSING` of k(x, x) on average over ``x`` at the converted hyperparameters.

    There the map is not the model converted: ℓ = 0.3 on [−1, 1]² (‖x‖²/ℓ² up to 22, 27 % left out on average) gave
    334 times the exact GP's posterior variance among 1 000 training points, the bias correction adding the outputscale
    times the missing part (guide: predictive uncertainty).  :func:`rfgp.fit_mll` warns the same after training."""
    share = truncation_share(kernel, x)
    missing = float((1 - share).mean())
    if missing <= TRUNCATION_WARN_MISSING:
        return
    feature_map = kernel.feature_map
    scale = float(kernel.scale_inputs(x).detach().pow(2).sum(-1).median())
    variance = ("the bias-corrected posterior variance adds the outputscale times the rest, k(x, x) − E k̂(x, x), as "
                "prior variance, among the data too" if feature_map.bias_correction
                else "its posterior is the truncated kernel's")
    warn_user(
        f"rfgp.sketch: the optimized Maclaurin map of {type(kernel).__name__} ({feature_map.kernel.name}, order "
        f"{feature_map.order} ≤ max_order={feature_map.order_limit}), fitted on x_sample at the converted "
        f"hyperparameters, leaves out {missing:.2g} of k(x, x) on average over it (median share "
        f"{float(share.median()):.3g}, median ‖x‖²/ℓ² {scale:.3g}), so it is not the converted model there: "
        f"{variance}. Raise {feature_map.order_option}, centre and scale the inputs, or use method='rff', 'orf' or "
        "'nystrom'",
        TruncationWarning,
    )


def truncation_share(kernel: Kernel, x: Tensor, refit: bool = False) -> Tensor:
    """E k̂(x, x)/k(x, x) per input of the current allocation, or (``refit``) of the one a refit would choose.

    ``kernel`` (not a ``ScaleKernel``) owns an :class:`~rfgp.features.OptimizedMaclaurin` map and ``x`` is already
    restricted to its columns; both at the kernel's current hyperparameters, nothing is changed.  The current share
    costs one pass over ``x``; the refit share runs the allocation (Algorithm 3: seconds), so ask for it only when
    the current one is low.
    """
    with torch.no_grad():
        return kernel.feature_map.carried_share(kernel.scale_inputs(x), refit, _current_spec(kernel))
