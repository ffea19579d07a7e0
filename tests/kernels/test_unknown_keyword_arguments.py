"""Every rfgp feature kernel (and exact operator-valued kernel) refuses keyword arguments that GPyTorch's
Kernel.__init__ would silently drop."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.kernels import (
    ConstantFeatureKernel,
    CosineFeatureKernel,
    CurlFreeRBFKernel,
    DecomposableKernel,
    DivFreeRBFKernel,
    FeatureSumKernel,
    IndexFeatureKernel,
    LinearFeatureKernel,
    NystromKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedHammingIMQKernel,
    SketchedRBFKernel,
    SpectralProductKernel,
)

X = torch.rand(20, 2, dtype=torch.float64)
BUILDERS = {
    "NystromKernel": lambda **kw: NystromKernel(gpytorch.kernels.RBFKernel(), X[:5], **kw),
    "LinearFeatureKernel": lambda **kw: LinearFeatureKernel(input_dim=2, **kw),
    "ConstantFeatureKernel": lambda **kw: ConstantFeatureKernel(**kw),
    "CosineFeatureKernel": lambda **kw: CosineFeatureKernel(**kw),
    "FeatureSumKernel": lambda **kw: FeatureSumKernel(SketchedRBFKernel(16, seed=0), SketchedRBFKernel(16, seed=1), **kw),
    "SpectralProductKernel": lambda **kw: SpectralProductKernel(
        SketchedRBFKernel(16, seed=0), SketchedRBFKernel(16, seed=1), num_features=16, **kw),
    "SketchedCurlFreeKernel": lambda **kw: SketchedCurlFreeKernel(16, input_dim=2, **kw),
    "SketchedDecomposableKernel": lambda **kw: SketchedDecomposableKernel(SketchedRBFKernel(16), num_tasks=2, **kw),
    # these two dropped a misspelt keyword silently (GPyTorch's IndexKernel does)
    "SketchedHammingIMQKernel": lambda **kw: SketchedHammingIMQKernel(3, 16, seed=0, **kw),
    "IndexFeatureKernel": lambda **kw: IndexFeatureKernel(num_tasks=3, **kw),
    # the exact operator-valued kernels too (they dropped a misspelt keyword silently)
    "CurlFreeRBFKernel": lambda **kw: CurlFreeRBFKernel(2, **kw),
    "DivFreeRBFKernel": lambda **kw: DivFreeRBFKernel(2, **kw),
    "DecomposableKernel": lambda **kw: DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=2, **kw),
}


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_unknown_keyword_is_refused_and_gpytorch_keywords_are_accepted(name):
    with pytest.raises(TypeError, match=f"{name} got unexpected keyword argument.*'lenghtscale_prior'"):
        BUILDERS[name](lenghtscale_prior=None)
    kernel = BUILDERS[name](active_dims=(0, 1))
    assert torch.equal(kernel.active_dims, torch.tensor([0, 1]))


def test_sketch_of_a_tree_still_converts():
    tree = (gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
            + gpytorch.kernels.LinearKernel(ard_num_dims=2))
    assert rfgp.sketch(tree, 64).num_features == 64
