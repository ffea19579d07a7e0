"""NaN targets under ``gpytorch.settings.observation_nan_policy``: "mask" and "fill" give the posterior and
marginal likelihood of the NaN-free training subset (both algebra paths, batches, chunked and multi-output
operators); the default "ignore" refuses NaN targets with the clear error."""

import warnings

import gpytorch
import pytest
import torch
from gpytorch.settings import observation_nan_policy

import rfgp
from rfgp.core.validation import NonFiniteError
from rfgp.inference.operators import ChunkedFeatureRootAddedDiagLinearOperator
from rfgp.kernels import NystromKernel, SketchedCurlFreeKernel, SketchedPolynomialKernel
from rfgp.models.multioutput import MultiOutputGPModel
from rfgp.models.regression import ExactGPModel

from .._dense import DenseKernel

F64 = torch.float64
NUM_FEATURES = 64
KERNEL_SPACE, FEATURE_SPACE = 40, 300  # N ≤ F: N × N algebra; N ≫ F: F × F capacitance
TOL = dict(rtol=1e-10, atol=1e-10)


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=likelihood.noise.shape[:-1])
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _data(n, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(*batch, n, 2, generator=g, dtype=F64)
    y = torch.sin(6 * x.sum(-1)) + 0.1 * torch.randn(*batch, n, generator=g, dtype=F64)
    return x, y, torch.rand(*batch, 7, 2, generator=g, dtype=F64)


def _model(x, y, kernel=None, batch=()):
    """A GP with a sketched ScaleKernel(RBF) (or ``kernel``, e.g. the dense ΦΦᵀ of another model's)."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size(batch)).to(F64)
    if kernel is None:
        base = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=torch.Size(batch)),
                                            batch_shape=torch.Size(batch))
        kernel = rfgp.sketch(base, num_features=NUM_FEATURES, seed=0).to(F64)
        with torch.no_grad():  # away from the defaults, so that every gradient is non-trivial
            kernel.outputscale = 1.4
            kernel.base_kernel.lengthscale = 0.4
    model = _GP(x, y, likelihood, kernel).to(F64)
    with torch.no_grad():
        likelihood.noise = 0.07
        model.mean_module.constant.fill_(0.3)
    return model, likelihood


def _with_nan(y, rows):
    y = y.clone()
    y[..., rows] = float("nan")
    return y


def _posterior(model, x_test, policy="ignore"):
    model.eval()
    with torch.no_grad(), observation_nan_policy(policy), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # GPyTorch's 'fill' warns that it goes dense
        posterior = model(x_test)
        return posterior.mean, posterior.covariance_matrix


def _mll_and_grads(model, likelihood, x, y, policy="ignore", num_data=None):
    model.train()
    model.zero_grad()
    with observation_nan_policy(policy):
        # × N: GPyTorch divides the masked log density by all N points, the subset model's by N_o
        value = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
        value = value * (y.shape[-1] if num_data is None else num_data)
    value.sum().backward()
    return value.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("num_data", [KERNEL_SPACE, FEATURE_SPACE], ids=["kernel_space", "feature_space"])
@pytest.mark.parametrize("policy", ["mask", "fill"])
def test_posterior_equals_the_nan_free_subset(num_data, policy):
    x, y, x_test = _data(num_data)
    missing = [1, 5, 8, num_data - 1]
    keep = torch.ones(num_data, dtype=torch.bool)
    keep[missing] = False
    model, _ = _model(x, _with_nan(y, missing))
    subset, _ = _model(x[keep], y[keep])
    mean, covar = _posterior(model, x_test, policy)
    assert model.prediction_strategy.uses_kernel_space == (num_data == KERNEL_SPACE)
    ref_mean, ref_covar = _posterior(subset, x_test)
    torch.testing.assert_close(mean, ref_mean, **TOL)
    torch.testing.assert_close(covar, ref_covar, **TOL)
    # the NaN points did carry information: the full data's posterior is another one
    full, _ = _model(x, y)
    assert (mean - _posterior(full, x_test)[0]).abs().max() > 1e-4


@pytest.mark.parametrize("num_data", [KERNEL_SPACE, FEATURE_SPACE], ids=["kernel_space", "feature_space"])
@pytest.mark.parametrize("policy", ["mask", "fill"])
def test_posterior_mean_is_gpytorchs_exact_one(num_data, policy):
    """GPyTorch's DefaultPredictionStrategy on the dense ΦΦᵀ gives the same mean under both policies (its
    covariance is not masked: it conditions on the NaN points' inputs too, which rfgp does not copy)."""
    x, y, x_test = _data(num_data)
    y = _with_nan(y, [0, 3, 17])
    model, _ = _model(x, y)
    exact, _ = _model(x, y, DenseKernel(model.covar_module))
    torch.testing.assert_close(_posterior(model, x_test, policy)[0], _posterior(exact, x_test, policy)[0], **TOL)


@pytest.mark.parametrize("num_data", [KERNEL_SPACE, FEATURE_SPACE], ids=["kernel_space", "feature_space"])
def test_masked_mll_and_gradients_equal_the_subsets(num_data):
    x, y, _ = _data(num_data)
    missing = [2, 4, 11]
    keep = torch.ones(num_data, dtype=torch.bool)
    keep[missing] = False
    model, likelihood = _model(x, _with_nan(y, missing))
    subset, subset_likelihood = _model(x[keep], y[keep])
    # above max_cholesky_size GPyTorch's masked operator alone would take stochastic CG/Lanczos estimates
    with gpytorch.settings.max_cholesky_size(10):
        value, grads = _mll_and_grads(model, likelihood, x, _with_nan(y, missing), "mask")
        ref_value, ref_grads = _mll_and_grads(subset, subset_likelihood, x[keep], y[keep])
    torch.testing.assert_close(value, ref_value, **TOL)
    assert grads.keys() == ref_grads.keys()
    for name in grads:
        assert ref_grads[name].abs().max() > 0, name
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=name)
    # and the same as GPyTorch's exact GP with the dense ΦΦᵀ (dense Cholesky on the masked matrix)
    exact, exact_likelihood = _model(x, _with_nan(y, missing), DenseKernel(model.covar_module))
    exact_value, _ = _mll_and_grads(exact, exact_likelihood, x, _with_nan(y, missing), "mask")
    torch.testing.assert_close(exact_value, value, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("num_data", [KERNEL_SPACE, FEATURE_SPACE], ids=["kernel_space", "feature_space"])
def test_default_policy_still_refuses_nan_targets(num_data):
    x, y, x_test = _data(num_data)
    y = _with_nan(y, [3])
    model, likelihood = _model(x, y)
    with pytest.raises(NonFiniteError, match="observation_nan_policy"):
        _mll_and_grads(model, likelihood, x, y)
    with pytest.raises(NonFiniteError, match=r"training targets y contains NaN.*observation_nan_policy\('mask'\)"):
        _posterior(model, x_test)
    # caches built under "mask" are not handed out under "ignore"
    _posterior(model, x_test, "mask")
    with pytest.raises(NonFiniteError, match="training targets y"):
        _posterior(model, x_test)


def test_inf_targets_are_refused_under_mask():
    x, y, x_test = _data(FEATURE_SPACE)
    y = _with_nan(y, [3])
    y[7] = float("inf")
    model, _ = _model(x, y)
    with pytest.raises(NonFiniteError, match="at the points without NaN"):
        _posterior(model, x_test, "mask")


@pytest.mark.parametrize("num_data", [KERNEL_SPACE, FEATURE_SPACE], ids=["kernel_space", "feature_space"])
def test_batch_model_drops_a_point_missing_in_any_member(num_data):
    """GPyTorch's semantics (``_get_observed``): a target NaN in one batch member masks that point in all."""
    x, y, x_test = _data(num_data, batch=(2,))
    y_nan = y.clone()
    y_nan[0, [1, 6]] = float("nan")
    y_nan[1, [6, 9]] = float("nan")
    keep = torch.ones(num_data, dtype=torch.bool)
    keep[[1, 6, 9]] = False
    model, likelihood = _model(x, y_nan, batch=(2,))
    subset, subset_likelihood = _model(x[:, keep], y[:, keep], batch=(2,))
    mean, covar = _posterior(model, x_test, "mask")
    ref_mean, ref_covar = _posterior(subset, x_test)
    torch.testing.assert_close(mean, ref_mean, **TOL)
    torch.testing.assert_close(covar, ref_covar, **TOL)
    value, grads = _mll_and_grads(model, likelihood, x, y_nan, "mask")
    ref_value, ref_grads = _mll_and_grads(subset, subset_likelihood, x[:, keep], y[:, keep])
    torch.testing.assert_close(value, ref_value, **TOL)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=name)


