"""A ready-made GPyTorch ``ExactGP`` for regression with any (sketched or exact) kernel."""

from __future__ import annotations

import contextlib

import gpytorch
import torch
from torch import Tensor

from ..core.locks import init_lock
from ..core.validation import check_model_inputs, check_training_data
from ..inference.multioutput import check_one_output_per_input
from ..kernels.combinations import is_feature_kernel
from ..kernels.input_columns import check_input_width


def _nan_policy_leaves_nan_out() -> bool:
    """Whether ``gpytorch.settings.observation_nan_policy`` is "mask" or "fill": NaN targets are then left out of
    the marginal likelihood and the posterior (:mod:`rfgp.inference.prediction`) rather than refused."""
    return gpytorch.settings.observation_nan_policy.value() != "ignore"


def lazy_kernels_when_predicting(model: gpytorch.models.ExactGP):
    """``gpytorch.settings.lazily_evaluate_kernels(True)`` for a model in eval mode, else no change.

    GPyTorch's ``ExactGP`` asks the kernel for its prediction strategy only when the training covariance is
    lazily evaluated; under ``lazily_evaluate_kernels(False)`` it predicts through its generic
    ``DefaultPredictionStrategy``, without rfgp's bias-corrected variance (Maclaurin, spherical maps) and
    stale-cache checks.  Predictions evaluate the covariances inside the call either way; training-mode
    outputs keep the user's setting (a lazy covariance would be evaluated after ``functional_call`` returns).
    """
    return contextlib.nullcontext() if model.training else gpytorch.settings.lazily_evaluate_kernels(True)


def first_prediction_once(model: gpytorch.models.ExactGP):
    """The model's :func:`~rfgp.core.locks.init_lock` while it predicts without a prediction strategy, else no change.

    GPyTorch's ``ExactGP`` builds its prediction strategy (and with it the posterior caches) at the first call in
    eval mode, without a lock: threads predicting at once from a fresh or just ``eval()``-ed model each built one.
    The first prediction is made under the lock, and the threads that came with it wait for its strategy; later
    predictions do not take the lock."""
    if model.training or model.prediction_strategy is not None:
        return contextlib.nullcontext()
    return init_lock(model)


def lazy_test_covariances_for_batched_exact(model: gpytorch.models.ExactGP):
    """``gpytorch.settings.max_eager_kernel_size(0)`` for a model in eval mode with batched targets (T outputs or C
    classes) and an exact GPyTorch kernel (not an rfgp feature kernel), else no change.

    Below N + M = 512 GPyTorch makes such a kernel's test covariances dense and adds the unbatched (M, M) one to the
    (T, M, M) correction with ``torch.addmm``, which raised "mat2 must be a matrix, got 3-D tensor" at every
    prediction; its lazy path, taken above that size anyway, broadcasts them (same values).  The setting is
    process-wide (guide/conventions.md, "Threads"), so it is entered for this case only.
    """
    if model.training or model.train_targets.dim() < 2 or is_feature_kernel(model.covar_module):
        return contextlib.nullcontext()
    return gpytorch.settings.max_eager_kernel_size(0)


def check_kernel_takes_train_x(model, model_class: type, covar_module, train_x: Tensor) -> None:
    """Refuse at construction a ``covar_module`` whose declared input widths contradict train_x's columns
    (:func:`~rfgp.kernels.input_columns.check_input_width`: ``active_dims``, ``ard_num_dims``, an rfgp kernel's
    ``input_dim``), which its first evaluation would otherwise refuse, or, for an exact kernel under ``ScaleKernel``
    whose lengthscales broadcast over one column, evaluate as another model.

    Only where the kernel sees train_x: ``model_class.forward`` (a subclass's own ``forward`` may transform the inputs
    first, deep kernel learning, and is left to the first call).  Kernel parameters in another dtype or on another
    device than train_x are not refused: ``Model(x.cuda(), y.cuda(), likelihood, kernel).cuda()`` (or ``.double()``)
    is GPyTorch's usual pattern, and the conversion aligns them.
    """
    if type(model).forward is model_class.forward:
        check_input_width(covar_module, train_x, "train_x")


class CachesDroppedOnConversion:
    """Mixin of rfgp's ``ExactGP`` models: ``model.float()``, ``.double()`` and ``.to(...)`` drop the posterior caches.

    GPyTorch's ``ExactGP._apply`` converts the training data with the parameters but keeps the prediction strategy,
    whose caches were computed in the old dtype or on the old device: GPyTorch's exact model then fails in a matrix
    product ("expected m1 and m2 to have the same dtype"), and rfgp's strategy raises asking for ``model.train()``.
    Here the caches are recomputed at the next prediction, which equals that of a model built in the new dtype.
    """

    def _apply(self, fn, *args, **kwargs):
        self._clear_cache()
        return super()._apply(fn, *args, **kwargs)


class ExactGPModel(CachesDroppedOnConversion, gpytorch.models.ExactGP):
    """f ~ GP(m, k) with y = f + ε: the standard GPyTorch regression model, kernel supplied.

    With an rfgp kernel, training and prediction cost O(N·F² + F³) instead of O(N³).

    Args:
        train_x: inputs ``(n, d)``.
        train_y: targets ``(n,)``.
        likelihood: e.g. ``gpytorch.likelihoods.GaussianLikelihood()``.
        covar_module: the kernel, e.g. ``ScaleKernel(SketchedRBFKernel(1024, ard_num_dims=d))``.
        mean_module: defaults to ``gpytorch.means.ConstantMean()``.

    A kernel tree that contradicts train_x's columns (``active_dims`` outside them, a kernel's ``ard_num_dims`` or
    an rfgp kernel's ``input_dim`` other than the columns it sees) is refused here and by ``set_train_data``, by
    name; a kernel that declares no width is checked at its first call, as are the inputs of a subclass whose
    ``forward`` transforms them.
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood, covar_module, mean_module=None) -> None:
        check_training_data(train_x, train_y, allow_nan_targets=_nan_policy_leaves_nan_out())
        check_kernel_takes_train_x(self, ExactGPModel, covar_module, train_x)
        # its n·p × n·p covariance does not fit the MultivariateNormal over n points (GPyTorch failed at the first
        # call with "Attempting to broadcast a dimension"); train_x is (..., n, d): checked
        check_one_output_per_input(covar_module, train_x[..., :1, :], "ExactGPModel",
                                   "use rfgp.models.MultiOutputGPModel with (n, {outputs}) targets")
        super().__init__(train_x, train_y, likelihood)
        self.mean_module = mean_module if mean_module is not None else gpytorch.means.ConstantMean()
        self.covar_module = covar_module

    def set_train_data(self, inputs=None, targets=None, strict=True) -> None:
        new_x = inputs if inputs is None or torch.is_tensor(inputs) else inputs[0]
        check_training_data(self.train_inputs[0] if new_x is None else new_x,
                            self.train_targets if targets is None else targets,
                            allow_nan_targets=_nan_policy_leaves_nan_out())
        if new_x is not None:
            check_kernel_takes_train_x(self, ExactGPModel, self.covar_module, new_x)
        super().set_train_data(inputs, targets, strict)

    def __call__(self, *inputs, **kwargs):
        """The prior (train mode) or posterior (eval mode) at ``inputs``, checked against the training inputs."""
        check_model_inputs(self, inputs)
        with lazy_kernels_when_predicting(self), first_prediction_once(self), \
                lazy_test_covariances_for_batched_exact(self):
            return super().__call__(*inputs, **kwargs)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultivariateNormal:
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))
