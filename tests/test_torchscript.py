"""TorchScript export of trained rfgp models (GPyTorch's "TorchScript_Exact_Models" recipe).

The recipe: evaluate the model once (the posterior caches are computed and stored), trace a wrapper
returning ``(mean, variance)`` under ``fast_pred_var`` and ``trace_mode``, save, load.  The caches
enter the trace as constants; the test features are traced, so the saved module must contain no
Python autograd.Function (rfgp's fused Functions fall back to plain torch when tracing).
"""

import warnings

import gpytorch
import pytest
import torch
from gpytorch import kernels as K

import rfgp
from rfgp.inference.chunking import Featurizer, chunked_feature_statistics
from rfgp.inference.kernel_space import kernel_space_inv_quad_logdet
from rfgp.inference.linalg import feature_statistics
from rfgp.inference.prediction import operator_variance_correction
from rfgp.inference.triangular_statistics import (
    TriangularFeaturizer,
    chunked_triangular_statistics,
    triangular_features,
    triangular_statistics,
)

NUM_FEATURES = 32

KERNELS = {
    "rbf-rff": lambda x: rfgp.sketch(K.ScaleKernel(K.RBFKernel()), NUM_FEATURES, seed=0),
    "rbf-orf": lambda x: rfgp.sketch(K.ScaleKernel(K.RBFKernel()), NUM_FEATURES, method="orf", seed=0),
    "rbf-sorf": lambda x: rfgp.sketch(K.ScaleKernel(K.RBFKernel()), NUM_FEATURES, method="sorf", seed=0),
    "matern52": lambda x: rfgp.sketch(K.ScaleKernel(K.MaternKernel(nu=2.5)), NUM_FEATURES, seed=0),
    "periodic": lambda x: rfgp.sketch(K.ScaleKernel(K.PeriodicKernel()), NUM_FEATURES, seed=0),
    "rq": lambda x: rfgp.sketch(K.ScaleKernel(K.RQKernel()), NUM_FEATURES, seed=0),
    "polynomial-sketch": lambda x: rfgp.sketch(K.ScaleKernel(K.PolynomialKernel(power=3)), NUM_FEATURES, seed=0),
    "polynomial-maclaurin": lambda x: rfgp.sketch(K.ScaleKernel(K.PolynomialKernel(power=3)), NUM_FEATURES,
                                                  method="maclaurin", seed=0),
    # a truncated Maclaurin map: its posterior variance carries the bias correction
    "rbf-maclaurin": lambda x: rfgp.sketch(K.ScaleKernel(K.RBFKernel()), NUM_FEATURES, method="maclaurin",
                                           x_sample=x, seed=0),
    "additive": lambda x: rfgp.sketch(K.ScaleKernel(K.AdditiveKernel(K.RBFKernel(), K.PeriodicKernel())),
                                      NUM_FEATURES, seed=0),
}


class _GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, covar_module):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class _MeanVar(torch.nn.Module):
    def __init__(self, gp):
        super().__init__()
        self.gp = gp

    def forward(self, x):
        output = self.gp(x)
        return output.mean, output.variance


def _model(name, num_data, dtype):
    x = torch.rand(num_data, 2, dtype=dtype)
    y = torch.sin(6 * x).sum(-1)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
    model = _GP(x, y, likelihood, KERNELS[name](x).to(dtype)).to(dtype)
    model.eval()
    return model


