"""Kernel calls follow torch type promotion as GPyTorch's kernels do (rfgp.core.dtypes).

A float32 kernel on float64 inputs computes in and returns float64 with the values of the same
kernel after ``.double()``; a float64 kernel on float32 inputs returns float64; x1 and x2 of
different dtypes promote too.  Calls never change ``state_dict()``.
"""

from __future__ import annotations

import copy

import gpytorch
import pytest
import torch

import rfgp
from rfgp import kernels as K

from ._models import UserGP

F32, F64 = torch.float32, torch.float64
D = 2


def _rbf_tree():
    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()) + gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.MaternKernel(nu=1.5))


#: name -> (builder of a float32 kernel, kind of inputs); one representative of every family
BUILDERS = {
    "rff": (lambda: K.SketchedRBFKernel(32, "rff", input_dim=D, seed=0), "points"),
    "orf": (lambda: K.SketchedRBFKernel(32, "orf", input_dim=D, seed=0), "points"),
    "sorf": (lambda: K.SketchedRBFKernel(32, "sorf", input_dim=D, seed=0), "points"),
    "matern": (lambda: K.SketchedMaternKernel(32, nu=1.5, input_dim=D, seed=0), "points"),
    "maclaurin_default": (lambda: K.SketchedRBFKernel(32, "maclaurin", input_dim=D, seed=0), "points"),
    "maclaurin_optimized_real": (
        lambda: K.MaclaurinRBFKernel(32, input_dim=D, seed=0, weights="real", max_order=4), "points"),
    "polynomial_real": (lambda: K.SketchedPolynomialKernel(2, 32, weights="real", input_dim=D, seed=0), "points"),
    "polynomial_complex": (
        lambda: K.SketchedPolynomialKernel(2, 32, weights="complex", complex_posterior=True, input_dim=D, seed=0),
        "points"),
    "polynomial_ctr": (lambda: K.SketchedPolynomialKernel(2, 32, weights="ctr", input_dim=D, seed=0), "points"),
    "gaussian_sketch": (
        lambda: K.SketchedRBFKernel(32, "gaussian_sketch", order=3, center=[0.1, 0.2], input_dim=D, seed=0), "points"),
    "spherical": (lambda: K.SketchedSphericalPolynomialKernel(2, 32, input_dim=D, seed=0), "unit"),
    "spherical_complex": (
        lambda: K.SketchedSphericalPolynomialKernel(2, 32, method="srf_orth_complex", input_dim=D, seed=0), "unit"),
    "periodic": (lambda: K.SketchedPeriodicKernel(32, seed=0, ard_num_dims=D), "points"),
    "spectral_mixture": (lambda: K.SketchedSpectralMixtureKernel(2, 32, ard_num_dims=D, seed=0), "points"),
    "categorical": (lambda: K.SketchedCategoricalKernel(32, ard_num_dims=D, seed=0), "categories"),
    "curl_free": (lambda: K.SketchedCurlFreeKernel(32, input_dim=D, seed=0), "points"),
    "div_free": (lambda: K.SketchedDivFreeKernel(32, input_dim=D, seed=0), "points"),
    "decomposable": (lambda: K.SketchedDecomposableKernel(K.SketchedRBFKernel(16, input_dim=D, seed=0), D), "points"),
    "derivative": (lambda: K.SketchedRBFKernelGrad(32, input_dim=D, seed=0), "points"),
    "nystrom": (lambda: K.NystromKernel(gpytorch.kernels.RBFKernel(),
                                        torch.randn(4, D, generator=torch.Generator().manual_seed(3))), "points"),
    "sketch_sum": (lambda: rfgp.sketch(_rbf_tree(), num_features=32, seed=0), "points"),
    "sketch_product": (lambda: rfgp.sketch(gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel() * gpytorch.kernels.PeriodicKernel()), num_features=32, seed=0), "points"),
    "sketch_product_polynomial": (lambda: rfgp.sketch(gpytorch.kernels.ScaleKernel(
        gpytorch.kernels.RBFKernel() * gpytorch.kernels.PolynomialKernel(2)), num_features=32, seed=0), "points"),
    "scaled_rff": (lambda: gpytorch.kernels.ScaleKernel(K.SketchedRBFKernel(32, input_dim=D, seed=0)), "points"),
    "spectral_delta": (lambda: K.SpectralDeltaFeatureKernel(D, 16, ard_num_dims=D, seed=0), "points"),
    "arc": (lambda: K.SketchedArcKernel(K.SketchedMaternKernel(32, nu=2.5, input_dim=2 * D, seed=0),
                                        ard_num_dims=D), "points"),
    "newton_girard": (lambda: K.SketchedNewtonGirardAdditiveKernel(gpytorch.kernels.RBFKernel(ard_num_dims=D), D, 32,
                                                                   seed=0), "points"),
}


