"""Prior samples of an rfgp kernel (``MultivariateNormal(mean, covar_module(x)).rsample()``, ``model(x).rsample()``
under ``gpytorch.settings.prior_mode``) are Φε from the feature root: exactly N(0, ΦΦᵀ), at any N."""

import gpytorch
import pytest
import torch

import rfgp

F64 = torch.float64
BATCH = torch.Size([2])


class PriorGP(gpytorch.models.ExactGP):
    def __init__(self, train_x, train_y, kernel):
        super().__init__(train_x, train_y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=BATCH))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=BATCH)
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def short_lengthscale_sketch(num_features):
    """A covariance of rank F = 256 > 100 columns, the most a Lanczos root has by default."""
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=BATCH), batch_shape=BATCH)
    exact.base_kernel.lengthscale = torch.tensor([[[0.05]], [[0.1]]])
    exact.outputscale = torch.tensor([1.0, 2.0])
    return rfgp.sketch(exact, num_features, seed=0).double()


@pytest.mark.parametrize("num_points, budget", [(300, None), (1000, None), (1000, 2**20)])
def test_prior_samples_are_the_feature_root_times_normal_draws(num_points, budget):
    """Below 800 points linear_operator factorised the singular N × N matrix ΦΦᵀ (F < N) with jitter, above it took
    a Lanczos root of 100 columns, which kept 45 % of the prior variance of this rank-256 covariance; a root over
    the memory budget (1 MiB: chunks of Φ) is sampled chunk by chunk with one ε."""
    kernel = short_lengthscale_sketch(256)
    x = torch.rand(num_points, 3, generator=torch.Generator().manual_seed(1), dtype=F64)
    model = PriorGP(x[:10], torch.zeros(2, 10, dtype=F64), kernel).eval()
    features = kernel(x).evaluate_kernel().root.to_dense()  # √s·Φ, (2, N, F)
    with torch.no_grad(), gpytorch.settings.prior_mode(True), rfgp.settings.memory_budget(budget or 2**40):
        prior = model(x)
        assert type(prior.lazy_covariance_matrix.evaluate_kernel()).__name__.startswith("Chunked") == bool(budget)
        torch.manual_seed(2)
        samples = prior.rsample(torch.Size([5]))
    torch.manual_seed(2)
    normal = torch.randn(*BATCH, 256, 5, dtype=F64)
    expected = (features @ normal).permute(2, 0, 1) + prior.mean
    torch.testing.assert_close(samples, expected, rtol=1e-12, atol=1e-12)


def test_prior_sample_variance_is_the_kernel_diagonal():
    """4000 samples at 1500 points: the mean ratio of sample to kernel variance is 1 within a few of its standard
    errors (≈ 0.02 on the points' average, correlated points counted as one); the Lanczos root gave 0.45."""
    kernel = short_lengthscale_sketch(256)
    x = torch.rand(1500, 3, generator=torch.Generator().manual_seed(3), dtype=F64)
    covariance = kernel(x)
    torch.manual_seed(4)
    with torch.no_grad():
        samples = gpytorch.distributions.MultivariateNormal(torch.zeros(*BATCH, 1500, dtype=F64), covariance).rsample(
            torch.Size([4000]))
        ratio = (samples.var(0) / covariance.diagonal(dim1=-2, dim2=-1)).mean(-1)
    torch.testing.assert_close(ratio, torch.ones(2, dtype=F64), rtol=0, atol=0.1)
