"""A practitioner's pass over noise that is not one constant, and non-Gaussian likelihoods, with rfgp kernels.

Known per-point noise (``FixedNoiseGaussianLikelihood``, BoTorch's ``train_Yvar``) with variances spread over eight
decades; learned heteroskedastic noise trained jointly with its noise GP (GPyTorch's ``NoiseModelAddedLossTerm``);
the negative-binomial likelihood and minibatch (``DataLoader``) training with natural gradients in an SVGP.  The
reference is always the same model with GPyTorch's exact kernel, or the dense algebra of the same features
(``tests/test_gpytorch_sweep_round3.py`` and ``tests/test_approximate_gps_sweep.py`` hold the single-evaluation
checks of the other noise models and likelihoods).
"""

import copy
import math
import warnings

import gpytorch
import pytest
import torch
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood, GaussianLikelihood, _GaussianLikelihoodBase
from gpytorch.likelihoods.noise_models import HeteroskedasticNoise
from gpytorch.mlls import ExactMarginalLogLikelihood, NoiseModelAddedLossTerm
from linear_operator.operators import DiagLinearOperator

import rfgp
from rfgp.core.validation import InvalidValueError

from ._models import LikelihoodGP
from .test_approximate_gps_sweep import assert_approaches, errors_by_width, svgp_outputs

F64 = torch.float64


def exact_rbf(lengthscale=(0.3, 0.5), outputscale=1.3, batch_shape=torch.Size()):
    kernel = ScaleKernel(RBFKernel(ard_num_dims=len(lengthscale), batch_shape=batch_shape),
                         batch_shape=batch_shape).double()
    kernel.base_kernel.lengthscale = torch.tensor(lengthscale, dtype=F64)
    kernel.outputscale = outputscale
    return kernel


def spread_noise(n, low, high, generator):
    """Per-point noise variances log-spaced from 10^low to 10^high, in random order."""
    return (10 ** torch.linspace(low, high, n, dtype=F64))[torch.randperm(n, generator=generator)]


def regression_data(n, low, high, seed=0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=F64)
    noise = spread_noise(n, low, high, generator)
    y = torch.sin(4 * x[:, 0]) + x[:, 1] + noise.sqrt() * torch.randn(n, generator=generator, dtype=F64)
    return x, y, noise, torch.rand(7, 2, generator=generator, dtype=F64)


def dense_reference(kernel, x, y, noise, constant, test_x):
    """−log p(y)/N, its raw-lengthscale gradient and the posterior mean and variance of the GP with covariance
    ``kernel(x).to_dense()`` (the sketched kernel's own K̂ = ΦΦᵀ) plus diag(noise), by a dense float64 Cholesky."""
    kernel = copy.deepcopy(kernel).double()
    kernel.base_kernel.raw_lengthscale.grad = None
    x, y, noise, test_x = x.double(), y.double(), noise.double(), test_x.double()
    chol = torch.linalg.cholesky(kernel(x).to_dense() + torch.diag(noise))
    residual = (y - constant).unsqueeze(-1)
    alpha = torch.cholesky_solve(residual, chol)
    loss = 0.5 * ((residual * alpha).sum() + 2 * chol.diagonal().log().sum() + len(y) * math.log(2 * math.pi))
    (loss / len(y)).backward()
    with torch.no_grad():
        cross = kernel(test_x, x).to_dense()
        mean = constant + (cross @ alpha).squeeze(-1)
        variance = kernel(test_x, diag=True) - (cross * torch.cholesky_solve(cross.mT, chol).mT).sum(-1)
    return (loss / len(y)).detach(), kernel.base_kernel.raw_lengthscale.grad, mean, variance


def relative(a, b):
    return float((a.double() - b).abs().max() / b.abs().max())


