"""Two gloo processes on localhost give the single-process MLL, gradients and predictions."""

import contextlib
import datetime
import re
import socket

import gpytorch
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from linear_operator.operators import LinearOperator

import rfgp
from rfgp.core.validation import NonFiniteHyperparameterError
from rfgp.inference.kernel_evaluation import evaluated_covariance
from rfgp.inference.statistics_precision import recorded_statistics_dtypes
from rfgp.kernels import NystromKernel, SketchedPolynomialKernel, SketchedRBFKernel
from rfgp.models import ExactGPModel

from .._models import BatchIndependentGP, MultitaskGP, vector_field_kernel

WORLD_SIZE, NUM_TRAIN, DIM = 2, 150, 2


def _data():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(NUM_TRAIN, DIM, generator=gen, dtype=torch.float64)
    y = torch.cos(x).sum(-1) + 0.1 * torch.randn(NUM_TRAIN, generator=gen, dtype=torch.float64)
    return x, y, torch.randn(7, DIM, generator=gen, dtype=torch.float64)


def _model(x, y, high_snr=False):
    kernel = gpytorch.kernels.ScaleKernel(
        SketchedRBFKernel(32, ard_num_dims=DIM, seed=0, lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 4.0))
    )
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(x.dtype)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2)
    if high_snr:  # sin/cos features, ‖φ‖² = s: u·tr(ΦᵀD⁻¹Φ) = u·N·s/σ² = 0.15 on all N points, 0.075 on a rank's N/2
        model.covar_module.outputscale = 10.0
        model.likelihood.noise = 10.0 * NUM_TRAIN * 2.0**-24 / 0.15
    return model


def _mll_grads_prediction(model, x, y, x_test, mll, latent=False):
    """Loss, gradients, posterior mean and variance, and the statistics dtypes that every evaluation chose."""
    with recorded_statistics_dtypes() as dtypes:
        loss = -mll(model(x), y).sum()  # a batch of GPs (Dirichlet classification): the sum of their losses
        loss.backward()
        if dist.is_initialized():
            rfgp.inference.distributed.sync_gradients(model)
        grads = {name: p.grad.clone() for name, p in model.named_parameters()}
        model.eval()
        with torch.no_grad():
            prediction = model(x_test) if latent else model.likelihood(model(x_test))
    return {"loss": loss.detach(), "grads": grads, "mean": prediction.mean, "var": prediction.variance,
            "dtypes": list(dtypes)}


# (dtype, chunk size, rows per float64 cast) of the single-output model: materialised and chunked features on each
# rank; in float32 at a signal-to-noise ratio where the precision rule flips between a rank's shard and all points
# (_model's high_snr), also with Φ cast to float64 in blocks of 32 rows (rfgp.inference.linalg.cast_row_blocks)
SINGLE_OUTPUT_RUNS = [(torch.float64, None, None), (torch.float64, 32, None), (torch.float32, None, None),
                      (torch.float32, 32, None), (torch.float32, None, 32)]


def _single_output_result(dtype, chunk_size, cast_rows, shard=slice(None), distributed=False):
    x, y, x_test = (t.to(dtype) for t in _data())
    model = _model(x[shard], y[shard], high_snr=dtype == torch.float32)
    mll_class = (rfgp.inference.distributed.DistributedExactMarginalLogLikelihood if distributed
                 else gpytorch.mlls.ExactMarginalLogLikelihood)
    default_block = rfgp.inference.linalg.CAST_BLOCK_ELEMENTS
    if cast_rows is not None:  # max(F, elements/F) rows per block
        rfgp.inference.linalg.CAST_BLOCK_ELEMENTS = cast_rows * model.covar_module.base_kernel.num_features
    try:
        with rfgp.settings.chunk_size(chunk_size):
            return _mll_grads_prediction(model, x[shard], y[shard], x_test, mll_class(model.likelihood, model))
    finally:
        rfgp.inference.linalg.CAST_BLOCK_ELEMENTS = default_block


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spawn(worker, path, timeout: float | None = None):
    """Run ``worker(rank, path)`` on each of WORLD_SIZE processes in a gloo group on a free port (``timeout``: seconds
    a collective waits before it fails, so that a rank left waiting fails the test instead of hanging it); returns
    ``path``, the folder of their results."""
    mp.spawn(_in_group, args=(worker, _free_port(), str(path), timeout), nprocs=WORLD_SIZE, join=True)
    return path


def _in_group(rank, worker, port, path, timeout):
    """One rank of :func:`_spawn`: one thread (two ranks' thread pools would oversubscribe the cores and delay every
    collective 3×), the process group around ``worker(rank, path)``."""
    torch.set_num_threads(1)
    options = {} if timeout is None else {"timeout": datetime.timedelta(seconds=timeout)}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE,
                            **options)
    try:
        worker(rank, path)
    finally:
        dist.destroy_process_group()


#: relative tolerances (loss, gradient, posterior mean and variance) of two processes against one.  float64:
#: elementwise, the same sums in another order.  float32: normwise (relative to the largest entry), the same float32
#: statistics summed in another order (each rank's half, then the all-reduce) — the model's own rounding, measured up
#: to 1.8·10⁻⁵ (loss of the high signal-to-noise single-output model, whose rᵀD⁻¹r ≈ 2.6·10³ per point cancels
#: against BᵀA⁻¹B down to a loss of 5.7), 2.7·10⁻⁵ (gradients), 4·10⁻⁶ (posterior mean; the N × N path of one process
#: against the F × F one of two for "kernel-space"); about 5× that.  Whether the two formed their statistics in the
#: same precision is compared exactly, on the recorded dtypes.
TOLERANCES = {torch.float64: (1e-10, 1e-9, 1e-9, 1e-9), torch.float32: (1e-4, 2e-4, 2e-5, 2e-5)}


