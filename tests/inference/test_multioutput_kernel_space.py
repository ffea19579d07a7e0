"""Multi-output prediction in kernel space (N·T rows < F) and feature space (N·T > F) vs the dense GP.

:class:`MultitaskFeatureSpacePredictionStrategy` solves with the N·T × N·T matrix RRᵀ + D when that costs fewer
flops than the F × F capacitance (the marginal likelihood's rule); both must give the dense GP's posterior with the
model's own sketched K̂, for diagonal and correlated task noise, missing targets and batches, and the strategy must
never form an F × F matrix when N·T ≪ F (a sweep hit a 32 GiB allocation at N = 50, F = 65536).
"""


import gpytorch
import pytest
import torch
from gpytorch.likelihoods import MultitaskGaussianLikelihood

import rfgp
import rfgp.core.memory
from rfgp.inference.multioutput import MultitaskFeatureSpacePredictionStrategy
from rfgp.kernels import SketchedCurlFreeKernel, SketchedDecomposableKernel, SketchedRBFKernel

F64 = torch.float64
SMALL_F, LARGE_F = 16, 512  # N·T = 60 or 90 rows: feature space at 16 features, kernel space at 512


class _MultiOutputGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel, mean):
        super().__init__(x, y, likelihood)
        self.mean_module, self.covar_module = mean, kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def _curl_free(num_features, batch_shape=torch.Size()):
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(num_features, 2, seed=0, batch_shape=batch_shape),
                                          batch_shape=batch_shape)
    return kernel, gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(batch_shape=batch_shape), 2), 2


def _decomposable(num_features):
    kernel = SketchedDecomposableKernel(SketchedRBFKernel(num_features, seed=2), num_tasks=2, rank=1)
    return gpytorch.kernels.ScaleKernel(kernel), gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), 2), 2


def _derivative(num_features):
    """∂-observations: f and ∇f at every input (T = d + 1), GPyTorch's RBFKernelGrad converted by rfgp.sketch."""
    kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernelGrad(ard_num_dims=2)), num_features,
                         seed=0)
    return kernel, gpytorch.means.ConstantMeanGrad(), 3


KERNELS = {"curl_free": _curl_free, "decomposable": _decomposable, "derivative": _derivative}