def _export(model, test_x, path):
    """GPyTorch's recipe: evaluate once (posterior caches), trace, save, load."""
    with torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.trace_mode(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings about shapes baked into the trace
        wrapper = _MeanVar(model)
        wrapper(test_x)
        traced = torch.jit.trace(wrapper, test_x, check_trace=False)
        traced.save(str(path))
    return torch.jit.load(str(path))


def _check(model, loaded, x, tol):
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        expected = model(x)
        mean, variance = loaded(x)
    torch.testing.assert_close(mean, expected.mean, rtol=0, atol=tol)
    torch.testing.assert_close(variance, expected.variance, rtol=0, atol=tol)


@pytest.mark.parametrize("num_data", [60, 20], ids=["feature-space", "kernel-space"])
@pytest.mark.parametrize("name", list(KERNELS))
def test_traced_model_saves_loads_and_predicts(name, num_data, tmp_path):
    model = _model(name, num_data, torch.float64)
    assert model.prediction_strategy is None
    loaded = _export(model, torch.rand(10, 2, dtype=torch.float64), tmp_path / "model.pt")
    assert model.prediction_strategy.uses_kernel_space == (num_data <= NUM_FEATURES)
    _check(model, loaded, torch.rand(10, 2, dtype=torch.float64), 1e-10)  # new inputs, traced shape
    _check(model, loaded, torch.rand(3, 2, dtype=torch.float64), 1e-10)  # another number of test points


def test_traced_model_float32(tmp_path):
    model = _model("rbf-sorf", 60, torch.float32)
    loaded = _export(model, torch.rand(10, 2), tmp_path / "model.pt")
    _check(model, loaded, torch.rand(10, 2), 1e-5)


def test_traced_variance_keeps_the_bias_correction(tmp_path):
    model = _model("rbf-maclaurin", 60, torch.float64)
    test_x = 3.0 + torch.rand(10, 2, dtype=torch.float64)  # far from the data: the correction dominates
    with torch.no_grad():
        correction = operator_variance_correction(model.covar_module(test_x).evaluate_kernel())
    assert correction is not None and correction.min() > 1e-3
    loaded = _export(model, test_x, tmp_path / "model.pt")
    _check(model, loaded, test_x, 1e-10)


def test_untraced_features_keep_the_fused_function():
    kernel = rfgp.sketch(K.RBFKernel(), NUM_FEATURES, seed=0)
    x = torch.rand(5, 2, requires_grad=True)
    assert type(kernel.featurize(x).grad_fn).__name__ == "_SinCosFeaturesBackward"


def _saves(fn, inputs, tmp_path):
    """Trace ``fn`` on ``inputs``, save, load, and return (eager, loaded) outputs."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        traced = torch.jit.trace(fn, inputs, check_trace=False)
    torch.jit.save(traced, str(tmp_path / "fn.pt"))
    return fn(*inputs), torch.jit.load(str(tmp_path / "fn.pt"))(*inputs)


def test_statistics_functions_trace(tmp_path):
    features = torch.randn(40, 8, dtype=torch.float64)
    weights, rhs = torch.rand(40, dtype=torch.float64) + 0.5, torch.randn(40, 2, dtype=torch.float64)
    for w in (weights, weights[:1]):  # per-point and uniform weights
        expected, loaded = _saves(feature_statistics, (features, w, rhs), tmp_path)
        torch.testing.assert_close(loaded, expected, rtol=1e-12, atol=1e-12)

    def inv_quad_logdet(phi, noise, r):
        return kernel_space_inv_quad_logdet(phi, noise, r, logdet=True)

    expected, loaded = _saves(inv_quad_logdet, (features[:6], weights[:6], rhs[:6]), tmp_path)
    torch.testing.assert_close(loaded, expected, rtol=1e-12, atol=1e-12)

    chol = torch.linalg.cholesky(features[:8].mT @ features[:8] + torch.eye(8, dtype=torch.float64))

    def triangular(cross, factor, w, r):
        return triangular_statistics(triangular_features(cross, factor), cross, factor, w, r)

    expected, loaded = _saves(triangular, (features, chol, weights, rhs), tmp_path)
    torch.testing.assert_close(loaded, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("uniform", [True, False], ids=["uniform-weights", "per-point-weights"])
def test_traced_float32_statistics_sum_as_the_eager_ones(uniform, tmp_path):
    """The traced statistics (plain operations) summed ΦᵀWR in one float32 product: for N = 2·10⁴ rows of a
    Maclaurin map (columns of large mean) and a residual of one sign, B was 2.3·10⁻⁶ off the float64 statistics'
    against the eager 7·10⁻⁸; now both are summed in float64 partial sums (accumulated_project)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20_000, 3, generator=gen)
    with torch.no_grad():
        features = rfgp.kernels.MaclaurinRBFKernel(128, input_dim=3, seed=0).featurize(x)
    rhs = torch.sin(3 * x[:, :1]) + 1.0
    weights = torch.full((1,), 100.0) if uniform else 50.0 + 100.0 * torch.rand(20_000, generator=gen)
    inputs = (features, weights, rhs)
    eager, loaded = _saves(feature_statistics, inputs, tmp_path)
    exact = feature_statistics(*(t.double() for t in inputs))
    for traced, fused, reference in zip(loaded, eager, exact):
        assert traced.dtype == torch.float32
        error = float((traced.double() - reference).norm() / reference.norm())
        assert error < 2e-7
        assert error < 4 * float((fused.double() - reference).norm() / reference.norm()) + 1e-8


@pytest.mark.parametrize("kind", ["features", "nystrom"])
def test_traced_chunked_float32_statistics_choose_their_precision_as_the_eager_ones(kind, tmp_path):
    """Chunked statistics of float32 features at a high signal-to-noise ratio are formed in float64 eagerly
    (rfgp.inference.statistics_precision); their traced forward kept float32 (1.2·10⁻⁷ off in B for N = 2·10⁴ Maclaurin
    rows).  Now the trace runs the Function's forward, precision choice included, and equals the eager statistics."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(2_000, 2, generator=gen)
    if kind == "features":
        omega, phase = 3 * torch.randn(2, 40, generator=gen), 6.3 * torch.rand(40, generator=gen)
        featurizer = Featurizer(lambda u: torch.cos(u @ omega + phase), (), 40, torch.Size(), 0.8317)
        statistics = chunked_feature_statistics
    else:
        landmarks = torch.rand(12, 2, generator=gen)

        def cross(u):
            return torch.exp(-torch.cdist(u, landmarks).square() / 0.18)

        chol = torch.linalg.cholesky(cross(landmarks) + 1e-3 * torch.eye(12))
        featurizer = TriangularFeaturizer(cross, lambda: chol, (), 12, torch.Size(), 0.8317)
        statistics = chunked_triangular_statistics
    weights, rhs = torch.full((1,), 1e4), 5 + torch.randn(2_000, 1, generator=gen)  # 1/σ² of noise 10⁻⁴

    def chunked(u, w, r):
        return statistics(featurizer, u, w, r, 256, adaptive_precision=True)

    eager, loaded = _saves(chunked, (x, weights, rhs), tmp_path)
    for traced, fused in zip(loaded, eager):
        assert fused.dtype == traced.dtype == torch.float64  # the default rule widens here
        torch.testing.assert_close(traced, fused, rtol=1e-12, atol=0)
