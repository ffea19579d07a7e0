"""GPRegressor: scikit-learn's regressor contract on rfgp's random-feature GP regression."""

import pickle
import warnings

import gpytorch
import numpy as np
import pytest
import torch

import rfgp
from rfgp.models import DirichletGPClassifier, GPRegressor


def _wave(num_points=260, seed=0, noise=0.1):
    """y = 3 + 2·sin(2x₁)·x₂ + noise on [−2, 2]²: a smooth surface with an offset and a scale to normalise."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(-2, 2, (num_points, 2))
    return x, 3 + 2 * np.sin(2 * x[:, 0]) * x[:, 1] + noise * rng.standard_normal(num_points)


def _exact_twin(reg: GPRegressor) -> gpytorch.models.ExactGP:
    """GPyTorch's exact GP with the fitted regressor's hyperparameters, on its standardised training data."""
    model = reg.model_
    train_x, train_y = model.train_inputs[0], model.train_targets
    twin = rfgp.models.ExactGPModel(train_x, train_y, gpytorch.likelihoods.GaussianLikelihood(),
                                    gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))).double()
    with torch.no_grad():
        twin.covar_module.outputscale = model.covar_module.outputscale
        twin.covar_module.base_kernel.lengthscale = model.covar_module.base_kernel.base_kernel.lengthscale
        twin.likelihood.noise = model.likelihood.noise
        twin.mean_module.constant.copy_(model.mean_module.constant)
    return twin.eval()


def test_nystrom_with_every_point_a_landmark_predicts_as_the_exact_gp():
    # the Nyström kernel with all N training points as landmarks is the exact kernel on them, so the regressor's
    # predictions (inputs standardised, targets normalised and transformed back) are GPyTorch's exact GP's
    x, y = _wave(80)
    train_x, train_y, test_x, test_y = x[:60], y[:60], x[60:], y[60:]
    kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2)), 60,
                         method="nystrom", x_sample=torch.as_tensor(train_x), seed=0)
    reg = GPRegressor(kernel=kernel, num_iterations=10, standardize=True, dtype=torch.float64,
                      progress=False).fit(train_x, train_y)
    twin = _exact_twin(reg)
    with torch.no_grad():
        latent = twin((torch.as_tensor(test_x) - reg.input_mean_) / reg.input_scale_)
        noisy = twin.likelihood(latent)
    scale, shift = float(reg.y_scale_), float(reg.y_mean_)  # one output
    mean, std = reg.predict(test_x, return_std=True)
    np.testing.assert_allclose(mean, latent.mean.numpy() * scale + shift, atol=1e-4)
    np.testing.assert_allclose(std, latent.variance.sqrt().numpy() * scale, atol=1e-4)
    _, cov = reg.predict(test_x[:5], return_cov=True)
    np.testing.assert_allclose(cov, latent.covariance_matrix[:5, :5].numpy() * scale**2, atol=1e-4)
    exact_density = torch.distributions.Normal(noisy.mean * scale + shift, noisy.variance.sqrt() * scale)
    np.testing.assert_allclose(reg.log_predictive_density(test_x, test_y),
                               exact_density.log_prob(torch.as_tensor(test_y)).numpy(), atol=1e-4)
    assert reg.noise_ == pytest.approx(float(twin.likelihood.noise.detach()) * scale**2)
    # the check can fail: the untrained hyperparameters give other predictions
    untrained = GPRegressor(kernel=kernel, num_iterations=0, standardize=True, dtype=torch.float64).fit(train_x,
                                                                                                  train_y)
    assert np.abs(untrained.predict(test_x) - mean).max() > 1e-2


def test_accuracy_near_scikit_learns_gaussian_process_regressor():
    # the default regressor (float32, 256 features trained, 1024 predicting) against scikit-learn's exact GP with an
    # ARD RBF kernel and a white noise, on 200 training and 300 test points (noise 0.1): the test RMSE within 10 % and
    # the NLPD within 0.1 nats of scikit-learn's.  Measured: RMSE 0.1126 against 0.1118, NLPD -0.760 against -0.766;
    # 4 features (the control) 0.88 and 1.30
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    x, y = _wave(500)
    train_x, train_y, test_x, test_y = x[:200], y[:200], x[200:], y[200:]
    reference = GaussianProcessRegressor(ConstantKernel() * RBF([1.0, 1.0]) + WhiteKernel(), normalize_y=True,
                                         random_state=0).fit(train_x, train_y)
    ref_mean, ref_std = reference.predict(test_x, return_std=True)  # WhiteKernel: noise included

    def metrics(mean, density):
        return np.sqrt(np.mean((mean - test_y) ** 2)), -np.mean(density)

    ref_density = -0.5 * (((test_y - ref_mean) / ref_std) ** 2 + np.log(2 * np.pi * ref_std**2))
    ref_rmse, ref_nlpd = metrics(ref_mean, ref_density)
    reg = GPRegressor(progress=False).fit(train_x, train_y)
    rmse, nlpd = metrics(reg.predict(test_x), reg.log_predictive_density(test_x, test_y))
    assert rmse < 1.1 * ref_rmse and nlpd < ref_nlpd + 0.1, (rmse, ref_rmse, nlpd, ref_nlpd)
    narrow = GPRegressor(num_features=4, progress=False).fit(train_x, train_y)  # the check can fail
    narrow_rmse, narrow_nlpd = metrics(narrow.predict(test_x), narrow.log_predictive_density(test_x, test_y))
    assert narrow_rmse > 1.1 * ref_rmse and narrow_nlpd > ref_nlpd + 0.1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fit_predict_shapes_and_dtypes(dtype):
    x, y = _wave()
    reg = GPRegressor(dtype=dtype, progress=False).fit(x[:200], y[:200])
    mean, std = reg.predict(x[200:], return_std=True)
    numpy_dtype = np.float32 if dtype == torch.float32 else np.float64
    assert mean.shape == std.shape == (60,) and mean.dtype == std.dtype == numpy_dtype
    assert reg.score(x[200:], y[200:]) > 0.98 and bool((std > 0).all())
    assert isinstance(reg.losses_, rfgp.training.TrainingHistory) and reg.losses_[-1] < reg.losses_[0]
    assert (reg.train_num_features_, reg.num_features_) == (256, 1024)  # the classifier's widths
    assert reg.model_.covar_module.base_kernel.num_features == 1024
    assert reg.model_.covar_module.base_kernel.lengthscale.shape == (1, 2)  # ARD
    tensor_mean = reg.predict(torch.as_tensor(x[200:]))
    assert torch.is_tensor(tensor_mean) and tensor_mean.dtype == dtype
    np.testing.assert_array_equal(tensor_mean.numpy(), mean)
    cov = reg.predict(x[200:210], return_cov=True)[1]
    assert cov.shape == (10, 10)
    np.testing.assert_allclose(np.sqrt(np.diag(cov)), std[:10], rtol=1e-3 if dtype == torch.float32 else 1e-9)
    with pytest.raises(RuntimeError, match="at most one of return_std and return_cov"):
        reg.predict(x[:3], return_std=True, return_cov=True)


def test_float32_predicts_as_float64():
    x, y = _wave()
    single, double = (GPRegressor(dtype=dtype, progress=False).fit(x[:200], y[:200])
                      for dtype in (torch.float32, torch.float64))
    np.testing.assert_allclose(single.predict(x[200:]), double.predict(x[200:]), atol=0.02)


def test_float32_normalises_targets_with_a_large_offset_before_rounding_them():
    """y ≈ 10⁷ ± 1 went to float32 before its normalisation, which rounded it to whole numbers: the float32 fit's
    noise was 0.044 where the float64 fit's is 0.0022 (the noise of the data, 0.05²).  Now the targets are
    normalised in float64 and only the predictions in the units of y are rounded to float32, which is warned about."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 4, (300, 1))
    y = 1e7 + np.sin(2 * x[:, 0]) + 0.05 * rng.standard_normal(300)
    double = GPRegressor(dtype="float64", num_iterations=50, progress=False).fit(x, y)
    with pytest.warns(UserWarning, match=r"y \(column 0\) has the mean 1e\+07 against a standard deviation of 0.69.*"
                                         r"rounds the predictions in the units of y by up to 0.596.*dtype='float64'"):
        single = GPRegressor(num_iterations=50, progress=False).fit(x, y)
    np.testing.assert_allclose(single.noise_, double.noise_, rtol=0.05)
    assert np.abs(single.predict(x) - double.predict(x)).max() <= 0.5 + 0.05  # float32's spacing at 10⁷ is 1
    np.testing.assert_allclose(single.log_predictive_density(x, y), double.log_predictive_density(x, y), atol=0.05)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning where float32 holds the targets' digits
        GPRegressor(num_iterations=0).fit(x, y - 1e7 + 300)
        GPRegressor(num_iterations=0).fit(x, np.full(300, 1e5))  # constant: no spread to lose (it was "std 1")


