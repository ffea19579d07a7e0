"""Sums, products and scalings of feature kernels that stay feature kernels.

GPyTorch's ``AdditiveKernel``/``ProductKernel`` combine covariance *matrices*, which turns
a sum of low-rank ΦΦᵀ into a generic operator (solved iteratively) and a product into a
dense matrix.  On features the algebra is exact and stays low-rank:

* sum:      k₁ + k₂ ↦ [Φ₁, Φ₂]                       (width F₁ + F₂)
* product:  k₁·k₂   ↦ row-wise Kronecker Φ₁ ⊙ Φ₂     (width F₁·F₂)
* scale:    σ²k     ↦ σΦ                              (``gpytorch.kernels.ScaleKernel``)

:func:`rfgp.sketch` builds these from GPyTorch kernel trees.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, ScaleKernel
from torch import Tensor, nn

from .random_feature_kernel import FeatureKernel


def is_feature_kernel(kernel: Kernel) -> bool:
    """Whether ``kernel`` (possibly wrapped in ``ScaleKernel``) is an explicit feature kernel."""
    if isinstance(kernel, ScaleKernel):
        return is_feature_kernel(kernel.base_kernel)
    return isinstance(kernel, FeatureKernel)


def _select(kernel: Kernel, x: Tensor) -> Tensor:
    return x if kernel.active_dims is None else x.index_select(-1, kernel.active_dims)


def kernel_features(kernel: Kernel, x: Tensor) -> Tensor:
    """Φ(x) of a feature kernel or a ``ScaleKernel`` around one, honouring ``active_dims``."""
    x = _select(kernel, x)
    if isinstance(kernel, ScaleKernel):
        scale = kernel.outputscale.sqrt().unsqueeze(-1).unsqueeze(-1)
        return kernel_features(kernel.base_kernel, x) * scale
    if isinstance(kernel, FeatureKernel):
        return kernel.featurize(x)
    raise TypeError(f"{type(kernel).__name__} is not a feature kernel")


def kernel_diag_moments(kernel: Kernel, x: Tensor) -> tuple[Tensor, Tensor] | None:
    """(k(x, x), E[k̂(x, x)]) of a feature kernel tree, ``None`` where they agree exactly."""
    x = _select(kernel, x)
    if isinstance(kernel, ScaleKernel):
        moments = kernel_diag_moments(kernel.base_kernel, x)
        if moments is None:
            return None
        scale = kernel.outputscale.unsqueeze(-1)
        return moments[0] * scale, moments[1] * scale
    return kernel.diag_moments(x)


def _exact_moments(kernel: Kernel, x: Tensor) -> tuple[Tensor, Tensor]:
    """Diagonal moments, with E[k̂(x, x)] = k̂(x, x) = k(x, x) filled in for unbiased kernels."""
    moments = kernel_diag_moments(kernel, x)
    if moments is not None:
        return moments
    diag = kernel_features(kernel, x).pow(2).sum(-1)
    return diag, diag


class _CombinedFeatureKernel(FeatureKernel):
    def __init__(self, *kernels: Kernel, **kwargs) -> None:
        if len(kernels) < 1:
            raise ValueError("at least one kernel is needed")
        for i, kernel in enumerate(kernels):
            if not is_feature_kernel(kernel):
                raise TypeError(
                    f"kernels[{i}] is a {type(kernel).__name__}; only rfgp feature kernels "
                    "(optionally inside ScaleKernel) can be combined in feature space"
                )
            base = kernel.base_kernel if isinstance(kernel, ScaleKernel) else kernel
            if getattr(base, "complex_posterior", False):
                raise ValueError(
                    f"kernels[{i}] has complex_posterior=True, which combined kernels would silently drop "
                    "(their features are real): use it on a single kernel"
                )
        super().__init__(**kwargs)
        self.kernels = nn.ModuleList(kernels)


class FeatureSumKernel(_CombinedFeatureKernel):
    r"""k̂ = Σᵢ k̂ᵢ with features [Φ₁, …, Φₖ] (width ΣFᵢ): the low-rank form of ``AdditiveKernel``."""

    def featurize(self, x: Tensor) -> Tensor:
        parts = [kernel_features(kernel, x) for kernel in self.kernels]
        batch = torch.broadcast_shapes(*(p.shape[:-2] for p in parts))
        return torch.cat([p.expand(*batch, *p.shape[-2:]) for p in parts], dim=-1)

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        moments = [kernel_diag_moments(kernel, x) for kernel in self.kernels]
        if all(m is None for m in moments):
            return None
        pairs = [_exact_moments(kernel, x) for kernel in self.kernels]
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


class FeatureProductKernel(_CombinedFeatureKernel):
    r"""k̂ = Πᵢ k̂ᵢ with row-wise Kronecker features Φ₁ ⊙ Φ₂ ⊙ … (width ΠFᵢ): the form of ``ProductKernel``.

    The factors use independent draws, so E[Πk̂ᵢ] = ΠE[k̂ᵢ].  The width multiplies: keep
    the factors small.
    """

    def featurize(self, x: Tensor) -> Tensor:
        result = None
        for kernel in self.kernels:
            part = kernel_features(kernel, x)
            if result is None:
                result = part
            else:
                result = (result.unsqueeze(-1) * part.unsqueeze(-2)).flatten(-2)
        return result

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        if all(kernel_diag_moments(kernel, x) is None for kernel in self.kernels):
            return None
        target = expected = 1.0
        for kernel in self.kernels:
            t, e = _exact_moments(kernel, x)
            target, expected = target * t, expected * e
        return target, expected

