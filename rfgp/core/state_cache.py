"""A result reused while the values it was computed from are unchanged.

Some per-call quantities depend only on a module's state, not on the call's input: the Cholesky factor
L = chol(K(Z, Z) + εI) of a Nyström kernel's landmarks, say, which every posterior call of a BO loop recomputed
(O(M³) per call at M landmarks, more than the prediction at small N).  :class:`StateCache` keeps one such result
together with copies of the tensors and the configuration it came from, and returns it while they compare equal.

Keyed on values, not on identities or version counters: GPyTorch's ``kernel.lengthscale = v`` writes through
``parameter.data.copy_``, which leaves the parameter's ``_version`` unchanged, so only a comparison of values sees
every change (in-place edits, assignments, ``load_state_dict``, optimiser steps, ``.to(dtype)``).  The comparison
is O(size of the state), small next to what it saves; it reads one boolean per tensor on the host, as the
computation it replaces did (a Cholesky's success check).

Only results without an autograd graph are cached: with gradients enabled and a state tensor that requires
them, the result is computed afresh at every call (a cached graph would be freed by the first backward pass, and a
graph-free result would drop the gradient w.r.t. the state); so is it while ``torch.jit.trace`` or ``torch.compile``
records the computation.  A result computed under ``torch.inference_mode`` (an inference tensor, which autograd
refuses to save for backward) is reused only under inference mode: outside it, it is computed afresh and replaces it.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import Generic, TypeVar

import torch
from torch import Tensor, nn

Result = TypeVar("Result")

_SCALARS = (bool, int, float, str, type(None))


def module_configuration(module: nn.Module) -> tuple:
    """The plain Python settings of ``module`` and its submodules (``nu`` of a Matérn kernel, ``ard_num_dims``, a
    batch shape, ...): for each submodule its type and its attributes that are scalars, strings, ``None`` or tuples
    of those — everything a module holds besides tensors and other objects — as a hashable tuple."""
    return tuple(
        (type(sub), tuple(sorted((name, value) for name, value in vars(sub).items()
                                 if isinstance(value, _SCALARS)
                                 or (isinstance(value, tuple) and all(isinstance(v, _SCALARS) for v in value)))))
        for sub in module.modules()
    )


def module_tensors(module: nn.Module) -> tuple[Tensor, ...]:
    """Every parameter and buffer of ``module`` and its submodules."""
    return (*module.parameters(), *module.buffers())


class StateCache(Generic[Result]):
    """One result of ``compute()``, reused while ``tensors`` equal (shape, dtype, device and values) and ``config``
    equals (``==``) those it was computed from, and no tensor requires a gradient while gradients are enabled; one
    computed under ``torch.inference_mode`` only under inference mode."""

    def __init__(self) -> None:
        # (config, tensors, result, computed under inference mode), replaced as one object: threads sharing the module
        # read a whole entry, never one state's key with another's result
        self._entry: tuple[Hashable, tuple[Tensor, ...], Result, bool] | None = None

    def get(self, tensors: Sequence[Tensor], config: Hashable, compute: Callable[[], Result]) -> Result:
        if (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) or _recording():
            return compute()
        inference = torch.is_inference_mode_enabled()
        entry = self._entry
        if entry is not None:
            saved_config, saved_tensors, saved_result, saved_inference = entry
            if (inference or not saved_inference) and saved_config == config and _equal(saved_tensors, tensors):
                return saved_result
        result = compute()
        self._entry = (config, tuple(t.detach().clone() for t in tensors), result, inference)
        return result


def _recording() -> bool:
    """Under ``torch.jit.trace`` or ``torch.compile`` a reused result would enter the recorded program as a constant
    (later hyperparameters would not reach it): computed afresh there."""
    return torch.jit.is_tracing() or torch.compiler.is_compiling()


def _equal(saved: Sequence[Tensor], tensors: Sequence[Tensor]) -> bool:
    return len(saved) == len(tensors) and all(
        a.shape == b.shape and a.dtype == b.dtype and a.device == b.device and bool(torch.equal(a, b))
        for a, b in zip(saved, tensors))