def test_a_fit_that_explains_the_targets_as_noise_warns():
    """sin(20x) on x in [0, 10] (400 points, noise 0.1): from the median-heuristic lengthscale the marginal likelihood
    ended silently at its trivial optimum, all noise (outputscale 9e-6, noise ≈ var y, R² 0.00), where a start at a
    hundredth of that lengthscale reaches noise 0.02 and R² 0.98.  The fit now says so, with the leave-one-out
    numbers; a fit that explains part of the variance does not warn."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (400, 1))
    y = np.sin(20 * x[:, 0]) + 0.1 * rng.standard_normal(400)
    with pytest.warns(rfgp.models.classifier_check.DegenerateFitWarning,
                      match=r"GPRegressor: the trained model predicts its training targets, each left out in turn.*"
                            r"explains no more of the targets than noise does \(outputscale .*If y is not noise"):
        reg = GPRegressor(dtype="float64", progress=False).fit(x, y)
    assert reg.score(x, y) < 0.01 and reg.leave_one_out_nll_ > reg.constant_mean_nll_ - 0.01
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.models.classifier_check.DegenerateFitWarning)
        weak = GPRegressor(dtype="float64", progress=False).fit(x, 0.1 * np.sin(x[:, 0]) + 0.1 * y)
    assert weak.leave_one_out_nll_ < weak.constant_mean_nll_ - 0.01
    two = GPRegressor(dtype="float64", num_iterations=20, progress=False)
    with pytest.warns(rfgp.models.classifier_check.DegenerateFitWarning, match=r"model \(outputs \[1\]\)"):
        two.fit(x, np.c_[np.sin(x[:, 0]), rng.standard_normal(400)])  # the second output is noise
    assert two.leave_one_out_nll_.shape == (2,)


def test_a_constant_target_is_no_degenerate_fit():
    """A constant target column (leave-one-out baseline variance 0) was warned about as a fit that explains no more
    than noise, with advice for a missed signal (restarts, shorter lengthscales); alone or beside a real output."""
    x, y = _wave(60)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)  # fit_mll's restarts: not the point
        warnings.simplefilter("error", rfgp.models.classifier_check.DegenerateFitWarning)
        both = GPRegressor(num_features=64, num_iterations=30, progress=False).fit(x, np.c_[y, np.full(60, 2.0)])
        alone = GPRegressor(num_features=64, num_iterations=10, progress=False).fit(x, np.full(60, 2.0))
    np.testing.assert_allclose(both.predict(x[:5])[:, 1], 2.0, rtol=1e-6)
    np.testing.assert_allclose(alone.predict(x[:5]), 2.0, rtol=1e-6)


def _degenerate_wave():
    """sin(20x) on x in [0, 10] (400 points, noise 0.1): from the median-heuristic lengthscale the marginal likelihood
    ends at its all-noise optimum."""
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 10, (400, 1))
    return x, np.sin(20 * x[:, 0]) + 0.1 * rng.standard_normal(400)


def test_restarts_escape_the_all_noise_optimum_and_keep_the_best():
    """scikit-learn's n_restarts_optimizer: the default start ends at the all-noise optimum (R² 0.00, with a
    DegenerateFitWarning and no other warning: its message read a tensor that required grad); restarts from random
    lengthscales and noises find the wave (R² 0.98), the best final loss is kept, the fit repeats bit for bit, and
    the discarded fits' warnings are not shown."""
    x, y = _degenerate_wave()
    settings = dict(dtype="float64", progress=False, train_num_features=64, num_iterations=30)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        single = GPRegressor(**settings).fit(x, y)
    assert [m.category for m in caught] == [rfgp.models.classifier_check.DegenerateFitWarning]
    assert single.score(x, y) < 0.01 and single.restart_losses_ == [single.losses_[-1]]
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.models.classifier_check.DegenerateFitWarning)
        reg = GPRegressor(n_restarts_optimizer=4, **settings).fit(x, y)
    assert reg.score(x, y) > 0.95
    assert len(reg.restart_losses_) == 5 and reg.restart_losses_[0] == single.restart_losses_[0]
    assert reg.losses_[-1] == min(reg.restart_losses_) < reg.restart_losses_[0] - 1
    again = GPRegressor(n_restarts_optimizer=4, **settings).fit(x, y)
    assert again.restart_losses_ == reg.restart_losses_
    assert torch.equal(again.predict(torch.as_tensor(x[:50])), reg.predict(torch.as_tensor(x[:50])))


