"""Kriging workflows as a geostatistician first runs them: Matérn kernels with a nugget on scattered sites,
universal kriging, cross-validation, variance maps and conditional simulation (synthetic Gaussian random fields)."""

import warnings

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, ScaleKernel

import rfgp
from rfgp.inference.leave_one_out import leave_one_out_predictions

F64 = torch.float64


def _matern_field(n: int, nu: float = 1.5, lengthscale: float = 2.0, sill: float = 1.5, nugget: float = 0.1,
                  extent: float = 10.0, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A Matérn random field with a nugget, sampled exactly (float64 Cholesky) at n uniform sites of a square."""
    generator = torch.Generator().manual_seed(seed)
    x = extent * torch.rand(n, 2, generator=generator, dtype=F64)
    kernel = MaternKernel(nu=nu).to(F64)
    kernel.lengthscale = lengthscale
    with torch.no_grad():
        covariance = sill * kernel(x).to_dense() + 1e-8 * torch.eye(n, dtype=F64)
    field = torch.linalg.cholesky(covariance) @ torch.randn(n, generator=generator, dtype=F64)
    return x, field + nugget**0.5 * torch.randn(n, generator=generator, dtype=F64)


def _kriging_model(x, y, kernel, lengthscale=2.0, sill=1.5, nugget=0.1):
    """Ordinary kriging with known parameters: a constant mean (0), ScaleKernel(Matérn) and a Gaussian nugget."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = rfgp.models.ExactGPModel(x, y, likelihood, kernel).to(F64)
    model.covar_module.base_kernel.lengthscale = lengthscale
    model.covar_module.outputscale = sill
    likelihood.noise = nugget
    return model


def test_leave_one_out_cross_validation_of_a_kriging_model():
    """Kriging cross-validation as documented: leave_one_out_predictions on the lazily evaluated prior covariance
    of likelihood(model(train_x)).  Before, it took only the evaluated operator (an AttributeError,
    'LazyEvaluatedKernelTensor' object has no attribute 'feature_statistics'), and the posterior covariance of a
    model in eval mode or an exact kernel's covariance got the same error, or another, not a refusal by name."""
    x, y = _matern_field(300)
    model = _kriging_model(x, y, rfgp.sketch(ScaleKernel(MaternKernel(nu=1.5)), 256, seed=0))
    model.train()
    prior = model.likelihood(model(x))
    loo_mean, loo_variance = leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)
    # against the dense formula of the same (sketched) covariance, R&W Eqs. 5.12–5.13
    inverse = torch.linalg.inv(prior.lazy_covariance_matrix.to_dense())
    dense_variance = inverse.diagonal().reciprocal()
    torch.testing.assert_close(loo_variance, dense_variance, rtol=1e-9, atol=0)
    torch.testing.assert_close(loo_mean, y - (inverse @ (y - prior.mean)) * dense_variance, rtol=0, atol=1e-9)
    model.eval()
    with torch.no_grad():
        posterior = model.likelihood(model(x))
    with pytest.raises(TypeError, match=r"covar must be a noise-added rfgp feature covariance.*model.forward\(train_x\)"
                       r".*got .*posterior covariance \(model\(train_x\) in eval mode\)"):
        leave_one_out_predictions(posterior.lazy_covariance_matrix, y, posterior.mean)
    exact = _kriging_model(x, y, ScaleKernel(MaternKernel(nu=1.5)))
    exact.train()
    prior = exact.likelihood(exact(x))
    with pytest.raises(TypeError, match=r"covar must be .* got \w+"):
        leave_one_out_predictions(prior.lazy_covariance_matrix, y, prior.mean)