# (N, F, rows per chunk): the F × F capacitance (N > F), the N × N kernel-space path (N ≤ F), chunked statistics
PATHS = {"feature_space": (240, 64, None), "kernel_space": (40, 128, None), "chunked": (240, 64, 37)}


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_known_per_point_noise_over_eight_decades_is_the_dense_algebra_of_the_same_features(path, dtype):
    """Noise variances 10⁻⁶ … 10² (a ratio of 10⁸ between points; float32 rounds those below 10⁻⁴ up, with GPyTorch's
    NumericalWarning, the dense reference takes the rounded values): MLL, lengthscale gradient, posterior mean and
    variance are the dense Cholesky algebra of K̂ = ΦΦᵀ + D on every path.  Measured relative errors: float64 ≤ 2.4e-10;
    float32 ≤ 9.1e-3 (the gradient; MLL ≤ 8.5e-4), at ε̂ = u·tr(ΦᵀD⁻¹Φ) ≈ 0.06, below rfgp's float32-statistics
    tolerance: the float32 model's own accuracy, as GPyTorch's exact float32 GP errs by 2e-3–7e-3 in the gradient on
    such data; with float32_statistics_tolerance(0) ≤ 3.4e-6."""
    num_points, num_features, chunk = PATHS[path]
    x, y, noise, test_x = regression_data(num_points, -6, 2)
    x, y, noise, test_x = x.to(dtype), y.to(dtype), noise.to(dtype), test_x.to(dtype)
    kernel = rfgp.sketch(exact_rbf(), num_features, method="orf", seed=0).to(dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.NumericalWarning)  # the rounding up, said once
        likelihood = FixedNoiseGaussianLikelihood(noise=noise)
        model = LikelihoodGP(x, y, kernel, likelihood).to(dtype)
        with rfgp.settings.chunk_size(chunk):
            loss = -ExactMarginalLogLikelihood(likelihood, model)(model(x), y)
            loss.backward()
            model.eval()
            with torch.no_grad():
                posterior = model(test_x)
        used_noise = likelihood.noise_covar(shape=y.shape).diagonal()
    reference = dense_reference(kernel, x, y, used_noise, float(model.mean_module.constant.detach()), test_x)
    errors = [relative(loss.detach(), reference[0]), relative(kernel.base_kernel.raw_lengthscale.grad, reference[1]),
              relative(posterior.mean, reference[2]), relative(posterior.variance, reference[3])]
    assert max(errors) < (1e-8 if dtype == torch.float64 else 3e-2), errors


