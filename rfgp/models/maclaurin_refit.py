"""How :func:`rfgp.fit_mll` treats optimized Maclaurin maps that training made stale.

An optimized Maclaurin map's truncation order and per-degree widths are fitted to the data at the hyperparameters
of the moment (paper 000, Algorithm 3).  Training moves the lengthscale, so the allocation can go stale: a map fitted
at ℓ = 10 on 5 standardised columns kept degrees ≤ 2 and was trained into a quadratic kernel (test RMSE 0.62,
NLPD 1.13; refitted and trained on: 0.108 and −0.89, as RFF).  :func:`refit_stale_allocations` refits a map when that
at least halves the share of k(x, x) it leaves out on the training inputs, and :func:`warn_truncated_maclaurin`
warns (:class:`~rfgp.training.TruncationWarning`) where a trained map still leaves out much of it.  Both are
registered with :func:`rfgp.training.register_stale_map_handlers` when this module is imported (by
:mod:`rfgp.models`): the walk over a model's kernel tree (:func:`~rfgp.models.feature_width.optimized_maclaurin_units`)
lives in this layer, above the training loop.
"""

from __future__ import annotations

import gpytorch
from torch import Tensor

from ..core.user_warnings import warn as warn_user
from ..kernels.maclaurin import TRUNCATION_WARN_MISSING, TruncationWarning, fit_allocation_on_columns, truncation_share
from ..training import AllocationRefit, register_stale_map_handlers
from .feature_width import optimized_maclaurin_units
from .kernel_inputs import covar_module_inputs


def _missing(share: Tensor) -> float:
    """The mean share of k(x, x) a map leaves out, from its per-input carried shares."""
    return float((1 - share).mean())


#: refit a map that leaves out more than this share of k(x, x) (and whose refit at least halves it)
_REFIT_MISSING = 0.01


def refit_stale_allocations(model: gpytorch.models.ExactGP, iteration: int, loss: float) -> list[AllocationRefit]:
    """Refit every optimized Maclaurin map whose refit would at least halve the missing share of k(x, x)."""
    train_inputs = getattr(model, "train_inputs", None)
    if not train_inputs:
        return []
    refits = []
    for feature_map, kernel, x in list(optimized_maclaurin_units(model, covar_module_inputs(model, train_inputs[0]))):
        missing = _missing(truncation_share(kernel, x))
        if missing <= _REFIT_MISSING:
            continue  # the refit's share (an allocation run) is only needed for a map that leaves out enough
        missing_refit = _missing(truncation_share(kernel, x, refit=True))
        if missing_refit <= missing / 2:
            widths = feature_map.widths
            fit_allocation_on_columns(kernel, x)
            refits.append(AllocationRefit(iteration, type(kernel).__name__, widths, feature_map.widths, missing,
                                          missing_refit, loss))
    return refits


def warn_truncated_maclaurin(model: gpytorch.models.ExactGP) -> None:
    """Warn for each optimized Maclaurin map that leaves out much of k(x, x) at the trained hyperparameters.

    The marginal likelihood sees only Φ, so training can move ℓ to where the truncation carries a small share of
    k(x, x) while the outputscale grows to match the data with what it does carry; the bias-corrected posterior
    variance then adds the outputscale times the missing part as prior variance no data informs (diamonds, 18
    standardised columns: share 0.035, test NLPD 4.2 against −0.04 for RFF; 1.7 after max_order=30 and a refit,
    0.25 with bias_correction=False).
    """
    train_inputs = getattr(model, "train_inputs", None)
    if not train_inputs:
        return
    for feature_map, kernel, x in optimized_maclaurin_units(model, covar_module_inputs(model, train_inputs[0])):
        share = truncation_share(kernel, x)
        missing = _missing(share)
        if missing <= TRUNCATION_WARN_MISSING:
            continue
        missing_refit = _missing(truncation_share(kernel, x, refit=True))
        scale = float(kernel.scale_inputs(x).detach().pow(2).sum(-1).median())
        if missing_refit <= missing / 2:
            advice = (f"Call refit_allocation(model.covar_module, train_x) to refit it at the trained hyperparameters "
                      f"(leaving out {missing_refit:.2g}) and train on (fit_mll does both while iterations are left, "
                      "unless refit_allocation=False)")
        else:
            advice = (f"A refit at max_order={feature_map.order_limit} would still leave out {missing_refit:.2g}: "
                      f"build the kernel with a larger {feature_map.order_option}, "
                      "refit_allocation(model.covar_module, train_x) and train on")
        if feature_map.bias_correction:
            advice += ", or build it with bias_correction=False (the posterior of the truncated kernel)"
        warn_user(
            f"fit_mll: at the trained hyperparameters the optimized Maclaurin map of {type(kernel).__name__} "
            f"({feature_map.kernel.name}, order {feature_map.order} ≤ max_order={feature_map.order_limit}) leaves out "
            f"{missing:.2g} of k(x, x) on average over the training inputs (median share {float(share.median()):.3g}, "
            f"median ‖x‖²/ℓ² {scale:.3g}): the model was trained on the truncated kernel, and the bias-corrected "
            "posterior variance adds the outputscale times the rest, k(x, x) − E k̂(x, x), as prior variance that no "
            f"data informs. {advice}; or use method='rff'.",
            TruncationWarning,
        )


register_stale_map_handlers(refit_stale_allocations, warn_truncated_maclaurin)
