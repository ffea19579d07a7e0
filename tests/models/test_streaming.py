"""Streaming updates of the feature statistics equal a refit on all data."""

import copy

import gpytorch
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import rfgp
from rfgp.inference.cholesky_update import cholesky_update
from rfgp.inference.statistics_precision import recorded_statistics_dtypes, unit_roundoff, weighted_square_norm
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel
from rfgp.models import streaming as streaming_module
from rfgp.models.streaming import StreamingFeatureGP, fit_from_batches, takes_rank_update
from tests.inference.test_float32_training import igrf_model

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


def _rank_updated_stream(x, y, first, step):
    """A stream of ``model``'s kernel over (x, y): the first ``first`` points, factorised, then batches of ``step``
    points that update the factor by rank-``step`` updates."""
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update="always")
    streaming.update(x[:first], y[:first]).cholesky()
    for start in range(first, x.shape[0], step):
        streaming.update(x[start:start + step], y[start:start + step])
    return streaming


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


def _fitted_and_loaded_copy(x, y):
    """(model, streaming GP fitted on x, y, a differently seeded streaming GP that loaded its state_dict)."""
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x, y)
    other = _model(x[:3], y[:3], seed=7)
    fresh = StreamingFeatureGP(other.covar_module, other.likelihood, other.mean_module)
    fresh.load_state_dict(streaming.state_dict())
    return model, streaming, fresh


def test_state_dict_round_trip():
    x, y = _data()
    model, streaming, fresh = _fitted_and_loaded_copy(x, y)
    x_test = torch.rand(6, DIM, dtype=torch.float64)
    with torch.no_grad():
        assert torch.equal(fresh(x_test).mean, streaming(x_test).mean)
        assert torch.equal(fresh(x_test).variance, streaming(x_test).variance)


def test_state_dict_round_trip_keeps_a_rank_updated_factor():
    """After rank updates the factor L was not in the state dict: the loaded model refactorised I + G, which differs
    from the rank-updated L by rounding, and predicted other values (10⁻¹⁵ in the means) than the model it was saved
    from.  A state dict saved without the factor still loads (strict), refactorising it."""
    x, y = _data()
    streaming = _rank_updated_stream(x, y, 200, 4)
    other = _model(x[:3], y[:3], seed=7)
    fresh = StreamingFeatureGP(other.covar_module, other.likelihood, other.mean_module, rank_update="always")
    fresh.load_state_dict(copy.deepcopy(streaming.state_dict()))
    x_test = torch.rand(6, DIM, dtype=torch.float64)
    for _ in range(2):  # as saved, and after one more rank update of both
        with torch.no_grad():
            assert torch.equal(fresh(x_test).mean, streaming(x_test).mean)
            assert torch.equal(fresh(x_test).variance, streaming(x_test).variance)
        for gp in (streaming, fresh):
            gp.update(x[:2], y[:2])
    old_format = {k: v for k, v in streaming.state_dict().items() if k != "factor"}
    fresh.load_state_dict(old_format)
    assert fresh._chol is None
    with torch.no_grad():
        torch.testing.assert_close(fresh(x_test).mean, streaming(x_test).mean, rtol=1e-10, atol=1e-12)


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


