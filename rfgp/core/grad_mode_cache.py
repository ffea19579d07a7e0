"""Results cached on an object once per autograd grad mode.

A tensor computed under ``torch.no_grad()`` has no graph.  A cache that returns it to a later call with gradients
enabled silently drops that call's gradient (linear_operator's ``@cached`` keys on the method's arguments only, as
``RootLinearOperator.to_dense`` does).  :func:`cached_per_grad_mode` keys the cache on ``torch.is_grad_enabled()``
too: at most two results per object, one with a graph and one without.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TypeVar

import torch
from linear_operator.utils.memoize import cached

Result = TypeVar("Result")


def cached_per_grad_mode(name: str) -> Callable[[Callable[..., Result]], Callable[..., Result]]:
    """Decorator for a method without arguments: its result cached under ``name`` (linear_operator's memoize cache
    on the object) once per grad mode."""

    def decorator(method: Callable[..., Result]) -> Callable[..., Result]:
        @cached(name=name)
        def compute(self, grad_enabled: bool) -> Result:
            return method(self)

        @functools.wraps(method)
        def wrapper(self) -> Result:
            return compute(self, torch.is_grad_enabled())

        return wrapper

    return decorator
