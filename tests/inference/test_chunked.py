"""Chunked feature statistics: the plain ExactGP + ExactMarginalLogLikelihood path gives the same
MLL, gradients and predictions with and without chunking, and never materialises N × F."""

import functools
import math

import gpytorch
import pytest
import torch
from linear_operator.operators import ConstantMulLinearOperator, DiagLinearOperator

import rfgp
from rfgp.inference.operators import (
    ChunkedFeatureCrossLinearOperator,
    ChunkedFeatureRootAddedDiagLinearOperator,
    ChunkedFeatureRootLinearOperator,
    FeatureRootLinearOperator,
)
from rfgp.kernels import FeatureSumKernel, SketchedMaternKernel, SketchedRBFKernel
from rfgp.models import ExactGPModel

NUM_TRAIN, DIM = 200, 3


def _data(dtype):
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(NUM_TRAIN, DIM, generator=gen, dtype=dtype)
    y = torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(NUM_TRAIN, generator=gen, dtype=dtype)
    x_test = torch.randn(11, DIM, generator=gen, dtype=dtype)
    return x, y, x_test


def _kernel(kind):
    if kind == "rbf":
        return gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, ard_num_dims=DIM, seed=0))
    return FeatureSumKernel(
        gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, method="orf", ard_num_dims=DIM, seed=1)),
        gpytorch.kernels.ScaleKernel(SketchedMaternKernel(32, nu=1.5, seed=2)),
    )


@functools.lru_cache(maxsize=None)
def _train_and_predict(kind, dtype, chunk_size):
    """Loss, parameter gradients and predictive mean/variance under ``rfgp.settings.chunk_size``."""
    x, y, x_test = _data(dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = ExactGPModel(x, y, likelihood, _kernel(kind)).to(dtype)
    with torch.no_grad():  # away from initial values so that every gradient is non-trivial
        for p in model.parameters():
            p.add_(0.3)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with rfgp.settings.chunk_size(chunk_size):
        loss = -mll(model(x), y)
        loss.backward()
        model.eval()
        with torch.no_grad():
            prediction = likelihood(model(x_test))
            mean, variance = prediction.mean, prediction.variance
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    return loss.detach(), grads, mean, variance


@pytest.mark.parametrize("kind, chunk_size", [("rbf", 16), ("rbf", 64), ("rbf", NUM_TRAIN - 1), ("sum", 64)])
def test_chunked_equals_unchunked(kind, chunk_size, dtype):
    rtol, atol = (1e-10, 1e-12) if dtype == torch.float64 else (2e-4, 2e-5)
    loss, grads, mean, var = _train_and_predict(kind, dtype, None)
    c_loss, c_grads, c_mean, c_var = _train_and_predict(kind, dtype, chunk_size)
    torch.testing.assert_close(c_loss, loss, rtol=rtol, atol=atol)
    assert set(grads) == set(c_grads)
    for name in grads:
        assert grads[name].abs().max() > 0, name
        torch.testing.assert_close(c_grads[name], grads[name], rtol=rtol * 10, atol=atol * 10, msg=name)
    torch.testing.assert_close(c_mean, mean, rtol=rtol * 10, atol=atol * 10)
    torch.testing.assert_close(c_var, var, rtol=rtol * 10, atol=atol * 10)


def test_chunked_path_never_featurizes_more_than_a_chunk():
    x, y, x_test = _data(torch.float64)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = _kernel("rbf")
    model = ExactGPModel(x, y, likelihood, kernel).double()
    rows_seen = []
    kernel.base_kernel.feature_map.register_forward_hook(lambda m, args, out: rows_seen.append(out.shape[-2]))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with rfgp.settings.chunk_size(50):
        output = model(x)
        assert isinstance(output.lazy_covariance_matrix.evaluate_kernel(), ChunkedFeatureRootLinearOperator)
        assert isinstance(likelihood(output).lazy_covariance_matrix.evaluate_kernel(),
                          ChunkedFeatureRootAddedDiagLinearOperator)
        (-mll(output, y)).backward()
        model.eval()
        with torch.no_grad():
            likelihood(model(x_test)).variance
    assert rows_seen and max(rows_seen) <= 50


def test_memory_budget_selects_the_path():
    x = torch.randn(1000, DIM, dtype=torch.float64)
    kernel = SketchedRBFKernel(64, ard_num_dims=DIM, seed=0).double()
    # 4 working copies × 64 features × 8 bytes = 2048 bytes per row
    with rfgp.settings.memory_budget(2048 * 1000):
        assert isinstance(kernel(x).evaluate_kernel(), FeatureRootLinearOperator)
    with rfgp.settings.memory_budget(2048 * 100):
        op = kernel(x).evaluate_kernel()
        assert isinstance(op, ChunkedFeatureRootLinearOperator) and op.chunk_size == 100
    assert rfgp.settings.resolve_chunk_size(1000, 64, 1, torch.float64) is None  # default 1 GiB


def test_matmul_gradients_through_chunked_operator():
    """GPyTorch's generic matmul backward (_bilinear_derivative) reaches the kernel parameters."""
    x = torch.randn(40, DIM, dtype=torch.float64)
    rhs = torch.randn(40, 2, dtype=torch.float64)
    results = []
    for chunk in (None, 9):
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, ard_num_dims=DIM, seed=0)).double()
        with rfgp.settings.chunk_size(chunk):
            product = kernel(x).evaluate_kernel().matmul(rhs)
            (product.pow(2).sum()).backward()
        results.append((product.detach(), [p.grad.clone() for p in kernel.parameters()]))
    torch.testing.assert_close(results[1][0], results[0][0])
    for chunked, plain in zip(results[1][1], results[0][1]):
        torch.testing.assert_close(chunked, plain)


