r"""GPyTorch's ``NewtonGirardAdditiveKernel`` with unbiased random features of every interaction order.

The additive GP of Duvenaud, Nickisch & Rasmussen (2011, *Additive Gaussian Processes*, NeurIPS, Eq. 2-4) sums,
over the orders d = 1…D, all d-way products of one-dimensional base kernels kᵢ(xᵢ, yᵢ) on the n input columns:

    k(x, y) = Σ_{d=1}^{D} σ_d² e_d(k₁, …, k_n),      e_d = Σ_{S ⊆ {1…n}, #S = d} Π_{i∈S} kᵢ(xᵢ, yᵢ),

e_d the elementary symmetric polynomials, which GPyTorch (``gpytorch/kernels/newton_girard_additive_kernel.py``)
evaluates with the Newton-Girard formulae from the base kernel called with ``last_dim_is_batch=True`` — column i
divided by its own lengthscale ℓᵢ under ARD (``ard_num_dims=n`` on the base), one σ_d² per order
(``outputscale``, shape ``(*batch, D)``, initially 1/D, ``Positive``), D = ``max_degree`` ≤ ``num_dims``.

**Features.**  A product Π_{i∈S} kᵢ(τᵢ) of stationary kernels on the columns S is stationary with the product
spectral measure (Bochner; the convolution of :mod:`rfgp.kernels.spectral_product` on disjoint columns), so one
frequency vector ω with ωᵢ ~ μᵢ independently for i ∈ S and ωᵢ = 0 elsewhere gives E[cos(ωᵀ(x − y))] = Π_{i∈S} kᵢ.
For order d with m_d frequencies:

* if m_d ≥ C(n, d), every d-subset S gets r_S = ⌊m_d/C(n, d)⌋ or one more frequencies (the first subsets in
  lexicographic order take the remainder), each pair scaled by σ_d²/r_S: the exact enumeration of the subsets,
  stratified, at the same cost as sampling them and without the subset-sampling variance;
* otherwise m_d subsets S_j are drawn uniformly (independently, with replacement), each pair scaled by
  σ_d²·C(n, d)/m_d:  E = σ_d²·C(n, d)·E_S[Π_{i∈S} kᵢ] = σ_d² e_d.

Φ(x) = [√c_j cos(ω_jᵀx), √c_j sin(ω_jᵀx)]_j over all orders' frequencies j (c_j their scales), of width
F = 2Σ_d m_d; E[Φ(x)ᵀΦ(y)] = k(x, y), and Φ(x)ᵀΦ(x) = Σ_d σ_d² C(n, d) = k(x, x) exactly.  The frequencies are
ω = s·g/ℓ per column (g ~ N(0, 1), s ≡ 1 for the RBF, s = √(2ν/u), u ~ χ²_{2ν} for Matérn-ν), a differentiable
function of ℓ, and σ_d² enters the scales, so gradients in the lengthscales and outputscales are those of the
Monte-Carlo estimate (unbiased for the exact gradients).  The features are
:func:`~rfgp.features.weighted_fourier.scaled_sincos_features` of the projections.

**Width across orders.**  The m = ⌊F/2⌋ frequencies are split equally among the D orders (the first m mod D
orders one more): at conversion the outputscales are initial values that training changes, so they do not set
the split (as :mod:`rfgp.kernels.tree_widths` splits sums equally); F < 2D raises.

**Base kernels.**  ``RBFKernel`` and ``MaternKernel`` with ν ∈ {3/2, 5/2} (GPyTorch's, held as they are: their
lengthscale ``Parameter``, constraint and prior are the ``base_kernel.*`` of the exact state); others have no
per-column spectral measure here and raise.  Matérn-½ is refused: its one-dimensional measure is Cauchy, whose
reparameterised lengthscale gradient has infinite variance (rfgp's own Matérn-½ kernels use anchored importance
weights instead).  The base may not select columns (``active_dims``; set them on this kernel), and its lengthscale
has 1 or n entries.  GPyTorch evaluates the base on every column it is given and reads ``num_dims`` only to cap
``max_degree``; the draws need n, so n = ``num_dims`` and inputs with another number of columns raise.
"""

from __future__ import annotations

