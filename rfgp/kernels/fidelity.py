r"""BoTorch's fidelity kernels (``SingleTaskMultiFidelityGP``, Wu et al., arXiv:1903.04703) as finite feature maps.

* ``DownsamplingKernel``  k(x, x') = c + Σⱼ (1 − xⱼ)^{1+δ}(1 − x'ⱼ)^{1+δ}: exact features
  Φ(x) = [√c, (1 − x₁)^{1+δ}, …, (1 − x_d)^{1+δ}], width 1 + d (d = 1 in BoTorch's models: one kernel per
  data-fidelity column, multiplied).
* ``ExponentialDecayKernel``  k(x, x') = w + (1 + (x + x')/β)^−α = w + E_{t∼Gamma(α, 1)}[e^{−tx/β} e^{−tx'/β}]:
  deterministic quadrature features (not random) Φ(x) = [√(w + c₀), √w₁ e^{−t₁x/β}, …] from the fixed
  trapezoidal rule of :mod:`rfgp.features.exponential_quadrature` (106 features, relative error ≤ 6.8·10⁻⁸ for
  α ≤ 12 and (x + x')/β ≤ 10⁴, differentiable in α and β, positive weights: PSD).

Same parameter names, shapes, constraints and priors as BoTorch's kernels (``raw_power``, ``raw_offset``, and
the lengthscale β of the exponential decay), so the exact kernels' ``state_dict`` loads into these.  Both
are ``is_exact`` (sums reserve their fixed widths before splitting F); in a product the downsampling features
multiply as a row-wise Kronecker factor (width 2), the 106 decay features through the TensorSRHT of the product's
random factors (:attr:`ExponentialDecayFeatureKernel.kronecker_factor` is ``False``), which keeps the product F wide.
"""

from __future__ import annotations

import torch
from gpytorch.constraints import Interval
from gpytorch.priors import Prior
from torch import Tensor

from ..core import settings
from ..core.config_state import LAZY, METHOD
from ..core.validation import DrawCoverageError, check_finite, check_positive_int
from ..features import exponential_quadrature as quadrature
from .exact_features import _ExactFeatureKernel
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter


def _check_bound(x: Tensor, bad: Tensor, name: str, requirement: str, why: str,
                 error: type[ValueError] = ValueError) -> None:
    """An ``error`` naming the entries of x where ``bad`` holds (their count, the first index and its value)."""
    if settings.validate_inputs.on() and bad.numel() and bool(bad.any()):
        first = tuple(int(i) for i in bad.nonzero()[0])
        raise error(
            f"{name} must be {requirement}, got {int(bad.sum())} entries that are not (the first at index {first}: "
            f"{float(x[first].detach())!r}); {why}"
        )


