"""Stride-0 batch members evaluated once (rfgp.core.batch_copies): gradients reach every member as a dense
computation gives them."""

import torch

from rfgp import FeatureRootLinearOperator
from rfgp.core.batch_copies import broadcast_dims, distinct_members, narrow_broadcast
from rfgp.inference.linalg import feature_statistics


def _stride0_leaf_and_dense():
    phi = torch.randn(1, 5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return phi.expand(3, 5, 3).requires_grad_(), phi.expand(3, 5, 3).clone().requires_grad_()


def test_stride0_leaf_members_are_not_copies():
    leaf, _ = _stride0_leaf_and_dense()
    assert leaf.is_leaf and leaf.stride(0) == 0
    assert broadcast_dims(leaf, 1) == () and distinct_members(leaf, 1) == 3
    assert narrow_broadcast(leaf, 1) is leaf
    base = torch.randn(1, 5, 3, requires_grad=True)
    assert broadcast_dims(base.expand(3, 5, 3), 1) == (0,)  # copies made by expand in the graph: the sum is wanted


def test_gram_gradient_of_stride0_leaf_per_member():
    """Each member of a stride-0 leaf had received nothing but the first, which took every member's gradient."""
    leaf, dense = _stride0_leaf_and_dense()
    weights = torch.randn(3, 5, 5, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    (FeatureRootLinearOperator(leaf).to_dense() * weights).sum().backward()
    ((dense @ dense.mT) * weights).sum().backward()
    torch.testing.assert_close(leaf.grad, dense.grad)


def test_feature_statistics_gradient_of_stride0_leaf_per_member():
    leaf, dense = _stride0_leaf_and_dense()
    rhs = torch.randn(3, 5, 2, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    weights = torch.ones(3, 1, dtype=torch.float64)
    for phi in (leaf, dense):
        gram, cross = feature_statistics(phi, weights, rhs)
        (gram.sum() + (cross * torch.arange(cross.numel(), dtype=cross.dtype).reshape(cross.shape)).sum()).backward()
    torch.testing.assert_close(leaf.grad, dense.grad)
