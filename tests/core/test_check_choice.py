"""A choice argument that is none of the choices is refused by name, whatever its type."""

import numpy as np
import pytest
import torch

import rfgp
from rfgp.core.validation import check_choice

NOT_CHOICES = [["rff"], np.array(["rff", "orf"]), torch.tensor(1.0)]


@pytest.mark.parametrize("value", NOT_CHOICES, ids=["list", "array", "tensor"])
def test_check_choice_names_an_array_or_unhashable_value(value):
    """A NumPy array had raised "The truth value of an array ... is ambiguous"."""
    with pytest.raises(ValueError, match="method must be one of 'a', 'b'"):
        check_choice(value, "method", ("a", "b"))


@pytest.mark.parametrize("value", NOT_CHOICES, ids=["list", "array", "tensor"])
def test_a_kernel_family_names_an_unhashable_method(value):
    """The family dispatch had raised a bare "unhashable type: 'list'" before the constructor's check."""
    with pytest.raises(ValueError, match="method must be one of 'rff'"):
        rfgp.kernels.SketchedRBFKernel(16, method=value)
