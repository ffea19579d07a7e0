"""Feature-space linear algebra: the statistics ΦᵀWΦ and ΦᵀWR with a lean backward pass.

A random-feature GP is determined by the F × F statistic G = ΦᵀWΦ (W diagonal) and the
F × t statistic B = ΦᵀWR.  Autograd through ``(Φ * w).mT @ Φ`` and ``Φ.mT @ (w * R)``
costs three N·F² products (one forward, two backward) plus a second gradient path into
Φ; the custom function below needs

* forward: the symmetric G from its upper column blocks only (:func:`symmetric_gram`,
  (k + 1)/(2k) of the 2·N·F² flops for k blocks);
* backward: one N·F² product, ∂Φ = 2WΦS + WRB̄ᵀ with S = ½(Ḡ + Ḡᵀ), the rank-t term
  accumulated into the product's output instead of a second N × F pass.

When the weights are uniform (one value per batch, shape ``(..., 1)`` — a homoscedastic
noise), no N × F element-wise pass is made at all: G = w·ΦᵀΦ and ∂w = ⟨ΦᵀΦ, S⟩ + ⟨ΦᵀR, B̄⟩
come from F × F quantities.  Second derivatives (``create_graph=True``, e.g. Hessians of the
MLL w.r.t. hyperparameters) take :func:`differentiable_backward` instead: plain autograd
through the same statistics, differentiable again.  Used by :class:`rfgp.inference.operators.FeatureRootAddedDiagLinearOperator`
(materialised Φ) and, chunk by chunk, by :mod:`rfgp.inference.chunking`.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from linear_operator.utils.errors import NanError, NotPSDError
from torch import Tensor

from ..core.batch_copies import broadcast_dims, narrow_broadcast
from ..core.dtypes import factor_dtype, refuse_autocast_backward
from ..core.validation import NonFiniteHyperparameterError, has_values
from .statistics_precision import unit_roundoff


class CapacitanceNotPSDError(NotPSDError):
    """The capacitance I + ΦᵀD⁻¹Φ failed to factorise even in :func:`factor_dtype`: its statistics, rounded in the
    model's dtype, are not positive definite.  A ``NotPSDError``, so that handlers of
    linear_operator's error (:func:`rfgp.fit_mll`'s restarts) treat it alike."""


def capacitance_cholesky(gram: Tensor, noise: Tensor | None = None) -> Tensor:
    """L = chol(I + ``gram``) in :func:`factor_dtype` (float64 for float32/half input), differentiable.

    A = I + ΦᵀD⁻¹Φ has eigenvalues ≥ 1 in exact arithmetic, but at a high signal-to-noise ratio its condition
    number reaches 1/eps of float32 (a 3-D curl-free IGRF fit: ‖ΦᵀD⁻¹Φ‖ ≈ 2.7·10⁷), where a float32 Cholesky
    factorisation breaks down (``NotPSDError`` even with jitter) although the rounded A is positive definite
    (smallest eigenvalue 0.46).  Factorised in float64, the F³/3 flops (and the Cholesky backward) cost little
    beside the N·F² statistics, which stay in the input dtype.  No jitter is added: it would have to reach the
    rounding of ΦᵀD⁻¹Φ (≈ eps·‖ΦᵀD⁻¹Φ‖, far above 1) to help, and would change the model; a failure raises
    :class:`CapacitanceNotPSDError` saying what to do instead (``NanError`` for non-finite entries).

    Args:
        gram: ΦᵀD⁻¹Φ ``(..., F, F)``.
        noise: optional noise variances (any shape), named in the error message.
    """
    work = factor_dtype(gram.dtype, gram.device)
    capacitance = gram.to(work) + torch.eye(gram.shape[-1], dtype=work, device=gram.device)
    chol, info = torch.linalg.cholesky_ex(capacitance)
    if torch.any(info):
        capacitance = capacitance.detach()
        if not torch.isfinite(capacitance).all():  # linear_operator's error for NaN entries, as psd_safe_cholesky's
            raise NanError(
                f"the {capacitance.shape[-1]} × {capacitance.shape[-1]} capacitance I + ΦᵀD⁻¹Φ has NaN or infinite "
                "entries: the features, hyperparameters or noise are not finite"
            )
        raise CapacitanceNotPSDError(_capacitance_failure(capacitance, gram.dtype, noise))
    return chol


def _capacitance_failure(capacitance: Tensor, dtype: torch.dtype, noise: Tensor | None) -> str:
    """What failed and what to do, for :class:`CapacitanceNotPSDError`."""
    size = capacitance.shape[-1]
    what = f"the {size} × {size} capacitance I + ΦᵀD⁻¹Φ of a {dtype} model"
    # λ_min(A) ≥ 1 in exact arithmetic; the largest diagonal entry is a lower bound of λ_max, and u·tr(ΦᵀD⁻¹Φ) the
    # a-priori estimate of the statistics' rounding (rfgp.inference.statistics_precision; the largest batch member's)
    diagonal = capacitance.diagonal(dim1=-2, dim2=-1)
    largest = diagonal.abs().max().item()
    estimate = unit_roundoff(dtype) * (diagonal.sum(-1) - size).max().item()
    noise_text = "" if noise is None else f", smallest noise variance {noise.detach().min().item():.3g}"
    widened = "" if capacitance.dtype == dtype else f" even factorised in {capacitance.dtype}"
    return (
        f"{what} is not positive definite{widened} (largest eigenvalue ≥ {largest:.3g}{noise_text}): its "
        f"statistics ΦᵀD⁻¹Φ, computed in {dtype}, carry rounding errors of up to about u·tr(ΦᵀD⁻¹Φ) = "
        f"{estimate:.3g} (u = {unit_roundoff(dtype):.2g}), against a smallest eigenvalue of 1 in exact arithmetic. "
        f"{rounding_advice(dtype)}"
    )


def rounding_advice(dtype: torch.dtype) -> str:
    """What to do when a factorisation fails because rounding in ``dtype`` exceeds the noise (the capacitance's
    :class:`CapacitanceNotPSDError`, the kernel-space path's ``KernelSpaceNotPSDError``)."""
    start = "Raise" if dtype == torch.float64 else (
        "Train in float64 (model.double() with float64 data), form float32 features' statistics in float64 "
        "(rfgp.settings.float32_statistics_tolerance(0); the default tolerance chooses float64 by u·tr(ΦᵀD⁻¹Φ)) "
        "or raise")
    return (f"{start} the noise lower bound (the rounding scales with 1/noise): a GaussianLikelihood's "
            "noise_constraint=gpytorch.constraints.GreaterThan(...), or a larger alpha_epsilon for Dirichlet "
            "classification")


def capacitance_solve(gram: Tensor, rhs: Tensor, noise: Tensor | None = None,
                      dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(A⁻¹·rhs, L) for the capacitance A = I + ``gram`` = LLᵀ of a posterior's weight space.

    The factorisation and the solve run in :func:`factor_dtype` (float64 for float32 input,
    :func:`capacitance_cholesky`) and are rounded back to ``dtype`` (default ``gram``'s; the model's where float32
    features formed float64 statistics): L has the square root of A's condition number, which float32 triangular
    solves with test features handle.  ``noise`` (optional) is named in the error message.
    """
    dtype = gram.dtype if dtype is None else dtype
    chol = capacitance_cholesky(gram, noise)
    solution = torch.cholesky_solve(rhs.to(chol.dtype), chol, upper=False)
    return solution.to(dtype), chol.to(dtype)


def cholesky_solve(rhs: Tensor, chol: Tensor) -> Tensor:
    """(LLᵀ)⁻¹·rhs for a lower factor L by two triangular solves, L⁻ᵀ(L⁻¹·rhs) — what ``torch.cholesky_solve`` computes
    (LAPACK potrs: the same two solves) without its column-major copy of the N × N factor, and without its
    multi-threaded potrs on CPU: N = 1000, one right-hand side, one thread 0.3 against 0.8 ms (float32) and 0.5 against
    1.4 ms (float64); two threads 0.3 against 7 ms (float32, a shared host).  Batches broadcast as in
    ``torch.linalg.solve_triangular``."""
    return torch.linalg.solve_triangular(chol.mT, torch.linalg.solve_triangular(chol, rhs, upper=False), upper=True)


def diagonal_logdet(diagonal: Tensor, size: int) -> Tensor:
    """log|D| = Σᵢ log dᵢ of a ``size`` × ``size`` diagonal D given per entry ``(..., size)`` or constant ``(..., 1)``
    (then ``size``·log d); 0 for ``size`` = 0 (a rank's empty shard: its per-point noise has no entry).  Batches of
    ``diagonal`` give a batch of log-determinants ``(...)``."""
    return diagonal.log().sum(-1) * (1 if diagonal.shape[-1] == size else size)


def is_positive(value: Tensor | float) -> bool:
    """Whether a constant (a number, or one per batch member) is > 0 everywhere: operators scale their roots by √c
    only then (one host read for a tensor)."""
    return bool((value > 0).all()) if torch.is_tensor(value) else value > 0


def scales_root(value: Tensor | float) -> bool:
    """Whether c·ΦΦᵀ stays a feature root, (√c·Φ)(√c·Φ)ᵀ: c finite and > 0 everywhere (a number, or one per batch
    member; one host read for a tensor; a c on ``meta``, shape inference, has no values and counts as > 0).  ``False``
    where some c < 0 — not a covariance: linear_operator's generic
    product, as for its own ``RootLinearOperator``.

    Raises:
        NonFiniteHyperparameterError: c ≥ 0 with c = 0 somewhere — an outputscale underflowed to 0 (GPyTorch's softplus
            of a float32 raw_outputscale below about −104).  The feature-space algebra scales Φ by √c and
            differentiates through it (d√c/dc is infinite at 0), and linear_operator's generic product would silently
            take its iterative CG/Lanczos path (O(N²) per iteration, NaN preconditioners).  A ``NanError``, so that
            :func:`rfgp.fit_mll` and BoTorch's ``fit_gpytorch_mll`` step back from such a line-search trial point.
            Also where c is NaN or ±Inf somewhere (an outputscale after a diverged step): before, a NaN c was reported
            as 0 and an infinite one gave a covariance of NaN and Inf entries without a word.
    """
    if torch.is_tensor(value):
        if not has_values(value) or bool(((value > 0) & (value < float("inf"))).all()):  # one host read
            return True
        finite = bool(torch.isfinite(value).all())
    elif 0 < value < float("inf"):
        return True
    else:
        finite = math.isfinite(value)
    if not finite:
        raise NonFiniteHyperparameterError(
            "a covariance of random features is multiplied by a constant that is NaN or ±Inf (a ScaleKernel's "
            f"outputscale{' in some batch members' if torch.is_tensor(value) and value.numel() > 1 else ''}, after a "
            "diverged optimiser step, say): reset it to a finite positive value, e.g. kernel.outputscale = 1.0"
        )
    if bool((value < 0).any()) if torch.is_tensor(value) else value < 0:
        return False
    raise NonFiniteHyperparameterError(
        "a covariance of random features is multiplied by the constant 0 (a ScaleKernel's outputscale is 0"
        f"{' in some batch members' if torch.is_tensor(value) and value.numel() > 1 else ''}; in float32, softplus of "
        "a raw_outputscale below about -104 underflows to 0): rfgp's feature-space algebra scales the features by "
        "√outputscale and cannot differentiate at 0. Keep it positive — a lower bound such as ScaleKernel(..., "
        "outputscale_constraint=gpytorch.constraints.GreaterThan(1e-6)), or float64 — and remove a component from "
        "the kernel tree instead of scaling it by 0"
    )


#: column-block width of :func:`symmetric_gram`; narrower blocks skip more of the lower
#: triangle but make smaller, less efficient matrix products (measured on CPU: F = 1024
#: in 4 blocks is 20–25 % faster than one product).
GRAM_BLOCK = 256


def symmetric_gram(left: Tensor, right: Tensor) -> Tensor:
    """leftᵀright for a product known to be symmetric (left = WΦ, right = Φ), from its upper blocks.

    Block row i costs 2·N·b·(F − i·b) flops; the lower blocks are mirrored (the diagonal
    blocks are symmetric up to rounding, like a full product's).  Shapes
    ``(..., N, F)``, broadcast over batches.
    """
    num_features = right.shape[-1]
    if num_features < 2 * GRAM_BLOCK:
        return left.mT @ right
    batch = torch.broadcast_shapes(left.shape[:-2], right.shape[:-2])
    gram = right.new_empty(*batch, num_features, num_features)
    for start in range(0, num_features, GRAM_BLOCK):
        stop = min(start + GRAM_BLOCK, num_features)
        rows = left[..., start:stop].mT @ right[..., start:]
        gram[..., start:stop, start:] = rows
        gram[..., stop:, start:stop] = rows[..., stop - start :].mT
    return gram


def project(features: Tensor, rhs: Tensor) -> Tensor:
    """ΦᵀR for Φ ``(..., N, F)`` and a thin R ``(..., N, t)``, computed as (RᵀΦ)ᵀ.

    CPU BLAS (MKL) runs the product with the transposed N × F operand ~40× slower once
    t ≥ 2 (N = 10⁵, F = 1024, t = 2: 3.2 s against 0.06 s CPU), same result.
    """
    return (rhs.mT @ features).mT


class _SquaredRowNorms(torch.autograd.Function):
    """‖rᵢ‖² by one fused reduction, with the derivative 2rᵢ·ḡᵢ written in differentiable operations (any order) and
    the forward-mode derivative 2rᵢ·ṙᵢ; ``setup_context`` and the generated vmap rule let ``torch.func`` transforms
    (``grad``, ``jacrev``, ``hessian``, ``vmap``) through it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(rows: Tensor) -> Tensor:
        return torch.linalg.vector_norm(rows, 2, -1).square()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        (rows,) = inputs
        ctx.save_for_backward(rows)
        ctx.save_for_forward(rows)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        (rows,) = ctx.saved_tensors
        return 2 * rows * grad.unsqueeze(-1)

    @staticmethod
    def jvp(ctx, tangent: Tensor) -> Tensor:
        (rows,) = ctx.saved_tensors
        return 2 * (rows * tangent).sum(-1)


def squared_row_norms(rows: Tensor) -> Tensor:
    """‖rᵢ‖² of the real rows of ``rows`` ``(..., n, F)``, shape ``(..., n)``: diag(ΦΦᵀ) without an n × F temporary.

    ``rows.pow(2).sum(-1)`` allocates the n × F squares first: 50 ms against 2.8 ms for this fused reduction at
    n = 14 016, F = 1 024 in float32 (100 against 9 ms in float64; one thread), the same values to rounding
    (≤ 5·10⁻⁷ / 1.1·10⁻¹⁵ relative).  ``torch.linalg.vector_norm``'s own derivative divides by ‖rᵢ‖ (NaN second
    derivatives at a zero row: Nyström features vanish far from the landmarks), so the derivative 2rᵢ·ḡᵢ is given
    here (:class:`_SquaredRowNorms`); a traced call (``torch.jit.trace``, which cannot export a Python autograd
    Function) takes the plain reduction.
    """
    if rows.is_complex():
        raise TypeError(f"squared_row_norms takes real rows (|·|² of complex ones is another sum), got {rows.dtype}")
    if torch.jit.is_tracing() or not (rows.requires_grad and torch.is_grad_enabled()):
        return torch.linalg.vector_norm(rows, 2, -1).square()
    return _SquaredRowNorms.apply(rows)


#: the most float32 partial sums of ΦᵀR that :func:`accumulated_project` adds in float64, and the fewest rows in each
PROJECTION_PARTS, PROJECTION_ROWS = 64, 256


def accumulated_project(features: Tensor, rhs: Tensor) -> Tensor:
    """ΦᵀR (:func:`project`) for float32 Φ with its sum over the N rows accumulated in float64 between blocks of
    ⌈N/64⌉ (at least 256) rows, each block's product formed in float32, the result rounded back to Φ's dtype.

    The N-term sums of B = ΦᵀWr round coherently where features and residuals share a sign pattern (every column
    of a Maclaurin or Nyström map has a large mean): one float32 product of N = 5·10⁴ rows put the marginal
    likelihood's gradient 2.1 % off the float64 statistics' for a Maclaurin model and 14 % for an RFF one (noise 10⁻²
    of the outputscale), 2.1·10⁻⁴ and 1.3·10⁻³ with float64 partial sums — as good as forming B wholly in float64,
    without an N × F float64 copy (``benchmarks/results/float32_statistics_refined.md``).  The Gram ΦᵀWΦ does not
    need it: its rounding is the one ε̂ bounds.  Float64 Φ (or a device without float64) takes :func:`project`.
    """
    num_rows = int(features.shape[-2])  # an int even under torch.jit.trace
    wide = factor_dtype(features.dtype, features.device)
    if wide == features.dtype or num_rows <= PROJECTION_ROWS:
        return project(features, rhs)
    block = max(PROJECTION_ROWS, -(-num_rows // PROJECTION_PARTS))
    whole = num_rows - num_rows % block
    blocks = (rhs[..., :whole, :].unflatten(-2, (-1, block)).mT @ features[..., :whole, :].unflatten(-2, (-1, block)))
    total = blocks.sum(-3, dtype=wide)
    if whole < num_rows:
        total = total + (rhs[..., whole:, :].mT @ features[..., whole:, :]).to(wide)
    return total.mT.to(features.dtype)


def _is_uniform(weights: Tensor) -> bool:
    """One weight per batch (``(..., 1)``), broadcast over the rows."""
    return weights.shape[-1] == 1


def unit_statistics(features: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀΦ, ΦᵀR): the statistics of uniform weights, which scale them afterwards (no N × F pass)."""
    return symmetric_gram(features, features), accumulated_project(features, rhs)


def weighted_statistics(features: Tensor, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for per-point weights ``(..., N)``, without autograd bookkeeping."""
    w = weights.unsqueeze(-1)
    return symmetric_gram(features * w, features), accumulated_project(features, rhs * w)


def gram_gradient(grad_gram: Tensor, weights: Tensor) -> Tensor:
    """The F × F factor of ∂Φ in :func:`statistics_backward`: S = ½(Ḡ + Ḡᵀ), or 2w·S for uniform weights
    ``(..., 1)``."""
    sym = 0.5 * (grad_gram + grad_gram.mT)
    return sym * (2.0 * weights.unsqueeze(-1)) if _is_uniform(weights) else sym


def statistics_backward(
    features: Tensor,
    weights: Tensor,
    rhs: Tensor,
    grad_gram: Tensor,
    grad_cross: Tensor,
    needs: tuple[bool, bool, bool],
    factor: Tensor | None = None,
    uniform: bool | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """Gradients of (ΦᵀWΦ, ΦᵀWR) with respect to (Φ, w, R), before un-broadcasting.

    For uniform weights ``(..., 1)`` ∂w is not computed here: it is an F × F contraction of
    the whole data's unit statistics (:func:`uniform_weight_grad`), so ``needs[1]`` is ignored.
    ``factor``: :func:`gram_gradient` of ``grad_gram``, where a caller that splits Φ into row blocks forms it once.
    ``uniform``: whether ``weights`` are uniform (default: their shape ``(..., 1)`` says so); a caller that splits Φ
    into row blocks says it, since a one-row block of per-point weights has that shape too.
    """
    uniform = _is_uniform(weights) if uniform is None else uniform
    sym = gram_gradient(grad_gram, weights) if factor is None else factor
    w = weights.unsqueeze(-1)
    grad_features = grad_weights = grad_rhs = None
    if needs[2]:
        grad_rhs = (features @ grad_cross) * w
    if uniform:
        if needs[0]:
            grad_features = _add_matmul(features @ sym, rhs * w, grad_cross.mT)
        return grad_features, grad_weights, grad_rhs
    projected = features @ sym  # the one N·F² product of the backward pass
    if needs[1]:
        grad_weights = (features * projected).sum(-1) + ((features @ grad_cross) * rhs).sum(-1)
    if needs[0]:
        grad_features = _add_matmul(projected.mul_(2.0), rhs, grad_cross.mT).mul_(w)
    return grad_features, grad_weights, grad_rhs


def uniform_weight_grad(unit_gram: Tensor, unit_cross: Tensor, grad_gram: Tensor, grad_cross: Tensor) -> Tensor:
    """∂/∂w of (w·Φᵀ Φ, w·ΦᵀR): ⟨ΦᵀΦ, Ḡ⟩ + ⟨ΦᵀR, B̄⟩, shape ``(..., 1)``."""
    return ((unit_gram * grad_gram).sum((-2, -1)) + (unit_cross * grad_cross).sum((-2, -1))).unsqueeze(-1)


def _add_matmul(out: Tensor, left: Tensor, right: Tensor) -> Tensor:
    """out + left @ right, accumulated inside the matrix product (no N × F temporary) where the shapes allow."""
    if left.shape[-1] == 0:
        return out
    if out.dim() == 2 and left.dim() == 2 and right.dim() == 2:
        return out.addmm_(left, right)
    if out.dim() == left.dim() == right.dim() == 3 and out.shape[0] == left.shape[0] == right.shape[0]:
        return out.baddbmm_(left, right)  # a batch of T outputs' statistics (rfgp.inference.independent_tasks)
    return out.add_(left @ right)


def plain_statistics(features: Tensor, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) with ordinary differentiable operations (weights ``(..., N)`` or uniform ``(..., 1)``), ΦᵀWR
    summed as the fused statistics do (:func:`accumulated_project`): ``torch.jit.trace`` records this forward, and
    one float32 product of N = 2·10⁴ Maclaurin rows put a traced B 2.3·10⁻⁶ off the float64 statistics' against the
    eager 7·10⁻⁸."""
    w = weights.unsqueeze(-1)
    return (features * w).mT @ features, accumulated_project(features, rhs * w)


def differentiable_backward(compute, inputs, needs, grads) -> tuple[Tensor | None, ...]:
    """The vector-Jacobian product of ``compute()`` w.r.t. ``inputs`` as a differentiable graph (double backward).

    Called from a custom Function's backward under ``create_graph=True``: the lean backward
    passes work in place and without a graph, which would make second derivatives silently
    zero; this recomputes the statistics with autograd (O(N·F) memory) and differentiates them.
    """
    wanted = [t for t, need in zip(inputs, needs) if need]
    with torch.enable_grad():
        outputs = compute()
    found = iter(torch.autograd.grad(outputs, wanted, grads, create_graph=True, allow_unused=True))
    return tuple(next(found) if need else None for need in needs)


#: Elements of Φ cast at a time where float32 features form float64 statistics (32 MiB of float64 per block), unless
#: F rows are more (:func:`cast_row_blocks`)
CAST_BLOCK_ELEMENTS = 2**22


def cast_row_blocks(features: Tensor, dtype: torch.dtype) -> list[slice]:
    """Row blocks of Φ ``(..., N, F)`` to cast to ``dtype`` one at a time: the whole Φ where it already has that
    dtype, else blocks of max(F, :data:`CAST_BLOCK_ELEMENTS`/F) rows, so that float64 statistics of float32 features
    hold one float64 block beside Φ (at most the F × F statistics' own size, or 32 MiB) instead of an N × F float64
    copy, twice Φ's memory.  At least F rows per block: each block adds F × F work (the accumulated Gram, the
    symmetrised gradient) beside its F·F·rows product, which fewer rows would no longer amortise."""
    if features.dtype == dtype:
        return [slice(None)]
    num_features = max(features.shape[-1], 1)
    rows = max(num_features, CAST_BLOCK_ELEMENTS // num_features)
    return [slice(start, start + rows) for start in range(0, max(features.shape[-2], 1), rows)]


class _FeatureStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, weights: Tensor, rhs: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        ctx.dtype = dtype
        uniform = _is_uniform(weights)
        gram = cross = None
        for rows in cast_row_blocks(features, dtype):
            block, block_rhs = features[..., rows, :].to(dtype), rhs[..., rows, :]
            if uniform:
                block_gram, block_cross = unit_statistics(block, block_rhs)
            else:
                block_gram, block_cross = weighted_statistics(block, weights[..., rows], block_rhs)
            gram = block_gram if gram is None else gram.add_(block_gram)
            cross = block_cross if cross is None else cross.add_(block_cross)
        if uniform:
            ctx.save_for_backward(features, weights, rhs, gram, cross)
            w = weights.unsqueeze(-1)
            return gram * w, cross * w
        ctx.save_for_backward(features, weights, rhs)
        return gram, cross

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_gram: Tensor, grad_cross: Tensor):
        features, weights, rhs, *unit = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True
            return (*differentiable_backward(lambda: plain_statistics(features.to(ctx.dtype), weights, rhs),
                                             (features, weights, rhs), ctx.needs_input_grad[:3],
                                             (grad_gram, grad_cross)), None)
        blocks = cast_row_blocks(features, ctx.dtype)
        if len(blocks) == 1:
            grad_features, grad_weights, grad_rhs = statistics_backward(
                features.to(ctx.dtype), weights, rhs, grad_gram, grad_cross, ctx.needs_input_grad[:3])
            grad_features = None if grad_features is None else grad_features.to(features.dtype)
        else:  # Φ's gradient written block by block in Φ's dtype; w̄ and R̄ are O(N·t)
            grad_features = torch.empty_like(features) if ctx.needs_input_grad[0] else None
            weight_parts, rhs_parts = [], []
            factor = gram_gradient(grad_gram, weights)  # once, not per block
            for rows in blocks:
                block_weights = weights if unit else weights[..., rows]
                block = statistics_backward(features[..., rows, :].to(ctx.dtype), block_weights, rhs[..., rows, :],
                                            grad_gram, grad_cross, ctx.needs_input_grad[:3], factor, bool(unit))
                if grad_features is not None:
                    grad_features[..., rows, :] = block[0]
                weight_parts.append(block[1])
                rhs_parts.append(block[2])
            grad_weights = None if weight_parts[0] is None else torch.cat(weight_parts, -1)
            grad_rhs = None if rhs_parts[0] is None else torch.cat(rhs_parts, -2)
        if unit and ctx.needs_input_grad[1]:
            grad_weights = uniform_weight_grad(*unit, grad_gram, grad_cross)
        grads = (grad_features, grad_weights, grad_rhs)
        return (*(None if g is None else _sum_to_shape(g, t.shape) for g, t in zip(grads, (features, weights, rhs))),
                None)


def _sum_to_shape(grad: Tensor, shape: torch.Size) -> Tensor:
    """Undo broadcasting: sum ``grad`` over the leading/expanded axes that ``shape`` lacks."""
    if grad.shape == shape:
        return grad
    lead = grad.dim() - len(shape)
    grad = grad.sum(dim=tuple(range(lead))) if lead > 0 else grad
    axes = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    return grad.sum(dim=axes, keepdim=True) if axes else grad


def feature_statistics(features: Tensor, weights: Tensor, rhs: Tensor,
                       dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for Φ ``(..., N, F)``, weights ``(..., N)`` or uniform ``(..., 1)``, and R ``(..., N, t)``.

    ``dtype``: form them in this dtype (the weights' and R's; default Φ's), casting Φ one row block at a time
    (:func:`cast_row_blocks`); the gradient reaches Φ in its own dtype.
    The chunked counterpart is :func:`rfgp.inference.chunking.chunked_feature_statistics`.
    """
    dtype = features.dtype if dtype is None else dtype
    batch = torch.broadcast_shapes(features.shape[:-2], weights.shape[:-1], rhs.shape[:-2])
    if features.shape[:-2] != batch:  # a leaf of the full batch stays a leaf (its stride-0 members are no copies)
        features = features.expand(*batch, *features.shape[-2:])
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same statistics, plainly
        return plain_statistics(features.to(dtype), weights, rhs)
    weights, rhs = weights.expand(*batch, weights.shape[-1]), rhs.expand(*batch, *rhs.shape[-2:])
    copies = broadcast_dims(features, len(batch))
    if copies and _is_uniform(weights):
        return _shared_feature_statistics(features, weights, rhs, copies, dtype)
    return _FeatureStatistics.apply(features, weights, rhs, dtype)


def _shared_feature_statistics(features: Tensor, weights: Tensor, rhs: Tensor, copies: tuple[int, ...],
                               dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """:func:`feature_statistics` for uniform weights w_b over batch dimensions ``copies`` in which Φ is one tensor
    expanded (stride 0): ΦᵀWΦ = w_b·Φᵀ Φ and ΦᵀWR_b = w_b·ΦᵀR_b, so Φᵀ Φ is formed once per distinct Φ and the
    members' R_b are its right-hand-side columns — O(N·F² + N·F·t·b) instead of b·O(N·F²); the gradient reaches Φ
    through :func:`~rfgp.core.batch_copies.narrow_broadcast`.  A GPyTorch ``ExactGP``
    whose targets (and mean) have a batch of their own over an unbatched kernel (T targets of one kernel, as
    ``rfgp.models.GPRegressor`` fits them) has that covariance: the likelihood's noise expands Φ to the targets'
    batch."""
    distinct = narrow_broadcast(features, features.dim() - 2).squeeze(copies)  # the dimensions ``copies``
    lead = rhs.dim() - len(copies)
    columns = rhs.movedim(copies, tuple(range(lead, rhs.dim()))).flatten(lead - 1)  # (..., N, t·b)
    ones = weights.new_ones(()).expand(*distinct.shape[:-2], 1)
    gram, cross = _FeatureStatistics.apply(distinct, ones, columns, dtype)
    for dim in copies:
        gram = gram.unsqueeze(dim)
    cross = cross.unflatten(-1, (rhs.shape[-1], *(rhs.shape[dim] for dim in copies)))
    cross = cross.movedim(tuple(range(cross.dim() - len(copies), cross.dim())), copies)
    w = weights.unsqueeze(-1)
    return gram * w, cross * w


def fold_constant(constant: Tensor | float | None, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """Weights and right-hand side for Φ₀ such that the statistics are those of Φ = c·Φ₀.

    (cΦ₀)ᵀW(cΦ₀) = Φ₀ᵀ(c²W)Φ₀ and (cΦ₀)ᵀWR = Φ₀ᵀ(c²W)(R/c), so a constant (``ScaleKernel``'s
    √outputscale, batch-shaped or scalar) costs no N × F pass.
    """
    if constant is None:
        return weights, rhs
    if torch.is_tensor(constant):
        constant = constant.unsqueeze(-1)  # batch-shaped c against (..., N) weights
        return weights * constant.pow(2), rhs / constant.unsqueeze(-1)
    return weights * constant**2, rhs / constant


def weighted_gram(features: Tensor, weights: Tensor) -> Tensor:
    """ΦᵀWΦ for Φ of shape ``(..., N, F)`` and diagonal weights ``(..., N)`` or uniform ``(..., 1)``."""
    return feature_statistics(features, weights, features.new_zeros(*features.shape[:-1], 0))[0]


def rows_times_inverse_cholesky_transpose(rows: Tensor, chol: Tensor) -> Tensor:
    """X·L⁻ᵀ for rows X ``(*lead, *batch, n, F)`` and a lower Cholesky factor L ``(*batch, F, F)``.

    ``torch.linalg.solve_triangular`` broadcasts L over the batch dimensions that only X has: one copy of the
    F × F factor and one single-column solve per member — a t-batch of b candidate sets at the posterior's
    L_A (BoTorch's acquisition optimisation, 8 restarts × q = 1 points, N = 3000, F = 1024) spent 0.31 s per
    evaluation there, more than the rest of the posterior.  The same solve with those dimensions folded into
    the n rows is one triangular solve with b·n right-hand sides, without the copies.
    """
    return _folded_rows(rows, chol, lambda columns: torch.linalg.solve_triangular(chol, columns, upper=False))


def rows_times_inverse_capacitance(rows: Tensor, chol: Tensor) -> Tensor:
    """X·A⁻¹ = (X·L⁻ᵀ)·L⁻¹ for rows X ``(*lead, *batch, n, F)`` and A = LLᵀ, L ``(*batch, F, F)`` lower: two
    triangular solves with the n rows as right-hand sides (2·n·F² flops), batch dimensions folded into the rows as in
    :func:`rows_times_inverse_cholesky_transpose`."""
    return _folded_rows(rows, chol, lambda columns: cholesky_solve(columns, chol))


def _folded_rows(rows: Tensor, chol: Tensor, solve) -> Tensor:
    """``solve(Xᵀ)ᵀ`` for rows X ``(*lead, *batch, n, F)``, ``solve`` taking columns ``(*batch, F, k)`` against the
    factor ``chol`` ``(*batch, F, F)``, with X's leading dimensions folded into its rows (one solve of b·n columns)."""
    lead = rows.dim() - chol.dim()
    if lead <= 0:
        return solve(rows.mT).mT
    batch = torch.broadcast_shapes(rows.shape[lead:-2], chol.shape[:-2])
    rows = rows.expand(*rows.shape[:lead], *batch, *rows.shape[-2:])
    lead_dims, moved = tuple(range(lead)), tuple(range(len(batch), len(batch) + lead))
    folded = rows.movedim(lead_dims, moved).reshape(*batch, -1, rows.shape[-1])
    solved = solve(folded.mT).mT
    return solved.reshape(*batch, *rows.shape[:lead], *rows.shape[-2:]).movedim(moved, lead_dims)


class CapacitanceFactor(NamedTuple):
    """L = chol(A), A = I + ΦᵀD⁻¹Φ (F × F, paper 000 §5.6): the feature-space counterpart of
    :class:`~rfgp.inference.kernel_space.KernelSpaceFactor`, whose root L⁻ᵀ of A⁻¹ = L⁻ᵀL⁻¹ gives the posterior
    covariance Φ*A⁻¹Φ*ᵀ at test features Φ* the n × F root Φ*L⁻ᵀ."""

    cholesky: Tensor  #: L ``(..., F, F)``, lower triangular

    def posterior_root(self, features: Tensor) -> Tensor:
        """Φ*L⁻ᵀ ``(..., n, F)`` for test features Φ* ``(..., n, F)``, in n·F² flops."""
        return rows_times_inverse_cholesky_transpose(features, self.cholesky)

    def rows_times_weight_covariance(self, features: Tensor) -> Tensor:
        """Φ_rA⁻¹ = (Φ_rL⁻ᵀ)L⁻¹ ``(..., r, F)`` for feature rows Φ_r ``(..., r, F)``, in 2·r·F² flops: a covariance
        block Φ_rA⁻¹Φ*ᵀ then costs 2·r·F² + r·n·F instead of the n × F root's n·F²."""
        return rows_times_inverse_capacitance(features, self.cholesky)


def _capacitance_terms(gram: Tensor, cross: Tensor, noise: Tensor | None) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(BᵀA⁻¹B per column, log|A|, L, L⁻¹B) for A = I + ``gram`` = LLᵀ and B = ``cross``, in :func:`factor_dtype`."""
    chol = capacitance_cholesky(gram, noise)
    projected = torch.linalg.solve_triangular(chol, cross.to(chol.dtype), upper=False)
    return projected.pow(2).sum(-2), 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1), chol, projected


class _CapacitanceInvQuadLogdet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, gram: Tensor, cross: Tensor, noise: Tensor | None, logdet: bool):
        quad, logdet_term, chol, projected = _capacitance_terms(gram, cross, noise)
        ctx.logdet = logdet
        ctx.save_for_backward(gram, cross, chol, projected)
        return quad, logdet_term

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_quad: Tensor, grad_logdet: Tensor):
        gram, cross, chol, projected = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: plain autograd through the same terms, differentiable again
            return (*differentiable_backward(lambda: _capacitance_terms(gram, cross, None)[:2], (gram, cross),
                                             ctx.needs_input_grad[:2], (grad_quad, grad_logdet)), None, None)
        # α = A⁻¹B; ∂/∂A of ḡ_l·log|A| + ḡ_q·BᵀA⁻¹B is S = ḡ_l A⁻¹ − α diag(ḡ_q) αᵀ, ∂B = 2α diag(ḡ_q)
        solve = torch.linalg.solve_triangular(chol.mT, projected, upper=True)
        weighted = solve * grad_quad.unsqueeze(-2)
        grad_gram = grad_cross = None
        if ctx.needs_input_grad[0]:
            grad_gram = -(weighted @ solve.mT)
            if ctx.logdet:
                grad_gram = grad_gram + torch.cholesky_inverse(chol) * grad_logdet.unsqueeze(-1).unsqueeze(-1)
            grad_gram = _sum_to_shape(grad_gram, gram.shape).to(gram.dtype)
        if ctx.needs_input_grad[1]:
            grad_cross = _sum_to_shape(2.0 * weighted, cross.shape).to(cross.dtype)
        return grad_gram, grad_cross, None, None


def capacitance_inv_quad_logdet(gram: Tensor, cross: Tensor, logdet: bool,
                                noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(BᵀA⁻¹B per column ``(..., t)``, log|A| ``(...)``) for the capacitance A = I + ``gram`` and B = ``cross``
    ``(..., F, t)``, in :func:`factor_dtype` (float64 for float32 statistics; the outputs stay there, so that the
    caller's differences rᵀD⁻¹r − BᵀA⁻¹B, which cancel at a high signal-to-noise ratio, are taken in it too).

    The factorisation is :func:`capacitance_cholesky`'s.  The backward pass is the closed form
    ∂A = ḡ_l A⁻¹ − α diag(ḡ_q) αᵀ, ∂B = 2α diag(ḡ_q) with α = A⁻¹B (A⁻¹ from the factor, LAPACK potri): at
    F = 2048 on one CPU thread, 0.5 s in float64 against 0.9 s for float32 autograd through the Cholesky
    factorisation (1.9 s in float64), so the widened factorisation costs nothing per iteration.  ``logdet``:
    whether log|A| is used (its A⁻¹ is skipped otherwise).  ``noise`` (optional) is named in the error message.
    """
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same terms, plainly
        return _capacitance_terms(gram, cross, noise)[:2]
    return _CapacitanceInvQuadLogdet.apply(gram, cross, noise, logdet)


def woodbury_inv_quad_logdet(gram: Tensor, cross: Tensor, weighted_square: Tensor | None, noise_logdet: Tensor | None,
                             logdet: bool, noise: Tensor | None = None,
                             dtype: torch.dtype | None = None) -> tuple[Tensor | None, Tensor | None]:
    """(rᵀ(ΦΦᵀ + D)⁻¹r per column, log|ΦΦᵀ + D|) from the F × F statistics ΦᵀD⁻¹Φ = ``gram``, B = ΦᵀD⁻¹r =
    ``cross``, rᵀD⁻¹r = ``weighted_square`` and log|D| = ``noise_logdet``.

    Woodbury and the determinant lemma with A = I + ΦᵀD⁻¹Φ = LLᵀ: rᵀD⁻¹r − ‖L⁻¹B‖² (``None`` for
    ``weighted_square=None``, no right-hand side) and 2Σ log Lᵢᵢ + log|D| (``None`` unless ``logdet``;
    ``noise_logdet`` is read only then).  The capacitance terms (:func:`capacitance_inv_quad_logdet`, forward and
    backward) and the sums with them — rᵀD⁻¹r − ‖L⁻¹B‖² cancels at a high signal-to-noise ratio — are taken in
    :func:`factor_dtype` and rounded back to ``dtype`` (default ``gram``'s; the model's where float32 features formed
    float64 statistics, :mod:`rfgp.inference.statistics_precision`).  ``noise`` (optional) is named in the error
    message.
    """
    quad, capacitance_logdet = capacitance_inv_quad_logdet(gram, cross, logdet, noise)
    work, dtype = quad.dtype, gram.dtype if dtype is None else dtype
    inv_quad = None if weighted_square is None else (weighted_square.to(work) - quad).to(dtype)
    logdet_term = (capacitance_logdet + noise_logdet.to(work)).to(dtype) if logdet else None
    return inv_quad, logdet_term
