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
#: the Maclaurin models here are narrow (F = 48–64) and trained for a few steps: the truncation they leave is expected
_NARROW_MACLAURIN = pytest.mark.filterwarnings("ignore::rfgp.TruncationWarning")


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


@_NARROW_MACLAURIN
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


def _persisted_models(seed):
    """A Maclaurin, a k-means++ Nyström, a polynomial-sketch and a curl-free model (seeded by ``seed``)."""
    x, y = _data()
    models = {}
    for name, tree, options in (
        ("maclaurin", ScaleKernel(RBFKernel()), {"method": "maclaurin"}),
        ("nystrom", ScaleKernel(RBFKernel()), {"method": "nystrom", "x_sample": x, "landmarks": "kmeans++"}),
        ("polynomial", ScaleKernel(PolynomialKernel(power=3)), {}),
    ):
        kernel = rfgp.sketch(tree, 24 if name == "nystrom" else 48, seed=seed, **options)
        models[name] = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()
    targets = torch.stack([y, torch.cos(3 * x[:, 0])], -1)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2)
    kernel = rfgp.kernels.SketchedCurlFreeKernel(48, D, seed=seed)
    models["curl_free"] = MultiOutputGPModel(x, targets, likelihood, kernel).double()
    return models


def _predict(model, test_x):
    model.eval()
    with torch.no_grad():
        output = model.likelihood(model(test_x))
        return torch.cat([output.mean.reshape(-1), output.variance.reshape(-1)])


_RELOAD = """
import sys, torch
import rfgp
torch.set_num_threads(int(sys.argv[3]))  # bit-equal results need the same thread count (BLAS summation order)
saved = torch.load(sys.argv[1], weights_only=False)
states = torch.load(sys.argv[2], weights_only=True)
for name, (whole, fresh, expected) in saved["models"].items():
    fresh.load_state_dict(states[name])
    for model in (whole, fresh):
        model.eval()
        with torch.no_grad():
            output = model.likelihood(model(saved["x"]))
            got = torch.cat([output.mean.reshape(-1), output.variance.reshape(-1)])
        assert torch.equal(got, expected), name
"""


@_NARROW_MACLAURIN
def test_trained_models_predict_bit_for_bit_in_a_fresh_process(tmp_path):
    """Beyond the RBF model of `tests/test_long_running.py`: a trained Maclaurin (fitted allocation), Nyström
    (k-means++ landmarks), polynomial-sketch and curl-free model, saved whole (`torch.save`) and as a state dict
    (read back with `weights_only=True` into models of another seed), predict bit for bit in a new process."""
    import subprocess
    import sys

    test_x = _test_points()
    trained, fresh = _persisted_models(0), _persisted_models(1)
    saved, states = {}, {}
    for name, model in trained.items():
        rfgp.fit_mll(model, 3, progress=False)
        saved[name] = (model, fresh[name], _predict(model, test_x))
        states[name] = model.state_dict()
    torch.save({"models": saved, "x": test_x}, tmp_path / "models.pt")
    torch.save(states, tmp_path / "states.pt")
    subprocess.run([sys.executable, "-c", _RELOAD, str(tmp_path / "models.pt"), str(tmp_path / "states.pt"),
                    str(torch.get_num_threads())],
                   check=True, timeout=120)


def test_a_state_loaded_into_another_seed_keeps_nothing_of_that_seed():
    """After `load_state_dict` into a model built with another seed, everything seeded is the saved model's: the
    state dict is equal entry for entry, and `set_num_features` (which re-draws, or re-chooses landmarks, from the
    stored seed and rule) gives the saved model's wider map."""
    x, _ = _data()
    saved, other = _persisted_models(0), _persisted_models(7)
    for name in saved:
        other[name].load_state_dict(saved[name].state_dict())
        reference, loaded = saved[name].state_dict(), other[name].state_dict()
        assert reference.keys() == loaded.keys()
        assert all(torch.equal(reference[key], loaded[key]) for key in reference), name
        if name != "curl_free":
            for model in (saved[name], other[name]):
                rfgp.set_num_features(model, 40 if name == "nystrom" else 96, x_sample=x)
            reference, loaded = saved[name].state_dict(), other[name].state_dict()
            assert all(torch.equal(reference[key], loaded[key]) for key in reference), name


def _predict_in_worker(arguments):
    model, test_x, threads = arguments
    torch.set_num_threads(threads)  # bit-equal results need the same thread count (BLAS summation order)
    return _predict(model, test_x)


class _PredictionBlocks(torch.utils.data.Dataset):
    def __init__(self, model, test_x):
        self.model, self.test_x = model, test_x

    def __len__(self):
        return 2

    def __getitem__(self, index):
        return _predict(self.model, self.test_x[index::2])


