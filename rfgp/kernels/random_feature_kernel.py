"""The GPyTorch adapter that turns any :class:`~rfgp.features.FeatureMap` into a kernel.

k̂(x, y) = Φ(x/ℓ)ᵀΦ(y/ℓ), returned as a low-rank LinearOperator (never a dense n × n
matrix unless ``to_dense()`` is asked for), with GPyTorch's lengthscale (ARD, batch
shapes, constraints, priors), ``active_dims``, ``diag=True`` and a feature-space
prediction strategy.  The random draws are shared across the kernel's batch
dimensions, so batched models (one GP per class or output) share one Φ per input.

When the N × F features of a call would exceed :class:`rfgp.settings.memory_budget`
(or a :class:`rfgp.settings.chunk_size` is forced), the kernel returns chunked
operators that hold x and the feature function instead of Φ (see
:mod:`rfgp.inference.chunking`): same values and gradients, O(chunk·F + F²) memory.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable

import torch
from gpytorch.kernels import Kernel
from linear_operator.operators import LinearOperator, MatmulLinearOperator
from torch import Tensor, nn

from ..core.batch_copies import copied_batch_dims, expand_batch, narrow_copies
from ..core.config_state import ConfigState
from ..core.dtypes import in_full_precision, promote_pair
from ..core.memory import check_solve
from ..core.settings import chunking_cause, resolve_chunk_size
from ..core.state_cache import module_configuration, module_tensors
from ..core.validation import (
    NonFiniteError,
    NonFiniteHyperparameterError,
    check_finite,
    check_hyperparameter,
    check_kernel_inputs,
    describe_bad_hyperparameters,
    module_dtype,
    promote_unit_rows,
    refuse_functorch_transforms,
)
from ..features.base import FeatureMap
from ..features.fourier import RandomFourierFeatures
from ..features.weighted_fourier import projection_features
from ..inference.chunking import Featurizer, chunk_slices
from ..inference.linalg import squared_row_norms
from ..inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator, points_per_block
from ..inference.operators import (
    ChunkedFeatureCrossLinearOperator,
    ChunkedFeatureRootLinearOperator,
    FeatureRootLinearOperator,
)
from ..inference.prediction import FeatureSpacePredictionStrategy
from .checked_call import CheckedCallMixin, refuse_last_dim_is_batch
from .families import check_kernel_kwargs
from .first_evaluation import mark_loaded_samples, refuse_unfixed_state
from .hyperparameters import parameter_value


class FeatureKernel(CheckedCallMixin, ConfigState, Kernel):
    """Base of every kernel that is an explicit inner product of features, k̂(x, y) = Φ(x)ᵀΦ(y).

    Subclasses implement :meth:`featurize` — or :meth:`folded_features`, which gives :meth:`featurize` and folds a
    ``ScaleKernel``'s outputscale into the features — and :meth:`diag_moments`; this class turns them
    into GPyTorch's kernel contract with low-rank outputs and the feature-space
    prediction strategy.  Options that change the kernel (``method``, ``nu``, ...) are declared
    in ``config_fields`` and saved in ``state_dict`` (:mod:`rfgp.core.config_state`); the feature
    map saves its own.
    """

    def featurize(self, x: Tensor) -> Tensor:
        """Φ(x) of shape ``(*batch_shape, n, F)`` (``active_dims`` already applied by the caller); here
        :meth:`folded_features` ``(x)``, for kernels that implement that instead."""
        return self.folded_features(x)

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """√A·Φ(x) for log A of shape ``(*batch)`` (``None``: A = 1, Φ(x) itself), the amplitude folded into the
        features' own evaluation — the one method of the amplitude-folding protocol.

        A kernel that implements this instead of :meth:`featurize` gets ``featurize(x) = folded_features(x)``,
        :meth:`folds_amplitude` and :meth:`amplitude_features`: a ``ScaleKernel``'s outputscale s then enters as
        log A = log s (:func:`~rfgp.inference.chunking.scaled_features`) instead of multiplying Φ afterwards.  For
        sin/cos features Φ = e^{σ}·[cos P, sin P] with log pair scales σⱼ = ½(log A + log wⱼ − log m)
        (:func:`~rfgp.features.weighted_fourier.scaled_sincos_features`): the product Φ(x)·√A is made inside the
        Function, which saves its output Φ̃ = √A·Φ(x) and returns A's gradient from it,
        ∂L/∂log A = ½ Σ G ⊙ Φ̃ — no pass over the N × F features each way for the multiplication, no N × F product
        kept for its gradient.  It must equal ``featurize(x) * A.sqrt()`` as a function of x and every
        hyperparameter (values, first and second derivatives), and make :meth:`featurize`'s checks.
        """
        raise NotImplementedError(f"{type(self).__name__} implements neither featurize nor folded_features")

    #: own buffers that carry the kernel's batch shape, indexed by :meth:`__getitem__`; every other own buffer (random
    #: draws, landmarks, an input centre, ``active_dims``) is shared by the batch members
    batched_buffers: tuple[str, ...] = ()
    #: own parameters shared by the batch members, not indexed by :meth:`__getitem__`; every other own parameter is a
    #: hyperparameter of shape ``(*batch_shape, ...)``
    shared_parameters: tuple[str, ...] = ()

    def __getitem__(self, index) -> Kernel:
        """The kernel of the batch members ``index`` (GPyTorch's ``kernel[i]``): ``kernel[i](x)`` is ``kernel(x)[i]``.

        GPyTorch's ``Kernel.__getitem__`` indexes every own parameter and buffer and sets the batch shape from the last
        of them; rfgp kernels keep state that all batch members share (the draws of a spectral product, Nyström
        landmarks, ``active_dims``), which that indexing cut to the first rows (silently other landmarks) or raised on,
        and the sums and products of feature kernels kept their parts unindexed (the whole batch, without a word).
        Here the hyperparameters (and :attr:`batched_buffers`) are indexed, the shared state is kept, the batch shape
        is that of the index, and the child kernels (also those in a ``ModuleList``) are indexed in turn.
        """
        if len(self.batch_shape) == 0:
            return self
        index = index if isinstance(index, tuple) else (index,)
        new = copy.deepcopy(self)
        if len(self._batch_shape):
            own = [name for name, _ in self.named_parameters(recurse=False) if name not in self.shared_parameters]
            own += [name for name, _ in self.named_buffers(recurse=False) if name in self.batched_buffers]
            for name in own:
                tensor = getattr(new, name)
                tensor.data = tensor.data[index]
            new.batch_shape = torch.empty(self._batch_shape)[index].shape
        for name, child in self.named_children():  # an unbatched child answers itself: its copy in new stays
            if isinstance(child, Kernel):
                indexed = child[index]
                if indexed is not child:
                    setattr(new, name, indexed)
            elif isinstance(child, nn.ModuleList):
                for i, part in enumerate(child):
                    indexed = part[index] if isinstance(part, Kernel) else part
                    if indexed is not part:
                        getattr(new, name)[i] = indexed
        return new

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        """(k(x, x), E[k̂(x, x)]) per point, or ``None`` when the two agree exactly."""
        raise NotImplementedError

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """‖Φ(x)‖² per point, shape ``(*batch, n)``, from a closed form that does not featurise x, or ``None``
        (the default) where only the features give it.

        An SVGP step evaluates K(Z, x) and, by a separate call with ``diag=True``, k̂(x, x): with a closed form
        the diagonal costs O(n) instead of a second featurisation of x.  It must equal (Φ(x)·Φ(x)).sum(-1) as a
        function of the hyperparameters, gradients included, and validate what the featurisation would.
        """
        return None

    def folds_amplitude(self) -> bool:
        """Whether :meth:`amplitude_features` folds an amplitude into the features' own evaluation: where the kernel
        implements :meth:`folded_features` and keeps this class's :meth:`featurize`.  A subclass that overrides
        :meth:`featurize` (derivative rows, a user's change to Φ) does not fold — its Φ is never bypassed by the
        :meth:`folded_features` it inherits — and a ``ScaleKernel``'s √outputscale multiplies its Φ afterwards."""
        return type(self).featurize is FeatureKernel.featurize

    def amplitude_features(self, x: Tensor, log_amplitude: Tensor) -> Tensor:
        """√A·Φ(x) for log A of shape ``(*batch)`` (a ``ScaleKernel``'s log outputscale): :meth:`folded_features`,
        for kernels whose :meth:`folds_amplitude` is ``True`` (others raise)."""
        if not self.folds_amplitude():
            raise NotImplementedError(f"{type(self).__name__} does not fold an amplitude into its features (its "
                                      "featurize is its own, not folded_features(x)): multiply featurize(x) by √A")
        return self.folded_features(x, log_amplitude)

    def amplitude_function(self) -> Callable[[Tensor, Tensor], Tensor] | None:
        """:meth:`amplitude_features` where :meth:`folds_amplitude`, else ``None``: the ``amplitude_function`` of
        :func:`~rfgp.inference.chunking.scaled_features` (the chunked operators' :meth:`featurizer` and
        :func:`~rfgp.kernels.kernel_features` scale Φ by √outputscale through it)."""
        return self.amplitude_features if self.folds_amplitude() else None

    def keeps_features_of(self, cls: type[FeatureKernel]) -> bool:
        """Whether this kernel's Φ is ``cls``'s: neither :meth:`featurize` nor :meth:`folded_features` overridden
        below ``cls`` (so that a closed form of ``cls``'s features, e.g. its ‖Φ(x)‖², holds for it)."""
        return type(self).featurize is cls.featurize and type(self).folded_features is cls.folded_features

    def prepare(self, x: Tensor) -> None:
        """Fit what the kernel fits on its first input (the optimized Maclaurin allocation, draws of an unset
        ``input_dim``) from all of ``x``; a no-op for kernels that fit nothing or have fitted already."""

    def state_fixed_at_first_evaluation(self) -> str | None:
        """What this kernel (not its parts) would fix at its next evaluation's hyperparameters, ``None`` for nothing
        (:mod:`rfgp.kernels.first_evaluation`)."""
        return None

    def local_load_samples(self, samples_dict, memo, prefix) -> None:
        """GPyTorch's ``pyro_load_from_samples`` step for this kernel: load its samples, and mark it so that an
        evaluation that would fix first-evaluation state at them raises (:mod:`rfgp.kernels.first_evaluation`)."""
        super().local_load_samples(samples_dict, memo, prefix)
        mark_loaded_samples(self)

    def variance_correction(self, x: Tensor) -> Tensor | None:
        """k(x, x) − E[k̂(x, x)] ≥ 0 per point, or ``None`` when the features are unbiased on the diagonal."""
        moments = self.diag_moments(x)
        return None if moments is None else (moments[0] - moments[1]).clamp_min(0.0)

    @in_full_precision
    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params):
        if last_dim_is_batch:
            refuse_last_dim_is_batch(self)
        refuse_unfixed_state(self)
        refuse_functorch_transforms()  # before same_inputs, whose storage test a functorch tensor fails obscurely
        same = same_inputs(x1, x2)
        # A cross-covariance of one output per input is a lazy operator that checks the rows it featurises (a
        # posterior never reads its test–train covariance, whose N training rows GPyTorch slices from the joint
        # inputs anew at every call: checking them here cost more than the prediction at b = 256 t-batches).
        lazy_cross = not (same or diag) and self.num_outputs_per_input(x1, x2) == 1
        dtype = self.check_inputs(x1, x2, finite=not lazy_cross)
        batch_shape = None
        if same or diag:
            x1, x2, batch_shape = self.without_copies(x1, x2, same)
        if dtype is not None:
            x1, x2 = self.promote_inputs(x1, x2, dtype)
        try:
            output = self._feature_forward(x1, x2, diag, same)
        except NonFiniteError as error:
            if lazy_cross:  # building the operator (the featurizer's probe row) met inputs its blocks check by name
                self.check_inputs(x1, x2)
            raise self._nonfinite_error(error) from None
        return output if batch_shape is None else expand_batch(output, batch_shape)

    def without_copies(self, x1: Tensor, x2: Tensor, same: bool) -> tuple[Tensor, Tensor, torch.Size | None]:
        """x1 and x2 without the batch members that copy their first (:mod:`rfgp.core.batch_copies`), and the batch
        shape of the inputs as given, to expand the output to (``None`` when there are no copies).

        GPyTorch's likelihood sampling evaluates K(x, x) on ``num_likelihood_samples`` copies of x: the features and
        the dense Gram are then computed once instead of once per copy.  A data-dependent map is fitted
        (:meth:`prepare`) on the inputs as given, as without copies.
        """
        dims1 = copied_batch_dims(x1, self.batch_shape)
        dims2 = dims1 if same else copied_batch_dims(x2, self.batch_shape)
        if not (dims1 or dims2):
            return x1, x2, None
        with torch.no_grad():
            self.prepare(x1)
        compact1 = narrow_copies(x1, dims1)
        return compact1, compact1 if same else narrow_copies(x2, dims2), torch.broadcast_shapes(x1.shape[:-2],
                                                                                               x2.shape[:-2])

    def check_inputs(self, x1: Tensor, x2: Tensor, finite: bool = True) -> torch.dtype | None:
        """Checks of an evaluation: dtypes, input dimension and, if ``finite``, finite values (one reduction per
        distinct input; ``finite=False`` for lazy cross-covariances, which check each block of rows they featurise).

        Returns the dtype the evaluation computes in (:func:`~rfgp.core.validation.check_kernel_inputs`), or
        ``None`` for kernels whose inputs are not points and stay as they are (task indices).
        """
        dtype = check_kernel_inputs(x1, x2, module_dtype(self))
        input_dim = getattr(self, "input_dim", None)  # the dimension the draws were made for, if fixed
        if input_dim is not None and x1.shape[-1] != input_dim:
            raise ValueError(
                f"x1 has {x1.shape[-1]} input dimensions (last axis, after active_dims) but this kernel was built "
                f"for input_dim={input_dim}"
            )
        if finite:
            check_finite(x1, "x1")
            if not same_memory(x1, x2):
                check_finite(x2, "x2")
        return dtype

    def promote_inputs(self, x1: Tensor, x2: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        """x1 and x2 in the call's dtype (new tensors where promoted: the caller's are never modified).

        Kernels defined on the unit sphere (:meth:`unit_rows_hint`) check a promoted input's unit norm to the
        precision of the dtype it came in, then project it back onto the sphere in ``dtype``.
        """
        hint = self.unit_rows_hint()
        if hint is None:
            return promote_pair(x1, x2, dtype)
        same = x2 is x1
        x1 = promote_unit_rows(x1, "x1", dtype, hint)
        return x1, x1 if same else promote_unit_rows(x2, "x2", dtype, hint)

    def unit_rows_hint(self) -> str | None:
        """For kernels that need unit-norm inputs, what the error says to do about others; ``None`` otherwise."""
        return None

    def _feature_forward(self, x1: Tensor, x2: Tensor, diag: bool, same: bool):
        if diag and same and self.num_outputs_per_input(x1, x2) == 1:
            norms = self.feature_squared_norm(x1)
            if norms is not None:
                return norms
        outputs = self.num_outputs_per_input(x1, x2)
        # unchunked, a covariance of one output per input or a diagonal featurises every row of x1 (and x2) below,
        # which makes the probe row's checks: the probe's shape may be reused
        reuse = (same or diag) and outputs == 1
        featurizer = self.featurizer(x1, reuse_shape=reuse)
        num_rows = max(x1.shape[-2], x2.shape[-2])
        batch = math.prod(featurizer.batch_shape)
        if same and not diag:
            check_solve(num_rows, featurizer.num_features, batch, x1.dtype, x1.device)
        if outputs != 1:
            lazy = self._multi_output_prediction_forward(x1, x2, same, diag, featurizer, num_rows, outputs, batch)
            if lazy is not None:
                return lazy
        chunk_size = resolve_chunk_size(num_rows, featurizer.num_features, batch, x1.dtype)
        if chunk_size is not None:
            if reuse:  # a chunked covariance featurises its chunks lazily: the probe row's checks now, as before
                featurizer = self.featurizer(x1)
            return self._chunked_forward(x1, x2, same, diag, featurizer, chunk_size)
        if not (same or diag) and outputs == 1:
            # Prediction asks for the test–train covariance Φ(x*)Φ(x)ᵀ, which the feature-space
            # strategy never evaluates: stay lazy instead of featurising the N training points — also
            # under autograd (BoTorch's acquisition optimisation: GPyTorch evaluates it for every t-batch,
            # with the training points expanded to the batch), the lazy operator being differentiable.
            return ChunkedFeatureCrossLinearOperator.from_featurizer(x1, x2, featurizer, num_rows,
                                                                     unchecked=("x1", "x2"))
        if same and not diag:
            return self.training_covariance(x1)
        z1 = self.featurize(x1)
        z2 = z1 if same else self.featurize(x2)
        if diag:
            return (z1 * z2).sum(-1)
        return MatmulLinearOperator(z1, z2.mT)

    def training_covariance(self, x: Tensor) -> FeatureRootLinearOperator:
        """K(x, x) with materialised features: Φ(x)Φ(x)ᵀ (:meth:`feature_root`) plus the :meth:`variance_correction`
        diagonal; kernels whose covariance has structure that callers take apart (a multitask covariance's Kronecker
        factors) return a subclass that carries it."""
        return FeatureRootLinearOperator(self.feature_root(x), self.variance_correction(x))

    def feature_root(self, x: Tensor) -> Tensor | LinearOperator:
        """Φ(x) as the root of the training covariance ΦΦᵀ: :meth:`featurize`, or an operator that also carries
        structure for the feature statistics (Nyström's K·L⁻ᵀ)."""
        return self.featurize(x)

    def featurizer(self, x: Tensor, reuse_shape: bool = False) -> Featurizer:
        """:meth:`featurize` as a :class:`~rfgp.inference.chunking.Featurizer` (for chunked evaluation), probed on x's
        first row — after :meth:`prepare` on all of x, so that no data-dependent map is fitted to the probe — for its
        width and batch shape.

        ``reuse_shape``: for callers that featurise every row of x next (whose evaluation makes the probe's checks),
        the width and batch shape of an earlier probe are reused if x's batch shape and dimension and the kernel's
        settings and tensor shapes (:func:`~rfgp.core.state_cache.module_configuration`) are those it was made at: a
        probe costs as much as the features of hundreds of rows for maps with a Python loop over their parts
        (a Maclaurin map's degrees: half of a marginal-likelihood step at N = 10).
        """
        shapes = self.__dict__.setdefault("_probe_shapes", {})
        with torch.no_grad():
            self.prepare(x)
            key = shape = None
            if reuse_shape:  # the key walks the module tree: only where it is read
                key = (x.shape[:-2], x.shape[-1], module_configuration(self),
                       tuple((t.shape, t.dtype) for t in module_tensors(self)))
                shape = shapes.get(key)
            if shape is None:
                probe = self.featurize(x[..., :1, :])
                shape = probe.shape[-1], probe.shape[:-2]
                if key is not None:
                    if len(shapes) >= 16:  # t-batch shapes of an acquisition optimisation, train and eval: a few keys
                        shapes.clear()
                    shapes[key] = shape
        params = [p for p in self.parameters() if p.requires_grad]
        return Featurizer(self.featurize, params, shape[0], shape[1], amplitude_function=self.amplitude_function())

    def _nonfinite_error(self, error: NonFiniteError) -> NonFiniteError:
        """x1 and x2 are finite, the scaled inputs (or feature weights) are not: name the hyperparameter (error path
        only)."""
        bad = describe_bad_hyperparameters(self)
        if bad:
            return NonFiniteHyperparameterError(
                f"the kernel's hyperparameters {', '.join(bad)} are NaN, Inf or not positive, so the scaled inputs, "
                "feature weights or exact feature roots its features are built from are not finite (x1 and x2 are "
                "finite); reset them to finite values inside their constraints, e.g. kernel.lengthscale = 1.0"
            )
        return error

    def _set_lengthscale(self, value) -> None:
        check_hyperparameter(value, "lengthscale", self.raw_lengthscale_constraint)
        super()._set_lengthscale(parameter_value(value, self.raw_lengthscale))

    def _chunked_forward(self, x1: Tensor, x2: Tensor, same: bool, diag: bool, featurizer: Featurizer,
                         chunk_size: int):
        if diag:
            rows = chunk_slices(x1.shape[-2], chunk_size)
            if same:  # ‖Φ(x)‖² from one featurisation of each chunk
                return torch.cat([squared_row_norms(featurizer(x1[..., r, :])) for r in rows], -1)
            return torch.cat([(featurizer(x1[..., r, :]) * featurizer(x2[..., r, :])).sum(-1) for r in rows], -1)
        if same:
            return ChunkedFeatureRootLinearOperator.from_featurizer(
                x1, featurizer, chunk_size, self.variance_correction(x1)
            )
        return ChunkedFeatureCrossLinearOperator.from_featurizer(x1, x2, featurizer, chunk_size, unchecked=("x1", "x2"))

    def _multi_output_prediction_forward(self, x1: Tensor, x2: Tensor, same: bool, diag: bool,
                                         featurizer: Featurizer, num_rows: int, outputs: int, batch: int):
        """The lazy operator of a multi-output root's covariance, ``None`` to materialise it.

        Prediction (eval mode, or no gradient recorded) never materialises the test–train covariance (the
        feature-space strategy does not read it).  A covariance R(x)R(x)ᵀ whose n·p × F root exceeds
        :class:`~rfgp.settings.memory_budget` — a training covariance (marginal likelihood and gradients, posterior
        caches) or a test–test one — is evaluated block by block (:mod:`rfgp.inference.multioutput_chunking`); a
        diagonal, or a cross-covariance with a gradient recorded, over the budget raises.
        """
        chunk_points = points_per_block(num_rows, outputs, featurizer.num_features, batch, x1.dtype)
        predicting = not (self.training and torch.is_grad_enabled())
        if chunk_points is None:
            if diag or same or not predicting:
                return None
        elif diag or not (same or predicting):
            check_unchunked_memory(self, num_rows, outputs, featurizer.num_features, batch, x1.dtype,
                                   "multi-output feature kernels evaluate block by block only a covariance R(x)R(x)ᵀ "
                                   "or, for prediction (eval mode, or under torch.no_grad()), R(x₁)R(x₂)ᵀ, not a "
                                   "diagonal or a cross-covariance with a gradient recorded")
        correction = self.variance_correction(x1) if same else None  # its posterior adds it (a test covariance)
        return ChunkedMultiOutputFeatureOperator.from_featurizer(x1, x1 if same else x2, featurizer,
                                                                 chunk_points or num_rows, outputs, correction)

    def prediction_strategy(self, train_inputs, train_prior_dist, train_labels, likelihood):
        return FeatureSpacePredictionStrategy(train_inputs, train_prior_dist, train_labels, likelihood)

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        return 1


class RandomFeatureKernel(FeatureKernel):
    r"""Kernel k̂(x, y) = Φ(x/ℓ)ᵀΦ(y/ℓ) for a random feature map Φ.

    Args:
        feature_map: the :class:`~rfgp.features.FeatureMap` (its draws are fixed buffers).
        kwargs: GPyTorch ``Kernel`` arguments (``ard_num_dims``, ``batch_shape``,
            ``active_dims``, ``lengthscale_prior``, ``lengthscale_constraint``); any other raises a
            ``TypeError`` (GPyTorch's ``Kernel`` would silently drop it).

    Example:
        >>> import torch
        >>> from rfgp.kernels import RandomFeatureKernel
        >>> from rfgp.features import RandomFourierFeatures
        >>> kernel = RandomFeatureKernel(RandomFourierFeatures(512, input_dim=2, seed=0))
        >>> kernel(torch.randn(10, 2)).shape
        torch.Size([10, 10])
    """

    has_lengthscale = True

    def __init__(self, feature_map: FeatureMap, **kwargs) -> None:
        if not isinstance(feature_map, FeatureMap):
            raise TypeError(f"feature_map must be a rfgp.features.FeatureMap, got {type(feature_map).__name__}")
        check_kernel_kwargs(type(self).__name__, kwargs)
        ard = kwargs.get("ard_num_dims")
        if ard is not None and feature_map.input_dim is not None and ard != feature_map.input_dim:
            raise ValueError(
                f"ard_num_dims={ard} does not match the feature map's input_dim={feature_map.input_dim}"
            )
        super().__init__(**kwargs)
        self.feature_map = feature_map

    @property
    def num_features(self) -> int:
        return self.feature_map.num_features

    @property
    def input_dim(self) -> int | None:
        """The input dimension of the feature map's draws (``None`` until the first call if not given)."""
        return self.feature_map.input_dim

    def scale_inputs(self, x: Tensor) -> Tensor:
        """What the feature map sees: x/ℓ (subclasses with other hyperparameters override this)."""
        return x.div(self.lengthscale) if self.has_lengthscale else x

    def folded_features(self, x: Tensor, log_amplitude: Tensor | None = None) -> Tensor:
        """Φ(x/ℓ) of shape ``(*batch_shape, n, F)`` (``active_dims`` already applied by the caller), and for a sin/cos
        map √A·Φ(x/ℓ) (:meth:`sincos_amplitude_features`)."""
        if log_amplitude is None:
            return self.feature_map(self.scale_inputs(x))
        return self.sincos_amplitude_features(self.scale_inputs(x), log_amplitude)

    def folds_amplitude(self) -> bool:
        """Only for a sin/cos map (:class:`~rfgp.features.RandomFourierFeatures`: RFF, ORF, SORF); other maps keep
        the multiplication."""
        return isinstance(self.feature_map, RandomFourierFeatures) and super().folds_amplitude()

    def sincos_amplitude_features(self, scaled: Tensor, log_amplitude: Tensor,
                                  log_weights: Tensor | None = None) -> Tensor:
        """√(A/m)·[√w cos(W u), √w sin(W u)] of the sin/cos map for scaled inputs u, log A ``(*batch)`` and optional
        per-frequency log-weights log w ``(*batch, m)``: one
        :func:`~rfgp.features.weighted_fourier.projection_features` call, after the map's checks of u (and its
        draws); other maps raise."""
        if not isinstance(self.feature_map, RandomFourierFeatures):
            raise NotImplementedError(f"{type(self).__name__}'s {type(self.feature_map).__name__} map does not fold an "
                                      "amplitude into its features (only sin/cos maps do): multiply featurize(x) by √A")
        self.feature_map.prepare(scaled)
        return projection_features(self.feature_map.project(scaled), log_weights, log_amplitude)

    def prepare(self, x: Tensor) -> None:
        if not self.feature_map.is_initialized:
            with torch.no_grad():
                self.feature_map.prepare(self.scale_inputs(x))

    def feature_squared_norm(self, x: Tensor) -> Tensor | None:
        """The map's closed-form ‖Φ(x/ℓ)‖² (:meth:`~rfgp.features.FeatureMap.squared_norm`), after the map's
        checks of x/ℓ; ``None`` for a map without one, or for a subclass that changes the features (it provides its
        own)."""
        if not self.keeps_features_of(RandomFeatureKernel):
            return None
        return self.map_squared_norm(x)

    def map_squared_norm(self, x: Tensor) -> Tensor | None:
        """The feature map's closed-form ‖Φ(x/ℓ)‖² (``None`` for a map without one), after its checks of x/ℓ (and
        its draws)."""
        if not self.feature_map.has_closed_form_squared_norm:
            return None
        scaled = self.scale_inputs(x)
        self.feature_map.prepare(scaled)
        return self.feature_map.squared_norm(scaled)

    def state_fixed_at_first_evaluation(self) -> str | None:
        if self.feature_map.fits_on_first_input:
            return f"the fit of its {type(self.feature_map).__name__} map to its first inputs"
        return None

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor] | None:
        if not self.feature_map.has_variance_bias:
            return None
        scaled = self.scale_inputs(x)
        return self.feature_map.target_diag(scaled), self.feature_map.expected_diag(scaled)


def same_inputs(x1: Tensor, x2: Tensor) -> bool:
    """Whether x1 and x2 hold the same points, so that k(x1, x2) is the symmetric ΦΦᵀ of one feature root.

    The same tensor, or a view of the same memory (GPyTorch's test–test covariance slices x1 and x2 separately from
    its joint inputs), is answered without reading values; other tensors of one shape are compared entrywise (a
    host synchronisation).

    Where autograd records a derivative with respect to the inputs, x1 and x2 must also be one function of the same
    tensors (:func:`same_derivation`): Φ(x1)Φ(x1)ᵀ for distinct tensors of equal values (independent leaves, or
    ``x.detach()`` and ``x``) sent x2's gradient to x1 (doubled there, none for x2).
    """
    if x1 is x2:
        return True
    if x1.shape != x2.shape:  # first: no autograd graph is inspected for a test–train cross-covariance
        return False
    if torch.is_grad_enabled() and (x1.requires_grad or x2.requires_grad) and not same_derivation(x1, x2):
        return False
    return same_memory(x1, x2) or bool((x1 == x2).all())


def same_derivation(x1: Tensor, x2: Tensor) -> bool:
    """Whether x1 and x2 are made by the same operation from the same tensors with the same arguments, so that a
    gradient reaches those tensors alike through either: views of one tensor (GPyTorch's test–test covariance slices
    x1 and x2 separately from its joint inputs) or, for equal values, the two ``index_select`` copies of
    GPyTorch's ``active_dims`` (its kernels inside an ``AdditiveKernel`` or ``ProductKernel`` select the columns of x1
    and x2 separately).  Leaves, and tensors of which one records no graph, are never the same derivation."""
    if x1.requires_grad != x2.requires_grad:
        return False
    if x1._base is not None and x1._base is x2._base:
        return same_memory(x1, x2)
    node1, node2 = x1.grad_fn, x2.grad_fn
    if node1 is None or node2 is None or type(node1) is not type(node2):
        return False
    if node1.next_functions != node2.next_functions:
        return False
    saved = [name for name in dir(node1) if name.startswith("_saved_")]
    try:
        return all(_same_argument(getattr(node1, name), getattr(node2, name)) for name in saved)
    except RuntimeError:  # saved tensors freed by a backward pass: not known to be the same
        return False


def _same_argument(a, b) -> bool:
    if torch.is_tensor(a) or torch.is_tensor(b):
        return torch.is_tensor(a) and torch.is_tensor(b) and a.shape == b.shape and bool((a == b).all())
    return a == b


def same_memory(x1: Tensor, x2: Tensor) -> bool:
    """Whether x1 and x2 are the same tensor or views of the same memory with one shape, stride and dtype."""
    return x1 is x2 or (x1.shape, x1.stride(), x1.dtype, x1.device, x1.data_ptr()) == (
        x2.shape, x2.stride(), x2.dtype, x2.device, x2.data_ptr())


def check_unchunked_memory(kernel: Kernel, num_points: int, outputs: int, num_features: int, batch: int,
                           dtype: torch.dtype, limitation: str) -> None:
    """Refuse, instead of silently exceeding, a memory budget that would ask to chunk a multi-output root.

    A kernel with several outputs per input (vector fields, derivatives) has a root of ``num_points · outputs``
    rows, evaluated block by block where :mod:`rfgp.inference.multioutput_chunking` can (``limitation`` says where
    it cannot).
    """
    rows = num_points * outputs
    if resolve_chunk_size(rows, num_features, batch, dtype) is not None:
        cause, remedy = chunking_cause()
        raise ValueError(
            f"{type(kernel).__name__}: the feature root of {rows} rows (n = {num_points} points × {outputs} outputs) "
            f"and {num_features} features would be evaluated {cause}, and {limitation}: {remedy}"
            + (", e.g. `with rfgp.settings.memory_budget(8 * 2**30):`" if remedy.startswith("raise") else "")
        )
