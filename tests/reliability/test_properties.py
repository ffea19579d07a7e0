"""Property-based fuzzing: for generated shapes, dtypes, sizes and non-finite patterns, every public
kernel, feature map, model and utility returns a correct finite result or raises a clear
``ValueError``/``TypeError`` — never a NaN, never an input modified in place.

Seeded and bounded (``derandomize=True``, a few dozen examples per property) so that the file
runs in well under a minute on one core.
"""

from __future__ import annotations

import math

import gpytorch
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rfgp
from rfgp import metrics
from rfgp.applications import distances

from ._builders import (
    FEATURE_MAPS,
    SCALAR_KERNELS,
    VECTOR_KERNELS,
    D,
    mll_value,
    multioutput_model,
    predict,
    regression_model,
    streaming_model,
)

FUZZ = settings(max_examples=25, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
SUPPORTED = (torch.float32, torch.float64)
DTYPES = st.sampled_from([torch.float64, torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.complex64])
PATTERNS = st.sampled_from(["finite", "finite", "nan", "inf", "-inf"])


@st.composite
def tensors(draw, rows=st.integers(0, 5), cols=st.just(D), batch=st.sampled_from([(), (2,)]), dtype=DTYPES,
            pattern=PATTERNS, unit=False):
    """A (*batch, n, d) tensor of the drawn dtype with an optional non-finite entry."""
    shape = (*draw(batch), draw(rows), draw(cols))
    seed = draw(st.integers(0, 2**16))
    x = torch.randn(shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed)) * 0.5
    if unit and x.numel():
        x = torch.nn.functional.normalize(x, dim=-1)
    kind = draw(pattern)
    if kind != "finite" and x.numel():
        flat = x.view(-1)
        flat[draw(st.integers(0, flat.numel() - 1))] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[kind]
    target = draw(dtype)
    return x.to(target) if target != torch.int64 else x.nan_to_num(0.0, 0.0, 0.0).round().to(target)


def _nonfinite(*tensors: torch.Tensor) -> bool:
    return any(t.is_floating_point() or t.is_complex() for t in tensors) and any(
        not bool(torch.isfinite(t).all()) for t in tensors if t.is_floating_point() or t.is_complex()
    )


def outcome(call, *inputs, error_types=(ValueError, TypeError)):
    """Run ``call``; check inputs are untouched and the result is finite unless a clear error was raised."""
    snapshots = [t.clone() for t in inputs]
    try:
        result = call()
    except error_types as error:
        assert str(error), "an error without a message"
        result = error
    for before, after in zip(snapshots, inputs):
        assert before.dtype == after.dtype and before.shape == after.shape
        assert torch.equal(before.nan_to_num(), after.nan_to_num()) and torch.equal(before.isnan(), after.isnan()), \
            "an input was modified in place"
    if isinstance(result, Exception):
        return result
    for tensor in _flatten(result):
        assert torch.isfinite(tensor).all(), "a silent NaN/Inf"
    return result


def _flatten(result):
    if torch.is_tensor(result):
        return [result]
    if hasattr(result, "to_dense"):
        return [result.to_dense()]
    if isinstance(result, (tuple, list)):
        return [t for item in result for t in _flatten(item)]
    return []


def _must_fail(*inputs: torch.Tensor) -> type | None:
    """The error type an input set must raise: TypeError for unsupported dtypes, ValueError for NaN/Inf."""
    if any(t.dtype not in SUPPORTED for t in inputs):
        return TypeError
    if _nonfinite(*inputs):
        return ValueError
    return None


def _check(expected, result):
    """``expected``: ``None`` (a finite result) or the error type(s) the inputs must raise."""
    if expected is None:
        assert not isinstance(result, Exception), f"unexpected error: {result!r}"
    else:
        assert isinstance(result, expected), f"expected {expected}, got {result!r}"


