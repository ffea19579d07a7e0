"""Non-Gaussian likelihoods of rfgp.pyro.RandomFeatureGP on fixed synthetic problems."""

import math

import pyro
import pyro.distributions as dist
import pytest
import torch

from rfgp.features import RandomFourierFeatures
from rfgp.pyro import (
    Bernoulli,
    Categorical,
    CustomLikelihood,
    Gaussian,
    HeteroscedasticGaussian,
    Poisson,
    RandomFeatureGP,
    StudentT,
    fit_svi,
    posterior_predictive,
    weight_guide,
)


def three_sector_problem(n, generator):
    """Labels = angular sector (3 × 120°) of a point in the unit disc: not linearly separable."""
    x = torch.rand(n, 2, generator=generator) * 2.0 - 1.0
    angle = torch.atan2(x[:, 1], x[:, 0]) + math.pi
    return x, (angle / (2.0 * math.pi / 3.0)).long().clamp_max(2)


def test_softmax_classification_beats_constant_predictor():
    pyro.set_rng_seed(0)
    generator = torch.Generator().manual_seed(0)
    x_train, y_train = three_sector_problem(300, generator)
    x_test, y_test = three_sector_problem(500, generator)
    model = RandomFeatureGP(RandomFourierFeatures(64, input_dim=2, seed=0), Categorical(3),
                            lengthscale=dist.Gamma(5.0, 10.0), outputscale=4.0)
    guide = weight_guide(model, family="mean_field", hyperparameters="map")
    fit_svi(model, guide, x_train, y_train, num_steps=400, lr=0.05, num_particles=4)
    f = posterior_predictive(model, x_test, guide, num_samples=200, return_sites=("f",))["f"]
    probabilities = model.likelihood.expected_value(f).mean(0)
    assert torch.allclose(probabilities.sum(-1), torch.ones(500))
    accuracy = (probabilities.argmax(-1) == y_test).float().mean()
    mnll = -probabilities[torch.arange(500), y_test].log().mean()
    # The best constant predictor: the training class frequencies.
    frequencies = torch.bincount(y_train, minlength=3).float() / 300
    constant_accuracy = (y_test == frequencies.argmax()).float().mean()
    constant_mnll = -frequencies[y_test].log().mean()
    assert accuracy > 0.9 and accuracy > constant_accuracy + 0.45
    assert mnll < 0.4 * constant_mnll


def test_poisson_regression_recovers_rate():
    pyro.set_rng_seed(0)
    generator = torch.Generator().manual_seed(1)

    def rate(x):
        return torch.exp(1.5 + torch.sin(2.0 * math.pi * x[:, 0]))

    x = torch.rand(400, 1, generator=generator, dtype=torch.float64)
    y = torch.poisson(rate(x), generator=generator)
    model = RandomFeatureGP(RandomFourierFeatures(32, input_dim=1, seed=0).double(), Poisson(),
                            lengthscale=0.2, outputscale=1.0, mean=dist.Normal(0.0, 3.0))
    guide = weight_guide(model, family="full_rank", hyperparameters="map")
    fit_svi(model, guide, x, y, num_steps=800, lr=0.03, num_particles=4, final_lr_fraction=0.1)
    grid = torch.linspace(0.05, 0.95, 50, dtype=torch.float64).unsqueeze(-1)
    f = posterior_predictive(model, grid, guide, num_samples=500, return_sites=("f",))["f"][..., 0]
    rates = f.exp()
    truth = rate(grid)
    relative_error = (rates.mean(0) - truth).abs() / truth
    assert relative_error.mean() < 0.08 and relative_error.max() < 0.25
    lower, upper = rates.quantile(0.025, dim=0), rates.quantile(0.975, dim=0)
    coverage = ((lower <= truth) & (truth <= upper)).double().mean()
    assert coverage >= 0.8
    # Misspecified check: a constant rate explains the data far worse.
    assert (truth.mean() - truth).abs().div(truth).mean() > 3 * relative_error.mean()