def test_batched_per_point_noise_with_learned_extra_noise_and_test_time_noise_is_the_dense_algebra():
    """Three independent data sets with their own per-point noise, learned extra noise and test-time noise
    (``likelihood(model(x*), noise=...)``) on one unbatched sketched kernel.  GPyTorch's exact model of the same
    layout fails in prediction (``mat2 must be a matrix, got 3-D tensor`` in its predictive covariance); rfgp's is
    the dense algebra per member.  The likelihood adds to the latent variance what GPyTorch's likelihood adds for
    any kernel: at other points than the training points the learned extra noise alone, and with ``noise=`` that
    noise twice instead (GPyTorch 1.15 passes ``noise=`` to the learned part too, which then returns it)."""
    generator = torch.Generator().manual_seed(1)
    x, y, _, test_x = regression_data(60, -4, 1)
    noise = torch.stack([spread_noise(60, -4, 1, generator) for _ in range(3)])
    targets = y + 0.1 * torch.randn(3, 60, generator=generator, dtype=F64)
    test_noise = torch.full((3, 7), 0.3, dtype=F64)
    kernel = rfgp.sketch(exact_rbf(), 256, method="orf", seed=0)
    likelihood = FixedNoiseGaussianLikelihood(noise=noise, learn_additional_noise=True, batch_shape=torch.Size([3]))
    likelihood.second_noise = torch.tensor([[0.01], [0.05], [0.2]], dtype=F64)
    model = LikelihoodGP(x, targets, kernel, likelihood, torch.Size([3])).double()
    loss = -ExactMarginalLogLikelihood(likelihood, model)(model(x), targets)
    model.eval()
    with torch.no_grad():
        latent = model(test_x)
        predictive, given = likelihood(latent), likelihood(latent, noise=test_noise)
    for member in range(3):
        constant = float(model.mean_module.constant[member].detach())
        extra = likelihood.second_noise[member].detach()
        reference = dense_reference(kernel, x, targets[member], noise[member] + extra, constant, test_x)
        torch.testing.assert_close(loss[member].detach(), reference[0], rtol=1e-10, atol=0)
        torch.testing.assert_close(latent.mean[member], reference[2], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(latent.variance[member], reference[3], rtol=1e-9, atol=0)
        torch.testing.assert_close(predictive.mean[member], reference[2], rtol=1e-9, atol=1e-12)
        torch.testing.assert_close(predictive.variance[member], reference[3] + extra, rtol=1e-9, atol=0)
        torch.testing.assert_close(given.variance[member], reference[3] + 2 * test_noise[member], rtol=1e-9, atol=0)


def test_non_finite_per_point_noise_is_refused_by_name():
    """GPyTorch rounds a zero or negative fixed noise up to 10⁻⁶ (float64) with a NumericalWarning, as for its exact
    kernels; NaN or ±Inf survive that rounding and are refused, naming the noise."""
    x, y, noise, _ = regression_data(50, -2, 0)
    for bad in (float("nan"), float("inf")):
        noisy = noise.clone()
        noisy[3] = bad
        likelihood = FixedNoiseGaussianLikelihood(noise=noisy)
        model = LikelihoodGP(x, y, rfgp.sketch(exact_rbf(), 32, method="orf", seed=0), likelihood).double()
        with pytest.raises(InvalidValueError, match="the likelihood's noise variances must be finite and > 0"):
            ExactMarginalLogLikelihood(likelihood, model)(model(x), y)


def test_botorch_train_yvar_over_eight_decades_with_nystrom_landmarks_at_every_point_is_the_exact_model():
    """SingleTaskGP(train_Yvar=...) with Yvar 10⁻⁶ … 10², BoTorch's default Standardize and a Normalize input
    transform: MLL, gradient, posterior, and the posterior with ``observation_noise=True`` and with a Tensor of
    test-time noise.  Measured largest relative error 1e-4 (the landmarks' jitter against noise 10⁻⁶)."""
    pytest.importorskip("botorch")
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize

    generator = torch.Generator().manual_seed(0)
    train_x = torch.rand(50, 2, generator=generator, dtype=F64)
    train_y = (torch.sin(4 * train_x[:, 0]) + train_x[:, 1]).unsqueeze(-1)
    train_yvar = spread_noise(50, -6, 2, generator).unsqueeze(-1)
    test_x = torch.rand(6, 2, generator=generator, dtype=F64)
    landmarks = torch.cat([train_x, test_x])

    def outputs(convert):
        model = SingleTaskGP(train_x, train_y, train_Yvar=train_yvar, input_transform=Normalize(d=2))
        model.covar_module = convert(model.covar_module)
        loss = -ExactMarginalLogLikelihood(model.likelihood, model)(model(*model.train_inputs), model.train_targets)
        loss.backward()
        gradient = next(p.grad for name, p in model.named_parameters() if "raw_lengthscale" in name)
        model.eval()
        with torch.no_grad():
            latent = model.posterior(test_x)
            observed = model.posterior(test_x, observation_noise=True)
            given = model.posterior(test_x, observation_noise=torch.full((6, 1), 0.5, dtype=F64))
        return (loss.detach(), gradient, latent.mean, latent.variance, observed.variance, given.variance,
                given.mvn.covariance_matrix)

    exact = outputs(lambda kernel: kernel)
    # the landmarks live in the coordinates the kernel sees: Normalize's, fitted on train_x
    bounds = torch.stack([train_x.min(0).values, train_x.max(0).values])
    sketched = outputs(lambda kernel: rfgp.sketch(kernel, len(landmarks), method="nystrom", seed=0,
                                                  x_sample=(landmarks - bounds[0]) / (bounds[1] - bounds[0])))
    errors = [relative(s, e) for s, e in zip(sketched, exact)]
    assert max(errors) < 1e-3, errors


def heteroskedastic_training(convert_main, convert_noise, steps=3):
    """GPyTorch's heteroskedastic recipe trained jointly: the noise GP (fitted to log squared residuals) is the
    ``HeteroskedasticNoise`` of the main GP and its own marginal likelihood enters the loss as a
    ``NoiseModelAddedLossTerm``; Adam steps on all parameters of both GPs."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=generator, dtype=F64)
    scale = 0.05 + 0.5 * x[:, 0]
    y = torch.sin(6 * x[:, 0]) + scale * torch.randn(40, generator=generator, dtype=F64)
    test_x = torch.linspace(0, 1, 9, dtype=F64).view(-1, 1)
    noise_gp = LikelihoodGP(x, scale.square().log(), convert_noise(exact_rbf((0.4,), 1.0)),
                            GaussianLikelihood()).double()
    likelihood = _GaussianLikelihoodBase(noise_covar=HeteroskedasticNoise(noise_gp)).double()
    model = LikelihoodGP(x, y, convert_main(exact_rbf((0.3,), 1.0)), likelihood).double()
    model.register_added_loss_term("noise_added_loss")
    model.update_added_loss_term("noise_added_loss", NoiseModelAddedLossTerm(noise_gp))
    return (*adam_then_predict(model, x, y, test_x, steps),
            torch.cat([p.detach().flatten() for p in model.parameters()]))


def adam_then_predict(model, x, y, test_x, steps):
    """(losses, predictive mean, predictive variance) after ``steps`` Adam steps on the model's MLL, the inputs
    passed to the likelihood too (its noise model evaluates at them)."""
    likelihood = model.likelihood
    mll = ExactMarginalLogLikelihood(likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -mll(model(x), y, x)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():
        predictive = likelihood(model(test_x), test_x)
    return torch.stack(losses), predictive.mean, predictive.variance


def test_heteroskedastic_noise_gp_trained_jointly_with_nystrom_landmarks_at_every_point_is_the_exact_model():
    """rfgp kernels in both GPs; after each step the noise GP's caches are rebuilt (its mode is restored to train by
    ``HeteroskedasticNoise``), so the trajectory is the exact one, not only the first evaluation."""
    exact = heteroskedastic_training(lambda kernel: kernel, lambda kernel: kernel)
    x = torch.rand(40, 1, generator=torch.Generator().manual_seed(0), dtype=F64)
    landmarks = torch.cat([x, torch.linspace(0, 1, 9, dtype=F64).view(-1, 1)])

    def nystrom(kernel):
        return rfgp.sketch(kernel, len(landmarks), method="nystrom", x_sample=landmarks, seed=0)

    sketched = heteroskedastic_training(nystrom, nystrom)
    errors = [relative(s, e) for s, e in zip(sketched, exact)]
    assert max(errors) < 1e-6, errors


class NetworkNoise(gpytorch.likelihoods.noise_models.Noise):
    """A practitioner's learned noise: a small network of x returns the noise diagonal (≥ 10⁻⁴)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Linear(1, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).double()

    def forward(self, *params, shape=None, noise=None, **kwargs):
        if noise is not None:
            return DiagLinearOperator(noise)
        x = params[0] if torch.is_tensor(params[0]) else params[0][0]
        return DiagLinearOperator(torch.nn.functional.softplus(self.net(x)).squeeze(-1) + 1e-4)


