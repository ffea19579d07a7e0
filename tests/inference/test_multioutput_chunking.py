"""Prediction of multi-output feature GPs over the memory budget: block by block, the same numbers as unchunked."""

import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood
from linear_operator.operators import LinearOperator

import rfgp
from rfgp.datasets import igrf_magnetic_field
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator, ChunkedPosteriorCovariance
from rfgp.kernels import (
    SketchedCurlFreeKernel,
    SketchedRBFKernel,
)
from rfgp.models.multioutput import MultiOutputGPModel

from .._models import MultitaskGP, vector_field_kernel

F64 = torch.float64
ScaleKernel = gpytorch.kernels.ScaleKernel


def _model(kind, width, d=2, n=40):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=g, dtype=F64) * 2 - 1
    y = torch.cat([torch.sin(3 * x[:, :1]), torch.cos(2 * x[:, 1:])], -1) + 0.05 * torch.randn(n, d, generator=g,
                                                                                                  dtype=F64)
    likelihood = MultitaskGaussianLikelihood(num_tasks=d, rank=0).to(F64)
    likelihood.noise = 0.01
    return MultiOutputGPModel(x, y, likelihood, vector_field_kernel(kind, width, d)).to(F64).eval(), likelihood


def _predict(model, likelihood, test_x):
    torch.manual_seed(3)
    with torch.no_grad():
        posterior = model(test_x)
        samples = posterior.rsample(torch.Size([3]))
        return posterior, (posterior.mean, posterior.variance, likelihood(posterior).variance, samples,
                           posterior.covariance_matrix[:25, :25])


