"""A scikit-learn estimator: Dirichlet GP classification on top of the GPyTorch pieces.

``DirichletGPClassifier().fit(X, y).predict_proba(X_test)`` builds C Dirichlet-transformed
regressions (Milios et al. 2018; paper 000 App. D.4) sharing one random-feature kernel,
trains the kernel hyperparameters by the exact marginal likelihood, optionally picks α_ε by
validation MNLL, and predicts E[softmax(f)] — everything in O(N·F²) time independent of C
when the kernel is an rfgp feature kernel (see :mod:`rfgp.inference.classification`).
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import numbers
import sys
import warnings
from collections.abc import Sequence
from types import SimpleNamespace

import gpytorch
import numpy as np
import torch
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.validation import check_choice, check_dtype_argument, check_positive_float, check_positive_int
from ..kernels.fourier import FOURIER_METHODS, SketchedRBFKernel
from ..kernels.gaussian_sketch import GaussianSketchRBFKernel
from ..kernels.nystrom import NystromKernel
from ..likelihoods.dirichlet import PROBABILITY_METHODS, DirichletClassificationLikelihood
from ..metrics import mean_negative_log_likelihood
from ..training import OPTIMIZERS, fit_mll
from .classifier_check import class_prior_nll, leave_one_out_nll, warn_degenerate_fit
from .data_scale import shown_lengthscales
from .feature_width import refit_data_fitted_maps, set_num_features
from .regression import ExactGPModel

#: the default kernel's training width when neither width is given, and its prediction width's multiple of it
DEFAULT_TRAIN_NUM_FEATURES = 256
PREDICT_WIDTH_RATIO = 4


@contextlib.contextmanager
def _held_warnings():
    """The warnings raised inside the block, held back (a list of ``warnings.WarningMessage``) for :func:`_replay`;
    replayed at once if the block raises, so that they still explain the error."""
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    except BaseException:
        _replay(caught)
        raise


def _replay(caught) -> None:
    """Issues held warnings again, under the caller's filters, with their original category and location."""
    for message in caught:
        warnings.warn_explicit(message.message, message.category, message.filename, message.lineno,
                               source=message.source)


