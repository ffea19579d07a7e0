r"""GPyTorch's ``ArcKernel`` with a feature kernel as its base: features of the base on the same arc embedding.

The arc kernel of Swersky, Duvenaud, Snoek, Hutter & Osborne (2013, *Raiders of the Lost Architecture: Kernels
for Bayesian Optimization in Conditional Parameter Spaces*, arXiv:1409.4011, §3) evaluates a Euclidean base
kernel k_b on a cylindrical embedding of each input column, which a relevance indicator δᵢ(x) switches off.
GPyTorch's parameterisation (``gpytorch/kernels/arc_kernel.py``), per column i (ARD) or shared:

    gᵢ(x) = δᵢ(x)·rᵢ·[sin(πρᵢxᵢ/ℓᵢ), cos(πρᵢxᵢ/ℓᵢ)],      k(x, y) = k_b(g(x), g(y)),

g(x) = [r⊙sin(πρ⊙x/ℓ)⊙δ, r⊙cos(πρ⊙x/ℓ)⊙δ] ∈ ℝ^{2d} (all sines, then all cosines), with the angle ρ ∈ (0.1, 0.9)
(``Interval(0.1, 0.9)``), the radius r > 0 and a lengthscale ℓ, each of shape ``(*batch, 1, d or 1)``; the
default δ is 1.  If k_b(u, v) ≈ Φ_b(u)ᵀΦ_b(v), then k(x, y) ≈ Φ_b(g(x))ᵀΦ_b(g(y)): the features of the
base kernel on the embedding, unbiased whenever the base's are, with the base's variance at the embedded
points.  The embedding is a differentiable function of ρ, r and ℓ, so gradients reach them through Φ_b
(autograd; the base's draws stay fixed).

GPyTorch fixes the base kernel's lengthscale at 1 (``requires_grad_(False)``) when it builds an ``ArcKernel``;
``rfgp.sketch`` carries the base's lengthscale and its ``requires_grad`` as they are.  A custom ``delta_func``
(a Python callable of the inputs) is carried as it is and, as in GPyTorch, is not part of ``state_dict``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import Kernel
from gpytorch.priors import Prior
from torch import Tensor

from ..core.dtypes import cast_to
from ..core.validation import check_finite
from .combinations import (
    is_exact_feature_kernel,
    is_feature_kernel,
    kernel_diag_moments,
    kernel_features,
    kernel_num_features,
    kernel_squared_norm,
    select_active,
    unwrap_scale,
)
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .random_feature_kernel import FeatureKernel

#: GPyTorch's constraint of the angle ρ
ANGLE_BOUNDS = (0.1, 0.9)


class SketchedArcKernel(FeatureKernel):
    r"""k(x, y) = k_b(g(x), g(y)) on the arc embedding g (see the module doc) with features Φ_b(g(x)).

    Args:
        base_kernel: an rfgp feature kernel (tree), optionally inside ``ScaleKernel``, on the 2d embedded columns.
        delta_func: δ(x), a tensor like x of 0/1 relevance indicators; ``None``: all ones (GPyTorch's default).
        angle_prior, radius_prior: priors of ρ and r.
        angle_constraint: constraint of ``raw_angle`` (default GPyTorch's ``Interval(0.1, 0.9)``).
        radius_constraint: constraint of ``raw_radius`` (default ``Positive()``).
        kwargs: ``ard_num_dims`` (one ρ, r, ℓ per column), ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint``.

    Raises:
        TypeError: a base kernel that is not an rfgp feature kernel, or one with several outputs per input.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedArcKernel, SketchedMaternKernel
        >>> kernel = SketchedArcKernel(SketchedMaternKernel(256, nu=2.5, seed=0), ard_num_dims=3)
        >>> kernel.num_features, kernel(torch.rand(10, 3)).shape
        (256, torch.Size([10, 10]))
    """

    has_lengthscale = True

    def __init__(self, base_kernel: Kernel, delta_func: Callable[[Tensor], Tensor] | None = None,
                 angle_prior: Prior | None = None, radius_prior: Prior | None = None,
                 angle_constraint: Interval | None = None, radius_constraint: Interval | None = None,
                 **kwargs) -> None:
        if not is_feature_kernel(base_kernel):
            raise TypeError(
                f"base_kernel must be an rfgp feature kernel (optionally inside ScaleKernel), got "
                f"{type(unwrap_scale(base_kernel)[0]).__name__}; rfgp.sketch(ArcKernel(base), F) converts an exact one"
            )
        probe = torch.zeros(1, 1)
        outputs = base_kernel.num_outputs_per_input(probe, probe)
        if outputs != 1:
            raise TypeError(f"base_kernel has {outputs} outputs per input (derivative or multitask); the arc kernel "
                            "is a scalar kernel of its embedding")
        if delta_func is not None and not callable(delta_func):
            raise TypeError(f"delta_func must be callable (x -> relevance indicators like x), got "
                            f"{type(delta_func).__name__}")
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        shape = (*self.batch_shape, 1, self.ard_num_dims or 1)
        register_positive_hyperparameter(self, "angle", shape, angle_prior,
                                         Interval(*ANGLE_BOUNDS) if angle_constraint is None else angle_constraint)
        register_positive_hyperparameter(self, "radius", shape, radius_prior, radius_constraint)
        self.base_kernel = base_kernel
        self.delta_func = delta_func

    angle = PositiveHyperparameter()
    radius = PositiveHyperparameter()

    @property
    def num_features(self) -> int:
        return kernel_num_features(self.base_kernel)

    @property
    def is_exact(self) -> bool:
        """Exact where the base kernel's features are (an arc of a linear kernel)."""
        return is_exact_feature_kernel(self.base_kernel)

    def embedding(self, x: Tensor) -> Tensor:
        """g(x) = [r⊙sin(πρ⊙x/ℓ)⊙δ(x), r⊙cos(πρ⊙x/ℓ)⊙δ(x)], ``(..., n, 2d)``; checked finite (a NaN ρ, r or ℓ would
        make every feature NaN)."""
        phase = math.pi * cast_to(self.angle, x.dtype) / cast_to(self.lengthscale, x.dtype) * x
        radius = cast_to(self.radius, x.dtype)
        sine, cosine = radius * torch.sin(phase), radius * torch.cos(phase)
        if self.delta_func is not None:
            mask = self.delta_func(x)
            sine, cosine = sine * mask, cosine * mask
        embedded = torch.cat([sine, cosine], dim=-1)
        check_finite(embedded, "the arc embedding r·[sin, cos](π·angle·x/lengthscale)")
        return embedded

    def featurize(self, x: Tensor) -> Tensor:
        return kernel_features(self.base_kernel, self.embedding(x))

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """The base kernel's closed-form ‖Φ_b(g(x))‖² (``None`` where it has none)."""
        return kernel_squared_norm(self.base_kernel, self.embedding(x))

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        return kernel_diag_moments(self.base_kernel, self.embedding(x))

    def prepare(self, x: Tensor) -> None:
        """The base kernel fits what it fits (an optimized Maclaurin allocation) on the embedded points."""
        with torch.no_grad():
            embedded = self.embedding(x)
        unwrap_scale(self.base_kernel)[0].prepare(select_active(self.base_kernel, embedded))
