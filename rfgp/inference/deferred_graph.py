"""Values computed without a graph, differentiated by recomputing them with one only where a backward pass needs it.

A fantasy posterior's training caches (m, L) (:class:`rfgp.inference.prediction.RankUpdatedFantasyStrategy`) are
functions of the hyperparameters, the noise, the prior mean and the training data, not of the new inputs X. Under
BoTorch's ``propagate_grads(True)`` the gradient w.r.t. those must be available, but BoTorch's gradient steps
(``gen_candidates_scipy``: ``torch.autograd.grad(loss, X)``) never ask for it, and a graph built in the forward pass
costs the featurisation of all N training points and their N·F² statistics at every step.

:func:`deferred_graph` returns the values, computed without a graph, as the outputs of an autograd node whose backward
recomputes them with their graph (the same function of the same tensors: the same derivative) and differentiates
that. Autograd runs a node's backward only where a gradient w.r.t. one of its inputs is asked for: ``loss.backward()``
over parameters that require grad rebuilds once, ``torch.autograd.grad(loss, X)`` never does. A backward with
``create_graph=True`` differentiates the rebuilt graph with a graph of its own (second derivatives are exact too).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import Tensor


def deferred_graph(values: Sequence[Tensor], rebuild: Callable[[], Sequence[Tensor]],
                   inputs: Sequence[Tensor]) -> tuple[Tensor, ...]:
    """``values`` (computed without a graph) as differentiable functions of ``inputs``, through ``rebuild()``.

    Args:
        values: the tensors, without a graph.
        rebuild: recomputes ``values`` from ``inputs`` with their graph; called in a backward pass that needs them.
        inputs: the tensors ``rebuild`` differentiates in (those that do not require grad are dropped, a repeated
            one counted once); a backward pass whose rebuilt graph reaches another tensor that requires grad raises
            instead of dropping its gradient.

    Returns:
        ``values`` unchanged where no gradient is recorded or no input requires grad, else copies with the node.
    """
    inputs = tuple({id(t): t for t in inputs if t.requires_grad}.values())  # once each: a repeat doubled its gradient
    if not torch.is_grad_enabled() or not inputs:
        return tuple(values)
    return _DeferredGraph.apply(rebuild, len(values), *values, *inputs)


class _DeferredGraph(torch.autograd.Function):
    @staticmethod
    def forward(ctx, rebuild, num_values: int, *tensors: Tensor):
        ctx.rebuild, ctx.num_values, ctx.inputs = rebuild, num_values, tensors[num_values:]
        ctx.versions = [t._version for t in ctx.inputs]
        return tuple(value.clone() for value in tensors[:num_values])

    @staticmethod
    def backward(ctx, *grads: Tensor):
        _check_unmodified(ctx.inputs, ctx.versions)
        _check_not_nested(ctx.inputs)
        with torch.enable_grad():
            rebuilt = tuple(ctx.rebuild())
        _check_inputs(rebuilt, ctx.inputs)
        pairs = [(value, grad) for value, grad in zip(rebuilt, grads, strict=True)
                 if grad is not None and value.requires_grad]
        input_grads = torch.autograd.grad([value for value, _ in pairs], ctx.inputs, [grad for _, grad in pairs],
                                          allow_unused=True, create_graph=torch.is_grad_enabled()) if pairs else (
            (None,) * len(ctx.inputs))
        return (None, None, *(None,) * ctx.num_values, *input_grads)


def _check_unmodified(inputs: Sequence[Tensor], versions: Sequence[int]) -> None:
    """Raise if an input was modified in place since the forward pass, as autograd does for a saved tensor: the
    rebuild would differentiate at the new values, not at those the forward pass used."""
    for position, (tensor, version) in enumerate(zip(inputs, versions, strict=True)):
        if tensor._version != version:
            raise RuntimeError(
                f"deferred_graph input {position} (shape {tuple(tensor.shape)}) was modified in place after the "
                f"forward pass (version {version} → {tensor._version}; an optimizer step before backward()?), so "
                "its gradient cannot be computed at the values the forward pass used; call backward() before "
                "changing the parameters")


def _check_not_nested(inputs: Sequence[Tensor]) -> None:
    """Raise if an input is computed from another: the gradient w.r.t. the earlier one would include the path through
    the later one, which the outer backward pass then follows again (counted twice)."""
    nodes = {t.grad_fn: position for position, t in enumerate(inputs) if t.grad_fn is not None}
    leaves = {id(t): position for position, t in enumerate(inputs) if t.grad_fn is None}
    for position, tensor in enumerate(inputs):
        seen, pending = set(), [] if tensor.grad_fn is None else [tensor.grad_fn]
        while pending:
            node = pending.pop()
            if node in seen:
                continue
            seen.add(node)
            for child, _ in node.next_functions:
                if child is None:
                    continue
                upstream = nodes.get(child, leaves.get(id(getattr(child, "variable", None))))
                if upstream is not None and upstream != position:
                    raise RuntimeError(
                        f"deferred_graph input {position} (shape {tuple(tensor.shape)}) is computed from input "
                        f"{upstream} (shape {tuple(inputs[upstream].shape)}), so the gradient through it would be "
                        "counted twice: pass only one of them")
                pending.append(child)


def _check_inputs(outputs: Sequence[Tensor], inputs: Sequence[Tensor]) -> None:
    """Raise if the graph of ``outputs`` reaches a leaf that requires grad other than through ``inputs``."""
    stops = {t.grad_fn for t in inputs if t.grad_fn is not None}
    leaves = {id(t) for t in inputs if t.grad_fn is None}
    seen, pending = set(), [t.grad_fn for t in outputs if t.grad_fn is not None]
    while pending:
        node = pending.pop()
        if node in seen or node in stops:
            continue
        seen.add(node)
        variable = getattr(node, "variable", None)
        if variable is not None and id(variable) not in leaves:
            raise RuntimeError(
                f"a deferred graph reached a tensor that requires grad (shape {tuple(variable.shape)}) outside the "
                "inputs it was given, so its gradient would be lost: pass that tensor among deferred_graph's inputs")
        pending.extend(child for child, _ in node.next_functions if child is not None)
