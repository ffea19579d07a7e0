"""Sketched polynomial kernel: GPyTorch's ``PolynomialKernel`` (xᵀy/ℓ² + c)^p with random features.

The offset c has GPyTorch's name, shape, default ``Positive`` constraint and prior
(``raw_offset``, ``offset_constraint``, ``offset_prior``), so hyperparameters carry over from
``gpytorch.kernels.PolynomialKernel`` (:func:`rfgp.sketch` converts it).  An optional
lengthscale (ARD) divides the inputs, (x/ℓ)ᵀ(y/ℓ).  The feature map sketches
x̃ = [x/ℓ; √c] (paper 000 Eq. 2), so gradients reach ℓ and c with the draws frozen.
"""

from __future__ import annotations

import math
from typing import Callable

import torch
from gpytorch.constraints import Positive
from gpytorch.priors import Prior
from torch import Tensor

from ..core.config_state import METHOD
from ..core.dtypes import device_constant
from ..core.validation import (
    check_choice,
    check_finite,
    check_hyperparameter,
    check_positive_float,
    check_unit_rows,
    has_values,
    normalize_rows,
)
from ..features.base import FeatureMap
from ..features.dot_product import integer_powers
from ..features.polynomial import PolynomialSketch, check_degree
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .hyperparameters import parameter_value, prior_closures
from .random_feature_kernel import RandomFeatureKernel

#: ``method`` name -> builder(power, num_features, input_dim, seed, generator, **options) -> FeatureMap
POLYNOMIAL_METHODS: dict[str, Callable[..., FeatureMap]] = {}
#: ``method`` name -> the options its builder takes besides ``projection``, ``weights``, ``srht_blocks``
POLYNOMIAL_METHOD_OPTIONS: dict[str, tuple[str, ...]] = {}

INPUT_NORMALIZATIONS = (None, "check", "normalize")
UNIT_ROWS_HINT = "Normalise the inputs or build the kernel with from_sphere(..., normalize_inputs=True)"


def register_polynomial_method(name: str, options: tuple[str, ...] = ()) -> Callable:
    """Register a feature-map builder for ``SketchedPolynomialKernel(method=name)``.

    Args:
        name: the ``method`` name.
        options: keyword options of this method only, passed from the kernel's keyword
            arguments to the builder; given with another method they raise a ``ValueError``.
    """

    def decorate(builder: Callable[..., FeatureMap]) -> Callable[..., FeatureMap]:
        POLYNOMIAL_METHODS[name] = builder
        POLYNOMIAL_METHOD_OPTIONS[name] = tuple(options)
        return builder

    return decorate


@register_polynomial_method("sketch")
def _polynomial_sketch(power, num_features, input_dim, seed, generator, **options) -> FeatureMap:
    return PolynomialSketch(power, num_features, input_dim=input_dim, offset=0.0, seed=seed, generator=generator, **options)


def _method_options(method: str, kwargs: dict) -> dict:
    """Pop the options of ``method`` from ``kwargs``; an option of another method raises (``None``/``False``: dropped)."""
    taken = {name: kwargs.pop(name) for name in POLYNOMIAL_METHOD_OPTIONS[method] if name in kwargs}
    for name in [name for name in kwargs if any(name in o for o in POLYNOMIAL_METHOD_OPTIONS.values())]:
        value = kwargs.pop(name)
        if value is not None and value is not False:
            owners = [m for m, o in POLYNOMIAL_METHOD_OPTIONS.items() if name in o]
            raise ValueError(
                f"{name}={value!r} is an option of SketchedPolynomialKernel(method={'/'.join(map(repr, owners))}), "
                f"not of method={method!r}"
            )
    return taken


