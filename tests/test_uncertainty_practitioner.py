"""A practitioner's pass on predictive uncertainty: the exact kernel swapped for rfgp's at the same hyperparameters.

Intervals, risk bounds and active-learning scores read the predictive variance through many doors — ``.variance``,
``covariance_matrix``, samples, ``confidence_region()``, ``likelihood(f)``, BoTorch posteriors, the scikit-learn
estimator, leave-one-out cross-validation.  These tests check that every door reports the same variance, bias
correction included, and that it is the one the exact GP reports where the docs claim the same model.
"""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

import rfgp
from rfgp.inference.leave_one_out import leave_one_out_predictions

from ._models import UserGP

DTYPE = torch.float64
NOISE = 0.01


def _data(n: int = 80, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = 2 * torch.rand(n, 2, generator=g, dtype=DTYPE) - 1
    y = torch.sin(3 * x[:, 0]) * x[:, 1] + 0.1 * torch.randn(n, generator=g, dtype=DTYPE)
    return x, y


def _exact_kernel(lengthscale: float = 0.3, outputscale: float = 1.3) -> ScaleKernel:
    kernel = ScaleKernel(RBFKernel()).to(DTYPE)
    kernel.base_kernel.lengthscale = lengthscale
    kernel.outputscale = outputscale
    return kernel


def _model(x, y, kernel) -> UserGP:
    model = UserGP(x, y, kernel).to(DTYPE)
    model.likelihood.noise = NOISE
    return model


#: a fixed optimized-Maclaurin allocation of 64 features (order 7, what Algorithm 3 picks on _data() at ℓ = 0.3,
#: without its seconds of search): at the corners of [−1, 1]², ‖x‖²/ℓ² ≈ 22, it leaves out most of k(x, x)
MACLAURIN_WIDTHS = (2, 3, 3, 5, 5, 6, 7)


def _sketched(method: str, num_features: int, x) -> ScaleKernel:
    if method != "maclaurin":
        return rfgp.sketch(_exact_kernel(), num_features, method=method, seed=0,
                           x_sample=x if method == "nystrom" else None)
    kernel = rfgp.sketch(_exact_kernel(), num_features, method=method, seed=0, input_dim=x.shape[-1])
    kernel.base_kernel.feature_map.set_widths(MACLAURIN_WIDTHS)
    return kernel


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("method, num_features", [("maclaurin", 64), ("nystrom", 30)])
def test_leave_one_out_variance_is_the_variance_of_the_model_refitted_without_the_point(method, num_features, mode):
    """Kriging cross-validation of a bias-corrected map: the leave-one-out variance of point i is the predictive
    variance (noise included) of the same model conditioned on the other N − 1 points, from the prior of the model in
    eval or in train mode.  Before, the variance correction c(x) = k(x, x) − E k̂(x, x) was left out: a Maclaurin
    model (ℓ = 0.3 on [−1, 1]², where order 10 leaves out most of k(x, x) at the corners) reported 0.012 where its
    refit says 1.18, and Nyström 0.028 instead of 0.143 at a point that is not a landmark — overconfident
    cross-validation z-scores; in train mode Nyström still did (its training covariance lacked the FITC term)."""
    x, y = _data()
    kernel = _sketched(method, num_features, x)
    model = _model(x, y, kernel)
    getattr(model, mode)()
    prior = model.likelihood(model.forward(x))
    loo_mean, loo_variance = leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)
    for i in range(6):
        keep = torch.arange(len(y)) != i
        refitted = _model(x[keep], y[keep], kernel)
        refitted.mean_module.load_state_dict(model.mean_module.state_dict())
        refitted.eval()
        with torch.no_grad():
            predictive = refitted.likelihood(refitted(x[i:i + 1]))
        torch.testing.assert_close(loo_variance[i:i + 1].detach(), predictive.variance, rtol=1e-8, atol=1e-12)
        torch.testing.assert_close(loo_mean[i:i + 1].detach(), predictive.mean, rtol=0, atol=1e-9)


