"""Shared fixtures: every device-dependent test runs on the CPU and, where present, on CUDA."""

import pytest
import torch

# The suite is many small tensor operations: one intra-op thread per process avoids
# oversubscription (tiny LAPACK calls such as an 8 × 8 QR take ~5 ms with two threads
# instead of ~6 µs), and pytest-xdist runs one process per core instead.
torch.set_num_threads(1)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request):
    return torch.device(request.param)


@pytest.fixture(params=[torch.float32, torch.float64], ids=["float32", "float64"])
def dtype(request):
    return request.param



@pytest.fixture(autouse=True)
def _seed_torch():
    """Every test starts from the same global RNG state, whatever ran before it in its worker."""
    torch.manual_seed(0)


@pytest.fixture
def factorised(monkeypatch):
    """Sizes of every matrix handed to a Cholesky factorisation."""
    sizes = []
    for name in ("cholesky", "cholesky_ex"):
        original = getattr(torch.linalg, name)

        def spy(matrix, *args, _original=original, **kwargs):
            sizes.append(matrix.shape[-1])
            return _original(matrix, *args, **kwargs)

        monkeypatch.setattr(torch.linalg, name, spy)
    return sizes
