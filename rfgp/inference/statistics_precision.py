"""The precision of the feature statistics G = ΦᵀWΦ and B = ΦᵀWr for float32 features, chosen by an a-priori bound.

A feature-space GP factorises A = I + G, whose eigenvalues are ≥ 1 in exact arithmetic; the factor is float64 for
float32 models (:func:`~rfgp.inference.linalg.capacitance_cholesky`), but the N·F² statistics are formed before it.
Formed in float32, G carries a rounding error ΔG; beside the identity it changes log|A|, BᵀA⁻¹B and their gradients by
relative amounts of order ‖A⁻¹ΔG‖₂ ≤ ‖ΔG‖₂, and makes A indefinite once ‖ΔG‖₂ approaches 1.  (The rounding of the
float32 features themselves is different: the Gram matrix of rounded features is positive semi-definite, the model of
slightly perturbed features.)

Bound.  A product of inner dimension n formed in floating point satisfies ``|fl(XᵀY) − XᵀY| ≤ γₙ|X|ᵀ|Y|``
elementwise, γₙ = nu/(1 − nu) with u the unit roundoff (Higham, *Accuracy and Stability of Numerical Algorithms*,
2nd ed., 2002, §3.5, eq. (3.13)); forming WΦ first adds one rounding.  For G = (WΦ)ᵀΦ over N rows, with
``‖|M|‖₂ ≤ ‖M‖_F``::

    |ΔG| ≤ γ_{N+1}·|Φ|ᵀW|Φ|,    ‖ΔG‖₂ ≤ γ_{N+1}·‖W^½|Φ|‖_F² = γ_{N+1}·Σᵢ wᵢ‖φᵢ‖² = γ_{N+1}·tr(G).

γ_{N+1} ≈ N·u is the worst case; modelling the rounding errors as independent with mean zero gives ≈ √N·u with high
probability (Higham & Mary, *A New Approach to Probabilistic Rounding Error Analysis*, SIAM J. Sci. Comput. 41(5),
2019), and BLAS kernels sum in short blocks with their own accumulators, which lowers it further.  rfgp therefore
uses the estimate::

    ε̂ = u·tr(G) = u·Σᵢ wᵢ‖φᵢ‖²                (O(N·F): one pass over Φ, no F × F product)

and forms the statistics in float32 while ε̂ ≤ τ (:class:`rfgp.settings.float32_statistics_tolerance`, default
10⁻¹), in float64 (:func:`~rfgp.core.dtypes.factor_dtype`) otherwise.  Measured
(``benchmarks/results/float32_statistics_threshold.md``: float32 ExactGP, F = 512, N = 1 500–20 000, MKL on one CPU
thread): ‖ΔG‖₂ = 0.06–0.10·ε̂ for N ≤ 2·10⁴ (it grows slowly with N: 0.3–0.4·ε̂ at N = 2·10⁵, and features
with a large common mean round coherently, Maclaurin 0.35–1.4·ε̂ and a linear kernel on offset inputs 14–66·ε̂:
``benchmarks/results/float32_statistics_refined.md``, which also shows that no estimate built on A = I + G
separates those models from the benign ones), and, against the float64 model,

=========  ===========================  ================================  ================
u·tr(G)    loss per point, f32 / f64    gradient (relative), f32 / f64    λ_min(I + G₃₂)
=========  ===========================  ================================  ================
10⁻³       1–2·10⁻⁷ / ≤ 4·10⁻⁷          0.4–2·10⁻⁶ / ≤ 1.2·10⁻⁶           1.000
10⁻²       0.2–2·10⁻⁶ / ≤ 1.4·10⁻⁶      0.4–2·10⁻⁵ / ≤ 1·10⁻⁵             0.999
10⁻¹       1.6–4·10⁻⁵ / ≤ 5.4·10⁻⁵      0.8–3·10⁻⁴ / ≤ 7·10⁻⁵             0.99
1          2–3·10⁻³ / ≤ 1·10⁻⁴          0.8–1.3·10⁻² / ≤ 9·10⁻⁴           0.90–0.95
10         0.24–0.29 / ≤ 2·10⁻³         1.2–1.5 / ≤ 3·10⁻³                0.15–0.42
10²        indefinite                   —                                 −5 to −8
=========  ===========================  ================================  ================

("f32": statistics in float32; "f64": the same float32 features, statistics in float64 — the features' own
rounding.)  Up to ε̂ = 10⁻² the float32 statistics' error is of the order of the features' (loss) or within 2·10⁻⁵
(gradient); at ε̂ = 0.1 it is at most 4·10⁻⁵ per point in the loss and 3·10⁻⁴ relative in the gradient (more than the
features' share at N = 20 000, within float32 training's own accuracy), and beyond it grows quadratically, reaching
1 % of the gradient at ε̂ = 1.  τ = 10⁻¹ keeps the statistics in float32 — whose float64 products cost 1.8–1.9× per
training step on CPU, ``benchmarks/results/float32_statistics_training.md`` — for as many models as that accuracy
allows: a margin of 30 below the 1 % gradient error and 10³ below indefiniteness.  At the default noise of a
``GaussianLikelihood`` (σ² ≈ outputscale) ε̂ ≈ u·N: float32 statistics up to N ≈ 1.7·10⁶; at a trained
outputscale/noise ratio ρ, up to N ≈ 1.7·10⁶/ρ.  (GPU BLAS libraries sum in other orders: the
deterministic bound holds for any order, the constant 0.06–0.1 was measured on CPU only.)

tr(G) is the quantity a stream accumulates too: the float32 errors of the batches a ``StreamingFeatureGP`` formed in
float32 add up to at most u·Σₖ tr(Gₖ) ≤ u·tr(G_total), so the stream compares u·tr(G_total) (earlier batches
included) with τ, and every later batch is formed in float64 once it is exceeded.

Where it applies: the marginal likelihood (forward and backward), the posterior caches, the leave-one-out terms
(:mod:`rfgp.inference.leave_one_out`) and BoTorch's pathwise update (:mod:`rfgp.integrations.botorch`) of a
feature-root model with a materialised Φ
(:meth:`~rfgp.inference.operators.FeatureRootLinearOperator.feature_statistics`, Nyström roots Φ = K·L⁻ᵀ included: K
and L are cast with Φ) or a chunked one (:func:`~rfgp.inference.chunking.chunked_feature_statistics`, and
:func:`~rfgp.inference.triangular_statistics.chunked_triangular_statistics` for Nyström: tr(G) is read off the float32
result, which is then recomputed in float64 if needed — no extra pass for a benign model); multi-output roots,
materialised or chunked (:mod:`~rfgp.inference.multioutput_chunking`), with independent tasks (a batch of task systems:
the largest member's trace decides) or correlated task noise (the whitened rows WΦ, D = I); Dirichlet classification
(:mod:`~rfgp.inference.classification`: tr(ΦᵀD_c⁻¹Φ) = β_{c,on}t_c + β_{c,off}(Σ_k t_k − t_c) from the per-label traces
t_k = tr(Φ_kᵀΦ_k), the largest class decides; one O(N·F) pass over a materialised Φ, read off the float32 per-label
Grams of a chunked one); complex features (:mod:`~rfgp.inference.complex_posterior`: tr(ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°) =
2·Σᵢ‖ψᵢ‖²/σᵢ²); ``StreamingFeatureGP.update``; and the kernel-space path (N ≤ F,
:func:`~rfgp.inference.kernel_space.covariance_dtype`), which forms and factorises the N × N matrix K = sΦΦᵀ + D
instead: its rounding beside the noise floor D is bounded by the same trace, ‖D^{-1/2}ΔK D^{-1/2}‖₂ ≤
γ_{F+1}·tr(sΦᵀD⁻¹Φ) (inner dimension F; derived and measured in :mod:`rfgp.inference.kernel_space`), so K, its
Cholesky factor, the solves, the backward products and the posterior factor are float64 where u·tr(sΦᵀD⁻¹Φ)
exceeds τ — the decision the feature path takes for the same model — in the marginal likelihood and its gradient,
the posterior caches, leave-one-out terms, BoTorch's pathwise update and log-densities under the posterior.  The
choice changes the accuracy of the same model, never the model.

The residual. The quadratic term q = rᵀ(ΦΦᵀ + D)⁻¹r = rᵀWr − BᵀA⁻¹B (W = D⁻¹, B = ΦᵀWr, α = A⁻¹B) is a difference of two
terms of size ‖r‖²/σ², so its pieces are taken as follows. (i) W and r are cast to the statistics' precision once and
every term uses those tensors (:func:`~rfgp.inference.operators.widened_statistics_inputs`): their gradients, ∂rᵀWr/∂w =
Σr² against ∂BᵀA⁻¹B/∂w ≈ Σr², meet in float64; cast separately for each use, each was rounded to float32 before they
cancelled, and a float32 model whose statistics were float64 had its noise gradient up to 120 % and its mean's 6 % off
the float64 model (N = 500–5 000, noise 10⁻⁴, targets 0–10⁴; ≤ 3·10⁻⁶ now). (ii) rᵀWr is summed in float64 (O(N)): in
float32 it erred by u·rᵀWr, i.e. u·κ relative to q with κ = rᵀWr/q up to 10⁶ for targets far from the mean. (iii) The
Gram: to first order Δq = αᵀΔGα, and since q = min_β ‖β‖² + ‖W^½(r − Φβ)‖² = ‖α‖² + ‖W^½(r − Φα)‖² ≥ ‖α‖², ``|Δq| ≤
‖ΔG‖₂·‖α‖² ≤ ‖ΔG‖₂·q``: the quadratic term's error relative to q is bounded by the same ε̂ as log|A|'s — it grows with q
(as the float32 loss's own rounding ``u·|q|`` does), not with ‖r‖²/σ² — so the rule needs no residual term for the loss.
(iv) B's float32 rounding, ``|ΔB| ≤ γ_N|Φ|ᵀW|r|`` (Higham, eq. (3.13)), changes q by ``|2αᵀΔB| ≤
2γ_N·(rᵀWr·tr(G))^½·‖α‖`` (Cauchy–Schwarz, ‖α‖² ≤ q), of the order of (iii) where measured: forming B in float64 beside
a float32 G did not lower the errors (N = 500/5 000, F = 256, targets 0–10⁴: loss and gradient errors within a factor
2–4 either way; the noise gradient 5.3 % off with a float64 B against 0.28 % with the float32 one at N = 5 000, offset
10⁴, noise 10⁻²), so B stays in the statistics' precision. Not covered: the noise gradient ∂q/∂w = ‖r − Φα‖² (uniform w)
carries G's rounding as αᵀΔG₀α ≤ ε̂·‖α‖²/w (G₀ = ΦᵀΦ), a relative error of at most about ε̂·(1 + ρ), ρ = ‖α‖²/(q −
‖α‖²). With float32 statistics kept at ε̂ = 3·10⁻³–0.03 it is up to 4 % off (chunked 7 %) at targets 10³–10⁴ from the
mean, against ≤ 3·10⁻³ at ≤ 10 (N = 500–5 000, F = 256–2048, ``benchmarks/results/float32_residual_precision.md``; the
N × N path at the same ε̂: ≤ 10⁻⁵). ε̂·(1 + ρ) bounded the error in all 16 cases measured (N = 500/5 000, F = 256), but
ρ = 6–13 at every offset, 0 included: it does not single out the far-off targets, and as a rule it would be τ lowered
tenfold, float64 for benign models too; ρ also needs α, known only after the float32 solve (a second host
synchronisation). No residual term was added to the rule. Centre the targets (or train a mean) before float32 training,
or use ``float32_statistics_tolerance(0)``.

Under :class:`rfgp.inference.distributed.data_parallel` every path sums tr(G) over the processes before comparing
(each rank holds only its shard of the N points), so all ranks choose the precision that one process holding all the
data would choose.

The decision reads one number from the device (a host synchronisation) per evaluation; ``τ = 0`` and ``τ = math.inf``
decide without the data.  :func:`recorded_statistics_dtypes` reports the decisions (a diagnostic and testing hook).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterator

import torch
from torch import Tensor

from ..core import settings
from ..core.dtypes import factor_dtype

_RECORDS: list[list[torch.dtype]] = []


def unit_roundoff(dtype: torch.dtype) -> float:
    """u = eps/2 of ``dtype`` (2⁻²⁴ for float32)."""
    return torch.finfo(dtype).eps / 2


def weighted_square_norm(features: Tensor, weights: Tensor) -> Tensor:
    """tr(ΦᵀWΦ) = Σᵢ wᵢ‖φᵢ‖² per batch member, for Φ ``(..., N, F)`` and weights ``(..., N)`` or uniform ``(..., 1)``;
    without a graph."""
    with torch.no_grad():
        norms = torch.linalg.vector_norm(features, dim=-1).square()
        if weights.shape[-1] == 1:
            return norms.sum(-1) * weights[..., 0]
        return (norms * weights).sum(-1)


def statistics_dtype(dtype: torch.dtype, device: torch.device, trace: Callable[[], Tensor]) -> torch.dtype:
    """The dtype to form the statistics G, B of ``dtype`` features in: ``dtype``, or :func:`factor_dtype` (float64)
    where u·tr(G) exceeds :class:`rfgp.settings.float32_statistics_tolerance`.

    ``trace`` returns tr(G) (one per batch member: the largest decides); it is called only where the two dtypes differ
    and the tolerance is neither 0 nor ∞.  The comparison reads one number from the device (a host synchronisation).
    """
    wide = factor_dtype(dtype, device)
    tolerance = settings.float32_statistics_tolerance.value()
    if wide == dtype:
        return dtype
    if tolerance == math.inf:
        chosen = dtype
    elif tolerance == 0:
        chosen = wide
    else:
        estimate = trace().max() * unit_roundoff(dtype)
        chosen = dtype if bool(estimate <= tolerance) else wide
    for record in _RECORDS:
        record.append(chosen)
    return chosen


@contextlib.contextmanager
def recorded_statistics_dtypes() -> Iterator[list[torch.dtype]]:
    """A list that collects the dtype chosen by every :func:`statistics_dtype` decision made inside the block.

    A diagnostic hook (which path did my float32 model take?) and the tests' way to check the decision; decisions of
    float64 models, which have nothing to decide, are not recorded.

    Example:
        >>> from rfgp.inference.statistics_precision import recorded_statistics_dtypes
        >>> with recorded_statistics_dtypes() as dtypes:
        ...     pass  # an MLL evaluation or a StreamingFeatureGP.update of a float32 model
        >>> dtypes
        []
    """
    record: list[torch.dtype] = []
    _RECORDS.append(record)
    try:
        yield record
    finally:
        _RECORDS.remove(record)
