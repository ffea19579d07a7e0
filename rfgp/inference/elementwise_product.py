"""K̂ ∘ B: the elementwise product of a feature-root covariance with a matrix of small exact rank.

GPyTorch's Hadamard multitask model (and code written like it) multiplies covariances elementwise,
``covar_module(x).mul(task_covar_module(i))``, with ``IndexKernel`` giving B[iₙ, iₘ] for a T × T task
matrix B.  Generic linear_operator turns that into a ``MulLinearOperator`` of Lanczos roots and
solves it by conjugate gradients, so the feature-space algebra of an rfgp kernel is lost.  With a
root R of B's rows (Rₙ = C[iₙ], C = chol(B), width T) the product keeps a feature root, by the
face-splitting identity (ΦΦᵀ) ∘ (RRᵀ) = (Φ • R)(Φ • R)ᵀ, (Φ • R)ₙ = Φₙ ⊗ Rₙ (row-wise Kronecker
product, width F·T): the same matrix, exactly, with the marginal likelihood and posterior of
:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator` (feature or kernel space,
whichever is cheaper) at O(N·F·T) extra cost.  A per-point variance correction cₙ of the rfgp
covariance becomes cₙ·Bᵢₙᵢₙ; of two rfgp covariances with corrections c₁, c₂ (Nyström, truncated Maclaurin) the
product's diagonal (‖Φ₁ₙ‖² + c₁ₙ)(‖Φ₂ₙ‖² + c₂ₙ) leaves c₁ₙ‖Φ₂ₙ‖² + c₂ₙ‖Φ₁ₙ‖² + c₁ₙc₂ₙ beside ‖(Φ₁ • Φ₂)ₙ‖².

A cross covariance Φ(x₁)Φ(x₂)ᵀ of an rfgp kernel (``covar_module(x1, x2).mul(...)``) has no such root: its product is
the dense one, as an exact kernel's.  Operands with such a root: an ``InterpolatedLinearOperator`` over a small base
(``IndexKernel``, symmetric: the same indices on both sides) whose base has a Cholesky factor (a singular base gets
the dense product with a :class:`SingularTaskMatrixWarning`), another rfgp
feature root (two sketched kernels: width F₁·F₂), or a
``RootLinearOperator``.  Any other operand (a cross covariance with different task indices on the
two sides, say) gets the dense product, as GPyTorch gives an exact kernel's dense matrix —
linear_operator's generic ``MulLinearOperator`` multiplies root decompositions, which is only
right for two symmetric positive semi-definite operands.  The dense product keeps the correction of the rfgp
covariance, cₙ·Kₙₙ (:class:`~rfgp.inference.combined_covariances.CorrectedDenseLinearOperator`), which GPyTorch's
prediction strategy then adds (it had been dropped: a Nyström kernel times an exact one predicted 1e-10 instead of the
prior variance far from the data).  A symmetric product whose root would
exceed :class:`rfgp.settings.memory_budget` keeps that generic product, with a warning naming the
budget.
"""

from __future__ import annotations

import math

import torch
from gpytorch.lazy import LazyEvaluatedKernelTensor
from linear_operator import to_linear_operator
from linear_operator.operators import (
    ConstantMulLinearOperator,
    InterpolatedLinearOperator,
    LinearOperator,
    RootLinearOperator,
)
from linear_operator.utils.interpolation import left_interp
from torch import Tensor

from ..core.settings import memory_budget, resolve_chunk_size
from ..core.user_warnings import warn as warn_user
from .combined_covariances import (
    CorrectedDenseLinearOperator,
    dense_product_keeping_corrections,
    lazy_product_keeping_corrections,
    product_correction,
)
from .kernel_evaluation import evaluated_covariance
from .linalg import squared_row_norms


class SingularTaskMatrixWarning(UserWarning):
    """An elementwise product's small matrix (an ``IndexKernel``'s B) has no Cholesky factor, so the product of an
    rfgp covariance with it is dense (:func:`exact_root`).  A root from B's eigendecomposition would be exact in value
    but its gradient is undefined at B's repeated zero eigenvalues, so the exact dense product is kept, and said."""


#: largest base of an interpolated operator (T × T) factorised for its root
MAX_INTERPOLATED_BASE = 1024


def exact_root(operator: LinearOperator) -> Tensor | None:
    """R with RRᵀ = ``operator`` exactly (an interpolated small base, a root operator), ``None`` if not cheap."""
    from .operators import FeatureRootLinearOperator  # imports this module

    if isinstance(operator, FeatureRootLinearOperator):  # its variance correction is not part of the matrix
        return operator.features()
    if isinstance(operator, RootLinearOperator):
        return operator.root.to_dense()
    if not isinstance(operator, InterpolatedLinearOperator):
        return None
    if operator.base_linear_op.shape[-1] > MAX_INTERPOLATED_BASE:
        return None
    left, right = operator.left_interp_indices, operator.right_interp_indices
    same = left is right or (left.shape == right.shape and torch.equal(left, right))
    values_same = operator.left_interp_values is operator.right_interp_values or torch.equal(
        operator.left_interp_values, operator.right_interp_values)
    if not (same and values_same):
        return None
    chol, info = torch.linalg.cholesky_ex(operator.base_linear_op.to_dense())
    if bool((info != 0).any()):  # a singular task matrix: the dense product, said
        warn_user(
            f"the {tuple(operator.base_linear_op.shape[-2:])} matrix of an elementwise product with an rfgp covariance "
            "(an IndexKernel's task covariance B = WWᵀ + diag(v), say) has no Cholesky factor (singular: task "
            "variances v at 0): the product is the dense N × N matrix (O(N³) solves), without rfgp's feature-space "
            "algebra; keep B positive definite, e.g. IndexKernel(..., var_constraint=gpytorch.constraints."
            "GreaterThan(1e-6))",
            SingularTaskMatrixWarning,
        )
        return None
    return left_interp(left, operator.left_interp_values, chol)


