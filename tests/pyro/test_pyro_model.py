"""RandomFeatureGP as a Pyro model: shapes, dtypes, likelihood validation, guides, state."""

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

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
    run_nuts,
    weight_guide,
)


def targets(likelihood, n, dtype):
    if isinstance(likelihood, Categorical):
        return torch.randint(likelihood.num_classes, (n,))
    if isinstance(likelihood, Bernoulli):
        return torch.randint(2, (n,)).to(dtype)
    if isinstance(likelihood, Poisson):
        return torch.randint(5, (n,)).to(dtype)
    return torch.randn(n, dtype=dtype)


LIKELIHOODS = [
    lambda: Gaussian(dist.Gamma(2.0, 4.0)),
    lambda: StudentT(df=4.0, scale=0.3),
    lambda: HeteroscedasticGaussian(),
    lambda: Bernoulli(),
    lambda: Categorical(3),
    lambda: Poisson(),
    lambda: CustomLikelihood(lambda f: dist.Laplace(f[..., 0], 0.5)),
]


@pytest.mark.parametrize("make_likelihood", LIKELIHOODS)
def test_trace_shapes_and_dtype_follow_input(make_likelihood, dtype, device):
    pyro.set_rng_seed(0)
    likelihood = make_likelihood()
    model = RandomFeatureGP(RandomFourierFeatures(16, input_dim=2, seed=0), likelihood,
                            lengthscale=dist.Gamma(4.0, 4.0).expand([2]).to_event(1)).to(device)
    x = torch.randn(7, 2, dtype=dtype, device=device)
    y = targets(likelihood, 7, dtype).to(device)
    trace = poutine.trace(model).get_trace(x, y)
    f = trace.nodes["f"]["value"]
    assert f.shape == (7, likelihood.num_latents) and f.dtype == dtype and f.device == x.device
    assert trace.nodes["w"]["value"].shape == (likelihood.num_latents, 16)
    assert torch.isfinite(trace.log_prob_sum())


def test_latent_is_the_weight_space_gp():
    """f = m + σΦ(x/ℓ)wᵀ exactly, for a given w."""
    feature_map = RandomFourierFeatures(8, input_dim=2, seed=1).double()
    model = RandomFeatureGP(feature_map, Categorical(3), lengthscale=torch.tensor([0.5, 2.0]), outputscale=4.0, mean=1.0)
    x = torch.randn(5, 2, dtype=torch.float64)
    w = torch.randn(3, 8, dtype=torch.float64)
    f = poutine.trace(poutine.condition(model, {"w": w})).get_trace(x).nodes["f"]["value"]
    expected = 1.0 + 2.0 * feature_map(x / torch.tensor([0.5, 2.0], dtype=torch.float64)) @ w.T
    torch.testing.assert_close(f, expected, rtol=1e-12, atol=1e-12)


def test_guides_and_vectorised_predictive_shapes():
    pyro.set_rng_seed(0)
    x, y = torch.randn(12, 2), torch.randint(3, (12,))
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Categorical(3),
                            lengthscale=dist.Gamma(4.0, 4.0).expand([2]).to_event(1), outputscale=dist.Gamma(2.0, 2.0))
    for family in ("mean_field", "full_rank"):
        for hyper in ("map", "mean_field", "joint"):
            guide = weight_guide(model, family=family, hyperparameters=hyper)
            losses = fit_svi(model, guide, x, y, num_steps=3, num_particles=2)
            assert len(losses) == 3
            samples = posterior_predictive(model, torch.randn(5, 2), guide, num_samples=4,
                                           return_sites=("f", "y", "w", "lengthscale", "outputscale"))
            assert samples["f"].shape == (4, 5, 3) and samples["y"].shape == (4, 5)
            assert samples["w"].shape == (4, 3, 8) and samples["lengthscale"].shape == (4, 2)
            assert samples["outputscale"].shape == (4,)
            if hyper == "map":  # a point estimate: identical in every draw
                assert (samples["lengthscale"] == samples["lengthscale"][0]).all()


