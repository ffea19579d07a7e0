"""A scikit-learn estimator: GP regression with random features, ``GPRegressor().fit(X, y).predict(X_test)``.

The model is GPyTorch's exact regression GP y = f(x) + ε, f ~ GP(m, k), ε ~ N(0, σ²), with the kernel k replaced by a
random-feature estimate k̂(x, x') = s·Φ(x)ᵀΦ(x') (Rahimi & Recht 2007; orthogonal features: paper 002).  Its
hyperparameters maximise the exact marginal likelihood of k̂ and its posterior (Rasmussen & Williams 2006, Eqs.
2.25–2.26) is computed in feature space, O(N·F² + F³) in time and O(N·F) in memory, where scikit-learn's
``GaussianProcessRegressor`` costs O(N³) and O(N²) per likelihood evaluation.
"""

from __future__ import annotations

import math
import numbers
from types import SimpleNamespace

import gpytorch
import numpy as np
import torch
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.state_cache import StateCache, module_configuration, module_tensors
from ..core.user_warnings import warn as warn_user
from ..core.validation import check_finite, check_positive_float, check_positive_int
from ..inference.log_prob import has_feature_space_covariance
from .classifier_check import DegenerateFitWarning, training_leave_one_out
from .estimator import (
    RandomFeatureEstimator,
    as_real_tensor,
    check_sample_weight,
    column_scales,
    predicting,
    refuse_sparse,
)
from .feature_width import set_num_features
from .regression import ExactGPModel
from .sampling import posterior_paths


