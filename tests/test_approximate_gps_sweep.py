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
from gpytorch.models.deep_gps import DeepGP, DeepGPLayer
from gpytorch.models.deep_gps.dspp import DSPP, DSPPLayer
from gpytorch.variational import CholeskyVariationalDistribution, VariationalStrategy

import rfgp
from rfgp.core.validation import NonFiniteError
from tests._dense import SameFeaturesKernel

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
                 objective=gpytorch.mlls.VariationalELBO, nu=None, learn_inducing_locations=True, **objective_options):
    """``outputs(convert)`` for :func:`errors_by_width`: the objective, its gradient in the raw lengthscale, the latent
    mean and variance and the likelihood's predictive mean at test points of an SVGP around ``convert(exact
    kernel)``, with q(u) from :func:`set_variational`; predictions in eval mode under ``fast_pred_var``."""
    x, f, xs, _ = data()

    def outputs(convert):
        torch.manual_seed(5)  # a likelihood's random initial values, if it has any
        lik = likelihood().double()
        model = SVGP(convert(exact_kernel(nu=nu)), x[:M].clone(), distribution, strategy,
                     learn_inducing_locations=learn_inducing_locations).double()
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


def elbo_and_gradients(model, likelihood, x, y):
    """The ELBO and its gradient in every parameter of the model and likelihood, by name (a
    :class:`~tests._dense.SameFeaturesKernel`'s wrapper level dropped from the names)."""
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), y)
    named = dict(model.named_parameters()) | {f"likelihood.{k}": p for k, p in likelihood.named_parameters()}
    grads = torch.autograd.grad(elbo, list(named.values()))
    return elbo.detach(), {name.replace(".sketched.", "."): g for name, g in zip(named, grads)}


def same_feature_svgp_outputs(case, convert):
    """ELBO and gradients of the SVGP (or independent multitask SVGP) of ``case`` around ``convert(exact kernel)``."""
    x, f, _, gen = data()
    if case == "independent_multitask":
        y = torch.stack([f, torch.cos(3 * x[:, 1]), x.sum(-1)], -1) + 0.05 * torch.randn(N, T, generator=gen,
                                                                                         dtype=F64)
        model = MultitaskSVGP("independent", convert, x[:M].clone()).double()
        set_variational(model.variational_strategy.base_variational_strategy)
        likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=T).double()
        return elbo_and_gradients(model, likelihood, x, y)
    strategy = gpytorch.variational.UnwhitenedVariationalStrategy if "unwhitened" in case else VariationalStrategy
    model = SVGP(convert(exact_kernel()), x[:M].clone(), strategy=strategy).double()
    set_variational(model.variational_strategy)
    return elbo_and_gradients(model, gpytorch.likelihoods.GaussianLikelihood().double(), x, f)


@pytest.mark.parametrize("case, width, tolerance", [
    ("whitened", 64, 1e-10), ("whitened", 6, 1e-10), ("unwhitened", 64, 1e-10), ("unwhitened", 6, 1e-5),
    ("independent_multitask", 64, 1e-10)])
