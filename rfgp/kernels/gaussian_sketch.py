"""The RBF kernel with the truncated-Taylor GaussianSketch/GaussianSketchHD features of paper 003.

exp(−‖z − z'‖²/2) = e^{−‖z‖²/2} e^{−‖z'‖²/2} Σₖ (zᵀz')ᵏ/k! (z = (x − c)/ℓ) is truncated at order s
and the degree-k blocks are sketched (explicit when s^d ≤ F); the truncation bias
k(x, x) − K_s(x, x) goes to the posterior variance correction.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from ..core.validation import check_choice, check_positive_float
from ..features.gaussian_sketch import GaussianSketch, GaussianSketchHD, check_center
from .families import refuse_other_family_options
from .fourier import SketchedRBFKernel, _input_dim

#: ``method`` names of the truncated-Taylor sketches of the RBF kernel (paper 003) and their maps.
GAUSSIAN_SKETCH_METHODS = {"gaussian_sketch": GaussianSketch, "gaussian_sketch_hd": GaussianSketchHD}


class GaussianSketchRBFKernel(SketchedRBFKernel):
    r"""RBF kernel exp(−‖x − y‖²/(2ℓ²)) with GaussianSketch(HD) features (paper 003, Algorithms 1/2).

    The Taylor expansion is around the origin, so the inputs are shifted by a centre c and
    scaled, z = (x − c)/ℓ.  The truncation order s is the smallest with additive error ≤ α for
    inputs within ``radius`` of c (paper 003 Thms 3.1/3.3; box radius for GaussianSketch,
    ball radius for HD), evaluated at the lengthscale ``min_lengthscale``: a smaller
    lengthscale makes radius/ℓ larger, so the bound would no longer hold, and the kernel
    raises instead.  Also built by ``SketchedRBFKernel(F, method="gaussian_sketch", ...)``.

    Args:
        num_features: output width F of the feature map.
        method: ``"gaussian_sketch"`` (GaussianSketch, sketches of zᵏ per block) or
            ``"gaussian_sketch_hd"`` (GaussianSketchHD, for high dimensions).
        input_dim: input dimension (defaults to ``ard_num_dims``; otherwise set at the first call).
        seed: seed of the sketches.
        generator: a ``torch.Generator`` for the sketches, instead of ``seed``.
        order: the truncation order s; or ``None`` to derive it from ``radius`` and ``alpha``.
        radius: bound on ‖x − center‖_∞ (GaussianSketch) or ‖x − center‖₂ (HD) in INPUT units.
        alpha: target additive error of the kernel distance (paper 003 Thms 3.1/3.3).
        center: c, subtracted from the inputs before scaling (default: no shift).
        min_lengthscale: the smallest lengthscale s is chosen for (default ln 2, GPyTorch's
            initial lengthscale; only with ``radius``, ``ValueError`` without it).  A lengthscale below it raises;
            ``lengthscale_constraint=gpytorch.constraints.GreaterThan(min_lengthscale)`` prevents it.
        mode: GaussianSketch only: ``"auto"``, ``"tree"`` or ``"explicit"`` (the map's default: ``"auto"``).
        **kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernel``.

    Raises:
        ValueError: an unknown ``method``, an option of another RBF family (naming it and the
            class that takes it), a non-positive ``radius``/``min_lengthscale``, or a width F
            too small for the order.

    Example:
        >>> import torch
        >>> from rfgp.kernels import GaussianSketchRBFKernel
        >>> kernel = GaussianSketchRBFKernel(64, order=6, center=[0.5, 0.5], input_dim=2, seed=0)
        >>> kernel.feature_map.order
        6
        >>> kernel(torch.rand(5, 2)).shape
        torch.Size([5, 5])
    """

    family_methods = tuple(GAUSSIAN_SKETCH_METHODS)
    legacy_type_names = ("SketchedRBFKernel",)

    def __init__(
        self,
        num_features: int,
        method: str = "gaussian_sketch",
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        order: int | None = None,
        radius: float | None = None,
        alpha: float | None = None,
        center=None,
        min_lengthscale: float | None = None,
        mode: str | None = None,
        **kwargs,
    ) -> None:
        check_choice(method, "method", self.family_methods)
        kwargs = refuse_other_family_options(self, method, kwargs)
        if min_lengthscale is not None and radius is None:
            raise ValueError(
                f"min_lengthscale={min_lengthscale!r} only applies with radius= (the order is chosen for "
                "radius/min_lengthscale); with order= alone there is no bound to protect"
            )
        if radius is not None:
            min_lengthscale = check_positive_float(
                math.log(2) if min_lengthscale is None else min_lengthscale, "min_lengthscale")
            radius = check_positive_float(radius, "radius", allow_zero=True) / min_lengthscale
        options = {"mode": mode} if mode is not None else {}
        feature_map = GAUSSIAN_SKETCH_METHODS[method](
            num_features, order=order, radius=radius, alpha=alpha, input_dim=_input_dim(input_dim, kwargs),
            seed=seed, generator=generator, **options,
        )
        self._setup_rbf(method, feature_map, kwargs, min_lengthscale=min_lengthscale)
        # a None buffer when absent: GPyTorch's batch expansion (__getitem__) walks every buffer
        if center is not None:
            center = check_center(center, self.feature_map.input_dim, torch.get_default_dtype())
        self.register_buffer("input_center", center)

    def scale_inputs(self, x: Tensor) -> Tensor:
        """(x − c)/ℓ; refuses a lengthscale below the ``min_lengthscale`` the order s was chosen for."""
        if self.min_lengthscale is not None and bool((self.lengthscale < self.min_lengthscale * (1 - 1e-6)).any()):
            raise ValueError(
                f"lengthscale {self.lengthscale.min().item():.7g} is below min_lengthscale={self.min_lengthscale:.7g} "
                f"for which the truncation order s={self.feature_map.order} was chosen (radius/lengthscale grew, so "
                "the truncation bound no longer holds): rebuild the kernel with a smaller min_lengthscale or "
                "constrain it with lengthscale_constraint=gpytorch.constraints.GreaterThan(min_lengthscale)"
            )
        if self.input_center is not None:
            if self.input_center.numel() not in (1, x.shape[-1]):
                raise ValueError(f"center has {self.input_center.numel()} entries but the inputs have {x.shape[-1]} "
                                 "columns (after active_dims): pass one entry per column")
            x = x - self.input_center.to(x)
        return super().scale_inputs(x)