def test_chunked_dense_diag_and_cross_covariance_match():
    x, _, x_test = _data(torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, ard_num_dims=DIM, seed=0)).double()
    kernel.outputscale = 1.7
    with torch.no_grad():
        dense = kernel(x_test, x).to_dense()
        diag = kernel(x, diag=True)
        with rfgp.settings.chunk_size(13):
            torch.testing.assert_close(kernel(x_test, x).to_dense(), dense)
            torch.testing.assert_close(kernel(x, diag=True), diag)
            torch.testing.assert_close(kernel(x_test, x).evaluate_kernel() @ torch.ones(NUM_TRAIN, 1, dtype=torch.float64),
                                       dense.sum(-1, keepdim=True))


@pytest.mark.parametrize("setting, value, error", [
    (rfgp.settings.chunk_size, 0, ValueError),
    (rfgp.settings.chunk_size, 2.5, TypeError),
    (rfgp.settings.memory_budget, None, TypeError),
])
def test_settings_validate(setting, value, error):
    with pytest.raises(error, match=setting._name):
        setting(value)


def test_input_gradients_match():
    """Inputs produced by a network (deep kernel learning) get the same gradient through the chunks."""
    base_x, y, _ = _data(torch.float64)
    grads = []
    for chunk in (None, 23):
        x = base_x.clone().requires_grad_(True)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = ExactGPModel(x, y, likelihood, _kernel("rbf")).double()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        with rfgp.settings.chunk_size(chunk):
            (-mll(model(x), y)).backward()
        grads.append(x.grad)
    assert grads[0].abs().max() > 0
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-9, atol=1e-12)


def test_prediction_keeps_the_test_train_covariance_lazy():
    """The cross covariance Φ(x*)Φ(x)ᵀ is a lazy operator (the N training points are not featurised for it), with
    the same values and the same posterior as the eager one."""
    x, y, x_test = _data(torch.float64)
    kernel = SketchedRBFKernel(64, ard_num_dims=DIM, seed=0).double()
    eager = kernel(x_test, x).to_dense()
    with torch.no_grad():
        lazy = kernel(x_test, x).evaluate_kernel()
        assert isinstance(lazy, ChunkedFeatureCrossLinearOperator)
        torch.testing.assert_close(lazy.to_dense(), eager.detach())
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().eval()
    with torch.no_grad():
        lazy_posterior = model(x_test)
        mean, variance = lazy_posterior.mean, lazy_posterior.variance
    model.train()
    model.eval()
    with torch.enable_grad():
        posterior = model(x_test)
        torch.testing.assert_close(mean, posterior.mean.detach())
        torch.testing.assert_close(variance, posterior.variance.detach())