def test_kernels_whose_posterior_the_statistics_do_not_hold_are_refused_by_name():
    """A complex_posterior=True kernel was streamed with its real features: posterior and log p(y) silently those of
    another model (33 nats off the ExactGP's on 40 points); a kernel with several outputs per input failed at the
    first batch with a bare broadcasting RuntimeError."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    complex_kernel = rfgp.kernels.MaclaurinRBFKernel(64, seed=0, complex_posterior=True)
    with pytest.raises(ValueError, match="complex_posterior=True"):
        StreamingFeatureGP(gpytorch.kernels.ScaleKernel(complex_kernel).double(), likelihood)
    for kernel in (rfgp.kernels.SketchedCurlFreeKernel(64, input_dim=2, seed=0),
                   rfgp.kernels.SketchedRBFKernelGrad(64, input_dim=2, seed=0)):
        with pytest.raises(TypeError, match=r"covar_module \(ScaleKernel\) has (2|3) outputs per input .* but "
                                            "StreamingFeatureGP models one output per input row: use a single-output"):
            StreamingFeatureGP(gpytorch.kernels.ScaleKernel(kernel).double(), likelihood)


def test_streaming_and_exact_models_refuse_a_multi_output_kernel_alike():
    """The twin checks differed: ExactGPModel raised a ValueError where StreamingFeatureGP raised a TypeError for the
    same derivative kernel (one helper, rfgp.inference.multioutput.check_one_output_per_input, now raises for both)."""
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernelGrad(64, input_dim=1, seed=0)).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    x = torch.rand(8, 1, dtype=torch.float64)
    for build in (lambda: StreamingFeatureGP(kernel, likelihood),
                  lambda: rfgp.models.ExactGPModel(x, x[:, 0], likelihood, kernel)):
        with pytest.raises(TypeError, match=r"covar_module \(ScaleKernel\) has 2 outputs per input"):
            build()


def test_a_batch_of_another_batch_shape_is_refused_and_leaves_the_model_unchanged():
    """A batched (3, k, d) batch after unbatched data was accepted, broadcasting the earlier points into each of the
    three new models as if each had seen them; (3, k, d) after (2, k, d) failed with a bare
    broadcasting RuntimeError."""
    x, y = _data(40)
    model = _model(x, y)
    gp = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x[:10], y[:10])
    before = copy.deepcopy(gp.state_dict())
    with pytest.raises(ValueError, match=r"batch shape \(3,\).*absorbed so far have batch shape \(\)"):
        gp.update(x[10:40].reshape(3, 10, DIM), y[10:40].reshape(3, 10))
    _assert_same_state(before, gp.state_dict())
    gp.reset().update(x[:20].reshape(2, 10, DIM), y[:20].reshape(2, 10))
    with pytest.raises(ValueError, match=r"batch shape \(3,\).*absorbed so far have batch shape \(2,\)"):
        gp.update(x[10:40].reshape(3, 10, DIM), y[10:40].reshape(3, 10))


@pytest.mark.parametrize("rank_update", ["never", "always"])
def test_a_batched_likelihood_over_an_unbatched_kernel_streams_one_gp_per_noise(rank_update):
    """GaussianLikelihood(batch_shape=(3,)) over an unbatched kernel (three GPs of one kernel, as in an ExactGP) failed
    at the first batch with a bare RuntimeError of expand; each member now equals the stream of its own noise."""
    x, y = _data(40)
    model = _model(x, y)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size([3])).double()
    noises = torch.tensor([0.01, 0.1, 0.5], dtype=torch.float64)
    likelihood.noise = noises.unsqueeze(-1)
    gp = StreamingFeatureGP(model.covar_module, likelihood, model.mean_module, rank_update=rank_update)
    gp.update(x[:15], y[:15]).cholesky()
    gp.update(x[15:], y[15:])
    x_test = x[:4] + 0.1
    with torch.no_grad():
        batched = gp(x_test)
        for member, noise in enumerate(noises):
            single = gpytorch.likelihoods.GaussianLikelihood().double()
            single.noise = noise
            alone = StreamingFeatureGP(model.covar_module, single, model.mean_module).update(x, y)
            torch.testing.assert_close(gp.log_marginal_likelihood()[member], alone.log_marginal_likelihood(),
                                       rtol=1e-12, atol=1e-10)
            torch.testing.assert_close(batched.mean[member], alone(x_test).mean, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(batched.covariance_matrix[member], alone(x_test).covariance_matrix,
                                       rtol=1e-12, atol=1e-12)


def _assert_same_state(before: dict, after: dict) -> None:
    assert before.keys() == after.keys()
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name


@pytest.mark.parametrize("absorbed", [0, 100], ids=["before-data", "after-data"])
def test_empty_batch_is_a_no_op(absorbed):
    x, y = _data()
    model = _model(x, y)
    gp = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update="always")
    if absorbed:
        gp.update(x[:absorbed], y[:absorbed])
        gp.cholesky()
    before, factor = copy.deepcopy(gp.state_dict()), gp._chol
    assert gp.update(x[:0], y[:0]) is gp
    _assert_same_state(before, gp.state_dict())
    assert gp.num_data == absorbed and gp._chol is factor  # the posterior's factor kept, not even refactorised


def test_empty_batch_is_still_checked():
    x, y = _data()
    model = _model(x, y)
    gp = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x[:50], y[:50])
    before = copy.deepcopy(gp.state_dict())
    for rows in (1, 0):  # a batch of 3 columns into a 2-column model: the empty one is refused as the other is
        with pytest.raises(Exception) as error:
            gp.update(torch.zeros(rows, 3, dtype=torch.float64), torch.zeros(rows, dtype=torch.float64))
        assert "empty" not in str(error.value)
        if rows:
            refusal = (type(error.value), str(error.value))
    assert (type(error.value), str(error.value)) == refusal
    with pytest.raises(ValueError, match="y must have shape"):
        gp.update(x[:0], y[:1])
    with pytest.raises(TypeError, match="x"):
        gp.update(x[:0].float(), y[:0].float())
    with pytest.raises(TypeError, match="y"):
        gp.update(x[:0], y[:0].float())
    _assert_same_state(before, gp.state_dict())


def test_empty_first_batch_of_the_wrong_width_is_refused_without_drawing():
    """Before any data, an empty batch cannot be featurised (that would fix lazily drawn features on no data), but its
    width is checked against the tree: it was accepted silently, and the stream failed only at its first rows."""
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double()
    gp = StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood().double())
    before = copy.deepcopy(gp.state_dict())
    empty = torch.zeros(0, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"ard_num_dims=2\) sees 3 columns"):
        gp.update(torch.zeros(0, 3, dtype=torch.float64), empty)
    picked = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, active_dims=[0, 4], seed=0)).double()
    with pytest.raises(ValueError, match=r"active_dims=\[0, 4\].*given 3 columns"):
        StreamingFeatureGP(picked, gpytorch.likelihoods.GaussianLikelihood().double()).update(
            torch.zeros(0, 3, dtype=torch.float64), empty)
    assert gp.update(torch.zeros(0, 2, dtype=torch.float64), empty) is gp
    _assert_same_state(before, gp.state_dict())
    assert gp._hyperparameters is None  # nothing drawn or fixed


def test_empty_first_batch_is_checked_against_a_declared_input_dim_and_named_as_x():
    """A map built for input_dim=2 took an empty 3-column first batch silently (only ard_num_dims was read); the
    error of an ard_num_dims contradiction described the batch as "x_sample (1 rows × 3 columns)"."""
    kernel = rfgp.kernels.RandomFeatureKernel(rfgp.features.RandomFourierFeatures(64, input_dim=2, seed=0)).double()
    gp = StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood().double())
    with pytest.raises(ValueError, match=r"input_dim=2\) sees 3 columns \(all columns of x, shape \(0, 3\)\)"):
        gp.update(torch.zeros(0, 3, dtype=torch.float64), torch.zeros(0, dtype=torch.float64))


def test_batch_of_the_wrong_width_is_refused_by_name_under_ard_lengthscales():
    """Streaming featurises without GPyTorch's Kernel.__call__, whose ard_num_dims check then did not run: a
    3-column batch into a 2-column ARD model failed in x / lengthscale with a bare broadcasting RuntimeError."""
    x, y = _data()
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, ard_num_dims=2, seed=0)).double()
    gp = StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood().double()).update(x[:50], y[:50])
    with pytest.raises(ValueError, match=r"x has 3 input column\(s\).*ard_num_dims=2"):
        gp.update(torch.zeros(4, 3, dtype=torch.float64), torch.zeros(4, dtype=torch.float64))


def test_fit_from_batches_passes_over_an_empty_batch():
    x, y = _data()
    keep = torch.ones(len(y), dtype=torch.bool)
    keep[80:120] = False  # the second batch of 40 is filtered out entirely

    def filtering(rows):
        x_batch, y_batch, keep_batch = (torch.stack(column) for column in zip(*rows))
        return x_batch[keep_batch], y_batch[keep_batch]

    loader = DataLoader(TensorDataset(x, y, keep), batch_size=40, collate_fn=filtering)
    assert [len(batch[1]) for batch in loader] == [40, 40, 0, 40, 40, 40]
    model = _model(x, y)
    streamed = fit_from_batches(StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module), loader,
                                progress=False)
    batches = [batch for batch in loader if len(batch[1])]
    reference = fit_from_batches(StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module),
                                 batches, progress=False)
    _assert_same_state(reference.state_dict(), streamed.state_dict())
    assert streamed.num_data == 200


def _count_rank_updates(monkeypatch):
    """Record the rank k of every Cholesky update the streaming model makes."""
    calls = []

    def counting(chol, vectors):
        calls.append(vectors.shape[-1])
        return cholesky_update(chol, vectors)

    monkeypatch.setattr(streaming_module, "cholesky_update", counting)
    return calls


def _exact_posterior(model, x, y, x_test):
    """The ExactGP posterior on all of (x, y): the refit the streaming model must reproduce."""
    model.set_train_data(x, y, strict=False)
    with torch.no_grad():
        return model(x_test)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_rank_updates_equal_refit(dtype, monkeypatch):
    calls = _count_rank_updates(monkeypatch)
    sizes = [1, 1, 5, 3, 1, 4, 2, 1, 1, 5] * 20  # 480 points in 200 updates: the drift check
    x, y = _data(100 + sum(sizes))
    x, y = x.to(dtype), y.to(dtype)
    model = _model(x, y).to(dtype)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update="always")
    streaming.update(x[:100], y[:100]).cholesky()  # the factor exists: batches now update it
    bounds = torch.tensor([0, *sizes]).cumsum(0) + 100
    for start, stop in zip(bounds[:-1], bounds[1:]):
        streaming.update(x[start:stop], y[start:stop])
    assert calls == sizes  # every batch took the rank-k path, none refactorised
    tolerance = {torch.float64: 1e-10, torch.float32: 1e-4}[dtype]
    eye = torch.eye(streaming.gram.shape[-1], dtype=torch.float64)
    refactorised = torch.linalg.cholesky(eye + streaming.gram.double())
    relative = (streaming.cholesky().double() - refactorised).norm() / refactorised.norm()
    assert relative < tolerance
    x_test = torch.rand(7, DIM, dtype=dtype) * 4
    with torch.no_grad():
        streamed = streaming(x_test)
    reference = _exact_posterior(model, x, y, x_test)
    close = {"rtol": 1e-8, "atol": 1e-9} if dtype == torch.float64 else {"rtol": 1e-3, "atol": 1e-3}
    torch.testing.assert_close(streamed.mean, reference.mean, **close)
    torch.testing.assert_close(streamed.covariance_matrix, reference.covariance_matrix, **close)


def test_an_interrupted_rank_update_leaves_the_model_as_it_was(monkeypatch):
    """The statistics were summed before the factor was rank-updated: an update interrupted there (Ctrl-C in an
    O(k·F²) update at a large F, out of memory) left G and B with the new batch and L without it, and the posterior
    was silently that of the mixed state."""
    x, y = _data()
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update="always")
    streaming.update(x[:100], y[:100]).cholesky()
    before = copy.deepcopy(streaming.state_dict())

    def interrupted(chol, vectors):
        raise KeyboardInterrupt

    monkeypatch.setattr(streaming_module, "cholesky_update", interrupted)
    with pytest.raises(KeyboardInterrupt):
        streaming.update(x[100:103], y[100:103])
    _assert_same_state(before, streaming.state_dict())


def test_when_batches_update_the_factor(monkeypatch):
    assert takes_rank_update(63, 1024) and not takes_rank_update(64, 1024)  # k < F/16 ...
    assert not takes_rank_update(1, 512)  # ... once F is large enough to pay
    assert takes_rank_update(500, 512, "always") and not takes_rank_update(1, 4096, "never")
    calls = _count_rank_updates(monkeypatch)
    x, y = _data()
    model = _model(x, y)
    for mode in ("auto", "never"):  # F = 48: "auto" refactorises too
        streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update=mode)
        streaming.update(x[:100], y[:100]).cholesky()
        streaming.update(x[100:101], y[100:101])
        assert calls == [] and streaming._chol is None
    with pytest.raises(ValueError, match="rank_update"):
        StreamingFeatureGP(model.covar_module, model.likelihood, rank_update="sometimes")


@pytest.mark.parametrize(
    "change",
    [
        lambda m: setattr(m.covar_module.base_kernel, "lengthscale", torch.tensor([0.5, 1.2])),
        lambda m: setattr(m.covar_module, "outputscale", 2.0),
        lambda m: setattr(m.likelihood, "noise", 0.1),
        lambda m: m.mean_module.constant.data.fill_(0.0),
        lambda m: m.covar_module.base_kernel.feature_map.resample(torch.Generator().manual_seed(9)),
    ],
    ids=["lengthscale", "outputscale", "noise", "mean", "features"],
)
def test_hyperparameter_change_invalidates_the_statistics(change):
    x, y = _data()
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x[:200], y[:200])
    streaming.cholesky()
    saved = copy.deepcopy(model.state_dict())
    change(model)
    for use in (lambda: streaming.update(x[200:], y[200:]), lambda: streaming(x[:3]), streaming.log_marginal_likelihood):
        with pytest.raises(RuntimeError, match="changed after data were absorbed"):
            use()
    model.load_state_dict(saved)  # restored: the statistics are valid again
    streaming.update(x[200:], y[200:])
    torch.testing.assert_close(streaming.cholesky(), StreamingFeatureGP(
        model.covar_module, model.likelihood, model.mean_module).update(x, y).cholesky(), rtol=1e-12, atol=1e-12)
    change(model)
    streaming.reset().update(x, y)  # reset: streaming with the new hyperparameters is allowed
    assert streaming.num_data == len(y)


def test_a_configuration_change_after_streaming_invalidates_the_statistics():
    """A Nyström kernel's jitter ε (in Φ = K(x, Z)·chol(K(Z, Z) + εI)⁻ᵀ) is a Python attribute, not a parameter or
    buffer: set after streaming, the posterior was that of the stale statistics with the new features (means 0.4 off
    the refit) without a word.  The rfgp modules' configuration fields are now part of the statistics' snapshot."""
    x, y = _data(80)
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.NystromKernel(gpytorch.kernels.RBFKernel(), landmarks=x[:20]))
    streaming = StreamingFeatureGP(kernel.double(), gpytorch.likelihoods.GaussianLikelihood().double()).update(x, y)
    with torch.no_grad():
        before = streaming(x[:3]).mean
    kernel.base_kernel.jitter = 1e-1
    with pytest.raises(RuntimeError, match=r"covar_module.base_kernel.config_jitter changed after data were "
                                           r"absorbed;.*stream the data again\.$"):  # not "converted" (None → 0.1)
        streaming(x[:3])
    kernel.base_kernel.jitter = None
    with torch.no_grad():
        assert torch.equal(streaming(x[:3]).mean, before)


def test_loaded_statistics_are_tied_to_the_loaded_hyperparameters():
    x, y = _data()
    model, streaming, fresh = _fitted_and_loaded_copy(x, y)
    fresh(x[:2])  # the loaded hyperparameters match the loaded statistics
    fresh.float()(x[:2].float())  # moving the model moves the statistics: still valid
    fresh.likelihood.noise = 0.3  # a hyperparameter changes after loading
    with pytest.raises(RuntimeError, match="likelihood.noise_covar.raw_noise"):
        fresh(x[:2].float())


def test_a_model_saved_after_its_hyperparameters_changed_loads_still_refusing_its_statistics():
    """The snapshot of the hyperparameters the statistics were summed with was not in the state dict: a model whose
    outputscale changed after streaming (refused at its next use) was saved and loaded, the loaded model took the
    changed outputscale as that of the statistics and predicted from them without a word.  Now the snapshot is saved
    beside the statistics (and the state dict round-trips bit for bit); restoring the hyperparameter makes both
    valid."""
    x, y = _data(60)
    model, streaming, _ = _fitted_and_loaded_copy(x, y)
    original = model.covar_module.raw_outputscale.detach().clone()
    model.covar_module.outputscale = 5.0
    saved = copy.deepcopy(streaming.state_dict())
    other = _model(x[:3], y[:3], seed=7)
    fresh = StreamingFeatureGP(other.covar_module, other.likelihood, other.mean_module)
    fresh.load_state_dict(saved)  # strict: the snapshot's keys are the model's own
    _assert_same_state(saved, fresh.state_dict())
    for gp in (streaming, fresh):
        with pytest.raises(RuntimeError, match="covar_module.raw_outputscale changed after data were absorbed"):
            gp(x[:2])
        gp.covar_module.raw_outputscale.data.copy_(original)
    with torch.no_grad():
        assert torch.equal(fresh(x[:2]).mean, streaming(x[:2]).mean)
    assert saved["statistics_hyperparameters.covar_module.raw_outputscale"].equal(original)
    unsaved = {key: value for key, value in saved.items() if not key.startswith("statistics_hyperparameters.")}
    fresh.load_state_dict(unsaved)  # saved before the snapshot was: the loaded hyperparameters are taken as its own
    fresh(x[:2])


def test_a_partial_load_that_changes_hyperparameters_but_not_the_statistics_invalidates_them():
    """load_state_dict(strict=False) of another model's hyperparameters without the statistics re-snapshotted the
    loaded hyperparameters as those of the kept statistics: the posterior was silently that of the old noise and
    outputscale applied to statistics summed under the new ones (0.39 against the refit's 0.17)."""
    x, y = _data(60)
    model, streaming, _ = _fitted_and_loaded_copy(x, y)
    other = _model(x, y)
    other.likelihood.noise = 0.3
    hyperparameters = {name: value for name, value in StreamingFeatureGP(
        other.covar_module, other.likelihood, other.mean_module).state_dict().items()
        if name not in streaming_module._STATISTICS}
    original_noise = streaming.likelihood.raw_noise.detach().clone()
    streaming.load_state_dict(hyperparameters, strict=False)
    with pytest.raises(RuntimeError, match="likelihood.noise_covar.raw_noise changed after data were absorbed"):
        streaming(x[:2])
    streaming.load_state_dict({**hyperparameters, "likelihood.noise_covar.raw_noise": original_noise},
                              strict=False)  # the statistics' own hyperparameters again: valid
    streaming(x[:2])


@pytest.mark.parametrize("rank_update", ["never", "always"])
def test_float32_streaming_at_a_high_signal_to_noise_ratio_matches_float64(rank_update):
    """The IGRF fit of tests/inference/test_float32_training.py (N = 1500, F = 512, outputscale 84, noise 4.4e-4;
    ‖G‖ = ‖ΦᵀWΦ‖ = 2.3·10⁷, 291 eigenvalues of G below 1), streamed.

    Before: the float32 factor of I + G broke down (linear_operator's 'not positive definite after repeatedly adding
    jitter up to 1e-4'); then, factorised in float64 from G summed in float32, I + G's smallest eigenvalue was the
    rounding of the float32 sums (errors ≈ eps₃₂·‖G‖ = 2.7, measured 1.7 in spectral norm, against the 1 that I adds):
    −0.06 to 0.04 as rounding-level changes of Φ (√s folded into the features instead of multiplied) moved it, and
    the refactorisation failed or not by chance.  Now G and B are summed in float64 from the float32 features: G is
    the Gram matrix of the rounded features, so I + G ≥ 1 − O(eps₆₄·‖G‖) = 1 − 5·10⁻⁹ (measured 1 − 1.3·10⁻⁹).

    What remains is the float32 features' own rounding, δ ≤ 1.6·10⁻⁶ relative (measured; cos and sin of float32
    projections Wu of size ≲ 20): the float32 stream is the float64 model of perturbed features, whose log p(y), mean
    and variance move by O(δ) times their sensitivities (measured 3.3·10⁻⁵ = 20δ for log p(y), a sum over 1500 points
    in which q − ‖L⁻¹B‖² cancels; 8·10⁻⁷ for the mean; 5·10⁻⁶ for the variance).  The tolerances are ten times
    those (and ≥ 10δ); the float32 sums' errors were 5·10⁻³, 1·10⁻³ and 1·10⁻².  The rank-updated factor's update
    V = ΦₖᵀW^½ was formed in float32 (the weights 3.5·10⁻⁴ off those of the refactorised I + G); now in float64."""
    results = []
    for dtype in (torch.float32, torch.float64):
        model = igrf_model(dtype, False, 512)
        x, y = model.train_inputs[0], model.train_targets
        streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update=rank_update)
        with recorded_statistics_dtypes() as dtypes:
            streaming.update(x[:1400], y[:1400]).cholesky()
            for start in range(1400, 1500, 25):  # absorbed by rank-25 updates of the factor, or refactorised
                streaming.update(x[start:start + 25], y[start:start + 25])
        assert dtypes == ([torch.float64] * 5 if dtype == torch.float32 else [])  # u·tr(G) = 30 from the start
        assert streaming.cholesky().dtype == streaming.gram.dtype == torch.float64
        eye = torch.eye(streaming.gram.shape[-1], dtype=torch.float64)
        assert torch.linalg.eigvalsh(eye + streaming.gram)[0] >= 1 - 1e-7
        # the rank-updated factor is that of I + G: its update V = ΦₖᵀW^½ was formed in float32, ‖A⁻¹(LLᵀ − A)‖₂ = 10⁻²
        factor, capacitance = streaming.cholesky(), eye + streaming.gram
        assert torch.linalg.matrix_norm(torch.linalg.solve(capacitance, factor @ factor.mT - capacitance), 2) < 1e-7
        with torch.no_grad():
            posterior = streaming(x[:50] * 1.01)
        results.append([streaming.log_marginal_likelihood().reshape(1), posterior.mean, posterior.variance])
    for value, reference, tol in zip(*results, (3e-4, 2e-5, 5e-5)):
        assert value.dtype == torch.float32
        assert (value.double() - reference).norm() <= tol * reference.norm()


