"""Feature-space linear algebra: the weighted Gram matrix with a lean backward pass.

A random-feature GP is determined by the F × F statistic ΦᵀWΦ (W diagonal) and the
F × t statistic ΦᵀWR.  Autograd
through ``(Φ * w).mT @ Φ`` costs three N·F² products (one forward, two backward); the
custom function below exploits the symmetry of the result and needs two, which is the
4·N·F² floating-point floor of one MLL-and-gradient evaluation.
"""

from __future__ import annotations

import torch
from torch import Tensor


class _WeightedGram(torch.autograd.Function):
    @staticmethod
    def forward(ctx, features: Tensor, weights: Tensor) -> Tensor:
        ctx.save_for_backward(features, weights)
        return (features * weights.unsqueeze(-1)).mT @ features

    @staticmethod
    def backward(ctx, grad_gram: Tensor):
        features, weights = ctx.saved_tensors
        sym = 0.5 * (grad_gram + grad_gram.mT)
        projected = features @ sym  # the one N·F² product of the backward pass
        grad_features = grad_weights = None
        if ctx.needs_input_grad[0]:
            grad_features = 2.0 * weights.unsqueeze(-1) * projected
            grad_features = _sum_to_shape(grad_features, features.shape)
        if ctx.needs_input_grad[1]:
            grad_weights = _sum_to_shape((features * projected).sum(-1), weights.shape)
        return grad_features, grad_weights


def _sum_to_shape(grad: Tensor, shape: torch.Size) -> Tensor:
    """Undo broadcasting: sum ``grad`` over the leading/expanded axes that ``shape`` lacks."""
    if grad.shape == shape:
        return grad
    lead = grad.dim() - len(shape)
    grad = grad.sum(dim=tuple(range(lead))) if lead > 0 else grad
    axes = tuple(i for i, size in enumerate(shape) if size == 1 and grad.shape[i] != 1)
    return grad.sum(dim=axes, keepdim=True) if axes else grad


def weighted_gram(features: Tensor, weights: Tensor) -> Tensor:
    """ΦᵀWΦ for Φ of shape ``(..., N, F)`` and diagonal weights ``(..., N)`` (broadcast over batches)."""
    batch = torch.broadcast_shapes(features.shape[:-2], weights.shape[:-1])
    features = features.expand(*batch, *features.shape[-2:])
    weights = weights.expand(*batch, weights.shape[-1])
    return _WeightedGram.apply(features, weights)


def feature_statistics(features: Tensor, weights: Tensor, rhs: Tensor) -> tuple[Tensor, Tensor]:
    """(ΦᵀWΦ, ΦᵀWR) for materialised Φ ``(..., N, F)``, weights ``(..., N)`` and R ``(..., N, t)``.

    The chunked counterpart is :func:`rfgp.chunking.chunked_feature_statistics`.
    """
    return weighted_gram(features, weights), features.mT @ (rhs * weights.unsqueeze(-1))
