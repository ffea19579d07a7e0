"""GPyTorch's approximate-GP tutorial patterns with rfgp kernels, each against the same model with the exact kernel.

Every model is built twice with the same variational parameters and hyperparameters (distinct per batch member, so a
batch kernel that mixed its members' hyperparameters would show): once with GPyTorch's exact kernel, once converted by
``rfgp.sketch``.  The ELBO (or the objective named), the gradient of a lengthscale and the predictions approach the
exact ones as F grows (random-feature error ∝ 1/√F: a 256× wider map has 16× smaller errors on average, so the tests
ask for less than half the narrow map's error and a bound at the wide one), and a Nyström kernel whose landmarks are
all the points agrees to its jitter.  Monte-Carlo objectives draw the same standard normals in both models (GPyTorch
samples the marginals in training: N(μ, σ²) from the same seed), so the comparison is not drowned in sampling noise.
"""

import gpytorch
import pytest
import torch
from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel
from gpytorch.models import ApproximateGP
from gpytorch.variational import (
    CholeskyVariationalDistribution,
    VariationalStrategy,
)

import rfgp
from rfgp.core.validation import NonFiniteError

F64 = torch.float64
N, M, D = 50, 10, 2


def data(seed=0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(N, D, generator=gen, dtype=F64)
    f = 2 * torch.sin(4 * x[:, 0]) + x[:, 1]
    return x, f, torch.rand(20, D, generator=gen, dtype=F64), gen


def exact_kernel(batch_shape=torch.Size([]), nu=None):
    """ScaleKernel(RBF or Matérn-ν, ARD) with lengthscales 0.2–0.5 and outputscales 0.7–1.6 spread over the batch."""
    base = RBFKernel if nu is None else (lambda **kw: MaternKernel(nu=nu, **kw))
    kernel = ScaleKernel(base(ard_num_dims=D, batch_shape=batch_shape), batch_shape=batch_shape).double()
    count = batch_shape.numel()
    kernel.base_kernel.lengthscale = torch.linspace(0.2, 0.5, D * count, dtype=F64).reshape(*batch_shape, 1, D)
    kernel.outputscale = torch.linspace(0.7, 1.6, count, dtype=F64).reshape(batch_shape)
    return kernel


def raw_lengthscale(kernel):
    return next(p for name, p in kernel.named_parameters() if name.endswith("raw_lengthscale"))


def set_variational(strategy, seed=3):
    """A fixed, non-trivial q(u) for any of GPyTorch's variational distributions (GPyTorch would otherwise initialise
    it to the prior at the first call): means N(0, 0.25), covariances S = CCᵀ with C = 0.4·I + 0.3·strict-tril(ε)."""
    gen = torch.Generator().manual_seed(seed)
    distribution = strategy._variational_distribution
    for name, param in distribution.named_parameters():
        noise = torch.randn(param.shape, generator=gen, dtype=F64)
        if param.dim() >= 2 and param.shape[-1] == param.shape[-2]:
            chol = 0.3 * noise.tril(-1) + 0.4 * torch.eye(param.shape[-1], dtype=F64)
            if name == "natural_mat":  # NaturalVariationalDistribution: −S⁻¹/2
                param.data = -0.5 * torch.cholesky_inverse(chol)
            elif name == "natural_tril_mat":  # TrilNaturalVariationalDistribution: L with LLᵀ = S⁻¹
                param.data = torch.linalg.cholesky(torch.cholesky_inverse(chol))
            else:
                param.data = chol
        else:
            param.data = 0.5 * noise
    strategy.variational_params_initialized.fill_(1)


class SVGP(ApproximateGP):
    """GPyTorch's SVGP tutorial model, with the distribution, strategy and batch shape as arguments."""

    def __init__(self, covar_module, inducing_points, distribution=CholeskyVariationalDistribution,
                 strategy=VariationalStrategy, batch_shape=torch.Size([]), learn_inducing_locations=True):
        inducing_points = inducing_points.expand(*batch_shape, *inducing_points.shape).clone()
        q_u = distribution(inducing_points.shape[-2], batch_shape=batch_shape)
        super().__init__(strategy(self, inducing_points, q_u, learn_inducing_locations=learn_inducing_locations))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_nan_inducing_point_is_named_as_the_kernels_x1():
    """A NaN inducing point (a diverged training step) first reaches the kernel in K(Z, x), a lazy cross-covariance
    whose rows are checked block by block; building it probes Z's first row, and that probe's error named the feature
    map's argument "x" with its 2 entries ("x contains NaN ... of 2"), as if the data were at fault."""
    x, f, _, _ = data()
    model = SVGP(rfgp.sketch(exact_kernel(), 64, seed=0), x[:M].clone()).double()
    model.variational_strategy.inducing_points.data[0, 1] = float("nan")
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    with pytest.raises(NonFiniteError, match=r"^x1 contains NaN or Inf entries \(1 NaN and 0 ±Inf of 20, the first "
                                             r"at index \(0, 1\)\)"):
        gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), f)
    kernel = rfgp.kernels.SketchedRBFKernel(64, seed=0, ard_num_dims=D).double()
    z = x[:M].clone()
    z[0, 0] = float("inf")
    with pytest.raises(NonFiniteError, match=r"^x1 contains NaN or Inf entries \(0 NaN and 1 ±Inf of 20"):
        kernel(z, x).to_dense()
    x = x.clone()
    x[0, 0] = float("nan")
    with pytest.raises(NonFiniteError, match=r"^x2 contains NaN or Inf entries \(1 NaN and 0 ±Inf of 100"):
        kernel(z[1:], x).to_dense()


