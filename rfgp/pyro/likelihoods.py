"""Likelihoods p(y | f) for weight-space random-feature GPs in Pyro.

A likelihood maps the latent values f of shape ``(..., n, L)`` (L = ``num_latents``
GP outputs per point) to a Pyro distribution with batch shape ``(..., n)`` and
checks that targets are valid for it.  Every likelihood is a ``PyroModule``, so its
hyperparameters (noise, degrees of freedom, ...) are fixed buffers or latent
variables with priors (see :func:`rfgp.pyro.hyperparameter.register_hyperparameter`).

=====================  ===  ==========================================  ===========================
likelihood             L    p(y | f)                                    targets
=====================  ===  ==========================================  ===========================
Gaussian               1    N(y; f, σ²)                                 real
StudentT               1    t_ν(y; f, s)                                real
HeteroscedasticGauss.  2    N(y; f₁, exp(f₂)²)  (f₂ = log noise std)    real
Bernoulli              1    Bernoulli(y; sigmoid(f))                    0 or 1
Categorical            C    Categorical(y; softmax(f₁..f_C))            integers 0..C−1
Poisson                1    Poisson(y; exposure·exp(f))                 counts 0, 1, 2, ...
CustomLikelihood       L    any ``f -> Distribution`` callable          checked by the user
=====================  ===  ==========================================  ===========================
"""

from __future__ import annotations

import math
from typing import Callable

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule
from torch import Tensor
from torch.distributions import constraints

from ..core.config_state import METHOD, ConfigState
from ..core.validation import check_positive_float, check_positive_int
from .hyperparameter import hyperparameter_value, is_random, register_hyperparameter, support_lower_bound


class Likelihood(ConfigState, PyroModule):
    """Base class: ``forward(f)`` returns p(y | f) with batch shape ``f.shape[:-1]``.

    Subclasses set ``num_latents`` and implement :meth:`_distribution`; they override
    :meth:`check_targets` when only some values of y are valid.  Their settings that are not parameters (the class,
    ``exposure``, ``num_classes``, ...) are ``config_fields`` (:mod:`rfgp.core.config_state`): a state of another
    likelihood is refused; states saved before they were (without them) load as they are.
    """

    num_latents: int = 1
    optional_config_fields = frozenset({"type", "num_latents", "noise_offset", "num_classes", "exposure"})

    def forward(self, f: Tensor) -> dist.Distribution:
        if f.shape[-1] != self.num_latents:
            raise ValueError(
                f"{type(self).__name__} needs f of shape (..., n, {self.num_latents}), got {tuple(f.shape)}"
            )
        return self._distribution(f)

    def _distribution(self, f: Tensor) -> dist.Distribution:
        raise NotImplementedError

    def expected_value(self, f: Tensor) -> Tensor:
        """E[y | f] per point (class probabilities ``(..., n, C)`` for :class:`Categorical`).

        Averaging it over posterior samples of f gives the posterior predictive mean.
        """
        return self(f).mean

    def check_targets(self, y: Tensor, num_data: int) -> None:
        """Raise if ``y`` is not a ``(num_data,)`` tensor of values this likelihood can observe."""
        if not torch.is_tensor(y):
            raise TypeError(f"y must be a torch.Tensor, got {type(y).__name__}")
        if y.shape != (num_data,):
            raise ValueError(f"y must have shape ({num_data},) (one target per row of x), got {tuple(y.shape)}")
        if y.is_floating_point() and not bool(torch.isfinite(y).all()):
            raise ValueError("y contains NaN or Inf entries")


class Gaussian(Likelihood):
    """y = f + ε, ε ~ N(0, σ²).  ``noise`` is the variance σ² (a number or a prior)."""

    def __init__(self, noise=0.1) -> None:
        super().__init__()
        register_hyperparameter(self, "noise", noise)

    def _distribution(self, f: Tensor) -> dist.Distribution:
        noise = hyperparameter_value(self, "noise", f)
        return dist.Normal(f[..., 0], noise.sqrt())

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        _check_real(y)


