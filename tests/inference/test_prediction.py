"""FeatureSpacePredictionStrategy: the posterior equals a dense exact GP with the same K̂ = ΦΦᵀ,
honours skip_posterior_variances and adds the scaled variance correction of biased maps."""

import copy

import gpytorch
import pytest
import torch

from rfgp.features import OptimizedMaclaurin, RandomFourierFeatures, dot_product
from rfgp.inference import distributed
from rfgp.inference.prediction import FeatureSpacePredictionStrategy
from rfgp.kernels import (
    NystromKernel,
    RandomFeatureKernel,
    SketchedMaternKernel,
    SketchedNewtonGirardAdditiveKernel,
    SketchedRBFKernel,
    SpectralProductKernel,
    kernel_features,
)
from rfgp.models import ExactGPModel
from tests._dense import assert_eager_kernels_keep_the_strategy
from tests._feature_maps import ShrunkFourierFeatures
from tests._models import UserGP


def data(device, n=30, d=2, seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64) * 4 - 2
    y = torch.sin(2 * x[:, 0]) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    xs = torch.linspace(-2.5, 2.5, 13, dtype=torch.float64).unsqueeze(-1).expand(13, d).contiguous()
    return x.to(device), y.to(device), xs.to(device)


def build(kernel, x, y, device, outputscale=1.7, lengthscale=0.6, noise=0.05, model_class=ExactGPModel):
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = model_class(x, y, likelihood, gpytorch.kernels.ScaleKernel(kernel)).double().to(device)
    model.covar_module.outputscale = outputscale
    model.covar_module.base_kernel.lengthscale = lengthscale
    model.likelihood.noise = noise
    model.mean_module.constant.data.fill_(0.3)
    model.eval()
    return model


def dense_posterior(model, x, y, xs, correction=None):
    """Exact GP algebra with K̂ = s·ΦΦᵀ, explicit N × N matrices (the reference)."""
    with torch.no_grad():
        phi, phis = kernel_features(model.covar_module, x), kernel_features(model.covar_module, xs)
        noise = model.likelihood.noise.item()
        mu = model.mean_module.constant.item()
        k = phi @ phi.T + noise * torch.eye(len(x), dtype=x.dtype, device=x.device)
        cross = phis @ phi.T
        mean = mu + cross @ torch.linalg.solve(k, y - mu)
        covar = phis @ phis.T - cross @ torch.linalg.solve(k, cross.T)
        if correction is not None:
            covar = covar + torch.diag(correction)
    return mean, covar


@pytest.mark.parametrize("method", ["rff", "orf", "sorf"])
@pytest.mark.parametrize("num_features", [8, 64])  # F < N (Woodbury) and F ≥ N
def test_posterior_equals_dense_gp_with_same_features(method, num_features, device):
    x, y, xs = data(device)
    model = build(SketchedRBFKernel(num_features, method=method, seed=0), x, y, device)
    with torch.no_grad():
        pred = model(xs)
    assert isinstance(model.prediction_strategy, FeatureSpacePredictionStrategy)
    mean, covar = dense_posterior(model, x, y, xs)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-8, atol=1e-8)
    torch.testing.assert_close(pred.covariance_matrix, covar, rtol=1e-7, atol=1e-8)
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        fast = model(xs)
    torch.testing.assert_close(fast.variance, torch.diagonal(covar), rtol=1e-7, atol=1e-8)
    # The predictive distribution adds the observation noise.
    with torch.no_grad():
        observed = model.likelihood(model(xs))
    torch.testing.assert_close(observed.variance, torch.diagonal(covar) + model.likelihood.noise, rtol=1e-7,
                               atol=1e-8)


