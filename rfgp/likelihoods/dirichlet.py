"""Dirichlet-based GP classification as C heteroscedastic regressions (Milios et al. 2018).

Paper 000, App. D.4, Eqs. 91–92: for labels y_i ∈ {0..C−1} and α_ε > 0, class c sees

    α_{c,i} = α_ε + 1[y_i = c],   σ²_{c,i} = log(1/α_{c,i} + 1),   ỹ_{c,i} = log α_{c,i} − σ²_{c,i}/2,

(log-normal moment matching of Gamma(α_{c,i}, 1)), and ỹ_c = f_c(X) + ε_c, ε_{c,i} ~ N(0, σ²_{c,i}),
f_c ~ GP(m_c, k).  Class probabilities are E[softmax(f)] under the C latent posteriors.

:class:`DirichletClassificationLikelihood` is a drop-in replacement of GPyTorch's class of the
same name (and a subclass of it) that

* validates labels and takes ``num_classes`` explicitly, so classes absent from a batch exist;
* with an rfgp feature kernel shared by the classes (Φ of shape (N, F)) hands GPyTorch a
  :class:`~rfgp.inference.classification.ClassNoiseFeatureLinearOperator` (or its chunked sibling when the
  kernel's features exceed ``rfgp.settings.memory_budget``), whose marginal likelihood and
  posterior caches cost O(N·F² + C·F³) instead of O(C·N·F²);
* fixes GPyTorch's fantasy update (which read the ``noise`` keyword as the new labels);
* predicts class probabilities by seeded Monte Carlo or the deterministic mean-field approximation, optionally at a
  temperature T (E[softmax(f/T)], saved in ``state_dict``; :mod:`rfgp.models.classifier_temperature` chooses it).
"""

from __future__ import annotations

import math
from copy import deepcopy

import gpytorch
import torch
from gpytorch.distributions import MultivariateNormal
from gpytorch.likelihoods import FixedNoiseGaussianLikelihood
from gpytorch.likelihoods.noise_models import FixedGaussianNoise
from torch import Tensor

from ..core.config_state import DRAW, METHOD, ConfigState
from ..core.validation import (
    check_choice,
    check_dtype_argument,
    check_positive_float,
    check_positive_int,
    check_seed,
    empty_shards_allowed,
)
from ..inference.classification import (
    ChunkedClassNoiseFeatureLinearOperator,
    ClassNoiseFeatureLinearOperator,
    LabelBlockPlan,
    TwoLevelNoise,
)
from ..inference.kernel_evaluation import evaluated_covariance
from ..inference.operators import ChunkedFeatureRootAddedDiagLinearOperator, FeatureRootAddedDiagLinearOperator
from .softmax import softmax_expectation_mc, softmax_expectation_mean_field

PROBABILITY_METHODS = ("mc", "mean_field")
#: noise-added operators of a feature kernel → their shared-Φ, class-structured counterparts
_STRUCTURED_OPERATORS = {
    FeatureRootAddedDiagLinearOperator: ClassNoiseFeatureLinearOperator,
    ChunkedFeatureRootAddedDiagLinearOperator: ChunkedClassNoiseFeatureLinearOperator,
}


def check_labels(labels, name: str, num_classes: int | None = None) -> Tensor:
    """Return ``labels`` as a 1-D ``torch.long`` tensor after checking they are integers in 0..C−1; non-empty, except
    on a rank of a ``torch.distributed`` process group (:func:`~rfgp.core.validation.empty_shards_allowed`)."""
    if not torch.is_tensor(labels):
        raise TypeError(f"{name} must be a 1-D torch.Tensor of integer class labels, got {type(labels).__name__}")
    if labels.is_complex() or labels.dtype == torch.bool:
        raise TypeError(f"{name} must hold integer class labels, got dtype {labels.dtype}")
    if labels.dim() != 1 or (labels.numel() == 0 and not empty_shards_allowed()):
        raise ValueError(f"{name} must be a non-empty 1-D tensor of class labels, got shape {tuple(labels.shape)}")
    if labels.numel() == 0:  # a rank's empty shard: no values to check
        return labels.long()
    if labels.is_floating_point():
        if not bool(torch.isfinite(labels).all()) or not bool((labels == labels.round()).all()):
            raise ValueError(f"{name} must hold integer class labels; got non-integer values such as "
                             f"{labels[(labels != labels.round()) | ~torch.isfinite(labels)][0].item()}")
    labels = labels.long()
    low, high = int(labels.min()), int(labels.max())
    if low < 0:
        raise ValueError(f"{name} must be class indices in 0..C-1; got the negative label {low}")
    if num_classes is not None and high >= num_classes:
        raise ValueError(
            f"{name} must be class indices in 0..{num_classes - 1} (num_classes={num_classes}); got label {high}"
        )
    return labels


