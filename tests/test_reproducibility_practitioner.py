"""Reproducibility as a practitioner needs it (papers, model validation, a downstream library's CI).

Seeds, global-RNG independence, grad modes and thread counts (`guide/conventions.md`, "Reproducibility"); seeded
draws that do not depend on `rfgp.settings.memory_budget`; repeated fits; persistence through a fresh process,
multiprocessing (spawn) and DataLoader workers.  Round trips of every map and kernel's state are in
`tests/core/test_state_dict.py`, a saved RBF model in a fresh process in `tests/test_long_running.py`, the
scikit-learn estimators' pickle/joblib/clone in `tests/models/test_sklearn_ecosystem.py`.
"""

from __future__ import annotations

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, PeriodicKernel, PolynomialKernel, RBFKernel, ScaleKernel

import rfgp
from rfgp.models import ExactGPModel, MultiOutputGPModel

N, D = 60, 2


def _data(dtype=torch.float64):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(N, D, generator=gen, dtype=dtype)
    y = torch.sin(4 * x.sum(-1)) + 0.1 * torch.randn(N, generator=gen, dtype=dtype)
    return x, y


def _test_points(n=25, dtype=torch.float64):
    return torch.rand(n, D, generator=torch.Generator().manual_seed(5), dtype=dtype)


LAZY_TREES = {  # kernels that make their draws (or fit their allocation) at their first call
    "orf": (lambda: ScaleKernel(RBFKernel()), {"method": "orf"}),
    "maclaurin": (lambda: ScaleKernel(RBFKernel()), {"method": "maclaurin"}),
    "matern12": (lambda: ScaleKernel(MaternKernel(nu=0.5)), {}),  # and anchors its lengthscale
    "polynomial": (lambda: ScaleKernel(PolynomialKernel(power=2)), {}),
    "periodic_x_rbf": (lambda: ScaleKernel(PeriodicKernel() * RBFKernel()), {}),
}


@pytest.mark.parametrize("name", list(LAZY_TREES))
def test_first_call_under_inference_mode_leaves_a_trainable_model(name):
    """A converted kernel draws at its first call.  When that call was a prediction under `torch.inference_mode()`
    (a quick look at the untrained model), the draws were inference tensors and training then failed with
    "RuntimeError: Inference tensors do not track version counter" (GPyTorch's exact kernels train after it); the
    draws are made outside inference mode, the same as a first call outside it."""
    x, y = _data()
    tree, options = LAZY_TREES[name]

    def model():
        kernel = rfgp.sketch(tree(), 64, seed=0, **options)
        return ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()

    looked, plain = model(), model()
    looked.eval()
    with torch.inference_mode():
        looked(x[:3]).mean
    looked.train()
    losses = [rfgp.fit_mll(m, 3, progress=False).losses for m in (looked, plain)]
    assert losses[0] == losses[1]
    assert all(torch.equal(a, b) for a, b in zip(looked.state_dict().values(), plain.state_dict().values()))


def _single_output_model():
    x, y = _data()
    kernel = rfgp.sketch(ScaleKernel(RBFKernel()), 32, method="orf", seed=0)  # N > F: feature space either way
    return ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()


def _vector_field_model():
    x, y = _data()
    targets = torch.stack([y, torch.cos(3 * x[:, 0])], -1)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2)
    return MultiOutputGPModel(x, targets, likelihood, rfgp.kernels.SketchedCurlFreeKernel(64, D, seed=0)).double()


@pytest.mark.parametrize("build", [_single_output_model, _vector_field_model], ids=["single", "curl_free"])
def test_seeded_predictive_samples_do_not_depend_on_chunking(build):
    """`likelihood(model(x)).rsample()` after `torch.manual_seed(s)`: a test set over `rfgp.settings.memory_budget`
    (or `chunk_size`) is sampled a block of points at a time, and its observation noise ε′ was drawn block by block,
    other numbers from the generator (samples 4–6 apart at the same seed); now the same sample to rounding, as the
    latent samples were."""
    model = build()
    test_x = _test_points(400)
    samples = []
    for rows in (None, 37):  # the second computes the 400 test points 37 at a time
        model.train()
        model.eval()
        with torch.no_grad(), rfgp.settings.chunk_size(rows):
            predictive = model.likelihood(model(test_x))
            torch.manual_seed(3)
            samples.append(predictive.rsample(torch.Size([5])))
    torch.testing.assert_close(samples[0], samples[1], rtol=0, atol=1e-12)


@pytest.mark.parametrize("estimator", ["regressor", "classifier"])
def test_estimator_draws_do_not_depend_on_torchs_default_dtype(estimator):
    """`GPRegressor(dtype=torch.float64, seed=0)` drew its default kernel's frequencies in torch's default dtype and
    cast them to float64: a script that called `torch.set_default_dtype(torch.float64)` got other draws, hence other
    predictions (3e-7 apart), from the same estimator, seed and data than one that did not.  The classifier now
    predicts bit for bit; the regressor's predictions still differ by ~1e-11 through GPyTorch's own noise bound
    (`GreaterThan(1e-4)`, rounded to the default dtype when GPyTorch builds it; see guide/conventions.md)."""
    np = pytest.importorskip("numpy")
    from rfgp.models import DirichletGPClassifier, GPRegressor

    rows = np.random.RandomState(0).rand(80, 3)
    if estimator == "regressor":
        make, target, predict = GPRegressor, np.sin(3 * rows.sum(1)), "predict"
    else:
        make, target, predict = DirichletGPClassifier, (rows.sum(1) > 1.5).astype(int), "predict_proba"
    fits = []
    for default in (torch.float32, torch.float64):
        previous = torch.get_default_dtype()
        torch.set_default_dtype(default)
        try:
            fits.append(make(num_features=64, num_iterations=3, dtype=torch.float64, progress=False).fit(rows, target))
        finally:
            torch.set_default_dtype(previous)
    draws = [fit.model_.covar_module.base_kernel.feature_map.state_dict() for fit in fits]
    assert all(torch.equal(draws[0][key], draws[1][key]) for key in draws[0])
    if estimator == "classifier":
        np.testing.assert_array_equal(getattr(fits[0], predict)(rows), getattr(fits[1], predict)(rows))
