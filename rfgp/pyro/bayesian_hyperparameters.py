"""Fully Bayesian kernel hyperparameters for GPyTorch models with rfgp kernels, by NUTS.

The hyperparameters θ (lengthscale, outputscale, noise, ...) get priors registered
the GPyTorch way (``lengthscale_prior=...``); NUTS samples p(θ | y) ∝ p(y | θ) p(θ)
with the exact marginal likelihood p(y | θ) = N(y; m, K̂_θ + σ²I), through GPyTorch's
Pyro integration (``Module.pyro_sample_from_prior`` / ``pyro_load_from_samples``, as in
GPyTorch's "Fully Bayesian GPs" example).  With an rfgp kernel, K̂_θ = Φ_θΦ_θᵀ and every
likelihood evaluation is O(N·F² + F³) through
:class:`~rfgp.inference.operators.FeatureRootAddedDiagLinearOperator`.

The random draws of the features are shared across the kernel's batch dimensions, so
after loading S samples the model is a batch of S GPs over one set of features, and the
posterior predictive is a batched ``MultivariateNormal`` (one component per sample of θ).
"""

from __future__ import annotations

import math
import sys

import gpytorch
import pyro
import torch
from linear_operator.utils.errors import NanError, NotPSDError
from pyro.infer import MCMC, NUTS
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.validation import DrawCoverageError, InvalidValueError, check_positive_int


def _check_exact_gp(model) -> None:
    if not isinstance(model, gpytorch.models.ExactGP):
        raise TypeError(f"model must be a gpytorch.models.ExactGP, got {type(model).__name__}")
    if model.train_inputs is None or model.train_targets is None:
        raise ValueError("model has no training data: build it with train_x, train_y or call set_train_data")
    priors = list(model.named_priors())
    if not priors:
        raise ValueError(
            "model has no hyperparameter priors: register some, e.g. "
            "SketchedRBFKernel(..., lengthscale_prior=gpytorch.priors.GammaPrior(2.0, 4.0))"
        )
    for name, _, _, _, setting_closure in priors:
        if setting_closure is None:
            raise ValueError(f"prior {name!r} has no setting closure, so Pyro cannot set its hyperparameter")


def _within_constraints(model) -> bool:
    """Whether every raw hyperparameter of ``model`` under a transform-less GPyTorch constraint satisfies it.

    A constraint without a transform (BoTorch's ``SingleTaskGP``: ``GreaterThan(1e-4, transform=None)`` on the noise,
    ``GreaterThan(2.5e-2, transform=None)`` on the lengthscale) is not enforced by the prior's setting closure, which
    stores a value below the bound as it is (an enforced one's inverse transform gives NaN there, rejected as such):
    NUTS sampled BoTorch's noise down to 1e-7 on noiseless data and loaded those samples into the model.
    """
    for module in model.modules():
        for name, constraint in getattr(module, "_constraints", {}).items():
            if constraint is not None and not constraint.enforced and not bool(
                    constraint.check_raw(getattr(module, name.removesuffix("_constraint")))):
                return False
    return True