class GPRegressor(RandomFeatureEstimator):
    r"""Gaussian-process regression with random features: ``fit(X, y)``, ``predict(X, return_std=True)``.

    y = f(x) + ε with f ~ GP(m, k̂), k̂(x, x') = s·Φ(x)ᵀΦ(x'), ε ~ N(0, σ²); the hyperparameters (lengthscales,
    outputscale s, noise σ², constant mean m) maximise the exact marginal likelihood log p(y | θ) of k̂, and the
    posterior of f at x* has mean m + k̂(x*, X)(K̂ + σ²I)⁻¹(y − m) and covariance k̂(x*, x*) − k̂(x*, X)(K̂ + σ²I)⁻¹k̂(X, x*)
    (Rasmussen & Williams 2006, Eqs. 2.25–2.26), both computed in feature space in O(N·F² + F³).  The API is that of
    scikit-learn's ``GaussianProcessRegressor``.

    Args:
        kernel: a GPyTorch kernel; default ``ScaleKernel(SketchedRBFKernel(F_train, method, ard_num_dims=d))``,
            re-drawn at F after training, starting from the median-heuristic lengthscale in every dimension and the
            outputscale set to the variance of the (normalised) targets.  A given kernel is used as given (deep-copied
            at every fit; an exact GPyTorch kernel is not converted: ``rfgp.sketch(kernel, F)`` makes a random-feature
            one, e.g. ``rfgp.sketch(ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d)), 1024)``).  It sees the
            inputs in the units of ``X`` (scikit-learn's convention: a period of 1 in years stays one year) unless
            ``standardize=True``, with which its hyperparameters are read in standardised units and its maps fitted to
            a data sample are refitted on the standardised inputs as in :class:`~rfgp.models.DirichletGPClassifier`
            (a kernel at GPyTorch's initial lengthscale 0.69, like the Matérn example, wants ``standardize=True`` on
            raw columns; :func:`rfgp.fit_mll` warns with a ``DataScaleWarning`` otherwise).
        num_features, train_num_features: the default kernel's width at prediction (F) and in training (F_train),
            by :class:`~rfgp.models.DirichletGPClassifier`'s rule ("train small, predict big", re-drawn by
            :func:`rfgp.set_num_features` with the same hyperparameters and seed): neither given: F_train = 256,
            F = 1024; only ``num_features``: both that; only ``train_num_features``: F = 4·F_train; both: those.  Even
            numbers.  With ``kernel`` given its own width is used and both are refused (``rfgp.sketch(kernel, F)``
            builds a kernel at width F; ``rfgp.set_num_features(reg.model_, F)`` re-draws a fitted one).
        method: the Fourier method of the default kernel (``"rff"``, ``"orf"``, ``"sorf"``, …).
        num_iterations, lr, optimizer, time_budget: training by :func:`rfgp.fit_mll`: at most ``num_iterations``
            iterations (0: no training) of L-BFGS (``"lbfgs"``, the default, stopped by fit_mll's convergence rule)
            or Adam (``"adam"``), ``lr`` its step (``None``: fit_mll's default), ``time_budget`` seconds at most
            per start (``None``: no limit).
        standardize: centre and scale every input column with the training statistics (a constant column is
            centred, not scaled), as the classifier: ``True``, ``False`` or ``"auto"`` (the default: the default
            kernel's inputs are standardised, a given kernel's are not, since its lengthscales, periods and
            frequencies are in the units of ``X``; standardising them silently made a one-year period 12.7 years
            on the weekly CO₂ record).
        normalize_y: centre and scale every target column to mean 0 and variance 1 for the model (the default prior
            of the outputscale and noise assumes unit-scale targets; scikit-learn's default is ``False``);
            predictions are transformed back: means by y·scale + mean, standard deviations by the scale,
            covariances by its square.
        dtype, device: of the model (dtype ``"float32"``, the default, ``"float64"`` or the torch dtype); inputs are
            converted.
        seed: seeds the random features.
        progress: tqdm progress bar during training (``None``: only on a terminal).
        n_restarts_optimizer: train that many more times, from random starts drawn from ``seed``
            (:func:`~rfgp.models.random_start.draw_random_start`: lengthscales and noise), and keep the fit with the
            lowest final loss, as scikit-learn's argument of that name; a start that fails is skipped with a
            ``NumericalWarning``.  The marginal likelihood has local optima (all noise, among others) that the default
            start can end in.

    Targets ``y`` of shape ``(N,)``, or ``(N, T)`` for T outputs: T independent GPs sharing the inputs and the
    kernel's hyperparameters, noise and features (as scikit-learn's multi-target regressor shares its kernel), each
    with its own constant mean and, with ``normalize_y``, its own scaling: a batch of T targets over one kernel.  It
    forms the features' Gram ΦᵀΦ once for all T targets (:func:`rfgp.inference.linalg.feature_statistics` of a Φ
    shared by the batch) and the F × F factorisation and solves once per target: at N = 4 000, F = 512, T = 8, float64,
    one thread, one MLL + gradient took 0.24 s against 0.09–0.13 s for T = 1 (6.5–7.5× before the Gram was shared)
    and a prediction at 1 000 points 0.16–0.19 s against 0.05–0.07 s.  ``(N, 1)`` gives 1-D predictions, as in
    scikit-learn.

    Uncertainty: ``predict``'s ``return_std`` and ``return_cov`` are those of the latent f (noise excluded, as
    scikit-learn's regressor with a kernel without ``WhiteKernel``); the fitted noise variance is ``noise_`` (in
    the units of y²), so the predictive standard deviation of a new observation is √(std² + ``noise_``), and
    :meth:`log_predictive_density` gives log p(y* | x*, data) per point, noise included.

    It follows scikit-learn's estimator contract without depending on scikit-learn (:mod:`rfgp.models.estimator`):
    ``get_params``/``set_params``, ``clone``, ``Pipeline``, ``GridSearchCV``, ``cross_val_score``, ``score`` (R²),
    arguments checked by ``fit``, prediction before ``fit`` raises a ``NotFittedError``.

    Attributes (after ``fit``):
        ``model_``/``likelihood_``: the fitted GPyTorch objects (in normalised units); ``losses_``: the
        :class:`~rfgp.training.TrainingHistory` of :func:`rfgp.fit_mll` (``[]`` for ``num_iterations=0``);
        ``n_features_in_``; ``feature_names_in_`` (a DataFrame's string column names, checked at prediction);
        ``train_num_features_``, ``num_features_``: the default kernel's widths (``None`` with a given kernel);
        ``y_mean_``, ``y_scale_``: the target normalisation (0 and 1 without ``normalize_y``);
        ``noise_``: the noise variance σ² in the units of y² (a float, or ``(T,)`` for T outputs);
        ``kernel_``: the fitted kernel (``model_.covar_module``); ``log_marginal_likelihood_value_``: log p(y | X, θ)
        of the fitted model (scikit-learn's attribute; computed at first access);
        ``restart_losses_``: the final training loss (negative MLL per point) from each start, the default one first
        (NaN for a start that failed; ``[]`` untrained); ``losses_`` is the kept fit's history;
        ``leave_one_out_nll_``, ``constant_mean_nll_``: the trained model's leave-one-out NLL of its training targets
        and that of their mean and variance alone (normalised units; ``None`` untrained or for an exact kernel): a
        ``DegenerateFitWarning`` says when the first is no better, the fit having explained the targets as noise.

    Example:
        >>> import torch
        >>> from rfgp.models import GPRegressor
        >>> g = torch.Generator().manual_seed(0)
        >>> X = 4 * torch.rand(300, 2, generator=g, dtype=torch.float64) - 2
        >>> y = torch.sin(2 * X[:, 0]) * X[:, 1] + 0.1 * torch.randn(300, generator=g, dtype=torch.float64)
        >>> reg = GPRegressor(dtype=torch.float64).fit(X[:200], y[:200])
        >>> mean, std = reg.predict(X[200:], return_std=True)      # tensors in, tensors out (else NumPy)
        >>> mean.shape, bool((std > 0).all())
        (torch.Size([100]), True)
        >>> reg.score(X[200:], y[200:]) > 0.9                        # R²
        True
    """

    _estimator_type = "regressor"  # scikit-learn < 1.6 reads this; newer versions read __sklearn_tags__
    _noun = "regressor"

    def __init__(
        self,
        kernel: gpytorch.kernels.Kernel | None = None,
        num_features: int | None = None,
        train_num_features: int | None = None,
        method: str = "rff",
        num_iterations: int = 100,
        lr: float | None = None,
        optimizer: str = "lbfgs",
        time_budget: float | None = None,
        standardize: bool | str = "auto",
        normalize_y: bool = True,
        dtype: str | torch.dtype = "float32",
        device: str | torch.device | None = None,
        seed: int = 0,
        progress: bool | None = None,
        n_restarts_optimizer: int = 0,
    ) -> None:
        # scikit-learn's estimator contract: arguments stored as given, checked by ``fit``
        self.kernel = kernel
        self.num_features = num_features
        self.train_num_features = train_num_features
        self.method = method
        self.num_iterations = num_iterations
        self.lr = lr
        self.optimizer = optimizer
        self.time_budget = time_budget
        self.standardize = standardize
        self.normalize_y = normalize_y
        self.dtype = dtype
        self.device = device
        self.seed = seed
        self.progress = progress
        self.n_restarts_optimizer = n_restarts_optimizer

    def __sklearn_tags__(self):
        # only scikit-learn calls this, so scikit-learn is installed; rfgp itself does not depend on it
        from sklearn.utils import RegressorTags, Tags, TargetTags

        return Tags(estimator_type="regressor", target_tags=TargetTags(required=True, multi_output=True),
                    regressor_tags=RegressorTags())

    def _check_params(self) -> SimpleNamespace:
        """The constructor arguments, checked: they drive this fit and the predictions after it (``_fit_params``)."""
        common = self._check_common_params()
        if self.time_budget is not None:
            check_positive_float(self.time_budget, "time_budget")
        if not isinstance(self.normalize_y, (bool, np.bool_)):
            raise TypeError(f"normalize_y must be True or False, got {self.normalize_y!r}")
        auto = isinstance(self.standardize, str) and self.standardize == "auto"
        if not (auto or isinstance(self.standardize, (bool, np.bool_))):
            raise TypeError(f"standardize must be True, False or 'auto', got {self.standardize!r}")
        common["standardize"] = self.kernel is None if auto else bool(self.standardize)
        return SimpleNamespace(**common, time_budget=self.time_budget, normalize_y=bool(self.normalize_y))

    # ----- fitting ------------------------------------------------------------------------
    @in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
    def fit(self, X, y) -> "GPRegressor":
        """Fit on inputs ``X`` (N, d) and real targets ``y`` (N,) or (N, T); NaN or Inf in either is refused.

        A pandas DataFrame's string column names are kept as ``feature_names_in_`` and checked at prediction.
        """
        self._fit_params = p = self._check_params()
        x = self._training_inputs(X)
        self.n_outputs_ = None
        targets = self._as_targets(y, x.shape[0])  # (N, T), in the wider of y's dtype and the model's
        self.n_outputs_ = targets.shape[-1]
        x = self._standardised(x)
        # normalised before they are rounded to the model's dtype: float32 rounded y ≈ 10⁷ ± 1 to whole numbers
        # first (noise 0.044 fitted where it was 0.0022, R² lost)
        self.y_mean_ = targets.mean(0) if p.normalize_y else torch.zeros_like(targets[0])
        self.y_scale_ = column_scales(targets, self.y_mean_, "y") if p.normalize_y else torch.ones_like(targets[0])
        _warn_rounded_targets(targets, p.dtype, p.normalize_y)
        targets = ((targets - self.y_mean_) / self.y_scale_).to(p.dtype).T  # (T, N): a batch over one kernel
        batch = torch.Size([self.n_outputs_]) if self.n_outputs_ > 1 else torch.Size()
        targets = targets.reshape(*batch, -1)
        model, self.losses_, self.restart_losses_ = self._best_of_starts(lambda start: self._trained_model(
            x, targets, gpytorch.likelihoods.GaussianLikelihood(), start, "GP regression", ard=True,
            time_budget=p.time_budget))
        self.leave_one_out_nll_ = self.constant_mean_nll_ = None
        if p.num_iterations > 0:
            self._check_degenerate_fit(model)
        likelihood = model.likelihood
        if p.num_features != p.train_num_features:  # train small, predict big: same hyperparameters and seed
            set_num_features(model, p.num_features)
        model.eval()
        likelihood.eval()
        self.model_, self.likelihood_ = model, likelihood
        self._log_marginal_likelihood = StateCache()  # log_marginal_likelihood_value_, computed when first read
        self.train_num_features_, self.num_features_ = p.train_num_features, p.num_features
        noise = (likelihood.noise.detach().reshape(()) * self.y_scale_.square()).to(p.dtype)
        self.noise_ = float(noise) if self.n_outputs_ == 1 else noise.cpu().numpy()
        return self

    def _check_degenerate_fit(self, model: ExactGPModel) -> None:
        """Warn (:class:`~rfgp.models.classifier_check.DegenerateFitWarning`) where the trained model predicts its
        training targets, each left out in turn, no better than their mean does, ignoring the inputs.

        The marginal likelihood has the trivial optimum "all noise" (outputscale → 0, noise → the targets' variance),
        which a start far from the data's lengthscale falls into although a better one exists: sin(20x) on x in
        [0, 10] (400 points, noise 0.1) ended there from the median-heuristic lengthscale (R² 0.00; started at a
        hundredth of it: noise 0.02, R² 0.98), as did pure-noise targets, where it is the answer.  The leave-one-out
        NLL (Rasmussen & Williams 2006, Eqs. 5.12–5.13; O(N·F²),
        :func:`~rfgp.inference.leave_one_out.leave_one_out_predictions`) is compared with that of the Gaussian fitted
        to the other targets (:func:`constant_mean_nll`), per output, in normalised units; a model within
        ``DEGENERATE_MARGIN`` nats per point of it (explaining ≲ 2 % of the variance) is warned about; constant
        targets (nothing to explain) are not.  Exact GPyTorch
        kernels (O(N³) leave-one-out terms) are not checked.  ``leave_one_out_nll_``, ``constant_mean_nll_`` keep the
        numbers (``None`` when not checked).
        """
        loo = leave_one_out_nll(model)
        targets = model.train_targets
        if loo is None or targets.shape[-1] < 3:
            return
        baseline = constant_mean_nll(targets)
        self.leave_one_out_nll_, self.constant_mean_nll_ = (
            float(v) if self.n_outputs_ == 1 else v.cpu().numpy() for v in (loo, baseline))
        # a constant output has nothing to explain (its baseline variance is 0: a density of −43 nats per point in
        # float32), and was warned about with advice for a fit that missed a signal
        constant = targets.amax(-1) == targets.amin(-1)
        degenerate = ((loo > baseline - DEGENERATE_MARGIN) & ~constant).reshape(-1)
        if bool(degenerate.any()):
            outputs = degenerate.nonzero()[:, 0].tolist()
            which = "" if self.n_outputs_ == 1 else f" (outputs {outputs})"
            first = outputs[0]
            warn_user(
                f"GPRegressor: the trained model{which} predicts its training targets, each left out in turn, with "
                f"a mean negative log density of {float(loo.reshape(-1)[first]):.4g} (normalised units), not "
                f"{DEGENERATE_MARGIN} nats better than the {float(baseline.reshape(-1)[first]):.4g} of their mean and "
                "variance alone: it explains no more of the targets than noise does (outputscale "
                f"{_outputscale(model)}, noise {float(model.likelihood.noise.detach().reshape(-1)[0]):.3g}). If y is "
                "not noise, the fit may have ended at the marginal likelihood's all-noise optimum from a start far "
                "from the data's lengthscale, or stopped early: pass n_restarts_optimizer (e.g. 5: more starts, the "
                "best kept), a kernel started at a shorter lengthscale (e.g. "
                "rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=d)), F) with base_kernel.lengthscale set, and "
                "standardize=True), more num_iterations, or more data (leave_one_out_nll_ and constant_mean_nll_ hold "
                "the numbers)",
                DegenerateFitWarning,
            )

    def _as_targets(self, y, num_rows: int, name: str = "y", dtype: torch.dtype | None = None) -> Tensor:
        """Real targets ``y`` of shape (N,) or (N, T) as an (N, T) tensor of ``dtype`` (default: the wider of y's and
        the model's, float64 for anything but a tensor) on the model's device."""
        if y is None:
            raise ValueError(f"{type(self).__name__} requires y to be passed, but the target y is None")
        refuse_sparse(y, name)  # a TypeError, not the "must hold real numbers" below
        try:
            values = as_real_tensor(y, name)
        except (TypeError, ValueError) as error:
            if "Complex" in str(error):
                raise
            raise ValueError(f"{name} must hold real numbers (regression targets), got {error}") from None
        if values.dim() not in (1, 2) or values.shape[0] != num_rows or values.numel() == 0:
            raise ValueError(f"{name} must have shape ({num_rows},) or ({num_rows}, T) with T ≥ 1 (one target per row "
                             f"of X), got {tuple(values.shape)}")
        wide = torch.promote_types(values.dtype if values.is_floating_point() else torch.float64,
                                   self._fit_params.dtype)
        values = values.to(device=self._fit_params.device, dtype=dtype or wide)
        values = values.reshape(num_rows, -1)
        check_finite(values, name, "remove or impute those rows")
        if self.n_outputs_ is not None and values.shape[-1] != self.n_outputs_:
            raise ValueError(f"{name} has {values.shape[-1]} output column(s), but the regressor was fitted on "
                             f"{self.n_outputs_}")
        return values

    # ----- prediction ---------------------------------------------------------------------
    def predict(self, X, return_std: bool = False, return_cov: bool = False):
        """Posterior mean of f at ``X``; with ``return_std`` also its standard deviation, with ``return_cov`` its
        covariance (latent f, noise excluded: add ``noise_`` for a new observation's).

        Shapes as scikit-learn's ``GaussianProcessRegressor.predict``: mean and std ``(M,)``, covariance ``(M, M)``;
        ``(M, T)`` and ``(M, M, T)`` for T outputs.  NumPy arrays, or tensors for tensor input.
        """
        if return_std and return_cov:
            raise RuntimeError("predict: at most one of return_std and return_cov can be requested, got both True")
        x = self._test_inputs(X)
        with predicting():
            posterior = self.model_(x)
            mean = self._in_units_of_y(posterior.mean, 1, shift=True)
            if return_std:
                second = self._in_units_of_y(posterior.variance.sqrt(), 1)  # GPyTorch warns about, rounds negatives
            elif return_cov:
                second = self._in_units_of_y(posterior.covariance_matrix, 2, cov=True)
        results = (self._outputs(mean),) + ((self._outputs(second, cov=return_cov),) if return_std or return_cov
                                            else ())
        results = tuple(r.to(self._fit_params.dtype) for r in results)  # rounded once, after the unit change
        results = tuple(r if torch.is_tensor(X) else r.cpu().numpy() for r in results)
        return results if len(results) > 1 else results[0]

    def log_predictive_density(self, X, y):
        """log p(y* | x*, data) = log N(y*; μ(x*), σ²_f(x*) + σ²) per point, in the units of y (noise included).

        ``(M,)``, or ``(M, T)`` for T outputs; its negative mean is the test NLPD.  NumPy, or a tensor for tensor X.
        """
        x = self._test_inputs(X)
        targets = self._as_targets(y, x.shape[0])
        with predicting():
            predictive = self.likelihood_(self.model_(x))
            mean = self._outputs(self._in_units_of_y(predictive.mean, 1, shift=True))
            variance = self._outputs(self._in_units_of_y(predictive.variance, 2))
        residual = self._outputs(targets.T) - mean  # in the targets' dtype: y ≈ 10⁷ lost its digits in float32
        density = -0.5 * (residual.square() / variance + variance.log() + math.log(2 * math.pi))
        density = density.to(self._fit_params.dtype)
        return density if torch.is_tensor(X) else density.cpu().numpy()

    @property
    def log_marginal_likelihood_value_(self) -> float:
        """log p(y | X, θ) at the fitted hyperparameters θ, as scikit-learn's attribute of that name: the exact log
        marginal likelihood of the fitted model (its kernel at the prediction width F, so "train small, predict big"
        gives the value of the model that predicts), of the normalised targets with ``normalize_y`` (as scikit-learn
        computes it), summed over outputs; the mean's and kernel's priors are not included.  Computed at the first
        access (one O(N·F²) pass, chunked under :class:`rfgp.settings.memory_budget`), then kept while ``model_``'s
        state (hyperparameters, features) and training data stay those it was computed for: after
        ``rfgp.set_num_features(reg.model_, F)`` or a changed hyperparameter it is computed again (it was the value
        of the model before).
        """
        self._check_fitted()
        model = self.model_

        def compute() -> float:
            x = model.train_inputs[0]
            with predicting():  # the prior at the training inputs, from the model's forward: no GPyTorch setting
                marginal = self.likelihood_(model.forward(x))
                if has_feature_space_covariance(marginal):  # rfgp's exact O(N·F²) log-determinant and solve
                    return float(marginal.log_prob(model.train_targets).sum())
                # an exact GPyTorch kernel, whose log_prob above max_cholesky_size is a stochastic estimate (36 nats
                # off at N = 900): the dense Cholesky, O(N³) like its training
                dense = torch.distributions.MultivariateNormal(marginal.mean, marginal.covariance_matrix)
                return float(dense.log_prob(model.train_targets).sum())

        # kept while the model's parameters, buffers (feature draws), settings and training data are unchanged
        state = (*module_tensors(model), *model.train_inputs, model.train_targets)
        with torch.no_grad():  # a StateCache recomputes at every call where a state tensor records a gradient
            return self._log_marginal_likelihood.get(state, module_configuration(model), compute)

    def sample_y(self, X, n_samples: int = 1, random_state=0):
        """``n_samples`` posterior functions f evaluated at ``X`` (latent, noise excluded): ``(M, n_samples)``, or
        ``(M, T, n_samples)`` for T outputs, as scikit-learn's ``sample_y``.

        Drawn as weight-space paths f(x) = m + Φ(x)ᵀw, w ~ p(w | data) (:func:`rfgp.sampling.posterior_paths`): one
        featurisation of X, no M × M covariance.  Needs an rfgp feature kernel (the default); an exact GPyTorch kernel
        is refused (sample ``latent = reg.model_(x)`` yourself, at O(M³)).  ``random_state``: an integer seed (the
        default 0, as scikit-learn's), a ``torch.Generator``, a NumPy ``Generator``/``RandomState`` (a seed is drawn
        from it) or ``None`` (torch's global generator).
        """
        x = self._test_inputs(X)
        n_samples = check_positive_int(n_samples, "n_samples")
        generator = self._generator(random_state)
        try:
            paths = posterior_paths(self.model_, n_samples, generator=generator)
        except TypeError as error:
            raise TypeError(f"sample_y draws posterior functions by rfgp.sampling.posterior_paths: {error}") from None
        with torch.no_grad():
            values = self._in_units_of_y(paths(x), 1, shift=True).to(self._fit_params.dtype)  # (S, [T,] M)
        values = values.movedim(0, -1)  # ([T,] M, S)
        values = values.movedim(0, 1) if self.n_outputs_ > 1 else values
        return values if torch.is_tensor(X) else values.cpu().numpy()

    def score(self, X, y, sample_weight=None) -> float:
        """R² = 1 − Σᵢwᵢ(yᵢ − ŷᵢ)²/Σᵢwᵢ(yᵢ − ȳ)² of ``predict(X)`` (scikit-learn's regressor score, averaged
        uniformly over outputs; a constant y scores 1 if predicted exactly, else 0), weighted if given; at least 2
        rows."""
        predicted = self.predict(X)
        truth = self._as_targets(y, np.shape(predicted)[0], dtype=torch.float64).cpu().numpy()
        predicted = np.asarray(predicted.cpu() if torch.is_tensor(predicted) else predicted, dtype=np.float64)
        return r2_score(truth, predicted.reshape(truth.shape), sample_weight)

    # ----- helpers ------------------------------------------------------------------------
    def _shift(self) -> Tensor:
        """The targets' mean, shaped for the model's (T, M) or (M,) outputs."""
        return self.y_mean_.reshape(-1, 1) if self.n_outputs_ > 1 else self.y_mean_.reshape(())

    def _scale(self, power: int) -> Tensor:
        scale = self.y_scale_ ** power
        return scale.reshape(-1, 1) if self.n_outputs_ > 1 else scale.reshape(())

    def _in_units_of_y(self, values: Tensor, power: int, shift: bool = False, cov: bool = False) -> Tensor:
        """A normalised model output ``([T,] M[, M])`` in the units of y: ``values``·scale^power (+ the mean with
        ``shift``; ``cov``: a covariance), formed in the dtype of ``y_mean_`` (the wider of y's and the model's)."""
        scale = self._scale(power)
        values = values.to(scale.dtype) * (scale.unsqueeze(-1) if cov else scale)
        return values + self._shift() if shift else values

    def _outputs(self, values: Tensor, cov: bool = False) -> Tensor:
        """A model output ``([T,] M[, M])`` in scikit-learn's layout: ``(M[, M], T)`` for T outputs."""
        if self.n_outputs_ == 1:
            return values.reshape(values.shape[-2:] if cov else values.shape[-1:])
        return values.movedim(0, -1)

    def _generator(self, random_state) -> torch.Generator | None:
        if random_state is None or isinstance(random_state, torch.Generator):
            return random_state
        if isinstance(random_state, np.random.RandomState):
            random_state = int(random_state.randint(np.iinfo(np.int32).max))
        elif isinstance(random_state, np.random.Generator):
            random_state = int(random_state.integers(np.iinfo(np.int32).max))
        if isinstance(random_state, bool) or not isinstance(random_state, numbers.Integral):
            raise TypeError("random_state must be an integer seed, a torch.Generator, a NumPy Generator or "
                            f"RandomState, or None, got {random_state!r}")
        return torch.Generator(device=self._fit_params.device).manual_seed(int(random_state))


