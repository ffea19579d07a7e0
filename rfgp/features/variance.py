"""Closed-form variances of the polynomial sketches (papers 000 Table 1 and 001 Table 1).

Every function works on pairs of (already homogenised) inputs x̃, ỹ, vectorised over any
leading shape, in float64, and clamps at 0 (the forms (A)ⁿ − G²ⁿ cancel for large n).
Notation (paper 000 §0): G = xᵀy, N = ‖x‖²‖y‖², S = Σₖ xₖ²yₖ²; for a weight entry z,
m₄ = E|z|⁴ and q = E[(Re z)²] (q = 1 real, q = ½ complex).

* Single feature (D = 1, paper 000 Theorem 2, Eq. 16):
  V = (m₄S + N − S + ((2q−1)² + 1)(G² − S))ⁿ − G²ⁿ  — Eqs. 18–21 for real/complex
  Rademacher/Gaussian.  Pseudo-variance E[k̂²] − (E k̂)² (paper 001 Eq. 6 / Table 1):
  P = (m₄S + 2(G² − S) + (2q−1)²(N − S))ⁿ − G²ⁿ (= V for real weights).
* D i.i.d. features divide both by D.
* TensorSRHT (paper 000 Eqs. 28/33; paper 001 Table 1): V/D + (pairs/D²)·Cov with the
  covariance of two distinct features Cov = (G² − V⁽¹⁾/r)ⁿ − G²ⁿ, V⁽¹⁾ the degree-1 single
  feature variance, and for the block sampling
  ``"independent"`` (paper 000 Alg. 1): pairs = c(D, d) (Eq. 29), r = d − 1;
  ``"tiled"`` (paper 001 §5.1): pairs = D(D − 1), r = ⌈D/d⌉d − 1.
  The pseudo-variance has the same form with P⁽¹⁾ in place of V⁽¹⁾.
* The real part of a complex estimate — what [Re Φ, Im Φ] features (CtR, paper 001 Eq. 6)
  give — has variance ½(V + P); the imaginary part ½(V − P).

:func:`expected_error` applies these to a data sample to choose a sketch before drawing it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import torch
from torch import Tensor

from ..core.validation import check_choice, check_positive_int
from .degree_sketch import SRHT_BLOCKS, srht_padded_dim
from .polynomial import WEIGHTS, PolynomialSketch, check_degree

#: projections with a closed-form variance
CLOSED_FORM_PROJECTIONS = ("rademacher", "gaussian", "srht")
#: (m₄ real, m₄ complex) of the weight entries
FOURTH_MOMENT = {"rademacher": (1.0, 1.0), "gaussian": (3.0, 2.0), "srht": (1.0, 1.0)}


# ------------------------------------------------------------------ statistics
def pair_statistics(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(G, N, S) = (xᵀy, ‖x‖²‖y‖², Σₖxₖ²yₖ²) for paired rows of x and y (broadcast), in float64."""
    x, y = x.double(), y.double()
    return (x * y).sum(-1), x.pow(2).sum(-1) * y.pow(2).sum(-1), (x * y).pow(2).sum(-1)