# --------------------------------------------------------------------------- feature maps
@pytest.mark.parametrize("name", sorted(FEATURE_MAPS))
@FUZZ
@given(data=st.data())
def test_feature_maps(name, data):
    build, unit = FEATURE_MAPS[name]
    x = data.draw(tensors(unit=unit, rows=st.integers(2 if name == "optimized_maclaurin" else 0, 5)))
    feature_map = build()
    if x.dtype in SUPPORTED:
        feature_map = feature_map.to(x.dtype)
    result = outcome(lambda: feature_map(x), x)
    _check(_must_fail(x), result)
    if not isinstance(result, Exception):
        assert result.shape == (*x.shape[:-1], feature_map.num_features) and result.dtype == x.dtype


# --------------------------------------------------------------------------- kernels
@pytest.mark.parametrize("name", sorted(SCALAR_KERNELS) + sorted(VECTOR_KERNELS))
@FUZZ
@given(data=st.data())
def test_kernels(name, data):
    build, unit = SCALAR_KERNELS.get(name, (VECTOR_KERNELS.get(name), False))
    rows = st.integers(2 if name in ("rbf_maclaurin", "exponential") else 0, 4)
    x1 = data.draw(tensors(unit=unit, rows=rows, batch=st.just(())))
    mixed = data.draw(st.booleans())
    x2 = data.draw(tensors(unit=unit, rows=rows, batch=st.just(()))) if mixed else x1
    model_dtype = data.draw(st.sampled_from(SUPPORTED))
    kernel = build().to(model_dtype)
    result = outcome(lambda: kernel(x1, x2).to_dense(), x1, x2)
    active = (lambda x: x[..., :1]) if name == "cosine_features" else (lambda x: x)  # active_dims=[0]
    expected = _must_fail(active(x1), active(x2))
    _check(expected, result)
    if expected is None:  # float32 and float64 meet under torch type promotion, as in GPyTorch
        assert result.dtype == torch.promote_types(torch.promote_types(x1.dtype, x2.dtype), model_dtype)


@pytest.mark.parametrize("name", ["rbf_rff", "matern", "random_feature", "polynomial"])
@FUZZ
@given(value=st.floats(allow_nan=True, allow_infinity=True, width=64) | st.sampled_from([0.0, -0.0, -1.0]))
def test_hyperparameter_setters(name, value):
    kernel = SCALAR_KERNELS[name][0]().double()
    attribute = "offset" if name == "polynomial" else "lengthscale"
    floor = 0.0 if attribute == "offset" else 1e-300  # an offset of 0 is valid, a lengthscale of 0 is not
    try:
        setattr(kernel, attribute, value)
    except ValueError as error:
        assert attribute in str(error)
        assert not (math.isfinite(value) and value >= floor and value < 1e300)
        return
    assert math.isfinite(value) and value >= 0
    x = torch.randn(3, D, dtype=torch.float64)
    out = outcome(lambda: kernel(x).to_dense(), x)
    assert isinstance(out, Exception) or torch.isfinite(out).all()


# --------------------------------------------------------------------------- models
@FUZZ
@given(x=tensors(rows=st.integers(0, 6), batch=st.just(()), dtype=st.sampled_from(SUPPORTED)),
       y_pattern=PATTERNS, test=tensors(rows=st.integers(1, 3), batch=st.just(()), cols=st.integers(1, 3)),
       own=st.booleans())
def test_regression_models(x, y_pattern, test, own):
    y = torch.sin(x.sum(-1)) if x.numel() else x.new_zeros(x.shape[0])
    if y_pattern != "finite" and y.numel():
        y[0] = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}[y_pattern]
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, input_dim=D, seed=0))

    def fit_and_predict():
        model = regression_model(x, y, kernel=kernel, own=own, dtype=x.dtype)
        value = mll_value(model)
        return value, *predict(model, test)

    errors = (ValueError, TypeError) if own else (ValueError, TypeError, RuntimeError)
    result = outcome(fit_and_predict, x, y, test, error_types=errors)
    if isinstance(result, RuntimeError):
        # only GPyTorch's own ExactGP checks, ahead of rfgp: NaN training inputs, mismatched test dimension
        assert not own and (_nonfinite(x) or test.shape[-1] != D), result
        return
    bad = x.shape[0] == 0 or _nonfinite(x, y) or (own and _must_fail(test) is not None) or test.shape[-1] != D
    if own and test.dtype in SUPPORTED and test.dtype != x.dtype:
        bad = True
    if not bad and not own and test.dtype not in SUPPORTED + (torch.float16, torch.bfloat16):
        bad = True  # integer/complex test inputs meet rfgp's dtype check after GPyTorch's concatenation
    if not bad and not own and _nonfinite(test):
        bad = True
    _check(ValueError if bad and not isinstance(result, TypeError) else (TypeError if bad else None), result)


