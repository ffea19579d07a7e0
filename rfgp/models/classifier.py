"""A scikit-learn estimator: Dirichlet GP classification on top of the GPyTorch pieces.

``DirichletGPClassifier().fit(X, y).predict_proba(X_test)`` builds C Dirichlet-transformed
regressions (Milios et al. 2018; paper 000 App. D.4) sharing one random-feature kernel,
trains the kernel hyperparameters by the exact marginal likelihood, optionally picks α_ε by
validation MNLL, and predicts E[softmax(f)] — everything in O(N·F²) time independent of C
when the kernel is an rfgp feature kernel (see :mod:`rfgp.inference.classification`).
"""

from __future__ import annotations

import numbers
import sys
from collections.abc import Sequence
from types import SimpleNamespace

import gpytorch
import numpy as np
import torch
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.user_warnings import held_warnings, replay_warnings
from ..core.validation import check_choice, check_positive_float, check_positive_int
from ..likelihoods.dirichlet import PROBABILITY_METHODS, DirichletClassificationLikelihood
from ..metrics import mean_negative_log_likelihood
from .classifier_check import class_prior_nll, leave_one_out_nll, warn_degenerate_fit
from .classifier_temperature import leave_one_out_temperature
from .data_scale import shown_lengthscales
from .estimator import RandomFeatureEstimator, check_sample_weight, predicting, refuse_sparse
from .feature_width import set_num_features
from .regression import ExactGPModel


