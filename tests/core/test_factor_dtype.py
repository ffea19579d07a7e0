"""The working precision of F × F factors (rfgp.core.dtypes.factor_dtype) is never half precision."""

import pytest
import torch

from rfgp.core.dtypes import factor_dtype


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_float64_where_the_device_has_it(dtype):
    assert factor_dtype(dtype, torch.device("cpu")) == torch.float64


@pytest.mark.parametrize("dtype, expected", [(torch.float16, torch.float32), (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32)])
def test_float32_on_mps_which_has_no_float64(dtype, expected):
    """Half-precision inputs had kept their half precision for the factors on MPS."""
    assert factor_dtype(dtype, torch.device("mps")) == expected