@pytest.mark.parametrize("kind", ["curl_free", "helmholtz", "decomposable"])
@pytest.mark.parametrize("width", [16, 256])  # N·p > F: feature space; N·p < F: kernel space
def test_prediction_over_the_budget_is_blockwise_and_equals_the_unchunked_one(kind, width):
    """Before: a test root over the budget raised ('multi-output feature kernels have no chunked evaluation'),
    so a 10⁵-point grid at F = 512 (3-D) needed a 4.7 GiB budget; now it is evaluated ≤ chunk points at a time."""
    model, likelihood = _model(kind, width)
    test_x = torch.rand(300, 2, generator=torch.Generator().manual_seed(5), dtype=F64) * 2 - 1
    _, whole = _predict(model, likelihood, test_x)
    largest = []
    kernels = [m for m in model.covar_module.modules() if hasattr(m, "featurize") and not hasattr(m, "kernels")]
    for kernel in kernels:  # record the widest featurisation of test points
        original = kernel.featurize
        kernel.featurize = lambda x, original=original: largest.append(x.shape[-2]) or original(x)
    with rfgp.settings.chunk_size(64):  # 64 root rows = 32 points per block
        posterior, blocked = _predict(model, likelihood, test_x)
    assert isinstance(posterior.lazy_covariance_matrix, ChunkedPosteriorCovariance)
    assert max(size for size in largest if size != model.train_inputs[0].shape[-2]) <= 32
    for a, b in zip(whole, blocked):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_blockwise_prediction_keeps_the_batch_shape():
    model, likelihood = _model("curl_free", 32)
    test_x = torch.rand(2, 50, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    _, whole = _predict(model, likelihood, test_x)
    with rfgp.settings.chunk_size(16):
        _, blocked = _predict(model, likelihood, test_x)
    for a, b in zip(whole[:4], blocked[:4]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def _no_dense_factor(self, *args, **kwargs):
    raise AssertionError(f"a root decomposition of the {tuple(self.shape)} predictive covariance was computed")


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("rank, global_noise", [(1, True), (2, False)])  # Σ_T = BBᵀ + σ²I, or BBᵀ (B 2 × 2)
def test_noisy_predictive_samples_with_correlated_task_noise_have_its_covariance(chunked, rank, global_noise,
                                                                                  monkeypatch):
    """Before: likelihood(posterior) with MultitaskGaussianLikelihood(rank ≥ 1) was a plain sum whose rsample took the
    dense Cholesky factor of the n·T × n·T matrix (3000 points, T = 2: 5.3 s; 28.8 s chunked); now a low-rank draw
    plus per-point T × T noise, with the sum's covariance (mean of 4·10⁴ draws within 5 standard errors)."""
    model, _ = _model("curl_free", 16)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=rank, has_global_noise=global_noise).to(F64)
    likelihood.task_noise_covar_factor.data = torch.tensor([[0.3, 0.1], [-0.2, 0.2]], dtype=F64)[:, :rank]
    model.likelihood = likelihood
    model.prediction_strategy = None
    test_x = torch.rand(3, 2, generator=torch.Generator().manual_seed(5), dtype=F64)
    with torch.no_grad():
        model(test_x)  # the posterior caches, over the whole training root
    torch.manual_seed(0)
    with torch.no_grad(), rfgp.settings.chunk_size(2 if chunked else None):
        predictive = likelihood(model(test_x))
        covariance = predictive.covariance_matrix
        monkeypatch.setattr(LinearOperator, "root_decomposition", _no_dense_factor)
        samples = predictive.rsample(torch.Size([40_000])).flatten(-2) - predictive.mean.flatten()
    centred = samples.unsqueeze(-1) * samples.unsqueeze(-2)
    error = centred.mean(0) - covariance
    standard_error = centred.std(0) / 40_000**0.5
    assert (error.abs() <= 5 * standard_error + 1e-12).all()


@pytest.mark.parametrize("multi_output", [True, False])
def test_float32_posterior_at_a_high_signal_to_noise_ratio_matches_float64(multi_output):
    """Before: the float32 capacitance I + ΦᵀD⁻¹Φ (condition ≈ 10⁷, positive definite as rounded) broke the float32
    Cholesky factorisation: NotPSDError after jitter (an IGRF curl-free fit re-drawn at F = 512..2048). Now it is
    factorised in float64 and rounded back; the float32 posterior matches the float64 one to float32 accuracy
    at that condition (mean 2e-3, variance 1e-2)."""
    x, field = igrf_magnetic_field(1500, altitude_km=(0.0, 1000.0), seed=0)
    y = field / 30 if multi_output else field[:, 0] / 30
    test_x = x[:20] * 1.01
    results = []
    for dtype in (torch.float32, F64):
        if multi_output:
            kernel = ScaleKernel(SketchedCurlFreeKernel(512, input_dim=3, seed=0))
            likelihood = MultitaskGaussianLikelihood(num_tasks=3, rank=0, has_task_noise=False)
            model = MultiOutputGPModel(x.to(dtype), y.to(dtype), likelihood, kernel)
        else:
            kernel = ScaleKernel(SketchedRBFKernel(512, seed=0))
            likelihood = gpytorch.likelihoods.GaussianLikelihood()
            model = rfgp.models.ExactGPModel(x.to(dtype), y.to(dtype), likelihood, kernel)
        kernel.base_kernel.lengthscale, kernel.outputscale = 0.43, 15.6 if multi_output else 84.0
        likelihood.noise = 4.4e-4
        model = model.to(dtype).eval()
        with torch.no_grad():
            posterior = model(test_x.to(dtype))
            results.append((posterior.mean.double(), posterior.variance.double()))
    (mean32, var32), (mean64, var64) = results
    assert (mean32 - mean64).abs().max() <= 1e-2 * mean64.abs().max()  # float32 at a condition number of 10⁷
    assert (var32 - var64).abs().max() <= 5e-2 * var64.abs().max()


@pytest.mark.parametrize("batched", [False, True])
def test_blockwise_predictive_log_density_is_exact(batched):
    """Before: likelihood(posterior).log_prob(y) of a blockwise posterior went to linear_operator's iterative
    estimate (1500 points: 12 s, relative error 1e-3); now Woodbury over F × F block statistics, equal to the
    unchunked posterior's exact value."""
    model, likelihood = _model("curl_free", 16)
    shape = (2, 450, 2) if batched else (450, 2)  # 900 rows: above max_cholesky_size, where it turns iterative
    test_x = torch.rand(*shape, generator=torch.Generator().manual_seed(5), dtype=F64)
    test_y = torch.cat([test_x[..., :1].sin(), test_x[..., 1:].cos()], -1)
    with torch.no_grad():
        model(test_x[..., :2, :])
        whole = likelihood(model(test_x)).log_prob(test_y)
        with rfgp.settings.chunk_size(64):
            predictive = likelihood(model(test_x))
            blocked = predictive.log_prob(test_y)
    assert isinstance(predictive.lazy_covariance_matrix, ChunkedPosteriorCovariance)
    torch.testing.assert_close(blocked, whole, rtol=1e-10, atol=1e-9)


@pytest.mark.parametrize("kernel_batch", [torch.Size([2]), torch.Size()])
def test_batch_members_of_a_chunked_posterior_covariance(kernel_batch):
    """Selecting, unsqueezing, expanding or permuting the batch of a chunked posterior covariance: linear_operator's
    defaults reshaped its arguments (the prior, whose batch is narrower for an unbatched kernel shared by batched
    outputs, and the factor, which its root function does not read): ``covar[1]`` and
    ``MultitaskMultivariateNormal.from_independent_mvns`` failed.  Against the unchunked posterior."""
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(40, 2, generator=gen, dtype=F64), torch.randn(2, 40, generator=gen, dtype=F64)
    batch = torch.Size([2])
    kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=kernel_batch),
                                                      batch_shape=kernel_batch), 16, seed=0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch)

    class BatchGP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x, y, likelihood)
            self.mean_module, self.covar_module = gpytorch.means.ConstantMean(batch_shape=batch), kernel

        def forward(self, inputs):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(inputs), self.covar_module(inputs))

    model = BatchGP().to(F64).eval()
    test_x = torch.rand(7, 2, generator=gen, dtype=F64)
    with torch.no_grad():
        dense = model(test_x)
        model.train()
        model.eval()
        with rfgp.settings.chunk_size(3):
            chunked = model(test_x)
            covar, expected = chunked.lazy_covariance_matrix, dense.covariance_matrix
            assert isinstance(covar, ChunkedPosteriorCovariance)
            torch.testing.assert_close(covar[1].to_dense(), expected[1])
            torch.testing.assert_close(covar[torch.tensor([1, 0, 1]), 2:5, 1:4].to_dense(),
                                       expected[torch.tensor([1, 0, 1]), 2:5, 1:4])
            torch.testing.assert_close(covar.expand(4, 2, 7, 7).permute(1, 0, 2, 3).to_dense(),
                                       expected.expand(4, 2, 7, 7).permute(1, 0, 2, 3))
            noisy = model.likelihood(chunked)
            torch.testing.assert_close(noisy[1].log_prob(y[1, :7]), model.likelihood(dense)[1].log_prob(y[1, :7]))
            joint = gpytorch.distributions.MultitaskMultivariateNormal.from_independent_mvns([chunked[0], chunked[1]])
            reference = gpytorch.distributions.MultitaskMultivariateNormal.from_independent_mvns([dense[0], dense[1]])
            torch.testing.assert_close(joint.covariance_matrix, reference.covariance_matrix)