class DirichletGPClassifier(RandomFeatureEstimator):
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
            With ``kernel`` given its own width is used: ``num_features`` and ``train_num_features`` are refused
            (build the kernel at the training width and call ``rfgp.set_num_features(clf.model_, F)``).
        method: the Fourier method of the default kernel.
        alpha_epsilon: α_ε, or a sequence (or 1-D array) of candidates chosen by validation MNLL.
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
        temperature: T > 0 of the class probabilities E[softmax(f/T)] (1, the default, is the paper's Dirichlet GP),
            or ``"loo"``: T in [0.1, 10] minimising the leave-one-out NLL of the training labels under the fitted
            model, by the same probability integration (:mod:`rfgp.models.classifier_temperature`; about 20
            evaluations of the N training points' class probabilities, after the fit).  A post-hoc calibration:
            it leaves the latent posterior and the hyperparameters alone, and ``alpha_epsilon`` candidates are
            compared at T = 1.  Measured (``benchmarks/results/classifier_calibration.md``, 5 seeded 70/30 splits):
            the test NLL fell on digits (0.143 → 0.075; ECE 0.079 → 0.016), wine, iris, MASS::Pima (0.584 → 0.465)
            and ISLR::Default at the same accuracy, and rose on breast_cancer (0.102 → 0.116, on 4 of the 5 splits),
            hence not the default.
            Needs a kernel with random features (an exact GPyTorch kernel is refused).
        standardize: centre and scale every input column with the training statistics; a column that is
            constant in the training data (up to the rounding of its variance) is centred but not scaled
            (scale 1, as scikit-learn's ``StandardScaler``), so that a value it takes only at prediction
            (a category absent from the training data) stays on the data's scale.
        dtype, device: of the model (dtype ``"float32"``, the default, ``"float64"`` or the torch dtype); inputs are
            converted.
        seed: seeds the random features, the validation split and the Monte-Carlo draws.
        progress: tqdm progress bar during training (``None``: only on a terminal).
        n_restarts_optimizer: train every fit (each α_ε candidate's, the extra-noise refit) that many more times from
            random lengthscales drawn from ``seed`` (:func:`~rfgp.models.random_start.draw_random_start`; the noise
            is fixed by α_ε) and keep the lowest final loss, as scikit-learn's argument of that name; a start that
            fails is skipped with a ``NumericalWarning``.

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
        ``losses_``: training losses; ``temperature_``: the T used (also the likelihood's
        :attr:`~rfgp.likelihoods.DirichletClassificationLikelihood.temperature`, saved in its ``state_dict``);
        ``temperature_nll_``: {T: leave-one-out NLL} of the temperatures tried (``{}`` for a given T);
        ``leave_one_out_nll_``, ``class_prior_nll_``: the kept fit's mean leave-one-out negative log likelihood of
        the training labels (at the training width; ``None`` for a kernel without a feature root, which is not
        checked) and that of the class frequencies; ``learn_additional_noise_``: whether the kept fit has the extra
        noise; ``restart_losses_``: the kept fit's final training loss from each start, the default one first (NaN
        for a start that failed; ``[]`` untrained); ``kernel_``: the fitted kernel.

    Example:
        >>> import torch
        >>> from rfgp.models import DirichletGPClassifier
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
        temperature: float | str = 1.0,
        standardize: bool = True,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        seed: int = 0,
        progress: bool | None = None,
        n_restarts_optimizer: int = 0,
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
        self.temperature = temperature
        self.standardize = standardize
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.progress = progress
        self.n_restarts_optimizer = n_restarts_optimizer

    # ----- scikit-learn estimator protocol ------------------------------------------------
    _estimator_type = "classifier"  # scikit-learn < 1.6 reads this; newer versions read __sklearn_tags__
    _noun = "classifier"

    def __sklearn_tags__(self):
        # only scikit-learn calls this, so scikit-learn is installed; rfgp itself does not depend on it
        from sklearn.utils import ClassifierTags, Tags, TargetTags

        return Tags(
            estimator_type="classifier", target_tags=TargetTags(required=True), classifier_tags=ClassifierTags()
        )

    def score(self, X, y, sample_weight=None) -> float:
        """Mean accuracy of ``predict(X)`` against the labels ``y`` (scikit-learn's classifier score), weighted if
        given; ``y`` is checked as in ``fit`` (one label per row of ``X``)."""
        predicted = self.predict(X)
        truth = _check_labels(y, predicted.shape[0])
        if _holds_text(truth) != _holds_text(self.classes_):  # "1" never equals 1: every row counted as wrong
            kinds = ("strings", "numbers") if _holds_text(truth) else ("numbers", "strings")
            raise ValueError(f"y holds {kinds[0]}, but the classifier was fitted on {kinds[1]} "
                             f"(classes_ {self.classes_[:5].tolist()}); pass labels of the type fitted on")
        correct = np.asarray(predicted == truth, dtype=np.float64)
        return float(np.average(correct, weights=check_sample_weight(sample_weight, truth.shape[0])))

    def _check_params(self) -> SimpleNamespace:
        """The constructor arguments, checked: they drive this fit and the predictions after it (``_fit_params``)."""
        common = self._check_common_params()
        if not isinstance(self.standardize, (bool, np.bool_)):  # bool("no") and the regressor's "auto" were True
            raise TypeError(f"standardize must be True or False, got {self.standardize!r}")
        if check_positive_float(self.validation_fraction, "validation_fraction") >= 1:
            raise ValueError(f"validation_fraction must lie in (0, 1), got {self.validation_fraction}")
        check_choice(self.probability_method, "probability_method", PROBABILITY_METHODS)
        check_positive_int(self.num_samples, "num_samples")
        return SimpleNamespace(
            **common, alpha_candidates=_check_alphas(self.alpha_epsilon),
            learn_additional_noise=_check_optional_bool(self.learn_additional_noise, "learn_additional_noise"),
            validation_fraction=float(self.validation_fraction),
            probability_method=self.probability_method, num_samples=int(self.num_samples),
            temperature=_check_temperature(self.temperature),
        )

    # ----- fitting ------------------------------------------------------------------------
    @in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
    def fit(self, X, y) -> "DirichletGPClassifier":
        """Fit on inputs ``X`` (N, d) and class labels ``y`` (N,) (any sortable label values).

        A pandas DataFrame's string column names are kept as ``feature_names_in_`` and checked at prediction.
        """
        self._fit_params = p = self._check_params()
        x = self._training_inputs(X)
        labels_np = _check_labels(y, x.shape[0])
        self.classes_, encoded = np.unique(labels_np, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y must contain at least two classes, got 1 class: {self.classes_.tolist()}")
        labels = torch.as_tensor(encoded.reshape(-1), dtype=torch.long, device=p.device)
        x = self._standardised(x)
        self.validation_mnll_ = {}
        if len(p.alpha_candidates) > 1:
            self.validation_mnll_ = self._validate_alphas(x, labels)
            self.alpha_epsilon_ = min(self.validation_mnll_, key=self.validation_mnll_.get)
        else:
            self.alpha_epsilon_ = p.alpha_candidates[0]
        model, losses = self._fit_checked(x, labels)
        self.temperature_, self.temperature_nll_ = p.temperature, {}
        if p.temperature == "loo":  # before model_ is set: a fit that raises here is not fitted
            self.temperature_, self.temperature_nll_ = leave_one_out_temperature(
                model, p.probability_method, p.num_samples, p.seed)
        model.likelihood.temperature = self.temperature_
        self.model_, self.losses_, self.likelihood_ = model, losses, model.likelihood
        self.train_num_features_, self.num_features_ = p.train_num_features, p.num_features
        return self

    def _validate_alphas(self, x: Tensor, labels: Tensor) -> dict[float, float]:
        p = self._fit_params
        gen = torch.Generator().manual_seed(p.seed)
        order = torch.randperm(x.shape[0], generator=gen).to(p.device)
        num_val = max(1, int(round(p.validation_fraction * x.shape[0])))
        if num_val >= x.shape[0]:  # the fits on no point raised about an empty "targets" tensor
            raise ValueError(
                f"validation_fraction={p.validation_fraction} holds out {num_val} of the {x.shape[0]} training points "
                f"to choose among the alpha_epsilon candidates {list(p.alpha_candidates)}, which leaves none to fit "
                "on: lower validation_fraction, or pass a single alpha_epsilon"
            )
        val, train = order[:num_val], order[num_val:]
        scores = {}
        for alpha in p.alpha_candidates:
            model, *_ = self._fit_model(x[train], labels[train], alpha, bool(p.learn_additional_noise), check=False)
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
        with held_warnings() as kept_warnings:  # shown for the fit that is kept, not for one discarded
            model, losses, loo, starts = self._fit_model(x, labels, self.alpha_epsilon_, extra)
        first_loo, first_lengthscales = loo, _lengthscales(model)
        trained = p.num_iterations > 0
        degenerate = trained and loo is not None and loo >= self.class_prior_nll_
        other = None  # (leave-one-out NLL, lengthscales) of the fit with the extra noise, when the default made one
        if degenerate and p.learn_additional_noise is None:
            with held_warnings() as refit_warnings:
                refit, refit_losses, refit_loo, refit_starts = self._fit_model(x, labels, self.alpha_epsilon_, True)
            other = (refit_loo, _lengthscales(refit))
            if refit_loo < loo:
                model, losses, loo, starts, extra = refit, refit_losses, refit_loo, refit_starts, True
                kept_warnings = refit_warnings
        replay_warnings(kept_warnings)
        self.learn_additional_noise_, self.leave_one_out_nll_, self.restart_losses_ = extra, loo, starts
        if degenerate:
            warn_degenerate_fit(first_loo, self.class_prior_nll_, first_lengthscales, other,
                                bool(p.learn_additional_noise))
        return model, losses

    def _fit_model(self, x: Tensor, labels: Tensor, alpha: float, extra_noise: bool, check: bool = True):
        """(model, losses, leave-one-out NLL at the training width, or ``None`` where not ``check``ed or not
        available, the final losses from every start), the model trained from the best of ``n_restarts_optimizer``
        + 1 starts and re-drawn for prediction."""
        p = self._fit_params
        model, losses, starts = self._best_of_starts(lambda start: self._trained_model(
            x, *self._dirichlet_targets(labels, alpha, extra_noise), start, "Dirichlet GP"))
        loo = leave_one_out_nll(model) if check else None
        if p.num_features != p.train_num_features:  # train small, predict big: same hyperparameters and seed
            set_num_features(model, p.num_features)
        model.eval()
        model.likelihood.eval()
        return model, losses, None if loo is None else float(loo), starts

    def _dirichlet_targets(self, labels: Tensor, alpha: float, extra_noise: bool):
        """(the C transformed targets ``(C, N)``, their ``DirichletClassificationLikelihood``) of ``labels`` at α_ε =
        ``alpha``; the noise is fixed by α_ε, so a restart draws the lengthscales alone."""
        p = self._fit_params
        likelihood = DirichletClassificationLikelihood(
            labels, num_classes=len(self.classes_), alpha_epsilon=alpha, learn_additional_noise=extra_noise,
            dtype=p.dtype,
        )
        return likelihood.transformed_targets.to(p.device), likelihood

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
        with predicting():
            return self.model_(x)

    def _probabilities(self, model, x: Tensor) -> Tensor:
        p = self._fit_params
        with predicting():
            posterior = model(x)
            return model.likelihood.predict_proba(
                posterior, method=p.probability_method, num_samples=p.num_samples, seed=p.seed
            )

def _check_labels(y, num_rows: int) -> np.ndarray:
    """Class labels ``y`` as a 1-D array, one per row of X; real values that are not integers are refused.

    Any sortable values are labels (strings, integers, integral floats such as 1.0 and 3.0), but a float
    target with fractional values is a regression target ("continuous", scikit-learn's word): taking
    each distinct value as a class would silently fit N classes.
    """
    if y is None:
        raise ValueError("DirichletGPClassifier requires y to be passed, but the target y is None")
    refuse_sparse(y, "y")
    labels = np.asarray(y.cpu() if torch.is_tensor(y) else y)
    if labels.ndim != 1 or labels.shape[0] != num_rows:
        raise ValueError(
            f"y should be a 1d array with {num_rows} labels (one per row of X), got shape {labels.shape}"
            + ("; pass y.ravel() for a column vector" if labels.shape == (num_rows, 1) else "")
        )
    if np.iscomplexobj(labels):
        raise ValueError(f"Unknown label type: y has complex values ({labels.dtype})")
    missing = _missing(labels)
    if missing.any():
        raise ValueError(f"y has {int(missing.sum())} missing label(s) (NaN, None or pd.NA) of {num_rows}, the first "
                         f"at index {int(missing.argmax())}; drop those rows")
    if labels.dtype.kind in "UO":  # NumPy turns [1, "a"] into the strings "1", "a": predict gave "1" for 1
        values = np.asarray(y, dtype=object).reshape(-1)
        text = np.fromiter((isinstance(v, str) for v in values), dtype=bool, count=values.size)
        if text.any() and not text.all():
            raise ValueError(
                "Mix of label input types (string and number): y holds strings such as "
                f"{str(values[text.argmax()])!r} and other values such as {values[(~text).argmax()]!r}; pass labels of "
                "one type (e.g. y.astype(str))"
            )
    values = labels
    if labels.dtype.kind == "O" and all(isinstance(v, numbers.Real) for v in labels):
        values = labels.astype(np.float64)  # numbers in an object array (a pandas object column) were not checked
    if values.dtype.kind == "f" and not bool(np.all(np.isfinite(values) & (values == np.round(values)))):
        raise ValueError(
            "Unknown label type: continuous. y has non-integer (or non-finite) float values, which are a regression"
            " target, not class labels; pass integer or string labels"
        )
    return labels


def _holds_text(labels: np.ndarray) -> bool:
    """Whether checked labels (:func:`_check_labels`: not of mixed types) are strings."""
    return labels.dtype.kind == "U" or labels.dtype.kind == "O" and isinstance(labels.reshape(-1)[0], str)


def _missing(labels: np.ndarray) -> np.ndarray:
    """Which labels are missing: NaN, ``None`` or, when pandas is in use, ``pd.NA`` (error check, on the host)."""
    pandas = sys.modules.get("pandas")  # pd.NA implies pandas imported; rfgp does not import it itself
    if pandas is not None:
        return np.asarray(pandas.isna(labels), dtype=bool)
    if labels.dtype.kind == "f":
        return np.isnan(labels)
    if labels.dtype.kind == "O":
        return np.array([v is None or (isinstance(v, float) and v != v) for v in labels], dtype=bool)
    return np.zeros(labels.shape, dtype=bool)


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


def _check_temperature(temperature) -> float | str:
    if isinstance(temperature, str):
        if temperature != "loo":
            raise ValueError(f"temperature must be a number > 0 or 'loo' (chosen by leave-one-out NLL), "
                             f"got {temperature!r}")
        return temperature
    if isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
        raise TypeError(f"temperature must be a number > 0 or 'loo', got {temperature!r}")
    return check_positive_float(temperature, "temperature")


def _check_alphas(alpha_epsilon) -> tuple[float, ...]:
    several = (isinstance(alpha_epsilon, Sequence) and not isinstance(alpha_epsilon, str)
               or isinstance(alpha_epsilon, np.ndarray) and alpha_epsilon.ndim == 1)  # np.logspace(-3, -1, 3)
    values = alpha_epsilon if several else [alpha_epsilon]
    if len(values) == 0:
        raise ValueError("alpha_epsilon must be a positive number or a non-empty sequence of them, got []")
    return tuple(check_positive_float(v, "alpha_epsilon") for v in values)
