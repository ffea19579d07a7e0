"""The kernel-space path: the N × N matrix K = ΦΦᵀ + D when it is cheaper than feature space.

A random-feature GP can be solved with the F × F capacitance A = I + ΦᵀD⁻¹Φ (Woodbury, cost
≈ N·F² + F³/3) or with the N × N covariance K = ΦΦᵀ + D (cost ≈ N²·F + N³/3).  Both give the
same marginal likelihood, gradients and posterior; :func:`prefers_kernel_space` picks the
cheaper by flop count, counting the Gram products once per distinct Φ (a Φ shared by a batch of
noise levels, as in Dirichlet classification, is multiplied once) and the factorisations once
per batch member.  With N ≤ F the kernel-space path is always chosen.

Marginal-likelihood terms (:func:`kernel_space_inv_quad_logdet`, a custom autograd function)::

    forward:  K = ΦΦᵀ + D,  L = chol(K),  α = K⁻¹r,  rᵀK⁻¹r = rᵀα,  log|K| = 2 Σ log Lᵢᵢ;
    backward: S = ḡ_l K⁻¹ − α diag(ḡ_q) αᵀ  (∂/∂K of ḡ_l·log|K| + ḡ_q·rᵀK⁻¹r),
              ∂Φ = 2SΦ,  ∂D = diag(S),  ∂r = 2α diag(ḡ_q),

(Rasmussen & Williams 2006, Eq. 5.9), i.e. one symmetric N × N Gram, one Cholesky, one
inverse from the factor and one N²·F product — where autograd through ``Φ @ Φᵀ`` and the
Cholesky would spend three N²·F products and a Cholesky backward.  When Φ is shared over the
batch, S is summed over the batch first, so the N²·F product runs once.  K⁻¹ is formed in full (LAPACK potri,
2N³/3 flops): K⁻¹Φ from the factor instead (two N²·F triangular solves, the flops of the product SΦ) ran slower on
CPU BLAS (N = 1000, F = 2048, float32, one thread: 45 ms against 10 + 33 ms for the inverse and the product), and
diag(K⁻¹), the noise gradient, would still need L⁻¹.  α = K⁻¹r takes two triangular solves
(:func:`rfgp.inference.linalg.cholesky_solve`), without ``torch.cholesky_solve``'s copy of the factor.

Posterior (:func:`kernel_space_posterior_caches`): with the push-through identity
A⁻¹ΦᵀD⁻¹ = Φᵀ(ΦΦᵀ + D)⁻¹, the mean weights are Φᵀα, and A⁻¹ = RRᵀ with R = I − WᵀQ
(:class:`KernelSpaceFactor`, W = L⁻¹Φ and Q = (L + D^{1/2})⁻¹Φ, both N × F): the posterior
covariance at test features Φ* has the n × F root Φ*R, as in feature space (where it is Φ*L_A⁻ᵀ),
so products, variances and draws cost what they cost there — without an F × F factorisation.

Precision (:func:`covariance_dtype`): float32 features form and factorise K in float32 or float64 by the rule of
:mod:`rfgp.inference.statistics_precision`, on the same estimate ε̂ = u·tr(sΦᵀD⁻¹Φ) = u·Σᵢ s‖φᵢ‖²/dᵢ as the feature
path of the same model (so a model's precision does not change where N crosses F).  Derivation: the entries of sΦΦᵀ
are inner products of length F, so formed in floating point ``|ΔK| ≤ γ_{F+1}·s|Φ||Φ|ᵀ`` elementwise (Higham,
*Accuracy and Stability of Numerical Algorithms*, 2nd ed., 2002, §3.5, eq. (3.13); the product with s adds one
rounding).  K ⪰ D, so log|K|, rᵀK⁻¹r, their gradients and the Cholesky factor change by relative amounts of order
``‖K^{-1/2}ΔK K^{-1/2}‖₂ ≤ ‖D^{-1/2}ΔK D^{-1/2}‖₂``, and K becomes indefinite once that approaches 1, the smallest
eigenvalue of D^{-1/2}KD^{-1/2} = I + sD^{-1/2}ΦΦᵀD^{-1/2} in exact arithmetic (its eigenvalues above 1 are those of
I + sΦᵀD⁻¹Φ).  With ``‖|M|‖₂ ≤ ‖M‖_F``::

    ‖D^{-1/2}ΔK D^{-1/2}‖₂ ≤ γ_{F+1}·s·‖D^{-1/2}|Φ|‖_F² = γ_{F+1}·Σᵢ s‖φᵢ‖²/dᵢ = γ_{F+1}·tr(sΦᵀD⁻¹Φ),

the feature path's bound with the inner dimension F for N; the estimate u·tr drops the worst-case factor as there.
A float32 Cholesky factorisation of the rounded K adds a backward error ``|ΔK| ≤ γ_{N+1}|L||L|ᵀ`` (Higham,
Theorem 10.3) with ``‖D^{-1/2}|L||L|ᵀD^{-1/2}‖₂ ≤ Σᵢ kᵢᵢ/dᵢ = N + tr(sΦᵀD⁻¹Φ)``, of the same order once the trace
dominates: so the factor is not widened alone (a float64 factor of the float32 K failed at the same
signal-to-noise ratios, :class:`KernelSpaceNotPSDError`).  Where ε̂ exceeds the tolerance, Φ, D, r and s are cast
to float64 (differentiably) and the Gram, the Cholesky factor, the solves and the backward products (S, SΦ,
⟨S, ΦΦᵀ⟩) run in float64; the terms are rounded back, and the gradients reach the float32 inputs in float32.  The
posterior caches do the same and keep the factor's W and Q in float64 (:meth:`KernelSpaceFactor.posterior_root`
casts the test features): the root Φ*R = Φ* − (Φ*Wᵀ)Q cancels at a high signal-to-noise ratio, and W and Q rounded
to float32 made the posterior variance 20–100 times less accurate (2·10⁻⁵ to 2·10⁻³ relative at outputscale/noise
10⁴–10⁸, N = 500–1000, F = 2048, against 5·10⁻⁷ to 2·10⁻⁵); the mean weights are rounded back.

Measured (``benchmarks/results/kernel_space_precision.md``: float32 ExactGP, F = 2048, N = 500–2000, one CPU
thread): ‖D^{-1/2}ΔK D^{-1/2}‖₂ = 0.03–0.07·ε̂, and against the float64 model, with K formed in float32 ("f32") or
float64 ("f64", the float32 features' own rounding):

=========  ===========================  ==========================  ============================  ==================
u·tr       loss per point, f32 / f64    gradient (rel.), f32 / f64  variance (rel.), f32 / f64    λ_min(D^-½K₃₂D^-½)
=========  ===========================  ==========================  ============================  ==================
10⁻³       3–7·10⁻⁷ / ≤ 5·10⁻⁸          0.5–1.6·10⁻⁶ / ≤ 1.1·10⁻⁷   1.5–4·10⁻⁶ / ≤ 4.4·10⁻⁷       1.000
10⁻²       3–9·10⁻⁶ / ≤ 3·10⁻⁷          0.4–1.6·10⁻⁵ / ≤ 2.1·10⁻⁷   1.5–4·10⁻⁵ / ≤ 7.3·10⁻⁷       0.999–1.000
10⁻¹       0.8–1.3·10⁻⁴ / ≤ 5.3·10⁻⁷    1.3–1.8·10⁻⁴ / ≤ 1.4·10⁻⁷   1.7–3.9·10⁻⁴ / ≤ 1.3·10⁻⁶     0.995–0.997
1          0.7–1.3·10⁻³ / ≤ 2.4·10⁻⁷    0.5–1.1·10⁻³ / ≤ 3·10⁻⁷     2–3.6·10⁻³ / ≤ 1.8·10⁻⁶       0.95–0.97
10         0.03–0.06 / ≤ 5.5·10⁻⁷       0.02–0.15 / ≤ 3.5·10⁻⁷      0.1–0.14 / 0.1–0.14 (*)       0.46–0.69
10²        0.9–1.1 (jitter) / ≤ 4·10⁻⁷  0.3–0.5 / ≤ 9·10⁻⁷          2.5–3.6 / 2.5–3.3 (*)         −4.4 to −2.1
=========  ===========================  ==========================  ============================  ==================

(*) the float32 test features' own rounding: the feature path with float64 statistics errs alike.  At the default
tolerance 10⁻¹ a float32 K errs by at most 1.3·10⁻⁴ per point in the loss (the feature path: 4·10⁻⁵) and 2·10⁻⁴ in
the gradient (3·10⁻⁴); beyond, the errors grow as there, and at ε̂ = 100 the float32 K is indefinite (factorised
only by linear_operator's jitter, a different model).  Cost at N = 1000, F = 2048 (``float32_statistics_paths.py``'s
pairs): the decision is 0.7 ms beside 0.09–0.1 s for an MLL + gradient (< 1 %); float64 costs 2.2× the float32
time per MLL + gradient and per posterior.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from ..core.batch_copies import narrow_broadcast
from ..core.dtypes import refuse_autocast_backward
from .linalg import _sum_to_shape, cholesky_solve, differentiable_backward, rounding_advice, symmetric_gram
from .statistics_precision import statistics_dtype, unit_roundoff, weighted_square_norm


def prefers_kernel_space(num_data: int, num_features: int, feature_batch: int = 1, solve_batch: int = 1,
                         statistics_batch: int | None = None) -> bool:
    """Whether N²·F + N³/3 (kernel space) costs no more than N·F² + F³/3 (feature space), batches counted.

    Args:
        num_data, num_features: N and F.
        feature_batch: number of distinct Φ matrices (the Gram ΦΦᵀ is formed once per Φ).
        solve_batch: number of factorisations (batch members of the noise-added operator).
        statistics_batch: number of F × F statistics ΦᵀWΦ the feature path forms (``feature_batch``
            for homoscedastic noise, whose weight scales one shared ΦᵀΦ; otherwise one per
            batch member of Φ and the noise together).  Defaults to ``feature_batch``.
    """
    statistics_batch = feature_batch if statistics_batch is None else statistics_batch
    n, f = float(num_data), float(num_features)
    kernel = feature_batch * n * n * f + solve_batch * n**3 / 3
    feature = statistics_batch * n * f * f + solve_batch * f**3 / 3
    return kernel <= feature


def kernel_gram(features: Tensor) -> Tensor:
    """ΦΦᵀ ``(..., N, N)`` from its upper column blocks (:func:`rfgp.inference.linalg.symmetric_gram` on Φᵀ)."""
    return symmetric_gram(features.mT, features.mT)


def covariance_dtype(features: Tensor, noise: Tensor, scale: Tensor | None = None) -> torch.dtype:
    """The dtype to form and factorise K = sΦΦᵀ + D in: Φ's and D's, or float64 for float32 ones where the a-priori
    estimate of K's float32 rounding beside its noise floor D, ε̂ = u·tr(sΦᵀD⁻¹Φ) = u·Σᵢ s‖φᵢ‖²/dᵢ, exceeds
    :class:`rfgp.settings.float32_statistics_tolerance` (:func:`rfgp.inference.statistics_precision.statistics_dtype`;
    the derivation is in this module's docstring).

    Args:
        features: Φ ``(..., N, F)``.
        noise: the diagonal of D, ``(..., N)`` or ``(..., 1)`` for a constant one.
        scale: optional positive s, batch-shaped.
    """
    def trace() -> Tensor:
        with torch.no_grad():
            trace = weighted_square_norm(features, noise.reciprocal())
            return trace if scale is None else trace * scale

    return statistics_dtype(torch.promote_types(features.dtype, noise.dtype), features.device, trace)


def kernel_cholesky(features: Tensor, noise: Tensor, scale: Tensor | None = None) -> Tensor:
    """chol(sΦΦᵀ + D) for Φ ``(..., N, F)``, the noise diagonal ``(..., N)`` and an optional batch-shaped s, formed
    and factorised in :func:`covariance_dtype` (float64 for float32 features at a high signal-to-noise ratio): solve
    with it in its dtype.  A Φ expanded to a batch (stride-0 copies: T targets of one kernel) forms one Gram, which
    the factorisations share (one factorisation, expanded, where the noise is shared too), as the marginal
    likelihood's path does."""
    work = covariance_dtype(features, noise, scale)
    distinct = narrow_broadcast(features, features.dim() - 2)
    chol = _factor(kernel_gram(distinct.to(work)), noise.to(work), None if scale is None else scale.to(work))
    return chol.expand(*torch.broadcast_shapes(features.shape[:-2], chol.shape[:-2]), *chol.shape[-2:])


def _factor(gram: Tensor, noise: Tensor, scale: Tensor | None) -> Tensor:
    """chol(sG + D), forming sG + D in one fresh N × N buffer (one pass over G)."""
    covar = gram.clone() if scale is None else gram * scale.unsqueeze(-1).unsqueeze(-1)
    batch = torch.broadcast_shapes(covar.shape[:-2], noise.shape[:-1])
    if covar.shape[:-2] != batch:
        covar = covar.expand(*batch, *covar.shape[-2:]).clone()
    covar.diagonal(dim1=-2, dim2=-1).add_(noise)
    try:
        return psd_safe_cholesky(covar)
    except NotPSDError as error:
        raise KernelSpaceNotPSDError(_kernel_space_failure(covar.detach(), noise.detach(), str(error))) from error


class KernelSpaceNotPSDError(NotPSDError):
    """The N × N covariance sΦΦᵀ + D of the kernel-space path failed to factorise even with linear_operator's jitter.

    The rounding of sΦΦᵀ beside the noise is what fails: ≈ u·tr(sΦᵀD⁻¹Φ) (this module's docstring), so float32
    features form *and* factorise K in float64 where that estimate exceeds
    :class:`rfgp.settings.float32_statistics_tolerance` (a float64 factor of the float32 K alone gained nothing:
    float32 against float64 errors alike, failures at the same signal-to-noise ratios).  In float32 the error is left
    where the rule kept float32 (the tolerance raised, or ∞); in float64, where even float64's rounding exceeds the
    noise.  A ``NotPSDError``, so that :func:`rfgp.fit_mll`'s restarts treat it as linear_operator's.
    """


def _kernel_space_failure(covar: Tensor, noise: Tensor, cause: str) -> str:
    """What failed and what to do, for :class:`KernelSpaceNotPSDError`: the rounding estimate u·tr(sΦᵀD⁻¹Φ) of the
    dtype K was formed in, tr(sΦᵀD⁻¹Φ) = Σᵢ (kᵢᵢ − dᵢ)/dᵢ read off K's diagonal (the largest batch member's)."""
    size, dtype = covar.shape[-1], covar.dtype
    trace = ((covar.diagonal(dim1=-2, dim2=-1) - noise) / noise).sum(-1).max().item()
    estimate = unit_roundoff(dtype) * trace
    return (
        f"the {size} × {size} covariance sΦΦᵀ + D of rfgp's kernel-space path (taken when N ≤ F), formed in {dtype}, "
        f"is not positive definite ({cause.rstrip('.')}): its rounding beside the noise is about "
        f"u·tr(sΦᵀD⁻¹Φ) = {estimate:.3g} (u = {unit_roundoff(dtype):.2g}), against a smallest eigenvalue of 1 of "
        f"D^(-1/2)·K·D^(-1/2) in exact arithmetic; smallest noise variance of {noise.min().item():.3g}. "
        f"{rounding_advice(dtype)}"
    )


def _covariance_gradient(chol: Tensor, solve: Tensor, grad_inv_quad: Tensor, grad_logdet: Tensor | None) -> Tensor:
    """S = ḡ_l K⁻¹ − α diag(ḡ_q) αᵀ ``(..., N, N)`` (∂/∂K of ḡ_l·log|K| + ḡ_q·rᵀK⁻¹r), in one N × N buffer.

    K⁻¹ from the factor (LAPACK potri), scaled and updated by the rank-t term in place
    (batched ``baddbmm_``), so no further N × N temporaries are made.
    """
    weighted = solve * grad_inv_quad.unsqueeze(-2)
    if grad_logdet is None:
        return -(weighted @ solve.mT)
    sym = torch.cholesky_inverse(chol).mul_(grad_logdet.unsqueeze(-1).unsqueeze(-1))
    b, (n, t) = math.prod(sym.shape[:-2]), solve.shape[-2:]  # weighted and solve share sym's batch
    sym.view(b, n, n).baddbmm_(weighted.reshape(b, n, t), solve.mT.reshape(b, t, n), alpha=-1)
    return sym


def _batched_dot(left: Tensor, right: Tensor) -> Tensor:
    """Σᵢⱼ Lᵢⱼ Rᵢⱼ over the last two axes (broadcast batches), without an N × N temporary.

    ``vecdot`` on the flattened matrices: the same dot as a 1 × N² by N² × 1 ``matmul`` runs
    ~40× slower on CPU BLAS (6 ms against 0.15 ms at N = 1000, 2 threads).  Under ``torch.compile``
    the elementwise product and sum, which inductor fuses into one reduction (no temporary either):
    inductor lowers ``flatten`` of the transposed LAPACK inverse, updated in place, as a ``view`` it
    then refuses ("Cannot view a tensor with shape [N, N] and strides (1, N)", torch 2.13).
    """
    if torch.compiler.is_compiling():
        return (left * right).sum((-2, -1))
    return torch.linalg.vecdot(left.flatten(-2), right.flatten(-2))


def _inv_quad_logdet(features: Tensor, noise: Tensor, rhs: Tensor, scale: Tensor, gram: Tensor):
    """(rᵀK⁻¹r per column, log|K|, chol(K), K⁻¹r) for K = sΦΦᵀ + D with ΦΦᵀ = ``gram``."""
    chol = _factor(gram, noise, scale)
    batch = chol.shape[:-2]
    solve = cholesky_solve(rhs.expand(*batch, *rhs.shape[-2:]), chol)
    inv_quad = (rhs * solve).sum(-2)
    logdet_term = 2.0 * torch.diagonal(chol, dim1=-2, dim2=-1).log().sum(-1)
    return inv_quad, logdet_term, chol, solve


class _KernelSpaceInvQuadLogdet(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, noise: Tensor, rhs: Tensor, scale: Tensor, logdet: bool):
        gram = kernel_gram(features)
        inv_quad, logdet_term, chol, solve = _inv_quad_logdet(features, noise, rhs, scale, gram)
        ctx.logdet = logdet
        ctx.save_for_backward(features, noise, rhs, scale, gram, chol, solve)
        return inv_quad, logdet_term

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad_inv_quad: Tensor, grad_logdet: Tensor):
        features, noise, rhs, scale, gram, chol, solve = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: the lean backward below has no graph
            inputs = (features, noise, rhs, scale)
            return (*differentiable_backward(
                lambda: _inv_quad_logdet(features, noise, rhs, scale, features @ features.mT)[:2],
                inputs, ctx.needs_input_grad[:4], (grad_inv_quad, grad_logdet)), None)
        need_features, need_noise, need_rhs, need_scale = ctx.needs_input_grad[:4]
        # S = ḡ_l K⁻¹ − α diag(ḡ_q) αᵀ, the gradient with respect to K (symmetric)
        sym = _covariance_gradient(chol, solve, grad_inv_quad, grad_logdet if ctx.logdet else None)
        grad_features = grad_noise = grad_rhs = grad_scale = None
        if need_noise:
            grad_noise = _sum_to_shape(torch.diagonal(sym, dim1=-2, dim2=-1).clone(), noise.shape)
        if need_rhs:
            grad_rhs = _sum_to_shape(2.0 * solve * grad_inv_quad.unsqueeze(-2), rhs.shape)
        if need_scale:
            # ⟨S, G⟩ = ⟨Sᵀ, G⟩ for symmetric S; Sᵀ is the contiguous view of LAPACK's column-major inverse
            grad_scale = _sum_to_shape(_batched_dot(sym.mT, gram), scale.shape)
        if need_features:  # ∂Φ = 2sSΦ (S scaled in place: the other gradients are taken), summed over
            # the batch members that share Φ before the N²·F product
            sym.mul_((2.0 * scale).unsqueeze(-1).unsqueeze(-1))
            grad_features = _sum_to_shape(sym, (*features.shape[:-2], *sym.shape[-2:])) @ features
        return grad_features, grad_noise, grad_rhs, grad_scale, None


