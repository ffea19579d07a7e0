"""Streaming updates of the feature statistics equal a refit on all data."""

import gpytorch
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel
from rfgp.streaming import StreamingFeatureGP, fit_from_batches

DIM = 2


def _model(x, y, seed=0):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(48, ard_num_dims=DIM, seed=seed))
    kernel.outputscale = 1.3
    kernel.base_kernel.lengthscale = torch.tensor([0.7, 1.2])
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.05
    model = ExactGPModel(x, y, likelihood, kernel).double()
    model.mean_module.constant.data.fill_(0.4)
    return model.eval()


def _data(n=240):
    gen = torch.Generator().manual_seed(3)
    x = torch.rand(n, DIM, generator=gen, dtype=torch.float64) * 4
    y = torch.sin(x[:, 0]) * torch.cos(x[:, 1]) + 0.2 * torch.randn(n, generator=gen, dtype=torch.float64)
    return x, y


def test_streaming_equals_refit():
    x, y = _data()
    x_test = torch.rand(9, DIM, dtype=torch.float64) * 4
    model = _model(x, y)
    with torch.no_grad():
        reference = model.likelihood(model(x_test))
        model.train()
        reference_mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)(model(x), y) * len(y)
        model.eval()
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module)
    loader = DataLoader(TensorDataset(x, y), batch_size=70)  # 4 uneven batches
    fit_from_batches(streaming, loader, progress=False)
    assert streaming.num_data == len(y)
    with torch.no_grad():
        prediction = streaming.likelihood(streaming(x_test))
    torch.testing.assert_close(prediction.mean, reference.mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(prediction.covariance_matrix, reference.covariance_matrix, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(streaming.log_marginal_likelihood(), reference_mll.detach(), rtol=1e-10, atol=1e-9)


def test_update_absorbs_new_data_without_old_data():
    x, y = _data()
    model = _model(x, y)
    first = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x[:100], y[:100])
    x_test = torch.rand(5, DIM, dtype=torch.float64)
    with torch.no_grad():
        before = first(x_test).mean
        first.update(x[100:], y[100:])
        after = first(x_test).mean
        full = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x, y)(x_test).mean
    assert (after - before).abs().max() > 1e-3  # the new batch changed the posterior (cache refreshed)
    torch.testing.assert_close(after, full, rtol=1e-10, atol=1e-12)


def test_state_dict_round_trip():
    x, y = _data()
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x, y)
    other = _model(x[:3], y[:3], seed=7)
    fresh = StreamingFeatureGP(other.covar_module, other.likelihood, other.mean_module)
    fresh.load_state_dict(streaming.state_dict())
    x_test = torch.rand(6, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(fresh(x_test).mean, streaming(x_test).mean)
        assert torch.equal(fresh(x_test).variance, streaming(x_test).variance)


def test_bad_input():
    x, y = _data(10)
    model = _model(x, y)
    with pytest.raises(TypeError, match="covar_module"):
        StreamingFeatureGP(gpytorch.kernels.RBFKernel(), model.likelihood)
    with pytest.raises(TypeError, match="likelihood"):
        StreamingFeatureGP(model.covar_module, gpytorch.likelihoods.BernoulliLikelihood())
    gp = StreamingFeatureGP(model.covar_module, model.likelihood)
    with pytest.raises(ValueError, match="y must have shape"):
        gp.update(x, y[:-1])
    with pytest.raises(RuntimeError, match="no data"):
        gp(x)
    with pytest.raises(ValueError, match="pair"):
        fit_from_batches(gp, [x], progress=False)
