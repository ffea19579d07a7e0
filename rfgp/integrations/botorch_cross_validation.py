"""BoTorch's ``loo_cv`` in O(N·F² + F³) for models with an rfgp covariance.

``botorch.cross_validation.loo_cv`` (and ``efficient_loo_cv``, ``ensemble_loo_cv``) compute the closed-form
leave-one-out means and variances μ₋ᵢ = yᵢ − [K⁻¹r]ᵢ/[K⁻¹]ᵢᵢ, σ²₋ᵢ = 1/[K⁻¹]ᵢᵢ (Rasmussen & Williams 2006, Eqs.
5.12–5.13) in their private helper ``_compute_loo_predictions``, which densifies the noise-added N × N covariance,
factorises it with ``psd_safe_cholesky`` and inverts the factor: O(N³) time, O(N²) memory, whatever the kernel.
BoTorch offers no public hook for it (the public functions call the helper by its module-global name), so — as
:mod:`rfgp.integrations.botorch_pruning` wraps ``get_sampler`` — the module attribute is wrapped when BoTorch is
imported (:mod:`rfgp.integrations`): when the model's noise-added training covariance is an rfgp feature operator
(:func:`rfgp.inference.leave_one_out.feature_covariance`; single output, batched outputs, ensemble members), the
means and variances come from :func:`rfgp.inference.leave_one_out.leave_one_out_predictions` (Woodbury through the
F × F capacitance, or the N × N factor when N ≤ F where that is cheaper), and the rest is BoTorch's own code
(``observation_noise=False`` subtracts the noise with BoTorch's ``_subtract_observation_noise``, the posterior, the
outcome untransform).  Every other model — including those BoTorch refuses (auxiliary inputs, forward methods that
do not return a ``MultivariateNormal``) — goes to BoTorch's unchanged helper, which raises its own errors.  A model
without an rfgp kernel among its modules goes there at once, decided from its module tree without evaluating
anything, so a plain model's kernel is evaluated once per call, as without rfgp; a model with one is evaluated here
first, and only a covariance that turns out not to be a feature operator (an rfgp kernel summed with an exact one in
GPyTorch's ``AdditiveKernel``) is evaluated again by BoTorch's helper.
``loo_cv`` of a ``SingleTaskGP`` with F = 256 (float64, 2 shared cores, ``benchmarks/leave_one_out.py``): N = 5000
9.9 s → 0.17 s, N = 10 000 58 s → 0.62 s (the exact GP: 9.6 s and 36 s).
"""

from __future__ import annotations

import functools

import botorch.cross_validation as botorch_cross_validation
from gpytorch.distributions import MultivariateNormal
from torch import Tensor

from ..inference.leave_one_out import feature_covariance, leave_one_out_predictions
from ..kernels.combinations import holds_feature_kernel

#: BoTorch's helper, which :func:`_compute_loo_predictions` calls for every other model
_botorch_compute_loo_predictions = botorch_cross_validation._compute_loo_predictions


@functools.wraps(_botorch_compute_loo_predictions)
def _compute_loo_predictions(model, observation_noise: bool = True) -> tuple[Tensor, Tensor, Tensor]:
    train_inputs = getattr(model, "train_inputs", None)
    train_Y = getattr(model, "train_targets", None)
    if (not train_inputs or train_Y is None or not isinstance(train_inputs[0], Tensor)
            or not holds_feature_kernel(model)):
        return _botorch_compute_loo_predictions(model, observation_noise=observation_noise)
    train_X = train_inputs[0]
    prior = model.forward(train_X)
    if type(prior) is not MultivariateNormal:
        return _botorch_compute_loo_predictions(model, observation_noise=observation_noise)
    if botorch_cross_validation._likelihood_requires_X(model.likelihood):
        noisy = model.likelihood(prior, train_X)
    else:
        noisy = model.likelihood(prior)
    covar = feature_covariance(noisy.lazy_covariance_matrix) if type(noisy) is MultivariateNormal else None
    if covar is None:
        return _botorch_compute_loo_predictions(model, observation_noise=observation_noise)
    loo_mean, loo_variance = leave_one_out_predictions(covar, train_Y, prior.mean)
    loo_mean, loo_variance = loo_mean.unsqueeze(-1), loo_variance.unsqueeze(-1)
    if not observation_noise:
        loo_variance = botorch_cross_validation._subtract_observation_noise(model, loo_variance)
    return loo_mean, loo_variance, train_Y


botorch_cross_validation._compute_loo_predictions = _compute_loo_predictions
