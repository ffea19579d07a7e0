import math
import warnings

import pytest
import torch

from rfgp.features.periodic import PeriodicSpectralMeasure, harmonic_probabilities, latin_hypercube
from rfgp.features.weighted_fourier import WeightedFourierFeatures
from tests._spectral_checks import (
    assert_derivatives_match_finite_differences,
    assert_error_falls_like_inverse_sqrt,
    assert_unbiased,
)

F64 = torch.float64
LENGTHSCALE = torch.tensor([[0.6, 1.5]], dtype=F64)
PERIOD = torch.tensor([[0.8, 1.7]], dtype=F64)
X = torch.rand(8, 2, generator=torch.Generator().manual_seed(0), dtype=F64) * 3


def exact_periodic(x, y, lengthscale, period):
    """GPyTorch's PeriodicKernel: exp(−2 Σ_i sin²(π(x_i − y_i)/p_i)/ℓ_i)."""
    diff = x.unsqueeze(-2) - y.unsqueeze(-3)
    return torch.exp(-2 * (torch.sin(math.pi * diff / period) ** 2 / lengthscale).sum(-1))


def features(num_features, seed, reference=LENGTHSCALE):
    measure = PeriodicSpectralMeasure()
    measure.reference = {"lengthscale": reference}
    return WeightedFourierFeatures(measure, num_features, input_dim=2, seed=seed)


def gram(phi, lengthscale=LENGTHSCALE, period=PERIOD, x=X):
    z = phi(x, lengthscale=lengthscale, period=period)
    return z @ z.mT


def test_harmonic_probabilities_sum_to_one_and_give_the_kernel():
    z = torch.tensor([0.2, 1.0, 7.0], dtype=F64)
    q = harmonic_probabilities(z, 80)
    assert torch.allclose(q.sum(-1), torch.ones(3, dtype=F64), atol=1e-13)
    tau = torch.linspace(-2, 2, 9, dtype=F64)
    series = (q.unsqueeze(-2) * torch.cos(2 * math.pi * torch.arange(80, dtype=F64) * tau.unsqueeze(-1) / 1.3)).sum(-1)
    kernel = torch.exp(-2 * torch.sin(math.pi * tau / 1.3) ** 2 * z.unsqueeze(-1))
    assert torch.allclose(series, kernel, atol=1e-13)


def test_gram_is_unbiased():
    assert_unbiased(lambda seed: gram(features(64, seed)), exact_periodic(X, X, LENGTHSCALE, PERIOD), 80)


def test_unbiased_away_from_the_proposal_lengthscale():
    # the weights keep the estimate unbiased when ℓ has moved from the value the harmonics were drawn at
    moved = LENGTHSCALE * torch.tensor([[0.5, 2.0]], dtype=F64)
    assert_unbiased(lambda seed: gram(features(64, seed), lengthscale=moved), exact_periodic(X, X, moved, PERIOD), 80)


def test_relative_error_falls_like_inverse_sqrt_width():
    exact = exact_periodic(X, X, LENGTHSCALE, PERIOD)
    assert_error_falls_like_inverse_sqrt(lambda width, seed: gram(features(width, 100 + seed)), exact, 32, 512)


def test_one_dimensional_harmonic_counts_are_stratified():
    uniforms = latin_hypercube(50, 3, torch.Generator().manual_seed(1))
    strata = (uniforms * 50).floor().sort(0).values
    assert torch.equal(strata, torch.arange(50, dtype=F64).unsqueeze(-1).expand(50, 3))


def test_harmonic_probabilities_accurate_to_three_times_the_design_argument():
    from scipy.special import ive

    from rfgp.features.periodic import num_harmonics_for

    for design in (0.5, 8.0, 200.0):
        num = num_harmonics_for(design)
        z = torch.tensor([design / 100, design, 3 * design], dtype=F64)
        reference = torch.from_numpy(ive(torch.arange(num, dtype=F64).numpy()[None], z.numpy()[:, None]))
        reference[:, 1:] *= 2
        mask = reference > 1e-250
        assert torch.allclose(harmonic_probabilities(z, num)[mask], reference[mask], rtol=1e-11, atol=0)


def test_gradients_and_hessian_match_finite_differences():
    phi = features(16, 3)
    probe = torch.randn(8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)

    def scalar(theta):  # θ = (ℓ₁, ℓ₂, p₁, p₂)
        return (gram(phi, theta[:2].unsqueeze(0), theta[2:].unsqueeze(0)) * probe).sum()

    assert_derivatives_match_finite_differences(scalar, torch.cat([LENGTHSCALE[0], PERIOD[0]]))


def test_too_small_lengthscale_raises_naming_it():
    phi = features(16, 0)
    with pytest.raises(ValueError, match="lengthscale .* too small.*resample"):
        gram(phi, lengthscale=LENGTHSCALE / 200)


def test_too_small_trainable_lengthscale_raises_without_a_warning():
    # the message read float() of a tensor that requires grad: a UserWarning came with (or, under -W error, instead
    # of) the refusal
    phi = features(16, 0)
    lengthscale = (LENGTHSCALE / 200).requires_grad_()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ValueError, match="lengthscale .* too small"):
            gram(phi, lengthscale=lengthscale)


def test_state_dict_round_trip_restores_proposal_dependent_shapes():
    phi = features(32, 5, reference=LENGTHSCALE / 10)  # more harmonics than at the default reference
    other = features(32, 9)
    other.load_state_dict(phi.state_dict())
    assert torch.equal(gram(other), gram(phi))


def test_input_hessian_matches_finite_differences():
    phi = features(32, 4)
    weights = torch.randn(32, generator=torch.Generator().manual_seed(5), dtype=F64)

    def mean_at(point):  # a predictive mean Φ(x)ᵀβ at one point
        return phi(point.unsqueeze(0), lengthscale=LENGTHSCALE, period=PERIOD)[0] @ weights

    assert_derivatives_match_finite_differences(mean_at, torch.tensor([0.3, 1.1], dtype=F64))
