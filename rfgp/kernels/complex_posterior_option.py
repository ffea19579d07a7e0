"""The ``complex_posterior=True`` option of kernels whose feature maps have complex weights.

With it, the kernel's training and test covariances become
:class:`~rfgp.inference.complex_posterior.ComplexFeatureRootLinearOperator` (Ψ = [Re Φ_C, Im Φ_C]); an
ordinary GPyTorch ``ExactGP`` with a ``GaussianLikelihood`` then trains on the complex-GP
evidence log CN(y + 0i; 0, 2(K̂_C + Σ)) and predicts the complex-GP posterior of paper 000
Appendix D (Eqs. 86–90, real form A = I + ΨᵀΣ⁻¹Ψ + Ψ°ᵀΣ⁻¹Ψ°), see :mod:`rfgp.inference.complex_posterior`.
Cross-covariances and ``diag=True`` are unchanged (Re K̂); the feature-space prediction strategy
needs neither.
"""

from __future__ import annotations

import torch
from torch import Tensor

from ..core.settings import chunking_cause
from ..inference.complex_posterior import ComplexFeatureRootLinearOperator, complex_feature_posterior
from ..inference.operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator
from .combinations import kernel_features


def check_complex_posterior(value, complex_weights: bool, what: str) -> bool:
    """Validate the ``complex_posterior`` flag; ``what`` names the feature map's weights for the error."""
    if not isinstance(value, bool):
        raise TypeError(f"complex_posterior must be True or False, got {value!r}")
    if value and not complex_weights:
        raise ValueError(
            f"complex_posterior=True needs a feature map with complex weights, got {what}; use weights='complex' "
            "(or 'ctr') for polynomial and Maclaurin sketches, method='srf_orth_complex' for spherical features"
        )
    return value


class ComplexPosteriorMixin:
    """Kernel mixin (before :class:`~rfgp.kernels.RandomFeatureKernel` in the bases) for ``complex_posterior``.

    The feature map provides ``complex_layout()``: the output columns holding [Re Φ_C, Im Φ_C]
    (``num_features`` marks a zero column, e.g. the imaginary part of a real constant feature).
    """

    complex_posterior: bool = False

    def complex_root(self, features: Tensor) -> Tensor:
        """Ψ = [Re Φ_C, Im Φ_C] from the kernel's real output features."""
        layout = self.feature_map.complex_layout().to(features.device)
        padded = torch.cat((features, features.new_zeros(*features.shape[:-1], 1)), dim=-1)
        return padded.index_select(-1, layout)

    def _feature_forward(self, x1: Tensor, x2: Tensor, diag: bool, same: bool):
        output = super()._feature_forward(x1, x2, diag, same)
        if not self.complex_posterior or diag:
            return output
        if isinstance(output, ChunkedFeatureRootLinearOperator):
            why, remedy = chunking_cause()
            raise NotImplementedError(
                f"complex_posterior=True needs the features materialised, but this call would be evaluated {why}: "
                f"{remedy}"
            )
        if isinstance(output, FeatureRootLinearOperator):
            return ComplexFeatureRootLinearOperator(self.complex_root(output.root.to_dense()),
                                                    output.variance_correction)
        return output


def complex_kernel_posterior(kernel, train_x: Tensor, train_y: Tensor, noise, test_x: Tensor, full_covariance=False):
    """:func:`~rfgp.inference.complex_posterior.complex_feature_posterior` with the features of a kernel built on
    complex weights.

    ``kernel`` is e.g. ``ScaleKernel(SketchedPolynomialKernel(p, F, weights="complex"))``
    (its outputscale is folded into the features), evaluated with its current hyperparameters.
    """
    return complex_feature_posterior(
        kernel_features(kernel, train_x), train_y, noise, kernel_features(kernel, test_x), full_covariance
    )