def test_state_dict_round_trip_reproduces_latent():
    x = torch.randn(6, 3)
    w = torch.randn(1, 32)
    model = RandomFeatureGP(RandomFourierFeatures(32, input_dim=3, seed=0), Poisson(), lengthscale=0.7, mean=-1.0)
    other = RandomFeatureGP(RandomFourierFeatures(32, input_dim=3, seed=99), Poisson(), lengthscale=3.0, mean=2.0)
    other.load_state_dict(model.state_dict())
    f1 = poutine.condition(model.latent, {"w": w})(x)
    f2 = poutine.condition(other.latent, {"w": w})(x)
    assert torch.equal(f1, f2)


def test_errors_name_the_argument():
    feature_map = RandomFourierFeatures(8, input_dim=2, seed=0)
    with pytest.raises(TypeError, match="likelihood must be one of"):
        RandomFeatureGP(feature_map, dist.Bernoulli)
    with pytest.raises(TypeError, match="feature_map"):
        RandomFeatureGP(torch.nn.Linear(2, 8), Bernoulli())
    with pytest.raises(ValueError, match="lengthscale must be > 0"):
        RandomFeatureGP(feature_map, Bernoulli(), lengthscale=-1.0)
    with pytest.raises(ValueError, match="positive support"):
        RandomFeatureGP(feature_map, Bernoulli(), lengthscale=dist.Normal(0.0, 1.0))
    with pytest.raises(TypeError, match="outputscale"):
        RandomFeatureGP(feature_map, Bernoulli(), outputscale="big")
    with pytest.raises(ValueError, match="num_classes"):
        Categorical(1)
    x = torch.randn(4, 2)
    cases = [
        (Categorical(3), torch.tensor([0, 1, 3, 2]), ValueError, r"0\.\.2"),
        (Categorical(3), torch.tensor([0.0, 1.0, 2.0, 1.0]), TypeError, "integer tensor"),
        (Bernoulli(), torch.tensor([0.0, 1.0, 0.5, 1.0]), ValueError, "0 or 1"),
        (Poisson(), torch.tensor([0.0, 1.0, -2.0, 1.0]), ValueError, "non-negative integer"),
        (Poisson(), torch.tensor([0.0, 1.5, 2.0, 1.0]), ValueError, "non-negative integer"),
        (Gaussian(), torch.tensor([0.0, float("nan"), 2.0, 1.0]), ValueError, "NaN"),
        (Gaussian(), torch.zeros(5), ValueError, r"shape \(4,\)"),
    ]
    for likelihood, y, error, message in cases:
        with pytest.raises(error, match=message):
            RandomFeatureGP(feature_map, likelihood)(x, y)
    with pytest.raises(ValueError, match="input_dim=2"):
        RandomFeatureGP(feature_map, Gaussian())(torch.randn(4, 3))
    with pytest.raises(ValueError, match="num_data"):
        RandomFeatureGP(feature_map, Gaussian())(x, torch.zeros(4), num_data=2)
    with pytest.raises(ValueError, match="batch shape"):
        RandomFeatureGP(feature_map, CustomLikelihood(lambda f: dist.Normal(f, 1.0)))(x)
    big = RandomFeatureGP(RandomFourierFeatures(1024, input_dim=2, seed=0), Categorical(5))
    with pytest.raises(ValueError, match="mean_field"):
        weight_guide(big, family="full_rank")
    with pytest.raises(ValueError, match="fit_svi"):
        run_nuts(big, x, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="family"):
        weight_guide(big, family="diagonal")
    with pytest.raises(ValueError, match="num_samples is required"):
        posterior_predictive(big, x, weight_guide(big, family="mean_field"))


def test_num_data_rescales_minibatch_likelihood():
    """A minibatch of n points stands for num_data points: its log-likelihood is scaled by num_data/n."""
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Gaussian(0.2))
    x, y = torch.randn(5, 2), torch.randn(5)
    trace = poutine.trace(model).get_trace(x, y, num_data=20)
    trace.compute_log_prob()
    full = poutine.trace(poutine.condition(model, {"w": trace.nodes["w"]["value"]})).get_trace(x, y)
    full.compute_log_prob()
    assert trace.nodes["y"]["scale"] == 4.0
    # Pyro's trace log-probabilities already carry the plate's scale.
    torch.testing.assert_close(trace.nodes["y"]["log_prob_sum"], 4.0 * full.nodes["y"]["log_prob_sum"])


