"""gather_product against the plain product of gathers; TensorSRHT's batched path against its per-degree projections."""

import math

import pytest
import torch

from rfgp.features import gather_product as module
from rfgp.features.degree_sketch import DegreeSketch
from rfgp.features.gather_product import gather_product, suffix_gather_product


def reference(values, index):
    out = 1
    for idx in index:
        if idx.dim() == 1:
            out = out * values[..., idx]
        else:
            out = out * values.gather(-1, idx.unsqueeze(-2).expand(*values.shape[:-1], idx.shape[-1]))
    return out


def _inputs(batched: bool, complex_values: bool, k: int = 3, gen_seed: int = 0):
    gen = torch.Generator().manual_seed(gen_seed)
    shape = (2, 4, 6) if batched else (4, 6)
    values = torch.randn(*shape, dtype=torch.float64, generator=gen)
    if complex_values:
        values = torch.complex(values, torch.randn(*shape, dtype=torch.float64, generator=gen))
    index = torch.randint(0, 6, (k, 2, 9) if batched else (k, 9), generator=gen)
    return values, index


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("complex_values", [False, True])
@pytest.mark.parametrize("k", [1, 2, 3])
def test_matches_product_of_gathers(batched, complex_values, k):
    values, index = _inputs(batched, complex_values, k)
    torch.testing.assert_close(gather_product(values, index), reference(values, index), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("block_bytes", [1, 160, 300])  # 1, 2 or 1 (uneven) and 4 or 2 rows of 9 per block
@pytest.mark.parametrize("complex_values", [False, True])
def test_row_blocks_of_the_in_place_products(block_bytes, complex_values, monkeypatch):
    monkeypatch.setattr(module, "_BLOCK_BYTES", block_bytes)
    values, index = _inputs(False, complex_values)
    values = torch.stack((values, 2 * values, -values))[:, 1:]  # leading batch, 3 × 3 rows, non-contiguous
    torch.testing.assert_close(gather_product(values, index), reference(values, index), rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("batched", [False, True])
@pytest.mark.parametrize("complex_values", [False, True])
def test_gradients_to_second_order(batched, complex_values):
    values, index = _inputs(batched, complex_values)
    values.requires_grad_()
    # repeated indices within and across factors exercise the scatter-add of the backward
    assert torch.autograd.gradcheck(lambda v: gather_product(v, index), (values,))
    assert torch.autograd.gradgradcheck(lambda v: gather_product(v, index), (values,))


def test_gradient_equals_autograd_of_reference(device, dtype):
    values, index = _inputs(False, False)
    values = values.to(device, dtype).requires_grad_()
    index = index.to(device)
    upstream = torch.randn(4, 9, dtype=dtype, device=device)
    (got,) = torch.autograd.grad(gather_product(values, index), values, upstream)
    (expected,) = torch.autograd.grad(reference(values, index), values, upstream)
    torch.testing.assert_close(got, expected)


@pytest.mark.parametrize("blocks", ["tiled", "independent"])
@pytest.mark.parametrize("complex_weights", [False, True])
@pytest.mark.parametrize("draws", [(), (3,)])
def test_batched_srht_equals_product_of_per_degree_projections(blocks, complex_weights, draws):
    # One FWHT and one gather-product over all degrees and blocks = D^{-1/2} Π_i (projection i),
    # for a shared input (apply) and for distinct inputs (apply_to, as the hierarchical sketch uses it).
    d, width, degree = 6, 20, 3  # padded to 8: 3 blocks, the last one partial
    sketch = DegreeSketch(degree, width, d, "srht", complex_weights, blocks)
    buffers = sketch.draw(torch.Generator().manual_seed(1), batch_shape=draws)
    inputs = [torch.randn(5, d, dtype=torch.float64) for _ in range(degree)]
    for xs in ([inputs[0]] * degree, inputs):
        expected = math.prod(sketch.project(x, i, buffers.__getitem__) for i, x in enumerate(xs)) / math.sqrt(width)
        got = sketch.apply_to(xs, buffers.__getitem__)
        assert got.shape == (*draws, 5, width)
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def _suffix_inputs(complex_values: bool, rows=(2, 5)):
    """Four factors reaching the columns 0:, 2:, 2: and 7: of 9."""
    gen = torch.Generator().manual_seed(3)
    starts = (0, 2, 2, 7)
    dtype = torch.complex128 if complex_values else torch.float64
    values = torch.randn(*rows, 6, dtype=dtype, generator=gen)
    indices = [torch.randint(0, 6, (9 - s,), generator=gen) for s in starts]
    return values, indices, starts


def suffix_reference(values, indices, starts):
    columns = []
    for column in range(9):
        value = 1
        for start, index in zip(starts, indices):
            if column >= start:
                value = value * values[..., index[column - start]]
        columns.append(value)
    return torch.stack(columns, dim=-1)


@pytest.mark.parametrize("complex_values", [False, True])
@pytest.mark.parametrize("block_bytes", [1, 64, 8 << 20])  # one row, a few rows, every row per block
def test_suffix_products_match_the_products_of_each_column(complex_values, block_bytes, monkeypatch):
    monkeypatch.setattr(module, "_BLOCK_BYTES", block_bytes)
    values, indices, starts = _suffix_inputs(complex_values)
    values.requires_grad_()
    got = suffix_gather_product(values, indices, starts)
    expected = suffix_reference(values, indices, starts)
    torch.testing.assert_close(got, expected, rtol=1e-14, atol=1e-14)
    upstream = torch.randn(got.shape, dtype=got.dtype, generator=torch.Generator().manual_seed(4))
    (a,), (b,) = torch.autograd.grad(got, values, upstream), torch.autograd.grad(expected, values, upstream)
    torch.testing.assert_close(a, b, rtol=1e-13, atol=1e-13)


def test_suffix_products_gradients_to_second_order():
    values, indices, starts = _suffix_inputs(True, rows=(3,))
    values.requires_grad_()
    assert torch.autograd.gradcheck(lambda v: suffix_gather_product(v, indices, starts), (values,))
    assert torch.autograd.gradgradcheck(lambda v: suffix_gather_product(v, indices, starts), (values,))


@pytest.mark.parametrize("starts", [(1, 2), (0,)])
def test_suffix_products_refuse_inconsistent_starts(starts):
    with pytest.raises(ValueError, match="starts must begin with 0"):
        suffix_gather_product(torch.ones(2, 4), [torch.zeros(4, dtype=torch.long), torch.zeros(2, dtype=torch.long)],
                              starts)


@pytest.mark.parametrize("complex_values", [False, True])
@pytest.mark.parametrize("batched", [False, True])
def test_forward_mode_and_forward_over_reverse(complex_values, batched):
    """Forward mode (the product rule, vmapped over batched tangents) and forward-over-reverse derivatives against
    finite differences: without a jvp they failed with PyTorch's "You must implement the jvp function", and
    conj() in the backward failed a forward-over-reverse Hessian with the internal assert "has_fw_view"."""
    values, index = _inputs(batched, complex_values)
    values.requires_grad_()
    assert torch.autograd.gradcheck(lambda v: gather_product(v, index), (values,), check_forward_ad=True,
                                    check_batched_forward_grad=True)
    suffix_values, indices, starts = _suffix_inputs(complex_values, rows=(3,))
    suffix_values.requires_grad_()
    product = lambda v: suffix_gather_product(v, indices, starts)  # noqa: E731
    assert torch.autograd.gradcheck(product, (suffix_values,), check_forward_ad=True, check_batched_forward_grad=True)
    assert torch.autograd.gradgradcheck(product, (suffix_values,), check_fwd_over_rev=True)
