"""A ScaleKernel's outputscale folded into the sin/cos Functions' pair scales (FeatureKernel.amplitude_features), as
the chunked operators' Featurizer does for K(Z, x) and kernel_features does for sums of scaled kernels, streaming and
sampling.

The folded features must equal the multiply path ``featurize(x)·√s`` as functions of x and every hyperparameter:
values to 1e-13 (float64), first and second derivatives to 1e-10 relative.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel

import rfgp
from rfgp.features.weighted_fourier import projection_features
from rfgp.kernels import (
    FeatureKernel,
    FeatureSumKernel,
    SketchedMatern52KernelGrad,
    SketchedMaternKernel,
    SketchedNewtonGirardAdditiveKernel,
    SketchedPeriodicKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
    SketchedRQKernel,
    SketchedSpectralMixtureKernel,
    SketchedSphericalPolynomialKernel,
    SpectralDeltaFeatureKernel,
    SpectralProductKernel,
)
from rfgp.kernels.combinations import kernel_features, kernel_squared_norm

BATCH = torch.Size([3])

KERNELS = {
    "rff": lambda b: SketchedRBFKernel(16, method="rff", ard_num_dims=2, batch_shape=b, seed=0),
    "orf": lambda b: SketchedRBFKernel(16, method="orf", ard_num_dims=2, batch_shape=b, seed=0),
    "sorf": lambda b: SketchedRBFKernel(16, method="sorf", ard_num_dims=2, batch_shape=b, seed=0),
    "matern12": lambda b: SketchedMaternKernel(16, nu=0.5, ard_num_dims=2, batch_shape=b, seed=0),
    "matern32": lambda b: SketchedMaternKernel(16, nu=1.5, ard_num_dims=2, batch_shape=b, seed=0),
    "periodic": lambda b: SketchedPeriodicKernel(16, ard_num_dims=2, batch_shape=b, seed=0),
    "rq": lambda b: SketchedRQKernel(16, ard_num_dims=2, batch_shape=b, seed=0),
    "spectral_mixture": lambda b: SketchedSpectralMixtureKernel(2, 16, ard_num_dims=2, batch_shape=b, seed=0),
    "product": lambda b: SpectralProductKernel(SketchedPeriodicKernel(8, batch_shape=b, seed=0),
                                               ScaleKernel(SketchedRBFKernel(8, batch_shape=b, seed=1), batch_shape=b),
                                               num_features=16, seed=2),
    "spectral_delta": lambda b: SpectralDeltaFeatureKernel(2, 8, ard_num_dims=2, batch_shape=b, seed=0),
    "newton_girard": lambda b: SketchedNewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=2, batch_shape=b), 2, 16,
                                                                  batch_shape=b, seed=0),
}


def _scaled(name, batch):
    torch.manual_seed(0)
    kernel = ScaleKernel(KERNELS[name](batch), batch_shape=batch).double()
    with torch.no_grad():  # hyperparameters away from their defaults, different per batch member
        for parameter in kernel.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    return kernel


def _multiplied(kernel, x):
    """The multiply path: Φ(x)·√s."""
    return kernel.base_kernel.featurize(x) * kernel.outputscale.sqrt().unsqueeze(-1).unsqueeze(-1)


def _folded(kernel, x):
    """√s folded into the features: amplitude_features(x, log s)."""
    return kernel.base_kernel.amplitude_features(x, kernel.outputscale.log())


@pytest.mark.parametrize("batch", [torch.Size(), BATCH], ids=["plain", "batched"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_folded_features_equal_the_multiplied_ones(name, batch):
    kernel = _scaled(name, batch)
    assert kernel.base_kernel.folds_amplitude()
    x = torch.rand(7, 2, dtype=torch.float64, requires_grad=True)
    params = [x, *kernel.parameters()]
    kernel_features(kernel, x)  # the draws (a periodic kernel's proposal fixed at its first call)

    folded, multiplied = _folded(kernel, x), _multiplied(kernel, x)
    assert folded.shape == multiplied.shape == (*batch, 7, 16)
    _assert_same_function(folded, multiplied, params)


def _assert_same_function(folded, multiplied, params):
    """Values to 1e-13, then first derivatives through a generic loss and second derivatives of a first
    derivative's norm to 1e-10."""
    torch.testing.assert_close(folded, multiplied, rtol=0, atol=1e-13)
    weights = torch.randn_like(folded)
    grads = [torch.autograd.grad((f * weights).sum(), params, create_graph=True) for f in (folded, multiplied)]
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    seconds = [torch.autograd.grad(sum(g.pow(2).sum() for g in gs), params, allow_unused=True) for gs in grads]
    for a, b in zip(*seconds):
        if a is None or b is None:
            assert a is None and b is None or (a if b is None else b).abs().max() == 0
            continue
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-11)


def _count_folds(monkeypatch, kernel_class):
    """The inputs of every amplitude_features call of ``kernel_class`` (still computing the folded features)."""
    folded, calls = kernel_class.amplitude_features, []
    monkeypatch.setattr(kernel_class, "amplitude_features", lambda self, u, a: calls.append(u) or folded(self, u, a))
    return calls


