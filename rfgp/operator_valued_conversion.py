"""``rfgp.sketch`` converters for the operator-valued kernels (registered on import).

* :class:`~rfgp.kernels.CurlFreeRBFKernel` → :class:`~rfgp.kernels.SketchedCurlFreeKernel`
* :class:`~rfgp.kernels.DivFreeRBFKernel` → :class:`~rfgp.kernels.SketchedDivFreeKernel`
* ``gpytorch.kernels.MultitaskKernel`` (and so :class:`~rfgp.kernels.DecomposableKernel`) →
  :class:`~rfgp.kernels.SketchedDecomposableKernel` over ``rfgp.sketch(data_covar_module)``;
  ``num_features`` is then the width of the scalar sketch, the root has F·(rank + p) columns.

Lengthscales, the output covariance A (the ``IndexKernel``), constraints and priors are copied.
"""

from __future__ import annotations

import copy

from gpytorch.kernels import MultitaskKernel

from .conversion import copy_hyperparameters, lengthscale_kwargs, register_converter, sketch
from .kernels.operator_valued import CurlFreeRBFKernel, DivFreeRBFKernel
from .kernels.sketched_operator_valued import SketchedCurlFreeKernel, SketchedDecomposableKernel, SketchedDivFreeKernel


def _convert_derivative_kernel(sketched_type, kernel, num_features, method, seed, **options):
    sketched = sketched_type(
        num_features, kernel.input_dim, method=method or "rff", seed=seed, **options, **lengthscale_kwargs(kernel)
    )
    return copy_hyperparameters(kernel, sketched, "lengthscale")


@register_converter(CurlFreeRBFKernel)
def _convert_curl_free(kernel, num_features, method, seed, **options):
    return _convert_derivative_kernel(SketchedCurlFreeKernel, kernel, num_features, method, seed, **options)


@register_converter(DivFreeRBFKernel)
def _convert_div_free(kernel, num_features, method, seed, **options):
    return _convert_derivative_kernel(SketchedDivFreeKernel, kernel, num_features, method, seed, **options)


@register_converter(MultitaskKernel)
def _convert_decomposable(kernel, num_features, method, seed, **options):
    base = sketch(kernel.data_covar_module, num_features, method=method, seed=seed, **options)
    rank = kernel.task_covar_module.covar_factor.shape[-1]
    sketched = SketchedDecomposableKernel(base, num_outputs=kernel.num_tasks, rank=rank)
    # The IndexKernel (A = LLᵀ + diag(v), its constraint and prior) carries over unchanged.
    sketched.task_covar_module = copy.deepcopy(kernel.task_covar_module)
    return sketched
