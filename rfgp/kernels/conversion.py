"""``rfgp.sketch``: convert a GPyTorch kernel tree into its random-feature counterpart.

Each supported GPyTorch kernel type has a registered converter that builds the rfgp
kernel with the same hyperparameter values, constraints, priors, ``ard_num_dims``,
``batch_shape`` and ``active_dims``.  ``ScaleKernel`` is kept (its outputscale scales
the features), ``AdditiveKernel`` becomes :class:`~rfgp.kernels.FeatureSumKernel` (its
parts share the width F) and ``ProductKernel`` a width-F product
(:class:`~rfgp.kernels.SpectralProductKernel` for stationary factors,
:class:`~rfgp.kernels.SketchedProductKernel` otherwise, a Kronecker product with exact
factors such as ``IndexKernel``; see :mod:`rfgp.kernels.tree_widths`), so the whole tree
stays low-rank and at most F wide.  ``AdditiveStructureKernel``/``ProductStructureKernel`` become the
sum/product of their base kernel on each column, its hyperparameters tied (:mod:`rfgp.kernels.structure`).
Modules of other families register their converters with :func:`register_converter`.

Dispatch is on the exact type: a subclass of a supported kernel (``RBFKernelGrad`` is an
``RBFKernel``) may compute a different covariance, so it raises a ``TypeError`` unless it
has a converter of its own.  ``method`` is one name for every leaf that has it, or a mapping
from kernel class (or class name) to method; keyword options go to the leaves that declare
them, and an option no leaf of the tree takes raises.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping

import gpytorch
import torch
from gpytorch.kernels import AdditiveKernel, Kernel, ProductKernel, ScaleKernel
from torch import Tensor
from torch.nn import Module

from ..core.validation import check_positive_int, check_seed, has_values
from ..features.gaussian_sketch import bounding_box_center
from .carried_hyperparameters import carry_extra_hyperparameters, check_priors_kept
from .combinations import FeatureProductKernel, FeatureSumKernel
from .hyperparameters import prior_closures
from .input_columns import MULTITASK_TYPES, STRUCTURE_TYPES, TreeColumns, check_tree, children
from .operator_valued import CurlFreeRBFKernel, DivFreeRBFKernel
from .tree_widths import TreeBuilder, leaf_width

_CONVERTERS: dict[type, Callable] = {}
#: the ``method`` names each converter accepts (a callable for families that grow, e.g. polynomial)
_METHODS: dict[type, tuple[str, ...] | Callable[[], tuple[str, ...]]] = {}
#: the keyword options each converter accepts
_OPTIONS: dict[type, tuple[str, ...]] = {}
#: kernels rfgp deliberately does not convert, with the reason
_REFUSALS: dict[type, str] = {}

#: what an error tells a user whose tree holds a kernel without random features
NYSTROM_ALTERNATIVE = (
    "Any scalar kernel tree converts to rank-M landmark features with method='nystrom': "
    "rfgp.sketch(kernel, M, method='nystrom', x_sample=X), X the inputs as the kernel sees them (after input "
    "transforms)"
)


def register_converter(kernel_type: type, methods=None, options: tuple[str, ...] | None = None) -> Callable:
    """Decorator registering ``fn(kernel, num_features, method, seed, **options) -> Kernel`` for exactly ``kernel_type``.

    Args:
        kernel_type: the kernel class (subclasses are not matched: register them separately).
        methods: the ``method`` names ``fn`` accepts (a tuple, or a callable returning one); ``fn``
            receives ``None`` for its default.  ``None``: undeclared, ``fn`` receives any name given.
        options: the keyword options ``fn`` accepts; ``None``: undeclared, ``fn`` receives all.  ``x_sample``
            reaches ``fn`` (if declared, or undeclared) as the rows of the columns its leaf sees.

    Returns:
        The decorator, which registers ``fn`` and returns it unchanged.
    """

    def decorate(fn: Callable) -> Callable:
        _CONVERTERS[kernel_type] = fn
        _METHODS.pop(kernel_type, None)
        _OPTIONS.pop(kernel_type, None)
        if methods is not None:
            _METHODS[kernel_type] = methods
        if options is not None:
            _OPTIONS[kernel_type] = tuple(options)
        return fn

    return decorate


def refuse_conversion(kernel_type: type, reason: str) -> None:
    """Make :func:`sketch` raise a TypeError with ``reason`` for ``kernel_type``."""
    _REFUSALS[kernel_type] = reason


def sketch(kernel: Kernel, num_features: int, method: str | None = None, seed: int | None = None, **options) -> Kernel:
    """Return the random-feature version of a GPyTorch kernel tree with the same hyperparameters.

    Args:
        kernel: e.g. ``ScaleKernel(RBFKernel(ard_num_dims=d))``.  Leaves: RBF, Matérn,
            polynomial, periodic, RQ, spectral mixture, Hamming IMQ (random features, width F); linear,
            constant, cosine, spectral delta (exact features of width d, 1, 2, 2·num_deltas;
            :mod:`rfgp.kernels.spectral_delta`); arc (its converted base on the arc embedding,
            :mod:`rfgp.kernels.arc`); ``NewtonGirardAdditiveKernel`` (every interaction order, F split equally
            among the orders, :mod:`rfgp.kernels.newton_girard`); curl-/divergence-free; ``IndexKernel``;
            ``gpytorch.kernels.keops``' RBF, Matérn and periodic kernels as their namesakes;
            with BoTorch installed also its ``CategoricalKernel``, ``PositiveIndexKernel``, ``DownsamplingKernel``
            and ``ExponentialDecayKernel`` (:mod:`rfgp.integrations.botorch_kernels`) and
            ``OrthogonalAdditiveKernel`` (:mod:`rfgp.integrations.botorch_oak`); inside ``ScaleKernel``,
            ``AdditiveKernel``, ``ProductKernel``, ``MultitaskKernel``, ``AdditiveStructureKernel`` and
            ``ProductStructureKernel`` (per-column features with one tied set of hyperparameters,
            :mod:`rfgp.kernels.structure`).
        num_features: the total width F of the converted tree's Φ (its ``num_features`` is ≤ F).
            A sum splits F equally among its parts after its exact finite parts (``IndexKernel``,
            Linear, Constant, Cosine) took their own widths, each random part an even share (the d
            columns of an ``AdditiveStructureKernel`` are its parts); a product keeps F.  A list gives
            the widths of the parts of the tree's (outermost, ScaleKernels looked through)
            ``AdditiveKernel`` (or columns of its ``AdditiveStructureKernel``) explicitly, e.g.
            ``[256, 512, 256]``; an entry may itself be a list for a nested sum.  Non-positive or
            non-integer widths, a list whose length is not the number of parts, or a width below that of the exact
            part of a sum it is given to, raise ValueError.  (A tree that is one exact leaf, e.g. a ``LinearKernel``,
            has its own width whatever F.)
        method: the sketch of each leaf: ``None`` (every family's default, e.g. ``"rff"`` for
            RBF/Matérn); one name (``"orf"``), used by every leaf that has it while the others
            keep their default — a name no leaf of the tree has raises; or a mapping from
            kernel class or class name to method, ``{"RBFKernel": "orf", PolynomialKernel: "sketch"}``
            (a name covers every class of that name, ``RBFKernel`` and ``keops.RBFKernel``; unlisted
            leaves keep their default; unknown kernels or methods, and kernels no leaf of the tree is, raise).
            ``method="nystrom"`` instead turns the whole tree (any scalar kernel) into one
            :class:`~rfgp.kernels.NystromKernel` with ``num_features`` landmarks chosen among
            ``x_sample=`` (required) by ``landmarks="uniform" | "kmeans++" | "rls"``, see
            :func:`~rfgp.kernels.nystrom.nystrom_sketch` (a ``ScaleKernel`` on top stays on top:
            ``ScaleKernel(NystromKernel(k))``, the same kernel); a ``MultitaskKernel`` becomes a
            decomposable kernel over the Nyström data kernel.
        seed: seed of the random draws; leaf kernels get ``seed, seed + 1, ...`` so
            that factors of a product are independent.  Trees converted for independent models (an ensemble)
            want seeds at least their number of leaves apart: ``seed=0`` and ``seed=1`` give a two-leaf tree's
            second leaf and the other tree's first leaf the same seed, hence the same draws where their type and
            width agree.
        x_sample: optional points of the model's input space (all the columns the tree receives),
            ``(n, d)`` or batched ``(..., n, d)`` (flattened to rows); finite, floating.  Accepted
            whatever the method.  Every leaf gets the columns it sees, as GPyTorch evaluates the
            tree (:mod:`rfgp.kernels.input_columns`): the ``active_dims`` of sum and product parts
            select among their parent's columns (nested ones compose), a ``ScaleKernel``'s base and
            a ``MultitaskKernel``'s data kernel see their parent's columns.  From them Nyström
            chooses its landmarks, the Gaussian sketch its centre and radius, the optimized
            Maclaurin map its allocation (else fitted on its first input), and an exact
            ``LinearKernel`` (features of width d) its d, so that ``num_features`` is known before
            the first call.  Without ``x_sample`` a ``LinearKernel``'s d is the number of its
            ``active_dims``, or the ``ard_num_dims`` of a leaf that also sees all columns; else it
            is set at the first call, and a sum containing it is F + d wide (a product, which must
            keep F, raises).
        **options: passed to the leaves whose converter declares them, and on to the family class
            of the leaf's method, which raises a ``ValueError`` for an option of another family
            (``max_order`` with ``method="rff"``, say).  ``method="gaussian_sketch" |
            "gaussian_sketch_hd"`` (RBF leaves, paper 003) need the data radius and the target
            additive error to choose the truncation order: ``x_sample=`` (or ``radius=``) and
            ``alpha=``, or ``order=`` (see :func:`taylor_sketch_options`); a ValueError names what
            is missing.

    Raises:
        TypeError: ``kernel`` is not a GPyTorch ``Kernel`` (a model: convert its ``covar_module``), or naming
            the first kernel in the tree that has no random-feature version (or is an unregistered subclass of
            one, or of ``ScaleKernel``/``AdditiveKernel``/``ProductKernel`` overriding more than its constructor), or
            an unknown keyword option (the accepted ones listed), or a
            prior of the tree that the converted tree would not have with the same log-density
            (:mod:`rfgp.kernels.carried_hyperparameters`; parameters and priors registered on a kernel instance
            beyond its class's, as BoTorch's ``add_saas_prior`` adds, are carried over).
        ValueError: a method name no leaf of the tree has, a ``method`` mapping naming an
            unknown kernel, a kernel no leaf of the tree is, or a method that kernel does not have, or an option of
            another family
            than the leaf's method; a bad ``x_sample``; and, before any first call would, a tree
            that contradicts itself or ``x_sample``: ``active_dims`` outside the columns a kernel is
            given, a leaf's ``ard_num_dims`` other than the number of columns it sees, leaves that
            see all columns with different ``ard_num_dims``
            (:func:`~rfgp.kernels.input_columns.check_tree`); a ``LinearKernel`` of unknown d in a product.

    Returns:
        The converted kernel tree: ``ScaleKernel`` kept, leaves replaced by their rfgp kernels
        (an RBF leaf by the class of its family, e.g. :class:`~rfgp.kernels.MaclaurinRBFKernel`
        for ``method="maclaurin"``), hyperparameters copied (``requires_grad`` included), constraints and priors
        too (copies: moving the converted tree or loading a state into it leaves ``kernel`` as it was); a module
        the tree holds more than once is converted once per occurrence (independent draws) with its hyperparameters
        shared; in ``kernel``'s train/eval mode.

    Example:
        >>> import torch, rfgp
        >>> from gpytorch.kernels import PeriodicKernel, PolynomialKernel, RBFKernel, ScaleKernel
        >>> train_x = torch.rand(50, 3, generator=torch.Generator().manual_seed(0))
        >>> exact = ScaleKernel(RBFKernel(ard_num_dims=3))
        >>> sketched = rfgp.sketch(exact, num_features=256, method="sorf", seed=0)
        >>> type(sketched.base_kernel).__name__
        'SketchedRBFKernel'
        >>> taylor = rfgp.sketch(exact, 256, method="gaussian_sketch", x_sample=train_x, alpha=1e-2, seed=0)
        >>> type(taylor.base_kernel).__name__
        'GaussianSketchRBFKernel'
        >>> mixed = rfgp.sketch(ScaleKernel(RBFKernel()) + PolynomialKernel(power=2), 256, seed=0,
        ...                     method={"RBFKernel": "orf", "PolynomialKernel": "sketch"})
        >>> tree = ScaleKernel(RBFKernel()) + ScaleKernel(PeriodicKernel() * RBFKernel())
        >>> rfgp.sketch(tree, num_features=[64, 192], seed=0).num_features  # the product keeps its 192
        256
        >>> landmark = rfgp.sketch(exact, 32, method="nystrom", x_sample=train_x, landmarks="kmeans++", seed=0)
        >>> type(landmark).__name__, landmark.base_kernel.num_features  # the ScaleKernel stays on top
        ('ScaleKernel', 32)
    """
    _check_kernel_argument(kernel)
    seed = check_seed(seed)
    columns = check_tree(kernel, options.pop("x_sample", None))
    if method == "nystrom":
        check_positive_int(num_features, "num_features")  # the number of landmarks: one map of the whole tree
        return _own_modules(kernel, _nystrom(kernel, num_features, seed, columns, options)).train(kernel.training)
    _check_option_names(options)
    leaves = list(_leaves(kernel))
    choose_method = _method_chooser(method, leaves)
    plan = _Plan(num_features, choose_method, _SeedSequence(seed), options, columns)
    converted = _convert(kernel, plan)
    _tie_shared_hyperparameters(converted, plan.conversions)
    _count_priors_as_gpytorch(converted, plan.conversions)
    _own_modules(kernel, converted)
    check_priors_kept(kernel, converted)
    unused = sorted(set(options) - plan.used_options)
    if unused:
        takers = {name: sorted({t.__name__ for t, names in _OPTIONS.items() if name in names}) for name in unused}
        raise TypeError(
            "options not taken by any kernel in this tree: "
            + "; ".join(f"{name!r} (taken by {', '.join(takers[name])})" for name in unused)
        )
    # in the exact tree's mode (new modules are in train mode): an rfgp kernel adds its eval-mode terms (a Nyström or
    # truncated map's variance correction) only in eval mode, which a model converted after model.eval() is in
    return converted.train(kernel.training)


def _own_modules(exact: Kernel, converted: Kernel) -> Kernel:
    """Replace every module that ``converted`` took from ``exact`` (the converters pass on its constraints and
    priors) by a copy, so that the conversion is a copy: ``converted.to(...)`` or ``converted.load_state_dict(...)``
    must not cast or overwrite the exact kernel's constraint bounds and prior parameters, which are buffers.  So are
    the tensors a converted module took from ``exact`` (the ``active_dims`` buffer the converters pass to the rfgp
    constructors, which GPyTorch keeps as it is given): ``load_state_dict`` copies into buffers in place.

    One copy per exact module or tensor (a constraint or prior that several converted modules share stays shared
    among them), registered wherever it was: as a child, in GPyTorch's ``_constraints``, in its ``_priors`` entries,
    as a buffer or a parameter.
    """
    exact_modules = {id(module) for module in exact.modules()}
    exact_tensors = {id(tensor) for tensor in (*exact.parameters(), *exact.buffers())}
    memo: dict[int, object] = {}

    def own(module):
        return copy.deepcopy(module, memo) if id(module) in exact_modules else module

    for module in [module for module in converted.modules() if id(module) not in exact_modules]:
        for tensors in (module._buffers, module._parameters):
            for name, tensor in list(tensors.items()):
                if tensor is not None and id(tensor) in exact_tensors:
                    tensors[name] = copy.deepcopy(tensor, memo)
        for name, child in list(module._modules.items()):
            if child is not None:
                module._modules[name] = own(child)
        constraints = getattr(module, "_constraints", {})
        for name, constraint in list(constraints.items()):
            constraints[name] = own(constraint)
        priors = getattr(module, "_priors", {})
        for name, (prior, closure, setting_closure) in list(priors.items()):
            priors[name] = (own(prior), closure, setting_closure)
    return converted


def _check_kernel_argument(kernel) -> None:
    """A TypeError for anything but a GPyTorch kernel, pointing a model's owner at its ``covar_module``."""
    if isinstance(kernel, Kernel):
        return
    message = f"kernel must be a gpytorch.kernels.Kernel (a kernel tree), got {type(kernel).__name__}"
    if isinstance(getattr(kernel, "covar_module", None), Kernel):
        message += (
            "; this is a model: convert its kernel instead, "
            "model.covar_module = rfgp.sketch(model.covar_module, num_features, ...)"
        )
    raise TypeError(message)