@pytest.mark.parametrize("batch", [torch.Size(), BATCH], ids=["plain", "batched"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_kernel_features_fold_the_outputscale(name, batch, monkeypatch):
    """kernel_features (sums of scaled kernels, streaming, sampling, BoTorch's pathwise features) scales Φ by √s as
    the chunked operators do: folded through amplitude_features, the same function of x and the hyperparameters."""
    kernel = _scaled(name, batch)
    x = torch.rand(7, 2, dtype=torch.float64, requires_grad=True)
    kernel_features(kernel, x)  # draws
    calls = _count_folds(monkeypatch, type(kernel.base_kernel))
    features = kernel_features(kernel, x)
    assert len(calls) == 1
    _assert_same_function(features, _multiplied(kernel, x), [x, *kernel.parameters()])


def test_nested_scale_kernels_fold_the_product_of_their_outputscales(monkeypatch):
    inner = _scaled("rff", BATCH)
    kernel = ScaleKernel(inner, batch_shape=BATCH).double()
    kernel.outputscale = torch.tensor([0.3, 2.0, 7.0], dtype=torch.float64)
    x = torch.rand(5, 2, dtype=torch.float64, requires_grad=True)
    kernel_features(kernel, x)
    calls = _count_folds(monkeypatch, SketchedRBFKernel)
    features = kernel_features(kernel, x)
    assert len(calls) == 1
    expected = _multiplied(inner, x) * kernel.outputscale.sqrt().unsqueeze(-1).unsqueeze(-1)
    _assert_same_function(features, expected, [x, *kernel.parameters()])


def test_sum_of_scaled_kernels_folds_every_outputscale(monkeypatch):
    """A co2-style sum ScaleKernel(RBF) + ScaleKernel(Periodic) converted by rfgp.sketch: a FeatureSumKernel whose
    features [√s₁Φ₁, √s₂Φ₂] (its training root, K(Z, x), samples) fold both outputscales."""
    tree = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)) + gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.PeriodicKernel(ard_num_dims=2))
    kernel = rfgp.sketch(tree, num_features=32, seed=0).double()
    assert isinstance(kernel, FeatureSumKernel)
    torch.manual_seed(0)
    with torch.no_grad():
        for parameter in kernel.parameters():
            parameter.add_(0.3 * torch.randn_like(parameter))
    x = torch.rand(6, 2, dtype=torch.float64, requires_grad=True)
    kernel.featurize(x)  # draws
    calls = [_count_folds(monkeypatch, type(part.base_kernel)) for part in kernel.kernels]
    features = kernel.featurize(x)
    assert [len(c) for c in calls] == [1, 1]
    expected = torch.cat([_multiplied(part, x) for part in kernel.kernels], -1)
    _assert_same_function(features, expected, [x, *kernel.parameters()])


