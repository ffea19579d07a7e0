"""The fixed quadrature (1 + s)^−α ≈ c₀ + Σ wₖ e^{−tₖ s}: its measured error bound, positive weights, α-derivative."""

import math

import torch

from rfgp.features import exponential_quadrature as quadrature

F64 = torch.float64


def test_relative_error_is_below_1e_7_over_the_documented_range():
    alpha = torch.logspace(-3, math.log10(quadrature.MAX_POWER), 80, dtype=F64)
    decay = torch.cat([torch.linspace(0, 1, 200, dtype=F64),
                       torch.logspace(0, math.log10(quadrature.MAX_DECAY), 400, dtype=F64)])
    error = quadrature.max_relative_error(alpha, decay)
    assert error.max() < 1e-7, error.max()  # documented: 6.4e-8
    # and it is a real bound: past the range the error grows (α = 8 needs a finer step)
    assert quadrature.max_relative_error(torch.tensor([8.0], dtype=F64), decay) > 1e-7


def test_weights_are_positive_and_sum_to_one():
    alpha = torch.tensor([1e-3, 0.05, 0.5, 1.0, 3.0, 5.0], dtype=F64)
    log_w, log_tail = quadrature.log_weights(alpha, quadrature.log_nodes())
    assert log_w.shape == (6, quadrature.NUM_NODES) and torch.isfinite(log_w).all() and torch.isfinite(log_tail).all()
    total = log_w.exp().sum(-1) + log_tail.exp()  # s = 0: (1 + 0)^−α = 1
    torch.testing.assert_close(total, torch.ones_like(total), rtol=1e-7, atol=0)  # the bound at s = 0


def test_alpha_derivative_matches_the_exact_one():
    alpha = torch.tensor([0.1, 0.7, 2.5], dtype=F64, requires_grad=True)
    decay = torch.tensor([0.0, 0.3, 4.0, 150.0], dtype=F64)
    nodes = quadrature.log_nodes()
    log_w, log_tail = quadrature.log_weights(alpha, nodes)
    mixture = (log_w.unsqueeze(-2) - nodes.exp() * decay.unsqueeze(-1)).exp().sum(-1) + log_tail.exp().unsqueeze(-1)
    exact = (1 + decay).pow(-alpha.unsqueeze(-1))
    (grad,) = torch.autograd.grad(mixture.sum(), alpha)
    (expected,) = torch.autograd.grad(exact.sum(), alpha)
    torch.testing.assert_close(grad, expected, rtol=1e-6, atol=1e-9)