def network_noise_training(convert, steps=3):
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(40, 1, generator=generator, dtype=F64)
    y = torch.sin(6 * x[:, 0]) + (0.05 + 0.5 * x[:, 0]) * torch.randn(40, generator=generator, dtype=F64)
    likelihood = _GaussianLikelihoodBase(noise_covar=NetworkNoise()).double()
    model = LikelihoodGP(x, y, convert(exact_rbf((0.3,), 1.0)), likelihood).double()
    test_x = torch.linspace(0, 1, 9, dtype=F64).view(-1, 1)
    return adam_then_predict(model, x, y, test_x, steps)


def test_noise_from_a_network_trained_jointly_with_nystrom_landmarks_at_every_point_is_the_exact_model():
    x = torch.rand(40, 1, generator=torch.Generator().manual_seed(0), dtype=F64)
    landmarks = torch.cat([x, torch.linspace(0, 1, 9, dtype=F64).view(-1, 1)])
    exact = network_noise_training(lambda kernel: kernel)
    sketched = network_noise_training(lambda kernel: rfgp.sketch(kernel, len(landmarks), method="nystrom",
                                                                 x_sample=landmarks, seed=0))
    errors = [relative(s, e) for s, e in zip(sketched, exact)]
    assert max(errors) < 1e-6, errors


