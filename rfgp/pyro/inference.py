"""Inference for :class:`~rfgp.pyro.RandomFeatureGP`: Gaussian guides + SVI, NUTS, posterior predictive.

* :func:`weight_guide` — q(w) = N(μ, diag(s²)) (``"mean_field"``, Pyro's ``AutoNormal``) or
  N(μ, LLᵀ) (``"full_rank"``, ``AutoMultivariateNormal``) on the F·L weights, with the
  hyperparameters that have priors point-estimated (``"map"``, ``AutoDelta``), given
  their own mean-field Gaussian (``"mean_field"``) or included in the weight guide
  (``"joint"``, which also correlates them with w in the full-rank family).
* :func:`fit_svi` — maximise the ELBO with Adam, on the full data or on minibatches (``batch_size``).
* :func:`run_nuts` — exact (asymptotically) posterior samples for small problems.
* :func:`posterior_predictive` — ``pyro.infer.Predictive`` over a guide or NUTS samples,
  vectorised over samples.
"""

from __future__ import annotations

import functools
import math
import sys
import weakref
from collections.abc import Iterator

import pyro
import pyro.infer.autoguide as autoguide
import torch
from pyro import poutine
from pyro.infer import MCMC, NUTS, SVI, Predictive, Trace_ELBO
from pyro.infer.mcmc.util import initialize_model
from torch import Tensor
from tqdm import tqdm  # plain text bar: tqdm.auto needs ipywidgets inside notebooks

from ..core.dtypes import in_full_precision
from ..core.validation import (
    DrawCoverageError,
    InvalidValueError,
    check_choice,
    check_positive_float,
    check_positive_int,
    check_seed,
)
from .likelihoods import CustomLikelihood
from .weight_space import RandomFeatureGP

GUIDE_FAMILIES = ("mean_field", "full_rank")
HYPERPARAMETER_GUIDES = ("map", "mean_field", "joint")
#: a full-rank guide has (F·L)² / 2 scale parameters; beyond this, use mean-field.
MAX_FULL_RANK_WEIGHTS = 4096
#: NUTS mixes poorly and costs O(dim) memory per leapfrog tree beyond this: use SVI.
MAX_NUTS_WEIGHTS = 2048


def _check_model(model) -> RandomFeatureGP:
    if not isinstance(model, RandomFeatureGP):
        raise TypeError(f"model must be a rfgp.pyro.RandomFeatureGP, got {type(model).__name__}")
    return model


