"""Checks that a converted kernel holds its own copies of the exact kernel's constraints and priors."""

import torch


def _assert_copied_module(copied, original) -> None:
    assert type(copied) is type(original) and copied is not original
    state, other = copied.state_dict(), original.state_dict()
    assert state.keys() == other.keys()
    for name, value in state.items():
        assert value.dtype == other[name].dtype and torch.equal(value, other[name]), name


def assert_copied_constraint(copied, original) -> None:
    """``copied`` is a copy of the constraint ``original``: same class, bounds, transform and initial value."""
    _assert_copied_module(copied, original)
    assert copied.enforced == original.enforced and type(copied._transform) is type(original._transform)
    assert copied.initial_value == original.initial_value


def assert_copied_prior(copied, original) -> None:
    """``copied`` is a copy of the prior ``original``: same class and parameters, bit for bit."""
    _assert_copied_module(copied, original)