class DirichletGPClassifier:
    r"""Dirichlet-based GP classifier: ``fit(X, y)``, ``predict_proba(X)``, ``predict(X)``.

    Args:
        kernel: a GPyTorch kernel shared by all classes (not batched, so that Φ is shared);
            default ``ScaleKernel(SketchedRBFKernel(F_train, method))``, re-drawn at F after training, with a
            median-heuristic lengthscale and the outputscale set to the variance of the transformed targets
            (paper 000's settings).  Deep-copied at every fit; with ``standardize`` the maps fitted to a data
            sample are refitted on the standardised training inputs, the inputs the model sees: Nyström landmarks
            (``rfgp.sketch(kernel, M, method="nystrom", x_sample=X)``) re-selected by their rule and seed, optimized
            Maclaurin allocations (``method="maclaurin"``) refitted; hand-given or learned landmarks and a
            GaussianSketch centre or radius (in raw units) are refused.
        num_features, train_num_features: the default kernel's width at prediction (F) and in training (F_train).
            Train small, predict big: the hyperparameters are trained at F_train, where a marginal-likelihood
            evaluation costs O(N·F_train²), then ``fit`` re-draws the features once at F with the same hyperparameters
            and seed (:func:`rfgp.set_num_features`; the draws are those of a kernel built at F with that seed), whose
            smaller Monte-Carlo error of k̂ (∝ F^{−1/2}) serves the predictions.  Neither given: F_train = 256,
            F = 1024.  Only ``num_features`` given: training and prediction at that width.  Only
            ``train_num_features`` given: F = 4·F_train.  Both given: exactly those.  Even numbers (sin/cos pairs).
            Measured (``benchmarks/results/time_to_accuracy_classification_widths.md``; float32, one thread) against
            training at 1024: ggplot2::diamonds (10 000 rows) fitted in 0.13 of the CPU time to a test NLL lower by
            0.010 ± 0.004, dplyr::storms (15 629 rows) in 0.07 of it to one higher by 0.008 ± 0.005, scikit-learn's
            digits in 0.1 of it, 0.003 ± 0.003 lower; ``train_num_features=512`` (F = 2048) was 0.005–0.019 below
            training at 1024 on all three in 0.2–0.38 of its time, at 4× the prediction memory (C·F²).
            With ``kernel`` given its own width is used: ``num_features`` does not apply and ``train_num_features`` is
            refused (build the kernel at the training width and call ``rfgp.set_num_features(clf.model_, F)``).
        method: the Fourier method of the default kernel.
        alpha_epsilon: α_ε, or a sequence of candidates chosen by validation MNLL.
        num_iterations, lr, optimizer: training of the hyperparameters on the negative MLL by
            :func:`rfgp.fit_mll`: at most ``num_iterations`` iterations (0 disables training) of full-batch
            L-BFGS (``"lbfgs"``, the default, stopped by fit_mll's convergence rule) or Adam (``"adam"``);
            ``lr`` is the optimizer's step (``None``: fit_mll's default, 1.0 for L-BFGS, 0.05 for Adam).  L-BFGS is
            the default because it reaches a lower test NLL sooner: on ggplot2::diamonds (cut, 10 000 rows,
            F = 1024, one thread) 50 Adam steps took 72 s of CPU to a test NLL of 0.724, L-BFGS converged after 18
            iterations and 39 s at 0.710 (``benchmarks/results/time_to_accuracy_classification_after.md``).
        learn_additional_noise: learn an extra per-class noise on top of σ²_{c,i} (``True``), or not (``False``).
            ``None`` (the default): without it, and once more with it when the first fit predicts its training labels
            (leave one out) no better than the class prior, keeping the better of the two by that measure and warning
            (:class:`~rfgp.models.DegenerateFitWarning`; ``learn_additional_noise_`` records the choice).  Without it
            the fixed σ²_{c,i} cannot hold the spread of the targets where classes overlap, and the marginal
            likelihood — GPyTorch's exact one too — may prefer a kernel that is white noise (ℓ → 0), where the
            random-feature fit predicted worse than the class prior; with it, some fits that were good without it
            stop at a small lengthscale instead (``benchmarks/results/classifier_degenerate_optimum.md``,
            :mod:`rfgp.models.classifier_check`).  ``α_ε`` validation fits go without it unless it is ``True``.
        validation_fraction: share of the data held out to choose α_ε (then refit on all data).
        probability_method, num_samples: class probabilities by ``"mc"`` (seeded) or ``"mean_field"``.
        standardize: centre and scale every input column with the training statistics; a column that is
            constant in the training data (up to the rounding of its variance) is centred but not scaled
            (scale 1, as scikit-learn's ``StandardScaler``), so that a value it takes only at prediction
            (a category absent from the training data) stays on the data's scale.
        dtype, device: of the model; inputs are converted.
        seed: seeds the random features, the validation split and the Monte-Carlo draws.
        progress: tqdm progress bar during training (``None``: only on a terminal).

    It follows scikit-learn's estimator contract without depending on scikit-learn: ``get_params``/``set_params``
    (so ``clone``, ``Pipeline``, ``GridSearchCV`` and ``cross_val_score`` with stratified folds work), ``score``
    (accuracy), arguments stored as given and checked by ``fit``, prediction before ``fit`` raises a
    ``NotFittedError``, a float target with fractional values is refused as continuous.

    Attributes (after ``fit``):
        ``classes_``: the sorted class labels; ``n_features_in_``; ``feature_names_in_`` (a DataFrame's string
        column names, checked at prediction); ``model_``/``likelihood_``: the fitted GPyTorch objects;
        ``alpha_epsilon_``: the α_ε used; ``validation_mnll_``: {α_ε: MNLL} when several were tried;
        ``train_num_features_``, ``num_features_``: the default kernel's training and prediction widths (``None``
        with a given kernel);
        ``losses_``: training losses;
        ``leave_one_out_nll_``, ``class_prior_nll_``: the kept fit's mean leave-one-out negative log likelihood of
        the training labels (at the training width; ``None`` for a kernel without a feature root, which is not
        checked) and that of the class frequencies; ``learn_additional_noise_``: whether the kept fit has the extra
        noise.

    Example:
        >>> g = torch.Generator().manual_seed(0)
        >>> X = torch.randn(150, 2, generator=g)
        >>> y = (X[:, 0] > 0).long() + (X[:, 1] > 1).long()                # three classes
        >>> clf = DirichletGPClassifier(num_features=256, alpha_epsilon=[0.001, 0.01, 0.1], num_iterations=10)
        >>> clf.fit(X[:100], y[:100]).predict(X[100:]).shape           # a NumPy array of labels
        (50,)
    """

    def __init__(
        self,
        kernel: gpytorch.kernels.Kernel | None = None,
        num_features: int | None = None,
        train_num_features: int | None = None,
        method: str = "rff",
        alpha_epsilon: float | Sequence[float] = 0.01,
        num_iterations: int = 50,
        lr: float | None = None,
        optimizer: str = "lbfgs",
        learn_additional_noise: bool | None = None,
        validation_fraction: float = 0.2,
        probability_method: str = "mc",
        num_samples: int = 1000,
        standardize: bool = True,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        seed: int = 0,
        progress: bool | None = None,
    ) -> None:
        # scikit-learn's estimator contract: the arguments are stored as given (``clone`` and
        # ``get_params`` hand back these very objects) and checked by ``fit``, which also sees
        # values changed by ``set_params``.
        self.kernel = kernel
        self.num_features = num_features
        self.train_num_features = train_num_features
        self.method = method
        self.alpha_epsilon = alpha_epsilon
        self.num_iterations = num_iterations
        self.lr = lr
        self.optimizer = optimizer
        self.learn_additional_noise = learn_additional_noise
        self.validation_fraction = validation_fraction
        self.probability_method = probability_method
        self.num_samples = num_samples
        self.standardize = standardize
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.progress = progress

    # ----- scikit-learn estimator protocol ------------------------------------------------
    _estimator_type = "classifier"  # scikit-learn < 1.6 reads this; newer versions read __sklearn_tags__

    @classmethod
    def _get_param_names(cls) -> list[str]:
        return [name for name in inspect.signature(cls.__init__).parameters if name != "self"]

    def get_params(self, deep: bool = True) -> dict:
        """The constructor arguments as stored (scikit-learn's ``get_params``; ``clone`` rebuilds from them)."""
        return {name: getattr(self, name) for name in self._get_param_names()}

    def set_params(self, **params) -> "DirichletGPClassifier":
        """Set constructor arguments (checked at the next ``fit``), as scikit-learn's ``set_params``."""
        valid = self._get_param_names()
        for name, value in params.items():
            if name not in valid:
                raise ValueError(f"invalid parameter {name!r} for DirichletGPClassifier; accepted: {', '.join(valid)}")
            setattr(self, name, value)
        return self

    def __sklearn_tags__(self):
        # only scikit-learn calls this, so scikit-learn is installed; rfgp itself does not depend on it
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier", target_tags=TargetTags(required=True), classifier_tags=ClassifierTags()
        )

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy of ``predict(X)`` against ``y`` (scikit-learn's classifier score), weighted if given."""
        correct = np.asarray(self.predict(X) == np.asarray(y), dtype=np.float64)
        return float(np.average(correct, weights=sample_weight))

    def __repr__(self) -> str:
        defaults = {name: p.default for name, p in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items() if not _same(v, defaults.get(k))]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _check_params(self) -> SimpleNamespace:
        """The constructor arguments, checked: they drive this fit and the predictions after it (``_fit_params``)."""
        if self.kernel is not None and not isinstance(self.kernel, gpytorch.kernels.Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel or None, got {type(self.kernel).__name__}")
        train_width, predict_width = self._check_widths()
        check_choice(self.method, "method", tuple(FOURIER_METHODS))
        iterations = self.num_iterations
        if isinstance(iterations, bool) or not isinstance(iterations, numbers.Integral) or iterations < 0:
            raise ValueError(f"num_iterations must be an integer ≥ 0, got {iterations!r}")
        if self.lr is not None:
            check_positive_float(self.lr, "lr")
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        if check_positive_float(self.validation_fraction, "validation_fraction") >= 1:
            raise ValueError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction}")
        check_choice(self.probability_method, "probability_method", PROBABILITY_METHODS)
        check_positive_int(self.num_samples, "num_samples")
        dtype = check_dtype_argument(self.dtype)
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise TypeError(f"seed must be an integer, got {self.seed!r}")
        return SimpleNamespace(
            kernel=self.kernel, train_num_features=train_width, num_features=predict_width, method=self.method,
            alpha_candidates=_check_alphas(self.alpha_epsilon), num_iterations=int(iterations),
            lr=None if self.lr is None else float(self.lr), optimizer=self.optimizer,
            learn_additional_noise=_check_optional_bool(self.learn_additional_noise, "learn_additional_noise"),
            validation_fraction=float(self.validation_fraction),
            probability_method=self.probability_method, num_samples=int(self.num_samples),
            standardize=bool(self.standardize), dtype=dtype,
            device=torch.device(self.device) if self.device is not None else torch.device("cpu"),
            seed=int(self.seed), progress=self.progress,
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
                    "rfgp.set_num_features(clf.model_, F) after fit, or pass train_num_features=None"
                )
            return None, None
        for name, value in (("train_num_features", train), ("num_features", predict)):
            if value is not None and value % 2:
                raise ValueError(f"{name} must be even for the default kernel's sin/cos features (F = 2m), got {value}")
        if train is None:
            train = DEFAULT_TRAIN_NUM_FEATURES if predict is None else predict
        return train, PREDICT_WIDTH_RATIO * train if predict is None else predict

    # ----- fitting ------------------------------------------------------------------------
    @in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
    def fit(self, X, y) -> "DirichletGPClassifier":
        """Fit on inputs ``X`` (N, d) and class labels ``y`` (N,) (any sortable label values).

        A pandas DataFrame's string column names are kept as ``feature_names_in_`` and checked at prediction.
        """
        self._fit_params = p = self._check_params()
        self.n_features_in_ = None  # a new fit forgets the previous one's columns before reading X
        self.feature_names_in_ = None
        names = _feature_names(X)
        x = self._as_inputs(X, "X")
        self.n_features_in_ = x.shape[-1]
        self.feature_names_in_ = names
        if self.feature_names_in_ is None:
            del self.feature_names_in_
        labels_np = _check_labels(y, x.shape[0])
        self.classes_, encoded = np.unique(labels_np, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y must contain at least two classes, got 1 class: {self.classes_.tolist()}")
        labels = torch.as_tensor(encoded.reshape(-1), dtype=torch.long, device=p.device)
        if p.standardize:
            self.input_mean_ = x.mean(0)
            self.input_scale_ = _column_scales(x, self.input_mean_)
            x = (x - self.input_mean_) / self.input_scale_
        self.validation_mnll_ = {}
        if len(p.alpha_candidates) > 1:
            self.validation_mnll_ = self._validate_alphas(x, labels)
            self.alpha_epsilon_ = min(self.validation_mnll_, key=self.validation_mnll_.get)
        else:
            self.alpha_epsilon_ = p.alpha_candidates[0]
        self.model_, self.losses_ = self._fit_checked(x, labels)
        self.likelihood_ = self.model_.likelihood
        self.train_num_features_, self.num_features_ = p.train_num_features, p.num_features
        return self

    def _validate_alphas(self, x: Tensor, labels: Tensor) -> dict[float, float]:
        p = self._fit_params
        gen = torch.Generator().manual_seed(p.seed)
        order = torch.randperm(x.shape[0], generator=gen).to(p.device)
        num_val = max(1, int(round(p.validation_fraction * x.shape[0])))
        val, train = order[:num_val], order[num_val:]
        scores = {}
        for alpha in p.alpha_candidates:
            model, _, _ = self._fit_model(x[train], labels[train], alpha, bool(p.learn_additional_noise),
                                          check=False)
            probs = self._probabilities(model, x[val])
            scores[alpha] = mean_negative_log_likelihood(probs, labels[val]).item()
        return scores

    def _fit_checked(self, x: Tensor, labels: Tensor):
        """The final fit, checked by its leave-one-out NLL against the class prior's (:mod:`.classifier_check`).

        ``learn_additional_noise=None``: without the extra noise, and once more with it when that fit is no better
        than the class prior; the fit with the lower leave-one-out NLL is kept, and ``fit`` warns either way.
        """
        p = self._fit_params
        self.class_prior_nll_ = float(class_prior_nll(labels, len(self.classes_)))
        extra = bool(p.learn_additional_noise)
        with _held_warnings() as kept_warnings:  # shown for the fit that is kept, not for one discarded
            model, losses, loo = self._fit_model(x, labels, self.alpha_epsilon_, extra)
        first_loo, first_lengthscales = loo, _lengthscales(model)
        trained = p.num_iterations > 0
        degenerate = trained and loo is not None and loo >= self.class_prior_nll_
        other = None  # (leave-one-out NLL, lengthscales) of the fit with the extra noise, when the default made one
        if degenerate and p.learn_additional_noise is None:
            with _held_warnings() as refit_warnings:
                refit, refit_losses, refit_loo = self._fit_model(x, labels, self.alpha_epsilon_, True)
            other = (refit_loo, _lengthscales(refit))
            if refit_loo < loo:
                model, losses, loo, extra = refit, refit_losses, refit_loo, True
                kept_warnings = refit_warnings
        _replay(kept_warnings)
        self.learn_additional_noise_, self.leave_one_out_nll_ = extra, loo
        if degenerate:
            warn_degenerate_fit(first_loo, self.class_prior_nll_, first_lengthscales, other,
                                bool(p.learn_additional_noise))
        return model, losses

    def _fit_model(self, x: Tensor, labels: Tensor, alpha: float, extra_noise: bool, check: bool = True):
        """(model, losses, leave-one-out NLL at the training width, or ``None`` where not ``check``ed or not
        available), the model re-drawn for prediction."""
        p = self._fit_params
        num_classes = len(self.classes_)
        likelihood = DirichletClassificationLikelihood(
            labels, num_classes=num_classes, alpha_epsilon=alpha,
            learn_additional_noise=extra_noise, dtype=p.dtype,
        )
        targets = likelihood.transformed_targets.to(p.device)
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
        kernel = self._new_kernel(x, targets)
        model = ExactGPModel(x, targets, likelihood, kernel, mean).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            mean.constant.copy_(targets.mean(-1))
        losses = []
        if p.num_iterations > 0:
            losses = fit_mll(model, p.num_iterations, p.lr, p.progress, description="Dirichlet GP",
                             optimizer=p.optimizer)
        loo = leave_one_out_nll(model) if check else None
        if p.num_features != p.train_num_features:  # train small, predict big: same hyperparameters and seed
            set_num_features(model, p.num_features)
        model.eval()
        likelihood.eval()
        return model, losses, None if loo is None else float(loo)

    def _new_kernel(self, x: Tensor, targets: Tensor) -> gpytorch.kernels.Kernel:
        p = self._fit_params
        if p.kernel is not None:
            kernel = copy.deepcopy(p.kernel)
            if p.standardize:
                _refit_among(kernel, x)
            return kernel
        base = SketchedRBFKernel(p.train_num_features, method=p.method, input_dim=x.shape[-1], seed=p.seed)
        kernel = gpytorch.kernels.ScaleKernel(base).to(device=p.device, dtype=p.dtype)
        with torch.no_grad():
            base.lengthscale = _median_distance(x, p.seed)
            kernel.outputscale = (targets - targets.mean(-1, keepdim=True)).var().clamp_min(1e-3)
        return kernel

    # ----- prediction ---------------------------------------------------------------------
    def predict_proba(self, X, batch_size: int = 4096):
        """Class probabilities ``(M, C)`` in the order of ``classes_`` (a tensor for tensor input)."""
        x = self._test_inputs(X)
        batch_size = check_positive_int(batch_size, "batch_size")
        probs = torch.cat([self._probabilities(self.model_, chunk) for chunk in x.split(batch_size)])
        return probs if torch.is_tensor(X) else probs.cpu().numpy()

    def predict(self, X):
        """Most probable class label per row of ``X``."""
        probs = self.predict_proba(X)
        index = probs.argmax(-1)
        if torch.is_tensor(index):
            index = index.cpu().numpy()
        return self.classes_[index]

    def latent_posterior(self, X) -> gpytorch.distributions.MultivariateNormal:
        """The C latent posteriors f_c at ``X`` (batch ``(C,)``): what the probabilities integrate over."""
        x = self._test_inputs(X)
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            return self.model_(x)

    def _probabilities(self, model, x: Tensor) -> Tensor:
        p = self._fit_params
        # GPyTorch warns when eval-mode inputs equal the training inputs ("did you forget model.train()?");
        # predicting at the training points (training accuracy) is deliberate here
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", gpytorch.utils.warnings.GPInputWarning)
            posterior = model(x)
            return model.likelihood.predict_proba(
                posterior, method=p.probability_method, num_samples=p.num_samples, seed=p.seed
            )

    def _test_inputs(self, X) -> Tensor:
        """Checked, standardised prediction inputs: fitted, same columns (and column names) as in ``fit``."""
        self._check_fitted()
        names = _feature_names(X)
        fitted_names = getattr(self, "feature_names_in_", None)
        if fitted_names is not None and names is not None and not np.array_equal(names, fitted_names):
            raise ValueError(
                f"X has the columns {names.tolist()}, but the classifier was fitted on {fitted_names.tolist()}"
                " (same names in the same order are required)"
            )
        if (fitted_names is None) != (names is None):
            warnings.warn(
                f"X {'has' if names is not None else 'does not have'} feature names, but the classifier was fitted "
                f"{'without' if fitted_names is None else 'with'} them: columns are matched by position",
                UserWarning, stacklevel=3,
            )
        x = self._as_inputs(X, "X")
        if self._fit_params.standardize:
            x = (x - self.input_mean_) / self.input_scale_
        return x

    def _as_inputs(self, X, name: str) -> Tensor:
        p = self._fit_params
        if hasattr(X, "toarray") or hasattr(X, "tocsr"):
            raise TypeError(f"{name} is a sparse matrix; sparse input is not supported: pass {name}.toarray()")
        if torch.is_tensor(X):
            x = X.detach()
        else:
            # a copy: DataFrames give read-only or negatively strided views, which torch refuses
            array = np.array(X, copy=True)
            if np.iscomplexobj(array):  # float64 conversion would silently drop the imaginary part
                raise ValueError(f"Complex data not supported: {name} has {array.dtype} values; real inputs required")
            x = torch.as_tensor(array.astype(np.float64))
        if x.is_complex():
            raise ValueError(f"Complex data not supported: {name} has {x.dtype} values; real inputs required")
        if x.dim() != 2:
            raise ValueError(
                f"{name} must be a 2-D array (n_samples, n_features), got shape {tuple(x.shape)}. Reshape your data"
                f" with {name}.reshape(-1, 1) for a single feature or {name}.reshape(1, -1) for a single sample"
            )
        for axis, what in enumerate(("sample", "feature")):
            if x.shape[axis] == 0:
                raise ValueError(f"{name} has 0 {what}(s) (shape={tuple(x.shape)}) while a minimum of 1 is required.")
        x = x.to(device=p.device, dtype=p.dtype)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or Inf entries")
        if self.n_features_in_ is not None and x.shape[-1] != self.n_features_in_:
            raise ValueError(
                f"{name} has {x.shape[-1]} features, but DirichletGPClassifier is expecting {self.n_features_in_}"
                " features as input (the number of columns it was fitted on)"
            )
        return x

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise _not_fitted_error()("this DirichletGPClassifier is not fitted yet; call fit(X, y) first")


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


def _check_labels(y, num_rows: int) -> np.ndarray:
    """Class labels ``y`` as a 1-D array, one per row of X; real values that are not integers are refused.

    Any sortable values are labels (strings, integers, integral floats such as 1.0 and 3.0), but a float
    target with fractional values is a regression target ("continuous", scikit-learn's word): taking
    each distinct value as a class would silently fit N classes.
    """
    if y is None:
        raise ValueError("DirichletGPClassifier requires y to be passed, but the target y is None")
    labels = np.asarray(y.cpu() if torch.is_tensor(y) else y)
    if labels.ndim != 1 or labels.shape[0] != num_rows:
        raise ValueError(
            f"y should be a 1d array with {num_rows} labels (one per row of X), got shape {labels.shape}"
            + ("; pass y.ravel() for a column vector" if labels.shape == (num_rows, 1) else "")
        )
    if np.iscomplexobj(labels):
        raise ValueError(f"Unknown label type: y has complex values ({labels.dtype})")
    if labels.dtype.kind == "f" and not bool(np.all(np.isfinite(labels) & (labels == np.round(labels)))):
        raise ValueError(
            "Unknown label type: continuous. y has non-integer (or non-finite) float values, which are a regression"
            " target, not class labels; pass integer or string labels"
        )
    return labels


def _feature_names(X) -> np.ndarray | None:
    """A DataFrame's column names when they are all strings (scikit-learn's rule), else ``None``."""
    columns = getattr(X, "columns", None)
    if columns is None or torch.is_tensor(X):
        return None
    names = np.asarray(list(columns), dtype=object)
    return names if len(names) and all(isinstance(n, str) for n in names) else None


def _same(a, b) -> bool:
    try:
        return bool(a is b or a == b)
    except (TypeError, ValueError, RuntimeError):
        return False


def _column_scales(x: Tensor, mean: Tensor) -> Tensor:
    """Standard deviations of the columns of ``x``, 1 for columns constant up to rounding (and for one row).

    A column is constant when its computed variance is within the rounding error of a variance
    computation, n·ε·var + (n·|mean|·ε)² (scikit-learn's test): dividing by such a standard deviation
    (rounding noise, or 0) would blow up any other value the column takes at prediction.
    """
    if x.shape[0] < 2:
        return torch.ones_like(x[0])
    n, eps = x.shape[0], torch.finfo(x.dtype).eps
    var = x.var(0)
    constant = var <= n * eps * var + (n * eps * mean).square()
    return torch.where(constant, torch.ones_like(var), var.sqrt())


def _check_optional_bool(value, name: str) -> bool | None:
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True, False or None, got {value!r}")
    return None if value is None else bool(value)


def _lengthscales(model: ExactGPModel) -> str:
    """The first lengthscale module's values (at most 4), for messages."""
    for module in model.covar_module.modules():
        if getattr(module, "has_lengthscale", False):
            return shown_lengthscales(module)
    return "none"


def _check_alphas(alpha_epsilon) -> tuple[float, ...]:
    several = isinstance(alpha_epsilon, Sequence) and not isinstance(alpha_epsilon, str)
    values = alpha_epsilon if several else [alpha_epsilon]
    if len(values) == 0:
        raise ValueError("alpha_epsilon must be a positive number or a non-empty sequence of them, got []")
    return tuple(check_positive_float(v, "alpha_epsilon") for v in values)


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
    """Median pairwise distance of (up to ``max_points``) rows: the paper's lengthscale heuristic."""
    if x.shape[0] > max_points:
        gen = torch.Generator().manual_seed(seed)
        x = x[torch.randperm(x.shape[0], generator=gen)[:max_points].to(x.device)]
    distances = torch.pdist(x)
    return distances.median().clamp_min(1e-6) if distances.numel() else torch.ones((), dtype=x.dtype)