def _inputs(kind: str, n: int, seed: int, dtype=F64) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if kind == "categories":
        return torch.randint(0, 3, (n, D), generator=generator).to(dtype)
    x = torch.randn(n, D, dtype=F64, generator=generator) * 0.5
    if kind == "unit":
        x = torch.nn.functional.normalize(x, dim=-1)
    return x.to(dtype)


def _dense(output) -> torch.Tensor:
    return output.to_dense() if hasattr(output, "to_dense") else output


def _state(module) -> dict[str, torch.Tensor]:
    return {name: value.clone() for name, value in module.state_dict().items()}


def _assert_same_state(before, after):
    assert before.keys() == after.keys()
    for name in before:
        assert before[name].dtype == after[name].dtype and torch.equal(before[name], after[name]), name


def _close(actual, expected):
    assert actual.dtype == expected.dtype
    scale = expected.abs().max().clamp_min(1e-12)
    assert float((actual - expected).abs().max().detach() / scale.detach()) < 1e-6


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_float32_kernel_on_float64_inputs_returns_float64_like_double(name):
    build, kind = BUILDERS[name]
    kernel = build()
    assert rfgp.core.validation.module_dtype(kernel) == F32
    x, y = _inputs(kind, 6, 0), _inputs(kind, 4, 1)
    kernel(x.float()).to_dense()  # fits what is fitted at the first call (Maclaurin allocation, lazy draws)
    before = _state(kernel)
    reference = copy.deepcopy(kernel).double()
    y32 = y.float()
    if kind == "unit":  # a float32 unit row promoted is projected back onto the sphere
        y32_as_64 = torch.nn.functional.normalize(y32.double(), dim=-1)
    else:
        y32_as_64 = y32.double()
    calls = [((x,), {}, (x,)), ((x, y), {}, (x, y)), ((x,), {"diag": True}, (x,)), ((x, y32), {}, (x, y32_as_64))]
    for args, kwargs, reference_args in calls:
        output = _dense(kernel(*args, **kwargs))
        assert output.dtype == F64
        _close(output, _dense(reference(*reference_args, **kwargs)))
    _assert_same_state(before, _state(kernel))


@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_float64_kernel_on_float32_inputs_returns_float64(name):
    build, kind = BUILDERS[name]
    kernel = build().double()
    x, y = _inputs(kind, 6, 0, F32), _inputs(kind, 4, 1, F32)
    kernel(_inputs(kind, 6, 0)).to_dense()  # fits what is fitted at the first call
    before = _state(kernel)
    output = _dense(kernel(x, y))
    assert output.dtype == F64
    if kind != "unit":
        _close(output, _dense(kernel(x.double(), y.double())))
    assert _dense(kernel(x, diag=True)).dtype == F64
    _assert_same_state(before, _state(kernel))


@pytest.mark.parametrize("name", ["maclaurin_default", "sketch_sum", "periodic"])
def test_first_call_in_float64_keeps_the_draws_in_the_kernels_dtype(name):
    """What a first call fits (allocation, lazily drawn frequencies) is stored in the module's dtype."""
    if name == "maclaurin_default":
        kernel = K.SketchedRBFKernel(32, "maclaurin", seed=0)  # lazy: input_dim and allocation from the call
    else:
        kernel = BUILDERS[name][0]()
    x = _inputs("points", 6, 0)
    output = kernel(x).to_dense()
    assert output.dtype == F64
    floats = {v.dtype for k, v in kernel.state_dict().items() if v.is_floating_point() and "config_" not in k
              and "center" not in k}  # the Gaussian sketch keeps its centre in float64 by design
    assert floats == {F32}
    _close(output, copy.deepcopy(kernel).double()(x).to_dense())


def test_gradients_reach_the_float32_parameters():
    kernel = gpytorch.kernels.ScaleKernel(K.SketchedRBFKernel(32, input_dim=D, seed=0))
    kernel(_inputs("points", 5, 0)).to_dense().sum().backward()
    for parameter in kernel.parameters():
        assert parameter.dtype == F32 and parameter.grad is not None and parameter.grad.dtype == F32


def test_gpytorch_exact_kernel_has_the_same_dtype_rule():
    """The reference behaviour: GPyTorch's exact kernels promote the same way."""
    x = _inputs("points", 5, 0)
    for exact, sketched in ((gpytorch.kernels.RBFKernel(), K.SketchedRBFKernel(32, input_dim=D, seed=0)),):
        assert exact(x).to_dense().dtype == sketched(x).to_dense().dtype == F64
        assert exact.double()(x.float()).to_dense().dtype == sketched.double()(x.float()).to_dense().dtype == F64


