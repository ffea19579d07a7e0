"""GPyTorch's batch-independent multi-output GP with an rfgp kernel: T feature roots, T systems under diagonal noise.

GPyTorch's "Batch Independent Multioutput GP" gives each of T outputs its own hyperparameters through a kernel with
``batch_shape=torch.Size([T])`` and joins them with ``MultitaskMultivariateNormal.from_batch_mvn``, whose covariance
is a ``BlockInterleavedLinearOperator`` of the batch of T covariances.  That operator hides the kernel from GPyTorch's
``prediction_strategy`` (it then takes ``DefaultPredictionStrategy``) and from rfgp's feature-space algebra, so with a
sketched kernel the marginal likelihood and the posterior ran through linear_operator's generic path: CG and
stochastic Lanczos beyond ``max_cholesky_size`` (N = 1000, T = 2, F = 128: a loss off by 3e-3 and means by 4e-3),
dense Cholesky of the N·T × N·T matrix otherwise (N = 3000: 44 s for one loss and gradient instead of 2.6 s).

The T independent outputs of feature roots Φ_t (N × F each) are one feature root R of width T·F in GPyTorch's
interleaved layout, R[n·T + t, s·F + f] = δ_ts Φ_t(x_n)_f, RRᵀ = the block-interleaved matrix exactly.
:class:`IndependentOutputsKernel` returns the T roots as
:class:`~rfgp.inference.independent_tasks.IndependentTasksLinearOperator` (over the memory budget
``ChunkedIndependentTasksOperator``), which is R where R is needed, so
``MultitaskGaussianLikelihood`` (any rank), the marginal likelihood, ``observation_nan_policy("mask")`` and
prediction run in feature space.  With diagonal task noise (rank 0, the tutorial's) the outputs are T single-output
systems (:mod:`rfgp.inference.independent_tasks`): O(N·T·F² + T·F³), the flops of T separate GPs (T = 4, F = 1024,
float64, one CPU thread, one loss and gradient: N = 2000 1.7 s, T separate GPs 1.6 s, through R 17.8 s; N = 20 000
14.5 s, 11.8 s and 184 s; ``benchmarks/independent_outputs.py``).  Correlated task noise (rank ≥ 1) couples them and
takes R through :mod:`rfgp.inference.multioutput`: O(N·T·(T·F)² + (T·F)³), T² times the flops of T separate GPs
(the root's zero blocks are multiplied and factorised too).
:func:`install` makes ``from_batch_mvn`` return it for a lazily evaluated covariance of a kernel tree that holds an
rfgp kernel (unbatched inputs), and for an eagerly evaluated batch of feature roots
(``gpytorch.settings.lazily_evaluate_kernels(False)``: the same operators, from the roots themselves), which batched
inputs (each output's own, say) get too, evaluated in ``from_batch_mvn``; any other batch MVN keeps GPyTorch's
operator.
"""

from __future__ import annotations

import functools
import math

import gpytorch
import torch
from gpytorch.distributions import MultitaskMultivariateNormal
from gpytorch.kernels import Kernel
from gpytorch.lazy import LazyEvaluatedKernelTensor
from linear_operator import to_linear_operator
from linear_operator.operators import BlockInterleavedLinearOperator
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.settings import chunking_cause, memory_budget
from ..inference.chunking import Featurizer
from ..inference.complex_posterior import ComplexFeatureRootLinearOperator
from ..inference.independent_tasks import ChunkedIndependentTasksOperator, IndependentTasksLinearOperator
from ..inference.kernel_evaluation import evaluated_covariance
from ..inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from ..inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator, points_per_block
from ..inference.operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator
from .combinations import holds_feature_kernel


