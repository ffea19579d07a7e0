"""Kernel mean embeddings, kernel distance (MMD), a permutation two-sample test and kernel PCA.

For a kernel k with feature map φ and point sets P, Q with uniform weights (paper 003 §1)::

    Φ(P) = (1/|P|) Σ_{x∈P} φ(x)                                  (kernel mean embedding)
    κ(P, Q) = (1/|P||Q|) Σ_{x∈P} Σ_{y∈Q} k(x, y)
    D_K(P, Q) = ‖Φ(P) − Φ(Q)‖ = √(κ(P, P) + κ(Q, Q) − 2κ(P, Q))    (kernel distance = MMD)

With a random feature map G (any :class:`~rfgp.features.FeatureMap`: Fourier features,
GaussianSketch, Maclaurin, ...) the estimate is ‖F(P) − F(Q)‖ with F(X) the MEAN of G over X
(paper 003 Thms 3.1/3.3 misprint it as a sum) and ONE draw of G for both sets: independent
draws for P and Q would estimate κ(P, P) + κ(Q, Q) instead of D_K² (sign-randomised sketches
have E⟨T₁a, T₂b⟩ = 0).  The exact ``O(|P|·|Q|)`` computation is done in row chunks
(:func:`exact_gaussian_kernel_distance`: float64 GEMM blocks of the upper triangle, for n ~ 10⁵).

Kernel PCA: :func:`kernel_pca` decomposes one feature matrix; :func:`two_sketch_kernel_pca` is
the two-sketch construction of paper 003 Appendix A (a narrow sketch fixes the subspace, a wide
independent one ranks directions inside it) with its almost-relative-error guarantee.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from gpytorch.kernels import Kernel
from torch import Tensor

from ..core.validation import (
    check_finite,
    check_points,
    check_positive_float,
    check_positive_int,
    check_same_dtype,
    check_seed,
    check_tensor_dtype,
)
from ..features.base import FeatureMap

KernelFunction = Callable[[Tensor, Tensor], Tensor]


def _features(feature_map: FeatureMap, x: Tensor, name: str = "feature_map") -> Tensor:
    """Φ(x), ``(n, F)``, refusing kernels and maps whose output is not one feature row per point.

    A GPyTorch kernel called on X returns its n × n kernel matrix: taken for features it gave a silently
    wrong test statistic (βᵀK instead of Φ's mean embeddings) and cryptic errors elsewhere.
    """
    if isinstance(feature_map, Kernel):
        raise TypeError(f"{name} must be a feature map x ↦ Φ(x) (e.g. rfgp.features.RandomFourierFeatures), got the "
                        f"kernel {type(feature_map).__name__}, whose call gives the n × n kernel matrix, not features")
    features = feature_map(x)
    if not torch.is_tensor(features) or features.dim() != 2 or features.shape[0] != x.shape[0]:
        shape = tuple(features.shape) if hasattr(features, "shape") else type(features).__name__
        raise ValueError(f"{name} must map the ({x.shape[0]}, d) points to an ({x.shape[0]}, F) feature tensor, "
                         f"got {shape}")
    return features


def _check_pair(p: Tensor, q: Tensor) -> None:
    check_points(p, "p")
    check_points(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p and q must have the same dimension, got p: {tuple(p.shape)}, q: {tuple(q.shape)}")
    check_same_dtype(q, "q", p.dtype, "p")


def gaussian_kernel(lengthscale: float = 1.0) -> KernelFunction:
    """The exact RBF kernel k(x, y) = exp(−‖x − y‖²/(2ℓ²)) as a function of two point sets.

    Both sets are shifted by the mean of ``x`` first (k is translation invariant): cdist's matrix-product
    expansion ‖x‖² + ‖y‖² − 2xᵀy otherwise loses the digits of ‖x − y‖² far from the origin.
    """
    lengthscale = check_positive_float(lengthscale, "lengthscale")

    def kernel(x: Tensor, y: Tensor) -> Tensor:
        center = x.mean(0)
        return torch.cdist(x - center, y - center).square().div(-2 * lengthscale**2).exp()

    return kernel


def kernel_mean_embedding(feature_map: FeatureMap, x: Tensor, chunk_size: int = 8192) -> Tensor:
    """``F(X) = (1/|X|) Σ_{x∈X} G(x)``, shape ``(F,)`` (paper 003 §1, the mean — not the sum).

    The features are summed over row chunks of ``chunk_size`` points, so memory is
    O(chunk_size · F) (plus the map's intermediates) for any ``|X|``; a map that fits itself to its first
    inputs is fitted to all of X first.
    """
    x = check_points(x, "x")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    if getattr(feature_map, "fits_on_first_input", False):  # fit on all of X, not on its first chunk
        feature_map.prepare(x)
    total = sum(_features(feature_map, x[i : i + chunk_size]).sum(-2) for i in range(0, x.shape[0], chunk_size))
    return total / x.shape[0]


def kernel_distance(
    feature_map: FeatureMap, p: Tensor, q: Tensor, squared: bool = False, chunk_size: int = 8192
) -> Tensor:
    """Estimate of D_K(P, Q) (or D_K² with ``squared=True``) from ONE feature map applied to both sets.

    ``chunk_size``: rows per feature evaluation (see :func:`kernel_mean_embedding`).  A map that fits itself to
    its first inputs (the optimized Maclaurin allocation) is fitted to P ∪ Q.

    Example:
        >>> import torch
        >>> from rfgp.applications.distances import kernel_distance, exact_gaussian_kernel_distance
        >>> from rfgp.features import RandomFourierFeatures
        >>> phi = RandomFourierFeatures(1024, input_dim=2, seed=0)
        >>> g = torch.Generator().manual_seed(0)
        >>> p, q = torch.randn(500, 2, generator=g), torch.randn(400, 2, generator=g) + 1.0
        >>> d = kernel_distance(phi, p, q)
        >>> bool(abs(d - exact_gaussian_kernel_distance(p, q)) < 0.05)     # same draw of Φ for P and Q
        True
    """
    _check_pair(p, q)
    if getattr(feature_map, "fits_on_first_input", False):  # fit on P ∪ Q, not on P: D(P, Q) = D(Q, P)
        feature_map.prepare(torch.cat((p, q)))
    difference = kernel_mean_embedding(feature_map, p, chunk_size) - kernel_mean_embedding(feature_map, q, chunk_size)
    if squared:
        return difference.square().sum(-1)
    # ‖·‖ rather than √(‖·‖²): at D = 0 (P = Q) the latter's gradient is 0·∞ = NaN, torch's norm gives the subgradient 0
    return torch.linalg.vector_norm(difference, dim=-1)


def mean_kernel(kernel: KernelFunction, x: Tensor, y: Tensor, chunk_size: int = 2048) -> Tensor:
    """κ(X, Y) = mean of k(x, y) over X × Y, accumulated over row chunks of X (memory ``O(chunk·|Y|)``)."""
    check_points(x, "x")
    check_points(y, "y")
    check_same_dtype(y, "y", x.dtype, "x")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    total = sum(kernel(x[i : i + chunk_size], y).sum() for i in range(0, x.shape[0], chunk_size))
    return total / (x.shape[0] * y.shape[0])


def exact_kernel_distance(
    kernel: KernelFunction, p: Tensor, q: Tensor, squared: bool = False, chunk_size: int = 2048
) -> Tensor:
    """Exact D_K(P, Q) = √(κ(P,P) + κ(Q,Q) − 2κ(P,Q)) in ``O((|P| + |Q|)²)`` time, chunked rows.

    ``kernel`` maps two point sets to their dense kernel matrix (e.g. :func:`gaussian_kernel`).
    Negative round-off of D_K² is clamped to 0 before the square root.
    """
    _check_pair(p, q)
    value = mean_kernel(kernel, p, p, chunk_size) + mean_kernel(kernel, q, q, chunk_size)
    value = value - 2 * mean_kernel(kernel, p, q, chunk_size)
    return value if squared else value.clamp_min(0).sqrt()


def exact_gaussian_kernel_distance(
    p: Tensor, q: Tensor, lengthscale: float = 1.0, squared: bool = False, chunk_size: int = 2048
) -> Tensor:
    """Exact D_K(P, Q) for the RBF kernel exp(−‖x − y‖²/(2ℓ²)), in float64, for large sets.

    Uses the signed-weight form D_K² = βᵀKβ over Z = P ∪ Q with ``β = 1/|P|`` on P and ``−1/|Q|`` on Q
    (paper 003 §1).  K is never formed: ``chunk_size`` × 8·``chunk_size`` blocks of the upper
    triangle are built from one GEMM each, ‖z − z'‖² = ‖z‖² + ‖z'‖² − 2zᵀz' of the centred points (clamped at 0), and
    symmetry (off-diagonal blocks counted twice) halves the ``(|P| + |Q|)²`` kernel evaluations.
    Memory O(chunk_size²); same value as :func:`exact_kernel_distance` with :func:`gaussian_kernel`.
    """
    _check_pair(p, q)
    lengthscale = check_positive_float(lengthscale, "lengthscale")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    z = torch.cat((p, q)).double() / lengthscale
    # k is translation invariant: centring keeps ‖z‖² + ‖z'‖² − 2zᵀz' from cancelling ‖z‖² ≫ ‖z − z'‖² (far
    # from the origin, e.g. coordinates in metres or timestamps, the expansion lost all but a few digits)
    z = z - z.mean(0)
    n, num_p = z.shape[0], p.shape[0]
    beta = torch.full((n,), -1.0 / (n - num_p), dtype=z.dtype, device=z.device)
    beta[:num_p] = 1.0 / num_p
    norms = z.square().sum(-1)
    column_chunk = 8 * chunk_size
    total = torch.zeros((), dtype=z.dtype, device=z.device)
    for i in range(0, n, chunk_size):
        rows = slice(i, i + chunk_size)
        for j in range(i, n, column_chunk):
            cols = slice(j, j + column_chunk)
            block = z[rows] @ z[cols].T
            # −½‖z − z'‖² = zᵀz' − ½‖z‖² − ½‖z'‖², built in place to keep one block in memory
            block.sub_(norms[rows, None] / 2).sub_(norms[None, cols] / 2).clamp_max_(0).exp_()
            weighted = beta[rows] @ block
            # columns before the row block's end that lie in it are the diagonal block (counted once)
            diagonal = max(0, min(i + chunk_size, n) - j)
            total += weighted[:diagonal] @ beta[j : j + diagonal] + 2 * (weighted[diagonal:] @ beta[j + diagonal : j + column_chunk])
    return total if squared else total.clamp_min(0).sqrt()


# --------------------------------------------------------------------------- two-sample test
@dataclass
class TwoSampleTestResult:
    """Outcome of :func:`two_sample_test`.

    Attributes:
        statistic: the squared kernel distance D̂²(P, Q) of the observed split.
        p_value: (1 + #{permutations with D̂² ≥ statistic}) / (1 + num_permutations).
        threshold: the critical value: ``reject`` is exactly ``statistic > threshold``.  It is the (c + 1)-th
            largest permutation statistic, c the most permutation statistics ≥ D̂² that still give
            p_value ≤ level (close to the (1 − level) quantile, which disagreed with ``reject`` when the +1
            of the p-value or the quantile's interpolation decided).
        reject: whether H₀ (same distribution) is rejected at ``level`` (p_value ≤ level).
        null_statistics: the permutation statistics, shape ``(num_permutations,)``.
    """

    statistic: Tensor
    p_value: float
    threshold: Tensor
    reject: bool
    null_statistics: Tensor


def permutation_statistics(features: Tensor, num_p: int, permutations: Tensor) -> Tensor:
    """D̂² of every relabelling: the first ``num_p`` permuted rows form P, the rest Q.

    ``features`` is (n, F) for the stacked P ∪ Q and ``permutations`` (B, n) row orders.
    With signed weights ``β = 1/|P|`` on P and ``−1/|Q|`` on Q (paper 003 §1), F(P) − F(Q) = βᵀΦ, so
    all B statistics are one (B × n)(n × F) product: the features are computed once.
    """
    n = features.shape[0]
    if check_positive_int(num_p, "num_p") >= n:
        raise ValueError(f"num_p must leave both sets non-empty: 1 ≤ num_p < n = {n}, got {num_p}")
    if permutations.dim() != 2 or permutations.shape[1] != n or permutations.is_floating_point():
        raise ValueError(f"permutations must be a (B, n = {n}) integer tensor of row orders, got "
                         f"{tuple(permutations.shape)} of dtype {permutations.dtype}")
    base = torch.full((n,), -1.0 / (n - num_p), dtype=features.dtype, device=features.device)
    base[:num_p] = 1.0 / num_p
    weights = torch.zeros(permutations.shape, dtype=features.dtype, device=features.device)
    weights.scatter_(-1, permutations, base.expand(permutations.shape))
    return (weights @ features).square().sum(-1)


def two_sample_test(
    feature_map: FeatureMap,
    p: Tensor,
    q: Tensor,
    num_permutations: int = 1000,
    level: float = 0.05,
    seed: int | None = None,
    batch_size: int = 256,
) -> TwoSampleTestResult:
    """Kernel two-sample test of H₀: P and Q come from one distribution (Gretton et al.; paper 003 §4).

    The statistic D̂²(P, Q) uses one sketch G; the null distribution comes from relabelling the
    pooled points ``num_permutations`` times with the SAME cached features (each permutation
    costs O(nF), vectorised in batches of ``batch_size`` permutations).  The p-value counts the
    observed split as one permutation, so the test has size ≤ ``level`` under H₀.

    Args:
        feature_map: any rfgp feature map (draws shared by P, Q and every permutation).
        p, q: point sets ``(n₁, d)`` and ``(n₂, d)``.
        num_permutations: B, the number of random relabellings.
        level: significance level in (0, 1).
        seed: seed of the permutation generator (``None``: torch's global generator).
        batch_size: permutations evaluated per matrix product (memory O(batch_size · n)).

    Raises:
        ValueError: if ``num_permutations`` is too small for the test ever to reject at ``level``
            (the smallest p-value is 1/(B + 1), so B + 1 ≥ 1/level is needed).
    """
    _check_pair(p, q)
    num_permutations = check_positive_int(num_permutations, "num_permutations")
    batch_size = check_positive_int(batch_size, "batch_size")
    level = check_positive_float(level, "level")
    if level >= 1:
        raise ValueError(f"level must lie in (0, 1), got {level}")
    # c: the most permutation statistics ≥ D̂² with (1 + c)/(1 + B) ≤ level, by the p-value's own float comparison
    allowed = int(level * (1 + num_permutations)) - 1
    allowed += (2 + allowed) / (1 + num_permutations) <= level
    allowed -= allowed >= 0 and (1 + allowed) / (1 + num_permutations) > level
    if allowed < 0:
        needed = math.ceil(1 / level) - 1
        needed += 1 / (1 + needed) > level
        raise ValueError(f"num_permutations={num_permutations} can never reject at level={level}: the smallest "
                         f"p-value is 1/(num_permutations + 1) = {1 / (1 + num_permutations):.4g}; use "
                         f"num_permutations ≥ {needed}")
    generator = torch.Generator().manual_seed(
        check_seed(seed) if seed is not None else int(torch.randint(2**62, (1,)).item()))
    features = _features(feature_map, torch.cat((p, q), dim=0))
    n, num_p = features.shape[0], p.shape[0]
    identity = torch.arange(n, device=features.device).unsqueeze(0)
    statistic = permutation_statistics(features, num_p, identity)[0]
    null = []
    for start in range(0, num_permutations, batch_size):
        count = min(batch_size, num_permutations - start)
        orders = torch.argsort(torch.rand(count, n, generator=generator), dim=-1).to(features.device)
        null.append(permutation_statistics(features, num_p, orders))
    null = torch.cat(null)
    p_value = (1 + (null >= statistic).sum().item()) / (1 + num_permutations)
    threshold = null.sort(descending=True).values[allowed]
    return TwoSampleTestResult(statistic, p_value, threshold, p_value <= level, null)


# --------------------------------------------------------------------------- kernel PCA
@dataclass
class KernelPCA:
    """Kernel PCA in feature space (paper 003 Appendix A).

    Attributes:
        eigenvalues: top-k eigenvalues of the (centred) Gram matrix ΦΦᵀ, descending, ``(k,)``.
        basis: V, the n × k orthonormal top-k left singular vectors of Φ (the Gram eigenvectors).
        scores: the projections of the points on the principal axes, V·diag(√λ), ``(n, k)``.
        components: the principal axes in feature space, ``(F, k)``.
        mean: the feature mean removed before the decomposition (zeros if not centred), ``(F,)``.
    """

    eigenvalues: Tensor
    basis: Tensor
    scores: Tensor
    components: Tensor
    mean: Tensor

    def transform(self, feature_map: FeatureMap, x: Tensor) -> Tensor:
        """Scores of new points: (φ(x) − mean) · components, ``(m, k)``."""
        return (_features(feature_map, x) - self.mean) @ self.components


def kernel_pca(feature_map: FeatureMap, x: Tensor, num_components: int, center: bool = True) -> KernelPCA:
    """Kernel PCA of X from its features Φ (n × F): the SVD Φ = U S Wᵀ gives K ≈ ΦΦᵀ = U S² Uᵀ.

    Costs O(n F²) instead of the O(n³) eigendecomposition of K.  ``center=True`` centres the
    features, i.e. decomposes H K H with H = I − 11ᵀ/n (classical kernel PCA); ``False`` gives
    the uncentred rank-k approximation of paper 003 Appendix A, where
    ‖B_X − VVᵀB_X‖²_F = Tr(K) − Tr(VᵀKV) is compared with Σ_{i>k} λᵢ(K).
    """
    check_points(x, "x")
    num_components = check_positive_int(num_components, "num_components")
    features = _features(feature_map, x)
    if num_components > min(features.shape):
        raise ValueError(
            f"num_components must be ≤ min(n, num_features) = {min(features.shape)}, got {num_components}"
        )
    mean = features.mean(0) if center else torch.zeros_like(features[0])
    left, singular, right_t = torch.linalg.svd(features - mean, full_matrices=False)
    left, singular = left[:, :num_components], singular[:num_components]
    return KernelPCA(singular.square(), left, left * singular, right_t[:num_components].T, mean)


def exact_kernel_pca_eigenvalues(kernel: KernelFunction, x: Tensor, num_components: int, center: bool = True) -> Tensor:
    """Top-k eigenvalues of the exact n × n Gram matrix (H K H if ``center``), O(n³), for reference (k ≤ n)."""
    num_components = check_positive_int(num_components, "num_components")
    if num_components > check_points(x, "x").shape[0]:
        raise ValueError(f"num_components must be ≤ n = {x.shape[0]} (the Gram matrix has n eigenvalues), "
                         f"got {num_components}")
    gram = kernel(x, x)
    if center:
        gram = gram - gram.mean(0, keepdim=True) - gram.mean(1, keepdim=True) + gram.mean()
    return torch.linalg.eigvalsh(gram).flip(0)[:num_components]


@dataclass
class SketchedKernelPCA:
    """Output of :func:`two_sketch_kernel_pca`.

    Attributes:
        basis: V = UW, an n × k matrix with orthonormal columns approximating the top-k
            eigenvectors of the (uncentred) Gram matrix K.
        singular_values: the top-k singular values of UᵀN, ``(k,)`` (their squares estimate the
            top-k eigenvalues of K).
        range_rank: the rank of the range sketch M (the width of U).
    """

    basis: Tensor
    singular_values: Tensor
    range_rank: int


def two_sketch_kernel_pca(range_map: FeatureMap, projection_map: FeatureMap, x: Tensor, num_components: int) -> SketchedKernelPCA:
    r"""Rank-k kernel PCA basis from two independent sketches (paper 003 Appendix A; Avron et al. 2014).

    With K = B_X B_Xᵀ the Gram matrix of X, the algorithm of Thm A.2 (GaussianSketch) / Thm A.7
    (GaussianSketchHD) is:

        M = G(X) (n × m),  N = H(X) (n × r),   G, H independent sketches, r ≫ m
        U = orthonormal basis of col(M)                          (n × rank M)
        W = top-k left singular vectors of UᵀN                   (rank M × k)
        V = U W

    and with constant probability ‖B_X − VVᵀB_X‖²_F = Tr(K) − Tr(VᵀKV)
    ≤ (1 + ε)‖B_X − [B_X]_k‖²_F + α = (1 + ε) Σ_{i>k} λᵢ(K) + α, for m = Θ(d(k² + k/ε)),
    r = Θ(d m²/ε²) and the truncation order s chosen with ξ = 4n² (Thm A.2; the paper's
    constants are unspecified: calibrate m and r empirically).  The narrow sketch M only fixes
    the subspace; the wide sketch N estimates B_X's energy inside it (UᵀN ≈ UᵀB_X up to a
    near-isometry), so a second, wider sketch buys accuracy without an n × r basis.  Costs
    O(n m² + n m r) after the features; no n × n matrix is formed.

    Args:
        range_map: G, width m (e.g. ``GaussianSketch(m, ...)``).
        projection_map: H, width r, drawn independently of G (another seed).
        x: the n points ``(n, d)``.
        num_components: k ≤ rank of G(X).
    """
    check_points(x, "x")
    num_components = check_positive_int(num_components, "num_components")
    range_features = _features(range_map, x, "range_map")
    # orthonormal basis of col(M) from its SVD, dropping directions at round-off level
    left, singular, _ = torch.linalg.svd(range_features, full_matrices=False)
    tolerance = max(range_features.shape) * torch.finfo(singular.dtype).eps * singular[0]
    rank = int((singular > tolerance).sum())
    if num_components > rank:
        raise ValueError(f"num_components must be ≤ rank of the range sketch G(x) = {rank}, got {num_components}")
    basis = left[:, :rank]
    projected = basis.mT @ _features(projection_map, x, "projection_map").to(basis.dtype)  # UᵀN, rank × r
    top, values, _ = torch.linalg.svd(projected, full_matrices=False)
    return SketchedKernelPCA(basis @ top[:, :num_components], values[:num_components], rank)


def projection_residual(kernel: KernelFunction, x: Tensor, basis: Tensor, chunk_size: int = 2048) -> Tensor:
    """‖B_X − VVᵀB_X‖²_F = Tr(K) − Tr(VᵀKV) for orthonormal V, exactly, in O(n²k) over row chunks.

    The quantity bounded by paper 003 Thm A.2 (its proof's first line), compared with the best
    rank-k value Σ_{i>k} λᵢ(K) = Tr(K) − Σ_{i≤k} λᵢ(K) (:func:`exact_kernel_pca_eigenvalues`
    with ``center=False``).
    """
    check_points(x, "x")
    chunk_size = check_positive_int(chunk_size, "chunk_size")
    check_tensor_dtype(basis, "basis")
    if basis.dim() != 2 or basis.shape[0] != x.shape[0]:
        raise ValueError(f"basis must be (n, k) with n = {x.shape[0]} rows, got shape {tuple(basis.shape)}")
    check_finite(basis, "basis")
    total = torch.zeros((), dtype=basis.dtype, device=basis.device)
    for i in range(0, x.shape[0], chunk_size):
        rows = x[i : i + chunk_size]
        block = kernel(rows, x).to(basis.dtype)  # K[chunk, :]
        trace = kernel(rows, rows).diagonal().sum()
        total += trace - (basis[i : i + chunk_size] * (block @ basis)).sum()
    return total
