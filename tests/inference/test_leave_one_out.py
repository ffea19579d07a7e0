"""Leave-one-out predictions and GPyTorch's LeaveOneOutPseudoLikelihood through the F × F capacitance.

The reference is GPyTorch's own method (``forward.gpytorch_forward``, the dense N × N Cholesky path) on the same
model: both compute the same exact quantity, so values and gradients agree to rounding (1e-10 in float64).  A Nyström
map with every training point as a landmark is the exact kernel, so its pseudo-likelihood is the exact GP's.
"""

import copy
import weakref

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import LeaveOneOutPseudoLikelihood

import rfgp
from rfgp.inference.classification import ClassNoiseFeatureLinearOperator
from rfgp.inference.leave_one_out import feature_covariance, leave_one_out_predictions
from rfgp.kernels import SketchedRBFKernel
from rfgp.likelihoods import DirichletClassificationLikelihood
from rfgp.models import ExactGPModel
from tests._models import MultitaskGP, UserGP

F64 = torch.float64


def data(n, seed=0, batch=()):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(*batch, n, 2, generator=g, dtype=F64)
    y = torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(*batch, n, generator=g, dtype=F64)
    return x, y


def sketched_model(n, num_features, batch=(), seed=0):
    x, y = data(n, seed, batch)
    kernel = ScaleKernel(SketchedRBFKernel(num_features, method="orf", seed=0, batch_shape=torch.Size(batch)),
                         batch_shape=torch.Size(batch))
    model = UserGP(x, y, kernel).double()
    if batch:
        model.likelihood = gpytorch.likelihoods.GaussianLikelihood(batch_shape=torch.Size(batch)).double()
        model.mean_module = gpytorch.means.ConstantMean(batch_shape=torch.Size(batch)).double()
    model.covar_module.outputscale = 1.5
    model.covar_module.base_kernel.lengthscale = 0.4
    model.likelihood.noise = 0.02
    model.mean_module.constant.data.fill_(0.3)
    return model, x, y


def loo_value_and_grads(model, x, y, forward=None):
    model.train()
    mll = LeaveOneOutPseudoLikelihood(model.likelihood, model)
    output = model(x)
    value = (forward or LeaveOneOutPseudoLikelihood.forward)(mll, output, y)
    parameters = [p for p in model.parameters() if p.requires_grad]
    grads = torch.autograd.grad(value.sum(), parameters)
    return value.detach(), grads


def dense_loo_value_and_grads(model, x, y):
    return loo_value_and_grads(model, x, y, LeaveOneOutPseudoLikelihood.forward.gpytorch_forward)


def assert_same(actual, expected, tolerance=1e-10):
    torch.testing.assert_close(actual[0], expected[0], rtol=tolerance, atol=tolerance)
    for a, e in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, e, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize(("n", "num_features"), [(60, 16), (12, 32)], ids=["feature_space", "kernel_space"])
def test_pseudo_likelihood_is_the_dense_paths(n, num_features, factorised):
    """Value and hyperparameter gradients equal GPyTorch's dense path to 1e-10; with N > F nothing larger than
    F × F is factorised (GPyTorch's method factorises the N × N covariance)."""
    model, x, y = sketched_model(n, num_features)
    model.covar_module.base_kernel.register_prior("lengthscale_prior", gpytorch.priors.GammaPrior(3.0, 6.0),
                                                  "lengthscale")
    actual = loo_value_and_grads(model, x, y)
    sizes = list(factorised)
    assert max(sizes) <= max(num_features, n if n <= num_features else 0)
    assert_same(actual, dense_loo_value_and_grads(model, x, y))
    assert max(factorised) == n  # the reference did factorise N × N


def test_batch_model_is_the_dense_paths():
    model, x, y = sketched_model(40, 8, batch=(3,))
    model.likelihood.noise = torch.tensor([[0.01], [0.05], [0.2]], dtype=F64)
    actual = loo_value_and_grads(model, x, y)
    assert actual[0].shape == (3,)
    assert_same(actual, dense_loo_value_and_grads(model, x, y))


def test_heteroscedastic_noise_is_the_dense_paths():
    """FixedNoiseGaussianLikelihood: D is each point's own noise."""
    x, y = data(50)
    noise = torch.linspace(0.01, 0.3, 50, dtype=F64)
    model = UserGP(x, y, ScaleKernel(SketchedRBFKernel(16, method="orf", seed=0))).double()
    model.likelihood = gpytorch.likelihoods.FixedNoiseGaussianLikelihood(noise, learn_additional_noise=True).double()
    assert_same(loo_value_and_grads(model, x, y), dense_loo_value_and_grads(model, x, y))