class StudentT(Likelihood):
    """y = f + s·ε, ε ~ Student-t with ``df`` = ν degrees of freedom: robust regression."""

    def __init__(self, df=4.0, scale=0.1) -> None:
        super().__init__()
        register_hyperparameter(self, "df", df)
        register_hyperparameter(self, "scale", scale)

    def _distribution(self, f: Tensor) -> dist.Distribution:
        df = hyperparameter_value(self, "df", f)
        scale = hyperparameter_value(self, "scale", f)
        return dist.StudentT(df, f[..., 0], scale)

    def expected_value(self, f: Tensor) -> Tensor:
        """E[y | f] = f where it exists, i.e. for ν > 1; for ν ≤ 1 (Cauchy tails and heavier) y has no mean.

        Raises:
            ValueError: a fixed ν ≤ 1, or a prior on ν whose support reaches below 1 (the mean of the posterior
                predictive does not exist then; the median is f).
        """
        if is_random(self, "df"):
            lower = support_lower_bound(self._pyro_samples["df"])
            if lower is None or lower < 1:
                raise ValueError(
                    f"the prior of df has support down to {lower}: y has no mean for df ≤ 1, so its posterior "
                    "predictive has none; use the median f (posterior_predictive's 'f') or a prior on df > 1 "
                    "(dist.Uniform(1.0, 30.0), dist.Pareto(1.0, 2.0))"
                )
        elif not bool((self.df > 1).all()):
            raise ValueError(f"y has no mean for df ≤ 1, got df={self.df.item()}; its median is f")
        return f[..., 0]

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        _check_real(y)


class HeteroscedasticGaussian(Likelihood):
    """y = f₁ + exp(f₂)·ε with two latent GPs: the mean f₁ and the log noise standard deviation f₂.

    ``noise_offset`` is added to f₂ (a prior mean for the log noise std), so that a
    zero-mean GP on f₂ starts near a sensible noise level.  ``log_prob`` is computed from the log std, so it stays
    finite where exp(f₂) under- or overflows (f₂ outside about [−103, 88] in float32).
    """

    config_fields = {"noise_offset": METHOD}

    num_latents = 2

    def __init__(self, noise_offset: float = -1.0) -> None:
        super().__init__()
        if isinstance(noise_offset, bool) or not isinstance(noise_offset, (int, float)):
            raise TypeError(f"noise_offset must be a real number, got {noise_offset!r}")
        if not math.isfinite(noise_offset):
            raise ValueError(f"noise_offset must be a finite number, got {noise_offset!r}")
        self.noise_offset = float(noise_offset)

    def _distribution(self, f: Tensor) -> dist.Distribution:
        return _LogScaleNormal(f[..., 0], f[..., 1] + self.noise_offset)

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        _check_real(y)


class Bernoulli(Likelihood):
    """Binary classification: p(y = 1 | f) = sigmoid(f)."""

    def _distribution(self, f: Tensor) -> dist.Distribution:
        return dist.Bernoulli(logits=f[..., 0])

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        if not y.is_floating_point():
            raise TypeError(f"Bernoulli targets y must be a floating tensor of 0s and 1s, got dtype {y.dtype}")
        if not bool(((y == 0) | (y == 1)).all()):
            raise ValueError(f"Bernoulli targets y must be 0 or 1, got values {_some_values(y)}")


class Categorical(Likelihood):
    """C-class classification with one latent GP per class: p(y = c | f) = softmax(f)_c."""

    config_fields = {"num_classes": METHOD}

    def __init__(self, num_classes: int) -> None:
        super().__init__()
        self.num_classes = check_positive_int(num_classes, "num_classes")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be at least 2, got {num_classes}")
        self.num_latents = self.num_classes

    def _distribution(self, f: Tensor) -> dist.Distribution:
        return dist.Categorical(logits=f)

    def expected_value(self, f: Tensor) -> Tensor:
        return torch.softmax(f, dim=-1)

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        if y.is_floating_point() or y.is_complex() or y.dtype == torch.bool:
            raise TypeError(f"Categorical targets y must be an integer tensor of class labels, got dtype {y.dtype}")
        if bool(((y < 0) | (y >= self.num_classes)).any()):
            raise ValueError(
                f"Categorical targets y must be class labels in 0..{self.num_classes - 1}, got values {_some_values(y)}"
            )


class Poisson(Likelihood):
    """Count regression with a log link: y ~ Poisson(exposure · exp(f)).

    ``log_prob`` is computed from the log rate log(exposure) + f, so it stays finite (and never NaN) where the rate
    exp(f) under- or overflows (f outside about [−103, 88] in float32).
    """

    config_fields = {"exposure": METHOD}

    def __init__(self, exposure: float = 1.0) -> None:
        super().__init__()
        self.exposure = check_positive_float(exposure, "exposure")

    def _distribution(self, f: Tensor) -> dist.Distribution:
        return _LogRatePoisson(math.log(self.exposure) + f[..., 0])

    def check_targets(self, y: Tensor, num_data: int) -> None:
        super().check_targets(y, num_data)
        if not y.is_floating_point():
            raise TypeError(f"Poisson targets y must be a floating tensor of counts, got dtype {y.dtype}")
        if not bool(((y >= 0) & (y == y.round())).all()):
            raise ValueError(f"Poisson targets y must be non-negative integer counts, got values {_some_values(y)}")


