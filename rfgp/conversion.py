"""``rfgp.sketch``: convert a GPyTorch kernel tree into its random-feature counterpart.

Each supported GPyTorch kernel type has a registered converter that builds the rfgp
kernel with the same hyperparameter values, constraints, priors, ``ard_num_dims``,
``batch_shape`` and ``active_dims``.  ``ScaleKernel`` is kept (its outputscale scales
the features), ``AdditiveKernel``/``ProductKernel`` become the feature-space
:class:`~rfgp.kernels.FeatureSumKernel`/:class:`~rfgp.kernels.FeatureProductKernel`, so
the whole tree stays low-rank.  Modules of other families register their converters
with :func:`register_converter`.
"""

from __future__ import annotations

import copy
from typing import Callable

import gpytorch
import torch
from gpytorch.kernels import AdditiveKernel, Kernel, ProductKernel, ScaleKernel
from torch import Tensor

from .kernels.combinations import FeatureProductKernel, FeatureSumKernel
from .kernels.operator_valued import CurlFreeRBFKernel, DivFreeRBFKernel

_CONVERTERS: dict[type, Callable] = {}


def register_converter(kernel_type: type) -> Callable:
    """Decorator registering ``fn(kernel, num_features, method, seed, **options) -> Kernel`` for a type."""

    def decorate(fn: Callable) -> Callable:
        _CONVERTERS[kernel_type] = fn
        return fn

    return decorate


def sketch(kernel: Kernel, num_features: int, method: str | None = None, seed: int | None = None, **options) -> Kernel:
    """Return the random-feature version of a GPyTorch kernel tree with the same hyperparameters.

    Args:
        kernel: e.g. ``ScaleKernel(RBFKernel(ard_num_dims=d))``.
        num_features: feature width F of every sketched leaf kernel.
        method: the sketch of each leaf (``None``: the leaf family's default, e.g.
            ``"rff"`` for RBF/Matérn; ``"rff" | "orf" | "sorf"`` for those).  ``method="nystrom"``
            turns the whole tree (any scalar kernel) into one :class:`~rfgp.kernels.NystromKernel`
            with ``num_features`` landmarks chosen among ``x_sample=`` (required) by
            ``landmarks="uniform" | "kmeans++" | "rls"``, see :func:`~rfgp.kernels.nystrom.nystrom_sketch`;
            a ``MultitaskKernel`` becomes a decomposable kernel over the Nyström data kernel.
        seed: seed of the random draws; leaf kernels get ``seed, seed + 1, ...`` so
            that factors of a product are independent.
        options: passed to the leaf converters.  ``method="gaussian_sketch" | "gaussian_sketch_hd"``
            (RBF leaves, paper 003) need the data radius and the target additive error to
            choose the truncation order: ``x_sample=`` (or ``radius=``) and ``alpha=``, or
            ``order=`` (see :func:`taylor_sketch_options`); a ValueError names what is missing.

    Raises:
        TypeError: naming the first kernel in the tree that has no random-feature version.

    Example:
        >>> exact = ScaleKernel(RBFKernel(ard_num_dims=3))
        >>> sketched = rfgp.sketch(exact, num_features=1024, method="sorf")
        >>> taylor = rfgp.sketch(exact, 1024, method="gaussian_sketch", x_sample=train_x, alpha=1e-4)
        >>> landmark = rfgp.sketch(exact, 512, method="nystrom", x_sample=train_x, landmarks="kmeans++", seed=0)
    """
    if method == "nystrom" and not isinstance(kernel, gpytorch.kernels.MultitaskKernel):
        from .kernels.nystrom import nystrom_sketch

        return nystrom_sketch(kernel, num_features, seed=seed, **options)
    seeds = _SeedSequence(seed)
    return _convert(kernel, num_features, method, seeds, options)


class _SeedSequence:
    def __init__(self, seed: int | None) -> None:
        self.next = seed

    def take(self) -> int | None:
        seed = self.next
        if seed is not None:
            self.next += 1
        return seed


