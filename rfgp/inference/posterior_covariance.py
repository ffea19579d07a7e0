"""The posterior covariance Σ* = RRᵀ of a feature-space GP, low-rank for products and sampling.

The weight-space posterior θ | y ~ N(m, A⁻¹) (A = I + ΦᵀD⁻¹Φ = LLᵀ, paper 000 §5.6) gives the
latent covariance at n test points as Σ* = Φ*A⁻¹Φ*ᵀ = RRᵀ with the n × F root R = Φ*L⁻ᵀ.
:class:`LowRankPosteriorCovariance` keeps R: matrix products cost O(n·F) per column, the
variance is the row norms of R, and ``MultivariateNormal.rsample()`` draws R·ε with
ε ~ N(0, I_F) in O(n·F) per sample (Thompson sampling over many candidates stays cheap).

It is deliberately *not* a ``RootLinearOperator``, whose ``root_decomposition()`` returns the
n × F factor itself: code that reads a root decomposition as a square Cholesky factor
(BoTorch's cached-root qNEI/qLogNEI, ``CachedCholeskyMCSamplerMixin``, solves triangular systems
with it; base samples are drawn with the distribution's ``base_sample_shape``, n for a
non-root operator) gets the lower-triangular n × n factor of the dense Σ*, as from an exact
GP: ``root_decomposition()`` follows linear_operator's default policy (Cholesky, with jitter
when n > F makes Σ* singular, up to ``max_cholesky_size``).
"""

from __future__ import annotations

import torch
from linear_operator.operators import DenseLinearOperator, LinearOperator, MatmulLinearOperator
from torch import Tensor


class LowRankPosteriorCovariance(MatmulLinearOperator):
    """Σ* = RRᵀ for a root R of shape ``(*batch, n, F)``; any F, including F > n.

    Args:
        root: the dense root R, e.g. Φ*L⁻ᵀ of a feature-space posterior.
    """

    def __init__(self, root: Tensor):
        if not torch.is_tensor(root) or root.dim() < 2:
            raise ValueError(f"root must be a tensor of shape (*batch, n, F), got {getattr(root, 'shape', root)!r}")
        LinearOperator.__init__(self, root)  # one argument, R: reconstruction, .to(), .detach() keep the symmetry
        self.low_rank_root = root
        self.left_linear_op = DenseLinearOperator(root)
        self.right_linear_op = DenseLinearOperator(root.mT)

    def _expand_batch(self, batch_shape) -> LowRankPosteriorCovariance:
        return self.__class__(self.low_rank_root.expand(*batch_shape, *self.low_rank_root.shape[-2:]))

    def _permute_batch(self, *dims: int) -> LowRankPosteriorCovariance:
        return self.__class__(self.low_rank_root.permute(*dims, -2, -1))

    def _transpose_nonbatch(self) -> LowRankPosteriorCovariance:
        return self

    # The product rule through R by autograd, over this operator's one argument (MatmulLinearOperator's
    # version returns one gradient per factor, i.e. two).
    _bilinear_derivative = LinearOperator._bilinear_derivative

    def _diagonal(self) -> Tensor:
        return self.low_rank_root.pow(2).sum(-1)

    def zero_mean_mvn_samples(self, num_samples: int) -> Tensor:
        """R·ε, ε ~ N(0, I_F): ``(num_samples, *batch, n)`` samples of N(0, RRᵀ) in O(num_samples·n·F)."""
        root = self.low_rank_root
        noise = torch.randn(*self.batch_shape, root.shape[-1], num_samples, dtype=root.dtype, device=root.device)
        return (root @ noise).permute(-1, *range(self.dim() - 1)).contiguous()
