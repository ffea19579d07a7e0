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


def test_mc_standard_error_of_one_sample_is_unknown_not_zero():
    """One sample has no spread to estimate its error from: the error was 0 (an estimate claimed certain), now ∞."""
    mean, variance = _latents(4, 3, torch.float64)
    estimate, error = softmax_expectation_mc(mean, variance, 1, torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(estimate).all()) and bool(torch.isinf(error).all())
    _, two = softmax_expectation_mc(mean, variance, 2, torch.Generator().manual_seed(0))
    assert bool(torch.isfinite(two).all()) and bool((two > 0).all())


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


def _quadrature_expectation(mean, variance, nodes=24):
    """E[softmax(f)] for independent f_c ~ N(μ_c, σ²_c), C = 3, by a Gauss–Hermite product rule (float64, exact to
    ~1e-12 for these latents): the reference of the Monte-Carlo estimator's gradients."""
    import numpy as np

    x, w = (torch.as_tensor(a, dtype=torch.float64) for a in np.polynomial.hermite.hermgauss(nodes))
    grid = torch.stack(torch.meshgrid(x, x, x, indexing="ij"), -1).reshape(-1, 3)  # (n³, 3)
    weight = (w[:, None, None] * w[None, :, None] * w[None, None, :]).reshape(-1) / math.pi**1.5
    samples = mean.unsqueeze(-2) + (2.0 * variance).sqrt().unsqueeze(-2) * grid  # (..., n³, 3)
    return (weight.unsqueeze(-1) * torch.softmax(samples, -1)).sum(-2)


def _expectation_variance_gradient(mean, variance, weights, step):
    """∂/∂σ² of Σ weights · E[softmax(f)] by finite differences of the quadrature: one-sided (forward) where σ² = 0,
    central elsewhere."""
    def value(v):
        return float((weights * _quadrature_expectation(mean, v)).sum())

    grad = torch.zeros_like(variance)
    for index in torch.cartesian_prod(*(torch.arange(n) for n in variance.shape)):
        index = tuple(index.tolist())
        up, down = variance.clone(), variance.clone()
        up[index] += step
        if variance[index] > 0:
            down[index] -= step
        grad[index] = (value(up) - value(down)) / (up[index] - down[index])
    return grad


