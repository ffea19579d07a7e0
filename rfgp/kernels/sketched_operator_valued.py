"""Random-feature (ORFF) versions of the operator-valued kernels (paper 004, Brault et al. 2016).

Each kernel returns, for x1 == x2, a :class:`~rfgp.inference.operators.FeatureRootLinearOperator` over the
interleaved root R of shape ``(..., n·p, F)`` (row i·p + t = output t of point i, GPyTorch's
multitask order), so K̂ = RRᵀ stays low-rank through the likelihood, the marginal likelihood
and the prediction (:class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy`):
training and prediction cost O(N·p·F²).

* :class:`SketchedDecomposableKernel` — any rfgp scalar feature kernel φ ⊗ Bᵀ with
  A = BBᵀ, B = [L, diag(√v)] (width F_s·(rank + p)).
* :class:`SketchedCurlFreeKernel` — B(ω) = ω (width F = 2m).
* :class:`SketchedDivFreeKernel` — B(ω) = ‖ω‖U⊥(ω) (width F = 2m(d − 1)).
* :class:`MultiOutputFeatureSumKernel` — Σᵢ K̂ᵢ with root [R₁, R₂, …], e.g. the Helmholtz kernel
  σ_c²K̂_curl + σ_d²K̂_div whose posterior splits into a curl-free and a divergence-free field.

See :mod:`rfgp.features.operator_valued` for the feature maps and the corrected
divergence-free factor.
"""

from __future__ import annotations

import functools
import math

import torch
from gpytorch.kernels import IndexKernel, Kernel
from torch import Tensor, nn

from ..core.config_state import METHOD
from ..core.settings import resolve_chunk_size
from ..core.user_warnings import warn as warn_user
from ..core.validation import check_choice, check_positive_int
from ..features.operator_valued import (
    OperatorValuedFourierFeatures,
    decomposable_features,
)
from ..inference.chunked_kronecker import ChunkedKroneckerFeatureOperator
from ..inference.chunking import Featurizer
from ..inference.kronecker_tasks import KroneckerFeatureRootLinearOperator, KroneckerRootLinearOperator
from ..inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator
from .combinations import (
    FeatureSumKernel,
    is_feature_kernel,
    kernel_features,
    kernel_num_features,
    kernel_variance_correction,
    select_active,
    unwrap_scale,
)
from .families import check_kernel_kwargs
from .fourier import FOURIER_METHODS
from .operator_valued import check_vector_dim, check_vector_input, check_vector_kernel_kwargs
from .random_feature_kernel import FeatureKernel


class _MultiOutputFeatureKernel(FeatureKernel):
    """A feature kernel whose root has p interleaved rows per input point."""

    num_outputs: int

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        return self.num_outputs

    def diag_moments(self, x: Tensor):
        # ORFF are unbiased with finite variance; no deterministic diagonal shortfall to correct.
        return None

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        from ..inference.multioutput import MultitaskFeatureSpacePredictionStrategy

        return MultitaskFeatureSpacePredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)


class _SketchedGaussianDerivativeKernel(_MultiOutputFeatureKernel):
    family: str
    has_lengthscale = True
    #: output j is the field's component along input column j (see :func:`~.combinations.rows_follow_columns`)
    outputs_follow_input_columns = True
    config_fields = {"method": METHOD, "input_dim": METHOD}

    def __init__(
        self,
        num_features: int,
        input_dim: int,
        method: str = "rff",
        seed: int | None = None,
        generator: torch.Generator | None = None,
        **kwargs,
    ) -> None:
        input_dim = check_vector_dim(input_dim)
        check_choice(method, "method", tuple(FOURIER_METHODS))
        check_vector_kernel_kwargs(input_dim, kwargs)
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.method = method
        self.input_dim = input_dim
        self.num_outputs = input_dim
        self.feature_map = OperatorValuedFourierFeatures(
            num_features, input_dim, self.family, sampler=FOURIER_METHODS[method], seed=seed, generator=generator
        )

    @property
    def num_features(self) -> int:
        return self.feature_map.num_features

    def featurize(self, x: Tensor) -> Tensor:
        """The interleaved root Φ of shape ``(*batch, n·d, F)``."""
        check_vector_input(x, "x", self.input_dim)
        lengthscale = self.lengthscale
        return self.feature_map(x.div(lengthscale), lengthscale).flatten(-3, -2)

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}, num_features={self.num_features}, method={self.method!r}"


