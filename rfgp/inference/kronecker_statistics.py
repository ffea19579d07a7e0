r"""The feature statistics of a sketched multitask covariance under Kronecker noise, from the Kronecker factors.

A sketched ``MultitaskKernel`` (:class:`~rfgp.kernels.SketchedDecomposableKernel`) has the interleaved root
Φ = φ ⊗ B (N·T × F·m: row i·T + t, column f·m + k, entry φ_f(xᵢ)·B[t, k]; φ the N × F data features, A = BBᵀ the task
covariance, m = rank + T).  Under a noise D_N ⊗ Σ_T (D_N diagonal — constant for every GPyTorch
``MultitaskGaussianLikelihood`` — and Σ_T = CCᵀ of any rank, :mod:`rfgp.inference.task_noise`) the whitening
W = D_N^{-1/2} ⊗ C⁻¹ keeps the structure, WΦ = φ̃ ⊗ B̃ with φ̃ = D_N^{-1/2}φ and B̃ = C⁻¹B, so the statistics of the
capacitance path (:func:`~rfgp.inference.linalg.woodbury_inv_quad_logdet`) are

    Φ̃ᵀΦ̃ = (φᵀD_N⁻¹φ) ⊗ (B̃ᵀB̃)                               O(N·F² + F²·m²),
    Φ̃ᵀr̃ = vec(φᵀD_N⁻¹ R̃ B̃)   (row-major: entry f·m + k)       O(N·T·(T + m·k) + N·F·m·k),
    r̃ᵀr̃ = Σᵢ r̃ᵢᵀr̃ᵢ/dᵢ,   log|D_N ⊗ Σ_T| = T·Σ log dᵢ + 2N·Σ log Cₜₜ,

for the residuals R (N × T per right-hand side, interleaved) whitened per point, R̃ = RC⁻ᵀ (the Kronecker
mixed-product rule (X ⊗ Y)ᵀ(U ⊗ V) = XᵀU ⊗ YᵀV, and (X ⊗ Y)ᵀvec_r(R) = vec_r(XᵀRY) for row-major vec; Van Loan,
"The ubiquitous Kronecker product", J. Comput. Appl. Math. 123, 2000, §2).  Forming Φ̃ᵀΦ̃ from the whitened root costs
O(N·T·F²·m²) instead.  The F·m × F·m capacitance I + Φ̃ᵀΦ̃ is still factorised by Cholesky: an eigendecomposition of
the task factor would give NaN gradients at repeated eigenvalues (GPyTorch's ``IndexKernel`` starts with equal
variances).  The float32 statistics rule (:mod:`rfgp.inference.statistics_precision`) reads the same estimate,
u·tr(Φ̃ᵀΦ̃) = u·tr(φᵀD_N⁻¹φ)·‖B̃‖_F².

The same model's algebra, chosen where it applies: noise that is not D_N ⊗ Σ_T (per-entry noise), missing targets
under ``observation_nan_policy`` "mask"/"fill" (per-point masks break the Kronecker structure), sums of decomposable
terms (LCM) and the curl-/divergence-free kernels keep the whitened-root statistics; so do models for which the
N·T × N·T kernel-space path is cheaper (:func:`prefers_kernel_space_kronecker`).  A root over
:class:`rfgp.settings.memory_budget` keeps these statistics, from φ whole where φ fits the budget or from row blocks of
φ (:class:`ChunkedDataFeatures`, :mod:`rfgp.inference.chunked_kronecker`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from linear_operator.operators import ConstantDiagLinearOperator, DiagLinearOperator, KroneckerProductLinearOperator
from torch import Tensor

from ..core.dtypes import factor_dtype
from ..core.memory import check_solve
from ..core.validation import check_noise
from . import distributed
from .chunking import Featurizer, chunked_feature_statistics
from .linalg import diagonal_logdet, feature_statistics
from .statistics_precision import statistics_dtype, weighted_square_norm


def kronecker_noise(noise, num_tasks: int) -> tuple[Tensor, Tensor] | None:
    """(d ``(..., N)`` or ``(..., 1)`` for a constant D_N, Σ_T ``(..., T, T)``) of a noise D_N ⊗ Σ_T in GPyTorch's
    interleaved layout (σ²I; GPyTorch's ``MultitaskGaussianLikelihood`` noise c·I_N ⊗ Σ_T of any rank; a diagonal
    D_N ⊗ Σ_T); ``None`` for any other noise."""
    if isinstance(noise, ConstantDiagLinearOperator):
        eye = torch.eye(num_tasks, dtype=noise.dtype, device=noise.device)
        return noise.diag_values, eye.expand(*noise.batch_shape, num_tasks, num_tasks)
    if not (isinstance(noise, KroneckerProductLinearOperator) and len(noise.linear_ops) == 2
            and isinstance(noise.linear_ops[0], DiagLinearOperator) and noise.linear_ops[1].shape[-1] == num_tasks):
        return None
    points, tasks = noise.linear_ops
    constant = isinstance(points, ConstantDiagLinearOperator)
    point_noise = points.diag_values if constant else points.diagonal(dim1=-1, dim2=-2)
    return point_noise, tasks.to_dense()


class ChunkedDataFeatures(NamedTuple):
    """φ = featurizer(x) of a Kronecker root φ ⊗ B over :class:`rfgp.settings.memory_budget`, evaluated
    ``chunk_size`` points at a time (:func:`kronecker_statistics` accumulates φ_cᵀD_c⁻¹φ_c and φ_cᵀD_c⁻¹R̃_cB̃)."""

    featurizer: Featurizer
    inputs: Tensor
    chunk_size: int


def kronecker_statistics(data: Tensor | ChunkedDataFeatures, weights: Tensor, task: Tensor, chol: Tensor,
                         rhs: Tensor) -> tuple[Tensor, Tensor, Tensor, torch.dtype]:
    """(Φ̃ᵀΦ̃ ``(..., F·m, F·m)``, Φ̃ᵀr̃ ``(..., F·m, k)``, r̃ᵀr̃ ``(..., k)``, the model's dtype) from the factors
    (module docstring), summed over processes inside :class:`rfgp.inference.distributed.data_parallel`.

    float32 factors form the data statistics in float64 where u·tr(Φ̃ᵀΦ̃) exceeds the tolerance
    (:func:`~rfgp.inference.statistics_precision.statistics_dtype`); the results are then float64, and the returned
    dtype is the model's, to round the results derived from them back to.

    A chunked φ (:class:`ChunkedDataFeatures`) has its data statistics accumulated over row blocks with the
    backward recomputing each block (:func:`~rfgp.inference.chunking.chunked_feature_statistics`, O(chunk·F + F²)
    memory); its precision is decided from the float32 sums' tr(φᵀD_N⁻¹φ)·‖B̃‖_F² (a second pass in float64 where
    needed), the residual projections B̃ᵀr̃ᵢ formed in the model's dtype.

    Args:
        data: φ ``(..., N, F)``, or its :class:`ChunkedDataFeatures`.
        weights: 1/dᵢ ``(..., N)``, or ``(..., 1)`` for a constant D_N.
        task: B ``(..., T, m)``.
        chol: C ``(..., T, T)``, lower, Σ_T = CCᵀ.
        rhs: the interleaved residuals r ``(..., N·T, k)`` (k may be 0).
    """
    num_tasks, width = task.shape[-2:]
    chunked = isinstance(data, ChunkedDataFeatures)
    data_dtype = data.inputs.dtype if chunked else data.dtype
    dtype = torch.promote_types(torch.promote_types(data_dtype, weights.dtype), task.dtype)
    check_kronecker_solve(data, weights, task, chol, dtype)
    whitened_task = torch.linalg.solve_triangular(chol.to(dtype), task.to(dtype), upper=False)  # B̃ = C⁻¹B
    blocks = rhs.to(dtype).unflatten(-2, (-1, num_tasks))  # (..., N, T, k)
    whitened = torch.linalg.solve_triangular(chol.to(dtype).unsqueeze(-3), blocks, upper=False)  # R̃ per point

    if chunked:
        # W, B̃ and R̃ widened once for all their uses (as rfgp.inference.operators.widened_statistics_inputs), so that
        # the gradients of the statistics and of rᵀWr, which cancel, meet in float64
        wide = factor_dtype(dtype, weights.device)
        weights, whitened_task, whitened = weights.to(wide), whitened_task.to(wide), whitened.to(wide)
        projected = torch.einsum("...tm,...ntk->...nmk", whitened_task, whitened)  # B̃ᵀr̃ᵢ
        data_gram, data_cross = chunked_feature_statistics(
            data.featurizer, data.inputs, weights, projected.flatten(-2), data.chunk_size, adaptive_precision=True,
            trace_scale=whitened_task.detach().square().sum((-2, -1)), model_dtype=dtype)
        work = data_gram.dtype
    else:
        def trace() -> Tensor:  # tr(Φ̃ᵀΦ̃) = tr(φᵀD_N⁻¹φ)·‖B̃‖_F², summed over processes (one dtype on every rank)
            with torch.no_grad():
                return distributed.reduce_statistics(weighted_square_norm(data, weights))[0] * whitened_task.square(
                ).sum((-2, -1))

        work = statistics_dtype(dtype, data.device, trace)
        # B̃, R̃ and W cast once for all their uses below: their gradients, which cancel, meet in ``work``
        whitened_task, whitened, weights = whitened_task.to(work), whitened.to(work), weights.to(work)
        projected = torch.einsum("...tm,...ntk->...nmk", whitened_task, whitened)
        data_gram, data_cross = feature_statistics(data.to(work), weights, projected.flatten(-2))
    whitened_task, whitened, weights = whitened_task.to(work), whitened.to(work), weights.to(work)
    weighted_square = (whitened.square().sum(-2) * weights.unsqueeze(-1)).sum(-2)
    task_gram = whitened_task.mT @ whitened_task
    gram = (data_gram[..., :, None, :, None] * task_gram[..., None, :, None, :]).flatten(-2).flatten(-3, -2)
    cross = data_cross.unflatten(-1, (width, -1)).flatten(-3, -2)
    # Reduced after the product with B̃ᵀB̃: every parameter then enters each rank's summand only, so the gradients
    # that sync_gradients sums count B and Σ_T once (a reduced φᵀD_N⁻¹φ times a local B̃ᵀB̃ counted them per rank).
    gram, cross, weighted_square = distributed.reduce_statistics(gram, cross, weighted_square)
    return gram, cross, weighted_square, dtype


def check_kronecker_solve(data: Tensor | ChunkedDataFeatures, weights: Tensor, task: Tensor, chol: Tensor,
                          dtype: torch.dtype) -> None:
    """Refuse, naming the sizes, F·m × F·m statistics (and the capacitance's factor) that cannot fit in the memory
    available (:func:`rfgp.core.memory.check_solve`), before they are formed: the rule of an F × F solve
    (:func:`rfgp.inference.chunking.check_chunked_solve`) for the width F·m of the Kronecker root φ ⊗ B, which neither
    the data kernel's F × F check nor the memory budget of φ's row blocks covers."""
    chunked = isinstance(data, ChunkedDataFeatures)
    data_batch = torch.broadcast_shapes(data.featurizer.batch_shape, data.inputs.shape[:-2]) if chunked \
        else data.shape[:-2]
    num_points, num_features = data.inputs.shape[-2] if chunked else data.shape[-2], task.shape[-1]
    num_features *= data.featurizer.num_features if chunked else data.shape[-1]
    batch = torch.broadcast_shapes(data_batch, weights.shape[:-1], task.shape[:-2], chol.shape[:-2]).numel()
    device = data.inputs.device if chunked else data.device
    advice = (f"reduce num_features (the data kernel's F) or the task covariance's rank: the capacitance of a "
              f"sketched MultitaskKernel is F·(rank + T) = {num_features} wide")
    check_solve(num_points * task.shape[-2], num_features, batch, dtype, device, size=num_features, advice=advice)


def kronecker_noise_logdet(point_noise: Tensor, chol: Tensor, num_points: int) -> Tensor:
    """log|D_N ⊗ Σ_T| = T·Σ log dᵢ + 2N·Σ log Cₜₜ (d ``(..., N)``, or ``(..., 1)`` for a constant D_N), summed over
    processes inside :class:`rfgp.inference.distributed.data_parallel`."""
    num_tasks = chol.shape[-1]
    point_logdet = diagonal_logdet(point_noise, num_points)
    chol_logdet = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
    (logdet,) = distributed.reduce_statistics(num_tasks * point_logdet + num_points * chol_logdet)
    return logdet


def diagonal_task_cholesky(task_noise: Tensor) -> Tensor:
    """C = diag(√σₜ²) of a diagonal Σ_T (a rank-0 ``MultitaskGaussianLikelihood``), its variances checked > 0."""
    return torch.diag_embed(check_noise(task_noise.diagonal(dim1=-2, dim2=-1)).sqrt())


def prefers_kernel_space_kronecker(num_points: int, num_tasks: int, data_width: int, task_width: int,
                                   feature_batch: int = 1, solve_batch: int = 1, statistics_batch: int = 1) -> bool:
    """Whether the N·T × N·T kernel-space path, (N·T)²·F·m + (N·T)³/3, costs no more than the capacitance path with
    Kronecker statistics, N·F² (the data Gram) + F²·m² (its product with B̃ᵀB̃) + (F·m)³/3, batches counted as in
    :func:`rfgp.inference.kernel_space.prefers_kernel_space` (``statistics_batch``: data Grams φᵀD_N⁻¹φ formed)."""
    rows, width, data = float(num_points * num_tasks), float(data_width * task_width), float(data_width)
    kernel = feature_batch * rows * rows * width + solve_batch * rows**3 / 3
    feature = statistics_batch * num_points * data * data + solve_batch * (width * width + width**3 / 3)
    return kernel <= feature


def statistics_batches(data: Tensor, point_noise: Tensor, task: Tensor, batch_shape) -> tuple[int, int, int]:
    """(distinct roots, factorisations, data Grams) for :func:`prefers_kernel_space_kronecker`: one Gram per φ under
    a constant D_N (its weight scales the Gram afterwards), else one per batch member of φ and D_N."""
    roots = math.prod(torch.broadcast_shapes(data.shape[:-2], task.shape[:-2]))
    grams = math.prod(data.shape[:-2])
    if point_noise.shape[-1] != 1:
        grams = math.prod(torch.broadcast_shapes(data.shape[:-2], point_noise.shape[:-1]))
    return roots, math.prod(batch_shape), grams
