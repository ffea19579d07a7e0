"""A GPyTorch ``ExactGP`` with p outputs per input, trained and predicted in feature space.

The model layer of multi-output GPs: it checks the (n, p) targets against the kernel's
``num_outputs_per_input`` and returns a ``MultitaskMultivariateNormal``; the O(N·p·F²)
algebra lives in :mod:`rfgp.inference.multioutput`.
"""

from __future__ import annotations

import gpytorch
import torch
from torch import Tensor

from ..core.validation import check_model_inputs, check_training_data
from ..inference.multioutput import kernel_num_outputs
from .regression import (
    CachesDroppedOnConversion,
    _nan_policy_leaves_nan_out,
    check_kernel_takes_train_x,
    first_prediction_once,
    lazy_kernels_when_predicting,
)


class MultiOutputGPModel(CachesDroppedOnConversion, gpytorch.models.ExactGP):
    """f ~ GP(μ, K) with p outputs per input; y = f + ε, ``MultitaskMultivariateNormal`` output.

    With an rfgp multi-output kernel (sketched curl/div-free or decomposable) training and
    prediction stay in feature space (O(N·p·F²)); exact operator-valued kernels work too
    (dense, for validation).

    Args:
        train_x: ``(n, d)`` inputs.
        train_y: ``(n, p)`` targets; p must equal the kernel's ``num_outputs_per_input``.
        likelihood: e.g. ``gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=p, rank=0)`` (independent
            task noises; rank ≥ 1 correlates them, see :mod:`rfgp.inference.task_noise`).
        covar_module: the matrix-valued kernel (optionally inside ``ScaleKernel``).
        mean_module: defaults to ``MultitaskMean(ZeroMean(), p)`` (vector fields are usually centred).

    Inconsistent parts are refused here, by name, before any evaluation: train_x's columns against the kernel tree's
    declared widths (``active_dims``, ``ard_num_dims``, an rfgp kernel's ``input_dim``; a kernel that declares none,
    e.g. a map drawn at its first call, is checked by that call), train_y's columns against the kernel's outputs
    (d for a curl- or divergence-free kernel in d dimensions), and the likelihood's and a ``MultitaskMean``'s
    ``num_tasks`` against them.

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.models import MultiOutputGPModel
        >>> from gpytorch.likelihoods import MultitaskGaussianLikelihood
        >>> from rfgp.kernels import SketchedCurlFreeKernel
        >>> x = torch.randn(50, 2, generator=torch.Generator().manual_seed(0))
        >>> y = -2 * x                                   # the gradient field of −‖x‖²: curl-free
        >>> kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(1024, input_dim=2, seed=0))
        >>> model = MultiOutputGPModel(x, y, MultitaskGaussianLikelihood(num_tasks=2, rank=0), kernel)
        >>> _ = model.eval()
        >>> model(torch.zeros(3, 2)).mean.shape          # (points, components)
        torch.Size([3, 2])
    """

    def __init__(self, train_x: Tensor, train_y: Tensor, likelihood, covar_module, mean_module=None) -> None:
        if not torch.is_tensor(train_y) or train_y.dim() != 2:
            shape = tuple(train_y.shape) if torch.is_tensor(train_y) else type(train_y).__name__
            raise ValueError(f"train_y must be an (n, p) tensor of vector observations, got {shape}")
        check_training_data(train_x, train_y, target_axis=-2, allow_nan_targets=_nan_policy_leaves_nan_out())
        check_kernel_takes_train_x(self, MultiOutputGPModel, covar_module, train_x)  # before the outputs it implies
        num_outputs = kernel_num_outputs(covar_module, train_x[..., :1, :])
        if train_y.shape[-1] != num_outputs:
            raise ValueError(
                f"train_y has {train_y.shape[-1]} outputs (columns) but covar_module has num_outputs_per_input="
                f"{num_outputs}; they must match"
            )
        if isinstance(likelihood, gpytorch.likelihoods._GaussianLikelihoodBase) and not isinstance(
                likelihood, gpytorch.likelihoods._MultitaskGaussianLikelihoodBase):
            # GaussianLikelihood's noise failed to broadcast deep inside GPyTorch; FixedNoiseGaussianLikelihood's
            # (n·p,) noise was dropped with a GPInputWarning only (a noise-free marginal likelihood), its (n, p) failed
            raise TypeError(
                f"likelihood must be a multitask likelihood for {num_outputs} outputs per point, got "
                f"{type(likelihood).__name__} (a single-output Gaussian likelihood, whose noise GPyTorch does not add "
                f"to a MultitaskMultivariateNormal); use MultitaskGaussianLikelihood(num_tasks={num_outputs}, "
                "rank=0) (has_task_noise=False for one noise shared by all outputs)"
            )
        tasks = getattr(likelihood, "num_tasks", num_outputs)
        if tasks != num_outputs:
            raise ValueError(f"likelihood has num_tasks={tasks} but the kernel has {num_outputs} outputs")
        means = getattr(mean_module, "num_tasks", num_outputs)  # a MultitaskMean's; other means say none
        if means != num_outputs:
            raise ValueError(f"mean_module has num_tasks={means} but the kernel has {num_outputs} outputs; use "
                             f"MultitaskMean(..., num_tasks={num_outputs})")
        super().__init__(train_x, train_y, likelihood)
        self.num_outputs = num_outputs
        if mean_module is None:
            mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ZeroMean(), num_tasks=num_outputs)
        self.mean_module = mean_module
        self.covar_module = covar_module

    def __call__(self, *inputs, **kwargs):
        check_model_inputs(self, inputs)
        with lazy_kernels_when_predicting(self), first_prediction_once(self):
            return super().__call__(*inputs, **kwargs)

    def forward(self, x: Tensor) -> gpytorch.distributions.MultitaskMultivariateNormal:
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))