def _nystrom(kernel: Kernel, num_features: int, seed: int | None, columns: TreeColumns, options: dict) -> Kernel:
    """``method="nystrom"``: one Nyström map of the whole tree (of the data kernel of a multitask kernel, of each
    component's data kernel of an ``LCMKernel``).

    The tree's landmarks are points of its whole input (its ``active_dims`` apply to them as to the data); a
    multitask kernel's data kernel runs on the multitask kernel's columns, its own ``active_dims`` unapplied
    as in GPyTorch (:mod:`rfgp.kernels.input_columns`), so its landmarks are chosen among those columns.
    """
    from .nystrom import nystrom_sketch
    from .structure import check_nystrom

    check_nystrom(kernel)
    if type(kernel) is gpytorch.kernels.LCMKernel:  # one rank-M map per component's data kernel
        from .sketched_operator_valued import SketchedLCMKernel

        parts = [_nystrom(part, num_features, None if seed is None else seed + i, columns, dict(options))
                 for i, part in enumerate(kernel.covar_module_list)]
        return SketchedLCMKernel(*parts, active_dims=kernel.active_dims)
    if type(kernel) in MULTITASK_TYPES:
        data = kernel.data_covar_module
        if data.active_dims is not None:
            data = copy.deepcopy(data)
            data.active_dims = None
        data_kernel = nystrom_sketch(data, num_features, x_sample=columns.sample(columns.root), seed=seed, **options)
        return _convert_decomposable(kernel, data_kernel)
    return nystrom_sketch(kernel, num_features, x_sample=columns.sample(None), seed=seed, **options)


