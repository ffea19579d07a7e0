"""The blocked rank-k Cholesky update equals the Cholesky factor of the updated matrix."""

import pytest
import torch

from rfgp.inference.cholesky_update import cholesky_update

TOLERANCE = {torch.float64: 1e-10, torch.float32: 1e-4}  # relative Frobenius error


def _relative_error(actual, expected):
    return ((actual - expected).norm() / expected.norm()).item()


def _factor(size, dtype, device, batch=(), seed=0):
    """chol(I + XᵀX) for a random X: a factor like the streaming model's."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*batch, 2 * size, size, generator=gen, dtype=torch.float64) / size**0.5
    eye = torch.eye(size, dtype=torch.float64)
    return torch.linalg.cholesky(eye + x.mT @ x).to(dtype=dtype, device=device)


@pytest.mark.parametrize(("size", "rank", "block_size"), [(40, 1, None), (50, 7, 16), (37, 20, 8), (24, 30, None)])
def test_update_equals_refactorisation(size, rank, block_size, dtype, device):
    chol = _factor(size, dtype, device)
    vectors = torch.randn(size, rank, dtype=dtype, device=device)
    original = chol.clone()
    updated = cholesky_update(chol, vectors, block_size=block_size)
    expected = torch.linalg.cholesky(chol.double() @ chol.double().mT + vectors.double() @ vectors.double().mT)
    assert updated.dtype == dtype and updated.device == chol.device
    assert torch.equal(updated, torch.tril(updated)) and (torch.diagonal(updated) > 0).all()
    assert _relative_error(updated.double(), expected) < TOLERANCE[dtype]
    assert torch.equal(chol, original)  # the input factor is left untouched


def test_batched_and_broadcast(dtype):
    chol = _factor(20, dtype, "cpu", batch=(2,))
    vectors = torch.randn(3, 1, 20, 4, dtype=dtype)
    updated = cholesky_update(chol, vectors, block_size=6)
    assert updated.shape == (3, 2, 20, 20)
    expected = torch.linalg.cholesky(chol.double() @ chol.double().mT + vectors.double() @ vectors.double().mT)
    assert _relative_error(updated.double(), expected) < TOLERANCE[dtype]


def test_many_sequential_updates_do_not_drift(dtype):
    size, steps = 48, 150
    chol = _factor(size, dtype, "cpu")
    exact = chol.double() @ chol.double().mT
    gen = torch.Generator().manual_seed(5)
    for step in range(steps):
        vectors = torch.randn(size, 1 + step % 3, generator=gen, dtype=torch.float64) / 3
        chol = cholesky_update(chol, vectors.to(dtype))
        exact = exact + vectors @ vectors.mT
    assert _relative_error(chol.double(), torch.linalg.cholesky(exact)) < TOLERANCE[dtype]


def test_bad_input():
    chol = torch.eye(4, dtype=torch.float64)
    with pytest.raises(ValueError, match="chol must be a square"):
        cholesky_update(torch.ones(4, 3, dtype=torch.float64), torch.ones(4, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"vectors must have shape \(\.\.\., 4, k\)"):
        cholesky_update(chol, torch.ones(3, 1, dtype=torch.float64))
    with pytest.raises(ValueError, match="vectors must have chol's dtype"):
        cholesky_update(chol, torch.ones(4, 1))
    with pytest.raises(ValueError, match="chol contains NaN or Inf"):  # was NaN entries in the result, silently
        cholesky_update(torch.tensor([[1.0, 0.0], [float("nan"), 1.0]], dtype=torch.float64),
                        torch.ones(2, 1, dtype=torch.float64))
    for dtype in (torch.float16, torch.int64, torch.complex128):  # torch's QR named geqrf_cpu, Long, "lt_cpu"
        with pytest.raises(TypeError, match=f"chol must be a .*{dtype}"):
            cholesky_update(torch.eye(3, dtype=dtype), torch.ones(3, 1, dtype=dtype))
    for name in ("chol", "vectors"):  # the result had no gradient: a loss through it lost their share silently
        inputs = {"chol": chol.clone(), "vectors": torch.ones(4, 1, dtype=torch.float64)}
        inputs[name].requires_grad_()
        with pytest.raises(ValueError, match="cholesky_update has no gradient, but chol or vectors requires one"):
            cholesky_update(**inputs)
        with torch.no_grad():
            cholesky_update(**inputs)
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        cholesky_update(chol, torch.ones(4, 1, dtype=torch.float64), block_size=0)
