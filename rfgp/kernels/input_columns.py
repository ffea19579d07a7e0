"""Which input columns every node of a kernel tree sees, and the contradictions that follow from it.

GPyTorch selects a kernel's ``active_dims`` in ``Kernel.__call__``, before ``forward``
(``gpytorch/kernels/kernel.py``); which selections apply depends on who calls whom:

* the root (called by the model) and the parts of ``AdditiveKernel``/``ProductKernel`` are
  *called*: a node with ``active_dims`` a, handed the columns c by its parent, sees c[a], so
  nested ``active_dims`` compose;
* the base kernel of ``AdditiveStructureKernel``/``ProductStructureKernel`` is *called* too (with
  ``last_dim_is_batch=True``: it selects its own ``active_dims`` and is then evaluated on each of
  the columns it sees);
* ``ScaleKernel`` and ``MultitaskKernel`` (rfgp's ``DecomposableKernel`` too) run their child's
  ``forward`` directly: the child sees exactly its parent's columns and its own ``active_dims``
  are not applied.  ``ScaleKernel`` copies its base's ``active_dims`` to itself at construction,
  so ``ScaleKernel(RBFKernel(active_dims=a))`` still sees c[a]; a ``MultitaskKernel``'s data
  kernel with ``active_dims`` of its own sees all the columns of the ``MultitaskKernel``.
  :func:`check_tree` warns about such ignored ``active_dims``, and ``rfgp.sketch`` converts the
  tree as GPyTorch evaluates it.
* rfgp's feature-space combinations (``FeatureSumKernel``, the products, ``MultiOutputFeatureSumKernel``,
  ``SketchedLCMKernel``) and ``SketchedDecomposableKernel`` evaluate their parts (its data kernel) through
  :func:`~rfgp.kernels.combinations.kernel_features`, which selects each part's ``active_dims``: *called*
  (:func:`evaluated_children`).

Columns are indices into the root's input columns (those of ``x_sample``), ``None`` for all of
them.  Their number d is ``x_sample``'s width if given, else the ``ard_num_dims`` of the leaves
that see all columns.  :func:`check_tree` raises, at conversion, what GPyTorch (or the converted
kernel) would only raise at the first call: ``active_dims`` outside the columns a node is given,
a leaf's ``ard_num_dims`` or an rfgp leaf's declared ``input_dim`` (:func:`declared_input_dim`) different
from the number of columns it sees, and leaves on all the columns with different ``ard_num_dims``.
:func:`check_input_width` makes the same checks against a model's ``train_x`` at construction.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import (
    AdditiveKernel,
    AdditiveStructureKernel,
    Kernel,
    LCMKernel,
    MultitaskKernel,
    ProductKernel,
    ProductStructureKernel,
    ScaleKernel,
)
from torch import Tensor

from ..core.user_warnings import warn as warn_user
from .combinations import _CombinedFeatureKernel
from .operator_valued import DecomposableKernel, _GaussianDerivativeKernel
from .random_feature_kernel import FeatureKernel
from .sketched_operator_valued import SketchedDecomposableKernel

#: multitask kernels whose data kernel ``rfgp.sketch`` converts (exact types: subclasses may compute otherwise)
MULTITASK_TYPES = (MultitaskKernel, DecomposableKernel)

#: GPyTorch's per-column wrappers, Σᵢ or Πᵢ base(xᵢ, yᵢ) (exact types, converted by :mod:`rfgp.kernels.structure`)
STRUCTURE_TYPES = (AdditiveStructureKernel, ProductStructureKernel)

Columns = tuple[int, ...] | None


def children(kernel: Kernel) -> list[tuple[Kernel, bool]]:
    """The sub-kernels of a ``ScaleKernel``/sum/product/structure/multitask/LCM node as ``(child, called)``.

    ``called``: the parent calls the child (its ``active_dims`` apply) rather than its ``forward``.
    """
    if isinstance(kernel, ScaleKernel):
        return [(kernel.base_kernel, False)]
    if isinstance(kernel, (AdditiveKernel, ProductKernel)):
        return [(part, True) for part in kernel.kernels]
    if type(kernel) in MULTITASK_TYPES:
        return [(kernel.data_covar_module, False)]
    if type(kernel) in STRUCTURE_TYPES:
        return [(kernel.base_kernel, True)]
    if type(kernel) is LCMKernel:  # its forward calls each MultitaskKernel's forward
        return [(part, False) for part in kernel.covar_module_list]
    return []


def evaluated_children(kernel: Kernel) -> list[tuple[Kernel, bool]]:
    """:func:`children`, and the parts of rfgp's feature-space kernels as ``(child, True)``: a combination's ``kernels``
    (sum, product, LCM) and a ``SketchedDecomposableKernel``'s ``data_covar_module`` are evaluated through
    :func:`~rfgp.kernels.combinations.kernel_features`, which selects their ``active_dims`` as a call does."""
    if isinstance(kernel, _CombinedFeatureKernel):
        return [(part, True) for part in kernel.kernels]
    if isinstance(kernel, SketchedDecomposableKernel):
        return [(kernel.data_covar_module, True)]
    return children(kernel)


def declared_input_dim(kernel: Kernel) -> int | None:
    """The number of input columns an rfgp kernel was built for, ``None`` where it declares none.

    A feature kernel's ``input_dim`` (its draws' dimension, which :meth:`~rfgp.kernels.FeatureKernel.check_inputs`
    holds every call to; ``None`` for a map that draws at its first call) and a curl-/divergence-free kernel's d.
    GPyTorch's kernels declare theirs through ``ard_num_dims`` only.
    """
    if isinstance(kernel, (FeatureKernel, _GaussianDerivativeKernel)):
        return getattr(kernel, "input_dim", None)
    return None


def check_x_sample(x_sample) -> Tensor:
    """``x_sample`` as detached rows ``(N, d)``: a finite floating tensor ``(n, d)``, batched ``(..., n, d)`` flattened."""
    if not torch.is_tensor(x_sample) or not x_sample.is_floating_point() or x_sample.dim() < 2:
        given = (f"a {x_sample.dtype} tensor of shape {tuple(x_sample.shape)}" if torch.is_tensor(x_sample)
                 else f"a {type(x_sample).__name__}")
        hint = ""
        if torch.is_tensor(x_sample) and not x_sample.is_floating_point() and not x_sample.is_complex():
            # integer-coded columns (counts, categories, pixels) train as the model's floating dtype
            hint = ": pass the training inputs in the model's floating dtype, e.g. x_sample.to(torch.float64)"
        elif not torch.is_tensor(x_sample) and hasattr(x_sample, "shape"):  # NumPy array, pandas DataFrame
            hint = ": pass a tensor, e.g. torch.as_tensor(numpy.asarray(x_sample), dtype=torch.float64)"
        raise ValueError(
            f"x_sample must be a floating tensor of input points, shape (n, d) or batched (..., n, d); got {given}"
            f"{hint}"
        )
    if x_sample.shape[-1] == 0 or x_sample.numel() == 0:
        raise ValueError(f"x_sample must hold at least one point with at least one column; got shape "
                         f"{tuple(x_sample.shape)}")
    rows = x_sample.detach().reshape(-1, x_sample.shape[-1])
    bad = ~torch.isfinite(rows)
    if bool(bad.any()):
        row, column = (int(i) for i in bad.nonzero()[0])
        raise ValueError(
            f"x_sample contains NaN or Inf entries ({int(bad.sum())} of them, the first at row {row}, column "
            f"{column} of its (N, d) rows): pass finite input points"
        )
    return rows


class TreeColumns:
    """The columns every node of one kernel tree sees, checked against ``x_sample`` (see the module doc).

    Args:
        kernel: the root of the tree.
        x_sample: optional points of the root's input space (validated by :func:`check_x_sample`).
        inputs: instead, ``(d, description)`` of the inputs the root is called with, e.g. a model's
            ``(train_x.shape[-1], "train_x, shape (n, d)")``: checked against without reading their values.
    """

    def __init__(self, kernel: Kernel, x_sample=None, inputs: tuple[int, str] | None = None) -> None:
        self.rows = None if x_sample is None else check_x_sample(x_sample)
        self._inputs = inputs
        self.root = _compose(None, kernel)  # the model calls the root
        nodes = []  # (node, parent, whether it is called, the columns it is given, the columns it sees)
        self._walk(kernel, None, True, None, nodes)
        self.num_columns, self._source = self._root_width(nodes)
        for node, parent, called, given, _ in nodes:
            if called and node.active_dims is not None:
                self._check_active_dims(node, parent, given)
        for node, _, _, _, seen in nodes:
            if not evaluated_children(node):
                self._check_ard(node, seen)
                self._check_input_dim(node, seen)

    def child_columns(self, parent: Kernel, parent_columns: Columns, child: Kernel) -> Columns:
        """The columns ``child`` sees, ``parent`` seeing ``parent_columns``."""
        called = next(c for k, c in evaluated_children(parent) if k is child)
        return _compose(parent_columns, child) if called else parent_columns

    def width(self, columns: Columns) -> int | None:
        """The number of columns; ``None`` when all are meant and their number is unknown."""
        return self.num_columns if columns is None else len(columns)

    def sample(self, columns: Columns) -> Tensor | None:
        """The rows of ``x_sample`` restricted to ``columns`` (``None`` without ``x_sample``)."""
        if self.rows is None or columns is None:
            return self.rows
        return self.rows.index_select(-1, torch.tensor(columns, device=self.rows.device))

    def describe(self, columns: Columns) -> str:
        """Where ``columns`` come from, for error messages."""
        if columns is not None:
            return f"columns {list(columns)} of {self._source}"
        return f"all columns of {self._source}"

    # ------------------------------------------------------------------------------- walk and checks
    def _walk(self, node: Kernel, parent: Kernel | None, called: bool, given: Columns, nodes: list) -> None:
        seen = _compose(given, node) if called else given
        nodes.append((node, parent, called, given, seen))
        for child, child_called in evaluated_children(node):
            if not child_called:
                _warn_ignored_active_dims(node, child)
            self._walk(child, node, child_called, seen, nodes)

    def _root_width(self, nodes: list) -> tuple[int | None, str]:
        """d and what it was taken from: x_sample, else the ``ard_num_dims`` of the leaves that see all columns."""
        if self.rows is not None:
            return self.rows.shape[-1], f"x_sample ({self.rows.shape[0]} rows × {self.rows.shape[-1]} columns)"
        if self._inputs is not None:
            return self._inputs
        on_all = [node for node, *_, seen in nodes
                  if seen is None and not evaluated_children(node) and node.ard_num_dims is not None]
        widths = sorted({node.ard_num_dims for node in on_all})
        if len(widths) > 1:
            leaves = ", ".join(f"{type(node).__name__}(ard_num_dims={node.ard_num_dims})" for node in on_all)
            raise ValueError(
                f"leaves that see the same input columns (all of them) have different ard_num_dims: {leaves}; "
                "they cannot all match the input, so the first call would fail. Give them the same ard_num_dims, "
                "or select their columns with active_dims"
            )
        if widths:
            return widths[0], f"the input (d = {widths[0]}, the ard_num_dims of {type(on_all[0]).__name__})"
        return None, "the input"

    def _check_active_dims(self, node: Kernel, parent: Kernel | None, given: Columns) -> None:
        dims = node.active_dims.tolist()
        available = self.width(given)
        if not any(i < 0 or (available is not None and i >= available) for i in dims):
            return
        inside = "" if parent is None else f" inside {type(parent).__name__}"
        accepted = f"0..{available - 1}" if available else "non-negative column indices"
        raise ValueError(
            f"{type(node).__name__}{inside} has active_dims={dims}, but it is given "
            f"{'all' if available is None else available} columns ({self.describe(given)}); "
            f"active_dims must be in {accepted}"
        )

    def _check_ard(self, leaf: Kernel, seen: Columns) -> None:
        width = self.width(seen)
        if leaf.ard_num_dims is not None and width is not None and leaf.ard_num_dims != width:
            dims = "" if leaf.active_dims is None else f", active_dims={leaf.active_dims.tolist()}"
            hint = "" if self.rows is None else " (or x_sample is not points of the input space the tree is used on)"
            raise ValueError(
                f"{type(leaf).__name__}(ard_num_dims={leaf.ard_num_dims}{dims}) sees {width} columns "
                f"({self.describe(seen)}); its ard_num_dims must be {width}{hint}"
            )

    def _check_input_dim(self, leaf: Kernel, seen: Columns) -> None:
        """An rfgp leaf built for ``input_dim`` columns (:func:`declared_input_dim`) sees that many."""
        width, declared = self.width(seen), declared_input_dim(leaf)
        if declared is not None and width is not None and declared != width:
            dims = "" if leaf.active_dims is None else f", active_dims={leaf.active_dims.tolist()}"
            raise ValueError(
                f"{type(leaf).__name__}(input_dim={declared}{dims}) sees {width} columns ({self.describe(seen)}) but "
                f"was built for input_dim={declared}: give it inputs of {declared} columns, or build it for "
                f"input_dim={width}"
            )


def check_tree(kernel: Kernel, x_sample=None) -> TreeColumns:
    """The columns of every node of ``kernel``'s tree; raises ValueError for the contradictions of the module doc.

    Args:
        kernel: a GPyTorch kernel tree (any kernels: the checks read ``active_dims``, ``ard_num_dims`` and the
            structure of ``ScaleKernel``/``AdditiveKernel``/``ProductKernel``/``MultitaskKernel`` only).
        x_sample: optional points of the input space, ``(n, d)`` or ``(..., n, d)``.

    Returns:
        The :class:`TreeColumns` of the tree.

    Raises:
        ValueError: a bad ``x_sample``; ``active_dims`` outside the columns a node is given; a leaf whose
            ``ard_num_dims`` is not the number of columns it sees; leaves on all columns with different
            ``ard_num_dims``.

    Example:
        >>> import torch
        >>> from rfgp.kernels.input_columns import check_tree
        >>> from gpytorch.kernels import LinearKernel, RBFKernel, ScaleKernel
        >>> tree = ScaleKernel(RBFKernel(active_dims=[0, 2])) + LinearKernel(active_dims=[1])
        >>> columns = check_tree(tree, x_sample=torch.rand(10, 3))
        >>> rbf = columns.child_columns(tree, columns.root, tree.kernels[0])
        >>> rbf, columns.width(rbf), tuple(columns.sample(rbf).shape)
        ((0, 2), 2, (10, 2))
    """
    return TreeColumns(kernel, x_sample)


def check_input_width(kernel: Kernel, x: Tensor, name: str) -> None:
    """Refuse, before any evaluation, a kernel tree that cannot take ``x``'s columns: ``active_dims`` outside them, a
    leaf whose ``ard_num_dims`` or declared ``input_dim`` (:func:`declared_input_dim`) is not the number of columns
    it sees (a ``ValueError`` naming the kernel, ``name`` and x's shape).

    Reads the tree's declared attributes only, never ``x``'s values: no map is drawn or fitted (Nyström landmarks,
    a Gaussian sketch, draws at the first call) on a probe, and a kernel that declares nothing is left to its first
    call.  For a model whose ``forward`` hands ``x`` to the kernel unchanged.
    """
    TreeColumns(kernel, inputs=(x.shape[-1], f"{name}, shape {tuple(x.shape)}"))


def _compose(given: Columns, kernel: Kernel) -> Columns:
    """The columns a called ``kernel`` sees, ``given[active_dims]`` (an index outside ``given`` maps to -1, for
    which :class:`TreeColumns` raises before anything reads it)."""
    if kernel.active_dims is None:
        return given
    dims = kernel.active_dims.tolist()
    if given is None:
        return tuple(dims)
    return tuple(given[i] if 0 <= i < len(given) else -1 for i in dims)


def _warn_ignored_active_dims(parent: Kernel, child: Kernel) -> None:
    """A child run through ``forward`` whose own ``active_dims`` differ from the parent's: GPyTorch ignores them."""
    own = None if child.active_dims is None else child.active_dims.tolist()
    parents = None if parent.active_dims is None else parent.active_dims.tolist()
    if own is not None and own != parents:
        warn_user(
            f"{type(child).__name__}.active_dims={own} have no effect inside {type(parent).__name__} "
            f"(active_dims={parents}): GPyTorch applies active_dims in Kernel.__call__ and {type(parent).__name__} "
            "runs its child's forward directly, so the child sees its parent's columns; the converted kernel does "
            f"the same. To select columns, set active_dims on the {type(parent).__name__}",
            UserWarning,
        )
