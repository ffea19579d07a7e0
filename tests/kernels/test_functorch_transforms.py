"""torch.func transforms over rfgp kernels: refused with a NotImplementedError that names the alternative.

Without the check, ``vmap`` over stacked hyperparameters failed inside the feature map with PyTorch's "an
autograd.Function ... must override the setup_context staticmethod", or with "data-dependent control flow"
from the input checks; ``functional_call`` alone (no transform) is no transform and runs.
"""

import copy

import gpytorch
import pytest
import torch
from gpytorch.kernels import PolynomialKernel, RBFKernel, ScaleKernel
from torch.func import functional_call, grad, stack_module_state, vmap

import rfgp


@pytest.mark.parametrize("make", [
    lambda: ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, seed=0, ard_num_dims=2)),
    lambda: rfgp.sketch(ScaleKernel(RBFKernel()) + PolynomialKernel(power=2), 16, seed=0),
], ids=["rff", "tree"])
def test_vmap_and_grad_over_stacked_hyperparameters_are_refused_naming_batch_shape(make):
    x = torch.rand(10, 2, dtype=torch.float64)
    kernels = [make().double() for _ in range(3)]
    for i, kernel in enumerate(kernels):
        kernel(x).to_dense()  # the draws are made at the first evaluation
        with torch.no_grad():
            for parameter in kernel.parameters():
                parameter.add_(0.3 * i)
    params, buffers = stack_module_state(kernels)
    base = copy.deepcopy(kernels[0])

    def gram(p, b):
        with gpytorch.settings.lazily_evaluate_kernels(False):
            return functional_call(base, (p, b), (x,)).to_dense()

    first = gram({k: v[1] for k, v in params.items()}, {k: v[1] for k, v in buffers.items()})
    torch.testing.assert_close(first, kernels[1](x).to_dense().detach(), rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="torch.func transforms.*batch_shape=torch.Size"):
        vmap(gram)(params, buffers)
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        vmap(grad(lambda p, b: gram(p, b).sum()))(params, buffers)


def _posterior(base, method=None):
    """A trained-shape ExactGP (RFF, weighted-Fourier or ``method``) in eval mode (its draws and caches made outside a
    transform)."""
    from .._models import UserGP

    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20, 2, generator=gen, dtype=torch.float64)
    model = UserGP(x, torch.sin(3 * x).sum(-1), rfgp.sketch(ScaleKernel(base), 64, method, seed=0)).double().eval()
    test = torch.rand(3, 2, generator=gen, dtype=torch.float64)
    with torch.no_grad():
        model(test)
    return model, test