class DownsamplingFeatureKernel(_ExactFeatureKernel):
    r"""k(x, x') = c + Σⱼ (1 − xⱼ)^{1+δ}(1 − x'ⱼ)^{1+δ} (BoTorch's ``DownsamplingKernel``): exact features, width 1 + d.

    Φ(x) = [√c, (1 − x₁)^{1+δ}, …, (1 − x_d)^{1+δ}] with offset c > 0 and power δ > 0.  Inputs must be ≤ 1 (the data
    fidelity, 1 the full data): (1 − x)^{1+δ} of x > 1 is NaN, which BoTorch's kernel returns and this one refuses.
    For d > 1 columns BoTorch's ``diag=True`` path computes c + (Σⱼ(1 − xⱼ)(1 − x'ⱼ))^{1+δ}, not the diagonal of its
    own matrix; this kernel follows the matrix (BoTorch's models use one column per kernel, where the two agree).

    Args:
        input_dim: d, the number of columns it sees (default: the number of ``active_dims``, else set at the first
            call).
        power_prior, offset_prior, power_constraint, offset_constraint: as in BoTorch (default ``Positive()``).
        kwargs: ``batch_shape``, ``active_dims``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import DownsamplingFeatureKernel
        >>> kernel = DownsamplingFeatureKernel(active_dims=[2]).double()
        >>> kernel.featurize(torch.tensor([[0.5], [1.0]], dtype=torch.float64)).shape
        torch.Size([2, 2])
    """

    config_fields = {"input_dim": LAZY}

    def __init__(self, power_prior: Prior | None = None, offset_prior: Prior | None = None,
                 power_constraint: Interval | None = None, offset_constraint: Interval | None = None,
                 input_dim: int | None = None, **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        if input_dim is None and self.active_dims is not None:
            input_dim = len(self.active_dims)
        self.input_dim = None if input_dim is None else check_positive_int(input_dim, "input_dim")
        register_positive_hyperparameter(self, "power", (*self.batch_shape, 1), power_prior, power_constraint)
        register_positive_hyperparameter(self, "offset", (*self.batch_shape, 1), offset_prior, offset_constraint)

    power = PositiveHyperparameter()
    offset = PositiveHyperparameter()

    @property
    def num_features(self) -> int:
        if self.input_dim is None:
            raise RuntimeError("DownsamplingFeatureKernel has width 1 + d, d = input_dim unknown before the first "
                               "call: pass input_dim= or active_dims=, or x_sample= to rfgp.sketch")
        return 1 + self.input_dim

    def featurize(self, x: Tensor) -> Tensor:
        if self.input_dim is None:
            self.input_dim = x.shape[-1]
        _check_bound(x, x > 1, "the data-fidelity inputs of DownsamplingKernel", "≤ 1",
                     "(1 − x)^(1 + power) is NaN for x > 1 (1 is the full fidelity; scale the column to [0, 1])")
        offset, exponent = self.offset, 1 + self.power  # (*batch, 1)
        check_finite(offset, "offset")
        check_finite(exponent, "1 + power")
        decayed = (1 - x).pow(exponent.unsqueeze(-1))  # torch.pow: d/dδ 0^{1+δ} = 0 at x = 1, the target fidelity
        root = offset.sqrt().unsqueeze(-1)
        root = root.expand(*torch.broadcast_shapes(root.shape[:-2], decayed.shape[:-2]), x.shape[-2], 1)
        return torch.cat([root, decayed.expand(*root.shape[:-1], decayed.shape[-1])], dim=-1)


class ExponentialDecayFeatureKernel(_ExactFeatureKernel):
    r"""k(x, x') = w + (1 + (x + x')/β)^−α (BoTorch's ``ExponentialDecayKernel``) by deterministic quadrature features.

    (1 + s)^−α = E_{t∼Gamma(α, 1)}[e^{−ts}] with s = (x + x')/β, so
    Φ(x) = [√(w + c₀(α)), √w₁(α) e^{−t₁x/β}, …, √w_K(α) e^{−t_Kx/β}] (K = 105 fixed nodes tₖ, positive weights
    differentiable in α; :mod:`rfgp.features.exponential_quadrature`) has Φ(x)ᵀΦ(x') = k(x, x') to a relative
    error ≤ 6.8·10⁻⁸ (measured in float64) while α ≤ 12 and x/β ≤ 5·10³.  No random draws: ``num_features`` is
    106 whatever width a conversion asks for; the rule is saved in ``state_dict`` (``config_quadrature_rule``), a
    state of another rule is refused by name, and a state without it (saved before it was recorded) loads.

    Inputs: one column (the iteration fidelity, BoTorch's ``active_dims=[i]``) with x ≥ 0.  BoTorch computes
    ‖x + x'‖/β: for one column and x, x' ≥ 0 that is (x + x')/β, the form that has these features (for several
    columns or negative x it is not a function of x plus a function of x', so no product-form features exist).
    Values outside the measured range (α > 12, x/β > 5·10³) raise
    :class:`~rfgp.core.validation.DrawCoverageError` rather than lose accuracy silently: a line-search trial point
    there (BoTorch's fits try α of 10³ to 10¹¹ and β → 0 on the way) is a failed trial that :func:`rfgp.fit_mll` and
    BoTorch's ``fit_gpytorch_mll`` step back from (a ``NanError`` to the latter).

    Args:
        power_prior, offset_prior, power_constraint, offset_constraint: as in BoTorch (default ``Positive()``).
        kwargs: ``batch_shape``, ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import ExponentialDecayFeatureKernel
        >>> kernel = ExponentialDecayFeatureKernel().double()
        >>> x = torch.tensor([[0.0], [0.5]], dtype=torch.float64)
        >>> kernel.featurize(x).shape
        torch.Size([2, 106])
    """

    config_fields = {"quadrature_rule": METHOD}
    optional_config_fields = frozenset({"quadrature_rule"})
    quadrature_rule = quadrature.RULE
    has_lengthscale = True
    num_features = quadrature.NUM_NODES + 1
    #: 106 columns: multiplying a product's width by them would leave its random factors almost no features
    kronecker_factor = False

    def __init__(self, power_prior: Prior | None = None, offset_prior: Prior | None = None,
                 power_constraint: Interval | None = None, offset_constraint: Interval | None = None,
                 **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        if kwargs.get("ard_num_dims") not in (None, 1):
            raise ValueError(f"ExponentialDecayFeatureKernel takes one input column, got ard_num_dims="
                             f"{kwargs['ard_num_dims']}")
        super().__init__(**kwargs)
        register_positive_hyperparameter(self, "power", (*self.batch_shape, 1), power_prior, power_constraint)
        register_positive_hyperparameter(self, "offset", (*self.batch_shape, 1), offset_prior, offset_constraint)

    power = PositiveHyperparameter()
    offset = PositiveHyperparameter()

    def featurize(self, x: Tensor) -> Tensor:
        if x.shape[-1] != 1:
            raise ValueError(
                f"ExponentialDecayKernel takes one input column (the iteration fidelity), got {x.shape[-1]}: BoTorch's "
                "formula uses ‖x + x'‖/β, which for several columns has no product-form features; set active_dims "
                "to the fidelity column"
            )
        _check_bound(x, x < 0, "the inputs of ExponentialDecayKernel", "≥ 0",
                     "BoTorch's kernel uses |x + x'|, which has the features e^{−t(x + x')/β} only for x, x' ≥ 0")
        power, offset, lengthscale = self.power, self.offset, self.lengthscale  # (*b, 1), (*b, 1), (*b, 1, 1)
        for value, name in ((power, "power"), (offset, "offset"), (lengthscale, "lengthscale")):
            check_finite(value, name)
        _check_bound(power, power > quadrature.MAX_POWER, "ExponentialDecayKernel's power α",
                     f"≤ {quadrature.MAX_POWER:g}",
                     f"the quadrature's measured error bound covers α ≤ {quadrature.MAX_POWER:g}", DrawCoverageError)
        decay = x / lengthscale  # (*b, n, 1)
        _check_bound(decay, decay > quadrature.MAX_DECAY / 2, "the decay x/lengthscale of ExponentialDecayKernel",
                     f"≤ {quadrature.MAX_DECAY / 2:g}",
                     f"the quadrature's measured error bound covers (x + x')/β ≤ {quadrature.MAX_DECAY:g}",
                     DrawCoverageError)
        nodes = quadrature.log_nodes(decay.dtype, decay.device)
        log_w, log_tail = quadrature.log_weights(power, nodes)  # (*b, 1, K), (*b, 1)
        exponentials = (0.5 * log_w - decay * nodes.exp()).exp()  # (*b, n, K)
        constant = (offset + log_tail.exp()).sqrt().unsqueeze(-1)  # (*b, 1, 1)
        constant = constant.expand(*exponentials.shape[:-1], 1)
        return torch.cat([constant, exponentials], dim=-1)