def test_marginal_log_likelihood_equals_dense_and_uses_feature_space(device, monkeypatch):
    from rfgp.inference.operators import FeatureRootAddedDiagLinearOperator

    calls = []
    original = FeatureRootAddedDiagLinearOperator.inv_quad_logdet

    def spy(self, *args, **kwargs):
        calls.append(self.shape)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(FeatureRootAddedDiagLinearOperator, "inv_quad_logdet", spy)
    x, y, _ = data(device, n=40)
    model = build(SketchedRBFKernel(16, method="orf", seed=1), x, y, device)
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    value = mll(model(x), y)
    assert calls == [torch.Size([40, 40])]  # GPyTorch's MLL reaches the O(N·F²) Woodbury path
    with torch.no_grad():
        phi = kernel_features(model.covar_module, x)
        k = phi @ phi.T + model.likelihood.noise * torch.eye(40, dtype=x.dtype, device=device)
        mu = torch.full_like(y, 0.3)
        reference = torch.distributions.MultivariateNormal(mu, k).log_prob(y) / 40
    torch.testing.assert_close(value.detach(), reference, rtol=1e-9, atol=1e-9)
    value.backward()
    assert all(p.grad is not None and bool(torch.isfinite(p.grad).all()) for p in model.parameters())


def test_skip_posterior_variances(device):
    x, y, xs = data(device)
    model = build(SketchedRBFKernel(16, seed=0), x, y, device)
    with torch.no_grad():
        full = model(xs)
    model = build(SketchedRBFKernel(16, seed=0), x, y, device)
    with torch.no_grad(), gpytorch.settings.skip_posterior_variances():
        skipped = model(xs)
    from linear_operator.operators import ZeroLinearOperator

    torch.testing.assert_close(skipped.mean, full.mean)
    assert isinstance(skipped.lazy_covariance_matrix, ZeroLinearOperator)
    assert skipped.lazy_covariance_matrix.shape == (len(xs), len(xs))


@pytest.mark.parametrize("num_features", [8, 64])
def test_variance_correction_added_and_scaled_by_outputscale(num_features, device):
    x, y, xs = data(device)
    shrink, outputscale = 0.6, 2.5
    kernel = RandomFeatureKernel(ShrunkFourierFeatures(num_features, 0.6, seed=0))
    model = build(kernel, x, y, device, outputscale=outputscale)
    with torch.no_grad():
        pred = model(xs)
    correction = torch.full((len(xs),), (1 - shrink) * outputscale, dtype=torch.float64, device=device)
    mean, covar = dense_posterior(model, x, y, xs, correction=correction)
    torch.testing.assert_close(pred.mean, mean, rtol=1e-8, atol=1e-8)  # the mean ignores the correction
    torch.testing.assert_close(pred.covariance_matrix, covar, rtol=1e-7, atol=1e-8)
    # Without the correction the same model would report less variance by exactly (1 − shrink)·s.
    uncorrected = build(RandomFeatureKernel(ShrunkFourierFeatures(num_features, 0.6, seed=0)), x, y, device,
                        outputscale=outputscale)
    uncorrected.covar_module.base_kernel.feature_map.has_variance_bias = False
    with torch.no_grad():
        torch.testing.assert_close(pred.variance - uncorrected(xs).variance, correction)


@pytest.mark.parametrize("num_features", [8, 64])
def test_rfgp_models_keep_the_variance_correction_with_eagerly_evaluated_kernels(num_features):
    """Under ``gpytorch.settings.lazily_evaluate_kernels(False)`` GPyTorch's ExactGP chose its generic
    DefaultPredictionStrategy (it asks the kernel only for a lazily evaluated covariance): rfgp's own models
    lost the variance correction of biased maps, (1 − shrink)·s = 1.0 here, silently."""
    x, y, xs = data("cpu")
    model = build(RandomFeatureKernel(ShrunkFourierFeatures(num_features, 0.6, seed=0)), x, y, "cpu", outputscale=2.5)
    assert_eager_kernels_keep_the_strategy(model, xs, FeatureSpacePredictionStrategy, tolerance=1e-10)


