r"""A fixed quadrature of (1 + s)^−α as a positive mixture of exponentials e^{−ts}, differentiable in α.

(1 + s)^−α = E_{t∼Gamma(α, 1)}[e^{−ts}] = (1/Γ(α)) ∫ exp(αu − eᵘ) e^{−eᵘ s} du   (t = eᵘ),

for s ≥ 0, α > 0.  The integrand in u is analytic and decays doubly exponentially as u → +∞ and like e^{αu} as
u → −∞, so the trapezoidal rule on the fixed grid uₖ = u₀ + kh converges exponentially in 1/h (the exponential-
sum approximation of power functions, Beylkin & Monzón, Appl. Comput. Harmon. Anal. 28 (2010); Hackbusch,
Comput. Vis. Sci. 8 (2005)):

    (1 + s)^−α ≈ c₀(α) + Σₖ wₖ(α) e^{−tₖ s},   tₖ = e^{uₖ},   wₖ = h·exp(αuₖ − tₖ)/Γ(α) > 0,

and the grid points below u₀ (where e^{−t} = 1 − t + O(t²) and e^{−ts} ≈ 1) as one node at t = 0 with the
closed-form weight of their geometric sums, c₀ = (h/Γ(α))·(G(α) − G(α + 1)), G(b) = e^{b(u₀ − h)}/(1 − e^{−bh}).
Nodes are fixed, weights are smooth functions of α (autograd gives exact derivatives of the rule), and all weights
are positive, so the features √wₖ e^{−tₖ x} built from it give a positive semi-definite kernel.

Accuracy and cost.  For large α the integrand's peak in u (at log(α/(1 + s)), of width 1/√α) narrows, and the
trapezoidal error of an entire integrand, bounded on the strip \|Im u\| < y by (cos y)^−α e^{−2πy/h} (minimised at
tan y = 2π/(hα)), grows with α at a fixed h: the first rule (h = 0.35, 74 nodes) reached 5.5·10⁻⁸ at α = 5 and
1.3·10⁻³ at α = 20.  Measured now (float64, :func:`max_relative_error`; tests/features/test_exponential_quadrature.py):
with h = 0.25, u ∈ [−22, 4] (105 nodes + the node at 0) the relative error is at most 6.8·10⁻⁸ over
α ∈ [10⁻³, 12] and s ∈ [0, 10⁴] (the worst at α ≈ 0.07 and s = 10⁴, where the node at 0 stands for the nodes below
u₀; 1.7·10⁻⁸ at α = 12, 3.9·10⁻⁸ at 13, 8.4·10⁻⁸ at 14; 8.2·10⁻⁷ up to s = 10⁵).  The cost is 106 features instead
of 75 (1.4× the exponentials; a TensorSRHT pads both to 128 columns).  :data:`MAX_POWER` and :data:`MAX_DECAY` are the
limits the kernels using it enforce: BoTorch's ``SingleTaskMultiFidelityGP`` puts a Gamma(3, 6) prior on α (mean
0.5; P(α > 12) ≈ 10⁻²⁸, log density 63 nats below its mode), and its fits end at α ≤ 2.5 (measured), while their
line searches try points far beyond any bound (α up to 10¹¹, x/β up to ∞): those trial points raise
:class:`~rfgp.core.validation.DrawCoverageError`, which optimisers treat as a failed trial point and step back from.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

#: grid spacing h and end points u₀, u_max of the trapezoidal rule in u = log t
STEP = 0.25
LOG_NODE_MIN = -22.0
LOG_NODE_MAX = 4.0
#: number of exponential nodes (the node at t = 0 comes on top)
NUM_NODES = int(round((LOG_NODE_MAX - LOG_NODE_MIN) / STEP)) + 1
#: the largest α and s the measured error bound (≤ 10⁻⁷ relative) covers
MAX_POWER = 12.0
MAX_DECAY = 1.0e4
#: the rule's configuration, saved in the state of the kernels that use it (a state of another rule is refused)
RULE = f"trapezoid in log t: h={STEP}, u0={LOG_NODE_MIN}, umax={LOG_NODE_MAX}"


def log_nodes(dtype: torch.dtype = torch.float64, device: torch.device | None = None) -> Tensor:
    """u = log t of the exponential nodes, shape ``(NUM_NODES,)``."""
    return LOG_NODE_MIN + STEP * torch.arange(NUM_NODES, dtype=dtype, device=device)


def log_weights(alpha: Tensor, nodes: Tensor) -> tuple[Tensor, Tensor]:
    """(log wₖ, log c₀) of the rule for shape parameters ``alpha`` (any shape ``S``) at the nodes u = :func:`log_nodes`.

    Returns tensors of shapes ``(*S, NUM_NODES)`` and ``S``.
    """
    log_gamma = torch.lgamma(alpha)
    log_w = math.log(STEP) + alpha.unsqueeze(-1) * nodes - nodes.exp() - log_gamma.unsqueeze(-1)

    def log_geometric(b: Tensor) -> Tensor:  # log Σ_{k≥1} e^{b(u₀ − kh)}
        return b * (LOG_NODE_MIN - STEP) - torch.log(-torch.expm1(-b * STEP))

    # log(G(α) − G(α + 1)) = log G(α) + log(1 − G(α + 1)/G(α)), G(α + 1)/G(α) < e^{u₀ − h} ≪ 1
    first, second = log_geometric(alpha), log_geometric(alpha + 1)
    log_tail = math.log(STEP) - log_gamma + first + torch.log1p(-torch.exp(second - first))
    return log_w, log_tail


def max_relative_error(alpha: Tensor, decay: Tensor) -> Tensor:
    """max over ``decay`` s of abs(rule − (1 + s)^−α)/(1 + s)^−α per α (a float64 measurement, not a forward path)."""
    alpha, decay = alpha.double(), decay.double()
    nodes = log_nodes()
    log_w, log_tail = log_weights(alpha, nodes)
    mixture = (log_w.unsqueeze(-2) - nodes.exp() * decay.unsqueeze(-1)).exp().sum(-1) + log_tail.exp().unsqueeze(-1)
    exact = (1 + decay).pow(-alpha.unsqueeze(-1))
    return ((mixture - exact) / exact).abs().amax(-1)
