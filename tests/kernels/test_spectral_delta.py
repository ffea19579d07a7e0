"""GPyTorch's SpectralDeltaKernel converted to its exact features (rfgp/kernels/spectral_delta.py): values and
gradients equal to GPyTorch's, its state_dict, the width rule, trees (sums, products, ScaleKernel) and training."""

import gpytorch
import numpy
import pytest
import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import RBFKernel, ScaleKernel, SpectralDeltaKernel
from gpytorch.priors import GammaPrior

import rfgp
from rfgp.kernels.spectral_delta import SpectralDeltaFeatureKernel
from rfgp.models import ExactGPModel
from tests._conversion_checks import assert_copied_constraint
from tests._spectral_checks import assert_unbiased

F64 = torch.float64
BATCH = torch.Size([2])
X = torch.rand(12, 3, dtype=F64, generator=torch.Generator().manual_seed(0)) * 2
Y = torch.rand(7, 3, dtype=F64, generator=torch.Generator().manual_seed(1)) * 2


def exact_kernel(batch_shape=BATCH, **kwargs):
    torch.manual_seed(0)  # GPyTorch draws raw_Z with torch.rand
    kernel = SpectralDeltaKernel(num_dims=2, num_deltas=10, ard_num_dims=2, batch_shape=batch_shape,
                                 active_dims=(0, 2), lengthscale_prior=GammaPrior(2.0, 2.0), **kwargs).double()
    kernel.lengthscale = 0.4 + torch.rand(*batch_shape, 1, 2, dtype=F64, generator=torch.Generator().manual_seed(2))
    return kernel


def test_values_and_gradients_equal_gpytorch():
    exact = exact_kernel()
    sketched = rfgp.sketch(exact, num_features=20)
    assert type(sketched) is SpectralDeltaFeatureKernel and sketched.num_features == 20
    weights = torch.randn(*BATCH, 12, 7, dtype=F64, generator=torch.Generator().manual_seed(3))
    for kernel in (exact, sketched):
        assert torch.allclose(sketched(X, Y).to_dense(), exact(X, Y).to_dense(), rtol=0, atol=1e-12)
        assert torch.allclose(sketched(X).to_dense(), exact(X).to_dense(), rtol=0, atol=1e-12)
        assert torch.allclose(sketched(X, diag=True), exact(X, diag=True), rtol=0, atol=1e-12)
    grads = []
    for kernel in (exact, sketched):
        loss = (kernel(X, Y).to_dense() * weights).sum() + kernel(X).to_dense().pow(2).sum()
        grads.append(torch.autograd.grad(loss, [kernel.raw_Z, kernel.raw_lengthscale]))
    for ours, theirs in zip(*grads):
        assert torch.allclose(ours, theirs, rtol=0, atol=1e-10 * theirs.abs().max())


def test_hyperparameters_constraints_priors_and_state_dict_carry_over():
    exact = exact_kernel(Z_constraint=Interval(0.0, 3.0))
    sketched = rfgp.sketch(exact, num_features=64)
    assert_copied_constraint(sketched.raw_Z_constraint, exact.raw_Z_constraint)
    assert torch.equal(sketched.Z, exact.Z) and torch.equal(sketched.lengthscale, exact.lengthscale)
    assert {n for n, *_ in sketched.named_priors()} == {"lengthscale_prior"}
    fresh = rfgp.sketch(exact_kernel(Z_constraint=Interval(0.0, 3.0)), num_features=64)
    fresh.raw_Z.data.zero_()
    result = fresh.load_state_dict(exact.state_dict(), strict=False)
    assert result.unexpected_keys == [] and set(result.missing_keys) == {"config_type"}
    assert torch.allclose(fresh(X).to_dense(), exact(X).to_dense(), rtol=0, atol=1e-12)
    again = SpectralDeltaFeatureKernel(2, 10, Z_constraint=Interval(0.0, 3.0), ard_num_dims=2, batch_shape=BATCH,
                                       active_dims=(0, 2), lengthscale_prior=GammaPrior(2.0, 2.0)).double()
    again.load_state_dict(sketched.state_dict())
    assert torch.equal(again(X, Y).to_dense(), sketched(X, Y).to_dense())