def _assert_close(actual, expected, tolerance, what):
    if expected.dtype == torch.float64:  # elementwise
        torch.testing.assert_close(actual, expected, rtol=tolerance, atol=1e-12, msg=str(what))
    else:  # normwise: the float32 rounding of an entry near 0 is relative to the largest
        error = ((actual - expected).abs().max() / expected.abs().max()).item()
        assert actual.dtype == expected.dtype and error <= tolerance, (what, error)


def _assert_matches(result, reference, what):
    """``result`` of one rank equals the one-process ``reference`` to the tolerance of its dtype, and every
    evaluation formed its statistics in the same dtype."""
    loss, grad_tol, mean, var = TOLERANCES[reference["loss"].dtype]
    assert result["dtypes"] == reference["dtypes"], (what, result["dtypes"], reference["dtypes"])
    for key, tolerance in (("loss", loss), ("mean", mean), ("var", var)):
        _assert_close(result[key], reference[key], tolerance, (what, key))
    for name, grad in reference["grads"].items():
        assert grad.abs().max() > 0, (what, name)
        _assert_close(result["grads"][name], grad, grad_tol, (what, name))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_gloo_processes_match_one(spawned):
    """A single-output model, materialised and chunked, in float64 and in float32 at a high signal-to-noise ratio:
    its float32 statistics are float64 on both ranks (u·tr(ΦᵀD⁻¹Φ) of all points is above the tolerance), as on one
    process, although each rank's shard alone would keep float32."""
    for run in SINGLE_OUTPUT_RUNS:
        reference = _single_output_result(*run)
        if run[0] == torch.float32:
            assert set(reference["dtypes"]) == {torch.float64}, reference["dtypes"]
        for rank in range(WORLD_SIZE):
            result = torch.load(spawned / f"rank{rank}-single-{run}.pt")
            _assert_matches(result, reference, (run, rank))
            if run[0] == torch.float32:
                shard_alone = torch.load(spawned / f"rank{rank}-single-{run}-shard.pt")
                assert set(shard_alone) == {torch.float32}, shard_alone


NUM_CASE_TRAIN = 40
# kind: (model, likelihood rank, chunk size, NaN targets).  A sketched MultitaskKernel's Kronecker statistics under
# rank-0 and rank-1 noise, also chunked (rows of φ in blocks, rfgp.inference.chunked_kronecker); the whitened root
# (rfgp.inference.task_noise) of missing targets (also chunked), of a curl-free field and of an LCM sum;
# batch-independent outputs; Dirichlet classification (batched per-point noise; a kernel shared by the classes:
# per-label statistics, rfgp.inference.classification, also chunked); fixed per-point noise; N < F, where one process
# takes the kernel-space path and data_parallel the F × F capacitance; Nyström roots K(x, Z)L⁻ᵀ at landmarks given
# by hand (rfgp.inference.triangular_statistics, also chunked); complex features
# (rfgp.inference.complex_posterior)
MODEL_KINDS = {
    "multitask-rank0": ("multitask", 0, None, False),
    "multitask-rank1": ("multitask", 1, None, False),
    "multitask-rank1-chunked": ("multitask", 1, 8, False),
    "multitask-rank1-masked": ("multitask", 1, None, True),
    "multitask-rank1-chunked-masked": ("multitask", 1, 8, True),
    "lcm-rank1": ("lcm", 1, None, False),
    "curl-free-rank0": ("curl_free", 0, None, False),
    "curl-free-rank1": ("curl_free", 1, None, False),
    "independent-rank0": ("independent", 0, None, False),
    "independent-rank1-masked": ("independent", 1, None, True),
    "dirichlet": ("dirichlet", None, None, False),
    "dirichlet-shared": ("dirichlet_shared", None, None, False),
    "dirichlet-shared-chunked": ("dirichlet_shared", None, 8, False),
    "fixed-noise": ("fixed_noise", None, None, False),
    "kernel-space": ("kernel_space", None, None, False),
    "nystrom": ("nystrom", None, None, False),
    "nystrom-chunked": ("nystrom", None, 8, False),
    "complex-posterior": ("complex_posterior", None, None, False),
}


def _case_data(num_outputs, masked, dtype=torch.float64):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(NUM_CASE_TRAIN, DIM, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(x[:, 0] + t) for t in range(num_outputs)], -1)
    y = y + 0.1 * torch.randn(NUM_CASE_TRAIN, num_outputs, generator=gen, dtype=torch.float64)
    if masked:  # missing task values on both ranks' shards
        y[torch.rand(NUM_CASE_TRAIN, num_outputs, generator=gen) < 0.2] = float("nan")
    return x.to(dtype), y.to(dtype), torch.randn(5, DIM, generator=gen, dtype=torch.float64).to(dtype)


