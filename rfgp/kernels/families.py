"""One kernel class per approximation family, with ``method=`` as the short way to pick one.

A kernel such as the RBF has several approximation families (random Fourier features, optimized
Maclaurin features, truncated-Taylor GaussianSketch), each with options of its own.  Each family
is its own class with explicit keyword arguments; the family classes of one kernel subclass its
*root* class (e.g. :class:`~rfgp.kernels.SketchedRBFKernel`), which mixes in
:class:`MethodDispatch`:

* ``Root(..., method=m)`` returns an instance of the family class registered for m
  (``Root.__new__`` picks the class; Python then runs that class's ``__init__`` with the same
  arguments), so ``isinstance(kernel, Root)`` holds for every family and the short spelling
  builds exactly the object the family's own constructor builds;
* a family class declares the methods it implements in ``family_methods``;
* an option that only another family takes raises a ``ValueError`` naming the option and the
  class that accepts it (:func:`refuse_other_family_options`);
* a family split out of a root that used to build it itself declares the root's name in
  ``legacy_type_names`` (:class:`~rfgp.config_state.ConfigState`), so checkpoints saved before
  the split (which name the root) load into the family class; the saved ``method`` is still checked.
"""

from __future__ import annotations

import inspect
from typing import Any, ClassVar

from gpytorch.kernels import Kernel

#: the keyword arguments of ``gpytorch.kernels.Kernel.__init__`` (it silently drops any other)
GPYTORCH_KERNEL_ARGS = tuple(
    name for name, parameter in inspect.signature(Kernel.__init__).parameters.items()
    if name != "self" and parameter.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
)


class MethodDispatch:
    """Mixin of a root kernel class whose ``method`` argument selects a family subclass.

    The root (the first subclass; its ``__init__`` takes ``method``) sets ``family_methods`` (its
    own methods); each family subclass sets its own ``family_methods`` and is registered under them.
    Subclasses that do not set ``family_methods`` (derivative kernels, say) are constructed as themselves.
    """

    family_methods: ClassVar[tuple[str, ...]] = ()
    _families: ClassVar[dict[str, type]]

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        if not any("_families" in base.__dict__ for base in cls.__mro__[1:]):
            cls._families = {}  # the first subclass of MethodDispatch is the root
        if "family_methods" in cls.__dict__:
            cls._families.update(dict.fromkeys(cls.family_methods, cls))

    def __new__(cls, *args, **kwargs):
        method = cls._method_argument(args, kwargs) if cls._is_root() else None
        # a method that is no family's name (not even a string) builds the root, whose __init__ refuses it by name
        family = cls._families.get(method, cls) if isinstance(method, str) else cls
        return super().__new__(family)

    @classmethod
    def all_methods(cls) -> tuple[str, ...]:
        """Every ``method`` of the root's families: the root's own first, then the others sorted."""
        root = cls._root()
        return (*root.family_methods, *sorted(set(root._families) - set(root.family_methods)))

    @classmethod
    def method_choices(cls) -> tuple[str, ...]:
        """The ``method`` values this class's ``__init__`` accepts: every family's for the root (``__new__`` picks
        the family class), its own family's for any other class (a subclass of the root, say, builds itself)."""
        return cls.all_methods() if cls._is_root() else cls.family_methods

    @classmethod
    def _is_root(cls) -> bool:
        return "_families" in cls.__dict__

    @classmethod
    def _root(cls) -> type:
        return next(base for base in cls.__mro__ if "_families" in base.__dict__)

    @classmethod
    def _method_argument(cls, args: tuple, kwargs: dict) -> Any:
        """The ``method`` the root's ``__init__`` would receive (its default when not given)."""
        signature = inspect.signature(cls.__init__)
        try:
            bound = signature.bind(None, *args, **kwargs)
        except TypeError:
            return None  # the arguments do not fit: __init__ raises the error itself
        return bound.arguments.get("method", signature.parameters["method"].default)

    @classmethod
    def family_options(cls) -> tuple[str, ...]:
        """The named arguments of this family's constructor that not every family of its root has."""
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)

        def names(family: type) -> list[str]:
            return [p.name for p in inspect.signature(family.__init__).parameters.values() if p.kind in named]

        common = set.intersection(*(set(names(family)) for family in cls._root()._families.values()))
        return tuple(name for name in names(cls) if name not in common)


def refuse_other_family_options(kernel: MethodDispatch, method: str, kwargs: dict) -> dict:
    """``kwargs`` without the options of other families of ``kernel``'s root; raises for a given one.

    An option of another family given as ``None`` or ``False`` (what "not used" means for every
    family option) is dropped: the kernel is the same with or without it.

    Raises:
        ValueError: naming the option, the family class (and its methods) that takes it, and ``method``.
    """
    families = {family: family.family_options() for family in dict.fromkeys(type(kernel)._root()._families.values())}
    kept = dict(kwargs)
    for name, value in kwargs.items():
        owners = [family for family, options in families.items() if name in options and family is not type(kernel)]
        if not owners:
            continue
        if value is None or value is False:
            del kept[name]
            continue
        takers = ", ".join(f"{f.__name__} (method={'/'.join(map(repr, f.family_methods))})" for f in owners)
        raise ValueError(
            f"{name}={value!r} is an option of {takers}, not of {type(kernel).__name__} (method={method!r})"
        )
    return kept


def check_kernel_kwargs(kernel_name: str, kwargs: dict) -> None:
    """Refuse keyword arguments GPyTorch's ``Kernel.__init__`` would silently drop.

    Raises:
        TypeError: naming the unexpected arguments and the accepted ones.
    """
    unexpected = [name for name in kwargs if name not in GPYTORCH_KERNEL_ARGS]
    if unexpected:
        raise TypeError(
            f"{kernel_name} got unexpected keyword argument(s) {', '.join(map(repr, unexpected))}; besides its own "
            f"arguments it accepts the GPyTorch Kernel arguments {', '.join(GPYTORCH_KERNEL_ARGS)}"
        )
