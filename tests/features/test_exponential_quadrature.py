"""The fixed quadrature (1 + s)^−α ≈ c₀ + Σ wₖ e^{−tₖ s}: its measured error bound, positive weights, α-derivative."""

import math

import torch

from rfgp.features import exponential_quadrature as quadrature

F64 = torch.float64


def test_relative_error_is_below_1e_7_up_to_power_12():
    """BoTorch's fits reach α ≈ 2.5 and their line searches far beyond: the first rule (h = 0.35) covered α ≤ 5."""
    assert quadrature.MAX_POWER == 12.0 and quadrature.NUM_NODES == 105
    alpha = torch.cat([torch.logspace(-3, 0, 40, dtype=F64), torch.linspace(1, 12, 89, dtype=F64)])
    decay = torch.cat([torch.linspace(0, 1, 200, dtype=F64),
                       torch.logspace(0, math.log10(quadrature.MAX_DECAY), 400, dtype=F64)])
    error = quadrature.max_relative_error(alpha, decay)
    assert error.max() < 1e-7, error.max()  # documented: 6.8e-8 (at α ≈ 0.07, s = 1e4); 1.7e-8 at α = 12
    # and it is a real bound: past the range the error grows (α = 16 needs a finer step)
    assert quadrature.max_relative_error(torch.tensor([16.0], dtype=F64), decay) > 2e-7


def test_weights_are_positive_and_sum_to_one():
    alpha = torch.tensor([1e-3, 0.05, 0.5, 1.0, 3.0, 5.0, 9.0, 12.0], dtype=F64)
    log_w, log_tail = quadrature.log_weights(alpha, quadrature.log_nodes())
    assert log_w.shape == (8, quadrature.NUM_NODES) and torch.isfinite(log_w).all() and torch.isfinite(log_tail).all()
    total = log_w.exp().sum(-1) + log_tail.exp()  # s = 0: (1 + 0)^−α = 1
    torch.testing.assert_close(total, torch.ones_like(total), rtol=1e-7, atol=0)  # the bound at s = 0


def test_alpha_derivative_matches_the_exact_one():
    alpha = torch.tensor([0.1, 0.7, 2.5, 8.0, 11.5], dtype=F64, requires_grad=True)
    decay = torch.tensor([0.0, 0.3, 4.0, 150.0], dtype=F64)
    nodes = quadrature.log_nodes()
    log_w, log_tail = quadrature.log_weights(alpha, nodes)
    mixture = (log_w.unsqueeze(-2) - nodes.exp() * decay.unsqueeze(-1)).exp().sum(-1) + log_tail.exp().unsqueeze(-1)
    exact = (1 + decay).pow(-alpha.unsqueeze(-1))
    (grad,) = torch.autograd.grad(mixture.sum(), alpha)
    (expected,) = torch.autograd.grad(exact.sum(), alpha)
    torch.testing.assert_close(grad, expected, rtol=2e-6, atol=1e-9)  # 1.1e-6 at α = 11.5