def kernel_space_inv_quad_logdet(features: Tensor, noise: Tensor, rhs: Tensor | None, logdet: bool,
                                 scale: Tensor | float | None = None) -> tuple[Tensor | None, Tensor | None]:
    """(rᵀ(sΦΦᵀ + D)⁻¹r per column ``(..., t)``, log|sΦΦᵀ + D| ``(...)``), ``None`` where not asked.

    Args:
        features: Φ ``(..., N, F)`` (shared over the noise's batch when it has fewer batch dims).
        noise: the diagonal of D, ``(..., N)``.
        rhs: r ``(..., N, t)`` or ``None``.
        logdet: whether the log-determinant is needed.
        scale: optional positive s (a number or batch-shaped, e.g. ``ScaleKernel``'s outputscale),
            kept out of Φ so that it costs no N × F pass.
    """
    width_rhs = rhs if rhs is not None else features.new_zeros(*features.shape[:-2], features.shape[-2], 0)
    if not torch.is_tensor(scale):  # made on the device (torch.as_tensor of a number would copy it from the host)
        scale = None if scale is None else features.new_full((), float(scale))
    dtype = torch.promote_types(torch.promote_types(features.dtype, noise.dtype), width_rhs.dtype)
    work = covariance_dtype(features, noise, scale)
    # the casts are differentiable: float64 forward and backward, gradients rounded back to each input's dtype
    features, noise, width_rhs = features.to(work), noise.to(work), width_rhs.to(work)
    scale = features.new_ones(()) if scale is None else scale.to(work)
    if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same forward, plainly
        inv_quad, logdet_term = _inv_quad_logdet(features, noise, width_rhs, scale, kernel_gram(features))[:2]
    else:
        inv_quad, logdet_term = _KernelSpaceInvQuadLogdet.apply(features, noise, width_rhs, scale, logdet)
    return (inv_quad.to(dtype) if rhs is not None else None), (logdet_term.to(dtype) if logdet else None)