import itertools
import math

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import Kernel, MaternKernel, RBFKernel
from gpytorch.priors import Prior
from torch import Tensor

from ..core.config_state import DRAW, METHOD
from ..core.dtypes import cast_to
from ..core.validation import check_finite, check_positive_int
from ..features import random
from ..features.base import _new_seed
from ..features.spectral import CONFIG_FIELDS as SPECTRAL_FIELDS
from ..features.spectral import GaussianSpectralDensity, MaternSpectralDensity, SpectralDensity
from ..features.weighted_fourier import scaled_sincos_features
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .random_feature_kernel import FeatureKernel


def column_density(base_kernel: Kernel) -> SpectralDensity:
    """The one-dimensional spectral density of a supported base kernel (see the module doc), else a TypeError."""
    if type(base_kernel) is RBFKernel:
        return GaussianSpectralDensity()
    if type(base_kernel) is MaternKernel and base_kernel.nu in (1.5, 2.5):
        return MaternSpectralDensity(base_kernel.nu)
    if type(base_kernel) is MaternKernel:
        raise TypeError(
            "NewtonGirardAdditiveKernel over MaternKernel(nu=0.5) has no per-column random features here: the "
            "one-dimensional Matérn-½ spectral measure is Cauchy, whose reparameterised lengthscale gradient has "
            "infinite variance; use nu=1.5 or 2.5, or AdditiveStructureKernel for the first order"
        )
    raise TypeError(
        f"NewtonGirardAdditiveKernel over {type(base_kernel).__name__} has no per-column random features: rfgp "
        "draws the orders' frequencies from the one-dimensional spectral measure of an RBFKernel or "
        "MaternKernel(nu=1.5 or 2.5) base; for other bases, method='nystrom' converts any scalar kernel tree"
    )


def order_widths(num_frequencies: int, max_degree: int) -> list[int]:
    """m_d for d = 1…D: ``num_frequencies`` split equally, the first orders taking the remainder."""
    share, extra = divmod(num_frequencies, max_degree)
    return [share + (d < extra) for d in range(max_degree)]