class IndependentOutputsKernel(Kernel):
    """T independent outputs of a batched kernel as one multi-output kernel (interleaved, module docstring).

    Args:
        batch_kernel: a kernel with T in its ``batch_shape`` (its hyperparameters stay its own, not copied).
        task_dim: which batch dimension of ``batch_kernel`` holds the outputs (non-negative).
    """

    def __init__(self, batch_kernel: Kernel, task_dim: int) -> None:
        batch_shape = list(batch_kernel.batch_shape)
        self.num_tasks = batch_shape.pop(task_dim)
        super().__init__(batch_shape=torch.Size(batch_shape))
        self.batch_kernel = batch_kernel
        self.task_dim = task_dim

    @property
    def batch_shape(self) -> torch.Size:
        """The batch kernel's batch shape without the task dimension (GPyTorch's default broadcasts the sub-kernels'
        batch shapes, which would put it back)."""
        return self._batch_shape

    @batch_shape.setter
    def batch_shape(self, value: torch.Size) -> None:
        self._batch_shape = torch.Size(value)

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        return self.num_tasks

    @in_full_precision
    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, **params):
        source = self.task_dim - len(self.batch_kernel.batch_shape)  # the task dimension, counted from the batch's end
        same = x2 is x1
        x1 = _with_task_dim(x1, source)
        x2 = x1 if same else _with_task_dim(x2, source)
        if diag:
            covar = self.batch_kernel(x1, x2, diag=True, **params)
            return covar.movedim(source - 1, -1).flatten(-2)  # (..., T, n) → (..., n·T), interleaved
        # the interleaved root is T times the batch of T roots: it is chunked when the batch is over 1/T of the budget
        budget = memory_budget.value()
        covar = self._task_covariance(x1, x2, max(1, budget // self.num_tasks), source, **params)
        if isinstance(covar, ChunkedFeatureRootLinearOperator):
            # the T roots alone (diagonal noise) may still fit the whole budget
            return _chunked_block_root(covar, self._task_covariance(x1, x2, budget, source, **params),
                                       type(self.batch_kernel).__name__)
        if not isinstance(covar, FeatureRootLinearOperator):  # a cross covariance, or a tree without one feature root
            return BlockInterleavedLinearOperator(covar)
        return IndependentTasksLinearOperator(covar)

    def _task_covariance(self, x1: Tensor, x2: Tensor, budget: int, source: int, **params):
        """The batch kernel's covariance under a memory budget, the outputs in its last batch dimension."""
        with memory_budget(budget):
            covar = self.batch_kernel(x1, x2, **params)
            covar = evaluated_covariance(covar) if hasattr(covar, "evaluate_kernel") else to_linear_operator(covar)
        return _outputs_last(covar, source)

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        if isinstance(evaluated_covariance(train_prior_dist.lazy_covariance_matrix),
                      (FeatureRootLinearOperator, ChunkedMultiOutputFeatureOperator)):
            return MultitaskFeatureSpacePredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)
        return gpytorch.models.exact_prediction_strategies.DefaultPredictionStrategy(
            train_inputs, train_prior_dist, train_labels, likelihood)


def _with_task_dim(x: Tensor, source: int) -> Tensor:
    """Inputs ``(..., n, d)`` in this kernel's batch (GPyTorch expands them to it, e.g. when it slices the joint
    train/test covariance) with a dimension of 1 where the batch kernel has the outputs (``source``, counted from the
    batch's end), so that they broadcast against the batch kernel's hyperparameters; inputs with fewer batch
    dimensions broadcast as they are."""
    return x.unsqueeze(source - 2) if x.dim() - 2 >= -source else x


def _outputs_last(covar, source: int):
    """A batch kernel's evaluated covariance with its outputs' batch dimension ``source`` (counted from the batch's
    end) moved last, as :class:`~rfgp.inference.independent_tasks.IndependentTasksLinearOperator` takes them."""
    if source == -1:
        return covar
    correction = getattr(covar, "variance_correction", None)
    if correction is not None:
        correction = correction.movedim(source - 1, -2)  # (..., n): the outputs' batch dimension last
    if isinstance(covar, ChunkedFeatureRootLinearOperator):  # permuted in its features
        base = covar.featurizer
        batch = list(base.batch_shape)
        batch.append(batch.pop(len(batch) + source))

        def task_features(x: Tensor) -> Tensor:
            return base(x).movedim(source - 2, -3)

        featurizer = Featurizer(task_features, base.params, base.num_features, torch.Size(batch))
        return ChunkedFeatureRootLinearOperator.from_featurizer(covar.inputs, featurizer, covar.chunk_size,
                                                                correction)
    dims = list(range(covar.dim() - 2))
    dims.append(dims.pop(source))
    covar = covar.permute(*dims, -2, -1)
    if isinstance(covar, FeatureRootLinearOperator):  # a permutation keeps the correction's order
        covar = FeatureRootLinearOperator(covar.root, correction)
    return covar


def _chunked_block_root(covar: ChunkedFeatureRootLinearOperator, tasks,
                        kernel: str = "the batch kernel") -> ChunkedIndependentTasksOperator:
    """The outputs over the budget: the interleaved root's rows evaluated a block of points at a time
    (:class:`~rfgp.inference.independent_tasks.ChunkedIndependentTasksOperator`, which also trains), with the
    T roots ``tasks`` (materialised if they fit the budget) for diagonal noise; ``kernel`` names the batch kernel
    in errors."""
    if covar.variance_correction is not None:
        why, remedy = chunking_cause()  # the chunking named as the user asked for it: rows, or a memory budget
        raise NotImplementedError(
            f"{kernel}'s features are biased on the diagonal (a bias-corrected map), and the independent outputs of "
            f"such a kernel {why} have no chunked evaluation: {remedy}, or use an unbiased map (random Fourier "
            "features)"
        )
    num_points, base = covar.inputs.shape[-2], covar.featurizer
    points = points_per_block(num_points, base.batch_shape[-1], base.batch_shape[-1] * base.num_features,
                              math.prod(base.batch_shape[:-1]), covar.inputs.dtype)
    return ChunkedIndependentTasksOperator.from_tasks(covar, points or num_points, tasks)


#: GPyTorch's function (the classmethod's ``__func__``), which :func:`_from_batch_mvn` runs first
_gpytorch_from_batch_mvn = MultitaskMultivariateNormal.__dict__["from_batch_mvn"].__func__


@functools.wraps(_gpytorch_from_batch_mvn)
def _from_batch_mvn(cls, batch_mvn, task_dim=-1):
    joint = _gpytorch_from_batch_mvn(cls, batch_mvn, task_dim)  # its checks, its mean
    covar = batch_mvn.lazy_covariance_matrix if batch_mvn.islazy else None
    if (isinstance(covar, LazyEvaluatedKernelTensor) and (covar.x1.dim() != 2 or covar.x2.dim() != 2)
            and holds_feature_kernel(covar.kernel)):
        # batched inputs (each output's own, say), which the outputs' kernel cannot take lazily: evaluated now, as
        # an eagerly evaluated kernel is (GPyTorch's operator ran CG and stochastic Lanczos: loss off by 6e-3)
        covar = evaluated_covariance(covar)
    if type(covar) in (FeatureRootLinearOperator, ComplexFeatureRootLinearOperator,
                       ChunkedFeatureRootLinearOperator) and covar.batch_shape == batch_mvn.batch_shape:
        # an eagerly evaluated batch of T feature roots (gpytorch.settings.lazily_evaluate_kernels(False)), complex
        # ones (complex_posterior=True) included: GPyTorch's operator would lose their complex GP for the real one
        task_dim = task_dim if task_dim >= 0 else len(batch_mvn.batch_shape) + task_dim
        tasks = _outputs_last(covar, task_dim - len(batch_mvn.batch_shape))
        chunked = isinstance(tasks, ChunkedFeatureRootLinearOperator)
        outputs = _chunked_block_root(tasks, tasks) if chunked else IndependentTasksLinearOperator(tasks)
        return cls(mean=joint.mean, covariance_matrix=outputs)
    if not isinstance(covar, LazyEvaluatedKernelTensor) or covar.x1.dim() != 2 or covar.x2.dim() != 2:
        return joint
    kernel = covar.kernel
    if kernel.batch_shape != batch_mvn.batch_shape:
        return joint
    if not holds_feature_kernel(kernel):
        return joint
    task_dim = task_dim if task_dim >= 0 else len(batch_mvn.batch_shape) + task_dim
    outputs = LazyEvaluatedKernelTensor(covar.x1, covar.x2, IndependentOutputsKernel(kernel, task_dim), **covar.params)
    return cls(mean=joint.mean, covariance_matrix=outputs)


def install() -> None:
    """Route ``MultitaskMultivariateNormal.from_batch_mvn`` of rfgp kernels to :class:`IndependentOutputsKernel`
    (idempotent)."""
    if MultitaskMultivariateNormal.__dict__["from_batch_mvn"].__func__ is not _from_batch_mvn:
        MultitaskMultivariateNormal.from_batch_mvn = classmethod(_from_batch_mvn)
