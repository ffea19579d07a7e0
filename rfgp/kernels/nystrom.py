r"""Nyström landmark features for any GPyTorch kernel: Φ(x) = K(x, Z)·L⁻ᵀ, L = chol(K(Z, Z) + εI).

With M landmarks Z the Nyström approximation (Williams & Seeger 2001) is

    k̂(x, y) = Φ(x)ᵀΦ(y) = K(x, Z) (K(Z, Z) + εI)⁻¹ K(Z, y),

the projection of k's feature map onto span{φ(z₁), …, φ(z_M)}: exact at the landmarks (up to
the jitter ε), never larger than k on the diagonal, and deterministic given Z.  It is the
covariance of GPyTorch's SGPR / the DTC approximation (Seeger et al. 2003; Quiñonero-Candela
& Rasmussen 2005), here as an explicit width-M feature map, so it runs through rfgp's
feature-space algebra: O(N·M² + M³) marginal likelihood, chunked evaluation, streaming,
multi-output and Dirichlet classification.  The training objective is the DTC marginal
likelihood log N(y | 0, ΦΦᵀ + σ²I) (SGPR's collapsed bound without its trace term).

Predictive variance.  Away from the landmarks K(x, Z) → 0, so Φ(x) → 0 and the DTC
posterior variance would collapse to zero.  :meth:`NystromKernel.diag_moments` returns
(k(x, x), ‖Φ(x)‖²), and rfgp's prediction strategy adds the residual
c(x) = k(x, x) − Φ(x)ᵀΦ(x) ≥ 0 to the posterior variance: the FITC-style diagonal
correction at the test points (Snelson & Ghahramani 2006; Quiñonero-Candela & Rasmussen
2005 §6), which restores the prior variance far from Z.

Jitter.  ε = jitter·mean(diag K(Z, Z)) is relative to the kernel's scale.  It starts at
``jitter`` (default 1e-8 in float64, 1e-6 in float32) and grows ×10 while the Cholesky factor
fails (at most up to 10⁻¹); a growth is reported once per kernel by a ``NumericalWarning``,
and a failure at the largest value raises ``NotPSDError`` naming the kernel (never a silent
NaN).  The check costs one host synchronisation per factorisation; between calls that build no
graph (predictions) L is reused while Z and the base kernel are unchanged, at one host read per
tensor compared (:class:`~rfgp.core.state_cache.StateCache`).  For float32 (and half)
inputs K(Z, Z) and its factor are computed in float64 and L is rounded to the input dtype:
the O(M³) factorisation is small next to the O(N·M²) features, and a float32 Cholesky of
thousands of close landmarks needs a jitter (10⁻⁴ at M = 4096 on the elecdemand data of
``benchmarks/time_to_accuracy.py``) that costs test NLPD: −0.306 with a float32 factor, −0.314
with the float64 one, at the same prediction time (30.8 s against 30.7 s CPU).  Devices without float64 (Apple
MPS) factorise in the input dtype.  The base kernel is evaluated there as if converted by ``.double()``, through a
view of it whose float32 hyperparameters are differentiable casts (:func:`~rfgp.core.module_in_dtype.module_in_dtype`;
the kernel itself is never converted): GPyTorch's ``PolynomialKernel`` does not promote its offset to float64 inputs.

Negligible entries.  Far from every landmark K(x, Z) underflows below the dtype's smallest normal
number, and the solve and ΦᵀΦ create more such numbers, on which CPUs compute 10–100× more slowly
(float32, diamonds with 26 standardised one-hot and numeric columns at the initial lengthscale,
N = 1200, M = 512: 0.83 s per marginal likelihood and gradient against 0.12 s).  Entries of K, L and
Φ below tiny^¼ (K, L) or tiny^½ (Φ) of the kernel's scale — far below the rounding of the entries
they are summed with — are therefore zero
(:func:`~rfgp.inference.triangular_statistics.negligible_threshold`); losses and gradients are
unchanged to the dtype's precision.

The base kernel's hyperparameters stay trainable (it is a submodule), and so are the
landmarks with ``learn_landmarks=True`` (as in SGPR); otherwise they are a buffer.  Every
operation is an ordinary differentiable torch op (Cholesky, triangular solve), so the map is
twice differentiable.  The training covariance hands Φ over together with K(X, Z) and L
(:class:`~rfgp.inference.triangular_statistics.TriangularFeatures`): the marginal likelihood's
feature statistics then take a backward fused through the triangular solve
(:mod:`rfgp.inference.triangular_statistics`: ≈ 4.25·N·M² flops per gradient instead of 7.25; float32 features
solve its K̄ = Φ̄L⁻¹ per row, ≈ 5.25·N·M², for gradients that the landmark factor's conditioning does not spoil).
"""

from __future__ import annotations

import copy
import math

import torch
from gpytorch.kernels import InducingPointKernel, Kernel, ScaleKernel
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.utils.errors import NotPSDError
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from ..core.config_state import DRAW, METHOD, ConfigState
from ..core.module_in_dtype import module_in_dtype
from ..core.settings import resolve_chunk_size
from ..core.state_cache import StateCache, module_configuration, module_tensors
from ..core.user_warnings import warn as warn_user
from ..core.validation import (
    NonFiniteHyperparameterError,
    check_hyperparameter,
    check_points,
    check_positive_float,
    check_positive_int,
    check_seed,
    describe_bad_hyperparameters,
)
from ..features.base import _new_seed
from ..features.landmarks import LANDMARK_METHODS, distinct_rows, select_landmarks
from ..inference.chunking import chunk_slices
from ..inference.linalg import squared_row_norms
from ..inference.operators import FeatureRootLinearOperator
from ..inference.triangular_statistics import (
    TriangularFeatures,
    TriangularFeaturizer,
    factor_dtype,
    flush_negligible,
    kernel_scale,
    negligible_threshold,
    triangular_features,
)
from .families import check_kernel_kwargs
from .hyperparameters import parameter_value
from .random_feature_kernel import FeatureKernel

#: first relative jitter per dtype; ×10 per failed Cholesky up to _MAX_JITTER
_DEFAULT_JITTER = {torch.float64: 1e-8, torch.float32: 1e-6}
_MAX_JITTER = 1e-1
#: relative error of float32 Nyström features from float64's above which a prediction warns
#: (:meth:`NystromKernel._check_feature_precision`)
FEATURE_PRECISION_TOLERANCE = 1e-2
#: a float32 evaluation of K(x, Z) whose amplified error exceeds this many times that of rounding the float64 one, and
#: the floor below, is replaced by the float64 one (:meth:`NystromKernel._choose_cross_precision`)
CROSS_EVALUATION_EXCESS = 10.0
CROSS_EVALUATION_FLOOR = 1e-3
#: landmarks whose features decide it (evenly spaced): 2·M²·64 flops of triangular solves, not 2·M³
CROSS_EVALUATION_SAMPLE = 64