def test_unsupported_dtypes_still_raise():
    kernel = K.SketchedRBFKernel(32, input_dim=D, seed=0)
    x = _inputs("points", 3, 0)
    with pytest.raises(TypeError, match="float16"):
        kernel(x.half()).to_dense()
    with pytest.raises(TypeError, match="bfloat16"):
        kernel(x, x.bfloat16()).to_dense()
    with pytest.raises(TypeError, match="int64"):
        kernel(x.round().long()).to_dense()
    with pytest.raises(TypeError, match="complex"):
        kernel(x.to(torch.complex128)).to_dense()


def test_promoted_unit_rows_are_checked_to_their_own_precision():
    kernel = K.SketchedSphericalPolynomialKernel(2, 32, input_dim=D, seed=0).double()
    x32 = _inputs("unit", 5, 0, F32)
    assert kernel(x32).to_dense().dtype == F64
    with pytest.raises(ValueError, match="unit sphere"):
        kernel(x32 * 1.001).to_dense()


def test_streaming_statistics_refuse_another_dtype_and_say_why():
    model = rfgp.StreamingFeatureGP(gpytorch.kernels.ScaleKernel(K.SketchedRBFKernel(32, input_dim=D, seed=0)),
                                    gpytorch.likelihoods.GaussianLikelihood())
    x = _inputs("points", 5, 0)
    with pytest.raises(TypeError, match="accumulate in the model's dtype"):
        model.update(x, x.sum(-1))
    model.update(x.float(), x.float().sum(-1))
    with pytest.raises(TypeError, match="sums kept in one dtype"):
        model.update(x, x.sum(-1))


# --------------------------------------------------------------------------- end to end
def _train_step_and_predict(model, x, y, x_test):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    loss = -mll(model(x), y)
    loss.backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        prediction = model.likelihood(model(x_test))
    return loss.detach(), prediction.mean, prediction.variance


@pytest.mark.parametrize("own", [True, False], ids=["rfgp_model", "user_exact_gp"])
@pytest.mark.parametrize("method", ["rff", "maclaurin"])
def test_exact_gp_with_float32_modules_and_float64_data(own, method):
    x = _inputs("points", 30, 0)
    y = torch.sin(3 * x).sum(-1)
    x_test = _inputs("points", 7, 1)
    kernel = gpytorch.kernels.ScaleKernel(K.SketchedRBFKernel(64, method, input_dim=D, seed=0))
    if own:
        model = rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel)
    else:
        model = UserGP(x, y, kernel)
    reference = copy.deepcopy(model).double()
    results = _train_step_and_predict(model, x, y, x_test)
    expected = _train_step_and_predict(reference, x, y, x_test)
    for result, value in zip(results, expected):
        assert result.dtype == F64
        torch.testing.assert_close(result, value, rtol=1e-5, atol=1e-6)
    assert {p.dtype for p in model.parameters()} == {F32}


def test_botorch_variational_gp_with_a_float32_rfgp_kernel_and_float64_data():
    pytest.importorskip("botorch")
    from botorch.models import SingleTaskVariationalGP

    torch.manual_seed(0)
    x = _inputs("points", 20, 0)
    y = torch.sin(3 * x).sum(-1, keepdim=True)
    x_test = _inputs("points", 4, 1)

    def fit_and_predict(covar_module):
        assert rfgp.core.validation.module_dtype(covar_module) == F32
        model = SingleTaskVariationalGP(x, y, covar_module=covar_module, inducing_points=6)
        mll = gpytorch.mlls.VariationalELBO(model.likelihood, model.model, num_data=x.shape[0])
        optimizer = torch.optim.Adam(mll.parameters(), lr=0.05)
        model.train()
        for _ in range(3):
            optimizer.zero_grad()
            loss = -mll(model(x), y.squeeze(-1))
            loss.backward()
            optimizer.step()
        model.eval()
        posterior = model.posterior(x_test)
        return loss.dtype, posterior.mean.dtype, posterior.variance.dtype, posterior.mean.shape

    exact = fit_and_predict(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()))
    sketched = fit_and_predict(gpytorch.kernels.ScaleKernel(K.SketchedRBFKernel(64, input_dim=D, seed=0)))
    converted = fit_and_predict(rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()),
                                            num_features=64, seed=0))
    assert exact == sketched == converted == (F64, F64, F64, torch.Size([4, 1]))
