"""The memory guard (rfgp.core.memory) counts a solve's matrices in the precision they are formed in."""

import pytest
import torch

from rfgp.core import memory


def test_the_capacitance_of_float32_features_is_counted_in_float64(monkeypatch):
    """The F × F capacitance of float32 features is factorised in float64: counted in float32, the guard passed a
    solve needing twice the memory available."""
    num_features = 8192
    float64_bytes = 2 * num_features**2 * 8  # the capacitance and its Cholesky factor
    monkeypatch.setattr(memory, "available_bytes", lambda device: float64_bytes - 1)
    with pytest.raises(ValueError, match="num_features=8192.*torch.float64 matrix"):
        memory.check_solve(100_000, num_features, 1, torch.float32, "cpu", size=num_features)
    monkeypatch.setattr(memory, "available_bytes", lambda device: float64_bytes)
    memory.check_solve(100_000, num_features, 1, torch.float32, "cpu", size=num_features)


def test_the_kernel_space_matrix_is_counted_in_the_features_dtype(monkeypatch):
    num_rows = 8192
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2 * num_rows**2 * 4)
    memory.check_solve(num_rows, 100_000, 1, torch.float32, "cpu", size=num_rows)
    monkeypatch.setattr(memory, "available_bytes", lambda device: 2 * num_rows**2 * 4 - 1)
    with pytest.raises(ValueError, match="8192 × 8192 torch.float32 matrix"):
        memory.check_solve(num_rows, 100_000, 1, torch.float32, "cpu", size=num_rows)
