"""rfgp kernels with a variance correction inside GPyTorch's own containers with exact parts (sums, products,
``ScaleKernel``, ``MultitaskKernel``), predicted by GPyTorch's strategy: the correction reaches the variance.

With every training point a Nyström landmark, K̂(x, X) = K(x, X) and the FITC term k(x, x) − ‖Φ(x)‖² makes the
test diagonal exact, so the posterior equals the exact GP's everywhere, up to the landmark jitter (1e-8 of the mean
diagonal, amplified by K(X, X)⁻¹): on these data the Nyström RBF kernel alone is 2.3e-6 off the exact GP's mean,
3e-8 in the marginal likelihood and 8e-9 in the variance, hence the tolerance 1e-5."""

import copy

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, MultitaskKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.inference.operators import ChunkedFeatureRootLinearOperator

DTYPE = torch.float64
TOL = 1e-5


def data(n=60, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=DTYPE) * 2 - 1
    y = torch.sin(3 * x[:, 0]) + 0.5 * torch.cos(2 * x.sum(-1)) + 0.1 * torch.randn(n, generator=gen, dtype=DTYPE)
    near = x[:5] + 0.05
    far = torch.rand(5, 2, generator=gen, dtype=DTYPE) * 2 + 4  # k(x*, X) ≈ 0: the prior variance
    return x, y, torch.cat([near, far])


def parts():
    rbf = ScaleKernel(RBFKernel()).to(DTYPE)
    rbf.base_kernel.lengthscale, rbf.outputscale = 0.4, 0.7
    matern = ScaleKernel(MaternKernel(nu=1.5)).to(DTYPE)
    matern.base_kernel.lengthscale, matern.outputscale = 1.2, 0.4
    return rbf, matern


class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel, num_tasks=None):
        super().__init__(x, y, likelihood)
        self.num_tasks = num_tasks
        mean = gpytorch.means.ConstantMean()
        self.mean_module = mean if num_tasks is None else gpytorch.means.MultitaskMean(mean, num_tasks)
        self.covar_module = kernel

    def forward(self, x):
        if self.num_tasks is None:
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def posterior(kernel, x, y, test, num_tasks=None):
    if num_tasks is None:
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    else:
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=num_tasks).to(DTYPE)
        y = torch.stack([y, -0.5 * y], -1)
    likelihood.noise = 0.05
    model = GP(x, y, likelihood, kernel, num_tasks).to(DTYPE)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    with gpytorch.settings.max_cholesky_size(10_000):
        loss = mll(model(x), y).detach()
        model.eval()
        with torch.no_grad():
            prediction = model(test)
    return loss, prediction.mean, prediction.variance


def landmarks(kernel, x):
    return rfgp.sketch(kernel, x.shape[0], method="nystrom", x_sample=x)


COMBINATIONS = {
    "sum": lambda rbf, matern, x: (rbf + matern, landmarks(rbf, x) + matern),
    "scaled sum": lambda rbf, matern, x: (ScaleKernel(rbf + matern), ScaleKernel(landmarks(rbf, x) + matern)),
    "product": lambda rbf, matern, x: (rbf * matern, landmarks(rbf, x) * matern),
    "product, exact factor first": lambda rbf, matern, x: (matern * rbf, matern * landmarks(rbf, x)),
    "Nyström product plus exact": lambda rbf, matern, x: (
        rbf * rbf + matern, landmarks(rbf, x) * landmarks(copy.deepcopy(rbf), x) + matern),
}


@pytest.mark.parametrize("lazily", [True, False], ids=["lazy", "eager"])
@pytest.mark.parametrize("name", list(COMBINATIONS))
def test_nystrom_combined_with_exact_kernels_predicts_the_exact_posterior(name, lazily):
    """Before, GPyTorch's strategy left the FITC term out: far from the data the sum predicted 0.40 for 1.10, the
    products 1e-10 for 0.28."""
    x, y, test = data()
    exact, combined = COMBINATIONS[name](*parts(), x)
    with gpytorch.settings.lazily_evaluate_kernels(lazily):
        reference = posterior(exact, x, y, test)
        result = posterior(combined, x, y, test)
    for value, expected in zip(result, reference):
        torch.testing.assert_close(value, expected, rtol=TOL, atol=TOL)


def test_maclaurin_correction_survives_a_sum_with_an_exact_kernel():
    """A truncated Maclaurin sketch with its bias correction, plus an exact Matérn: far from the data (k̂ = 0 beyond
    the truncation) the variance is the prior's 0.7 + 0.4, as for the Maclaurin kernel alone (before: 0.4)."""
    x, y, test = data()
    rbf, matern = parts()
    maclaurin = rfgp.sketch(rbf, 256, method="maclaurin", max_order=4)
    far = test[5:]
    _, _, alone = posterior(maclaurin, x, y, far)
    _, _, summed = posterior(maclaurin + matern, x, y, far)
    torch.testing.assert_close(alone, torch.full_like(alone, 0.7), rtol=1e-3, atol=0)
    torch.testing.assert_close(summed, torch.full_like(summed, 1.1), rtol=1e-3, atol=0)


