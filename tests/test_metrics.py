"""rfgp.metrics against hand-computed values and closed forms."""

import math

import pytest
import torch

from rfgp import metrics


def test_relative_frobenius_error_uses_real_part_of_complex_approximation():
    exact = torch.tensor([[2.0, 1.0], [1.0, 2.0]], dtype=torch.float64)
    approx = exact + torch.tensor([[0.1, 0.0], [0.0, -0.1]], dtype=torch.float64) + 5j
    expected = math.sqrt(0.02) / math.sqrt(10.0)
    assert metrics.relative_frobenius_error(approx, exact).item() == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match="same shape"):
        metrics.relative_frobenius_error(torch.ones(2, 2), torch.ones(3, 3))
    with pytest.raises(TypeError, match="exact must be a real matrix"):  # (1 + i)·I against I scored 0
        metrics.relative_frobenius_error(torch.eye(2), torch.eye(2) * (1 + 1j))
    with pytest.raises(TypeError, match="approx must be a torch.Tensor or LinearOperator, got list"):
        metrics.relative_frobenius_error([[1.0]], torch.eye(1))


def test_gaussian_kl_is_the_corrected_formula_and_matches_torch():
    gen = torch.Generator().manual_seed(0)
    mean_a, mean_e = torch.randn(2, 3, 50, generator=gen, dtype=torch.float64)
    var_a, var_e = torch.rand(2, 3, 50, generator=gen, dtype=torch.float64) + 0.1
    kl = metrics.gaussian_kl_divergence(mean_a, var_a, mean_e, var_e)
    reference = torch.distributions.kl_divergence(
        torch.distributions.Normal(mean_a, var_a.sqrt()), torch.distributions.Normal(mean_e, var_e.sqrt())
    ).sum(-1)
    torch.testing.assert_close(kl, reference)
    assert bool((kl >= 0).all())
    assert metrics.gaussian_kl_divergence(mean_a, var_a, mean_a, var_a).abs().max() < 1e-12


def test_classification_scores_by_hand():
    probs = torch.tensor([[0.9, 0.1], [0.2, 0.8], [0.6, 0.4], [0.3, 0.7]], dtype=torch.float64)
    labels = torch.tensor([0, 1, 1, 1])
    assert metrics.classification_error(probs, labels).item() == pytest.approx(0.25)
    nll = -(math.log(0.9) + math.log(0.8) + math.log(0.4) + math.log(0.7)) / 4
    assert metrics.mean_negative_log_likelihood(probs, labels).item() == pytest.approx(nll)
    # bins of width 0.25: (0.5, 0.75] holds 0.6 (wrong) and 0.7 (right); (0.75, 1] holds 0.9, 0.8 (right)
    ece = 2 / 4 * abs(0.5 - 0.65) + 2 / 4 * abs(1.0 - 0.85)
    assert metrics.expected_calibration_error(probs, labels, num_bins=4).item() == pytest.approx(ece)
    confidence, accuracy, counts = metrics.reliability_curve(probs, labels, num_bins=4)
    torch.testing.assert_close(accuracy, torch.tensor([0.0, 0.0, 0.5, 1.0], dtype=torch.float64))
    torch.testing.assert_close(confidence, torch.tensor([0.0, 0.0, 0.65, 0.85], dtype=torch.float64))
    assert counts.tolist() == [0.0, 0.0, 2.0, 2.0]
    assert metrics.mean_negative_log_likelihood(torch.tensor([[1.0, 0.0]]), torch.tensor([1])).isfinite()
    with pytest.raises(ValueError, match="labels must lie in 0..1"):
        metrics.classification_error(probs, torch.tensor([0, 1, 2, 1]))
    with pytest.raises(ValueError, match="labels contains NaN or Inf entries"):  # was called "non-integer"
        metrics.classification_error(probs, torch.tensor([0.0, 1.0, math.nan, 1.0]))