def test_svgp_is_the_dense_model_on_the_same_random_features(case, width, tolerance):
    """The ELBO of an SVGP with an rfgp kernel and its gradients in every parameter (inducing points, q(u), mean,
    likelihood, lengthscales, outputscale) are those of the SVGP whose kernel is the dense s·Φ(x/ℓ)Φ(y/ℓ)ᵀ of the same
    draws (:class:`~tests._dense.SameFeaturesKernel`): whitened (K_ZZ's Cholesky factor with GPyTorch's jitter) and
    unwhitened (prior N(0, K_ZZ) in the KL), F ≥ M and F = 6 < M = 10 (K̂_ZZ of rank 6: the jitter 1e-6 alone makes it
    positive definite), and an independent multitask SVGP over a batch kernel.  Their differences from the exact
    kernel's model are the random-feature error, not rfgp's algebra (guide/gpytorch.md, "How far its objective and
    gradients are from the exact kernel's").

    Errors relative to max(1, |reference|), bounded by rounding: measured ≤ 1.1e-12 except unwhitened at F = 6, whose
    KL and its gradient hold K̂_ZZ⁻¹ (twice) with cond(K̂_ZZ + 1e-6·I) ≈ 1e7: there the dense reference differs from
    itself by 7.2e-7 when √s is folded into Φ before the product (the same matrix, other rounding), rfgp by 6.4e-7."""
    rfgp_value, rfgp_grads = same_feature_svgp_outputs(case, lambda kernel: rfgp.sketch(kernel, width, seed=0))
    dense_value, dense_grads = same_feature_svgp_outputs(
        case, lambda kernel: SameFeaturesKernel(rfgp.sketch(kernel, width, seed=0)))
    assert rfgp_grads.keys() == dense_grads.keys()
    for name, value, reference in [("elbo", rfgp_value, dense_value)] + [
            (name, rfgp_grads[name], dense_grads[name]) for name in dense_grads]:
        error = float((value - reference).abs().max() / reference.abs().max().clamp_min(1))
        assert error < tolerance, (name, error)


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


def gaussian_svgp_outputs(model, x, f, xs):
    """(ELBO, its gradient in the raw lengthscale, latent mean and variance at ``xs`` in eval mode under
    ``fast_pred_var``) of ``model`` with a Gaussian likelihood."""
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)(model(x), f)
    (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.covar_module))
    model.eval()
    with torch.no_grad(), gpytorch.settings.fast_pred_var():
        latent = model(xs)
    return elbo.detach(), grad, latent.mean, latent.variance


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
        return gaussian_svgp_outputs(model, x, f, xs)
    # measured: 0.0097, 0.16, 0.29, 0.11 at F = 256 and 1.4e-4, 0.0041, 0.012, 0.0056 at 65 536
    assert_approaches(errors_by_width(outputs), 0.03)


def test_maclaurin_svgp_on_centred_inputs_approaches_the_exact_kernel():
    """Optimized Maclaurin features where they fit: inputs centred, ‖x‖²/ℓ² ≤ 2.  (On [0, 1]² with ℓ = 0.3 the
    truncated map leaves out part of k(x, x) at any width — Gram error 0.29 at F = 16 384 — and a variational model
    has no bias-corrected variance: it is the SVGP of the truncated kernel; see guide/gpytorch.md.)"""
    x, f, xs, _ = data()
    x, xs = x - 0.5, xs - 0.5

    def outputs(convert):
        kernel = exact_kernel()
        kernel.base_kernel.lengthscale = 0.5
        model = SVGP(convert(kernel), x[:M].clone()).double()
        set_variational(model.variational_strategy)
        return gaussian_svgp_outputs(model, x, f, xs)
    errors = errors_by_width(outputs, widths=(256, 4096), method="maclaurin")
    # measured: 0.0088, 0.084, 0.31, 0.25 at F = 256 and 3.5e-4, 0.012, 0.0075, 0.036 at 4096 (the variance keeps
    # the truncation's share of k(x, x) longest)
    assert_approaches(errors, 0.05)


HIDDEN = 2


class HiddenLayer(DeepGPLayer):
    """The layer of GPyTorch's deep GP tutorial (linear mean, learnt inducing points), given its kernel."""

    def __init__(self, convert, input_dims, output_dims, gen):
        batch_shape = torch.Size([]) if output_dims is None else torch.Size([output_dims])
        inducing_points = torch.rand(*batch_shape, M, input_dims, generator=gen, dtype=F64)
        q_u = CholeskyVariationalDistribution(M, batch_shape=batch_shape)
        super().__init__(VariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=True),
                         input_dims, output_dims)
        set_variational(self.variational_strategy, seed=int(torch.randint(100, (), generator=gen)))
        self.mean_module = gpytorch.means.LinearMean(input_dims, batch_shape=batch_shape)
        self.covar_module = convert(exact_kernel(batch_shape))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