def _accepted_option_names() -> list[str]:
    return sorted({name for names in _OPTIONS.values() for name in names})


def _check_option_names(options: dict) -> None:
    unknown = [name for name in options if name not in _accepted_option_names()]
    undeclared = [t for t in _CONVERTERS if t not in _OPTIONS]
    if unknown and not undeclared:
        raise TypeError(
            f"rfgp.sketch got unexpected keyword argument(s) {', '.join(repr(n) for n in unknown)}; accepted: "
            f"num_features, method, seed, {', '.join(_accepted_option_names())}"
        )


def _leaves(kernel: Kernel):
    parts = children(kernel) or _embedded_children(kernel)
    if not parts:
        yield kernel
    for child, _ in parts:
        yield from _leaves(child)


def _embedded_children(kernel: Kernel) -> list[tuple[Kernel, bool]]:
    """The base kernel of a kernel that evaluates it on an embedding of its inputs (``ArcKernel``), whose leaves take
    ``method`` and options as the tree's own do (its columns are the embedding's, :meth:`_Plan.embedded`)."""
    return [(kernel.base_kernel, True)] if type(kernel) is gpytorch.kernels.ArcKernel else []


def _methods_of(kernel_type: type) -> tuple[str, ...] | None:
    methods = _METHODS.get(kernel_type)
    return methods() if callable(methods) else methods


def _method_chooser(method, leaves: list[Kernel]) -> Callable[[Kernel], str | None]:
    """``leaf -> method`` for a ``method`` argument that is None, one name or a mapping."""
    if method is None:
        return lambda leaf: None
    if isinstance(method, str):
        types = {type(leaf) for leaf in leaves if type(leaf) in _CONVERTERS}
        declared = {t: _methods_of(t) for t in types}
        if types and all(m is not None and method not in m for m in declared.values()):
            accepted = sorted({name for m in declared.values() for name in m})
            raise ValueError(
                f"method must be one of {', '.join(repr(a) for a in accepted)} (the methods of the kernels in this "
                f"tree: {', '.join(sorted(t.__name__ for t in types))}); got {method!r}"
            )
        return lambda leaf: method if declared.get(type(leaf)) is None or method in declared[type(leaf)] else None
    if not isinstance(method, Mapping):
        raise TypeError(f"method must be None, a str or a mapping from kernel class to method, got {type(method).__name__}")
    by_type = {}
    names: dict[str, list[type]] = {}  # a name may stand for several classes (RBFKernel and its KeOps twin)
    for t in _CONVERTERS:
        names.setdefault(t.__name__, []).append(t)
    for key, value in method.items():
        kernel_types = names.get(key, []) if isinstance(key, str) else [key]
        if not kernel_types or kernel_types[0] not in _CONVERTERS:
            raise ValueError(
                f"method mapping names {getattr(key, '__name__', key)!r}, which rfgp.sketch does not convert; "
                f"kernels: {', '.join(sorted(names))}"
            )
        for kernel_type in kernel_types:
            accepted = _methods_of(kernel_type)
            if accepted is not None and value not in accepted:
                raise ValueError(f"method for {kernel_type.__name__} must be one of "
                                 f"{', '.join(repr(a) for a in accepted)}; got {value!r}")
            by_type[kernel_type] = value
        in_tree = {type(leaf) for leaf in leaves}
        if not in_tree.intersection(kernel_types):  # like a method name no leaf has: it would change nothing
            raise ValueError(
                f"method mapping names {getattr(key, '__name__', key)}, which is no leaf of this tree (its leaves: "
                f"{', '.join(sorted({t.__name__ for t in in_tree}))}), so the entry would change nothing; remove it"
            )
    return lambda leaf: by_type.get(type(leaf))


class _Plan:
    """What every node conversion needs: width, method choice, seeds, options (with their use recorded), and the
    input columns the node sees (``tree``: those of every node, :mod:`rfgp.kernels.input_columns`)."""

    def __init__(self, num_features: int, choose_method: Callable, seeds: _SeedSequence, options: dict,
                 tree: TreeColumns) -> None:
        self.num_features = num_features
        self.choose_method = choose_method
        self.seeds = seeds
        self.options = options
        self.tree = tree
        self.columns = tree.root
        self.used_options: set[str] = set()
        #: (exact node, its conversion) for every node converted, probes included (shared by all derived plans)
        self.conversions: list[tuple[Kernel, Kernel]] = []

    def at_width(self, num_features, seeds: _SeedSequence | None = None) -> _Plan:
        """This plan for a sub-tree of another width (and, for probes, other seeds); option use stays shared."""
        plan = copy.copy(self)
        plan.num_features = num_features
        if seeds is not None:
            plan.seeds = seeds
        return plan

    def below(self, parent: Kernel, child: Kernel) -> _Plan:
        """This plan for ``child`` of ``parent`` (the columns it sees; option use stays shared)."""
        plan = copy.copy(self)
        plan.columns = self.tree.child_columns(parent, self.columns, child)
        return plan

    def embedded(self, kernel: Kernel, embed: Callable[[Tensor], Tensor]) -> _Plan:
        """This plan for the base kernel of ``kernel``, which evaluates it on ``embed(x)`` (``ArcKernel``): the base
        sees the embedding's columns, and ``x_sample``'s rows (as ``kernel`` sees them) embedded."""
        plan = copy.copy(self)
        rows = self.tree.sample(self.columns)
        if rows is not None:
            with torch.no_grad():
                rows = embed(rows)
        plan.tree = check_tree(kernel.base_kernel, rows)
        plan.columns = plan.tree.root
        return plan

    def options_for(self, kernel: Kernel) -> dict:
        """The options the leaf ``kernel``'s converter declares; the rows of ``x_sample`` in the leaf's columns (any
        leaf may use them, none must) to those that take it, and the number of its columns as ``input_dim`` to
        leaves that need it at conversion (``_TAKES_INPUT_DIM``)."""
        declared = _OPTIONS.get(type(kernel))
        taken = self.options if declared is None else {k: v for k, v in self.options.items() if k in declared}
        self.used_options.update(taken)
        taken = dict(taken)
        x_sample = self.tree.sample(self.columns)
        if x_sample is not None and (declared is None or "x_sample" in declared):
            taken["x_sample"] = x_sample
        if type(kernel) in _TAKES_INPUT_DIM:
            input_dim = self._input_dim(kernel, taken.get("input_dim"))
            if input_dim is not None:
                taken["input_dim"] = input_dim
        return taken

    def _input_dim(self, kernel: Kernel, given: int | None) -> int | None:
        """The number d of columns a leaf sees, else ``input_dim=``; ``None`` when neither is known (a Linear leaf
        then takes d at its first call, :mod:`rfgp.kernels.tree_widths`)."""
        width = self.tree.width(self.columns)
        if given is not None and width is not None and given != width:
            raise ValueError(f"input_dim={given} was passed, but {type(kernel).__name__} sees {width} columns "
                             f"({self.tree.describe(self.columns)})")
        return given if width is None else width


