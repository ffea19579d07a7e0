"""Training multi-output feature GPs whose n·p × F root exceeds the memory budget: block by block, the same numbers.

Before, a training root over ``rfgp.settings.memory_budget`` raised ("multi-output feature kernels evaluate block by
block only for prediction", or "the marginal likelihood and the training covariance of a multi-output model need the
whole root"); now the marginal likelihood, its gradients and the posterior caches are accumulated a block of points
at a time (:mod:`rfgp.inference.multioutput_chunking`) and equal the unchunked path to rounding.
"""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood

import rfgp
from rfgp.inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator
from rfgp.kernels import (
    SketchedDivFreeKernel,
    SketchedRBFKernelGrad,
)
from rfgp.models.multioutput import MultiOutputGPModel

from .._models import vector_field_kernel

F64 = torch.float64
ScaleKernel = gpytorch.kernels.ScaleKernel
CHUNK_ROWS = 12  # rfgp.settings.chunk_size counts root rows: 6 points × 2 outputs per block
TOL = dict(rtol=1e-9, atol=1e-11)


def _model(kind, rank, width=16, n=40, missing=False, global_noise=True):
    torch.manual_seed(0)  # the decomposable kernel's task factor and the likelihood's are drawn by torch
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.cat([torch.sin(3 * x[:, :1]), torch.cos(2 * x[:, 1:])], -1) + 0.05 * torch.randn(n, 2, generator=g,
                                                                                                  dtype=F64)
    if missing:  # single tasks and a whole point
        y[3, 1] = y[7, 0] = y[11, 0] = float("nan")
        y[20] = float("nan")
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=rank, has_global_noise=global_noise).to(F64)
    if rank:
        with torch.no_grad():
            likelihood.task_noise_covar_factor.copy_(torch.tensor([[0.2, 0.05], [-0.1, 0.15]], dtype=F64)[:, :rank])
    mean = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=2)
    with gpytorch.settings.observation_nan_policy("mask" if missing else "ignore"):
        model = MultiOutputGPModel(x, y, likelihood, vector_field_kernel(kind, width), mean).to(F64)
    with torch.no_grad():
        for constant in model.mean_module.parameters():
            constant.fill_(0.1)
    return model, likelihood, x, y


def _record_featurized_points(model):
    """Wrap every leaf feature kernel's featurize to record how many points it is called on."""
    sizes = []
    for kernel in model.covar_module.modules():
        if hasattr(kernel, "featurize") and not hasattr(kernel, "kernels"):
            original = kernel.featurize
            kernel.featurize = lambda x, original=original: sizes.append(x.shape[-2]) or original(x)
    return sizes


def _train_and_predict(model, likelihood, x, y, test_x, chunk_rows, missing=False):
    """(MLL, its gradients w.r.t. every parameter, posterior mean, variance, joint covariance, and the training
    covariance's operator), with ``chunk_rows`` root rows per block (``None``: unchunked)."""
    policy = "mask" if missing else "ignore"
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    with gpytorch.settings.observation_nan_policy(policy), rfgp.settings.chunk_size(chunk_rows):
        output = model(x)
        operator = output.lazy_covariance_matrix.evaluate_kernel()
        value = mll(output, y)
        gradients = torch.autograd.grad(value, parameters)
        model.eval()
        with torch.no_grad():
            posterior = model(test_x)
            results = (value.detach(), *gradients, posterior.mean, posterior.variance, posterior.covariance_matrix)
    return results, operator


def _assert_all_close(expected, actual):
    for index, (a, b) in enumerate(zip(expected, actual)):
        torch.testing.assert_close(b, a, **TOL, msg=lambda text, index=index: f"result {index}: {text}")


