"""BoTorch models that cache quantities of the features outside GPyTorch's prediction strategies, or that read a
kernel's covariance as a dense tensor.

Registered with :func:`rfgp.models.feature_width.register_cache_clearer` when BoTorch is imported
(:mod:`rfgp.integrations`), so that :func:`rfgp.set_num_features` rebuilds them at the new width:

* ``botorch.models.PairwiseGP`` keeps its Laplace approximation (the MAP utility, the Cholesky factor
  of K and the likelihood Hessian) from its last fit or construction and predicts from it in eval mode;
  after a resize it would combine that K of the old features with cross-covariances of the new ones.
  It is re-solved on the current data, as BoTorch's own ``PairwiseGP.load_state_dict`` does after new
  hyperparameters.  Its (transformed) ``datapoints`` are the default ``x_sample`` of data-dependent maps
  (optimized Maclaurin, Nyström landmarks), as an ``ExactGP``'s ``train_inputs`` are.

``botorch.models.LatentKroneckerGP`` (where the installed BoTorch has it) trains and predicts its posterior mean and
variance with rfgp kernels as ``covar_module_X``/``covar_module_T`` (GPyTorch's algebra on the same covariance), but
its pathwise sampler (``posterior(X, T).rsample``, hence every Monte-Carlo acquisition function) reads the evaluated
kernels' dense ``.tensor`` and Cholesky-factorises K_X and the conditional test covariance, which for a rank-F
covariance ΦΦᵀ is singular once F < n.  It failed with ``AttributeError: 'ChunkedFeatureCrossLinearOperator' object
has no attribute 'tensor'``; it now raises an ``UnsupportedError`` that names the models whose sampling takes rfgp
kernels.

``botorch.models.KroneckerMultiTaskGP`` with a sketched ``MultitaskKernel``
(:class:`~rfgp.kernels.SketchedDecomposableKernel`) whose data kernel has a variance correction (Nyström
landmarks: the FITC-style c(x) = k(x, x) − ‖φ(x)‖²) adds c(x*)·A_ii to its posterior variance, A the task
covariance, as rfgp's multi-output models do; BoTorch's formula reads the data kernel's diagonal ‖φ(x*)‖² only, so
away from the landmarks the variance fell to 10⁻¹⁰ instead of the prior k(x*, x*)·A_ii.  Its Matheron samples get
the same term from the joint root (:meth:`~rfgp.inference.kronecker_tasks.DataFeatureRootLinearOperator.cat_rows`).
"""

from __future__ import annotations

import functools
import importlib.util

from botorch.exceptions.errors import UnsupportedError
from botorch.models.multitask import KroneckerMultiTaskGP
from botorch.models.pairwise_gp import PairwiseGP
from botorch.posteriors.multitask import MultitaskGPPosterior
from linear_operator.operators import DiagLinearOperator
from torch import Tensor

from ..kernels.combinations import holds_feature_kernel
from ..kernels.sketched_operator_valued import SketchedDecomposableKernel
from ..models.feature_width import register_cache_clearer


def _resolve_laplace(model: PairwiseGP) -> None:
    if model.datapoints is not None and model.comparisons is not None:
        model._update(model.transform_inputs(model.datapoints))


def _datapoints(model: PairwiseGP) -> Tensor | None:
    return None if model.datapoints is None else model.transform_inputs(model.datapoints)


register_cache_clearer(PairwiseGP, _resolve_laplace, train_inputs=_datapoints)

#: BoTorch's posterior, which :func:`_kronecker_posterior` runs and completes with the variance correction
_botorch_kronecker_posterior = KroneckerMultiTaskGP.posterior


@functools.wraps(_botorch_kronecker_posterior)
def _kronecker_posterior(self, X: Tensor, *args, **kwargs):
    posterior = _botorch_kronecker_posterior(self, X, *args, **kwargs)
    kernel = self.covar_module
    if not isinstance(kernel, SketchedDecomposableKernel):
        return posterior
    correction = kernel.variance_correction(self.transform_inputs(X))  # c(x*)·A_ii, interleaved as the variance
    if correction is None:
        return posterior
    inner = posterior
    while not isinstance(inner, MultitaskGPPosterior):  # outcome transforms wrap it in TransformedPosteriors
        if not hasattr(inner, "_posterior"):
            raise TypeError(
                f"KroneckerMultiTaskGP.posterior returned a {type(inner).__name__} around no MultitaskGPPosterior, so "
                "rfgp cannot add its data kernel's variance correction k(x, x) − ‖φ(x)‖² (Nyström landmarks) to it"
            )
        inner = inner._posterior
    mvn = inner.distribution
    inner.distribution = type(mvn)(mvn.mean, mvn.lazy_covariance_matrix + DiagLinearOperator(correction.to(mvn.mean)),
                                   interleaved=mvn._interleaved)
    return posterior


KroneckerMultiTaskGP.posterior = _kronecker_posterior


if importlib.util.find_spec("botorch.models.latent_kronecker_gp") is not None:  # not in every BoTorch
    from botorch.models.latent_kronecker_gp import LatentKroneckerGP

    #: BoTorch's pathwise sampler, which :func:`_rsample_from_base_samples` runs for other kernels
    _botorch_latent_kronecker_rsample = LatentKroneckerGP._rsample_from_base_samples

    @functools.wraps(_botorch_latent_kronecker_rsample)
    def _rsample_from_base_samples(self, *args, **kwargs):
        sketched = [name for name in ("covar_module_X", "covar_module_T")
                    if holds_feature_kernel(getattr(self, name))]
        if sketched:
            raise UnsupportedError(
                "LatentKroneckerGP samples its posterior (posterior(X, T).rsample, Monte-Carlo acquisition functions) "
                f"by Cholesky factors of the dense covariances of {' and '.join(sketched)}, an rfgp kernel: its "
                "covariance ΦΦᵀ has rank F (singular for F < n) and no dense tensor. Its posterior mean and variance "
                "are exact for the rfgp kernel. To sample, fit the same GP as a SingleTaskGP on the observed (x, t) "
                "rows with covar_module=rfgp.sketch(k_X * k_T, F) (the factors on the x and t columns by active_dims; "
                "missing entries are absent rows), use HigherOrderGP with an rfgp data kernel (covar_modules[0], "
                "complete grids), or keep the exact kernels here"
            )
        return _botorch_latent_kronecker_rsample(self, *args, **kwargs)

    LatentKroneckerGP._rsample_from_base_samples = _rsample_from_base_samples
