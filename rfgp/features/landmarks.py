"""Landmark (inducing point) selection for the Nyström method: uniform, k-means++, ridge leverage scores.

The Nyström approximation K ≈ K_{xZ} K_{ZZ}⁻¹ K_{Zx} is as good as its landmarks Z are at
spanning the data in the kernel's feature space.  Three selectors, all returning M rows of
the sample x (so that K_{ZZ} is a principal submatrix of the data Gram matrix):

* :func:`uniform_landmarks` — M distinct points drawn uniformly among the rows without
  replacement (Williams & Seeger 2001), a row equal to one already chosen skipped.  Cheapest;
  poor when the data are very unevenly spread.
* :func:`kmeanspp_landmarks` — k-means++ seeding (Arthur & Vassilvitskii 2007): each new
  landmark is drawn with probability ∝ D²(x), the squared distance to the nearest landmark
  chosen so far.  With a ``kernel`` the distance is the feature-space one,
  D²(x, z) = k(x, x) + k(z, z) − 2k(x, z) (kernel k-means++ landmarks, Oglic & Gärtner 2017),
  which honours lengthscales, periodicity and any other structure of the kernel.
* :func:`ridge_leverage_landmarks` — M distinct rows drawn without replacement with probability ∝
  approximate λ-ridge leverage scores τᵢ(λ) = [K(K + λI)⁻¹]ᵢᵢ (Alaoui & Mahoney 2015),
  estimated from a uniform pilot sample S of s points as in Musco & Musco 2017 (§3):

      τ̃ᵢ(λ) = (k(xᵢ, xᵢ) − k_{iS}(K_{SS} + λI)⁻¹k_{Si}) / λ,

  the λ-regularised Nyström residual of point i, which over-estimates τᵢ(λ) for every S.
  Points the pilot already explains get small scores, points in sparsely covered regions
  large ones.  Cost O(n·s² + s³).  The default λ is the ⌈s/2⌉-th largest eigenvalue of
  (n/s)·K_{SS}, the pilot's Nyström estimate of K's spectrum (floored at 10⁻⁶·mean k(x, x)):
  about half of the spectrum the landmarks can hold lies above λ, so d_eff(λ) is of the
  order of M, the regime in which M landmarks suffice.  In a GP the noise variance σ² is
  the natural λ (pass ``regularization=``).

:func:`approximate_ridge_leverage_scores` exposes the scores.

Landmarks are distinct points.  A repeated point adds nothing to span{φ(z)} and makes K_{ZZ}
singular (the jitter would absorb it and silently waste part of the width M), so every selector
skips rows equal to a chosen one (rows are grouped with ``torch.unique`` on x's device, one
synchronisation at selection time) and raises a ``ValueError`` naming ``num_landmarks`` when x has
fewer than M distinct rows: pass fewer landmarks, or a sample with more distinct points.  A point
repeated r times weighs as its r rows together (r times as likely to come first under uniform
selection; its rows' leverage scores pooled under "rls").  Data without repeated rows give the same
landmarks as without this rule.  k-means++ distances and leverage scores are worked in float64 for
float32 input (as the Nyström factor is, :func:`rfgp.core.dtypes.factor_dtype`): the selection
then depends on the values of x, not on its dtype.

Sampling without replacement and without reweighting is what Nyström needs: the
approximation K_{xZ}K_{ZZ}⁻¹K_{Zx} is the projection onto span{φ(z)}, which column
scaling does not change.

Kernels enter as a callable ``kernel(x1, x2, diag=False)`` returning the dense
``(..., n1, n2)`` cross-covariance (or the ``(..., n)`` diagonal for ``diag=True``), so
this module needs no GPyTorch; batch dimensions of the kernel are averaged.
Randomness: ``seed`` (an int) or ``generator`` (a ``torch.Generator``, whose device the
draws are made on); with neither, torch's global generator.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from ..core.dtypes import factor_dtype
from ..core.validation import check_points, check_positive_float, check_positive_int, check_seed

KernelFunction = Callable[..., Tensor]

LANDMARK_METHODS = ("uniform", "kmeans++", "rls")


def select_landmarks(x: Tensor, num_landmarks: int, method: str = "uniform", kernel: KernelFunction | None = None,
                     seed: int | None = None, generator: torch.Generator | None = None, **options) -> Tensor:
    """Dispatch to the selector named ``method`` (one of :data:`LANDMARK_METHODS`); returns ``(M, d)`` rows of x."""
    if method == "uniform":
        return uniform_landmarks(x, num_landmarks, seed=seed, generator=generator, **options)
    if method == "kmeans++":
        return kmeanspp_landmarks(x, num_landmarks, kernel=kernel, seed=seed, generator=generator, **options)
    if method == "rls":
        if kernel is None:
            raise ValueError("landmarks='rls' needs the kernel whose ridge leverage scores it samples by (kernel=None)")
        return ridge_leverage_landmarks(x, num_landmarks, kernel, seed=seed, generator=generator, **options)
    raise ValueError(f"landmarks must be one of {', '.join(repr(m) for m in LANDMARK_METHODS)}; got {method!r}")


def uniform_landmarks(x: Tensor, num_landmarks: int, seed: int | None = None,
                      generator: torch.Generator | None = None) -> Tensor:
    """M distinct points of x drawn uniformly among its rows without replacement, ``(M, d)``.

    The rows are put in a uniformly random order and the first M *distinct* ones are kept: a row equal
    to one already chosen is skipped, so a point repeated r times in x is r times as likely to be drawn
    first as a single one (it holds r times the data), yet never twice.  Without repeated rows this is
    the first M rows of one uniform permutation, and the same seed at a larger M extends the draw.

    Raises:
        ValueError: when x has fewer than ``num_landmarks`` distinct rows.
    """
    num_landmarks = _check_sample(x, num_landmarks)
    groups, count = distinct_rows(x)
    _check_distinct(count, num_landmarks, "distinct rows")
    generator = _generator(seed, generator)
    order = torch.randperm(x.shape[0], generator=generator, device=_draw_device(generator, x)).to(x.device)
    if count < x.shape[0]:  # keep each point's first row in the order; the chosen rows stay in drawing order
        order = order.index_select(0, _first_positions(groups.index_select(0, order), count))
    return x.index_select(0, order[:num_landmarks])


def kmeanspp_landmarks(x: Tensor, num_landmarks: int, kernel: KernelFunction | None = None, seed: int | None = None,
                       generator: torch.Generator | None = None) -> Tensor:
    """k-means++ seeding (Arthur & Vassilvitskii 2007), ``(M, d)`` distinct rows of x.

    The first landmark is uniform; each next one is drawn with probability ∝ D²(x), the
    squared distance to the nearest landmark so far: Euclidean without ``kernel``, the
    kernel feature-space distance k(x, x) + k(z, z) − 2k(x, z) with one (Oglic & Gärtner
    2017).  O(n·M) distance evaluations, a loop over the M landmarks (not over the data).

    A chosen point and every copy of it (an equal row) have D² = 0 exactly, so no point is picked
    twice: the rounding of k(x, x) + k(z, z) − 2k(x, z) at equal rows (up to 5·10⁻⁶ of the kernel's
    scale in float32 through GPyTorch's RBF on standardised data, 10⁻¹⁴ in float64) would give copies
    a positive probability.  Distinct rows that the kernel cannot tell apart (shifts by a period of a
    periodic kernel) keep their rounding-level D² and come last.  Distances are computed in float64
    for float32 input, so the draw depends on the values of x, not on its dtype.

    Raises:
        ValueError: when fewer than ``num_landmarks`` rows are distinct (or at a positive distance).
    """
    num_landmarks = _check_sample(x, num_landmarks)
    groups, count = distinct_rows(x)
    _check_distinct(count, num_landmarks, "distinct rows")
    generator = _generator(seed, generator)
    points = x.to(factor_dtype(x.dtype, x.device))
    diag = _batch_mean(kernel(points, points, diag=True), 1).to(points.dtype) if kernel is not None else None

    def squared_distance(index: Tensor) -> Tensor:
        z = points.index_select(0, index)
        if kernel is None:
            distance = (points - z).pow(2).sum(-1)
        else:
            cross = _batch_mean(kernel(points, z), 2).squeeze(-1).to(points.dtype)
            distance = (diag + diag.index_select(0, index) - 2 * cross).clamp_min(0)
        return distance.masked_fill(groups == groups.index_select(0, index), 0)

    first = torch.randint(x.shape[0], (1,), generator=generator, device=_draw_device(generator, x)).to(x.device)
    chosen = [first]
    nearest = squared_distance(first)
    for count in range(1, num_landmarks):
        if not bool(nearest.sum() > 0):
            _check_distinct(count, num_landmarks, "distinct rows under the k-means++ distance")
        index = _draw(nearest, 1, generator)
        chosen.append(index)
        nearest = torch.minimum(nearest, squared_distance(index))
    return x.index_select(0, torch.cat(chosen))


def ridge_leverage_landmarks(x: Tensor, num_landmarks: int, kernel: KernelFunction, regularization: float | None = None,
                             pilot_size: int | None = None, seed: int | None = None,
                             generator: torch.Generator | None = None) -> Tensor:
    """M distinct rows of x drawn without replacement ∝ approximate λ-ridge leverage scores, ``(M, d)``.

    Args:
        x: sample of inputs ``(n, d)``.
        num_landmarks: M ≤ the number of distinct rows of x.
        kernel: ``kernel(x1, x2, diag=False)`` → dense cross-covariance (or diagonal).
        regularization: λ > 0; default from the pilot's spectrum (see the module docstring).
        pilot_size: s, the size of the uniform pilot sample the scores are estimated from
            (default min(n, M)); cost O(n·s² + s³).
        seed, generator: the randomness of the pilot and of the final draw.

    The scores are the Musco & Musco (2017) estimates
    τ̃ᵢ = (k(xᵢ, xᵢ) − k_{iS}(K_{SS} + λI)⁻¹k_{Si}) / λ (see the module docstring), computed in
    float64 for float32 input (as the Nyström factor is): in float32 the residuals of the points
    the pilot explains, of the order of λ, are lost in the rounding of k(xᵢ, xᵢ), so which and how
    many points had a positive score depended on the dtype.  Rows equal to one already drawn are
    skipped: each point is drawn with the total score of its rows, at most once.

    Raises:
        ValueError: on a bad argument, or when fewer than M distinct rows have a positive score.
    """
    num_landmarks = _check_sample(x, num_landmarks)
    groups, count = distinct_rows(x)
    _check_distinct(count, num_landmarks, "distinct rows")
    num_points = x.shape[0]
    pilot_size = min(count, num_landmarks) if pilot_size is None else check_positive_int(pilot_size, "pilot_size")
    if pilot_size > count:
        raise ValueError(f"pilot_size={pilot_size} exceeds the number of distinct rows of x ({count} of {num_points})")
    generator = _generator(seed, generator)
    points = x.to(factor_dtype(x.dtype, x.device))
    pilot = uniform_landmarks(points, pilot_size, generator=generator)
    if regularization is None:
        regularization = _spectral_regularization(points, kernel, pilot)
    scores = approximate_ridge_leverage_scores(points, kernel, regularization, pilot)
    if count < num_points:  # a point's rows pool their scores on its first row
        totals = scores.new_zeros(count).index_add_(0, groups, scores)
        scores = scores.new_zeros(num_points).index_copy_(0, _first_rows(groups, count), totals)
    positive = int((scores > 0).sum())
    if positive < num_landmarks:
        raise ValueError(
            f"only {positive} distinct rows of x have a positive ridge leverage score, fewer than "
            f"num_landmarks={num_landmarks}; use fewer landmarks or choose them among more distinct points"
        )
    return x.index_select(0, _draw(scores, num_landmarks, generator))


def approximate_ridge_leverage_scores(x: Tensor, kernel: KernelFunction, regularization: float | Tensor,
                                      pilot: Tensor) -> Tensor:
    """τ̃ᵢ(λ) = (k(xᵢ, xᵢ) − k_{iS}(K_{SS} + λI)⁻¹k_{Si}) / λ for the rows of x, ``(n,)`` (Musco & Musco 2017).

    An over-estimate of the λ-ridge leverage score τᵢ(λ) = [K(K + λI)⁻¹]ᵢᵢ for every pilot
    set S, equal to it when S = x (then K − K(K + λI)⁻¹K = λK(K + λI)⁻¹).  Computed in float64
    for float32 input and returned in x's dtype.
    """
    regularization = _check_regularization(regularization)
    work = factor_dtype(x.dtype, x.device)
    points, pilot = x.to(work), pilot.to(work)
    if torch.is_tensor(regularization):
        regularization = regularization.to(work)
    diag = _batch_mean(kernel(points, points, diag=True), 1).to(work)
    cross = _batch_mean(kernel(points, pilot), 2).to(work)  # (n, s)
    pilot_gram = _batch_mean(kernel(pilot, pilot), 2).to(work)
    eye = torch.eye(pilot.shape[0], dtype=work, device=pilot_gram.device)
    chol = torch.linalg.cholesky(pilot_gram + regularization * eye)
    explained = torch.linalg.solve_triangular(chol, cross.mT, upper=False).pow(2).sum(-2)
    return ((diag - explained) / regularization).clamp_min(0).to(x.dtype)


def _spectral_regularization(x: Tensor, kernel: KernelFunction, pilot: Tensor) -> Tensor:
    """The ⌈s/2⌉-th largest eigenvalue of (n/s)·K_SS, at least 10⁻⁶·mean k(x, x)."""
    num_points, pilot_size = x.shape[0], pilot.shape[0]
    spectrum = torch.linalg.eigvalsh(_batch_mean(kernel(pilot, pilot), 2).to(x.dtype)) * (num_points / pilot_size)
    floor = 1e-6 * _batch_mean(kernel(x, x, diag=True), 1).to(x.dtype).mean()
    return torch.maximum(spectrum[pilot_size - (pilot_size + 1) // 2], floor)


def _check_regularization(regularization: float | Tensor) -> float | Tensor:
    """λ: a finite number > 0, or a one-element real tensor holding one (one host read).

    A tensor λ was used unchecked: λ = 0 gave NaN and Inf scores (then ``torch.multinomial``'s "probability
    tensor contains either inf, nan or element < 0"), a negative λ a ``LinAlgError`` or scores clamped to 0."""
    if not torch.is_tensor(regularization):
        return check_positive_float(regularization, "regularization")
    if regularization.numel() != 1 or not regularization.is_floating_point() or regularization.is_complex():
        raise TypeError(f"regularization must be a real number or a one-element real floating-point tensor, got "
                        f"{regularization!r:.80}")
    if not bool(torch.isfinite(regularization).all() & (regularization > 0).all()):
        raise ValueError(f"regularization must be a finite number > 0, got {regularization.item()}")
    return regularization.reshape(())


def _check_sample(x: Tensor, num_landmarks: int) -> int:
    check_points(x, "x")
    num_landmarks = check_positive_int(num_landmarks, "num_landmarks")
    if num_landmarks > x.shape[0]:
        raise ValueError(
            f"num_landmarks={num_landmarks} exceeds the number of rows of x ({x.shape[0]}); landmarks are "
            "chosen among the given points, so pass at least num_landmarks points"
        )
    return num_landmarks


def distinct_rows(x: Tensor) -> tuple[Tensor, int]:
    """The group of every row of x (equal rows share one, ``(n,)``) and the number of distinct rows (one sync)."""
    _, groups = torch.unique(x, dim=0, return_inverse=True)
    return groups, int(groups.max()) + 1


def _first_rows(groups: Tensor, count: int) -> Tensor:
    """The position of the first occurrence of each of the ``count`` groups in the sequence ``groups``, by group."""
    positions = torch.arange(groups.shape[0], device=groups.device)
    first = torch.full((count,), groups.shape[0], dtype=positions.dtype, device=groups.device)
    return first.scatter_reduce(0, groups, positions, "amin")


def _first_positions(groups: Tensor, count: int) -> Tensor:
    """Sorted positions of the first occurrence of each of the ``count`` groups in the sequence ``groups``."""
    return _first_rows(groups, count).sort().values


def _check_distinct(count: int, num_landmarks: int, what: str) -> None:
    if count < num_landmarks:
        raise ValueError(
            f"x has only {count} {what}, fewer than num_landmarks={num_landmarks} (num_features of a Nyström map): "
            f"landmarks are distinct points, a repeated one adds nothing to the Nyström span and makes K(Z, Z) "
            f"singular; use at most {count} landmarks, or choose them among more distinct points"
        )


def _generator(seed: int | None, generator: torch.Generator | None) -> torch.Generator | None:
    if seed is not None and generator is not None:
        raise ValueError("pass seed or generator, not both")
    if seed is not None:
        return torch.Generator().manual_seed(check_seed(seed))
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    return generator


def _draw_device(generator: torch.Generator | None, x: Tensor) -> torch.device:
    return generator.device if generator is not None else x.device


#: ``torch.multinomial`` takes at most this many categories
MULTINOMIAL_CATEGORIES = 2**24


def _draw(weights: Tensor, count: int, generator: torch.Generator | None) -> Tensor:
    """``count`` indices drawn without replacement ∝ weights, on the weights' device.

    Above :data:`MULTINOMIAL_CATEGORIES` weights (k-means++ and ridge-leverage selection among more than 2²⁴ points,
    where ``torch.multinomial`` raised "number of categories cannot exceed 2^24") by the exponential race of
    Efraimidis & Spirakis (2006): the ``count`` largest keys log(uᵢ)/wᵢ, uᵢ ~ U(0, 1), are a weighted sample
    without replacement with the same law as successive draws ∝ w; below it, ``torch.multinomial``'s draws as before.
    """
    device = _draw_device(generator, weights)
    if weights.numel() > MULTINOMIAL_CATEGORIES:
        uniform = torch.rand(weights.shape, generator=generator, dtype=torch.float64, device=device)
        keys = uniform.log() / weights.to(device=device, dtype=torch.float64)
        return keys.topk(count).indices.to(weights.device)
    return torch.multinomial(weights.to(device), count, replacement=False, generator=generator).to(weights.device)


def _batch_mean(values: Tensor, event_dims: int) -> Tensor:
    """Average a kernel output (a diagonal: ``event_dims=1``, a matrix: 2) over its batch dimensions."""
    if not torch.is_tensor(values):
        raise TypeError(f"kernel must return dense tensors, got {type(values).__name__}")
    batch_dims = tuple(range(values.dim() - event_dims))
    return values.mean(batch_dims) if batch_dims else values