def test_kriging_variance_far_from_the_sites_reverts_to_the_sill_with_nystrom_not_with_fourier_features():
    """The documented limit (guide/gpytorch.md, kriging with Matérn sketches): a random-feature posterior is that of
    a degenerate GP whose F weights the data pin down everywhere at once, so its kriging variance is too small near
    the sites and, 40 ranges away from any site, neither its variance reverts to the sill nor its mean to the
    trend: ORF (F = 128, N = 400) gives 0.90–1.03 for a sill of 1.5 and means 1.2 off.  Nyström (M = 128) carries
    k(x, x) − ‖Φ(x)‖² (FITC-style) and Φ(x) → 0 away from its landmarks, so it gives the sill and the mean exactly,
    as the exact GP does."""
    x, y = _matern_field(400)
    generator = torch.Generator().manual_seed(1)
    near = x[:100] + 0.05
    far = 40 + 10 * torch.rand(50, 2, generator=generator, dtype=F64)
    test_x = torch.cat([near, far])
    kernels = {
        "exact": ScaleKernel(MaternKernel(nu=1.5)),
        "orf": rfgp.sketch(ScaleKernel(MaternKernel(nu=1.5)), 128, method="orf", seed=0),
        "nystrom": rfgp.sketch(ScaleKernel(MaternKernel(nu=1.5)), 128, method="nystrom", x_sample=x, seed=0),
    }
    posteriors = {}
    for name, kernel in kernels.items():
        model = _kriging_model(x, y, kernel)
        model.mean_module.constant.data.fill_(0.3)
        model.eval()
        with torch.no_grad():
            posteriors[name] = model(test_x)
    sill, trend = torch.full((50,), 1.5, dtype=F64), torch.full((50,), 0.3, dtype=F64)
    for name in ("exact", "nystrom"):
        torch.testing.assert_close(posteriors[name].variance[100:], sill, rtol=1e-9, atol=0)
        torch.testing.assert_close(posteriors[name].mean[100:], trend, rtol=0, atol=1e-9)
    fourier = posteriors["orf"]
    assert fourier.variance[100:].max() < 0.95 * 1.5
    assert (fourier.mean[100:] - 0.3).abs().max() > 0.5
    assert fourier.variance[:100].mean() < 0.5 * posteriors["exact"].variance[:100].mean()


