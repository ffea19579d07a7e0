"""rfgp.inference.log_prob: the feature-space MLL runs whatever gpytorch.settings.fast_computations says (BoTorch
switches its log_prob flag off globally), and only rfgp covariances are affected."""

import gpytorch
import pytest
import torch

import rfgp
from rfgp.inference.log_prob import has_feature_space_covariance
from rfgp.inference.operators import select_observed
from rfgp.kernels import SketchedCurlFreeKernel, SketchedRBFKernel
from rfgp.models import ExactGPModel, MultiOutputGPModel

SLOW_LOG_PROB = gpytorch.settings.fast_computations(covar_root_decomposition=False, log_prob=False, solves=False)


def model(kernel, n=300, d=2):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = torch.sin(5 * x).sum(-1) + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64)
    gp = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel)).double()
    return gp, x, y


def mll_and_grads(gp, x, y):
    gp.train()
    gp.zero_grad()
    loss = -gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)(gp(x), y)
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in gp.parameters()]


@pytest.mark.parametrize("chunk_size", [None, 64])
def test_mll_stays_in_feature_space_with_fast_log_prob_off(factorised, chunk_size):
    gp, x, y = model(SketchedRBFKernel(32, method="orf", ard_num_dims=2, seed=0))
    with rfgp.settings.chunk_size(chunk_size):
        reference, reference_grads = mll_and_grads(gp, x, y)
        factorised.clear()
        with SLOW_LOG_PROB:
            loss, grads = mll_and_grads(gp, x, y)
    assert factorised and max(factorised) <= 32  # only F × F capacitance matrices
    torch.testing.assert_close(loss, reference, rtol=1e-12, atol=0)
    for grad, expected in zip(grads, reference_grads):
        torch.testing.assert_close(grad, expected, rtol=1e-10, atol=1e-12)


def test_dense_log_prob_agrees(factorised):
    """The feature-space branch computes GPyTorch's dense log-density of ΦΦᵀ + D exactly."""
    gp, x, y = model(SketchedRBFKernel(32, seed=0, ard_num_dims=2))
    gp.train()
    output = gp.likelihood(gp(x))
    with torch.no_grad(), SLOW_LOG_PROB:
        fast = output.log_prob(y)
        dense_covariance = output.lazy_covariance_matrix.to_dense()
    dense = torch.distributions.MultivariateNormal(output.mean.detach(), dense_covariance).log_prob(y)
    torch.testing.assert_close(fast, dense, rtol=1e-10, atol=0)


def test_other_covariances_keep_gpytorch_behaviour(factorised):
    gp, x, y = model(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    gp.train()
    output = gp.likelihood(gp(x))
    assert not has_feature_space_covariance(output)
    with torch.no_grad(), SLOW_LOG_PROB:
        output.log_prob(y)
    assert max(factorised) == x.shape[0]  # GPyTorch's own dense Cholesky, untouched


def test_install_is_idempotent():
    wrapped = gpytorch.distributions.MultivariateNormal.log_prob
    rfgp.inference.log_prob.install()
    assert gpytorch.distributions.MultivariateNormal.log_prob is wrapped


# ----- rfgp's own log-density against GPyTorch's structured branch ------------------------------------------------
GPYTORCH_LOG_PROB = gpytorch.distributions.MultivariateNormal.log_prob.gpytorch_log_prob


def _gpytorch_structured_log_prob(self, value):
    """What rfgp did before: GPyTorch's own method with ``fast_computations.log_prob`` on (the masked covariance
    replaced by the operator of the observed rows, as rfgp's wrapper does)."""
    observed = select_observed(self.lazy_covariance_matrix)
    if observed is not None:
        self = gpytorch.distributions.MultivariateNormal(self.loc, observed)
    with gpytorch.settings.fast_computations(log_prob=True):
        return GPYTORCH_LOG_PROB(self, value)


def _single(n, num_features=32, nan=False):
    gp, x, y = model(SketchedRBFKernel(num_features, ard_num_dims=2, seed=0), n=n)
    if nan:
        y = y.clone()
        y[[3, 7]] = float("nan")
        gp.set_train_data(targets=y, strict=False)
    gp.train()
    return lambda: gpytorch.mlls.ExactMarginalLogLikelihood(gp.likelihood, gp)(gp(x), y), list(gp.parameters())


def _multi_output(nan=False):
    gen = torch.Generator().manual_seed(2)
    x = torch.rand(50, 2, generator=gen, dtype=torch.float64)
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1])], -1)
    if nan:
        y[4, 1] = y[9, 0] = float("nan")
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=2, rank=0).double()
    gp = MultiOutputGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(32, 2, seed=0)))
    gp = gp.double().train()
    return lambda: gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, gp)(gp(x), y), list(gp.parameters())


