"""GPyTorch's HammingIMQKernel in rfgp.sketch: Gamma-mixture categorical features, unbiased against GPyTorch's kernel
and its gradients for α and β away from the draws' reference, hyperparameters and state carried, one-hot inputs."""

import gpytorch
import pytest
import torch
from gpytorch.constraints import Interval
from gpytorch.kernels import HammingIMQKernel
from gpytorch.priors import GammaPrior
from torch.nn.functional import one_hot

import rfgp
from rfgp.core.validation import DrawCoverageError
from rfgp.kernels.hamming_imq import SketchedHammingIMQKernel
from rfgp.models import ExactGPModel
from tests._conversion_checks import assert_copied_constraint

F64 = torch.float64
VOCAB = 4


def sequences():
    tokens = torch.randint(0, VOCAB, (7, 5), generator=torch.Generator().manual_seed(0))
    tokens[1] = tokens[0]  # distance 0 between different rows
    tokens[2, :4] = tokens[0, :4]  # distance 1
    return one_hot(tokens, VOCAB).flatten(-2).to(F64)


X = sequences()


def hamming_imq(alpha=0.7, beta=1.3, **kwargs):
    kernel = HammingIMQKernel(vocab_size=VOCAB, **kwargs).double()
    kernel.alpha, kernel.beta = alpha, beta
    return kernel


def feature_terms(kernel):
    """F·Φ_f(x)Φ_f(y) for each pair of rows and feature f, ``(n, n, F)``: independent, identically distributed terms
    whose mean is k(x, y)."""
    phi = kernel.featurize(X)
    return phi.unsqueeze(-2) * phi.unsqueeze(-3) * phi.shape[-1]


def assert_within_4_standard_errors(terms, truth):
    standard_error = terms.std(-1) / terms.shape[-1] ** 0.5
    z = (terms.mean(-1) - truth) / standard_error
    assert z.abs().max() < 4, z.abs().max()


@pytest.mark.parametrize("beta", [1.3, 0.4, 4.0])
def test_mean_of_the_features_and_of_their_gradients_is_gpytorchs_kernel(beta):
    """Drawn around β₀ = 1.3, evaluated at β ∈ {1.3, 0.4, 4}: the importance weights keep every term unbiased."""
    converted = rfgp.sketch(hamming_imq(), 20000, seed=0)
    converted.beta = beta
    exact = hamming_imq(beta=beta)
    truth = exact(X).to_dense()
    assert_within_4_standard_errors(feature_terms(converted).detach(), truth.detach())
    parameters = ("raw_alpha", "raw_beta")
    step = 1e-6
    for name in parameters:
        exact_grad = torch.stack([torch.autograd.grad(truth[i, j], getattr(exact, name), retain_graph=True)[0].sum()
                                  for i in range(7) for j in range(7)]).reshape(7, 7)
        raw = getattr(converted, name)
        with torch.no_grad():  # per-feature derivatives by central differences: iid terms with mean ∂k/∂raw
            raw += step
            upper = feature_terms(converted)
            raw -= 2 * step
            lower = feature_terms(converted)
            raw += step
        derivatives = (upper - lower) / (2 * step)
        mean_grad = torch.autograd.grad(feature_terms(converted).mean(-1).sum(), raw)[0]
        torch.testing.assert_close(mean_grad.sum(), derivatives.mean(-1).sum(), rtol=1e-5, atol=1e-8)  # autograd
        assert_within_4_standard_errors(derivatives, exact_grad)


def test_small_beta_in_float32_gives_finite_unbiased_features():
    # β = 0.1 drew Gamma(β/4) precisions below float32's range: log τ = −inf made every float32 call raise
    converted = rfgp.sketch(hamming_imq(beta=0.1), 20000, seed=0).float()
    truth = hamming_imq(beta=0.1)(X).to_dense().detach()
    phi = converted.featurize(X.float()).double()
    assert_within_4_standard_errors((phi.unsqueeze(-2) * phi.unsqueeze(-3) * phi.shape[-1]).detach(), truth)


def test_a_state_with_the_precisions_saved_as_tau_loads():
    # states saved before the draws were kept as log τ hold τ under "feature_map.precisions"
    converted, other = rfgp.sketch(hamming_imq(), 64, seed=0), rfgp.sketch(hamming_imq(), 64, seed=1)
    expected = converted(X).to_dense()
    legacy = {key.replace("log_precisions", "precisions"): (value.exp() if key.endswith("log_precisions") else value)
              for key, value in converted.state_dict().items()}
    other.load_state_dict(legacy)
    torch.testing.assert_close(other(X).to_dense(), expected, rtol=1e-12, atol=1e-14)