class KernelSpaceFactor(NamedTuple):
    """R = I − WᵀQ (F × F, never formed), a square root of the posterior weight covariance: RRᵀ = A⁻¹.

    With LLᵀ = ΦΦᵀ + D, W = L⁻¹Φ and Q = (L + D^{1/2})⁻¹Φ (both N × F, from two triangular solves):
    M = L⁻¹D^{1/2} gives WWᵀ = I − MMᵀ, and H = (I + M)⁻¹ = (L + D^{1/2})⁻¹L (so Q = HW) satisfies
    HM = I − H, hence H + Hᵀ − H·WWᵀ·Hᵀ = I and RRᵀ = I − WᵀW = I − Φᵀ(ΦΦᵀ + D)⁻¹Φ = A⁻¹ (push-through
    identity; derived here).  L + D^{1/2} is triangular with diagonal Lᵢᵢ + √dᵢ ≥ 2√dᵢ > 0 (a Cholesky
    diagonal is a conditional standard deviation, ≥ √dᵢ), so Q costs one more N²·F solve.  At test
    features Φ* the posterior covariance Φ*A⁻¹Φ*ᵀ = (Φ*R)(Φ*R)ᵀ then has the n × F root
    Φ*R = Φ* − (Φ*Wᵀ)Q, positive semi-definite by construction, and a weight draw is m + Rz, z ~ N(0, I_F).
    W and Q are float64 for float32 features where :func:`covariance_dtype` chose float64; the products are then
    formed in float64 and rounded back to their argument's dtype.
    """

    projection: Tensor  #: W = L⁻¹Φ ``(..., N, F)``
    correction: Tensor  #: Q = (L + D^{1/2})⁻¹Φ ``(..., N, F)``

    def posterior_root(self, features: Tensor) -> Tensor:
        """Φ*R = Φ* − (Φ*Wᵀ)Q ``(..., n, F)`` for test features Φ* ``(..., n, F)``, in O(n·N·F)."""
        work = features.to(self.projection.dtype)
        return (work - (work @ self.projection.mT) @ self.correction).to(features.dtype)

    def rows_times_weight_covariance(self, features: Tensor) -> Tensor:
        """Φ_rA⁻¹ = (Φ_rR)Rᵀ ``(..., r, F)`` for feature rows Φ_r ``(..., r, F)``, in O(r·N·F): with
        Φ_rR = Φ_r − (Φ_rWᵀ)Q, then (Φ_rR)Rᵀ = Φ_rR − ((Φ_rR)Qᵀ)W — the two root products of :meth:`posterior_root`,
        so a covariance block Φ_rA⁻¹Φ*ᵀ = (Φ_rR)(Φ*R)ᵀ costs O(r·N·F + r·n·F) instead of the n × F root.  In W's dtype
        (float64 where :func:`covariance_dtype` chose it for float32 features), for that block's product."""
        shape = features.shape
        if self.projection.dim() == 2:  # one factor for every batch member: fold them into the rows (one product)
            features = features.reshape(-1, shape[-1])
        work = features.to(self.projection.dtype)  # Φ_rR kept in W's precision, not rounded between the products
        root = work - (work @ self.projection.mT) @ self.correction
        return (root - (root @ self.correction.mT) @ self.projection).reshape(shape)

    def weight_root_product(self, vectors: Tensor) -> Tensor:
        """Rz = z − Wᵀ(Qz) for columns z ``(..., F, S)``, in O(N·F·S)."""
        work = vectors.to(self.projection.dtype)
        return (work - self.projection.mT @ (self.correction @ work)).to(vectors.dtype)