def test_gpytorch_sums_of_rfgp_kernels_predict_in_feature_space():
    """GPyTorch's ``k₁ + k₂`` of rfgp kernels (an ``AdditiveKernel``, which trains through the feature root) answered
    GPyTorch's dispatch with the generic DefaultPredictionStrategy: N × N algebra (160× slower than FeatureSumKernel at
    N = 3 000, F = 512) and, for a biased map, no variance correction.  Now it predicts as FeatureSumKernel does; a
    sum of exact kernels keeps GPyTorch's strategy."""
    from rfgp.kernels import FeatureSumKernel

    x, y, xs = data("cpu")

    def parts():
        return (gpytorch.kernels.ScaleKernel(RandomFeatureKernel(ShrunkFourierFeatures(16, 0.6, seed=0))),
                gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, seed=1)))

    predictions = {}
    for name, kernel in (("gpytorch sum", gpytorch.kernels.AdditiveKernel(*parts())),
                         ("feature sum", FeatureSumKernel(*parts()))):
        model = UserGP(x, y, kernel).double().eval()
        with torch.no_grad():
            prediction = model(xs)
            predictions[name] = (prediction.mean, prediction.variance)
        assert isinstance(model.prediction_strategy, FeatureSpacePredictionStrategy), name
    for actual, expected in zip(predictions["gpytorch sum"], predictions["feature sum"]):
        torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)
    exact = UserGP(x, y, gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
                   + gpytorch.kernels.ScaleKernel(gpytorch.kernels.MaternKernel())).double().eval()
    with torch.no_grad():
        exact(xs)
    assert type(exact.prediction_strategy) is gpytorch.models.exact_prediction_strategies.DefaultPredictionStrategy


@pytest.mark.parametrize("wrapper", ["scale", "scale_of_scale"])
def test_scaled_gpytorch_products_of_corrected_rfgp_kernels_predict_with_the_correction(wrapper):
    """``ScaleKernel(k₁ * k₂)`` of Nyström and truncated Maclaurin kernels: GPyTorch's dispatch asks the ScaleKernel,
    which hands it to the ProductKernel's generic strategy; the dispatch looked at the ScaleKernel only, so the model
    predicted through DefaultPredictionStrategy with neither factor's variance correction (the variance 0.07–0.3 below
    the dense posterior of the same features and corrections).  Now it predicts in feature space, with
    c₁‖Φ₂‖² + c₂‖Φ₁‖² + c₁c₂ on the prior diagonal."""
    from rfgp.kernels import MaclaurinRBFKernel, NystromKernel

    x, y, xs = data("cpu")
    base = gpytorch.kernels.RBFKernel(active_dims=[0]).double()
    base.lengthscale = 0.4
    left = NystromKernel(base, landmarks=x[:6])
    right = MaclaurinRBFKernel(8, active_dims=[1], seed=0, max_order=3).double()
    kernel = gpytorch.kernels.ScaleKernel(left * right)
    if wrapper == "scale_of_scale":
        kernel = gpytorch.kernels.ScaleKernel(kernel)
    model = UserGP(x, y, kernel).double().eval()
    model.likelihood.noise = 0.05
    with torch.no_grad():
        prediction = model(xs)
        scale = kernel.outputscale if wrapper == "scale" else kernel.outputscale * kernel.base_kernel.outputscale
        exact_right = gpytorch.kernels.RBFKernel(active_dims=[1]).double()
        exact_right.lengthscale = right.lengthscale
        prior = scale * base(xs, diag=True) * exact_right(xs, diag=True)
        train = scale * left(x).to_dense() * right(x).to_dense() + 0.05 * torch.eye(len(x), dtype=x.dtype)
        cross = scale * left(xs, x).to_dense() * right(xs, x).to_dense()
        variance = prior - (cross @ torch.linalg.solve(train, cross.T)).diagonal()
        mean = model.mean_module.constant + cross @ torch.linalg.solve(train, y - model.mean_module.constant)
    # to the Nyström roots' jitter (1e-9 here): the corrections alone are 0.07–0.7
    torch.testing.assert_close(prediction.variance, variance, rtol=1e-7, atol=1e-8)
    torch.testing.assert_close(prediction.mean, mean, rtol=1e-7, atol=1e-8)
    assert isinstance(model.prediction_strategy, FeatureSpacePredictionStrategy)


