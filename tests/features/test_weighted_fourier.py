"""fourier_features' custom autograd Function against autograd of the plain formula.

Φ = m^{−1/2}[√w cos(xWᵀ), √w sin(xWᵀ)] is evaluated by one Function whose backward reuses Φ; values, first and
second derivatives in x, W and log w must be those of the plain cat/mul/exp formula (float64, to rounding).
"""

import math

import pytest
import torch
import torch.autograd.forward_ad as forward_ad

from rfgp.features import weighted_fourier
from rfgp.features.weighted_fourier import fourier_features


def plain(x, frequencies, log_weights):
    projection = x @ frequencies.mT
    features = torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1)
    m = frequencies.shape[-2]
    if log_weights is None:
        return features / math.sqrt(m)
    amplitudes = torch.exp(0.5 * (log_weights - math.log(m))).unsqueeze(-2)
    return features * torch.cat([amplitudes, amplitudes], dim=-1)


SHAPES = {  # x, W, log w: unbatched; log w batched over unbatched W (a batched lengthscale, a shared period)
    "plain": ((7, 2), (5, 2), (5,)),
    "weights_batched": ((7, 2), (5, 2), (3, 5)),
    "all_batched": ((3, 7, 2), (3, 5, 2), (3, 5)),
    "uniform": ((7, 2), (5, 2), None),
}


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_values_and_first_and_second_derivatives_match_the_plain_formula(name, monkeypatch):
    monkeypatch.setattr(weighted_fourier, "ROW_BLOCK_ELEMENTS", 30)  # blocks of 3 rows: 3, 3 and a partial 1
    gen = torch.Generator().manual_seed(0)
    x_shape, w_shape, lw_shape = SHAPES[name]
    inputs = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True)
              for s in (x_shape, w_shape, lw_shape) if s is not None]
    if lw_shape is None:
        inputs.append(None)
    probe = torch.randn(fourier_features(*inputs).shape, generator=gen, dtype=torch.float64)
    results = []
    for fn in (fourier_features, plain):
        out = fn(*inputs)
        differentiable = [t for t in inputs if t is not None]
        grads = torch.autograd.grad((out * probe).sum(), differentiable, create_graph=True)
        # second derivatives: a Hessian-vector product through every first derivative
        second = torch.autograd.grad(sum((g * g).sum() for g in grads), differentiable)
        results.append((out, grads, second))
    (out, grads, second), (ref, ref_grads, ref_second) = results
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
    for got, want in zip((*grads, *second), (*ref_grads, *ref_second)):
        assert got.shape == want.shape
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_weight_that_underflows_gives_zero_features_and_finite_gradients():
    x = torch.randn(4, 2, dtype=torch.float64, requires_grad=True)
    frequencies = torch.randn(3, 2, dtype=torch.float64)
    log_weights = torch.tensor([0.0, -2000.0, 1.0], dtype=torch.float64, requires_grad=True)  # e^{-1000} = 0
    out = fourier_features(x, frequencies, log_weights)
    assert torch.equal(out[:, [1, 4]], torch.zeros(4, 2, dtype=torch.float64))
    grads = torch.autograd.grad(out.sum(), (x, log_weights))
    ref = torch.autograd.grad(plain(x, frequencies, log_weights).sum(), (x, log_weights))
    for got, want in zip(grads, ref):
        assert torch.isfinite(got).all()
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_gradcheck_and_gradgradcheck():
    gen = torch.Generator().manual_seed(1)
    args = [torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True) for s in ((2, 4, 2), (3, 2), (2, 3))]
    torch.autograd.gradcheck(fourier_features, args)
    torch.autograd.gradgradcheck(fourier_features, args)