class SketchedPolynomialKernel(ComplexPosteriorMixin, RandomFeatureKernel):
    r"""(xᵀy/ℓ² + c)^p approximated by a random feature map (default: a polynomial sketch).

    Args:
        power: p ≥ 1 (an integer).
        num_features: real output width F of the features.
        method: ``"sketch"`` (:class:`~rfgp.features.PolynomialSketch`); other families
            register themselves with :func:`register_polynomial_method`: ``"maclaurin"``
            (:class:`~rfgp.features.OptimizedMaclaurin`, options ``min_order``, ``sample_size``,
            ``bias_correction``) and ``"random_maclaurin"`` (:class:`~rfgp.features.RandomMaclaurin`,
            option ``bias_correction``), whose options raise a ``ValueError`` with another method.
        projection, weights, srht_blocks: passed to the sketch (defaults: ``"srht"``, ``"ctr"``
            — the lowest-variance combination on non-negative data, paper 001).
        lengthscale: whether the kernel has a lengthscale (``ard_num_dims`` for ARD);
            without it this is exactly GPyTorch's ``PolynomialKernel``.
        input_normalization: ``None``; ``"check"`` raises on inputs off the unit sphere;
            ``"normalize"`` divides inputs by their norm (for :meth:`from_sphere`).
        offset_prior, offset_constraint: as in ``gpytorch.kernels.PolynomialKernel``.
        input_dim, seed, generator: feature-map arguments.
        complex_posterior: with complex weights (``"complex"``, ``"ctr"``; also the Maclaurin
            methods), train and predict with the complex-feature GP of paper 000 Appendix D
            instead of the real GP on Re K̂: MLL = complex-GP evidence log CN(y + 0i; 0, 2(K̂_C + Σ)),
            posterior Eqs. 86–90 (:mod:`rfgp.kernels.complex_posterior_option`).  ``ValueError`` for real weights.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``, ...

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import SketchedPolynomialKernel
        >>> covar = gpytorch.kernels.ScaleKernel(SketchedPolynomialKernel(3, num_features=512))
        >>> covar(torch.rand(10, 4)).shape
        torch.Size([10, 10])
    """

    config_fields = {"power": METHOD, "method": METHOD, "has_lengthscale": METHOD, "input_normalization": METHOD,
                     "complex_posterior": METHOD}

    def __init__(
        self,
        power: int,
        num_features: int,
        method: str = "sketch",
        projection: str = "srht",
        weights: str = "ctr",
        lengthscale: bool = False,
        input_normalization: str | None = None,
        offset_prior: Prior | None = None,
        offset_constraint=None,
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        self.power = check_degree(power, "power")
        self.method = check_choice(method, "method", tuple(POLYNOMIAL_METHODS))
        self.input_normalization = check_choice(input_normalization, "input_normalization", INPUT_NORMALIZATIONS)
        if not isinstance(lengthscale, bool):
            raise TypeError(f"lengthscale must be True or False, got {lengthscale!r}")
        if kwargs.get("ard_num_dims") is not None and not lengthscale:
            raise ValueError("ard_num_dims needs lengthscale=True (the polynomial kernel has no lengthscale otherwise)")
        self.has_lengthscale = lengthscale  # read by gpytorch.kernels.Kernel.__init__
        options = {"projection": projection, "weights": weights, "srht_blocks": kwargs.pop("srht_blocks", "tiled"),
                   **_method_options(method, kwargs)}
        feature_map = POLYNOMIAL_METHODS[method](
            self.power,
            num_features,
            input_dim if input_dim is not None else kwargs.get("ard_num_dims"),
            seed,
            generator,
            **options,
        )
        self.complex_posterior = check_complex_posterior(
            complex_posterior, getattr(feature_map, "is_complex", False), f"method={method!r}, weights={weights!r}"
        )
        super().__init__(feature_map, **kwargs)
        self.register_parameter("raw_offset", torch.nn.Parameter(torch.zeros(*self.batch_shape, 1)))
        if offset_constraint is None:
            offset_constraint = Positive()
        lower = getattr(offset_constraint, "lower_bound", None)
        lower = None if lower is None else torch.as_tensor(lower)
        if lower is None or (has_values(lower) and bool((lower < 0).any())):
            # the features sketch [x/ℓ; √c]: a negative offset would make every feature NaN
            raise ValueError(
                f"offset_constraint must keep the offset ≥ 0 (the features append √c), got {offset_constraint} "
                "(accepted: a gpytorch constraint with lower_bound ≥ 0, e.g. Positive() or Interval(0, b))"
            )
        self.register_constraint("raw_offset", offset_constraint)
        if offset_prior is not None:
            if not isinstance(offset_prior, Prior):
                raise TypeError(f"offset_prior must be a gpytorch.priors.Prior, got {type(offset_prior).__name__}")
            self.register_prior("offset_prior", offset_prior, *prior_closures("offset"))

    @classmethod
    def from_sphere(cls, a: float, power: int, num_features: int, normalize_inputs: bool = False, **kwargs):
        r"""k(x, y) = (1 − ‖x − y‖²/a²)^p on the unit sphere (paper 000 Eq. 57; a = 2 in its experiments).

        For unit x, y: 1 − ‖x − y‖²/a² = (2/a²)xᵀy + 1 − 2/a², i.e. lengthscale ℓ = a/√2 and
        offset c = 1 − 2/a² (a ≥ √2 keeps c ≥ 0).  Inputs off the unit sphere raise a
        ``ValueError`` unless ``normalize_inputs=True`` opts into x ↦ x/‖x‖.  Wrap the kernel in
        a ``ScaleKernel`` for σ².  ℓ and c are initialised, not fixed: they remain trainable.

        ``method="srf" | "srf_orth" | "srf_orth_complex"`` selects spherical random features
        (Pennington et al. 2015; paper 000 §6.4), which need a fixed a ≥ 2 and return a
        :class:`~rfgp.kernels.SketchedSphericalPolynomialKernel`.
        """
        from .spherical import SPHERICAL_METHODS, SketchedSphericalPolynomialKernel

        if kwargs.get("method") in SPHERICAL_METHODS:
            return SketchedSphericalPolynomialKernel(
                power, num_features, a=a, normalize_inputs=normalize_inputs, **kwargs
            )
        a = check_positive_float(a, "a")
        if a < 2**0.5:
            raise ValueError(f"a must be ≥ √2 so that the offset 1 − 2/a² is ≥ 0, got {a}")
        kernel = cls(
            power,
            num_features,
            lengthscale=True,
            input_normalization="normalize" if normalize_inputs else "check",
            offset_constraint=kwargs.pop("offset_constraint", Positive()),
            **kwargs,
        )
        kernel.lengthscale = a / 2**0.5
        kernel.offset = 1.0 - 2.0 / a**2
        return kernel

    @property
    def offset(self) -> Tensor:
        return self.raw_offset_constraint.transform(self.raw_offset)

    @offset.setter
    def offset(self, value) -> None:
        self._set_offset(value)

    def _set_offset(self, value) -> None:
        check_hyperparameter(value, "offset", self.raw_offset_constraint, allow_bound=True)
        value = parameter_value(value, self.raw_offset)
        self.initialize(raw_offset=self.raw_offset_constraint.inverse_transform(value))

    def scale_inputs(self, x: Tensor) -> Tensor:
        if self.input_normalization == "normalize":
            x = normalize_rows(x, "x")
        elif self.input_normalization == "check":
            check_unit_rows(x, "x", UNIT_ROWS_HINT)
        return super().scale_inputs(x)

    def unit_rows_hint(self) -> str | None:
        return UNIT_ROWS_HINT if self.input_normalization == "check" else None

    def featurize(self, x: Tensor) -> Tensor:
        return self.feature_map(self.scale_inputs(x), offset=self.checked_offset())

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """(k(x, x), E[Φ(x)ᵀΦ(x)]) of a biased (Maclaurin) map at the kernel's current offset ν, t = ‖x/ℓ‖²::

            k(x, x) = (ν + t)^p,    E[Φ(x)ᵀΦ(x)] = Σ_{n present} C(p, n) ν^{p−n} tⁿ    (paper 000 Eq. 37),

        the degrees present being the map's (:meth:`~rfgp.features.OptimizedMaclaurin.expected_degrees`).  The
        maps' own moments take ν from the allocation's fit: after the offset moved (a hand-written optimisation
        loop; ``rfgp.fit_mll`` refits the allocation), the variance correction was the old offset's (k(x, x) = 8
        where it is 64).  Zeroth powers without a power (:func:`~rfgp.features.dot_product.integer_powers`): the
        derivatives at t = 0 or ν = 0 stay finite.
        """
        if not self.feature_map.has_variance_bias:
            return None
        t = self.scale_inputs(x).pow(2).sum(-1)
        offset = self.checked_offset()  # (*batch, 1): broadcasts over the points
        degrees = torch.arange(self.power + 1, device=t.device)
        binomial = device_constant(self, ("binomial", self.power), lambda: torch.tensor(
            [math.comb(self.power, n) for n in range(self.power + 1)], dtype=torch.float64), t)
        terms = (binomial * integer_powers(offset.to(t).unsqueeze(-1), self.power - degrees)
                 * integer_powers(t.unsqueeze(-1), degrees))
        return (offset.to(t) + t).pow(self.power), terms[..., self.feature_map.expected_degrees()].sum(-1)

    def checked_offset(self) -> Tensor:
        """The offset ν the features append as √ν, checked finite: one set in place on ``raw_offset`` (past the
        setter's check) made every feature NaN silently, where a NaN lengthscale is named through the scaled inputs;
        the kernel call names it (``NonFiniteHyperparameterError``)."""
        offset = self.offset
        check_finite(offset, "offset")
        return offset