class ThreeLayerDeepGP(DeepGP):
    """Two hidden layers of HIDDEN outputs each (batch kernels) and a last layer, Gaussian likelihood."""

    def __init__(self, convert):
        super().__init__()
        torch.manual_seed(0)  # LinearMean's initial weights
        gen = torch.Generator().manual_seed(2)
        self.first = HiddenLayer(convert, D, HIDDEN, gen)
        self.second = HiddenLayer(convert, HIDDEN, HIDDEN, gen)
        self.last = HiddenLayer(convert, HIDDEN, None, gen)
        self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
        self.double()

    def forward(self, x):
        return self.last(self.second(self.first(x)))


def test_deep_gp_with_two_hidden_layers_approaches_the_exact_kernels():
    """GPyTorch's deep GP tutorial with two hidden layers: DeepApproximateMLL over VariationalELBO with sampled hidden
    inputs (the marginals N(μ, σ²) of each layer, sampled from the same seed in both models), the first layer's
    lengthscale gradient through both sampled layers, and the predictive mixture in eval mode."""
    x, f, xs, _ = data()

    def outputs(convert):
        model = ThreeLayerDeepGP(convert)
        mll = gpytorch.mlls.DeepApproximateMLL(gpytorch.mlls.VariationalELBO(model.likelihood, model, num_data=N))
        with gpytorch.settings.num_likelihood_samples(8):
            torch.manual_seed(11)
            elbo = mll(model(x), f)
            (grad,) = torch.autograd.grad(elbo, raw_lengthscale(model.first.covar_module))
            model.eval()
            torch.manual_seed(12)
            with torch.no_grad(), gpytorch.settings.fast_pred_var():
                predictive = model.likelihood(model(xs))
        assert predictive.mean.shape == (8, len(xs))
        return elbo.detach(), grad, predictive.mean.mean(0), predictive.variance.mean(0)
    errors = errors_by_width(outputs, widths=(256, 16384))
    # measured: ELBO, gradient, predictive mean and variance 0.0098, 0.15, 0.067, 0.04 at F = 256 and 5.8e-4, 0.03,
    # 0.0074, 0.0016 at 16 384
    assert_approaches(errors, 0.05)


class QuadratureLayer(DSPPLayer):
    """The layer of GPyTorch's DSPP tutorial (constant mean), given its kernel."""

    def __init__(self, convert, input_dims, output_dims, gen, num_quad_sites):
        batch_shape = torch.Size([]) if output_dims is None else torch.Size([output_dims])
        inducing_points = torch.rand(*batch_shape, M, input_dims, generator=gen, dtype=F64)
        q_u = CholeskyVariationalDistribution(M, batch_shape=batch_shape)
        super().__init__(VariationalStrategy(self, inducing_points, q_u, learn_inducing_locations=True),
                         input_dims, output_dims, num_quad_sites=num_quad_sites)
        set_variational(self.variational_strategy, seed=int(torch.randint(100, (), generator=gen)))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch_shape)
        self.covar_module = convert(exact_kernel(batch_shape))

    def forward(self, x, mean_input=None, **kwargs):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def test_dspp_approaches_the_exact_kernels():
    """GPyTorch's DSPP: a hidden and an output DSPPLayer with 8 quadrature sites, DeepPredictiveLogLikelihood."""
    x, f, xs, _ = data()
    sites = 8

    class TwoLayerDSPP(DSPP):
        def __init__(self, convert):
            torch.manual_seed(0)  # the initial quadrature weights and sites
            super().__init__(sites)
            gen = torch.Generator().manual_seed(2)
            self.hidden = QuadratureLayer(convert, D, HIDDEN, gen, sites)
            self.last = QuadratureLayer(convert, HIDDEN, None, gen, sites)
            self.likelihood = gpytorch.likelihoods.GaussianLikelihood()
            self.double()

        def forward(self, x, **kwargs):
            return self.last(self.hidden(x, **kwargs), **kwargs)

    def outputs(convert):
        model = TwoLayerDSPP(convert)
        objective = gpytorch.mlls.DeepPredictiveLogLikelihood(model.likelihood, model, num_data=N, beta=0.05)(
            model(x), f)
        kernel_params = [p for name, p in model.named_parameters() if "covar_module" in name]
        grad = torch.cat([g.flatten() for g in torch.autograd.grad(objective, kernel_params)])
        model.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            predictive = model.likelihood(model(xs, mean_input=xs))
        assert predictive.mean.shape == (sites, len(xs))
        return objective.detach(), grad, predictive.mean, predictive.variance
    errors = errors_by_width(outputs, widths=(256, 16384))
    # measured: objective, gradient of all kernel hyperparameters, predictive mean and variance 0.0015, 0.27, 0.28,
    # 0.11 at F = 256 and 7.3e-4, 0.081, 0.034, 0.016 at 16 384; the objective's error is already small at F = 256
    # (4e-5 at F = 262 144, where the gradient's is 0.007)
    assert max(errors[0][0], errors[1][0]) < 0.003, errors
    assert_approaches([narrow[1:] for narrow in errors], 0.1)


