"""The unit-sphere check names the row off the sphere by its position in x."""

import pytest
import torch

from rfgp.core.validation import check_unit_rows


def _unit(shape):
    return torch.nn.functional.normalize(torch.randn(*shape, dtype=torch.float64,
                                                     generator=torch.Generator().manual_seed(0)), dim=-1)


def test_a_batched_input_names_batch_index_and_row():
    """The flat index over the batch had been given as the row: 'row 7' for row 2 of member 1."""
    x = _unit((2, 5, 3))
    x[1, 2] *= 1.01
    with pytest.raises(ValueError, match=r"row \(1, 2\) has norm 1\.01"):
        check_unit_rows(x, "x", "")


def test_an_unbatched_input_names_the_row():
    x = _unit((5, 3))
    x[3] *= 0.99
    with pytest.raises(ValueError, match=r"row 3 has norm 0\.99 "):
        check_unit_rows(x, "x", "")