def _fresh_store_and_data():
    """An empty parameter store, the seed 0 and 20 binary-labelled points in 2-D."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    return torch.randn(20, 2), torch.randint(2, (20,)).float()


def _bernoulli_model():
    return RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Bernoulli(), lengthscale=dist.Gamma(4.0, 4.0))


def test_guide_restores_a_saved_param_store(tmp_path):
    """Loading a saved parameter store and then building the guide (Pyro's usual order) restored nothing:
    weight_guide removed the loaded parameters, and the guide predicted from its initialisation."""
    x, y = _fresh_store_and_data()
    guide = weight_guide(_bernoulli_model(), family="mean_field", hyperparameters="map")
    fit_svi(_bernoulli_model(), guide, x, y, num_steps=20, lr=0.1)
    fitted = {**guide[0].median(), **guide[1].median()}
    pyro.get_param_store().save(tmp_path / "params.pt")
    torch.save(guide, tmp_path / "guide.pt")  # as Pyro's docs save a guide: it must pickle

    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "params.pt")
    with pytest.raises(ValueError, match="from_param_store=True"):
        weight_guide(_bernoulli_model(), family="mean_field", hyperparameters="map")
    model = _bernoulli_model()
    restored = weight_guide(model, family="mean_field", hyperparameters="map", from_param_store=True)
    restored(x, y)
    for name, value in {**restored[0].median(), **restored[1].median()}.items():
        assert torch.equal(value, fitted[name])
    # A second guide of weight_guide starts afresh again, without complaint.
    fresh = weight_guide(model, family="mean_field", hyperparameters="map")
    fresh(x, y)
    assert not torch.equal(fresh[1].median()["lengthscale"], fitted["lengthscale"])

    pyro.clear_param_store()
    with pytest.raises(ValueError, match="from_param_store=True, but"):
        weight_guide(model, from_param_store=True)


@pytest.mark.parametrize(
    "saved, built, missing, unused",
    [
        (("mean_field", "map"), ("full_rank", "map"), "AutoGuideList.0.loc", "AutoGuideList.0.locs.w"),
        (("full_rank", "map"), ("mean_field", "map"), "AutoGuideList.0.locs.w", "AutoGuideList.0.loc"),
        (("mean_field", "map"), ("mean_field", "mean_field"), "AutoGuideList.1.locs.lengthscale",
         "AutoGuideList.1.lengthscale"),
        (("mean_field", "mean_field"), ("mean_field", "map"), "AutoGuideList.1.lengthscale",
         "AutoGuideList.1.locs.lengthscale"),
    ],
)
def test_guide_from_a_param_store_of_another_guide_is_refused(saved, built, missing, unused):
    """A guide built from_param_store with another family or hyperparameters than the saved one started the
    parameters the store lacked from their initialisation without a word, and ignored the stored ones."""
    x, y = _fresh_store_and_data()
    fit_svi(_bernoulli_model(), weight_guide(_bernoulli_model(), *saved), x, y, num_steps=3, lr=0.1)
    store = pyro.get_param_store()
    before = {name: store[name].detach().clone() for name in store.keys()}
    guide = weight_guide(_bernoulli_model(), *built, from_param_store=True)
    with pytest.raises(ValueError, match="family= and hyperparameters=") as error:
        guide(x, y)
    assert missing in str(error.value).split("stored but")[0] and unused in str(error.value).split("stored but")[1]
    assert store.keys() == before.keys()  # the parameters the refused call created are gone again
    assert all(torch.equal(store[name], value) for name, value in before.items())
    with pytest.raises(ValueError, match="family= and hyperparameters="):
        guide(x, y)


@pytest.mark.parametrize("ard", [False, True])
def test_parallel_predictive_layout_is_refused_by_name(ard):
    """pyro.infer.Predictive(parallel=True) lays samples of sites with event dimensions out as (S, *event), with no
    slot for the data plate: an ARD lengthscale failed with a bare broadcasting RuntimeError, w with a message that
    did not say what to use instead."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x, y = torch.randn(10, 2), torch.randn(10)
    lengthscale = dist.LogNormal(torch.zeros(2), torch.ones(2)).to_event(1) if ard else dist.LogNormal(0.0, 1.0)
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Gaussian(0.1), lengthscale=lengthscale)
    guide = pyro.infer.autoguide.AutoNormal(model)
    guide(x, y)
    with pytest.raises(ValueError, match=r"(lengthscale|w) has batch shape \(4,\).*rfgp.pyro.posterior_predictive"):
        pyro.infer.Predictive(model, guide=guide, num_samples=4, parallel=True)(x)
    sequential = pyro.infer.Predictive(model, guide=guide, num_samples=4, return_sites=["f"])(x)
    assert sequential["f"].shape == posterior_predictive(model, x, guide, num_samples=4)["f"].shape == (4, 10, 1)
    pyro.clear_param_store()  # the hand-built guide's parameters: weight_guide refuses to drop them