def test_the_strategy_uses_the_rfgp_kernels_blocks():
    """K(Z, Z), K(Z, x*) and k(x*, x*) inside the whitened strategy are the rfgp kernel's low-rank values: the
    memoised factor L is chol(Φ(Z)Φ(Z)ᵀ + jitter·I) and the prediction is the whitened SVGP's formula on the
    rfgp Gram blocks (μ + K̂*ᶻL⁻ᵀm, k̂** + jitter − ‖L⁻¹K̂ᶻ*‖² + ‖CᵀL⁻¹K̂ᶻ*‖²), not the exact kernel's."""
    from rfgp.inference.operators import ChunkedFeatureCrossLinearOperator, FeatureRootLinearOperator

    x, _, xs, _ = data()
    model = SVGP(rfgp.sketch(exact_kernel(), 64, method="orf", seed=0), x[:M].clone()).double()
    set_variational(model.variational_strategy)
    model.eval()
    with torch.no_grad():
        latent = model(xs)
    strategy = model.variational_strategy
    z = strategy.inducing_points.detach()
    kernel = model.covar_module
    joint = kernel(torch.cat([z, xs]))
    assert isinstance(joint.evaluate_kernel(), FeatureRootLinearOperator)  # outputscale folded into Φ
    assert isinstance(joint[..., :M, M:].evaluate_kernel(), ChunkedFeatureCrossLinearOperator)
    with torch.no_grad():
        k_zz, k_zs = kernel(z).to_dense(), kernel(z, xs).to_dense()
        k_ss = kernel(xs, diag=True)
        exact_zz = exact_kernel()(z).to_dense()
    chol = strategy._memoize_cache["cholesky_factor"].to_dense()
    torch.testing.assert_close(chol @ chol.mT, k_zz + strategy.jitter_val * torch.eye(M, dtype=F64), rtol=0,
                               atol=1e-12)
    assert float((k_zz - exact_zz).abs().max()) > 1e-2  # a 64-feature Gram, not the exact one
    distribution = strategy._variational_distribution
    interp = torch.linalg.solve_triangular(chol, k_zs, upper=False)
    mean = model.mean_module.constant + interp.mT @ distribution.variational_mean
    covar_root = distribution.chol_variational_covar.tril().mT @ interp
    variance = k_ss + strategy.jitter_val - interp.pow(2).sum(-2) + covar_root.pow(2).sum(-2)
    torch.testing.assert_close(latent.mean, mean.detach(), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(latent.variance, variance.detach(), rtol=1e-8, atol=1e-8)


CONVERSIONS = {
    "orf": lambda kernel, x: rfgp.sketch(kernel, 128, method="orf"),
    "sorf": lambda kernel, x: rfgp.sketch(kernel, 128, method="sorf"),
    "matern_half": lambda kernel, x: rfgp.sketch(ScaleKernel(MaternKernel(nu=0.5, ard_num_dims=D)), 128),
    "maclaurin": lambda kernel, x: rfgp.sketch(kernel, 128, method="maclaurin"),
    "nystrom": lambda kernel, x: rfgp.sketch(kernel, 30, method="nystrom", x_sample=x),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", CONVERSIONS)
def test_state_dict_of_a_trained_variational_model_reproduces_its_predictions_bit_for_bit(name, dtype):
    """Draws from torch's global RNG (no seed), 5 Adam steps, then a fresh model — other draws, other landmarks —
    loads the state: the same tensors under the same keys, and the same predictions to the bit; float32 predicts in
    float32 what float64 predicts, to float32's precision."""
    x, f, xs, _ = data()

    def build():
        kernel = CONVERSIONS[name](exact_kernel(), x[torch.randperm(N)])
        return SVGP(kernel, x[:M].clone()).to(dtype), gpytorch.likelihoods.GaussianLikelihood().to(dtype)

    def predict(model, likelihood):
        model.eval()
        likelihood.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            predictive = likelihood(model(xs.to(dtype)))
        return predictive.mean, predictive.variance

    torch.manual_seed(0)
    model, likelihood = build()
    optimizer = torch.optim.Adam([*model.parameters(), *likelihood.parameters()], lr=0.05)
    elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=N)
    for _ in range(5):
        optimizer.zero_grad()
        (-elbo(model(x.to(dtype)), f.to(dtype))).backward()
        optimizer.step()
    prediction = predict(model, likelihood)
    state = {key: value.clone() for key, value in model.state_dict().items()}
    assert all(torch.is_tensor(value) for value in state.values())

    torch.manual_seed(1)
    fresh, fresh_likelihood = build()
    assert not torch.equal(predict(fresh, fresh_likelihood)[0], prediction[0])
    fresh.load_state_dict(state)
    fresh_likelihood.load_state_dict(likelihood.state_dict())
    reloaded = predict(fresh, fresh_likelihood)
    assert fresh.state_dict().keys() == state.keys()
    assert all(torch.equal(fresh.state_dict()[key], value) for key, value in state.items())
    assert all(torch.equal(a, b) for a, b in zip(reloaded, prediction))
    assert all(p.dtype == dtype and torch.isfinite(p).all() for p in prediction)
    if dtype == torch.float32:
        # GPyTorch's K_ZZ jitter is 1e-4 in float32 and 1e-6 in float64, which moves the exact kernel's model by
        # 0.0056 here; at the same jitter float32 predicts the float64 model to 1e-5
        fresh.train()  # its eval-mode cache (chol K_ZZ) keeps its dtype through .double(), whatever the kernel
        fresh.variational_strategy.jitter_val = 1e-6
        single = predict(fresh, fresh_likelihood)
        fresh.train()
        # (Nyström's own landmark jitter is 1e-6·mean diag K_ZZ in float32, 1e-8 in float64: 1.4e-3 here)
        tolerance = 5e-3 if name == "nystrom" else 1e-3
        for narrow, wide in zip(single, predict(fresh.double(), fresh_likelihood.double())):
            torch.testing.assert_close(narrow.double(), wide, rtol=tolerance, atol=tolerance / 10)


def test_natural_gradient_training_reaches_the_exact_kernels_quality():
    """GPyTorch's natural-gradient SVGP recipe (NaturalVariationalDistribution, NGD for q(u), Adam for the
    hyperparameters and inducing points), 80 steps from the same start: the F = 256 model predicts held-out data as
    well as the exact kernel's."""
    gen = torch.Generator().manual_seed(0)
    x, x_test = torch.rand(120, D, generator=gen, dtype=F64), torch.rand(200, D, generator=gen, dtype=F64)

    def target(x):
        return torch.sin(6 * x[:, 0]) * torch.cos(4 * x[:, 1]) + 0.1 * torch.randn(len(x), generator=gen, dtype=F64)
    y, y_test = target(x), target(x_test)

    def trained(convert):
        model = SVGP(convert(ScaleKernel(RBFKernel(ard_num_dims=D)).double()), x[:12].clone(),
                     distribution=gpytorch.variational.NaturalVariationalDistribution).double()
        likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
        ngd = gpytorch.optim.NGD(model.variational_parameters(), num_data=len(x), lr=0.1)
        adam = torch.optim.Adam([*model.hyperparameters(), *likelihood.parameters()], lr=0.05)
        elbo = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(x))
        for _ in range(80):
            ngd.zero_grad()
            adam.zero_grad()
            (-elbo(model(x), y)).backward()
            ngd.step()
            adam.step()
        model.eval()
        likelihood.eval()
        with torch.no_grad(), gpytorch.settings.fast_pred_var():
            predictive = likelihood(model(x_test))
        rmse = float((predictive.mean - y_test).pow(2).mean().sqrt())
        nlpd = float(-torch.distributions.Normal(predictive.mean, predictive.variance.sqrt()).log_prob(y_test).mean())
        return rmse, nlpd
    exact_rmse, exact_nlpd = trained(lambda kernel: kernel)
    rmse, nlpd = trained(lambda kernel: rfgp.sketch(kernel, 256, method="orf", seed=0))
    # measured: exact RMSE 0.129, NLPD −0.529; F = 256: 0.130, −0.534 (noise sd 0.1: NLPD −0.88 at best)
    assert rmse < 1.2 * exact_rmse and nlpd < exact_nlpd + 0.15, (rmse, nlpd, exact_rmse, exact_nlpd)