def weight_guide(
    model: RandomFeatureGP,
    family: str = "full_rank",
    hyperparameters: str = "map",
    init_scale: float = 0.1,
    from_param_store: bool = False,
) -> autoguide.AutoGuide:
    """A Gaussian variational family on the weights w (and a guide for the hyperparameters).

    Args:
        model: the :class:`RandomFeatureGP`.
        family: ``"mean_field"`` or ``"full_rank"`` (full-rank needs F·L ≤ 4096).
        hyperparameters: ``"map"``, ``"mean_field"`` or ``"joint"`` (see module docstring) for every latent
            site but w: the priors of the model and its likelihood, and any site a :class:`CustomLikelihood`'s
            ``distribution_fn`` samples; ignored when there is none.
        init_scale: initial standard deviation of q(w).
        from_param_store: start from the parameters of this name in Pyro's parameter store, e.g. after
            ``pyro.get_param_store().load(path)`` (a guide built before the load picks them up as well).  The guide
            must be the one that saved them (same ``family``, ``hyperparameters`` and model): its first call raises,
            naming them, if it needs parameters the store lacks or leaves stored ones unused.

    Otherwise the guide starts from its own initialisation: parameters of the same name that an earlier
    guide of this function created are removed from Pyro's global parameter store.  Others of that name
    (loaded from a file, or of a guide built by hand) are not guessed at: the call raises, naming
    ``from_param_store`` and ``pyro.clear_param_store()``.
    """
    _check_model(model)
    check_choice(family, "family", GUIDE_FAMILIES)
    check_choice(hyperparameters, "hyperparameters", HYPERPARAMETER_GUIDES)
    init_scale = check_positive_float(init_scale, "init_scale")
    if family == "full_rank" and model.num_weights > MAX_FULL_RANK_WEIGHTS:
        raise ValueError(
            f"family='full_rank' needs F·L ≤ {MAX_FULL_RANK_WEIGHTS} weights, the model has "
            f"{model.num_weights} (F={model.feature_map.num_features}, L={model.num_latents}); use family='mean_field'"
        )
    gaussian = autoguide.AutoMultivariateNormal if family == "full_rank" else autoguide.AutoNormal
    # A guide fixes its latent sites at its first call: one without y (predicting from a fresh or reloaded guide)
    # would make the observed site y latent, a guide of another model that no later call could fit or predict with.
    latent_model = poutine.block(model, hide=["y"])
    # A CustomLikelihood may sample hyperparameters of its own inside distribution_fn: sites only a trace shows.
    # The hyperparameter guide takes every latent site but w, so that those are inferred too, not drawn from
    # their priors at every step (Pyro only warns "Found vars in model but not guide").
    has_hyperparameters = model.hyperparameter_sites() or isinstance(model.likelihood, CustomLikelihood)
    if hyperparameters == "joint" or not has_hyperparameters:
        guide = gaussian(latent_model, init_scale=init_scale)
    else:
        guide = autoguide.AutoGuideList(latent_model)
        guide.append(gaussian(poutine.block(latent_model, expose=["w"]), init_scale=init_scale))
        hyperparameter_model = poutine.block(latent_model, hide=["w"])
        if hyperparameters == "map":
            guide.append(autoguide.AutoDelta(hyperparameter_model))
        else:
            guide.append(autoguide.AutoNormal(hyperparameter_model, init_scale=init_scale))
    store = pyro.get_param_store()
    stored = [name for name in store.keys() if name.startswith(guide._pyro_name + ".")]
    if from_param_store:
        if not stored:
            raise ValueError(
                f"from_param_store=True, but Pyro's parameter store holds no parameters of a guide named "
                f"{guide._pyro_name!r}: load them first (pyro.get_param_store().load(path))"
            )
        # Which parameters the guide needs shows only at its first call, when it creates them.
        guide.register_forward_hook(functools.partial(_check_stored_parameters, frozenset(stored)))
    else:
        foreign = [name for name in stored if _GUIDE_PARAMETERS.get(id(store._params[name])) is not store._params[name]]
        if foreign:
            raise ValueError(
                f"Pyro's parameter store holds parameters named {foreign[:3]} that no guide of weight_guide made "
                "(loaded with pyro.get_param_store().load, or of a guide built by hand): pass from_param_store=True "
                "to start from them, or call pyro.clear_param_store() to start from the guide's initialisation"
            )
        for name in stored:
            del store[name]
        # Pyro names an autoguide's parameters by its class (AutoMultivariateNormal.loc): an earlier guide of this
        # name would read and train this one's parameters (its predictions changed silently once this one was fit).
        for earlier in _GUIDES:
            if earlier._pyro_name == guide._pyro_name:
                earlier._superseded = True
    guide._superseded = False
    guide.register_forward_pre_hook(_refuse_superseded)
    _GUIDES.add(guide)
    # Guides create their parameters at their first call: remember them then, as this function's own.
    guide.register_forward_hook(_remember_parameters)
    return guide


def _refuse_superseded(guide, args) -> None:
    """Forward pre-hook of the guides of :func:`weight_guide`: refuse a guide whose parameters a later guide of the
    same name took over in Pyro's parameter store."""
    if guide._superseded:
        raise RuntimeError(
            f"this {guide._pyro_name} guide was superseded by a later weight_guide(...) call: Pyro names an "
            f"autoguide's parameters by its class ({guide._pyro_name}.loc, ...) in its global parameter store, so the "
            "later guide replaced them and this one would read and train the later one's. Use the latest guide; to "
            "keep a fitted one, save its parameters first (pyro.get_param_store().save(path)) and restore them with "
            "weight_guide(..., from_param_store=True) after pyro.get_param_store().load(path)"
        )


def _check_stored_parameters(stored: frozenset[str], guide, args, output) -> None:
    """Forward hook of a guide of ``weight_guide(..., from_param_store=True)``: raise if it created parameters that
    the store lacked (they would start from their initialisation) or left stored ones unused — the saved guide had
    another ``family``, ``hyperparameters`` or model.  The parameters created by the refused call are removed."""
    store = pyro.get_param_store()
    own = {id(parameter) for parameter in guide.parameters()}
    names = {name for name in store.keys() if name.startswith(guide._pyro_name + ".")}
    missing = sorted(names - stored)
    unused = sorted(name for name in stored if name not in store or id(store._params[name]) not in own)
    if missing or unused:
        for name in missing:
            del store[name]
        raise ValueError(
            f"weight_guide(..., from_param_store=True): the stored parameters are not those of this guide; missing "
            f"from the store (this guide would start them from its initialisation): {missing or 'none'}; stored but "
            f"unused by this guide: {unused or 'none'}. Build the guide with the family= and hyperparameters= of the "
            "guide that saved them, for the same model (features, likelihood, priors)"
        )


