"""rfgp.set_num_features on BoTorch models that cache quantities of the features outside GPyTorch."""

import pytest
import torch

botorch = pytest.importorskip("botorch")

import gpytorch  # noqa: E402
from botorch.models import PairwiseGP  # noqa: E402
from botorch.models.transforms import Normalize  # noqa: E402

import rfgp  # noqa: E402

F64 = torch.float64


def preference_data(generator):
    x = torch.rand(20, 2, generator=generator, dtype=F64)
    utility = torch.sin(5 * x[:, 0]) + x[:, 1]
    pairs = torch.combinations(torch.arange(20))[::3]
    comparisons = torch.where((utility[pairs[:, 0]] > utility[pairs[:, 1]]).unsqueeze(-1), pairs, pairs.flip(-1))
    return x, comparisons


def pairwise_model(x, comparisons, num_features):
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(num_features, seed=0)).double()
    return PairwiseGP(x, comparisons, covar_module=kernel).eval()


def test_resized_pairwise_gp_predicts_from_the_laplace_approximation_of_its_new_features():
    """PairwiseGP predicts (eval mode) from a Laplace approximation solved at construction or fit; after a resize
    it mixed that K of the old features with cross-covariances of the new ones (0.14 off the model built at the new
    width) instead of re-solving it."""
    generator = torch.Generator().manual_seed(0)
    x, comparisons = preference_data(generator)
    test_x = torch.rand(30, 2, generator=generator, dtype=F64)
    model = pairwise_model(x, comparisons, 64)
    old_mean = model.posterior(test_x).mean
    rfgp.set_num_features(model, 2048)
    built = pairwise_model(x, comparisons, 2048)
    assert torch.equal(model.covar_module(x).to_dense(), built.covar_module(x).to_dense())
    expected = built.posterior(test_x)
    posterior = model.posterior(test_x)
    assert (old_mean - expected.mean).abs().max() > 0.05  # the width changes the prediction
    torch.testing.assert_close(posterior.mean, expected.mean, rtol=0, atol=1e-10)
    torch.testing.assert_close(posterior.variance, expected.variance, rtol=0, atol=1e-10)


def test_resizing_a_pairwise_gp_refits_data_dependent_maps_on_its_transformed_datapoints():
    """set_num_features took the default x_sample only from an ExactGP's train_inputs, so on a PairwiseGP an
    optimized Maclaurin map raised for want of data; it now refits on the datapoints as the kernel sees them."""
    generator = torch.Generator().manual_seed(1)
    x, comparisons = preference_data(generator)
    x = 10 * x  # Normalize maps them back to the unit square: the map must see the transformed inputs

    def model():
        normalize = Normalize(d=2)
        exact = PairwiseGP(x, comparisons, input_transform=normalize)
        seen = exact.transform_inputs(x)
        kernel = rfgp.sketch(exact.covar_module, 64, method="maclaurin", x_sample=seen, seed=0)
        return PairwiseGP(x, comparisons, covar_module=kernel, input_transform=normalize).eval(), seen

    default, _ = model()
    explicit, seen = model()
    rfgp.set_num_features(default, 256)
    rfgp.set_num_features(explicit, 256, x_sample=seen)
    assert torch.equal(default.covar_module(seen).to_dense(), explicit.covar_module(seen).to_dense())
    assert not torch.equal(default.covar_module(seen).to_dense(), model()[0].covar_module(seen).to_dense())