def test_a_restart_that_fails_is_skipped_by_name(monkeypatch):
    """A random start whose covariance is not positive definite is recorded as NaN with a NumericalWarning; the fit
    goes on with the other starts."""
    import rfgp.models.estimator as estimator

    from .._models import fit_mll_failing_at

    failing_second, calls = fit_mll_failing_at(2)
    monkeypatch.setattr(estimator, "fit_mll", failing_second)
    x, y = _wave(80)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning,
                      match=r"restart 1 of n_restarts_optimizer=2 failed and is skipped \(NotPSDError: Matrix not"):
        reg = GPRegressor(n_restarts_optimizer=2, num_iterations=5, progress=False).fit(x, y)
    assert len(calls) == 3 and np.isnan(reg.restart_losses_[1]) and not np.isnan(reg.restart_losses_[2])


@pytest.mark.parametrize("value, error, match", [
    (-1, ValueError, r"n_restarts_optimizer must be a non-negative integer, got -1"),
    (1.5, TypeError, r"n_restarts_optimizer must be a non-negative integer, got 1.5 of type float"),
    (True, TypeError, r"n_restarts_optimizer must be a non-negative integer, got True of type bool"),
])
def test_restarts_are_checked(value, error, match):
    x, y = _wave(40)
    with pytest.raises(error, match=match):
        GPRegressor(n_restarts_optimizer=value).fit(x, y)
    with pytest.raises(ValueError, match=r"n_restarts_optimizer=2 restarts .* but num_iterations=0 does not optimise"):
        GPRegressor(n_restarts_optimizer=2, num_iterations=0).fit(x, y)