@pytest.mark.parametrize("name", ["rff", "periodic", "product"])
def test_cross_covariance_folds_the_outputscale(name, monkeypatch):
    """The chunked cross-covariance K(Z, x) of an SVGP step: the Featurizer folds √s instead of multiplying Φ, and its
    values and gradients are those of s·Φ(Z)Φ(x)ᵀ."""
    kernel = _scaled(name, BATCH)
    z = torch.rand(5, 2, dtype=torch.float64)
    x = torch.rand(9, 2, dtype=torch.float64, requires_grad=True)
    kernel(z, x).to_dense()  # draws
    expected = _multiplied(kernel, z) @ _multiplied(kernel, x).mT
    calls = _count_folds(monkeypatch, type(kernel.base_kernel))
    covariance = kernel(z, x).to_dense()
    assert len(calls) == 2  # Φ(Z), Φ(x) with √s folded, not featurised then multiplied
    torch.testing.assert_close(covariance, expected, rtol=0, atol=1e-13)
    params = [x, *kernel.parameters()]
    weights = torch.randn_like(expected)
    monkeypatch.undo()
    for a, b in zip(torch.autograd.grad((covariance * weights).sum(), params),
                    torch.autograd.grad((expected * weights).sum(), params)):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_squared_norm_unaffected():
    kernel = _scaled("periodic", BATCH)
    x = torch.rand(6, 2, dtype=torch.float64)
    torch.testing.assert_close(kernel_squared_norm(kernel, x), kernel_features(kernel, x).pow(2).sum(-1),
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("make", [
    lambda: SketchedPolynomialKernel(power=2, num_features=16, seed=0),
    lambda: SketchedMatern52KernelGrad(16, seed=0),  # a Matérn subclass whose featurize gives derivative rows
], ids=["polynomial", "matern52_grad"])
def test_kernels_that_do_not_fold_keep_the_multiply(make):
    kernel = ScaleKernel(make()).double()
    x = torch.rand(4, 2, dtype=torch.float64)
    assert not kernel.base_kernel.folds_amplitude()
    assert kernel.base_kernel.featurizer(x).amplitude_function is None
    torch.testing.assert_close(kernel_features(kernel, x), _multiplied(kernel, x), rtol=0, atol=0)


class _FoldedFeaturesOnly(FeatureKernel):
    """sin/cos features √(A/m)[cos ωx, sin ωx] of m = 4 frequencies ω = W·e^r, batch shape ``BATCH``, implementing only
    ``folded_features``."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.register_buffer("frequencies", torch.randn(4, 2, generator=torch.Generator().manual_seed(0)))
        # a hyperparameter per batch member: ω = W·e^r
        self.register_parameter("raw_scale", torch.nn.Parameter(torch.linspace(-0.5, 0.5, BATCH[0]).unsqueeze(-1)))

    def folded_features(self, x, log_amplitude=None):
        frequencies = self.frequencies.to(x.dtype) * self.raw_scale.exp().unsqueeze(-1)
        return projection_features(x @ frequencies.mT, None, log_amplitude)

    def diag_moments(self, x):
        return None


def test_a_kernel_implementing_only_folded_features_folds_the_outputscale(monkeypatch):
    """The shared protocol (FeatureKernel.folded_features): featurize, folds_amplitude and amplitude_features come
    from the one method, and a ScaleKernel's outputscale is folded through it — kernel_features and the chunked
    cross-covariance — as the same function of x and the hyperparameters as the multiply path."""
    kernel = ScaleKernel(_FoldedFeaturesOnly(batch_shape=BATCH), batch_shape=BATCH).double()
    kernel.outputscale = torch.tensor([0.3, 2.0, 7.0], dtype=torch.float64)
    x = torch.rand(6, 2, dtype=torch.float64, requires_grad=True)
    z = torch.rand(5, 2, dtype=torch.float64)
    base = kernel.base_kernel
    assert base.folds_amplitude()
    torch.testing.assert_close(base.featurize(x), base.folded_features(x), rtol=0, atol=0)
    calls = _count_folds(monkeypatch, _FoldedFeaturesOnly)
    features = kernel_features(kernel, x)
    assert len(calls) == 1
    _assert_same_function(features, _multiplied(kernel, x), [x, *kernel.parameters()])
    covariance = kernel(z, x).to_dense()
    assert len(calls) == 3  # Φ(Z) and Φ(x), each folded
    torch.testing.assert_close(covariance, _multiplied(kernel, z) @ _multiplied(kernel, x).mT, rtol=0, atol=1e-13)


def _doubled(kernel):
    """``kernel`` as an instance of a user subclass whose featurize returns 2·Φ(x)."""
    cls = type(kernel)
    kernel.__class__ = type(f"Doubled{cls.__name__}", (cls,), {"featurize": lambda self, x: 2 * cls.featurize(self, x)})
    return kernel


@pytest.mark.parametrize("name", ["rff", "matern12", "periodic", "spectral_mixture", "product", "spectral_delta",
                                  "newton_girard", "folded_features_only"])
def test_a_subclass_that_overrides_featurize_is_not_folded(name):
    """A user subclass that changes featurize is never bypassed by the folded_features it inherits: it does not fold,
    amplitude_features refuses, and a ScaleKernel's √s multiplies its Φ (kernel_features, the chunked
    cross-covariance)."""
    kernel = ScaleKernel(_FoldedFeaturesOnly(batch_shape=BATCH), batch_shape=BATCH).double() \
        if name == "folded_features_only" else _scaled(name, BATCH)
    x = torch.rand(6, 2, dtype=torch.float64)
    z = torch.rand(5, 2, dtype=torch.float64)
    kernel_features(kernel, x)  # draws
    folded = kernel.base_kernel.folded_features(x)
    base = _doubled(kernel.base_kernel)
    assert not base.folds_amplitude()
    assert base.amplitude_function() is None
    with pytest.raises(NotImplementedError, match="does not fold an amplitude"):
        base.amplitude_features(x, kernel.outputscale.log())
    expected = 2 * folded * kernel.outputscale.sqrt()[..., None, None]
    torch.testing.assert_close(kernel_features(kernel, x), expected, rtol=0, atol=1e-13)
    covariance = kernel(z, x).to_dense()
    torch.testing.assert_close(covariance, _multiplied(kernel, z) @ expected.mT, rtol=0, atol=1e-13)


@pytest.mark.parametrize("make", [
    lambda: FeatureKernel(),
    lambda: SketchedSphericalPolynomialKernel(power=3, num_features=16, input_dim=2, seed=0),  # projects, not sin/cos
], ids=["neither_method", "spherical"])
def test_kernels_without_folded_features_refuse_an_amplitude(make):
    """A kernel that implements neither featurize nor folded_features says so; a random-feature kernel whose map is
    not sin/cos refuses to fold an amplitude instead of returning sin/cos features of its projections."""
    kernel = make().double()
    x = torch.nn.functional.normalize(torch.rand(4, 2, dtype=torch.float64), dim=-1)
    log_amplitude = torch.tensor(0.3, dtype=torch.float64)
    for call in (lambda: kernel.amplitude_features(x, log_amplitude), lambda: kernel.folded_features(x, log_amplitude)):
        with pytest.raises(NotImplementedError, match="neither featurize nor folded_features|does not fold"):
            call()