def _batched(target_shape, covariance_batch):
    """A noise-added feature operator of batch ``covariance_batch`` evaluated at targets of ``target_shape``
    (extra leading dimensions: fantasies; a covariance batch of size 1 broadcast)."""
    gen = torch.Generator().manual_seed(3)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(24, ard_num_dims=2, seed=0)).double()
    likelihood = gpytorch.likelihoods.GaussianLikelihood().double()
    x = torch.rand(*covariance_batch, 40, 2, generator=gen, dtype=torch.float64)
    y = torch.randn(*target_shape, generator=gen, dtype=torch.float64)

    def log_density():
        prior = gpytorch.distributions.MultivariateNormal(torch.zeros(x.shape[:-1], dtype=torch.float64), kernel(x))
        return likelihood(prior).log_prob(y)

    return log_density, list(kernel.parameters()) + list(likelihood.parameters())


LOG_DENSITIES = {
    "feature space": lambda: _single(300),
    "kernel space": lambda: _single(20, num_features=64),
    "masked": lambda: _single(300, nan=True),
    "multi-output": lambda: _multi_output(),
    "multi-output masked": lambda: _multi_output(nan=True),
    "batched": lambda: _batched((2, 40), (2,)),
    "fantasy targets": lambda: _batched((3, 2, 40), (2,)),
    "covariance batch of 1": lambda: _batched((3, 40), (1,)),
    "targets without the batch": lambda: _batched((40,), (2,)),
}


@pytest.mark.parametrize("chunk_size", [None, 16])
@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("case", list(LOG_DENSITIES))
def test_log_density_and_gradients_are_gpytorchs_structured_ones(monkeypatch, case, fast, chunk_size):
    """rfgp's −½[rᵀK⁻¹r + log|K| + N log 2π] from the covariance's ``inv_quad_logdet`` equals GPyTorch's structured
    branch (which rfgp used to enter by the process-wide flag) to 1e-12, gradients included, whatever the flag
    says, and enters no setting."""
    policy = "mask" if "masked" in case else "ignore"

    def value_and_gradients():
        with rfgp.settings.chunk_size(chunk_size), gpytorch.settings.observation_nan_policy(policy):
            log_density, parameters = LOG_DENSITIES[case]()
            with gpytorch.settings.fast_computations(log_prob=fast):
                value = log_density()
        return value.detach(), torch.autograd.grad(value.sum(), parameters)

    before = gpytorch.settings.fast_computations.log_prob.on()  # False once any test imported botorch
    value, gradients = value_and_gradients()
    assert gpytorch.settings.fast_computations.log_prob.on() == before
    monkeypatch.setattr(gpytorch.distributions.MultivariateNormal, "log_prob", _gpytorch_structured_log_prob)
    reference, reference_gradients = value_and_gradients()
    torch.testing.assert_close(value, reference, rtol=1e-12, atol=1e-12)
    for gradient, expected in zip(gradients, reference_gradients, strict=True):
        torch.testing.assert_close(gradient, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("policy", ["mask", "fill"])
def test_a_nan_target_of_a_log_density_under_a_nan_policy_is_refused_with_what_leaves_it_out(policy):
    """Under ``observation_nan_policy("mask"/"fill")`` a NaN target given to the distribution's ``log_prob`` (not
    left out: only ExactMarginalLogLikelihood masks them) is refused naming its point, and not with the advice to
    use the policy already in use."""
    gp, x, y = model(SketchedRBFKernel(16, seed=0))
    gp.train()
    bad = y.clone()
    bad[3] = float("nan")
    with gpytorch.settings.observation_nan_policy(policy), pytest.raises(
            rfgp.core.validation.NonFiniteError,
            match=r"the first at index \(3,\).*ExactMarginalLogLikelihood leaves NaN targets out"):
        gp.likelihood(gp(x)).log_prob(bad)


@pytest.mark.parametrize("layout", ["flat", "transposed"])
def test_multi_output_targets_in_another_layout_are_refused_by_name(layout):
    """Before: a flat interleaved (n·T,) or a transposed (T, n) target of a sketched vector field failed in the
    subtraction y − μ ("The size of tensor a (90) must match the size of tensor b (3)"), in the marginal likelihood
    and in ``likelihood(posterior).log_prob``."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(30, 3, generator=gen, dtype=torch.float64)
    y = torch.randn(30, 3, generator=gen, dtype=torch.float64)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3, rank=0)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(64, input_dim=3, seed=0))
    gp = MultiOutputGPModel(x, y, likelihood, kernel).double()

    def wrong(targets):
        return targets.reshape(-1) if layout == "flat" else targets.mT

    def expected(n):
        given = f"{3 * n}," if layout == "flat" else f"3, {n}"
        return rf"targets must have shape \(\.\.\., n, T\) = \(\.\.\., {n}, 3\).*got \({given}\)"

    with pytest.raises(ValueError, match=expected(30)):
        gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, gp)(gp(x), wrong(y))
    gp.eval()
    with torch.no_grad(), pytest.raises(ValueError, match=expected(4)):
        likelihood(gp(x[:4])).log_prob(wrong(y[:4]))