#: nats per point by which a trained regressor's leave-one-out NLL must beat the targets' own Gaussian: 0.01 is a
#: model that explains 2 % of the variance (−½·log(1 − 0.02))
DEGENERATE_MARGIN = 0.01


def leave_one_out_nll(model: ExactGPModel) -> Tensor | None:
    """Mean leave-one-out negative log density of the training targets, ``()`` or ``(T,)``, of a regression ``model``;
    ``None`` when its noise-added covariance has no feature root (an exact GPyTorch kernel)."""
    predictions = training_leave_one_out(model)
    if predictions is None:
        return None
    mean, variance = predictions
    targets = model.train_targets
    return 0.5 * ((2 * math.pi * variance).log() + (targets - mean).square() / variance).mean(-1)


def constant_mean_nll(targets: Tensor) -> Tensor:
    """Mean leave-one-out negative log density of ``targets`` ``(..., N)`` (N ≥ 3) under the model that ignores the
    inputs: each yᵢ predicted by the Gaussian of the other N − 1 targets' mean ȳ₋ᵢ and sample variance s²₋ᵢ, with
    predictive variance s²₋ᵢ·N/(N − 1) (that of a new draw given an estimated mean).

    With d = y − ȳ: yᵢ − ȳ₋ᵢ = dᵢ·N/(N − 1) and (N − 2)·s²₋ᵢ = Σd² − dᵢ²·N/(N − 1).
    """
    n = targets.shape[-1]
    centred = targets - targets.mean(-1, keepdim=True)
    residual = centred * n / (n - 1)
    variance = (centred.square().sum(-1, keepdim=True) - centred.square() * n / (n - 1)) / (n - 2) * n / (n - 1)
    variance = variance.clamp_min(torch.finfo(variance.dtype).tiny)
    return 0.5 * ((2 * math.pi * variance).log() + residual.square() / variance).mean(-1)