def test_heteroscedastic_gaussian_recovers_noise_level():
    """y = sin(3x) + s(x)ε with s(x) = 0.05·e^{3x} on [0, 1]: the second latent GP learns log s(x)."""
    pyro.set_rng_seed(0)
    generator = torch.Generator().manual_seed(2)

    def noise_std(x):
        return 0.05 * torch.exp(3.0 * x[:, 0])

    x = torch.rand(500, 1, generator=generator, dtype=torch.float64)
    y = torch.sin(3.0 * x[:, 0]) + noise_std(x) * torch.randn(500, generator=generator, dtype=torch.float64)
    model = RandomFeatureGP(RandomFourierFeatures(16, input_dim=1, seed=0).double(), HeteroscedasticGaussian(),
                            lengthscale=0.5)
    guide = weight_guide(model, family="full_rank")
    fit_svi(model, guide, x, y, num_steps=600, lr=0.05, num_particles=4, final_lr_fraction=0.1)
    grid = torch.linspace(0.1, 0.9, 9, dtype=torch.float64).unsqueeze(-1)
    f = posterior_predictive(model, grid, guide, num_samples=300, return_sites=("f",))["f"].mean(0)
    estimated = torch.exp(f[:, 1] + model.likelihood.noise_offset)
    assert ((estimated / noise_std(grid)).log().abs() < math.log(1.35)).all()  # within a factor 1.35
    assert ((f[:, 0] - torch.sin(3.0 * grid[:, 0])).abs() < 3 * noise_std(grid) / math.sqrt(50)).all()