def test_chunked_kernel_is_the_unchunked(factorised):
    """Under a memory budget smaller than Φ the kernel hands a chunked operator; V = ΦL⁻ᵀ is formed per chunk."""
    model, x, y = sketched_model(80, 16)
    expected = loo_value_and_grads(model, x, y)
    with rfgp.settings.memory_budget(16 * 8 * 20):  # 20 rows of float64 features per chunk
        covar = model.likelihood(model(x)).lazy_covariance_matrix.evaluate_kernel()
        assert type(covar).__name__ == "ChunkedFeatureRootAddedDiagLinearOperator"
        factorised.clear()
        actual = loo_value_and_grads(model, x, y)
    assert max(factorised) <= 16
    assert_same(actual, expected)


def test_chunked_features_are_formed_one_chunk_at_a_time(monkeypatch):
    """Each chunk's features are solved against the factor and released before the next chunk is formed: the chunks
    were all formed first, holding the N × F matrix the budget bounds (2 GB at N = 400 000, F = 1 024 under 64 MiB,
    in every GPRegressor fit's degenerate-fit check)."""
    model, x, y = sketched_model(80, 16)
    model.eval()
    formed, alive_at_solve = [], []
    solve = torch.linalg.solve_triangular

    def logged_solve(*args, **kwargs):
        alive_at_solve.append(sum(ref() is not None for ref in formed))
        return solve(*args, **kwargs)

    monkeypatch.setattr(torch.linalg, "solve_triangular", logged_solve)
    with rfgp.settings.memory_budget(16 * 8 * 20), torch.no_grad():  # 20 rows of float64 features per chunk
        prior = model.likelihood(model.forward(x))
        covar = feature_covariance(prior.lazy_covariance_matrix)
        featurize = type(covar._linear_op.featurizer).__call__

        def logged_featurize(self, *args, **kwargs):
            features = featurize(self, *args, **kwargs)
            formed.append(weakref.ref(features))
            return features

        monkeypatch.setattr(type(covar._linear_op.featurizer), "__call__", logged_featurize)
        leave_one_out_predictions(covar, y, prior.mean)
    assert len(alive_at_solve) >= 4 and max(alive_at_solve) == 1, alive_at_solve


def test_nystrom_with_every_point_is_the_exact_gps():
    """All training points as landmarks: the exact kernel, so the exact GP's pseudo-likelihood and gradients
    (up to the Nyström factor's jittered round-off, ≈ 1e-8 of K amplified by 1/noise)."""
    x, y = data(30)
    exact = UserGP(x, y, ScaleKernel(RBFKernel())).double()
    exact.covar_module.base_kernel.lengthscale = 0.4
    exact.likelihood.noise = 0.05
    landmark = copy.deepcopy(exact)
    landmark.covar_module = rfgp.sketch(exact.covar_module, 30, method="nystrom", x_sample=x)
    expected, actual = loo_value_and_grads(exact, x, y), loo_value_and_grads(landmark, x, y)
    torch.testing.assert_close(actual[0], expected[0], rtol=1e-6, atol=1e-7)
    for a, e in zip(actual[1], expected[1]):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-6)


def test_other_models_run_gpytorchs_method():
    x, y = data(20)
    exact = UserGP(x, y, ScaleKernel(RBFKernel())).double()
    assert_same(loo_value_and_grads(exact, x, y), dense_loo_value_and_grads(exact, x, y), tolerance=0)


def test_a_multi_output_covariance_is_refused_naming_the_documented_prior():
    """A multitask prior covariance (several outputs per input) was refused with advice to take
    likelihood(model(train_x)) "in train mode", where the documented recipe takes model.forward in eval mode."""
    x, _ = data(15)
    targets = torch.stack([torch.sin(3 * x).sum(-1), torch.cos(2 * x).sum(-1)], -1)
    kernel = rfgp.sketch(gpytorch.kernels.MultitaskKernel(RBFKernel(), num_tasks=2, rank=1), 32, seed=0)
    model = MultitaskGP(x, targets, gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2), kernel).double()
    model.eval()
    with torch.no_grad():
        prior = model.likelihood(model.forward(x))
    with pytest.raises(TypeError, match=r"covar must be .* of one output \(.*model.forward\(train_x\).* eval mode"
                       r".*got KroneckerFeatureRootAddedDiagLinearOperator.*multi-output"):
        leave_one_out_predictions(prior.lazy_covariance_matrix, targets.reshape(-1), prior.mean.reshape(-1))


def test_non_finite_targets_are_refused():
    model, x, y = sketched_model(30, 8)
    y = y.clone()
    y[3] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        loo_value_and_grads(model, x, y)


