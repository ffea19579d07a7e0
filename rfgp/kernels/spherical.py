"""The polynomial kernel on the unit sphere, approximated by Spherical Random Features.

k(x, y) = (1 − ‖x − y‖²/a²)^p = ((1 − 2/a²) + (2/a²) xᵀy)^p for ‖x‖ = ‖y‖ = 1
(paper 000, Eq. 57; wrap in ``gpytorch.kernels.ScaleKernel`` for σ²).  The features are
unbiased for a *fitted* kernel K̂ within ``max_fit_error`` of k, see
:class:`rfgp.features.SphericalRandomFeatures`; the prediction strategy adds
k(x, x) − K̂(0) (when positive) to the posterior variance.
"""

from __future__ import annotations

import os

import torch

from ..core.batch_copies import expand_batch
from ..core.config_state import METHOD
from ..core.validation import check_choice
from ..features.spherical import UNIT_ROWS_HINT, SphericalRandomFeatures
from .complex_posterior_option import ComplexPosteriorMixin, check_complex_posterior
from .random_feature_kernel import RandomFeatureKernel

#: ``method`` names (paper 000, §6.4 legends) and the direction sampler each uses.
SPHERICAL_METHODS = {"srf": "iid", "srf_orth": "structured", "srf_orth_complex": "structured"}


class SketchedSphericalPolynomialKernel(ComplexPosteriorMixin, RandomFeatureKernel):
    r"""(1 − ‖x − y‖²/a²)^p on the unit sphere with spherical random features (Pennington et al. 2015).

    There is no lengthscale: the kernel is defined on unit vectors, and inputs that are not
    unit-norm raise a ``ValueError`` unless ``normalize_inputs=True`` (then every row is
    divided by its norm, after ``active_dims``).

    Args:
        power: the degree p (integer ≥ 1).
        num_features: output width F = 2m of the feature map (even).
        a: the scale a ≥ 2 (a = 2: ((1 + xᵀy)/2)^p; paper 000 uses a = 2, and a = 4 in Fig. 7).
        method: ``"srf"`` (i.i.d. uniform directions), ``"srf_orth"`` (SORF-structured
            directions, paper 000 §6.4 "SRF Orth.") or ``"srf_orth_complex"`` ("SRF Orth. Comp.",
            Eq. 60: exp(iωᵀx) with the same structured frequencies; at equal real width F its
            real [Re, Im] features coincide with ``"srf_orth"``'s — footnote 19 — and the complex
            map is available from ``feature_map.complex_features``).
        normalize_inputs: opt in to normalising inputs onto the sphere.
        input_dim: input dimension (otherwise set, and the density fitted, at the first call).
        cache_dir: optional directory caching fitted radial densities across processes.
        seed, generator: randomness of the frequencies.
        complex_posterior: with ``method="srf_orth_complex"``, the complex-feature GP of paper 000
            App. D (see :class:`~rfgp.kernels.SketchedPolynomialKernel`); ``ValueError`` otherwise.
        kwargs: ``batch_shape``, ``active_dims`` as in GPyTorch kernels.

    Example:
        >>> import gpytorch
        >>> from rfgp.kernels import SketchedSphericalPolynomialKernel
        >>> covar_module = gpytorch.kernels.ScaleKernel(
        ...     SketchedSphericalPolynomialKernel(power=7, num_features=512, method="srf_orth"))
    """

    has_lengthscale = False
    config_fields = {"method": METHOD, "complex_posterior": METHOD}

    def __init__(
        self,
        power: int,
        num_features: int,
        a: float = 2.0,
        method: str = "srf",
        normalize_inputs: bool = False,
        input_dim: int | None = None,
        cache_dir: str | os.PathLike | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        complex_posterior: bool = False,
        **kwargs,
    ) -> None:
        self.method = check_choice(method, "method", tuple(SPHERICAL_METHODS))
        self.complex_posterior = check_complex_posterior(
            complex_posterior, method == "srf_orth_complex", f"method={method!r}"
        )
        feature_map = SphericalRandomFeatures(
            num_features,
            power=power,
            a=a,
            input_dim=input_dim,
            direction_sampler=SPHERICAL_METHODS[method],
            normalize_inputs=normalize_inputs,
            cache_dir=cache_dir,
            seed=seed,
            generator=generator,
        )
        super().__init__(feature_map, **kwargs)

    def forward(self, x1: torch.Tensor, x2: torch.Tensor, diag: bool = False, **params):
        """The feature kernel's output, expanded (stride 0) to ``batch_shape``: no hyperparameter carries the batch
        here, so every member is the same kernel, and GPyTorch expects the batch of a ``batch_shape`` kernel."""
        return expand_batch(super().forward(x1, x2, diag=diag, **params), self.batch_shape)

    def unit_rows_hint(self) -> str | None:
        return None if self.feature_map.normalize_inputs else UNIT_ROWS_HINT

    # Without hyperparameters GPyTorch would report no device; the feature map's buffers
    # carry the kernel's dtype and device instead.
    @property
    def dtype(self) -> torch.dtype:
        dtypes = {param.dtype for param in self.parameters()} | {self.feature_map._anchor.dtype}
        if len(dtypes) > 1:
            raise RuntimeError(f"The kernel's parameters have multiple dtypes: {dtypes}.")
        return dtypes.pop()

    @property
    def device(self) -> torch.device:
        devices = {param.device for param in self.parameters()} | {self.feature_map._anchor.device}
        if len(devices) > 1:
            raise RuntimeError(f"The kernel's parameters are on multiple devices: {devices}.")
        return devices.pop()

    @property
    def power(self) -> int:
        return self.feature_map.power

    @property
    def a(self) -> float:
        return self.feature_map.a

    def exact(self, x1: torch.Tensor, x2: torch.Tensor) -> torch.Tensor:
        """The exact target (1 − ‖x₁ − x₂‖²/a²)^p as a dense matrix (for tests and error metrics)."""
        if self.feature_map.normalize_inputs:
            x1, x2 = torch.nn.functional.normalize(x1, dim=-1), torch.nn.functional.normalize(x2, dim=-1)
        return (1.0 - torch.cdist(x1, x2).square() / self.a**2).pow(self.power)
