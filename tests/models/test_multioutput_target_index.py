"""A NaN or Inf target of a multi-output model is named by its (point, task), on every multi-output path.

GPyTorch flattens the ``(N, T)`` targets to N·T entries (n·T + t) before the covariance sees them, so the feature
operators' check reported the flat index: a NaN at point 7, task 1 of a 2-output model read "index (15, 0)" in the
marginal likelihood and "(15,)" in the posterior caches, for every path (LCM, independent outputs, Kronecker with and
without task noise, chunked).  The model constructor's own check (``MultiOutputGPModel``) named it right; targets
given to the marginal likelihood or through ``set_train_data`` did not pass there.
"""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood

import rfgp
from rfgp.core.validation import NonFiniteError
from rfgp.inference.chunked_kronecker import ChunkedKroneckerFeatureOperator
from rfgp.inference.independent_tasks import IndependentTasksAddedDiagLinearOperator
from rfgp.inference.kronecker_tasks import KroneckerStatistics
from rfgp.inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator
from rfgp.models.multioutput import MultiOutputGPModel

from .._models import BatchIndependentGP, vector_field_kernel

F64 = torch.float64
POINT, TASK = 7, 1  # flat index 7·2 + 1 = 15
MESSAGE = r"\(…, point, task\).*the first at index \(7, 1\)"


def _data(n=30):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1])], -1) + 0.05 * torch.randn(n, 2, generator=g,
                                                                                               dtype=F64)
    return x, y


def _model(path, x, y):
    """(model, likelihood) of a 2-output path: ``lcm`` (rfgp.sketch of GPyTorch's LCMKernel), ``curl_free`` (a
    multi-output root), ``kronecker`` / ``kronecker_task_noise`` (a sketched MultitaskKernel under rank-0 / rank-1
    task noise), ``independent`` (GPyTorch's batch-independent outputs)."""
    if path == "independent":
        exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=torch.Size([2])),
                                             batch_shape=torch.Size([2]))
        likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(F64)
        return BatchIndependentGP(x, y, rfgp.sketch(exact, 16, seed=0), likelihood).to(F64), likelihood
    rank = 1 if path == "kronecker_task_noise" else 0
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=rank).to(F64)
    if path == "lcm":
        lcm = gpytorch.kernels.LCMKernel([gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()], num_tasks=2)
        kernel = rfgp.sketch(lcm, 16, seed=0)
    else:
        kernel = vector_field_kernel("curl_free" if path == "curl_free" else "decomposable", 16)
    return MultiOutputGPModel(x, y, likelihood, kernel).to(F64), likelihood


PATHS = ["lcm", "curl_free", "kronecker", "kronecker_task_noise", "independent"]


def _each_path_whole_and_chunked(test):
    """The test for every multi-output path, with the features whole and in chunks."""
    by_path = pytest.mark.parametrize("path", PATHS)(test)
    return pytest.mark.parametrize("chunked", [False, True], ids=["whole", "chunked"])(by_path)


def _with_nan_target(path):
    """(x, the model, its likelihood, the targets with a NaN at (POINT, TASK))."""
    x, y = _data()
    model, likelihood = _model(path, x, y)
    bad = y.clone()
    bad[POINT, TASK] = float("nan")
    return x, model, likelihood, bad


@_each_path_whole_and_chunked
def test_a_nan_target_is_named_by_point_and_task_in_the_marginal_likelihood(path, chunked):
    x, model, likelihood, bad = _with_nan_target(path)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with rfgp.settings.chunk_size(8 if chunked else None):
        output = model(x)
        noisy = likelihood(output).lazy_covariance_matrix.evaluate_kernel()
        if path.startswith("kronecker"):
            assert isinstance(noisy, KroneckerStatistics)
        if path == "independent":
            assert isinstance(noisy, IndependentTasksAddedDiagLinearOperator)
        if chunked and path != "independent":
            assert isinstance(output.lazy_covariance_matrix.evaluate_kernel(),
                              (ChunkedMultiOutputFeatureOperator, ChunkedKroneckerFeatureOperator))
        with pytest.raises(NonFiniteError, match=MESSAGE):
            mll(output, bad)


@_each_path_whole_and_chunked
def test_a_nan_target_is_named_by_point_and_task_in_the_posterior(path, chunked):
    x, model, _, bad = _with_nan_target(path)
    model.set_train_data(x, bad, strict=False)
    model.eval()
    with rfgp.settings.chunk_size(8 if chunked else None), torch.no_grad():
        with pytest.raises(NonFiniteError, match=MESSAGE):
            model(x[:3]).mean


@pytest.mark.parametrize("path", PATHS)
def test_an_inf_target_beside_masked_nan_targets_is_named_by_its_own_point_and_task(path):
    """Under ``observation_nan_policy("mask")`` the NaN entries are left out; an Inf entry is named by its own
    (point, task), not by its place among the observed entries, in the log-density of the model's distribution and
    in the posterior.  (GPyTorch's ExactMarginalLogLikelihood masks the targets itself into a flat distribution
    first, where no (point, task) is left: there the index is still the flat one among the observed entries.)"""
    x, y = _data()
    with gpytorch.settings.observation_nan_policy("mask"):
        model, likelihood = _model(path, x, y)
        bad = y.clone()
        bad[2, 0] = bad[4, 1] = float("nan")
        bad[POINT, TASK] = float("inf")
        with pytest.raises(NonFiniteError, match=MESSAGE):
            likelihood(model(x)).log_prob(bad)
        model.set_train_data(x, bad, strict=False)
        model.eval()
        with torch.no_grad(), pytest.raises(NonFiniteError, match=MESSAGE):
            model(x[:3]).mean


@pytest.mark.parametrize("policy", ["mask", "fill"])
@pytest.mark.parametrize("path", PATHS)
def test_a_nan_target_of_a_log_density_under_a_nan_policy_is_named_by_point_and_task(path, policy):
    """A distribution's ``log_prob`` takes every target under ``observation_nan_policy("mask"/"fill")`` (GPyTorch's
    ExactMarginalLogLikelihood leaves NaN entries out before, GPyTorch's own log_prob returns NaN): the NaN target was
    read as missing by the (point, task) check and then refused by the covariance as the flat entry n·T + t ("(15, 0)",
    or "(1, 7, 0)" for independent outputs), with the advice to use the policy already in use."""
    x, model, likelihood, bad = _with_nan_target(path)
    with gpytorch.settings.observation_nan_policy(policy):
        with pytest.raises(NonFiniteError, match=MESSAGE + r".*ExactMarginalLogLikelihood leaves NaN targets out"):
            likelihood(model(x)).log_prob(bad)
