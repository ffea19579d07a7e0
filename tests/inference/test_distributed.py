"""Two gloo processes on localhost give the single-process MLL, gradients and predictions."""

import re
import socket

import gpytorch
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rfgp
from rfgp.kernels import SketchedPolynomialKernel, SketchedRBFKernel
from rfgp.models import ExactGPModel

from .._models import BatchIndependentGP, vector_field_kernel

WORLD_SIZE, NUM_TRAIN, DIM = 2, 150, 2


def _data():
    gen = torch.Generator().manual_seed(5)
    x = torch.randn(NUM_TRAIN, DIM, generator=gen, dtype=torch.float64)
    y = torch.cos(x).sum(-1) + 0.1 * torch.randn(NUM_TRAIN, generator=gen, dtype=torch.float64)
    return x, y, torch.randn(7, DIM, generator=gen, dtype=torch.float64)


def _model(x, y):
    kernel = gpytorch.kernels.ScaleKernel(
        SketchedRBFKernel(32, ard_num_dims=DIM, seed=0, lengthscale_prior=gpytorch.priors.GammaPrior(3.0, 4.0))
    )
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.2)
    return model


def _mll_grads_prediction(model, x, y, x_test, mll, latent=False):
    loss = -mll(model(x), y).sum()  # a batch of GPs (Dirichlet classification): the sum of their losses
    loss.backward()
    if dist.is_initialized():
        rfgp.inference.distributed.sync_gradients(model)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        prediction = model(x_test) if latent else model.likelihood(model(x_test))
    return {"loss": loss.detach(), "grads": grads, "mean": prediction.mean, "var": prediction.variance}


CHUNK_SIZES = (None, 32)  # materialised and chunked features on each rank


def _worker(rank, port, path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        x, y, x_test = _data()
        shard = slice(rank * NUM_TRAIN // WORLD_SIZE, (rank + 1) * NUM_TRAIN // WORLD_SIZE)
        for chunk_size in CHUNK_SIZES:
            model = _model(x[shard], y[shard])
            mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model)
            with rfgp.settings.chunk_size(chunk_size), rfgp.inference.distributed.data_parallel():
                result = _mll_grads_prediction(model, x[shard], y[shard], x_test, mll)
            torch.save(result, f"{path}/rank{rank}-chunk{chunk_size}.pt")
    finally:
        dist.destroy_process_group()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_gloo_processes_match_one(tmp_path):
    x, y, x_test = _data()
    model = _model(x, y)
    reference = _mll_grads_prediction(model, x, y, x_test, gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model))
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    for rank in range(WORLD_SIZE):
        for chunk_size in CHUNK_SIZES:
            result = torch.load(tmp_path / f"rank{rank}-chunk{chunk_size}.pt")
            torch.testing.assert_close(result["loss"], reference["loss"], rtol=1e-10, atol=1e-12)
            for name, grad in reference["grads"].items():
                assert grad.abs().max() > 0, name
                torch.testing.assert_close(result["grads"][name], grad, rtol=1e-9, atol=1e-12, msg=name)
            torch.testing.assert_close(result["mean"], reference["mean"], rtol=1e-9, atol=1e-12)
            torch.testing.assert_close(result["var"], reference["var"], rtol=1e-9, atol=1e-12)
    

NUM_CASE_TRAIN = 40
# kind: (model, likelihood rank, chunk size, NaN targets).  A sketched MultitaskKernel's Kronecker statistics under
# rank-0 and rank-1 noise, also chunked (rows of φ in blocks, rfgp.inference.chunked_kronecker); the whitened root
# (rfgp.inference.task_noise) of missing targets (also chunked), of a curl-free field and of an LCM sum;
# batch-independent outputs; Dirichlet classification (batched per-point noise); fixed per-point noise; N < F, where
# one process takes the kernel-space path and data_parallel the F × F capacitance; complex features
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
    "fixed-noise": ("fixed_noise", None, None, False),
    "kernel-space": ("kernel_space", None, None, False),
    "complex-posterior": ("complex_posterior", None, None, False),
}


class _MultitaskGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=y.shape[-1])
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def _case_data(num_outputs, masked):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(NUM_CASE_TRAIN, DIM, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(x[:, 0] + t) for t in range(num_outputs)], -1)
    y = y + 0.1 * torch.randn(NUM_CASE_TRAIN, num_outputs, generator=gen, dtype=torch.float64)
    if masked:  # missing task values on both ranks' shards
        y[torch.rand(NUM_CASE_TRAIN, num_outputs, generator=gen) < 0.2] = float("nan")
    return x, y, torch.randn(5, DIM, generator=gen, dtype=torch.float64)