class _SeedSequence:
    def __init__(self, seed: int | None) -> None:
        self.next = seed

    def take(self) -> int | None:
        seed = self.next
        if seed is not None:
            self.next += 1
        return seed


#: the composite kernels that _convert takes apart; a subclass is taken apart as its parent only if it computes as it
_COMPOSITES = (ScaleKernel, AdditiveKernel, ProductKernel)
#: what every class defines: overriding these is no change of the covariance (a subclass's constructor sets defaults)
_CLASS_BOOKKEEPING = frozenset({"__init__", "__module__", "__qualname__", "__doc__", "__dict__", "__weakref__",
                                "__annotations__", "__firstlineno__", "__static_attributes__", "__orig_bases__",
                                "__parameters__", "__slotnames__"})


def _convert(kernel, plan: _Plan):
    converted = _convert_node(kernel, plan)
    plan.conversions.append((kernel, converted))
    return converted


def _tie_shared_hyperparameters(converted: Kernel, conversions: list[tuple[Kernel, Kernel]]) -> None:
    """Give the conversions of one hyperparameter of the exact tree one ``Parameter``, as GPyTorch trains it as one.

    A hyperparameter is one ``Parameter`` of the exact tree, held by one module or several:

    * a module the tree holds more than once (``AdditiveKernel(rbf, ProductKernel(rbf, periodic))`` with one ``rbf``)
      is converted once per occurrence (a product needs draws independent of the sum's); each occurrence's
      parameters are the first one's, by name;
    * a ``Parameter`` several modules hold (``k2.raw_lengthscale = k1.raw_lengthscale``): the converters copy each
      module's values into parameters of its own under the exact names (and
      :func:`~rfgp.kernels.carried_hyperparameters.carry_extra_hyperparameters` the rest), so the conversions'
      parameters of that name are the first one's (a restructured product's that lost the name keeps its own).

    One rule for both: a converted parameter stands for the exact module's own ``Parameter`` of its name, or, where
    the exact module has none of that name (one nested in a composite's conversion), for the name in that module;
    all that stand for one hyperparameter become the first of them.  Else training would fit them apart, a different
    model.  Priors stay on the occurrences that GPyTorch's ``named_priors`` counts in the exact tree
    (:func:`_count_priors_as_gpytorch`).
    """
    in_tree = {id(module) for module in converted.modules()}
    first_conversion: dict[int, Kernel] = {}
    first_parameter: dict[tuple, torch.nn.Parameter] = {}
    for exact, result in conversions:
        if id(result) not in in_tree:  # a probe's conversion, thrown away
            continue
        _check_same_parameters(exact, first_conversion.setdefault(id(exact), result), result)
        exact_parameters = {name: id(parameter) for name, parameter in exact.named_parameters(recurse=False)}
        for name in dict(result.named_parameters(remove_duplicate=False)):
            owner, _, leaf = name.rpartition(".")
            module = result.get_submodule(owner)
            key = (exact_parameters[name],) if name in exact_parameters else (id(exact), name)
            module._parameters[leaf] = first_parameter.setdefault(key, module._parameters[leaf])


def _check_same_parameters(exact: Kernel, first: Kernel, result: Kernel) -> None:
    """Two conversions of one exact module have the same parameter names and shapes, else they cannot be tied."""
    shared = dict(first.named_parameters(remove_duplicate=False))
    own = dict(result.named_parameters(remove_duplicate=False))
    if shared.keys() != own.keys() or any(shared[n].shape != p.shape for n, p in own.items()):
        raise TypeError(
            f"rfgp.sketch cannot keep the hyperparameters of {type(exact).__name__} tied: the same module appears "
            f"more than once in the tree and its conversions have different parameters ({sorted(own)} vs "
            f"{sorted(shared)}); use separate kernel instances, or tie them after conversion"
        )


def _count_priors_as_gpytorch(converted: Kernel, conversions: list[tuple[Kernel, Kernel]]) -> None:
    """Remove the priors of a converted occurrence that GPyTorch's ``named_priors`` skips in the exact tree.

    ``named_priors`` walks ``named_children``, which lists a child held twice by the same parent once: the exact
    ``k * k`` or ``k + k`` counts k's priors once, while its conversion holds two occurrences (independent draws,
    tied hyperparameters, :func:`_tie_shared_hyperparameters`), whose second would double the log prior.  An occurrence
    whose exact module is an earlier sibling's (children of the same converted node, in order) loses its priors
    and those of its submodules; the same module under another parent keeps them, as GPyTorch counts it there.
    """
    in_tree = {id(module) for module in converted.modules()}
    exact_of = {id(result): exact for exact, result in conversions if id(result) in in_tree}

    def walk(module: Module, removed: bool, siblings: set[int]) -> None:
        exact = exact_of.get(id(module))
        if exact is not None:
            removed = removed or id(exact) in siblings
            siblings.add(id(exact))
            siblings = set()  # the scope of this node's own children
        if removed:
            for name in list(getattr(module, "_priors", {})):
                del module._priors[name]
                del module._modules[name]
        for child in module.children():
            walk(child, removed, siblings)

    walk(converted, False, set())


def _convert_node(kernel, plan: _Plan):
    if isinstance(kernel, _COMPOSITES) and not _computes_as_composite(kernel):
        return _convert_leaf(kernel, plan)  # a converter registered for its exact type, or an error naming it
    if isinstance(kernel, ScaleKernel):
        base = _convert(kernel.base_kernel, plan.below(kernel, kernel.base_kernel))
        scaled = ScaleKernel(base, **_common_kwargs(kernel))
        scaled.active_dims = kernel.active_dims  # its own, as GPyTorch applies them (not the base's copied at init)
        return carry_extra_hyperparameters(kernel, copy_hyperparameters(kernel, scaled, "outputscale"))
    if isinstance(kernel, (AdditiveKernel, ProductKernel)):
        builder = _tree_builder(kernel, plan)
        if isinstance(kernel, AdditiveKernel):
            return carry_extra_hyperparameters(kernel, builder.sum(kernel, plan.num_features))  # parts kept in order
        product = builder.product(kernel, plan.num_features)
        parts = getattr(product, "kernels", None)
        if parts is not None and len(parts) == len(kernel.kernels) and not hasattr(product, "exact_factor_paths"):
            # factors kept in order, so a prior's closure (m.kernels[i]...) reads the same factor; a restructured
            # product does not take the composite's own priors, and check_priors_kept names them
            carry_extra_hyperparameters(kernel, product)
        return product
    if type(kernel) in MULTITASK_TYPES:
        data = kernel.data_covar_module
        sketched = [type(leaf).__name__ for leaf in _leaves(data) if _is_rfgp_kernel(leaf)]
        if sketched:
            raise TypeError(
                f"rfgp.sketch converts exact GPyTorch kernels, and this {type(kernel).__name__}'s data_covar_module "
                f"holds {sketched[0]}, already an rfgp kernel: use rfgp.kernels.SketchedDecomposableKernel("
                "data_covar_module, num_tasks, rank) in place of the MultitaskKernel (a drop-in, same arguments and "
                "state_dict keys), which keeps the feature algebra that GPyTorch's dense Kronecker product loses; or "
                "pass the exact tree to rfgp.sketch"
            )
        return _convert_decomposable(kernel, _convert(data, plan.below(kernel, data)))
    if type(kernel) in STRUCTURE_TYPES:
        return carry_extra_hyperparameters(kernel, _convert_structure(kernel, plan))
    if type(kernel) is gpytorch.kernels.ArcKernel:
        return carry_extra_hyperparameters(kernel, _convert_arc(kernel, plan))
    if type(kernel) is gpytorch.kernels.LCMKernel:
        from .sketched_operator_valued import SketchedLCMKernel

        parts = _tree_builder(kernel, plan).sum_parts(kernel.covar_module_list, plan.num_features, "LCMKernel")
        return SketchedLCMKernel(*parts, active_dims=kernel.active_dims)
    return _convert_leaf(kernel, plan)


