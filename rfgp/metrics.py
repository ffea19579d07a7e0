"""Evaluation metrics of paper 000 §6.1.3 and App. D.5 (kernel error, posterior KL, classification scores).

* :func:`relative_frobenius_error` — ‖K̂ − K‖_F / ‖K‖_F (paper 000 Eq. 58; real part of a complex K̂).
* :func:`gaussian_kl_divergence` — KL between factorised Gaussian posteriors (paper 000 Eq. 93 with
  its misprint corrected, see below).
* :func:`classification_error`, :func:`mean_negative_log_likelihood`, :func:`gaussian_mnll`,
  :func:`expected_calibration_error` and :func:`reliability_curve` for predictions.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from .core.validation import (
    check_finite,
    check_gaussian_moments,
    check_positive_float,
    check_positive_int,
    check_tensor_dtype,
)


def _dense(matrix, name: str) -> Tensor:
    matrix = matrix.to_dense() if hasattr(matrix, "to_dense") and not torch.is_tensor(matrix) else matrix
    if not torch.is_tensor(matrix):
        raise TypeError(f"{name} must be a torch.Tensor or LinearOperator, got {type(matrix).__name__}")
    return matrix


def relative_frobenius_error(approx, exact) -> Tensor:
    """‖K̂ − K‖_F / ‖K‖_F over the last two axes (paper 000 Eq. 58).

    A complex K̂ contributes its real part (the paper's convention: K is real; a complex ``exact`` is refused).
    Accepts tensors or LinearOperators of equal shape ``(..., m, m)``.
    """
    approx, exact = _dense(approx, "approx"), _dense(exact, "exact")
    if exact.is_complex():  # its imaginary part was dropped: (1 + i)·I against I scored 0
        raise TypeError(f"exact must be a real matrix (the exact kernel matrix K), got the complex dtype "
                        f"{exact.dtype}; pass exact.real if its imaginary part is rounding")
    approx = approx.real if approx.is_complex() else approx
    if approx.shape != exact.shape:
        raise ValueError(f"approx and exact must have the same shape, got {tuple(approx.shape)} and {tuple(exact.shape)}")
    if approx.dim() < 2:
        raise ValueError(f"approx and exact must be (..., m, m) matrices, got shape {tuple(approx.shape)}")
    check_tensor_dtype(approx, "approx")
    check_tensor_dtype(exact, "exact")
    check_finite(approx, "approx")
    check_finite(exact, "exact")
    norm = torch.linalg.matrix_norm(exact)
    if not bool((norm > 0).all()):
        raise ValueError("exact is the zero matrix (in some batch): the relative error ‖K̂ − K‖_F / ‖K‖_F is undefined")
    return torch.linalg.matrix_norm(approx - exact) / norm


def gaussian_kl_divergence(
    mean_approx: Tensor, var_approx: Tensor, mean_exact: Tensor, var_exact: Tensor, min_variance: float = 1e-12
) -> Tensor:
    """KL[N(μ_a, diag σ²_a) ‖ N(μ_e, diag σ²_e)] summed over the last axis (the test points).

        KL = ½ Σ_i ( σ²_a,i/σ²_e,i + log(σ²_e,i/σ²_a,i) − 1 + (μ_e,i − μ_a,i)²/σ²_e,i ).

    Paper 000 Eq. 93 prints the ratios inverted (σ²_e/σ²_a + log(σ²_e/σ²_a) − 1, which can be
    negative); this is the corrected form its code computes.  For classification pass the C
    latent posteriors as ``(C, m)`` and average the result over classes, as the paper does.
    Variances are clamped to ``min_variance`` (the paper's code clamps std at 1e−6).
    """
    shapes = {t.shape for t in (mean_approx, var_approx, mean_exact, var_exact)}
    if len(shapes) != 1:
        raise ValueError(f"means and variances must share one shape, got {sorted(tuple(s) for s in shapes)}")
    check_gaussian_moments(var_approx=var_approx, var_exact=var_exact, mean_approx=mean_approx, mean_exact=mean_exact)
    min_variance = check_positive_float(min_variance, "min_variance")
    var_approx = var_approx.clamp_min(min_variance)
    var_exact = var_exact.clamp_min(min_variance)
    ratio = var_approx / var_exact
    terms = ratio - ratio.log() - 1.0 + (mean_exact - mean_approx).pow(2) / var_exact
    return 0.5 * terms.sum(-1)


def _check_probabilities(probs: Tensor, labels: Tensor) -> Tensor:
    if not torch.is_tensor(probs) or probs.dim() != 2:
        raise ValueError(f"probs must be a (M, C) tensor of class probabilities, got {getattr(probs, 'shape', probs)}")
    if not torch.is_tensor(labels) or labels.shape != probs.shape[:1]:
        raise ValueError(f"labels must be a ({probs.shape[0]},) tensor, got {getattr(labels, 'shape', labels)}")
    check_tensor_dtype(probs, "probs")
    if probs.shape[0] == 0:  # every score below is a mean over the M points: 0/0 = NaN otherwise
        raise ValueError(f"probs must hold at least one prediction, got shape {tuple(probs.shape)}")
    check_finite(probs, "probs")
    if bool(((probs < 0) | (probs > 1)).any()):
        # 10 digits: a float32 1 + 2⁻²³ must not print as 1
        raise ValueError(f"probs must lie in [0, 1], got values in [{float(probs.min()):.10g}, "
                         f"{float(probs.max()):.10g}]")
    # rows of an (M, C) predictive distribution sum to 1 up to rounding, a random walk of C roundings: √C·√ε
    # (float32 softmax and Monte-Carlo averages stay below 1.3·√C·ε, ~2000× within it; C·√ε let float32
    # rows summing to 0.7 through at C = 1000); scores of one-vs-rest sigmoids or unnormalised Dirichlet
    # means are not probabilities, and their MNLL and ECE would be meaningless numbers.  ε is at least float32's:
    # float32 probabilities handed over as float64 (a NumPy array of a float32 model's predict_proba) keep float32's
    # rounding, which float64's √(C·ε) refused (the Dirichlet tutorial's rows summed to 1 ± 1e-7 at C = 10)
    sums = probs.sum(-1)
    eps = max(torch.finfo(probs.dtype).eps, torch.finfo(torch.float32).eps)
    if bool(((sums - 1).abs() > (probs.shape[1] * eps) ** 0.5).any()):
        raise ValueError(f"probs must be class probabilities whose rows sum to 1, got row sums in "
                         f"[{float(sums.min()):.10g}, {float(sums.max()):.10g}]; normalise them first "
                         "(probs / probs.sum(-1, keepdim=True)), or pass softmax(logits, -1)")
    if labels.is_floating_point():  # a NaN label was reported as "non-integer"
        check_finite(labels, "labels")
    if labels.is_floating_point() and not bool((labels == labels.round()).all()):
        raise ValueError("labels must be integer class indices, got non-integer values")
    labels = labels.long()
    if bool((labels < 0).any()) or bool((labels >= probs.shape[1]).any()):
        raise ValueError(f"labels must lie in 0..{probs.shape[1] - 1}")
    return labels


def classification_error(probs: Tensor, labels: Tensor) -> Tensor:
    """Fraction of points whose most probable class differs from the label (test error)."""
    labels = _check_probabilities(probs, labels)
    return (probs.argmax(-1) != labels).to(probs.dtype).mean()


def mean_negative_log_likelihood(probs: Tensor, labels: Tensor) -> Tensor:
    """MNLL = −(1/M) Σ_i log p_i(y_i) of predicted class probabilities (R&W p. 23).

    Zero probabilities are raised to the dtype's smallest normal number, so a confident
    mistake costs a large finite amount instead of ∞.
    """
    labels = _check_probabilities(probs, labels)
    picked = probs.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return -picked.clamp_min(torch.finfo(probs.dtype).tiny).log().mean()


def gaussian_mnll(mean: Tensor, variance: Tensor, targets: Tensor) -> Tensor:
    """Regression MNLL = −(1/M) Σ_i log N(y_i; μ_i, σ²_i) with σ² the predictive (noisy) variance."""
    if not (mean.shape == variance.shape == targets.shape):
        raise ValueError(f"mean, variance and targets must share one shape, got {tuple(mean.shape)}, "
                         f"{tuple(variance.shape)} and {tuple(targets.shape)}")
    check_gaussian_moments(mean=mean, variance=variance, targets=targets)
    if mean.numel() == 0:  # a mean over no points: 0/0 = NaN otherwise
        raise ValueError(f"mean, variance and targets must hold at least one prediction, got shape {tuple(mean.shape)}")
    if not bool((variance > 0).all()):
        raise ValueError(f"variance must be > 0 (a predictive variance), got the minimum {float(variance.min()):.6g}")
    return 0.5 * ((targets - mean).pow(2) / variance + variance.log() + math.log(2 * math.pi)).mean()


def reliability_curve(probs: Tensor, labels: Tensor, num_bins: int = 10) -> tuple[Tensor, Tensor, Tensor]:
    """Per confidence bin I_b = ((b − 1)/B, b/B], b = 1..B (Guo et al. 2017, Sec. 2; scikit-learn's
    ``calibration_curve`` closes its bins on the right too; the first bin holds 0 as well): mean confidence, accuracy
    and point count.

    Confidence is the top-class probability; empty bins report zero confidence and accuracy.
    """
    labels = _check_probabilities(probs, labels)
    num_bins = check_positive_int(num_bins, "num_bins")
    confidence, predicted = probs.max(-1)
    correct = (predicted == labels).to(probs.dtype)
    # the inner edges b/B (each the float nearest to it); a confidence on an edge belongs to the bin below it: a
    # two-class tie at 0.5 went to [0.5, 0.6) with floor(conf·B), among confidences up to 0.6
    edges = torch.arange(1, num_bins, dtype=probs.dtype, device=probs.device) / num_bins
    bins = torch.bucketize(confidence, edges)
    counts = torch.bincount(bins, minlength=num_bins).to(probs.dtype)
    conf_sum = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add(0, bins, confidence)
    acc_sum = torch.zeros(num_bins, dtype=probs.dtype, device=probs.device).index_add(0, bins, correct)
    safe = counts.clamp_min(1.0)
    return conf_sum / safe, acc_sum / safe, counts


def expected_calibration_error(probs: Tensor, labels: Tensor, num_bins: int = 10) -> Tensor:
    """ECE = Σ_b (n_b/M) ``|accuracy_b − confidence_b|`` over the equal-width confidence bins ((b − 1)/B, b/B] of
    :func:`reliability_curve` (Guo et al. 2017, Eq. 3)."""
    confidence, accuracy, counts = reliability_curve(probs, labels, num_bins)
    return (counts / counts.sum() * (accuracy - confidence).abs()).sum()
