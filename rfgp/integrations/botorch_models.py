"""BoTorch models that cache quantities of the features outside GPyTorch's prediction strategies.

Registered with :func:`rfgp.models.feature_width.register_cache_clearer` when BoTorch is imported
(:mod:`rfgp.integrations`), so that :func:`rfgp.set_num_features` rebuilds them at the new width:

* ``botorch.models.PairwiseGP`` keeps its Laplace approximation (the MAP utility, the Cholesky factor
  of K and the likelihood Hessian) from its last fit or construction and predicts from it in eval mode;
  after a resize it would combine that K of the old features with cross-covariances of the new ones.
  It is re-solved on the current data, as BoTorch's own ``PairwiseGP.load_state_dict`` does after new
  hyperparameters.  Its (transformed) ``datapoints`` are the default ``x_sample`` of data-dependent maps
  (optimized Maclaurin, Nyström landmarks), as an ``ExactGP``'s ``train_inputs`` are.
"""

from __future__ import annotations

from botorch.models.pairwise_gp import PairwiseGP
from torch import Tensor

from ..models.feature_width import register_cache_clearer


def _resolve_laplace(model: PairwiseGP) -> None:
    if model.datapoints is not None and model.comparisons is not None:
        model._update(model.transform_inputs(model.datapoints))


def _datapoints(model: PairwiseGP) -> Tensor | None:
    return None if model.datapoints is None else model.transform_inputs(model.datapoints)


register_cache_clearer(PairwiseGP, _resolve_laplace, train_inputs=_datapoints)