class SketchedCurlFreeKernel(_SketchedGaussianDerivativeKernel):
    r"""ORFF approximation of :class:`~rfgp.kernels.CurlFreeRBFKernel`: K̂ = m⁻¹Σⱼcos(ωⱼᵀδ)ωⱼωⱼᵀ.

    Every sample Φ(x)θ is the gradient of the scalar RFF function Σⱼ(aⱼsin − bⱼcos)(ωⱼᵀx)
    /√m, so its curl is zero to machine precision.

    Args:
        num_features: F = 2m (even).
        input_dim: d ≥ 2 (= number of outputs).
        method: ``"rff"`` (i.i.d.), ``"orf"`` (orthogonal) or ``"sorf"`` (structured) frequencies.
        seed, generator: randomness of the frequencies.
        kwargs: ``ard_num_dims``, ``lengthscale_prior``, ``lengthscale_constraint``, ``batch_shape``,
            ``active_dims``.

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import SketchedCurlFreeKernel
        >>> covar_module = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(1024, input_dim=3, method="orf"))
        >>> covar_module(torch.rand(5, 3)).shape  # 5 points × 3 field components
        torch.Size([15, 15])
    """

    family = "curl_free"


class SketchedDivFreeKernel(_SketchedGaussianDerivativeKernel):
    r"""ORFF approximation of :class:`~rfgp.kernels.DivFreeRBFKernel`: K̂ = m⁻¹Σⱼcos(ωⱼᵀδ)(‖ωⱼ‖²I − ωⱼωⱼᵀ).

    Uses the corrected factor B(ω) = ‖ω‖U⊥(ω) (digest II.2(c) pitfall), so ωᵀB = 0 and every
    sample is exactly divergence-free; works for every d ≥ 2.  ``num_features`` = F = 2m(d − 1)
    must be a multiple of 2(d − 1).  Other arguments as :class:`SketchedCurlFreeKernel`.
    """

    family = "divergence_free"


