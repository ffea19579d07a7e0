r"""GPyTorch's ``SpectralDeltaKernel`` (sparse-spectrum GP) with its exact features.

The sparse-spectrum GP of Lázaro-Gredilla, Quiñonero-Candela, Rasmussen & Figueiras-Vidal (2010, *Sparse
Spectrum Gaussian Process Regression*, JMLR 11, Eq. 5) puts the spectral measure on s trainable point masses.
GPyTorch's parameterisation (``gpytorch/kernels/spectral_delta_kernel.py``): frequencies Z ∈ ℝ^{s×d}
(``raw_Z`` through ``Z_constraint``, default ``Positive``) in units of the lengthscale-scaled inputs x/ℓ, so

    k(x, y) = (1/s) Σⱼ cos(2π zⱼᵀ(x − y)/ℓ),
    Φ(x) = s^{−1/2}·[cos(2π Z(x/ℓ)), sin(2π Z(x/ℓ))],   k(x, y) = Φ(x)ᵀΦ(y) exactly,

(cos(a − b) = cos a cos b + sin a sin b), width F = 2s fixed by ``num_deltas``; ARD divides each input column
by its own ℓᵢ.  The features are :func:`~rfgp.features.weighted_fourier.projection_features` of the projections
2πZ(x/ℓ) — GPyTorch's own features, column order [cos…, sin…] included, so values and gradients agree with
GPyTorch's to rounding.

``num_features`` can only be the exact width: ``None`` or 2·num_deltas (anything else raises, naming 2·num_deltas;
fewer features would need fewer deltas, a different model, and more cannot improve exact ones).  ``rfgp.sketch``
gives a ``SpectralDeltaKernel`` its width 2·num_deltas like the other exact kernels (a sum reserves it before
splitting F among its random parts) and raises when the width F given to it is smaller.

As a factor of a product with other stationary kernels it offers the spectral protocol of
:mod:`rfgp.kernels.spectral_kernel`: its measure is uniform over the 2s points ±2πzⱼ/ℓ, drawn as a random
index j and sign per frequency (the sign makes the measure symmetric, which the convolution ω₁ + ω₂ needs).
"""

from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import SpectralDeltaKernel
from torch import Tensor

from ..core.dtypes import cast_to
from ..core.validation import check_finite, check_positive_int
from ..features.weighted_fourier import projection_features
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .random_feature_kernel import FeatureKernel


