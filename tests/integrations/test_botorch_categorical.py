"""BoTorch's CategoricalKernel in rfgp.sketch: unbiased against BoTorch, hyperparameters copied, MixedSingleTaskGP."""

import copy

import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.acquisition.logei import qLogNoisyExpectedImprovement  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.models import MixedSingleTaskGP  # noqa: E402
from botorch.models.kernels.categorical import CategoricalKernel  # noqa: E402
from gpytorch.constraints import Interval  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402
from gpytorch.priors import GammaPrior  # noqa: E402

import rfgp  # noqa: E402
from rfgp.features.categorical import categorical_variance  # noqa: E402
from rfgp.kernels import SketchedCategoricalKernel, SketchedProductKernel  # noqa: E402
from tests._conversion_checks import assert_copied_constraint, assert_copied_prior  # noqa: E402

F64 = torch.float64
CATEGORIES = torch.tensor([
    [0.0, 1.0, 0.5],
    [-0.0, 1.0, 0.5],
    [0.0, 2.0, 0.5],
    [1.0, 2.0, 3.0],
    [0.5, 7.0, -2.0],
    [1.0, 1.0, 0.5],
], dtype=F64)


def categorical(**kwargs):
    kernel = CategoricalKernel(ard_num_dims=3, **kwargs).double()
    kernel.lengthscale = torch.tensor([[0.3, 1.0, 4.0]], dtype=F64)
    return kernel


def test_mean_of_the_sketch_is_botorchs_kernel():
    exact = categorical()
    groups, width = 4000, 8
    sketched = rfgp.sketch(exact, groups * width, seed=0)
    with torch.no_grad():
        phi = sketched.featurize(CATEGORIES)
        truth = exact(CATEGORIES).to_dense()
    parts = phi.reshape(len(CATEGORIES), groups, width).transpose(0, 1)
    estimates = parts @ parts.mT * groups  # independent width-8 estimators
    shares = torch.exp(-1 / (3 * exact.lengthscale.detach().squeeze(-2)))
    variance = categorical_variance(CATEGORIES, CATEGORIES, shares, width)
    z = (estimates.mean(0) - truth) / (variance / groups).sqrt()
    assert z.abs().max() < 5, z.abs().max()
    assert (truth[0] < 1).sum() > 0 and torch.equal(truth[0], truth[1])


def test_sketch_copies_lengthscale_constraint_prior_batch_and_dims():
    prior = GammaPrior(2.0, 3.0)
    constraint = Interval(1e-3, 50.0)
    exact = CategoricalKernel(ard_num_dims=2, batch_shape=torch.Size([2]), active_dims=[1, 3],
                              lengthscale_prior=prior, lengthscale_constraint=constraint).double()
    exact.lengthscale = torch.tensor([[[0.2, 3.0]], [[1.5, 0.7]]], dtype=F64)
    sketched = rfgp.sketch(exact, 64, seed=5)
    assert isinstance(sketched, SketchedCategoricalKernel) and sketched.num_features == 64
    assert sketched.feature_map.seed == 5 and sketched.batch_shape == torch.Size([2])
    assert torch.equal(sketched.active_dims, exact.active_dims) and sketched.ard_num_dims == 2
    assert torch.equal(sketched.lengthscale, exact.lengthscale) and sketched.raw_lengthscale.dtype == F64
    assert_copied_constraint(sketched.raw_lengthscale_constraint, constraint)
    (name, _, sketched_prior, closure, _), = sketched.named_priors()
    assert name == "lengthscale_prior"
    assert_copied_prior(sketched_prior, prior)
    torch.testing.assert_close(closure(sketched), exact.lengthscale)
    x = torch.randint(0, 3, (5, 4)).to(F64)
    assert sketched(x).to_dense().shape == (2, 5, 5)


def mixed_data(n, generator):
    x = torch.cat([torch.rand(n, 2, generator=generator, dtype=F64),
                   torch.randint(0, 3, (n, 1), generator=generator).to(F64)], -1)
    y = torch.sin(5 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] + 0.05 * torch.randn(n, 1, generator=generator, dtype=F64)
    return x, y


def test_mixed_single_task_gp_converts_fits_and_predicts_like_the_exact_model():
    generator = torch.Generator().manual_seed(0)
    train_x, train_y = mixed_data(40, generator)
    test_x, _ = mixed_data(30, generator)
    exact = MixedSingleTaskGP(train_x, train_y, cat_dims=[2])
    for kernel in exact.covar_module.kernels:  # hyperparameters away from their initial values
        kernel.outputscale = 0.8
    exact.likelihood.noise = 1e-2
    with torch.no_grad():
        exact_mean = exact.posterior(test_x).mean

    def sketched_model(num_features):
        model = copy.deepcopy(exact)
        model.covar_module = rfgp.sketch(exact.covar_module, num_features, seed=0)
        return model

    errors = {}
    for num_features in (16, 8192):
        with torch.no_grad():
            errors[num_features] = float((sketched_model(num_features).posterior(test_x).mean - exact_mean).abs().max())
    assert errors[8192] < 0.1 < errors[16], errors  # the sketched model converges to the exact one

    model = sketched_model(256)
    converted = model.covar_module
    product = converted.kernels[1].base_kernel
    assert isinstance(product, SketchedProductKernel) and product.num_features == 128  # the product keeps its share
    assert converted.num_features == 256
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model), optimizer_kwargs={"options": {"maxiter": 5}})
    lengthscale = converted.kernels[0].base_kernel.kernels[1].base_kernel.lengthscale
    assert not torch.equal(lengthscale, exact.covar_module.kernels[0].base_kernel.kernels[1].base_kernel.lengthscale)
    posterior = model.posterior(test_x)
    assert torch.isfinite(posterior.mean).all() and (posterior.variance > 0).all()
    acquisition = qLogNoisyExpectedImprovement(model, X_baseline=train_x)
    values = acquisition(test_x[:4].unsqueeze(1))
    assert values.shape == (4,) and torch.isfinite(values).all()


def test_sketching_the_model_instead_of_its_kernel_says_to_convert_covar_module():
    train_x, train_y = mixed_data(10, torch.Generator().manual_seed(0))
    model = MixedSingleTaskGP(train_x, train_y, cat_dims=[2])
    with pytest.raises(TypeError, match=r"kernel must be .*got MixedSingleTaskGP.*model\.covar_module = rfgp\.sketch"):
        rfgp.sketch(model, num_features=256)
