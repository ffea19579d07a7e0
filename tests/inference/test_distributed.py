"""Two gloo processes on localhost give the single-process MLL, gradients and predictions."""

import socket

import gpytorch
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import rfgp
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

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


def _mll_grads_prediction(model, x, y, x_test, mll):
    loss = -mll(model(x), y)
    loss.backward()
    if dist.is_initialized():
        rfgp.inference.distributed.sync_gradients(model)
    grads = {name: p.grad.clone() for name, p in model.named_parameters()}
    model.eval()
    with torch.no_grad():
        prediction = model.likelihood(model(x_test))
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
    

NUM_TASKS, NUM_MT_TRAIN = 3, 40
# (likelihood rank, chunk size, NaN targets): the Kronecker statistics under rank-0 and rank-1 noise, and the whitened
# root of a chunked root and of missing targets (rfgp.inference.task_noise)
MULTITASK_KINDS = {"rank0": (0, None, False), "rank1": (1, None, False), "rank1-chunked": (1, 8, False),
                   "rank1-masked": (1, None, True)}


class _MultitaskGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=NUM_TASKS)
        kernel = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=NUM_TASKS, rank=1)
        self.covar_module = rfgp.sketch(kernel, 8, seed=0)

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def _multitask_data(masked):
    gen = torch.Generator().manual_seed(6)
    x = torch.randn(NUM_MT_TRAIN, DIM, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(x[:, 0] + t) for t in range(NUM_TASKS)], -1)
    y = y + 0.1 * torch.randn(NUM_MT_TRAIN, NUM_TASKS, generator=gen, dtype=torch.float64)
    if masked:  # missing task values on both ranks' shards
        y[torch.rand(NUM_MT_TRAIN, NUM_TASKS, generator=gen) < 0.2] = float("nan")
    return x, y, torch.randn(5, DIM, generator=gen, dtype=torch.float64)


def _multitask_model(x, y, likelihood_rank):
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=NUM_TASKS, rank=likelihood_rank)
    gen = torch.Generator().manual_seed(7)  # the same parameters on every rank (IndexKernel draws its factor)
    model = _MultitaskGP(x, y, likelihood).double()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(0.2 + 0.3 * torch.rand(p.shape, generator=gen, dtype=p.dtype))
    return model


def _multitask_result(kind, shard=slice(None), distributed=False):
    likelihood_rank, chunk_size, masked = MULTITASK_KINDS[kind]
    x, y, x_test = _multitask_data(masked)
    model = _multitask_model(x[shard], y[shard], likelihood_rank)
    mll_class = (rfgp.inference.distributed.DistributedExactMarginalLogLikelihood if distributed
                 else gpytorch.mlls.ExactMarginalLogLikelihood)
    with rfgp.settings.chunk_size(chunk_size), gpytorch.settings.observation_nan_policy("mask" if masked else "ignore"):
        return _mll_grads_prediction(model, x[shard], y[shard], x_test, mll_class(model.likelihood, model))


def _multitask_worker(rank, port, path):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD_SIZE)
    try:
        shard = slice(rank * NUM_MT_TRAIN // WORLD_SIZE, (rank + 1) * NUM_MT_TRAIN // WORLD_SIZE)
        for kind in MULTITASK_KINDS:
            with rfgp.inference.distributed.data_parallel():
                torch.save(_multitask_result(kind, shard, distributed=True), f"{path}/rank{rank}-{kind}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available(), reason="torch.distributed unavailable")
def test_two_gloo_processes_match_one_multitask(tmp_path):
    """Sketched MultitaskKernel with rank-0 and rank-1 MultitaskGaussianLikelihood (Kronecker statistics), chunked
    and with missing targets (whitened root): the loss, the summed gradients and the posterior of one process."""
    mp.spawn(_multitask_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD_SIZE, join=True)
    for kind in MULTITASK_KINDS:
        reference = _multitask_result(kind)
        for rank in range(WORLD_SIZE):
            result = torch.load(tmp_path / f"rank{rank}-{kind}.pt")
            torch.testing.assert_close(result["loss"], reference["loss"], rtol=1e-10, atol=1e-12, msg=kind)
            for name, grad in reference["grads"].items():
                assert grad.abs().max() > 0, (kind, name)
                torch.testing.assert_close(result["grads"][name], grad, rtol=1e-9, atol=1e-12, msg=f"{kind} {name}")
            torch.testing.assert_close(result["mean"], reference["mean"], rtol=1e-9, atol=1e-12, msg=kind)
            torch.testing.assert_close(result["var"], reference["var"], rtol=1e-9, atol=1e-12, msg=kind)


def test_data_parallel_needs_a_process_group():
    with pytest.raises(RuntimeError, match="init_process_group"):
        with rfgp.inference.distributed.data_parallel():
            pass