def test_random_start_moves_lengthscales_and_noise_only_and_inside_their_constraints():
    from rfgp.models.random_start import draw_random_start

    x = torch.rand(30, 3, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(rfgp.sketch(gpytorch.kernels.RBFKernel(
        ard_num_dims=3, lengthscale_constraint=gpytorch.constraints.Interval(0.5, 2.0)), 64))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = rfgp.models.ExactGPModel(x, x.sum(-1), likelihood, kernel).double()
    before = {name: value.clone() for name, value in model.state_dict().items()}
    with torch.no_grad():
        for seed in range(20):
            model.load_state_dict(before)
            draw_random_start(model, torch.Generator().manual_seed(seed), 4.0)
            lengthscale = kernel.base_kernel.lengthscale
            assert ((lengthscale > 0.5) & (lengthscale < 2.0)).all()
            assert 4e-3 * (1 - 1e-9) <= likelihood.noise.item() <= 4.0
        draw_random_start(model, torch.Generator().manual_seed(0), 4.0)
        assert len(set(kernel.base_kernel.lengthscale.flatten().tolist())) == 3  # ARD entries drawn independently
    changed = {name for name, value in model.state_dict().items() if not torch.equal(value, before[name])}
    assert changed == {"covar_module.base_kernel.raw_lengthscale", "likelihood.noise_covar.raw_noise"}


def test_kernel_and_log_marginal_likelihood_value_as_scikit_learn():
    """scikit-learn's ``kernel_`` and ``log_marginal_likelihood_value_`` (read by most of its GP examples): the fitted
    kernel, and the exact log marginal likelihood of the normalised targets under the fitted model at its prediction
    width, summed over outputs; before fit, a NotFittedError that hasattr treats as absent."""
    x, y = _wave(120)
    reg = GPRegressor(dtype="float64", num_iterations=10, progress=False)
    assert not hasattr(reg, "kernel_") and not hasattr(reg, "log_marginal_likelihood_value_")
    reg.fit(x, np.c_[y, np.cos(x[:, 0])])
    assert reg.kernel_ is reg.model_.covar_module
    model, noise = reg.model_, reg.likelihood_.noise.detach()
    train_x, targets = model.train_inputs[0], model.train_targets  # (2, 120) normalised targets
    with torch.no_grad():
        covariance = reg.kernel_(train_x).to_dense() + noise * torch.eye(120, dtype=torch.float64)
        dense = torch.distributions.MultivariateNormal(model.mean_module(train_x), covariance).log_prob(targets).sum()
    assert reg.log_marginal_likelihood_value_ == pytest.approx(float(dense), rel=1e-9)
    same_width = GPRegressor(dtype="float64", num_iterations=10, num_features=256, progress=False).fit(x, y)
    assert same_width.log_marginal_likelihood_value_ == pytest.approx(-120 * same_width.losses_[-1], rel=1e-9)


def test_log_marginal_likelihood_value_follows_changes_to_the_fitted_model():
    """The value was kept from its first reading: after rfgp.set_num_features(reg.model_, F) (the widening the
    estimators' messages suggest), a changed hyperparameter or new training data it was the value of the model
    before."""
    x, y = _wave(120)
    reg = GPRegressor(num_features=64, num_iterations=5, dtype=torch.float64, progress=False).fit(x, y)

    @torch.no_grad()
    def dense():
        model = reg.model_
        prior = reg.likelihood_(model.forward(model.train_inputs[0]))
        return float(torch.distributions.MultivariateNormal(prior.mean, prior.covariance_matrix).log_prob(
            model.train_targets))

    first = reg.log_marginal_likelihood_value_
    assert reg.log_marginal_likelihood_value_ == first
    rfgp.set_num_features(reg.model_, 512)
    assert reg.log_marginal_likelihood_value_ != first
    assert reg.log_marginal_likelihood_value_ == pytest.approx(dense(), rel=1e-9)
    with torch.no_grad():
        reg.likelihood_.noise = 0.5
    assert reg.log_marginal_likelihood_value_ == pytest.approx(dense(), rel=1e-9)
    model = reg.model_
    model.set_train_data(model.train_inputs[0][:60], model.train_targets[:60], strict=False)
    assert reg.log_marginal_likelihood_value_ == pytest.approx(dense(), rel=1e-9)
    with torch.no_grad():
        model.train_targets.mul_(2.0)  # in place
    assert reg.log_marginal_likelihood_value_ == pytest.approx(dense(), rel=1e-9)
    restored = pickle.loads(pickle.dumps(reg))
    assert restored.log_marginal_likelihood_value_ == reg.log_marginal_likelihood_value_


def test_log_marginal_likelihood_value_of_a_float32_regressor_is_its_models_in_float64():
    """A float32 regressor's value is that of its float32 hyperparameters and features, evaluated in float64, to
    float32's rounding of the statistics."""
    x, y = _wave(120)
    reg = GPRegressor(num_iterations=10, progress=False).fit(x, y)
    model = reg.model_
    train_x, targets = model.train_inputs[0], model.train_targets.double()
    with torch.no_grad():
        covariance = (reg.kernel_(train_x).to_dense().double()
                      + reg.likelihood_.noise.detach().double() * torch.eye(120, dtype=torch.float64))
        mean = model.mean_module(train_x).double()
        dense = torch.distributions.MultivariateNormal(mean, covariance).log_prob(targets)
    assert reg.log_marginal_likelihood_value_ == pytest.approx(float(dense), rel=1e-4, abs=1e-2)


def test_log_marginal_likelihood_value_is_exact_for_an_exact_kernel_above_max_cholesky_size():
    """Above GPyTorch's max_cholesky_size (800) an exact kernel's log_prob is a stochastic Lanczos estimate: the value
    was 438.5 where the dense Gaussian gives 402.6 at N = 900."""
    x, y = _wave(900)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    reg = GPRegressor(kernel=kernel, dtype="float64", num_iterations=1, progress=False).fit(x, y)
    train_x, targets = reg.model_.train_inputs[0], reg.model_.train_targets
    with torch.no_grad():
        covariance = reg.kernel_(train_x).to_dense() + reg.likelihood_.noise * torch.eye(900, dtype=torch.float64)
        dense = torch.distributions.MultivariateNormal(reg.model_.mean_module(train_x), covariance).log_prob(targets)
    assert reg.log_marginal_likelihood_value_ == pytest.approx(float(dense), rel=1e-9)


def test_constant_mean_nll_is_the_leave_one_out_gaussian():
    from rfgp.models.regressor import constant_mean_nll

    targets = torch.tensor([[0.3, -1.2, 2.0, 0.7, -0.1]], dtype=torch.float64)
    expected = []
    for i in range(5):
        others = torch.cat([targets[0, :i], targets[0, i + 1:]])
        variance = others.var() * 5 / 4  # a new draw given the estimated mean: s²·(1 + 1/(N − 1))
        expected.append(-torch.distributions.Normal(others.mean(), variance.sqrt()).log_prob(targets[0, i]))
    torch.testing.assert_close(constant_mean_nll(targets), torch.stack(expected).mean().reshape(1))


def test_multiple_targets_are_independent_gps_sharing_the_kernel():
    # y of shape (N, 2) with the second column an affine map a·y + b of the first: normalised, the two targets are
    # ±the same, so each output's posterior is that affine map of the other's, through its own mean and scale
    x, y = _wave()
    targets = np.c_[y, -3.0 * y + 7.0]
    reg = GPRegressor(dtype=torch.float64, progress=False).fit(x[:200], targets[:200])
    mean, std = reg.predict(x[200:], return_std=True)
    assert mean.shape == std.shape == (60, 2) and reg.n_outputs_ == 2
    np.testing.assert_allclose(mean[:, 1], -3.0 * mean[:, 0] + 7.0, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(std[:, 1], 3.0 * std[:, 0], rtol=1e-6)
    assert reg.noise_.shape == (2,) and reg.noise_[1] == pytest.approx(9 * reg.noise_[0])
    assert reg.predict(x[200:205], return_cov=True)[1].shape == (5, 5, 2)
    assert reg.sample_y(x[200:205], 3).shape == (5, 2, 3)
    assert reg.log_predictive_density(x[200:], targets[200:]).shape == (60, 2)
    assert reg.score(x[200:], targets[200:]) > 0.98
    # each output is the single-output GP with the same hyperparameters
    model = reg.model_
    for t in range(2):
        single = rfgp.models.ExactGPModel(model.train_inputs[0], model.train_targets[t], model.likelihood,
                                          model.covar_module).eval()
        single.mean_module.constant.data = model.mean_module.constant.data[t]
        with torch.no_grad():
            x_test = (torch.as_tensor(x[200:]) - reg.input_mean_) / reg.input_scale_
            expected = single(x_test).mean * reg.y_scale_[t] + reg.y_mean_[t]
        np.testing.assert_allclose(mean[:, t], expected.numpy(), rtol=1e-9, atol=1e-9)
    # a column vector is one output with 1-D predictions (scikit-learn's rule), the model of y itself
    column = GPRegressor(dtype=torch.float64, progress=False).fit(x[:200], targets[:200, :1])
    plain = GPRegressor(dtype=torch.float64, progress=False).fit(x[:200], y[:200])
    np.testing.assert_array_equal(column.predict(x[200:]), plain.predict(x[200:]))


def test_sample_y_draws_the_posterior():
    # S posterior paths at M points: their mean and variance match predict's within 4 standard errors
    x, y = _wave()
    reg = GPRegressor(dtype=torch.float64, progress=False).fit(x[:200], y[:200])
    num = 4000
    samples = reg.sample_y(x[200:], num, random_state=1)
    mean, std = reg.predict(x[200:], return_std=True)
    assert samples.shape == (60, num)
    assert np.all(np.abs(samples.mean(-1) - mean) <= 4 * std / np.sqrt(num))
    assert np.all(np.abs(samples.var(-1) / std**2 - 1) <= 4 * np.sqrt(2 / num))
    np.testing.assert_array_equal(reg.sample_y(x[200:203], 2, random_state=5), reg.sample_y(x[200:203], 2, 5))
    assert not np.array_equal(reg.sample_y(x[200:203], 2, 5), reg.sample_y(x[200:203], 2, 6))
    rng_draws = reg.sample_y(x[200:203], 2, random_state=np.random.RandomState(0))
    assert rng_draws.shape == (3, 2)
    with pytest.raises(TypeError, match="random_state must be"):
        reg.sample_y(x[:3], 2, random_state="zero")
    with pytest.raises(ValueError, match="n_samples"):
        reg.sample_y(x[:3], 0)
    exact = GPRegressor(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), num_iterations=2,
                        progress=False).fit(x[:50], y[:50])
    with pytest.raises(TypeError, match="sample_y draws posterior functions by rfgp.sampling.posterior_paths"):
        exact.sample_y(x[:3])


def test_log_predictive_density_includes_the_noise():
    x, y = _wave()
    reg = GPRegressor(dtype=torch.float64, progress=False).fit(x[:200], y[:200])
    mean, std = reg.predict(x[200:], return_std=True)
    variance = std**2 + reg.noise_
    expected = -0.5 * ((y[200:] - mean) ** 2 / variance + np.log(2 * np.pi * variance))
    np.testing.assert_allclose(reg.log_predictive_density(x[200:], y[200:]), expected, rtol=1e-9)


def test_score_is_scikit_learns_r2():
    from sklearn.metrics import r2_score

    x, y = _wave()
    targets = np.c_[y, np.sin(x[:, 0])]
    reg = GPRegressor(num_iterations=5, progress=False).fit(x[:200], targets[:200])
    weights = np.random.default_rng(0).uniform(0, 2, 60)
    predicted = reg.predict(x[200:]).astype(np.float64)
    for w in (None, weights):
        assert reg.score(x[200:], targets[200:], sample_weight=w) == pytest.approx(
            r2_score(targets[200:], predicted, sample_weight=w), rel=1e-12)
    constant = GPRegressor(num_iterations=0).fit(x[:20], np.full(20, 2.0))  # scikit-learn's force_finite rule
    assert constant.score(x[:20], np.full(20, 2.0)) == r2_score(np.full(20, 2.0), constant.predict(x[:20]))


def test_score_refuses_one_row_and_weights_that_weigh_nothing():
    """R² of one row was 1 or 0 whatever the model (its targets' spread around their mean is 0; scikit-learn returns
    NaN); weights all 0 raised NumPy's ZeroDivisionError "Weights sum to zero", naming no argument, and negative
    weights gave a weighted "R²" of no meaning."""
    x, y = _wave()
    reg = GPRegressor(num_iterations=0, num_features=32).fit(x[:50], y[:50])
    with pytest.raises(ValueError, match="R² needs at least 2 samples"):
        reg.score(x[:1], y[:1])
    with pytest.raises(ValueError, match="sample_weight must hold at least one weight > 0, got 5 zeros"):
        reg.score(x[:5], y[:5], sample_weight=np.zeros(5))
    with pytest.raises(ValueError, match="sample_weight must be ≥ 0, got 1 negative weight.*-0.5 at index 2"):
        reg.score(x[:5], y[:5], sample_weight=[1, 1, -0.5, 1, 1])


@pytest.mark.parametrize("given, error, match", [
    ({"method": "fft"}, ValueError, "method"),
    ({"num_iterations": -1}, ValueError, "num_iterations must be a non-negative integer, got -1"),
    ({"num_iterations": 2.5}, TypeError, "num_iterations must be a non-negative integer, got 2.5 of type float"),
    ({"lr": 0.0}, ValueError, "lr"),
    ({"optimizer": "sgd"}, ValueError, "optimizer"),
    ({"time_budget": -2.0}, ValueError, "time_budget"),
    ({"normalize_y": "yes"}, TypeError, "normalize_y must be True or False, got 'yes'"),
    ({"standardize": None}, TypeError, "standardize must be True, False or 'auto', got None"),
    ({"dtype": torch.float16}, TypeError, "dtype"),
    ({"dtype": "half"}, TypeError, "dtype must be .float32., .float64."),
    ({"device": "tpu:7"}, ValueError, "device must be None, a torch.device or a device string.*'tpu:7'"),
    # torch's AssertionError "Torch not compiled with CUDA enabled" (or "invalid device ordinal") named no argument
    ({"device": "cuda:99"}, ValueError, "device 'cuda:99' is not available here"),
    ({"seed": 1.5}, TypeError, "seed must be an integer, got 1.5"),
    ({"seed": None}, TypeError, "seed must be an integer, got None: .* not from scikit-learn's random_state"),
    ({"num_features": 65}, ValueError, "num_features must be even.*got 65"),
    ({"train_num_features": 0}, ValueError, "train_num_features must be a positive"),
    ({"kernel": "rbf"}, TypeError, "kernel must be a gpytorch Kernel or None, got str"),
    ({"kernel": gpytorch.kernels.RBFKernel(), "train_num_features": 16}, ValueError,
     "train_num_features=16 sets the default kernel's training width"),
    # num_features was ignored: an exact kernel stayed exact, a sketched one kept its own width
    ({"kernel": gpytorch.kernels.RBFKernel(), "num_features": 512}, ValueError,
     r"num_features=512 sets the default kernel's width, but kernel=RBFKernel was given.*rfgp.sketch\(kernel, 512\)"),
    ({"kernel": rfgp.kernels.SketchedRBFKernel(16, seed=0), "num_features": 64}, ValueError,
     "num_features=64 sets the default kernel's width, but kernel=SketchedRBFKernel was given"),
])
def test_arguments_are_checked_by_fit_and_named(given, error, match):
    x, y = _wave(20)
    reg = GPRegressor(**given)  # stored as given (scikit-learn's contract)
    assert all(reg.get_params()[k] is v for k, v in given.items())
    with pytest.raises(error, match=match):
        reg.fit(x, y)


def test_data_errors_are_named():
    x, y = _wave(20)
    reg = GPRegressor(num_iterations=0)
    with pytest.raises(ValueError, match=r"y contains NaN or Inf entries \(1 NaN and 0 ±Inf of 20, the first at"):
        reg.fit(x, np.where(np.arange(20) == 3, np.nan, y))
    with pytest.raises(ValueError, match="y contains NaN or Inf entries .0 NaN and 1 ±Inf"):
        reg.fit(x, np.where(np.arange(20) == 3, np.inf, y))
    with pytest.raises(ValueError, match=r"X contains NaN or Inf entries \(2 NaN .* first at index \(3, 0\)\).*impute"):
        reg.fit(np.where(np.arange(20)[:, None] == 3, np.nan, x), y)
    with pytest.raises(ValueError, match=r"y must have shape \(20,\) or \(20, T\)"):
        reg.fit(x, y[:-1])
    with pytest.raises(ValueError, match=r"y must have shape \(20,\) or \(20, T\).*\(20, 1, 1\)"):
        reg.fit(x, y[:, None, None])
    with pytest.raises(ValueError, match="y must hold real numbers"):
        reg.fit(x, np.array(["a"] * 20))
    with pytest.raises(ValueError, match="Complex data not supported: y"):
        reg.fit(x, y + 1j)
    with pytest.raises(ValueError, match="y is None"):
        reg.fit(x, None)
    with pytest.raises((ValueError, AttributeError), match="this GPRegressor is not fitted yet"):
        GPRegressor().predict(x)
    reg.fit(x, y)
    with pytest.raises(ValueError, match="expecting 2 features"):
        reg.predict(x[:, :1])
    with pytest.raises(ValueError, match="y has 2 output column"):
        reg.log_predictive_density(x, np.c_[y, y])
    with pytest.raises(ValueError, match="sample_weight must have shape"):
        reg.score(x, y, sample_weight=np.ones(3))
    with pytest.raises(ValueError, match="sample_weight must be finite, got 1 NaN or Inf"):  # R² was NaN
        reg.score(x, y, sample_weight=np.where(np.arange(len(y)) == 0, np.inf, 1.0))


def test_fitted_model_round_trips_its_state():
    x, y = _wave()
    reg = GPRegressor(progress=False).fit(x[:200], y[:200])
    expected_mean, expected_std = reg.predict(x[200:], return_std=True)
    restored = pickle.loads(pickle.dumps(reg))
    np.testing.assert_array_equal(restored.predict(x[200:], return_std=True)[1], expected_std)
    fresh = GPRegressor(num_iterations=0).fit(x[:200], y[:200])  # untrained, the same structure at F = 1024
    state = reg.model_.state_dict()
    fresh.model_.load_state_dict(state)
    assert all(torch.equal(state[k], v) for k, v in fresh.model_.state_dict().items())
    mean, std = fresh.predict(x[200:], return_std=True)
    np.testing.assert_array_equal(mean, expected_mean)
    np.testing.assert_array_equal(std, expected_std)
    np.testing.assert_array_equal(fresh.sample_y(x[200:], 3), reg.sample_y(x[200:], 3))


def test_feature_names_follow_scikit_learn():
    pandas = pytest.importorskip("pandas")
    x, y = _wave(60)
    frame = pandas.DataFrame(x, columns=["a", "b"])
    reg = GPRegressor(num_iterations=2, progress=False).fit(frame, y)
    np.testing.assert_array_equal(reg.feature_names_in_, ["a", "b"])
    with pytest.raises(ValueError, match="the regressor was fitted on"):
        reg.predict(frame[["b", "a"]])
    with pytest.warns(UserWarning, match="does not have feature names, but the regressor was fitted with them"):
        np.testing.assert_array_equal(reg.predict(x), reg.predict(frame))
    assert not hasattr(GPRegressor(num_iterations=0).fit(x, y), "feature_names_in_")


def test_mixed_type_column_names_are_refused():
    """Column names of mixed types (as "a", 1) are refused as by scikit-learn (before: silently matched by position,
    so the same frame with its columns reordered predicted something else)."""
    pandas = pytest.importorskip("pandas")
    x, y = _wave(20)
    frame = pandas.DataFrame(x, columns=["a", 1])
    for estimator in (GPRegressor(num_iterations=0), rfgp.models.DirichletGPClassifier(num_iterations=0)):
        with pytest.raises(TypeError, match=r"X has column names of types \['int', 'str'\].*astype\(str\)"):
            estimator.fit(frame, (y > 0).astype(int))
    assert not hasattr(GPRegressor(num_iterations=0).fit(pandas.DataFrame(x), y), "feature_names_in_")  # all ints


def test_scikit_learn_estimator_contract():
    from sklearn.base import clone, is_regressor
    from sklearn.model_selection import GridSearchCV, KFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _wave(150)
    reg = GPRegressor(num_features=64, num_iterations=20, progress=False)
    copy = clone(reg)
    assert copy.get_params() == reg.get_params() and copy is not reg and is_regressor(reg)
    assert repr(copy) == "GPRegressor(num_features=64, num_iterations=20, progress=False)"
    folds = KFold(3, shuffle=True, random_state=0)
    scores = cross_val_score(make_pipeline(StandardScaler(), reg), x, y, cv=folds)
    assert scores.shape == (3,) and scores.min() > 0.9
    search = GridSearchCV(reg, {"num_features": [4, 64]}, cv=folds).fit(x, y)
    assert search.best_params_ == {"num_features": 64} and search.best_score_ > 0.9
    assert not hasattr(reg, "model_")  # clone copies the arguments, not the fit


def test_scikit_learn_estimator_checks():
    # every check passes but check_array_api_input, skipped (SCIPY_ARRAY_API unset: rfgp takes NumPy, pandas and
    # torch input, not the array API); check_parameters_default_constructible needs plain defaults (dtype "float32").
    # float64, as float32 predictions are float32 arrays, which check_regressor_multioutput refuses (it wants float64)
    from sklearn.utils.estimator_checks import check_estimator

    reg = GPRegressor(num_features=32, num_iterations=3, progress=False, dtype="float64")
    results = check_estimator(reg, on_fail=None)
    failed = {r["check_name"] for r in results if r["status"] == "failed"}
    assert failed == set()


def test_non_numeric_columns_are_named():
    """A DataFrame's categorical or string columns are refused by name, with the encoders that work (before: numpy's
    "could not convert string to float: 'x'", naming neither X nor the column)."""
    pandas = pytest.importorskip("pandas")
    x, y = _wave(20)
    frame = pandas.DataFrame({"a": x[:, 0], "kind": pandas.Categorical(["u", "v"] * 10), "label": ["p", "q"] * 10})
    with pytest.raises(ValueError, match=r"X must hold numbers only: columns 'kind' \(category\), 'label'.*Encoder"):
        GPRegressor(num_iterations=0).fit(frame, y)
    with pytest.raises(ValueError, match=r"X must hold numbers only: values of dtype object"):
        GPRegressor(num_iterations=0).fit(frame.to_numpy(), y)


def test_float32_columns_are_scaled_past_2_to_the_23_rows_and_beyond_float32s_squares():
    """In float32 the constant-column test var ≤ n·ε·var + (n·ε·mean)² holds for every column from n·ε ≥ 1, 2²³ rows
    on: a float32 tensor of 9·10⁶ rows was neither standardised nor normalised (scales 1 for columns with standard
    deviations 5 and 2).  A float32 column spreading by 4·10²⁰ overflowed its variance to Inf, also taken for constant
    (the fit then failed on an infinite lengthscale); a float64 one whose variance overflows is named."""
    from rfgp.models.estimator import column_scales

    g = torch.Generator().manual_seed(0)
    x = torch.linspace(-1.0, 1.0, 2**23 + 2**20).unsqueeze(-1) * 5 + 3  # standard deviation 5/√3
    scales = column_scales(x, x.mean(0), "X")
    assert scales.dtype == torch.float32
    torch.testing.assert_close(scales, torch.tensor([5 / 3**0.5]), rtol=1e-5, atol=0)
    wide = torch.rand(50, 1, generator=g, dtype=torch.float64)
    y = torch.sin(6 * wide[:, 0])
    reg = GPRegressor(num_features=64, num_iterations=10, progress=False).fit((wide * 4e20).float(), y)
    assert float(reg.input_scale_) == pytest.approx(float(wide.std() * 4e20), rel=1e-5)
    assert reg.score((wide * 4e20).float(), y) > 0.99
    with pytest.raises(ValueError, match=r"X \(column 0\) spreads too widely for its variance .* rescale that column"):
        GPRegressor(num_iterations=0).fit(wide * 1e160, y)


def test_prediction_refuses_a_model_left_in_training_mode():
    """A training loop's model_.train() after fit made predict at the training inputs return GPyTorch's prior there
    (a constant mean, R² −0.1 instead of 0.97) and sample_y and the classifier's probabilities likewise, silently."""
    x, y = _wave(100)
    reg = GPRegressor(num_features=64, num_iterations=5, progress=False).fit(x, y)
    expected = reg.predict(x)
    reg.model_.train()
    for call in (lambda: reg.predict(x), lambda: reg.score(x, y), lambda: reg.sample_y(x),
                 lambda: reg.log_predictive_density(x, y)):
        with pytest.raises(RuntimeError, match=r"GPRegressor.model_ is in training mode .* call regressor.model_.eval"):
            call()
    reg.model_.eval()
    np.testing.assert_array_equal(reg.predict(x), expected)
    labels = (y > 3).astype(int)
    clf = DirichletGPClassifier(num_features=32, num_iterations=3, progress=False).fit(x, labels)
    clf.model_.train()
    for call in (lambda: clf.predict_proba(x), lambda: clf.predict(x), lambda: clf.latent_posterior(x)):
        with pytest.raises(RuntimeError, match="DirichletGPClassifier.model_ is in training mode"):
            call()


def test_ragged_rows_are_named():
    """Lists of rows of unequal lengths raised NumPy's "setting an array element with a sequence", naming neither X
    nor y."""
    with pytest.raises(ValueError, match="X must be a rectangular array, one row per sample"):
        GPRegressor(num_iterations=0).fit([[1.0, 2.0], [3.0]], [1.0, 2.0])
    with pytest.raises(ValueError, match="y must be a rectangular array"):
        GPRegressor(num_iterations=0).fit([[1.0], [3.0]], [[1.0, 2.0], [3.0]])
    with pytest.raises(ValueError, match="X must be a rectangular array"):
        DirichletGPClassifier(num_iterations=0).fit([[1.0, 2.0], [3.0]], [0, 1])


def test_date_and_time_columns_are_refused_not_read_as_nanoseconds():
    """Datetime, timezone-aware and timedelta columns (and NumPy datetime64 arrays) are refused by name: float64
    conversion would read them as nanoseconds since 1970, a unit and origin the user never chose."""
    pandas = pytest.importorskip("pandas")
    x, y = _wave(20)
    times = pandas.date_range("2020-01-01", periods=20, freq="D")
    for column in (times, times.tz_localize("UTC"), times - times[0]):
        frame = pandas.DataFrame({"a": x[:, 0], "when": column})
        with pytest.raises(TypeError, match=r"X has date/time values \(column 'when' \((datetime|timedelta)64"):
            GPRegressor(num_iterations=0).fit(frame, y)
    with pytest.raises(TypeError, match=r"X has date/time values \(dtype datetime64"):
        GPRegressor(num_iterations=0).fit(times.values.reshape(-1, 1), y)


def test_missing_values_of_nullable_columns_are_named():
    """pandas' nullable Int64/Float64 columns are numbers; their pd.NA is a missing value, named with its column
    (before: "X must hold numbers only: columns 'a' (Int64), 'b' (Float64)" and the advice to encode them)."""
    pandas = pytest.importorskip("pandas")
    x, y = _wave(20)
    frame = pandas.DataFrame({"a": pandas.array(np.arange(20), dtype="Int64"), "b": pandas.array(x[:, 1], "Float64")})
    reference = GPRegressor(num_iterations=0).fit(frame.astype("float64"), y).predict(frame.astype("float64"))
    np.testing.assert_array_equal(GPRegressor(num_iterations=0).fit(frame, y).predict(frame), reference)
    frame.loc[3, "b"] = pandas.NA
    with pytest.raises(ValueError, match=r"X contains NaN .*1 NaN .*\(3, 1\)\).*first in column 'b'; drop or impute"):
        GPRegressor(num_iterations=0).fit(frame, y)
    frame["kind"] = ["u", "v"] * 10
    with pytest.raises(ValueError, match=r"numbers only: column 'kind' \((object|str)\) "):  # nullable ones not named
        GPRegressor(num_iterations=0).fit(frame, y)


def test_a_failed_fit_leaves_the_regressor_unfitted():
    """scikit-learn's check_is_fitted called an estimator fitted after a fit that failed (its n_features_in_ was
    set), and a failed refit kept the previous model_ beside the new columns."""
    from sklearn.utils.validation import check_is_fitted

    x, y = _wave(20)
    reg = GPRegressor(num_iterations=0)
    with pytest.raises(ValueError, match="y must have shape"):
        reg.fit(x, y[:5])
    with pytest.raises(ValueError, match="not fitted"):
        check_is_fitted(reg)
    reg.fit(x, y)
    check_is_fitted(reg)
    with pytest.raises(ValueError, match="y must have shape"):
        reg.fit(x[:, :1], y[:5])
    with pytest.raises(ValueError, match="not fitted"):
        reg.predict(x[:, :1])


@pytest.mark.parametrize("estimator", ["regressor", "classifier"])
def test_training_inputs_are_copied_from_a_tensor(estimator):
    """A float32 tensor X fitted without standardisation was the model's training inputs itself: the caller zeroing
    that tensor after fit changed every prediction (by 0.9 here) without a word; scikit-learn's
    GaussianProcessRegressor copies X (copy_X_train=True)."""
    x, y = _wave(40)
    inputs = torch.as_tensor(x, dtype=torch.float32)
    regressor = estimator == "regressor"
    cls, target, method = ((GPRegressor, y, "predict") if regressor else
                           (rfgp.models.DirichletGPClassifier, (y > 3).astype(int), "predict_proba"))
    arguments = dict(num_features=32, num_iterations=2, standardize=False, progress=False)
    expected = getattr(cls(**arguments).fit(inputs.clone(), target), method)(inputs[:5].clone())
    fitted = cls(**arguments).fit(inputs, target)
    inputs.zero_()
    torch.testing.assert_close(getattr(fitted, method)(torch.as_tensor(x[:5], dtype=torch.float32)), expected,
                               rtol=0, atol=0)



def _dense_posterior(model, x):
    """Mean (B, M) and covariance (B, M, M) of a batch of B exact GPs sharing an unbatched kernel, formed densely."""
    kernel, train_x = model.covar_module, model.train_inputs[0]
    with torch.no_grad():
        k_train, k_cross, k_test = (kernel(a, b).to_dense() for a, b in ((train_x, train_x), (x, train_x), (x, x)))
        covariance = k_train + torch.diag_embed(model.likelihood.noise.expand(model.train_targets.shape))
        constant = model.mean_module.constant.unsqueeze(-1)
        mean = (k_cross @ torch.linalg.solve(covariance, (model.train_targets - constant).unsqueeze(-1))).squeeze(-1)
        return mean + constant, k_test - k_cross @ torch.linalg.solve(covariance, k_cross.T)


def test_an_exact_kernel_predicts_several_outputs_and_classes(monkeypatch):
    """An unbatched exact GPyTorch kernel under T outputs or C classes: every prediction raised GPyTorch's "mat2 must
    be a matrix, got 3-D tensor" (its dense path for N + M ≤ 512 adds the (M, M) test covariance to the (T, M, M)
    correction with torch.addmm), after a fit that had passed.  The process-wide setting that avoids it is entered
    for that case only (guide/conventions.md, "Threads"), not for rfgp's feature kernels."""
    entered = []
    setting = gpytorch.settings.max_eager_kernel_size
    original = setting.__enter__
    monkeypatch.setattr(setting, "__enter__", lambda self: entered.append(self) or original(self))
    x, y = _wave(60)
    GPRegressor(num_features=16, num_iterations=0).fit(x, np.c_[y, y]).predict(x[:5], return_std=True)
    rfgp.models.DirichletGPClassifier(num_features=16, num_iterations=0).fit(x, y > 3).predict_proba(x[:5])
    assert entered == []
    targets = np.c_[y, x[:, 0] - y]
    reg = GPRegressor(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), num_iterations=2,
                      dtype="float64", progress=False).fit(x, targets)
    mean, covariance = reg.predict(x[:5], return_cov=True)
    expected_mean, expected_covariance = _dense_posterior(reg.model_, torch.as_tensor(x[:5]))
    scale = reg.y_scale_.numpy()
    np.testing.assert_allclose(mean, expected_mean.T.numpy() * scale + reg.y_mean_.numpy(), rtol=1e-9)
    np.testing.assert_allclose(covariance, expected_covariance.permute(1, 2, 0).numpy() * scale**2, atol=1e-12)
    np.testing.assert_allclose(reg.predict(x[:5], return_std=True)[1], np.sqrt(np.diagonal(covariance).T))
    clf = rfgp.models.DirichletGPClassifier(kernel=gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
                                            num_iterations=2, dtype="float64", progress=False)
    clf.fit(x, np.digitize(y, [2.0, 4.0]))
    latent = clf.latent_posterior(x[:5])
    standardised = (torch.as_tensor(x[:5]) - clf.input_mean_) / clf.input_scale_
    expected_mean, expected_covariance = _dense_posterior(clf.model_, standardised)
    torch.testing.assert_close(latent.mean, expected_mean)
    torch.testing.assert_close(latent.covariance_matrix, expected_covariance)
    assert clf.predict_proba(x[:5]).shape == (5, 3) and len(entered) > 0