@_NARROW_MACLAURIN
def test_a_model_sent_to_spawned_processes_and_dataloader_workers_predicts_bit_for_bit():
    """A trained model pickled to a `spawn` worker and used inside DataLoader workers (one thread each, as
    PyTorch sets them) predicts as in the parent process at the same thread count."""
    import multiprocessing

    model = _persisted_models(0)["maclaurin"]
    rfgp.fit_mll(model, 3, progress=False)
    test_x = _test_points()
    threads = torch.get_num_threads()
    expected = _predict(model, test_x)
    model.train()  # sent without its posterior caches: the worker rebuilds them
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        (got,) = pool.map(_predict_in_worker, [(model, test_x, threads)])
    assert torch.equal(got, expected)
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        blocks = [_predict(model, test_x[index::2]) for index in range(2)]
    finally:
        torch.set_num_threads(previous)
    loader = torch.utils.data.DataLoader(_PredictionBlocks(model, test_x), batch_size=None, num_workers=2)
    assert all(torch.equal(got, want) for got, want in zip(loader, blocks))


DETERMINISTIC_KERNELS = {
    "sorf": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 32, method="sorf", seed=0),  # FWHT
    "maclaurin": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 32, method="maclaurin", seed=0),  # gathers
    "countsketch": lambda x: rfgp.kernels.SketchedPolynomialKernel(3, 32, projection="countsketch", seed=0),
    "periodic_x_rbf": lambda x: rfgp.sketch(ScaleKernel(PeriodicKernel() * RBFKernel()), 32, seed=0),
    "gaussian_sketch_hd": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 32, method="gaussian_sketch_hd",
                                                x_sample=x, alpha=1e-2, seed=0),
    "nystrom_kmeans++": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 16, method="nystrom", x_sample=x,
                                              landmarks="kmeans++", seed=0),
    "nystrom_rls": lambda x: rfgp.sketch(ScaleKernel(RBFKernel()), 16, method="nystrom", x_sample=x,
                                         landmarks="rls", seed=0),
}


@pytest.mark.parametrize("chunk", [None, 23], ids=["whole", "chunked"])
@pytest.mark.parametrize("name", list(DETERMINISTIC_KERNELS))
def test_deterministic_algorithms_give_the_same_numbers(name, chunk):
    """`torch.use_deterministic_algorithms(True)` runs every family (landmark selection included), whole and
    chunked, and the loss, its gradient and the prediction are those computed without it."""
    x, y = _data()
    test_x = _test_points()

    def run():
        model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), DETERMINISTIC_KERNELS[name](x)).double()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        with rfgp.settings.chunk_size(chunk):
            loss = -mll(model(x), y)
            loss.backward()
            gradients = [p.grad for p in model.parameters() if p.grad is not None]
            return [loss.detach(), *gradients, _predict(model, test_x)]

    expected = run()
    torch.use_deterministic_algorithms(True)
    try:
        got = run()
    finally:
        torch.use_deterministic_algorithms(False)
    assert len(got) == len(expected) and all(torch.equal(a, b) for a, b in zip(got, expected))


@_NARROW_MACLAURIN
@pytest.mark.parametrize("optimizer", ["lbfgs", "adam"])
def test_the_same_fit_twice_repeats_every_loss(optimizer):
    """Two fits of models built with the same seed, with other uses of the global generator before each, give
    bit-identical losses and parameters."""
    histories, states = [], []
    for disturbance in (1, 2):
        torch.manual_seed(disturbance)
        torch.nn.functional.dropout(torch.ones(100), 0.5)
        model = _persisted_models(0)["maclaurin"]
        histories.append(rfgp.fit_mll(model, 8, optimizer=optimizer, progress=False).losses)
        states.append(model.state_dict())
    assert histories[0] == histories[1]
    assert all(torch.equal(states[0][key], states[1][key]) for key in states[0])


def _built_under(default, build):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(default)
    try:
        return build()
    finally:
        torch.set_default_dtype(previous)


@pytest.mark.parametrize("name", ["rbf_ard", "matern_ard", "sorf", "curl_free"])
def test_a_map_drawn_in_float32_then_doubled_is_the_float64_map(name):
    """Maps that draw at construction (ARD trees in `rfgp.sketch`, `input_dim=` given) draw in torch's default dtype;
    `.double()` of one built under float32 (BoTorch's `SingleTaskGP` converts its kernel so) kept float32-rounded
    draws, 1e-8–1e-7 away in k from the same seed built under float64.  Now the same state and kernel values."""
    build = {
        "rbf_ard": lambda: rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=D)), 64, method="orf", seed=0),
        "matern_ard": lambda: rfgp.sketch(ScaleKernel(MaternKernel(nu=1.5, ard_num_dims=D)), 64, seed=0),
        "sorf": lambda: rfgp.kernels.SketchedRBFKernel(64, method="sorf", input_dim=D, seed=0),
        "curl_free": lambda: rfgp.kernels.SketchedCurlFreeKernel(64, D, seed=0),
    }[name]
    doubled = _built_under(torch.float32, build).double()
    native = _built_under(torch.float64, build)
    reference, converted = native.state_dict(), doubled.state_dict()
    assert all(torch.equal(reference[key], converted[key]) for key in reference)
    x = _test_points()
    with torch.no_grad():
        assert torch.equal(doubled(x).to_dense(), native(x).to_dense())
    round_trip = _built_under(torch.float64, build).float().double().state_dict()  # exact again
    assert all(torch.equal(reference[key], round_trip[key]) for key in reference)


