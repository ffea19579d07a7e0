r"""BoTorch's ``OrthogonalAdditiveKernel`` (OAK) with random features of its orthogonalised base kernels.

BoTorch's OAK (Lu, Boukouvalas & Hensman, "Additive Gaussian processes revisited", ICML 2022; BoTorch generalises
it to any base kernel by Gauss–Legendre quadrature) on inputs x ∈ [0, 1]^d is

    k(x, y) = c₀ + Σᵢ c₁ᵢ k̃ᵢ(xᵢ, yᵢ) + Σ_{i<j} c₂ᵢⱼ k̃ᵢ(xᵢ, yᵢ) k̃ⱼ(xⱼ, yⱼ)   (second order optional),
    k̃ᵢ(a, b) = kᵢ(a, b) − sᵢ(a) sᵢ(b)/Nᵢ,   sᵢ(a) = Σ_q w_q kᵢ(a, z_q),   Nᵢ = max(Σ_{q,r} w_q kᵢ(z_q, z_r) w_r, 10⁻⁶),

kᵢ the base kernel on column i (its own lengthscale with ``per_dim_lengthscales``), (z_q, w_q) BoTorch's
``quad_deg``-node Gauss–Legendre rule on [0, 1] (the uniform input measure), c ≥ 0 the coefficients.

Features.  With base features kᵢ(a, b) ≈ φᵢ(a)ᵀφᵢ(b) (rfgp's conversion of the base kernel, width G), BoTorch's
quadrature applied to them gives mᵢ = Σ_q w_q φᵢ(z_q), so sᵢ(a) ≈ mᵢᵀφᵢ(a), Nᵢ ≈ ‖mᵢ‖² and

    k̃ᵢ(a, b) ≈ φᵢ(a)ᵀ(I − mᵢmᵢᵀ/‖mᵢ‖²)φᵢ(b) = ψᵢ(a)ᵀψᵢ(b),   ψᵢ = Pᵢφᵢ,  Pᵢ the projector orthogonal to mᵢ:

the feature GP conditioned on a zero integral over the quadrature measure, as the exact OAK is the base GP
conditioned on it (Lu et al. §3).  Where BoTorch's clamp Nᵢ = 10⁻⁶ > ‖mᵢ‖² applies, ψᵢ = φᵢ − (1 − √(1 − ‖mᵢ‖²/10⁻⁶))
mᵢmᵢᵀφᵢ/‖mᵢ‖², whose Gram is φᵢᵀ(I − mᵢmᵢᵀ/10⁻⁶)φᵢ, BoTorch's formula.  The quadrature (not the closed form
E_u[cos ωu] = sin ω/ω of sin/cos features) is used so that the features target BoTorch's kernel: both agree to
10⁻¹² for RBF lengthscales ≥ 0.1, while below 0.05 the 32-node rule misintegrates the high frequencies and
BoTorch's own ∫k(a, u)du is off by 10⁻³ (ℓ = 0.03) to 87 % (ℓ = 0.01); see ``guide/botorch.md``.

The ratio mᵢmᵢᵀ/‖mᵢ‖² makes k̂ consistent but not unbiased: E[k̂] − k = O(1/G), below the Monte-Carlo error of
400 draws already at G = 16 (d = 3 with second order, ℓ = 0.2–1: the largest of 144 entries 2.3 SE off).
Second-order terms are the TensorSRHT (:class:`~rfgp.features.tensor_product.TensorProductSketch`, unbiased given its
factors) of ψᵢ and ψⱼ, whose draws are independent (one conversion of the base kernel per column, hyperparameters
tied), so E[ψ-product] factorises.

Φ(x) = [√c₀, √c₁ᵢ ψᵢ(xᵢ) for each i, √c₂ᵢⱼ S(ψᵢ(xᵢ), ψⱼ(xⱼ)) for each i < j]: width 1 + G·(d + d(d − 1)/2).

BoTorch's methods keep their meaning for these features: ``k`` is φᵢᵀφᵢ per column, ``normalizer`` max(‖mᵢ‖², 10⁻⁶),
so BoTorch's ``_orthogonal_base_kernels`` formula gives ψᵢᵀψᵢ.  The predictive variance has no bias correction:
the features' mean error E[‖Φ(x)‖²] − k(x, x) has no closed form, and the draw-based k(x, x) − ‖Φ(x)‖² (measured
against the exact GP's variance, mean absolute error near / away from the data, 3 seeds: G = 16 0.204 / 0.219 with it,
0.0016 / 0.215 without; G = 1024 0.0073 / 0.023 with, 0.0004 / 0.024 without) hurts near the data and does not help
away from it.
"""

from __future__ import annotations

import torch
from botorch.models.kernels.orthogonal_additive_kernel import OrthogonalAdditiveKernel
from gpytorch.kernels import AdditiveKernel, Kernel
from linear_operator.operators import MatmulLinearOperator
from torch import Tensor, nn