@FUZZ
@given(batches=st.lists(st.tuples(tensors(rows=st.integers(0, 4), batch=st.just(()),
                                          dtype=st.sampled_from([torch.float64, torch.float64, torch.float32])),
                                  PATTERNS), min_size=1, max_size=3))
def test_streaming(batches):
    gp = streaming_model()
    inputs, dtype, expect_error = [], torch.float64, False
    for x, pattern in batches:
        y = torch.cos(x.sum(-1))
        if pattern != "finite" and y.numel():
            y[-1] = math.nan if pattern == "nan" else math.inf
        inputs += [x, y]
        expect_error |= x.dtype != dtype or _nonfinite(x, y)  # an empty batch is a no-op, checked as any other

    def stream():
        for x, y in zip(inputs[::2], inputs[1::2]):
            gp.update(x, y)
        return gp.log_marginal_likelihood(), gp(torch.zeros(2, D, dtype=torch.float64)).mean

    result = outcome(stream, *inputs, error_types=(ValueError, TypeError, RuntimeError))
    no_data = all(x.shape[0] == 0 for x in inputs[::2])  # only empty batches: no posterior yet, said so by name
    _check((ValueError, TypeError) if expect_error else RuntimeError if no_data else None, result)


@FUZZ
@given(x=tensors(rows=st.integers(0, 5), batch=st.just(()), dtype=st.sampled_from(SUPPORTED)), pattern=PATTERNS,
       kernel=st.sampled_from(["curl_free", "div_free", "decomposable"]))
def test_multioutput_model(x, pattern, kernel):
    x = x.double()
    y = torch.stack((torch.sin(x[:, 0]), torch.cos(x[:, 1])), -1) if x.numel() else x.new_zeros(0, D)
    if pattern != "finite" and y.numel():
        y[0, 1] = math.nan if pattern == "nan" else -math.inf

    def fit():
        model = multioutput_model(x, y, VECTOR_KERNELS[kernel]())
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        value = mll(model(x), y)
        model.eval()
        with torch.no_grad():
            return value, model(torch.zeros(2, D, dtype=torch.float64)).mean

    result = outcome(fit, x, y)
    _check(ValueError if x.shape[0] == 0 or _nonfinite(x, y) else None, result)


# --------------------------------------------------------------------------- utilities
@FUZZ
@given(p=tensors(rows=st.integers(0, 5), batch=st.just(())), q=tensors(rows=st.integers(0, 5), batch=st.just(())))
def test_kernel_distance(p, q):
    feature_map = FEATURE_MAPS["rff"][0]().double()
    result = outcome(lambda: distances.kernel_distance(feature_map, p, q), p, q)
    problems = {_must_fail(p, q)} - {None}
    if p.shape[0] == 0 or q.shape[0] == 0:
        problems.add(ValueError)
    if p.dtype != q.dtype or p.dtype != torch.float64:
        problems.add(TypeError)
    _check(tuple(problems) or None, result)


@FUZZ
@given(mean=tensors(rows=st.just(1), cols=st.integers(1, 5), batch=st.just(())), scale=st.floats(-1.0, 2.0),
       pattern=PATTERNS)