def test_nuts_rejects_extreme_hyperparameter_proposals_instead_of_failing():
    """NUTS' step-size search probes extreme lengthscales: in float32 one underflowed to 0, x/ℓ became infinite,
    and rfgp's input check ended the whole run with a NonFiniteError (3 of the first 6 seeds of this problem).
    Such a point has zero posterior density: NUTS must treat it as a divergence and go on."""
    pyro.set_rng_seed(0)
    x = torch.randn(30, 2)
    y = torch.sin(x[:, 0]) + 0.1 * torch.randn(30)
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Gaussian(0.1),
                            lengthscale=dist.LogNormal(0.0, 1.0))
    samples = run_nuts(model, x, y, num_samples=10, warmup_steps=10)
    assert samples["w"].shape == (10, 1, 8) and samples["lengthscale"].shape == (10,)
    assert bool(torch.isfinite(samples["w"]).all()) and bool((samples["lengthscale"] > 0).all())


@pytest.mark.parametrize("family", ["mean_field", "full_rank"])
@pytest.mark.parametrize("hyperparameters", ["map", "mean_field", "joint"])
def test_guide_first_called_without_targets_predicts_and_fits(tmp_path, family, hyperparameters):
    """A guide fixes its sites at its first call: one without y (posterior_predictive right after a param-store load,
    or a prior check before fitting) made the observed y a latent site of the guide, and predicting failed with a
    bare RuntimeError ('shape [3, 4] is invalid'), the load check named a missing 'locs.y', and fitting afterwards
    failed with 'Shape mismatch inside plate('data')'."""
    x, y = _fresh_store_and_data()
    guide = weight_guide(_bernoulli_model(), family, hyperparameters)
    assert posterior_predictive(_bernoulli_model(), x[:4], guide, num_samples=3)["f"].shape == (3, 4, 1)
    fit_svi(_bernoulli_model(), guide, x, y, num_steps=3, lr=0.1)
    pyro.get_param_store().save(tmp_path / "params.pt")
    fitted = guide.median()

    pyro.clear_param_store()
    pyro.get_param_store().load(tmp_path / "params.pt")
    restored = weight_guide(_bernoulli_model(), family, hyperparameters, from_param_store=True)
    assert posterior_predictive(_bernoulli_model(), x[:4], restored, num_samples=3)["y"].shape == (3, 4)
    for name, value in restored.median().items():
        assert torch.equal(value, fitted[name])


def test_posterior_samples_must_cover_the_model_sites():
    """Pyro's Predictive draws a latent site without samples from its prior: a NUTS dict without the lengthscale
    (or with it misspelt) gave the predictive of prior lengthscales without a word; sample counts that differ
    failed with a bare reshape RuntimeError, an empty dict with StopIteration, an unknown return site gave {}, and w
    samples without their L axis (or with an extra one) blamed Predictive's layout or failed in a reshape."""
    pyro.set_rng_seed(0)
    model = _bernoulli_model()
    x, w, lengthscale = torch.randn(4, 2), torch.randn(10, 1, 8), torch.rand(10) + 0.5
    assert posterior_predictive(model, x, {"w": w, "lengthscale": lengthscale})["f"].shape == (10, 4, 1)
    with pytest.raises(ValueError, match=r"missing: \['lengthscale'\]"):
        posterior_predictive(model, x, {"w": w})
    with pytest.raises(ValueError, match=r"not sites of this model: \['lengthscal'\]"):
        posterior_predictive(model, x, {"w": w, "lengthscale": lengthscale, "lengthscal": lengthscale})
    with pytest.raises(ValueError, match=r"missing: \['lengthscale', 'w'\]"):
        posterior_predictive(model, x, {})
    with pytest.raises(ValueError, match="same number S of samples"):
        posterior_predictive(model, x, {"w": w, "lengthscale": lengthscale[:7]})
    for wrong in (w[:, 0], w.unsqueeze(1)):
        with pytest.raises(ValueError, match=r"posterior\['w'\] must have shape \(S, L, F\) = \(S, 1, 8\)"):
            posterior_predictive(model, x, {"w": wrong, "lengthscale": lengthscale})
    with pytest.raises(ValueError, match="return_sites must be a tuple of this model's sites"):
        posterior_predictive(model, x, {"w": w, "lengthscale": lengthscale}, return_sites=("g",))