class SketchedNewtonGirardAdditiveKernel(FeatureKernel):
    r"""k = Σ_d σ_d² e_d(k₁, …, k_n) with random features of every order d (see the module doc).

    Args:
        base_kernel: GPyTorch's ``RBFKernel`` or ``MaternKernel(nu=1.5 | 2.5)`` (``ard_num_dims`` n for one
            lengthscale per column), held for its hyperparameters.
        num_dims: n, the number of input columns (after ``active_dims``).
        num_features: F; m = ⌊F/2⌋ frequencies, split equally among the orders (width 2m).
        max_degree: D ∈ {1, …, n} (default n).
        seed, generator: randomness of the subsets and frequencies.
        outputscale_prior, outputscale_constraint: of σ² (default ``Positive()``), as GPyTorch's.
        kwargs: ``batch_shape``, ``active_dims``.

    Raises:
        TypeError: an unsupported base kernel, or one with ``active_dims``.
        ValueError: ``max_degree`` outside 1…n, a base lengthscale with other than 1 or n entries, F < 2D; at a
            call, inputs with other than n columns.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedNewtonGirardAdditiveKernel
        >>> from gpytorch.kernels import RBFKernel
        >>> kernel = SketchedNewtonGirardAdditiveKernel(RBFKernel(ard_num_dims=4), 4, 512, max_degree=2, seed=0)
        >>> kernel.num_features, kernel(torch.rand(10, 4)).shape
        (512, torch.Size([10, 10]))
    """

    config_fields = {"num_frequencies": METHOD, "num_dims": METHOD, "max_degree": METHOD,
                     "spectral_density": METHOD, "spectral_parameter": METHOD, "seed": DRAW}
    #: the base kernel's measure (an RBF and a Matérn base have the same state keys): absent from earlier states
    optional_config_fields = frozenset({"spectral_density", "spectral_parameter"})

    def __init__(self, base_kernel: Kernel, num_dims: int, num_features: int, max_degree: int | None = None,
                 seed: int | None = None, generator: torch.Generator | None = None,
                 outputscale_prior: Prior | None = None, outputscale_constraint: Interval | None = None,
                 **kwargs) -> None:
        self.density = column_density(base_kernel)
        num_dims = check_positive_int(num_dims, "num_dims")
        if base_kernel.active_dims is not None:
            raise TypeError(
                f"base_kernel has active_dims={base_kernel.active_dims.tolist()}: the base kernel is evaluated on "
                "every column the NewtonGirardAdditiveKernel sees; select columns with the active_dims of the "
                "NewtonGirardAdditiveKernel instead"
            )
        if base_kernel.lengthscale.shape[-1] not in (1, num_dims):
            raise ValueError(f"base_kernel has {base_kernel.lengthscale.shape[-1]} lengthscales but num_dims="
                             f"{num_dims}; accepted: one shared lengthscale, or ard_num_dims={num_dims}")
        max_degree = num_dims if max_degree is None else check_positive_int(max_degree, "max_degree")
        if max_degree > num_dims:
            raise ValueError(f"max_degree must be in 1..num_dims={num_dims} (there are no interactions of more "
                             f"columns), got {max_degree}")
        num_features = check_positive_int(num_features, "num_features")
        if num_features < 2 * max_degree:
            raise ValueError(f"num_features={num_features} is too small for max_degree={max_degree}: every order "
                             f"needs at least one sin/cos pair, so at least {2 * max_degree}")
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.base_kernel = base_kernel
        self.num_dims, self.max_degree, self.num_frequencies = num_dims, max_degree, num_features // 2
        self.seed = int(seed) if seed is not None else _new_seed(generator)
        register_positive_hyperparameter(self, "outputscale", (*self.batch_shape, max_degree), outputscale_prior,
                                         outputscale_constraint)
        self.outputscale = torch.full((max_degree,), 1.0 / max_degree)  # GPyTorch's initial value
        self.outputscale_constraint = self.raw_outputscale_constraint  # GPyTorch's second name (state_dict keys)
        self._materialize()

    outputscale = PositiveHyperparameter()

    @property
    def num_features(self) -> int:
        return 2 * self.num_frequencies

    @property
    def input_dim(self) -> int:
        """n: inputs with another number of columns raise (:meth:`FeatureKernel.check_inputs`)."""
        return self.num_dims

    # ------------------------------------------------------------------ draws
    @torch.inference_mode(False)
    def _materialize(self) -> None:
        """Draw every order's subsets (or enumerate them) and per-column unit frequencies (module doc); outside
        ``torch.inference_mode()``, so that draws made by ``resample()`` under it stay usable by training."""
        generator = torch.Generator().manual_seed(self.seed)
        n, m = self.num_dims, self.num_frequencies
        masks, orders, sampled, shares = [], [], [], []
        for d, m_d in enumerate(order_widths(m, self.max_degree), start=1):
            count = math.comb(n, d)
            if m_d >= count:
                share, extra = divmod(m_d, count)
                repeats = torch.tensor([share + (i < extra) for i in range(count)])
                subsets = torch.zeros(count, n, dtype=torch.float64)
                for i, subset in enumerate(itertools.combinations(range(n), d)):
                    subsets[i, list(subset)] = 1.0
                masks.append(subsets.repeat_interleave(repeats, dim=0))
                shares.append(repeats.repeat_interleave(repeats))
            else:
                chosen = torch.rand(m_d, n, generator=generator, dtype=torch.float64).argsort(-1)[:, :d]
                masks.append(torch.zeros(m_d, n, dtype=torch.float64).scatter_(-1, chosen, 1.0))
                shares.append(torch.full((m_d,), m_d))
            orders.append(torch.full((m_d,), d - 1, dtype=torch.int64))
            sampled.append(torch.full((m_d,), m_d < count))
        unit = random.normal((m, n), generator)
        scales = self.density.sample_scales(m * n, generator)
        if scales is not None:
            unit = unit * scales.reshape(m, n)
        anchor = self.raw_outputscale
        # float32 values (exact in float64): a seed gives the same draws whatever dtype the kernel had when it drew
        unit = unit.to(torch.float32).to(torch.float64)
        self.register_buffer("unit_frequencies", (torch.cat(masks) * unit).to(anchor))
        # integers, so that the pair scales are exact in every dtype (a float32 buffer moved to float64 is not)
        self.register_buffer("orders", torch.cat(orders).to(anchor.device))
        self.register_buffer("sampled", torch.cat(sampled).to(anchor.device))
        self.register_buffer("shares", torch.cat(shares).to(anchor.device))

    def resample(self, generator: torch.Generator | None = None) -> SketchedNewtonGirardAdditiveKernel:
        """Redraw the subsets and frequencies (from ``generator`` if given, else torch's global RNG)."""
        self.seed = _new_seed(generator)
        self._materialize()
        return self

    def set_width(self, num_features: int) -> None:
        """Redraw at width ``num_features`` (same seed, the orders split as at construction); used by
        :func:`rfgp.set_num_features`."""
        if num_features < 2 * self.max_degree:
            raise ValueError(f"num_features={num_features} is too small for max_degree={self.max_degree}: at least "
                             f"{2 * self.max_degree}")
        self.num_frequencies = num_features // 2
        self._materialize()

    def _config_value(self, name: str):
        if name in SPECTRAL_FIELDS:
            return self.density.config_value(name)
        return super()._config_value(name)

    def _adopt_config(self, values: dict) -> None:
        """Adopt the saved seed, then re-draw so that the saved draws load into place."""
        super()._adopt_config(values)
        self._materialize()

    # ---------------------------------------------------------------- features
    def frequencies(self, dtype: torch.dtype) -> Tensor:
        """ω = s·g/ℓ on each frequency's columns, ``(*batch, m, n)``; checked finite (a NaN ℓ would make Φ NaN)."""
        frequencies = cast_to(self.unit_frequencies, dtype) / cast_to(self.base_kernel.lengthscale, dtype)
        check_finite(frequencies, "the frequencies (unit draws / base_kernel.lengthscale)")
        return frequencies

    def log_scales(self, log_amplitude: Tensor | None = None, dtype: torch.dtype | None = None) -> Tensor:
        """log c_j = log σ²_{d(j)} + log(C(n, d)/m_d) for sampled subsets, log σ²_{d(j)} − log r_S for enumerated ones,
        ``(*batch, m)``, in ``dtype`` (default the kernel's); plus log A if given.  log C(n, d) = lgamma(n + 1) −
        lgamma(d + 1) − lgamma(n − d + 1)."""
        log_outputscale = cast_to(self.outputscale, self.raw_outputscale.dtype if dtype is None else dtype).log()
        check_finite(log_outputscale, "log outputscale")
        degree = (self.orders + 1).to(log_outputscale)
        n = torch.tensor(self.num_dims + 1.0, dtype=degree.dtype, device=degree.device)
        log_count = torch.lgamma(n) - torch.lgamma(degree + 1) - torch.lgamma(n - degree)
        pair = torch.where(self.sampled, log_count, 0.0) - self.shares.to(degree).log()
        scales = log_outputscale.index_select(-1, self.orders) + pair
        return scales if log_amplitude is None else scales + log_amplitude.unsqueeze(-1)

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√A·Φ(x), A (an outputscale around it; ``None``: A = 1) in the pair scales (:meth:`log_scales`)."""
        projection = x @ self.frequencies(x.dtype).mT
        log_amplitude = None if log_amplitude is None else cast_to(log_amplitude, x.dtype)
        return scaled_sincos_features(projection, 0.5 * self.log_scales(log_amplitude, x.dtype))

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² = Σ_j c_j = Σ_d σ_d² C(n, d) = k(x, x) at every point, after the checks of :meth:`featurize`."""
        self.frequencies(x.dtype)
        norms = self.log_scales(dtype=x.dtype).exp().sum(-1, keepdim=True)
        shape = torch.broadcast_shapes(x.shape[:-1], norms.shape)
        return norms.to(torch.promote_types(x.dtype, norms.dtype)).expand(shape)

    def diag_moments(self, x: Tensor) -> None:
        return None  # Φ(x)ᵀΦ(x) = k(x, x) exactly

    def extra_repr(self) -> str:
        return (f"num_dims={self.num_dims}, max_degree={self.max_degree}, num_features={self.num_features}, "
                f"seed={self.seed}")
