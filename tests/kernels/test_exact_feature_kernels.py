"""Linear / Constant / Cosine feature kernels: exact against GPyTorch, exact widths, spectral protocol."""

import math

import gpytorch
import pytest
import torch

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.kernels.exact_features import ConstantFeatureKernel, CosineFeatureKernel, LinearFeatureKernel

F64 = torch.float64
X = torch.rand(6, 3, generator=torch.Generator().manual_seed(0), dtype=F64)
Y = torch.rand(4, 3, generator=torch.Generator().manual_seed(1), dtype=F64)


def dense(kernel, x, y):
    return kernel(x, y).to_dense()


def test_linear_matches_gpytorch_with_ard_and_batch():
    exact = gpytorch.kernels.LinearKernel(ard_num_dims=3, batch_shape=torch.Size([2])).double()
    exact.variance = torch.tensor([[[0.5, 1.0, 2.0]], [[1.5, 0.2, 0.7]]], dtype=F64)
    kernel = LinearFeatureKernel(ard_num_dims=3, batch_shape=torch.Size([2])).double()
    kernel.variance = exact.variance
    assert kernel.num_features == 3
    assert torch.allclose(dense(kernel, X, Y), dense(exact, X, Y), atol=1e-14)
    assert torch.allclose(kernel(X, diag=True), exact(X, diag=True), atol=1e-14)


def test_linear_width_is_set_at_the_first_call_or_raises_before():
    kernel = LinearFeatureKernel().double()
    with pytest.raises(RuntimeError, match="input_dim"):
        kernel.num_features
    dense(kernel, X, X)
    assert kernel.num_features == 3


def test_linear_input_dim_that_contradicts_ard_num_dims_is_refused_at_construction():
    # was accepted, then every call raised GPyTorch's "Expected the input to have 3 dimensionality"
    with pytest.raises(ValueError, match="input_dim=4 does not match ard_num_dims=3"):
        LinearFeatureKernel(ard_num_dims=3, input_dim=4)
    assert LinearFeatureKernel(ard_num_dims=3, input_dim=3).num_features == 3


def test_constant_matches_gpytorch():
    exact = gpytorch.kernels.ConstantKernel(batch_shape=torch.Size([2])).double()
    exact.constant = torch.tensor([0.3, 2.0], dtype=F64)
    kernel = ConstantFeatureKernel(batch_shape=torch.Size([2])).double()
    kernel.constant = exact.constant.unsqueeze(-1)
    assert kernel.num_features == 1
    assert torch.allclose(dense(kernel, X, Y), dense(exact, X, Y), atol=1e-14)


def test_cosine_matches_gpytorch_in_one_dimension_and_refuses_more():
    exact = gpytorch.kernels.CosineKernel().double()
    exact.period_length = 0.7
    kernel = CosineFeatureKernel().double()
    kernel.period_length = 0.7
    assert kernel.num_features == 2
    assert torch.allclose(dense(kernel, X[:, :1], Y[:, :1]), dense(exact, X[:, :1], Y[:, :1]), atol=1e-14)
    with pytest.raises(ValueError, match="positive definite only on 1-D inputs, got input dimension 3"):
        dense(kernel, X, Y)


def test_a_cosine_leaf_on_several_columns_is_refused_at_conversion():
    match = "positive definite only on 1-D inputs, got input dimension 2"
    with pytest.raises(ValueError, match=match):
        rfgp.sketch(gpytorch.kernels.CosineKernel(active_dims=[0, 2]), 16)
    tree = gpytorch.kernels.RBFKernel(active_dims=[0]) * gpytorch.kernels.CosineKernel(active_dims=[1, 2])
    with pytest.raises(ValueError, match=match):
        rfgp.sketch(tree, 16, x_sample=X)
    with pytest.raises(ValueError, match="got input dimension 3"):
        rfgp.sketch(gpytorch.kernels.CosineKernel(), 16, x_sample=X)  # all of x_sample's columns
    with pytest.raises(ValueError, match="got input dimension 3"):  # d from the RBF leaf on the same columns
        rfgp.sketch(gpytorch.kernels.RBFKernel(ard_num_dims=3) + gpytorch.kernels.CosineKernel(), 16)
    assert rfgp.sketch(gpytorch.kernels.CosineKernel(active_dims=[1]), 16, x_sample=X).num_features == 2


def test_gradients_match_gpytorch():
    exact = gpytorch.kernels.CosineKernel().double()
    kernel = CosineFeatureKernel().double()
    for module in (exact, kernel):
        module.period_length = 0.9
        dense(module, X[:, :1], Y[:, :1]).sum().backward()
    assert torch.allclose(kernel.raw_period_length.grad, exact.raw_period_length.grad, atol=1e-12)