class NystromKernel(FeatureKernel):
    r"""Nyström features of any GPyTorch kernel at M landmarks: k̂(x, y) = K(x, Z)(K(Z, Z) + εI)⁻¹K(Z, y).

    Args:
        base_kernel: any GPyTorch kernel (tree), e.g. ``ScaleKernel(MaternKernel(nu=2.5))``;
            used as it is (not copied), its hyperparameters stay trainable.  It must give one
            output per input (for multi-output models wrap the Nyström data kernel in
            :class:`~rfgp.kernels.SketchedDecomposableKernel`).
        landmarks: Z, ``(M, d)`` points of the input space (the base kernel applies its
            ``active_dims`` to them as to the data); see :mod:`rfgp.features.landmarks`.
        learn_landmarks: make Z an ``nn.Parameter`` (trained with the hyperparameters); under a batch shape of the
            base kernel, one ``(*batch_shape, M, d)`` parameter, each member's Z starting at ``landmarks``.
        jitter: first relative jitter (default 1e-8 for float64, 1e-6 for float32), see the
            module docstring.
        landmark_method, selection_seed, regularization, pilot_size: how ``landmarks`` were
            chosen among data points (set by :func:`nystrom_sketch`); with them
            :meth:`reselect_landmarks` — hence :func:`rfgp.set_num_features` — can choose M' new
            landmarks by the same rule.  ``None`` for landmarks given by hand.

    ``num_features`` is M.  Batch shapes of the base kernel give batched features
    ``(*batch_shape, n, M)`` over shared landmarks, or with ``learn_landmarks=True`` over each member's own: the batch
    members are independent GPs (a BoTorch multi-output ``SingleTaskGP``, GPyTorch's batch-independent models), each
    trained as if alone — by ``rfgp.fit_mll(model, optimizer="member_lbfgs")`` or BoTorch's ``fit_gpytorch_mll``,
    which fits them independently and refused landmarks the members shared.  The ``state_dict`` of the exact tree (a
    trained ``ScaleKernel(RBFKernel())``, say: keys at this level, no ``landmarks``) loads into ``base_kernel``
    and keeps the landmarks, so ``load_state_dict(exact.state_dict(), strict=False)`` leaves no key over.

    Example:
        >>> import torch, rfgp
        >>> from rfgp.kernels import NystromKernel
        >>> from gpytorch.kernels import PeriodicKernel, ScaleKernel
        >>> train_x = torch.rand(200, 1, generator=torch.Generator().manual_seed(0))
        >>> base = ScaleKernel(PeriodicKernel())
        >>> kernel = NystromKernel(base, landmarks=train_x[:64])
        >>> kernel(train_x).shape          # a rank-64 feature-root operator
        torch.Size([200, 200])
        >>> # or, choosing the landmarks and deep-copying the tree: ScaleKernel(NystromKernel(PeriodicKernel()))
        >>> kernel = rfgp.sketch(base, num_features=64, method="nystrom", x_sample=train_x, landmarks="rls", seed=0)
    """

    config_fields = {"learn_landmarks": METHOD, "jitter": METHOD, "base_kernel_tree": METHOD, "num_features": DRAW,
                     "landmark_method": DRAW, "selection_seed": DRAW, "regularization": DRAW, "pilot_size": DRAW}
    optional_config_fields = frozenset({"base_kernel_tree", "num_features", "landmark_method", "selection_seed",
                                        "regularization", "pilot_size"})
    @property
    def shared_parameters(self) -> tuple[str, ...]:
        """Fixed landmarks (a buffer) are shared by the batch members; learned ones are one Z per member, which
        ``kernel[i]`` indexes with the base kernel."""
        return ("landmarks",) if self.landmarks.dim() == 2 else ()

    def __init__(self, base_kernel: Kernel, landmarks: Tensor, learn_landmarks: bool = False,
                 jitter: float | None = None, landmark_method: str | None = None, selection_seed: int | None = None,
                 regularization: float | None = None, pilot_size: int | None = None, **kwargs) -> None:
        if not isinstance(base_kernel, Kernel):
            raise TypeError(f"base_kernel must be a gpytorch Kernel, got {type(base_kernel).__name__}")
        landmarks = _check_distinct_landmarks(check_points(landmarks, "landmarks"))
        _refuse_inducing_point_kernel(base_kernel, "base_kernel")
        if not isinstance(learn_landmarks, bool):  # bool("no") is True: a string would train the landmarks
            raise TypeError(f"learn_landmarks must be True or False, got {learn_landmarks!r}")
        _check_scalar(base_kernel, landmarks, "base_kernel")
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(batch_shape=base_kernel.batch_shape, **kwargs)
        self.base_kernel = base_kernel
        landmarks = landmarks.detach().clone()
        self.learn_landmarks = learn_landmarks
        if learn_landmarks:  # each batch member its own Z (independent members)
            self.landmarks = nn.Parameter(landmarks.expand(*self.batch_shape, *landmarks.shape).clone())
        else:
            self.register_buffer("landmarks", landmarks)
        self.jitter = None if jitter is None else check_positive_float(jitter, "jitter")
        if landmark_method is not None and landmark_method not in LANDMARK_METHODS:
            raise ValueError(f"landmark_method must be None or one of {LANDMARK_METHODS}, got {landmark_method!r}")
        self.landmark_method = landmark_method
        # checked here, not only when set_num_features re-selects with them
        self.selection_seed = check_seed(selection_seed, "selection_seed")
        self.regularization = None if regularization is None else check_positive_float(regularization, "regularization")
        self.pilot_size = None if pilot_size is None else check_positive_int(pilot_size, "pilot_size")
        self._warned_jitter = False
        self._warned_precision = False
        self._cross_in_work_precision = False  # set with each landmark factor, computed or reused (landmark_cholesky)
        self._cholesky_cache = StateCache()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        # The state of the exact tree this kernel approximates (a trained ScaleKernel(RBFKernel()), say) has no
        # landmarks and holds the tree's keys at this level: load them into base_kernel, keep the landmarks.
        saved = state_dict.get(prefix + "landmarks")
        if torch.is_tensor(saved) and saved.dim() >= 1 and saved.shape[-1] != self.landmarks.shape[-1]:
            # before the saved width is adopted: that re-created Z uninitialised at this module's d, and torch's
            # "size mismatch" then named that shape as this module's, leaving garbage landmarks behind
            raise ValueError(
                f"cannot load state: {prefix}landmarks has shape {tuple(saved.shape)} in the state dict, points of "
                f"{saved.shape[-1]} input columns, but this module's landmarks {tuple(self.landmarks.shape)} have "
                f"{self.landmarks.shape[-1]}: the state was saved from a kernel on other inputs"
            )
        if torch.is_tensor(saved) and saved.dim() == 2 and self.landmarks.dim() > 2:
            # saved when learned landmarks were shared by the batch members: the same Z for each, the same model
            state_dict[prefix + "landmarks"] = saved.expand(*self.landmarks.shape[:-2], *saved.shape)
        if prefix + "landmarks" not in state_dict:
            inner = prefix + "base_kernel."
            tree_keys = set(self.base_kernel.state_dict())
            for key in [key for key in state_dict if key.startswith(prefix) and key[len(prefix):] in tree_keys]:
                if inner + key[len(prefix):] not in state_dict:
                    state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    def _config_value(self, name: str):
        if name == "base_kernel_tree":
            return kernel_tree(self.base_kernel)
        return super()._config_value(name)

    @property
    def num_features(self) -> int:
        return self.landmarks.shape[-2]

    @num_features.setter
    def num_features(self, value: int) -> None:
        """Adopted from a state dict: re-create Z with the saved number of rows (the values follow)."""
        if value != self.num_features:
            empty = self.landmarks.new_empty(*self.landmarks.shape[:-2], value, self.landmarks.shape[-1])
            if self.learn_landmarks:
                self.landmarks = nn.Parameter(empty)
            else:
                self.landmarks = empty

    @property
    def lengthscale(self) -> Tensor | None:
        """The lengthscale of the base kernel (the top of its tree; ``None`` where it has none, as GPyTorch's kernels
        answer), read and set here as on the exact tree: ``covar_module.base_kernel.lengthscale`` of
        ``rfgp.sketch(ScaleKernel(RBFKernel()), M, method="nystrom", ...)`` = ScaleKernel(NystromKernel(RBFKernel())).
        Setting it changes K(x, Z) and K(Z, Z) at the next evaluation.

        The parameter stays the base kernel's own: this kernel's ``has_lengthscale`` is ``False`` and it has no
        ``raw_lengthscale``, so code that walks a model's modules for lengthscale owners (to register priors,
        constraints or bounds) finds it once, on the base kernel."""
        return self.base_kernel.lengthscale if self.base_kernel.has_lengthscale else None

    @lengthscale.setter
    def lengthscale(self, value) -> None:
        self._set_lengthscale(value)

    def _set_lengthscale(self, value) -> None:
        if not self.base_kernel.has_lengthscale:  # GPyTorch's error type for a kernel without one
            raise RuntimeError(
                f"NystromKernel has no lengthscale: its base kernel {type(self.base_kernel).__name__} has none (a "
                "Nyström kernel exposes the lengthscale of the top of its base tree); set it on the kernel inside, "
                "e.g. kernel.base_kernel.base_kernel.lengthscale for a base ScaleKernel(RBFKernel())"
            )
        check_hyperparameter(value, "lengthscale", self.base_kernel.raw_lengthscale_constraint)
        # a Python float in the kernel's dtype (GPyTorch's setter makes it float32 first)
        self.base_kernel.lengthscale = parameter_value(value, self.base_kernel.raw_lengthscale)

    def initialize(self, **kwargs) -> NystromKernel:
        """GPyTorch's ``initialize``, also by the names of the exact tree this kernel approximates, as
        ``load_state_dict`` takes that tree's keys: a dotted name whose first part is a module of the base kernel and
        not of this one (``kernels.0.outputscale`` of ``rfgp.sketch(ScaleKernel(RBFKernel()) + ..., M,
        method="nystrom", ...)``, a ``NystromKernel`` around the sum) initialises the base kernel.  Before, code
        written for the exact tree raised ``AttributeError`` ("NystromKernel has no module kernels")."""
        base_modules = self.base_kernel._modules

        def in_base(name: str) -> bool:
            head = name.split(".", 1)[0]
            return "." in name and head not in self._modules and head in base_modules

        inner = {name: value for name, value in kwargs.items() if in_base(name)}
        if inner:
            self.base_kernel.initialize(**inner)
        return super().initialize(**{name: value for name, value in kwargs.items() if name not in inner})

    def _base_accessor(self, name: str) -> bool:
        """Whether ``name`` is a settable property of the base kernel's class that this kernel lacks: a hyperparameter
        accessor such as ``PeriodicKernel.period_length``, ``RQKernel.alpha``, ``SpectralMixtureKernel.mixture_*``,
        ``PolynomialKernel.offset`` or a custom kernel's (GPyTorch's "Implementing a custom kernel" ``length``)."""
        base = self.__dict__.get("_modules", {}).get("base_kernel")
        accessor = getattr(type(base), name, None)
        return (base is not None and isinstance(accessor, property) and accessor.fset is not None
                and not hasattr(type(self), name))

    def __getattr__(self, name: str):
        """Reads of the base kernel's hyperparameter accessors (:meth:`_base_accessor`), as on the exact tree:
        ``covar_module.base_kernel.period_length`` of ``ScaleKernel(NystromKernel(PeriodicKernel()))``.  Its raw
        parameters and other attributes are not forwarded (their owner stays the base kernel, as the lengthscale's):
        reading one (``covar_module.base_kernel.raw_lengthscale``, as GPyTorch's hyperparameter tutorial does) raises
        an ``AttributeError`` that names its path, ``NystromKernel.base_kernel.raw_lengthscale``."""
        try:
            return super().__getattr__(name)
        except AttributeError:
            if self._base_accessor(name):
                return getattr(self.base_kernel, name)
            base = self.__dict__.get("_modules", {}).get("base_kernel")
            if base is not None and hasattr(base, name):
                raise AttributeError(
                    f"NystromKernel has no attribute {name!r}: it belongs to the kernel it approximates, "
                    f"NystromKernel.base_kernel.{name} (covar_module.base_kernel.base_kernel.{name} of "
                    "rfgp.sketch(ScaleKernel(k), M, method='nystrom')); the Nyström kernel forwards the base "
                    "kernel's hyperparameter properties (lengthscale, period_length, ...), not its raw parameters"
                ) from None
            raise

    def __setattr__(self, name: str, value) -> None:
        """Writes of the base kernel's hyperparameter accessors go to the base kernel, as ``lengthscale`` does: before,
        ``covar_module.base_kernel.period_length = 0.5`` (code written for the exact tree) set a plain attribute of
        this kernel and left the covariance unchanged, without a word."""
        if name not in self.__dict__ and self._base_accessor(name):
            setattr(self.base_kernel, name, value)
        else:
            super().__setattr__(name, value)

    @torch.inference_mode(False)  # new landmarks chosen under inference mode stay usable by training
    def reselect_landmarks(self, num_landmarks: int, x_sample: Tensor | None,
                           outputscale: Tensor | None = None) -> None:
        """Choose ``num_landmarks`` new landmarks among ``x_sample`` by the rule and seed of the first choice.

        The hyperparameters (the base kernel's) are kept; with the same seed, uniform selection
        at a larger M extends the previous landmarks' draw order.  ``x_sample`` holds points in the columns the
        landmarks have, after this kernel's own ``active_dims`` (:func:`rfgp.set_num_features` passes them so).
        ``outputscale``: that of the ``ScaleKernel``
        around this kernel (:func:`nystrom_sketch` of ``ScaleKernel(k)``), which ``"rls"`` selection scores the
        kernel with, as at the first choice (a ``regularization`` given then is on that scale).

        Raises:
            TypeError: the landmarks were given by hand (no selection rule to repeat).
            ValueError: trained landmarks (``learn_landmarks=True``: a re-selection would discard
                their positions), or ``x_sample`` is missing or has fewer than ``num_landmarks`` rows.
        """
        if self.landmark_method is None:
            raise TypeError(
                "this NystromKernel was built from landmarks given by hand, so there is no selection rule to repeat at "
                "a new width: build it with rfgp.sketch(kernel, M, method='nystrom', x_sample=X) or pass new landmarks"
            )
        if self.learn_landmarks:
            raise ValueError(
                "cannot re-select landmarks that are trained parameters (learn_landmarks=True, trained or not): new "
                "landmarks would discard their learned positions and the optimiser's hold on them; keep this width, "
                "or build the kernel at the new width, rfgp.sketch(kernel, M, method='nystrom', x_sample=X, "
                "learn_landmarks=True), before training"
            )
        if x_sample is None:
            raise ValueError(
                "re-selecting Nyström landmarks needs the data they are chosen among: pass x_sample= (e.g. the "
                "training inputs), or call set_num_features on the ExactGP model"
            )
        x_sample = check_points(x_sample, "x_sample")
        if x_sample.shape[-1] != self.landmarks.shape[-1]:  # before: such landmarks, refused at the next evaluation
            raise ValueError(
                f"x_sample has {x_sample.shape[-1]} columns but the landmarks have {self.landmarks.shape[-1]}: pass "
                "the points in the columns this kernel sees (after its active_dims)"
            )
        options = {name: value for name, value in (("regularization", self.regularization),
                                                      ("pilot_size", self.pilot_size)) if value is not None}
        with torch.no_grad():
            points = select_landmarks(x_sample.detach(), num_landmarks,
                                      self.landmark_method, kernel=_dense(self.base_kernel, outputscale),
                                      seed=self.selection_seed,
                                      **options)
        self.landmarks = points.to(self.landmarks)

    def landmark_cholesky(self, dtype: torch.dtype | None = None) -> Tensor:
        """L = chol(K(Z, Z) + εI) in ``dtype``, ``(*batch_shape, M, M)``, with the jitter schedule and the working
        precision (float64 for float32/half) of the module docstring.

        Without a graph to build (gradients disabled, or neither Z nor the base kernel's hyperparameters require
        them: prediction) L is reused while Z, the base kernel's parameters, buffers and settings, the jitter and
        ``dtype`` equal those it was computed at (:class:`~rfgp.core.state_cache.StateCache`): each posterior call of a
        BO loop factorised K(Z, Z) twice (O(M³) per call, whatever the number of test points).
        """
        dtype = self.landmarks.dtype if dtype is None else dtype
        tensors = (self.landmarks, *module_tensors(self.base_kernel))
        config = (dtype, self.jitter, module_configuration(self.base_kernel))

        def factorise() -> tuple[Tensor, bool]:
            factor = self._landmark_cholesky(dtype)
            return factor, self._cross_in_work_precision

        # the precision of K(x, Z) chosen with a factor is reused with it: set from the last factor computed, a
        # reused one took that of another state (one computed under autograd, which is not kept), and the same
        # state's float32 covariance changed by 4·10⁻³ with the kernel's history
        factor, self._cross_in_work_precision = self._cholesky_cache.get(tensors, config, factorise)
        return factor

    def _landmark_cholesky(self, dtype: torch.dtype) -> Tensor:
        work = factor_dtype(dtype, self.landmarks.device)
        landmarks = self.landmarks.to(work)
        gram = _dense_covariance(self.base_kernel, landmarks, landmarks).to(work)
        scale = gram.diagonal(dim1=-2, dim2=-1).mean(-1).unsqueeze(-1).unsqueeze(-1)
        eye = torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device)
        first = jitter = self.jitter if self.jitter is not None else _DEFAULT_JITTER.get(dtype, 1e-4)
        while True:
            chol, info = torch.linalg.cholesky_ex(gram + (jitter * scale) * eye)
            if bool((info == 0).all() & torch.isfinite(chol).all()):
                break
            if jitter == first and not bool(torch.isfinite(gram).all()):  # no jitter makes NaN entries positive
                raise self._nonfinite_gram_error()
            if jitter * 10 > _MAX_JITTER * (1 + 1e-9):
                raise NotPSDError(
                    "NystromKernel: Cholesky of K(Z, Z) + ε·I failed for base kernel "
                    f"{type(self.base_kernel).__name__} at {self.num_features} landmarks even at relative jitter "
                    f"{jitter:.0e} (K(Z, Z) has non-finite entries, or the landmarks are (nearly) duplicated, or the "
                    "kernel is not positive definite at them)"
                )
            jitter *= 10
        if jitter != first and not self._warned_jitter:
            self._warned_jitter = True
            warn_user(
                f"NystromKernel: the Cholesky factor of K(Z, Z) at {self.num_features} landmarks needed relative "
                f"jitter {jitter:.0e} instead of {first:.0e} in {gram.dtype} (warned once per kernel); "
                "consider fewer or better spread landmarks",
                NumericalWarning,
            )
        # entries negligible in dtype (below its rounding) are zero, so that no subnormal number enters the solve
        factor = flush_negligible(chol, negligible_threshold(kernel_scale(chol), dtype, 0.25, 1)).to(dtype)
        self._cross_in_work_precision = work != dtype and self._choose_cross_precision(landmarks, gram, chol, dtype)
        if work != dtype and not self.training and not self._warned_precision:
            self._check_feature_precision(gram, chol, factor)
        return factor

    def _choose_cross_precision(self, landmarks: Tensor, gram: Tensor, chol: Tensor, dtype: torch.dtype) -> bool:
        """Whether :meth:`_cross` evaluates K(x, Z) of ``dtype`` (float32) inputs in float64 and rounds it, decided
        with each landmark factor from K(Z, Z): where L⁻¹ amplifies the error of the float32 evaluation more than
        :data:`CROSS_EVALUATION_EXCESS` times that of rounding the float64 one (and above
        :data:`CROSS_EVALUATION_FLOOR` relative to ‖L‖, so that harmless errors cost nothing).

        Φ(x) = K(x, Z)·L⁻ᵀ carries K(x, Z)'s error amplified by L⁻¹, up to (ε·k̄)^-½ ≈ 10³ at a near-singular
        K(Z, Z).  A float32 evaluation of distances far from the origin in lengthscales cancels (‖a‖² + ‖b‖² − 2aᵀb):
        on ggplot2's ``txhousing`` (d = 53 one-hot and numeric columns, N = 4 000, M = 1 024) K(x, Z) erred by
        1.1·10⁻⁵ relative, Φ by 0.9 % (median row, 5 % the worst), and the test RMSE of the same trained model was
        0.301 against float64's 0.290 (0.328 against 0.289 at M = 4 000), without a word; with the float64 evaluation
        0.290 (0.289).  Evaluating always in float64 cost 12–43 % of a float32 marginal likelihood with gradient
        (N = 10⁴, M = 512, d = 53 and 3), where standard normal inputs gain nothing; the floor 10⁻³ keeps the float32
        evaluation on the time-to-accuracy benchmarks' data (elecdemand, diamonds: 5·10⁻⁵ to 9·10⁻⁴ at lengthscales
        0.3–3, M = 1 024).  The decision costs an M × 64 kernel evaluation in ``dtype`` and two triangular solves with
        64 columns in float64 per factor (no graph; measured at 64 evenly spaced landmarks), and applies from that
        factor on: to the features of the same call (:meth:`featurize`, the chunked statistics, which factorise first)
        and to later calls."""
        with torch.no_grad():
            # Φ(z)ᵀ = L⁻¹K(Z, z) at CROSS_EVALUATION_SAMPLE evenly spaced landmarks z, ‖Φ(z)‖ = ‖L's row of z‖
            picked = torch.linspace(0, landmarks.shape[-2] - 1, min(landmarks.shape[-2], CROSS_EVALUATION_SAMPLE),
                                    device=landmarks.device).round().long()
            exact = gram.index_select(-1, picked)
            coarse = _dense_covariance(self.base_kernel, landmarks.to(dtype),
                                       landmarks.index_select(-2, picked).to(dtype))
            size = chol.index_select(-2, picked).norm(dim=(-2, -1))
            evaluated = torch.linalg.solve_triangular(chol, coarse.to(gram.dtype) - exact,
                                                      upper=False).norm(dim=(-2, -1)) / size
            rounded = torch.linalg.solve_triangular(chol, exact.to(dtype).to(gram.dtype) - exact,
                                                    upper=False).norm(dim=(-2, -1)) / size
            coarse_enough = (evaluated <= CROSS_EVALUATION_EXCESS * rounded) | (evaluated <= CROSS_EVALUATION_FLOOR)
        return not bool(coarse_enough.all())  # one host read per factor

    def _check_feature_precision(self, gram: Tensor, chol: Tensor, factor: Tensor) -> None:
        """Warn (once per kernel) where this kernel's float32 features err by more than
        :data:`FEATURE_PRECISION_TOLERANCE` relative to float64's.  Φ(x) = K(x, Z)·L⁻ᵀ is formed from K(x, Z)
        rounded to float32 (:meth:`_cross` evaluates it in float64 where a float32 evaluation would err by more, see
        :meth:`_choose_cross_precision`; elsewhere by at most 10⁻³ or 10 times the rounding, which this estimate
        leaves out), the factor L rounded to float32 and a float32 solve, whose errors L⁻¹ amplifies up to
        ‖L⁻¹‖ ≈ (ε·k̄)^-½ when K(Z, Z) is near-singular: about 10³·u at the default jitter, more at a smaller one given
        by hand.  Measured at the landmarks, the same steps against the float64 ones (Φ(Z) ≈ L): one float32 and one
        float64 triangular solve, once per factor computed in eval mode."""
        with torch.no_grad():
            exact = triangular_features(gram, chol)
            rounded = triangular_features(gram.to(factor.dtype), factor).to(exact.dtype)
            relative = ((rounded - exact).norm(dim=(-2, -1)) / exact.norm(dim=(-2, -1))).max()
        if not bool(relative > FEATURE_PRECISION_TOLERANCE):  # one host read per factor computed for prediction
            return
        self._warned_precision = True
        warn_user(
            f"NystromKernel: its {factor.dtype} features at {self.num_features} landmarks err by "
            f"{float(relative):.1e} (relative) from float64's: their {factor.dtype} rounding is amplified by L⁻¹, "
            "K(Z, Z) being near-singular "
            "(many landmarks, long lengthscales, or a small jitter), and predictions change with it; use "
            "model.double() (the float64 features cost about twice as much), fewer landmarks or the default jitter "
            "(warned once per kernel)",
            NumericalWarning,
        )

    def _nonfinite_gram_error(self) -> NonFiniteHyperparameterError:
        """K(Z, Z) has NaN or Inf entries (Z is finite at construction): name the hyperparameters (learned landmarks
        included) that are not finite or not positive.  Before, the jitter grew to 10⁻¹ in vain and a ``NotPSDError``
        blamed duplicated landmarks; as a ``NanError`` the trial point of an optimiser is stepped back from, as with
        random features."""
        bad = describe_bad_hyperparameters(self)
        cause = (f"its hyperparameters {', '.join(bad)} are NaN, Inf or not positive; reset them to finite values "
                 "inside their constraints" if bad else "the base kernel returns them at finite hyperparameters")
        return NonFiniteHyperparameterError(
            f"NystromKernel: K(Z, Z) of base kernel {type(self.base_kernel).__name__} at its {self.num_features} "
            f"landmarks has NaN or Inf entries: {cause}"
        )

    def featurize(self, x: Tensor) -> Tensor:
        """Φ(x) = K(x, Z)·L⁻ᵀ, ``(*batch_shape, n, M)``.

        L is recomputed at every call, so that chunked evaluations that recompute the features
        of each chunk under autograd differentiate through it: O(M³) per chunk, small against the
        chunk's O(chunk·M²).  The chunked marginal likelihood does not: its featurizer hands K
        and L apart (:meth:`featurizer`) and factorises L once.
        """
        return triangular_features(*self._factors(x))

    def feature_root(self, x: Tensor) -> TriangularFeatures:
        """Φ(x) with its factors K(x, Z) and L, whose feature statistics (the marginal likelihood's) take the
        backward fused through the triangular solve (:mod:`rfgp.inference.triangular_statistics`)."""
        cross, chol = self._factors(x)
        return TriangularFeatures(triangular_features(cross, chol), cross, chol)

    def training_covariance(self, x: Tensor) -> FeatureRootLinearOperator:
        """Φ(x)Φ(x)ᵀ (:meth:`feature_root`) and the correction k(x, x) − ‖Φ(x)‖² from the same Φ(x)
        (:meth:`variance_correction` of x alone featurises it again: K(x, Z), its solve, and the base kernel's
        evaluation overhead once more per prediction).

        In train mode too: no training quantity reads it, but predictions formed from the training covariance do
        (:func:`~rfgp.inference.leave_one_out.leave_one_out_predictions` of ``likelihood(model(train_x))`` in train
        mode lacked it: 0.028 instead of the refit's 0.143 at a point that is not a landmark), and from Φ(x) it costs
        k(x, x) and O(N·M) beside the features' O(N·M²)."""
        root = self.feature_root(x)
        features = root.features if isinstance(root, TriangularFeatures) else root
        return FeatureRootLinearOperator(root, self._correction(x, squared_row_norms(features)))

    def featurizer(self, x: Tensor, reuse_shape: bool = False) -> TriangularFeaturizer:
        """Φ = K(·, Z)·L⁻ᵀ with K and L apart, so that chunked statistics factorise L once per pass and take the fused
        backward (:func:`~rfgp.inference.triangular_statistics.chunked_triangular_statistics`).

        Width M and the batch shape of x and the base kernel are known, so no probe row is featurised (FeatureKernel's
        probe would factorise K(Z, Z) once more per kernel call), and ``reuse_shape`` has nothing to reuse.
        """
        params = [p for p in self.parameters() if p.requires_grad]
        dtype = x.dtype
        return TriangularFeaturizer(lambda rows: self._cross(rows),
                                    lambda: self.landmark_cholesky(dtype), params, self.num_features,
                                    torch.broadcast_shapes(x.shape[:-2], self.batch_shape))

    def _factors(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(K(x, Z), L)."""
        chol = self.landmark_cholesky(x.dtype)
        return self._cross(x), chol

    def _cross(self, x: Tensor) -> Tensor:
        """K(x, Z) with its negligible entries, below tiny^¼ of the largest kernel value at the landmarks (see
        :func:`~rfgp.inference.triangular_statistics.negligible_threshold`), set to zero.

        The scale is evaluated at every call, though it depends on the state only and takes no gradient (it enters a
        comparison): reusing it (:class:`~rfgp.core.state_cache.StateCache`) saved 0.07 ms of diagonal but cost 0.03 ms
        of key comparison, a change within noise (−2.8 % to +0.5 %, paired CPU-time medians, 1 thread, float64) of a
        posterior mean and variance at 32 points under autograd, N = M = 50–200, d = 2–6 (2.8–6.2 ms per call)."""
        if x.shape[-1] != self.landmarks.shape[-1]:
            raise ValueError(
                f"NystromKernel got inputs with {x.shape[-1]} columns, but its landmarks have "
                f"{self.landmarks.shape[-1]}: landmarks are points of the space the kernel is evaluated on (a deep "
                "kernel's network outputs, after input transforms), so choose them there, e.g. "
                "rfgp.sketch(kernel, M, method='nystrom', x_sample=<the kernel's inputs>)"
            )
        # in the factor's working precision (float64 for float32 inputs), rounded, where the landmark factor found a
        # float32 evaluation too coarse (_choose_cross_precision)
        work = factor_dtype(x.dtype, x.device) if self._cross_in_work_precision else x.dtype
        landmarks = self.landmarks.to(work)
        cross = _dense_covariance(self.base_kernel, x.to(work), landmarks).to(x.dtype)
        scale = _kernel_diagonal(self.base_kernel, landmarks).detach().clamp_min(0).amax(-1).sqrt()[..., None, None]
        return flush_negligible(cross, negligible_threshold(scale.to(x.dtype), cross.dtype, 0.25, 2))

    def diag_moments(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """(k(x, x), ‖Φ(x)‖²) per point; their difference is the FITC-style variance correction (≥ 0)."""
        batch = torch.broadcast_shapes(x.shape[:-2], self.batch_shape)
        chunk_size = resolve_chunk_size(x.shape[-2], self.num_features, math.prod(batch), x.dtype)
        if chunk_size is None:
            norms = self._squared_norms(x)
        else:  # the budget's chunks, recomputed in the backward pass instead of holding N × M features
            norms = torch.cat([
                checkpoint(self._squared_norms, x[..., rows, :], use_reentrant=False)
                if torch.is_grad_enabled() else self._squared_norms(x[..., rows, :])
                for rows in chunk_slices(x.shape[-2], chunk_size)
            ], -1)
        target = _kernel_diagonal(self.base_kernel, x)
        return target.expand(norms.shape), norms

    def _squared_norms(self, x: Tensor) -> Tensor:
        return squared_row_norms(self.featurize(x))

    def variance_correction(self, x: Tensor) -> Tensor | None:
        """k(x, x) − ‖Φ(x)‖² ≥ 0, computed in eval mode only: no training quantity reads it, predictions do."""
        if self.training:
            return None
        return super().variance_correction(x)

    def _correction(self, x: Tensor, norms: Tensor) -> Tensor:
        """k(x, x) − ‖Φ(x)‖² ≥ 0 for the squared norms ‖Φ(x)‖² (as :meth:`variance_correction` from
        :meth:`diag_moments`)."""
        return (_kernel_diagonal(self.base_kernel, x).expand(norms.shape) - norms).clamp_min(0.0)


def kernel_tree(kernel: Kernel) -> str:
    """The classes of a kernel tree in module order, each GPyTorch kernel with its settings that are not tensors
    (``ScaleKernel, MaternKernel(nu=2.5)``): what a state dict does not say, since GPyTorch's RBF and Matérn kernels of
    any ν (or polynomial kernels of any power) hold the same keys.  rfgp kernels in the tree check their own
    configuration, so only their class is named."""
    parts = []
    for module in kernel.modules():
        if not isinstance(module, Kernel):
            continue
        settings = [] if isinstance(module, ConfigState) else [
            f"{name}={value!r}" for name, value in sorted(vars(module).items())
            if not name.startswith("_") and name != "training" and isinstance(value, (bool, int, float, str))]
        parts.append(f"{type(module).__name__}({', '.join(settings)})" if settings else type(module).__name__)
    return ", ".join(parts)


def _refuse_inducing_point_kernel(kernel: Kernel, name: str) -> None:
    """The TypeError for a tree holding GPyTorch's ``InducingPointKernel`` (SGPR), naming the Nyström kernel of its
    parts.  Before, ``rfgp.sketch(..., method="nystrom")`` built Nyström features of it: in train mode its evaluation
    at two inputs raised GPyTorch's "x1 should equal x2 in training mode", and in eval mode the features approximated
    its rank-(number of inducing points) covariance instead of the base kernel, without a word."""
    if not any(isinstance(module, InducingPointKernel) for module in kernel.modules()):
        return
    raise TypeError(
        f"{name} holds GPyTorch's InducingPointKernel (SGPR), itself a landmark approximation of its base_kernel whose "
        "train-mode evaluation also registers SGPR's loss term, so it has no Nyström features of its own; for "
        "SGPR's kernel as rfgp features take its base kernel and inducing points: "
        "rfgp.kernels.NystromKernel(ipk.base_kernel, ipk.inducing_points.detach(), learn_landmarks=True), ipk the "
        "InducingPointKernel, in an ExactGP (trained on the DTC marginal likelihood, SGPR's bound without its trace "
        "term)"
    )


def _check_scalar(kernel: Kernel, points: Tensor, name: str) -> None:
    """The TypeError for a kernel with several outputs per input (at ``points``), naming what converts it instead."""
    probe = points[:1]
    with torch.no_grad():
        outputs = kernel.num_outputs_per_input(probe, probe)
    if outputs == 1:
        return
    if hasattr(kernel, "num_tasks"):  # MultitaskKernel: Nyström features of its data kernel
        instead = "SketchedDecomposableKernel(NystromKernel(data_kernel, ...), num_tasks=p)"
    else:  # derivative kernels, vector fields: another covariance than a task matrix times a scalar kernel
        instead = ("random features, rfgp.sketch(kernel, num_features) without method='nystrom' (derivative kernels "
                   "such as RBFKernelGrad: method 'rff', 'orf' or 'sorf')")
    raise TypeError(f"{name} {type(kernel).__name__} has {outputs} outputs per input; Nyström features are for scalar "
                    f"kernels: use {instead}")


def _check_distinct_landmarks(landmarks: Tensor) -> Tensor:
    """The ValueError for hand-given landmarks with repeated rows (one host read, at construction).

    A repeated landmark adds nothing to span{φ(z)}: K(Z, Z) is singular, the jitter absorbs it and the map has rank
    below its width M = ``num_features``, which then overstates the approximation's cost and accuracy, without a word.
    Deduplicating would change M behind the user's back (and the shape of a trained ``landmarks`` parameter), so the
    repeated rows are refused, as the landmark selectors refuse to pick a point twice."""
    distinct, rows = distinct_rows(landmarks)[1], landmarks.shape[0]
    if distinct < rows:
        raise ValueError(
            f"landmarks has {rows - distinct} repeated rows ({distinct} distinct of {rows}): "
            "a repeated landmark adds nothing to the Nyström span and makes K(Z, Z) singular, wasting part of the "
            "width M; pass distinct points, e.g. torch.unique(landmarks, dim=0)"
        )
    return landmarks


def nystrom_sketch(kernel: Kernel, num_features: int, x_sample: Tensor | None = None, landmarks: str = "uniform",
                   seed: int | None = None, generator: torch.Generator | None = None, learn_landmarks: bool = False,
                   jitter: float | None = None, **selection_options) -> Kernel:
    """``rfgp.sketch(kernel, M, method="nystrom", x_sample=X, ...)``: one NystromKernel over a deep copy of the tree.

    The whole tree becomes one Nyström map: the projection of the sum/product kernel onto its
    own landmarks is at least as accurate as summing separate Nyström maps of the parts at
    the same total width (the sum's span contains no wasted directions), and costs one
    Cholesky.  The tree is deep-copied: its hyperparameter values, constraints and priors
    carry over, and training the converted kernel leaves the user's exact kernel unchanged
    (as every ``rfgp.sketch`` conversion does).

    A ``ScaleKernel`` at the top of the tree stays on top: ``ScaleKernel(k)`` becomes
    ``ScaleKernel(NystromKernel(k))``, the same kernel, since the Nyström map of s·k is √s times k's,
    K(x, Z)(sK(Z, Z) + sεI)⁻¹K(Z, y)·s = s·K(x, Z)(K(Z, Z) + εI)⁻¹K(Z, y) (the jitter ε is relative to
    the mean of diag K(Z, Z), so it scales with s too), and the FITC-style variance correction
    s·k(x, x) − s·‖Φ(x)‖² with it.  So code written for the exact tree reads and sets its hyperparameters at
    the same paths: ``.outputscale``, ``.base_kernel.lengthscale`` (the NystromKernel exposes the
    lengthscale of its base kernel), and BoTorch's outputscale handling sees a ``ScaleKernel`` as for random
    features.  The ScaleKernel's ``active_dims`` select the landmarks' columns (it calls the Nyström
    kernel's ``forward``, as it called k's), and the NystromKernel takes k's ``active_dims`` (k's copy inside
    has none), so the exact tree's ``state_dict`` loads key for key.  One ScaleKernel is factored out; a
    ScaleKernel directly below it stays in the base tree.

    Args:
        kernel: any scalar GPyTorch kernel (tree).
        num_features: M, the number of landmarks: M distinct points of ``x_sample`` (rows equal
            to a chosen one are skipped; a ``ValueError`` when it has fewer than M distinct rows).
        x_sample: ``(n, d)`` input points (at least M distinct rows) to choose the landmarks among,
            e.g. the training inputs (required).
        landmarks: ``"uniform"``, ``"kmeans++"`` (in the kernel's feature-space distance) or
            ``"rls"`` (approximate ridge leverage scores of the whole kernel, outputscale included),
            see :mod:`rfgp.features.landmarks`.
        seed, generator: randomness of the selection (one of them; a generator draws the seed that is stored).
        learn_landmarks, jitter: see :class:`NystromKernel`.
        selection_options: passed to the selector (``regularization``, ``pilot_size`` for ``"rls"``).

    Returns:
        the ``NystromKernel``, or for a tree with a ``ScaleKernel`` on top that ``ScaleKernel`` around it.
    """
    if x_sample is None:
        raise ValueError(
            "method='nystrom' chooses its landmarks among data points: pass x_sample= (an (n, d) tensor of "
            "input points with n ≥ num_features, e.g. the training inputs)"
        )
    if not isinstance(kernel, Kernel):
        raise TypeError(f"kernel must be a gpytorch Kernel, got {type(kernel).__name__}")
    x_sample = check_points(x_sample, "x_sample").detach()
    if seed is not None and generator is not None:  # the seed alone would decide, the generator go unused
        raise ValueError(f"pass seed or generator, not both (got seed={seed!r} and a generator): the landmarks are "
                         "chosen by one stored seed, which set_num_features repeats")
    unknown = set(selection_options) - {"regularization", "pilot_size"}
    if unknown:
        raise TypeError(f"unknown landmark selection options {sorted(unknown)}; accepted: regularization, pilot_size")
    if selection_options and landmarks in ("uniform", "kmeans++"):
        raise TypeError(f"landmark selection options {sorted(selection_options)} are those of landmarks='rls' (ridge "
                        f"leverage scores); landmarks={landmarks!r} takes none")
    tree = _copy_tree(kernel)
    seed = seed if seed is not None else _new_seed(generator)  # stored: set_num_features repeats the choice
    scale = tree if type(tree) is ScaleKernel else None
    base, active_dims = tree, None
    if scale is not None:  # it calls base.forward on its own columns: base's active_dims move to the Nyström kernel
        base, active_dims = scale.base_kernel, scale.base_kernel.active_dims
        base.active_dims = None
        if scale.active_dims is not None:
            x_sample = x_sample.index_select(-1, scale.active_dims.to(x_sample.device))
    _refuse_inducing_point_kernel(base, "kernel")
    _check_scalar(base, x_sample, "kernel")  # before choosing landmarks, which may evaluate the kernel
    with torch.no_grad():
        outputscale = None if scale is None else scale.outputscale
        points = select_landmarks(x_sample, num_features, landmarks, kernel=_dense(base, outputscale), seed=seed,
                                  **selection_options)
    nystrom = NystromKernel(base, points, learn_landmarks=learn_landmarks, jitter=jitter, landmark_method=landmarks,
                            selection_seed=seed, active_dims=active_dims, **selection_options)
    if scale is None:
        return nystrom
    scale.base_kernel = nystrom
    scale.register_load_state_dict_pre_hook(_refuse_whole_tree_state)
    return scale


def _refuse_whole_tree_state(module: ScaleKernel, state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook of :func:`nystrom_sketch`'s ``ScaleKernel(NystromKernel(k))``: a state saved from the
    earlier layout ``NystromKernel(ScaleKernel(k))`` (landmarks at this level) raises instead of loading in part."""
    if prefix + "landmarks" in state_dict:
        raise ValueError(
            f"cannot load state: it holds a NystromKernel at {prefix[:-1] or 'the top'!r} over the whole tree "
            f"NystromKernel(ScaleKernel(k)) (its landmarks are {prefix + 'landmarks'!r}), as "
            "rfgp.sketch(ScaleKernel(k), method='nystrom') built it before it became ScaleKernel(NystromKernel(k)), "
            "this module's layout. Convert the exact tree anew and set the old state's landmarks and hyperparameters "
            "at their new paths: base_kernel.landmarks, outputscale, base_kernel.base_kernel.*"
        )


def _copy_tree(kernel: Kernel) -> Kernel:
    """``copy.deepcopy(kernel)``, buffers that are results of a computation (not graph leaves) copied as detached
    values: deepcopy refuses those, and BoTorch's ``LCEAKernel`` caches its context covariance so in eval mode (a
    model's kernel after ``model.eval()``); it recomputes it at its next ``train()``/``eval()`` switch."""
    memo = {id(buffer): buffer.detach().clone() for module in kernel.modules() for buffer in module.buffers(False)
            if buffer.grad_fn is not None}
    return copy.deepcopy(kernel, memo)


def _dense(kernel: Kernel, outputscale: Tensor | None = None):
    """``kernel`` (times ``outputscale``, ``(*batch)``, if given) as a function (x1, x2, diag) → dense tensor, the
    form the landmark selectors take."""

    def dense_kernel(x1: Tensor, x2: Tensor, diag: bool = False) -> Tensor:
        value = _kernel_diagonal(kernel, x1) if diag else _dense_covariance(kernel, x1, x2)
        if outputscale is None:
            return value
        return value * (outputscale[..., None] if diag else outputscale[..., None, None])

    return dense_kernel


def _kernel_diagonal(kernel: Kernel, x: Tensor) -> Tensor:
    """k(x, x) per point, ``(*batch, n)``, evaluated at x expanded to the kernel's batch shape.

    GPyTorch's ``Kernel.__call__(x, diag=True)`` takes the diagonal of a kernel whose ``forward`` ignores ``diag``
    (``IndexKernel``) only when the output has as many dimensions as the inputs (GPyTorch 1.15.2): a batched
    ``IndexKernel`` on unbatched inputs returns its whole ``(S, n, n)`` matrix, which a product kernel cannot multiply
    with its other factors' ``(S, n)`` diagonals (BoTorch's ``SaasFullyBayesianMultiTaskGP`` after fitting: a batch
    of MCMC samples of Matérn × IndexKernel).
    """
    batch = torch.broadcast_shapes(x.shape[:-2], kernel.batch_shape)
    return module_in_dtype(kernel, x.dtype)(x.expand(*batch, *x.shape[-2:]), diag=True)


def _dense_covariance(kernel: Kernel, x1: Tensor, x2: Tensor) -> Tensor:
    """K(x1, x2) as a dense tensor, the kernel evaluated in the inputs' dtype (:func:`module_in_dtype`: float32
    hyperparameters cast, differentiably, where the factor works in float64).  GPyTorch's ``PolynomialKernel`` does not
    promote its offset (``torch.addmm``): called as it is on float64 inputs, a float32 one raised "self and mat2 must
    have the same dtype" at every factorisation of a float32 Nyström map."""
    return module_in_dtype(kernel, x1.dtype)(x1, x2).to_dense()
