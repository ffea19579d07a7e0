"""Shared statistical checks of random feature Grams against an exact kernel matrix."""

from __future__ import annotations

from typing import Callable

import torch


def assert_unbiased(make_gram: Callable[[int], torch.Tensor], exact: torch.Tensor, num_seeds: int,
                    num_se: float = 4.5) -> None:
    """|mean over seeds − exact| ≤ num_se·SE entrywise (plus float64 round-off for zero-variance entries)."""
    grams = torch.stack([make_gram(seed).detach() for seed in range(num_seeds)])
    mean, se = grams.mean(0), grams.std(0) / num_seeds**0.5
    excess = (mean - exact).abs() - num_se * se - 1e-10
    assert excess.max() <= 0, f"max |mean − exact| / SE = {((mean - exact).abs() / se.clamp_min(1e-15)).max():.2f}"


def relative_error(gram: torch.Tensor, exact: torch.Tensor) -> float:
    return float((gram.detach() - exact).norm() / exact.norm())


def assert_error_falls_like_inverse_sqrt(make_gram: Callable[[int, int], torch.Tensor], exact: torch.Tensor,
                                         small: int, large: int, num_seeds: int = 6) -> None:
    """Mean relative Frobenius error at width ``large`` vs ``small``: ratio ≈ √(large/small) (within a factor 1.6)."""
    errors = [sum(relative_error(make_gram(width, seed), exact) for seed in range(num_seeds)) / num_seeds
              for width in (small, large)]
    expected = (large / small) ** 0.5
    ratio = errors[0] / errors[1]
    assert expected / 1.6 < ratio < expected * 1.6, (errors, ratio, expected)


def assert_derivatives_match_finite_differences(scalar: Callable[[torch.Tensor], torch.Tensor], theta: torch.Tensor,
                                                step: float = 1e-5, rtol: float = 1e-6) -> None:
    """Autograd gradient vs central differences of the value, and Hessian vs central differences of the gradient."""
    theta = theta.detach().clone()

    def gradient(at: torch.Tensor, create_graph: bool = False) -> torch.Tensor:
        at = at.clone().requires_grad_()
        return torch.autograd.grad(scalar(at), at, create_graph=create_graph)[0]

    basis = torch.eye(theta.numel(), dtype=theta.dtype).reshape(-1, *theta.shape)
    fd_gradient = torch.stack([(scalar(theta + step * e) - scalar(theta - step * e)) / (2 * step) for e in basis])
    grad = gradient(theta)
    scale = grad.abs().max()
    assert torch.allclose(grad.flatten(), fd_gradient.detach(), rtol=rtol, atol=rtol * scale), (grad, fd_gradient)
    hessian = torch.autograd.functional.hessian(lambda t: scalar(t), theta).reshape(theta.numel(), theta.numel())
    fd_hessian = torch.stack([(gradient(theta + step * e) - gradient(theta - step * e)).flatten() / (2 * step)
                              for e in basis])
    scale = hessian.abs().max()
    assert torch.allclose(hessian, fd_hessian, rtol=1e-4, atol=1e-4 * scale), (hessian, fd_hessian)