def _remember_parameters(guide, args, output) -> None:
    """Forward hook of the guides of :func:`weight_guide` (a module-level function, so that guides still pickle)."""
    _GUIDE_PARAMETERS.update((id(parameter), parameter) for parameter in guide.parameters())


#: the guides of :func:`weight_guide` (weakly held), so that a later guide of the same name marks them superseded
_GUIDES: weakref.WeakSet = weakref.WeakSet()
#: the parameters that guides of :func:`weight_guide` created (weakly held: they live in Pyro's parameter store)
#: by id, since tensors compare elementwise
_GUIDE_PARAMETERS: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


@in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
def fit_svi(
    model: RandomFeatureGP,
    guide,
    x: Tensor,
    y: Tensor,
    num_steps: int = 1000,
    lr: float = 0.01,
    num_particles: int = 1,
    num_data: int | None = None,
    final_lr_fraction: float = 1.0,
    progress: bool | None = None,
    batch_size: int | None = None,
    seed: int | None = None,
) -> list[float]:
    """Maximise the ELBO with (clipped) Adam; returns the loss (−ELBO) per step.

    ``num_particles`` > 1 averages that many vectorised Monte-Carlo samples per step;
    the learning rate decays geometrically from ``lr`` to ``final_lr_fraction · lr``
    (a decay removes most of the stochastic-gradient jitter around the optimum).

    ``batch_size`` trains on minibatches of x and y: every epoch visits the rows once in a random order
    (``seed`` seeds it), each step takes the next ``batch_size`` rows (the last of an epoch may be fewer) and
    scales their log likelihood by N/batch (``num_data`` = N), so the loss of a step is an unbiased estimate of
    the full-data −ELBO and one optimiser (its Adam state and learning-rate decay) runs through all steps.
    Without ``seed`` the order is drawn from torch's global random state, so ``pyro.set_rng_seed`` reproduces it.
    ``num_data`` is for callers that pass one minibatch themselves; it cannot be combined with ``batch_size``.
    """
    _check_model(model)
    num_steps = check_positive_int(num_steps, "num_steps")
    num_particles = check_positive_int(num_particles, "num_particles")
    lr = check_positive_float(lr, "lr")
    final_lr_fraction = check_positive_float(final_lr_fraction, "final_lr_fraction")
    if final_lr_fraction > 1:  # lrd = fraction^(1/steps) > 1 would grow the learning rate geometrically
        raise ValueError(f"final_lr_fraction must be in (0, 1] (the learning rate decays to final_lr_fraction·lr), "
                         f"got {final_lr_fraction}")
    # y=None would fit the prior (Pyro samples an unobserved y); with batch_size, the rows of y are indexed with
    # those of x, so one y of another length would pair targets with other rows.
    model.likelihood.check_targets(y, x.shape[0])
    batches = None
    seed = check_seed(seed)
    if seed is not None and batch_size is None:
        raise ValueError(
            f"seed={seed} was given without batch_size: it seeds the order of minibatches only (full-batch SVI "
            "draws its ELBO samples from Pyro's global random state): pass batch_size, or seed with pyro.set_rng_seed"
        )
    if batch_size is not None:
        if num_data is not None:
            raise ValueError(
                f"num_data={num_data!r} and batch_size={batch_size!r} were both given: with batch_size, x and y are "
                "the full data set and num_data is their number of rows; pass num_data only for a minibatch of your own"
            )
        batches = _minibatches(x.shape[0], check_positive_int(batch_size, "batch_size"), seed, x.device)
    if progress is None:
        progress = sys.stderr.isatty()
    elbo = Trace_ELBO(num_particles=num_particles, vectorize_particles=num_particles > 1, max_plate_nesting=1)
    svi = SVI(model, guide, pyro.optim.ClippedAdam({"lr": lr, "lrd": final_lr_fraction ** (1.0 / num_steps)}), loss=elbo)
    losses = []
    bar = tqdm(range(num_steps), desc="SVI", disable=not progress, leave=False)
    for _ in bar:
        if batches is None:
            losses.append(svi.step(x, y, num_data=num_data))
        else:
            rows = next(batches)
            losses.append(svi.step(x[rows], y[rows], num_data=x.shape[0]))
        bar.set_postfix(loss=f"{losses[-1]:.3f}")
    return losses


