"""rfgp kernels under the torch/GPyTorch module API, checked against GPyTorch's exact kernels.

Batch indexing: ``kernel[i]`` (GPyTorch's ``Kernel.__getitem__``, also what ``kernel(x)[i]`` of a lazily evaluated
batch covariance calls) is the kernel of batch member i.  GPyTorch's generic version indexes every own parameter and
buffer and leaves the parts of a ``ModuleList`` unindexed: rfgp's shared state (Nyström landmarks, the draws of a
spectral product or a Newton-Girard sketch, ``active_dims``) was cut to other rows or raised, and feature sums and
products returned the whole batch.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, NewtonGirardAdditiveKernel, PolynomialKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.kernels import NystromKernel

F64 = torch.float64
BATCH = torch.Size([3])
X = torch.rand(20, 3, generator=torch.Generator().manual_seed(0), dtype=F64) * 2


def scaled_rbf():
    return ScaleKernel(RBFKernel(batch_shape=BATCH), batch_shape=BATCH)


BATCHED_KERNELS = {
    "nystrom": lambda: rfgp.sketch(scaled_rbf(), 12, method="nystrom", x_sample=X, seed=0),
    "nystrom_learned_landmarks": lambda: NystromKernel(scaled_rbf(), X[:12], learn_landmarks=True),
    "feature_sum": lambda: rfgp.sketch(scaled_rbf() + ScaleKernel(MaternKernel(batch_shape=BATCH), batch_shape=BATCH),
                                       32, seed=0),
    "spectral_product": lambda: rfgp.sketch(
        ScaleKernel(RBFKernel(batch_shape=BATCH) * MaternKernel(batch_shape=BATCH), batch_shape=BATCH), 32, seed=0),
    "sketched_product": lambda: rfgp.sketch(RBFKernel(batch_shape=BATCH) * PolynomialKernel(2, batch_shape=BATCH),
                                            32, seed=0),
    "newton_girard": lambda: rfgp.sketch(
        NewtonGirardAdditiveKernel(RBFKernel(batch_shape=BATCH), num_dims=3, max_degree=2, batch_shape=BATCH),
        32, seed=0),
    "matern_half": lambda: rfgp.sketch(ScaleKernel(MaternKernel(nu=0.5, batch_shape=BATCH), batch_shape=BATCH),
                                       32, seed=0),
    "active_dims": lambda: rfgp.sketch(RBFKernel(batch_shape=BATCH, active_dims=[0, 2]), 32, seed=0),
    "exact": scaled_rbf,
}


def distinct_members(kernel):
    """The kernel in float64 with different hyperparameters per batch member (up to ±25 % of each raw value)."""
    kernel = kernel.double()
    with torch.no_grad():
        for name, parameter in kernel.named_parameters():
            if parameter.shape[:1] == BATCH:
                parameter.add_(torch.linspace(-0.25, 0.25, parameter.numel(), dtype=F64).view_as(parameter))
    return kernel


def dense(covariance):
    return covariance.to_dense().detach()


@pytest.mark.parametrize("index", [1, slice(0, 2), (2,), (slice(None),)], ids=["int", "slice", "tuple", "all"])
@pytest.mark.parametrize("name", list(BATCHED_KERNELS))
def test_batch_indexed_kernel_is_the_kernel_of_those_members(name, index):
    kernel = distinct_members(BATCHED_KERNELS[name]())
    with gpytorch.settings.lazily_evaluate_kernels(False):
        full = dense(kernel(X))
        indexed = kernel[index]
        torch.testing.assert_close(dense(indexed(X)), full[index], rtol=1e-12, atol=1e-12)
    assert indexed.batch_shape == full[index].shape[:-2]
    torch.testing.assert_close(dense(kernel(X)[index]), full[index], rtol=1e-12, atol=1e-12)  # lazy batch indexing


@pytest.mark.parametrize("learned", [False, True])
def test_batch_indexing_keeps_shared_landmarks_or_takes_the_members_and_leaves_the_kernel_unchanged(learned):
    """Fixed landmarks are shared by the members; learned ones are one Z per member (independent members)."""
    kernel = distinct_members(NystromKernel(scaled_rbf(), X[:12], learn_landmarks=learned))
    before = {key: value.clone() for key, value in kernel.state_dict().items()}
    member = kernel[1]
    torch.testing.assert_close(member.landmarks, kernel.landmarks[1] if learned else kernel.landmarks, rtol=0, atol=0)
    assert member.landmarks.data_ptr() != kernel.landmarks.data_ptr()
    assert isinstance(member.landmarks, torch.nn.Parameter) == learned
    for key, value in kernel.state_dict().items():
        torch.testing.assert_close(value, before[key], rtol=0, atol=0)


def test_nystrom_kernel_around_a_tree_initializes_by_the_exact_tree_names():
    """``rfgp.sketch(sum, M, method="nystrom")`` is a NystromKernel around the whole sum: ``initialize`` by the sum's
    own names (as its ``load_state_dict`` takes the sum's keys) reaches the sum; before, ``AttributeError``."""
    exact = (ScaleKernel(RBFKernel()) + ScaleKernel(MaternKernel())).double()
    kernel = rfgp.sketch(exact, 20, method="nystrom", x_sample=X, seed=0)
    assert isinstance(kernel, NystromKernel)
    values = {"kernels.0.outputscale": 1.7, "kernels.1.base_kernel.lengthscale": torch.tensor(0.3, dtype=F64)}
    assert kernel.initialize(**values) is kernel
    exact.initialize(**values)
    kernel.initialize(**{"base_kernel.kernels.1.outputscale": 0.8})  # the kernel's own module path, as before
    exact.initialize(**{"kernels.1.outputscale": 0.8})
    for name, parameter in exact.named_parameters():
        torch.testing.assert_close(kernel.base_kernel.get_parameter(name), parameter, rtol=0, atol=0)
    with gpytorch.settings.lazily_evaluate_kernels(False):
        torch.testing.assert_close(dense(kernel(X)), dense(exact(X)), rtol=1e-6, atol=1e-6)  # every point a landmark
    with pytest.raises(AttributeError, match="no module nothing"):
        kernel.initialize(**{"nothing.lengthscale": 1.0})


def regression_model():
    x = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    kernel = ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, method="orf", seed=0, ard_num_dims=2))
    return rfgp.models.ExactGPModel(x, torch.sin(5 * x[:, 0]), gpytorch.likelihoods.GaussianLikelihood(), kernel)