def _model(make_kernel, num_features, rank, n=30, batch_shape=torch.Size(), nan_at=()):
    kernel, mean, num_tasks = make_kernel(num_features, batch_shape) if batch_shape else make_kernel(num_features)
    g = torch.Generator().manual_seed(0)
    x = torch.rand(*batch_shape, n, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.sin(3 * x.sum(-1, keepdim=True)) + 0.3 * torch.randn(*batch_shape, n, num_tasks, generator=g, dtype=F64)
    for point, task in nan_at:
        y[..., point, task] = float("nan")
    likelihood = MultitaskGaussianLikelihood(num_tasks=num_tasks, rank=rank, batch_shape=batch_shape).to(F64)
    with torch.no_grad():
        if rank == 0:
            likelihood.task_noises = torch.linspace(0.02, 0.05, num_tasks, dtype=F64)
        else:
            factor = torch.tensor([[0.2, 0.05], [-0.1, 0.15], [0.05, -0.1]], dtype=F64)[:num_tasks, :rank]
            likelihood.task_noise_covar_factor.copy_(factor.expand_as(likelihood.task_noise_covar_factor))
        likelihood.noise = 0.01
    model = _MultiOutputGP(x, y, likelihood, kernel, mean).to(F64)
    with torch.no_grad():
        for name, parameter in model.mean_module.named_parameters():
            if name.endswith("raw_constant") or name.endswith("constant"):
                parameter.fill_(0.3)
    test_x = torch.rand(*batch_shape, 6, 2, generator=g, dtype=F64) * 2 - 1
    return model, x, y, test_x


def _dense_posterior(model, x, y, test_x):
    """μ* + K*ₓ(Kₓₓ + noise)⁻¹(y − μ) and K** − K*ₓ(Kₓₓ + noise)⁻¹Kₓ* over the non-NaN targets, with the model's K̂."""
    with torch.no_grad():
        kernel, batch = model.covar_module, y.shape[:-2]
        noisy = kernel(x).to_dense() + model.likelihood._shaped_noise_covar(y.shape).to_dense()
        residual = (y - model.mean_module(x)).reshape(*batch, -1)
        cross = kernel(test_x, x).to_dense()
        observed = ~torch.isnan(residual.reshape(-1, residual.shape[-1])).any(0)
        noisy, cross, residual = noisy[..., observed, :][..., observed], cross[..., observed], residual[..., observed]
        solve = torch.linalg.solve(noisy, torch.cat([residual.unsqueeze(-1), cross.mT], -1))
        test_mean = model.mean_module(test_x)
        mean = test_mean + (cross @ solve[..., :1]).squeeze(-1).reshape(test_mean.shape)
        return mean, kernel(test_x).to_dense() - cross @ solve[..., 1:]


def _assert_posterior(model, test_x, kernel_space, mean_ref, covar_ref):
    model.eval()
    with torch.no_grad():
        posterior = model(test_x)
        strategy = model.prediction_strategy
        assert isinstance(strategy, MultitaskFeatureSpacePredictionStrategy)
        assert strategy.uses_kernel_space is kernel_space
        torch.testing.assert_close(posterior.mean, mean_ref, atol=1e-8, rtol=1e-8)
        torch.testing.assert_close(posterior.covariance_matrix, covar_ref, atol=1e-8, rtol=1e-8)
        variance = torch.diagonal(covar_ref, dim1=-2, dim2=-1).reshape(mean_ref.shape)
        torch.testing.assert_close(posterior.variance, variance, atol=1e-8, rtol=1e-8)
        with gpytorch.settings.skip_posterior_variances(True):
            torch.testing.assert_close(model(test_x).mean, mean_ref, atol=1e-8, rtol=1e-8)
    return strategy


@pytest.mark.parametrize("num_features, kernel_space", [(SMALL_F, False), (LARGE_F, True)])
@pytest.mark.parametrize("kernel, rank", [(name, rank) for name in sorted(KERNELS) for rank in (0, 1)]
                         + [("decomposable", 2)])  # rank 0: diagonal noise; rank ≥ 1: correlated, whitened
def test_posterior_equals_the_dense_gp_in_either_space(kernel, rank, num_features, kernel_space):
    model, x, y, test_x = _model(KERNELS[kernel], num_features, rank)
    strategy = _assert_posterior(model, test_x, kernel_space, *_dense_posterior(model, x, y, test_x))
    # the weight-space mean E[θ | y] is the same in both algebras (push-through identity)
    with torch.no_grad():
        torch.testing.assert_close(strategy.kernel_space_cache[0], strategy.mean_covar_cache[0], atol=1e-8, rtol=1e-8)


def test_diagonal_noise_without_task_noises():
    """GaussianLikelihood-style noise σ²I (MultitaskGaussianLikelihood without task noises), in kernel space."""
    kernel, mean, _ = _curl_free(LARGE_F)
    x = torch.rand(30, 2, generator=torch.Generator().manual_seed(1), dtype=F64)
    y = torch.randn(30, 2, generator=torch.Generator().manual_seed(2), dtype=F64)
    likelihood = MultitaskGaussianLikelihood(num_tasks=2, rank=0, has_task_noise=False).to(F64)
    likelihood.noise = 0.03
    model = _MultiOutputGP(x, y, likelihood, kernel, mean).to(F64)
    test_x = torch.rand(5, 2, dtype=F64, generator=torch.Generator().manual_seed(3))
    _assert_posterior(model, test_x, True, *_dense_posterior(model, x, y, test_x))


@pytest.mark.parametrize("num_features, kernel_space", [(SMALL_F, False), (LARGE_F, True)])
@pytest.mark.parametrize("rank", [0, 1])
@pytest.mark.parametrize("kernel", ["curl_free", "derivative"])
def test_missing_targets_condition_on_the_observed_entries_in_either_space(kernel, rank, num_features, kernel_space):
    """observation_nan_policy("mask"/"fill"): single tasks and whole points missing, the dense GP of the rest."""
    nan_at = [(3, 1), (7, 0), (11, 0), (20, 0), (20, 1)]
    model, x, y, test_x = _model(KERNELS[kernel], num_features, rank, nan_at=nan_at)
    if kernel == "derivative":
        y[..., 20, 2] = float("nan")  # the whole point
    references = _dense_posterior(model, x, y, test_x)
    for policy in ("mask", "fill"):
        with gpytorch.settings.observation_nan_policy(policy):
            _assert_posterior(model, test_x, kernel_space, *references)


@pytest.mark.parametrize("num_features, kernel_space", [(SMALL_F, False), (LARGE_F, True)])
@pytest.mark.parametrize("rank", [0, 1])
def test_batched_models_in_either_space(rank, num_features, kernel_space):
    model, x, y, test_x = _model(_curl_free, num_features, rank, n=20, batch_shape=torch.Size([2]))
    _assert_posterior(model, test_x, kernel_space, *_dense_posterior(model, x, y, test_x))


@pytest.mark.parametrize("rank", [0, 1])
def test_wide_derivative_sketch_with_few_points_never_forms_the_feature_gram(monkeypatch, rank):
    """The sweep's repro: N = 50 points × 3 outputs, F = 65536.  An F × F float64 matrix is 32 GiB; with 1 GiB
    available the memory guard would refuse it, so passing shows only the 150 × 150 system was formed."""
    monkeypatch.setattr(rfgp.core.memory, "available_bytes", lambda device: 2**30)
    model, x, y, test_x = _model(_derivative, 65536, rank, n=50)
    mean_ref, covar_ref = _dense_posterior(model, x, y, test_x)
    _assert_posterior(model, test_x, True, mean_ref, covar_ref)


@pytest.mark.parametrize("num_features, side", [(1024, 100), (64, 64)])  # kernel space: N·T; feature space: F
def test_a_system_that_cannot_fit_is_refused_by_name(monkeypatch, num_features, side):
    """50 points × 2 outputs: the strategy's own N·T × N·T or F × F matrix (and its factor) over the available memory
    raises the memory guard's ValueError, not the allocator's error; the kernel's own min(N, F) check passes."""
    model, x, y, test_x = _model(_curl_free, num_features, 0, n=50)
    model.eval()
    needed = 2 * side * side * 8
    monkeypatch.setattr(rfgp.core.memory, "CHECK_THRESHOLD", 0)
    monkeypatch.setattr(rfgp.core.memory, "available_bytes", lambda device: needed - 1)
    with torch.no_grad(), pytest.raises(ValueError, match=rf"feature-space solve .*{side} × {side}"):
        model(test_x)
