"""``rfgp.set_num_features``: re-draw every feature map of a model or kernel tree at a new width.

Train small, predict big: the hyperparameters (lengthscales, outputscale, noise, means) of a
random-feature GP do not depend on F, only the Monte-Carlo error of k̂ does (it falls as F^{−1/2}).
So a model can be trained at a small F — O(N·F²) per marginal-likelihood evaluation — and then
re-drawn at 4–8× the width with the *same* hyperparameters, paying O(N·F'²) once for the
posterior caches instead of at every optimiser step.

Every map keeps its configuration (method, projection, weights, spectral density, seed, ...):
a map re-drawn at F' is the map a model built at F' with the same seed has.  Its draws are made anew, not
appended to the old ones: torch's normal sampler fills a tensor in blocks of 16 values, so the first draws at F' equal
those at F only for some widths (RFF in d = 3: from F = 64 to 128, not from F = 100 to 300).  When a tree holds
several maps (sums, multi-output parts) the widths keep their proportions; each is rounded to its map's granularity
(sin/cos pairs, complex features and operator-valued blocks come in multiples).  A product whose
own Φ sets its width counts once, with that width, as in :func:`rfgp.sketch`: a TensorSRHT
(:class:`~rfgp.kernels.SketchedProductKernel`) or spectral product re-draws its sketch at the new
width and scales its factors' maps by the same ratio (so ``MixedSingleTaskGP``'s kernel resizes as
``rfgp.sketch`` would build it at the new width); a Kronecker product
(:class:`~rfgp.kernels.FeatureProductKernel`) scales its k random factors by the k-th root of the
ratio and keeps its exact factors.  Exact parts (Linear, Constant, Cosine, ``IndexKernel`` features)
keep their fixed widths and are not counted; a :class:`~rfgp.kernels.SketchedNewtonGirardAdditiveKernel` re-draws
its orders' frequencies at the new width (split equally among the orders, as at construction).  A kernel that sets
the widths of its own parts otherwise (BoTorch's orthogonal additive kernel, :mod:`rfgp.integrations.botorch_oak`) is
one unit too, resized by its ``resize_features(num_features)``.

Data-dependent maps refit on the data: optimized Maclaurin re-runs its allocation
(paper 000 Algorithm 3) for the new budget on the training inputs as the map sees them, and a
Nyström kernel chooses M' new landmarks among them by the rule and seed of its first choice
(:meth:`~rfgp.kernels.NystromKernel.reselect_landmarks`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor, nn

from ..core.validation import check_positive_int
from ..features.base import FeatureMap
from ..features.categorical import CategoricalFeatures
from ..features.fourier import RandomFourierFeatures
from ..features.gaussian_sketch import _TaylorSketchBase
from ..features.maclaurin import OptimizedMaclaurin, RandomMaclaurin, _MaclaurinFeatures
from ..features.maclaurin_allocation import total_width
from ..features.operator_valued import OperatorValuedFourierFeatures
from ..features.polynomial import PolynomialSketch
from ..features.spherical import SphericalRandomFeatures
from ..features.weighted_fourier import WeightedFourierFeatures
from ..kernels.arc import SketchedArcKernel
from ..kernels.combinations import FeatureProductKernel, SketchedProductKernel, kernel_num_features
from ..kernels.fourier import SketchedMaternKernel
from ..kernels.hamming_imq import SketchedHammingIMQKernel
from ..kernels.maclaurin import fit_allocation_on_columns
from ..kernels.newton_girard import SketchedNewtonGirardAdditiveKernel
from ..kernels.nystrom import NystromKernel
from ..kernels.random_feature_kernel import RandomFeatureKernel
from ..kernels.spectral_kernel import SpectralFeatureKernel
from ..kernels.spectral_product import SpectralProductKernel
from .kernel_inputs import covar_module_inputs
from .streaming import StreamingFeatureGP

#: maps whose draws depend only on (seed, input_dim, num_features): a new width is a redraw
_REDRAWN = (RandomFourierFeatures, SphericalRandomFeatures, PolynomialSketch, _TaylorSketchBase, CategoricalFeatures)


def set_num_features(module: nn.Module, num_features: int, x_sample: Tensor | None = None) -> nn.Module:
    """Re-draw the rfgp feature maps in ``module`` in place so that their widths sum to ``num_features``.

    Hyperparameters and every other setting are kept; prediction caches of GPyTorch models in
    ``module`` are cleared (an ``ExactGP``'s posterior, a variational strategy's factor of K_ZZ, which
    GPyTorch keeps in eval mode), so the next posterior is rebuilt once at the new width (chunk by chunk
    when its N × F features exceed :class:`rfgp.settings.memory_budget`); so are those of the model types
    registered with :func:`register_cache_clearer` (BoTorch's ``PairwiseGP`` re-solves its Laplace
    approximation).

    Args:
        module: an ``ExactGP`` (e.g. a trained model), an ``ApproximateGP`` or deep GP, a kernel tree, or any
            module holding them.
        num_features: the new total width Σᵢ Fᵢ of the maps (a single map: its F; a product: the width
            of its own Φ, see the module doc).  With several maps each gets F·Fᵢ/ΣFⱼ rounded to its
            granularity (at least one unit).
        x_sample: inputs for data-dependent maps (optimized Maclaurin, Nyström landmarks), as the kernel sees them;
            defaults to the model's ``train_inputs`` as its ``forward`` passes them to its ``covar_module`` (a deep
            kernel's network outputs, :func:`~rfgp.models.kernel_inputs.covar_module_inputs`; for model types
            registered with :func:`register_cache_clearer`, the inputs it names).

    Returns:
        ``module``.

    Raises:
        ValueError: ``num_features`` is not a multiple of a single map's granularity (e.g. odd for
            sin/cos features), ``module`` holds no feature map, a data-dependent map has no data, or a
            Nyström map is asked for more landmarks than its data has distinct rows (the message names how
            many: AER's CPS1988, 10 000 rows of integer-coded columns, has 3 827).
        TypeError: a map type without a width rule, or a :class:`~rfgp.models.streaming.StreamingFeatureGP`
            (its sufficient statistics belong to the old features: refit it from the data).

    Example:
        >>> import torch, gpytorch, rfgp
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(512, seed=0))
        >>> likelihood = gpytorch.likelihoods.GaussianLikelihood()
        >>> model = rfgp.models.ExactGPModel(train_x, train_y, likelihood, kernel).double()
        >>> history = rfgp.fit_mll(model, num_iterations=20)   # train at F = 512
        >>> model = rfgp.set_num_features(model, 4096)         # predict at F = 4096, same hyperparameters
        >>> model.covar_module.base_kernel.num_features
        4096
        >>> _ = model.eval()
        >>> posterior = model.likelihood(model(torch.linspace(0, 1, 50, dtype=torch.float64)[:, None]))
    """
    num_features = check_positive_int(num_features, "num_features")
    if x_sample is None and isinstance(module, gpytorch.models.ExactGP) and module.train_inputs is not None:
        x_sample = covar_module_inputs(module, module.train_inputs[0])
    for model_type, train_inputs in _TRAIN_INPUTS.items():
        if x_sample is None and isinstance(module, model_type):
            x_sample = train_inputs(module)
    for node in module.modules():
        if isinstance(node, StreamingFeatureGP):
            raise TypeError(
                "set_num_features cannot resize a StreamingFeatureGP: its accumulated statistics ΦᵀΦ belong to "
                "the old features; build a new one at the new width and update it from the data batches"
            )
    units = list(_width_units(module, x_sample, None))
    if not units:
        raise ValueError(f"{type(module).__name__} holds no rfgp feature map to resize")
    if len(units) == 1 and num_features % _granularity(units[0][0]):
        node = units[0][0]
        raise ValueError(
            f"num_features must be a multiple of {_granularity(node)} for {type(node).__name__} "
            f"(its features come in groups of {_granularity(node)}), got {num_features}"
        )
    _resize_units(units, num_features)
    for node in module.modules():
        if isinstance(node, gpytorch.models.ExactGP):
            node.prediction_strategy = None
        elif isinstance(node, gpytorch.variational._VariationalStrategy):
            node._clear_cache()  # the Cholesky factor of K_ZZ at the old width, memoised in eval mode
        for model_type, clear in _CACHE_CLEARERS.items():
            if isinstance(node, model_type):
                clear(node)
    return module



def refit_data_fitted_maps(module: nn.Module, x_sample: Tensor) -> nn.Module:
    """Refit, at their current widths, the maps in ``module`` that were fitted to a data sample, on ``x_sample``.

    For a model whose kernel sees transformed inputs (standardised, normalised) while the maps were fitted to the
    user's raw sample: Nyström landmarks are re-chosen among ``x_sample`` by the rule and seed of their first choice
    (:meth:`~rfgp.kernels.NystromKernel.reselect_landmarks`; uniform selection picks the same rows), and fitted
    optimized Maclaurin allocations (paper 000 Algorithm 3) are refitted on it at the kernel's current
    hyperparameters, as :func:`set_num_features` does at a new width.  Maps that draw without data are not touched.

    Args:
        module: a kernel tree (or a module holding one).
        x_sample: the inputs as the tree sees them, shape ``(n, d)`` (before ``active_dims``).

    Returns:
        ``module``.

    Raises:
        ValueError: a Nyström kernel with landmarks given by hand or learned (no rule to repeat), or too few rows.
    """
    for unit, owner, inputs in _width_units(module, x_sample, None):
        if isinstance(unit, NystromKernel):
            unit.reselect_landmarks(unit.num_features, inputs, _outputscale(owner))
    for _, owner, inputs in list(optimized_maclaurin_units(module, x_sample)):
        fit_allocation_on_columns(owner, inputs)
    return module


#: model types (other libraries' GPs) whose caches depend on the features, and how to rebuild them
_CACHE_CLEARERS: dict[type, Callable[[nn.Module], None]] = {}
#: the same model types' training inputs as their kernels see them (the default ``x_sample``)
_TRAIN_INPUTS: dict[type, Callable[[nn.Module], Tensor]] = {}


def register_cache_clearer(model_type: type, clear: Callable[[nn.Module], None],
                           train_inputs: Callable[[nn.Module], Tensor] | None = None) -> None:
    """Make :func:`set_num_features` call ``clear(model)`` on every instance of ``model_type`` it resizes.

    For models that keep quantities computed from the old features outside GPyTorch's prediction
    strategies (e.g. a Laplace approximation), so that they predict at the new width instead of mixing
    caches of the old features with covariances of the new ones.

    Args:
        model_type: the model class (subclasses match too).
        clear: rebuilds or drops the caches of one model, in place.
        train_inputs: returns one model's training inputs as its kernel sees them; :func:`set_num_features`
            called on such a model refits data-dependent maps on them when no ``x_sample`` is given (as it
            does with an ``ExactGP``'s ``train_inputs``).
    """
    _CACHE_CLEARERS[model_type] = clear
    if train_inputs is not None:
        _TRAIN_INPUTS[model_type] = train_inputs


#: products whose own Φ is the width unit: their factors' maps are resized with them, not counted
_PRODUCTS = (SketchedProductKernel, SpectralProductKernel, FeatureProductKernel)


def _width_units(module: nn.Module, x: Tensor | None, owner: Kernel | None,
                 owner_inputs: Tensor | None = None, called: bool = True) -> Iterator[tuple]:
    """(unit, owning kernel, the input columns the owner sees) for every outermost width unit below ``module``.

    A unit is a feature map, a :class:`~rfgp.kernels.NystromKernel` (its landmarks are its width;
    its base kernel is not searched; its owner is the kernel around it, e.g. the ``ScaleKernel`` of
    ``rfgp.sketch(ScaleKernel(k), M, method="nystrom")``) or a product kernel whose own Φ sets its width (TensorSRHT,
    spectral or Kronecker product): its factors are resized with it (:func:`_resize_product`).
    ``x`` follows the columns as the kernels evaluate them: a kernel's ``active_dims`` select among
    its parent's columns, except below a ``ScaleKernel``, which selects its own (copied from its
    base at construction) and runs its base's ``forward`` (:mod:`rfgp.kernels.input_columns`); an arc kernel's base
    sees the arc embedding of its columns.
    """
    if isinstance(module, (FeatureMap, OperatorValuedFourierFeatures)):
        yield module, owner, owner_inputs
        return
    if isinstance(module, Kernel):
        if called and x is not None and module.active_dims is not None:
            x = x.index_select(-1, module.active_dims.to(x.device))
        parent, owner, owner_inputs = owner, module, x
        if isinstance(module, NystromKernel):  # owned by the kernel around it, whose outputscale "rls" scores with
            yield module, parent, x
            return
        if isinstance(module, SketchedNewtonGirardAdditiveKernel) or callable(
                getattr(module, "resize_features", None)):  # its own draws are its width
            yield module, module, x
            return
        if isinstance(module, _PRODUCTS):
            if any(_factor_units(module, x)):
                yield module, module, x
            return  # a product of exact factors only has a fixed width
        if isinstance(module, SketchedArcKernel) and x is not None:
            with torch.no_grad():
                x = module.embedding(x)  # what its base kernel sees
    for child in module.children():
        yield from _width_units(child, x, owner, owner_inputs, called=not isinstance(module, ScaleKernel))


def _factor_units(product: Kernel, x: Tensor | None) -> list[list[tuple]]:
    """The width units of every factor of a product kernel (empty for exact factors)."""
    return [list(_width_units(factor, x, product)) for factor in product.kernels]


def _width(unit: nn.Module) -> int:
    return unit.num_features


def _granularity(unit: nn.Module) -> int:
    if isinstance(unit, OperatorValuedFourierFeatures):
        return 2 * unit.factor_width
    if isinstance(unit, (RandomFourierFeatures, SphericalRandomFeatures, WeightedFourierFeatures,
                         SpectralProductKernel, SketchedNewtonGirardAdditiveKernel)):
        return 2
    if isinstance(unit, PolynomialSketch) and unit.is_complex:
        return 2  # its constructor refuses odd widths for complex/CtR weights too
    if isinstance(unit, SketchedProductKernel):  # its factors keep their width ratio to it: their groups count
        return math.lcm(*(_granularity(u) for units in _factor_units(unit, None) for u, _, _ in units))
    if isinstance(unit, FeatureProductKernel):  # one random factor times the fixed width of the exact ones
        factors = _factor_units(unit, None)
        resized = [units for units in factors if units]
        if len(resized) == 1:
            fixed = math.prod(kernel_num_features(k) for k, units in zip(unit.kernels, factors) if not units)
            return fixed * math.lcm(*(_granularity(u) for u, _, _ in resized[0]))
    return 1  # Maclaurin widths are budgets, as in their constructors: an unusable odd column is dropped


def _new_widths(units: list[nn.Module], num_features: int) -> list[int]:
    grains = [_granularity(u) for u in units]
    if len(units) == 1:
        return [max(grains[0], grains[0] * round(num_features / grains[0]))]
    total = sum(_width(u) for u in units)
    return [max(g, g * round(num_features * _width(u) / total / g)) for u, g in zip(units, grains)]


def _resize_units(units: list[tuple], num_features: int) -> None:
    """Share ``num_features`` among ``units`` in proportion to their widths and redraw each."""
    widths = _new_widths([unit for unit, _, _ in units], num_features)
    for (unit, owner, inputs), width in zip(units, widths):
        _redraw(unit, width, owner, inputs)


def _resize_product(product: Kernel, width: int, inputs: Tensor | None) -> None:
    """A product at width ``width``: its factors scaled by the same ratio, then its own draws.

    A TensorSRHT or spectral product has width F and factors built at F by :func:`rfgp.sketch`, so
    each factor is scaled by width/F; a Kronecker product's width is the product of its factors'
    widths, so its k resized factors are each scaled by (width/F)^(1/k) (exact factors keep theirs).
    """
    factors = _factor_units(product, inputs)
    ratio = width / product.num_features
    if isinstance(product, FeatureProductKernel):
        ratio **= 1 / sum(bool(units) for units in factors)
    for units in factors:
        if units:
            _resize_units(units, round(ratio * sum(_width(u) for u, _, _ in units)))
    if isinstance(product, SketchedProductKernel):
        sketch = product.sketch
        sketch.num_features = width
        sketch.input_dim = max(kernel_num_features(kernel) for kernel in product.kernels)
        sketch._materialize()
    elif isinstance(product, SpectralProductKernel):
        product.num_frequencies = width // 2
        if product.input_dims is not None:
            product._materialize(product.input_dims)


def _outputscale(owner: Kernel | None) -> Tensor | None:
    """The outputscale of a Nyström kernel's owner that is a ``ScaleKernel`` (its landmarks were scored with it)."""
    return owner.outputscale.detach() if isinstance(owner, ScaleKernel) else None


