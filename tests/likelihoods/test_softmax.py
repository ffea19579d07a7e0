"""Class probabilities E[softmax(f)]: seeded Monte Carlo vs the deterministic mean-field approximation."""

import math

import pytest
import torch

from rfgp.likelihoods import softmax_expectation_mc, softmax_expectation_mean_field

#: measured max |mean-field − E[softmax]| for μ ~ N(0, 4), σ² ~ U(0, 1) (see rfgp.likelihoods.softmax)
MEAN_FIELD_ERROR = {2: 0.01, 3: 0.025, 10: 0.07}


def _latents(num_points, num_classes, dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    mean = 2.0 * torch.randn(num_points, num_classes, generator=gen, dtype=dtype)
    variance = torch.rand(num_points, num_classes, generator=gen, dtype=dtype)
    return mean, variance


@pytest.mark.parametrize("num_classes, num_points, num_samples", [(2, 100, 20000), (3, 100, 20000), (10, 40, 10000)])
def test_mc_converges_to_mean_field_within_measured_error(num_classes, num_points, num_samples):
    mean, variance = _latents(num_points, num_classes, torch.float32)
    mc, se = softmax_expectation_mc(mean, variance, num_samples, torch.Generator().manual_seed(1), chunk_size=5000)
    approx = softmax_expectation_mean_field(mean, variance)
    assert bool(((mc - approx).abs() <= MEAN_FIELD_ERROR[num_classes] + 4 * se).all())
    # the approximation is not trivially equal to the plug-in softmax(μ): the variance matters
    assert (softmax_expectation_mean_field(mean, variance) - torch.softmax(mean, -1)).abs().max() > 0.01


def test_mean_field_is_exact_without_variance(dtype):
    mean, _ = _latents(50, 5, dtype)
    torch.testing.assert_close(softmax_expectation_mean_field(mean, torch.zeros_like(mean)), torch.softmax(mean, -1))


def test_probabilities_sum_to_one_and_follow_dtype(dtype):
    mean, variance = _latents(30, 4, dtype)
    mc, se = softmax_expectation_mc(mean, variance, 300, torch.Generator().manual_seed(2))
    approx = softmax_expectation_mean_field(mean, variance)
    for probs in (mc, approx):
        assert probs.dtype == dtype and bool((probs >= 0).all())
        torch.testing.assert_close(probs.sum(-1), torch.ones(30, dtype=dtype))
    assert se.shape == mc.shape


def test_mc_is_seeded_and_its_standard_error_is_honest():
    mean, variance = _latents(4, 3, torch.float64)
    first, _ = softmax_expectation_mc(mean, variance, 500, torch.Generator().manual_seed(7))
    again, _ = softmax_expectation_mc(mean, variance, 500, torch.Generator().manual_seed(7))
    assert torch.equal(first, again)
    runs = [softmax_expectation_mc(mean, variance, 500, torch.Generator().manual_seed(s)) for s in range(300)]
    estimates, errors = torch.stack([r[0] for r in runs]), torch.stack([r[1] for r in runs])
    # over independent seeds the estimates scatter as their standard errors say (300 seeds: ±8 % at 3σ)
    ratio = estimates.std(0) / errors.pow(2).mean(0).sqrt()
    assert bool(((ratio > 0.85) & (ratio < 1.15)).all()), ratio


def test_mc_estimate_of_a_point_does_not_depend_on_the_other_points():
    # DirichletGPClassifier.predict_proba(X)[i] changed with the order and number of the other rows of X
    # (a fresh (S, M, C) draw per call: 0.0400 vs 0.0458 for the same point, S = 1000); every point now uses
    # the same S draws ε_s ∈ R^C, so a point's estimate is a function of its mean, variance and the seed
    mean, variance = _latents(50, 4, torch.float64)
    whole, whole_se = softmax_expectation_mc(mean, variance, 700, torch.Generator().manual_seed(3), chunk_size=300)
    order = torch.randperm(50, generator=torch.Generator().manual_seed(0))
    shuffled, _ = softmax_expectation_mc(mean[order], variance[order], 700, torch.Generator().manual_seed(3), 300)
    torch.testing.assert_close(shuffled, whole[order], rtol=1e-12, atol=1e-15)
    alone, alone_se = softmax_expectation_mc(mean[7], variance[7], 700, torch.Generator().manual_seed(3), 300)
    torch.testing.assert_close(alone, whole[7], rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(alone_se, whole_se[7], rtol=1e-12, atol=1e-15)
    batched, _ = softmax_expectation_mc(mean.view(5, 10, 4), variance.view(5, 10, 4), 700,
                                        torch.Generator().manual_seed(3), 300)
    torch.testing.assert_close(batched, whole.view(5, 10, 4), rtol=1e-12, atol=1e-15)


def test_bad_sample_count_rejected():
    mean, variance = _latents(3, 2, torch.float64)
    with pytest.raises(ValueError, match="num_samples"):
        softmax_expectation_mc(mean, variance, 0)


@pytest.mark.parametrize("estimator", [softmax_expectation_mc, softmax_expectation_mean_field])
def test_negative_nonfinite_or_misshapen_latents_are_refused(estimator):
    """A negative variance was clamped to 0 by the Monte-Carlo estimator (and made the mean-field one NaN)."""
    mean = torch.zeros(3, 2)
    with pytest.raises(ValueError, match=r"variance must be ≥ 0 .*-0\.2"):
        estimator(mean, torch.tensor([[0.1, -0.2], [0.0, 0.0], [1.0, 1.0]]))
    with pytest.raises(ValueError, match="NaN"):
        estimator(torch.tensor([[0.0, float("nan")]]), torch.ones(1, 2))
    with pytest.raises(ValueError, match=r"broadcastable .*\(3, 2\) and \(3, 3\)"):
        estimator(mean, torch.ones(3, 3))
    probs = estimator(mean, torch.zeros(3, 2))  # zero variance is a point mass: the softmax of the means
    probs = probs[0] if isinstance(probs, tuple) else probs
    torch.testing.assert_close(probs, torch.full((3, 2), 0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_softmax_last_is_torch_softmax_in_value_and_gradient(dtype):
    """The Monte-Carlo estimator's softmax (torch.softmax over a short last axis was 10× slower on CPUs): the same
    values and gradients, also for logits far from 0 and far apart, and -inf entries."""
    from rfgp.likelihoods.softmax import softmax_last

    generator = torch.Generator().manual_seed(0)
    scales = torch.tensor([1.0, 30.0, 1e3], dtype=dtype).reshape(3, 1, 1)
    logits = torch.randn(3, 50, 7, generator=generator, dtype=dtype) * scales
    logits[0, 0, 2] = -math.inf
    logits = (logits + 500.0).requires_grad_(True)
    weights = torch.randn(3, 50, 7, generator=generator, dtype=dtype)
    ours = softmax_last(logits)
    expected = torch.softmax(logits, dim=-1)
    torch.testing.assert_close(ours, expected)
    (grad,) = torch.autograd.grad((ours * weights).sum(), logits)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    torch.testing.assert_close(grad, expected_grad)
