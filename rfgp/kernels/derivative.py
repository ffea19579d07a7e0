"""Sketched derivative kernels: GPyTorch's ``RBFKernelGrad``, ``RBFKernelGradGrad``,
``Matern52KernelGrad`` and ``PolynomialKernelGrad`` with a random-feature root.

A GP observed through values and gradients has the joint covariance
Cov(∂ᵢf(x), ∂ⱼf(y)) = ∂²k(x, y)/∂xᵢ∂yⱼ (Rasmussen & Williams 2006, §9.4).  With
k(x, y) ≈ Φ(x)ᵀΦ(y) this is ∂ᵢΦ(x)ᵀ∂ⱼΦ(y), so the whole joint Gram over the n·K outputs
(K = d + 1: value and gradient; K = 2d + 1: also the diagonal second derivatives ∂ⱼ²f) is
RRᵀ with the root

    R = [Φ(xᵢ); ∂₁Φ(xᵢ); …; ∂_dΦ(xᵢ) (; ∂₁²Φ(xᵢ); …; ∂_d²Φ(xᵢ))]ᵢ   of shape (n·K, F),

rows interleaved per point exactly as GPyTorch orders its derivative kernels (row i·K + t:
output t of point i, value first), so ``MultitaskMultivariateNormal``,
``MultitaskGaussianLikelihood(num_tasks=K)``, ``ConstantMeanGrad`` and
``ExactMarginalLogLikelihood`` work unchanged.  Training and prediction then cost
O(n·K·F² + F³) through the F × F capacitance matrix
(:class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy`) instead of GPyTorch's
O((n·K)³); a root over :class:`rfgp.settings.memory_budget` is evaluated a block of points at a time, as a
vector field's (:mod:`rfgp.inference.multioutput_chunking`).

The input derivatives of the features are analytic (:mod:`rfgp.features.derivatives`):
for sin/cos features a swap of Φ's halves times the frequencies; for polynomial sketches
the product rule over the sketched factors.  The lengthscale enters by the chain rule,
∂/∂xⱼ = ℓⱼ⁻¹ ∂/∂zⱼ with z = x/ℓ.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.validation import check_choice
from .combinations import seen_width
from .fourier import FOURIER_METHODS, SketchedMaternKernel, SketchedRBFKernel
from .polynomial import SketchedPolynomialKernel


class _DerivativeRootMixin:
    """Turns a scalar rfgp feature kernel into its derivative-observation kernel (first in the bases).

    Subclasses implement :meth:`input_derivatives` (rows [Φ, ∂Φ/∂zⱼ, (∂²Φ/∂zⱼ²)] with respect to
    the scaled input z the feature map sees) and set ``second_derivatives``.
    """

    second_derivatives: bool = False
    #: the rows after the first are derivatives along the input columns (see :func:`~.combinations.rows_follow_columns`)
    outputs_follow_input_columns = True

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        """1 + d (+ d) for the d columns the kernel differentiates along (:func:`~.combinations.seen_width`: its
        ``active_dims`` where set, whether it is asked with the columns selected or with all of them)."""
        d = seen_width(self, x1)
        return 1 + (2 * d if self.second_derivatives else d)

    def input_derivatives(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def featurize(self, x: Tensor) -> Tensor:
        """The interleaved root R of shape ``(*batch, n·K, F)`` (``active_dims`` already applied)."""
        rows = self.input_derivatives(x)
        return (rows * self._chain_factors(x).to(rows)).flatten(-3, -2)

    def _chain_factors(self, x: Tensor) -> Tensor:
        """(1, ℓ⁻¹, (ℓ⁻²)) per output row, shape ``(*batch, 1, K, 1)``: ∂/∂xⱼ = ℓⱼ⁻¹∂/∂zⱼ."""
        d = x.shape[-1]
        if not self.has_lengthscale:
            inverse = x.new_ones(d)
        else:
            inverse = self.lengthscale.reciprocal().expand(*self.lengthscale.shape[:-1], d)
        powers = [torch.ones_like(inverse[..., :1]), inverse]
        if self.second_derivatives:
            powers.append(inverse.square())
        return torch.cat(powers, dim=-1).unsqueeze(-1)

    def diag_moments(self, x: Tensor):
        # the supported feature maps (sin/cos, polynomial sketches) are unbiased on the whole joint diagonal
        return None

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        from ..inference.multioutput import MultitaskFeatureSpacePredictionStrategy

        return MultitaskFeatureSpacePredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)


class SketchedRBFKernelGrad(_DerivativeRootMixin, SketchedRBFKernel):
    r"""``gpytorch.kernels.RBFKernelGrad`` with random Fourier features: the joint kernel of (f, ∇f).

    Root rows per point: Φ(x) = m^{−1/2}[cos(Ωz), sin(Ωz)] (z = x/ℓ) and
    ∂ⱼΦ = ℓⱼ⁻¹ m^{−1/2}[−sin(Ωz), cos(Ωz)] ⊙ [Ω_{:,j}, Ω_{:,j}], in GPyTorch's interleaved order
    (``num_outputs_per_input`` = d + 1).

    Args:
        num_features: F = 2m.
        method: ``"rff"``, ``"orf"`` or ``"sorf"`` (the frequency sampler, see :class:`SketchedRBFKernel`).
        input_dim, seed, generator: as :class:`SketchedRBFKernel`.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint`` as in ``gpytorch.kernels.RBFKernelGrad``.

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import SketchedRBFKernelGrad
        >>> covar_module = gpytorch.kernels.ScaleKernel(SketchedRBFKernelGrad(1024, ard_num_dims=2))
        >>> covar_module(torch.randn(10, 2)).shape  # n·(d + 1) = 30
        torch.Size([30, 30])
    """

    def __init__(self, num_features: int, method: str = "rff", input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None, **kwargs) -> None:
        check_choice(method, "method", tuple(FOURIER_METHODS))
        super().__init__(num_features, method=method, input_dim=input_dim, seed=seed, generator=generator, **kwargs)

    def input_derivatives(self, x: Tensor) -> Tensor:
        return self.feature_map.input_derivatives(self.scale_inputs(x), second=self.second_derivatives)


class SketchedRBFKernelGradGrad(SketchedRBFKernelGrad):
    r"""``gpytorch.kernels.RBFKernelGradGrad`` with random Fourier features: (f, ∇f, ∂₁²f, …, ∂_d²f).

    Adds the rows ∂ⱼ²Φ = −ℓⱼ⁻² Φ ⊙ [Ω_{:,j}², Ω_{:,j}²] after the gradient rows
    (``num_outputs_per_input`` = 2d + 1, GPyTorch's order).  Arguments as :class:`SketchedRBFKernelGrad`.
    """

    second_derivatives = True


class SketchedMatern52KernelGrad(_DerivativeRootMixin, SketchedMaternKernel):
    r"""``gpytorch.kernels.Matern52KernelGrad`` with random Fourier features (Student-t frequencies, 5 dof).

    The derivative rows are those of :class:`SketchedRBFKernelGrad`; E‖ω‖² is finite for
    ν = 5/2, so the gradient block is unbiased.  Arguments as :class:`SketchedMaternKernel`
    without ``nu`` (fixed to 5/2, as in GPyTorch).
    """

    def __init__(self, num_features: int, method: str = "rff", input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None, **kwargs) -> None:
        nu = kwargs.pop("nu", 2.5)
        if nu != 2.5:
            raise ValueError(f"nu must be 2.5 for Matern52KernelGrad (the only Matérn derivative kernel), got {nu!r}")
        super().__init__(num_features, nu=2.5, method=method, input_dim=input_dim, seed=seed, generator=generator,
                         **kwargs)

    def input_derivatives(self, x: Tensor) -> Tensor:
        return self.feature_map.input_derivatives(self.scale_inputs(x), second=False)


class SketchedPolynomialKernelGrad(_DerivativeRootMixin, SketchedPolynomialKernel):
    r"""``gpytorch.kernels.PolynomialKernelGrad`` (xᵀy + c)^p with a polynomial sketch: the joint kernel of (f, ∇f).

    Φ(x) = S(x̃ ⊗ … ⊗ x̃) with x̃ = [x; √c] and S linear in each factor, so
    ∂ⱼΦ = Σᵢ S(x̃ ⊗ … ⊗ eⱼ ⊗ … ⊗ x̃) (eⱼ at factor i) — exact for every projection
    (:func:`~rfgp.features.derivatives.multilinear_derivatives`).  Arguments as
    :class:`SketchedPolynomialKernel`, except ``method`` (``"sketch"`` only: the Maclaurin maps have no input
    derivatives), ``input_normalization`` (no derivative through x/‖x‖) and ``complex_posterior`` (the joint
    derivative GP is the real one).

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import SketchedPolynomialKernelGrad
        >>> covar_module = gpytorch.kernels.ScaleKernel(SketchedPolynomialKernelGrad(2, num_features=512))
        >>> covar_module(torch.rand(5, 3)).shape  # n·(d + 1) = 20
        torch.Size([20, 20])
    """

    def __init__(self, power: int, num_features: int, **kwargs) -> None:
        for name in ("input_normalization", "complex_posterior"):
            if kwargs.get(name):
                raise ValueError(f"{type(self).__name__} does not support {name}={kwargs[name]!r}")
        # the Maclaurin maps (method="maclaurin" | "random_maclaurin") have no input derivatives
        check_choice(kwargs.get("method", "sketch"), "method", ("sketch",))
        super().__init__(power, num_features, **kwargs)

    def input_derivatives(self, x: Tensor) -> Tensor:
        return self.feature_map.input_derivatives(self.scale_inputs(x), offset=self.checked_offset(), second=False)