from ..core import settings
from ..features.tensor_product import TensorProductSketch
from ..inference.operators import FeatureRootLinearOperator
from ..kernels.checked_call import refuse_last_dim_is_batch
from ..kernels.combinations import kernel_features
from ..kernels.conversion import register_converter, sketch
from ..kernels.random_feature_kernel import FeatureKernel
from ..models.feature_width import set_num_features

#: BoTorch's lower bound on the normaliser Nᵢ (``OrthogonalAdditiveKernel.normalizer``'s ``eps``)
NORMALIZER_EPS = 1e-6


class SketchedOrthogonalAdditiveKernel(FeatureKernel, OrthogonalAdditiveKernel):
    r"""BoTorch's ``OrthogonalAdditiveKernel`` with features Φ = [√c₀, √c₁ᵢψᵢ, √c₂ᵢⱼS(ψᵢ, ψⱼ)] (see the module doc).

    Built by ``rfgp.sketch`` from an exact OAK: same parameters (``raw_offset``, ``raw_coeffs_1``, ``raw_coeffs_2``,
    ``coeff_constraint``, the priors), ``base_kernel`` the rfgp conversion of the exact base kernel (its state_dict
    keys), ``column_kernels`` its conversions for columns 1..d−1 (independent draws, parameters tied to
    ``base_kernel``'s) when there are second-order terms.  Inputs must lie in [0, 1]^d, as for BoTorch's kernel.

    Args:
        exact: the BoTorch kernel to convert (its hyperparameters are copied).
        num_features: the total width F; each of the d + d(d − 1)/2 components gets an even share G ≥ 2.
        method: the method of the base kernel's conversion (``None``: its default).
        seed: the seeds of the base kernels' and the pair sketch's draws derive from it at random, so that they are
            independent of the leaves ``rfgp.sketch`` seeds with seed + 1, seed + 2, … next to this kernel.

    Example:
        >>> import torch
        >>> from rfgp.integrations.botorch_oak import SketchedOrthogonalAdditiveKernel
        >>> from botorch.models.kernels.orthogonal_additive_kernel import OrthogonalAdditiveKernel
        >>> exact = OrthogonalAdditiveKernel(dim=3, second_order=True, dtype=torch.float64)
        >>> converted = SketchedOrthogonalAdditiveKernel(exact, num_features=1201, seed=0)
        >>> converted.num_features  # 1 + 200·(3 + 3)
        1201
    """

    def __init__(self, exact: OrthogonalAdditiveKernel, num_features: int, method: str | None = None,
                 seed: int | None = None) -> None:
        dim = exact.dim
        second_order = exact.raw_coeffs_2 is not None
        width = component_width(num_features, dim, second_order)
        copies = (dim if second_order else 1)
        seeds = (None, None) if seed is None else torch.randint(
            2**62, (2,), generator=torch.Generator().manual_seed(seed)).tolist()
        bases = sketch(AdditiveKernel(*[exact.base_kernel] * copies), [width] * copies, method=method, seed=seeds[0])
        bases = list(bases.kernels)
        raw = exact.raw_offset
        super().__init__(dim, base_kernel=bases[0], per_dim_lengthscales=exact.per_dim_lengthscales,
                         quad_deg=exact.z.shape[0], second_order=second_order, batch_shape=exact.batch_shape,
                         dtype=raw.dtype, device=raw.device, coeff_constraint=exact.coeff_constraint)
        self.column_kernels = nn.ModuleList(bases[1:])
        self.load_state_dict({name: value for name, value in exact.state_dict().items()
                              if not name.startswith("base_kernel.")}, strict=False)
        for name in ("raw_offset", "raw_coeffs_1", "raw_coeffs_2"):
            if getattr(exact, name) is not None:
                getattr(self, name).requires_grad_(getattr(exact, name).requires_grad)
        for name, (prior, closure, setting_closure) in exact._priors.items():
            self.register_prior(name, prior, closure, setting_closure)
        # BoTorch keeps its quadrature as plain attributes; buffers follow .to() and state_dict
        self.register_buffer("quadrature_nodes", exact.z[:, 0].detach().clone())
        self.register_buffer("quadrature_weights", exact.w[:, 0].detach().clone())
        del self.z, self.w
        self.component_width = width
        self.pair_sketch = TensorProductSketch(2, width, input_dim=width, seed=seeds[1]) if second_order else None

    @property
    def num_features(self) -> int:
        pairs = self.dim * (self.dim - 1) // 2 if self.raw_coeffs_2 is not None else 0
        return 1 + self.component_width * (self.dim + pairs)

    def resize_features(self, num_features: int) -> None:
        """``rfgp.set_num_features``' rule: every component at the share G' of ``num_features`` that the conversion
        would give, the base kernels' maps and the pair sketch redrawn at G' (same seeds, same hyperparameters)."""
        width = component_width(num_features, self.dim, self.raw_coeffs_2 is not None)
        for kernel in (self.base_kernel, *self.column_kernels):
            set_num_features(kernel, width)
        if self.pair_sketch is not None:
            self.pair_sketch.num_features = self.pair_sketch.input_dim = width
            self.pair_sketch._materialize()
        self.component_width = width

    def check_inputs(self, x1: Tensor, x2: Tensor, finite: bool = True) -> torch.dtype | None:
        """rfgp's checks, then BoTorch's: inputs in [0, 1]^d (within 10⁻⁶) and d columns."""
        dtype = super().check_inputs(x1, x2, finite)
        for x, name in ((x1, "x1"), (x2, "x2")) if x2 is not x1 else ((x1, "x1"),):
            if x.shape[-1] != self.dim:
                raise ValueError(f"{name} has {x.shape[-1]} columns, but this OrthogonalAdditiveKernel has "
                                 f"dim={self.dim}")
            if finite and settings.validate_inputs.on() and x.numel() and bool(((x < -1e-6) | (x > 1 + 1e-6)).any()):
                raise ValueError(f"{name} is not in the hypercube [0, 1]^{self.dim} (values from "
                                 f"{float(x.min()):.4g} to {float(x.max()):.4g}), where OrthogonalAdditiveKernel is "
                                 "defined (its orthogonality is w.r.t. the uniform measure there): normalise the "
                                 "inputs, e.g. BoTorch's Normalize input transform")
        return dtype

    def column_features(self, x: Tensor) -> Tensor:
        """φᵢ(x_{·i}) for every column i, shape ``(*batch, d, n, G)``: column i from its own conversion."""
        columns = x.transpose(-1, -2).unsqueeze(-1)  # (..., d, n, 1), BoTorch's per-dimension batch
        kernels = [self.base_kernel, *self.column_kernels]
        if len(kernels) == 1:
            features = kernel_features(self.base_kernel, columns)
            return features.expand(*features.shape[:-3], self.dim, *features.shape[-2:])
        return torch.stack([kernel_features(kernel, columns)[..., i, :, :] for i, kernel in enumerate(kernels)], -3)

    def quadrature_means(self, like: Tensor) -> Tensor:
        """mᵢ = Σ_q w_q φᵢ(z_q) under BoTorch's Gauss–Legendre rule, shape ``(*batch, d, 1, G)``, dtype/device of
        ``like``."""
        nodes = self.quadrature_nodes.to(like).unsqueeze(-1).expand(-1, self.dim)
        return (self.quadrature_weights.to(like).unsqueeze(-1) * self.column_features(nodes)).sum(-2, keepdim=True)

    def k(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        """BoTorch's ``k``: the base kernel on each column, kᵢ(x1ᵢ, x2ᵢ) ≈ φᵢ(x1ᵢ)ᵀφᵢ(x2ᵢ) with the features (column
        i's own draws) that Φ is built from; shape ``(*batch, d, n1, n2)``, or ``(*batch, d, n1)`` with ``diag``."""
        features1 = self.column_features(x1)
        features2 = features1 if x2 is x1 else self.column_features(x2)
        return (features1 * features2).sum(-1) if diag else features1 @ features2.mT

    def normalizer(self, eps: float = NORMALIZER_EPS) -> Tensor:
        """BoTorch's ``normalizer``: Nᵢ = max(Σ_{q,r} w_q kᵢ(z_q, z_r) w_r, eps) with :meth:`k`'s kᵢ, i.e. max(‖mᵢ‖²,
        eps); shape ``(*batch, d, 1, 1)``.  Computed at each call (BoTorch caches it in eval mode; here it is
        O(d·q·G))."""
        return self.quadrature_means(self.quadrature_weights).pow(2).sum(-1, keepdim=True).clamp(eps)

    def _orthogonal_base_kernels(self, x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        """BoTorch's orthogonalised base kernels k̃ᵢ(x1ᵢ, x2ᵢ) = kᵢ − sᵢ(x1ᵢ)sᵢ(x2ᵢ)/Nᵢ with :meth:`k` and
        :meth:`normalizer`, which is ψᵢ(x1ᵢ)ᵀψᵢ(x2ᵢ); shape ``(*batch, d, n1, n2)`` (``(*batch, d, n1)`` with
        ``diag``)."""
        self.check_inputs(x1, x2)
        psi1 = self.orthogonal_features(x1)
        psi2 = psi1 if x2 is x1 else self.orthogonal_features(x2)
        return (psi1 * psi2).sum(-1) if diag else psi1 @ psi2.mT

    def orthogonal_features(self, x: Tensor) -> Tensor:
        """ψᵢ = Pᵢφᵢ (BoTorch's clamp of Nᵢ at 10⁻⁶ included), shape ``(*batch, d, n, G)``."""
        features, mean = self.column_features(x), self.quadrature_means(x)  # mᵢ (..., d, 1, G)
        norm = mean.pow(2).sum(-1, keepdim=True)
        clamped = norm < NORMALIZER_EPS
        # 1 where ‖m‖² ≥ eps (a projection); where clamped, the shrink whose Gram is I − mmᵀ/eps (double where:
        # no infinite gradient of √0 reaches ‖m‖² on the other branch)
        shrink = 1 - torch.where(clamped, 1 - norm / NORMALIZER_EPS, torch.zeros_like(norm)).sqrt()
        return features - shrink * mean * (features * mean).sum(-1, keepdim=True) / norm

    def featurize(self, x: Tensor) -> Tensor:
        psi = self.orthogonal_features(x)
        parts = [self.offset.sqrt()[..., None, None].expand(*self.batch_shape, x.shape[-2], 1),
                 _flatten_components(self.coeffs_1, psi)]
        if self.raw_coeffs_2 is not None:
            rows, cols = torch.triu_indices(self.dim, self.dim, offset=1, device=x.device)
            pairs = self.pair_sketch([psi.index_select(-3, rows), psi.index_select(-3, cols)])
            parts.append(_flatten_components(self.coeff_constraint.transform(self.raw_coeffs_2), pairs))
        batch = torch.broadcast_shapes(*(part.shape[:-2] for part in parts))
        return torch.cat([part.expand(*batch, *part.shape[-2:]) for part in parts], -1)

    def _non_reduced_forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False):
        """BoTorch's per-component covariances (``OrthogonalAdditiveGP.posterior(..., infer_all_components=True)``),
        the offset c₀ first: Φₖ(x1)Φₖ(x2)ᵀ with Φₖ = Φ restricted to component k's columns (the others zeroed), shape
        ``(*batch, 1 + components, n1, n2)`` as a low-rank operator, so that the feature-space posterior of each
        component is that of f = Σₖ Φₖw given y (the slice of the weights' posterior); ``(..., 1 + components, n1)``
        with ``diag``."""
        if last_dim_is_batch:
            refuse_last_dim_is_batch(self)
        self.check_inputs(x1, x2)
        same = x2 is x1
        features1 = self.featurize(x1)
        features2 = features1 if same else self.featurize(x2)
        sizes = [1] + [self.component_width] * (self.num_components - 1)  # BoTorch's order: offset, 1st, 2nd
        masks = torch.block_diag(*(torch.ones(1, size, dtype=features1.dtype, device=x1.device) for size in sizes))
        if diag:
            return ((features1 * features2) @ masks.mT).transpose(-1, -2)
        embedded1 = features1.unsqueeze(-3) * masks.unsqueeze(-2)  # (..., components, n, F)
        if same:
            return FeatureRootLinearOperator(embedded1)
        return MatmulLinearOperator(embedded1, (features2.unsqueeze(-3) * masks.unsqueeze(-2)).mT)

    def diag_moments(self, x: Tensor) -> None:
        """``None``: no closed form of E[ψᵢ(x)ᵀψᵢ(x)] (the projection's O(1/G) bias is not corrected)."""
        return None


def component_width(num_features: int, dim: int, second_order: bool) -> int:
    """G, the even width of each of the d (+ d(d − 1)/2) components: the largest with 1 + G·components ≤ F."""
    components = dim + (dim * (dim - 1) // 2 if second_order else 0)
    width = 2 * ((num_features - 1) // (2 * components))
    if width < 2:
        raise ValueError(
            f"num_features={num_features} is too small for an OrthogonalAdditiveKernel of dim={dim} with "
            f"{components} {'first- and second-order' if second_order else 'first-order'} components: it needs "
            f"1 + 2·{components} = {1 + 2 * components} at least (an even width per component and one for the "
            "offset)"
        )
    return width


def _flatten_components(coefficients: Tensor, features: Tensor) -> Tensor:
    """[√c_k·features_k for each component k] side by side: ``(*batch, K)`` and ``(*batch, K, n, G)`` →
    ``(*batch, n, K·G)``."""
    scaled = coefficients.sqrt()[..., None, None] * features
    return scaled.transpose(-3, -2).flatten(-2)


@register_converter(OrthogonalAdditiveKernel, methods=("rff", "orf", "sorf"), options=())
def _convert_orthogonal_additive(kernel: Kernel, num_features: int, method: str | None, seed: int | None):
    """OrthogonalAdditiveKernel → :class:`SketchedOrthogonalAdditiveKernel` (same parameters, priors, quadrature)."""
    return SketchedOrthogonalAdditiveKernel(kernel, num_features, method=method, seed=seed)