@in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
def sample_hyperparameters(
    model: gpytorch.models.ExactGP,
    num_samples: int = 200,
    warmup_steps: int = 200,
    max_tree_depth: int = 6,
    progress: bool | None = None,
) -> dict[str, Tensor]:
    """Sample the hyperparameters that have priors by NUTS and load the samples into ``model``.

    Hyperparameters without a prior stay fixed at their current values.  Proposals that
    violate a hyperparameter's GPyTorch constraint (a prior with more support than the
    constraint) are rejected, i.e. the prior is truncated to the constraint.  Afterwards
    ``model`` (in eval mode) is a batch of ``num_samples`` GPs; predict with
    :func:`batched_predictive`.  State that rfgp kernels fix at their first evaluation (a Matérn-½
    lengthscale anchor, a spectral product's draws) is fixed at the current hyperparameters before
    sampling, if it is not already; to anchor near the posterior mode, fit first (:func:`rfgp.fit_mll`)
    and re-anchor at the fitted lengthscale with ``rfgp.set_num_features(model, F)`` (same width, same draws).

    Args:
        model: an ``ExactGP`` with training data and priors on its hyperparameters.
        num_samples, warmup_steps: NUTS samples kept and warm-up (adaptation) iterations.
        max_tree_depth: NUTS tree depth cap (2^depth leapfrog steps per iteration at most).
        progress: show Pyro's progress bar; ``None`` shows it only on a terminal.

    Returns:
        ``{prior name: samples of shape (num_samples, *hyperparameter shape)}``.
    """
    _check_exact_gp(model)
    num_samples = check_positive_int(num_samples, "num_samples")
    warmup_steps = check_positive_int(warmup_steps, "warmup_steps")
    if progress is None:
        progress = sys.stderr.isatty()

    # GPyTorch's pyro_load_from_samples (an earlier call of this function) makes the model a batch of S GPs over S
    # stride-0 copies of its training data: NUTS would sample S independent copies of every hyperparameter given the
    # same data, the posterior of another model, and load S × S samples.
    y = model.train_targets
    if y.dim() > 1 and y.shape[0] > 1 and y.stride(0) == 0:
        raise ValueError(
            f"model holds {y.shape[0]} hyperparameter samples loaded by an earlier sample_hyperparameters (or "
            f"pyro_load_from_samples): its training targets are {y.shape[0]} copies of the same data, and NUTS would "
            "sample that many independent copies of each hyperparameter. Sample a model with one value per "
            "hyperparameter (build it again, or load its state_dict saved before sampling)"
        )
    was_training = model.training
    model.train()
    try:
        x = model.train_inputs[0]
        # rfgp kernels fix some state at their first evaluation after a draw: a Matérn-½ kernel's lengthscale anchor ℓ₀
        # (its frequencies ξ/ℓ₀), a spectral product's draws.  Evaluate once here, at the model's current
        # hyperparameters, so that NUTS samples the posterior of this model and the samples load into it: otherwise the
        # copy below fixed that state at NUTS' random initial point (an anchor of 4.7 where ℓ was 0.69, which moved
        # E[log ℓ | y] from 0.70 to 0.30; exact 0.82), and the loaded model at each sample (r ≡ 1, other features).
        with torch.no_grad():
            model.likelihood(model(x)).log_prob(y)
        # GPyTorch's pyro_sample_from_prior() deep-copies the model at every potential evaluation
        # (most of NUTS' time on small problems); copy it once and overwrite its hyperparameters.
        random_model = model.to_pyro_random_module()
        priors = list(random_model.named_priors())

        def pyro_model(x: Tensor, y: Tensor) -> None:
            values = [(module, setting_closure, pyro.sample(name, prior.expand(closure(module).shape)))
                      for name, module, prior, closure, setting_closure in priors]
            try:
                for module, setting_closure, value in values:
                    setting_closure(module, value)
                if _within_constraints(random_model):
                    # Fast log_prob stays on: it routes to the kernel's own inv_quad_logdet (O(N·F²) for rfgp).
                    log_likelihood = random_model.likelihood(random_model(x)).log_prob(y)
                else:  # a proposal below a transform-less constraint's bound: zero posterior density
                    log_likelihood = y.new_tensor(-math.inf)
            except DrawCoverageError:  # a NanError too, but a valid point: never a zero density
                raise
            except (NanError, NotPSDError, InvalidValueError):
                # A proposal outside a hyperparameter's constraint (e.g. noise below GaussianLikelihood's
                # 1e-4 floor) makes the setting closure produce NaN, or rfgp's checks refuse it: reject it
                # (zero posterior density).
                log_likelihood = y.new_tensor(-math.inf)
            pyro.factor("y", log_likelihood)

        kernel = NUTS(pyro_model, max_tree_depth=check_positive_int(max_tree_depth, "max_tree_depth"))
        mcmc = MCMC(kernel, num_samples=num_samples, warmup_steps=warmup_steps, disable_progbar=not progress)
        mcmc.run(x, y)
        samples = mcmc.get_samples()
    except BaseException:  # an error or an interrupt leaves the model in the mode it was given in
        model.train(was_training)
        raise
    model.pyro_load_from_samples(samples)
    model.eval()
    return samples


def batched_predictive(model: gpytorch.models.ExactGP, samples: dict[str, Tensor], x: Tensor, observed: bool = False):
    """The posterior predictive at ``x`` under each hyperparameter sample loaded by :func:`sample_hyperparameters`.

    Returns a ``MultivariateNormal`` with batch shape ``(S,)`` over the ``n`` points of
    ``x`` (of the latent f, or of y with ``observed=True``).  The fully Bayesian
    predictive is the equal-weight mixture of these S components; see :func:`mixture_moments`.
    """
    _check_exact_gp(model)
    if not isinstance(samples, dict) or not samples:
        raise ValueError(f"samples must be the non-empty dict that sample_hyperparameters returned, got {samples!r}")
    num_samples = next(iter(samples.values())).shape[0]
    for name, module, _, closure, _ in model.named_priors():
        if name in samples and closure(module).shape != samples[name].shape:
            raise ValueError(
                f"the model's {name} hyperparameter has shape {tuple(closure(module).shape)}, not the samples' "
                f"{tuple(samples[name].shape)}: run sample_hyperparameters(model) (or model.pyro_load_from_samples) first"
            )
    expanded = x.unsqueeze(0).expand(num_samples, *x.shape)
    model.eval()
    with torch.no_grad():
        output = model(expanded)
        return model.likelihood(output) if observed else output


def mixture_moments(output) -> tuple[Tensor, Tensor]:
    """Mean and variance of the equal-weight mixture over the batch of a :func:`batched_predictive`.

    E[f] = mean_s μ_s, Var[f] = mean_s σ²_s + mean_s (μ_s − E[f])² (law of total variance), the spread of the means
    taken about their mean: the equal form mean_s (σ²_s + μ_s²) − E[f]² cancels catastrophically where the absolute
    value of E[f] is far above the standard deviation (float32 means of 1000 gave a variance of 0 for 1e-4).
    """
    means, variances = output.mean, output.variance
    mean = means.mean(0)
    return mean, variances.mean(0) + (means - mean).pow(2).mean(0)
