"""Feature statistics over data chunks with per-chunk recomputation in the backward pass.

A random-feature GP sees its N training points only through sums over points,

    G = ΦᵀWΦ  (F × F),   B = ΦᵀWR  (F × t),        W = D⁻¹ diagonal,

so they can be accumulated over row chunks of x with O(chunk·F + F²) memory.  The
gradient needs ∂G and ∂B with respect to Φ, which again decompose over chunks: with
Ḡ, B̄ the incoming gradients and S = ½(Ḡ + Ḡᵀ),

    ∂Φ_c = 2 W_c Φ_c S + W_c R_c B̄ᵀ,   ∂w_c = rowsum(Φ_c ⊙ Φ_c S) + rowsum(R_c ⊙ Φ_c B̄),
    ∂R_c = W_c Φ_c B̄,

so the backward pass recomputes Φ_c = φ(x_c) under autograd one chunk at a time and
backpropagates ∂Φ_c into the kernel hyperparameters (gradient checkpointing per chunk).
Forward and backward use the per-chunk kernels of :mod:`rfgp.inference.linalg` (symmetric Gram,
one N·F² product backward, no N × F pass for uniform weights), the same cost as the
unchunked path; only the features are computed twice.  Second derivatives
(``create_graph=True``) recompute the statistics of all chunks under autograd instead
(:func:`rfgp.inference.linalg.differentiable_backward`), so they need O(N·F) memory.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from ..core.dtypes import factor_dtype, refuse_autocast_backward
from ..core.memory import check_solve, warn_statistics_over_budget
from ..core.settings import memory_budget
from . import distributed
from .linalg import (
    _is_uniform,
    _sum_to_shape,
    differentiable_backward,
    fold_constant,
    gram_gradient,
    plain_statistics,
    statistics_backward,
    uniform_weight_grad,
    unit_statistics,
    weighted_statistics,
)
from .statistics_precision import statistics_dtype


def scaled_features(x: Tensor, function: Callable[[Tensor], Tensor], constant: Tensor | float | None,
                    amplitude_function: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
    """c·Φ₀(x) for Φ₀ = ``function`` and a positive constant c (``None`` for 1, a number or a batch-shaped tensor):
    ``amplitude_function(x, 2 log c)`` where one is given and c is a tensor — the amplitude c² folded into the
    features' own evaluation (:meth:`rfgp.kernels.FeatureKernel.amplitude_features`) —, Φ₀(x)·c otherwise."""
    if constant is None:
        return function(x)
    if amplitude_function is not None and torch.is_tensor(constant):
        return amplitude_function(x, 2.0 * constant.log())
    features = function(x)
    return features * (constant.unsqueeze(-1).unsqueeze(-1) if torch.is_tensor(constant) else constant)