def _convert(kernel, num_features, method, seeds, options):
    if isinstance(kernel, ScaleKernel):
        base = _convert(kernel.base_kernel, num_features, method, seeds, options)
        return copy_hyperparameters(kernel, ScaleKernel(base, **_common_kwargs(kernel)), "outputscale")
    if isinstance(kernel, (AdditiveKernel, ProductKernel)):
        parts = [_convert(k, num_features, method, seeds, options) for k in kernel.kernels]
        cls = FeatureSumKernel if isinstance(kernel, AdditiveKernel) else FeatureProductKernel
        return cls(*parts, active_dims=kernel.active_dims)
    for kernel_type in type(kernel).__mro__:
        if kernel_type in _CONVERTERS:
            return _CONVERTERS[kernel_type](kernel, num_features, method, seeds.take(), **options)
    supported = ", ".join(sorted(t.__name__ for t in _CONVERTERS))
    raise TypeError(
        f"rfgp.sketch has no random-feature version of {type(kernel).__name__}; supported kernels: "
        f"{supported}, and ScaleKernel/AdditiveKernel/ProductKernel around them"
    )


def _common_kwargs(kernel: Kernel) -> dict:
    return {"batch_shape": kernel.batch_shape, "active_dims": kernel.active_dims}


def lengthscale_kwargs(kernel: Kernel) -> dict:
    """Constructor arguments that reproduce ``kernel``'s lengthscale setup (ARD, batch, dims, constraint, prior)."""
    kwargs = _common_kwargs(kernel)
    kwargs["ard_num_dims"] = kernel.ard_num_dims
    kwargs["lengthscale_constraint"] = kernel.raw_lengthscale_constraint
    prior = getattr(kernel, "lengthscale_prior", None)
    if prior is not None:
        kwargs["lengthscale_prior"] = prior
    return kwargs


def copy_hyperparameters(source: Kernel, target: Kernel, *names: str) -> Kernel:
    """Copy the raw values of the named hyperparameters (and their constraints/priors) from source to target."""
    for name in names:
        raw = f"raw_{name}"
        # the target was built in torch's default dtype on the CPU: follow the source, copy at full precision
        target.to(getattr(source, raw))
        getattr(target, raw).data.copy_(getattr(source, raw).data)
        target.register_constraint(raw, getattr(source, f"{raw}_constraint"))
        prior_name = f"{name}_prior"
        if prior_name in source._priors:
            prior, closure, setting_closure = source._priors[prior_name]
            target._priors[prior_name] = (prior, closure, setting_closure)
            target.add_module(prior_name, prior)
    return target


@register_converter(gpytorch.kernels.RBFKernel)
def _convert_rbf(kernel, num_features, method, seed, **options):
    """RBFKernel → SketchedRBFKernel; ``method="gaussian_sketch" | "gaussian_sketch_hd"`` see :func:`taylor_sketch_options`."""
    from .kernels.fourier import GAUSSIAN_SKETCH_METHODS, SketchedRBFKernel

    if method in GAUSSIAN_SKETCH_METHODS:
        options = taylor_sketch_options(kernel, method, **options)
    sketched = SketchedRBFKernel(num_features, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "lengthscale")


def taylor_sketch_options(kernel: Kernel, method: str, x_sample: Tensor | None = None, radius: float | None = None,
                          alpha: float | None = None, order: int | None = None, center=None,
                          min_lengthscale: float | None = None, **options) -> dict:
    r"""Arguments of ``SketchedRBFKernel(method="gaussian_sketch"|"gaussian_sketch_hd")`` for converting ``kernel``.

    GaussianSketch(HD) truncate the Taylor expansion of exp(−‖z − z'‖²) around the origin at
    an order s that depends on the data radius and the target additive error α (paper 003
    Lemmas 2.9/2.11, Thms 3.1/3.3: the smallest s with ξ d e^{2dL²} P(s, 2L²) ≤ α, box
    radius L = ‖x − c‖_∞/(√2 ℓ), resp. ξ e^{2R²} P(s, 2R²) ≤ α, ball radius R = ‖x − c‖₂/(√2 ℓ),
    ξ = 4).  So the conversion needs, besides ``alpha``:

    * ``x_sample``: points of the input space (the columns the GP receives; the kernel's
      ``active_dims`` are applied) — the centre c is their bounding-box centre and the radius
      their largest ‖x − c‖_∞ (GaussianSketch) or ‖x − c‖₂ (HD), in input units; or
    * ``radius`` (and optionally ``center``, default no shift) given directly; or
    * ``order`` = s directly (then neither radius nor alpha is needed).

    ``min_lengthscale`` (the lengthscale s is chosen for) defaults to the converted kernel's
    smallest current lengthscale, so the converted kernel holds the bound |K − K_s| ≤ α/4
    entrywise at the carried-over hyperparameters; a lengthscale trained below it raises.

    Raises:
        ValueError: naming the missing argument (``radius``/``x_sample`` or ``alpha``), or
            when both ``radius`` and ``x_sample`` are given.
    """
    if x_sample is not None:
        if radius is not None:
            raise ValueError(f"pass radius= or x_sample= for method={method!r}, not both (got radius={radius})")
        x = _active_columns(kernel, x_sample)
        center = (x.min(-2).values + x.max(-2).values) / 2 if center is None else torch.as_tensor(center).to(x)
        offsets = x - center
        radius = float(offsets.abs().max() if method == "gaussian_sketch" else offsets.norm(dim=-1).max())
        center = center.tolist()
    if order is None:
        norm = "‖x − center‖_∞" if method == "gaussian_sketch" else "‖x − center‖₂"
        missing = [name for name, value in (("radius", radius), ("alpha", alpha)) if value is None]
        if missing:
            raise ValueError(
                f"method={method!r} chooses its truncation order s from the data radius and the target "
                f"additive error alpha (paper 003 Lemma 2.9/2.11); missing: {' and '.join(missing)} "
                f"(got radius={radius}, x_sample=None, alpha={alpha}). Pass x_sample= (points to take the "
                f"centre and radius from) or radius= (a bound on {norm} in input units), and alpha= "
                "(e.g. 1e-4), or order= directly"
            )
    if min_lengthscale is None and radius is not None:
        min_lengthscale = float(kernel.lengthscale.detach().min())
    return {"order": order, "radius": radius, "alpha": alpha, "center": center,
            "min_lengthscale": min_lengthscale, **options}


