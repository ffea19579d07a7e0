import math

import pytest
import torch

from rfgp.features.spectral_mixture import SpectralMixtureSpectralMeasure
from rfgp.features.weighted_fourier import WeightedFourierFeatures
from tests._spectral_checks import (
    assert_derivatives_match_finite_differences,
    assert_error_falls_like_inverse_sqrt,
    assert_unbiased,
)

F64 = torch.float64
GEN = torch.Generator().manual_seed(0)
WEIGHTS = torch.tensor([0.3, 1.0, 0.6], dtype=F64)
MEANS = torch.rand(3, 1, 2, generator=GEN, dtype=F64)
SCALES = 0.2 + 0.5 * torch.rand(3, 1, 2, generator=GEN, dtype=F64)
X = torch.rand(8, 2, generator=GEN, dtype=F64) * 2


def exact_spectral_mixture(x, y, weights, means, scales):
    """GPyTorch's SpectralMixtureKernel: Π_i Σ_q w_q exp(−2π²τ_i²σ_qi²) cos(2πτ_iμ_qi), normalised by (Σw)^d."""
    tau = (x.unsqueeze(-2) - y.unsqueeze(-3)).unsqueeze(-2)  # (n, n, 1, d)
    terms = torch.exp(-2 * math.pi**2 * tau**2 * scales.squeeze(-2) ** 2) * torch.cos(2 * math.pi * tau * means.squeeze(-2))
    return (terms * weights.unsqueeze(-1)).sum(-2).prod(-1) / weights.sum() ** x.shape[-1]


def features(num_features, seed):
    return WeightedFourierFeatures(SpectralMixtureSpectralMeasure(3), num_features, input_dim=2, seed=seed)


def gram(phi, weights=WEIGHTS, means=MEANS, scales=SCALES, x=X):
    z = phi(x, weights=weights, means=means, scales=scales)
    return z @ z.mT


def test_gram_is_unbiased():
    assert_unbiased(lambda seed: gram(features(64, seed)), exact_spectral_mixture(X, X, WEIGHTS, MEANS, SCALES), 150)


def test_relative_error_falls_like_inverse_sqrt_width():
    exact = exact_spectral_mixture(X, X, WEIGHTS, MEANS, SCALES)
    assert_error_falls_like_inverse_sqrt(lambda width, seed: gram(features(width, 50 + seed)), exact, 32, 512)


def test_gradients_and_hessian_in_weights_means_scales_match_finite_differences():
    phi = features(24, 1)
    probe = torch.randn(8, 8, generator=torch.Generator().manual_seed(2), dtype=F64)

    def scalar(theta):
        weights, means, scales = theta[:3], theta[3:9].reshape(3, 1, 2), theta[9:].reshape(3, 1, 2)
        return (gram(phi, weights, means, scales) * probe).sum()

    theta = torch.cat([WEIGHTS, MEANS.flatten(), SCALES.flatten()])
    assert_derivatives_match_finite_differences(scalar, theta)


def test_components_are_stratified_per_dimension():
    draws = features(40, 3).draws(X)  # m = 20 over Q = 3
    counts = torch.stack([torch.bincount(draws["component"][:, i], minlength=3) for i in range(2)])
    assert torch.equal(counts, torch.tensor([[7, 7, 6], [7, 7, 6]]))


def test_fewer_frequencies_than_components_raises_naming_num_features():
    with pytest.raises(ValueError, match="num_features"):
        features(4, 0)


def test_kernel_features_fold_the_amplitude_and_match_sqrt_a_times_the_normalised_features():
    """SketchedSpectralMixtureKernel passes log A to the map (no extra pass over Φ): √A·Φ, to rounding, with the
    same gradients in every hyperparameter."""
    import gpytorch

    import rfgp
    from rfgp.kernels.spectral_kernel import SpectralFeatureKernel

    x = torch.rand(9, 2, dtype=torch.float64)
    kernel = rfgp.sketch(gpytorch.kernels.SpectralMixtureKernel(num_mixtures=3, ard_num_dims=2), 64, seed=0).double()
    kernel(x[:2]).to_dense()
    params = [kernel.raw_mixture_weights, kernel.raw_mixture_means, kernel.raw_mixture_scales]
    out = kernel.featurize(x)
    ref = SpectralFeatureKernel.folded_features(kernel, x) * kernel.spectral_amplitude().sqrt()  # normalised Φ·√A
    assert type(out.grad_fn).__name__ == "_WeightedSinCosFeaturesBackward"
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    probe = torch.randn(out.shape, dtype=torch.float64)
    for got, want in zip(torch.autograd.grad((out * probe).sum(), params),
                         torch.autograd.grad((ref * probe).sum(), params)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