def _minibatches(num_rows: int, batch_size: int, seed: int | None, device) -> Iterator[Tensor]:
    """Row indices of successive minibatches, epoch after epoch, each epoch a fresh permutation of all rows."""
    if batch_size > num_rows:
        raise ValueError(f"batch_size must be at most the number of rows of x ({num_rows}), got {batch_size}")
    generator = torch.Generator()
    # Without a seed, one draw of the global random state (which pyro.set_rng_seed seeds) seeds the order.
    generator.manual_seed(int(torch.randint(2**62, ())) if seed is None else seed)
    while True:
        yield from torch.randperm(num_rows, generator=generator).to(device).split(batch_size)


@in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
def run_nuts(
    model: RandomFeatureGP,
    x: Tensor,
    y: Tensor,
    num_samples: int = 300,
    warmup_steps: int = 300,
    num_chains: int = 1,
    max_tree_depth: int = 8,
    full_mass: bool = False,
    progress: bool | None = None,
) -> dict[str, Tensor]:
    """Posterior samples of w (and of the hyperparameters that have priors) by NUTS.

    For small problems only (F·L ≤ 2048 weights); use :func:`fit_svi` beyond.  ``full_mass``
    adapts a dense mass matrix during warm-up, which removes the posterior correlations
    of w (cheap for a few hundred weights, and much faster mixing).  Proposals that rfgp's checks refuse (a
    lengthscale so small that x/ℓ overflows) have zero posterior density: divergences, not errors.
    Returns ``{site: tensor of shape (num_chains·num_samples, *site_shape)}``.
    """
    _check_model(model)
    num_samples = check_positive_int(num_samples, "num_samples")
    warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
    num_chains = check_positive_int(num_chains, "num_chains")
    if not isinstance(full_mass, bool):
        raise TypeError(f"full_mass must be True or False, got {full_mass!r}")
    model.likelihood.check_targets(y, x.shape[0])  # y=None would sample the prior, y being unobserved
    if model.num_weights > MAX_NUTS_WEIGHTS:
        raise ValueError(
            f"NUTS is for small models (F·L ≤ {MAX_NUTS_WEIGHTS} weights); this one has {model.num_weights}: "
            "use weight_guide + fit_svi"
        )
    if progress is None:
        progress = sys.stderr.isatty()
    initial_params, potential, transforms, _ = initialize_model(model, model_args=(x, y), max_plate_nesting=1,
                                                                num_chains=num_chains)

    def rejecting_potential(params: dict[str, Tensor]) -> Tensor:
        # NUTS' step-size search and trajectories probe extreme hyperparameters (a lengthscale of 1e-40 in float32
        # makes x/ℓ infinite), which rfgp's checks refuse: such a point has zero posterior density, a divergence to
        # NUTS, not an error that ends the run.  Draws the features do not cover stay an error.
        try:
            return potential(params)
        except DrawCoverageError:
            raise
        except InvalidValueError:
            return sum(value.sum() for value in params.values()) * 0.0 + math.inf

    kernel = NUTS(potential_fn=rejecting_potential, max_tree_depth=check_positive_int(max_tree_depth, "max_tree_depth"),
                  full_mass=full_mass)
    mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, num_chains=num_chains,
                initial_params=initial_params, transforms=transforms, disable_progbar=not progress)
    mcmc.run()
    return mcmc.get_samples()