def face_splitting_product(features: LinearOperator, other: LinearOperator) -> LinearOperator:
    """(ΦΦᵀ) ∘ ``other`` for an rfgp feature root and an evaluated operator (module docstring)."""
    root = exact_root(other)
    if root is None:
        return dense_product_keeping_corrections(features, other, features.to_dense() * other.to_dense())
    base, constant = features.scaled_root()
    phi = base.to_dense()
    batch = torch.broadcast_shapes(phi.shape[:-2], root.shape[:-2])
    width = phi.shape[-1] * root.shape[-1]
    if resolve_chunk_size(phi.shape[-2], width, math.prod(batch), phi.dtype) is not None:
        warn_user(
            f"the elementwise product of an rfgp covariance (F = {phi.shape[-1]}) with a rank-{root.shape[-1]} "
            f"matrix has a feature root of width {width}, over rfgp.settings.memory_budget "
            f"({memory_budget.value()} bytes): linear_operator's generic product is used (as for exact kernels), "
            "without rfgp's feature-space algebra; raise the budget to keep it",
        )
        return lazy_product_keeping_corrections(features, other)
    product = (phi.unsqueeze(-1) * root.to(phi.dtype).unsqueeze(-2)).flatten(-2)  # (..., N, F·r)
    split_root = product if constant is None else ConstantMulLinearOperator(to_linear_operator(product), constant)
    return type(features)(split_root, _product_correction(features, other, root))


def _product_correction(features: LinearOperator, other: LinearOperator, root: Tensor) -> Tensor | None:
    """The correction of (Φ₁Φ₁ᵀ) ∘ (RRᵀ): c₁‖R‖² + c₂‖Φ₁‖² + c₁c₂, where c₂ is ``other``'s own correction (an rfgp
    feature root's; ``None`` for exact operands) — the product's diagonal (‖Φ₁‖² + c₁)(‖R‖² + c₂) less ‖Φ₁ • R‖²."""
    theirs = getattr(other, "variance_correction", None)
    own_norms = None if theirs is None else squared_row_norms(features.features())  # read only beside c₂
    return product_correction(own_norms, features.variance_correction, squared_row_norms(root), theirs)


def install() -> None:
    """Route elementwise products with rfgp covariances through :func:`face_splitting_product`; idempotent.

    * ``LazyEvaluatedKernelTensor.mul`` (``covar_module(x).mul(...)``): linear_operator's ``_mul_matrix`` evaluates
      both kernels and builds a generic ``MulLinearOperator`` without asking the evaluated operators.
    * Any other operator times an rfgp covariance (GPyTorch's ``ProductKernel`` with an exact factor first,
      ``exact * sketched``): linear_operator's generic product is the dense matrix or ``MulLinearOperator``, without
      the rfgp factor's variance correction; the product is taken as ``sketched * exact`` (K₁ ∘ K₂ = K₂ ∘ K₁).
    """
    current = LazyEvaluatedKernelTensor._mul_matrix
    if getattr(current, "generic_mul_matrix", None) is not None:
        return

    def _mul_matrix(self, other):
        if isinstance(other, LinearOperator):
            product = _rfgp_product(evaluated_covariance(self), evaluated_covariance(other))
            if product is not None:
                return product
        return current(self, other)

    generic = LinearOperator._mul_matrix

    def _operator_mul_matrix(self, other):
        from .operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator  # imports this module

        if isinstance(other, LinearOperator) and not isinstance(self, _rfgp_operators()):
            right = evaluated_covariance(other)
            if isinstance(right, (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator,
                                  CorrectedDenseLinearOperator)):
                return right._mul_matrix(self)
        return generic(self, other)

    _mul_matrix.generic_mul_matrix = current
    LazyEvaluatedKernelTensor._mul_matrix = _mul_matrix
    LinearOperator._mul_matrix = _operator_mul_matrix


def _rfgp_operators() -> tuple:
    from .operators import (  # imports this module
        ChunkedFeatureCrossLinearOperator,
        ChunkedFeatureRootLinearOperator,
        FeatureRootLinearOperator,
    )

    return (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator, ChunkedFeatureCrossLinearOperator,
            CorrectedDenseLinearOperator)


def _rfgp_product(left: LinearOperator, right: LinearOperator) -> LinearOperator | None:
    """left ∘ right where either is an rfgp covariance (``None`` where neither is): the face-splitting product of a
    feature root, else the dense product of a cross covariance or of a dense covariance with a correction."""
    from .operators import ChunkedFeatureCrossLinearOperator, FeatureRootLinearOperator  # imports this module

    if isinstance(left, FeatureRootLinearOperator):
        return face_splitting_product(left, right)
    if isinstance(right, FeatureRootLinearOperator):
        return face_splitting_product(right, left)
    for first, second in ((left, right), (right, left)):
        if isinstance(first, (ChunkedFeatureCrossLinearOperator, CorrectedDenseLinearOperator)):
            return first._mul_matrix(second)
    return None
