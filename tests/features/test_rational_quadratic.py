import pytest
import torch

from rfgp.features.rational_quadratic import RationalQuadraticSpectralMeasure
from rfgp.features.weighted_fourier import WeightedFourierFeatures
from tests._spectral_checks import (
    assert_derivatives_match_finite_differences,
    assert_error_falls_like_inverse_sqrt,
    assert_unbiased,
)

F64 = torch.float64
LENGTHSCALE = torch.tensor([[0.7, 1.3]], dtype=F64)
ALPHA = torch.tensor([0.8], dtype=F64)
X = torch.rand(8, 2, generator=torch.Generator().manual_seed(0), dtype=F64) * 2


def exact_rq(x, y, lengthscale, alpha):
    """GPyTorch's RQKernel: (1 + r²/(2α))^{−α}, r² = ‖(x − y)/ℓ‖²."""
    r2 = (((x.unsqueeze(-2) - y.unsqueeze(-3)) / lengthscale) ** 2).sum(-1)
    return (1 + r2 / (2 * alpha)).pow(-alpha)


def features(num_features, seed, reference=ALPHA):
    measure = RationalQuadraticSpectralMeasure()
    measure.reference = {"alpha": reference}
    return WeightedFourierFeatures(measure, num_features, input_dim=2, seed=seed)


def gram(phi, lengthscale=LENGTHSCALE, alpha=ALPHA, x=X):
    z = phi(x, lengthscale=lengthscale, alpha=alpha)
    return z @ z.mT


def test_gram_is_unbiased():
    assert_unbiased(lambda seed: gram(features(128, seed)), exact_rq(X, X, LENGTHSCALE, ALPHA), 150)


@pytest.mark.parametrize("factor", [0.3, 4.0])
def test_unbiased_when_alpha_moved_from_the_proposal(factor):
    alpha = ALPHA * factor
    assert_unbiased(lambda seed: gram(features(128, seed), alpha=alpha), exact_rq(X, X, LENGTHSCALE, alpha), 150)


def test_relative_error_falls_like_inverse_sqrt_width():
    exact = exact_rq(X, X, LENGTHSCALE, ALPHA)
    assert_error_falls_like_inverse_sqrt(lambda width, seed: gram(features(width, 50 + seed)), exact, 32, 512)


def test_gradients_and_hessian_in_alpha_and_lengthscale_match_finite_differences():
    phi = features(32, 1)
    probe = torch.randn(8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)

    def scalar(theta):  # θ = (ℓ₁, ℓ₂, α)
        return (gram(phi, theta[:2].unsqueeze(0), theta[2:]) * probe).sum()

    assert_derivatives_match_finite_differences(scalar, torch.cat([LENGTHSCALE[0], ALPHA]))


def test_alpha_far_below_the_proposal_raises_naming_it():
    with pytest.raises(ValueError, match="alpha .* resample"):
        gram(features(16, 0), alpha=ALPHA / 10)


@pytest.mark.parametrize("dtype,alpha", [(torch.float32, 0.1), (torch.float64, 0.002)])
def test_small_alpha_gives_finite_unbiased_features(dtype, alpha):
    # the proposal's Gamma(α/4) precisions underflow (float32 at α ≈ 0.1, float64 at α ≈ 0.01): log τ = −inf made
    # the log-weights NaN/Inf and every call raise; the draws are kept as log τ
    alpha = torch.tensor([alpha], dtype=F64)

    def small_alpha_gram(seed):
        phi = features(128, seed, reference=alpha).to(dtype)
        return gram(phi, LENGTHSCALE.to(dtype), alpha.to(dtype), X.to(dtype)).double()

    assert_unbiased(small_alpha_gram, exact_rq(X, X, LENGTHSCALE, alpha), 100)


@pytest.mark.parametrize("alpha", [1e5, 1e7])
def test_float32_features_at_large_alpha_match_float64(alpha):
    # a log a − log Γ(a) in the Gamma log-density cancelled in float32: at α = 1e7 k̂(x, x) was ≈ 8000, not ≈ 1
    alpha = torch.tensor([alpha], dtype=F64)
    phi = features(128, 3, reference=alpha)
    in_float64 = gram(phi, alpha=alpha)
    in_float32 = gram(phi.float(), LENGTHSCALE.float(), alpha.float(), X.float()).double()
    torch.testing.assert_close(in_float32, in_float64, rtol=0.0, atol=1e-4)


def test_state_dict_round_trip():
    phi, other = features(32, 5), features(32, 6)
    other.load_state_dict(phi.state_dict())
    assert torch.equal(gram(other), gram(phi))


def test_a_state_with_the_precisions_saved_as_tau_loads():
    # states saved before the draws were kept as log τ hold τ under "precisions"
    phi, other = features(32, 5), features(32, 6)
    gram(phi)
    state = phi.state_dict()
    legacy = {("precisions" if key == "log_precisions" else key): (value.exp() if key == "log_precisions" else value)
              for key, value in state.items()}
    other.load_state_dict(legacy)
    assert "precisions" in legacy and "log_precisions" not in legacy  # the caller's dict is not changed
    torch.testing.assert_close(other.log_precisions, phi.log_precisions)  # to the buffers' dtype's precision
    torch.testing.assert_close(gram(other), gram(phi))