class SpectralDeltaFeatureKernel(FeatureKernel):
    r"""k(x, y) = (1/s)Σⱼ cos(2πzⱼᵀ(x − y)/ℓ) with its exact features (GPyTorch's ``SpectralDeltaKernel``).

    Args:
        num_dims: d, the number of input columns (after ``active_dims``) the frequencies Z have.
        num_deltas: s, the number of trainable frequencies (point masses); the width is 2s.
        Z_constraint: constraint of ``raw_Z`` (default ``Positive()``, as GPyTorch).
        num_features: ``None`` or 2·num_deltas (the width is fixed by ``num_deltas``).
        seed, generator: randomness of the initial ``raw_Z`` ~ U[0, 1) (GPyTorch's ``torch.rand``); a converted
            kernel copies the exact kernel's instead.
        kwargs: ``ard_num_dims``, ``batch_shape``, ``active_dims``, ``lengthscale_prior``,
            ``lengthscale_constraint``.

    Raises:
        ValueError: ``num_features`` other than ``None`` or 2·num_deltas; inputs with other than ``num_dims``
            columns; non-finite Z/ℓ at a call.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SpectralDeltaFeatureKernel
        >>> kernel = SpectralDeltaFeatureKernel(num_dims=2, num_deltas=16, seed=0)
        >>> kernel.num_features
        32
        >>> kernel(torch.rand(10, 2)).shape
        torch.Size([10, 10])
    """

    has_lengthscale = True
    is_stationary = True
    #: Φ(x)ᵀΦ(y) = k(x, y) exactly, at the width 2·num_deltas: sums reserve it before splitting F
    is_exact = True
    #: the spectral draws (indices and signs) depend on the seed alone
    spectral_draws_follow_seed = True

    def __init__(self, num_dims: int, num_deltas: int = 128, Z_constraint: Interval | None = None,
                 num_features: int | None = None, seed: int | None = None, generator: torch.Generator | None = None,
                 **kwargs) -> None:
        check_kernel_kwargs(type(self).__name__, kwargs)
        self.num_dims = check_positive_int(num_dims, "num_dims")
        num_deltas = check_positive_int(num_deltas, "num_deltas")
        check_exact_width(num_features, num_deltas, "num_features")
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        super().__init__(**kwargs)
        register_positive_hyperparameter(self, "Z", (*self.batch_shape, num_deltas, num_dims), None, Z_constraint)
        if seed is not None:
            generator = torch.Generator().manual_seed(seed)
        self.raw_Z.data.copy_(torch.rand(self.raw_Z.shape, generator=generator, dtype=torch.float64))

    Z = PositiveHyperparameter()

    def initialize_from_data(self, train_x: Tensor, train_y: Tensor) -> None:
        """GPyTorch's ``SpectralDeltaKernel.initialize_from_data``: Z sampled from the empirical spectrum of
        ``train_y`` (inverse CDF, NumPy's global random state as GPyTorch uses it; 1-D inputs).

        The kernel has GPyTorch's parameter names, shapes and constraints, so GPyTorch's routine runs on it unchanged
        and sets what it sets on the exact kernel from the same random state (before or after ``rfgp.sketch``)."""
        SpectralDeltaKernel.initialize_from_data(self, train_x, train_y)

    def initialize_from_data_simple(self, train_x: Tensor, train_y: Tensor, **kwargs) -> None:
        """GPyTorch's ``SpectralDeltaKernel.initialize_from_data_simple``: Z ~ U(0, 0.5/min_dist) per input column
        (torch's global random state), run on this kernel's hyperparameters as :meth:`initialize_from_data` is."""
        SpectralDeltaKernel.initialize_from_data_simple(self, train_x, train_y, **kwargs)

    @property
    def num_deltas(self) -> int:
        return self.raw_Z.shape[-2]

    @property
    def num_features(self) -> int:
        return 2 * self.num_deltas

    @property
    def input_dim(self) -> int:
        """d: inputs with another number of columns raise (:meth:`FeatureKernel.check_inputs`)."""
        return self.num_dims

    def scaled_frequencies(self, dtype: torch.dtype | None = None) -> Tensor:
        """2πZ/ℓ ``(*batch, s, d)`` in ``dtype`` (default the kernel's), in units of the raw inputs; checked finite (a
        NaN Z or ℓ would make Φ NaN)."""
        dtype = self.raw_Z.dtype if dtype is None else dtype
        frequencies = (2 * math.pi) * cast_to(self.Z, dtype) / cast_to(self.lengthscale, dtype)
        check_finite(frequencies, "2π·Z/lengthscale")
        return frequencies

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√A·Φ(x), A (an outputscale around it; ``None``: A = 1) in the sin/cos pair scales √(A/s)."""
        return projection_features(x @ self.scaled_frequencies(x.dtype).mT, None, log_amplitude)

    def feature_squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² = (1/s)Σⱼ(cos² + sin²) = 1 at every point, after the checks :meth:`featurize` makes."""
        frequencies = self.scaled_frequencies(x.dtype)
        shape = torch.broadcast_shapes(x.shape[:-1], (*frequencies.shape[:-2], 1))
        return torch.ones(shape, dtype=torch.promote_types(x.dtype, frequencies.dtype), device=x.device)

    def diag_moments(self, x: Tensor) -> None:
        return None

    # -------------------------------------------------------------- spectral
    def spectral_draws(self, num_frequencies: int, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        """A uniform index j ∈ {0, …, s − 1} and a random sign per frequency (the measure is uniform on ±2πzⱼ/ℓ)."""
        if input_dim != self.num_dims:
            raise ValueError(f"SpectralDeltaFeatureKernel has num_dims={self.num_dims} but is given {input_dim} "
                             "input columns")
        index = torch.randint(0, self.num_deltas, (num_frequencies,), generator=generator)
        signs = torch.randint(0, 2, (num_frequencies, 1), generator=generator).to(torch.float64).mul_(2).sub_(1)
        return {"index": index, "sign": signs}

    def spectral_frequencies(self, draws: dict[str, Tensor]) -> Tensor:
        """ω = ±2πz_j/ℓ ``(*batch, m, d)`` for the drawn indices j and signs."""
        frequencies = self.scaled_frequencies()
        return frequencies.index_select(-2, draws["index"].to(frequencies.device)) * draws["sign"].to(frequencies)

    def spectral_weights(self, draws: dict[str, Tensor]) -> None:
        return None

    def spectral_amplitude(self) -> Tensor:
        return torch.ones(self.batch_shape, dtype=self.raw_Z.dtype, device=self.raw_Z.device)

    def extra_repr(self) -> str:
        return f"num_dims={self.num_dims}, num_deltas={self.num_deltas}"


def check_exact_width(num_features: int | None, num_deltas: int, name: str, at_least: bool = False) -> None:
    """The ValueError for a width other than the exact 2·num_deltas (``at_least``: for one below it).

    Args:
        num_features: the width asked for (``None``: the exact one).
        num_deltas: s.
        name: the argument's name in the message.
        at_least: accept any width ≥ 2s (``rfgp.sketch``'s F is an upper bound of the tree's width).
    """
    if num_features is None:
        return
    width = 2 * num_deltas
    if num_features == width or (at_least and num_features > width):
        return
    accepted = f"≥ {width}" if at_least else f"None or {width}"
    raise ValueError(
        f"{name}={num_features}, but a SpectralDeltaKernel with num_deltas={num_deltas} has exactly {width} features "
        f"(cos and sin of each trainable frequency; exact, so more cannot improve them and fewer would need fewer "
        f"deltas, a different model); accepted: {accepted}, or build the kernel with num_deltas={num_features // 2}"
    )
