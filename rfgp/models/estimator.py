"""What rfgp's scikit-learn estimators share: the estimator protocol, checked arguments, inputs and the default kernel.

:class:`~rfgp.models.DirichletGPClassifier` and :class:`~rfgp.models.GPRegressor` follow scikit-learn's estimator
contract without depending on scikit-learn (its developer guide, "Rolling your own estimator"): the constructor stores
its arguments as given and ``fit`` checks them (also those changed by ``set_params``), ``get_params``/``set_params``
let ``clone``, ``Pipeline``, ``GridSearchCV`` and ``cross_val_score`` rebuild and tune them, prediction before
``fit`` raises a ``NotFittedError``, and a DataFrame's string column names are kept as ``feature_names_in_`` and
checked at prediction.  :class:`RandomFeatureEstimator` holds that protocol, the width rule "train small, predict
big" of the default kernel, the input conversion and standardisation, and the default kernel's construction.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import math
import numbers
import sys
import warnings

import gpytorch
import numpy as np
import torch
from gpytorch.utils.warnings import NumericalWarning
from linear_operator.utils.errors import NotPSDError
from torch import Tensor

from ..core.dtypes import factor_dtype
from ..core.user_warnings import held_warnings, replay_warnings
from ..core.user_warnings import warn as warn_user
from ..core.validation import (
    check_choice,
    check_dtype_argument,
    check_positive_float,
    check_positive_int,
    nonfinite_message,
)
from ..kernels.fourier import FOURIER_METHODS, SketchedRBFKernel
from ..kernels.gaussian_sketch import GaussianSketchRBFKernel
from ..kernels.nystrom import NystromKernel
from ..training import NonFiniteLossError, fit_mll
from .feature_width import refit_data_fitted_maps
from .random_start import draw_random_start
from .regression import ExactGPModel

#: the default kernel's training width when neither width is given, and its prediction width's multiple of it
DEFAULT_TRAIN_NUM_FEATURES = 256
PREDICT_WIDTH_RATIO = 4
#: fit_mll's optimizers an estimator takes: its outputs or classes share one kernel, which ``"member_lbfgs"`` (one
#: L-BFGS per independent batch member) refuses
ESTIMATOR_OPTIMIZERS = ("lbfgs", "adam")


class NotFittedError(ValueError, AttributeError):
    """Prediction before ``fit``: a ``ValueError`` and an ``AttributeError``, as scikit-learn's NotFittedError."""


def _not_fitted_error() -> type:
    """scikit-learn's ``NotFittedError`` when scikit-learn is in use (already imported), else rfgp's twin.

    Both are ``ValueError`` and ``AttributeError`` subclasses; scikit-learn's own code (``check_is_fitted``
    users, meta-estimators, its estimator checks) catches its class by name, and rfgp does not import
    scikit-learn itself.
    """
    sklearn_exceptions = sys.modules.get("sklearn.exceptions")
    return sklearn_exceptions.NotFittedError if sklearn_exceptions is not None else NotFittedError