def _outputscale(model: ExactGPModel) -> str:
    scale = getattr(model.covar_module, "outputscale", None)
    return "—" if scale is None else f"{float(scale.detach().reshape(-1)[0]):.3g}"


def _warn_rounded_targets(targets: Tensor, dtype: torch.dtype, normalized: bool) -> None:
    """Warn where a float32 model rounds the targets ``(N, T)`` (in the wider dtype) to more than 10⁻³ of their
    spread: predictions in the units of y are rounded to float32 (a mean of 10⁷ to a whole number), and without
    ``normalize_y`` so are the training targets."""
    if dtype != torch.float32 or targets.dtype == torch.float32:
        return  # float64 model, or targets already float32 (the user's rounding)
    mean = targets.mean(0)
    spread = column_scales(targets, mean, "y")
    rounding = mean.abs() * torch.finfo(torch.float32).eps / 2
    # a constant column has no spread to lose (its scale is 1, not its standard deviation 0): y = 10⁵ everywhere was
    # said to have "a standard deviation of 1" rounded by 0.006 of it
    coarse = (rounding > 1e-3 * spread) & (targets.amax(0) > targets.amin(0))
    if bool(coarse.any()):
        column = int(coarse.nonzero()[0, 0])
        trained = "" if normalized else " the training targets and"
        warn_user(
            f"GPRegressor(dtype='float32'): y (column {column}) has the mean {float(mean[column]):.7g} against a "
            f"standard deviation of {float(spread[column]):.3g}, so float32 rounds{trained} the predictions in the "
            f"units of y by up to {float(rounding[column]):.3g} ({float(rounding[column] / spread[column]):.2g} of "
            "that spread); pass dtype='float64', or subtract a reference value from y yourself",
            UserWarning,
        )