def relative_errors(sketched, exact):
    return [float((s - e).abs().max() / e.abs().max()) for s, e in zip(sketched, exact)]


def errors_by_width(outputs, widths=(256, 65536), method="orf"):
    """Relative errors of ``outputs(convert)`` (a tuple of tensors) against the exact kernel's at each width."""
    exact = outputs(lambda kernel: kernel)
    return [relative_errors(outputs(lambda kernel: rfgp.sketch(kernel, width, method=method, seed=0)), exact)
            for width in widths]


def assert_approaches(errors, bound):
    narrow, wide = errors
    assert all(w < n / 2 for w, n in zip(wide, narrow)), errors
    assert max(wide) < bound, errors


def svgp_outputs(likelihood, target, distribution=CholeskyVariationalDistribution, strategy=VariationalStrategy,
                 objective=gpytorch.mlls.VariationalELBO, batch_shape=torch.Size([]), nu=None,
                 learn_inducing_locations=True, seed=0, **objective_options):
    """(objective, ∂objective/∂raw lengthscale, predictive mean, predictive variance) of an SVGP built around
    ``convert(exact kernel)``, with q(u) from :func:`set_variational`; predictions in eval mode under
    ``fast_pred_var`` (latent f where the likelihood's predictive is not Gaussian-like, else y)."""
    x, f, xs, _ = data(seed)

    def outputs(convert):
        torch.manual_seed(5)  # the likelihood's own initial values (SoftmaxLikelihood's mixing weights)
        lik = likelihood().double()
        model = SVGP(convert(exact_kernel(batch_shape, nu)), x[:M].clone(), distribution, strategy, batch_shape,
                     learn_inducing_locations).double()
        set_variational(model.variational_strategy)
        with gpytorch.settings.num_likelihood_samples(512):
            torch.manual_seed(7)  # the same standard normals in both models' Monte-Carlo terms
            value = objective(lik, model, num_data=N, **objective_options)(model(x), target(f))
        value = sum(value) if isinstance(value, tuple) else value
        (grad,) = torch.autograd.grad(value.sum(), raw_lengthscale(model.covar_module))
        model.eval()
        lik.eval()
        # GPyTorch expands the predictive MVN to num_likelihood_samples copies and factorises each (exact kernel too)
        with torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.num_likelihood_samples(16):
            latent = model(xs)
            torch.manual_seed(8)
            predictive = lik(latent)
        return value.detach(), grad, latent.mean, latent.variance, predictive.mean
    return outputs