@pytest.mark.parametrize("kind", ["orf", "nystrom", "maclaurin", "curl_free"])
def test_eagerly_evaluated_roots_over_the_budget_predict_block_by_block(kind):
    """Under ``gpytorch.settings.lazily_evaluate_kernels(False)`` a user's ExactGP gets its multi-output root over the
    budget evaluated: it went to GPyTorch's generic strategy, which sliced the test blocks into interpolated operators
    and solved by CG (a sketched ``MultitaskKernel``, N = 600, T = 3: means off by 2e-2, 10× the time), without the
    variance correction of Nyström and truncated Maclaurin data kernels (variances 1.7 and 2.5 too small away from the
    data).  Now the blocks of whole points stay chunked and the posterior is the lazily evaluated model's."""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(450, 2, generator=g, dtype=F64) * 2 - 1  # N·T = 900 > max_cholesky_size: CG before
    y = torch.cat([torch.sin(3 * x[:, :1]), torch.cos(2 * x[:, 1:])], -1) + 0.05 * torch.randn(450, 2, generator=g,
                                                                                                  dtype=F64)
    test_x = torch.rand(30, 2, generator=g, dtype=F64) * 4 - 2  # away from the data too
    if kind != "curl_free":
        torch.manual_seed(0)
        exact = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=2, rank=1)
        kernel = rfgp.sketch(exact, 64, method=kind, seed=0, **({"x_sample": x} if kind == "nystrom" else {}))
    else:
        kernel = vector_field_kernel(kind, 32)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(F64)
    likelihood.noise = 0.01
    model = MultitaskGP(x, y, likelihood, kernel).to(F64)
    results = []
    for lazy in (True, False):
        model.train()
        model.eval()
        with torch.no_grad(), rfgp.settings.chunk_size(64), gpytorch.settings.lazily_evaluate_kernels(lazy):
            assert isinstance(model.forward(x).lazy_covariance_matrix.evaluate_kernel(),
                              ChunkedMultiOutputFeatureOperator)
            posterior = model(test_x)
            results.append((posterior.mean, posterior.variance, posterior.covariance_matrix))
        assert isinstance(model.prediction_strategy, MultitaskFeatureSpacePredictionStrategy)
    for actual, expected in zip(*results):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


def test_a_diagonal_over_the_budget_names_what_made_it_chunk():
    """A multi-output diagonal cannot be evaluated block by block: the refusal advised "raise the budget" also where
    a forced rfgp.settings.chunk_size, not the budget, asked for blocks."""
    kernel = SketchedCurlFreeKernel(64, input_dim=2, seed=0).double()
    x = torch.rand(30, 2, dtype=torch.float64)
    forced = r"chunk_size\(7\).*leave rfgp.settings.chunk_size unset"
    with rfgp.settings.chunk_size(7), pytest.raises(ValueError, match=forced):
        kernel(x, diag=True)
    with rfgp.settings.memory_budget(1024), pytest.raises(ValueError, match="raise rfgp.settings.memory_budget"):
        kernel(x, diag=True)
    assert kernel(x, diag=True).shape == (60,)