def test_mc_variance_gradient_at_zero_variance_is_finite_and_exact():
    """The variance gradient was infinite at σ² = 0 (the draws f = μ + √σ² ε differentiated √ at 0); it is Price's
    ½ E[∂²p/∂f²], at σ² = 0 exactly ½ ∂²softmax/∂f²(μ): equal to the limit of finite differences of E[softmax(f)]."""
    mean = torch.tensor([[0.3, -0.2, 1.0], [2.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    variance = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([[1.0, -0.5, 2.0], [0.3, 1.0, -1.0]], dtype=torch.float64)
    probs, _ = softmax_expectation_mc(mean, variance, 200, torch.Generator().manual_seed(0))
    grad_mean, grad_variance = torch.autograd.grad((weights * probs).sum(), (mean, variance))
    assert bool(torch.isfinite(grad_variance).all()), grad_variance
    # all draws coincide at σ² = 0: the estimate is exact, the second derivative of softmax at μ
    hessians = [torch.autograd.functional.hessian(lambda f: (w * torch.softmax(f, -1)).sum(), m.detach())
                for w, m in zip(weights, mean)]
    expected = 0.5 * torch.stack([h.diagonal() for h in hessians])
    torch.testing.assert_close(grad_variance, expected, rtol=1e-12, atol=1e-14)
    reference = _expectation_variance_gradient(mean.detach(), variance.detach(), weights, 1e-6)
    torch.testing.assert_close(grad_variance, reference, rtol=0.0, atol=1e-5)
    # the mean gradient is the Jacobian of softmax at μ
    jacobians = [torch.autograd.functional.jacobian(lambda f: torch.softmax(f, -1), m.detach()) for m in mean]
    torch.testing.assert_close(grad_mean, torch.stack([w @ j for w, j in zip(weights, jacobians)]))


@pytest.mark.parametrize("variance", [
    [[0.0, 0.5, 0.1], [1e-4, 1e-4, 0.0]],  # exactly 0 and small beside larger ones
    [[0.3, 1.5, 0.8], [2.0, 0.05, 1.0]],  # away from 0
])
def test_mc_gradients_against_the_exact_expectation_within_standard_errors(variance):
    """The variance gradient (Price's estimate from the draws) against finite differences of the quadrature
    expectation, the mean gradient against its autograd, within 4 standard errors over 30 independent seeds."""
    mean = torch.tensor([[0.3, -0.2, 1.0], [2.0, -1.0, 0.0]], dtype=torch.float64, requires_grad=True)
    variance = torch.tensor(variance, dtype=torch.float64, requires_grad=True)
    weights = torch.tensor([[1.0, -0.5, 2.0], [0.3, 1.0, -1.0]], dtype=torch.float64)
    runs = []
    for seed in range(30):
        probs, _ = softmax_expectation_mc(mean, variance, 2000, torch.Generator().manual_seed(seed))
        runs.append(torch.stack(torch.autograd.grad((weights * probs).sum(), (mean, variance))))
    runs = torch.stack(runs)
    estimate, error = runs.mean(0), runs.std(0) / math.sqrt(len(runs))
    assert bool(torch.isfinite(runs).all())
    quadrature_mean = mean.detach().clone().requires_grad_(True)
    (reference_mean,) = torch.autograd.grad(
        (weights * _quadrature_expectation(quadrature_mean, variance.detach())).sum(), quadrature_mean)
    reference_variance = _expectation_variance_gradient(mean.detach(), variance.detach(), weights, 1e-5)
    reference = torch.stack((reference_mean, reference_variance))
    assert bool(((estimate - reference).abs() <= 4.0 * error + 1e-9).all()), (estimate, reference, error)


def test_mc_mean_gradient_is_the_derivative_of_the_estimate():
    """Against autograd through the same draws f_s = μ + σ ε_s (float64, σ² > 0), the same in blocks under a small
    memory budget, and for a variance broadcast over the points (its gradient summed over them)."""
    from rfgp import settings

    mean, variance = _latents(20, 4, torch.float64)
    mean.requires_grad_(True)
    variance = variance[0].clone().requires_grad_(True)  # (C,), broadcast over the 20 points
    weights = torch.randn(20, 4, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    probs, error = softmax_expectation_mc(mean, variance, 300, torch.Generator().manual_seed(4), chunk_size=128)
    assert not error.requires_grad
    grad_mean, grad_variance = torch.autograd.grad((weights * probs).sum(), (mean, variance))
    assert grad_variance.shape == variance.shape
    generator = torch.Generator().manual_seed(4)
    draws = torch.cat([torch.randn((n, 1, 4), generator=generator, dtype=torch.float64) for n in (128, 128, 44)])
    plain = torch.softmax(mean + variance.sqrt() * draws, -1).mean(0)
    torch.testing.assert_close(probs, plain, rtol=1e-12, atol=1e-15)
    (expected_mean,) = torch.autograd.grad((weights * plain).sum(), mean)
    torch.testing.assert_close(grad_mean, expected_mean, rtol=1e-10, atol=1e-14)
    with settings.memory_budget(2000):
        blocked, _ = softmax_expectation_mc(mean, variance, 300, torch.Generator().manual_seed(4), chunk_size=128)
        blocked_grads = torch.autograd.grad((weights * blocked).sum(), (mean, variance))
    torch.testing.assert_close(blocked_grads[0], grad_mean, rtol=1e-12, atol=1e-15)
    torch.testing.assert_close(blocked_grads[1], grad_variance, rtol=1e-12, atol=1e-15)


def test_mc_float32_gradient_is_finite_at_zero_variance():
    mean, variance = _latents(10, 3, torch.float32)
    variance[0, 1] = 0.0
    mean.requires_grad_(True)
    variance.requires_grad_(True)
    probs, _ = softmax_expectation_mc(mean, variance, 500, torch.Generator().manual_seed(0))
    grads = torch.autograd.grad(probs[:, 0].sum(), (mean, variance))
    assert all(g.dtype == torch.float32 and bool(torch.isfinite(g).all()) for g in grads)


def test_mc_gradient_under_torch_func_and_second_derivatives_by_finite_differences():
    """torch.func.grad gives autograd's gradient; the backward pass is differentiable, its derivatives (create_graph)
    those of the gradient formulas, checked by central differences of the gradients (same draws, σ² > 0)."""
    mean, variance = _latents(3, 3, torch.float64)
    variance = variance + 0.2
    weights = torch.randn(3, 3, generator=torch.Generator().manual_seed(5), dtype=torch.float64)

    def objective(m, v):
        return (weights * softmax_expectation_mc(m, v, 400, torch.Generator().manual_seed(9))[0]).sum()

    def gradient(m, v):
        m, v = m.clone().requires_grad_(True), v.clone().requires_grad_(True)
        return torch.cat([g.reshape(-1) for g in torch.autograd.grad(objective(m, v), (m, v))])

    functional = torch.func.grad(objective, argnums=(0, 1))(mean, variance)
    torch.testing.assert_close(torch.cat([g.reshape(-1) for g in functional]), gradient(mean, variance),
                               rtol=1e-12, atol=1e-15)
    m, v = mean.clone().requires_grad_(True), variance.clone().requires_grad_(True)
    first = torch.cat([g.reshape(-1) for g in torch.autograd.grad(objective(m, v), (m, v), create_graph=True)])
    direction = torch.randn(18, generator=torch.Generator().manual_seed(6), dtype=torch.float64)
    second = torch.cat([g.reshape(-1) for g in torch.autograd.grad(first @ direction, (m, v))])
    step = 1e-5
    for index in range(18):
        shift = torch.zeros(18, dtype=torch.float64)
        shift[index] = step
        up = gradient(mean + shift[:9].view(3, 3), variance + shift[9:].view(3, 3))
        down = gradient(mean - shift[:9].view(3, 3), variance - shift[9:].view(3, 3))
        torch.testing.assert_close(second[index], (up - down) @ direction / (2 * step), rtol=1e-5, atol=1e-8)


def test_mean_field_pairwise_terms_are_blocked_under_the_memory_budget(monkeypatch):
    """The mean-field (points, C, C) pairwise terms were formed for all points at once (the leave-one-out check runs
    it over every training point: 8 GB at N = 10⁵, C = 100), whatever rfgp.settings.memory_budget; they are formed
    in blocks that fit it, with the same probabilities."""
    from rfgp import settings

    mean, variance = _latents(60, 5, torch.float64)
    whole = softmax_expectation_mean_field(mean, variance)
    pair_shapes = []
    logsumexp = torch.logsumexp
    monkeypatch.setattr(torch, "logsumexp", lambda x, dim: pair_shapes.append(x.shape) or logsumexp(x, dim=dim))
    budget = 4 * 5 * 5 * 8 * 16  # 16 points' working copies of their pairwise terms
    with settings.memory_budget(budget):
        blocked = softmax_expectation_mean_field(mean, variance)
    assert pair_shapes and all(4 * shape.numel() * 8 <= budget for shape in pair_shapes), pair_shapes
    torch.testing.assert_close(blocked, whole, rtol=0.0, atol=0.0)