def test_leave_one_out_of_a_chunked_nystrom_training_covariance_names_eval_mode():
    """A chunked Nyström training covariance (over the memory budget, train mode) does not form the FITC term, which
    would cost one more pass over the data per training step: its leave-one-out predictions are refused by name
    instead of reporting the variance without it; in eval mode they are the unchunked ones."""
    x, y = _data()
    model = _model(x, y, _sketched("nystrom", 30, x))
    with rfgp.settings.memory_budget(30 * 8 * 20):  # 20 rows of float64 features per chunk
        prior = model.likelihood(model.forward(x))
        with pytest.raises(ValueError, match="chunked Nyström training covariance.*eval mode"):
            leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)
        model.eval()
        prior = model.likelihood(model.forward(x))
        chunked = leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)
    prior = model.likelihood(model.forward(x))
    expected = leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)
    for value, reference in zip(chunked, expected):
        torch.testing.assert_close(value, reference, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method, num_features", [("maclaurin", 64), ("nystrom", 30), ("orf", 128)])
def test_every_door_reports_the_same_bias_corrected_variance(method, num_features):
    """``.variance``, the diagonal of ``covariance_matrix``, ``confidence_region()``, ``likelihood(f)`` (noise added),
    BoTorch's ``posterior(X)`` and ``posterior(X, observation_noise=True)``, and the empirical variance of
    BoTorch's posterior samples: one variance, correction c(x) included, near the data and 3–4 units away from it."""
    from botorch.models import SingleTaskGP
    from botorch.sampling import IIDNormalSampler

    x, y = _data()
    g = torch.Generator().manual_seed(1)
    test = torch.cat([2 * torch.rand(20, 2, generator=g, dtype=DTYPE) - 1,
                      3 + torch.rand(5, 2, generator=g, dtype=DTYPE)])
    kernel = _sketched(method, num_features, x)
    model = _model(x, y, kernel)
    model.eval()
    with torch.no_grad():
        latent = model(test)
        variance = latent.variance
        torch.testing.assert_close(latent.covariance_matrix.diagonal(), variance, rtol=1e-10, atol=1e-14)
        lower, upper = latent.confidence_region()
        torch.testing.assert_close((upper - lower) / 4, variance.sqrt(), rtol=1e-10, atol=0)
        noise = model.likelihood.noise.squeeze()  # 0.01 as set through the float32 constraint transform
        torch.testing.assert_close(model.likelihood(latent).variance, variance + noise, rtol=1e-10, atol=0)
    # the correction is what carries the prior variance far from the data for the corrected maps
    far = variance[20:]
    if method == "orf":
        assert bool((far < 1.3 - 0.05).any())  # a degenerate GP's variance does not revert (guide: uncertainty)
    else:
        torch.testing.assert_close(far, torch.full_like(far, 1.3), rtol=1e-3, atol=0)

    botorch_model = SingleTaskGP(x, y.unsqueeze(-1), covar_module=kernel, outcome_transform=None).to(DTYPE)
    botorch_model.likelihood.noise = model.likelihood.noise.detach()
    botorch_model.mean_module.load_state_dict(model.mean_module.state_dict())
    botorch_model.eval()
    with torch.no_grad():
        posterior = botorch_model.posterior(test)
        torch.testing.assert_close(posterior.variance.squeeze(-1), variance, rtol=1e-9, atol=1e-14)
        noisy = botorch_model.posterior(test, observation_noise=True)
        torch.testing.assert_close(noisy.variance.squeeze(-1), variance + noise, rtol=1e-9, atol=1e-14)
        samples = IIDNormalSampler(sample_shape=torch.Size([2000]), seed=0)(posterior).squeeze(-1)
    # the sample variance of 2000 draws: relative standard error √(2/1999) ≈ 0.032; 25 points, 5 SE
    ratio = samples.var(0) / variance
    assert float((ratio - 1).abs().max()) < 5 * math.sqrt(2 / 1999), ratio


def test_classification_scores_refuse_rows_that_are_not_probability_distributions():
    """The MNLL, error and ECE of (M, C) class probabilities: rows that do not sum to 1 (one-vs-rest sigmoid scores,
    unnormalised Dirichlet means) gave numbers without meaning — an MNLL of 0.97 and an ECE of 0.62 for rows summing to
    0.5 — and now raise, naming the row sums.  Rows normalised in float32 pass."""
    probs = torch.tensor([[0.3, 0.2], [0.1, 0.4], [0.45, 0.05]])
    labels = torch.tensor([0, 1, 0])
    for score in (rfgp.metrics.mean_negative_log_likelihood, rfgp.metrics.expected_calibration_error,
                  rfgp.metrics.classification_error, rfgp.metrics.reliability_curve):
        with pytest.raises(ValueError, match=r"rows sum to 1, got row sums in \[0\.5, 0\.5\]"):
            score(probs, labels)
    logits = torch.randn(1000, 10, generator=torch.Generator().manual_seed(0)) * 30
    normalised = torch.softmax(logits, -1)
    assert 0 <= float(rfgp.metrics.expected_calibration_error(normalised, logits.argmax(-1))) <= 1
    nll = rfgp.metrics.mean_negative_log_likelihood(probs / probs.sum(-1, keepdim=True), labels)
    assert float(nll) == pytest.approx(-(math.log(0.6) + math.log(0.8) + math.log(0.9)) / 3, rel=1e-6)


def test_gaussian_mnll_is_scipys_and_names_its_bad_inputs():
    """gaussian_mnll against scipy's normal log density, and its refusals: a negative variance is named, not clamped;
    a zero variance, mismatched shapes and NaN raise."""
    from scipy.stats import norm

    mean = torch.tensor([0.1, -1.0, 2.0], dtype=DTYPE)
    variance = torch.tensor([0.5, 2.0, 0.1], dtype=DTYPE)
    targets = torch.tensor([0.3, 0.0, 1.0], dtype=DTYPE)
    expected = -norm.logpdf(targets.numpy(), mean.numpy(), variance.sqrt().numpy()).mean()
    assert float(rfgp.metrics.gaussian_mnll(mean, variance, targets)) == pytest.approx(expected, rel=1e-12)
    with pytest.raises(ValueError, match=r"variance must be ≥ 0 \(variances\), got the minimum -2"):
        rfgp.metrics.gaussian_mnll(mean, -variance, targets)
    with pytest.raises(ValueError, match="variance must be > 0"):
        rfgp.metrics.gaussian_mnll(mean, variance * 0, targets)
    with pytest.raises(ValueError, match=r"must share one shape, got \(3,\), \(3,\) and \(1, 3\)"):
        rfgp.metrics.gaussian_mnll(mean, variance, targets.unsqueeze(0))
    with pytest.raises(ValueError, match="variance contains NaN"):
        rfgp.metrics.gaussian_mnll(mean, variance.clone().fill_(float("nan")), targets)


def test_converting_at_hyperparameters_the_maclaurin_truncation_does_not_carry_warns():
    """``rfgp.sketch(trained_exact, F, method="maclaurin", x_sample=train_x)`` at ℓ = 0.3 on [−1, 1]² fits an
    allocation of order ≤ 10 that leaves out about a quarter of k(x, x) over the sample: the bias correction then put
    334 times the exact GP's variance among 1 000 training points, and nothing said so (fit_mll warns only after
    training).  Now the conversion warns with rfgp.TruncationWarning; at ℓ = 1 it stays quiet."""
    x, _ = _data(40)
    with pytest.warns(rfgp.TruncationWarning, match=r"leaves out 0\.\d+ of k\(x, x\) on average over it.*max_order"):
        kernel = rfgp.sketch(_exact_kernel(lengthscale=0.2), 32, method="maclaurin", x_sample=x, seed=0)
    share = rfgp.kernels.maclaurin.truncation_share(kernel.base_kernel, x)
    assert float((1 - share).mean()) > 0.1
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.TruncationWarning)
        rfgp.sketch(_exact_kernel(lengthscale=1.0), 32, method="maclaurin", x_sample=x, seed=0)
