"""FeatureSumKernel / FeatureProductKernel: Gram equals the sum/product of the parts, features stay
low-rank, variance corrections combine, bad parts are rejected."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.features import RandomFourierFeatures
from rfgp.inference.operators import FeatureRootLinearOperator
from rfgp.kernels import (
    FeatureProductKernel,
    FeatureSumKernel,
    RandomFeatureKernel,
    SketchedMaternKernel,
    SketchedProductKernel,
    SketchedRBFKernel,
    is_feature_kernel,
    kernel_features,
)
from tests._feature_maps import ShrunkFourierFeatures


def parts(device):
    a = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(8, method="orf", seed=0, active_dims=[0]))
    b = SketchedMaternKernel(6, nu=1.5, seed=1, active_dims=[1, 2])
    a.outputscale = 1.8
    b.lengthscale = 0.7
    return a.double().to(device), b.double().to(device)


def test_sum_gram_equals_sum_of_parts(device):
    a, b = parts(device)
    kernel = FeatureSumKernel(a, b).double().to(device)
    x, y = torch.randn(12, 3, dtype=torch.float64, device=device), torch.randn(5, 3, dtype=torch.float64, device=device)
    op = kernel(x).evaluate_kernel()
    assert isinstance(op, FeatureRootLinearOperator) and op.root.shape == (12, 8 + 6)
    torch.testing.assert_close(op.to_dense(), a(x).to_dense() + b(x).to_dense())
    torch.testing.assert_close(kernel(x, y).to_dense(), a(x, y).to_dense() + b(x, y).to_dense())
    torch.testing.assert_close(kernel(x, diag=True), a(x, diag=True) + b(x, diag=True))


def test_product_gram_equals_product_of_parts(device):
    a, b = parts(device)
    kernel = FeatureProductKernel(a, b).double().to(device)
    x, y = torch.randn(12, 3, dtype=torch.float64, device=device), torch.randn(5, 3, dtype=torch.float64, device=device)
    assert kernel_features(kernel, x).shape == (12, 8 * 6)
    torch.testing.assert_close(kernel(x).to_dense(), a(x).to_dense() * b(x).to_dense())
    torch.testing.assert_close(kernel(x, y).to_dense(), a(x, y).to_dense() * b(x, y).to_dense())
    torch.testing.assert_close(kernel(x, diag=True), a(x, diag=True) * b(x, diag=True))


def test_nested_combinations_and_batches(device):
    a, b = parts(device)
    c = SketchedRBFKernel(4, seed=2).double().to(device)
    kernel = gpytorch.kernels.ScaleKernel(FeatureSumKernel(FeatureProductKernel(a, b), c)).double().to(device)
    kernel.outputscale = 0.5
    x = torch.randn(2, 7, 3, dtype=torch.float64, device=device)
    expected = 0.5 * (a(x).to_dense() * b(x).to_dense() + c(x).to_dense())
    torch.testing.assert_close(kernel(x).to_dense(), expected)


def test_gradients_flow_to_every_part(device):
    a, b = parts(device)
    kernel = FeatureSumKernel(a, FeatureProductKernel(b, SketchedRBFKernel(4, seed=3))).double().to(device)
    kernel(torch.randn(9, 3, dtype=torch.float64, device=device)).to_dense().sum().backward()
    for name, p in kernel.named_parameters():
        assert p.grad is not None and bool(torch.isfinite(p.grad).all()), name


def test_variance_corrections_combine(device):
    x = torch.randn(6, 2, dtype=torch.float64, device=device)
    biased = RandomFeatureKernel(ShrunkFourierFeatures(8, 0.6, seed=0)).double().to(device)
    unbiased = SketchedRBFKernel(8, seed=1).double().to(device)
    scaled = gpytorch.kernels.ScaleKernel(biased).double().to(device)
    scaled.outputscale = 2.0
    ones = torch.ones(6, dtype=torch.float64, device=device)
    # Sum: k − E[k̂] adds up; the unbiased part contributes zero.
    torch.testing.assert_close(FeatureSumKernel(scaled, unbiased).variance_correction(x), 2.0 * 0.4 * ones)
    # Product of two biased parts: k₁k₂ − E[k̂₁]E[k̂₂] = 1 − 0.36 (independent draws).
    product = FeatureProductKernel(biased, RandomFeatureKernel(ShrunkFourierFeatures(8, 0.6, seed=1)))
    torch.testing.assert_close(product.double().to(device).variance_correction(x), 0.64 * ones)
    assert FeatureSumKernel(unbiased, unbiased).variance_correction(x) is None
    assert FeatureProductKernel(unbiased, SketchedRBFKernel(8, seed=2)).variance_correction(x) is None
    assert isinstance(FeatureSumKernel(scaled, unbiased).double().to(device)(x).evaluate_kernel(),
                      FeatureRootLinearOperator)


def test_is_feature_kernel_and_kernel_features():
    sketched = SketchedRBFKernel(8, seed=0)
    assert is_feature_kernel(sketched) and is_feature_kernel(gpytorch.kernels.ScaleKernel(sketched))
    assert not is_feature_kernel(gpytorch.kernels.RBFKernel())
    with pytest.raises(TypeError, match="RBFKernel is not a feature kernel"):
        kernel_features(gpytorch.kernels.RBFKernel(), torch.randn(3, 2))


def test_bad_parts_rejected():
    with pytest.raises(TypeError, match=r"kernels\[1\] is a PeriodicKernel"):
        FeatureSumKernel(SketchedRBFKernel(8, seed=0), gpytorch.kernels.PeriodicKernel())
    with pytest.raises(TypeError, match=r"kernels\[0\] is a RBFKernel"):
        FeatureProductKernel(gpytorch.kernels.RBFKernel(), SketchedRBFKernel(8, seed=0))
    with pytest.raises(ValueError, match="at least one kernel"):
        FeatureSumKernel()


def test_random_feature_kernel_rejects_non_feature_map():
    with pytest.raises(TypeError, match="feature_map must be a rfgp.features.FeatureMap"):
        RandomFeatureKernel(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="ard_num_dims=2.*input_dim=3"):
        RandomFeatureKernel(RandomFourierFeatures(8, input_dim=3), ard_num_dims=2)


@pytest.mark.parametrize("wrappers", [0, 1, 2])
@pytest.mark.parametrize("combination", [FeatureSumKernel, FeatureProductKernel])
def test_a_complex_posterior_part_is_refused_inside_any_number_of_scale_kernels(wrappers, combination):
    """A part with complex_posterior=True would lose it in a combination (real features): refused, also inside two
    ScaleKernels (only one wrapper was looked through, so ScaleKernel(ScaleKernel(part)) combined silently)."""
    from rfgp.kernels import SketchedPolynomialKernel

    part = SketchedPolynomialKernel(2, 16, weights="complex", complex_posterior=True, seed=0)
    for _ in range(wrappers):
        part = gpytorch.kernels.ScaleKernel(part)
    with pytest.raises(ValueError, match="kernels\\[0\\] has complex_posterior=True"):
        combination(part, SketchedRBFKernel(16, seed=1))


def _sketched_product(*kernels):
    return SketchedProductKernel(*kernels, num_features=16, seed=3)


@pytest.mark.parametrize("wrap", [False, True])
@pytest.mark.parametrize("combination", [FeatureProductKernel, _sketched_product])
def test_a_product_refuses_one_random_kernel_in_two_factors(wrap, combination):
    """FeatureProductKernel(k, k) was k̂², whose mean k² + Var k̂ is biased (RFF, F = 8, ℓ = 0.69, |x − y| = 0.5:
    E[k̂²] = 0.618 ± 0.004 over 3000 seeds against k² = 0.594), with no variance correction to say so; refused, also
    through a ScaleKernel.  Two instances (independent draws) and a repeated factor without draws (exact, Nyström) are
    accepted."""
    from rfgp.kernels import IndexFeatureKernel

    k = SketchedRBFKernel(8, seed=0).double()
    with pytest.raises(ValueError, match=r"kernels\[0\] and kernels\[1\] hold the same RandomFourierFeatures instance"):
        combination(k, gpytorch.kernels.ScaleKernel(k) if wrap else k)
    combination(k, SketchedRBFKernel(8, seed=1).double())
    tasks = IndexFeatureKernel(num_tasks=3, rank=1).double()
    i = torch.tensor([[0.0], [2.0], [1.0]], dtype=torch.float64)
    torch.testing.assert_close(FeatureProductKernel(tasks, tasks)(i).to_dense(), tasks(i).to_dense().square())
    x = torch.rand(12, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    nystrom = rfgp.sketch(gpytorch.kernels.RBFKernel(), 6, method="nystrom", x_sample=x, seed=0).double()
    torch.testing.assert_close(FeatureProductKernel(nystrom, nystrom)(x).to_dense(), nystrom(x).to_dense().square())