@pytest.mark.parametrize("base", [RBFKernel, gpytorch.kernels.PeriodicKernel], ids=["rff", "weighted_fourier"])
@pytest.mark.parametrize("moment", ["mean", "variance"])
def test_forward_over_reverse_hessian_of_a_posterior_in_its_test_inputs(base, moment):
    """``torch.autograd.functional.hessian(..., outer_jacobian_strategy="forward-mode")`` through the fused sin/cos
    Functions (plain and weighted) equals the reverse-mode Hessian: it failed with "You must implement the jvp
    function for custom autograd.Function to use it with forward mode AD"."""
    model, test = _posterior(base())

    def moment_sum(z):
        return getattr(model(z), moment).sum()

    forward = torch.autograd.functional.hessian(moment_sum, test, vectorize=True,
                                                outer_jacobian_strategy="forward-mode")
    torch.testing.assert_close(forward, torch.autograd.functional.hessian(moment_sum, test), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("max_rows", [1024, 0], ids=["degrees_batched", "degree_by_degree"])
@pytest.mark.parametrize("moment", ["mean", "variance"])
def test_forward_over_reverse_hessian_of_a_maclaurin_posterior(moment, max_rows, monkeypatch):
    """The same for the optimized Maclaurin map (TensorSRHT, CtR weights, bias-corrected variance), both TensorSRHT
    paths: it failed with "You must implement the jvp function" (the gather product), then inside the backward with
    PyTorch's internal assert "has_fw_view" (a conj() view), then with "Trying to use forward AD with igammac" (the
    bias correction's Q(p + 1, ‖x‖²))."""
    from rfgp.features import maclaurin

    monkeypatch.setattr(maclaurin, "BATCHED_DEGREES_MAX_ROWS", max_rows)
    model, test = _posterior(RBFKernel(), method="maclaurin")

    def moment_sum(z):
        return getattr(model(z), moment).sum()

    forward = torch.autograd.functional.hessian(moment_sum, test, vectorize=True,
                                                outer_jacobian_strategy="forward-mode")
    torch.testing.assert_close(forward, torch.autograd.functional.hessian(moment_sum, test), rtol=1e-10, atol=1e-12)


def test_jvp_of_a_posterior_is_refused_naming_the_alternative():
    """torch.func.jvp of a cached posterior reached the kernel's same-memory test of its inputs first ("Cannot access
    data pointer of Tensor that doesn't have storage") instead of the refusal."""
    model, test = _posterior(RBFKernel())
    with pytest.raises(NotImplementedError, match="torch.func transforms"):
        torch.func.jvp(lambda z: model(z).mean.sum(), (test,), (torch.ones_like(test),))


@pytest.mark.parametrize("make", [
    lambda seed: rfgp.kernels.SketchedPeriodicKernel(16, seed=seed),
    lambda seed: rfgp.kernels.SketchedRBFKernel(21, method="maclaurin", seed=seed),
    lambda seed: rfgp.kernels.SpectralProductKernel(rfgp.kernels.SketchedRBFKernel(8, input_dim=2, seed=seed),
                                                    rfgp.kernels.SketchedMaternKernel(8, seed=seed),
                                                    num_features=16, seed=seed),
], ids=["periodic", "maclaurin", "spectral_product"])
def test_functional_call_of_a_module_before_its_first_draw_names_the_cause(make):
    """A module that draws at its first call, called through ``functional_call`` with the state of a called one: the
    missing buffers are set as plain attributes for the call, and the draw failed with a bare ``KeyError: "attribute
    'harmonics' already exists"``.  After load_state_dict, the same call gives the saved module's values."""
    x = torch.rand(6, 2, dtype=torch.float64)
    source = make(0).double()
    with gpytorch.settings.lazily_evaluate_kernels(False):
        expected = source(x).to_dense()
        state = dict(source.state_dict())
        fresh = make(1).double()
        with pytest.raises(RuntimeError, match="makes its draws at its first call, and '.*' is already a plain "
                                               "attribute .*functional_call.*call the module once"):
            functional_call(fresh, state, (x,))
        fresh.load_state_dict(state)
        assert torch.equal(functional_call(fresh, state, (x,)).to_dense(), expected)


@pytest.mark.parametrize("name", ["srf", "rff", "optimized_maclaurin", "gaussian_sketch"])
@pytest.mark.parametrize("randomness", ["different", "same"])
def test_first_call_draws_under_vmap_are_refused_and_leave_the_map_usable(name, randomness):
    """A feature map that draws at its first call, first called inside ``jacfwd(..., randomness="different")``: the
    spherical map registered its per-slice draws as batched buffers, returned a wrong Jacobian, and failed at its next
    call with "your tensor may have escaped from inside a function being vmapped".  Now the first call is refused;
    the map is left undrawn, and after a call outside the transform jacfwd equals autograd's Jacobian."""
    from ..core.test_state_dict import FEATURE_MAPS, _inputs

    build, d, sphere = FEATURE_MAPS[name]
    x = _inputs(d, sphere)
    feature_map = build(0, None).double()
    with pytest.raises(NotImplementedError, match="makes its random draws at its first call.*torch.func.vmap"):
        torch.func.jacfwd(feature_map, randomness=randomness)(x)
    assert not feature_map.is_initialized
    torch.testing.assert_close(feature_map(x), build(0, None).double()(x), rtol=0, atol=0)
    torch.testing.assert_close(torch.func.jacfwd(feature_map)(x), torch.autograd.functional.jacobian(feature_map, x),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", ["rff", "polynomial_srht_ctr", "optimized_maclaurin", "random_maclaurin", "srf",
                                  "gaussian_sketch_hd", "operator_valued"])
def test_vmap_over_a_feature_map_input_is_refused_and_input_jacobians_are_autograds(name):
    """``vmap(feature_map)`` over a batch of inputs failed with PyTorch's "data-dependent control flow" (the finite
    check) or "Batching rule not implemented for aten::cos.out"; now a NotImplementedError names the broadcasting
    alternative.  ``jacrev``/``jacfwd``/``hessian`` (which vmap over tangents, not over the input) equal autograd's."""
    from ..core.test_state_dict import FEATURE_MAPS, _inputs

    build, d, sphere = FEATURE_MAPS[name]
    x = _inputs(d, sphere)
    feature_map = build(0, d).double()
    batch = torch.stack((x, x.flip(0)))
    with pytest.raises(NotImplementedError, match=r"vmap over their input \(x\).*shape \(\.\.\., n, d\)"):
        vmap(feature_map)(batch)
    jacobian = torch.autograd.functional.jacobian(feature_map, x)
    torch.testing.assert_close(torch.func.jacrev(feature_map)(x), jacobian, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.func.jacfwd(feature_map)(x), jacobian, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.func.hessian(lambda z: feature_map(z).sum())(x),
                               torch.autograd.functional.hessian(lambda z: feature_map(z).sum(), x),
                               rtol=1e-10, atol=1e-10)
