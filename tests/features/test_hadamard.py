"""FWHT against an independently built Sylvester–Hadamard matrix (recursive Kronecker products)."""

import math

import pytest
import torch

from rfgp.features.hadamard import fwht, hadamard_matrix, next_power_of_two, pad_to_power_of_two

SIZES = [2**k for k in range(13)]  # 1 .. 4096


def sylvester(d: int, dtype=torch.float64, device="cpu") -> torch.Tensor:
    """H_1 = [1], H_2n = [[1, 1], [1, −1]] ⊗ H_n, built without the FWHT."""
    h = torch.ones(1, 1, dtype=dtype, device=device)
    block = torch.tensor([[1.0, 1.0], [1.0, -1.0]], dtype=dtype, device=device)
    while h.shape[0] < d:
        h = torch.kron(block, h)
    return h


def tolerance(dtype, d):
    # Each of the log₂ d butterfly stages adds rounding error; results grow like √d·|x|.
    eps = torch.finfo(dtype).eps
    return dict(rtol=0.0, atol=50 * eps * math.sqrt(d) * max(1.0, math.log2(d)))


@pytest.mark.parametrize("d", SIZES)
def test_fwht_matches_sylvester_matrix(d, device, dtype):
    gen = torch.Generator().manual_seed(d)
    x = torch.randn(3, d, generator=gen, dtype=torch.float64)
    expected = x @ sylvester(d)
    got = fwht(x.to(device=device, dtype=dtype))
    assert got.dtype == dtype and got.device.type == device.type
    torch.testing.assert_close(got.double().cpu(), expected, **tolerance(dtype, d))


@pytest.mark.parametrize("d", SIZES)
def test_normalized_fwht_is_orthogonal_involution(d, device, dtype):
    x = torch.randn(4, d, generator=torch.Generator().manual_seed(1), dtype=torch.float64).to(device, dtype)
    y = fwht(x, normalized=True)
    torch.testing.assert_close(y.double().cpu(), (x.double().cpu() @ sylvester(d)) / math.sqrt(d), **tolerance(dtype, d))
    torch.testing.assert_close(fwht(y, normalized=True), x, **tolerance(dtype, d))
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1), rtol=10 * torch.finfo(dtype).eps * math.log2(2 * d), atol=0)


@pytest.mark.parametrize("d", [1, 8, 256])
def test_hadamard_matrix_is_sylvester(d, device):
    h = hadamard_matrix(d, dtype=torch.float64, device=device)
    assert h.device.type == device.type
    torch.testing.assert_close(h.cpu(), sylvester(d), rtol=0, atol=0)
    torch.testing.assert_close(h @ h.T, d * torch.eye(d, dtype=torch.float64, device=device), rtol=0, atol=0)


@pytest.mark.parametrize("batch_shape", [(), (5,), (2, 3), (2, 1, 4)])
def test_fwht_any_leading_batch_shape(batch_shape, device):
    d = 16
    x = torch.randn(*batch_shape, d, dtype=torch.float64, device=device)
    got = fwht(x)
    assert got.shape == x.shape
    torch.testing.assert_close(got, x @ sylvester(d, device=device), rtol=1e-12, atol=1e-12)


def test_fwht_of_non_contiguous_input(device):
    x = torch.randn(8, 6, dtype=torch.float64, device=device).mT  # (6, 8), non-contiguous
    torch.testing.assert_close(fwht(x), x @ sylvester(8, device=device), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("normalized", [False, True])
def test_fwht_gradcheck(normalized, device):
    x = torch.randn(2, 3, 8, dtype=torch.float64, device=device, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: fwht(t, normalized=normalized), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fwht(t, normalized=normalized), (x,))


def test_fwht_gradient_is_transform_of_upstream_gradient(device, dtype):
    # H is symmetric, so ∂⟨g, xH⟩/∂x = gH.
    x = torch.randn(4, 32, dtype=dtype, device=device, requires_grad=True)
    g = torch.randn(4, 32, dtype=dtype, device=device)
    (fwht(x) * g).sum().backward()
    torch.testing.assert_close(x.grad, fwht(g))


@pytest.mark.parametrize("d", [1, 3, 5, 7, 8, 9, 100])
def test_pad_option_zero_pads_to_next_power_of_two(d, device, dtype):
    x = torch.randn(2, d, dtype=dtype, device=device)
    padded = next_power_of_two(d)
    got = fwht(x, pad=True)
    assert got.shape == (2, padded)
    manual = torch.cat((x, torch.zeros(2, padded - d, dtype=dtype, device=device)), dim=-1)
    torch.testing.assert_close(pad_to_power_of_two(x), manual, rtol=0, atol=0)
    torch.testing.assert_close(got.double().cpu(), manual.double().cpu() @ sylvester(padded), **tolerance(dtype, padded))


@pytest.mark.parametrize("n, expected", [(0, 1), (1, 1), (2, 2), (3, 4), (4, 4), (5, 8), (1000, 1024), (1024, 1024)])
def test_next_power_of_two(n, expected):
    assert next_power_of_two(n) == expected


@pytest.mark.parametrize("d", [3, 6, 12, 1000])
def test_fwht_rejects_non_power_of_two(d, device):
    with pytest.raises(ValueError, match=rf"power-of-two.*got {d}.*pad=True"):
        fwht(torch.randn(2, d, device=device))


def test_fwht_rejects_empty_last_axis():
    with pytest.raises(ValueError, match="power-of-two"):
        fwht(torch.randn(2, 0))