def _active_columns(kernel: Kernel, x_sample) -> Tensor:
    if not torch.is_tensor(x_sample) or not x_sample.is_floating_point() or x_sample.dim() < 2:
        raise ValueError(f"x_sample must be a floating (n, d) tensor of input points, got {x_sample!r:.80}")
    if kernel.active_dims is not None:
        x_sample = x_sample.index_select(-1, kernel.active_dims.to(x_sample.device))
    x_sample = x_sample.detach().reshape(-1, x_sample.shape[-1]).double()
    if not bool(torch.isfinite(x_sample).all()):
        raise ValueError("x_sample contains NaN or Inf entries")
    return x_sample


@register_converter(gpytorch.kernels.MaternKernel)
def _convert_matern(kernel, num_features, method, seed, **options):
    from .kernels.fourier import SketchedMaternKernel

    sketched = SketchedMaternKernel(
        num_features, nu=kernel.nu, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


@register_converter(gpytorch.kernels.PolynomialKernel)
def _convert_polynomial(kernel, num_features, method, seed, **options):
    from .kernels.polynomial import SketchedPolynomialKernel

    sketched = SketchedPolynomialKernel(
        kernel.power,
        num_features,
        method=method or "sketch",
        seed=seed,
        offset_constraint=kernel.raw_offset_constraint,
        **options,
        **_common_kwargs(kernel),
    )
    return copy_hyperparameters(kernel, sketched, "offset")


def _convert_derivative_kernel(sketched_type, kernel, num_features, method, seed, **options):
    sketched = sketched_type(
        num_features, kernel.input_dim, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


@register_converter(CurlFreeRBFKernel)
def _convert_curl_free(kernel, num_features, method, seed, **options):
    from .kernels.sketched_operator_valued import SketchedCurlFreeKernel

    return _convert_derivative_kernel(SketchedCurlFreeKernel, kernel, num_features, method, seed, **options)


@register_converter(DivFreeRBFKernel)
def _convert_div_free(kernel, num_features, method, seed, **options):
    from .kernels.sketched_operator_valued import SketchedDivFreeKernel

    return _convert_derivative_kernel(SketchedDivFreeKernel, kernel, num_features, method, seed, **options)


@register_converter(gpytorch.kernels.MultitaskKernel)
def _convert_decomposable(kernel, num_features, method, seed, **options):
    """MultitaskKernel (and so DecomposableKernel) → SketchedDecomposableKernel over the sketched data kernel.

    ``num_features`` is the width of the scalar sketch; the root has F·(rank + p) columns.  The
    IndexKernel (A = LLᵀ + diag(v), its constraint and prior) carries over unchanged.
    """
    from .kernels.sketched_operator_valued import SketchedDecomposableKernel

    base = sketch(kernel.data_covar_module, num_features, method=method, seed=seed, **options)
    rank = kernel.task_covar_module.covar_factor.shape[-1]
    sketched = SketchedDecomposableKernel(base, num_outputs=kernel.num_tasks, rank=rank)
    sketched.task_covar_module = copy.deepcopy(kernel.task_covar_module)
    return sketched
