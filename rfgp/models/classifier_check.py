"""Is a trained Dirichlet GP classifier better than ignoring its inputs?  Its leave-one-out NLL says.

The Dirichlet-transformed regressions (Milios et al. 2018) give every point a fixed noise σ²_{c,i} = log(1/α_{c,i} + 1)
that does not grow with the overlap of the classes.  Where the classes overlap, a smooth latent f_c cannot come near
the bimodal targets ỹ_{c,i} (≈ −0.35 on the point's class, ≈ −6.9 off it at α_ε = 0.01) within that noise, and the
marginal likelihood prefers a kernel that is white noise: ℓ → 0.  On 5 overlapping classes in 2-D (N = 704) GPyTorch's
exact Dirichlet GP trained by L-BFGS or Adam ends at ℓ = 4·10⁻⁵ or 0.02 with a loss of 12.56 against 15.2 at the
data's lengthscale, and predicts the class prior; a random-feature kernel (F = 256, rank F < N) cannot be white
noise and stops near ℓ = 0.1, where it predicts worse than the prior (test NLL 2.04 against 1.61;
``benchmarks/results/classifier_degenerate_optimum.md``).  A learned extra noise (``learn_additional_noise=True``,
GPyTorch's tutorial recipe) holds that white noise itself, and the kernel keeps the data's lengthscale there; it is no
cure for every data set (on three classes cut from a smooth 2-D function, N = 400, 4 of 10 fits with it stopped at
ℓ = 0.02–0.12 with test NLLs of 0.71–1.07 where those without it reached 0.46–0.56), so
:class:`~rfgp.models.DirichletGPClassifier` adds it only to a fit that this check finds degenerate.

:func:`leave_one_out_nll` measures the fit on the training data without a held-out split: each class's regression
predicts ỹ_{c,i} from all other points with mean μ₋ᵢ and variance σ²₋ᵢ (Rasmussen & Williams 2006, Eqs. 5.12–5.13;
:func:`~rfgp.inference.leave_one_out.leave_one_out_predictions`, O(N·F²) for a feature covariance), whose latent part
σ²₋ᵢ − σ²_{c,i} the mean-field softmax (:func:`~rfgp.likelihoods.softmax.softmax_expectation_mean_field`) turns into
class probabilities; their mean negative log probability of the held-out label is compared with that of the class
prior π_c = n_c/N (:func:`class_prior_nll`).
"""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

from ..core.user_warnings import warn as warn_user
from ..inference.leave_one_out import feature_covariance, leave_one_out_predictions
from ..likelihoods.softmax import softmax_expectation_mean_field
from ..metrics import mean_negative_log_likelihood


class DegenerateFitWarning(UserWarning):
    """A trained classifier predicts its own training labels (leave one out) no better than the class prior, or a
    trained :class:`~rfgp.models.GPRegressor` its training targets no better than their mean."""


def leave_one_out_nll(model: gpytorch.models.ExactGP) -> Tensor | None:
    """Mean leave-one-out negative log probability of the training labels under a Dirichlet GP ``model``.

    ``model`` holds a :class:`~rfgp.likelihoods.DirichletClassificationLikelihood` and C latent GPs (batch ``(C,)``)
    trained on its transformed targets.  ``None`` when the noise-added covariance has no feature root (an exact
    GPyTorch kernel: its leave-one-out terms would cost O(N³)).
    """
    latents = leave_one_out_latents(model)
    if latents is None:
        return None
    return mean_negative_log_likelihood(softmax_expectation_mean_field(*latents), model.likelihood.targets)


def leave_one_out_latents(model: gpytorch.models.ExactGP) -> tuple[Tensor, Tensor] | None:
    """Each training point's C latent predictions given all other points, (μ₋ᵢ, σ²₋ᵢ − σ²_{c,i}), both ``(N, C)``,
    of a Dirichlet GP ``model`` (as :func:`leave_one_out_nll`); ``None`` without a feature root."""
    predictions = training_leave_one_out(model)
    if predictions is None:
        return None
    mean, variance = predictions
    with torch.no_grad():  # a learned extra noise is a parameter: its graph made float(nll) warn about requires_grad
        latent = (variance - model.likelihood.noise).clamp_min(0)  # ≥ 0 up to rounding: K ⪰ D
    return mean.transpose(-1, -2), latent.transpose(-1, -2)


