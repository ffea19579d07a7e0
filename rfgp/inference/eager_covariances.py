"""rfgp's prediction strategies for eagerly evaluated feature covariances in GPyTorch's ``ExactGP``.

GPyTorch's ``ExactGP`` picks its prediction strategy with
``gpytorch.models.exact_prediction_strategies.prediction_strategy``, which asks the kernel
(``kernel.prediction_strategy``) only when the training covariance is a ``LazyEvaluatedKernelTensor``.  Under
``gpytorch.settings.lazily_evaluate_kernels(False)`` the kernels return their operators directly, so a user's own
``ExactGP`` with an rfgp kernel predicted through the generic ``DefaultPredictionStrategy``:

* without the bias-corrected posterior variance of truncated maps (paper 000 §5.6: k(x*, x*) − E[k̂(x*, x*)]); an
  optimized Maclaurin RBF model at N = 3000, F = 63 reported a predictive variance of 0.050 instead of 0.60 at a test
  point away from the data;
* through linear_operator's Woodbury form with its F × F capacitance matrix even where the N × N matrix is the
  cheaper exact algebra (N ≲ F, :mod:`rfgp.inference.kernel_space`);
* without the checks for re-drawn features and converted caches (:class:`~rfgp.inference.prediction.
  FeatureSpacePredictionStrategy`).

:func:`install` (run at ``import rfgp``) wraps that dispatch in ``gpytorch.models.exact_gp``: an eagerly evaluated
training covariance that is an rfgp feature root gets the strategy its kernel gives a lazily evaluated one —
:class:`~rfgp.inference.prediction.FeatureSpacePredictionStrategy` for one output per input,
:class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy` for several (derivative observations,
vector fields, multitask feature kernels: more rows than training points). Every other covariance (see
:func:`eager_strategy_class`), and every lazily evaluated one, goes to GPyTorch's function unchanged. Without the
kernel, the strategy cannot check for re-drawn features (they are checked where the kernel is lazily evaluated, as
in rfgp's own models).

The same dispatch serves a lazily evaluated covariance whose kernel answers with GPyTorch's generic strategy while
kernels inside it have their own — GPyTorch's ``AdditiveKernel``/``ProductKernel`` of rfgp kernels (``k₁ + k₂``),
which train through the feature root (:func:`_combines_specialised_kernels`): its covariance is evaluated (memoised)
and dispatched as an eager one, keeping the lazy covariance, so the strategy still checks the kernel's draws.

A combined covariance that is no feature root (an rfgp kernel summed with or multiplied by an exact one,
``MultitaskKernel`` around an rfgp data kernel) goes to GPyTorch's ``DefaultPredictionStrategy``; where its rfgp parts
carry a variance correction (Nyström, truncated Maclaurin), to
:class:`~rfgp.inference.combined_covariances.CorrectedDefaultPredictionStrategy`, which adds it.
"""

from __future__ import annotations

import functools

import gpytorch.kernels
import gpytorch.models.exact_gp
from gpytorch.lazy import LazyEvaluatedKernelTensor

from .combined_covariances import CorrectedDefaultPredictionStrategy, combined_variance_correction
from .kernel_evaluation import evaluated_covariance
from .multioutput import MultitaskFeatureSpacePredictionStrategy
from .multioutput_chunking import ChunkedMultiOutputFeatureOperator
from .operators import ChunkedFeatureRootLinearOperator, FeatureRootLinearOperator
from .prediction import FeatureSpacePredictionStrategy


