"""BoTorch's Standardize and ScalarizedPosteriorTransform on rfgp posteriors: the rescaled covariance keeps its n × F
root, so Thompson sampling over many candidates draws in O(n·F) instead of factorising an n × n matrix — with
BoTorch's own values."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.acquisition.objective import ScalarizedPosteriorTransform  # noqa: E402
from botorch.generation import MaxPosteriorSampling  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.transforms.outcome import ChainedOutcomeTransform, Standardize  # noqa: E402
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior  # noqa: E402
from botorch.posteriors import GPyTorchPosterior  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.posterior_covariance import LowRankPosteriorAddedDiag, LowRankPosteriorCovariance  # noqa: E402
from rfgp.integrations.botorch_transforms import _botorch_untransform_posterior  # noqa: E402

D = 2


def model(num_features=32, **options):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(30, D, generator=gen, dtype=torch.float64)
    noise = 0.1 * torch.randn(30, 1, generator=gen, dtype=torch.float64)
    y = 5.0 + 3.0 * torch.sin(4 * x).sum(-1, keepdim=True) + noise  # far from standardised: S ≠ I
    kernel = rfgp.sketch(get_covar_module_with_dim_scaled_prior(ard_num_dims=D), num_features, seed=0)
    return SingleTaskGP(x, y, covar_module=kernel, **options).double().eval()  # Standardize(1) unless told


@pytest.mark.parametrize("observation_noise", [False, True])
@pytest.mark.parametrize("chained", [False, True])
def test_standardized_posterior_keeps_the_root_with_botorchs_values(observation_noise, chained):
    gp = model(**({"outcome_transform": ChainedOutcomeTransform(standardize=Standardize(1))} if chained else {}))
    xs = torch.rand(50, D, generator=torch.Generator().manual_seed(1), dtype=torch.float64)  # n = 50 > F = 32
    with torch.no_grad():
        posterior = gp.posterior(xs, observation_noise=observation_noise)
        covariance = posterior.distribution.lazy_covariance_matrix
        assert isinstance(covariance, LowRankPosteriorAddedDiag if observation_noise else LowRankPosteriorCovariance)
        latent = gp.likelihood(gp(xs), xs) if observation_noise else gp(xs)
        transform = gp.outcome_transform["standardize"] if chained else gp.outcome_transform
        expected = _botorch_untransform_posterior(transform, GPyTorchPosterior(latent), X=xs)  # S Σ S, dense
    torch.testing.assert_close(posterior.mean, expected.mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(covariance.to_dense(), expected.distribution.covariance_matrix, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("weight", [None, -2.0])  # -2: minimise twice the output, c·Σ* with c = 4
def test_thompson_sampling_over_many_candidates_factorises_nothing(factorised, weight):
    gp = model()
    transform = None if weight is None else ScalarizedPosteriorTransform(torch.tensor([weight], dtype=torch.float64))
    xs = torch.rand(400, D, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    with torch.no_grad():
        gp.posterior(xs[:1])  # the prediction caches (an N × N factor at N ≤ F)
        factorised.clear()
        candidates = MaxPosteriorSampling(gp, posterior_transform=transform, replacement=False)(xs, num_samples=3)
        assert candidates.shape == (3, D) and not factorised
        posterior = gp.posterior(xs[:4], posterior_transform=transform)
        if weight is not None:
            unscaled = gp.posterior(xs[:4]).distribution.covariance_matrix
            torch.testing.assert_close(posterior.distribution.covariance_matrix, weight**2 * unscaled)
        samples = posterior.rsample(torch.Size([4000])).squeeze(-1)
    assert not factorised
    mean, covariance = posterior.mean.squeeze(-1), posterior.distribution.covariance_matrix
    variance = covariance.diagonal()
    assert ((samples.mean(0) - mean).abs() <= 4 * (variance / 4000).sqrt()).all()
    se = ((variance.unsqueeze(-1) * variance.unsqueeze(-2) + covariance.pow(2)) / 4000).sqrt()
    assert ((torch.cov(samples.T) - covariance).abs() <= 4 * se).all()
