"""BoTorch's own kernels as rfgp feature kernels, so that ``rfgp.sketch`` converts BoTorch's default models.

Registered with :func:`rfgp.register_converter` when BoTorch is imported (:mod:`rfgp.integrations`), for the
kernels the installed BoTorch has (``PositiveIndexKernel`` is not in every version).

* ``botorch.models.kernels.CategoricalKernel`` — the categorical kernel of ``MixedSingleTaskGP``,
  exp(−(1/d) Σᵢ 1[xᵢ ≠ yᵢ]/ℓᵢ): converted to :class:`~rfgp.kernels.SketchedCategoricalKernel` (hashed
  Rademacher-product features, unbiased, width F) with the same lengthscale, constraint, prior, batch shape
  and ``active_dims``.  ``MixedSingleTaskGP``'s kernel ScaleKernel(k_cont + k_cat) + ScaleKernel(k_cont·k_cat)
  converts as a whole: the sums split F, the product keeps its share through a TensorSRHT of the two factors'
  features (:class:`~rfgp.kernels.SketchedProductKernel`).
* ``botorch.models.kernels.PositiveIndexKernel`` — the default task kernel of ``MultiTaskGP`` in
  the BoTorch versions that have it (0.18 here; older ones use GPyTorch's ``IndexKernel``):
  B = (LLᵀ + diag(v))/c with L ≥ 0 elementwise (positive task correlations) and c = (LLᵀ + diag(v))[t, t]
  for the target task t when ``unit_scale_for_target`` (else 1).
  Its exact features are the rows of R/√c, R = [L, diag(√v)] (as for GPyTorch's ``IndexKernel``,
  :class:`~rfgp.kernels.IndexFeatureKernel`), so a ``MultiTaskGP``'s product kernel
  k_x(x, x')·B[i, i'] converts to a feature product like GPyTorch's multitask pattern.

* ``botorch.models.kernels.DownsamplingKernel`` and ``ExponentialDecayKernel`` — the fidelity kernels of
  ``SingleTaskMultiFidelityGP(linear_truncated=False)``: converted to :class:`~rfgp.kernels.DownsamplingFeatureKernel`
  (exact features [√c, (1 − x)^{1+δ}]) and :class:`~rfgp.kernels.ExponentialDecayFeatureKernel` (106 deterministic
  quadrature features, relative error ≤ 6.8·10⁻⁸ for α ≤ 12), same hyperparameters, constraints, priors, batch shape and
  ``active_dims`` (:mod:`rfgp.kernels.fidelity`).  The model's RBF × decay × downsampling product stays F wide: the
  downsampling features as a Kronecker factor, the decay features in a TensorSRHT with the RBF features.

``LinearTruncatedFidelityKernel`` (the default ``linear_truncated=True``) is refused by name: with its real trainable
power p its covariance is not positive semi-definite (the factor (1 + f·f')^p is indefinite for non-integer p), so
no real feature map reproduces it; the error points to ``linear_truncated=False`` and to ``method="nystrom"``, which
converts the whole multi-fidelity tree into landmark features.

Refused by name, each with the reason and the route that works for it, ``method="nystrom"`` (landmark features of
the whole tree, exact with every training point a landmark):

* ``InfiniteWidthBNNKernel`` (the NNGP of a deep ReLU network, Cho & Saul 2009; Lee et al. 2018): its recursion
  Kˡ = σ_b² + σ_w²·E[relu(u)relu(v)], (u, v) ~ N(0, Kˡ⁻¹), maps each layer's kernel through the arc-cosine function,
  so the features of a finite random ReLU network are unbiased for one hidden layer only (``depth=1``, an arc-cosine
  kernel rfgp has no features for either): deeper, each layer averages over the previous layer's random kernel
  instead of its expectation, a bias of order 1/width per layer that no number of seeds removes.
* ``LCEAKernel`` (contextual BO with context embeddings, Feng et al. 2020): Σᵢⱼ Cᵢⱼ k(x₍ᵢ₎, y₍ⱼ₎) couples every pair
  of context blocks through a context covariance C built from trainable embeddings (cached in eval mode); features
  would need a root of C per evaluation and the embeddings' state — not done here.
* ``SACKernel`` (structural additive contextual kernel): Σ_c s_c·k(x₍c₎, y₍c₎), one RBF module k shared by the
  contexts' ``ScaleKernel`` wrappers — covariance for covariance the tree ``AdditiveKernel(*(ScaleKernel(k, active_dims=
  columns_c) for each context c))``, which rfgp converts (one tied lengthscale).  But GPyTorch's ``named_priors``
  finds k's lengthscale prior under ``base_kernel`` and again under each context's ``ScaleKernel``, so BoTorch's
  MAP objective counts it C + 1 times for C contexts, the equivalent tree C times: converting SACKernel as that
  tree would change the fitted model, so it is refused, naming both routes (that tree, or Nyström).
"""

