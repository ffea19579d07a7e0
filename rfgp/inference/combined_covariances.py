"""Variance corrections of rfgp covariances inside GPyTorch's own containers, predicted by GPyTorch's strategy.

A Nyström or truncated Maclaurin covariance K̂ carries the per-point correction c(x) = k(x, x) − k̂(x, x) beside its
value (``variance_correction`` of :class:`~rfgp.inference.operators.FeatureRootLinearOperator`), which rfgp's
prediction strategies add to the test covariance's diagonal (paper 000 §5.6; Nyström's FITC term).  Inside a
GPyTorch container with an exact part the evaluated covariance is no feature root — ``k̂ + k_exact`` (a
``SumLinearOperator``), ``k̂ · k_exact`` (the dense elementwise product), ``MultitaskKernel(k̂)`` (K̂ ⊗ B) — so
``ExactGP`` predicts with GPyTorch's ``DefaultPredictionStrategy``, which read only the values and left the
correction out: a Nyström RBF (100 landmarks) plus an exact Matérn predicted 0.40 instead of 1.10 far from the data,
its product with the Matérn and ``MultitaskKernel`` around it 1e-10 instead of 0.28 and 0.77.

:func:`combined_variance_correction` gives the correction of such a covariance from its parts, and
:class:`CorrectedDefaultPredictionStrategy` adds it to GPyTorch's predictive covariance:

* a sum: Σᵢ cᵢ;
* c·K: c times the correction;
* an elementwise product K̂₁ ∘ K₂ (dense, :class:`CorrectedDenseLinearOperator`, or linear_operator's lazy product,
  :class:`CorrectedMulLinearOperator`): (d₁ + c₁)(d₂ + c₂) − d₁d₂, dᵢ the diagonal of the values;
* a Kronecker product K₁ ⊗ K₂: diag((K₁ + C₁) ⊗ (K₂ + C₂)) − diag(K₁ ⊗ K₂) = c₁ ⊗ (d₂ + c₂) + d₁ ⊗ c₂.

The marginal likelihood is unchanged: it trains the values, as for an rfgp covariance alone.  A test block that lost
the correction although the training covariance has one (GPyTorch slicing an eagerly evaluated K̂ ⊗ B into an
interpolated operator) is refused rather than predicted without it.
"""

from __future__ import annotations

import torch
from gpytorch import settings
from gpytorch.models.exact_prediction_strategies import DefaultPredictionStrategy
from linear_operator.operators import (
    ConstantMulLinearOperator,
    DenseLinearOperator,
    DiagLinearOperator,
    KroneckerProductLinearOperator,
    LinearOperator,
    MulLinearOperator,
    SumLinearOperator,
)
from torch import Tensor

from .kernel_evaluation import evaluated_covariance
from .operators import _add_optional


def combined_variance_correction(covariance) -> Tensor | None:
    """k(x, x) − diag K̂ of an evaluated covariance built from rfgp covariances with a correction (``(..., n)``), or
    ``None`` when no part carries one (module docstring)."""
    if isinstance(covariance, ConstantMulLinearOperator):
        inner = combined_variance_correction(covariance.base_linear_op)
        return None if inner is None else inner * covariance.expanded_constant.unsqueeze(-1)
    if isinstance(covariance, SumLinearOperator):
        corrections = [c for c in map(combined_variance_correction, covariance.linear_ops) if c is not None]
        return None if not corrections else sum(corrections[1:], corrections[0])
    if isinstance(covariance, KroneckerProductLinearOperator):
        return _kronecker_correction(covariance.linear_ops)
    return getattr(covariance, "variance_correction", None)


def product_correction(left_diagonal: Tensor, left: Tensor | None, right_diagonal: Tensor,
                       right: Tensor | None) -> Tensor | None:
    """The correction of an elementwise product of two covariances with diagonals dᵢ and corrections cᵢ (``None``:
    none): (d₁ + c₁)(d₂ + c₂) − d₁d₂ = c₁(d₂ + c₂) + d₁c₂."""
    if left is None and right is None:
        return None
    if right is None:
        return left * right_diagonal
    return right * left_diagonal if left is None else left * (right_diagonal + right) + left_diagonal * right


def dense_product_keeping_corrections(left: LinearOperator, right: LinearOperator,
                                      product: Tensor) -> CorrectedDenseLinearOperator:
    """The dense elementwise product ``product`` = left ∘ right, with the correction of both operands'
    (:func:`product_correction`)."""
    correction = product_correction(left.diagonal(), combined_variance_correction(left), right.diagonal(),
                                    combined_variance_correction(right))
    return CorrectedDenseLinearOperator(product, correction)


def lazy_product_keeping_corrections(left: LinearOperator, right: LinearOperator) -> LinearOperator:
    """linear_operator's ``MulLinearOperator`` of ``left`` ∘ ``right``, with the correction of both operands where one
    carries one (:class:`CorrectedMulLinearOperator`)."""
    correction = product_correction(left.diagonal(), combined_variance_correction(left), right.diagonal(),
                                    combined_variance_correction(right))
    return MulLinearOperator(left, right) if correction is None else CorrectedMulLinearOperator(left, right, correction)


def _kronecker_correction(factors) -> Tensor | None:
    corrections = [combined_variance_correction(factor) for factor in factors]
    if all(correction is None for correction in corrections):
        return None
    diagonal, correction = factors[0].diagonal(), corrections[0]
    for factor, factor_correction in zip(factors[1:], corrections[1:]):
        factor_diagonal = factor.diagonal()
        correction = product_correction(_outer(diagonal), _outer(correction),
                                        _inner(factor_diagonal), _inner(factor_correction))
        correction = None if correction is None else correction.flatten(-2)
        diagonal = (_outer(diagonal) * _inner(factor_diagonal)).flatten(-2)
    return correction


