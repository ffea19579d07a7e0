"""BoTorch's DownsamplingKernel (exact features) and ExponentialDecayKernel (quadrature features) against BoTorch:
values, gradients of every hyperparameter, constraints/priors/batch/dims carried by rfgp.sketch, state_dict, dtypes,
and the inputs each refuses."""

import numpy as np
import pytest
import torch

botorch = pytest.importorskip("botorch")

from botorch.models.kernels.downsampling import DownsamplingKernel  # noqa: E402
from botorch.models.kernels.exponential_decay import ExponentialDecayKernel  # noqa: E402
from botorch.optim.utils.common import _handle_numerical_errors  # noqa: E402
from gpytorch.constraints import Interval  # noqa: E402
from gpytorch.priors import GammaPrior  # noqa: E402
from linear_operator.utils.errors import NanError  # noqa: E402

import rfgp  # noqa: E402
from rfgp.core.config_state import decode, encode  # noqa: E402
from rfgp.core.validation import DrawCoverageError  # noqa: E402
from rfgp.features import exponential_quadrature as quadrature  # noqa: E402
from rfgp.kernels import DownsamplingFeatureKernel, ExponentialDecayFeatureKernel  # noqa: E402
from tests._conversion_checks import assert_copied_constraint, assert_copied_prior  # noqa: E402

F64 = torch.float64
BATCH = torch.Size([2])


