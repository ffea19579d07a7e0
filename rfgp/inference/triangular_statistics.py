r"""Feature statistics of Φ = K·L⁻ᵀ (Nyström features) with a backward pass fused through the triangular solve.

Nyström features are Φ = K L⁻ᵀ with K = K(X, Z) (N × M) and L the lower Cholesky factor of the
landmark Gram matrix (M × M).  Autograd through Φ = solve(L, Kᵀ)ᵀ followed by the statistics
G = ΦᵀWΦ and H = ΦᵀWR (:mod:`rfgp.inference.linalg`) costs ≈ 7.25·N·M² flops per gradient: the
triangular solve (N·M²), the symmetric Gram matrix (≈ 1.25·N·M² in blocks), Φ̄ = W(2ΦS + RH̄ᵀ)
(2·N·M², S = ½(Ḡ + Ḡᵀ)), the solve's backward K̄ = Φ̄L⁻¹ (N·M²) and the factor's cotangent
L̄ = −tril(L⁻ᵀΦ̄ᵀΦ) (2·N·M²).  Both cotangents have forms with one N·M² product in all:

    K̄ = Φ̄L⁻¹ = W(2Φ(SL⁻¹) + R(L⁻ᵀH̄)ᵀ),      L̄ = −tril(L⁻ᵀ(2SG + H̄Hᵀ)),

since Φ̄ᵀΦ = (2SΦᵀ + H̄Rᵀ)WΦ is made of the forward outputs: ≈ 4.25·N·M² per gradient (the
forward solve, the Gram matrix, one backward product).  R̄ = WΦH̄; uniform weights ``(..., 1)`` take
w̄ from the unit statistics as in :mod:`rfgp.inference.linalg`.  Per-point weights that need w̄
(w̄ᵢ = φᵢᵀSφᵢ + φᵢᵀH̄rᵢ) need ΦS anyway: there Φ̄ is formed
(:func:`~rfgp.inference.linalg.statistics_backward`) and K̄ = Φ̄L⁻¹ solved in its memory
(≈ 5.25·N·M²), and so is it for float32 features (below).

Precision.  For float32 features K̄ is Φ̄L⁻¹, not W(2Φ(SL⁻¹) + R(L⁻ᵀH̄)ᵀ): the M × M factors SL⁻¹ and L⁻ᵀH̄,
rounded to float32 once for all N rows, perturb S by up to ``u·|SL⁻¹|·|L|``, a relative error of order κ(L)·u
that every row shares, so that it adds up in the hyperparameters' gradients instead of averaging out
(forming the factors in float64 and rounding them to float32 does not help).  Φ̄ = W(2ΦS + RH̄ᵀ) and its
solve round per row.  Measured (``benchmarks/results/nystrom_float32_gradients.md``: 256 landmarks of an
RBF, ℓ = 0.3, x ∈ [0, 1]³, jitter 10⁻⁶, κ(L) = 7·10³, the model of
``benchmarks/results/float32_statistics_refined.md``; float32 against float64 statistics of the same model):
the gradient was 1.7–1.9·10⁻² off at N = 2 000–10 000, σ² = 10⁻², now 1.7·10⁻⁴ and 10⁻³ (chunked
1.2–3.7·10⁻⁴ instead of 0.9–5.3·10⁻³); the factors' error grows with κ(L) (none at κ(L) ≤ 55, 2.2·10⁻³ at
7·10²).  What remains at N ≥ 10⁴ is the float32 statistics' own rounding, to which a Nyström gradient is
more sensitive than a Fourier one (errors of S and H̄ are shared by all rows too and reach K̄ through L⁻¹):
``rfgp.settings.float32_statistics_tolerance(0)`` removes it.  The solve costs 1.12–1.22× per float32 MLL +
gradient (N = 10⁴–2·10⁴, M = 256–1 024, materialised or chunked, one CPU thread).  The M × M product 2SG +
H̄Hᵀ of L̄ is formed in float64 (:func:`factor_dtype`): in float32 it raised the largest relative error of
float32 hyperparameter gradients against float64 from 2.8·10⁻⁴ (autograd's) to 1.3·10⁻³ at N = 14 016,
M = 1024, d = 4 (``benchmarks/nystrom_statistics.py``).  Learned landmarks there have gradients below float32
rounding on either path; their rounding noise is ~25× autograd's with a float32 2SG + H̄Hᵀ and ~5× with the
float64 one (equal to autograd's at M = 128, where they are resolved).  The closed form K̄ = W(2KĜ + RĤᵀ),
Ĝ = L⁻ᵀSL⁻¹, which needs no Φ in the backward, is not used: K·Ĝ multiplies rounding by κ(L), and at that size
its float32 lengthscale gradients were off by up to 2.2 times their value.  Likewise the forward pass keeps
the triangular solve: forming KᵀWK and solving on both sides would square the conditioning of L in the
statistics themselves.  Second derivatives (``create_graph=True``) recompute the statistics with autograd
(:func:`~rfgp.inference.linalg.differentiable_backward`).

:class:`TriangularFeatures` is the root ``LinearOperator`` through which
:class:`~rfgp.kernels.NystromKernel` hands Φ, K and L to
:class:`~rfgp.inference.operators.FeatureRootLinearOperator`: it behaves as the dense Φ everywhere
(products, indexing, posterior caches, the kernel-space path), and its feature statistics take this
backward.  When Φ exceeds the memory budget, :class:`TriangularFeaturizer` keeps K(x, Z) and L apart
for the chunked operators: :func:`chunked_triangular_statistics` factorises L once per pass (autograd
through Φ recomputed per chunk factorises it in every chunk, forward and backward), forms the M × M
factors once, recomputes K(x_c, Z) per chunk for K̄_c and back-propagates L̄ once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator
from torch import Tensor

from ..core.dtypes import FullPrecisionOperator, refuse_autocast_backward
from .chunking import (
    Featurizer,
    _add,
    backprop_chunks,
    check_chunked_solve,
    chunked_statistics_forward,
    fold_backward,
    folded_in,
    gathered_row_grads,
    without_graph,
)
from .linalg import (
    _add_matmul,
    _is_uniform,
    _sum_to_shape,
    differentiable_backward,
    factor_dtype,
    gram_gradient,
    plain_statistics,
    statistics_backward,
    uniform_weight_grad,
    unit_statistics,
    weighted_statistics,
)


def triangular_features(cross: Tensor, chol: Tensor) -> Tensor:
    """Φ = K·L⁻ᵀ for K ``(..., N, M)`` and a lower-triangular L ``(..., M, M)`` (batch shapes broadcast).

    Entries of Φ below √tiny·max_j L_jj are set to zero (see :func:`negligible_threshold`), so that the Gram
    matrix ΦᵀΦ is not computed on subnormal numbers.
    """
    features = torch.linalg.solve_triangular(chol, cross.mT, upper=False).mT
    return flush_negligible(features, negligible_threshold(kernel_scale(chol), features.dtype, 0.5, 1))


def negligible_threshold(scale: Tensor, dtype: torch.dtype, power: float, degree: int) -> Tensor:
    r"""tiny^power · scaleᵈᵉᵍʳᵉᵉ: below it an entry of a Nyström factor is negligible.

    ``scale`` is s = √(max_j k(z_j, z_j)) per batch, ``(..., 1, 1)`` (:func:`kernel_scale`).
    Nyström algebra on points far from every landmark (standardised data with a few dozen columns, raw
    inputs at the initial lengthscale) meets numbers below the smallest normal number ``tiny`` of
    ``dtype``: K(x, Z) underflows, and the triangular solve and the Gram matrix create more by
    cancellation and products.  CPUs compute on subnormal numbers 10–100× more slowly (float32, diamonds
    with 26 standardised columns, N = 1200, M = 512: 0.83 s per marginal likelihood and gradient instead
    of 0.12 s).  s² is the largest kernel value at the landmarks, and an entry below tiny^¼ of its scale
    (3·10⁻¹⁰ relative in float32, 10⁻⁷⁷ in float64) is below the rounding of the entries it is summed
    with.  So K is flushed at tiny^¼·s² (degree 2), L at tiny^¼·s and Φ at tiny^½·s (degree 1), which
    keeps the solve's and the Gram matrix's products normal; no host synchronisation is made.
    """
    return torch.finfo(dtype).tiny ** power * scale.detach().to(dtype) ** degree


def kernel_scale(chol: Tensor) -> Tensor:
    """s = max_j L_jj ≈ √(max_j k(z_j, z_j)) of a landmark factor L, ``(..., 1, 1)``."""
    return chol.detach().diagonal(dim1=-2, dim2=-1).abs().amax(-1)[..., None, None]


def flush_negligible(values: Tensor, threshold: Tensor) -> Tensor:
    """``values`` with the entries of magnitude below ``threshold`` (broadcast) set to zero (NaN stays NaN)."""
    return torch.where(values.abs() < threshold, torch.zeros((), dtype=values.dtype, device=values.device), values)


def _solve_lower_transpose(chol: Tensor, matrix: Tensor, overwrite: bool = False) -> Tensor:
    """L⁻ᵀ·matrix, in the memory of ``matrix`` if ``overwrite``.

    For B·L⁻¹ pass ``matrix`` = Bᵀ of a row-major B: the column-major layout the solver works in
    (a right-sided solve is ~1.8× slower on CPU at N = 14 016, M = 1024; overwriting saves the
    copy of the right-hand side, 13 ms there).
    """
    return torch.linalg.solve_triangular(chol.mT, matrix, upper=True, out=matrix if overwrite else None)


def _right_factors(chol: Tensor, grad_gram: Tensor, grad_projection: Tensor) -> tuple[Tensor, Tensor]:
    """(SL⁻¹, (L⁻ᵀH̄)ᵀ) with S = ½(Ḡ + Ḡᵀ), for float64 factors (:func:`_uses_factors`)."""
    sym = 0.5 * (grad_gram + grad_gram.mT)
    solved = _solve_lower_transpose(chol, torch.cat((sym, grad_projection), -1)).mT
    return solved[..., : sym.shape[-1], :], solved[..., sym.shape[-1] :, :]


class _TriangularStatistics(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, cross: Tensor, chol: Tensor, weights: Tensor, rhs: Tensor):
        if _is_uniform(weights):
            unit = unit_statistics(features, rhs)
            w = weights.unsqueeze(-1)
            gram, projection = unit[0] * w, unit[1] * w
        else:
            unit = ()
            gram, projection = weighted_statistics(features, weights, rhs)
        ctx.save_for_backward(features, cross, chol, weights, rhs, gram, projection, *unit)
        return gram, projection

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_gram: Tensor, grad_projection: Tensor):
        features, cross, chol, weights, rhs, gram, projection, *unit = ctx.saved_tensors
        needs = ctx.needs_input_grad[1:]
        if torch.is_grad_enabled():  # create_graph=True
            grads = differentiable_backward(
                lambda: plain_statistics(triangular_features(cross, chol), weights, rhs), (cross, chol, weights, rhs),
                needs, (grad_gram, grad_projection),
            )
        else:
            grads = _lean_backward(features, chol, weights, rhs, gram, projection, unit, grad_gram, grad_projection,
                                   needs)
        return (None, *(None if g is None else _sum_to_shape(g, t.shape)
                        for g, t in zip(grads, (cross, chol, weights, rhs))))


def _lean_backward(features, chol, weights, rhs, gram, projection, unit, grad_gram, grad_projection, needs):
    """(K̄, L̄, w̄, R̄) without a graph; ``unit`` holds the unit statistics of uniform weights (else empty)."""
    need_cross, need_chol, need_weights, need_rhs = needs
    factors = _right_factors(chol, grad_gram, grad_projection) if _uses_factors(weights, needs, chol.dtype) else None
    grad_cross, grad_weights, grad_rhs = _row_grads(features, chol, weights, rhs, grad_gram, grad_projection, factors,
                                                    need_cross, need_weights, need_rhs)
    if need_weights and unit:
        grad_weights = uniform_weight_grad(*unit, grad_gram, grad_projection)
    grad_chol = _factor_grad(chol, grad_gram, grad_projection, gram, projection) if need_chol else None
    return grad_cross, grad_chol, grad_weights, grad_rhs


def _uses_factors(weights: Tensor, needs, dtype: torch.dtype) -> bool:
    """Whether K̄ comes from the M × M factors of :func:`_right_factors` by one product: in float64, and unless
    per-point weights need w̄ (which forms Φ̄ anyway).  In float32 K̄ = Φ̄L⁻¹ solves Φ̄, whose rounding is each row's
    own, instead of rounding SL⁻¹ once for all rows (see the module docstring's "Precision")."""
    need_cross, _, need_weights, _ = needs
    return need_cross and dtype == torch.float64 and not (need_weights and not _is_uniform(weights))


def _row_grads(features, chol, weights, rhs, grad_gram, grad_projection, factors, need_cross, need_weights, need_rhs,
               gram_factor: Tensor | None = None, uniform: bool | None = None):
    """(K̄, per-point w̄, R̄) of a block of rows (``weights`` theirs, or uniform: ``uniform``, by default their shape
    ``(..., 1)``, which a one-row block of per-point weights has too).

    Without ``factors`` (float32, or per-point weights that need w̄ = rowsum(Φ ⊙ ΦS) + rowsum(R ⊙ ΦH̄)) Φ̄ =
    W(2ΦS + RH̄ᵀ) is formed (:func:`~rfgp.inference.linalg.statistics_backward`, with ``gram_factor`` its
    :func:`~rfgp.inference.linalg.gram_gradient` where a caller visiting row blocks formed it once) and K̄ = Φ̄L⁻¹
    solved in its memory; otherwise K̄ comes from the M × M ``factors`` by one product.
    """
    uniform = _is_uniform(weights) if uniform is None else uniform
    per_point = need_weights and not uniform
    if per_point or (need_cross and factors is None):
        grad_features, grad_weights, grad_rhs = statistics_backward(
            features, weights, rhs, grad_gram, grad_projection, (need_cross, per_point, need_rhs), gram_factor, uniform
        )
        if need_cross:
            grad_features = _solve_lower_transpose(chol, grad_features.mT, overwrite=True).mT
        return grad_features, grad_weights, grad_rhs
    grad_cross = _cross_grad(features, weights, rhs, *factors, uniform) if need_cross else None
    grad_rhs = (features @ grad_projection) * weights.unsqueeze(-1) if need_rhs else None
    return grad_cross, None, grad_rhs


def _cross_grad(features: Tensor, weights: Tensor, rhs: Tensor, hat_sym: Tensor, hat_projection: Tensor,
                uniform: bool) -> Tensor:
    """K̄ = W(2Φ(SL⁻¹) + R(L⁻ᵀH̄)ᵀ) from the factors of :func:`_right_factors`: one N·M² product (``uniform``: as
    :func:`_row_grads`)."""
    w = weights.unsqueeze(-1)
    if uniform:  # the uniform weight scales the M × M factor, not the N × M product
        return _add_matmul(features @ (hat_sym * (2.0 * w)), rhs * w, hat_projection)
    return _add_matmul((features @ hat_sym).mul_(2.0), rhs, hat_projection).mul_(w)


def _factor_grad(chol: Tensor, grad_gram: Tensor, grad_projection: Tensor, gram: Tensor, projection: Tensor) -> Tensor:
    """L̄ = −tril(L⁻ᵀ(2SG + H̄Hᵀ)), the product formed in :func:`factor_dtype` (the solve's precision does not
    matter, see the module docstring)."""
    work = factor_dtype(chol.dtype, chol.device)
    grad_gram, gram = grad_gram.to(work), gram.to(work)
    product = _add_matmul((grad_gram + grad_gram.mT) @ gram, grad_projection.to(work), projection.mT.to(work))
    return _solve_lower_transpose(chol, product.to(chol.dtype)).tril_().neg_()


def triangular_statistics(features: Tensor, cross: Tensor, chol: Tensor, weights: Tensor,
                          rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for Φ = K·L⁻ᵀ, differentiable with respect to K, L, the weights and R.

    Args:
        features: Φ = :func:`triangular_features` (K, L), ``(..., N, M)``, already formed (by the
            kernel); only its value is used: gradients flow through ``cross`` and ``chol``.
        cross: K, ``(..., N, M)``.
        chol: L, lower triangular, ``(..., M, M)``.
        weights: diagonal of W, ``(..., N)``, or uniform ``(..., 1)``.
        rhs: R, ``(..., N, t)``.
    """
    batch = torch.broadcast_shapes(features.shape[:-2], cross.shape[:-2], chol.shape[:-2], weights.shape[:-1],
                                   rhs.shape[:-2])
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same statistics, plainly
        return plain_statistics(triangular_features(cross, chol), weights, rhs)
    return _TriangularStatistics.apply(
        features.detach().expand(*batch, *features.shape[-2:]), cross, chol,
        weights.expand(*batch, weights.shape[-1]), rhs.expand(*batch, *rhs.shape[-2:]),
    )


def _factor_first(cross: Callable[[Tensor], Tensor], chol: Callable[[], Tensor], x: Tensor) -> Tensor:
    """K(x, Z)·L⁻ᵀ with L computed before K(x, Z): a Nyström kernel decides with its factor how to evaluate K(x, Z)
    (:meth:`~rfgp.kernels.NystromKernel._choose_cross_precision`)."""
    factor = chol()
    return triangular_features(cross(x), factor)


class TriangularFeaturizer(Featurizer):
    """x ↦ Φ(x) = c·K(x)·L⁻ᵀ with K(x) = K(x, Z) and L as functions of the differentiable ``params``.

    Chunked statistics of such features (:func:`chunked_triangular_statistics`) factorise L once per
    pass instead of once per chunk and take the fused backward per chunk.

    Args:
        cross: maps rows ``(..., c, d)`` to K(x, Z) ``(*batch_shape, c, M)``.
        chol: returns L ``(*batch_shape, M, M)``.
        params, num_features, batch_shape, constant: as for :class:`~rfgp.inference.chunking.Featurizer`.
    """

    def __init__(self, cross: Callable[[Tensor], Tensor], chol: Callable[[], Tensor], params: Sequence[Tensor],
                 num_features: int, batch_shape: torch.Size, constant: Tensor | float | None = None) -> None:
        super().__init__(lambda x: _factor_first(cross, chol, x), params, num_features, batch_shape, constant)
        self.cross, self.chol = cross, chol

    def detach_(self) -> TriangularFeaturizer:
        """:meth:`~rfgp.inference.chunking.Featurizer.detach_`, K(x, Z) and L included."""
        self.cross, self.chol = without_graph(self.cross), without_graph(self.chol)
        return super().detach_()


def _triangular_chunks(featurizer: TriangularFeaturizer,
                       chol: Tensor) -> Callable[[Tensor, torch.dtype | None], Tensor]:
    """x, dtype ↦ K(x, Z)·L⁻ᵀ for L = ``chol`` (factorised once), formed from K and L cast to dtype (``None``: as they
    are), for :func:`~rfgp.inference.chunking.chunked_statistics_forward`."""
    return lambda x, dtype: (triangular_features(featurizer.cross(x), chol) if dtype is None
                             else triangular_features(featurizer.cross(x).to(dtype), chol.to(dtype)))


class _ChunkedTriangularStatistics(torch.autograd.Function):
    """(ΦᵀWΦ, ΦᵀWR) for Φ = c·K(x)L⁻ᵀ of the unfolded W, R and c: c is folded
    (:func:`~rfgp.inference.chunking.folded_in`) in the statistics' precision, forward and backward."""

    @staticmethod
    def forward(ctx, featurizer, blocks, inputs, weights, rhs, constant, *params):
        chunk_size, adaptive, model_dtype = blocks  # points per chunk, adaptive precision, the model's dtype
        chol = featurizer.chol()
        gram, projection, unit, fold_dtype = chunked_statistics_forward(
            _triangular_chunks(featurizer, chol), inputs, weights, rhs, constant, chunk_size, adaptive=adaptive,
            model_dtype=model_dtype)
        work = gram.dtype
        chol = chol.to(work)
        ctx.featurizer, ctx.chunk_size, ctx.work = featurizer, chunk_size, work
        ctx.fold_dtype, ctx.constant = fold_dtype, None if torch.is_tensor(constant) else constant
        ctx.save_for_backward(inputs, weights, rhs, constant if torch.is_tensor(constant) else None, chol, gram,
                              projection, *unit)
        return gram, projection

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_gram, grad_projection):
        inputs, weights, rhs, constant, chol, gram, projection, *unit = ctx.saved_tensors
        constant = ctx.constant if constant is None else constant
        featurizer, needs, work, fold_dtype = ctx.featurizer, ctx.needs_input_grad, ctx.work, ctx.fold_dtype
        if torch.is_grad_enabled():  # create_graph=True: second derivatives, features of all chunks at once
            grads = differentiable_backward(
                lambda: plain_statistics(featurizer(inputs).to(work),
                                         *(t.to(work) for t in folded_in(constant, weights, rhs, fold_dtype))),
                (inputs, weights, rhs, constant, *featurizer.params), needs[2:], (grad_gram, grad_projection),
            )
            return (None, None, *grads)
        need_fold = (needs[3], needs[4], needs[5])
        with torch.no_grad():
            folded_weights, folded_rhs = folded_in(constant, weights, rhs, fold_dtype)
        need_inputs, params_need = needs[2], needs[6:]
        need_weights, need_rhs = needs[3] or needs[5], needs[4] or needs[5]  # of the folded c²W and R/c: c̄ too
        need_cross = need_inputs or any(params_need)
        factors = gram_factor = None
        if _uses_factors(weights, (need_cross, False, need_weights, need_rhs), chol.dtype):
            factors = _right_factors(chol, grad_gram, grad_projection)
        elif need_cross or (need_weights and not _is_uniform(weights)):  # Φ̄ per chunk: S (2w·S) once, not per chunk
            gram_factor = gram_gradient(grad_gram, folded_weights.to(work))
        weight_grads, rhs_grads = [], []

        def chunk_grad(cross: Tensor, rows: slice) -> Tensor:
            chunk_weights = folded_weights if unit else folded_weights[..., rows]
            grad_cross, grad_weights, grad_rhs = _row_grads(
                triangular_features(cross.to(work), chol), chol, chunk_weights.to(work),
                folded_rhs[..., rows, :].to(work), grad_gram, grad_projection, factors, need_cross, need_weights,
                need_rhs, gram_factor, bool(unit),
            )
            weight_grads.append(grad_weights)
            rhs_grads.append(grad_rhs)
            # only w̄ or R̄ wanted (a frozen kernel): no K̄, nor the factors it would come from
            return torch.zeros_like(cross) if grad_cross is None else grad_cross.to(cross.dtype)

        cross = Featurizer(featurizer.cross, featurizer.params, featurizer.num_features, featurizer.batch_shape)
        input_grad, param_grads = backprop_chunks(cross, inputs, ctx.chunk_size, chunk_grad, need_inputs, params_need)
        if any(params_need):  # L̄ once, through one factorisation with a graph
            wanted = [p for p, need in zip(featurizer.params, params_need) if need]
            with torch.enable_grad():
                factor = featurizer.chol()
            grad_chol = _sum_to_shape(_factor_grad(chol, grad_gram, grad_projection, gram, projection), factor.shape)
            found = iter(torch.autograd.grad(factor, wanted, grad_chol.to(factor.dtype), allow_unused=True))
            param_grads = [_add(g, next(found)) if need else None for g, need in zip(param_grads, params_need)]
        grad_weights, grad_rhs = gathered_row_grads(unit, folded_weights, folded_rhs, weight_grads, rhs_grads,
                                                    grad_gram, grad_projection, need_weights, need_rhs)
        fold_grads = fold_backward(constant, weights, rhs, fold_dtype, grad_weights, grad_rhs, need_fold)
        return (None, None, input_grad, *fold_grads, *param_grads)


def chunked_triangular_statistics(featurizer: TriangularFeaturizer, inputs: Tensor, weights: Tensor, rhs: Tensor,
                                  chunk_size: int, adaptive_precision: bool = False,
                                  model_dtype: torch.dtype | None = None) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for Φ = featurizer(inputs) = c·K(x)L⁻ᵀ, accumulated over ``chunk_size`` rows at a time.

    The chunked counterpart of :func:`triangular_statistics` (and the Nyström counterpart of
    :func:`~rfgp.inference.chunking.chunked_feature_statistics`): the backward recomputes K(x_c) per
    chunk under autograd, and L once.  ``adaptive_precision``: float32 features whose float32 statistics would not be
    accurate (:func:`~rfgp.inference.chunking.accumulated_statistics_dtype`, from tr(G) of the float32 pass) form
    them again from K(x_c, Z) and L cast to float64, forward and backward, and return them so.  ``model_dtype``: as
    :func:`~rfgp.inference.chunking.chunked_feature_statistics`'s.
    """
    check_chunked_solve(featurizer, inputs, weights)
    unscaled = featurizer.unscaled()
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same forward, plainly
        return chunked_statistics_forward(_triangular_chunks(unscaled, unscaled.chol()), inputs, weights, rhs,
                                          featurizer.constant, chunk_size, adaptive=adaptive_precision,
                                          model_dtype=model_dtype)[:2]
    blocks = (chunk_size, adaptive_precision, model_dtype)
    return _ChunkedTriangularStatistics.apply(unscaled, blocks, inputs, weights, rhs, featurizer.constant,
                                              *unscaled.params)


class TriangularFeatures(FullPrecisionOperator, LinearOperator):
    """The feature matrix Φ = K·L⁻ᵀ ``(..., N, M)`` together with its factors K and L.

    Every operation sees the dense Φ (products, indexing, ``to_dense``; its autograd graph reaches K
    and L as usual); :meth:`feature_statistics` takes the fused backward of :func:`triangular_statistics`.
    K and L are expanded to Φ's batch shape (views), so that batch operations (indexing, permuting,
    unsqueezing) transform all three alike.

    Args:
        features: Φ = :func:`triangular_features` (cross, chol).
        cross: K, ``(..., N, M)``.
        chol: L, ``(..., M, M)``.
    """

    def __init__(self, features: Tensor, cross: Tensor, chol: Tensor) -> None:
        batch = features.shape[:-2]
        cross = cross.expand(*batch, *cross.shape[-2:])
        chol = chol.expand(*batch, *chol.shape[-2:])
        super().__init__(features, cross, chol)
        self.features, self.cross, self.chol = features, cross, chol

    def feature_statistics(self, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
        """(ΦᵀWΦ, ΦᵀWR), see :func:`triangular_statistics`."""
        return triangular_statistics(self.features, self.cross, self.chol, weights, rhs)

    def _size(self) -> torch.Size:
        return self.features.shape

    def _matmul(self, rhs: Tensor) -> Tensor:
        return self.features @ rhs

    def _transpose_nonbatch(self) -> LinearOperator:
        return DenseLinearOperator(self.features.mT)

    def _get_indices(self, row_index, col_index, *batch_indices) -> Tensor:
        return DenseLinearOperator(self.features)._get_indices(row_index, col_index, *batch_indices)

    def _getitem(self, row_index, col_index, *batch_indices) -> LinearOperator:
        return DenseLinearOperator(self.features)._getitem(row_index, col_index, *batch_indices)

    def to_dense(self) -> Tensor:
        return self.features

    def _expand_batch(self, batch_shape) -> "TriangularFeatures":
        """Φ, K and L expanded to ``batch_shape`` without copying (linear_operator's version repeats the operator)."""
        return self.__class__(self.features.expand(*batch_shape, *self.features.shape[-2:]), self.cross, self.chol)