def eager_strategy_class(covariance, num_points: int):
    """rfgp's strategy class for an evaluated training covariance over ``num_points`` inputs (``None``: GPyTorch's).

    A multi-output root evaluated a block of points at a time (over ``rfgp.settings.memory_budget``) gets the
    multi-output strategy too: ``ExactGP`` slices its test blocks out of the joint operator by whole points, which
    keeps them chunked (:meth:`~rfgp.inference.multioutput_chunking.ChunkedMultiOutputFeatureOperator._getitem`).
    It stayed with GPyTorch's strategy, whose CG solves gave a sketched ``MultitaskKernel`` (N = 600, T = 3) means
    off by 2e-2, in 10× the time.
    """
    if isinstance(covariance, ChunkedMultiOutputFeatureOperator):
        return MultitaskFeatureSpacePredictionStrategy
    if isinstance(covariance, (FeatureRootLinearOperator, ChunkedFeatureRootLinearOperator)):
        single = covariance.shape[-1] == num_points
        return FeatureSpacePredictionStrategy if single else MultitaskFeatureSpacePredictionStrategy
    return None


def _with_eager_rfgp_covariances(gpytorch_prediction_strategy):
    @functools.wraps(gpytorch_prediction_strategy)
    def prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood):
        covariance = train_prior_dist.lazy_covariance_matrix
        if isinstance(covariance, LazyEvaluatedKernelTensor) and _combines_specialised_kernels(covariance.kernel):
            covariance = evaluated_covariance(covariance)  # memoised: the strategy evaluates it again for free
        if not isinstance(covariance, LazyEvaluatedKernelTensor) and train_inputs:
            strategy = eager_strategy_class(covariance, train_inputs[0].shape[-2])
            if strategy is not None:
                return strategy(train_inputs, train_prior_dist, train_labels, likelihood)
            if combined_variance_correction(covariance) is not None:
                return CorrectedDefaultPredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)
        return gpytorch_prediction_strategy(train_inputs, train_prior_dist, train_labels, likelihood)

    prediction_strategy.gpytorch_prediction_strategy = gpytorch_prediction_strategy
    return prediction_strategy


#: ``prediction_strategy`` methods that return the ``base_kernel``'s
_DELEGATING_STRATEGIES = (gpytorch.kernels.ScaleKernel.prediction_strategy,
                          gpytorch.kernels.AdditiveStructureKernel.prediction_strategy)


def _combines_specialised_kernels(kernel) -> bool:
    """Whether ``kernel`` answers GPyTorch's dispatch with the generic ``Kernel.prediction_strategy`` although a kernel
    inside it has a strategy of its own: GPyTorch's ``AdditiveKernel``/``ProductKernel`` (``k₁ + k₂``, ``k₁ * k₂``) of
    rfgp kernels, whose evaluated covariance is an rfgp feature root (trained through its F × F statistics), predicted
    through ``DefaultPredictionStrategy``'s N × N algebra: 160× slower than ``FeatureSumKernel`` (N = 3 000,
    F = 512, 500 test points: 1.5 s against 0.009 s) and without the bias correction of truncated maps.  Their
    covariance is evaluated (memoised, as the strategy would) and dispatched as an eager one.

    Wrappers whose strategy is their ``base_kernel``'s (``ScaleKernel``, ``AdditiveStructureKernel``) are looked
    through, as GPyTorch's dispatch does: ``ScaleKernel(k₁ * k₂)`` of Nyström or truncated Maclaurin kernels
    predicted without either correction (variances up to k(x, x) too small far from the data)."""
    while type(kernel).prediction_strategy in _DELEGATING_STRATEGIES:
        kernel = kernel.base_kernel
    generic = gpytorch.kernels.Kernel.prediction_strategy
    return type(kernel).prediction_strategy is generic and any(
        type(part).prediction_strategy is not generic
        for part in kernel.modules() if isinstance(part, gpytorch.kernels.Kernel) and part is not kernel
    )


def install() -> None:
    """Wrap the strategy dispatch that ``gpytorch.models.exact_gp`` imported (idempotent)."""
    current = gpytorch.models.exact_gp.prediction_strategy
    if getattr(current, "gpytorch_prediction_strategy", None) is None:
        gpytorch.models.exact_gp.prediction_strategy = _with_eager_rfgp_covariances(current)