def _convert_structure(kernel: Kernel, plan: _Plan) -> Kernel:
    """``AdditiveStructureKernel``/``ProductStructureKernel`` → the conversion of the sum/product of per-column
    copies of the base kernel, their hyperparameters tied to one set (:mod:`rfgp.kernels.structure`); a product
    over an ``RBFKernel`` → that RBF kernel on all the columns (the same covariance and hyperparameter).  The
    exact kernel's ``state_dict`` (``base_kernel.*``) loads into every column's conversion."""
    from .structure import check_convertible, column_copies, column_positions, is_rbf_product, load_base_kernel_keys

    check_convertible(kernel)
    base = kernel.base_kernel
    if is_rbf_product(kernel):
        rbf = _convert(base, plan.below(kernel, base))
        converted = rbf if kernel.active_dims is None else FeatureProductKernel(rbf, active_dims=kernel.active_dims)
        occurrences = [rbf]
    else:
        copies = column_copies(kernel, column_positions(kernel, plan.tree.width(plan.columns)))
        converted = _convert_columns(kernel, copies, plan)
        in_tree = {id(module) for module in converted.modules()}
        copy_ids = {id(part) for part in copies}
        occurrences = [result for exact, result in plan.conversions if id(exact) in copy_ids and id(result) in in_tree]
        # the copies' conversions are occurrences of the one base module: _tie_shared_hyperparameters ties them
        plan.conversions.extend((base, result) for result in occurrences)
    names = {id(module): name for name, module in converted.named_modules(remove_duplicate=False)}
    paths = tuple(names[id(result)] for result in occurrences)
    converted.register_load_state_dict_pre_hook(functools.partial(load_base_kernel_keys, paths))
    return converted


def _convert_columns(kernel: Kernel, copies: list[Kernel], plan: _Plan) -> Kernel:
    """The sum (width F split among the columns) or product (width F) of the converted per-column ``copies``."""
    sums = type(kernel) is gpytorch.kernels.AdditiveStructureKernel
    equivalent = (AdditiveKernel if sums else ProductKernel)(*copies)
    equivalent.active_dims = kernel.active_dims  # the structure kernel's (plan.columns has applied them already)
    builder = _tree_builder(equivalent, plan)
    if sums:
        converted = FeatureSumKernel(*builder.sum_parts(copies, plan.num_features, type(kernel).__name__),
                                     active_dims=kernel.active_dims)
    else:
        converted = builder.product(equivalent, plan.num_features)
    if kernel.active_dims is None and kernel.base_kernel.active_dims is None:  # else the columns are known in number
        if len(copies) == 1 and not sums:
            converted = FeatureProductKernel(converted)  # a product of one factor is its conversion, input_dim its own
        converted.input_dim = len(copies)  # inputs of another width raise (FeatureKernel.check_inputs)
    return converted


def _convert_arc(kernel: Kernel, plan: _Plan) -> Kernel:
    """``ArcKernel`` → :class:`~rfgp.kernels.SketchedArcKernel`: the converted base kernel (at the width F, its
    leaves taking ``method`` and options as the tree's) on the same embedding, whose angle, radius and lengthscale
    (values, constraints, priors) carry over; a custom ``delta_func`` is kept (:mod:`rfgp.kernels.arc`)."""
    from .arc import SketchedArcKernel

    base = _convert(kernel.base_kernel, plan.embedded(kernel, kernel.embedding))
    default = getattr(kernel.delta_func, "__func__", None) is gpytorch.kernels.ArcKernel.default_delta_func
    sketched = SketchedArcKernel(base, delta_func=None if default else kernel.delta_func,
                                 angle_constraint=kernel.raw_angle_constraint,
                                 radius_constraint=kernel.raw_radius_constraint, **lengthscale_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "lengthscale", "angle", "radius")