def test_calibration_bins_are_closed_on_the_right():
    """Guo et al.'s bins are ((b − 1)/B, b/B], as scikit-learn's calibration_curve's: a confidence on an edge belongs
    to the bin below.  floor(conf·B) put a two-class tie at 0.5 in [0.5, 0.6) with the confidence 0.55: ECE 0.025
    instead of 0.525, and 0.4 (4.000000000000001 tenths) in [0.4, 0.5)."""
    probs = torch.tensor([[0.5, 0.5, 0.0], [0.45, 0.55, 0.0], [0.3, 0.3, 0.4], [0.7, 0.2, 0.1]], dtype=torch.float64)
    labels = torch.tensor([0, 0, 2, 0])  # the tie is right (argmax takes class 0), 0.55 wrong, 0.4 and 0.7 right
    ece = 1 / 4 * abs(1 - 0.5) + 1 / 4 * abs(0 - 0.55) + 1 / 4 * abs(1 - 0.4) + 1 / 4 * abs(1 - 0.7)
    assert metrics.expected_calibration_error(probs, labels).item() == pytest.approx(ece, rel=1e-12)
    counts = metrics.reliability_curve(probs, labels)[2]
    assert counts.nonzero().flatten().tolist() == [3, 4, 5, 6]  # (0.3, 0.4], (0.4, 0.5], (0.5, 0.6], (0.6, 0.7]
    edges = torch.tensor([[0.3, 0.7], [1.0, 0.0]], dtype=torch.float32)  # 0.7 and 1.0 in float32 too
    assert metrics.reliability_curve(edges, torch.tensor([1, 0]))[2].nonzero().flatten().tolist() == [6, 9]


def test_gaussian_mnll_matches_normal_log_prob():
    mean, var, y = torch.tensor([0.0, 1.0]), torch.tensor([1.0, 4.0]), torch.tensor([0.5, -1.0])
    expected = -torch.distributions.Normal(mean, var.sqrt()).log_prob(y).mean()
    torch.testing.assert_close(metrics.gaussian_mnll(mean, var, y), expected)


@pytest.mark.parametrize("score", [metrics.classification_error, metrics.mean_negative_log_likelihood,
                                   metrics.expected_calibration_error, metrics.reliability_curve])
def test_classification_scores_refuse_empty_predictions(score):
    """A mean over no points was a silent NaN (ECE: 0/0 bin weights); the reliability curve was all zeros."""
    with pytest.raises(ValueError, match=r"probs must hold at least one prediction, got shape \(0, 3\)"):
        score(torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.long))


def test_gaussian_mnll_refuses_empty_predictions():
    empty = torch.zeros(0, dtype=torch.float64)
    with pytest.raises(ValueError, match="at least one prediction"):
        metrics.gaussian_mnll(empty, empty, empty)


def test_relative_frobenius_error_refuses_vectors_and_integer_matrices_by_name():
    """Both reached torch.linalg.matrix_norm, whose RuntimeError named neither argument."""
    with pytest.raises(ValueError, match=r"approx and exact must be \(\.\.\., m, m\) matrices, got shape \(3,\)"):
        metrics.relative_frobenius_error(torch.ones(3, dtype=torch.float64), torch.ones(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="approx must be a floating-point tensor"):
        metrics.relative_frobenius_error(torch.eye(2, dtype=torch.long), torch.eye(2, dtype=torch.float64))


def test_probability_range_message_shows_the_offending_value():
    """A float32 probability one ulp above 1 was reported as 'got values in [0, 1]'."""
    probs = torch.tensor([[1.0 + 2.0**-23, 0.0]])
    with pytest.raises(ValueError, match=r"got values in \[0, 1\.000000119\]"):
        metrics.classification_error(probs, torch.tensor([0]))


def test_row_sum_tolerance_does_not_grow_linearly_with_the_classes():
    """The C·√ε tolerance let float32 rows summing to 0.7 through at C = 1000 (a meaningless MNLL/ECE)."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(20, 1000, generator=g) * 5, -1)
    labels = torch.zeros(20, dtype=torch.long)
    metrics.expected_calibration_error(probs, labels)  # float32 softmax round-off is accepted
    metrics.expected_calibration_error(torch.softmax(torch.randn(20, 10000, generator=g), -1), labels)
    with pytest.raises(ValueError, match="rows sum to 1"):
        metrics.expected_calibration_error(probs * 0.97, labels)


def test_float32_probabilities_handed_over_as_float64_are_accepted():
    """A float32 model's probabilities converted to float64 (NumPy's predict_proba output) keep float32's rounding:
    float64's √(C·ε) refused the Dirichlet tutorial's rows (1 ± 1e-7 at C = 10).  Gross mis-normalisation is still
    refused in float64."""
    g = torch.Generator().manual_seed(0)
    probs = torch.softmax(torch.randn(200, 10, generator=g) * 3, -1)  # float32 rounding
    probs[:, 0] += 2e-7  # a float32 Monte-Carlo average's last-digit error
    labels = torch.zeros(200, dtype=torch.long)
    metrics.mean_negative_log_likelihood(probs.double(), labels)
    with pytest.raises(ValueError, match="rows sum to 1"):
        metrics.mean_negative_log_likelihood(probs.double() * 0.99, labels)
