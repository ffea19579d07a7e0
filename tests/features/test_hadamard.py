"""FWHT against an independently built Sylvester–Hadamard matrix (recursive Kronecker products)."""

import math

import pytest
import torch

from rfgp.features import hadamard
from rfgp.features.hadamard import fwht, hadamard_matrix, kronecker_factors, next_power_of_two, pad_to_power_of_two

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


def butterfly(x: torch.Tensor) -> torch.Tensor:
    """Reference radix-2 FWHT (log₂ d stages of (a + b, a − b)), independent of the Kronecker factors."""
    d = x.shape[-1]
    y, half = x.reshape(-1, d), 1
    while half < d:
        pairs = y.view(-1, d // (2 * half), 2, half)
        y = torch.stack((pairs[:, :, 0] + pairs[:, :, 1], pairs[:, :, 0] - pairs[:, :, 1]), dim=2).reshape(-1, d)
        half *= 2
    return y.reshape(x.shape)


@pytest.mark.parametrize(
    "d, factors",
    [(1, [1]), (64, [64]), (128, [8, 16]), (1024, [32, 32]), (2048, [8, 16, 16]), (2**15, [32, 32, 32]), (2**16, [16] * 4)],
)
def test_kronecker_factors_multiply_to_d_and_stay_small(d, factors):
    assert kronecker_factors(d) == factors
    assert math.prod(factors) == d and factors == sorted(factors)


@pytest.mark.parametrize("d", [128, 2**15])
def test_factored_path_is_taken_and_matches_butterfly_on_strided_batches(d, device, dtype, monkeypatch):
    # Record which explicit factors fwht multiplies by: it must be exactly the Kronecker factors
    # (the CUDA kernel, when installed, would bypass them: the test forces the torch path).
    used = []
    sylvester_factor = hadamard._sylvester
    monkeypatch.setattr(hadamard, "_sylvester", lambda size, *args: used.append(size) or sylvester_factor(size, *args))
    monkeypatch.setattr(hadamard, "_cuda_hadamard_transform", None)
    gen = torch.Generator().manual_seed(d)
    base = torch.randn(3, d, 2, generator=gen, dtype=torch.float64)
    inputs = {
        "transposed": base.mT,  # (3, 2, d), last axis strided
        "sliced": torch.randn(2, 3, 2 * d, generator=gen, dtype=torch.float64)[..., ::2],
        "expanded": base[:, :, 0].unsqueeze(0).expand(4, 3, d),
    }
    for name, x in inputs.items():
        assert not x.is_contiguous()
        used.clear()
        got = fwht(x.to(device=device, dtype=dtype))
        assert sorted(used) == kronecker_factors(d), name
        assert got.shape == x.shape
        torch.testing.assert_close(got.double().cpu(), butterfly(x), **tolerance(dtype, d), msg=name)


def test_factored_fwht_gradcheck():
    x = torch.randn(2, 128, dtype=torch.float64, requires_grad=True)  # 8 × 16 factors
    assert torch.autograd.gradcheck(lambda t: fwht(t, normalized=True), (x,))
    assert torch.autograd.gradgradcheck(lambda t: fwht(t, normalized=True), (x,))


def test_cached_factors_work_under_inference_mode_then_autograd():
    # A factor first built under inference_mode must not be an inference tensor (autograd would refuse it).
    hadamard._sylvester.cache_clear()
    with torch.inference_mode():
        fwht(torch.randn(2, 256))
    x = torch.randn(2, 256, requires_grad=True)
    fwht(x).sum().backward()
    torch.testing.assert_close(x.grad, fwht(torch.ones(2, 256)))