def test_float32_stream_forms_batches_in_float32_until_its_rounding_estimate_exceeds_the_tolerance():
    """Each batch's ΦₖᵀWΦₖ is formed in float32 while u·tr(G) of the whole stream, this batch included, stays within
    rfgp.settings.float32_statistics_tolerance (here 10⁻⁴: u·tr(G) grows by 3·10⁻⁵ per batch of 20 points), in float64
    from then on; G is stored in float64 either way, and the stream equals the float64 one to float32 rounding."""
    x, y = _data()
    batches = [(x[i:i + 20], y[i:i + 20]) for i in range(0, len(y), 20)]
    model = _model(x, y)
    weights = model.likelihood.noise.detach().reciprocal().expand(20)
    traces = torch.stack([weighted_square_norm(streaming_module.kernel_features(model.covar_module, xb), weights)
                          for xb, _ in batches]).cumsum(0)
    expected = [torch.float32 if bound <= 1e-4 else torch.float64 for bound in traces * unit_roundoff(torch.float32)]
    assert expected[0] == torch.float32 and expected[-1] == torch.float64  # the stream crosses the tolerance
    results = []
    for dtype in (torch.float32, torch.float64):
        model = _model(x, y).to(dtype)
        streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module)
        with rfgp.settings.float32_statistics_tolerance(1e-4), recorded_statistics_dtypes() as dtypes:
            for xb, yb in batches:
                streaming.update(xb.to(dtype), yb.to(dtype))
        assert dtypes == (expected if dtype == torch.float32 else [])
        assert streaming.gram.dtype == streaming.cross.dtype == torch.float64
        results.append((streaming.gram, streaming.cross, streaming.log_marginal_likelihood().double()))
    for value, reference in zip(*results):
        torch.testing.assert_close(value, reference, rtol=1e-5, atol=1e-4)