def _case_model(kind, x, y):
    """The model of ``kind`` on (x, y), its parameters the same on every rank (IndexKernel draws its factor)."""
    name, likelihood_rank, _, _ = MODEL_KINDS[kind]
    if name in ("multitask", "lcm", "curl_free", "independent"):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=y.shape[-1], rank=likelihood_rank)
    if name == "multitask":
        kernel = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=y.shape[-1], rank=1)
        model = MultitaskGP(x, y, likelihood, rfgp.sketch(kernel, 8, seed=0))
    elif name == "lcm":
        bases = [gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()]
        kernel = rfgp.sketch(gpytorch.kernels.LCMKernel(bases, num_tasks=y.shape[-1], rank=1), 8, seed=0)
        model = MultitaskGP(x, y, likelihood, kernel)
    elif name == "curl_free":
        model = MultitaskGP(x, y, likelihood, vector_field_kernel("curl_free", 8, DIM))
    elif name == "independent":
        tasks = torch.Size([y.shape[-1]])
        exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=tasks), batch_shape=tasks)
        model = BatchIndependentGP(x, y, rfgp.sketch(exact, 8, seed=0), likelihood)
    elif name in ("dirichlet", "dirichlet_shared"):
        labels = (y[:, 0] > 0).long() + (y[:, 1] > 0).long()
        likelihood = rfgp.likelihoods.DirichletClassificationLikelihood(labels, num_classes=3, dtype=x.dtype)
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
        classes = torch.Size([3] if name == "dirichlet" else [])
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0, batch_shape=classes), batch_shape=classes)
        model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean)
    elif name == "nystrom":  # landmarks given by hand: the same on every rank
        landmarks = torch.randn(8, DIM, generator=torch.Generator().manual_seed(8), dtype=torch.float64).to(x.dtype)
        kernel = NystromKernel(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), landmarks=landmarks)
        model = ExactGPModel(x, y[:, 0], gpytorch.likelihoods.GaussianLikelihood(), kernel)
    elif name == "complex_posterior":
        kernel = SketchedPolynomialKernel(3, 12, weights="complex", complex_posterior=True, seed=3)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = ExactGPModel(x, y[:, 0], likelihood, gpytorch.kernels.ScaleKernel(kernel))
    else:
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64 if name == "kernel_space" else 16, seed=0))
        likelihood = (gpytorch.likelihoods.FixedNoiseGaussianLikelihood(0.01 + y[:, 1].abs())
                      if name == "fixed_noise" else gpytorch.likelihoods.GaussianLikelihood())
        model = ExactGPModel(x, y[:, 0], likelihood, kernel)
    model = model.to(x.dtype)
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():  # drawn in float64: a float32 model is the float64 one rounded
        for p in model.parameters():
            p.copy_(0.2 + 0.3 * torch.rand(p.shape, generator=gen, dtype=torch.float64))
    return model


#: a float32 tolerance (rfgp.settings.float32_statistics_tolerance) per kind at which the precision rule flips: between
#: each shard's a-priori estimate u·tr(ΦᵀD⁻¹Φ) (at most 0.6 of the global one here) and the estimate of all points
#: (0.75 of it), so that both ranks must form float64 statistics as one process does although each shard alone keeps
#: float32 (both checked); a decision from a rank's own data would differ from one process, or between the ranks
FLIP_TOLERANCES = {
    "multitask-rank0": 2.8e-6, "multitask-rank1": 4.9e-6, "multitask-rank1-chunked": 4.9e-6,
    "multitask-rank1-masked": 4.2e-6, "multitask-rank1-chunked-masked": 4.2e-6, "lcm-rank1": 1.05e-5,
    "curl-free-rank0": 3.7e-6, "curl-free-rank1": 6.6e-6, "independent-rank0": 9.5e-7,
    "independent-rank1-masked": 2.3e-6, "dirichlet": 1.3e-6, "dirichlet-shared": 1.3e-6,
    "dirichlet-shared-chunked": 1.3e-6, "fixed-noise": 6.3e-6, "kernel-space": 2e-6, "nystrom": 1.6e-6,
    "nystrom-chunked": 1.6e-6, "complex-posterior": 1.2e-4,
}
#: (kind, dtype, float32 tolerance or None for the default): every kind in float64, in float32, and flipped
CASE_RUNS = [(kind, dtype, None) for dtype in (torch.float64, torch.float32) for kind in MODEL_KINDS]
CASE_RUNS += [(kind, torch.float32, FLIP_TOLERANCES[kind]) for kind in MODEL_KINDS]


def _case_result(kind, shard=slice(None), distributed=False, dtype=torch.float64, tolerance=None):
    name, _, chunk_size, masked = MODEL_KINDS[kind]
    x, y, x_test = _case_data(3 if name in ("multitask", "lcm") else DIM, masked, dtype)
    model = _case_model(kind, x[shard], y[shard])
    mll_class = (rfgp.inference.distributed.DistributedExactMarginalLogLikelihood if distributed
                 else gpytorch.mlls.ExactMarginalLogLikelihood)
    mll = mll_class(model.likelihood, model)
    tolerance = rfgp.settings.float32_statistics_tolerance.DEFAULT if tolerance is None else tolerance
    with (rfgp.settings.chunk_size(chunk_size), rfgp.settings.float32_statistics_tolerance(tolerance),
          gpytorch.settings.observation_nan_policy("mask" if masked else "ignore")):
        return _mll_grads_prediction(model, x[shard], model.train_targets, x_test, mll,
                                     latent=name in ("dirichlet", "dirichlet_shared", "fixed_noise"))


def _refusal(model, x, y) -> str | None:
    """The message of the ``ValueError`` that the distributed MLL raises on this rank, ``None`` if it evaluates."""
    mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model)
    try:
        mll(model(x), y)
    except ValueError as error:
        return str(error)
    return None


def _scope_means(model, x_test):
    """Posterior means of one eval-mode model inside data_parallel, outside it, and inside again."""
    model.eval()
    means = []
    with torch.no_grad():
        for reduced in (True, False, True):
            with rfgp.inference.distributed.data_parallel() if reduced else contextlib.nullcontext():
                means.append(model(x_test).mean)
    return means


def _posterior_mean(model, x_test):
    model.eval()
    with torch.no_grad():
        return model(x_test).mean