def test_exact_gp_model_predicts_batched_targets_with_an_unbatched_exact_kernel():
    """rfgp.models.ExactGPModel itself (not only the estimators) with (T, N) targets and an unbatched exact GPyTorch
    kernel: every prediction below N + M = 512 raised GPyTorch's "mat2 must be a matrix, got 3-D tensor"."""
    x, y = (torch.as_tensor(a) for a in _wave(50))
    targets = torch.stack([y, x[:, 0] - y])
    model = rfgp.models.ExactGPModel(x, targets, gpytorch.likelihoods.GaussianLikelihood(),
                                     gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
                                     gpytorch.means.ConstantMean(batch_shape=torch.Size([2]))).double().eval()
    with torch.no_grad():
        posterior = model(x[:5])
        mean, covariance = posterior.mean, posterior.covariance_matrix
    expected_mean, expected_covariance = _dense_posterior(model, x[:5])
    torch.testing.assert_close(mean, expected_mean)
    torch.testing.assert_close(covariance, expected_covariance)


def test_repeated_input_values_do_not_start_the_lengthscale_at_its_floor():
    """An ordinal column with 80 % of the rows at one level: most pairwise distances were 0, the median heuristic gave
    the lengthscale floor 1e-6, where the marginal likelihood's gradients vanish, and the trained model was a lookup
    table of the levels: 0.21 at x = 1.5 for y = sin x (1.0), the classifier's probabilities the class prior's."""
    rng = np.random.default_rng(0)
    x = rng.choice([0.0, 1.0, 2.0], size=400, p=[0.8, 0.1, 0.1])[:, None]
    y = np.sin(x[:, 0]) + 0.05 * rng.standard_normal(400)
    between = np.array([[0.5], [1.5]])
    reg = GPRegressor(dtype="float64", progress=False).fit(x, y)
    np.testing.assert_allclose(reg.predict(between), np.sin(between[:, 0]), atol=0.15)  # was off by 0.26 and 0.78
    for estimator, target in ((GPRegressor, y), (rfgp.models.DirichletGPClassifier, (x[:, 0] > 0).astype(int))):
        start = estimator(num_iterations=0).fit(x, target).model_.covar_module.base_kernel.lengthscale
        assert float(start.min()) > 0.1  # the median distance between distinct standardised rows, 1.44
    clf = rfgp.models.DirichletGPClassifier(dtype="float64", progress=False).fit(x, (x[:, 0] > 0).astype(int))
    assert clf.predict_proba(between)[1, 1] > 0.5  # between the levels 1 and 2, both of class 1: was 0.15


