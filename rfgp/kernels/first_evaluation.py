"""State that rfgp kernels fix at their first evaluation, at the hyperparameters of that moment, and GPyTorch's Pyro
copies and loaded samples.

Some kernels fix part of their features when first evaluated (after a draw), at the hyperparameters they have then:
the proposal that periodic, rational-quadratic and spectral-mixture frequencies are drawn from, a Matérn-½ kernel's
lengthscale anchor ℓ₀, a spectral product's draws, the optimized Maclaurin allocation (fitted on x/ℓ).  From then on
the hyperparameters enter smoothly and the model is one function of them (:meth:`FeatureKernel.
state_fixed_at_first_evaluation` names what is still to be fixed).

GPyTorch's fully Bayesian recipe calls ``model.pyro_sample_from_prior()`` at every NUTS step, which deep-copies the
model (``Module.to_random_module``) and sets the proposed hyperparameters in the copy.  Of a model never evaluated,
each copy fixed that state at its own proposal — NUTS sampled the posterior of a model whose features moved with its
hyperparameters (a Matérn-½ anchor always at the proposed ℓ, a Maclaurin allocation refitted at every step), not of
the model the samples are loaded into, which fixes it once, at its first (batched) prediction.
:func:`refuse_unfixed_state` raises there instead, saying to evaluate the model once before sampling (as
:func:`rfgp.pyro.sample_hyperparameters` does).

The recipe then calls ``model.pyro_load_from_samples(samples)``.  Samples loaded into a model never evaluated (a
fresh model, the samples saved or drawn with another copy) would have that state fixed at the first evaluation
after the load, at the loaded batch of S samples — each sample predicting with features of its own (an anchor
ℓ₀ = ℓ_s, a proposal centred on θ_s), not with the state of the model the samples were drawn with (predictive means
0.2-1.0 off).  That state is not recoverable from the samples, so that evaluation raises too, saying to fix the
state before loading (:func:`mark_loaded_samples` marks a kernel whose hyperparameters were loaded).
"""

from __future__ import annotations

from gpytorch.module import RandomModuleMixin

#: attribute set on a kernel by :func:`mark_loaded_samples`
_LOADED = "_holds_loaded_samples"


def mark_loaded_samples(kernel) -> None:
    """Record that ``kernel``'s hyperparameters were set by ``pyro_load_from_samples`` (its ``local_load_samples``)."""
    setattr(kernel, _LOADED, True)


def refuse_unfixed_state(kernel) -> None:
    """Raise if evaluating ``kernel`` would fix state (it or a kernel it evaluates) at hyperparameters that are not
    the model's: a copy made by GPyTorch's ``to_random_module`` (``pyro_sample_from_prior``), or a kernel that holds
    samples loaded by ``pyro_load_from_samples``."""
    copied, loaded = isinstance(kernel, RandomModuleMixin), getattr(kernel, _LOADED, False)
    if not (copied or loaded):
        return
    pending = "; ".join(f"{name}: {state}" for name, state in _pending(kernel))
    if not pending:
        return
    if copied:
        raise RuntimeError(
            f"this kernel is a copy made by GPyTorch's pyro_sample_from_prior() of a model that was never evaluated, "
            f"and it would fix state at this sample's hyperparameters ({pending}), so that every NUTS step would "
            "sample a different model from the one the samples load into. Evaluate the model once before sampling, "
            "at the hyperparameters to fix that state at (e.g. model.train(); "
            "model.likelihood(model(train_x)).log_prob(train_y)), or sample with "
            "rfgp.pyro.sample_hyperparameters(model), which does so"
        )
    raise RuntimeError(
        f"this kernel holds hyperparameters loaded by pyro_load_from_samples() into a model that was never evaluated "
        f"(or was redrawn since), and this evaluation would fix state at the loaded batch of samples ({pending}) "
        "instead of the state of the model the samples were drawn with, so that each sample would predict with a "
        "different model. That state is not in the samples: load them into the model they were drawn with, or "
        "build the model again, give it that state before pyro_load_from_samples() — load the sampled model's "
        "state_dict() saved before sampling, or evaluate it once at the hyperparameters the sampled model was first "
        "evaluated at (model.train(); model.likelihood(model(train_x)).log_prob(train_y); "
        "rfgp.pyro.sample_hyperparameters evaluates at the model's hyperparameters when called) — and load the "
        "samples then"
    )


def _pending(module):
    """(class name, state) of ``module`` and of the kernels it evaluates whose state is still to be fixed; the factors
    of a kernel that draws for them (``draws_for_its_factors``: a spectral product) are not evaluated themselves."""
    state = getattr(module, "state_fixed_at_first_evaluation", lambda: None)()
    if state is not None:
        yield type(module).__name__.removeprefix("_Random"), state
    if not getattr(module, "draws_for_its_factors", False):
        for child in module.children():
            yield from _pending(child)