from __future__ import annotations

import importlib.util

from botorch.models.kernels.categorical import CategoricalKernel
from botorch.models.kernels.contextual_lcea import LCEAKernel
from botorch.models.kernels.contextual_sac import SACKernel
from botorch.models.kernels.downsampling import DownsamplingKernel
from botorch.models.kernels.exponential_decay import ExponentialDecayKernel
from botorch.models.kernels.infinite_width_bnn import InfiniteWidthBNNKernel
from botorch.models.kernels.linear_truncated_fidelity import LinearTruncatedFidelityKernel
from torch import Tensor

from ..core.config_state import METHOD
from ..kernels.categorical import SketchedCategoricalKernel
from ..kernels.conversion import copy_hyperparameters, lengthscale_kwargs, refuse_conversion, register_converter
from ..kernels.fidelity import DownsamplingFeatureKernel, ExponentialDecayFeatureKernel
from ..kernels.index import IndexFeatureKernel

if importlib.util.find_spec("botorch.models.kernels.positive_index") is not None:  # not in every BoTorch
    from botorch.models.kernels.positive_index import PositiveIndexKernel

    class PositiveIndexFeatureKernel(IndexFeatureKernel, PositiveIndexKernel):
        r"""BoTorch's ``PositiveIndexKernel`` with exact features Φ(i) = R[i]/√c (width r + T).

        Same parameters (``raw_covar_factor`` ≥ 0, ``raw_var`` and its constraint, the task prior on the
        correlations), arguments and covariance as ``PositiveIndexKernel``; ``target_task_index`` and
        ``unit_scale_for_target`` are saved in ``state_dict``.

        Example:
            >>> import torch
            >>> from rfgp.integrations.botorch_kernels import PositiveIndexFeatureKernel
            >>> tasks = PositiveIndexFeatureKernel(num_tasks=3, rank=2, target_task_index=1)
            >>> k = tasks(torch.tensor([[0], [1], [2]])).to_dense().detach()  # integers or integral floats
            >>> bool(torch.allclose(k, tasks.covar_matrix)), round(float(k[1, 1]), 6)
            (True, 1.0)
        """

        config_fields = {"target_task_index": METHOD, "unit_scale_for_target": METHOD}

        def task_root(self) -> Tensor:
            """R/√c, whose Gram matrix is ``covar_matrix``: c = (RRᵀ)[t, t] for ``unit_scale_for_target``, else 1."""
            root = super().task_root()
            if not self.unit_scale_for_target:
                return root
            target = root[..., self.target_task_index, :]
            return root / target.pow(2).sum(-1).sqrt().unsqueeze(-1).unsqueeze(-1)


    @register_converter(PositiveIndexKernel, methods=(), options=())
    def _convert_positive_index(kernel, num_features, method, seed):
        """PositiveIndexKernel → :class:`PositiveIndexFeatureKernel`: same parameters, constraints and priors."""
        num_tasks, rank = kernel.raw_covar_factor.shape[-2:]
        converted = PositiveIndexFeatureKernel(
            num_tasks, rank, target_task_index=kernel.target_task_index,
            unit_scale_for_target=kernel.unit_scale_for_target, normalize_covar_matrix=kernel.normalize_covar_matrix,
            var_constraint=kernel.raw_var_constraint, batch_shape=kernel.batch_shape, active_dims=kernel.active_dims,
        )
        converted.raw_covar_factor.data = kernel.raw_covar_factor.data.clone()
        for name, (prior, closure, setting_closure) in kernel._priors.items():
            converted.register_prior(name, prior, closure, setting_closure)
        copy_hyperparameters(kernel, converted, "var")
        return converted.to(kernel.raw_covar_factor)