@pytest.mark.parametrize("hyperparameters", ["map", "mean_field"])
@pytest.mark.parametrize("lengthscale", [1.0, dist.Gamma(4.0, 4.0)])
def test_weight_guide_infers_hyperparameters_sampled_inside_a_custom_likelihood(hyperparameters, lengthscale):
    """CustomLikelihood says hyperparameters may be pyro.sample'd inside distribution_fn.  weight_guide's guides
    left such a site out (Pyro only warned "Found vars in model but not guide"), so it was drawn from its prior
    at every step and in every prediction: never inferred."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.rand(200, 1) * 4.0 - 2.0
    y = torch.distributions.Gamma(5.0, 5.0 * torch.exp(-torch.sin(2.0 * x[:, 0]))).sample()

    def gamma(f):
        concentration = pyro.sample("concentration", dist.Gamma(2.0, 1.0))
        return dist.Gamma(concentration, concentration * torch.exp(-f[..., 0]))

    model = RandomFeatureGP(RandomFourierFeatures(16, input_dim=1, seed=0), CustomLikelihood(gamma),
                            lengthscale=lengthscale)
    guide = weight_guide(model, family="mean_field", hyperparameters=hyperparameters)
    fit_svi(model, guide, x, y, num_steps=300, lr=0.05)
    concentration = posterior_predictive(model, x, guide, num_samples=200,
                                         return_sites=("concentration",))["concentration"]
    # Under the Gamma(2, 1) prior the 5–95 % range is 0.36–4.7; the data say 5.
    assert concentration.quantile(0.05) > 3.0
    if hyperparameters == "map":
        assert (concentration == concentration[0]).all()


def _gp(likelihood, seed=0):
    return RandomFeatureGP(RandomFourierFeatures(16, 2, seed=seed), likelihood)


# (field, saved likelihood, loading likelihood): the likelihoods' settings are Python numbers, not parameters, so
# such states loaded silently into another model
LIKELIHOOD_MISMATCHES = [
    ("type", lambda: Bernoulli(), lambda: Poisson()),
    ("type", lambda: Gaussian(noise=0.1), lambda: StudentT(scale=0.1)),
    ("exposure", lambda: Poisson(exposure=1.0), lambda: Poisson(exposure=2.0)),
    ("num_classes", lambda: Categorical(3), lambda: Categorical(4)),
    ("noise_offset", lambda: HeteroscedasticGaussian(-1.0), lambda: HeteroscedasticGaussian(0.0)),
    ("num_latents", lambda: CustomLikelihood(lambda f: dist.Normal(f[..., 0], 1.0)),
     lambda: CustomLikelihood(lambda f: dist.Normal(f[..., 0], f[..., 1].exp()), num_latents=2)),
]


@pytest.mark.parametrize("field, saved, loading", LIKELIHOOD_MISMATCHES,
                         ids=[f"{m[0]}-{i}" for i, m in enumerate(LIKELIHOOD_MISMATCHES)])
def test_state_of_another_likelihood_is_refused_naming_the_field(field, saved, loading):
    state = _gp(saved()).state_dict()
    with pytest.raises(ValueError, match=rf"cannot load state: likelihood\.{field} is .* in the state dict but .* in "
                                         "this module"):
        _gp(loading(), seed=1).load_state_dict(state)


def test_likelihood_state_round_trips_and_loads_without_its_configuration():
    """A model's state loads into a model of the same likelihood (another seed), and a state saved before the
    likelihoods had a configuration (no ``likelihood.config_*`` keys) loads strictly."""
    source = _gp(Poisson(exposure=2.0))
    target = _gp(Poisson(exposure=2.0), seed=1)
    target.load_state_dict(source.state_dict())
    assert all(torch.equal(target.state_dict()[key], value) for key, value in source.state_dict().items())
    legacy = {key: value for key, value in source.state_dict().items() if not key.startswith("likelihood.config_")}
    _gp(Poisson(exposure=2.0), seed=1).load_state_dict(legacy)


def test_student_t_expected_value_is_refused_where_y_has_no_mean():
    """E[y | f] of a Student-t with ν ≤ 1 does not exist: expected_value returned NaN, and with a prior on ν it drew
    a fresh ν from the prior at every call (NaN or f by chance)."""
    f = torch.randn(5, 1, dtype=torch.float64)
    torch.testing.assert_close(StudentT(df=3.0).expected_value(f), f[:, 0], rtol=0, atol=0)
    torch.testing.assert_close(StudentT(df=dist.Pareto(1.0, 2.0)).expected_value(f), f[:, 0], rtol=0, atol=0)
    with pytest.raises(ValueError, match="no mean for df ≤ 1, got df=1.0"):
        StudentT(df=1.0).expected_value(f)
    with pytest.raises(ValueError, match="prior of df has support down to 0.0"):
        StudentT(df=dist.Gamma(2.0, 0.1)).expected_value(f)


def _poisson_log_likelihood_float64(y, f, exposure):
    """log p(y | f) = y·log λ − λ − log y! with log λ = log exposure + f, in float64."""
    y, f = y.double(), f.double()
    log_rate = math.log(exposure) + f
    return y * log_rate - log_rate.exp() - torch.lgamma(y + 1)


def test_poisson_log_prob_in_log_space_at_extreme_latents():
    # exposure·exp(f) overflowed to ∞ for f > 88 in float32 (log_prob ∞ − ∞ = NaN, a NaN SVI loss) and underflowed
    # to 0 for f < −103 (log_prob −∞ for y > 0 where it is y·f − log y!, finite)
    f = torch.tensor([89.0, 100.0, -120.0, -120.0, 0.0, 80.0], requires_grad=True)
    y = torch.tensor([3.0, 0.0, 1.0, 0.0, 2.0, 4.0])
    log_prob = Poisson(exposure=2.0)(f.unsqueeze(-1)).log_prob(y)
    reference = _poisson_log_likelihood_float64(y, f.detach(), 2.0)
    # the float64 value rounded to float32 (−∞ where it is below −3.4e38, as −2e89 is); e^η's relative error is the
    # rounding error of η = log 2 + f in float32, up to |η|·2⁻²⁴ = 4.8e−6 at η = 80.7
    assert not log_prob.isnan().any()
    torch.testing.assert_close(log_prob, reference.float(), rtol=1e-5, atol=1e-5)
    log_prob[2:].sum().backward()
    # d/df = y − λ, finite where λ is
    torch.testing.assert_close(f.grad[2:], (y[2:] - 2.0 * f.detach()[2:].double().exp()).float(), rtol=1e-5, atol=1e-6)


def test_heteroscedastic_gaussian_log_prob_in_log_space_at_extreme_latents():
    # exp(f₂) overflowed to σ = ∞ for f₂ > 88 in float32 (log_prob −∞ where it is −log σ − log √(2π), finite) and
    # underflowed to σ = 0 for f₂ < −103 (pyro's validation of scale > 0 raised, or 0/0 = NaN at y = f₁)
    log_std = torch.tensor([100.0, -100.0, -120.0, 0.5, -2.0])
    mean = torch.tensor([0.3, 1.5, 1.5, -1.0, 2.0])
    y = torch.tensor([2.0, 1.5, 1.5, 0.5, 2.25])
    f = torch.stack([mean, log_std], dim=-1).requires_grad_(True)
    log_prob = HeteroscedasticGaussian(noise_offset=0.0)(f).log_prob(y)
    residual = (y - mean).double() * (-log_std.double()).exp()
    reference = -0.5 * residual**2 - log_std.double() - 0.5 * math.log(2 * math.pi)
    torch.testing.assert_close(log_prob, reference.float(), rtol=1e-6, atol=1e-5)
    log_prob.sum().backward()
    # d/df₁ = z·e^{−f₂}, d/df₂ = z² − 1 with z = (y − f₁)·e^{−f₂}
    expected = torch.stack([residual * (-log_std.double()).exp(), residual**2 - 1], dim=-1).float()
    torch.testing.assert_close(f.grad, expected, rtol=1e-6, atol=1e-6)