class Featurizer:
    """x ↦ Φ(x) = c·Φ₀(x), a function of explicit differentiable tensors, so that it can be recomputed per chunk.

    Args:
        function: maps rows ``(..., c, d)`` to features Φ₀ ``(*batch_shape, c, F)``.
        params: every tensor through which gradients must flow (kernel parameters,
            output scales); the function may use them only through closure.
        num_features: F.
        batch_shape: batch shape of the features.
        constant: optional positive constant c (a number or a batch-shaped tensor, one of
            ``params`` if it needs gradients) kept apart from Φ₀ so that the feature
            statistics can fold it into their weights instead of scaling every chunk.
        amplitude_function: optional (x, log A) ↦ √A·Φ₀(x) for a batch-shaped log A, the amplitude folded into the
            features' own evaluation (:meth:`rfgp.kernels.FeatureKernel.amplitude_features`); where given, a tensor
            ``constant`` c is passed to it as log A = 2 log c rather than multiplied into Φ₀ afterwards, a pass over
            the features each way and a product the size of Φ for c's gradient saved.
    """

    def __init__(self, function: Callable[[Tensor], Tensor], params: Sequence[Tensor], num_features: int,
                 batch_shape: torch.Size, constant: Tensor | float | None = None,
                 amplitude_function: Callable[[Tensor, Tensor], Tensor] | None = None) -> None:
        self.function = function
        self.amplitude_function = amplitude_function
        self.params = tuple(params)
        self.num_features = num_features
        self.batch_shape = torch.Size(batch_shape)
        self.constant = constant
        #: the tensors of ``params`` that enter only through ``constant`` (the √outputscales of :meth:`scaled`)
        self.constant_params: tuple[Tensor, ...] = ()

    def __call__(self, x: Tensor) -> Tensor:
        return scaled_features(x, self.function, self.constant, self.amplitude_function)

    def scaled(self, scale: Tensor | float) -> Featurizer:
        """The features of σ²k: √σ² Φ (``scale`` a positive number or a batch-shaped tensor)."""
        root = scale.sqrt() if torch.is_tensor(scale) else scale**0.5
        scaled = copy.copy(self)  # a subclass keeps its structure (TriangularFeaturizer: K and L)
        scaled.constant = root if self.constant is None else self.constant * root
        scaled.params = (*self.params, root) if torch.is_tensor(root) else self.params
        if torch.is_tensor(root):
            scaled.constant_params = (*self.constant_params, root)
            scaled.batch_shape = torch.broadcast_shapes(self.batch_shape, root.shape)
        return scaled

    def unscaled(self) -> Featurizer:
        """Φ₀ = Φ/c as a featurizer of the tensors its function uses: without the constant and the tensors that only
        enter through it, which reach the statistics through :func:`~rfgp.inference.linalg.fold_constant`'s weights
        instead (kept as inputs too, a create_graph backward would count their derivative twice)."""
        unscaled = copy.copy(self)
        unscaled.constant, unscaled.constant_params = None, ()
        unscaled.params = tuple(p for p in self.params if all(p is not q for q in self.constant_params))
        return unscaled

    def detach(self) -> Featurizer:
        """These features without a graph, as ``LinearOperator.detach`` leaves an operator's tensors (it calls this on
        a chunked operator's featurizer): the function reads the live kernel, so the copy evaluates it under
        ``torch.no_grad()``, with its ``params`` and ``constant`` detached — the same values, no gradient to the
        kernel's parameters, none kept for them."""
        return copy.copy(self).detach_()

    def detach_(self) -> Featurizer:
        """:meth:`detach` in place (``LinearOperator.detach_``)."""
        detached = {id(p): p.detach() for p in self.params}
        self.params = tuple(detached[id(p)] for p in self.params)
        self.constant_params = tuple(detached.get(id(p), p.detach()) for p in self.constant_params)
        if torch.is_tensor(self.constant):
            self.constant = self.constant.detach()
        self.function = without_graph(self.function)
        if self.amplitude_function is not None:
            self.amplitude_function = without_graph(self.amplitude_function)
        return self

    def concatenated(self, other: Featurizer) -> Featurizer:
        """The features of k₁ + k₂: [Φ₁, Φ₂]."""
        batch = torch.broadcast_shapes(self.batch_shape, other.batch_shape)

        def function(x: Tensor) -> Tensor:
            left, right = self(x), other(x)
            return torch.cat((left.expand(*batch, *left.shape[-2:]), right.expand(*batch, *right.shape[-2:])), -1)

        params = self.params + tuple(p for p in other.params if all(p is not q for q in self.params))
        return Featurizer(function, params, self.num_features + other.num_features, batch)