@register_converter(CategoricalKernel, methods=(), options=())
def _convert_categorical(kernel, num_features, method, seed):
    """CategoricalKernel → :class:`~rfgp.kernels.SketchedCategoricalKernel`: same lengthscale (ARD or shared),
    constraint, prior, batch shape and ``active_dims``."""
    converted = SketchedCategoricalKernel(num_features, seed=seed, **lengthscale_kwargs(kernel))
    return copy_hyperparameters(kernel, converted, "lengthscale")


@register_converter(DownsamplingKernel, methods=(), options=("x_sample",))
def _convert_downsampling(kernel, num_features, method, seed, x_sample=None):
    """DownsamplingKernel → :class:`~rfgp.kernels.DownsamplingFeatureKernel` (exact features, width 1 + d): same
    power and offset, constraints, priors, batch shape and ``active_dims``; d from them or ``x_sample``."""
    input_dim = None if x_sample is None else x_sample.shape[-1]
    converted = DownsamplingFeatureKernel(input_dim=input_dim, batch_shape=kernel.batch_shape,
                                          active_dims=kernel.active_dims)
    return copy_hyperparameters(kernel, converted, "power", "offset")


@register_converter(ExponentialDecayKernel, methods=(), options=())
def _convert_exponential_decay(kernel, num_features, method, seed):
    """ExponentialDecayKernel → :class:`~rfgp.kernels.ExponentialDecayFeatureKernel` (106 quadrature features
    whatever ``num_features``): same lengthscale, power and offset with their constraints and priors (BoTorch
    registers ``power_constraint`` nowhere and the offset's constraint on the power: whatever the kernel holds is
    copied), batch shape and ``active_dims``."""
    converted = ExponentialDecayFeatureKernel(**lengthscale_kwargs(kernel))
    return copy_hyperparameters(kernel, converted, "lengthscale", "power", "offset")


refuse_conversion(
    LinearTruncatedFidelityKernel,
    "its covariance is not positive semi-definite for a non-integer power p (trainable, BoTorch's default "
    "softplus(0) = 0.69): the fidelity factor (1 + f·f')^p has Maclaurin coefficients binom(p, k) that change sign "
    "past k = p + 1, and at p = 0.69 BoTorch's own kernel matrix on 100 fidelities in [0, 1] has eigenvalue −0.0029, "
    "so no real feature map Φ has ΦΦᵀ equal to it (finite exact features exist only at integer p). Build the "
    "model with linear_truncated=False (RBF × DownsamplingKernel/ExponentialDecayKernel, which convert), or convert "
    "the whole tree to rank-M landmark features, model.covar_module = rfgp.sketch(model.covar_module, M, "
    "method='nystrom', x_sample=model.transform_inputs(train_X)), or keep the exact kernel",
)


refuse_conversion(
    InfiniteWidthBNNKernel,
    "it is the infinite-width limit of a deep ReLU network (the NNGP recursion K_l = bias + weight·E[relu(u)relu(v)], "
    "(u, v) ~ N(0, K_(l-1))), and the features of a finite random ReLU network are unbiased for one hidden layer only "
    "(depth=1, an arc-cosine kernel rfgp has no features for either): deeper, each layer averages over the previous "
    "layer's random kernel, a bias that no number of seeds removes. Its "
    "landmark features target it exactly at the landmarks: model.covar_module = rfgp.sketch(model.covar_module, M, "
    "method='nystrom', x_sample=model.transform_inputs(train_X))",
)
refuse_conversion(
    LCEAKernel,
    "it sums k(x_(i), y_(j)) over every pair of context blocks weighted by a context covariance built from trainable "
    "context embeddings, which rfgp has no features for. Its landmark features work on the whole input: "
    "model.covar_module = rfgp.sketch(model.covar_module, M, method='nystrom', "
    "x_sample=model.transform_inputs(train_X))",
)
refuse_conversion(
    SACKernel,
    "it is the sum over contexts of ScaleKernel(k) on each context's columns with one RBF k shared, whose "
    "lengthscale prior BoTorch's MAP objective counts C + 1 times for C contexts (under base_kernel and under each "
    "context's ScaleKernel); the same covariance as AdditiveKernel(*(ScaleKernel(kernel.base_kernel, active_dims=c, "
    "outputscale_prior=GammaPrior(2.0, 15.0)) for c in kernel._indexers.values())), outputscales copied, which "
    "rfgp.sketch converts but whose objective counts the prior C times. Build and fit that tree to use random "
    "features, or keep SACKernel with landmark features: rfgp.sketch(model.covar_module, M, method='nystrom', "
    "x_sample=model.transform_inputs(train_X))"
)