def _streamed(dtype, x, y, batch_size):
    model = _model(x, y).to(dtype)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module)
    for start in range(0, len(x), batch_size):
        streaming.update(x[start:start + batch_size].to(dtype), y[start:start + batch_size].to(dtype))
    return streaming


def test_float32_stream_of_many_small_batches_sums_every_statistic_in_float64():
    """q = ΣrᵀWr, ℓ = Σ log σ² and n are summed in float64 for float32 inputs, as G and B are: summed in float32 over
    one-point updates, ℓ drifted by 2·10⁻⁴ relative after 2·10⁴ of them (31 nats of log p(y)), and q by 2·10⁻⁶."""
    x, y = _data(1200)
    y = y + 3.0  # a residual far from 0: q grows with every point
    wide, narrow = _streamed(torch.float64, x, y, 1), _streamed(torch.float32, x, y, 1)
    # measured before: q, ℓ and log p(y) 4.6·10⁻⁷, 1.6·10⁻⁵ and 1.1·10⁻⁴ off; now 1.0·10⁻⁷ (the float32 model's own
    # rounding of r and σ²), 1.8·10⁻⁸ and 4·10⁻⁷
    for name, rtol in (("weighted_square", 3e-7), ("noise_logdet", 1e-6), ("count", 0)):
        assert getattr(narrow, name).dtype == torch.float64, name
        torch.testing.assert_close(getattr(narrow, name), getattr(wide, name), rtol=rtol, atol=0, msg=name)
    torch.testing.assert_close(narrow.log_marginal_likelihood().double(), wide.log_marginal_likelihood(),
                               rtol=1e-5, atol=0)


