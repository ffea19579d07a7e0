"""Shared fixtures: every device-dependent test runs on the CPU and, where present, on CUDA."""

import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param


@pytest.fixture
def single_thread():
    """Run with one intra-op thread: tiny LAPACK calls (8 × 8 QR) cost ~5 ms each with two
    threads on CPU, which dominates tests that build hundreds of small seeded maps."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