def test_products_of_rfgp_kernels_predict_one_point_per_batch_member():
    """A product of rfgp kernels at a single point per batch member (BoTorch's q = 1 candidates ``(b, 1, d)``): the
    1 × 1 covariance of the second factor was taken for a batch of ScaleKernel constants, so the test covariance was
    the first factor's root scaled (width M instead of M·F, and without the second factor's correction), and the
    prediction raised "mat1 and mat2 shapes cannot be multiplied (3x8 and 120x1)".  It equals the prediction of the
    same points as one batch of three."""
    from rfgp.kernels import MaclaurinRBFKernel, NystromKernel

    x, y, xs = data("cpu")
    base = gpytorch.kernels.RBFKernel(active_dims=[0]).double()
    base.lengthscale = 0.4
    kernel = NystromKernel(base, landmarks=x[:8]) * MaclaurinRBFKernel(16, active_dims=[1], seed=0, max_order=4)
    model = UserGP(x, y, kernel).double().eval()
    with torch.no_grad():
        together = model(xs[:3])
        apart = model(xs[:3].unsqueeze(-2))
    assert isinstance(model.prediction_strategy, FeatureSpacePredictionStrategy)
    torch.testing.assert_close(apart.mean.squeeze(-1), together.mean, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(apart.variance.squeeze(-1), together.variance, rtol=1e-10, atol=1e-12)


def test_unbiased_maps_carry_no_correction(device):
    x, _, _ = data(device)
    kernel = RandomFeatureKernel(RandomFourierFeatures(16, seed=0)).double().to(device)
    assert kernel.variance_correction(x) is None
    shrunk = RandomFeatureKernel(ShrunkFourierFeatures(16, 0.6, seed=0)).double().to(device)
    torch.testing.assert_close(shrunk.variance_correction(x), torch.full((len(x),), 0.4, dtype=torch.float64,
                                                                          device=device))


def test_batched_model_posterior_equals_dense(device):
    # One GP per output sharing Φ (e.g. Dirichlet classification): batch_shape (2,).
    x, y, xs = data(device, n=25)
    batch = torch.Size([2])
    ys = torch.stack((y, -y))
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(10, method="orf", seed=3, batch_shape=batch),
                                          batch_shape=batch)
    model = ExactGPModel(x, ys, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().to(device)
    model.mean_module = gpytorch.means.ConstantMean(batch_shape=batch).double().to(device)
    model.likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch).double().to(device)
    model.covar_module.outputscale = torch.tensor([1.0, 2.0], dtype=torch.float64, device=device)
    model.likelihood.noise = torch.tensor([[0.05], [0.2]], dtype=torch.float64, device=device)
    model.eval()
    with torch.no_grad():
        pred = model(xs)
        phi = kernel_features(model.covar_module, x)  # (2, n, F)
        phis = kernel_features(model.covar_module, xs)
        for b in range(2):
            k = phi[b] @ phi[b].T + model.likelihood.noise[b] * torch.eye(25, dtype=x.dtype, device=device)
            cross = phis[b] @ phi[b].T
            mean = cross @ torch.linalg.solve(k, ys[b])
            var = (phis[b] ** 2).sum(-1) - (cross * torch.linalg.solve(k, cross.T).T).sum(-1)
            torch.testing.assert_close(pred.mean[b], mean, rtol=1e-8, atol=1e-8)
            torch.testing.assert_close(pred.variance[b], var, rtol=1e-7, atol=1e-8)


def test_prediction_after_the_features_were_redrawn_raises_until_the_posterior_is_rebuilt(device):
    """The caches are weights of the training features' draws: after ``resample()`` (or loading a state with
    other draws into the kernel; the model's own load_state_dict clears its caches) in eval mode, the next
    prediction would pair the new Φ(x*) with the old weights."""
    x, y, xs = data(device)
    model = build(SketchedRBFKernel(64, seed=0), x, y, device)
    with torch.no_grad():
        model(xs)
        feature_map = model.covar_module.base_kernel.feature_map
        feature_map.resample(generator=torch.Generator().manual_seed(1))
        with pytest.raises(RuntimeError, match="re-drawn after this model cached its posterior.*model.train"):
            model(xs)
        model.train()
        model.eval()
        mean, _ = dense_posterior(model, x, y, xs)
        torch.testing.assert_close(model(xs).mean, mean, rtol=1e-8, atol=1e-8)
        model.covar_module.load_state_dict(build(SketchedRBFKernel(64, seed=2), x, y, device).covar_module.state_dict())
        with pytest.raises(RuntimeError, match="re-drawn"):
            model(xs)