LIKELIHOODS = {
    # name: (likelihood, target from the latent f, bound on the wide map's largest relative error)
    "bernoulli": (gpytorch.likelihoods.BernoulliLikelihood, lambda f: (f > f.median()).to(F64), 0.05),
    "student_t": (gpytorch.likelihoods.StudentTLikelihood, lambda f: f, 0.03),
    "laplace": (gpytorch.likelihoods.LaplaceLikelihood, lambda f: f, 0.03),
    "beta": (gpytorch.likelihoods.BetaLikelihood, lambda f: torch.sigmoid(f).clamp(0.02, 0.98), 0.03),
    "poisson": (gpytorch.likelihoods.PoissonLikelihood, lambda f: torch.round(torch.exp(f / 2)), 0.03),
}


@pytest.mark.parametrize("name", LIKELIHOODS)
def test_non_gaussian_likelihoods_approach_the_exact_kernels(name):
    likelihood, target, bound = LIKELIHOODS[name]
    errors = errors_by_width(svgp_outputs(likelihood, target))
    # measured (objective, gradient, latent mean, latent variance, predictive mean): Bernoulli 0.023, 0.41, 0.22,
    # 0.11, 0.085 at F = 256 and 8e-4, 0.021, 0.012, 0.0056, 0.0047 at 65 536; the others ≤ 0.0062 at 65 536
    assert_approaches(errors, bound)


GAUSSIAN = (gpytorch.likelihoods.GaussianLikelihood, lambda f: f)

STRATEGIES = {
    # name: svgp_outputs options, bound on the wide map's largest relative error
    "natural": (dict(distribution=gpytorch.variational.NaturalVariationalDistribution), 0.05),
    "tril_natural": (dict(distribution=gpytorch.variational.TrilNaturalVariationalDistribution), 0.05),
    "mean_field": (dict(distribution=gpytorch.variational.MeanFieldVariationalDistribution), 0.05),
    "delta": (dict(distribution=gpytorch.variational.DeltaVariationalDistribution), 0.05),
    # K_ZZ⁻¹ itself enters the unwhitened predictive mean and KL: the kernel's error is amplified by its conditioning
    # (measured: largest error 6.9 at F = 256, 0.045 at 65 536)
    "unwhitened": (dict(strategy=gpytorch.variational.UnwhitenedVariationalStrategy), 0.1),
    # CIQ's own quadrature and msMINRES error on this (small, 0.03) gradient is 0.059 (default settings against 30
    # quadrature points and tolerance 1e-10, exact kernel); measured 0.21, 0.062, 0.015 at F = 4096, 65 536, 262 144
    "ciq": (dict(strategy=gpytorch.variational.CiqVariationalStrategy), 0.1),
    "fixed_inducing_points": (dict(learn_inducing_locations=False), 0.05),
    "predictive_log_likelihood": (dict(objective=gpytorch.mlls.PredictiveLogLikelihood), 0.05),
    "gamma_robust": (dict(objective=gpytorch.mlls.GammaRobustVariationalELBO), 0.05),
    "elbo_terms": (dict(combine_terms=False), 0.05),
    "matern_half": (dict(nu=0.5), 0.05),
    "matern_five_halves": (dict(nu=2.5), 0.05),
}


@pytest.mark.parametrize("name", STRATEGIES)
def test_variational_distributions_strategies_and_objectives_approach_the_exact_kernels(name):
    options, bound = STRATEGIES[name]
    errors = errors_by_width(svgp_outputs(*GAUSSIAN, **options))
    # measured at F = 65 536: largest relative error 0.0054 (mean field) to 0.036 (Matérn-½), see the bounds above
    assert_approaches(errors, bound)