def test_width_is_exactly_two_per_delta_and_other_widths_raise_naming_it():
    assert SpectralDeltaFeatureKernel(2, 10, num_features=20).num_features == 20
    with pytest.raises(ValueError, match="num_features=32, but a SpectralDeltaKernel with num_deltas=10 has exactly "
                                         "20 features.*accepted: None or 20"):
        SpectralDeltaFeatureKernel(2, 10, num_features=32)
    with pytest.raises(ValueError, match="num_features=16, .*exactly 20 features.*accepted: ≥ 20, or build the "
                                         "kernel with num_deltas=8"):
        rfgp.sketch(exact_kernel(), num_features=16)
    assert rfgp.sketch(exact_kernel(), num_features=512).num_features == 20  # exact: a larger F is not needed
    tree = ScaleKernel(exact_kernel(batch_shape=torch.Size([]))) + ScaleKernel(RBFKernel())
    assert [rfgp.kernels.kernel_num_features(part) for part in rfgp.sketch(tree, 64).kernels] == [20, 44]
    with pytest.raises(ValueError, match="x1 has 3 input dimensions .*input_dim=2"):
        SpectralDeltaFeatureKernel(2, 10)(X).to_dense()


def test_sum_is_exact_and_product_with_rbf_is_unbiased():
    delta = exact_kernel(batch_shape=torch.Size([]))
    rbf = RBFKernel(active_dims=(1,)).double()
    total = (ScaleKernel(delta) + ScaleKernel(rbf)).double()
    sketched = rfgp.sketch(total, 64, seed=0)
    rbf_gram = sketched.kernels[1](X).to_dense()
    exact_delta = total.kernels[0](X).to_dense()
    assert torch.allclose(sketched(X).to_dense() - rbf_gram, exact_delta, rtol=0, atol=1e-12)
    product = ScaleKernel(delta * rbf).double()
    assert_unbiased(lambda seed: rfgp.sketch(product, 256, seed=seed)(X).to_dense(), product(X).to_dense().detach(),
                    num_seeds=40, num_se=4.0)


def test_exact_gp_with_the_converted_kernel_has_gpytorchs_likelihood_and_trains():
    generator = torch.Generator().manual_seed(4)
    x = torch.rand(40, 2, dtype=F64, generator=generator)
    y = torch.sin(5 * x[:, 0]) + 0.1 * torch.randn(40, dtype=F64, generator=generator)
    torch.manual_seed(1)
    exact_covar = ScaleKernel(SpectralDeltaKernel(num_dims=2, num_deltas=8)).double()
    losses = []
    for covar in (exact_covar, rfgp.sketch(exact_covar, 16)):
        model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), covar).double().train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with gpytorch.settings.max_cholesky_size(10**4):
            losses.append(-mll(model(x), y))
    assert torch.allclose(losses[0], losses[1], rtol=1e-10)
    history = rfgp.fit_mll(model, num_iterations=15)
    assert history.losses[-1] < history.losses[0]
    assert not torch.equal(model.covar_module.base_kernel.Z, exact_covar.base_kernel.Z)  # Z is trained


@pytest.mark.parametrize("routine", ["initialize_from_data", "initialize_from_data_simple"])
def test_gpytorch_initialisation_from_data_runs_on_the_converted_kernel(routine):
    x = torch.linspace(0, 4, 64, dtype=F64).unsqueeze(-1)
    y = torch.sin(3 * x[:, 0]) + torch.sin(7 * x[:, 0])
    results = []
    for convert in (False, True):
        torch.manual_seed(0)
        kernel = SpectralDeltaKernel(num_dims=1, num_deltas=12).double()
        kernel = rfgp.sketch(kernel, 24) if convert else kernel
        torch.manual_seed(5)
        numpy.random.seed(5)
        getattr(kernel, routine)(x, y)
        results.append(kernel(x).to_dense().detach())
    assert torch.allclose(results[1], results[0], rtol=0, atol=1e-12)


def test_set_num_features_keeps_the_exact_width_and_resizes_the_random_parts():
    tree = (ScaleKernel(exact_kernel(batch_shape=torch.Size([]))) + ScaleKernel(RBFKernel())).double()
    sketched = rfgp.set_num_features(rfgp.sketch(tree, 64, seed=0), 200)
    assert [rfgp.kernels.kernel_num_features(part) for part in sketched.kernels] == [20, 200]
    with pytest.raises(ValueError, match="holds no rfgp feature map to resize"):
        rfgp.set_num_features(rfgp.sketch(exact_kernel(), 20), 40)