def _redraw(feature_map: nn.Module, width: int, owner: Kernel | None, inputs: Tensor | None) -> None:
    if isinstance(feature_map, NystromKernel):
        feature_map.reselect_landmarks(width, inputs, _outputscale(owner))
    elif isinstance(feature_map, SketchedNewtonGirardAdditiveKernel):
        feature_map.set_width(width)
    elif callable(getattr(feature_map, "resize_features", None)):
        feature_map.resize_features(width)
    elif isinstance(feature_map, _PRODUCTS):
        _resize_product(feature_map, width, inputs)
    elif isinstance(feature_map, OperatorValuedFourierFeatures):
        feature_map.num_features = width
        _redraw(feature_map.fourier, width // feature_map.factor_width, None, None)
    elif isinstance(feature_map, _MaclaurinFeatures):
        _redraw_maclaurin(feature_map, width, owner, inputs)
    elif isinstance(feature_map, WeightedFourierFeatures):
        feature_map.num_features = width
        if feature_map.input_dim is not None:
            if isinstance(owner, SpectralFeatureKernel):
                owner._centre_proposal()  # as a fresh kernel draws: proposal at the current hyperparameters
            feature_map._materialize()
    elif isinstance(feature_map, _REDRAWN):
        feature_map.num_features = width
        if isinstance(owner, SketchedHammingIMQKernel):
            owner.centre_proposal()  # as a fresh kernel draws: the Gamma proposal at the current β
        if feature_map.input_dim is not None:
            feature_map._materialize()
        if isinstance(owner, SketchedMaternKernel) and owner.is_anchored:
            owner.anchor_lengthscale()  # Matérn-½ weights: ℓ₀ = the current (trained) lengthscale, at any width
    else:
        raise TypeError(
            f"set_num_features has no width rule for {type(feature_map).__name__}; known maps: "
            "RandomFourierFeatures, WeightedFourierFeatures, SphericalRandomFeatures, PolynomialSketch, "
            "GaussianSketch(HD), OptimizedMaclaurin, RandomMaclaurin, OperatorValuedFourierFeatures, "
            "CategoricalFeatures, and the kernels NystromKernel, SketchedProductKernel, SpectralProductKernel, "
            "FeatureProductKernel, SketchedNewtonGirardAdditiveKernel"
        )


def _redraw_maclaurin(feature_map: _MaclaurinFeatures, width: int, owner: Kernel | None,
                      inputs: Tensor | None) -> None:
    """A new budget D_total; Random Maclaurin redraws its degrees, optimized Maclaurin refits its allocation."""
    budget = total_width(width, feature_map.has_constant, feature_map.is_complex)
    if budget < 1:
        raise ValueError(f"num_features={width} leaves no feature for the Maclaurin sketches (weights="
                         f"{feature_map.weights!r})")
    refit = isinstance(feature_map, OptimizedMaclaurin) and feature_map.widths is not None
    if refit and (inputs is None or not isinstance(owner, RandomFeatureKernel)):
        raise ValueError(
            "set_num_features needs x_sample (the training inputs) to refit the optimized Maclaurin "
            "allocation for the new width; pass x_sample= or call it on the model (an ExactGP, or a model type "
            "registered with register_cache_clearer, such as BoTorch's PairwiseGP)"
        )
    if not isinstance(feature_map, (OptimizedMaclaurin, RandomMaclaurin)):
        raise TypeError(f"set_num_features has no width rule for {type(feature_map).__name__}")
    feature_map.requested_num_features = width  # saved as a map built at this width saves it
    feature_map.total_width = budget
    feature_map.num_features = feature_map._output_width()
    if refit:
        fit_allocation_on_columns(owner, inputs)  # the owner's lengthscale (its columns are selected)
        return
    if feature_map.input_dim is not None and (isinstance(feature_map, RandomMaclaurin) or feature_map.widths):
        feature_map._materialize()


def optimized_maclaurin_units(module: nn.Module, x: Tensor | None) -> Iterator[tuple]:
    """(map, owning kernel, the input columns it sees) for every fitted optimized Maclaurin map in ``module``,
    factors of product kernels included (:func:`_width_units` stops at a product)."""
    for unit, owner, inputs, _ in _units_through_products(_width_units(module, x, None)):
        if isinstance(unit, OptimizedMaclaurin) and unit.widths is not None and inputs is not None and isinstance(
                owner, RandomFeatureKernel):
            yield unit, owner, inputs


def fourier_units(module: nn.Module, x: Tensor | None) -> Iterator[tuple]:
    """(map, owning kernel, the input columns it sees, the innermost product kernel holding it or ``None``) for every
    random Fourier map (RFF/ORF/SORF of the RBF and Matérn kernels, and the operator-valued ones of the curl- and
    divergence-free kernels, whose Gaussian envelope k₀ decays the same way) in ``module`` whose owner has a
    lengthscale, factors of product kernels included (a spectral product draws from its factors' lengthscales)."""
    for unit, owner, inputs, product in _units_through_products(_width_units(module, x, None)):
        fourier = isinstance(unit, (RandomFourierFeatures, OperatorValuedFourierFeatures))
        if fourier and inputs is not None and getattr(owner, "has_lengthscale", False):
            yield unit, owner, inputs, product


def nystrom_units(module: nn.Module, x: Tensor | None) -> Iterator[tuple[NystromKernel, Tensor]]:
    """(Nyström kernel, the input columns its ``forward`` sees) for every :class:`~rfgp.kernels.NystromKernel` in
    ``module`` (a ``ScaleKernel`` around one selects them, as for ``rfgp.sketch(ScaleKernel(k), method="nystrom")``),
    factors of product kernels included."""
    for unit, _, inputs, _ in _units_through_products(_width_units(module, x, None)):
        if isinstance(unit, NystromKernel) and inputs is not None:
            yield unit, inputs


def _units_through_products(units, product: Kernel | None = None) -> Iterator[tuple]:
    """``units`` (from :func:`_width_units`) and, for each product kernel among them, its factors' units (on the
    columns each factor sees, nested products included), each with the innermost product holding it (or
    ``product``)."""
    for unit, owner, inputs in units:
        yield unit, owner, inputs, product
        if isinstance(unit, _PRODUCTS):
            for factor in _factor_units(unit, inputs):
                yield from _units_through_products(factor, unit)