def check_num_classes(num_classes, labels: Tensor) -> int:
    """``num_classes`` as an int ≥ 2, inferred as max(labels) + 1 when ``None``."""
    if num_classes is None:
        if labels.numel() == 0:
            raise ValueError("targets is empty (a rank's empty shard), so num_classes cannot be inferred from it: pass "
                             "num_classes, the same on every rank")
        inferred = int(labels.max()) + 1
        if inferred < 2:
            raise ValueError(f"targets hold a single class ({inferred}); pass num_classes (≥ 2) explicitly")
        return inferred
    num_classes = check_positive_int(num_classes, "num_classes")
    if num_classes < 2:
        raise ValueError(f"num_classes must be ≥ 2, got {num_classes}")
    return num_classes


def check_alpha_epsilon(alpha_epsilon, dtype: torch.dtype) -> float:
    """α_ε as a float, refused (naming the accepted range) where the model in ``dtype`` would not have its noise.

    σ²_off = log(1/α_ε + 1) overflows to ∞ (targets −∞) for an α_ε below the dtype's smallest normal number, and
    σ²_on = log(1/(1 + α_ε) + 1) falls below GPyTorch's ``min_fixed_noise`` for α_ε > 1/(e^{min_fixed_noise} − 1) − 1,
    where ``FixedGaussianNoise`` rounds the noise up (with a warning) while the structured solve kept the formula's:
    two different models, a marginal likelihood 10× off at α_ε = 10⁷ in float64.  The levels are checked as
    :func:`dirichlet_transform` computes them in ``dtype``.
    """
    alpha_epsilon = check_positive_float(alpha_epsilon, "alpha_epsilon")
    floor = gpytorch.settings.min_fixed_noise.value(dtype)
    on, off = dirichlet_noise_levels(alpha_epsilon, dtype)
    low, high = torch.finfo(dtype).tiny, 1.0 / math.expm1(floor) - 1.0
    if not bool(torch.isfinite(off)):
        reason = f"its off-class noise log(1/alpha_epsilon + 1) overflows in {dtype}"
    elif not bool(on >= floor):
        reason = (f"its on-class noise log(1/(1 + alpha_epsilon) + 1) = {float(on):.4g} falls below gpytorch's "
                  f"min_fixed_noise ({floor:g}), which would round the fixed noise up")
    else:
        return alpha_epsilon
    raise ValueError(f"alpha_epsilon must be within about [{low:.3g}, {high:.6g}] for dtype {dtype}, got "
                     f"{alpha_epsilon:g}: {reason}")


def dirichlet_noise_levels(
    alpha_epsilon: float, dtype: torch.dtype, device: torch.device | None = None
) -> tuple[Tensor, Tensor]:
    """(σ²_on, σ²_off) = (log(1/(1 + α_ε) + 1), log(1/α_ε + 1)), 0-dim tensors in ``dtype``: the noise where
    y_i = c and where y_i ≠ c, bit for bit the entries of :func:`dirichlet_transform`'s noise."""
    on, off = _dirichlet_noise(alpha_epsilon + torch.tensor([1.0, 0.0], dtype=dtype, device=device)).unbind()
    return on, off


def dirichlet_transform(
    labels: Tensor, num_classes: int, alpha_epsilon: float, dtype: torch.dtype = torch.float
) -> tuple[Tensor, Tensor]:
    """Noise σ² and regression targets ỹ, both ``(C, N)``, of paper 000 App. D.4 for validated labels."""
    classes = torch.arange(num_classes, device=labels.device).unsqueeze(-1)
    alpha = alpha_epsilon + (labels == classes).to(dtype)
    noise = _dirichlet_noise(alpha)
    return noise, alpha.log() - 0.5 * noise