def test_shapes_and_seed_are_checked_by_name():
    """An empty x failed with ZeroDivisionError, an ARD lengthscale of the wrong length with a broadcasting
    RuntimeError, a float seed with torch's 'manual_seed expected a long', and a seed without batch_size was
    ignored without a word (it seeds only the minibatch order); a NaN noise_offset gave NaN noise scales, and
    run_nuts(full_mass='no') adapted a dense mass matrix."""
    x, y = _fresh_store_and_data()
    model = _bernoulli_model()
    with pytest.raises(ValueError, match="x must have at least one row"):
        model(x[:0], y[:0])
    with pytest.raises(ValueError, match="input_dim=2 entries, got shape \\(3,\\)"):
        RandomFeatureGP(RandomFourierFeatures(8, input_dim=2, seed=0), Bernoulli(), lengthscale=torch.ones(3))
    lazy = RandomFeatureGP(RandomFourierFeatures(8, seed=0), Bernoulli(), lengthscale=torch.ones(3))
    with pytest.raises(ValueError, match="x has 2 input dimensions, but the ARD lengthscale has 3"):
        lazy(x, y)
    with pytest.raises(TypeError, match="seed must be an int or None, got 1.5"):
        fit_svi(model, weight_guide(model), x, y, num_steps=1, batch_size=5, seed=1.5)
    with pytest.raises(ValueError, match="seed=3 was given without batch_size"):
        fit_svi(model, weight_guide(model), x, y, num_steps=1, seed=3)
    with pytest.raises(TypeError, match="full_mass must be True or False, got 'no'"):
        run_nuts(model, x, y, num_samples=1, warmup_steps=1, full_mass="no")
    with pytest.raises(ValueError, match="noise_offset must be a finite number, got nan"):
        HeteroscedasticGaussian(float("nan"))


def test_minibatch_targets_must_match_the_rows_of_x():
    """With batch_size, y[rows] of a y longer than x passed every batch's check and trained on its first rows of y,
    paired with the rows of x, without a word; a shorter y failed with a bare IndexError."""
    x, y = _fresh_store_and_data()
    model = _bernoulli_model()
    for wrong in (torch.cat([y, y[:5]]), y[:15]):
        with pytest.raises(ValueError, match=r"y must have shape \(20,\) \(one target per row of x\)"):
            fit_svi(model, weight_guide(model), x, wrong, num_steps=10, batch_size=5)
    # Without targets, SVI fitted the prior (Pyro only warned "Found vars in model but not guide") and NUTS sampled y.
    with pytest.raises(TypeError, match="y must be a torch.Tensor, got NoneType"):
        fit_svi(model, weight_guide(model), x, None, num_steps=2)
    with pytest.raises(TypeError, match="y must be a torch.Tensor, got NoneType"):
        run_nuts(model, x, None, num_samples=1, warmup_steps=1)


def test_a_final_learning_rate_fraction_above_one_is_refused():
    """``final_lr_fraction=2`` was accepted: the "decay" factor (2)^(1/steps) > 1 grew the learning rate
    geometrically."""
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=0), Gaussian(0.1))
    x = torch.linspace(0, 1, 10).unsqueeze(-1)
    with pytest.raises(ValueError, match=r"final_lr_fraction must be in \(0, 1\]"):
        fit_svi(model, weight_guide(model), x, torch.sin(x[:, 0]), num_steps=2, final_lr_fraction=2.0)


