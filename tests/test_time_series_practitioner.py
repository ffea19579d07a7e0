"""A forecaster's pass over rfgp on real time series (statsmodels' weekly Mauna Loa CO₂ record): the scikit-learn
Mauna Loa kernel tree in years, converted with ``rfgp.sketch``, in float32 and float64 and through ``GPRegressor``."""

from __future__ import annotations

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.kernels import PeriodicKernel, RBFKernel, RQKernel, ScaleKernel

import rfgp
from rfgp.models import GPRegressor

sm = pytest.importorskip("statsmodels.api")


def _co2(step: int = 4) -> tuple[np.ndarray, np.ndarray]:
    """Weekly CO₂ (ppm) against decimal years 1958–2001, missing weeks dropped, every ``step``-th week."""
    frame = sm.datasets.co2.load_pandas().data.dropna()
    years = frame.index.year + (frame.index.dayofyear - 1) / 365.25
    return np.asarray(years, dtype=np.float64)[::step, None], frame["co2"].to_numpy()[::step]


def _mauna_loa_tree(fixed_period: bool = False) -> gpytorch.kernels.Kernel:
    """scikit-learn's Mauna Loa kernel in GPyTorch, hyperparameters in years: long-term RBF + RBF × periodic (one
    year) + RQ, alpha set to 1 as users write it."""
    trend = ScaleKernel(RBFKernel())
    trend.base_kernel.lengthscale = 50.0
    periodic, decay = PeriodicKernel(), RBFKernel()
    periodic.period_length, periodic.lengthscale, decay.lengthscale = 1.0, 1.0, 100.0
    if fixed_period:
        periodic.raw_period_length.requires_grad_(False)
    irregular = RQKernel()
    irregular.lengthscale, irregular.alpha = 1.0, 1.0
    return trend + ScaleKernel(decay * periodic) + ScaleKernel(irregular)


def test_a_seed_draws_the_same_rational_quadratic_features_in_float32_and_float64():
    # α = 1 set on a float64 RQKernel reads back as 0.9999999995 (softplus round trip), on a float32 one as 1.0; the
    # Gamma sampler boosts shapes below 1, so the two dtypes drew unrelated precisions from one seed (the CO₂ tree at
    # F = 1024: −MLL 0.4987 per point in float32 against 0.5291 in float64, a Monte-Carlo difference read as float32
    # error).  The proposal's shape is now rounded to float32 before drawing.
    dtypes = (torch.float32, torch.float64)
    kernels = {dtype: rfgp.sketch(_mauna_loa_tree(), 1024, seed=0).to(dtype) for dtype in dtypes}
    x = torch.linspace(0.0, 40.0, 50, dtype=torch.float64)[:, None]
    for dtype, kernel in kernels.items():
        kernel(x.to(dtype)).to_dense()  # draws are made at the first evaluation
    maps = {dtype: kernel.kernels[2].base_kernel.feature_map for dtype, kernel in kernels.items()}
    torch.testing.assert_close(maps[torch.float32].log_precisions.double(), maps[torch.float64].log_precisions,
                               rtol=1e-6, atol=0.0)
    with torch.no_grad():
        values = {dtype: kernel(x.to(dtype)).to_dense().double() for dtype, kernel in kernels.items()}
    torch.testing.assert_close(values[torch.float32], values[torch.float64], rtol=0.0, atol=1e-3)


def _fitted_mauna_loa_tree(target_variance: float) -> gpytorch.kernels.Kernel:
    """scikit-learn's fitted Mauna Loa hyperparameters (its example's, in years; outputscales in units of the
    normalised targets), all fixed."""
    trend = ScaleKernel(RBFKernel())
    trend.outputscale, trend.base_kernel.lengthscale = 44.8**2 / target_variance, 51.6
    periodic, decay = PeriodicKernel(), RBFKernel()
    periodic.period_length, periodic.lengthscale, decay.lengthscale = 1.0, 1.48, 91.5
    seasonal = ScaleKernel(decay * periodic)
    seasonal.outputscale = 2.64**2 / target_variance
    irregular = ScaleKernel(RQKernel())
    irregular.outputscale = 0.536**2 / target_variance
    irregular.base_kernel.lengthscale, irregular.base_kernel.alpha = 0.968, 2.89
    tree = trend + seasonal + irregular
    for parameter in tree.parameters():
        parameter.requires_grad_(False)
    return tree


