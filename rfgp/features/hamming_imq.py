r"""Random features of the inverse multiquadric (IMQ) kernel of the Hamming distance, as a Gamma mixture.

GPyTorch's ``HammingIMQKernel`` (Amin et al., "Biological sequence kernels with guaranteed flexibility",
arXiv:2304.03775) on sequences of T categorical positions is

    k(x, y) = ((1 + α)/(α + r))^β,   r = Σᵢ 1[xᵢ ≠ yᵢ] the Hamming distance,   α, β > 0.

Derivation.  (1 + r/α)^{−β} is the Laplace transform of a Gamma law: with τ ~ Gamma(β, rate β),
E[exp(−τβr/α)] = (1 + r/α)^{−β}, so k = k₀·E_τ[e^{−tr}], t = τβ/α, k₀ = ((1 + α)/α)^β = k(x, x).  For a fixed t,
e^{−t·r} = Πᵢ (e^{−t} + (1 − e^{−t})·1[xᵢ = yᵢ]) is the categorical product kernel with cᵢ = e^{−t}, whose
hashed Rademacher-product features (:class:`~rfgp.features.categorical.CategoricalFeatures`) are unbiased
feature by feature.  So each feature f draws its own τ_f, and

    Φ_f(x) = √(k₀ w_f/F) Πᵢ (√c_f ε_{f,i} + √(1 − c_f) h_{f,i}(xᵢ)),   c_f = exp(−τ_f β/α),

with τ_f from a fixed defensive Gamma-mixture proposal at the reference β₀ (β at draw time) and importance weights
w_f = Gamma(τ_f; β, β)/r(τ_f) (:mod:`rfgp.features.gamma_proposal`): E[Φ(x)ᵀΦ(y)] = k(x, y) for every α and β
(also on the diagonal), α and β enter differentiably (through c_f, w_f and k₀), and β ≤ β₀/8 raises (infinite
variance of the weights).  The F terms F·Φ_f(x)Φ_f(y) are independent and identically distributed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .categorical import CategoricalFeatures
from .gamma_proposal import draw_gamma_proposal, gamma_log_weights, upgrade_saved_precisions


class HammingIMQFeatures(CategoricalFeatures):
    r"""Φ_f(x) = √(w_f/F) Πᵢ (√c_f ε_{f,i} + √(1 − c_f) h_{f,i}(xᵢ)), c_f = exp(−τ_f β/α), for (1 + r/α)^{−β}.

    ``forward(x, alpha, beta)``: x ``(..., n, T)`` categories (as for :class:`CategoricalFeatures`), α and β of
    shape ``(*batch, 1)``; the amplitude k₀ = ((1 + α)/α)^β is the caller's (see the module doc).

    Args:
        num_features: F.
        reference_beta: β₀, the β the proposal of the τ_f is centred at (the buffer ``reference_beta`` keeps the
            one the draws were made with).
        input_dim, seed, generator: see :class:`~rfgp.features.FeatureMap`.

    Example:
        >>> import torch
        >>> from rfgp.features import HammingIMQFeatures
        >>> phi = HammingIMQFeatures(8192, reference_beta=1.0, input_dim=3, seed=0)
        >>> x = torch.tensor([[0.0, 1.0, 2.0], [0.0, 1.0, 3.0]], dtype=torch.float64)
        >>> one = torch.ones(1, dtype=torch.float64)
        >>> k = phi(x, one, one) @ phi(x, one, one).T  # (1 + r)^{-1}: exact [[1, 0.5], [0.5, 1]]
        >>> bool(abs(k[0, 1] - 0.5) < 0.05)
        True
    """

    def __init__(self, num_features: int, reference_beta: float, input_dim: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None) -> None:
        self.reference = float(reference_beta)  # β₀ for the next draws
        super().__init__(num_features, input_dim=input_dim, seed=seed, generator=generator)

    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        draws = super()._draw(input_dim, generator)
        log_tau, log_proposal = draw_gamma_proposal(self.num_features, self.reference, generator)
        return {**draws, "log_precisions": log_tau, "log_proposal": log_proposal,
                "reference_beta": torch.tensor(self.reference, dtype=torch.float64)}

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        upgrade_saved_precisions(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: Tensor, alpha: Tensor, beta: Tensor) -> Tensor:
        self._prepare(x)
        log_tau, log_proposal, reference = (self._buffer(name, alpha) for name in
                                            ("log_precisions", "log_proposal", "reference_beta"))
        log_weights = gamma_log_weights(log_tau, log_proposal, beta, reference, "beta")  # (*batch, F)
        # log c_f, (*batch, 1, F): one share for all positions
        log_share = (-log_tau.exp() * beta / alpha).unsqueeze(-2)
        features = super().forward(x, log_share, per_feature=True)
        return features * (0.5 * log_weights).exp().unsqueeze(-2)