def _case_model(kind, x, y):
    """The model of ``kind`` on (x, y), its parameters the same on every rank (IndexKernel draws its factor)."""
    name, likelihood_rank, _, _ = MODEL_KINDS[kind]
    if name in ("multitask", "lcm", "curl_free", "independent"):
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=y.shape[-1], rank=likelihood_rank)
    if name == "multitask":
        kernel = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=y.shape[-1], rank=1)
        model = _MultitaskGP(x, y, likelihood, rfgp.sketch(kernel, 8, seed=0))
    elif name == "lcm":
        bases = [gpytorch.kernels.RBFKernel(), gpytorch.kernels.MaternKernel()]
        kernel = rfgp.sketch(gpytorch.kernels.LCMKernel(bases, num_tasks=y.shape[-1], rank=1), 8, seed=0)
        model = _MultitaskGP(x, y, likelihood, kernel)
    elif name == "curl_free":
        model = _MultitaskGP(x, y, likelihood, vector_field_kernel("curl_free", 8, DIM))
    elif name == "independent":
        tasks = torch.Size([y.shape[-1]])
        exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=tasks), batch_shape=tasks)
        model = BatchIndependentGP(x, y, rfgp.sketch(exact, 8, seed=0), likelihood)
    elif name == "dirichlet":
        labels = (y[:, 0] > 0).long() + (y[:, 1] > 0).long()
        likelihood = rfgp.likelihoods.DirichletClassificationLikelihood(labels, num_classes=3, dtype=torch.float64)
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0, batch_shape=torch.Size([3])),
                                              batch_shape=torch.Size([3]))
        model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean)
    elif name == "complex_posterior":
        kernel = SketchedPolynomialKernel(3, 12, weights="complex", complex_posterior=True, seed=3)
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        model = ExactGPModel(x, y[:, 0], likelihood, gpytorch.kernels.ScaleKernel(kernel))
    else:
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(64 if name == "kernel_space" else 16, seed=0))
        likelihood = (gpytorch.likelihoods.FixedNoiseGaussianLikelihood(0.01 + y[:, 1].abs())
                      if name == "fixed_noise" else gpytorch.likelihoods.GaussianLikelihood())
        model = ExactGPModel(x, y[:, 0], likelihood, kernel)
    model = model.double()
    gen = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 + 0.3 * torch.rand(p.shape, generator=gen, dtype=p.dtype))
    return model


def _case_result(kind, shard=slice(None), distributed=False):
    name, _, chunk_size, masked = MODEL_KINDS[kind]
    x, y, x_test = _case_data(3 if name in ("multitask", "lcm") else DIM, masked)
    model = _case_model(kind, x[shard], y[shard])
    mll_class = (rfgp.inference.distributed.DistributedExactMarginalLogLikelihood if distributed
                 else gpytorch.mlls.ExactMarginalLogLikelihood)
    mll = mll_class(model.likelihood, model)
    with rfgp.settings.chunk_size(chunk_size), gpytorch.settings.observation_nan_policy("mask" if masked else "ignore"):
        return _mll_grads_prediction(model, x[shard], model.train_targets, x_test, mll,
                                     latent=name in ("dirichlet", "fixed_noise"))


def _refusal(model, x, y) -> str | None:
    """The message of the ``ValueError`` that the distributed MLL raises on this rank, ``None`` if it evaluates."""
    mll = rfgp.inference.distributed.DistributedExactMarginalLogLikelihood(model.likelihood, model)
    try:
        mll(model(x), y)
    except ValueError as error:
        return str(error)
    return None


def _case_worker(rank, port, path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        shard = slice(rank * NUM_CASE_TRAIN // WORLD_SIZE, (rank + 1) * NUM_CASE_TRAIN // WORLD_SIZE)
        for kind in MODEL_KINDS:
            with rfgp.inference.distributed.data_parallel():
                torch.save(_case_result(kind, shard, distributed=True), f"{path}/rank{rank}-{kind}.pt")
        x, y, _ = _case_data(3, False)
        torch.manual_seed(rank)  # unseeded ranks: GPyTorch's IndexKernel draws another task factor on each
        model = _MultitaskGP(x[shard], y[shard], gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3),
                             rfgp.sketch(gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), 3, rank=1), 8))
        torch.save(_refusal(model, x[shard], y[shard]), f"{path}/rank{rank}-different-parameters.pt")
        torch.manual_seed(0)  # the same parameters, but each rank's own random features
        x, y, _ = _data()
        model = _model(x[shard], y[shard])
        model.covar_module.base_kernel = SketchedRBFKernel(32, ard_num_dims=DIM, seed=rank).double()
        torch.save(_refusal(model, x[shard], y[shard]), f"{path}/rank{rank}-different-draws.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_gloo_processes_match_one_per_model_kind(tmp_path):
    """Every model kind of :data:`MODEL_KINDS`: the loss, the summed gradients and the posterior of one process."""
    mp.spawn(_case_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    for kind in MODEL_KINDS:
        reference = _case_result(kind)
        for rank in range(WORLD_SIZE):
            result = torch.load(tmp_path / f"rank{rank}-{kind}.pt")
            torch.testing.assert_close(result["loss"], reference["loss"], rtol=1e-10, atol=1e-12, msg=kind)
            for name, grad in reference["grads"].items():
                assert grad.abs().max() > 0, (kind, name)
                torch.testing.assert_close(result["grads"][name], grad, rtol=1e-9, atol=1e-12, msg=f"{kind} {name}")
            torch.testing.assert_close(result["mean"], reference["mean"], rtol=1e-9, atol=1e-12, msg=kind)
            torch.testing.assert_close(result["var"], reference["var"], rtol=1e-9, atol=1e-12, msg=kind)
    for rank in range(WORLD_SIZE):  # ranks that built different models are told so, not summed
        refusal = torch.load(tmp_path / f"rank{rank}-different-parameters.pt")
        assert refusal is not None and "covar_module.task_covar_module.covar_factor differs between ranks" in refusal
        refusal = torch.load(tmp_path / f"rank{rank}-different-draws.pt")  # buffers too: the random draws
        assert refusal is not None and refusal.startswith("buffer model.covar_module.base_kernel."), refusal
        assert "differs between ranks" in refusal and "seed" in refusal, refusal


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