def r2_score(truth: np.ndarray, predicted: np.ndarray, sample_weight=None) -> float:
    """The coefficient of determination of ``(M, T)`` predictions, averaged uniformly over the T outputs.

    R²_t = 1 − Σᵢwᵢ(yᵢₜ − ŷᵢₜ)²/Σᵢwᵢ(yᵢₜ − ȳₜ)² with ȳₜ the weighted mean; an output with a constant truth scores 1
    where predicted exactly and 0 otherwise (scikit-learn's ``r2_score`` with ``force_finite=True``).  Fewer than 2
    rows raise a ``ValueError`` (where scikit-learn returns NaN).
    """
    if truth.shape[0] < 2:  # the total sum of squares of one value is 0: R² would be 1 or 0 whatever the model
        raise ValueError(f"score: R² needs at least 2 samples (rows of X), got {truth.shape[0]}: the spread of one "
                         "target around its own mean is 0, so R² is undefined (scikit-learn's r2_score warns and "
                         "returns NaN)")
    weights = check_sample_weight(sample_weight, truth.shape[0])[:, None]
    residual = (weights * (truth - predicted) ** 2).sum(0)
    total = (weights * (truth - np.average(truth, axis=0, weights=weights[:, 0])) ** 2).sum(0)
    constant = total == 0
    scores = np.where(constant, np.where(residual == 0, 1.0, 0.0), 1 - residual / np.where(constant, 1, total))
    return float(scores.mean())
