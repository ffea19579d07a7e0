"""A scikit-learn-like Dirichlet GP classifier on top of the GPyTorch pieces.

``DirichletGPClassifier().fit(X, y).predict_proba(X_test)`` builds C Dirichlet-transformed
regressions (Milios et al. 2018; paper 000 App. D.4) sharing one random-feature kernel,
trains the kernel hyperparameters by the exact marginal likelihood, optionally picks α_ε by
validation MNLL, and predicts E[softmax(f)] — everything in O(N·F²) time independent of C
when the kernel is an rfgp feature kernel (see :mod:`rfgp.inference.classification`).
"""

from __future__ import annotations

import copy
import numbers
from collections.abc import Sequence

import gpytorch
import numpy as np
import torch
from torch import Tensor

from ..core.validation import check_choice, check_dtype_argument, check_positive_float, check_positive_int
from ..kernels.fourier import FOURIER_METHODS, SketchedRBFKernel
from ..likelihoods.dirichlet import PROBABILITY_METHODS, DirichletClassificationLikelihood
from ..metrics import mean_negative_log_likelihood
from ..training import fit_mll
from .regression import ExactGPModel


class DirichletGPClassifier:
    r"""Dirichlet-based GP classifier: ``fit(X, y)``, ``predict_proba(X)``, ``predict(X)``.

    Args:
        kernel: a GPyTorch kernel shared by all classes (not batched, so that Φ is shared);
            default ``ScaleKernel(SketchedRBFKernel(num_features, method))`` with a median-heuristic
            lengthscale and the outputscale set to the variance of the transformed targets
            (paper 000's settings).  Deep-copied at every fit.
        num_features, method: F and the Fourier method of the default kernel.
        alpha_epsilon: α_ε, or a sequence of candidates chosen by validation MNLL.
        num_iterations, lr: Adam steps on the negative MLL (0 disables training).
        learn_additional_noise: learn an extra per-class noise on top of σ²_{c,i}.
        validation_fraction: share of the data held out to choose α_ε (then refit on all data).
        probability_method, num_samples: class probabilities by ``"mc"`` (seeded) or ``"mean_field"``.
        standardize: centre and scale every input column with the training statistics; a column that is
            constant in the training data (up to the rounding of its variance) is centred but not scaled
            (scale 1, as scikit-learn's ``StandardScaler``), so that a value it takes only at prediction
            (a category absent from the training data) stays on the data's scale.
        dtype, device: of the model; inputs are converted.
        seed: seeds the random features, the validation split and the Monte-Carlo draws.
        progress: tqdm progress bar during training (``None``: only on a terminal).

    Attributes (after ``fit``):
        ``classes_``: the sorted class labels; ``model_``/``likelihood_``: the fitted GPyTorch objects;
        ``alpha_epsilon_``: the α_ε used; ``validation_mnll_``: {α_ε: MNLL} when several were tried;
        ``losses_``: training losses.

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
        num_features: int = 1024,
        method: str = "rff",
        alpha_epsilon: float | Sequence[float] = 0.01,
        num_iterations: int = 50,
        lr: float = 0.05,
        learn_additional_noise: bool = False,
        validation_fraction: float = 0.2,
        probability_method: str = "mc",
        num_samples: int = 1000,
        standardize: bool = True,
        dtype: torch.dtype = torch.float32,
        device: str | torch.device | None = None,
        seed: int = 0,
        progress: bool | None = None,
    ) -> None:
        if kernel is not None and not isinstance(kernel, gpytorch.kernels.Kernel):
            raise TypeError(f"kernel must be a gpytorch Kernel or None, got {type(kernel).__name__}")
        self.kernel = kernel
        self.num_features = check_positive_int(num_features, "num_features")
        self.method = check_choice(method, "method", tuple(FOURIER_METHODS))
        self.alpha_candidates = _check_alphas(alpha_epsilon)
        if isinstance(num_iterations, bool) or not isinstance(num_iterations, numbers.Integral) or num_iterations < 0:
            raise ValueError(f"num_iterations must be an integer ≥ 0, got {num_iterations!r}")
        self.num_iterations = int(num_iterations)
        self.lr = check_positive_float(lr, "lr")
        self.learn_additional_noise = bool(learn_additional_noise)
        self.validation_fraction = check_positive_float(validation_fraction, "validation_fraction")
        if self.validation_fraction >= 1:
            raise ValueError(f"validation_fraction must lie in (0, 1), got {validation_fraction}")
        self.probability_method = check_choice(probability_method, "probability_method", PROBABILITY_METHODS)
        self.num_samples = check_positive_int(num_samples, "num_samples")
        self.standardize = bool(standardize)
        self.dtype = check_dtype_argument(dtype)
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
            raise TypeError(f"seed must be an integer, got {seed!r}")
        self.seed = int(seed)
        self.progress = progress

    # ----- fitting ------------------------------------------------------------------------
    def fit(self, X, y) -> "DirichletGPClassifier":
        """Fit on inputs ``X`` (N, d) and class labels ``y`` (N,) (any sortable label values)."""
        x = self._as_inputs(X, "X")
        labels_np = np.asarray(y.cpu() if torch.is_tensor(y) else y)
        if labels_np.ndim != 1 or labels_np.shape[0] != x.shape[0]:
            raise ValueError(f"y must be 1-D with {x.shape[0]} labels (one per row of X), got shape {labels_np.shape}")
        self.classes_, encoded = np.unique(labels_np, return_inverse=True)
        if len(self.classes_) < 2:
            raise ValueError(f"y must contain at least two classes, got {self.classes_.tolist()}")
        labels = torch.as_tensor(encoded, dtype=torch.long, device=self.device)
        if self.standardize:
            self.input_mean_ = x.mean(0)
            self.input_scale_ = _column_scales(x, self.input_mean_)
            x = (x - self.input_mean_) / self.input_scale_
        self.validation_mnll_ = {}
        if len(self.alpha_candidates) > 1:
            self.validation_mnll_ = self._validate_alphas(x, labels)
            self.alpha_epsilon_ = min(self.validation_mnll_, key=self.validation_mnll_.get)
        else:
            self.alpha_epsilon_ = self.alpha_candidates[0]
        self.model_, self.losses_ = self._fit_model(x, labels, self.alpha_epsilon_)
        self.likelihood_ = self.model_.likelihood
        return self

    def _validate_alphas(self, x: Tensor, labels: Tensor) -> dict[float, float]:
        gen = torch.Generator().manual_seed(self.seed)
        order = torch.randperm(x.shape[0], generator=gen).to(self.device)
        num_val = max(1, int(round(self.validation_fraction * x.shape[0])))
        val, train = order[:num_val], order[num_val:]
        scores = {}
        for alpha in self.alpha_candidates:
            model, _ = self._fit_model(x[train], labels[train], alpha)
            probs = self._probabilities(model, x[val])
            scores[alpha] = mean_negative_log_likelihood(probs, labels[val]).item()
        return scores

    def _fit_model(self, x: Tensor, labels: Tensor, alpha: float):
        num_classes = len(self.classes_)
        likelihood = DirichletClassificationLikelihood(
            labels, num_classes=num_classes, alpha_epsilon=alpha,
            learn_additional_noise=self.learn_additional_noise, dtype=self.dtype,
        )
        targets = likelihood.transformed_targets.to(self.device)
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
        kernel = self._new_kernel(x, targets)
        model = ExactGPModel(x, targets, likelihood, kernel, mean).to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            mean.constant.copy_(targets.mean(-1))
        losses = []
        if self.num_iterations > 0:
            losses = fit_mll(model, self.num_iterations, self.lr, self.progress, description="Dirichlet GP",
                              optimizer="adam")
        model.eval()
        likelihood.eval()
        return model, losses

    def _new_kernel(self, x: Tensor, targets: Tensor) -> gpytorch.kernels.Kernel:
        if self.kernel is not None:
            return copy.deepcopy(self.kernel)
        base = SketchedRBFKernel(self.num_features, method=self.method, input_dim=x.shape[-1], seed=self.seed)
        kernel = gpytorch.kernels.ScaleKernel(base).to(device=self.device, dtype=self.dtype)
        with torch.no_grad():
            base.lengthscale = _median_distance(x, self.seed)
            kernel.outputscale = (targets - targets.mean(-1, keepdim=True)).var().clamp_min(1e-3)
        return kernel

    # ----- prediction ---------------------------------------------------------------------
    def predict_proba(self, X, batch_size: int = 4096):
        """Class probabilities ``(M, C)`` in the order of ``classes_`` (a tensor for tensor input)."""
        self._check_fitted()
        x = self._as_inputs(X, "X")
        if self.standardize:
            x = (x - self.input_mean_) / self.input_scale_
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
        self._check_fitted()
        x = self._as_inputs(X, "X")
        if self.standardize:
            x = (x - self.input_mean_) / self.input_scale_
        with torch.no_grad():
            return self.model_(x)

    def _probabilities(self, model, x: Tensor) -> Tensor:
        with torch.no_grad():
            posterior = model(x)
            return model.likelihood.predict_proba(
                posterior, method=self.probability_method, num_samples=self.num_samples, seed=self.seed
            )

    def _as_inputs(self, X, name: str) -> Tensor:
        x = X.detach() if torch.is_tensor(X) else torch.as_tensor(np.asarray(X, dtype=np.float64))
        if x.dim() != 2:
            raise ValueError(f"{name} must be a 2-D array (n_samples, n_features), got shape {tuple(x.shape)}")
        x = x.to(device=self.device, dtype=self.dtype)
        if not bool(torch.isfinite(x).all()):
            raise ValueError(f"{name} contains NaN or Inf entries")
        if hasattr(self, "input_mean_") and x.shape[-1] != self.input_mean_.shape[-1]:
            raise ValueError(f"{name} has {x.shape[-1]} columns; the classifier was fitted on {self.input_mean_.shape[-1]}")
        return x

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise RuntimeError("this DirichletGPClassifier is not fitted yet; call fit(X, y) first")


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


def _check_alphas(alpha_epsilon) -> tuple[float, ...]:
    values = alpha_epsilon if isinstance(alpha_epsilon, Sequence) and not isinstance(alpha_epsilon, str) else [alpha_epsilon]
    if len(values) == 0:
        raise ValueError("alpha_epsilon must be a positive number or a non-empty sequence of them, got []")
    return tuple(check_positive_float(v, "alpha_epsilon") for v in values)


def _median_distance(x: Tensor, seed: int, max_points: int = 1000) -> Tensor:
    """Median pairwise distance of (up to ``max_points``) rows: the paper's lengthscale heuristic."""
    if x.shape[0] > max_points:
        gen = torch.Generator().manual_seed(seed)
        x = x[torch.randperm(x.shape[0], generator=gen)[:max_points].to(x.device)]
    distances = torch.pdist(x)
    return distances.median().clamp_min(1e-6) if distances.numel() else torch.ones((), dtype=x.dtype)
