"""module_dtype (asked at every kernel call) and the prediction strategy's placement read a module's first floating
parameter or buffer, walking the module tree only up to it."""

import torch
from torch import nn

from rfgp.core.validation import first_floating_tensor, module_dtype
from rfgp.inference.prediction import _placement


class CountedParameters(dict):
    """A module's ``_parameters`` that counts how often they are listed."""

    listed = 0

    def items(self):
        CountedParameters.listed += 1
        return super().items()


def tree():
    root = nn.Module()
    root.register_buffer("index", torch.arange(3))  # not floating: skipped
    root.register_buffer("scale", torch.ones(2, dtype=torch.float64))
    child = nn.Module()
    child.weight = nn.Parameter(torch.ones(2, dtype=torch.float32))
    child._parameters = CountedParameters(child._parameters)
    leaf = nn.Module()
    leaf.register_buffer("late", torch.ones(1, dtype=torch.float16))
    child.leaf = leaf
    root.child = child
    return root, child


def test_parameters_first_then_buffers_as_before():
    root, child = tree()
    assert first_floating_tensor(root) is child.weight  # a parameter anywhere in the tree before any buffer
    assert module_dtype(root) == torch.float32
    assert _placement(root) == (torch.float32, torch.device("cpu"))
    without = nn.Module()
    without.register_buffer("scale", torch.ones(1, dtype=torch.float64))
    assert module_dtype(without) == torch.float64
    assert module_dtype(nn.Module()) is None and _placement(nn.Module()) is None and _placement(None) is None


def test_the_tree_is_walked_up_to_the_first_floating_tensor():
    root = nn.Module()
    root.weight = nn.Parameter(torch.ones(2, dtype=torch.float64))
    child = nn.Module()
    child.other = nn.Parameter(torch.ones(2))
    child._parameters = CountedParameters(child._parameters)
    root.child = child
    CountedParameters.listed = 0
    assert module_dtype(root) == torch.float64 and _placement(root)[0] == torch.float64
    assert CountedParameters.listed == 0  # before: every parameter and buffer of the tree listed, twice per call