T, LATENTS = 3, 2


class MultitaskSVGP(ApproximateGP):
    """GPyTorch's multitask SVGP tutorial: ``"independent"`` (IndependentMultitaskVariationalStrategy, a kernel with
    ``batch_shape=[T]``) or ``"lmc"`` (LMCVariationalStrategy over ``batch_shape=[L]`` latents)."""

    def __init__(self, kind, convert, inducing_points):
        batch_shape = torch.Size([T if kind == "independent" else LATENTS])
        inducing_points = inducing_points.expand(*batch_shape, *inducing_points.shape).clone()
        q_u = CholeskyVariationalDistribution(inducing_points.shape[-2], batch_shape=batch_shape)
        base = VariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=True)
        if kind == "independent":
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(base, num_tasks=T)
        else:
            strategy = gpytorch.variational.LMCVariationalStrategy(base, num_tasks=T, num_latents=LATENTS,
                                                                  latent_dim=-1)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = convert(exact_kernel(batch_shape))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def multitask_outputs(kind):
    """(ELBO, ∂ELBO/∂raw lengthscales, predictive mean and variance of y) of :class:`MultitaskSVGP`."""
    x, f, xs, gen = data()
    y = torch.stack([f, torch.cos(3 * x[:, 1]), x.sum(-1)], -1) + 0.05 * torch.randn(N, T, generator=gen, dtype=F64)

    def outputs(convert):
        torch.manual_seed(5)  # the LMC coefficients' initial values
        model = MultitaskSVGP(kind, convert, x[:M].clone()).double()
        set_variational(model.variational_strategy.base_variational_strategy)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=T).double()
        elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), y)
        (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.covar_module))
        model.eval()
        likelihood.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            predictive = likelihood(model(xs))
        return elbo.detach(), grad, predictive.mean, predictive.variance
    return outputs


@pytest.mark.parametrize("kind", ["independent", "lmc"])
def test_multitask_svgp_approaches_the_exact_kernels(kind):
    errors = errors_by_width(multitask_outputs(kind))
    # measured: independent 0.0044, 0.12, 0.12, 0.059 at F = 256 and 4e-4, 0.007, 0.0058, 0.0016 at 65 536;
    # LMC 0.0059, 0.19, 0.11, 0.023 and 6e-5, 0.0081, 0.002, 5e-4
    assert_approaches(errors, 0.03)


@pytest.mark.parametrize("kind", ["independent", "lmc"])
def test_multitask_svgp_with_nystrom_landmarks_at_every_point_is_the_exact_model(kind):
    """Nyström features with the N training and 20 test points as landmarks (the inducing points among them) reproduce
    the blocks of K on Z, x and x* of every task's batch kernel, so the model is the exact one up to the jitter."""
    x, _, xs, _ = data()
    points = torch.cat([x, xs])
    outputs = multitask_outputs(kind)
    exact = outputs(lambda kernel: kernel)
    nystrom = outputs(lambda kernel: rfgp.sketch(kernel, len(points), method="nystrom", x_sample=points, seed=0))
    errors = relative_errors(nystrom, exact)
    assert max(errors) < 1e-4, errors  # measured ≤ 6.3e-6 (jitter 1e-8·mean diag K_ZZ, amplified by K_ZZ⁻¹)