def test_conversion_carries_hyperparameters_constraints_priors_batch_and_state():
    batch = torch.Size([2])
    exact = HammingIMQKernel(vocab_size=VOCAB, batch_shape=batch, alpha_prior=GammaPrior(2.0, 2.0),
                             beta_constraint=Interval(0.05, 10.0), beta_prior=GammaPrior(3.0, 2.0)).double()
    exact.alpha = torch.tensor([[0.5], [2.0]], dtype=F64)
    exact.beta = torch.tensor([[1.0], [3.0]], dtype=F64)
    converted = rfgp.sketch(exact, 64, seed=3)
    assert isinstance(converted, SketchedHammingIMQKernel) and converted.batch_shape == batch
    assert torch.equal(converted.alpha, exact.alpha) and torch.equal(converted.beta, exact.beta)
    assert_copied_constraint(converted.raw_beta_constraint, exact.raw_beta_constraint)
    assert {n for n, *_ in converted.named_priors()} == {"alpha_prior", "beta_prior"}
    gram = converted(X).to_dense()
    assert gram.shape == (2, 7, 7)
    again = rfgp.sketch(exact, 64, seed=9)
    again(X).to_dense()
    again.load_state_dict(converted.state_dict())
    assert torch.equal(again(X).to_dense(), gram)
    diagonal = exact(X, diag=True)  # GPyTorch's k(x, x) = ((1 + α)/α)^β
    assert torch.allclose(rfgp.sketch(exact, 50000, seed=0)(X, diag=True), diagonal, rtol=0.05)


def test_inputs_that_are_not_one_hot_and_betas_beyond_the_draws_are_refused():
    converted = rfgp.sketch(hamming_imq(), 64, seed=0)
    relaxed = X.clone()
    relaxed[0, :VOCAB] = 0.25
    with pytest.raises(ValueError, match="x1 is not one-hot: every block of vocab_size=4 entries"):
        converted(relaxed).to_dense()
    with pytest.raises(ValueError, match="x1 has 7 columns, not a multiple of vocab_size=4"):
        converted(X[:, :7]).to_dense()
    converted.beta = 0.1  # drawn at β₀ = 1.3: the weights have infinite variance below β₀/8
    with pytest.raises(DrawCoverageError, match="beta 0.1 is at or below 0.1625 = beta_at_draw_time/8"):
        converted(X).to_dense()
    converted.resample()  # re-centred at β = 0.1
    assert torch.isfinite(converted(X).to_dense()).all()


@pytest.mark.parametrize("dtype,beta", [(torch.float64, 1e5), (torch.float32, 200.0)])
def test_an_amplitude_beyond_the_floating_range_is_refused_naming_alpha_and_beta(dtype, beta):
    # k(x, x) = ((1 + α)/α)^β overflowed: the covariance was inf and NaN without a word
    converted = rfgp.sketch(hamming_imq(beta=beta), 64, seed=0).to(dtype)
    with pytest.raises(ValueError, match=r"k\(x, x\) = \(\(1 \+ alpha\)/alpha\)\^beta .* alpha=0.7, beta="):
        converted(X.to(dtype)).to_dense()


def test_set_num_features_recentres_the_gamma_draws_at_the_trained_beta():
    converted = rfgp.sketch(hamming_imq(), 64, seed=0)
    converted.beta = 0.1  # trained far below the conversion's β₀ = 1.3
    rfgp.set_num_features(converted, 20000)
    assert converted.num_features == 20000
    assert_within_4_standard_errors(feature_terms(converted).detach(), hamming_imq(beta=0.1)(X).to_dense().detach())


def test_gp_on_sequences_trains_alpha_and_beta_and_predicts_like_the_exact_gp():
    generator = torch.Generator().manual_seed(3)
    tokens = torch.randint(0, VOCAB, (120, 6), generator=generator)
    x = one_hot(tokens, VOCAB).flatten(-2).to(F64)
    distance = (tokens != tokens[0]).sum(-1).to(F64)  # a function of the Hamming distance to one sequence
    y = 3 * (1 + distance / 0.7) ** -1.5 + 0.1 * torch.randn(120, generator=generator, dtype=F64)
    train, test = slice(0, 100), slice(100, 120)
    kernel = gpytorch.kernels.ScaleKernel(hamming_imq())
    exact = ExactGPModel(x[train], y[train], gpytorch.likelihoods.GaussianLikelihood(), kernel).double()
    model = ExactGPModel(x[train], y[train], gpytorch.likelihoods.GaussianLikelihood(),
                         rfgp.sketch(kernel, 4096, seed=0)).double()
    rfgp.fit_mll(model, num_iterations=30)
    base = model.covar_module.base_kernel
    assert not torch.equal(base.beta.detach(), kernel.base_kernel.beta.detach())
    exact.load_state_dict(model.state_dict(), strict=False)  # the trained hyperparameters into the exact GP
    for gp in (model, exact):
        gp.eval()
    with torch.no_grad():
        sketched_mean, exact_mean = model(x[test]).mean, exact(x[test]).mean
    assert float((sketched_mean - exact_mean).abs().max()) < 0.05  # half the noise's standard deviation
