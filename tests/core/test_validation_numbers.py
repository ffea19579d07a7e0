"""Number arguments (rfgp.core.validation): every real number is accepted or refused by name, never crashes."""

import math

import numpy as np
import pytest

from rfgp.core.validation import check_positive_float


@pytest.mark.parametrize("value", [10**400, -(10**400)], ids=["10**400", "-10**400"])
def test_an_int_beyond_float_range_is_refused_by_name(value):
    """float() of it had raised a bare OverflowError ("int too large to convert to float")."""
    with pytest.raises(ValueError, match="noise must be a finite number > 0"):
        check_positive_float(value, "noise")


@pytest.mark.parametrize("value, expected", [(np.float32(0.5), 0.5), (np.int64(3), 3.0), (2, 2.0)])
def test_numpy_and_python_numbers_are_taken(value, expected):
    assert check_positive_float(value, "noise") == expected


@pytest.mark.parametrize("value", [0, -1.0, math.nan, math.inf, np.float32("inf")])
def test_non_positive_and_non_finite_are_refused(value):
    with pytest.raises(ValueError, match="noise must be a finite number > 0"):
        check_positive_float(value, "noise")
