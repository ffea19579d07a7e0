"""rfgp.core.bounds: θ(u) stays inside its bounds, u(θ) inverts it, and gradients are finite in every case."""

import math

import torch

from rfgp.core.bounds import bounded_coordinate, bounded_value


def test_value_and_coordinate_invert_each_other_inside_every_kind_of_bounds():
    inf = math.inf
    lower = torch.tensor([1e-4, -inf, -2.0, -inf], dtype=torch.float64)
    upper = torch.tensor([inf, 3.0, 5.0, inf], dtype=torch.float64)
    theta = torch.tensor([0.02, -7.0, 4.5, -1.5], dtype=torch.float64)
    u = bounded_coordinate(theta, lower, upper)
    torch.testing.assert_close(bounded_value(u, lower, upper), theta, rtol=1e-12, atol=1e-15)
    u = torch.linspace(-40.0, 40.0, 4, dtype=torch.float64).requires_grad_(True)
    value = bounded_value(u, lower, upper)
    assert bool((value >= lower).all() & (value <= upper).all())
    (grad,) = torch.autograd.grad(value.sum(), u)
    assert bool(torch.isfinite(grad).all())


def test_a_value_on_or_outside_a_bound_is_taken_just_inside():
    lower, upper = torch.tensor([1e-4, 0.0], dtype=torch.float64), torch.tensor([math.inf, 1.0], dtype=torch.float64)
    u = bounded_coordinate(torch.tensor([1e-4, 1.5], dtype=torch.float64), lower, upper)
    value = bounded_value(u, lower, upper)
    assert bool(torch.isfinite(u).all())
    assert value[0] > 1e-4 and value[0] - 1e-4 < 1e-15 and value[1] < 1.0 and 1.0 - value[1] < 1e-15