@pytest.mark.parametrize("likelihood", ["fixed_plus_learned", "heteroskedastic"])
def test_fit_mll_warns_when_targets_vary_less_than_the_learned_noise_floor(likelihood):
    """The learned part of these noises is kept ≥ 10⁻⁴ (``second_noise``'s constraint; ``HeteroskedasticNoise``'s):
    targets that vary less are explained as noise.  Before, only a plain ``GaussianLikelihood`` was checked, and
    ``FixedNoiseGaussianLikelihood(learn_additional_noise=True)`` on sin(6x)·3·10⁻³ with its known 1 % noise trained
    without a word to a relative RMSE of 0.45 (0.001 at unit scale)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(60, 1, generator=generator, dtype=F64)
    y = 3e-3 * torch.sin(6 * x[:, 0])
    if likelihood == "fixed_plus_learned":
        model_likelihood = FixedNoiseGaussianLikelihood(noise=torch.full((60,), 1e-5, dtype=F64),
                                                        learn_additional_noise=True)
    else:
        noise_gp = LikelihoodGP(x, torch.full((60,), -12.0, dtype=F64), exact_rbf((0.4,), 1.0), GaussianLikelihood())
        model_likelihood = _GaussianLikelihoodBase(noise_covar=HeteroskedasticNoise(noise_gp))
    model = LikelihoodGP(x, y, rfgp.sketch(exact_rbf((0.3,), 1.0), 32, method="orf", seed=0), model_likelihood).double()
    with pytest.warns(rfgp.DataScaleWarning, match=r"vary with a variance of 4\.\d+e-06 or less, below the smallest "
                                                   r"noise variance the likelihood allows \(0\.0001,"):
        rfgp.fit_mll(model, num_iterations=1, progress=False)
    # the same targets at unit scale: no warning; and known noise alone (nothing learned) has no floor to report
    unit = LikelihoodGP(x, y / 3e-3, rfgp.sketch(exact_rbf((0.3,), 1.0), 32, method="orf", seed=0),
                        copy.deepcopy(model_likelihood)).double()
    known = LikelihoodGP(x, y, rfgp.sketch(exact_rbf((0.3,), 1.0), 32, method="orf", seed=0),
                         FixedNoiseGaussianLikelihood(noise=torch.full((60,), 1e-5, dtype=F64))).double()
    with warnings.catch_warnings():
        warnings.simplefilter("error", rfgp.DataScaleWarning)
        rfgp.fit_mll(unit, num_iterations=1, progress=False)
        rfgp.fit_mll(known, num_iterations=1, progress=False)


def test_negative_binomial_svgp_approaches_the_exact_kernels():
    """GPyTorch's NegativeBinomialLikelihood (over-dispersed counts) in a whitened SVGP: objective, lengthscale
    gradient, latent mean and variance and the predictive mean approach the exact kernel's as F grows.  Measured
    largest relative errors 0.26 at F = 256, 0.011 at 65 536."""
    likelihood = gpytorch.likelihoods.NegativeBinomialLikelihood
    errors = errors_by_width(svgp_outputs(likelihood, lambda f: torch.round(torch.exp(f))))
    assert_approaches(errors, 0.05)


class SVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing_points, kernel, natural):
        distribution = (gpytorch.variational.NaturalVariationalDistribution if natural
                        else gpytorch.variational.CholeskyVariationalDistribution)(inducing_points.shape[-2])
        strategy = gpytorch.variational.VariationalStrategy(self, inducing_points, distribution,
                                                            learn_inducing_locations=True)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def minibatch_training(convert, likelihood_class, natural, num_points=120):
    """GPyTorch's SVGP recipe on a shuffled DataLoader (batches of 40, two epochs): natural gradients (NGD) for q(u)
    with Adam for the hyperparameters, inducing locations and the likelihood's, or Adam for everything; seeded
    Monte-Carlo terms.  Returns the losses, the latent mean and variance at test points and the predictive mean."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 2, generator=generator, dtype=F64)
    f = torch.sin(4 * x[:, 0]) + x[:, 1]
    outliers = torch.where(torch.rand(num_points, generator=generator, dtype=F64) < 0.1, 5.0, 0.0)
    targets = {gpytorch.likelihoods.NegativeBinomialLikelihood: torch.round(torch.exp(f)),
               gpytorch.likelihoods.StudentTLikelihood: f + outliers,
               gpytorch.likelihoods.BernoulliLikelihood: (f > f.median()).to(F64)}[likelihood_class]
    test_x = torch.rand(10, 2, generator=generator, dtype=F64)
    torch.manual_seed(0)
    likelihood = likelihood_class().double()
    model = SVGP(x[:12].clone(), convert(exact_rbf()), natural).double()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=num_points)
    if natural:
        optimizers = [gpytorch.optim.NGD(model.variational_parameters(), num_data=num_points, lr=0.1),
                      torch.optim.Adam([*model.hyperparameters(), *likelihood.parameters()], lr=0.01)]
    else:
        optimizers = [torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.01)]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, targets), batch_size=40, shuffle=True,
                                         generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(2):
        for x_batch, y_batch in loader:
            for optimizer in optimizers:
                optimizer.zero_grad()
            torch.manual_seed(len(losses))  # the same standard normals for both kernels' Monte-Carlo terms
            with gpytorch.settings.num_likelihood_samples(16):
                loss = -elbo(model(x_batch), y_batch)
            loss.backward()
            for optimizer in optimizers:
                optimizer.step()
            losses.append(loss.detach())
    model.eval()
    likelihood.eval()
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(16):
        latent = model(test_x)
        torch.manual_seed(9)
        predictive = likelihood(latent)
    return torch.stack(losses), latent.mean, latent.variance, predictive.mean.mean(0)


