"""deferred_graph: values without a graph whose backward rebuilds them with one, only where a gradient is asked for."""

import pytest
import torch

from rfgp.inference.deferred_graph import deferred_graph


def _setup():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 4, generator=gen, dtype=torch.float64).requires_grad_(True)
    b = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_(True)
    x = torch.randn(4, generator=gen, dtype=torch.float64).requires_grad_(True)
    return a, b, x


def _function(a, b):
    gram = a @ a.mT + torch.eye(4, dtype=a.dtype)
    return torch.linalg.solve(gram, b.exp()).unsqueeze(-1), torch.linalg.cholesky(gram)


def test_rebuilt_only_for_the_gradients_that_need_it_and_exact():
    a, b, x = _setup()
    calls = []

    def rebuild():
        calls.append(1)
        return _function(a, b)

    def loss(mean, chol):
        return (x @ mean).sin().sum() + (chol @ x).square().sum()

    with torch.no_grad():
        values = _function(a, b)
    deferred = deferred_graph(values, rebuild, (a, b))
    value = loss(*deferred)
    assert calls == [] and all(torch.equal(d, v) for d, v in zip(deferred, values, strict=True))
    (grad_x,) = torch.autograd.grad(value, x, retain_graph=True)
    assert calls == []
    actual = torch.autograd.grad(value, (a, b, x), create_graph=True)
    assert calls == [1]
    direct = loss(*_function(a, b))
    expected = torch.autograd.grad(direct, (a, b, x), create_graph=True)
    for u, v in zip(actual, expected, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-13)
    torch.testing.assert_close(grad_x, expected[2], rtol=0, atol=1e-13)
    # second derivatives (create_graph=True) through the rebuilt graph
    second = torch.autograd.grad(actual[0].sum() + actual[1].square().sum(), (a, b))
    second_expected = torch.autograd.grad(expected[0].sum() + expected[1].square().sum(), (a, b))
    for u, v in zip(second, second_expected, strict=True):
        torch.testing.assert_close(u, v, rtol=0, atol=1e-12)


def test_a_leaf_outside_the_inputs_raises_instead_of_losing_its_gradient():
    a, b, _ = _setup()
    with torch.no_grad():
        values = _function(a, b)
    deferred = deferred_graph(values, lambda: _function(a, b), (a,))  # b read but not listed
    with pytest.raises(RuntimeError, match="outside the inputs"):
        sum(v.sum() for v in deferred).backward()
    assert deferred_graph(values, lambda: _function(a, b), (a.detach(),))[0] is values[0]  # nothing to differentiate


def test_an_input_modified_in_place_before_backward_raises():
    a, b, _ = _setup()
    with torch.no_grad():
        values = _function(a, b)
    deferred = deferred_graph(values, lambda: _function(a, b), (a, b))
    with torch.no_grad():
        a.add_(1.0)  # e.g. an optimizer step between the forward and the backward pass
    with pytest.raises(RuntimeError, match="modified in place after the forward pass"):
        sum(v.sum() for v in deferred).backward()


def test_a_repeated_input_gets_its_gradient_once():
    """An input passed twice (a model's training inputs that are also its kernel's inputs) is differentiated once;
    before, autograd returned its gradient for each occurrence and the two were summed: twice the true gradient."""
    a, b, _ = _setup()
    with torch.no_grad():
        values = _function(a, b)
    deferred = deferred_graph(values, lambda: _function(a, b), (a, b, a))
    expected = torch.autograd.grad(_function(a, b)[0].sum(), (a, b))
    torch.testing.assert_close(torch.autograd.grad(deferred[0].sum(), (a, b)), expected, rtol=1e-12, atol=1e-12)


def test_an_input_computed_from_another_is_refused():
    """b and b + 1 as inputs: autograd.grad w.r.t. both gives b the gradient through b + 1 too, which the outer
    backward then propagates to b again — before, b's gradient was silently twice the true one; refused by name."""
    a, b, _ = _setup()
    shifted = b + 1.0
    with torch.no_grad():
        values = _function(a, shifted)
    deferred = deferred_graph(values, lambda: _function(a, shifted), (a, b, shifted))
    with pytest.raises(RuntimeError, match="input 2 .shape .4,.. is computed from input 1"):
        torch.autograd.grad(deferred[0].sum(), (a, b))