def test_nystrom_landmarks_at_the_inducing_points_give_the_exact_mean_and_a_smaller_variance():
    """Guide: with Z as the landmarks K_ZZ and K_Zx are exact, so the predictive mean is the exact model's, but
    k̂(x*, x*) = Q** ≤ k(x*, x*): the variance is smaller (no FITC-style correction in a variational model)."""
    x, _, xs, _ = data()
    z = x[:M].clone()

    def predict(kernel):
        model = SVGP(kernel, z, learn_inducing_locations=False).double()
        set_variational(model.variational_strategy)
        model.eval()
        with torch.no_grad():
            latent = model(xs)
        return latent.mean, latent.variance
    exact_mean, exact_variance = predict(exact_kernel())
    mean, variance = predict(rfgp.sketch(exact_kernel(), M, method="nystrom", x_sample=z, seed=0))
    torch.testing.assert_close(mean, exact_mean, rtol=1e-5, atol=1e-5)  # measured 1e-6 (landmark jitter)
    assert (variance < exact_variance).all()
    assert float((exact_variance - variance).max() / exact_variance.max()) > 0.3  # measured 0.79


def test_redrawn_features_predict_as_a_fresh_model_after_train():
    """Guide: the eval-mode factor chol(K_ZZ) is GPyTorch's memo; after feature_map.resample(), model.train() once
    and the model predicts as one built with the new draws."""
    x, _, xs, _ = data()
    model = SVGP(rfgp.sketch(exact_kernel(), 64, seed=0), x[:M].clone()).double()
    set_variational(model.variational_strategy)
    model.eval()
    with torch.no_grad():
        before = model(xs).mean
    model.covar_module.base_kernel.feature_map.resample(torch.Generator().manual_seed(1))
    model.train()
    model.eval()
    fresh = SVGP(rfgp.sketch(exact_kernel(), 64, seed=3), x[:M].clone()).double()
    fresh.load_state_dict(model.state_dict())
    fresh.eval()
    with torch.no_grad():
        after, expected = model(xs).mean, fresh(xs).mean
    assert not torch.equal(after, before)
    assert torch.equal(after, expected)