@pytest.mark.parametrize("likelihood", ["negative_binomial", "student_t", "bernoulli"])
@pytest.mark.parametrize("natural", [True, False], ids=["ngd", "adam"])
def test_minibatch_training_with_nystrom_landmarks_at_every_point_follows_the_exact_trajectory(likelihood, natural):
    """Counts, outliers and binary labels, trained on minibatches with moving inducing points: with every training
    and test point a Nyström landmark, K(Z, x) is exact and K(Z, Z) exact to the landmarks' resolution, so the whole
    trajectory and the trained predictive are the exact kernel's (measured ≤ 1.7e-6 relative)."""
    likelihood_class = {"negative_binomial": gpytorch.likelihoods.NegativeBinomialLikelihood,
                        "student_t": gpytorch.likelihoods.StudentTLikelihood,
                        "bernoulli": gpytorch.likelihoods.BernoulliLikelihood}[likelihood]
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(120, 2, generator=generator, dtype=F64)
    torch.rand(120, generator=generator, dtype=F64)
    landmarks = torch.cat([x, torch.rand(10, 2, generator=generator, dtype=F64)])
    exact = minibatch_training(lambda kernel: kernel, likelihood_class, natural)
    sketched = minibatch_training(lambda kernel: rfgp.sketch(kernel, len(landmarks), method="nystrom",
                                                             x_sample=landmarks, seed=0), likelihood_class, natural)
    errors = [relative(s, e) for s, e in zip(sketched, exact)]
    assert max(errors) < 1e-5, errors


@pytest.mark.parametrize("num_features", [16, 256])  # the F × F path (N + m > F), the N × N one
@pytest.mark.parametrize("given", [False, True])
def test_heteroskedastic_fantasy_model_is_the_formula_with_or_without_given_noise(num_features, given):
    """``get_fantasy_model(x_new, y_new)`` of a heteroskedastic model conditions the new points on the noise GP's
    noise there; with ``noise=`` on that noise (BoTorch's ``condition_on_observations(X, Y, noise)``, as for Gaussian
    and fixed-noise likelihoods).  Before, ``noise=`` raised ``NotImplementedError`` for any noise model but the
    homoscedastic one (GPyTorch's exact strategy ignores it, and conditions on the noise GP's noise)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(50, 1, generator=generator, dtype=F64)
    y = torch.sin(6 * x[:, 0]) + 0.1 * torch.randn(50, generator=generator, dtype=F64)
    new_x = torch.rand(3, 1, generator=generator, dtype=F64)
    new_y = torch.sin(6 * new_x[:, 0])
    test_x = torch.linspace(0, 1, 5, dtype=F64).view(-1, 1)
    noise_gp = LikelihoodGP(x, (0.01 + x[:, 0]).log(), exact_rbf((0.4,), 1.0), GaussianLikelihood()).double()
    likelihood = _GaussianLikelihoodBase(noise_covar=HeteroskedasticNoise(noise_gp))
    kernel = rfgp.sketch(exact_rbf((0.3,), 1.0), num_features, method="orf", seed=0)
    model = LikelihoodGP(x, y, kernel, likelihood).double().eval()
    new_noise = torch.full((3,), 0.05, dtype=F64)
    with torch.no_grad():
        likelihood(model(test_x), test_x)  # the caches a fantasy starts from
        fantasy = model.get_fantasy_model(new_x, new_y, **({"noise": new_noise} if given else {}))
        posterior = fantasy(test_x)
        inputs, targets = torch.cat([x, new_x]), torch.cat([y, new_y])
        noise = likelihood.noise_covar(inputs).diagonal()
        if given:
            noise = torch.cat([noise[:50], new_noise])
        constant = model.mean_module.constant
        train = kernel(inputs).to_dense() + torch.diag(noise)
        cross = kernel(test_x, inputs).to_dense()
        mean = constant + cross @ torch.linalg.solve(train, targets - constant)
        variance = kernel(test_x, diag=True) - (cross * torch.linalg.solve(train, cross.mT).mT).sum(-1)
    torch.testing.assert_close(posterior.mean, mean, rtol=1e-9, atol=1e-10)
    torch.testing.assert_close(posterior.variance, variance, rtol=1e-8, atol=1e-10)