def test_fit_mll_warns_when_an_exact_kriging_model_starts_far_below_the_site_spacing():
    """Sites in metres at GPyTorch's initial lengthscale 0.69 m.  rfgp's maps were checked, the exact model's
    kernel not: on R's volcano (10 m cells, 1 000 training cells) the exact Matérn-3/2 GP trained by fit_mll
    "converged" to a white-noise model (test RMSE 25.9 m, the targets' spread) without a word, while ORF from the
    same start was warned.  The check finds exact kernels through sums, products and active_dims; not inside rfgp's
    kernels (whose maps are checked as before); the advice silences it."""
    x, y = _matern_field(200, extent=10.0)
    metres = 1000.0 * x
    space_time = torch.cat([metres, torch.rand(200, 1, generator=torch.Generator().manual_seed(3), dtype=F64)], -1)
    trees = {
        "ScaleKernel(Matern)": (metres, ScaleKernel(MaternKernel(nu=1.5))),
        "trend + Matern": (metres, gpytorch.kernels.LinearKernel() + ScaleKernel(MaternKernel(nu=2.5))),
        "space x time": (space_time, ScaleKernel(MaternKernel(nu=1.5, active_dims=[0, 1])
                                                 * gpytorch.kernels.RBFKernel(active_dims=[2]))),
    }
    for name, (inputs, kernel) in trees.items():
        model = rfgp.models.ExactGPModel(inputs, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(F64)
        message = r"inputs of MaternKernel lie a median [\d.e+]+ lengthscales apart.*white-noise model"
        with pytest.warns(rfgp.DataScaleWarning, match=message) as record:
            rfgp.fit_mll(model, num_iterations=1, progress=False)
        # the time column (unit range) is on its lengthscale's scale: only the spatial factor is reported
        assert sum("DataScaleWarning" in type(w.message).__name__ for w in record) == 1, name
    sketched = rfgp.sketch(ScaleKernel(MaternKernel(nu=1.5)), 64, seed=0)
    model = rfgp.models.ExactGPModel(metres, y, gpytorch.likelihoods.GaussianLikelihood(), sketched).to(F64)
    with pytest.warns(rfgp.DataScaleWarning) as record:
        rfgp.fit_mll(model, num_iterations=1, progress=False)
    assert [str(w.message).split(" lie")[0] for w in record if w.category is rfgp.DataScaleWarning] == [
        "fit_mll: the training inputs of SketchedMaternKernel"]
    kernel = ScaleKernel(MaternKernel(nu=1.5))
    kernel.base_kernel.lengthscale = 2000.0  # a range on the data's scale
    model = rfgp.models.ExactGPModel(metres, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(F64)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=1, progress=False)


def test_fit_mll_refuses_a_field_sampled_with_the_autograd_graph_attached():
    """A synthetic field sampled through a GPyTorch kernel outside torch.no_grad() carries the kernel's autograd
    graph.  Before, fit_mll's second step failed inside autograd with "Trying to backward through the graph a second
    time" (for the exact model and rfgp's alike); now the data are refused by name before training, and the model's
    parameters are untouched."""
    generator = torch.Generator().manual_seed(0)
    x = 10 * torch.rand(100, 2, generator=generator, dtype=F64)
    kernel = MaternKernel(nu=1.5).to(F64)
    covariance = 1.5 * kernel(x).to_dense() + 1e-8 * torch.eye(100, dtype=F64)  # no torch.no_grad(): a graph
    y = torch.linalg.cholesky(covariance) @ torch.randn(100, generator=generator, dtype=F64)
    assert y.grad_fn is not None
    for converted in (False, True):
        model_kernel = ScaleKernel(MaternKernel(nu=1.5))
        model_kernel = rfgp.sketch(model_kernel, 64, seed=0) if converted else model_kernel
        model = _kriging_model(x, y, model_kernel)
        before = {name: value.clone() for name, value in model.state_dict().items()}
        with pytest.raises(ValueError, match=r"model.train_targets carries an autograd graph .*detach"):
            rfgp.fit_mll(model, num_iterations=3, progress=False)
        assert all(torch.equal(before[name], value) for name, value in model.state_dict().items())
        model.set_train_data(inputs=x.requires_grad_(True) * 1.0, targets=y.detach(), strict=False)
        with pytest.raises(ValueError, match=r"model.train_inputs\[0\] carries an autograd graph"):
            rfgp.fit_mll(model, num_iterations=3, progress=False)
        x = x.detach()
        model.set_train_data(inputs=x, targets=y.detach(), strict=False)
        rfgp.fit_mll(model, num_iterations=3, progress=False)  # detached: trains


def test_space_time_kriging_trains_small_predicts_big_and_round_trips_through_state_dict():
    """Matérn-3/2 (space, ARD) × Matérn-½ (time) via active_dims, trained at F = 128, re-drawn at 512 (the time
    factor's anchor re-set), saved and loaded into a model built with another seed after widening it the same way:
    the same kriging mean and variance bit for bit; a model not widened is refused by name, not loaded."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(150, 3, generator=generator, dtype=F64) * torch.tensor([10.0, 10.0, 4.0], dtype=F64)
    y = torch.sin(x[:, 0] / 2) + torch.cos(x[:, 2]) + 0.1 * torch.randn(150, generator=generator, dtype=F64)
    test_x = torch.rand(40, 3, generator=generator, dtype=F64) * torch.tensor([10.0, 10.0, 4.0], dtype=F64)

    def model(seed):
        tree = ScaleKernel(MaternKernel(nu=1.5, ard_num_dims=2, active_dims=[0, 1])
                           * MaternKernel(nu=0.5, active_dims=[2]))
        kernel = rfgp.sketch(tree, 128, seed=seed)
        return rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(F64)

    trained = model(0)
    rfgp.fit_mll(trained, num_iterations=10, progress=False)
    rfgp.set_num_features(trained, 512)
    trained.eval()
    with torch.no_grad():
        posterior = trained(test_x)
    state = trained.state_dict()
    with pytest.raises(ValueError, match=r"cannot load state: .* is \d+ in the state dict but \d+ in this module"):
        model(5).load_state_dict(state)
    loaded = model(5)
    rfgp.set_num_features(loaded, 512)
    loaded.load_state_dict(state)
    loaded.eval()
    with torch.no_grad():
        again = loaded(test_x)
    assert torch.equal(again.mean, posterior.mean) and torch.equal(again.variance, posterior.variance)
