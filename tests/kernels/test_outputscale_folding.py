"""A ScaleKernel's outputscale folded into the sin/cos Functions' pair scales (FeatureKernel.amplitude_features), as
the chunked operators' Featurizer does for K(Z, x).

The folded features must equal the multiply path ``featurize(x)·√s`` as functions of x and every hyperparameter:
values to 1e-13 (float64), first and second derivatives to 1e-10 relative.
"""

import pytest
import torch
from gpytorch.kernels import ScaleKernel

from rfgp.kernels import (
    SketchedMatern52KernelGrad,
    SketchedMaternKernel,
    SketchedPeriodicKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
    SketchedRQKernel,
    SketchedSpectralMixtureKernel,
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
    torch.testing.assert_close(folded, multiplied, rtol=0, atol=1e-13)

    # first derivatives through a generic loss, then second derivatives of a first derivative's norm
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


@pytest.mark.parametrize("name", ["rff", "periodic", "product"])
def test_cross_covariance_folds_the_outputscale(name, monkeypatch):
    """The chunked cross-covariance K(Z, x) of an SVGP step: the Featurizer folds √s instead of multiplying Φ, and its
    values and gradients are those of s·Φ(Z)Φ(x)ᵀ."""
    kernel = _scaled(name, BATCH)
    z = torch.rand(5, 2, dtype=torch.float64)
    x = torch.rand(9, 2, dtype=torch.float64, requires_grad=True)
    kernel(z, x).to_dense()  # draws
    expected = _multiplied(kernel, z) @ _multiplied(kernel, x).mT
    base = kernel.base_kernel
    folded = type(base).amplitude_features
    calls = []
    monkeypatch.setattr(type(base), "amplitude_features", lambda self, u, a: calls.append(u) or folded(self, u, a))
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