def test_gaussian_metrics(mean, scale, pattern):
    mean = mean[0]
    variance = torch.full_like(mean, scale) if mean.dtype in SUPPORTED else torch.ones(mean.shape)
    targets = mean + 0.5 if mean.dtype in SUPPORTED else torch.ones(mean.shape)
    result = outcome(lambda: (metrics.gaussian_mnll(mean, variance, targets),
                              metrics.gaussian_kl_divergence(mean, variance.abs() + 0.1, targets, variance.abs() + 0.2)),
                     mean, variance, targets)
    expected = _must_fail(mean, variance, targets)
    if expected is None and scale <= 0:
        expected = ValueError
    _check(expected, result)


@FUZZ
@given(logits=tensors(rows=st.integers(1, 6), cols=st.integers(2, 4), batch=st.just(()), dtype=st.sampled_from(SUPPORTED)),
       shift=st.integers(-1, 1))
def test_classification_metrics(logits, shift):
    probs = torch.softmax(logits, -1)
    labels = (torch.arange(probs.shape[0]) + shift) % probs.shape[1] if shift >= 0 else torch.arange(probs.shape[0]) - 1
    result = outcome(lambda: (metrics.classification_error(probs, labels), metrics.mean_negative_log_likelihood(probs, labels),
                              metrics.expected_calibration_error(probs, labels)), probs, labels)
    _check(ValueError if _nonfinite(probs) or bool((labels < 0).any()) else None, result)


@FUZZ
@given(labels=st.lists(st.integers(-1, 4), min_size=0, max_size=8), num_classes=st.integers(1, 4))
def test_dirichlet_labels(labels, num_classes):
    targets = torch.tensor(labels, dtype=torch.long)
    result = outcome(lambda: rfgp.likelihoods.DirichletClassificationLikelihood(targets, num_classes=num_classes)
                     .transformed_targets, targets)
    valid = bool(labels) and min(labels) >= 0 and max(labels) < num_classes and num_classes >= 2
    _check(None if valid else ValueError, result)


@FUZZ
@given(x=tensors(rows=st.integers(1, 5), batch=st.just(())), pattern=PATTERNS,
       likelihood=st.sampled_from(["Gaussian", "StudentT", "Poisson", "Bernoulli"]))
def test_pyro_model(x, pattern, likelihood):
    import pyro

    from rfgp import pyro as rpyro

    counts = likelihood in ("Poisson", "Bernoulli")
    y = x.real.double().sum(-1).nan_to_num(0.0, 0.0, 0.0).abs().round().clamp_max(1 if likelihood == "Bernoulli" else 9)
    if not counts:
        y = y + 0.5
    if pattern != "finite":
        y[0] = math.nan if pattern == "nan" else math.inf
    model = rpyro.RandomFeatureGP(FEATURE_MAPS["rff"][0]().double(), getattr(rpyro, likelihood)())
    pyro.set_rng_seed(0)
    result = outcome(lambda: pyro.poutine.trace(model).get_trace(x, y).log_prob_sum(), x, y)
    problems = {_must_fail(x)} - {None}
    if x.dtype in SUPPORTED and x.dtype != torch.float64:
        problems.add(TypeError)  # the draws are float64; a float32 x meets them in one product
    if pattern != "finite":
        problems.add(ValueError)
    if problems and not isinstance(result, Exception):
        # a float32 x is accepted by Pyro's model (its draws follow the input), nothing else may pass
        assert problems == {TypeError} and x.dtype == torch.float32, result
        return
    _check(tuple(problems) or None, result)


@FUZZ
@given(x=tensors(rows=st.integers(0, 4), batch=st.just(())), kernel=st.sampled_from(["curl_free", "div_free"]))
def test_vector_fields(x, kernel):
    field = rfgp.applications.vector_fields.prior_field_samples(VECTOR_KERNELS[kernel]().double(), 2, anchors=torch.zeros(1, D,
                                                   dtype=torch.float64), generator=torch.Generator().manual_seed(0))
    result = outcome(lambda: (rfgp.applications.vector_fields.divergence(field, x), rfgp.applications.vector_fields.curl(field, x)), x)
    problems = {_must_fail(x)} - {None}
    if x.dtype in SUPPORTED and x.dtype != torch.float64:
        problems.add(TypeError)
    _check(tuple(problems) or None, result)