def test_posterior_samples_outside_their_priors_support_are_refused():
    """A samples dict with a negative lengthscale predicted finite numbers without a word (a model that cannot
    exist), and NaN weights failed in Pyro's Normal validation without naming ``posterior``."""
    pyro.set_rng_seed(0)
    model = _bernoulli_model()
    x, w, lengthscale = torch.randn(4, 2), torch.randn(10, 1, 8), torch.rand(10) + 0.5
    with pytest.raises(ValueError, match=r"posterior\['lengthscale'\] holds values that are not finite or outside"):
        posterior_predictive(model, x, {"w": w, "lengthscale": -lengthscale})
    with pytest.raises(ValueError, match=r"posterior\['w'\] holds values that are not finite"):
        posterior_predictive(model, x, {"w": w * float("nan"), "lengthscale": lengthscale})


@pytest.mark.parametrize("name, spec", [
    ("mean", torch.tensor([0.0, 5.0])),
    ("outputscale", torch.tensor([1.0, 5.0])),
    ("mean", dist.Normal(torch.zeros(2), 1.0).to_event(1)),
    ("lengthscale", dist.Gamma(torch.ones(2), 1.0)),  # batch shape (2,), event shape (): not an ARD prior
    ("lengthscale", torch.ones(2, 1)),
])
def test_hyperparameters_of_another_shape_are_refused_not_broadcast_against_the_points(name, spec):
    """A (2,) mean, outputscale or batch-shaped prior was accepted and, with n = 2 points, gave each point its own
    value (f of shape (2, 1) with the mean 0 at one point and 5 at the other)."""
    with pytest.raises(ValueError, match=name):
        RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=0), Gaussian(0.1), **{name: spec})


@pytest.mark.parametrize("spec", [torch.tensor([0.1, 0.2]), dist.Gamma(torch.ones(2), 1.0)])
def test_likelihood_hyperparameters_must_be_scalars(spec):
    with pytest.raises(ValueError, match="noise must be a scalar"):
        Gaussian(spec)
    with pytest.raises(ValueError, match="df must be a scalar"):
        StudentT(df=spec)


def test_fixed_hyperparameters_keep_a_float64_value_and_refuse_complex_ones():
    """A float64 tensor was stored in the default float32 (ℓ = 0.123456789012345 became 0.12345679104), and a complex
    one lost its imaginary part with only torch's cast warning."""
    value = torch.tensor(0.123456789012345, dtype=torch.float64)
    model = RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=0), Gaussian(0.1), lengthscale=value)
    assert model.lengthscale.dtype == torch.float64 and model.lengthscale.item() == value.item()
    with pytest.raises(TypeError, match="lengthscale must be a real number or tensor"):
        RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=0), Gaussian(0.1), lengthscale=torch.tensor(1 + 1j))


def test_a_guide_superseded_by_a_later_guide_of_the_same_name_is_refused():
    """Pyro names an autoguide's parameters by its class: after a second weight_guide of the same family (here for
    another model) was fit, the first guide read its parameters, and its posterior mean moved from 0.09 to 0.19."""
    pyro.clear_param_store()
    pyro.set_rng_seed(0)
    x = torch.randn(30, 1, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0])
    first = RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=0).double(), Gaussian(0.1))
    first_guide = weight_guide(first)
    fit_svi(first, first_guide, x, y, num_steps=5)
    assert posterior_predictive(first, x, first_guide, num_samples=4)["f"].shape == (4, 30, 1)
    second = RandomFeatureGP(RandomFourierFeatures(8, input_dim=1, seed=1).double(), Gaussian(0.1))
    second_guide = weight_guide(second)
    fit_svi(second, second_guide, x, y, num_steps=5)
    with pytest.raises(RuntimeError, match="superseded by a later weight_guide"):
        posterior_predictive(first, x, first_guide, num_samples=4)
    with pytest.raises(RuntimeError, match="superseded by a later weight_guide"):
        fit_svi(first, first_guide, x, y, num_steps=1)
    assert posterior_predictive(second, x, second_guide, num_samples=4)["f"].shape == (4, 30, 1)