def _refit_maclaurin(kernel):
    feature_map = kernel.feature_map
    feature_map.set_widths(tuple(reversed(feature_map.widths)))


def _load_other_state(kernel):
    """Load the state of the same kernel at other hyperparameters (Nyström: at other landmarks given by hand)."""
    other = copy.deepcopy(kernel)
    with torch.no_grad():
        other.lengthscale = 2 * other.lengthscale
        if isinstance(other, NystromKernel):
            other.landmarks.add_(0.5)
    kernel.load_state_dict(other.state_dict())


# kernels whose draws are not (only) a feature map's seed: a kernel-level seed, or a fitted allocation at one seed;
# and states loaded into the kernel alone, of the same seed (other hyperparameters) or of other hand-given landmarks
REDRAWS = {
    "hyperparameters_loaded": (lambda: SketchedRBFKernel(16, seed=0), _load_other_state),
    "nystrom_landmarks_loaded": (lambda: NystromKernel(gpytorch.kernels.RBFKernel(),
                                                       torch.linspace(-2, 2, 8, dtype=torch.float64).unsqueeze(-1)
                                                       .expand(8, 2).contiguous()), _load_other_state),
    "spectral_product": (lambda: SpectralProductKernel(SketchedRBFKernel(8, input_dim=1, seed=0),
                                                       SketchedMaternKernel(8, input_dim=1, seed=1),
                                                       num_features=16, seed=0), lambda k: k.resample()),
    "newton_girard": (lambda: SketchedNewtonGirardAdditiveKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2), 2, 16,
                                                                 seed=0), lambda k: k.resample()),
    "maclaurin_widths": (lambda: RandomFeatureKernel(OptimizedMaclaurin(dot_product.gaussian(), 24, input_dim=2,
                                                                        widths=(6, 3, 2), seed=0)),
                         _refit_maclaurin),
}


@pytest.mark.parametrize("name", REDRAWS)
def test_prediction_after_draws_outside_a_map_seed_changed_raises(name):
    """A spectral-product or Newton–Girard kernel draws its frequencies from a seed of its own, and an optimised
    Maclaurin map re-draws at its seed for a new allocation: after such a redraw in eval mode the cached weights
    belong to the old features (the check compared the feature maps' (class, seed, width) only, and the prediction
    silently paired the new Φ(x*) with them).  So do the weights after a state loaded into the kernel alone, whose
    draws no seed names (Nyström landmarks) or which changes hyperparameters only: the prediction was stale, silently
    (the model's own load_state_dict clears its caches)."""
    build_kernel, redraw = REDRAWS[name]
    x, y, xs = data("cpu")
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), build_kernel()).double()
    model.eval()
    with torch.no_grad():
        model(xs)
        redraw(model.covar_module)
        with pytest.raises(RuntimeError, match="re-drawn after this model cached its posterior.*model.train"):
            model(xs)


