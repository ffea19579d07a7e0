"""State that rfgp kernels fix at their first evaluation, at the hyperparameters of that moment, and GPyTorch's Pyro
copies.

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
:func:`refuse_in_pyro_copy` raises there instead, saying to evaluate the model once before sampling (as
:func:`rfgp.pyro.sample_hyperparameters` does).
"""

from __future__ import annotations

from gpytorch.module import RandomModuleMixin


def refuse_in_pyro_copy(kernel) -> None:
    """Raise if ``kernel`` is a copy made by GPyTorch's ``to_random_module`` (``pyro_sample_from_prior``) and it or a
    kernel it evaluates would fix state at this evaluation's hyperparameters."""
    if not isinstance(kernel, RandomModuleMixin):
        return
    pending = "; ".join(f"{name}: {state}" for name, state in _pending(kernel))
    if not pending:
        return
    raise RuntimeError(
        f"this kernel is a copy made by GPyTorch's pyro_sample_from_prior() of a model that was never evaluated, and "
        f"it would fix state at this sample's hyperparameters ({pending}), so that every NUTS step would sample a "
        "different model from the one the samples load into. Evaluate the model once before sampling, at the "
        "hyperparameters to fix that state at (e.g. model.train(); "
        "model.likelihood(model(train_x)).log_prob(train_y)), or sample with "
        "rfgp.pyro.sample_hyperparameters(model), which does so"
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