def _worker(rank, path):
    """Every distributed run of this file on one rank (a single spawn): the single-output model, every case of
    :data:`CASE_RUNS`, the differing-rank refusals; with the flip cases' shard-alone decisions beside."""
    shard = slice(rank * NUM_TRAIN // WORLD_SIZE, (rank + 1) * NUM_TRAIN // WORLD_SIZE)
    for run in SINGLE_OUTPUT_RUNS:
        with rfgp.inference.distributed.data_parallel():
            torch.save(_single_output_result(*run, shard, distributed=True), f"{path}/rank{rank}-single-{run}.pt")
        if run[0] == torch.float32:
            shard_alone = _single_output_result(*run, shard)["dtypes"]
            torch.save(shard_alone, f"{path}/rank{rank}-single-{run}-shard.pt")
    shard = slice(rank * NUM_CASE_TRAIN // WORLD_SIZE, (rank + 1) * NUM_CASE_TRAIN // WORLD_SIZE)
    for kind, dtype, tolerance in CASE_RUNS:
        with rfgp.inference.distributed.data_parallel():
            result = _case_result(kind, shard, True, dtype, tolerance)
        torch.save(result, f"{path}/rank{rank}-{kind}-{dtype}-{tolerance}.pt")
        if tolerance is not None:
            torch.save(_case_result(kind, shard, False, dtype, tolerance)["dtypes"],
                       f"{path}/rank{rank}-{kind}-{dtype}-{tolerance}-shard.pt")
    x, y, _ = _case_data(3, False)
    torch.manual_seed(rank)  # unseeded ranks: GPyTorch's IndexKernel draws another task factor on each
    model = MultitaskGP(x[shard], y[shard], gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3),
                         rfgp.sketch(gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), 3, rank=1), 8))
    torch.save(_refusal(model, x[shard], y[shard]), f"{path}/rank{rank}-different-parameters.pt")
    torch.manual_seed(0)  # the same parameters, but each rank's own random features
    x, y, x_test = _data()
    model = _model(x[shard], y[shard])
    model.covar_module.base_kernel = SketchedRBFKernel(32, ard_num_dims=DIM, seed=rank).double()
    torch.save(_refusal(model, x[shard], y[shard]), f"{path}/rank{rank}-different-draws.pt")
    shard = slice(rank * NUM_TRAIN // WORLD_SIZE, (rank + 1) * NUM_TRAIN // WORLD_SIZE)
    torch.save(_scope_means(_model(x[shard], y[shard]), x_test), f"{path}/rank{rank}-scopes.pt")


@pytest.fixture(scope="module")
def spawned(tmp_path_factory):
    """The folder of the two gloo processes' results (:func:`_worker`), spawned once for the file."""
    return _spawn(_worker, tmp_path_factory.mktemp("distributed"))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_gloo_processes_match_one_per_model_kind(spawned):
    """Every model kind of :data:`MODEL_KINDS` in float64 and float32: the loss, the summed gradients, the posterior
    and the statistics precision of one process; in float32 also where the precision rule flips between a shard and
    all points (:data:`FLIP_TOLERANCES`)."""
    for kind, dtype, tolerance in CASE_RUNS:
        reference = _case_result(kind, dtype=dtype, tolerance=tolerance)
        if tolerance is not None:  # the rule flipped: float64 on one process, float32 on either shard alone
            assert set(reference["dtypes"]) == {torch.float64}, (kind, reference["dtypes"])
        for rank in range(WORLD_SIZE):
            result = torch.load(spawned / f"rank{rank}-{kind}-{dtype}-{tolerance}.pt")
            _assert_matches(result, reference, (kind, dtype, tolerance, rank))
            if tolerance is not None:
                shard_alone = torch.load(spawned / f"rank{rank}-{kind}-{dtype}-{tolerance}-shard.pt")
                assert set(shard_alone) == {torch.float32}, (kind, rank, shard_alone)
    for rank in range(WORLD_SIZE):  # ranks that built different models are told so, not summed
        refusal = torch.load(spawned / f"rank{rank}-different-parameters.pt")
        assert refusal is not None and "covar_module.task_covar_module.covar_factor differs between ranks" in refusal
        refusal = torch.load(spawned / f"rank{rank}-different-draws.pt")  # buffers too: the random draws
        assert refusal is not None and refusal.startswith("buffer model.covar_module.base_kernel."), refusal
        assert "differs between ranks" in refusal and "seed" in refusal, refusal


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_caches_follow_the_data_parallel_scope(spawned):
    """A model that predicts inside data_parallel, outside it and inside again gives the posterior of all points, of
    its rank's shard alone and of all points: the posterior caches of one scope do not answer in the other (before,
    the first prediction's caches answered all three, whichever scope built them)."""
    x, y, x_test = _data()
    everything = _posterior_mean(_model(x, y), x_test)
    for rank in range(WORLD_SIZE):
        shard = slice(rank * NUM_TRAIN // WORLD_SIZE, (rank + 1) * NUM_TRAIN // WORLD_SIZE)
        alone = _posterior_mean(_model(x[shard], y[shard]), x_test)
        assert (alone - everything).abs().max() > 1e-2  # the check is not vacuous
        inside, outside, inside_again = torch.load(spawned / f"rank{rank}-scopes.pt")
        for mean, expected in ((inside, everything), (outside, alone), (inside_again, everything)):
            torch.testing.assert_close(mean, expected, rtol=1e-9, atol=1e-12)


@pytest.fixture
def one_process_group(tmp_path):
    """A gloo group of this process alone: enough for data_parallel to be active."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _refusal_operation(kind):
    x, y, x_test = _case_data(3, False)
    if kind == "exact kernel":
        model = ExactGPModel(x, y[:, 0], gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.RBFKernel())
        mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model.double())
        return lambda: mll(model(x), y[:, 0])
    if kind == "Kronecker solve":
        model = _case_model("multitask-rank1", x, y)
        covar = model.likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel()
        return lambda: covar.solve(y.reshape(-1, 1))
    model = _case_model("fixed-noise" if kind == "fantasy" else "kernel-space", x, y)
    if kind == "leave-one-out":
        mll = gpytorch.mlls.LeaveOneOutPseudoLikelihood(model.likelihood, model)
        return lambda: mll(model(x), y[:, 0])
    model.eval()
    model(x_test)  # the caches a fantasy model starts from
    return lambda: model.get_fantasy_model(x_test[:2], y[:2, 0], noise=torch.full((2,), 0.1, dtype=torch.float64))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
@pytest.mark.parametrize("kind, named", [("exact kernel", "covariance of type AddedDiagLinearOperator"),
                                         ("Kronecker solve", "solves"), ("leave-one-out", "leave-one-out"),
                                         ("fantasy", "fantasies")])
def test_data_parallel_refuses_what_it_cannot_shard(one_process_group, kind, named):
    """Operations over all N points that are no sums over each process's points are refused by name."""
    operation = _refusal_operation(kind)
    with rfgp.inference.distributed.data_parallel():
        with pytest.raises(NotImplementedError, match="data_parallel does not support") as info:
            operation()
    assert re.search(named, str(info.value)) and "supported:" in str(info.value)


def test_data_parallel_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        with rfgp.inference.distributed.data_parallel():
            pass


#: (kind, first point of rank 1's shard) of uneven shards: rank 1 holds no NaN target (the caches took the unmasked
#: path there, the masked one on rank 0: other collectives, gloo aborted); rank 1's shard of 11 points is below the
#: shared kernel's F = 16 (its chunked structured Dirichlet path was left for the generic one: gloo aborted); rank 1's
#: 6 points are one chunk of 8, rank 0's 34 are chunked
UNEVEN_SHARDS = [("multitask-rank1-masked", 39), ("dirichlet-shared-chunked", 29), ("multitask-rank1-chunked", 34)]


#: (kind, rfgp.settings.memory_budget in bytes) at which rank 0's shard of uneven ones (110 of the single-output
#: model's 150 points, 28 of the other kinds' 40) is evaluated in chunks and rank 1's (40, 12 points) materialised, as
#: are all points on one process: the chunking decision is each rank's own, and the ranks must still reduce the same
#: statistics in the same collectives (a materialised root, chunked row blocks of a single- or multi-output root,
#: per-label classification statistics, Nyström's triangular ones, a curl-free field's, independent tasks')
BUDGET_SPLIT_KINDS = [("single", 2**16), ("multitask-rank1-masked", 2**16), ("dirichlet-shared", 2**13),
                      ("nystrom", 2**12), ("curl-free-rank1", 2**13), ("independent-rank1-masked", 2**14)]
BUDGET_SPLIT = 28


def _budget_split_result(kind, budget, shard=slice(None), distributed=False):
    with rfgp.settings.memory_budget(budget):
        if kind == "single":
            return _single_output_result(torch.float64, None, None, shard, distributed)
        return _case_result(kind, shard, distributed)


def _is_chunked(operator) -> bool:
    """Whether ``operator`` or an operator it is built of evaluates its root in chunks of rows."""
    return type(operator).__name__.startswith("Chunked") or any(
        _is_chunked(part) for part in operator._args if isinstance(part, LinearOperator))


def _chunks_at(kind, budget, shard=slice(None)) -> bool:
    """Whether the training covariance of ``kind`` on ``shard`` is evaluated in chunks under ``budget``."""
    if kind == "single":
        x, y, _ = _data()
        model, masked = _model(x[shard], y[shard]), False
    else:
        name, _, _, masked = MODEL_KINDS[kind]
        x, y, _ = _case_data(3 if name in ("multitask", "lcm") else DIM, masked)
        model = _case_model(kind, x[shard], y[shard])
    with (rfgp.settings.memory_budget(budget), gpytorch.settings.observation_nan_policy("mask" if masked else "ignore"),
          torch.no_grad()):
        covariance = model.likelihood(model(x[shard])).lazy_covariance_matrix
        return _is_chunked(evaluated_covariance(covariance))


def _uneven_worker(rank, path):
    shard = slice(0, 110) if rank == 0 else slice(110, NUM_TRAIN)
    with rfgp.inference.distributed.data_parallel():
        torch.save(_single_output_result(torch.float64, None, None, shard, distributed=True),
                   f"{path}/rank{rank}-single.pt")
    for kind, split in UNEVEN_SHARDS:
        shard = slice(0, split) if rank == 0 else slice(split, NUM_CASE_TRAIN)
        with rfgp.inference.distributed.data_parallel():
            torch.save(_case_result(kind, shard, True), f"{path}/rank{rank}-{kind}.pt")
    for kind, budget in BUDGET_SPLIT_KINDS:
        split = 110 if kind == "single" else BUDGET_SPLIT
        shard = slice(0, split) if rank == 0 else slice(split, None)
        with rfgp.inference.distributed.data_parallel():
            torch.save(_budget_split_result(kind, budget, shard, True), f"{path}/rank{rank}-budget-{kind}.pt")


@pytest.fixture(scope="module")
def uneven_spawned(tmp_path_factory):
    """The folder of the two gloo processes' results of :func:`_uneven_worker`."""
    return _spawn(_uneven_worker, tmp_path_factory.mktemp("uneven"))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_uneven_shards_match_one_process(uneven_spawned):
    """Shards of different sizes, one without missing targets, one chunked beside one whole, one with fewer points
    than features: every rank takes the collectives of the others and gets the single-process loss, gradients and
    posterior."""
    x, y, _ = _case_data(3, True)
    assert not torch.isnan(y[39:]).any() and torch.isnan(y[:39]).any()  # rank 1 of the masked cases has no NaN
    references = {"single": _single_output_result(torch.float64, None, None)}
    references.update((kind, _case_result(kind)) for kind, _ in UNEVEN_SHARDS)
    for name, reference in references.items():
        for rank in range(WORLD_SIZE):
            _assert_matches(torch.load(uneven_spawned / f"rank{rank}-{name}.pt"), reference, (name, rank))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_a_budget_that_chunks_one_shard_matches_one_process(uneven_spawned):
    """rfgp.settings.memory_budget decides from each rank's own points whether to evaluate its features in chunks:
    at a budget that chunks the bigger shard only (checked), the ranks still reduce the same statistics in the same
    collectives, and both get the loss, gradients and posterior of one process (chunked) to 10⁻¹² relative.  The
    sums are the same in another order: measured up to 2·10⁻¹⁴ (a gradient entry)."""
    for kind, budget in BUDGET_SPLIT_KINDS:
        split = 110 if kind == "single" else BUDGET_SPLIT
        assert _chunks_at(kind, budget, slice(0, split)) and not _chunks_at(kind, budget, slice(split, None)), kind
        assert _chunks_at(kind, budget), kind
        reference = _budget_split_result(kind, budget)
        for rank in range(WORLD_SIZE):
            result = torch.load(uneven_spawned / f"rank{rank}-budget-{kind}.pt")
            assert result["dtypes"] == reference["dtypes"], (kind, rank)
            for key in ("loss", "mean", "var"):
                torch.testing.assert_close(result[key], reference[key], rtol=1e-12, atol=1e-14, msg=str((kind, key)))
            for name, grad in reference["grads"].items():
                torch.testing.assert_close(result["grads"][name], grad, rtol=1e-12, atol=1e-14, msg=str((kind, name)))


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_a_nan_parameter_is_named_as_on_one_process(one_process_group):
    """A hyperparameter that a diverged step made NaN (on every rank) gets the single-process error naming it, not
    "differs between ranks" (NaN != NaN read as a difference)."""
    x, y, _ = _data()
    model = _model(x, y)
    with torch.no_grad():
        model.covar_module.raw_outputscale.fill_(float("nan"))
    mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model)
    with pytest.raises(NonFiniteHyperparameterError, match="outputscale"):
        mll(model(x), y)


#: the single-output model and every model kind with one rank's shard empty and the other's holding every point; the
#: empty rank alternates (rank 1 for the first, rank 0 for the second, ...)
EMPTY_SHARD_KINDS = ["single", *MODEL_KINDS]


def _empty_shard_result(kind, empty):
    shard = slice(0, 0) if empty else slice(None)
    if kind == "single":
        return _single_output_result(torch.float64, None, None, shard, distributed=True)
    return _case_result(kind, shard, True)


class _Branches(torch.nn.Module):
    """Two parameters; a loss of the second branch leaves the first's ``.grad`` ``None`` (a rank whose data never
    take the first branch)."""

    def __init__(self, extra=False):
        super().__init__()
        self.first = torch.nn.Parameter(torch.tensor([1.0, 2.0], dtype=torch.float64))
        self.second = torch.nn.Parameter(torch.tensor(3.0, dtype=torch.float64))
        if extra:
            self.third = torch.nn.Parameter(torch.tensor(4.0, dtype=torch.float64))


def _sync_outcome(module, loss):
    """The summed gradients ``{name: grad or None}`` on this rank, or the message of the ``ValueError`` raised."""
    if loss is not None:
        loss.backward()
    try:
        rfgp.inference.distributed.sync_gradients(module)
    except ValueError as error:
        return str(error)
    return {name: None if p.grad is None else p.grad.clone() for name, p in module.named_parameters()}


def _sync_cases(rank):
    """sync_gradients where rank 1's loss leaves ``first`` without a gradient, where rank 1 froze ``first``, and
    where rank 1's module has one more parameter."""
    module = _Branches()
    unused = _sync_outcome(module, (module.first.square().sum() if rank == 0 else 0) + 5 * module.second)
    module = _Branches()
    if rank == 1:
        module.first.requires_grad_(False)
    frozen = _sync_outcome(module, (module.first.sum() if rank == 0 else 0) + module.second)
    module = _Branches(extra=rank == 1)
    return {"unused": unused, "frozen": frozen, "extra": _sync_outcome(module, None)}


def _empty_shard_worker(rank, path):
    for index, kind in enumerate(EMPTY_SHARD_KINDS):
        with rfgp.inference.distributed.data_parallel():
            result = _empty_shard_result(kind, empty=rank == (index + 1) % WORLD_SIZE)
        torch.save(result, f"{path}/rank{rank}-{kind}.pt")
    x, y, x_test = _data()
    model = _model(x[:0], y[:0])  # no rank holds a point
    torch.save(_refusal(model, x[:0], y[:0]), f"{path}/rank{rank}-no-points.pt")
    try:  # a rank's empty shard alone, outside data_parallel: a GP of no points (not a collective)
        _posterior_mean(model, x_test)
        outside = None
    except ValueError as error:
        outside = str(error)
    torch.save(outside, f"{path}/rank{rank}-outside.pt")
    with rfgp.inference.distributed.data_parallel(), torch.no_grad():  # inside it: the posterior of no point
        posterior = model(x_test)
        prior = (model.mean_module(x_test), model.covar_module(x_test).to_dense())
    torch.save({"posterior": (posterior.mean, posterior.covariance_matrix), "prior": prior},
               f"{path}/rank{rank}-prior.pt")
    torch.save(_sync_cases(rank), f"{path}/rank{rank}-sync.pt")
    model = _model(x, y)
    if rank == 1:  # a buffer more on one rank: the comparison of the ranks' tensors would differ in length
        model.covar_module.register_buffer("extra", torch.zeros(3, dtype=torch.float64))
    torch.save(_refusal(model, x, y), f"{path}/rank{rank}-extra-buffer.pt")


@pytest.fixture(scope="module")
def empty_shard_spawned(tmp_path_factory):
    """The folder of the two gloo processes' results of :func:`_empty_shard_worker`."""
    return _spawn(_empty_shard_worker, tmp_path_factory.mktemp("empty-shard"), timeout=120)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_an_empty_shard_contributes_nothing(empty_shard_spawned):
    """A rank without training points (N split over more ranks than it has chunks) builds its model and contributes
    zero statistics: every model kind gives the loss, summed gradients, posterior and statistics precision of one
    process on all points, on both ranks.  Before, the empty rank refused its data ("train_x is empty", "targets must
    be a non-empty 1-D tensor", "cannot reshape tensor of 0 elements" under observation_nan_policy("mask"), a
    ZeroDivisionError in the log-determinant count of per-point noise) and the other rank's collective failed with
    the lost peer.  The sums are those of one process plus zeros (the prior's gradient in two exact halves): measured
    equal up to 1.7·10⁻¹⁶ relative, compared to 10⁻¹²."""
    for kind in EMPTY_SHARD_KINDS:
        reference = _single_output_result(torch.float64, None, None) if kind == "single" else _case_result(kind)
        for rank in range(WORLD_SIZE):
            result = torch.load(empty_shard_spawned / f"rank{rank}-{kind}.pt")
            assert result["dtypes"] == reference["dtypes"], (kind, rank)
            for key in ("loss", "mean", "var"):
                torch.testing.assert_close(result[key], reference[key], rtol=1e-12, atol=1e-14, msg=str((kind, key)))
            for name, grad in reference["grads"].items():
                torch.testing.assert_close(result["grads"][name], grad, rtol=1e-12, atol=1e-14, msg=str((kind, name)))
    for rank in range(WORLD_SIZE):  # no point on any rank: refused on every rank, not 0/0
        refusal = torch.load(empty_shard_spawned / f"rank{rank}-no-points.pt")
        assert refusal is not None and "of all 2 ranks hold no observed value" in refusal, refusal
        outside = torch.load(empty_shard_spawned / f"rank{rank}-outside.pt")  # an empty rank's posterior alone
        assert outside is not None and "empty (0 data points)" in outside, outside
        no_point = torch.load(empty_shard_spawned / f"rank{rank}-prior.pt")  # inside data_parallel: the prior
        for posterior, prior in zip(no_point["posterior"], no_point["prior"]):
            torch.testing.assert_close(posterior, prior, rtol=1e-12, atol=1e-14)


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_sync_gradients_agrees_on_the_parameters_first(empty_shard_spawned):
    """A parameter without a gradient on one rank counts as zeros there and gets the sum on both (before, the ranks
    all-reduced buffers of different lengths); one frozen on one rank only, or modules with different parameters, are
    refused on every rank by name; so are models with a different number of buffers by the MLL's comparison of the
    ranks (before, its all-reduce had another length on each rank)."""
    for rank in range(WORLD_SIZE):
        cases = torch.load(empty_shard_spawned / f"rank{rank}-sync.pt")
        # rank 0: ∂(‖first‖² + 5·second) = (2, 4), 5; rank 1: ∂(5·second) = 5, first has none
        torch.testing.assert_close(cases["unused"]["first"], torch.tensor([2.0, 4.0], dtype=torch.float64))
        torch.testing.assert_close(cases["unused"]["second"], torch.tensor(10.0, dtype=torch.float64))
        assert cases["frozen"].startswith("parameter first requires a gradient on 1 of 2 ranks"), cases["frozen"]
        assert cases["extra"].startswith(f"the module has {2 + rank} parameters ({3 + rank} values) on this rank, and "
                                         "between 2 and 3 (3 to 4 values) over the ranks"), cases["extra"]
        refusal = torch.load(empty_shard_spawned / f"rank{rank}-extra-buffer.pt")  # the MLL's comparison of ranks
        assert refusal is not None and "parameters and buffers (outside the likelihoods)" in refusal, refusal


def _outcome(evaluate) -> tuple[str, str] | None:
    """(class name, message) of the ``ValueError`` that ``evaluate()`` raised on this rank, ``None`` if it returned.
    Another exception (gloo's timeout of a rank left waiting in a collective) fails the spawn."""
    try:
        evaluate()
    except (ValueError, rfgp.inference.distributed.CollectiveMismatchError) as error:
        return type(error).__name__, str(error)
    return None


def _one_rank_failing_cases(rank):
    """Every case's outcome on this rank, where one rank's shard or evaluation fails before the next collective."""
    x, y, x_test = _data()
    shard = slice(rank * NUM_TRAIN // WORLD_SIZE, (rank + 1) * NUM_TRAIN // WORLD_SIZE)
    x, y = x[shard], y[shard].clone()
    outcomes = {}
    model = _model(x, y)
    bad_y = y.clone()
    if rank == 1:
        bad_y[3] = float("nan")
    mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model)
    outcomes["nan-target"] = _outcome(lambda: mll(model(x), bad_y))

    def inside_data_parallel():  # the MLL called inside the user's data_parallel block
        with rfgp.inference.distributed.data_parallel():
            mll(model(x), bad_y)

    outcomes["nan-target-inside"] = _outcome(inside_data_parallel)
    noise = 0.01 + y.abs()
    if rank == 0:
        noise[5] = float("nan")
    fixed = ExactGPModel(x, y, gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise), _model(x, y).covar_module)
    fixed_mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(fixed.likelihood, fixed.double())
    outcomes["fixed-noise"] = _outcome(lambda: fixed_mll(fixed(x), y))
    cx, cy, _ = _case_data(3, True)
    case_shard = slice(rank * NUM_CASE_TRAIN // WORLD_SIZE, (rank + 1) * NUM_CASE_TRAIN // WORLD_SIZE)
    cx, cy = cx[case_shard], cy[case_shard].clone()
    with gpytorch.settings.observation_nan_policy("mask"):
        multitask = _case_model("multitask-rank1-masked", cx, cy)
        if rank == 1:
            cy[2, 1] = float("inf")
        multitask_mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(multitask.likelihood,
                                                                                         multitask)
        outcomes["multitask-inf-target"] = _outcome(lambda: multitask_mll(multitask(cx), cy))

    def predict_from_a_nan_target():  # rank 1's training target turned NaN after construction
        predicting = _model(x, y.clone())
        with torch.no_grad():
            if rank == 1:
                predicting.train_targets[0] = float("nan")
            predicting.eval()
            with rfgp.inference.distributed.data_parallel():
                predicting(x_test).mean

    outcomes["prediction"] = _outcome(predict_from_a_nan_target)

    def fail_before_the_mll():  # rank 0 refuses its test inputs inside the block, rank 1 goes on to the MLL
        trained = _model(x, y)
        with rfgp.inference.distributed.data_parallel():
            trained(x[:, :1] if rank == 0 else x)
            rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(trained.likelihood, trained)(
                trained(x), y)

    outcomes["before-the-mll"] = _outcome(fail_before_the_mll)

    def caches_on_one_rank_only():  # rank 1 predicts from its shard alone once: its caches are dropped, rank 0's kept
        predicting = _model(x, y)
        predicting.eval()
        with torch.no_grad():
            with rfgp.inference.distributed.data_parallel():
                predicting(x_test).mean
            if rank == 1:
                predicting(x_test).mean
            with rfgp.inference.distributed.data_parallel():
                predicting(x_test).mean

    outcomes["caches"] = _outcome(caches_on_one_rank_only)

    def build_a_model_of_a_nan_input():  # the script's own code, before any rfgp collective
        with rfgp.inference.distributed.every_rank_raises():
            _model(torch.where(torch.arange(len(x))[:, None] == 2, float("nan"), x) if rank == 1 else x, y)

    outcomes["model"] = _outcome(build_a_model_of_a_nan_input)
    with rfgp.inference.distributed.data_parallel():  # the ranks went on in step
        outcomes["after"] = _single_output_result(torch.float64, None, None, shard, distributed=True)
    return outcomes


def _one_rank_failing_worker(rank, path):
    torch.save(_one_rank_failing_cases(rank), f"{path}/rank{rank}-failing.pt")


#: (case, failing rank, its error class, what its message says)
ONE_RANK_FAILING = [("nan-target", 1, "NonFiniteError", "y − μ (the training targets minus the prior mean) contains"),
                    ("nan-target-inside", 1, "NonFiniteError", "y − μ (the training targets minus the prior mean)"),
                    ("fixed-noise", 0, "InvalidValueError", "noise variances must be finite and > 0"),
                    ("multitask-inf-target", 1, "NonFiniteError", "contains NaN or Inf"),
                    ("prediction", 1, "NonFiniteError", "contains NaN or Inf"),
                    ("before-the-mll", 0, "ValueError", ""),
                    ("model", 1, "NonFiniteError", "train_x contains NaN or Inf entries")]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_an_error_on_one_rank_is_raised_on_every_rank(tmp_path):
    """A NaN target, a NaN fixed noise, an Inf multi-output target on one rank's shard, a NaN training target at
    prediction under data_parallel, any error one rank raises inside data_parallel before its next collective, or in
    the script's code under every_rank_raises (a NaN training input):
    that rank raises its own error and every other rank an OtherRankError (a ValueError) with its message, and both
    go on in step (the next evaluation equals one process).  Posterior caches rebuilt inside data_parallel on one rank
    only (its prediction outside dropped them) raise CollectiveMismatchError on both ranks.  Before, the failing rank
    raised and the others waited in their next collective (for the process group's timeout, 30 minutes by default;
    30 s here), or met the failing rank's next collective of another length there: gloo aborted the process."""
    _spawn(_one_rank_failing_worker, tmp_path, timeout=30)
    outcomes = [torch.load(tmp_path / f"rank{rank}-failing.pt") for rank in range(WORLD_SIZE)]
    for case, failing, error_class, says in ONE_RANK_FAILING:
        own = outcomes[failing][case]
        assert own is not None and own[0] == error_class and says in own[1], (case, own)
        other = outcomes[1 - failing][case]
        assert other is not None and other[0] == "OtherRankError", (case, other)
        assert other[1].startswith(f"rank {failing} of 2 raised {error_class}: {own[1][:100]}"), (case, other)
    for rank, where in enumerate(("left it without one", "reached one")):  # rank 1 rebuilds its caches, rank 0 not
        assert outcomes[rank]["caches"][0] == "CollectiveMismatchError", outcomes[rank]["caches"]
        assert "1 of 2 ranks reached an rfgp collective" in outcomes[rank]["caches"][1], outcomes[rank]["caches"]
        assert f"this rank {where}" in outcomes[rank]["caches"][1], outcomes[rank]["caches"]
    reference = _single_output_result(torch.float64, None, None)
    for rank in range(WORLD_SIZE):
        _assert_matches(outcomes[rank]["after"], reference, ("after", rank))