@pytest.mark.parametrize("num_features", [8, 64], ids=["feature-space", "kernel-space"])
def test_prediction_after_a_dtype_conversion_raises_until_the_posterior_is_rebuilt(num_features):
    """``model.float()``/``.double()`` in eval mode converts GPyTorch's training data but keeps the prediction
    strategy, whose caches are in the old dtype: the next prediction names the conversion (it was a bare
    "expected m1 and m2 to have the same dtype"), and after train()/eval() predicts in the new dtype.  (A GPyTorch
    ``ExactGP``; rfgp's own models drop the caches in the conversion: tests/test_module_api.py.)"""
    x, y, xs = data("cpu")
    model = build(SketchedRBFKernel(num_features, seed=0), x, y, "cpu",
                  model_class=lambda x, y, likelihood, kernel: UserGP(x, y, kernel))
    with torch.no_grad():
        model(xs)
        for convert, dtype, tol in ((model.float, torch.float32, 1e-4), (model.double, torch.float64, 1e-8)):
            convert()
            with pytest.raises(RuntimeError, match=f"cached its posterior in torch.float.. on cpu .kernel: torch.float"
                                                   f".. on cpu., but predicts with test features in {dtype} on cpu "
                                                   f".kernel: {dtype} on cpu.*model.train"):
                model(xs.to(dtype))
            model.train()
            model.eval()
            pred = model(xs.to(dtype))
            assert pred.mean.dtype == dtype
            model.double()  # the reference in float64, from the (once rounded) training data the model holds
            mean, covar = dense_posterior(model, model.train_inputs[0], model.train_targets, xs)
            model.to(dtype)
            torch.testing.assert_close(pred.mean.double(), mean, rtol=tol, atol=tol)
            torch.testing.assert_close(pred.covariance_matrix.double(), covar, rtol=tol, atol=tol)


def test_float64_test_inputs_of_a_float32_user_model_are_named():
    """GPyTorch's ExactGP concatenates float64 test inputs with float32 training data: float64 test features,
    which the float32 caches do not multiply (rfgp's own models refuse such inputs first); and after
    ``model.float()`` of a model that predicted in float64, float64 test inputs met the float64 caches of the
    model before the conversion, silently."""

    class UserGP(gpytorch.models.ExactGP):
        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    x, y, xs = data("cpu")
    model = UserGP(x.float(), y.float(), gpytorch.likelihoods.GaussianLikelihood())
    model.mean_module = gpytorch.means.ConstantMean()
    model.covar_module = SketchedRBFKernel(16, seed=0)
    model.eval()
    with torch.no_grad():
        assert model(xs.float()).mean.dtype == torch.float32
        with pytest.raises(RuntimeError, match="in torch.float32 on cpu .kernel: torch.float32 on cpu., but predicts "
                                               "with test features in torch.float64 on cpu .kernel: torch.float32 on "
                                               "cpu.: pass test inputs in the dtype and on the device of the training"):
            model(xs)
        model.double()
        model.train()
        model.eval()
        model(xs)
        model.float()
        with pytest.raises(RuntimeError, match="in torch.float64 on cpu .kernel: torch.float64 on cpu., but predicts "
                                               "with test features in torch.float64 on cpu .kernel: torch.float32"):
            model(xs)