def _computes_as_composite(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a composite or a subclass of one that overrides nothing of it but its constructor
    (BoTorch's ``CombinatorialCovarModule(ScaleKernel)`` only sets constructor defaults); one that overrides
    ``forward`` (a squared ``ScaleKernel``), the ``outputscale`` property that ``forward`` reads, or any other attribute
    of its parent may compute another covariance, which converting it as its parent would silently change."""
    mro = type(kernel).__mro__
    parent = next(base for base in _COMPOSITES if isinstance(kernel, base))
    return not any(hasattr(parent, name) for cls in mro[:mro.index(parent)] for name in vars(cls)
                   if name not in _CLASS_BOOKKEEPING)


def _tree_builder(kernel: Kernel, plan: _Plan) -> TreeBuilder:
    """The width builder for the parts of ``kernel`` (a sum, product or LCM), converting them below it."""
    return TreeBuilder(
        convert=lambda part, width: _convert(part, plan.at_width(width).below(kernel, part)),
        probe=lambda part, width: _convert(part, plan.at_width(width, _SeedSequence(0)).below(kernel, part)),
        take_seed=plan.seeds.take,
    )


def _convert_leaf(kernel: Kernel, plan: _Plan) -> Kernel:
    kernel_type = type(kernel)
    if kernel_type in _REFUSALS:
        raise TypeError(f"rfgp.sketch does not convert {kernel_type.__name__}: {_REFUSALS[kernel_type]}")
    if kernel_type in _CONVERTERS:
        converter = _CONVERTERS[kernel_type]
        converted = converter(kernel, leaf_width(plan.num_features, kernel), plan.choose_method(kernel),
                              plan.seeds.take(), **plan.options_for(kernel))
        return carry_extra_hyperparameters(kernel, converted)
    if _is_rfgp_kernel(kernel):
        raise TypeError(
            f"rfgp.sketch converts exact GPyTorch kernels, and {kernel_type.__name__} is already an rfgp kernel; "
            "pass the exact tree to rfgp.sketch, or re-draw an rfgp tree at another width with "
            "rfgp.set_num_features(kernel_or_model, num_features)"
        )
    parents = [t.__name__ for t in kernel_type.__mro__[1:] if t in _CONVERTERS or t in _COMPOSITES]
    if parents:
        raise TypeError(
            f"rfgp.sketch has no random-feature version of {kernel_type.__name__}; it is a subclass of "
            f"{parents[0]}, but a subclass may compute a different covariance (RBFKernelGrad adds derivatives), "
            f"so it is not converted as its parent: register a converter with "
            f"rfgp.register_converter({kernel_type.__name__}). {NYSTROM_ALTERNATIVE}"
        )
    supported = ", ".join(sorted({t.__name__ for t in _CONVERTERS}))
    raise TypeError(
        f"rfgp.sketch has no random-feature version of {kernel_type.__name__}; supported kernels: "
        f"{supported}, and ScaleKernel/AdditiveKernel/ProductKernel/MultitaskKernel around them. "
        f"{NYSTROM_ALTERNATIVE}"
    )


def _is_rfgp_kernel(kernel: Kernel) -> bool:
    """Whether ``kernel`` is an rfgp kernel without a converter, i.e. already sketched (rfgp's exact CurlFreeRBFKernel
    and DivFreeRBFKernel have converters)."""
    return type(kernel).__module__.split(".")[0] == "rfgp" and type(kernel) not in _CONVERTERS


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
        target.register_constraint(raw, getattr(source, f"{raw}_constraint"))
        # after the constraint: GPyTorch re-initialises a parameter whose constraint has an initial_value (BoTorch's
        # lengthscale constraints do), which would overwrite a copied (e.g. fitted) value
        getattr(target, raw).data.copy_(getattr(source, raw).data)
        # a hyperparameter the user fixed (raw_*.requires_grad_(False)) stays fixed: training must not move it
        getattr(target, raw).requires_grad_(getattr(source, raw).requires_grad)
        prior_name = f"{name}_prior"
        if prior_name in source._priors:
            # the target's own closures: the source's call its class's private setters (PeriodicKernel's
            # _set_period_length), which the rfgp kernel has not, or are bound to the source kernel
            target.register_prior(prior_name, source._priors[prior_name][0], *prior_closures(name))
    return target


_FOURIER = ("rff", "orf", "sorf")
_RBF_METHODS = (*_FOURIER, "maclaurin", "gaussian_sketch", "gaussian_sketch_hd")
_MACLAURIN_OPTIONS = ("projection", "weights", "srht_blocks", "min_order", "max_order", "sample_size", "bias_correction")
_TAYLOR_OPTIONS = ("x_sample", "radius", "alpha", "order", "center", "min_lengthscale", "mode")


@register_converter(gpytorch.kernels.RFFKernel, methods=_RBF_METHODS,
                    options=(*_MACLAURIN_OPTIONS, *_TAYLOR_OPTIONS, "complex_posterior", "input_dim"))
@register_converter(gpytorch.kernels.RBFKernel, methods=_RBF_METHODS,
                    options=(*_MACLAURIN_OPTIONS, *_TAYLOR_OPTIONS, "complex_posterior", "input_dim"))
def _convert_rbf(kernel, num_features, method, seed, **options):
    """RBFKernel → the RBF family class of ``method`` (``SketchedRBFKernel(method=...)`` picks it);
    ``method="gaussian_sketch" | "gaussian_sketch_hd"`` see :func:`taylor_sketch_options`.  With ``x_sample`` the
    optimized Maclaurin map fits its allocation on it at conversion (as it would on its first input).

    GPyTorch's ``RFFKernel`` is random Fourier features of the same RBF kernel (its own draws, 2·num_samples
    wide, dense N × N algebra): it converts the same way — same lengthscale, rfgp's draws at width
    ``num_features``, feature-space inference."""
    from .fourier import SketchedRBFKernel
    from .gaussian_sketch import GAUSSIAN_SKETCH_METHODS
    from .maclaurin import warn_truncated_conversion

    x_sample = None
    if method in GAUSSIAN_SKETCH_METHODS:
        options = taylor_sketch_options(kernel, method, **options)
    else:  # the Fourier maps need no data; the Maclaurin allocation may take it
        x_sample = options.pop("x_sample", None)
    sketched = SketchedRBFKernel(num_features, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel))
    sketched = copy_hyperparameters(kernel, sketched, "lengthscale")
    if x_sample is not None and method == "maclaurin":
        sketched.prepare(x_sample)
        warn_truncated_conversion(sketched, x_sample)
    return sketched


def taylor_sketch_options(kernel: Kernel, method: str, x_sample: Tensor | None = None, radius: float | None = None,
                          alpha: float | None = None, order: int | None = None, center=None,
                          min_lengthscale: float | None = None, **options) -> dict:
    r"""Arguments of :class:`~rfgp.kernels.GaussianSketchRBFKernel` for converting ``kernel``.

    GaussianSketch(HD) truncate the Taylor expansion of exp(−‖z − z'‖²) around the origin at
    an order s that depends on the data radius and the target additive error α (paper 003
    Lemmas 2.9/2.11, Thms 3.1/3.3: the smallest s with ξ d e^{2dL²} P(s, 2L²) ≤ α, box
    radius L = ‖x − c‖_∞/(√2 ℓ), resp. ξ e^{2R²} P(s, 2R²) ≤ α, ball radius R = ‖x − c‖₂/(√2 ℓ),
    ξ = 4).  So the conversion needs, besides ``alpha``:

    * ``x_sample``: points in the columns the kernel sees (``rfgp.sketch`` passes each leaf its
      columns of its ``x_sample``, :mod:`rfgp.kernels.input_columns`) — the centre c is their
      bounding-box centre and the radius their largest ‖x − c‖_∞ (GaussianSketch) or ‖x − c‖₂
      (HD), in input units; or
    * ``radius`` (and optionally ``center``, default no shift) given directly; or
    * ``order`` = s directly (then neither radius nor alpha is needed).

    ``min_lengthscale`` (the lengthscale s is chosen for) defaults to the converted kernel's
    smallest current lengthscale, so the converted kernel holds the bound ``|K − K_s| ≤ α/4``
    entrywise at the carried-over hyperparameters; a lengthscale trained below it raises.

    Args:
        kernel: the exact ``gpytorch.kernels.RBFKernel`` being converted (its lengthscale is read).
        method: ``"gaussian_sketch"`` or ``"gaussian_sketch_hd"``.
        x_sample: finite points to take the centre and radius from, shape ``(n, d)``, d the columns ``kernel``
            sees (validated by :func:`~rfgp.kernels.input_columns.check_x_sample`).
        radius: a bound on ‖x − center‖ in input units, instead of ``x_sample``.
        alpha: the target additive error α.
        order: the truncation order s, instead of ``radius`` and ``alpha``.
        center: c (default: the bounding-box centre of ``x_sample``, or no shift with ``radius``).
        min_lengthscale: the lengthscale s is chosen for (default: the kernel's smallest).
        **options: the other options of :class:`~rfgp.kernels.GaussianSketchRBFKernel`, passed on.

    Returns:
        The keyword arguments of :class:`~rfgp.kernels.GaussianSketchRBFKernel` (besides
        ``num_features``, ``method``, ``seed`` and the lengthscale setup).

    Raises:
        ValueError: naming the missing argument (``radius``/``x_sample`` or ``alpha``), or
            when both ``radius`` and ``x_sample`` are given.
    """
    if x_sample is not None:
        if radius is not None:
            raise ValueError(f"pass radius= or x_sample= for method={method!r}, not both (got radius={radius})")
        x = x_sample.double()
        center = bounding_box_center(x) if center is None else torch.as_tensor(center).to(x)
        offsets = x - center
        radius = float(offsets.abs().max() if method == "gaussian_sketch" else offsets.norm(dim=-1).max())
        center = center.tolist()
    if order is None:
        norm = "‖x − center‖_∞" if method == "gaussian_sketch" else "‖x − center‖₂"
        missing = [name for name, value in (("radius", radius), ("alpha", alpha)) if value is None]
        if missing:
            given_sample = "None" if x_sample is None else f"a tensor of shape {tuple(x_sample.shape)}"
            raise ValueError(
                f"method={method!r} chooses its truncation order s from the data radius and the target "
                f"additive error alpha (paper 003 Lemma 2.9/2.11); missing: {' and '.join(missing)} "
                f"(got radius={radius}, x_sample={given_sample}, alpha={alpha}). Pass x_sample= (points to take the "
                f"centre and radius from) or radius= (a bound on {norm} in input units), and alpha= "
                "(e.g. 1e-4), or order= directly"
            )
    if min_lengthscale is None and radius is not None:
        min_lengthscale = float(kernel.lengthscale.detach().min())
    return {"order": order, "radius": radius, "alpha": alpha, "center": center,
            "min_lengthscale": min_lengthscale, **options}


@register_converter(gpytorch.kernels.MaternKernel, methods=_FOURIER, options=("input_dim",))
def _convert_matern(kernel, num_features, method, seed, **options):
    from .fourier import SketchedMaternKernel

    sketched = SketchedMaternKernel(
        num_features, nu=kernel.nu, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


def _polynomial_methods() -> tuple[str, ...]:
    from .polynomial import POLYNOMIAL_METHODS

    return tuple(POLYNOMIAL_METHODS)


@register_converter(gpytorch.kernels.PolynomialKernel, methods=_polynomial_methods,
                    options=("projection", "weights", "srht_blocks", "lengthscale", "input_normalization",
                             "complex_posterior", "input_dim", "min_order", "sample_size",
                             "bias_correction", "x_sample"))
def _convert_polynomial(kernel, num_features, method, seed, x_sample=None, **options):
    """PolynomialKernel → :class:`~rfgp.kernels.SketchedPolynomialKernel`, offset carried over; with ``x_sample``
    ``method="maclaurin"`` fits its allocation on it at the converted offset (as the RBF conversion does).  The option
    ``lengthscale=True`` adds a trainable ℓ, ((x/ℓ)ᵀ(y/ℓ) + c)^p, at ℓ = 1: the exact kernel at conversion."""
    from .maclaurin import fit_allocation_on_columns, warn_truncated_conversion
    from .polynomial import SketchedPolynomialKernel

    if kernel.power < 1:
        raise ValueError(
            f"rfgp.sketch: PolynomialKernel(power={kernel.power}) is the constant kernel (xᵀy + c)⁰ = 1, which has no "
            "polynomial sketch; accepted: power ≥ 1, or gpytorch.kernels.ConstantKernel for a constant (converted "
            "exactly)"
        )
    sketched = SketchedPolynomialKernel(
        kernel.power,
        num_features,
        method=method or "sketch",
        seed=seed,
        offset_constraint=kernel.raw_offset_constraint,
        **options,
        **_common_kwargs(kernel),
    )
    sketched = copy_hyperparameters(kernel, sketched, "offset")
    if sketched.has_lengthscale:  # the lengthscale the option adds starts at 1, where the covariance is the exact one
        sketched.lengthscale = torch.ones_like(sketched.lengthscale)
    if x_sample is not None and method == "maclaurin":
        fit_allocation_on_columns(sketched, x_sample)
        warn_truncated_conversion(sketched, x_sample)
    return sketched


def _convert_derivative_kernel(sketched_type, kernel, num_features, method, seed, **options):
    sketched = sketched_type(
        num_features, kernel.input_dim, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


@register_converter(CurlFreeRBFKernel, methods=_FOURIER, options=())
def _convert_curl_free(kernel, num_features, method, seed, **options):
    from .sketched_operator_valued import SketchedCurlFreeKernel

    return _convert_derivative_kernel(SketchedCurlFreeKernel, kernel, num_features, method, seed, **options)


@register_converter(DivFreeRBFKernel, methods=_FOURIER, options=())
def _convert_div_free(kernel, num_features, method, seed, **options):
    from .sketched_operator_valued import SketchedDivFreeKernel

    return _convert_derivative_kernel(SketchedDivFreeKernel, kernel, num_features, method, seed, **options)


def _convert_decomposable(kernel, base: Kernel) -> Kernel:
    """MultitaskKernel / DecomposableKernel → SketchedDecomposableKernel over the converted data kernel.

    ``num_features`` is the width of the scalar sketch; the root has F·(rank + p) columns.  The
    IndexKernel (A = LLᵀ + diag(v), its constraint and prior) carries over unchanged.  The
    multitask kernel's ``active_dims`` select the columns; its data kernel runs on them without
    selecting again, as GPyTorch's ``MultitaskKernel.forward`` does.  The result keeps MultitaskKernel's
    module names (``data_covar_module``, ``task_covar_module``), so the exact kernel's ``state_dict`` loads into it.
    """
    from .sketched_operator_valued import SketchedDecomposableKernel

    rank = kernel.task_covar_module.covar_factor.shape[-1]
    base.active_dims = None
    sketched = SketchedDecomposableKernel(base, num_tasks=kernel.num_tasks, rank=rank, active_dims=kernel.active_dims)
    sketched.task_covar_module = copy.deepcopy(kernel.task_covar_module)
    return sketched


def _check_positive_hyperparameters(kernel: Kernel, *names: str) -> None:
    """Conversion-time check (the sketched families need them > 0 whatever constraint the exact kernel has); a tree
    on ``meta`` has no values to check."""
    for name in names:
        value = getattr(kernel, name).detach()
        if has_values(value) and (not bool(torch.isfinite(value).all()) or bool((value <= 0).any())):
            raise ValueError(
                f"{type(kernel).__name__}.{name} must be finite and > 0 to convert, got "
                f"{value.cpu().flatten()[:8].tolist()}"
            )


def _spectral_kwargs(kernel: Kernel, method: str | None, seed: int | None) -> dict:
    return {"method": method or "rff", "seed": seed, **_common_kwargs(kernel)}


@register_converter(gpytorch.kernels.PeriodicKernel, methods=("rff",), options=())
def _convert_periodic(kernel, num_features, method, seed):
    """PeriodicKernel → SketchedPeriodicKernel (Bessel-weighted harmonics, :mod:`rfgp.features.periodic`)."""
    from .periodic import SketchedPeriodicKernel

    _check_positive_hyperparameters(kernel, "lengthscale", "period_length")
    sketched = SketchedPeriodicKernel(num_features, period_length_constraint=kernel.raw_period_length_constraint,
                                      **{**_spectral_kwargs(kernel, method, seed), **lengthscale_kwargs(kernel)})
    return copy_hyperparameters(kernel, sketched, "lengthscale", "period_length")


@register_converter(gpytorch.kernels.RQKernel, methods=("rff",), options=())
def _convert_rq(kernel, num_features, method, seed):
    """RQKernel → SketchedRQKernel (importance-weighted frequencies, :mod:`rfgp.features.rational_quadratic`)."""
    from .rational_quadratic import SketchedRQKernel

    _check_positive_hyperparameters(kernel, "lengthscale", "alpha")
    sketched = SketchedRQKernel(num_features, alpha_constraint=kernel.raw_alpha_constraint,
                                **{**_spectral_kwargs(kernel, method, seed), **lengthscale_kwargs(kernel)})
    return copy_hyperparameters(kernel, sketched, "lengthscale", "alpha")


_MIXTURE_PARAMETERS = ("mixture_weights", "mixture_means", "mixture_scales")


@register_converter(gpytorch.kernels.SpectralMixtureKernel, methods=("rff",), options=())
def _convert_spectral_mixture(kernel, num_features, method, seed):
    """SpectralMixtureKernel → SketchedSpectralMixtureKernel (:mod:`rfgp.features.spectral_mixture`)."""
    from .spectral_mixture import SketchedSpectralMixtureKernel

    _check_positive_hyperparameters(kernel, "mixture_weights", "mixture_scales")
    constraints = {f"{name}_constraint": getattr(kernel, f"raw_{name}_constraint") for name in _MIXTURE_PARAMETERS}
    sketched = SketchedSpectralMixtureKernel(kernel.num_mixtures, num_features, ard_num_dims=kernel.ard_num_dims,
                                             **constraints, **_spectral_kwargs(kernel, method, seed))
    return copy_hyperparameters(kernel, sketched, *_MIXTURE_PARAMETERS)


@register_converter(gpytorch.kernels.HammingIMQKernel, methods=(), options=())
def _convert_hamming_imq(kernel, num_features, method, seed):
    """HammingIMQKernel → :class:`~rfgp.kernels.hamming_imq.SketchedHammingIMQKernel` (Gamma-mixture categorical
    features, drawn around the current β), α and β with their constraints and priors."""
    from .hamming_imq import SketchedHammingIMQKernel

    _check_positive_hyperparameters(kernel, "alpha", "beta")
    sketched = SketchedHammingIMQKernel(kernel.vocab_size, num_features, seed=seed,
                                        alpha_constraint=kernel.raw_alpha_constraint,
                                        beta_constraint=kernel.raw_beta_constraint,
                                        reference_beta=float(kernel.beta.detach().min()), **_common_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "alpha", "beta")


#: leaves that receive the number d of columns they see as ``input_dim`` at conversion (:meth:`_Plan.options_for`):
#: a LinearKernel's feature width is d; a CosineKernel is defined for d = 1 only; a NewtonGirardAdditiveKernel draws
#: for its num_dims columns
_TAKES_INPUT_DIM = (gpytorch.kernels.LinearKernel, gpytorch.kernels.CosineKernel,
                    gpytorch.kernels.NewtonGirardAdditiveKernel)


@register_converter(gpytorch.kernels.LinearKernel, methods=("exact",), options=("input_dim",))
def _convert_linear(kernel, num_features, method, seed, input_dim=None):
    """LinearKernel → LinearFeatureKernel: exact features x⊙√v, width d = ``input_dim`` (the number of columns the
    leaf sees; ``None`` when unknown at conversion: set at the first call); ``num_features`` does not apply."""
    from .exact_features import LinearFeatureKernel

    sketched = LinearFeatureKernel(ard_num_dims=kernel.ard_num_dims, input_dim=input_dim,
                                   variance_constraint=kernel.raw_variance_constraint, **_common_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "variance")


@register_converter(gpytorch.kernels.ConstantKernel, methods=("exact",), options=())
def _convert_constant(kernel, num_features, method, seed):
    """ConstantKernel → ConstantFeatureKernel: the exact feature √c, width 1."""
    from .exact_features import ConstantFeatureKernel

    sketched = ConstantFeatureKernel(constant_constraint=kernel.raw_constant_constraint, **_common_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "constant")


@register_converter(gpytorch.kernels.CosineKernel, methods=("exact",), options=("input_dim",))
def _convert_cosine(kernel, num_features, method, seed, input_dim=None):
    """CosineKernel → CosineFeatureKernel: exact features [cos, sin](πx/p), width 2 (1-D inputs only: a leaf known
    to see more columns, ``input_dim`` from :meth:`_Plan.options_for`, raises here rather than at its first call)."""
    from .exact_features import CosineFeatureKernel

    if input_dim is not None:
        CosineFeatureKernel._check_one_dimensional(input_dim)
    _check_positive_hyperparameters(kernel, "period_length")
    sketched = CosineFeatureKernel(period_length_constraint=kernel.raw_period_length_constraint,
                                   **_common_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "period_length")


@register_converter(gpytorch.kernels.SpectralDeltaKernel, methods=("exact",), options=())
def _convert_spectral_delta(kernel, num_features, method, seed):
    """SpectralDeltaKernel → :class:`~rfgp.kernels.SpectralDeltaFeatureKernel`: its exact features of width
    2·num_deltas, the same ``Z`` and lengthscale; a width ``num_features`` below 2·num_deltas raises, naming it."""
    from .spectral_delta import SpectralDeltaFeatureKernel, check_exact_width

    num_deltas = kernel.raw_Z.shape[-2]
    check_exact_width(num_features, num_deltas, "num_features", at_least=True)
    sketched = SpectralDeltaFeatureKernel(kernel.num_dims, num_deltas, Z_constraint=kernel.raw_Z_constraint,
                                          **lengthscale_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "lengthscale", "Z")


@register_converter(gpytorch.kernels.NewtonGirardAdditiveKernel, methods=("rff",), options=("input_dim",))
def _convert_newton_girard(kernel, num_features, method, seed, input_dim=None):
    """NewtonGirardAdditiveKernel → :class:`~rfgp.kernels.SketchedNewtonGirardAdditiveKernel` (random features of
    every order, width F), holding a copy of the exact base kernel (its lengthscale, constraint, prior) and the
    order outputscales; the columns it sees (``input_dim``, when known) must number ``num_dims``."""
    from .newton_girard import SketchedNewtonGirardAdditiveKernel

    if input_dim is not None and input_dim != kernel.num_dims:
        raise ValueError(
            f"NewtonGirardAdditiveKernel(num_dims={kernel.num_dims}) sees {input_dim} columns: GPyTorch evaluates its "
            "base kernel on every column it is given (num_dims only caps max_degree), and the conversion draws for "
            f"num_dims columns; set num_dims={input_dim}, or select {kernel.num_dims} columns with active_dims"
        )
    sketched = SketchedNewtonGirardAdditiveKernel(
        copy.deepcopy(kernel.base_kernel), kernel.num_dims, num_features, max_degree=kernel.max_degree, seed=seed,
        outputscale_constraint=kernel.raw_outputscale_constraint, **_common_kwargs(kernel))
    return copy_hyperparameters(kernel, sketched, "outputscale")


# GPyTorch's KeOps kernels compute their namesakes' covariances with the same hyperparameters (KeOps only drives the
# kernel-matrix products, and without pykeops they run the plain torch formula), so they convert as those do.
for _keops_type, _plain_type in ((gpytorch.kernels.keops.RBFKernel, gpytorch.kernels.RBFKernel),
                                 (gpytorch.kernels.keops.MaternKernel, gpytorch.kernels.MaternKernel),
                                 (gpytorch.kernels.keops.PeriodicKernel, gpytorch.kernels.PeriodicKernel)):
    register_converter(_keops_type, methods=_METHODS[_plain_type], options=_OPTIONS[_plain_type])(
        _CONVERTERS[_plain_type])


refuse_conversion(
    gpytorch.kernels.GridInterpolationKernel,
    "it is itself a scalable approximation (SKI / KISS-GP) of its base_kernel, which random features replace "
    "rather than approximate a second time; sketch the base kernel instead, e.g. "
    "ScaleKernel(GridInterpolationKernel(RBFKernel(), grid_size, num_dims)) → "
    "rfgp.sketch(ScaleKernel(RBFKernel()), num_features)",
)
refuse_conversion(
    gpytorch.kernels.GridKernel,
    "it is its base_kernel evaluated with the Kronecker structure of inputs on a grid (GPyTorch's grid GP "
    "regression), an exact speed-up that the F-wide features of the base kernel replace at any inputs; sketch the "
    "base kernel instead: rfgp.sketch(kernel.base_kernel, num_features)",
)
refuse_conversion(
    gpytorch.kernels.InducingPointKernel,
    "it is SGPR's inducing-point approximation of its base_kernel (the inducing points are parameters, and "
    "the model's training objective is not an exact GP's); sketch the base kernel and use it in an ExactGP: "
    "rfgp.sketch(kernel.base_kernel, num_features), or keep the inducing points as Nyström landmarks: "
    "rfgp.kernels.NystromKernel(kernel.base_kernel, kernel.inducing_points.detach(), learn_landmarks=True)",
)
refuse_conversion(
    gpytorch.kernels.MultiDeviceKernel,
    "it splits the evaluation of its base_kernel's dense N × N covariance across GPUs (GPyTorch's multi-GPU exact "
    "GP), which the random-feature model never forms (N × F features and F × F statistics fit one device); "
    "sketch the base kernel instead and keep the model on one device: rfgp.sketch(kernel.base_kernel, num_features)",
)
refuse_conversion(
    gpytorch.kernels.GaussianSymmetrizedKLKernel,
    "its inputs are Gaussian distributions (each row: d means, then d log variances) and exp(−symmetrised KL/ℓ) is "
    "not a function of the difference of two rows, so it has no spectral measure to draw random Fourier features "
    "from, and rfgp has no other random-feature construction for it. Its landmark features work on the same rows: "
    "rfgp.sketch(kernel, M, method='nystrom', x_sample=X), X the (mean, log variance) rows (exact with every point "
    "as a landmark; a Cholesky error names landmarks at which the kernel, not positive definite in general, is not)",
)
refuse_conversion(
    gpytorch.kernels.DistributionalInputKernel,
    "it is exp(−distance_function(x, y)/ℓ) for a distance given as a Python callable, whose spectral measure (if the "
    "kernel is positive definite at all) rfgp cannot know. Its landmark features work with any distance_function: "
    "rfgp.sketch(kernel, M, method='nystrom', x_sample=X), X rows as the kernel receives them (exact with every "
    "point as a landmark)",
)
refuse_conversion(
    gpytorch.kernels.PiecewisePolynomialKernel,
    "its compactly supported (Wendland-type) covariance has a spectral density that is a sum of "
    "Bessel/hypergeometric terms with power-law tails and no closed-form sampler, and rfgp's radial "
    "density fit (used for SRF on the sphere) has no documented accuracy for it; keep it exact, "
    "replace it by a MaternKernel of similar smoothness (q = 0, 1, 2, 3 ~ nu = 0.5, 1.5, 2.5), or use its landmark "
    "features. " + NYSTROM_ALTERNATIVE,
)


# ---------------------------------------------------------------- derivative kernels
def _convert_fourier_gradient(kernel, sketched_name, num_features, method, seed, **options):
    """RBFKernelGrad/RBFKernelGradGrad/Matern52KernelGrad → the sketched kernel of :mod:`rfgp.kernels.derivative`."""
    from . import derivative

    sketched = getattr(derivative, sketched_name)(
        num_features, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


@register_converter(gpytorch.kernels.RBFKernelGrad, methods=_FOURIER, options=("input_dim",))
def _convert_rbf_grad(kernel, num_features, method, seed, **options):
    return _convert_fourier_gradient(kernel, "SketchedRBFKernelGrad", num_features, method, seed, **options)


@register_converter(gpytorch.kernels.RBFKernelGradGrad, methods=_FOURIER, options=("input_dim",))
def _convert_rbf_gradgrad(kernel, num_features, method, seed, **options):
    return _convert_fourier_gradient(kernel, "SketchedRBFKernelGradGrad", num_features, method, seed, **options)


@register_converter(gpytorch.kernels.Matern52KernelGrad, methods=_FOURIER, options=("input_dim",))
def _convert_matern52_grad(kernel, num_features, method, seed, **options):
    return _convert_fourier_gradient(kernel, "SketchedMatern52KernelGrad", num_features, method, seed, **options)


@register_converter(gpytorch.kernels.PolynomialKernelGrad, methods=("sketch",),
                    options=("projection", "weights", "srht_blocks", "input_dim"))
def _convert_polynomial_grad(kernel, num_features, method, seed, **options):
    """PolynomialKernelGrad → :class:`~rfgp.kernels.SketchedPolynomialKernelGrad`, offset carried over."""
    from .derivative import SketchedPolynomialKernelGrad

    sketched = SketchedPolynomialKernelGrad(
        kernel.power, num_features, method=method or "sketch", seed=seed,
        offset_constraint=kernel.raw_offset_constraint, **options, **_common_kwargs(kernel),
    )
    return copy_hyperparameters(kernel, sketched, "offset")


@register_converter(gpytorch.kernels.IndexKernel, methods=(), options=())
def _convert_index(kernel, num_features, method, seed):
    """IndexKernel → :class:`~rfgp.kernels.IndexFeatureKernel` (exact features [L[i], √v[i]e_i], same parameters, prior)."""
    from .index import IndexFeatureKernel

    num_tasks, rank = kernel.covar_factor.shape[-2:]
    converted = IndexFeatureKernel(num_tasks, rank, **_common_kwargs(kernel))
    converted.covar_factor.data = kernel.covar_factor.data.clone()
    converted.covar_factor.requires_grad_(kernel.covar_factor.requires_grad)
    for name, (prior, closure, setting_closure) in kernel._priors.items():
        converted.register_prior(name, prior, closure, setting_closure)
    copy_hyperparameters(kernel, converted, "var")
    return converted.to(kernel.covar_factor)