@pytest.mark.parametrize("chunk", [None, 7])
def test_lazy_cross_covariance_is_differentiable_like_the_eager_product(chunk):
    """Under autograd too (BoTorch optimises acquisition functions with gradients, and GPyTorch evaluates the test–train
    covariance of every t-batch: 0.60 s → 0.16 s per qLogEI evaluation at N = 3000, F = 1024), the cross covariance
    stays lazy, and products with it have the gradients of Φ(x₁)Φ(x₂)ᵀ in x₁, x₂, the lengthscale and the outputscale,
    whole or chunk by chunk."""
    x, _, x_test = _data(torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64, ard_num_dims=DIM, seed=0)).double()
    kernel.outputscale = 1.7
    rhs = torch.randn(NUM_TRAIN, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    left = torch.randn(11, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = []
    for lazy in (True, False):
        x1, x2 = x_test.clone().requires_grad_(True), x.clone().requires_grad_(True)
        if lazy:
            with rfgp.settings.chunk_size(chunk):
                covar = kernel(x1, x2).evaluate_kernel()
                inner = covar.base_linear_op if isinstance(covar, ConstantMulLinearOperator) else covar
                assert isinstance(inner, ChunkedFeatureCrossLinearOperator)
                value = (left * (covar @ rhs)).sum() + (rhs * (covar.mT @ left)).sum()
        else:
            dense = kernel(x1, x2).to_dense()
            value = 2 * (left * (dense @ rhs)).sum()
        params = (x1, x2, kernel.raw_outputscale, kernel.base_kernel.raw_lengthscale)
        grads.append(torch.autograd.grad(value, params))
    for lazy_grad, eager_grad in zip(*grads):
        assert eager_grad.abs().max() > 0
        torch.testing.assert_close(lazy_grad, eager_grad, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kernel", [
    lambda: gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0)),
    lambda: gpytorch.kernels.ScaleKernel(gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0))),
    lambda: gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0))
    + gpytorch.kernels.ScaleKernel(SketchedMaternKernel(16, seed=1)),
    lambda: gpytorch.kernels.ScaleKernel(rfgp.kernels.NystromKernel(gpytorch.kernels.RBFKernel(),
                                                                    torch.linspace(0, 1, 8).view(4, 2))),
], ids=["scaled", "scaled twice", "sum of scaled", "scaled nystrom"])
def test_create_graph_gradients_and_hessian_match_unchunked(kernel):
    """A ScaleKernel's √outputscale reaches the chunked statistics through their weights only: kept among the
    featurizer's differentiable inputs as well, a create_graph backward counted its derivative twice."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(40, 2, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel()).double().train()
    for module in model.modules():
        if isinstance(module, gpytorch.kernels.ScaleKernel):
            module.outputscale = 1.3
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]

    def gradient_and_hessian(chunk_size):
        with rfgp.settings.chunk_size(chunk_size):
            grads = torch.autograd.grad(mll(model(x), y), params, create_graph=True)
        flat = torch.cat([g.reshape(-1) for g in grads])
        rows = [torch.cat([h.reshape(-1) for h in torch.autograd.grad(entry, params, retain_graph=True,
                                                                     allow_unused=True, materialize_grads=True)])
                for entry in flat]
        return flat.detach(), torch.stack(rows)

    gradient, hessian = gradient_and_hessian(12)
    expected_gradient, expected_hessian = gradient_and_hessian(None)
    torch.testing.assert_close(gradient, expected_gradient, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(hessian, expected_hessian, rtol=1e-7, atol=1e-9)


def test_chunking_with_fewer_points_than_features_refuses_an_f_by_f_solve_that_cannot_fit(monkeypatch):
    """Chunked statistics are F × F; with N < F the unchunked kernel space would need only N × N: when the F × F
    matrix cannot be allocated the error says to raise the budget (was torch's raw allocator error).  Only the solve
    is refused: the prior covariance, which needs no F × F matrix, evaluates chunk by chunk (before, ``kernel(x)``
    itself raised the solve's error: 1000 points at F = 65 536 under the default budget)."""
    x = torch.rand(30, 2, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    kernel = SketchedRBFKernel(4096, seed=0)
    with rfgp.settings.memory_budget(2**30):
        dense = kernel(x).to_dense()
        diag = kernel(x, diag=True)
    monkeypatch.setattr(rfgp.core.memory, "available_bytes", lambda device: 2**27)  # 128 MiB: F × F is 256 MiB
    with rfgp.settings.memory_budget(2**20):
        prior = kernel(x).evaluate_kernel()
        assert isinstance(prior, ChunkedFeatureRootLinearOperator)
        torch.testing.assert_close(prior.to_dense(), dense, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(kernel(x, diag=True), diag, rtol=1e-12, atol=1e-12)
        assert gpytorch.distributions.MultivariateNormal(torch.zeros(30, dtype=torch.float64), prior).rsample().shape \
            == (30,)
        model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with pytest.raises(ValueError, match="raise rfgp.settings.memory_budget"):
            mll(model(x), y)
    with rfgp.settings.memory_budget(2**30):  # unchunked: the N × N kernel-space path
        assert isinstance(kernel(x).evaluate_kernel(), FeatureRootLinearOperator)


INDICES = {
    "rows": (Ellipsis, slice(1, 5), slice(None)),
    "columns by tensor": (Ellipsis, slice(None), torch.tensor([6, 0, 3])),
    "rows by tensor and columns": (Ellipsis, torch.tensor([2, 0]), slice(2, 7)),
    "batch member": (1,),
    "batch member, rows and columns": (0, slice(1, None), slice(None, 4)),
    "batch tensor": (torch.tensor([1, 0, 1]), slice(None), slice(2, 3)),
    "entries": (torch.tensor([1, 0]), torch.tensor([2, 0]), torch.tensor([5, 1])),
    "broadcast entries": (torch.tensor([[1], [0]]), torch.tensor([[2, 0, 0]]), torch.tensor([5, 1, 5])),
}


@pytest.mark.parametrize("index", INDICES.values(), ids=INDICES.keys())
@pytest.mark.parametrize("which", ["cross", "root"])
def test_indexing_lazy_operators_gives_the_dense_entries_with_gradients(which, index):
    """Test–train covariances (and chunked training ones) indexed by rows, columns and batch members are the dense
    entries, differentiable in the hyperparameters.  linear_operator's generic indexing wrapped them in an
    InterpolatedLinearOperator whose .to(device) raised (CatLinearOperator indexing: BoTorch's HigherOrderGP.posterior)
    and rebuilt them from batch-indexed copies of tensors the featurizer does not read (RuntimeError)."""
    gen = torch.Generator().manual_seed(4)
    batch = torch.Size([2])
    kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch),
                         32, seed=0).double()
    x1, x2 = torch.rand(2, 6, 2, generator=gen, dtype=torch.float64), torch.rand(2, 7, 2, generator=gen,
                                                                                  dtype=torch.float64)
    with rfgp.settings.chunk_size(3):
        operator = (kernel(x1, x2) if which == "cross" else kernel(x2)).evaluate_kernel()
    assert isinstance(operator, ChunkedFeatureCrossLinearOperator if which == "cross"
                      else ChunkedFeatureRootLinearOperator)
    indexed = operator[index]
    indexed = indexed.to_dense() if hasattr(indexed, "to_dense") else indexed
    expected = operator.to_dense()[index]
    torch.testing.assert_close(indexed, expected, rtol=1e-13, atol=1e-13)
    lengthscale = kernel.base_kernel.raw_lengthscale
    (grad,) = torch.autograd.grad(indexed.sum(), lengthscale)
    (expected_grad,) = torch.autograd.grad(expected.sum(), lengthscale)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-12)
    # a CatLinearOperator of them (a joint train/test covariance) reads blocks through .to(device)
    if which == "root":
        joint = operator[..., :4, :4].cat_rows(operator[..., 4:, :4], operator[..., 4:, 4:])
        torch.testing.assert_close(joint[..., 4:, :4].to_dense(), operator.to_dense()[..., 4:, :4])


@pytest.mark.parametrize("heteroscedastic", [False, True], ids=["uniform-noise", "per-point-noise"])
def test_float32_chunked_statistics_widened_to_float64_match_unchunked(heteroscedastic):
    """Adaptive precision (rfgp.inference.statistics_precision) in the chunked path: a float32 model whose statistics
    are formed in float64 (tolerance 0) gives the unchunked float64-statistics loss, gradients and Hessian-vector
    products, through the recomputed float64 forward, the per-chunk float64 backward and its casts back to float32."""
    from rfgp.inference.statistics_precision import recorded_statistics_dtypes

    g = torch.Generator().manual_seed(0)
    x = torch.rand(120, 2, generator=g)
    y = torch.sin(3 * x).sum(-1)
    noise = 0.01 + 0.05 * torch.rand(120, generator=g)
    likelihood = (gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise, learn_additional_noise=True)
                  if heteroscedastic else gpytorch.likelihoods.GaussianLikelihood())
    model = ExactGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=0))).train()
    model.covar_module.outputscale, model.covar_module.base_kernel.lengthscale = 1.3, 0.4
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]

    def derivatives(chunk_size):
        with rfgp.settings.chunk_size(chunk_size), rfgp.settings.float32_statistics_tolerance(0.0), \
                recorded_statistics_dtypes() as dtypes:
            loss = mll(model(x), y)
            grads = torch.autograd.grad(loss, params, create_graph=True)
            flat = torch.cat([gr.reshape(-1) for gr in grads])
            hvp = torch.autograd.grad(flat.sum(), params, allow_unused=True, materialize_grads=True)
        assert dtypes == [torch.float64]
        return loss.detach(), flat.detach(), torch.cat([h.reshape(-1) for h in hvp])

    chunked, unchunked = derivatives(16), derivatives(None)
    for value, reference in zip(chunked, unchunked):
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, reference, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kernel", [
    lambda: gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, ard_num_dims=DIM, seed=0)),
    lambda: gpytorch.kernels.ScaleKernel(rfgp.kernels.NystromKernel(gpytorch.kernels.RBFKernel(),
                                                                    torch.randn(12, DIM, dtype=torch.float64))),
    lambda: rfgp.sketch(gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), 2, rank=1), 16, seed=0),
], ids=["rff", "nystrom", "multitask"])
def test_detached_chunked_operators_carry_no_graph(kernel):
    """``LinearOperator.detach()`` (BoTorch detaches its training covariances) detaches a chunked operator's featurizer
    too: products, dense blocks and noise-added solves of the copy have no graph to the kernel's parameters, with
    the same values as the live operator's."""
    kernel = kernel().double()
    x, x2 = torch.randn(30, DIM, dtype=torch.float64), torch.randn(7, DIM, dtype=torch.float64)
    with rfgp.settings.chunk_size(8):
        live = kernel(x).evaluate_kernel()
        noisy = live + DiagLinearOperator(torch.full((live.shape[-1],), 0.1, dtype=torch.float64))
        operators = [live, noisy]
        if live.shape[-1] == len(x):  # multi-output cross-covariances are chunked for prediction only
            operators.append(kernel(x2, x).evaluate_kernel())
        assert all("Chunked" in type(operator).__name__ for operator in operators)
        rhs = torch.randn(live.shape[-1], 2, dtype=torch.float64)
        for operator in operators:
            detached = operator.detach()
            for value, reference in ((detached @ rhs, operator @ rhs), (detached.to_dense(), operator.to_dense())):
                assert reference.requires_grad and not value.requires_grad
                torch.testing.assert_close(value, reference.detach(), rtol=1e-12, atol=1e-12)
        assert not noisy.detach().solve(rhs).requires_grad