@pytest.mark.parametrize("num_features", [32, 256])  # N > F: feature-space caches; N < F: kernel-space caches
def test_predictions_differentiated_twice_wrt_the_test_inputs(num_features):
    """Before: a first prediction under autograd built the posterior caches with the training graph, which its
    backward() freed, so the second differentiated prediction raised 'Trying to backward through the graph a second
    time' (GPyTorch's exact GP detaches its caches under gpytorch.settings.detach_test_caches). Now the caches are
    built without a graph under that setting, the input gradients match finite differences."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(80, 2, generator=g, dtype=torch.float64), torch.randn(80, generator=g, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().eval()
    test_x = torch.rand(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    for _ in range(2):
        (grad,) = torch.autograd.grad(model(test_x).variance.sum() + model(test_x).mean.sum(), test_x)
    step = torch.zeros_like(test_x)
    step[2, 1] = 1e-6
    with torch.no_grad():
        value = lambda z: (model(z).variance.sum() + model(z).mean.sum()).item()  # noqa: E731
        finite_difference = (value(test_x + step) - value(test_x - step)) / 2e-6
    assert abs(grad[2, 1].item() - finite_difference) <= 1e-5 * max(1.0, abs(finite_difference))


def _dense_mean_and_variance_gradient(model, x, y, test_x, parameters):
    """The gradient of Σ mean + Σ variance of the posterior w.r.t. ``parameters``, by the dense algebra of K̂ = ΦΦᵀ."""
    phi, test_phi = kernel_features(model.covar_module, x), kernel_features(model.covar_module, test_x)
    prior_mean = model.mean_module.constant
    train = phi @ phi.T + model.likelihood.noise * torch.eye(len(x), dtype=x.dtype)
    cross = test_phi @ phi.T
    mean = prior_mean + cross @ torch.linalg.solve(train, y - prior_mean)
    variance = test_phi.pow(2).sum(-1) - (cross * torch.linalg.solve(train, cross.T).T).sum(-1)
    return torch.autograd.grad(mean.sum() + variance.sum(), parameters)


@pytest.mark.parametrize("num_features", [16, 256])  # N > F: feature-space caches; N < F: kernel-space caches
def test_predictions_without_detached_caches_differentiate_the_training_prior_at_every_call(num_features):
    """Under gpytorch.settings.detach_test_caches(False) (BoTorch's propagate_grads(True)) the posterior is
    differentiable in the hyperparameters, the noise and the prior mean through its caches.  Before, the caches were
    cached whatever their graph: after a first prediction under the default setting (caches without a graph) the
    gradient was silently the test features' alone (raw_outputscale: 0.133 against -0.0098), and caches built with a
    graph raised 'Trying to backward through the graph a second time' at the second differentiated prediction.
    Now the cached values carry a deferred graph: the test inputs' gradient needs no rebuild, and one through the
    caches of a strategy built under torch.no_grad (a training prior mean without a graph) is refused by name."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(60, 2, generator=g, dtype=torch.float64), torch.randn(60, generator=g, dtype=torch.float64)
    test_x = torch.rand(5, 2, generator=g, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()
    model.covar_module.outputscale, model.likelihood.noise = 1.7, 0.05
    model.mean_module.constant.data.fill_(0.3)
    parameters = [model.covar_module.raw_outputscale, model.covar_module.base_kernel.raw_lengthscale,
                  model.likelihood.noise_covar.raw_noise, model.mean_module.constant]
    expected = _dense_mean_and_variance_gradient(model, x, y, test_x, parameters)
    model.eval()
    model(test_x)  # the default setting's caches, without a graph
    for _ in range(2):
        with gpytorch.settings.detach_test_caches(False):
            posterior = model(test_x)
            gradients = torch.autograd.grad(posterior.mean.sum() + posterior.variance.sum(), parameters)
        for gradient, reference in zip(gradients, expected):
            torch.testing.assert_close(gradient, reference, rtol=1e-8, atol=1e-10)
    model.train()
    model.eval()
    with torch.no_grad():
        model(test_x)
    inputs = test_x.clone().requires_grad_(True)
    with gpytorch.settings.detach_test_caches(False):
        posterior = model(inputs)
    (input_gradient,) = torch.autograd.grad(posterior.mean.sum(), inputs, retain_graph=True)  # needs no rebuild
    assert input_gradient.abs().max() > 1e-2
    with pytest.raises(RuntimeError, match="built under torch.no_grad"):
        torch.autograd.grad(posterior.mean.sum(), parameters[:1])


def test_a_deferred_cache_gradient_outside_the_reduction_scope_of_its_prediction_is_refused(monkeypatch):
    """The caches' graph is rebuilt in the backward pass; its statistics are summed over the points of the scope it
    runs in (all ranks' inside rfgp.inference.distributed.data_parallel, this process's outside), so a backward in
    another scope than the prediction's would differentiate another posterior: refused by name."""
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(30, 2, generator=g, dtype=torch.float64), torch.randn(30, generator=g, dtype=torch.float64)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(16, seed=0))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().eval()
    with gpytorch.settings.detach_test_caches(False):
        mean = model(torch.rand(3, 2, generator=g, dtype=torch.float64)).mean
    monkeypatch.setattr(distributed, "reduction_scope", lambda: ("another group",))
    with pytest.raises(RuntimeError, match="inside rfgp.inference.distributed.data_parallel was asked outside it"):
        torch.autograd.grad(mean.sum(), model.covar_module.raw_outputscale)
