"""Registering GPyTorch-style positive hyperparameters (raw parameter, constraint, prior, validated setter)."""

from __future__ import annotations

from functools import partial

import torch
from gpytorch.constraints import Interval, Positive
from gpytorch.kernels import Kernel
from gpytorch.priors import Prior
from torch import Tensor

from ..core.validation import check_hyperparameter


def register_positive_hyperparameter(kernel: Kernel, name: str, shape, prior: Prior | None = None,
                                     constraint: Interval | None = None) -> None:
    """Register ``raw_<name>`` (zeros of ``shape``), its constraint (default ``Positive``) and ``<name>_prior``.

    The kernel class declares ``<name> = PositiveHyperparameter()``, exactly as GPyTorch's
    kernels name it, so values, constraints and priors carry over from the GPyTorch kernel.
    """
    kernel.register_parameter(f"raw_{name}", torch.nn.Parameter(torch.zeros(*shape)))
    kernel.register_constraint(f"raw_{name}", Positive() if constraint is None else constraint)
    if prior is not None:
        if not isinstance(prior, Prior):
            raise TypeError(f"{name}_prior must be a gpytorch.priors.Prior, got {type(prior).__name__}")
        kernel.register_prior(f"{name}_prior", prior, *prior_closures(name))


def prior_closures(name: str) -> tuple[partial, partial]:
    """(closure, setting_closure) of ``<name>_prior`` for ``register_prior``: read and set ``module.<name>``.

    GPyTorch calls them on the module that holds the prior (``pyro_sample_from_prior``,
    ``pyro_load_from_samples``, ``sample_from_prior``), so they go through the module's own (validated)
    setter; partials of module functions, not lambdas, so that a kernel with priors pickles.
    """
    return partial(_get_hyperparameter, name=name), partial(_set_hyperparameter, name=name)


def _get_hyperparameter(module, *, name: str):
    return getattr(module, name)


def _set_hyperparameter(module, value, *, name: str) -> None:
    setattr(module, name, value)


def parameter_value(value, raw: Tensor) -> Tensor:
    """``value`` (a number or tensor) in the dtype and device of the raw parameter ``raw``: a Python float is made a
    tensor in that dtype directly (GPyTorch's setters make it float32 first, which rounds 0.1 by 1.5e-9 in a float64
    kernel)."""
    return value.to(raw) if torch.is_tensor(value) else torch.as_tensor(value, dtype=raw.dtype, device=raw.device)


def positive_value(kernel: Kernel, name: str) -> Tensor:
    return getattr(kernel, f"raw_{name}_constraint").transform(getattr(kernel, f"raw_{name}"))


def set_positive_value(kernel: Kernel, name: str, value) -> None:
    """Set ``<name>`` after checking every entry is finite and > 0 (a ValueError names the argument otherwise)."""
    raw = getattr(kernel, f"raw_{name}")
    check_hyperparameter(value, name, getattr(kernel, f"raw_{name}_constraint"))
    value = parameter_value(value, raw)
    kernel.initialize(**{f"raw_{name}": getattr(kernel, f"raw_{name}_constraint").inverse_transform(value)})


class PositiveHyperparameter:
    """Class attribute ``<name> = PositiveHyperparameter()``: the constrained value of ``raw_<name>``, validated on set.

    GPyTorch writes this as a property/setter pair per hyperparameter; one descriptor serves them all
    (``nn.Module.__setattr__`` defers to it, as to a property, for names that are not parameters).
    """

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, kernel: Kernel | None, owner: type | None = None):
        return self if kernel is None else positive_value(kernel, self.name)

    def __set__(self, kernel: Kernel, value) -> None:
        set_positive_value(kernel, self.name, value)