def _fidelities(n=7, d=1, dtype=F64, seed=0):
    x = torch.rand(2, n, d, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    x[:, 0] = 1.0  # the target fidelity, where (1 − x)^{1+δ} = 0
    x[:, 1] = 0.0
    return x


def _downsampling(dtype=F64, **kwargs):
    kernel = DownsamplingKernel(batch_shape=BATCH, offset_prior=GammaPrior(3.0, 6.0), power_prior=GammaPrior(3.0, 6.0),
                                **kwargs).to(dtype)
    kernel.power = torch.tensor([[0.3], [1.7]])
    kernel.offset = torch.tensor([[0.2], [0.05]])
    return kernel


def _decay(dtype=F64, **kwargs):
    kernel = ExponentialDecayKernel(batch_shape=BATCH, lengthscale_prior=GammaPrior(3.0, 6.0),
                                    offset_prior=GammaPrior(3.0, 6.0), power_prior=GammaPrior(3.0, 6.0),
                                    **kwargs).to(dtype)
    kernel.lengthscale = torch.tensor([[[0.08]], [[1.3]]])
    kernel.power = torch.tensor([[0.4], [2.2]])
    kernel.offset = torch.tensor([[0.3], [0.01]])
    return kernel


@pytest.mark.parametrize("d", [1, 2])
def test_downsampling_features_are_botorchs_matrix_exactly_with_its_gradients(d):
    exact = _downsampling()
    converted = rfgp.sketch(exact, 64)
    assert isinstance(converted, DownsamplingFeatureKernel)
    x1, x2 = _fidelities(d=d), _fidelities(5, d=d, seed=1)
    for args in ((x1, x1), (x1, x2)):
        expected, actual = exact(*args).to_dense(), converted(*args).to_dense()
        torch.testing.assert_close(actual, expected, rtol=1e-13, atol=1e-14)
        weights = torch.rand(expected.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        names = ("raw_power", "raw_offset")
        grads = torch.autograd.grad((actual * weights).sum(), [getattr(converted, n) for n in names])
        expected_grads = torch.autograd.grad((expected * weights).sum(), [getattr(exact, n) for n in names])
        for grad, expected_grad in zip(grads, expected_grads):
            assert torch.isfinite(grad).all()
            torch.testing.assert_close(grad, expected_grad, rtol=1e-12, atol=1e-13)
    assert converted.num_features == 1 + d
    if d == 1:  # BoTorch's diag path agrees with its matrix for one column (for several it does not)
        torch.testing.assert_close(converted(x1, diag=True), exact(x1, diag=True), rtol=1e-13, atol=1e-14)


def test_exponential_decay_features_match_botorch_to_1e_7_with_gradients():
    exact = _decay()
    converted = rfgp.sketch(exact, 64)
    assert isinstance(converted, ExponentialDecayFeatureKernel) and converted.num_features == 106
    x1, x2 = _fidelities(9), _fidelities(4, seed=1)
    for args in ((x1, x1), (x1, x2)):
        expected, actual = exact(*args).to_dense(), converted(*args).to_dense()
        torch.testing.assert_close(actual, expected, rtol=1e-7, atol=0)
        weights = torch.rand(expected.shape, generator=torch.Generator().manual_seed(2), dtype=F64)
        names = ("raw_lengthscale", "raw_power", "raw_offset")
        grads = torch.autograd.grad((actual * weights).sum(), [getattr(converted, n) for n in names])
        expected_grads = torch.autograd.grad((expected * weights).sum(), [getattr(exact, n) for n in names])
        for grad, expected_grad in zip(grads, expected_grads):
            torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)
    torch.testing.assert_close(converted(x1, diag=True), exact(x1, diag=True), rtol=1e-7, atol=0)


@pytest.mark.parametrize("build", [_downsampling, _decay])
def test_float32_follows_botorch(build):
    exact = build(torch.float32)
    converted = rfgp.sketch(exact, 64)
    x = _fidelities(dtype=torch.float32)
    actual = converted(x).to_dense()
    assert actual.dtype == torch.float32
    torch.testing.assert_close(actual, exact(x).to_dense(), rtol=2e-5, atol=1e-6)


@pytest.mark.parametrize("build, names", [(_downsampling, ("power", "offset")),
                                          (_decay, ("lengthscale", "power", "offset"))])
def test_sketch_carries_constraints_priors_batch_and_dims(build, names):
    constraint = Interval(1e-3, 10.0)
    exact = build(offset_constraint=constraint, active_dims=[3])
    converted = rfgp.sketch(exact, 64)
    assert converted.batch_shape == BATCH and torch.equal(converted.active_dims, exact.active_dims)
    assert_copied_constraint(converted.raw_offset_constraint, constraint)
    priors = {name: (prior, closure) for name, _, prior, closure, _ in converted.named_priors()}
    assert set(priors) == {f"{name}_prior" for name in names}
    for name in names:
        assert_copied_constraint(getattr(converted, f"raw_{name}_constraint"), getattr(exact, f"raw_{name}_constraint"))
        prior, closure = priors[f"{name}_prior"]
        assert_copied_prior(prior, getattr(exact, f"{name}_prior"))
        torch.testing.assert_close(closure(converted), getattr(exact, name))
    x = torch.rand(5, 4, dtype=F64)
    torch.testing.assert_close(converted(x).to_dense(), exact(x).to_dense(), rtol=1e-7, atol=0)


@pytest.mark.parametrize("build", [_downsampling, _decay])
def test_state_dict_of_the_exact_kernel_loads_and_the_converted_one_round_trips(build):
    exact = build()
    converted = rfgp.sketch(build(), 64)  # built at other values, then loaded
    with torch.no_grad():
        for parameter in converted.parameters():
            parameter.add_(0.5)
    result = converted.load_state_dict(exact.state_dict(), strict=False)
    assert not result.unexpected_keys
    x = _fidelities()
    torch.testing.assert_close(converted(x).to_dense(), exact(x).to_dense(), rtol=1e-7, atol=0)
    fresh = rfgp.sketch(build(), 64)
    fresh.load_state_dict(converted.state_dict())  # strict: configuration and every hyperparameter
    assert torch.equal(fresh.featurize(x), converted.featurize(x))


def test_downsampling_refuses_fidelities_above_one():
    kernel = rfgp.sketch(_downsampling(), 64)
    x = _fidelities()
    x[1, 3, 0] = 1.25
    with pytest.raises(ValueError, match=r"data-fidelity inputs of DownsamplingKernel must be ≤ 1.*index \(1, 3, 0\)"
                                         r": 1.25.*NaN for x > 1"):
        kernel(x).to_dense()


def test_exponential_decay_refuses_what_its_features_do_not_cover():
    kernel = rfgp.sketch(_decay(), 64)
    with pytest.raises(ValueError, match="one input column.*got 2"):
        kernel(torch.rand(4, 2, dtype=F64)).to_dense()
    with pytest.raises(ValueError, match=r"inputs of ExponentialDecayKernel must be ≥ 0.*-0.5"):
        kernel(torch.tensor([[0.2], [-0.5]], dtype=F64)).to_dense()
    with pytest.raises(DrawCoverageError, match=r"decay x/lengthscale .* must be ≤ 5000"):
        kernel(torch.tensor([[0.2], [500.0]], dtype=F64)).to_dense()
    kernel.power = torch.tensor([[0.5], [13.0]])
    with pytest.raises(DrawCoverageError, match=r"power α must be ≤ 12, got 1 entries .*: 13.*covers α ≤ 12"):
        kernel(torch.tensor([[0.2]], dtype=F64)).to_dense()


def test_out_of_range_trial_points_are_a_nan_error_for_botorchs_optimiser():
    """BoTorch's scipy closure turns linear_operator's NanError into a NaN loss (a failed line-search trial)."""
    assert issubclass(DrawCoverageError, NanError) and issubclass(DrawCoverageError, ValueError)
    kernel = rfgp.sketch(_decay(), 64)
    kernel.power = torch.tensor([[0.5], [1e4]])
    try:
        kernel(torch.tensor([[0.2]], dtype=F64)).to_dense()
    except RuntimeError as error:
        value, grad = _handle_numerical_errors(error, x=np.zeros(3))
    assert np.isnan(value) and np.isnan(grad).all()


def test_powers_up_to_12_match_botorch_to_1e_7_with_gradients():
    exact = _decay()
    exact.power = torch.tensor([[6.5], [11.9]])
    converted = rfgp.sketch(exact, 64)
    x = _fidelities(9)
    x[0, 2:, 0] = torch.linspace(0, 400 * 0.08, 7, dtype=F64)  # (x + x')/β up to 800
    expected, actual = exact(x).to_dense(), converted(x).to_dense()
    torch.testing.assert_close(actual, expected, rtol=1e-7, atol=0)
    names = ("raw_lengthscale", "raw_power", "raw_offset")
    grads = torch.autograd.grad(actual.sum(), [getattr(converted, n) for n in names])
    expected_grads = torch.autograd.grad(expected.sum(), [getattr(exact, n) for n in names])
    for grad, expected_grad in zip(grads, expected_grads):
        torch.testing.assert_close(grad, expected_grad, rtol=1e-6, atol=1e-9)


def test_the_quadrature_rule_is_saved_a_different_one_refused_and_a_state_without_it_loads():
    converted = rfgp.sketch(_decay(), 64)
    state = converted.state_dict()
    rule = "trapezoid in log t: h=0.25, u0=-22.0, umax=4.0"
    assert decode(state["config_quadrature_rule"]) == quadrature.RULE == rule
    fresh = rfgp.sketch(_decay(), 64)
    fresh.load_state_dict(state)  # strict
    other = dict(state, config_quadrature_rule=encode("trapezoid in log t: h=0.35, u0=-22.0, umax=3.5"))
    with pytest.raises(ValueError, match=r"quadrature_rule is 'trapezoid in log t: h=0.35.*' in the state dict but "
                                         r"'trapezoid in log t: h=0.25"):
        fresh.load_state_dict(other)
    older = {key: value for key, value in state.items() if key != "config_quadrature_rule"}
    fresh.load_state_dict(older)  # strict: saved before the rule was recorded (its hyperparameters mean the same)
    x = _fidelities()
    assert torch.equal(fresh.featurize(x), converted.featurize(x))