def test_gp_regressor_keeps_a_given_kernels_hyperparameters_in_the_units_of_x():
    # A forecaster hands GPRegressor the Mauna Loa tree in years (period one year, fixed) and raw decimal years.  The
    # default standardize=True rescaled the inputs under the given kernel, so its period meant 12.7 years, silently:
    # forecast RMSE 5.5 ppm over 1992–2001 against 0.87 with the years as given.  A given kernel now sees X as given
    # unless standardize=True is passed ("auto"); noise and mean are trained, the kernel's hyperparameters are not.
    x, y = _co2(step=8)
    train = x[:, 0] <= 1992
    kernel = rfgp.sketch(_fitted_mauna_loa_tree(float(y[train].var())), 512, seed=0)
    reg = GPRegressor(kernel=kernel, dtype=torch.float64, progress=False).fit(x[train], y[train])
    torch.testing.assert_close(reg.model_.train_inputs[0], torch.as_tensor(x[train]))  # the years, as given
    assert not hasattr(reg, "input_mean_")
    rmse = float(np.sqrt(np.mean((reg.predict(x[~train]) - y[~train]) ** 2)))
    assert rmse < 1.5, rmse
    assert GPRegressor().get_params()["standardize"] == "auto"
    default = GPRegressor(num_iterations=0, dtype=torch.float64).fit(x[train], y[train])
    assert default.input_scale_.item() == pytest.approx(float(x[train].std(ddof=1)))  # the default kernel: standardised


def test_gp_regressor_standardises_julian_dates_before_rounding_them_to_float32():
    # Hourly observations against Julian dates (≈ 2.46·10⁶ days): the float32 regressor (the default dtype) rounded
    # the inputs to float32's spacing there, 0.25 days, before centring them, so 500 hourly rows shared 84 inputs and
    # the fit's training RMSE was 0.65 against the noise's 0.10 (the same hours counted from 0: 0.10).  The inputs are
    # now centred and scaled in float64 and rounded to the model's dtype after.
    import pandas as pd

    hours = pd.date_range("2024-01-01", periods=300, freq="h")
    julian = hours.to_julian_date().to_numpy()[:, None]
    assert len(np.unique(julian.astype(np.float32))) < 60  # the raw column does not survive float32
    t = np.arange(300.0)
    y = np.sin(2 * np.pi * t / 150) + 0.1 * np.random.default_rng(0).standard_normal(300)
    reg = GPRegressor(num_iterations=30, progress=False).fit(julian, y)
    assert reg.model_.train_inputs[0].dtype == torch.float32
    assert len(torch.unique(reg.model_.train_inputs[0])) == 300
    reference = GPRegressor(num_iterations=30, progress=False).fit(t[:, None], y)
    # the two standardised columns differ by one float32 ulp at some rows, and 30 float32 L-BFGS steps along the
    # flat outputscale–lengthscale ridge of a smooth sine amplify that into other hyperparameters: compare the fits
    rmse = np.sqrt(np.mean((reg.predict(julian) - y) ** 2))
    reference_rmse = np.sqrt(np.mean((reference.predict(t[:, None]) - y) ** 2))
    assert rmse < 0.12 and abs(rmse - reference_rmse) < 0.01, (rmse, reference_rmse)


def test_posterior_paths_take_one_dimensional_times_as_the_model_does():
    # GPyTorch's regression tutorials pass times as a 1-D tensor (train_x = torch.linspace(...)); ExactGP reads it as
    # one column, and the sketched model trained and predicted so, but its posterior paths raised "IndexError: tuple
    # index out of range" at x.shape[-2] for the same 1-D test times.
    x, y = _co2(step=16)
    t = torch.as_tensor(x[:, 0] - 1958.0)
    y = torch.as_tensor((y - y.mean()) / y.std())

    class TutorialGP(gpytorch.models.ExactGP):
        def __init__(self, train_x, train_y, likelihood):
            super().__init__(train_x, train_y, likelihood)
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = rfgp.sketch(ScaleKernel(RBFKernel()), 256, seed=0)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model = TutorialGP(t, y, gpytorch.likelihoods.GaussianLikelihood()).double()
    model.covar_module.base_kernel.lengthscale = 5.0
    model.eval()
    future = torch.linspace(44.0, 54.0, 25, dtype=torch.float64)
    paths = rfgp.sampling.posterior_paths(model, 8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        values = paths(future)
        torch.testing.assert_close(values, paths(future.unsqueeze(-1)))
        assert values.shape == (8, 25)
        with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., n, d\), or \(n,\).*got \(\)"):
            paths(future[0])


def test_posterior_paths_name_the_modules_they_need():
    # a model whose kernel is registered as self.kernel: "model.covar_module must be an rfgp feature kernel …, got
    # NoneType" read as a wrong kernel type; the message now names the attribute and GPyTorch's convention
    class OwnNames(gpytorch.models.ExactGP):
        def __init__(self, train_x, train_y):
            super().__init__(train_x, train_y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean = gpytorch.means.ConstantMean()
            self.kernel = rfgp.sketch(ScaleKernel(RBFKernel()), 64, seed=0)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean(x), self.kernel(x))

    model = OwnNames(torch.linspace(0.0, 1.0, 20)[:, None], torch.zeros(20)).eval()
    with pytest.raises(TypeError, match="OwnNames has no module 'mean_module'"):
        rfgp.sampling.posterior_paths(model, 2)