def posterior_predictive(
    model: RandomFeatureGP,
    x: Tensor,
    posterior,
    num_samples: int | None = None,
    return_sites: tuple[str, ...] = ("f", "y"),
) -> dict[str, Tensor]:
    """Samples of the latent ``"f"`` (shape ``(S, n, L)``) and of ``"y"`` (``(S, n)``) at ``x``.

    Args:
        model: the :class:`RandomFeatureGP`.
        x: inputs ``(n, d)``.
        posterior: a fitted guide, or a dict of posterior samples (from :func:`run_nuts`).
        num_samples: S; required with a guide, optional (all samples) with a dict.
        return_sites: the sites to return (also hyperparameter sites, e.g. ``"lengthscale"``).
    """
    _check_model(model)
    sites = {"w", *model.hyperparameter_sites()}
    # A CustomLikelihood's distribution_fn may sample sites of its own, which only a run of the model shows.
    known = None if isinstance(model.likelihood, CustomLikelihood) else sites | {"f", "y"}
    if isinstance(return_sites, str) or (known is not None and not set(return_sites) <= known):
        raise ValueError(f"return_sites must be a tuple of this model's sites {sorted(known or sites | {'f', 'y'})}, "
                         f"got {return_sites!r}")
    if isinstance(posterior, dict):
        _check_posterior_samples(model, posterior, sites, known)
        samples = posterior
    elif callable(posterior):
        if num_samples is None:
            raise ValueError("num_samples is required when posterior is a guide")
        num_samples = check_positive_int(num_samples, "num_samples")
        samples = Predictive(posterior, num_samples=num_samples, parallel=True)(x)
    else:
        raise TypeError(f"posterior must be a guide or a dict of samples, got {type(posterior).__name__}")
    samples = {name: value for name, value in samples.items() if name not in ("f", "y")}
    if isinstance(posterior, dict) and num_samples is not None:
        num_samples = check_positive_int(num_samples, "num_samples")
        available = next(iter(samples.values())).shape[0]
        if num_samples > available:
            raise ValueError(
                f"num_samples={num_samples} exceeds the {available} posterior samples given: pass at most "
                f"{available}, or None for all"
            )
        samples = {name: value[:num_samples] for name, value in samples.items()}
    # Every latent site is global (outside the data plate, dim -1): give its samples the
    # (S, 1, *site_shape) layout of a vectorised sample plate at dim -2.  Predictive's own
    # reshape would misplace the slot of sites with event dimensions (w, ARD lengthscale).
    conditioned = {name: value.unsqueeze(1) for name, value in samples.items()}
    num_draws = next(iter(conditioned.values())).shape[0]
    predictive = Predictive(model, posterior_samples=conditioned, num_samples=num_draws,
                            return_sites=list(return_sites), parallel=True)
    predictions = predictive(x)
    return {name: value if name in ("f", "y") else value.squeeze(1) for name, value in predictions.items()}


def _check_posterior_samples(model: RandomFeatureGP, samples: dict, sites: set[str], known: set[str] | None) -> None:
    """Raise unless ``samples`` holds S samples of every latent site of the model (``sites``; ``known``: all its
    sites, None for a CustomLikelihood's), those of w of shape ``(S, *weight_shape)`` = (S, L, F).  Pyro's
    ``Predictive`` draws a site without samples from its prior, so a missing or misspelt one would give the
    predictive of another model; and every sample is finite and inside its prior's support."""
    missing = sorted(sites - samples.keys())
    unknown = sorted(samples.keys() - known) if known is not None else []
    if missing or unknown:
        raise ValueError(
            f"posterior must hold samples of the model's latent sites {sorted(sites)}; missing: {missing or 'none'}, "
            f"not sites of this model: {unknown or 'none'}"
        )
    weight_shape = (model.num_latents, model.feature_map.num_features)
    counts = {name: value.shape[0] if torch.is_tensor(value) and value.dim() > 0 else None
              for name, value in samples.items()}
    if len(set(counts.values())) != 1 or None in counts.values():
        raise ValueError(f"posterior must hold tensors with the same number S of samples (first dimension) for "
                         f"every site, got {counts}")
    if samples["w"].shape[1:] != weight_shape:
        raise ValueError(f"posterior['w'] must have shape (S, L, F) = (S, {weight_shape[0]}, {weight_shape[1]}), got "
                         f"{tuple(samples['w'].shape)}")
    for site in sorted(sites):  # a value outside its prior's support (ℓ < 0, a NaN) predicted silently, or failed later
        support = getattr(_site_prior(model, site), "support", None)
        value = samples[site]
        if not bool(torch.isfinite(value).all()) or (support is not None and not bool(support.check(value).all())):
            raise ValueError(f"posterior[{site!r}] holds values that are not finite or outside its prior's support "
                             f"({support if support is not None else 'the reals'}); a sample must be a value the "
                             "model can take")


def _site_prior(model: RandomFeatureGP, site: str):
    """The prior of a latent site (``None`` for the weights w, whose prior is a standard normal)."""
    if site == "w":
        return None
    module, name = (model.likelihood, site.split(".", 1)[1]) if site.startswith("likelihood.") else (model, site)
    return module._pyro_samples[name]