@pytest.mark.parametrize("kind", ["curl_free", "helmholtz", "decomposable"])
@pytest.mark.parametrize("rank", [0, 1])  # independent task noises; correlated task noise, whitened per point
def test_chunked_mll_gradients_and_posterior_equal_the_unchunked_ones(kind, rank):
    model, likelihood, x, y = _model(kind, rank)
    test_x = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    expected, whole = _train_and_predict(model, likelihood, x, y, test_x, None)
    sizes = _record_featurized_points(model)
    actual, chunked = _train_and_predict(model, likelihood, x, y, test_x, CHUNK_ROWS)
    assert isinstance(chunked, ChunkedMultiOutputFeatureOperator) and not isinstance(
        whole, ChunkedMultiOutputFeatureOperator)
    # training, backward and posterior caches: never more than a block (of the root's 2 rows per point; a sketched
    # MultitaskKernel's Kronecker statistics chunk its data features φ, one row per point)
    assert max(sizes) <= (CHUNK_ROWS if kind == "decomposable" else CHUNK_ROWS // 2)
    assert all(torch.isfinite(g).all() and g.abs().sum() > 0 for g in actual[1:-3])  # every parameter is trained
    _assert_all_close(expected, actual)


@pytest.mark.parametrize("rank, global_noise", [(0, True), (1, True), (2, False)])
def test_missing_task_values_under_the_mask_policy_equal_the_unchunked_ones(rank, global_noise):
    model, likelihood, x, y = _model("curl_free", rank, missing=True, global_noise=global_noise)
    test_x = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    expected, _ = _train_and_predict(model, likelihood, x, y, test_x, None, missing=True)
    actual, chunked = _train_and_predict(model, likelihood, x, y, test_x, CHUNK_ROWS, missing=True)
    assert isinstance(chunked, ChunkedMultiOutputFeatureOperator)
    _assert_all_close(expected, actual)


@pytest.mark.parametrize("rank", [0, 1])
def test_fewer_rows_than_features_train_chunked_through_the_capacitance(rank):
    """N·p = 80 < F = 256: unchunked, the N·p × N·p kernel-space path; chunked, the F × F capacitance (the same
    model: the kernel-space path needs the whole root)."""
    model, likelihood, x, y = _model("curl_free", rank, width=256)
    test_x = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    expected, _ = _train_and_predict(model, likelihood, x, y, test_x, None)
    assert model.prediction_strategy.uses_kernel_space
    actual, _ = _train_and_predict(model, likelihood, x, y, test_x, CHUNK_ROWS)
    assert not model.prediction_strategy.uses_kernel_space
    _assert_all_close(expected, actual)


def test_the_memory_budget_chunks_training_and_fit_mll_trains_the_same_model():
    """Without a forced chunk size: a budget below the root's working set chunks it; rfgp.fit_mll takes the same
    steps and ends at the same hyperparameters and posterior as unchunked."""
    test_x = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    results = []
    for budget in (2**30, 8 * 2**10):  # 8 KiB: 4 copies × 32 features × 8 bytes = 1 KiB per row, 4 points
        model, likelihood, x, y = _model("helmholtz", 1)
        with rfgp.settings.memory_budget(budget):
            assert isinstance(model.covar_module(x).evaluate_kernel(),
                              ChunkedMultiOutputFeatureOperator) == (budget < 2**30)
            history = rfgp.fit_mll(model, num_iterations=4)
            model.eval()
            with torch.no_grad():
                posterior = model(test_x)
        results.append((torch.tensor(history.losses, dtype=F64), *[p.detach() for p in model.parameters()],
                        posterior.mean, posterior.variance))
    _assert_all_close(*results)


def test_a_gpytorch_sum_of_multi_output_kernels_concatenates_its_chunked_roots():
    """k₁ + k₂ (GPyTorch's AdditiveKernel) evaluates two chunked covariances: their sum is the chunked root [R₁, R₂]
    (as the unchunked roots concatenate), not a generic sum whose noisy form GPyTorch would solve densely."""
    model, likelihood, x, y = _model("curl_free", 1)
    model.covar_module = model.covar_module + ScaleKernel(SketchedDivFreeKernel(16, 2, seed=1)).to(F64)
    test_x = torch.rand(9, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    expected, _ = _train_and_predict(model, likelihood, x, y, test_x, None)
    actual, chunked = _train_and_predict(model, likelihood, x, y, test_x, CHUNK_ROWS)
    assert isinstance(chunked, ChunkedMultiOutputFeatureOperator) and chunked.featurizer.num_features == 32
    _assert_all_close(expected, actual)


@pytest.mark.parametrize("rank", [0, 1])
def test_second_derivatives_equal_the_unchunked_ones(rank):
    """create_graph=True (Hessians of the MLL w.r.t. hyperparameters) recomputes all rows with autograd."""
    hessian_rows = []
    for chunk_rows in (None, CHUNK_ROWS):
        model, likelihood, x, y = _model("curl_free", rank)
        parameters = [p for p in model.parameters() if p.requires_grad]
        with rfgp.settings.chunk_size(chunk_rows):
            value = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
            gradients = torch.autograd.grad(value, parameters, create_graph=True)
            hessian_rows.append(torch.autograd.grad(sum(g.sum() for g in gradients), parameters))
    _assert_all_close(*hessian_rows)


class _DerivativeGP(gpytorch.models.ExactGP):
    """GPyTorch's "GP regression with derivative information" model, with the sketched RBFKernelGrad."""

    def __init__(self, x, y, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMeanGrad()
        self.covar_module = ScaleKernel(SketchedRBFKernelGrad(32, ard_num_dims=2, seed=0))

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_derivative_observations_train_chunked_too():
    """Derivative kernels (roots [Φ; ∂Φ/∂x₁; …] interleaved per point) refused a root over the budget ('multi-output
    feature kernels have no chunked evaluation'); they now take the same block-by-block path."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(30, 2, generator=g, dtype=F64)
    y = torch.stack([torch.sin(2 * x[:, 0]) * x[:, 1], 2 * torch.cos(2 * x[:, 0]) * x[:, 1], torch.sin(2 * x[:, 0])],
                    -1) + 0.01 * torch.randn(30, 3, generator=g, dtype=F64)
    test_x = torch.rand(9, 2, generator=g, dtype=F64)
    results = []
    for chunk_rows in (None, 3 * 7):
        torch.manual_seed(0)
        likelihood = MultitaskGaussianLikelihood(num_tasks=3, rank=1).to(F64)
        model = _DerivativeGP(x, y, likelihood).to(F64)
        sizes = _record_featurized_points(model)
        result, operator = _train_and_predict(model, likelihood, x, y, test_x, chunk_rows)
        assert isinstance(operator, ChunkedMultiOutputFeatureOperator) == (chunk_rows is not None)
        if chunk_rows is not None:
            assert max(sizes) <= 7
        results.append(result)
    _assert_all_close(*results)


def test_a_diagonal_over_the_budget_with_a_gradient_is_still_refused_by_name():
    model, _, x, _ = _model("curl_free", 0)
    with rfgp.settings.chunk_size(CHUNK_ROWS), pytest.raises(ValueError, match=r"80 rows \(n = 40 points × 2 "):
        model.covar_module(x, diag=True)


def test_whitened_blocks_leave_room_for_the_whitened_copy_of_their_rows():
    """Correlated task noise whitens every block (a second copy of its rows, kept in the backward's recomputation
    too): under a memory budget its blocks are 4/6 of the unwhitened block (n = 40 000, p = 3, F = 512, rank 1 at
    1 GiB grew by 1.48 GiB before, 1.03 GiB after); a forced rfgp.settings.chunk_size is kept as given."""
    model, likelihood, x, y = _model("curl_free", 1)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    sizes = _record_featurized_points(model)
    with rfgp.settings.memory_budget(6 * 2**10):  # 4 copies × 16 features × 8 bytes per row: 6 points per block
        output = model(x)
        block = output.lazy_covariance_matrix.evaluate_kernel().chunk_size
        torch.autograd.grad(mll(output, y), [p for p in model.parameters() if p.requires_grad])
    assert block == 6 and max(sizes) == 4
    sizes.clear()
    with rfgp.settings.chunk_size(CHUNK_ROWS):
        torch.autograd.grad(mll(model(x), y), [p for p in model.parameters() if p.requires_grad])
    assert max(sizes) == CHUNK_ROWS // 2
