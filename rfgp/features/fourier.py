"""Random Fourier features for shift-invariant kernels: RFF, ORF and SORF.

Φ(x) = m^{−1/2} [cos(Wx), sin(Wx)] with m frequencies (rows of W), so the output width is
F = 2m and Φ(x)ᵀΦ(y) = m^{−1} Σᵢ cos(wᵢᵀ(x − y)) (Rahimi & Recht 2007; the sin/cos pair
has lower variance than cos with a random phase, Sutherland & Schneider 2015).

Frequency samplers (paper 002, Yu et al. 2016, "Orthogonal Random Features"):

* ``"iid"`` (RFF): rows i.i.d. from the spectral density.
* ``"orthogonal"`` (ORF, Eq. 2): W = S Q per d × d block, Q Haar-orthogonal (QR with the
  sign fix), S diagonal with independent χ_d norms; independent blocks are stacked when
  m > d and rows truncated when m < d.  Unbiased, lower variance than RFF.
* ``"structured"`` (SORF, Eq. 5): W = √D H D₁ H D₂ H D₃ per block with the normalised
  Hadamard H, Rademacher diagonals Dᵢ and the input zero-padded to D = 2^k ≥ 32; applied in
  O(D log D) by the FWHT.  Its rows have the fixed norm √D, so the bias is
  ≈ −e^{−z²/2}z⁴/(4D) (Lemma 5): padding low-dimensional inputs to D ≥ 32 keeps it small
  (zero-padding preserves ‖x − y‖; at D = 2 every row would be (±1, ±1) and the estimate
  would target cos-type kernels, not the RBF).

Non-Gaussian spectral densities (Matérn, rational quadratic) multiply each row by its own
scale draw (see :mod:`rfgp.features.spectral`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..core.config_state import METHOD
from ..core.dtypes import refuse_autocast_backward
from ..core.validation import check_choice
from . import random
from .base import FeatureMap
from .derivatives import sincos_derivatives
from .hadamard import fwht, next_power_of_two
from .spectral import CONFIG_FIELDS as SPECTRAL_FIELDS
from .spectral import GaussianSpectralDensity, SpectralDensity

SAMPLERS = ("iid", "orthogonal", "structured")

#: SORF pads inputs to at least this many dimensions (its bias ≈ −e^{−z²/2}z⁴/(4D)).
MIN_STRUCTURED_DIM = 32

#: up to this input dimension SORF is applied as one BLAS matmul with its explicit W (built by
#: the FWHT from the identity), which beats three FWHT passes over every point; above it the
#: FWHT path costs O(D log D) per block instead of O(d) per frequency.
DENSE_STRUCTURED_MAX_DIM = 128


class RandomFourierFeatures(FeatureMap):
    """sin/cos random Fourier features of a shift-invariant kernel (unit lengthscale).

    Args:
        num_features: output width F = 2m (must be even).
        input_dim: input dimension d (``None``: set at the first call).
        spectral_density: the kernel's spectral density; default RBF.
        sampler: ``"iid"`` (RFF), ``"orthogonal"`` (ORF) or ``"structured"`` (SORF).
        seed, generator: randomness, see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features import RandomFourierFeatures
        >>> phi = RandomFourierFeatures(256, input_dim=3, sampler="orthogonal", seed=0)
        >>> x = torch.randn(5, 3)
        >>> (phi(x) @ phi(x).T).shape
        torch.Size([5, 5])
    """

    config_fields = {"sampler": METHOD, "spectral_density": METHOD, "spectral_parameter": METHOD}
    has_closed_form_squared_norm = True

    def __init__(
        self,
        num_features: int,
        input_dim: int | None = None,
        spectral_density: SpectralDensity | None = None,
        sampler: str = "iid",
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        if isinstance(num_features, int) and not isinstance(num_features, bool) and num_features % 2:
            raise ValueError(f"num_features must be even for sin/cos features (F = 2m), got {num_features}")
        self.sampler = check_choice(sampler, "sampler", SAMPLERS)
        self.spectral_density = spectral_density if spectral_density is not None else GaussianSpectralDensity()
        if not isinstance(self.spectral_density, SpectralDensity):
            raise TypeError(
                f"spectral_density must be a rfgp.features.SpectralDensity, got {type(spectral_density).__name__}"
            )
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    @property
    def num_frequencies(self) -> int:
        return self.num_features // 2

    def _config_value(self, name: str):
        if name in SPECTRAL_FIELDS:
            return self.spectral_density.config_value(name)
        return super()._config_value(name)

    # ------------------------------------------------------------------ draws
    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        m, d = self.num_frequencies, input_dim
        if self.sampler == "structured":
            padded = max(next_power_of_two(d), MIN_STRUCTURED_DIM)
            num_blocks = math.ceil(m / padded)
            signs = random.rademacher((num_blocks, 3, padded), generator)
            row_scales = torch.full((m,), math.sqrt(padded), dtype=torch.float64)
            scales = self.spectral_density.sample_scales(m, generator)
            if scales is not None:
                row_scales = row_scales * scales
            return {"signs": signs, "row_scales": row_scales}
        if self.sampler == "iid":
            frequencies = random.normal((m, d), generator)
        else:
            num_blocks = math.ceil(m / d)
            directions = random.haar_orthogonal(num_blocks, d, generator).reshape(num_blocks * d, d)[:m]
            frequencies = directions * random.chi((m,), d, generator).unsqueeze(-1)
        scales = self.spectral_density.sample_scales(m, generator)
        if scales is not None:
            frequencies = frequencies * scales.unsqueeze(-1)
        return {"frequencies": frequencies}

    # ------------------------------------------------------------- projection
    def project(self, x: Tensor) -> Tensor:
        """The projections Wx of shape ``(..., n, m)`` (x already divided by the lengthscale)."""
        if self.sampler != "structured":
            return x @ self._buffer("frequencies", x).mT
        if x.shape[-1] <= DENSE_STRUCTURED_MAX_DIM:
            eye = torch.eye(x.shape[-1], dtype=x.dtype, device=x.device)
            return x @ self._structured_transform(eye)  # rows of I map to the columns of Wᵀ
        return self._structured_transform(x)

    def _structured_transform(self, x: Tensor) -> Tensor:
        """√D H D₁ H D₂ H D₃ x per block by three FWHT stages, O(D log D) per block and point."""
        signs = self._buffer("signs", x)
        num_blocks, _, padded = signs.shape
        z = F.pad(x, (0, padded - x.shape[-1])).unsqueeze(-2)  # (..., n, 1, padded)
        for stage in (2, 1, 0):  # D₃ first
            z = fwht(z * signs[:, stage], normalized=True)
        z = z.reshape(*z.shape[:-2], num_blocks * padded)[..., : self.num_frequencies]
        return z * self._buffer("row_scales", x)

    def frequency_matrix(self) -> Tensor:
        """The frequencies W as an explicit ``(m, d)`` matrix (for operator-valued features and tests)."""
        if not self.is_initialized:
            raise RuntimeError("the feature map has no draws yet: pass input_dim or call it on data first")
        eye = torch.eye(self.input_dim, dtype=self._anchor.dtype, device=self._anchor.device)
        return self.project(eye).mT

    def _features(self, x: Tensor) -> Tensor:
        projection, scale = self.project(x), 1.0 / math.sqrt(self.num_frequencies)
        if torch.jit.is_tracing():  # TorchScript cannot export a Python autograd.Function: the same values, plainly
            return torch.cat((torch.cos(projection), torch.sin(projection)), -1) * scale
        return _SinCosFeatures.apply(projection, scale)

    def input_derivatives(self, x: Tensor, second: bool = False) -> Tensor:
        """[Φ, ∂Φ/∂x₁, …, ∂Φ/∂x_d (, ∂²Φ/∂x₁², …)] of shape ``(..., n, 1 + d (+ d), F)``.

        Analytic (:func:`~rfgp.features.derivatives.sincos_derivatives`): ∂ⱼΦ swaps Φ's cos and
        sin halves and multiplies by the frequencies' j-th column, so no further sin or cos is evaluated.
        """
        features = self(x)
        return sincos_derivatives(features, self.frequency_matrix().to(features), second)

    # ---------------------------------------------------------- diagonal terms
    def target_diag(self, x: Tensor) -> Tensor:
        return torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)

    def expected_diag(self, x: Tensor) -> Tensor:
        return self.squared_norm(x)

    def squared_norm(self, x: Tensor) -> Tensor:
        # Φ = m^{-1/2}[cos P, sin P] and cos² + sin² = 1 for each of the m frequencies: Φ(x)ᵀΦ(x) = 1 exactly.
        return torch.ones(x.shape[:-1], dtype=x.dtype, device=x.device)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, spectral_density={self.spectral_density!r}, sampler={self.sampler!r}"


class _SinCosFeatures(torch.autograd.Function):
    """c·[cos P, sin P] whose backward reuses the forward output.

    d(c cos P)/dP = −c sin P and d(c sin P)/dP = c cos P are both blocks of the output, so
    the backward pass needs no second evaluation of sin and cos (autograd's default saves P
    and recomputes them) and no extra passes for the concatenation and the scaling.

    The backward is made of differentiable operations on the saved *output*, so autograd
    differentiates it again through this function (double backward: Hessians w.r.t. inputs
    and hyperparameters); a first-order backward runs it without building a graph, at the
    same cost as before.  The forward-mode derivative is Φ̇ = [−Φ_sin·Ṗ, Φ_cos·Ṗ] from the output too
    (:func:`sincos_projection_jvp`); ``setup_context`` and the generated vmap rule let forward-over-reverse
    Hessians (``torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")``) through it.
    """

    generate_vmap_rule = True

    @staticmethod
    def forward(projection: Tensor, scale: float) -> Tensor:
        m = projection.shape[-1]
        features = projection.new_empty(*projection.shape[:-1], 2 * m)
        torch.cos(projection, out=features[..., :m])  # written in place: no concatenation pass
        torch.sin(projection, out=features[..., m:])
        return features.mul_(scale)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)
        ctx.save_for_forward(output)

    @staticmethod
    @refuse_autocast_backward
    def backward(ctx, grad: Tensor):
        (features,) = ctx.saved_tensors
        return sincos_projection_grad(grad, features), None

    @staticmethod
    def jvp(ctx, tangent: Tensor, _scale_tangent: None) -> Tensor:
        (features,) = ctx.saved_tensors
        return sincos_projection_jvp(tangent, features)


def sincos_projection_grad(grad: Tensor, features: Tensor) -> Tensor:
    """∂L/∂P for features Φ = [a·cos P, a·sin P] (any per-pair amplitude a) from Φ itself and ∂L/∂Φ.

    ∂(a cos P)/∂P = −a sin P and ∂(a sin P)/∂P = a cos P are the other half of Φ, so
    ∂L/∂P = g_sin·Φ_cos − g_cos·Φ_sin: differentiable operations on Φ (double backward through Φ), the second
    term subtracted in place (the product is a fresh tensor that no backward saves), so one N × m buffer is made.
    """
    m = features.shape[-1] // 2
    return (grad[..., m:] * features[..., :m]).addcmul_(grad[..., :m], features[..., m:], value=-1.0)


def sincos_projection_jvp(tangent: Tensor, features: Tensor) -> Tensor:
    """Φ̇ for features Φ = [a·cos P, a·sin P] (any per-pair amplitude a, fixed) from Φ itself and the tangent Ṗ:
    [−Φ_sin·Ṗ, Φ_cos·Ṗ] — the forward-mode counterpart of :func:`sincos_projection_grad`."""
    m = features.shape[-1] // 2
    return torch.cat([-features[..., m:] * tangent, features[..., :m] * tangent], dim=-1)