def dense_loo_predictions(features, noise: float, y, prior_mean: float):
    """Leave-one-out means and variances of K = ΦΦᵀ + σ²I in closed form (R&W 2006, Eq. 5.12):
    σᵢ² = 1/[K⁻¹]ᵢᵢ, μᵢ = yᵢ − [K⁻¹(y − m)]ᵢ·σᵢ²."""
    inverse = torch.linalg.inv(features @ features.mT + noise * torch.eye(features.shape[-2], dtype=features.dtype))
    variance = inverse.diagonal().reciprocal()
    return y - (inverse @ (y - prior_mean)) * variance, variance


def test_predictions_are_the_closed_form_in_float32():
    """float32: the capacitance is factorised in float64 and the cancelling differences wᵢ − wᵢ²‖vᵢ‖² taken there;
    the result matches a float64 evaluation of the same float32 features to float32 rounding."""
    model, x, y = sketched_model(200, 32)
    model = model.float()
    model.likelihood.noise = 1e-3
    model.eval()
    with torch.no_grad(), gpytorch.settings.prior_mode(True):
        covar = feature_covariance(model.likelihood(model(x.float())).lazy_covariance_matrix)
        mean, variance = leave_one_out_predictions(covar, y.float(), torch.full_like(y, 0.3).float())
        features = covar._linear_op.features().double()
    expected_mean, expected_variance = dense_loo_predictions(features, 1e-3, y, 0.3)
    assert mean.dtype == variance.dtype == torch.float32
    torch.testing.assert_close(variance.double(), expected_variance, rtol=1e-4, atol=0)
    torch.testing.assert_close(mean.double(), expected_mean, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("num_data, num_features, outputscale", [(200, 512, 20.0), (1500, 32, None)],
                         ids=["kernel_space", "feature_space"])
def test_predictions_at_a_high_signal_to_noise_ratio_are_float64_ones_in_float32(num_data, num_features, outputscale):
    """Noise 10⁻⁴: u·tr(sΦᵀD⁻¹Φ) ≈ 2.4 (N = 200 ≤ F = 512, outputscale 20: the N × N path) or ≈ 1.3 (N = 1500 > F = 32:
    the F × F path), above the tolerance 10⁻¹, so K is formed and factorised in float64
    (rfgp.inference.kernel_space.kernel_cholesky), or the statistics ΦᵀWΦ, ΦᵀWr are, as for the marginal likelihood
    (rfgp.inference.statistics_precision): the float64 closed form of the same float32 features (measured: variance
    7·10⁻⁷ and 1.1·10⁻⁷ relative, mean 1.2·10⁻⁶ and 4.8·10⁻⁷).  Before: the N × N path formed and inverted K in
    float32 (variances off by up to 28 % relative, means by 0.16 of values up to 2), the F × F path formed float32
    statistics whatever the tolerance (variances off by 4.7·10⁻⁴ relative, means by 8.6·10⁻⁴)."""
    model, x, y = sketched_model(num_data, num_features)
    model = model.float()
    if outputscale is not None:
        model.covar_module.outputscale = outputscale
    model.likelihood.noise = 1e-4
    model.eval()
    with torch.no_grad(), gpytorch.settings.prior_mode(True):
        covar = feature_covariance(model.likelihood(model(x.float())).lazy_covariance_matrix)
        assert covar.uses_kernel_space() == (num_data <= num_features)
        with rfgp.inference.statistics_precision.recorded_statistics_dtypes() as dtypes:
            mean, variance = leave_one_out_predictions(covar, y.float(), torch.full_like(y, 0.3).float())
        features = covar._linear_op.features().double()
    assert dtypes and set(dtypes) == {F64}
    expected_mean, expected_variance = dense_loo_predictions(features, 1e-4, y, 0.3)
    assert mean.dtype == variance.dtype == torch.float32
    torch.testing.assert_close(variance.double(), expected_variance, rtol=1e-5, atol=0)
    torch.testing.assert_close(mean.double(), expected_mean, rtol=1e-5, atol=1e-5)


def test_dirichlet_classifier_is_the_dense_paths(factorised):
    """The Dirichlet classifier's class-noise operator (C regressions sharing Φ, per-class noise) is ΦΦᵀ + D_c."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(60, 2, generator=g, dtype=F64)
    labels = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=F64, learn_additional_noise=True)
    kernel = ScaleKernel(SketchedRBFKernel(16, seed=0))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).double()
    with torch.no_grad():
        likelihood.second_noise_covar.noise = torch.tensor([[0.05], [0.1], [0.3]], dtype=F64)
    covar = likelihood(model(x)).lazy_covariance_matrix
    assert isinstance(covar, ClassNoiseFeatureLinearOperator)
    targets = likelihood.transformed_targets
    actual = loo_value_and_grads(model, x, targets)
    assert max(factorised) <= 16
    assert_same(actual, dense_loo_value_and_grads(model, x, targets))