def kernel_space_posterior_caches(features: Tensor, noise: Tensor,
                                  residual: Tensor) -> tuple[Tensor, KernelSpaceFactor]:
    """(Φᵀ(ΦΦᵀ + D)⁻¹r ``(..., F, 1)``, the :class:`KernelSpaceFactor` of W = L⁻¹Φ and Q = (L + D^{1/2})⁻¹Φ).

    The first equals the feature-space mean cache A⁻¹ΦᵀD⁻¹r; the second gives the posterior covariance
    root and weight draws without an F × F matrix.
    """
    dtype = torch.promote_types(torch.promote_types(features.dtype, noise.dtype), residual.dtype)
    chol = kernel_cholesky(features, noise)
    features, noise, residual = features.to(chol.dtype), noise.to(chol.dtype), residual.to(chol.dtype)
    batch = chol.shape[:-2]
    solve = cholesky_solve(residual.expand(*batch, *residual.shape[-2:]), chol)
    mean_cache = features.mT @ solve
    features = features.expand(*batch, *features.shape[-2:])
    projection = torch.linalg.solve_triangular(chol, features, upper=False)
    shifted = chol + torch.diag_embed(noise.sqrt().expand(*batch, chol.shape[-1]))
    correction = torch.linalg.solve_triangular(shifted, features, upper=False)
    return mean_cache.to(dtype), KernelSpaceFactor(projection, correction)