def _product(nu, second=None):
    """An RBF × Matérn-ν spectral product over the D = 2 columns (every part seeded)."""
    second = second or (lambda: rfgp.kernels.SketchedMaternKernel(64, nu=nu, active_dims=[1], seed=2))
    return rfgp.kernels.SpectralProductKernel(rfgp.kernels.SketchedRBFKernel(64, active_dims=[0], seed=1),
                                              second(), num_features=64, seed=0)


@pytest.mark.parametrize("name", ["product", "product_matern_half", "matern_half"])
def test_draws_made_by_a_float32_call_then_doubled_are_the_float64_draws(name):
    """A spectral product's frequencies and a Matérn-½ anchor ℓ₀ are made at the first call, in its dtype: made in
    float32, `.double()` kept them float32-rounded (k 1.4·10⁻⁸, 2.5·10⁻⁸ and 6·10⁻⁹ off the same seed's kernel
    called in float64).  Now the same state and kernel values."""
    build = {
        "product": lambda: _product(1.5),
        "product_matern_half": lambda: _product(0.5),
        "matern_half": lambda: rfgp.kernels.SketchedMaternKernel(64, nu=0.5, seed=0),
    }[name]

    def called(dtype):
        kernel = _built_under(dtype, build)
        with torch.no_grad():
            kernel(_test_points(dtype=dtype)).to_dense()  # the draws (and the anchor), in dtype
        return kernel

    doubled, native = called(torch.float32).double(), called(torch.float64)
    reference, converted = native.state_dict(), doubled.state_dict()
    assert all(torch.equal(reference[key], converted[key]) for key in reference)
    with torch.no_grad():
        assert torch.equal(doubled(_test_points()).to_dense(), native(_test_points()).to_dense())


def test_widening_keeps_an_anchor_and_product_draws_that_do_not_follow_the_seed():
    """A Matérn-½ anchor ℓ₀ that ℓ has moved away from, and a product with a factor whose draws are centred on its
    hyperparameters (periodic), keep their converted values under `.double()`."""
    matern = _built_under(torch.float32, lambda: rfgp.kernels.SketchedMaternKernel(64, nu=0.5, seed=0))
    with torch.no_grad():
        matern(_test_points(dtype=torch.float32)).to_dense()
    anchor = matern.lengthscale_anchor.double()
    matern.lengthscale = 0.3  # trained away from ℓ₀
    matern.double()
    assert torch.equal(matern.lengthscale_anchor, anchor)

    product = _built_under(torch.float32, lambda: _product(
        None, lambda: rfgp.kernels.SketchedPeriodicKernel(64, active_dims=[1], seed=2)))
    with torch.no_grad():
        product(_test_points(dtype=torch.float32)).to_dense()
    before = {key: value.double() for key, value in product.state_dict().items() if value.is_floating_point()}
    product.double()
    after = product.state_dict()
    assert all(torch.equal(before[key], after[key]) for key in before)


def test_widening_keeps_draws_centred_on_earlier_hyperparameters():
    """A periodic map's harmonics are drawn around the lengthscale at draw time: after it changed, the seed gives
    other draws, and `.double()` keeps the map's own (converted) draws."""
    kernel = _built_under(torch.float32, lambda: rfgp.kernels.SketchedPeriodicKernel(64, seed=0))
    with torch.no_grad():
        kernel(_test_points(dtype=torch.float32)).to_dense()  # draws, at the initial lengthscale
    feature_map = kernel.feature_map
    before = {key: value.double() for key, value in feature_map.state_dict().items() if value.is_floating_point()}
    kernel.lengthscale = 0.05  # a proposal drawn now would be centred elsewhere, with more harmonics
    kernel.double()
    after = feature_map.state_dict()
    assert before and all(torch.equal(before[key], after[key]) for key in before)


@pytest.mark.parametrize("name", list(LAZY_TREES))
def test_manual_seed_fixes_the_draws_whatever_happens_before_the_first_call(name):
    """`torch.manual_seed(s)` before building: the same draws whether the global generator is used between building
    and the first call (dropout elsewhere), the kernel is built under `torch.no_grad()`, or the first call runs with
    another number of threads."""
    tree, options = LAZY_TREES[name]
    x = _test_points()

    def draws(between=lambda: None, building=torch.enable_grad, threads=None):
        torch.manual_seed(11)
        with building():
            kernel = rfgp.sketch(tree(), 64, **options).double()
        between()
        previous = torch.get_num_threads()
        torch.set_num_threads(threads or previous)
        try:
            with torch.no_grad():
                kernel(x).to_dense()
        finally:
            torch.set_num_threads(previous)
        return {key: value for key, value in kernel.state_dict().items() if "raw_" not in key}

    reference = draws()
    for other in (draws(between=lambda: torch.nn.functional.dropout(torch.ones(1000), 0.5)),
                  draws(building=torch.no_grad), draws(threads=2)):
        assert reference.keys() == other.keys()
        assert all(torch.equal(reference[key], other[key]) for key in reference)