@pytest.mark.parametrize("name, make", [("variance", LinearFeatureKernel), ("constant", ConstantFeatureKernel),
                                        ("period_length", CosineFeatureKernel)])
def test_non_positive_hyperparameters_raise_naming_them(name, make):
    with pytest.raises(ValueError, match=f"{name} must be finite and > 0"):
        setattr(make(), name, -0.5)


TASKS = torch.tensor([[0.0], [2.0], [1.0], [2.0], [0.0], [1.0]], dtype=F64)
NON_FINITE = {  # kernel, its inputs, the raw parameter set to a non-finite value, the name the error shows
    "linear": (lambda: LinearFeatureKernel(ard_num_dims=3), X, "raw_variance", "variance"),
    "constant": (ConstantFeatureKernel, X, "raw_constant", "constant"),
    "sketched_linear": (lambda: rfgp.sketch(gpytorch.kernels.LinearKernel(ard_num_dims=3), 8), X, "raw_variance",
                        "variance"),
    "sketched_constant": (lambda: rfgp.sketch(gpytorch.kernels.ConstantKernel(), 8), X, "raw_constant", "constant"),
    "rbf_times_linear": (lambda: rfgp.sketch(gpytorch.kernels.RBFKernel()
                                             * gpytorch.kernels.LinearKernel(ard_num_dims=3), 16, seed=0), X,
                         "kernels.1.raw_variance", "kernels.1.variance"),
    "index_var": (lambda: rfgp.kernels.IndexFeatureKernel(num_tasks=3, rank=1), TASKS, "raw_var", "var"),
    "index_covar_factor": (lambda: rfgp.kernels.IndexFeatureKernel(num_tasks=3, rank=1), TASKS, "covar_factor",
                           "covar_factor"),
    "hadamard_multitask": (lambda: rfgp.sketch(gpytorch.kernels.RBFKernel(active_dims=[0])
                                               * gpytorch.kernels.IndexKernel(num_tasks=3, active_dims=[1]), 16,
                                               seed=0),
                           torch.cat((X[:, :1], TASKS), -1), "kernels.1.covar_factor", "kernels.1.covar_factor"),
}


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
@pytest.mark.parametrize("call", ["full", "diag", "cross"])
@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_a_non_finite_exact_feature_hyperparameter_is_named(name, call, value):
    """Before, a NaN or infinite linear variance, constant or task covariance gave NaN/Inf covariances and closed-form
    ‖Φ‖² silently (GPyTorch's exact kernels too); now the call raises naming it, as for the spectral kernels."""
    build, x, raw, shown = NON_FINITE[name]
    kernel = build().double()
    kernel(x).to_dense()
    kernel.get_parameter(raw).data.view(-1)[0] = value
    evaluate = {"full": lambda: kernel(x).to_dense(), "diag": lambda: kernel(x, diag=True),
                "cross": lambda: kernel(x, x[:3].flip(0)).to_dense()}[call]
    with pytest.raises(NonFiniteHyperparameterError, match=f"hyperparameters {shown} = "):
        evaluate()


def test_cosine_and_constant_spectral_protocol():
    cosine = CosineFeatureKernel().double()
    cosine.period_length = 0.5
    draws = cosine.spectral_draws(64, 1, torch.Generator().manual_seed(0))
    frequencies = cosine.spectral_frequencies(draws)  # ±π/p with random signs (the measure is symmetric)
    assert torch.allclose(frequencies.abs(), torch.full((64, 1), math.pi / 0.5, dtype=F64))
    assert 0 < int((frequencies > 0).sum()) < 64
    assert cosine.spectral_weights(draws) is None and cosine.spectral_amplitude().shape == ()
    with pytest.raises(ValueError, match="input dimension 2"):
        cosine.spectral_draws(4, 2, torch.Generator())
    constant = ConstantFeatureKernel().double()
    constant.constant = torch.tensor([1.5], dtype=F64)
    draws = constant.spectral_draws(3, 2, torch.Generator())
    assert torch.equal(constant.spectral_frequencies(draws), torch.zeros(3, 2, dtype=F64))
    assert torch.allclose(constant.spectral_amplitude(), torch.tensor(1.5, dtype=F64))


def test_state_dict_round_trip():
    kernel = LinearFeatureKernel(ard_num_dims=3).double()
    kernel.variance = torch.tensor([0.5, 1.0, 2.0], dtype=F64)
    other = LinearFeatureKernel(ard_num_dims=3).double()
    other.load_state_dict(kernel.state_dict())
    assert torch.equal(dense(other, X, Y), dense(kernel, X, Y))
