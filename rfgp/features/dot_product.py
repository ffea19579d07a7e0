"""Dot-product kernel specifications k(x, y) = s(x)s(y)·Σₙ aₙ (xᵀy)ⁿ (paper 000 §5.1, Eqs. 35–39).

A :class:`DotProductKernelSpec` states a kernel by its Maclaurin coefficients aₙ ≥ 0, an
optional radial prefactor s(x) (the Gaussian kernel's exp(−‖x‖²/2), Eq. 39) and, where
known, its exact closed form.  Inputs are already divided by the lengthscale, so the
coefficients are those of the unit-lengthscale kernel:

* :func:`polynomial`: (ν + xᵀy)^p, aₙ = C(p, n) ν^{p−n} for n ≤ p, 0 beyond (Eq. 37);
  paper 000's sphere form (1 − ‖x − y‖²/a²)^p is this with ℓ = a/√2 and ν = 1 − 2/a² (Eq. 57).
* :func:`exponential`: exp(xᵀy), aₙ = 1/n! (Eq. 38).
* :func:`gaussian`: exp(−‖x − y‖²/2) = e^{−‖x‖²/2} e^{−‖y‖²/2} exp(xᵀy) (Eq. 39, §5.4).
* :func:`from_coefficients`: any user coefficient function n ↦ aₙ (and optionally f).

Coefficients are evaluated in log space (log aₙ) so that high degrees neither overflow nor
underflow before they are combined with powers of xᵀy; the built-in kernels also give
log|f(t)| (:meth:`DotProductKernelSpec.log_gram`), so that k = exp(log s(x) + log s(y) + log f)
stays finite at large norms where s(x)s(y) underflows and f(xᵀy) overflows (e.g. the Gaussian
kernel's e^{−‖x‖²/2}·e^{xᵀy}).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Callable

import torch
from torch import Tensor

from ..core.dtypes import device_constant
from ..core.validation import check_positive_float, check_positive_int


class DotProductKernelSpec:
    """k(x, y) = s(x)s(y) f(xᵀy), f(t) = Σₙ aₙtⁿ with aₙ ≥ 0.

    Args:
        log_coefficient: n ↦ log aₙ (−inf for aₙ = 0), for integers n ≥ 0.
        function: the exact f(t) on a tensor (``None``: summed up to ``max_degree``).
        max_degree: the last n with aₙ > 0 for finite series (``None``: infinite).
        log_prefactor: x ↦ log s(x) per row (``None``: s ≡ 1).
        name: for repr and messages.
        log_function: t ↦ (log|f(t)|, sign f(t)) (``None``: taken from ``function``).
    """

    def __init__(
        self,
        log_coefficient: Callable[[int], float],
        function: Callable[[Tensor], Tensor] | None = None,
        max_degree: int | None = None,
        log_prefactor: Callable[[Tensor], Tensor] | None = None,
        name: str = "dot_product",
        log_function: Callable[[Tensor], tuple[Tensor, Tensor]] | None = None,
    ) -> None:
        if function is None and max_degree is None:
            raise ValueError("a kernel with infinitely many coefficients needs its exact function f(t)")
        self._log_coefficient = log_coefficient
        self._function = function
        self.max_degree = max_degree
        self._log_prefactor = log_prefactor
        self._log_function = log_function
        self.name = name

    def __repr__(self) -> str:
        return f"DotProductKernelSpec({self.name})"

    @property
    def has_prefactor(self) -> bool:
        return self._log_prefactor is not None

    def log_coefficients(self, max_degree: int) -> Tensor:
        """(log a₀, …, log a_max_degree) in float64 (−inf where aₙ = 0)."""
        values = [self._log_coefficient(n) if self.max_degree is None or n <= self.max_degree else -math.inf
                  for n in range(max_degree + 1)]
        return torch.tensor(values, dtype=torch.float64)

    def coefficients(self, max_degree: int) -> Tensor:
        """(a₀, …, a_max_degree) in float64."""
        return self.log_coefficients(max_degree).exp()

    def log_prefactor(self, x: Tensor) -> Tensor:
        """log s(x) per row, shape ``x.shape[:-1]``."""
        if self._log_prefactor is None:
            return x.new_zeros(x.shape[:-1])
        return self._log_prefactor(x)

    def function(self, t: Tensor) -> Tensor:
        """f(t) = Σₙ aₙtⁿ exactly (or the finite sum)."""
        if self._function is not None:
            return self._function(t)
        return truncated_series(self, t, self.max_degree)

    def log_function(self, t: Tensor) -> tuple[Tensor, Tensor]:
        """(log|f(t)|, sign f(t)); exact in log space for the built-in kernels (no overflow of f)."""
        if self._log_function is not None:
            return self._log_function(t)
        value = self.function(t)
        return value.abs().log(), value.sign()

    def _from_log(self, log_scale: Tensor, t: Tensor) -> Tensor:
        log_abs, sign = self.log_function(t)
        return sign * (log_scale + log_abs).exp()

    def log_gram(self, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
        """(log|k(xᵢ, yⱼ)|, sign) = (log s(xᵢ) + log s(yⱼ) + log|f(xᵢᵀyⱼ)|, sign f), shape ``(..., n, m)``."""
        log_abs, sign = self.log_function(x @ y.mT)
        return log_abs + self.log_prefactor(x).unsqueeze(-1) + self.log_prefactor(y).unsqueeze(-2), sign

    def __call__(self, x: Tensor, y: Tensor) -> Tensor:
        """The exact Gram matrix k(xᵢ, yⱼ), shape ``(..., n, m)``.

        With a prefactor the product s(x)s(y)·f(xᵀy) is formed in log space (e^{−‖x‖²/2} would
        underflow and e^{xᵀy} overflow at large norms); without one f is evaluated directly.
        """
        if not self.has_prefactor:
            return self.function(x @ y.mT)
        log_abs, sign = self.log_gram(x, y)
        return sign * log_abs.exp()

    def diag(self, x: Tensor) -> Tensor:
        """k(x, x) per row (log space with a prefactor, as :meth:`__call__`)."""
        if not self.has_prefactor:
            return self.function(x.pow(2).sum(-1))
        return self._from_log(2 * self.log_prefactor(x), x.pow(2).sum(-1))


def integer_powers(base: Tensor, exponents: Tensor) -> Tensor:
    """baseⁿ for integer exponents n ≥ 0 (broadcast), with base⁰ = 1 taken without a power: PyTorch's derivative of
    base⁰, 0·base⁻¹, is NaN at base = 0, and would reach a sum even where the term is not used."""
    return torch.where(exponents == 0, 1.0, base.pow(exponents.clamp_min(1)))


def degree_terms(spec: DotProductKernelSpec, t: Tensor, max_degree: int, log_scale: Tensor | None = None) -> Tensor:
    """c·aₙtⁿ for n = 0..max_degree on a new last axis, as sign·exp(log c + log aₙ + n log|t|).

    ``log_scale`` (log c, broadcast to t; e.g. the log prefactors s(x)s(y)) is added in log
    space so that large norms and high degrees neither overflow nor underflow.
    """
    log_a = device_constant(spec, ("log_coefficients", max_degree), lambda: spec.log_coefficients(max_degree), t)
    degrees = torch.arange(max_degree + 1, dtype=t.dtype, device=t.device)
    t = t.unsqueeze(-1)
    log_c = log_a if log_scale is None else log_a + log_scale.unsqueeze(-1)
    # |t| < 1: c·aₙ·tⁿ with tⁿ as a power, whose derivatives of every order are finite at t = 0 (those of n·log|t|
    # were NaN there: the gradient and Hessian of a bias-corrected posterior variance at x = 0); |t| ≥ 1 in log space.
    # Each branch sees a safe argument, and t⁰ is no power (a NaN derivative of a branch not taken, such as that of
    # t^{n−1} = t^{−1} for n = 0, would still reach the sum).
    small = t.abs() < 1
    near = integer_powers(torch.where(small, t, 0.0), degrees) * log_c.exp()
    sign = torch.where((t < 0) & (degrees % 2 == 1), -1.0, 1.0)
    far = sign * (log_c + degrees * torch.where(small, 1.0, t).abs().log()).exp()
    return torch.where(torch.isneginf(log_a), 0.0, torch.where(small, near, far))


def truncated_series(spec: DotProductKernelSpec, t: Tensor, max_degree: int) -> Tensor:
    """Σ_{n ≤ max_degree} aₙtⁿ."""
    return degree_terms(spec, t, max_degree).sum(-1)


def _polynomial_log_coefficient(power: int, offset: float, n: int) -> float:
    if n > power or (offset == 0 and n < power):
        return -math.inf
    return math.log(math.comb(power, n)) + (power - n) * (math.log(offset) if offset > 0 else 0.0)


def _polynomial_function(power: int, offset: float, t: Tensor) -> Tensor:
    return (offset + t).pow(power)


def _polynomial_log_function(power: int, offset: float, t: Tensor) -> tuple[Tensor, Tensor]:
    base = offset + t
    sign = torch.where((base < 0) & (power % 2 == 1), -1.0, 1.0).to(t.dtype)
    return power * base.abs().log(), sign


def _exponential_log_function(t: Tensor) -> tuple[Tensor, Tensor]:
    return t, torch.ones_like(t)


def _log_inverse_factorial(n: int) -> float:
    return -math.lgamma(n + 1)


def _log_gaussian_prefactor(x: Tensor) -> Tensor:
    return -0.5 * x.pow(2).sum(-1)


def _checked_log(coefficient: Callable[[int], float], n: int) -> float:
    value = float(coefficient(n))
    if not 0 <= value < math.inf:  # an infinite aₙ had log aₙ = inf, read downstream as aₙ = 0 (not finite)
        raise ValueError(f"Maclaurin coefficients must be finite and ≥ 0 (positive definiteness), got a_{n} = {value}")
    return math.log(value) if value > 0 else -math.inf


# Module-level functions and partials (not lambdas) keep specs, and the kernels holding them, picklable.
def polynomial(power: int, offset: float = 1.0) -> DotProductKernelSpec:
    """(ν + xᵀy)^p with aₙ = C(p, n) ν^{p−n} (paper 000 Eq. 37)."""
    power = check_positive_int(power, "power")
    offset = check_positive_float(offset, "offset", allow_zero=True)
    spec = DotProductKernelSpec(
        partial(_polynomial_log_coefficient, power, offset),
        partial(_polynomial_function, power, offset),
        max_degree=power,
        name=f"polynomial(p={power}, ν={offset})",
        log_function=partial(_polynomial_log_function, power, offset),
    )
    spec.power, spec.offset = power, offset  # lets the feature maps take a learnable offset tensor
    return spec


def exponential() -> DotProductKernelSpec:
    """exp(xᵀy) with aₙ = 1/n! (paper 000 Eq. 38; inputs divided by ℓ give exp(xᵀy/ℓ²))."""
    return DotProductKernelSpec(_log_inverse_factorial, torch.exp, name="exponential",
                                log_function=_exponential_log_function)


def gaussian() -> DotProductKernelSpec:
    """exp(−‖x − y‖²/2) = e^{−‖x‖²/2} e^{−‖y‖²/2} Σₙ (xᵀy)ⁿ/n! (paper 000 Eq. 39, §5.4)."""
    return DotProductKernelSpec(_log_inverse_factorial, torch.exp, log_prefactor=_log_gaussian_prefactor,
                                name="gaussian", log_function=_exponential_log_function)


def from_coefficients(
    coefficient: Callable[[int], float],
    function: Callable[[Tensor], Tensor] | None = None,
    max_degree: int | None = None,
) -> DotProductKernelSpec:
    """A user kernel f(xᵀy) = Σₙ aₙ(xᵀy)ⁿ from n ↦ aₙ (must be ≥ 0) and, for infinite series, f."""
    if not callable(coefficient):
        raise TypeError(f"coefficient must be a callable n -> a_n, got {type(coefficient).__name__}")
    if max_degree is not None:
        max_degree = check_positive_int(max_degree, "max_degree")

    return DotProductKernelSpec(partial(_checked_log, coefficient), function, max_degree=max_degree, name="custom")