class SketchedDecomposableKernel(_MultiOutputFeatureKernel):
    r"""ORFF of a decomposable kernel k̂(x, y)·A: root φ(x) ⊗ Bᵀ with A = BBᵀ = LLᵀ + diag(v).

    A drop-in for ``gpytorch.kernels.MultitaskKernel`` (what :func:`rfgp.sketch` converts it to): the same
    constructor arguments and the same module names, the data kernel in ``data_covar_module`` and the
    output covariance, parameterised exactly like ``gpytorch.kernels.IndexKernel``, in ``task_covar_module``.
    So ``state_dict`` keys match (``data_covar_module.*``, ``task_covar_module.*``) and the trained
    hyperparameters of a ``MultitaskKernel`` or :class:`~rfgp.kernels.DecomposableKernel` load with
    ``load_state_dict(exact.state_dict(), strict=False)``; B = [L, diag(√v)] is an exact factor, no SVD needed.

    Args:
        data_covar_module: an rfgp scalar feature kernel (optionally inside ``ScaleKernel``), e.g.
            ``SketchedRBFKernel(512, method="orf")``.
        num_tasks: p (also readable as ``num_outputs``, rfgp's name for the outputs per input).
        rank: columns of L (0: independent outputs, A = diag(v), as ``MultitaskKernel(..., rank=0)``).
        task_covar_prior: optional prior on A (``IndexKernel``'s ``prior``).

    The operator-valued names of earlier versions remain: ``base_kernel`` (read-only alias of
    ``data_covar_module``) and ``num_outputs`` (read-only alias of ``num_tasks``); the constructor keywords
    ``base_kernel=``, ``num_outputs=`` and ``output_covar_prior=`` still work with a ``DeprecationWarning``, and a
    state dict saved under ``base_kernel.*`` loads into ``data_covar_module``.

    Width: F = F_s·(rank + p).

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedDecomposableKernel, SketchedRBFKernel
        >>> kernel = SketchedDecomposableKernel(SketchedRBFKernel(64, seed=0), num_tasks=3, rank=1)
        >>> kernel(torch.randn(4, 2)).shape          # 4 points × 3 tasks, interleaved
        torch.Size([12, 12])
    """

    # ``num_outputs`` (= num_tasks) keeps its state key ``config_num_outputs`` so saved states still load
    config_fields = {"num_outputs": METHOD, "rank": METHOD}
    _LEGACY_KEYWORDS = {"base_kernel": "data_covar_module", "num_outputs": "num_tasks",
                        "output_covar_prior": "task_covar_prior"}

    def __init__(self, data_covar_module: Kernel | None = None, num_tasks: int | None = None, rank: int = 1,
                 task_covar_prior=None, **kwargs):
        given = {"data_covar_module": data_covar_module, "num_tasks": num_tasks, "task_covar_prior": task_covar_prior}
        for old, new in self._LEGACY_KEYWORDS.items():
            if old not in kwargs:
                continue
            if given[new] is not None:
                raise TypeError(f"SketchedDecomposableKernel got both {new}= and its former name {old}=; pass {new}=")
            warn_user(f"SketchedDecomposableKernel({old}=...) is deprecated; use {new}= (MultitaskKernel's name)",
                      DeprecationWarning)
            given[new] = kwargs.pop(old)
        data_covar_module, num_tasks, task_covar_prior = given.values()
        if num_tasks is None:
            raise TypeError("SketchedDecomposableKernel needs num_tasks (the number of outputs p)")
        if not is_feature_kernel(data_covar_module):
            raise TypeError(
                f"data_covar_module must be an rfgp feature kernel (optionally inside ScaleKernel), got "
                f"{type(data_covar_module).__name__}; use rfgp.sketch(kernel, num_features) to convert an exact one"
            )
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)
        self.num_tasks = check_positive_int(num_tasks, "num_tasks")
        self.rank = check_positive_int(rank, "rank", allow_zero=True)
        self.data_covar_module = data_covar_module
        # one task covariance per batch member, as GPyTorch's MultitaskKernel
        self.task_covar_module = IndexKernel(num_tasks=self.num_tasks, batch_shape=self.batch_shape, rank=self.rank,
                                             prior=task_covar_prior)

    @property
    def num_outputs(self) -> int:
        """p, the outputs per input (rfgp's name for ``num_tasks``)."""
        return self.num_tasks

    @property
    def base_kernel(self) -> Kernel:
        """Read-only alias of ``data_covar_module`` (the name of earlier versions; not a second submodule)."""
        return self.data_covar_module

    def __setattr__(self, name: str, value) -> None:
        if name == "base_kernel":  # nn.Module would register a second copy of the data kernel under this name
            raise AttributeError("SketchedDecomposableKernel.base_kernel is read-only: set data_covar_module")
        super().__setattr__(name, value)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # states saved by earlier versions hold the data kernel under ``base_kernel.``: load it as data_covar_module
        old, new = prefix + "base_kernel.", prefix + "data_covar_module."
        if not any(key.startswith(new) for key in state_dict):
            for key in [key for key in state_dict if key.startswith(old)]:
                state_dict[new + key[len(old):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    @property
    def num_features(self) -> int:
        """Root width F_s·(rank + p), F_s the data kernel's sketch width."""
        return kernel_num_features(self.data_covar_module) * (self.rank + self.num_tasks)

    def output_factor(self) -> Tensor:
        """B = [L, diag(√v)] of shape (p, rank + p), with BBᵀ = A."""
        task = self.task_covar_module
        return torch.cat((task.covar_factor, torch.diag_embed(task.var.sqrt())), dim=-1)

    @property
    def output_covariance(self) -> Tensor:
        return self.task_covar_module.covar_matrix.to_dense()

    def prepare(self, x: Tensor) -> None:
        """The scalar kernel fits on all of ``x`` (see :meth:`~rfgp.kernels.FeatureKernel.prepare`)."""
        unwrap_scale(self.data_covar_module)[0].prepare(select_active(self.data_covar_module, x))

    def featurize(self, x: Tensor) -> Tensor:
        return self._decomposable_features(x)[0]

    def training_covariance(self, x: Tensor) -> KroneckerFeatureRootLinearOperator:
        """K(x, x) with its Kronecker factors φφᵀ ⊗ BBᵀ
        (:class:`~rfgp.inference.kronecker_tasks.KroneckerFeatureRootLinearOperator`), which BoTorch's
        ``KroneckerMultiTaskGP.posterior`` takes apart, from one featurisation of the data kernel."""
        scalar = kernel_features(self.data_covar_module, x)
        factor = self.output_factor().to(scalar.dtype)
        root = KroneckerRootLinearOperator(scalar, factor)  # formed only where a path needs it
        return KroneckerFeatureRootLinearOperator(root, self.variance_correction(x), scalar, factor)

    def _multi_output_prediction_forward(self, x1: Tensor, x2: Tensor, same: bool, diag: bool,
                                         featurizer: Featurizer, num_rows: int, outputs: int, batch: int):
        """A covariance R(x)R(x)ᵀ over the budget keeps its Kronecker factors
        (:class:`~rfgp.inference.chunked_kronecker.ChunkedKroneckerFeatureOperator`): under a noise D_N ⊗ Σ_T its
        statistics need φ (N × F_s) — whole where φ's working set fits the budget, else in row blocks — not the
        N·p × F_s·(rank + p) root."""
        lazy = super()._multi_output_prediction_forward(x1, x2, same, diag, featurizer, num_rows, outputs, batch)
        if diag or not isinstance(lazy, ChunkedMultiOutputFeatureOperator) or not lazy.symmetric:
            return lazy
        data = self.data_featurizer(x1)
        data_chunk = resolve_chunk_size(x1.shape[-2], data.num_features, math.prod(data.batch_shape), x1.dtype)
        factor = self.output_factor().to(x1.dtype)
        return ChunkedKroneckerFeatureOperator.from_root(lazy, data, factor, data_chunk)

    def data_featurizer(self, x: Tensor) -> Featurizer:
        """φ, the data kernel's features (``kernel_features`` of ``data_covar_module``, its outputscale and
        ``active_dims`` included), as a :class:`~rfgp.inference.chunking.Featurizer` for block-by-block evaluation;
        the data kernel already prepared on all of x (:meth:`prepare`)."""
        kernel = self.data_covar_module
        with torch.no_grad():
            probe = kernel_features(kernel, x[..., :1, :])
        params = [p for p in kernel.parameters() if p.requires_grad]
        return Featurizer(functools.partial(kernel_features, kernel), params, probe.shape[-1], probe.shape[:-2])

    def variance_correction(self, x: Tensor) -> Tensor | None:
        """c(x)·A_ii per interleaved row (point x, task i), c the data kernel's correction: the diagonal that the
        root φ(x) ⊗ Bᵀ (row norm ‖φ(x)‖²·‖B_i‖² = ‖φ(x)‖²·A_ii) falls short of k(x, x)·A_ii by.  Before, none: a
        multitask Nyström model's posterior variance away from the landmarks fell to 0 instead of the prior A_ii.
        In eval mode only, as a Nyström kernel's: no training quantity reads it, and a truncated Maclaurin data
        kernel would featurise x a second time for it."""
        if self.training:
            return None
        correction = kernel_variance_correction(self.data_covar_module, x)
        if correction is None:
            return None
        tasks = self.output_factor().to(correction).pow(2).sum(-1)  # diag(A) = ‖B_i‖², (*batch, p)
        return (correction.unsqueeze(-1) * tasks.unsqueeze(-2)).flatten(-2, -1)

    def _decomposable_features(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """(Φ(x) = φ(x) ⊗ Bᵀ with interleaved rows, φ(x), B)."""
        scalar = kernel_features(self.data_covar_module, x)
        factor = self.output_factor().to(scalar.dtype)
        return decomposable_features(scalar, factor).flatten(-3, -2), scalar, factor


def _num_outputs(kernel: Kernel) -> int:
    """p of a (multi-output) feature kernel inside any number of ``ScaleKernel`` s (1 for a scalar one)."""
    return getattr(unwrap_scale(kernel)[0], "num_outputs", 1)


class MultiOutputFeatureSumKernel(_MultiOutputFeatureKernel, FeatureSumKernel):
    r"""K̂ = Σᵢ K̂ᵢ of multi-output feature kernels with the same p, root [R₁, …, Rₖ] (width ΣFᵢ).

    With a curl-free and a divergence-free component (each in its own ``ScaleKernel``) this is
    the Helmholtz kernel: the weight posterior splits into the two parts, see
    :func:`rfgp.applications.vector_fields.posterior_component_fields`.

    Example:
        >>> import torch
        >>> from rfgp.kernels import MultiOutputFeatureSumKernel, SketchedCurlFreeKernel, SketchedDivFreeKernel
        >>> from gpytorch.kernels import ScaleKernel
        >>> helmholtz = MultiOutputFeatureSumKernel(
        ...     ScaleKernel(SketchedCurlFreeKernel(512, 2)), ScaleKernel(SketchedDivFreeKernel(512, 2)))
        >>> helmholtz(torch.randn(5, 2)).shape          # 5 points × 2 field components
        torch.Size([10, 10])
    """

    def __init__(self, *kernels: Kernel, **kwargs) -> None:
        FeatureSumKernel.__init__(self, *kernels, **kwargs)
        outputs = [_num_outputs(kernel) for kernel in kernels]
        if len(set(outputs)) != 1:
            raise ValueError(f"all kernels must have the same number of outputs; got num_outputs={outputs}")
        self.num_outputs = outputs[0]

    def variance_correction(self, x: Tensor) -> Tensor | None:
        """The sum of the components' corrections (those of an LCM's Nyström or truncated Maclaurin data kernels)."""
        corrections = [c for c in (kernel_variance_correction(kernel, x) for kernel in self.kernels) if c is not None]
        return functools.reduce(torch.add, corrections) if corrections else None

    def component_widths(self, x: Tensor) -> list[int]:
        """Root width of every component (the column blocks of the root)."""
        return [kernel_features(kernel, x[..., :1, :]).shape[-1] for kernel in self.kernels]


class SketchedLCMKernel(MultiOutputFeatureSumKernel):
    r"""K̂ = Σ_q k̂_q(x, y)·A_q, the linear model of coregionalisation as the sum of decomposable sketches.

    A drop-in for ``gpytorch.kernels.LCMKernel`` (what :func:`rfgp.sketch` converts it to): its components
    are :class:`SketchedDecomposableKernel` s kept, like LCMKernel's ``MultitaskKernel`` s, in
    ``covar_module_list`` (so the exact kernel's ``state_dict`` loads), and ``num_tasks`` is p.  The root is
    [R₁, …, R_Q] (width Σ_q F_q·(rank_q + p)), as for any :class:`MultiOutputFeatureSumKernel`.

    Example:
        >>> import torch
        >>> from rfgp.kernels import SketchedDecomposableKernel, SketchedLCMKernel, SketchedRBFKernel
        >>> lcm = SketchedLCMKernel(SketchedDecomposableKernel(SketchedRBFKernel(32, seed=0), num_tasks=2),
        ...                         SketchedDecomposableKernel(SketchedRBFKernel(32, seed=1), num_tasks=2))
        >>> lcm(torch.randn(5, 3)).shape          # 5 points × 2 tasks, interleaved
        torch.Size([10, 10])
    """

    def __init__(self, *kernels: Kernel, **kwargs) -> None:
        for i, kernel in enumerate(kernels):
            if not isinstance(kernel, SketchedDecomposableKernel):
                raise TypeError(f"kernels[{i}] must be a SketchedDecomposableKernel (a sketched MultitaskKernel), "
                                f"got {type(kernel).__name__}")
        super().__init__(*kernels, **kwargs)
        self.covar_module_list = self._modules.pop("kernels")  # LCMKernel's name for the components

    @property
    def kernels(self) -> nn.ModuleList:
        """The components (``covar_module_list``), under the name the feature-sum machinery reads."""
        return self.covar_module_list

    @property
    def num_tasks(self) -> int:
        return self.num_outputs