def gram_statistics(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(G, N, S) for all pairs of rows of x, each an (m × m) matrix, in float64."""
    x = x.double()
    squares = x.pow(2)
    norms = squares.sum(-1)
    return x @ x.mT, norms.unsqueeze(-1) * norms.unsqueeze(-2), squares @ squares.mT


def block_pair_count(num_features: int, padded_dim: int) -> int:
    """c(D, d) = ⌊D/d⌋d(d − 1) + (D mod d)(D mod d − 1): ordered pairs of features in one block (Eq. 29)."""
    full, rest = divmod(num_features, padded_dim)
    return full * padded_dim * (padded_dim - 1) + rest * (rest - 1)


def _power_gap(base: Tensor, g: Tensor, degree: int) -> Tensor:
    return base.pow(degree) - g.pow(2 * degree)


# ------------------------------------------------------ single-feature moments
def single_feature_variance(stats, degree: int, fourth_moment: float, q: float) -> Tensor:
    """Eq. 16: E|k̂ − k|² of one feature (complex variance), not clamped."""
    g, n, s = stats
    return _power_gap(fourth_moment * s + n - s + ((2 * q - 1) ** 2 + 1) * (g * g - s), g, degree)


def single_feature_pseudo_variance(stats, degree: int, fourth_moment: float, q: float) -> Tensor:
    """E[k̂²] − k² of one feature (paper 000 notes §2, paper 001 Table 1), not clamped."""
    g, n, s = stats
    return _power_gap(fourth_moment * s + 2 * (g * g - s) + (2 * q - 1) ** 2 * (n - s), g, degree)


def srht_covariance(stats, degree: int, degree_one_variance: Tensor, denominator: int) -> Tensor:
    """Cov = (G² − V⁽¹⁾/r)ⁿ − G²ⁿ of two distinct TensorSRHT features (paper 000 Eq. 28, 001 Lemma B.2.3)."""
    g = stats[0]
    return _power_gap(g * g - degree_one_variance / denominator, g, degree)


def srht_pairs(num_features: int, padded_dim: int, srht_blocks: str) -> tuple[int, int]:
    """(number of correlated ordered pairs, covariance denominator r) of a TensorSRHT sampling."""
    if srht_blocks == "independent":
        return block_pair_count(num_features, padded_dim), padded_dim - 1
    stacked = math.ceil(num_features / padded_dim) * padded_dim
    return num_features * (num_features - 1), stacked - 1


def _moments(stats, degree, width, projection, complex_weights, padded_dim, srht_blocks):
    """(variance, pseudo-variance) of the (complex) estimator with ``width`` features, not clamped."""
    m4 = FOURTH_MOMENT[projection][complex_weights]
    q = 0.5 if complex_weights else 1.0
    variance = single_feature_variance(stats, degree, m4, q) / width
    pseudo = single_feature_pseudo_variance(stats, degree, m4, q) / width
    if projection == "srht":
        pairs, denominator = srht_pairs(width, padded_dim, srht_blocks)
        factor = pairs / width**2
        variance = variance + factor * srht_covariance(
            stats, degree, single_feature_variance(stats, 1, m4, q), denominator
        )
        pseudo = pseudo + factor * srht_covariance(
            stats, degree, single_feature_pseudo_variance(stats, 1, m4, q), denominator
        )
    return variance, pseudo


# -------------------------------------------------------------- public forms
def _check(degree, width, projection, srht_blocks, padded_dim):
    degree = check_degree(degree)
    check_positive_int(width, "num_features")
    check_choice(projection, "projection", CLOSED_FORM_PROJECTIONS)
    check_choice(srht_blocks, "srht_blocks", SRHT_BLOCKS)
    if projection == "srht" and (padded_dim is None or padded_dim < 2 or padded_dim & (padded_dim - 1)):
        raise ValueError(f"padded_dim must be a power of two ≥ 2 for TensorSRHT, got {padded_dim}")
    return degree


def complex_estimator_variance(
    x: Tensor,
    y: Tensor,
    degree: int,
    num_features: int,
    projection: str = "rademacher",
    complex_weights: bool = False,
    padded_dim: int | None = None,
    srht_blocks: str = "tiled",
) -> Tensor:
    """E|k̂ − (xᵀy)ⁿ|² of the estimator with ``num_features`` real or complex features (paper 000 Table 1).

    For complex weights this is the complex variance V[Re k̂] + V[Im k̂] with D = ``num_features``
    complex features.  ``padded_dim`` is TensorSRHT's Hadamard size (the padded d).
    """
    degree = _check(degree, num_features, projection, srht_blocks, padded_dim)
    stats = pair_statistics(x, y)
    variance, _ = _moments(stats, degree, num_features, projection, complex_weights, padded_dim, srht_blocks)
    return variance.clamp_min(0.0)


def complex_estimator_pseudo_variance(
    x, y, degree, num_features, projection="rademacher", complex_weights=False, padded_dim=None, srht_blocks="tiled"
) -> Tensor:
    """E[k̂²] − k² (real) of the estimator with ``num_features`` features; equals the variance for real weights."""
    degree = _check(degree, num_features, projection, srht_blocks, padded_dim)
    stats = pair_statistics(x, y)
    return _moments(stats, degree, num_features, projection, complex_weights, padded_dim, srht_blocks)[1]


def real_part_variance(
    x, y, degree, num_features, projection="rademacher", complex_weights=True, padded_dim=None, srht_blocks="tiled"
) -> Tensor:
    """V[Re k̂] = ½(V + P) with ``num_features`` complex features (paper 001 Eq. 6: the CtR variance)."""
    degree = _check(degree, num_features, projection, srht_blocks, padded_dim)
    stats = pair_statistics(x, y)
    variance, pseudo = _moments(stats, degree, num_features, projection, complex_weights, padded_dim, srht_blocks)
    return (0.5 * (variance + pseudo)).clamp_min(0.0)


def sketch_variance(
    x: Tensor,
    y: Tensor,
    degree: int,
    num_features: int,
    projection: str = "rademacher",
    weights: str = "real",
    srht_blocks: str = "tiled",
) -> Tensor:
    """Variance of Φ(x)ᵀΦ(y) for a :class:`~rfgp.features.PolynomialSketch` of real width F.

    x and y are the homogenised inputs x̃ (append √ν yourself, or use :func:`expected_error`).
    Real weights: Table 1 with D = F.  Complex/CtR weights: V[Re k̂_C] = ½(V + P) with F/2
    complex features, the kernel the real feature output computes (paper 001 Eq. 6).
    """
    check_choice(weights, "weights", WEIGHTS)
    padded = srht_padded_dim(x.shape[-1])
    if weights == "real":
        return complex_estimator_variance(x, y, degree, num_features, projection, False, padded, srht_blocks)
    if num_features % 2:
        raise ValueError(f"num_features must be even for weights={weights!r}, got {num_features}")
    return real_part_variance(x, y, degree, num_features // 2, projection, True, padded, srht_blocks)


# ------------------------------------------------------------ data summaries


def expected_error(x_sample: Tensor, sketches) -> dict[str, float]:
    """Mean expected squared kernel error E|Φ(xᵢ)ᵀΦ(xⱼ) − k(xᵢ, xⱼ)|² over pairs i ≠ j of a sample.

    The sketches are unbiased, so this is the mean closed-form variance (the objective of
    paper 000 §5.3 with U-statistic weighting).  Use it to pick a projection, weights and
    width on your data before drawing anything.

    Args:
        x_sample: ``(m, d)`` inputs as the feature map sees them (divided by the lengthscale).
        sketches: a :class:`~rfgp.features.PolynomialSketch`, a dict of its constructor
            arguments (``degree``, ``num_features``, ``projection``, ``weights``, ``offset``,
            ``srht_blocks``), or a mapping ``name -> either``.

    Returns:
        ``{name: mean squared error}`` (name ``"sketch"`` for a single sketch).

    Example:
        >>> import torch
        >>> from rfgp.features.variance import expected_error
        >>> x = torch.nn.functional.normalize(torch.rand(20, 8, dtype=torch.float64), dim=-1)
        >>> errors = expected_error(x, {"real": dict(degree=3, num_features=128, projection="srht"),
        ...                    "ctr": dict(degree=3, num_features=128, projection="srht", weights="ctr")})
        >>> sorted(errors)
        ['ctr', 'real']
    """
    if not torch.is_tensor(x_sample) or x_sample.dim() != 2 or x_sample.shape[0] < 2:
        shape = tuple(x_sample.shape) if torch.is_tensor(x_sample) else type(x_sample).__name__
        raise ValueError(f"x_sample must be a tensor of shape (m, d) with m ≥ 2, got {shape}")
    if isinstance(sketches, PolynomialSketch) or (isinstance(sketches, Mapping) and "degree" in sketches):
        sketches = {"sketch": sketches}
    return {name: _mean_pair_error(x_sample, _spec(spec, name)) for name, spec in sketches.items()}


def _spec(spec, name: str) -> dict:
    if isinstance(spec, PolynomialSketch):
        return dict(
            degree=spec.degree,
            num_features=spec.num_features,
            projection=spec.projection,
            weights=spec.weights,
            offset=spec.offset,
            srht_blocks=spec.srht_blocks,
        )
    if not isinstance(spec, Mapping):
        raise TypeError(f"sketch {name!r} must be a PolynomialSketch or a dict of its arguments, got {type(spec).__name__}")
    PolynomialSketch(**{**spec, "input_dim": None})  # validates the arguments with the map's own messages
    return dict(spec)


def _mean_pair_error(x: Tensor, spec: dict) -> float:
    projection = spec.get("projection", "rademacher")
    if projection not in CLOSED_FORM_PROJECTIONS:
        raise ValueError(
            f"projection={projection!r} has no closed-form variance; accepted: {', '.join(CLOSED_FORM_PROJECTIONS)}"
        )
    x = x.double()
    offset = spec.get("offset")
    if offset is not None:
        x = torch.cat((x, torch.full_like(x[:, :1], math.sqrt(offset))), dim=-1)
    degree, width, weights = check_degree(spec["degree"]), spec["num_features"], spec.get("weights", "real")
    srht_blocks = spec.get("srht_blocks", "tiled")
    stats = gram_statistics(x)
    padded = srht_padded_dim(x.shape[-1])
    if weights == "real":
        error = _moments(stats, degree, width, projection, False, padded, srht_blocks)[0]
    else:
        variance, pseudo = _moments(stats, degree, width // 2, projection, True, padded, srht_blocks)
        error = 0.5 * (variance + pseudo)
    m = x.shape[0]
    off_diagonal = ~torch.eye(m, dtype=torch.bool, device=x.device)
    return float(error.clamp_min(0.0)[off_diagonal].mean())