def test_multitask_kernel_around_a_nystrom_data_kernel_predicts_the_exact_posterior():
    """GPyTorch's ``MultitaskKernel`` with only its data kernel swapped (K̂ ⊗ B): the correction c ⊗ diag(B) (before,
    1e-10 far from the data for the prior variance B_tt·0.7)."""
    x, y, test = data()
    torch.manual_seed(0)
    exact = MultitaskKernel(parts()[0], num_tasks=2, rank=1).to(DTYPE)
    swapped = copy.deepcopy(exact)
    swapped.data_covar_module = landmarks(swapped.data_covar_module, x)
    reference = posterior(exact, x, y, test, num_tasks=2)
    result = posterior(swapped, x, y, test, num_tasks=2)
    for value, expected in zip(result, reference):
        torch.testing.assert_close(value, expected, rtol=TOL, atol=TOL)


@pytest.mark.parametrize("budget", [2**40, 2**14], ids=["whole root", "chunked root"])
@pytest.mark.parametrize("index_first", [False, True], ids=["sketched * index", "index * sketched"])
def test_product_with_an_index_kernel_keeps_the_correction_in_either_order(index_first, budget):
    """``IndexKernel(active_dims=[2]) * nystrom`` (the task factor first): linear_operator's generic product of the
    interpolated task operator with the feature root left the FITC term out (1e-10 far from the data for the prior
    B_tt·0.7); it now takes the face-splitting root as ``nystrom * IndexKernel`` does.  A chunked root (over the
    memory budget) keeps linear_operator's lazy product, which now carries the correction too (it had dropped it)."""
    x, y, test = data()
    tasks = (torch.arange(x.shape[0]) % 3).to(DTYPE).unsqueeze(-1)
    inputs = torch.cat([x, tasks], -1)
    test_inputs = torch.cat([test, (torch.arange(test.shape[0]) % 3).to(DTYPE).unsqueeze(-1)], -1)
    rbf = ScaleKernel(RBFKernel(active_dims=[0, 1])).to(DTYPE)
    rbf.base_kernel.lengthscale, rbf.outputscale = 0.4, 0.7
    torch.manual_seed(0)
    index = gpytorch.kernels.IndexKernel(num_tasks=3, rank=1, active_dims=[2]).to(DTYPE)
    sketched = rfgp.sketch(copy.deepcopy(rbf), x.shape[0], method="nystrom", x_sample=inputs)
    exact = index * rbf if index_first else rbf * index
    combined = copy.deepcopy(index) * sketched if index_first else sketched * copy.deepcopy(index)
    reference = posterior(exact, inputs, y, test_inputs)
    with rfgp.settings.memory_budget(budget):
        result = posterior(combined, inputs, y, test_inputs)
    for value, expected in zip(result, reference):
        torch.testing.assert_close(value, expected, rtol=TOL, atol=TOL)


def test_eager_multitask_kernel_around_a_nystrom_data_kernel_refuses_rather_than_dropping_the_correction():
    """Under ``lazily_evaluate_kernels(False)`` GPyTorch slices the test block out of the evaluated K̂ ⊗ B, which
    linear_operator returns as an interpolated operator without the data kernel's correction: refused by name (before,
    1e-10 far from the data, silently)."""
    x, y, test = data()
    torch.manual_seed(0)
    swapped = MultitaskKernel(parts()[0], num_tasks=2, rank=1).to(DTYPE)
    swapped.data_covar_module = landmarks(swapped.data_covar_module, x)
    with gpytorch.settings.lazily_evaluate_kernels(False), pytest.raises(NotImplementedError, match="rfgp.sketch"):
        posterior(swapped, x, y, test, num_tasks=2)


@pytest.mark.parametrize("name", ["sum", "product", "product, exact factor first"])
def test_chunked_nystrom_combined_with_exact_kernels_predicts_the_exact_posterior(name):
    """Under a memory budget below the 60 × 60 Nyström root (28.8 kB) the root is chunked; its generic dense product
    with the exact factor dropped the correction (1e-10 for 0.28 far from the data)."""
    x, y, test = data()
    exact, combined = COMBINATIONS[name](*parts(), x)
    reference = posterior(exact, x, y, test)
    with rfgp.settings.memory_budget(2**14):
        nystrom = next(k for k in combined.modules() if isinstance(k, rfgp.kernels.NystromKernel))
        assert isinstance(nystrom(x).evaluate_kernel(), ChunkedFeatureRootLinearOperator)
        result = posterior(combined, x, y, test)
    for value, expected in zip(result, reference):
        torch.testing.assert_close(value, expected, rtol=TOL, atol=TOL)