def _outer(values: Tensor | None) -> Tensor | None:
    """The first factor's entries along rows of the Kronecker index (i·m + j)."""
    return None if values is None else values.unsqueeze(-1)


def _inner(values: Tensor | None) -> Tensor | None:
    return None if values is None else values.unsqueeze(-2)


def _same_index(row_index, col_index) -> bool:
    if row_index is col_index:
        return True
    if isinstance(row_index, slice) and isinstance(col_index, slice):
        return row_index == col_index
    return (torch.is_tensor(row_index) and torch.is_tensor(col_index) and row_index.shape == col_index.shape
            and torch.equal(row_index, col_index))


class CorrectedDenseLinearOperator(DenseLinearOperator):
    """A dense covariance K̂ (the elementwise product of an rfgp covariance with an operand without a small exact
    root) with the per-point correction c(x) = k(x, x) − k̂(x, x) of its diagonal, kept by principal blocks, batch
    expansion, constant scaling and sums (:func:`combined_variance_correction`); the matrix is K̂ alone."""

    def __init__(self, tsr: Tensor, variance_correction: Tensor | None = None) -> None:
        LinearOperator.__init__(self, tsr, variance_correction=variance_correction)
        self.tensor = tsr
        self.variance_correction = variance_correction

    def _check_args(self, tsr, variance_correction=None):
        return super()._check_args(tsr)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        block = super()._getitem(row_index, col_index, *batch_indices)
        if self.variance_correction is None or not _same_index(row_index, col_index):
            return DenseLinearOperator(block.tensor) if isinstance(block, DenseLinearOperator) else block
        correction = self.variance_correction.expand(*self.batch_shape, self.shape[-1])
        return self.__class__(block.tensor, correction[(*batch_indices, row_index)])

    def _expand_batch(self, batch_shape) -> "CorrectedDenseLinearOperator":
        correction = self.variance_correction
        return self.__class__(self.tensor.expand(*batch_shape, *self.matrix_shape),
                              None if correction is None else correction.expand(*batch_shape, correction.shape[-1]))

    def _mul_matrix(self, other):
        """The dense elementwise product, keeping both operands' corrections (:func:`product_correction`)."""
        other = evaluated_covariance(other)
        return dense_product_keeping_corrections(self, other, self.tensor * other.to_dense())

    def __add__(self, other):
        if isinstance(other, DenseLinearOperator):
            return self.__class__(self.tensor + other.tensor,
                                  _add_optional(self.variance_correction, getattr(other, "variance_correction", None)))
        return super().__add__(other)

    def __radd__(self, other):  # a plain dense operator on the left: Python asks the subclass first
        return self.__add__(other)


class CorrectedMulLinearOperator(MulLinearOperator):
    """linear_operator's lazy elementwise product of two root decompositions (a chunked rfgp root times an operand
    that is not dense, such as an ``IndexKernel``'s) with the per-point correction of its diagonal; the matrix is the
    product of the values alone; principal blocks keep the correction of their rows."""

    def __init__(self, left_linear_op, right_linear_op, variance_correction: Tensor | None = None) -> None:
        super().__init__(left_linear_op, right_linear_op)
        # rebuilt from its representation (evaluate_kernel, detach, device moves): the correction goes along
        LinearOperator.__init__(self, self.left_linear_op, self.right_linear_op,
                                variance_correction=variance_correction)
        self.variance_correction = variance_correction

    def _check_args(self, left_linear_op, right_linear_op, variance_correction=None):
        return super()._check_args(left_linear_op, right_linear_op)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        """A principal block keeps the correction of its rows (GPyTorch's test block [n:, n:])."""
        block = super()._getitem(row_index, col_index, *batch_indices)
        if not (isinstance(block, MulLinearOperator) and self.variance_correction is not None
                and _same_index(row_index, col_index)):
            return block
        correction = self.variance_correction.expand(*self.batch_shape, self.shape[-1])
        return CorrectedMulLinearOperator(block.left_linear_op, block.right_linear_op,
                                          correction[(*batch_indices, row_index)])


class CorrectedDefaultPredictionStrategy(DefaultPredictionStrategy):
    """GPyTorch's ``DefaultPredictionStrategy`` whose predictive covariance adds the variance correction of the rfgp
    covariances combined in the test covariance (module docstring); chosen by
    :mod:`rfgp.inference.eager_covariances` for a training covariance that carries one."""

    def exact_prediction(self, test_mean, test_test_covar, test_train_covar):
        """GPyTorch's predictive mean and covariance, plus diag(c) of the test points' variance correction c (none
        under ``skip_posterior_variances``); refused where the test covariance lost the correction."""
        correction = combined_variance_correction(evaluated_covariance(test_test_covar))
        if correction is None:
            raise NotImplementedError(
                f"the training covariance carries the variance correction k(x, x) − k̂(x, x) of an rfgp kernel "
                f"(Nyström, truncated Maclaurin) but the test covariance ({type(test_test_covar).__name__}) lost it, "
                "so GPyTorch's prediction would leave it out; convert the whole kernel tree with rfgp.sketch"
            )
        mean, covar = super().exact_prediction(test_mean, test_test_covar, test_train_covar)
        if settings.skip_posterior_variances.on():
            return mean, covar
        return mean, covar + DiagLinearOperator(correction.expand(covar.shape[:-1]))