def test_float32_matches_the_plain_formula():
    gen = torch.Generator().manual_seed(2)
    args = [torch.randn(s, generator=gen).requires_grad_() for s in ((6, 2), (4, 2), (4,))]
    out, ref = fourier_features(*args), plain(*args)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-6)
    for got, want in zip(torch.autograd.grad(out.sum(), args), torch.autograd.grad(ref.sum(), args)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_weighted_features_are_one_custom_function():
    x, frequencies, log_weights = torch.randn(4, 2), torch.randn(3, 2), torch.randn(3)
    out = fourier_features(x.requires_grad_(), frequencies, log_weights)
    assert type(out.grad_fn).__name__ == "_WeightedSinCosFeaturesBackward"


def test_no_rows_give_empty_features_and_zero_weight_gradients():
    log_weights = torch.randn(3, dtype=torch.float64, requires_grad=True)
    out = fourier_features(torch.zeros(0, 2, dtype=torch.float64), torch.randn(3, 2, dtype=torch.float64), log_weights)
    assert out.shape == (0, 6)
    (grad,) = torch.autograd.grad(out.sum(), log_weights)
    assert torch.equal(grad, torch.zeros(3, dtype=torch.float64))


def test_the_amplitude_folded_into_the_pair_scales_is_sqrt_a_times_the_features():
    """log A passed to fourier_features: √A·Φ (values, first and second derivatives in A, w and x), unbatched A with
    batched weights and a batched A with unbatched weights."""
    gen = torch.Generator().manual_seed(3)
    for a_shape, lw_shape in (((), (2, 5)), ((2,), (5,)), ((2,), None)):
        x = torch.randn(7, 2, generator=gen, dtype=torch.float64, requires_grad=True)
        frequencies = torch.randn(5, 2, generator=gen, dtype=torch.float64)
        log_weights = None if lw_shape is None else torch.randn(lw_shape, generator=gen, dtype=torch.float64,
                                                                   requires_grad=True)
        amplitude = torch.rand(a_shape, generator=gen, dtype=torch.float64).add(0.5).requires_grad_()
        out = fourier_features(x, frequencies, log_weights, amplitude.log())
        ref = plain(x, frequencies, log_weights) * amplitude.sqrt().unsqueeze(-1).unsqueeze(-1)
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-13)
        leaves = [t for t in (x, log_weights, amplitude) if t is not None]
        probe = torch.randn(out.shape, generator=gen, dtype=torch.float64)
        pairs = []
        for value in (out, ref):
            grads = torch.autograd.grad((value * probe).sum(), leaves, create_graph=True)
            pairs.append((*grads, *torch.autograd.grad(sum((g * g).sum() for g in grads), leaves)))
        for got, want in zip(*pairs):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_forward_mode_matches_finite_differences_reverse_mode_and_vmap(name):
    """The Function's jvp (tangents in P and in the log pair scales, broadcast against the rows) against finite
    differences, reverse mode (jacfwd = jacrev) and its generated vmap rule; forward-over-reverse second derivatives
    (a forward-mode Hessian of a posterior): it had no jvp ("You must implement the jvp function")."""
    gen = torch.Generator().manual_seed(3)
    x_shape, w_shape, lw_shape = SHAPES[name]
    inputs = tuple(torch.randn(s, generator=gen, dtype=torch.float64, requires_grad=True)
                   for s in (x_shape, w_shape, lw_shape) if s is not None)

    def features(*args):
        return fourier_features(*args, *([None] if lw_shape is None else []))

    torch.autograd.gradcheck(features, inputs, check_forward_ad=True, check_batched_forward_grad=True)
    torch.autograd.gradgradcheck(features, inputs, check_fwd_over_rev=True)
    detached = tuple(t.detach() for t in inputs)
    arguments = tuple(range(len(inputs)))
    forward = torch.func.jacfwd(features, argnums=arguments)(*detached)
    for got, want in zip(forward, torch.func.jacrev(features, argnums=arguments)(*detached)):
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-14)
    if lw_shape is not None:  # a tangent in the log weights alone (the projection's is None in the jvp)
        tangent = torch.randn(lw_shape, generator=gen, dtype=torch.float64)
        with forward_ad.dual_level():
            dual = forward_ad.make_dual(detached[2], tangent)
            got = forward_ad.unpack_dual(fourier_features(*detached[:2], dual)).tangent
        want = torch.func.jvp(lambda lw: plain(*detached[:2], lw), (detached[2],), (tangent,))[1]
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-14)
