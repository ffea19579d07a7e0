r"""Sketched Hamming IMQ kernel: GPyTorch's ``HammingIMQKernel`` with Gamma-mixture categorical features.

k(x, y) = ((1 + α)/(α + r))^β on one-hot encoded sequences (T positions over a vocabulary of V, flattened to T·V
columns as GPyTorch takes them), r the Hamming distance; the features of
:class:`~rfgp.features.hamming_imq.HammingIMQFeatures` (derivation there) are unbiased for every α, β.
"""

from __future__ import annotations

import math

import torch
from gpytorch.constraints import Interval
from gpytorch.priors import Prior
from torch import Tensor

from ..core import settings
from ..core.config_state import METHOD
from ..core.validation import NonFiniteHyperparameterError, check_kernel_inputs, module_dtype
from ..features.hamming_imq import HammingIMQFeatures
from .families import check_kernel_kwargs
from .hyperparameters import PositiveHyperparameter, register_positive_hyperparameter
from .random_feature_kernel import FeatureKernel


class SketchedHammingIMQKernel(FeatureKernel):
    r"""k(x, y) = ((1 + α)/(α + r))^β, r = Hamming(x, y), with F random features (GPyTorch's ``HammingIMQKernel``).

    Φ(x) = √k₀·Φ_IMQ(categories of x), k₀ = ((1 + α)/α)^β; the categories are the positions of the ones of each
    length-V block of x.  Inputs must be one-hot (each block of V entries 0 and exactly one 1): GPyTorch's formula
    T − Σ x·y is the Hamming distance only there.  Not differentiable in x (the features are piecewise constant);
    α and β get their gradients through the features.

    Args:
        vocab_size: V.
        num_features: F.
        seed, generator: randomness of the signs, hashes and Gamma draws.
        alpha_prior, alpha_constraint, beta_prior, beta_constraint: as in GPyTorch (constraints default ``Positive``).
        reference_beta: β₀ the Gamma draws are centred at (default: β at construction); β ≤ β₀/8 raises, and
            :meth:`resample` re-centres at the current β.
        kwargs: ``batch_shape``, ``active_dims``.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedHammingIMQKernel
        >>> kernel = SketchedHammingIMQKernel(vocab_size=4, num_features=4096, seed=0).double()
        >>> x = torch.nn.functional.one_hot(torch.tensor([[0, 1, 2], [0, 1, 3]]), 4).flatten(-2).double()
        >>> kernel(x).to_dense().shape
        torch.Size([2, 2])
    """

    def __init__(self, vocab_size: int, num_features: int, seed: int | None = None,
                 generator: torch.Generator | None = None, alpha_prior: Prior | None = None,
                 alpha_constraint: Interval | None = None, beta_prior: Prior | None = None,
                 beta_constraint: Interval | None = None, reference_beta: float | None = None, **kwargs) -> None:
        if isinstance(vocab_size, bool) or not isinstance(vocab_size, int) or vocab_size < 1:
            raise ValueError(f"vocab_size must be a positive int, got {vocab_size!r}")
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.vocab_size = vocab_size
        register_positive_hyperparameter(self, "alpha", (*self.batch_shape, 1), alpha_prior, alpha_constraint)
        register_positive_hyperparameter(self, "beta", (*self.batch_shape, 1), beta_prior, beta_constraint)
        if reference_beta is None:
            reference_beta = float(self.beta.detach().min())
        self.feature_map = HammingIMQFeatures(num_features, reference_beta, seed=seed, generator=generator)

    config_fields = {"vocab_size": METHOD}

    alpha = PositiveHyperparameter()
    beta = PositiveHyperparameter()

    @property
    def num_features(self) -> int:
        return self.feature_map.num_features

    def resample(self, generator: torch.Generator | None = None) -> SketchedHammingIMQKernel:
        """Redraw the features, the Gamma draws centred at the current β."""
        self.centre_proposal()
        self.feature_map.resample(generator)
        return self

    def centre_proposal(self) -> None:
        """Make the next draws' Gamma proposal centred at the current β (its smallest entry)."""
        self.feature_map.reference = float(self.beta.detach().min())

    def check_inputs(self, x1: Tensor, x2: Tensor, finite: bool = True) -> torch.dtype:
        """One-hot rows (T blocks of V entries: 0s and one 1) whatever ``finite``, as GPyTorch's kernel needs."""
        dtype = check_kernel_inputs(x1, x2, module_dtype(self))
        for x, name in ((x1, "x1"), (x2, "x2")) if x2 is not x1 else ((x1, "x1"),):
            if x.shape[-1] % self.vocab_size:
                raise ValueError(f"{name} has {x.shape[-1]} columns, not a multiple of vocab_size={self.vocab_size} "
                                 "(one-hot sequences flattened to T·vocab_size columns)")
            if settings.validate_inputs.on() and x.numel():
                blocks = x.reshape(*x.shape[:-1], -1, self.vocab_size)
                if not bool((((blocks == 0) | (blocks == 1)).all(-1) & (blocks.sum(-1) == 1)).all()):
                    raise ValueError(
                        f"{name} is not one-hot: every block of vocab_size={self.vocab_size} entries must hold 0s "
                        "and exactly one 1 (GPyTorch's HammingIMQKernel computes the Hamming distance as "
                        "T − Σ x·y, which only one-hot inputs make a distance); encode the sequences with "
                        "torch.nn.functional.one_hot(tokens, vocab_size).flatten(-2)"
                    )
        return dtype

    def featurize(self, x: Tensor) -> Tensor:
        categories = x.reshape(*x.shape[:-1], -1, self.vocab_size).argmax(-1).to(x.dtype)
        alpha, beta = self.alpha, self.beta
        log_amplitude = beta * torch.log1p(alpha.reciprocal())  # log k₀ = β·log((1 + α)/α), (*batch, 1)
        largest = torch.finfo(log_amplitude.dtype).max
        # k₀ = k(x, x) itself overflows: Φᵀ Φ = inf/NaN (one host read, skipped under validate_inputs(False))
        if settings.validate_inputs.on() and bool((log_amplitude.detach() >= math.log(largest)).any()):
            raise NonFiniteHyperparameterError(
                f"k(x, x) = ((1 + alpha)/alpha)^beta = exp({float(log_amplitude.detach().max()):.4g}) exceeds "
                f"{log_amplitude.dtype}'s largest value {largest:.3g} at alpha={float(alpha.detach().min()):.4g}, "
                f"beta={float(beta.detach().max()):.4g}; accepted are beta·log(1 + 1/alpha) < {math.log(largest):.4g} "
                "(a larger alpha or a smaller beta, or float64)"
            )
        features = self.feature_map(categories, alpha, beta)
        return features * (0.5 * log_amplitude).exp().unsqueeze(-1)

    def prepare(self, x: Tensor) -> None:
        if not self.feature_map.is_initialized:
            self.feature_map.prepare(x.reshape(*x.shape[:-1], -1, self.vocab_size).argmax(-1).to(x.dtype))

    def diag_moments(self, x: Tensor) -> None:
        return None  # unbiased, also on the diagonal