def test_float32_stream_counts_past_two_to_the_24_points():
    """A stream resumed at n = 2²⁴ points counts the next one (a float32 n + 1 rounded back to 2²⁴)."""
    x, y = _data(20)
    streaming = _streamed(torch.float32, x, y, 10)
    state = streaming.state_dict()
    state["count"] = torch.full_like(state["count"], 2.0**24)
    streaming.load_state_dict(state)
    streaming.update(x[:1].float(), y[:1].float())
    assert streaming.num_data == 2**24 + 1


def test_converting_a_float32_stream_to_float64_is_refused_naming_the_conversion():
    """model.double() after a float32 stream re-draws the seeded features in float64, so the statistics no longer
    match; the refusal named only the draws ("feature_map.frequencies changed"), which the user had not touched."""
    x, y = _data(60)
    streaming = _streamed(torch.float32, x, y, 20)
    streaming.double()
    with pytest.raises(RuntimeError, match=r"frequencies changed.*converted from torch.float32 to torch.float64"):
        streaming(x[:2])


def test_model_float_keeps_the_float64_sums_of_a_float32_stream():
    """model.float() (or .to(device)) after streaming keeps G, B, q, ℓ and n in float64: rounding them to float32
    loses what the float64 sums are for (the factorisation of I + G at a high signal-to-noise ratio)."""
    x, y = _data(60)
    streaming = _streamed(torch.float32, x, y, 20)
    before = {name: getattr(streaming, name).clone() for name in streaming_module._STATISTICS}
    streaming.float()
    for name, value in before.items():
        assert getattr(streaming, name).dtype == torch.float64 and torch.equal(getattr(streaming, name), value), name