def training_leave_one_out(model: gpytorch.models.ExactGP) -> tuple[Tensor, Tensor] | None:
    """(μ₋ᵢ, σ²₋ᵢ + c(xᵢ)) for each training target of ``model`` given all others
    (:func:`~rfgp.inference.leave_one_out.leave_one_out_predictions`), from the prior at the training inputs with
    the likelihood's noise; ``None`` when that covariance has no feature root (an exact GPyTorch kernel: O(N³)).

    Shared by the classifier's and :class:`~rfgp.models.GPRegressor`'s degenerate-fit checks.  The prior is taken in
    eval mode (``model.forward``), where a chunked Nyström covariance forms its FITC term; taken in train mode it
    raised for a :class:`~rfgp.models.DirichletGPClassifier` with a Nyström kernel over the memory budget.
    """
    inputs = model.train_inputs
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            prior = model.likelihood(model.forward(*inputs), *inputs)
            covar = feature_covariance(prior.lazy_covariance_matrix)
            if covar is None:
                return None
            return leave_one_out_predictions(covar, model.train_targets, prior.mean)
    finally:
        model.train(was_training)


def class_prior_nll(labels: Tensor, num_classes: int) -> Tensor:
    """−(1/N) Σᵢ log π_{yᵢ} with π_c = n_c/N: the training NLL of the classifier that ignores the inputs."""
    counts = torch.bincount(labels, minlength=num_classes).to(torch.float64)
    return -(counts[labels] / labels.numel()).log().mean()


def warn_degenerate_fit(loo_nll: float, prior_nll: float, lengthscale: str, refit: tuple[float, str] | None,
                        extra_noise: bool) -> None:
    """:class:`DegenerateFitWarning` for a fit whose leave-one-out NLL ``loo_nll`` is no better than ``prior_nll``.

    ``refit``: (leave-one-out NLL, lengthscales) of the second fit, with the extra noise, that
    ``DirichletGPClassifier(learn_additional_noise=None)`` made after it (``None``: none was made); ``extra_noise``:
    whether the first fit had the extra noise.  The message names the symptom, what was done and the fixes.
    """
    symptom = (
        f"DirichletGPClassifier: the trained model (lengthscale {lengthscale}) predicts its training labels, each left "
        f"out in turn, with a mean negative log likelihood of {loo_nll:.4g}, no better than the class prior's "
        f"{prior_nll:.4g}: the marginal likelihood's optimum explains the labels as noise, not by the inputs (with "
        "heavily overlapping classes the fixed Dirichlet noise cannot hold their spread and the likelihood may prefer "
        "a kernel that is white noise, ℓ → 0; with heavily imbalanced ones the default alpha_epsilon can suit the "
        "rare classes poorly at any lengthscale)"
    )
    others = "a larger alpha_epsilon (or several, chosen by validation), or more training data"
    if refit is None:
        advice = (f"; try {others}" if extra_noise else
                  f"; try learn_additional_noise=None (the default) or True, {others}")
    elif refit[0] < loo_nll:
        still = "" if refit[0] < prior_nll else ", still no better than the prior"
        advice = (
            f"; refitted with learn_additional_noise=True (a learned noise holds what the kernel cannot explain): "
            f"leave-one-out NLL {refit[0]:.4g}, lengthscale {refit[1]}{still}. The classifier keeps that fit "
            "(learn_additional_noise_ is True); pass learn_additional_noise=False or True to choose the model yourself"
        )
    else:
        advice = (f"; a refit with learn_additional_noise=True was no better (leave-one-out NLL {refit[0]:.4g}) and "
                  f"the first fit is kept; try {others}")
    warn_user(symptom + advice + " (leave_one_out_nll_ and class_prior_nll_ hold the kept fit's numbers)",
              DegenerateFitWarning)