def _dirichlet_noise(alpha: Tensor) -> Tensor:
    """σ² = log(1/α + 1) (paper 000 App. D.4, Eq. 91), computed in α's dtype."""
    return torch.log1p(alpha.reciprocal())


class DirichletClassificationLikelihood(ConfigState, gpytorch.likelihoods.DirichletClassificationLikelihood):
    r"""Fixed heteroscedastic Gaussian noise per class from integer labels (Milios et al. 2018).

    σ²_{c,i} = log(1/α_{c,i} + 1) and targets ỹ_{c,i} = log α_{c,i} − σ²_{c,i}/2 with
    α_{c,i} = α_ε + 1[y_i = c] (paper 000 App. D.4).  The model must produce C latent GPs
    (batch shape ``(C,)``, e.g. ``ConstantMean(batch_shape=(C,))``) and be trained on
    :attr:`transformed_targets` ``(C, N)``.  A non-batched rfgp kernel shares Φ across
    classes and triggers the O(N·F²), C-independent feature-space solve.

    Args:
        targets: integer labels ``(N,)`` in 0..C−1.
        num_classes: C; defaults to max(targets) + 1.  Pass it when a class may be absent.
        alpha_epsilon: α_ε > 0 (Dirichlet prior concentration; pick by validation MNLL).
        learn_additional_noise: add a learned per-class homoscedastic noise to σ².
        dtype: floating dtype of the noise and targets.
        temperature: T > 0 of the class probabilities E[softmax(f/T)] (:meth:`predict_proba`); 1 is the
            Dirichlet GP of the paper, T < 1 sharpens them, T > 1 flattens them.  A post-hoc calibration of the
            probabilities (Guo et al. 2017, "On calibration of modern neural networks", Sec. 4.2), chosen, e.g., by
            the leave-one-out NLL of the training labels (:func:`rfgp.models.classifier_temperature.
            leave_one_out_temperature`); it never changes the latent posterior.
        kwargs: ``noise_prior``/``noise_constraint`` of the learned noise; ``batch_shape`` (GPyTorch's argument)
            only as ``(C,)``, one noise per class, which it is anyway.

    Example:
        >>> import torch
        >>> from rfgp.likelihoods import DirichletClassificationLikelihood
        >>> from gpytorch.kernels import ScaleKernel
        >>> from gpytorch.means import ConstantMean
        >>> from rfgp.kernels import SketchedRBFKernel
        >>> from rfgp.models import ExactGPModel
        >>> train_x = torch.rand(100, 2, generator=torch.Generator().manual_seed(0))
        >>> train_y = (3 * train_x.sum(-1)).long()                # labels 0, 1, ..., 5
        >>> likelihood = DirichletClassificationLikelihood(train_y, num_classes=6)
        >>> model = ExactGPModel(train_x, likelihood.transformed_targets, likelihood,
        ...     ScaleKernel(SketchedRBFKernel(1024, seed=0)), ConstantMean(batch_shape=torch.Size([6])))
        >>> _ = model.eval()
        >>> probs = likelihood.predict_proba(model(torch.rand(8, 2)))       # (M, C)
        >>> probs.shape
        torch.Size([8, 6])

    ``alpha_epsilon`` and ``num_classes`` are saved in ``state_dict`` and a state saved with other
    values is refused (the labels are data: they are loaded); ``temperature`` is saved (a float64 scalar, bit for
    bit) and adopted at load (a state saved before it existed keeps the module's).
    """

    config_fields = {"num_classes": METHOD, "alpha_epsilon": METHOD, "temperature": DRAW}
    optional_config_fields = frozenset({"temperature"})

    def __init__(
        self,
        targets: Tensor,
        num_classes: int | None = None,
        alpha_epsilon: float = 0.01,
        learn_additional_noise: bool = False,
        dtype: torch.dtype = torch.float,
        temperature: float = 1.0,
        **kwargs,
    ) -> None:
        labels = check_labels(targets, "targets")
        if isinstance(num_classes, float):  # GPyTorch's second positional argument: alpha_epsilon
            raise TypeError(
                f"num_classes must be an integer, got {num_classes!r}: the second positional argument here is "
                "num_classes, where GPyTorch's DirichletClassificationLikelihood takes alpha_epsilon; pass "
                f"alpha_epsilon={num_classes!r} by keyword"
            )
        num_classes = check_num_classes(num_classes, labels)
        labels = check_labels(labels, "targets", num_classes)
        check_dtype_argument(dtype)
        self.alpha_epsilon = check_alpha_epsilon(alpha_epsilon, dtype)
        temperature = check_positive_float(temperature, "temperature")
        noise, transformed = dirichlet_transform(labels, num_classes, self.alpha_epsilon, dtype)
        batch_shape = torch.Size((num_classes,))
        # GPyTorch's class takes batch_shape and ignores it; passed on, it collided with the one set below
        given = kwargs.pop("batch_shape", batch_shape)
        if not _same_shape(given, batch_shape):
            raise ValueError(f"batch_shape must be (num_classes,) = {tuple(batch_shape)} (one noise per class) or "
                             f"left out, got {given!r}")
        # GPyTorch's parent __init__ infers C from max(targets); bypass it and set up the noise directly.
        FixedNoiseGaussianLikelihood.__init__(
            self,
            noise=noise,
            learn_additional_noise=learn_additional_noise,
            batch_shape=batch_shape,
            **kwargs,
        )
        self.num_classes = num_classes
        self.temperature = temperature
        self.register_buffer("targets", labels)
        self.register_buffer("transformed_targets", transformed)
        self._plans = {}
        self.register_load_state_dict_post_hook(_refresh_after_load)

    @property
    def temperature(self) -> float:
        """T of the class probabilities E[softmax(f/T)] (a float > 0)."""
        return self._temperature

    @temperature.setter
    def temperature(self, value: float) -> None:
        self._temperature = check_positive_float(value, "temperature")

    # ----- labels and noise -------------------------------------------------------------
    def _set_labels(self, labels: Tensor) -> None:
        dtype = self.transformed_targets.dtype
        noise, transformed = dirichlet_transform(labels, self.num_classes, self.alpha_epsilon, dtype)
        self.targets = labels
        self.transformed_targets = transformed
        self.noise_covar = FixedGaussianNoise(noise=noise)
        self._plans = {}

    @property
    def noise(self) -> Tensor:
        return self.noise_covar.noise + self.second_noise

    @noise.setter
    def noise(self, value: Tensor) -> None:
        raise AttributeError(
            "the noise of a DirichletClassificationLikelihood is fixed by alpha_epsilon and the labels; "
            "use learn_additional_noise=True to learn extra noise"
        )

    def label_noise(self, labels: Tensor) -> Tensor:
        """Fixed σ² ``(C, M)`` for (validated) labels ``(M,)`` (the learned extra noise comes on top)."""
        labels = check_labels(labels, "targets", self.num_classes).to(self.targets.device)
        noise, _ = dirichlet_transform(labels, self.num_classes, self.alpha_epsilon, self.transformed_targets.dtype)
        return noise

    def transform_labels(self, labels: Tensor) -> Tensor:
        """Regression targets ỹ ``(C, M)`` of labels ``(M,)`` (e.g. for ``get_fantasy_model``)."""
        labels = check_labels(labels, "labels", self.num_classes).to(self.targets.device)
        return dirichlet_transform(labels, self.num_classes, self.alpha_epsilon, self.transformed_targets.dtype)[1]

    def _two_level_noise(self, max_block_size: int | None = None) -> TwoLevelNoise:
        extra = self.second_noise
        extra = extra.reshape(-1) if torch.is_tensor(extra) else extra
        base = self.transformed_targets.new_ones(self.num_classes)
        on, off = dirichlet_noise_levels(self.alpha_epsilon, base.dtype, base.device)
        # the label blocks depend only on the labels (and the chunk size): built once per size
        key = (max_block_size, self.targets.device)
        if key not in self._plans:
            self._plans[key] = LabelBlockPlan.from_labels(self.targets, self.num_classes, max_block_size)
        return TwoLevelNoise(self.targets, base * on + extra, base * off + extra, self._plans[key])

    # ----- GPyTorch likelihood protocol -------------------------------------------------
    def marginal(self, function_dist: MultivariateNormal, *args, **kwargs) -> MultivariateNormal:
        """p(ỹ) = N(m, K̂ + D_c); over the training points with a feature kernel the covariance
        is a :class:`~rfgp.inference.classification.ClassNoiseFeatureLinearOperator` (structured solve), or
        its chunked sibling when the kernel returned a chunked ΦΦᵀ."""
        self._check_latent_batch(function_dist)
        prior_covar = function_dist.lazy_covariance_matrix
        if hasattr(prior_covar, "evaluate_kernel"):
            # A lazily evaluated kernel would be added to the noise as a generic sum; the evaluated
            # feature kernel (ΦΦᵀ) adds to it as a (chunked) feature-root-plus-diagonal operator.
            function_dist = function_dist.__class__(function_dist.mean, evaluated_covariance(prior_covar))
        result = super().marginal(function_dist, *args, **kwargs)
        covar = result.lazy_covariance_matrix
        structured_type = _STRUCTURED_OPERATORS.get(type(covar))
        eligible = (
            "noise" not in kwargs
            and structured_type is not None
            and covar.shape[-1] == self.targets.shape[-1]
            and covar.batch_shape == torch.Size((self.num_classes,))
        )
        if not eligible:
            return result
        # a chunked ΦΦᵀ is visited in label blocks no longer than its chunks
        max_block_size = getattr(covar._linear_op, "chunk_size", None)
        structured = structured_type.from_parts(covar, self._two_level_noise(max_block_size))
        return result.__class__(result.mean, structured)

    def _check_latent_batch(self, function_dist: MultivariateNormal) -> None:
        """Refuse latent GPs whose class batch is not C (or one GP broadcast to all classes), naming both: labels
        1..C without ``num_classes`` give C + 1 classes (class 0 without points), which only a broadcasting error
        deep in GPyTorch reported."""
        batch = function_dist.batch_shape
        if len(batch) > 0 and batch[-1] not in (1, self.num_classes):
            low, high = int(self.targets.min()), int(self.targets.max())
            raise ValueError(
                f"the model's latent GPs have batch shape {tuple(batch)}, but the likelihood has num_classes="
                f"{self.num_classes} (one latent GP per class: batch (..., {self.num_classes})); its labels span "
                f"{low}..{high} and num_classes defaults to max(labels) + 1: pass labels 0..C-1 (or num_classes) "
                f"and a model of batch shape (C,)"
            )

    def _shaped_noise_covar(self, base_shape, *params, **kwargs):
        if "noise" not in kwargs or self.second_noise_covar is None:
            return super()._shaped_noise_covar(base_shape, *params, **kwargs)
        # GPyTorch passes ``noise=`` to the learned noise as well, which then returns the given
        # noise again instead of its own (counting the label noise twice); keep them apart.
        shape = None if params else base_shape
        fixed = self.noise_covar(*params, shape=shape, noise=kwargs.pop("noise"))
        return fixed + self.second_noise_covar(*params, shape=shape, **kwargs)

    def __call__(self, input, *args, **kwargs):
        if "targets" in kwargs:
            kwargs["noise"] = self.label_noise(kwargs.pop("targets"))
        return FixedNoiseGaussianLikelihood.__call__(self, input, *args, **kwargs)

    def get_fantasy_likelihood(self, **kwargs) -> "DirichletClassificationLikelihood":
        """A copy whose training labels are extended by the fantasy points' class labels.

        GPyTorch's ``ExactGP.get_fantasy_model`` forwards only the ``noise`` keyword to the
        likelihood, so the labels travel as ``noise=`` (an integer tensor); ``labels=`` and
        ``targets=`` are accepted for direct calls.  (GPyTorch's own class demands ``targets``
        but reads ``noise``.)  Use:
        ``model.get_fantasy_model(x_new, likelihood.transform_labels(y_new), noise=y_new)``.
        """
        new_labels = next((kwargs[k] for k in ("labels", "targets", "noise") if kwargs.get(k) is not None), None)
        if new_labels is None:
            raise ValueError(
                "get_fantasy_likelihood needs the fantasy class labels as noise=..., labels=... or targets=..."
            )
        if torch.is_tensor(new_labels) and new_labels.is_floating_point():
            raise TypeError(
                "the fantasy labels of a DirichletClassificationLikelihood must be an integer tensor of classes "
                f"(its noise follows from them), got dtype {new_labels.dtype}"
            )
        new_labels = check_labels(new_labels, "labels", self.num_classes).to(self.targets.device)
        old_noise_covar = self.noise_covar
        self.noise_covar = None  # not deep-copied: rebuilt from the labels below
        try:
            fantasy = deepcopy(self)
        finally:
            self.noise_covar = old_noise_covar
        fantasy._set_labels(torch.cat((self.targets, new_labels)))
        return fantasy

    # ----- class probabilities ----------------------------------------------------------
    def predict_proba(
        self,
        function_dist: MultivariateNormal,
        method: str = "mc",
        num_samples: int = 1000,
        generator: torch.Generator | None = None,
        seed: int | None = 0,
    ) -> Tensor:
        """Class probabilities ``(M, C)`` = E[softmax(f/T)] under the latent posterior ``function_dist``, at the
        likelihood's :attr:`temperature` T (1 unless set).

        Args:
            function_dist: the C latent posteriors at M points (batch ``(C,)``, event ``(M,)``),
                e.g. ``model(test_x)`` in eval mode (not ``likelihood(model(test_x))``).
            method: ``"mc"`` (Monte Carlo through the softmax, paper 000 App. D.4) or
                ``"mean_field"`` (deterministic, see :mod:`rfgp.likelihoods.softmax`).
            num_samples: Monte-Carlo samples (``"mc"`` only).
            generator: random generator for ``"mc"``; if ``None``, one seeded with ``seed``.
            seed: seed used when ``generator`` is ``None`` (``None`` draws from the global state).
        """
        check_choice(method, "method", PROBABILITY_METHODS)
        if not isinstance(function_dist, MultivariateNormal):
            raise TypeError(f"function_dist must be a gpytorch MultivariateNormal, got {type(function_dist).__name__}")
        if function_dist.batch_shape[-1:] != torch.Size((self.num_classes,)):
            raise ValueError(
                f"function_dist must have batch shape (..., {self.num_classes}) (one latent GP per class), "
                f"got {tuple(function_dist.batch_shape)}"
            )
        mean = function_dist.mean.transpose(-1, -2)
        variance = function_dist.variance.transpose(-1, -2)
        return class_probabilities(mean, variance, method, num_samples, generator, seed, self.temperature)