class RandomFeatureEstimator:
    """Base of rfgp's scikit-learn estimators: the protocol, the shared arguments, inputs and the default kernel.

    A subclass stores its constructor arguments under their names (scikit-learn's rule) and has at least ``kernel``,
    ``num_features``, ``train_num_features``, ``method``, ``num_iterations``, ``lr``, ``optimizer``, ``standardize``,
    ``dtype``, ``device``, ``seed``, ``progress`` and ``n_restarts_optimizer``, documented in its class docstring;
    ``_noun`` names it in messages ("classifier", "regressor").
    """

    _noun = "estimator"

    # ----- scikit-learn estimator protocol ------------------------------------------------
    @classmethod
    def _get_param_names(cls) -> list[str]:
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self, deep: bool = True) -> dict:
        """The constructor arguments as stored (scikit-learn's ``get_params``; ``clone`` rebuilds from them)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params):
        """Set constructor arguments (checked at the next ``fit``), as scikit-learn's ``set_params``."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(
                    f"invalid parameter {name!r} for {type(self).__name__}; accepted: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __repr__(self) -> str:
        defaults = {name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if not _same(v, defaults.get(k))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def __sklearn_is_fitted__(self) -> bool:
        """Fitted once ``fit`` has finished (scikit-learn's ``check_is_fitted`` asks this instead of looking for
        attributes ending in ``_``, which a fit that failed half-way leaves behind)."""
        return hasattr(self, "model_")

    def __getstate__(self) -> dict:
        """The estimator as pickled (``pickle``, ``joblib.dump``): its fitted model without prediction caches.

        A fitted model's posterior caches (the C or T factors of F × F matrices a prediction builds, GPyTorch's
        ``prediction_strategy``) are a function of its state, rebuilt at the first prediction after loading with the
        same values; pickled with it they made a 16-class classifier at F = 1 024 92 MB instead of 0.35 MB.
        """
        strategy = getattr(self.__dict__.get("model_"), "prediction_strategy", None)
        if strategy is None:
            return self.__dict__.copy()
        # a copy whose memo maps the caches to None: a shallow copy of the model still reached them through the
        # bound methods GPyTorch registers as load hooks, and the copy keeps likelihood_ the model's likelihood
        return copy.deepcopy(self.__dict__, {id(strategy): None})

    @property
    def kernel_(self) -> gpytorch.kernels.Kernel:
        """The fitted kernel, ``model_.covar_module`` (scikit-learn's ``kernel_``), in the units the model sees: the
        standardised inputs with ``standardize`` and, for the regressor, the normalised targets with ``normalize_y``.
        """
        self._check_fitted()
        return self.model_.covar_module

    # ----- arguments ----------------------------------------------------------------------
    def _check_common_params(self) -> dict:
        """The shared constructor arguments, checked (a dict for the subclass's ``_fit_params`` namespace)."""
        if self.kernel is not None and not isinstance(self.kernel, gpytorch.kernels.Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel or None, got {type(self.kernel).__name__}")
        train_width, predict_width = self._check_widths()
        check_choice(self.method, "method", tuple(FOURIER_METHODS))
        iterations = check_positive_int(self.num_iterations, "num_iterations", allow_zero=True)
        if self.lr is not None:
            check_positive_float(self.lr, "lr")
        check_choice(self.optimizer, "optimizer", ESTIMATOR_OPTIMIZERS)
        dtype = _check_dtype(self.dtype)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(
                f"seed must be an integer, got {self.seed!r}: the estimators' features are drawn from one integer "
                "seed (fixed, so that a fit repeats bit for bit), not from scikit-learn's random_state (None, a "
                "RandomState); pass e.g. seed=0, or seed=int(rng.integers(2**31)) for a fresh draw"
            )
        restarts = check_positive_int(self.n_restarts_optimizer, "n_restarts_optimizer", allow_zero=True)
        if restarts > 0 and iterations == 0:  # nothing would be optimised from the random starts
            raise ValueError(
                f"n_restarts_optimizer={restarts} restarts the hyperparameter optimisation, but num_iterations=0 "
                "does not optimise: pass num_iterations > 0, or n_restarts_optimizer=0"
            )
        return dict(
            kernel=self.kernel, train_num_features=train_width, num_features=predict_width, method=self.method,
            num_iterations=iterations, lr=None if self.lr is None else float(self.lr), optimizer=self.optimizer,
            standardize=bool(self.standardize), dtype=dtype, device=_check_device(self.device), seed=int(self.seed),
            progress=self.progress, n_restarts_optimizer=restarts,
        )

    def _check_widths(self) -> tuple[int | None, int | None]:
        """(F_train, F) of the default kernel by the rule in the class doc; ``(None, None)`` with a given kernel."""
        train, predict = (None if getattr(self, name) is None else check_positive_int(getattr(self, name), name)
                          for name in ("train_num_features", "num_features"))
        if self.kernel is not None:
            if train is not None:
                raise ValueError(
                    f"train_num_features={train} sets the default kernel's training width, but a kernel was given (it "
                    "keeps its own width); build the kernel at the training width and call "
                    f"rfgp.set_num_features({self._noun}.model_, F) after fit, or pass train_num_features=None"
                )
            if predict is not None:  # it was ignored: a sketched kernel kept its width, an exact one stayed exact
                raise ValueError(
                    f"num_features={predict} sets the default kernel's width, but kernel={type(self.kernel).__name__} "
                    "was given (it keeps its own width and an exact GPyTorch kernel is not converted): build the "
                    f"kernel at that width, e.g. kernel=rfgp.sketch(kernel, {predict}), or call "
                    f"rfgp.set_num_features({self._noun}.model_, {predict}) after fit, and pass num_features=None"
                )
            return None, None
        for name, value in (("train_num_features", train), ("num_features", predict)):
            if value is not None and value % 2:
                raise ValueError(f"{name} must be even for the default kernel's sin/cos features (F = 2m), got {value}")
        if train is None:
            train = DEFAULT_TRAIN_NUM_FEATURES if predict is None else predict
        return train, PREDICT_WIDTH_RATIO * train if predict is None else predict

    # ----- inputs -------------------------------------------------------------------------
    def _training_inputs(self, X) -> Tensor:
        """``X`` checked and converted (in the wider of its dtype and the model's: :meth:`_standardised` scales and
        rounds it; a copy, never the caller's tensor), its columns recorded (``n_features_in_``,
        ``feature_names_in_``)."""
        self.__dict__.pop("model_", None)  # a new fit forgets the previous one: a failed one leaves it unfitted
        self.n_features_in_ = None  # and its columns, before reading X
        self.feature_names_in_ = None
        names = _feature_names(X)
        x = self._as_inputs(X, "X")
        if torch.is_tensor(X) and x.untyped_storage().data_ptr() == X.untyped_storage().data_ptr():
            # the model keeps its training inputs: the caller's tensor, changed in place after fit, changed the fit
            x = x.clone()
        self.n_features_in_ = x.shape[-1]
        self.feature_names_in_ = names
        if self.feature_names_in_ is None:
            del self.feature_names_in_
        return x

    def _standardised(self, x: Tensor) -> Tensor:
        """The training inputs standardised (``standardize``), their statistics kept for prediction, in the model's
        dtype.

        ``x`` comes in the wider of its own and the model's dtype (:meth:`_as_inputs`) and is centred and scaled there
        before it is rounded to the model's: float32 first rounded decimal years or Julian dates (≈ 2.46·10⁶ days,
        spacing 0.25 days in float32) before the centring, so hourly observations shared six-hourly inputs (500
        rows, 84 distinct; training RMSE 0.65 instead of the noise's 0.10).
        """
        if self._fit_params.standardize:
            self.input_mean_ = x.mean(0)
            self.input_scale_ = column_scales(x, self.input_mean_, "X")
            x = (x - self.input_mean_) / self.input_scale_
        return x.to(self._fit_params.dtype)

    def _test_inputs(self, X) -> Tensor:
        """Checked, standardised prediction inputs: fitted, in eval mode, same columns (and column names) as in
        ``fit``."""
        self._check_fitted()
        if self.model_.training:  # GPyTorch's train mode: the prior at the training inputs, an error elsewhere
            raise RuntimeError(
                f"{type(self).__name__}.model_ is in training mode (model_.train() was called after fit, e.g. by a "
                "training loop), where GPyTorch returns the prior at the training inputs instead of the posterior "
                f"(a {self._noun} scored its training data by its prior mean): call {self._noun}.model_.eval() "
                "before predicting"
            )
        names = _feature_names(X)
        fitted_names = getattr(self, "feature_names_in_", None)
        if fitted_names is not None and names is not None and not np.array_equal(names, fitted_names):
            raise ValueError(
                f"X has the columns {names.tolist()}, but the {self._noun} was fitted on {fitted_names.tolist()}"
                " (same names in the same order are required)"
            )
        if (fitted_names is None) != (names is None):
            warn_user(
                f"X {'has' if names is not None else 'does not have'} feature names, but the {self._noun} was fitted "
                f"{'without' if fitted_names is None else 'with'} them: columns are matched by position",
                UserWarning,
            )
        x = self._as_inputs(X, "X")
        if self._fit_params.standardize:
            x = (x - self.input_mean_) / self.input_scale_
        return x.to(self._fit_params.dtype)

    def _as_inputs(self, X, name: str) -> Tensor:
        p = self._fit_params
        x = as_real_tensor(X, name)
        if x.dim() != 2:
            raise ValueError(
                f"{name} must be a 2-D array (n_samples, n_features), got shape {tuple(x.shape)}. Reshape your data"
                f" with {name}.reshape(-1, 1) for a single feature or {name}.reshape(1, -1) for a single sample"
            )
        for axis, what in enumerate(("sample", "feature")):
            if x.shape[axis] == 0:
                raise ValueError(f"{name} has 0 {what}(s) (shape={tuple(x.shape)}) while a minimum of 1 is required.")
        # the model's dtype after scaling; integer or bool tensors in float64 first, as NumPy input is (int64 Unix
        # times went to float32 before the centring: R² 0.24 instead of 1.0 on an hourly sine)
        wide = x.dtype if x.is_floating_point() else torch.float64
        x = x.to(device=p.device, dtype=torch.promote_types(wide, p.dtype))
        if not bool(torch.isfinite(x).all()):
            names = _feature_names(X)
            first_column = int((~torch.isfinite(x)).nonzero()[0, 1])
            column = "" if names is None else f"the first in column {names[first_column]!r}; "
            hint = f"{column}drop or impute those rows (e.g. sklearn.impute.SimpleImputer)"
            raise ValueError(nonfinite_message(x, name, hint))
        if self.n_features_in_ is not None and x.shape[-1] != self.n_features_in_:
            raise ValueError(
                f"{name} has {x.shape[-1]} features, but {type(self).__name__} is expecting {self.n_features_in_}"
                " features as input (the number of columns it was fitted on)"
            )
        return x

    def _check_fitted(self) -> None:
        if not self.__sklearn_is_fitted__():
            raise _not_fitted_error()(f"this {type(self).__name__} is not fitted yet; call fit(X, y) first")

    # ----- training -----------------------------------------------------------------------
    def _best_of_starts(self, train):
        """(model, history, final losses of every start) of ``train(start)`` — a new model trained from the default
        start (``start=None``), then from ``n_restarts_optimizer`` random starts drawn from a CPU generator seeded
        with ``seed`` (:func:`~rfgp.models.random_start.draw_random_start`) — keeping the lowest final training loss
        (the default start wins ties), as scikit-learn's ``n_restarts_optimizer``.

        Only the kept fit's warnings are shown.  A restart that fails (``NotPSDError``, ``NonFiniteLossError``) is
        skipped with a ``NumericalWarning`` and recorded as NaN; a failure from the default start raises.  Untrained
        (``num_iterations=0``): ``train(None)``'s model and ``[]``.
        """
        p = self._fit_params
        with held_warnings() as kept_warnings:
            model, history = train(None)
        if not history:
            replay_warnings(kept_warnings)
            return model, history, []
        losses = [history.losses[-1]]
        starts = torch.Generator().manual_seed(p.seed)
        for restart in range(1, p.n_restarts_optimizer + 1):
            try:
                with held_warnings() as restart_warnings:  # replayed at once if it fails: they explain why
                    candidate, candidate_history = train(starts)
            except (NotPSDError, NonFiniteLossError) as error:
                warn_user(f"{type(self).__name__}: restart {restart} of n_restarts_optimizer="
                          f"{p.n_restarts_optimizer} failed and is skipped ({type(error).__name__}: "
                          f"{str(error).splitlines()[0]}); restart_losses_ records it as NaN", NumericalWarning)
                losses.append(math.nan)
                continue
            losses.append(candidate_history.losses[-1])
            if candidate_history.losses[-1] < history.losses[-1]:
                model, history, kept_warnings = candidate, candidate_history, restart_warnings
        replay_warnings(kept_warnings)
        return model, history, losses

    def _trained_model(self, x: Tensor, targets: Tensor, likelihood: gpytorch.likelihoods.Likelihood,
                       start: torch.Generator | None, description: str, ard: bool = False,
                       time_budget: float | None = None):
        """(model, :class:`~rfgp.training.TrainingHistory` or ``[]`` untrained): a new ``ExactGPModel`` on ``x`` and
        the ``targets`` ``([B,] N)`` it regresses, with ``likelihood``, a constant mean started at the targets' means
        and :meth:`_new_kernel`'s kernel, trained by :func:`rfgp.fit_mll` from the default start, or from a random one
        drawn from ``start`` (:func:`~rfgp.models.random_start.draw_random_start`, a restart of
        :meth:`_best_of_starts`); ``description`` labels the progress bar."""
        p = self._fit_params
        mean = gpytorch.means.ConstantMean(batch_shape=targets.shape[:-1])
        kernel = self._new_kernel(x, targets, ard=ard)
        model = ExactGPModel(x, targets, likelihood, kernel, mean).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            mean.constant.copy_(targets.mean(-1))
            if start is not None:
                draw_random_start(model, start, float(targets.var(-1, correction=0).mean()) or 1.0)
        if p.num_iterations == 0:
            return model, []
        history = fit_mll(model, p.num_iterations, p.lr, p.progress, description=description, optimizer=p.optimizer,
                          time_budget=time_budget)
        return model, history

    # ----- kernel -------------------------------------------------------------------------
    def _new_kernel(self, x: Tensor, targets: Tensor, ard: bool = False) -> gpytorch.kernels.Kernel:
        """A deep copy of the given kernel (its data-fitted maps refitted on the standardised ``x``), or the default
        ``ScaleKernel(SketchedRBFKernel(F_train, method))`` (ARD if ``ard``) at the median-heuristic lengthscale,
        with the outputscale set to the variance of the centred ``targets`` (rows of a batch centred each)."""
        p = self._fit_params
        if p.kernel is not None:
            batch = targets.shape[:-1]
            if p.kernel.batch_shape not in (torch.Size(), batch):  # GPyTorch's broadcasting error named neither
                raise ValueError(
                    f"kernel has batch_shape {tuple(p.kernel.batch_shape)}, but the {self._noun}'s targets form a "
                    f"batch of shape {tuple(batch)} (one per output or class): pass a kernel without a batch (shared "
                    f"by all of them) or with batch_shape {tuple(batch)}"
                )
            kernel = copy.deepcopy(p.kernel)
            if p.standardize:
                _refit_among(kernel, x)
            return kernel
        ard_dims = {"ard_num_dims": x.shape[-1]} if ard else {}
        base = SketchedRBFKernel(p.train_num_features, method=p.method, input_dim=x.shape[-1], seed=p.seed, **ard_dims)
        kernel = gpytorch.kernels.ScaleKernel(base).to(device=p.device, dtype=p.dtype)
        centred = targets - targets.mean(-1, keepdim=True)
        with torch.no_grad():
            base.lengthscale = _median_distance(x, p.seed)
            # one target has no sample variance (NaN): start at 1, the variance of normalised targets
            kernel.outputscale = (centred.var() if centred.numel() > 1 else torch.ones(())).clamp_min(1e-3)
        return kernel


@contextlib.contextmanager
def predicting():
    """An estimator's predictions: no gradients, no GPyTorch warning for predicting at the training
    inputs (deliberate here: training accuracy or R²).

    GPyTorch's ``skip_posterior_variances`` is not entered for mean-only predictions: it is process-wide, so a thread's
    ``predict(X)`` gave another thread's ``predict(X, return_std=True)`` skipped variances.  rfgp's posterior
    covariance is lazy (its root is formed where it is read), so the mean alone costs what it did; the mean is the
    same either way.  With an exact GPyTorch kernel (``kernel=``) GPyTorch forms its predictive covariance with the
    mean (O(N²M)): correct, slower; under T outputs or C classes :class:`~rfgp.models.ExactGPModel` predicts it with
    lazy test covariances (:func:`~rfgp.models.regression.lazy_test_covariances_for_batched_exact`).
    """
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
        yield


def as_real_tensor(X, name: str) -> Tensor:
    """``X`` (NumPy, pandas, lists or torch) as a real tensor: a detached tensor as it is, anything else a float64
    copy (DataFrames give read-only or negatively strided views, which torch refuses); complex values and sparse
    input (:func:`refuse_sparse`) refused."""
    refuse_sparse(X, name)
    if torch.is_tensor(X):
        x = X.detach()
    else:
        temporal = _temporal_columns(X)
        if temporal:  # their float64 values would be nanoseconds since 1970, a unit and origin nobody chose
            raise TypeError(
                f"{name} has date/time values ({temporal}), which rfgp does not convert to numbers itself: convert "
                "them to a scale you choose, e.g. days since a reference date, "
                "(X[c] - X[c].min()).dt.total_seconds() / 86400"
            )
        try:
            array = np.array(X, copy=True)
        except ValueError as error:  # rows of unequal lengths: NumPy's "inhomogeneous shape" named no argument
            raise ValueError(f"{name} must be a rectangular array, one row per sample, all of one length: {error}"
                             ) from None
        if np.iscomplexobj(array):  # float64 conversion would silently drop the imaginary part
            raise ValueError(f"Complex data not supported: {name} has {array.dtype} values; real inputs required")
        try:
            x = torch.as_tensor(_float64(X, array))
        except (TypeError, ValueError) as error:
            raise type(error)(f"{name} must hold numbers only: {_non_numeric(X, array)} ({error}); encode such "
                              "columns first, e.g. with sklearn.preprocessing.OneHotEncoder or OrdinalEncoder in a "
                              "Pipeline") from None  # numpy's type: TypeError for objects, ValueError for strings
    if x.is_complex():
        raise ValueError(f"Complex data not supported: {name} has {x.dtype} values; real inputs required")
    return x


def refuse_sparse(X, name: str) -> None:
    """Refuse a sparse ``X`` (SciPy matrix or array, torch sparse tensor) naming ``name`` and the way to dense input.

    A torch sparse tensor crashed inside torch (``Could not run 'aten::ne.Scalar' ... 'SparseCPU' backend``), a SciPy
    sparse ``y`` was called non-numeric; the features need dense rows anyway (Φ(x) is dense whatever x is), and a
    Pipeline's encoder makes them dense where it is built, which ``X.toarray()`` gives no place for.
    """
    if torch.is_tensor(X):
        if X.layout != torch.strided:
            raise TypeError(f"{name} is a sparse tensor (layout {X.layout}); rfgp's estimators need dense input: "
                            f"pass {name}.to_dense()")
    elif hasattr(X, "toarray") or hasattr(X, "tocsr"):
        pipeline = (", or, in a Pipeline, make the step before dense (OneHotEncoder(sparse_output=False), "
                    "ColumnTransformer(..., sparse_threshold=0))") if name == "X" else ""
        raise TypeError(f"{name} is a sparse matrix ({type(X).__name__}); rfgp's estimators need dense input: pass "
                        f"{name}.toarray(){pipeline}")


def _float64(X, array: np.ndarray) -> np.ndarray:
    """``X``'s values as float64; a pandas object's missing values (``pd.NA`` of its nullable ``Int64``, ``Float64``
    or ``boolean`` columns, which NumPy cannot convert) as NaN, for the finiteness check to name."""
    pandas = sys.modules.get("pandas")  # a pandas object implies pandas imported; rfgp does not import it itself
    if pandas is not None and isinstance(X, (pandas.DataFrame, pandas.Series)):
        return X.to_numpy(dtype=np.float64, na_value=np.nan, copy=True)  # writable: torch refuses read-only views
    return array.astype(np.float64)


def _temporal_columns(X) -> str:
    """The date/time (datetime64, timezone-aware, timedelta64) columns of ``X`` as text, ``""`` for none."""
    dtypes = getattr(X, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "items"):  # a DataFrame
        bad = [f"column {column!r} ({dtype})" for column, dtype in dtypes.items() if _is_temporal(dtype)]
        return ", ".join(bad)
    dtype = getattr(X, "dtype", None)
    return f"dtype {dtype}" if dtype is not None and _is_temporal(dtype) else ""


def _is_temporal(dtype) -> bool:
    return getattr(dtype, "kind", None) in ("M", "m") or str(dtype).startswith(("datetime64", "timedelta64"))


def _non_numeric(X, array: np.ndarray) -> str:
    """Which columns of ``X`` are not numbers (error path only): a DataFrame's by name and dtype."""
    dtypes = getattr(X, "dtypes", None)
    if dtypes is not None and hasattr(dtypes, "items"):
        bad = [f"{column!r} ({dtype})" for column, dtype in dtypes.items() if not _is_numeric(dtype)]
        if bad:
            return f"column{'s' if len(bad) > 1 else ''} {', '.join(bad)}"
    return f"values of dtype {array.dtype}"


def _is_numeric(dtype) -> bool:
    """A NumPy number or bool dtype, or pandas' nullable one (its categorical, string and object dtypes are not)."""
    try:
        dtype = np.dtype(getattr(dtype, "numpy_dtype", dtype))
    except TypeError:
        return False
    return np.issubdtype(dtype, np.number) or dtype == np.bool_


#: the names an estimator's ``dtype`` argument takes (scikit-learn's estimator checks want plain defaults)
DTYPE_NAMES = {"float32": torch.float32, "float64": torch.float64}


def _check_dtype(dtype) -> torch.dtype:
    """An estimator's ``dtype``: ``"float32"``, ``"float64"`` or the torch dtype."""
    if isinstance(dtype, str):
        if dtype not in DTYPE_NAMES:
            raise TypeError(f"dtype must be 'float32', 'float64', torch.float32 or torch.float64, got {dtype!r}")
        return DTYPE_NAMES[dtype]
    return check_dtype_argument(dtype)


def _check_device(device) -> torch.device:
    if device is None:
        return torch.device("cpu")
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        raise ValueError(f"device must be None, a torch.device or a device string such as 'cpu' or 'cuda:0', got "
                         f"{device!r} ({error})") from None
    try:  # torch's "Torch not compiled with CUDA enabled" (an AssertionError) named no argument
        torch.empty(0, device=device)
    except (RuntimeError, AssertionError) as error:
        raise ValueError(f"device {str(device)!r} is not available here ({error}); pass device=None or 'cpu', or "
                         "a device torch can reach") from None
    return device


def _feature_names(X) -> np.ndarray | None:
    """A DataFrame's column names when they are all strings, ``None`` when none is; names of mixed types (``"a"``
    and ``1``) are refused, as scikit-learn's ``_get_feature_names`` does."""
    columns = getattr(X, "columns", None)
    if columns is None or torch.is_tensor(X):
        return None
    names = np.asarray(list(columns), dtype=object)
    strings = [isinstance(n, str) for n in names]
    if any(strings) and not all(strings):
        types = sorted({type(n).__name__ for n in names})
        raise TypeError(f"X has column names of types {types}; feature names are kept and checked only when all are "
                        "strings: convert them with X.columns = X.columns.astype(str), or make none a string")
    return names if len(names) and all(strings) else None


def check_sample_weight(sample_weight, num_rows: int) -> np.ndarray:
    """A ``score``'s ``sample_weight`` as float64 weights ``(num_rows,)``, ones for ``None``; another shape, NaN or Inf,
    a negative weight or weights that are all 0 (scikit-learn refuses those too) refused."""
    if sample_weight is None:
        return np.ones(num_rows)
    given = sample_weight.detach().cpu() if torch.is_tensor(sample_weight) else sample_weight
    weights = np.asarray(given, dtype=np.float64)
    if weights.shape != (num_rows,):
        raise ValueError(f"sample_weight must have shape ({num_rows},) (one weight per row of X), got {weights.shape}")
    if not np.isfinite(weights).all():  # the score was NaN
        raise ValueError(f"sample_weight must be finite, got {int((~np.isfinite(weights)).sum())} NaN or Inf of "
                         f"{num_rows}, the first at index {int((~np.isfinite(weights)).argmax())}")
    if (weights < 0).any():  # a weighted mean with negative weights is no accuracy or R² (R² of 1.2, say)
        raise ValueError(f"sample_weight must be ≥ 0, got {int((weights < 0).sum())} negative weight(s), the first "
                         f"{weights[(weights < 0).argmax()]:g} at index {int((weights < 0).argmax())}")
    if not weights.any():  # NumPy's "Weights sum to zero, can't be normalized" (a ZeroDivisionError) named none
        raise ValueError(f"sample_weight must hold at least one weight > 0, got {num_rows} zeros: the weighted score "
                         "of no row is undefined")
    return weights


def _same(a, b) -> bool:
    try:
        return bool(a is b or a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def column_scales(x: Tensor, mean: Tensor, name: str) -> Tensor:
    """Standard deviations of the columns of ``x`` (named ``name`` in errors), in its dtype, 1 for columns constant up
    to rounding (and for one row).

    A column is constant when its computed variance is within the rounding error of a variance
    computation, ``n·ε·var + (n·|mean|·ε)²`` (scikit-learn's test): dividing by such a standard deviation
    (rounding noise, or 0) would blow up any other value the column takes at prediction.  As scikit-learn, the
    variance and the test are in float64 (:func:`~rfgp.core.dtypes.factor_dtype`: float64 except on Apple MPS): in
    float32, n·ε ≥ 1 from 2²³ rows on, which made every column of a float32 tensor with 9·10⁶ rows "constant" (neither
    standardised nor normalised), and columns spreading by more than 1.8·10¹⁹ overflowed the variance to Inf, which
    counted as constant too.  A variance beyond float64's range raises.
    """
    if x.shape[0] < 2:
        return torch.ones_like(x[0])
    wide = factor_dtype(x.dtype, x.device)
    n, eps = x.shape[0], torch.finfo(wide).eps
    var = x.to(wide).var(0)
    if not bool(torch.isfinite(var).all()):
        column = int((~torch.isfinite(var)).nonzero()[0, 0])
        raise ValueError(f"{name} (column {column}) spreads too widely for its variance to be computed in {wide} "
                         f"(it overflows; values up to {float(x[:, column].abs().max()):.3g}): rescale that column")
    constant = var <= n * eps * var + (n * eps * mean.to(wide)).square()
    return torch.where(constant, torch.ones_like(var), var.sqrt()).to(x.dtype)


def _refit_among(kernel: gpytorch.kernels.Kernel, x: Tensor) -> None:
    """Refit the data-fitted maps of ``kernel`` on the standardised training inputs ``x``, in place.

    ``rfgp.sketch(kernel, M, method=..., x_sample=X)`` fitted them to the user's inputs ``X``, but the model sees the
    standardised ``x``: Nyström landmarks in raw units gave a silently wrong model (ggplot2::diamonds, 2 400 rows,
    M = 256: test error 0.61 instead of 0.22), and an optimized Maclaurin allocation fitted on ``X`` is another model
    than the one fitted on ``x``.  Landmarks are re-chosen among ``x`` by the same rule and seed (uniform selection
    picks the same rows) and allocations refitted (:func:`~rfgp.models.feature_width.refit_data_fitted_maps`).
    Landmarks given by hand or learned, and a GaussianSketch centre or radius (in the raw units; its truncation order
    was chosen for them), have no rule to repeat and are refused.
    """
    for module in kernel.modules():
        if isinstance(module, NystromKernel) and (module.landmark_method is None or module.learn_landmarks):
            raise ValueError(
                "kernel holds a NystromKernel with landmarks given by hand or learned (learn_landmarks=True), and "
                "standardize=True rescales the inputs those landmarks live among; build it with rfgp.sketch(kernel, "
                "M, method='nystrom', x_sample=X) so that fit re-selects them among the standardised inputs, or pass "
                "standardize=False with inputs and landmarks on the same scale"
            )
        if isinstance(module, GaussianSketchRBFKernel) and (
                module.input_center is not None or module.min_lengthscale is not None):
            raise ValueError(
                "kernel holds a GaussianSketchRBFKernel with a centre or radius (from x_sample=, center= or radius=) "
                "in the units of the raw inputs, and standardize=True rescales the inputs: its truncation order "
                "holds only within that radius of that centre. Build it with order= alone (the Taylor expansion is "
                "then around the origin, the standardised inputs' mean), or pass standardize=False with the inputs "
                "in the units of the centre and radius"
            )
    refit_data_fitted_maps(kernel, x)


def _median_distance(x: Tensor, seed: int, max_points: int = 1000) -> Tensor:
    """Median pairwise distance of (up to ``max_points``) rows: the paper's lengthscale heuristic.

    Pairs of equal rows are left out: on tabular data with repeated values (a binary or ordinal column, 80 % of the
    rows at one level) most distances were 0, the median 0 and the lengthscale its floor 10⁻⁶, where every gradient
    of the marginal likelihood vanishes: the fit stayed there, a lookup table of the training levels predicting the
    mean between them (at x = 1.5 among the levels 0, 1, 2 of y = sin x: 0.21 instead of 1.0).
    """
    if x.shape[0] > max_points:
        gen = torch.Generator().manual_seed(seed)
        x = x[torch.randperm(x.shape[0], generator=gen)[:max_points].to(x.device)]
    distances = torch.pdist(x)
    distances = distances[distances > 0]
    return distances.median().clamp_min(1e-6) if distances.numel() else torch.ones((), dtype=x.dtype)