def without_graph(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
    """``function`` evaluated under ``torch.no_grad()``."""
    def detached(*args: Tensor) -> Tensor:
        with torch.no_grad():
            return function(*args)

    return detached


def chunk_slices(num_rows: int, chunk_size: int):
    """Slices of ``chunk_size`` rows covering ``num_rows``; one empty slice for no rows, so that the sums and
    concatenations over chunks have a term (a cross-covariance with an empty side is an empty matrix)."""
    if num_rows == 0:
        return iter((slice(0, 0),))
    return (slice(start, min(start + chunk_size, num_rows)) for start in range(0, num_rows, chunk_size))


def output_rows(points: slice, outputs: int) -> slice:
    """The rows of a block of input points in a root with ``outputs`` interleaved rows per point (row i·p + t =
    output t of point i: multi-output kernels, GPyTorch's multitask order); the block itself for one output."""
    return points if outputs == 1 else slice(points.start * outputs, points.stop * outputs)


def row_points(rows, num_rows: int, outputs: int) -> slice | None:
    """The inverse of :func:`output_rows`: the points whose rows ``rows`` (an index of ``num_rows`` interleaved rows)
    are, all ``outputs`` rows of each point (a slice of step 1 from and to point boundaries); ``None`` for any other
    index."""
    if not isinstance(rows, slice):
        return None
    start, stop, step = rows.indices(num_rows)
    if step != 1 or start % outputs or stop % outputs or stop < start:
        return None
    return slice(start // outputs, stop // outputs)


def backprop_chunks(
    featurizer: Featurizer,
    inputs: Tensor,
    chunk_size: int,
    chunk_grad: Callable[[Tensor, slice], Tensor],
    input_needs_grad: bool,
    params_need_grad: Sequence[bool],
    outputs: int = 1,
) -> tuple[Tensor | None, list[Tensor | None]]:
    """Σ over chunks of the vector-Jacobian product ⟨chunk_grad(Φ_c, rows), ∂Φ_c⟩ w.r.t. x and the params.

    ``chunk_grad(features, rows)`` receives the detached Φ_c and the slice of its rows in Φ (``outputs`` rows per
    input point, :func:`output_rows`) and returns ∂loss/∂Φ_c.
    """
    wanted = [p for p, needed in zip(featurizer.params, params_need_grad) if needed]
    param_grads = [None] * len(wanted)
    input_grad = torch.zeros_like(inputs) if input_needs_grad else None
    for points in chunk_slices(inputs.shape[-2], chunk_size):
        chunk = inputs[..., points, :].detach().requires_grad_(input_needs_grad)
        with torch.enable_grad():
            features = featurizer(chunk)
        grad_features = _sum_to_shape(chunk_grad(features.detach(), output_rows(points, outputs)), features.shape)
        targets = ([chunk] if input_needs_grad else []) + wanted
        if not targets:
            continue
        grads = torch.autograd.grad(features, targets, grad_features, allow_unused=True)
        if input_needs_grad:
            input_grad[..., points, :] = grads[0]
            grads = grads[1:]
        param_grads = [_add(total, g) for total, g in zip(param_grads, grads)]
    it = iter(param_grads)
    all_param_grads = [next(it) if needed else None for needed in params_need_grad]
    return input_grad, all_param_grads


def _add(total: Tensor | None, value: Tensor | None) -> Tensor | None:
    if value is None:
        return total
    return value if total is None else total + value


def accumulated_statistics(featurize: Callable[[Tensor], Tensor], inputs: Tensor, weights: Tensor, rhs: Tensor,
                           chunk_size: int, outputs: int = 1) -> tuple[Tensor, Tensor]:
    """Σ over chunks of rows of (Φ_cᵀW_cΦ_c, Φ_cᵀW_cR_c), Φ_c = featurize(x_c), without a graph; for uniform
    weights ``(..., 1)`` the unit statistics (Φᵀ Φ, ΦᵀR), which the weight scales afterwards.  ``chunk_size``
    counts input points, each with ``outputs`` rows of Φ, W and R (:func:`output_rows`).

    Each chunk's products are formed in Φ_c's dtype and the chunks' sums added in
    :func:`~rfgp.core.dtypes.factor_dtype` (float64 for float32 features), rounded back once: as the unchunked
    statistics accumulate ΦᵀWR (:func:`~rfgp.inference.linalg.accumulated_project`) and as a BLAS product blocks
    its N-term sums.  Adding the chunks in float32 made them N/chunk-term float32 sums: a float32 RFF model
    (N = 2·10⁴, noise 10⁻² of the outputscale, targets ≈ 10³) was 159 per point off its marginal likelihood and
    its gradient 104 % off at one point per chunk (25 per point and 9.6 % at seven), against 1.1 and 1.3 %
    unchunked."""
    uniform = _is_uniform(weights)
    gram = cross = None
    for points in chunk_slices(inputs.shape[-2], chunk_size):
        rows = output_rows(points, outputs)
        features, chunk_rhs = featurize(inputs[..., points, :]), rhs[..., rows, :]
        if uniform:
            chunk_gram, chunk_cross = unit_statistics(features, chunk_rhs)
        else:
            chunk_gram, chunk_cross = weighted_statistics(features, weights[..., rows], chunk_rhs)
        wide = factor_dtype(chunk_gram.dtype, chunk_gram.device)
        gram, cross = _add(gram, chunk_gram.to(wide)), _add(cross, chunk_cross.to(wide))
    return gram.to(chunk_gram.dtype), cross.to(chunk_gram.dtype)


def chunked_statistics_forward(featurize: Callable[[Tensor, torch.dtype | None], Tensor], inputs: Tensor,
                               weights: Tensor, rhs: Tensor, constant: Tensor | float | None, chunk_size: int,
                               outputs: int = 1, adaptive: bool = False, trace_scale: Tensor | float = 1.0,
                               model_dtype: torch.dtype | None = None):
    """The forward of the chunked statistics Functions, and all of it under ``torch.jit.trace`` (which cannot export a
    Python autograd.Function, and then records the precision chosen for the traced inputs).

    :func:`accumulated_statistics` of Φ₀ = ``featurize(x, None)`` with c folded into W and R (:func:`fold_constant`);
    where ``adaptive`` and their float32 rounding is not negligible (:func:`accumulated_statistics_dtype`) again from
    ``featurize(x, work)`` (Φ₀ formed in, or cast to, ``work``), c folded in ``work`` (:func:`folded_in`).  Returns
    (ΦᵀWΦ, ΦᵀWR, the unit statistics for uniform weights ``(..., 1)`` or ``()``, the fold dtype: ``None`` for the
    tensors' own).  ``model_dtype``: the statistics' dtype without adaptive precision, where W and R come wider (cast
    once by the caller, :func:`~rfgp.inference.operators.adaptive_feature_statistics`): the first pass folds them in
    it."""
    fold_dtype = model_dtype
    folded_weights, folded_rhs = folded_in(constant, weights, rhs, fold_dtype)
    gram, cross = accumulated_statistics(lambda x: featurize(x, None), inputs, folded_weights, folded_rhs, chunk_size,
                                         outputs)
    work = accumulated_statistics_dtype(gram, folded_weights, trace_scale) if adaptive else gram.dtype
    if work != gram.dtype:  # float32 rounding not negligible: again from Φ₀_c in float64, c folded so
        fold_dtype = work
        folded_weights, folded_rhs = folded_in(constant, weights, rhs, work)
        gram, cross = accumulated_statistics(lambda x: featurize(x, work), inputs, folded_weights, folded_rhs,
                                             chunk_size, outputs)
    if not _is_uniform(weights):
        return gram, cross, (), fold_dtype
    w = folded_weights.unsqueeze(-1).to(gram.dtype)
    return gram * w, cross * w, (gram, cross), fold_dtype


def gathered_row_grads(unit: Sequence[Tensor], weights: Tensor, rhs: Tensor, weight_grads: list, rhs_grads: list,
                       grad_gram: Tensor, grad_cross: Tensor, need_weights: bool,
                       need_rhs: bool) -> tuple[Tensor | None, Tensor | None]:
    """(w̄, R̄) of chunked statistics from the chunks' per-row gradients; uniform weights (``unit`` holds the unit
    statistics) take w̄ from :func:`~rfgp.inference.linalg.uniform_weight_grad` instead."""
    grad_weights = grad_rhs = None
    if need_weights:
        grad_weights = uniform_weight_grad(*unit, grad_gram, grad_cross) if unit else torch.cat(weight_grads, -1)
        grad_weights = _sum_to_shape(grad_weights, weights.shape)
    if need_rhs:
        grad_rhs = _sum_to_shape(torch.cat(rhs_grads, -2), rhs.shape)
    return grad_weights, grad_rhs


def accumulated_statistics_dtype(gram: Tensor, weights: Tensor, trace_scale: Tensor | float = 1.0) -> torch.dtype:
    """The dtype to form chunked statistics in (:func:`~rfgp.inference.statistics_precision.statistics_dtype`),
    decided from tr(G) of ``gram`` as accumulated in the features' dtype — exact to its rounding — summed over
    processes: a benign model pays no extra pass.  ``gram``: ΦᵀWΦ, or ΦᵀΦ for uniform weights ``(..., 1)``;
    ``trace_scale`` multiplies tr(G) where the statistics enter a wider product (‖B̃‖_F² for the data Gram of a
    Kronecker root φ ⊗ B, :mod:`rfgp.inference.kronecker_statistics`)."""
    def trace() -> Tensor:
        unit = gram.detach().diagonal(dim1=-2, dim2=-1).sum(-1)
        return distributed.reduce_statistics(unit * weights[..., 0] if _is_uniform(weights) else unit)[0] * trace_scale

    return statistics_dtype(torch.promote_types(gram.dtype, weights.dtype), gram.device, trace)


def folded_in(constant: Tensor | float | None, weights: Tensor, rhs: Tensor,
              dtype: torch.dtype | None) -> tuple[Tensor, Tensor]:
    """:func:`~rfgp.inference.linalg.fold_constant` (c²W, R/c) formed in ``dtype`` (``None``: the tensors' own).

    Chunked statistics formed in float64 for float32 features fold c in float64 too, forward and backward: c²W and
    R/c rounded to float32 scale B = Φ₀ᵀ(c²W)(R/c) by up to 2u, which rᵀD⁻¹r − ‖L⁻¹B‖² amplifies at a high
    signal-to-noise ratio (N = 3 000, outputscale 0.69, noise 10⁻⁴, y ≈ 5: 17 of 3 412 in rᵀ(K + D)⁻¹r).
    """
    if dtype is not None:
        constant = constant.to(dtype) if torch.is_tensor(constant) else constant
        weights, rhs = weights.to(dtype), rhs.to(dtype)
    return fold_constant(constant, weights, rhs)


def fold_backward(constant: Tensor | float | None, weights: Tensor, rhs: Tensor, dtype: torch.dtype | None,
                  grad_weights: Tensor | None, grad_rhs: Tensor | None,
                  needs: Sequence[bool]) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """(W̄, R̄, c̄) from the gradients of the folded c²W and R/c (:func:`folded_in`, chained in ``dtype`` as formed),
    each in its tensor's dtype; ``needs`` says which of W, R, c want one (none: no work)."""
    if not any(needs):
        return None, None, None
    leaves = [t.detach().requires_grad_() if need else t for t, need in zip((weights, rhs, constant), needs)]
    with torch.enable_grad():
        folded = folded_in(leaves[2], leaves[0], leaves[1], dtype)
    pairs = [(out, grad) for out, grad in zip(folded, (grad_weights, grad_rhs)) if grad is not None]
    wanted = [leaf for leaf, need in zip(leaves, needs) if need]
    found = iter(torch.autograd.grad([out for out, _ in pairs], wanted, [grad for _, grad in pairs],
                                     allow_unused=True))
    grads = [next(found) if need else None for need in needs]
    return tuple(None if g is None else g.to(t.dtype) for g, t in zip(grads, (weights, rhs, constant)))


def _cast_features(featurizer: Callable[[Tensor], Tensor]) -> Callable[[Tensor, torch.dtype | None], Tensor]:
    """x, dtype ↦ featurizer(x) cast to dtype (``None``: as it is), for :func:`chunked_statistics_forward`."""
    return lambda x, dtype: featurizer(x) if dtype is None else featurizer(x).to(dtype)


class _ChunkedStatistics(torch.autograd.Function):
    """(ΦᵀWΦ, ΦᵀWR) for Φ = c·Φ₀, of Φ₀ = ``featurizer`` and the unfolded W, R and c: c is folded
    (:func:`folded_in`) in the statistics' precision, forward and backward, so that value and gradient agree."""

    @staticmethod
    def forward(ctx, featurizer, blocks, inputs, weights, rhs, constant, *params):
        # points per chunk, rows of Φ per point, adaptive precision, its trace's scale, the model's dtype
        chunk_size, outputs, adaptive, trace_scale, model_dtype = blocks
        gram, cross, unit, fold_dtype = chunked_statistics_forward(
            _cast_features(featurizer), inputs, weights, rhs, constant, chunk_size, outputs, adaptive, trace_scale,
            model_dtype)
        ctx.featurizer, ctx.chunk_size, ctx.outputs, ctx.work = featurizer, chunk_size, outputs, gram.dtype
        ctx.fold_dtype, ctx.constant = fold_dtype, None if torch.is_tensor(constant) else constant
        # the unit statistics Φ₀ᵀΦ₀, Φ₀ᵀR of uniform weights give ∂w as an F × F contraction
        ctx.save_for_backward(inputs, weights, rhs, constant if torch.is_tensor(constant) else None, *unit)
        return gram, cross

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_gram, grad_cross):
        inputs, weights, rhs, constant, *unit = ctx.saved_tensors
        constant = ctx.constant if constant is None else constant
        needs, work, fold_dtype = ctx.needs_input_grad, ctx.work, ctx.fold_dtype  # work: float64 where widened
        if torch.is_grad_enabled():  # create_graph=True: second derivatives, features of all chunks at once
            params = ctx.featurizer.params
            grads = differentiable_backward(
                lambda: plain_statistics(ctx.featurizer(inputs).to(work),
                                         *(t.to(work) for t in folded_in(constant, weights, rhs, fold_dtype))),
                (inputs, weights, rhs, constant, *params), needs[2:], (grad_gram, grad_cross),
            )
            return (None, None, *grads)
        need_fold = (needs[3], needs[4], needs[5])
        with torch.no_grad():
            folded_weights, folded_rhs = folded_in(constant, weights, rhs, fold_dtype)
        uniform = _is_uniform(weights)
        weight_grads, rhs_grads = [], []
        need_folded_weights, need_folded_rhs = needs[3] or needs[5], needs[4] or needs[5]
        factor = gram_gradient(grad_gram, folded_weights.to(work))  # once, not per chunk: (*batch, F, F) work

        def chunk_grad(features: Tensor, rows: slice) -> Tensor:
            chunk_weights = folded_weights if uniform else folded_weights[..., rows]
            grad_features, grad_weights, grad_rhs = statistics_backward(
                features.to(work), chunk_weights.to(work), folded_rhs[..., rows, :].to(work), grad_gram, grad_cross,
                (True, need_folded_weights, need_folded_rhs), factor, uniform,
            )
            weight_grads.append(grad_weights)
            rhs_grads.append(grad_rhs)
            return grad_features.to(features.dtype)

        input_grad, param_grads = backprop_chunks(
            ctx.featurizer, inputs, ctx.chunk_size, chunk_grad, needs[2], needs[6:], ctx.outputs
        )
        grad_weights, grad_rhs = gathered_row_grads(unit, folded_weights, folded_rhs, weight_grads, rhs_grads,
                                                    grad_gram, grad_cross, need_folded_weights, need_folded_rhs)
        fold_grads = fold_backward(constant, weights, rhs, fold_dtype, grad_weights, grad_rhs, need_fold)
        return (None, None, input_grad, *fold_grads, *param_grads)


def check_chunked_solve(featurizer: Featurizer, inputs: Tensor, weights: Tensor, outputs: int = 1) -> None:
    """Refuse, naming the budget, chunked F × F statistics (and the capacitance solve they are for) that cannot fit.

    Checked where the statistics are accumulated — a marginal likelihood or posterior caches — not where a chunked
    covariance is built: a prior covariance, its products and samples need no F × F matrix (N = 1000 points at
    F = 65 536 raised this error for ``kernel(x)`` before).  With N < F the unchunked N × N kernel-space path would
    need only N × N, but Φ whole, hence the advice.  Statistics that fit the device but not
    :class:`rfgp.settings.memory_budget` get a :class:`~rfgp.core.memory.MemoryBudgetWarning`
    (:func:`~rfgp.core.memory.warn_statistics_over_budget`; with a gradient where one is being recorded).
    """
    num_rows, num_features = inputs.shape[-2] * outputs, featurizer.num_features
    batch = torch.broadcast_shapes(featurizer.batch_shape, inputs.shape[:-2], weights.shape[:-1]).numel()
    advice = None
    if num_rows < num_features:
        advice = (f"with N < F the N × N kernel-space path needs Φ whole: raise rfgp.settings.memory_budget above "
                  f"{memory_budget.value()} bytes, or reduce num_features")
    check_solve(num_rows, num_features, batch, inputs.dtype, inputs.device, size=num_features, advice=advice)
    gradient = torch.is_grad_enabled() and any(t.requires_grad for t in (inputs, weights, *featurizer.params))
    warn_statistics_over_budget(batch, num_features, inputs.dtype, inputs.device, gradient)


def chunked_feature_statistics(
    featurizer: Featurizer, inputs: Tensor, weights: Tensor, rhs: Tensor, chunk_size: int, outputs: int = 1,
    adaptive_precision: bool = False, trace_scale: Tensor | float = 1.0, model_dtype: torch.dtype | None = None,
) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for Φ = featurizer(inputs), accumulated over ``chunk_size`` input points at a time.

    Args:
        featurizer: the feature function and its differentiable tensors.
        inputs: x of shape ``(..., N, d)``.
        weights: diagonal of W, ``(..., N·p)``, or uniform ``(..., 1)``.
        rhs: R of shape ``(..., N·p, t)``.
        chunk_size: input points per chunk.
        outputs: p, the rows of Φ per input point (a multi-output root's interleaved rows, :func:`output_rows`).
        adaptive_precision: float32 features' statistics are recomputed in float64 (and returned so, gradients in
            the inputs' dtypes) where their float32 rounding, u·tr(G) of the float32 result, exceeds
            :class:`rfgp.settings.float32_statistics_tolerance` (:mod:`rfgp.inference.statistics_precision`): a
            second forward pass at a high signal-to-noise ratio, none otherwise.  The featurizer's constant c is
            folded into W and R (:func:`folded_in`) in that precision, forward and backward.
        trace_scale: a factor (no gradient) on that estimate's tr(G), where G enters a wider product: ‖B̃‖_F² for
            the data Gram of a Kronecker root (:mod:`rfgp.inference.kronecker_statistics`).
        model_dtype: the statistics' dtype without adaptive precision where ``weights`` and ``rhs`` come already
            widened to float64 (default ``None``: theirs), so that every use the caller makes of them accumulates its
            gradient in float64 before one rounding (:func:`~rfgp.inference.operators.adaptive_feature_statistics`).
    """
    check_chunked_solve(featurizer, inputs, weights, outputs)
    unscaled = featurizer.unscaled()
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same forward, plainly
        return chunked_statistics_forward(_cast_features(unscaled), inputs, weights, rhs, featurizer.constant,
                                          chunk_size, outputs, adaptive_precision, trace_scale, model_dtype)[:2]
    blocks = (chunk_size, outputs, adaptive_precision, trace_scale, model_dtype)
    return _ChunkedStatistics.apply(unscaled, blocks, inputs, weights, rhs, featurizer.constant, *unscaled.params)