def test_moving_the_model_keeps_the_rank_updated_factor(device):
    """.to(device) dropped the factor L, refactorised at the next prediction: after rank updates that differs by
    rounding, and a no-op model.to("cpu") moved the means by 4·10⁻¹⁶.  The factor now moves with the statistics."""
    x, y = _data()
    streaming = _rank_updated_stream(x, y, 100, 3)
    x_test = torch.rand(6, DIM, dtype=torch.float64)
    with torch.no_grad():
        before = streaming(x_test).mean
    factor = streaming.factor.clone()
    streaming.to(device)
    assert torch.equal(streaming.factor.cpu(), factor)
    with torch.no_grad():
        after = streaming(x_test.to(device)).mean.cpu()
    assert torch.equal(after, before) if device.type == "cpu" else torch.allclose(after, before, rtol=1e-12, atol=1e-14)
    loaded = StreamingFeatureGP(*(copy.deepcopy(m) for m in (streaming.covar_module, streaming.likelihood,
                                                              streaming.mean_module)))
    loaded.to(device).load_state_dict({key: value.cpu() for key, value in streaming.state_dict().items()})
    assert all(getattr(loaded, name).device == device for name in (*streaming_module._STATISTICS, "factor"))


def _noisy_data(n=240):
    """Targets observed with known noise variances spanning three decades (sensors of different accuracy)."""
    x, y = _data(n)
    gen = torch.Generator().manual_seed(8)
    noise = 10 ** (3 * torch.rand(n, generator=gen, dtype=torch.float64) - 3)  # 1e-3 … 1
    return x, y + noise.sqrt() * torch.randn(n, generator=gen, dtype=torch.float64), noise