def test_softmax_likelihood_over_independent_latents_approaches_the_exact_kernels():
    """GPyTorch's multi-class SVGP: LATENTS latent GPs (a batch kernel) mixed into 3 classes by SoftmaxLikelihood."""
    x, f, xs, _ = data()
    labels = (f > 0.5).long() + (f > 1.5).long()
    batch_shape = torch.Size([LATENTS])

    def outputs(convert):
        torch.manual_seed(5)
        likelihood = gpytorch.likelihoods.SoftmaxLikelihood(num_features=LATENTS, num_classes=3).double()
        q_u = CholeskyVariationalDistribution(M, batch_shape=batch_shape)
        model = SVGP(convert(exact_kernel(batch_shape)), x[:M].clone(), batch_shape=batch_shape).double()
        model.variational_strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
            VariationalStrategy(model, x[:M].expand(LATENTS, M, D).clone(), q_u), num_tasks=LATENTS)
        set_variational(model.variational_strategy.base_variational_strategy)
        with gpytorch.settings.num_likelihood_samples(512):
            torch.manual_seed(7)
            elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), labels)
        (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.covar_module))
        model.eval()
        likelihood.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var(), gpytorch.settings.num_likelihood_samples(8):
            latent = model(xs)
            torch.manual_seed(8)
            probabilities = likelihood(latent).probs.mean(0)
        return elbo.detach(), grad, latent.mean, latent.variance, probabilities
    errors = errors_by_width(outputs)
    # measured: ELBO, gradient, latent mean and variance, class probabilities 0.012, 0.15, 0.14, 0.067, 0.094 at
    # F = 256 and 2.6e-4, 0.0095, 0.0049, 0.0052, 0.0026 at 65 536
    assert_approaches(errors, 0.03)


def test_orthogonally_decoupled_strategy_approaches_the_exact_kernels():
    """OrthogonallyDecoupledVariationalStrategy: 2M mean inducing points (DeltaVariationalDistribution) around an
    M-point covariance strategy, as in GPyTorch's example; both Gram blocks come from the same rfgp kernel."""
    x, f, xs, _ = data()

    class DecoupledSVGP(SVGP):
        def __init__(self, covar_module):
            super().__init__(covar_module, x[:M].clone())
            self.variational_strategy = gpytorch.variational.OrthogonallyDecoupledVariationalStrategy(
                self.variational_strategy, x[M:3 * M].clone(), gpytorch.variational.DeltaVariationalDistribution(2 * M))

    def outputs(convert):
        model = DecoupledSVGP(convert(exact_kernel())).double()
        set_variational(model.variational_strategy.base_variational_strategy)
        set_variational(model.variational_strategy, seed=4)
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), f)
        (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.covar_module))
        model.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            latent = model(xs)
        return elbo.detach(), grad, latent.mean, latent.variance
    # measured: 0.0097, 0.16, 0.29, 0.11 at F = 256 and 1.4e-4, 0.0041, 0.012, 0.0056 at 65 536
    assert_approaches(errors_by_width(outputs), 0.03)


def test_maclaurin_svgp_on_centred_inputs_approaches_the_exact_kernel():
    """Optimized Maclaurin features where they fit: inputs centred, ‖x‖²/ℓ² ≤ 2.  (On [0, 1]² with ℓ = 0.3 the
    truncated map leaves out part of k(x, x) at any width — Gram error 0.29 at F = 16 384 — and a variational model
    has no bias-corrected variance: it is the SVGP of the truncated kernel; see README.)"""
    x, f, xs, _ = data()
    x, xs = x - 0.5, xs - 0.5

    def outputs(convert):
        kernel = exact_kernel()
        kernel.base_kernel.lengthscale = 0.5
        model = SVGP(convert(kernel), x[:M].clone()).double()
        set_variational(model.variational_strategy)
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), f)
        (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.covar_module))
        model.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            latent = model(xs)
        return elbo.detach(), grad, latent.mean, latent.variance
    errors = errors_by_width(outputs, widths=(256, 4096), method="maclaurin")
    # measured: 0.0088, 0.084, 0.31, 0.25 at F = 256 and 3.5e-4, 0.012, 0.0075, 0.036 at 4096 (the variance keeps
    # the truncation's share of k(x, x) longest)
    assert_approaches(errors, 0.05)