def vector_field_model():
    x = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    kernel = ScaleKernel(rfgp.kernels.SketchedCurlFreeKernel(64, input_dim=2, seed=0))
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0)
    return rfgp.MultiOutputGPModel(x, -2 * x, likelihood, kernel)


def predictive_moments(model, x):
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(x))
        return predictive.mean, predictive.variance


@pytest.mark.parametrize("build", [regression_model, vector_field_model], ids=["regression", "vector_field"])
def test_dtype_conversion_after_a_prediction_predicts_as_a_model_built_in_that_dtype(build):
    """GPyTorch's ``ExactGP`` converts its training data in ``model.float()`` but keeps the posterior caches of the
    old dtype; rfgp's models drop them (before: a RuntimeError asking for ``model.train()``)."""
    model = build()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(0.1)
    x_test = torch.rand(6, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    predictive_moments(model, x_test)  # caches in float64
    fresh = build()
    fresh.load_state_dict(model.state_dict())
    fresh.float()
    expected = predictive_moments(fresh, x_test.float())
    for converted, dtype in ((model.float(), torch.float32), (model.to(torch.float32), torch.float32)):
        mean, variance = predictive_moments(converted, x_test.to(dtype))
        assert mean.dtype == dtype
        torch.testing.assert_close((mean, variance), expected, rtol=0, atol=0)
    mean, _ = predictive_moments(model.double(), x_test)  # and back: float64 caches again
    assert mean.dtype == F64