def _fixed_noise_reference(model, x, y, noise, x_test):
    """Posterior at x_test and log p(y) (a sum) of the ExactGP with FixedNoiseGaussianLikelihood(noise) on model's
    kernel (the same features) and mean."""
    likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise, learn_additional_noise=False).double()
    reference = ExactGPModel(x, y, likelihood, model.covar_module, model.mean_module).double()
    with torch.no_grad():
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, reference)(reference(x), y) * len(y)
        reference.eval()
        return reference(x_test), mll


@pytest.mark.parametrize("rank_update", ["never", "always"])
def test_per_point_noise_equals_the_fixed_noise_gp_after_any_sequence_of_updates(rank_update):
    """Streaming with ``noise=`` per batch — batches of different sizes, some without noise (the likelihood's σ²
    then), the factor refactorised or rank-updated — equals the FixedNoiseGaussianLikelihood ExactGP on all points
    to 1e-10 (float64): posterior mean, covariance and log p(y) after every update; before, update took no noise."""
    x, y, noise = _noisy_data()
    model = _model(x, y)
    sigma2 = model.likelihood.noise.detach().expand(len(y))
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module, rank_update=rank_update)
    x_test = torch.rand(8, DIM, generator=torch.Generator().manual_seed(9), dtype=torch.float64) * 4
    bounds = [0, 50, 51, 57, 120, 121, 200, 240]
    given = [True, True, False, True, True, False, True]
    absorbed = torch.zeros(0, dtype=torch.float64)
    for (start, stop), known in zip(zip(bounds[:-1], bounds[1:]), given):
        streaming.update(x[start:stop], y[start:stop], noise=noise[start:stop] if known else None)
        absorbed = torch.cat((absorbed, noise[start:stop] if known else sigma2[start:stop]))
        streaming.cholesky()  # the factor exists: the next batch may rank-update it
        reference, mll = _fixed_noise_reference(model, x[:stop], y[:stop], absorbed, x_test)
        with torch.no_grad():
            streamed = streaming(x_test)
        torch.testing.assert_close(streamed.mean, reference.mean, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(streamed.covariance_matrix, reference.covariance_matrix, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(streaming.log_marginal_likelihood(), mll, rtol=1e-10, atol=1e-10)
    # the noise is a per-point weight: the same data with σ² everywhere is another posterior
    plain = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x, y)
    with torch.no_grad():
        assert float((plain(x_test).mean - streaming(x_test).mean).abs().max()) > 1e-2


def test_per_point_noise_streamed_through_fit_from_batches_and_a_state_dict_round_trip():
    """``fit_from_batches`` takes (x, y, noise) triples (a DataLoader of TensorDataset(x, y, noise)); the state
    (sums of the noise-weighted statistics) round-trips bit for bit into a differently seeded model."""
    x, y, noise = _noisy_data()
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module)
    fit_from_batches(streaming, DataLoader(TensorDataset(x, y, noise), batch_size=70), progress=False)
    x_test = torch.rand(6, DIM, generator=torch.Generator().manual_seed(10), dtype=torch.float64) * 4
    reference, mll = _fixed_noise_reference(model, x, y, noise, x_test)
    with torch.no_grad():
        streamed = streaming(x_test)
    torch.testing.assert_close(streamed.mean, reference.mean, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(streamed.covariance_matrix, reference.covariance_matrix, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(streaming.log_marginal_likelihood(), mll, rtol=1e-10, atol=1e-10)
    other = _model(x[:3], y[:3], seed=7)
    fresh = StreamingFeatureGP(other.covar_module, other.likelihood, other.mean_module)
    fresh.load_state_dict(streaming.state_dict())
    with torch.no_grad():
        assert torch.equal(fresh(x_test).mean, streamed.mean)
        assert torch.equal(fresh(x_test).covariance_matrix, streamed.covariance_matrix)
    assert torch.equal(fresh.log_marginal_likelihood(), streaming.log_marginal_likelihood())


def test_bad_per_point_noise_is_refused_by_name_and_leaves_the_model_unchanged():
    x, y, noise = _noisy_data(20)
    model = _model(x, y)
    gp = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module).update(x[:10], y[:10])
    before = {name: t.clone() for name, t in gp.state_dict().items()}
    bad = [
        (noise[10:19], ValueError, r"noise must hold one noise variance per point, of the shape of y \(10,\)"),
        (noise[10:].float(), TypeError, "noise"),
        ([0.1] * 10, TypeError, "noise"),
        (torch.cat((noise[10:19], noise.new_zeros(1))), ValueError, "noise must hold noise variances > 0"),
        (torch.cat((noise[10:19], noise.new_full((1,), -1.0))), ValueError, "> 0.*-1"),
        (torch.cat((noise[10:19], noise.new_full((1,), float("nan")))), ValueError, "noise.*NaN"),
    ]
    for value, error, message in bad:
        with pytest.raises(error, match=message):
            gp.update(x[10:], y[10:], noise=value)
    _assert_same_state(before, gp.state_dict())
    with pytest.raises(ValueError, match=r"\(x, y, noise\) triple, got a tuple of length 4"):
        fit_from_batches(gp, [(x, y, noise, noise)], progress=False)


@pytest.mark.parametrize("module", ["likelihood", "mean_module"])
def test_a_non_finite_noise_or_mean_is_refused_by_name_and_leaves_the_model_unchanged(module):
    """A NaN noise or prior mean (a diverged hyperparameter) at the first batch was summed into the statistics — G and B
    NaN for good — and the next call said the hyperparameter had "changed" (NaN ≠ NaN in the snapshot)."""
    x, y = _data(40)
    model = _model(x, y)
    streaming = StreamingFeatureGP(model.covar_module, model.likelihood, model.mean_module)
    before = copy.deepcopy(streaming.state_dict())
    parameter = {"likelihood": model.likelihood.raw_noise, "mean_module": model.mean_module.raw_constant}[module]
    saved = parameter.detach().clone()
    parameter.data.fill_(float("nan"))
    name = {"likelihood": r"likelihood\.noise", "mean_module": r"mean_module\(x\)"}[module]
    with pytest.raises(ValueError, match=f"{name}.*NaN"):
        streaming.update(x, y)
    parameter.data.copy_(saved)  # repaired: the stream starts as if nothing happened
    _assert_same_state(before, streaming.state_dict())
    assert streaming.num_data == 0 and streaming._hyperparameters is None
    streaming.update(x, y)
    with torch.no_grad():
        torch.testing.assert_close(streaming(x[:3]).mean, _exact_posterior(model, x, y, x[:3]).mean)


def test_a_one_dimensional_x_is_named_as_the_input_not_the_targets():
    """``update(x of shape (5,), y of shape (5,))`` said "y must have shape () to match x of shape (5,)", blaming
    the targets for inputs without their (k, d) layout."""
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, input_dim=1, seed=0)).double()
    gp = StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood().double())
    x = torch.rand(5, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"x must have shape \(\.\.\., n, d\), got shape \(5,\)"):
        gp.update(x, torch.sin(x))