@pytest.mark.parametrize("kernel", ["rbf", "maclaurin", "kernel_space"])
def test_prediction_at_chunked_test_inputs_never_materialises_their_features(kernel, monkeypatch):
    """Test inputs whose features exceed the budget are predicted a chunk at a time (mean, variance with the bias
    correction, likelihood, log_prob, joint samples), equal to the unchunked prediction; their n × F features are
    never formed whole (before: the chunks were concatenated, then squared, several n × F copies)."""
    x, y, _ = _data(torch.float64)
    x_test = torch.randn(300, DIM, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    y_test = torch.sin(2 * x_test).sum(-1)
    num_train = 40 if kernel == "kernel_space" else NUM_TRAIN  # N ≤ F: the kernel-space factor
    base = rfgp.kernels.MaclaurinRBFKernel(64, seed=0) if kernel == "maclaurin" else _kernel("rbf").base_kernel
    model = ExactGPModel(x[:num_train], y[:num_train], gpytorch.likelihoods.GaussianLikelihood(),
                         gpytorch.kernels.ScaleKernel(base)).double().eval()
    with torch.no_grad():
        latent, noisy = model(x_test), model.likelihood(model(x_test))
        expected = (latent.mean, latent.variance, noisy.variance, noisy.log_prob(y_test))

    def materialised(self):
        raise AssertionError(f"features of {self.shape[-1]} test points materialised")

    monkeypatch.setattr(ChunkedFeatureRootLinearOperator, "features", materialised)
    with rfgp.settings.chunk_size(50), torch.no_grad():
        latent, noisy = model(x_test), model.likelihood(model(x_test))
        assert type(latent.lazy_covariance_matrix).__name__ == "ChunkedPosteriorCovariance"
        chunked = (latent.mean, latent.variance, noisy.variance, noisy.log_prob(y_test))
        samples = noisy.rsample(torch.Size([3]))
    if kernel == "maclaurin":
        assert base.feature_map.has_variance_bias and expected[1].min() > 0
    for value, reference in zip(chunked, expected):
        torch.testing.assert_close(value, reference, rtol=1e-9, atol=1e-11)
    assert samples.shape == (3, len(x_test)) and samples.isfinite().all()


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform-weights", "per-point-weights"])
def test_float32_chunked_statistics_add_their_chunks_in_float64(uniform):
    """Float32 chunked statistics ΦᵀWΦ, ΦᵀWR are as accurate as the unchunked ones, whatever the chunk size: the
    chunks' sums are added in float64.  Added in float32, features with a large mean (a constant offset, as
    Maclaurin and Nyström columns have) made N/chunk-term float32 sums: at one point per chunk, N = 16 384, ΦᵀWR was
    4·10⁻⁶ off (relative), the unchunked 7·10⁻⁸."""
    from rfgp.inference.chunking import Featurizer, chunked_feature_statistics
    from rfgp.inference.linalg import feature_statistics

    g = torch.Generator().manual_seed(0)
    num_points, num_features = 16384, 8
    x = torch.rand(num_points, 2, generator=g)
    frequencies = torch.randn(2, num_features, generator=g)
    featurizer = Featurizer(lambda rows: 1.0 + 0.1 * torch.cos(rows @ frequencies), (), num_features, torch.Size())
    weights = torch.full((1,), 3.0) if uniform else 1.0 + torch.rand(num_points, generator=g)
    rhs = 1000.0 + torch.rand(num_points, 2, generator=g)
    exact = feature_statistics(featurizer(x).double(), weights.double(), rhs.double())
    unchunked = feature_statistics(featurizer(x), weights, rhs)
    with rfgp.settings.float32_statistics_tolerance(math.inf):  # the float32 statistics themselves
        chunked = chunked_feature_statistics(featurizer, x, weights, rhs, chunk_size=1)
    for value, whole, reference in zip(chunked, unchunked, exact):
        assert value.dtype == torch.float32
        error = ((value.double() - reference).abs().max() / reference.abs().max()).item()
        unchunked_error = ((whole.double() - reference).abs().max() / reference.abs().max()).item()
        assert error <= max(4 * unchunked_error, 2 * 2.0**-24), (error, unchunked_error)


@pytest.mark.parametrize("scaled", [False, True], ids=["bare-kernel", "scale-kernel"])
@pytest.mark.parametrize("kind", ["rff", "nystrom"])
@pytest.mark.parametrize("chunk_size", [1, 7])
def test_per_point_noise_with_a_one_point_chunk_matches_unchunked(kind, scaled, chunk_size):
    """Per-point noise and a chunk of one point (N = 29 in chunks of 7, or of 1): that chunk's weights have the shape
    (..., 1) of uniform weights, which the backward took them for — a TypeError where the weights needed a gradient
    (a ScaleKernel's outputscale is folded into them), and silently a wrong one otherwise (a bare kernel with fixed
    noise: the lengthscale's 1.38 instead of −0.21)."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(29, 2, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1)
    noise = 0.01 + 0.05 * torch.rand(29, generator=g, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise)
    kernel = (SketchedRBFKernel(16, seed=0) if kind == "rff"
              else rfgp.kernels.NystromKernel(gpytorch.kernels.RBFKernel(), x[::4].clone()))
    kernel = gpytorch.kernels.ScaleKernel(kernel) if scaled else kernel
    model = ExactGPModel(x, y, likelihood, kernel).double().train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grads(size):
        with rfgp.settings.chunk_size(size):
            loss = mll(model(x), y)
            return loss.detach(), torch.autograd.grad(loss, params)

    (loss, grads), (reference, reference_grads) = loss_and_grads(chunk_size), loss_and_grads(None)
    torch.testing.assert_close(loss, reference, rtol=1e-10, atol=1e-12)
    for grad, reference_grad in zip(grads, reference_grads):
        torch.testing.assert_close(grad, reference_grad, rtol=1e-8, atol=1e-10)