def test_chunked_operators_mask_too():
    x, y, x_test = _data(FEATURE_SPACE)
    missing = [0, 10, 20]
    keep = torch.ones(FEATURE_SPACE, dtype=torch.bool)
    keep[missing] = False
    y_nan = _with_nan(y, missing)
    model, likelihood = _model(x, y_nan)
    subset, subset_likelihood = _model(x[keep], y[keep])
    with rfgp.settings.chunk_size(64):
        with torch.no_grad():
            assert isinstance(likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel(),
                              ChunkedFeatureRootAddedDiagLinearOperator)
        value, grads = _mll_and_grads(model, likelihood, x, y_nan, "mask")
        mean, covar = _posterior(model, x_test, "mask")
    ref_value, ref_grads = _mll_and_grads(subset, subset_likelihood, x[keep], y[keep])
    ref_mean, ref_covar = _posterior(subset, x_test)
    torch.testing.assert_close(value, ref_value, **TOL)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], **TOL, msg=name)
    torch.testing.assert_close(mean, ref_mean, **TOL)
    torch.testing.assert_close(covar, ref_covar, **TOL)


def test_multi_output_masks_single_task_entries():
    """Multi-output (interleaved) targets: a NaN in one task at one input drops that entry only."""
    g = torch.Generator().manual_seed(3)
    x = torch.rand(60, 2, generator=g, dtype=F64) * 2 - 1
    y = torch.stack([torch.sin(2 * x[:, 0]) + x[:, 1], torch.cos(3 * x[:, 1]) * x[:, 0]], -1)
    x_test = torch.rand(5, 2, generator=g, dtype=F64)
    y_nan = y.clone()
    y_nan[4, 0] = y_nan[9, 1] = y_nan[12, :] = float("nan")

    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).to(F64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(48, 2, seed=0))
    with pytest.raises(NonFiniteError, match="observation_nan_policy"):
        MultiOutputGPModel(x, y_nan, likelihood, kernel)
    with observation_nan_policy("mask"):  # rfgp's models accept NaN targets where they are left out
        model = MultiOutputGPModel(x, y_nan, likelihood, kernel).to(F64)
    likelihood.noise = 0.02
    likelihood.task_noises = torch.tensor([0.01, 0.03], dtype=F64)
    mean, covar = _posterior(model, x_test, "mask")
    value, grads = _mll_and_grads(model, likelihood, x, y_nan, "mask", num_data=y.numel())
    assert all(torch.isfinite(g).all() for g in grads.values())
    # reference: the dense posterior and log density of the observed entries of the same K̂ + D
    observed = ~y_nan.isnan().reshape(-1)
    with torch.no_grad():
        kernel = model.covar_module
        k_train = kernel(x).to_dense() + likelihood._shaped_noise_covar(y.shape).to_dense()
        k_train = k_train[observed][:, observed]
        cross = kernel(x_test, x).to_dense()[:, observed]
        targets = y_nan.reshape(-1)[observed]
        ref_value = torch.distributions.MultivariateNormal(torch.zeros_like(targets), k_train).log_prob(targets)
        solve = torch.linalg.solve(k_train, torch.cat([targets.unsqueeze(-1), cross.T], -1))
        ref_mean = (cross @ solve[:, 0]).reshape(-1, 2)
        ref_covar = kernel(x_test).to_dense() - cross @ solve[:, 1:]
    torch.testing.assert_close(mean, ref_mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(covar, ref_covar, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(value, ref_value, rtol=1e-8, atol=1e-8)


def test_exact_gp_model_accepts_nan_targets_only_under_a_policy_that_leaves_them_out():
    x, y, x_test = _data(FEATURE_SPACE)
    y_nan = _with_nan(y, [5])
    kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), num_features=NUM_FEATURES, seed=0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    with pytest.raises(NonFiniteError, match="observation_nan_policy"):
        ExactGPModel(x, y_nan, likelihood, kernel)
    with observation_nan_policy("mask"):
        model = ExactGPModel(x, y, likelihood, kernel).to(F64)
        model.set_train_data(targets=y_nan, strict=False)
    y_inf = y.clone()
    y_inf[5] = float("inf")
    with observation_nan_policy("mask"), pytest.raises(NonFiniteError, match="Inf"):
        model.set_train_data(targets=y_inf, strict=False)
    subset = ExactGPModel(x[torch.arange(FEATURE_SPACE) != 5], y[torch.arange(FEATURE_SPACE) != 5],
                          likelihood, kernel).to(F64)
    torch.testing.assert_close(_posterior(model, x_test, "mask")[0], _posterior(subset, x_test)[0], **TOL)


@pytest.mark.parametrize("num_data", [15, 200], ids=["kernel_space", "feature_space"])
@pytest.mark.parametrize("kind", ["nystrom", "complex_posterior"])
def test_nystrom_and_complex_posterior_operators_mask_too(kind, num_data):
    """A Nyström root Φ = K·L⁻ᵀ keeps its factors when rows are dropped; the complex-feature GP's evidence and
    posterior are those of the complex GP observed at the remaining points."""
    x, y, x_test = _data(num_data)
    missing = [1, 4]
    keep = torch.ones(num_data, dtype=torch.bool)
    keep[missing] = False

    def model_for(inputs, targets):
        if kind == "nystrom":
            kernel = NystromKernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), x[:20].clone())
        else:
            kernel = gpytorch.kernels.ScaleKernel(
                SketchedPolynomialKernel(2, 32, weights="complex", complex_posterior=True, seed=0))
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(F64)
        model = _GP(inputs, targets, likelihood, kernel.to(F64)).to(F64)
        likelihood.noise = 0.05
        return model, likelihood

    model, likelihood = model_for(x, _with_nan(y, missing))
    subset, subset_likelihood = model_for(x[keep], y[keep])
    value, grads = _mll_and_grads(model, likelihood, x, _with_nan(y, missing), "mask")
    ref_value, ref_grads = _mll_and_grads(subset, subset_likelihood, x[keep], y[keep])
    torch.testing.assert_close(value, ref_value, rtol=1e-10, atol=1e-10)
    for name in grads:
        torch.testing.assert_close(grads[name], ref_grads[name], rtol=1e-9, atol=1e-9, msg=name)
    mean, covar = _posterior(model, x_test, "mask")
    ref_mean, ref_covar = _posterior(subset, x_test)
    torch.testing.assert_close(mean, ref_mean, **TOL)
    torch.testing.assert_close(covar, ref_covar, **TOL)