def test_integer_tensor_inputs_are_scaled_as_integer_arrays():
    """An int64 tensor of Unix times (hourly, ≈ 1.7·10⁹ s) went to float32 before its centring, NumPy's int64 to
    float64: other predictions (R² 0.24 against 1.0 on a sine of period 50 h, with two threads).  Both now give the
    same model."""
    times = 1_700_000_000 + 3600 * np.arange(300)[:, None]
    y = np.sin(2 * np.pi * np.arange(300) / 100)
    from_array = GPRegressor(num_iterations=30, progress=False).fit(times, y)
    from_tensor = GPRegressor(num_iterations=30, progress=False).fit(torch.as_tensor(times), y)
    np.testing.assert_array_equal(from_tensor.predict(torch.as_tensor(times)).numpy(), from_array.predict(times))
    assert from_tensor.score(torch.as_tensor(times), y) > 0.99


def test_a_kernel_batch_other_than_the_targets_is_named():
    """A batched kernel whose batch is not that of the outputs or classes failed in GPyTorch's broadcasting ("shape
    '[2]' is invalid for input of size 6", "Attempting to broadcast a dimension of length 3")."""
    x, y = _wave(30)

    def batched(size):
        return gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, seed=0, batch_shape=torch.Size([size])),
                                            batch_shape=torch.Size([size]))

    for estimator, target in ((GPRegressor(kernel=batched(3), num_iterations=0), y),
                              (GPRegressor(kernel=batched(3), num_iterations=0), np.c_[y, y]),
                              (rfgp.models.DirichletGPClassifier(kernel=batched(3), num_iterations=0), y > 3)):
        with pytest.raises(ValueError, match=r"kernel has batch_shape \(3,\), but the .* targets form a batch of"):
            estimator.fit(x, target)
    assert GPRegressor(kernel=batched(2), num_iterations=0).fit(x, np.c_[y, y]).predict(x[:4]).shape == (4, 2)