def class_probabilities(
    mean: Tensor,
    variance: Tensor,
    method: str = "mc",
    num_samples: int = 1000,
    generator: torch.Generator | None = None,
    seed: int | None = 0,
    temperature: float = 1.0,
) -> Tensor:
    """E[softmax(f/T)] ``(..., C)`` for independent latents f_c ~ N(μ_c, σ²_c) given as ``mean``, ``variance``
    ``(..., C)``: f/T ~ N(μ/T, σ²/T²) integrated by ``method`` (``"mc"``: ``num_samples`` draws from ``generator``,
    or one seeded with ``seed`` when it is ``None``; ``"mean_field"``), as
    :meth:`DirichletClassificationLikelihood.predict_proba` does."""
    check_choice(method, "method", PROBABILITY_METHODS)
    temperature = check_positive_float(temperature, "temperature")
    if temperature != 1.0:
        mean, variance = mean / temperature, variance / temperature**2
    if method == "mean_field":
        return softmax_expectation_mean_field(mean, variance)
    if generator is None and seed is not None:
        generator = torch.Generator(device=mean.device).manual_seed(check_seed(seed))
    return softmax_expectation_mc(mean, variance, num_samples, generator)[0]


def _same_shape(given, shape: torch.Size) -> bool:
    try:
        return torch.Size(given) == shape
    except TypeError:  # not a sequence of integers
        return False


def _refresh_after_load(module: DirichletClassificationLikelihood, incompatible_keys) -> None:
    """Rebuild the fixed noise from the loaded labels (the noise itself is not a buffer)."""
    module._set_labels(check_labels(module.targets, "targets", module.num_classes))