class CustomLikelihood(Likelihood):
    """Any Pyro distribution of the latent values: ``distribution_fn(f) -> Distribution``.

    ``f`` has shape ``(..., n, num_latents)``; the returned distribution must have batch
    shape ``(..., n)`` and event shape ``()``.  Hyperparameters are up to the caller
    (close over fixed values, or call ``pyro.sample`` inside ``distribution_fn``).

    Example:
        >>> import torch
        >>> import pyro.distributions as dist
        >>> from rfgp.pyro import CustomLikelihood
        >>> gamma = CustomLikelihood(lambda f: dist.Gamma(2.0, 2.0 * torch.exp(-f[..., 0])), num_latents=1)
    """

    config_fields = {"num_latents": METHOD}

    def __init__(self, distribution_fn: Callable[[Tensor], dist.Distribution], num_latents: int = 1) -> None:
        super().__init__()
        if not callable(distribution_fn):
            raise TypeError(f"distribution_fn must be callable f -> Distribution, got {type(distribution_fn).__name__}")
        self.distribution_fn = distribution_fn
        self.num_latents = check_positive_int(num_latents, "num_latents")

    def _distribution(self, f: Tensor) -> dist.Distribution:
        result = self.distribution_fn(f)
        if not isinstance(result, torch.distributions.Distribution):
            raise TypeError(f"distribution_fn must return a torch/Pyro Distribution, got {type(result).__name__}")
        if result.event_shape != () or result.batch_shape != f.shape[:-1]:
            raise ValueError(
                f"distribution_fn must return batch shape {tuple(f.shape[:-1])} and event shape (), "
                f"got batch shape {tuple(result.batch_shape)} and event shape {tuple(result.event_shape)}"
            )
        return result


class _LogScaleNormal(dist.Normal):
    """N(loc, exp(log_scale)²) whose density is computed from the log scale s:

        log p(y) = −z²/2 − s − log √(2π),   z = (y − loc)·e^{−s},

    finite where e^{s} overflows to ∞ (s > 88.7 in float32: ``Normal``'s −log σ was −∞) and where it underflows to 0
    (s < −103: ``Normal`` refused the scale, or gave 0/0 = NaN at y = loc); −∞ only where −z²/2 is below the dtype's
    range.  ``scale`` = e^{s} (for sampling and the moments) may be 0 or ∞ there.
    """

    arg_constraints = {"loc": constraints.real, "log_scale": constraints.real}

    def __init__(self, loc: Tensor, log_scale: Tensor, validate_args=None) -> None:
        self.log_scale = log_scale
        super().__init__(loc, log_scale.exp(), validate_args=validate_args)
        self.log_scale = self.log_scale.expand(self.batch_shape)

    def expand(self, batch_shape, _instance=None):
        new = super().expand(batch_shape, _instance=self._get_checked_instance(_LogScaleNormal, _instance))
        new.log_scale = self.log_scale.expand(batch_shape)
        return new

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        residual = value - self.loc
        # at y = loc, z = 0 also where e^{−s} = ∞ (0·∞ would be NaN, in the value and in the gradient)
        z = residual * torch.exp(torch.where(residual == 0, 0.0, -self.log_scale))
        return -0.5 * z.square() - self.log_scale - 0.5 * math.log(2 * math.pi)


class _LogRatePoisson(dist.Poisson):
    """Poisson(exp(log_rate)) whose mass is computed from the log rate η:

        log p(y) = y·η − e^{η} − log y!,

    finite where e^{η} underflows to 0 (η < −103 in float32: ``Poisson`` gave log 0 = −∞ for y > 0) and never NaN
    where it overflows (η > 88.7: ``Poisson`` gave ∞ − ∞ = NaN for y > 0); −∞ there, the value −e^{η} being below the
    dtype's range.  ``rate`` = e^{η} (for sampling and the moments).
    """

    arg_constraints = {"log_rate": constraints.real}

    def __init__(self, log_rate: Tensor, validate_args=None) -> None:
        self.log_rate = log_rate
        super().__init__(log_rate.exp(), validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = super().expand(batch_shape, _instance=self._get_checked_instance(_LogRatePoisson, _instance))
        new.log_rate = self.log_rate.expand(batch_shape)
        return new

    def log_prob(self, value: Tensor) -> Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return value * self.log_rate - self.rate - torch.lgamma(value + 1)


def _check_real(y: Tensor) -> None:
    if not y.is_floating_point():
        raise TypeError(f"regression targets y must be a floating tensor, got dtype {y.dtype}")


def _some_values(y: Tensor, limit: int = 6) -> list:
    return torch.unique(y)[:limit].tolist()
