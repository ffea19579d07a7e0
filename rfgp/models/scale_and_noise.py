r"""``rfgp.fit_scale_and_noise``: the outputscale, noise and constant mean that maximise the marginal likelihood.

For a model y ~ N(μ1 + m₀(x), sΦΦᵀ + σ²I) whose training covariance is a feature root (every rfgp
feature kernel, Nyström included), the marginal likelihood as a function of the outputscale s,
the Gaussian noise σ² and a constant mean μ — every other hyperparameter fixed — costs O(F) per
evaluation once ΦᵀΦ = V diag(λ) Vᵀ is known.  With c = VᵀΦᵀ(y − m₀ − μ1) (Woodbury and the matrix
determinant lemma; Rasmussen & Williams 2006, Eq. 2.30 and A.9–A.10):

    (y − μ1 − m₀)ᵀK⁻¹(y − μ1 − m₀) = ‖y − μ1 − m₀‖²/σ² − (s/σ²) Σᵢ cᵢ²/(sλᵢ + σ²),
    log|K| = Σᵢ log(sλᵢ + σ²) + (N − F) log σ²,

with no division by λᵢ (a rank-deficient Φ is fine) and c, ‖·‖² quadratic in μ (from Φᵀ[r, 1],
‖r‖² and 1ᵀr, with r = y − m₀ centred at its mean r̄ and μ − r̄ in place of μ, so that targets far from 0 do not
cancel to their digits).  One O(N·F² + F³) pass forms ΦᵀΦ and its eigendecomposition (float64); then
L-BFGS minimises that O(F) function plus the parameters' log priors — :func:`rfgp.fit_mll`'s loss —
over unconstrained coordinates of the values within their constraints' bounds (so that constraints
without a transform, as BoTorch's noise bound, hold too).

Where it pays (``benchmarks/results/profiled_likelihood.md``).  After :func:`rfgp.set_num_features` on a
Nyström map: with 4× the landmarks the map explains variance that the narrow map left to the noise, so
the trained σ² is too large for it (elecdemand, validation split: trained at M = 512, predicted at 2 048
landmarks, NLPD −0.159; with the scale and noise re-fitted, −0.183, for 6.8 s of CPU).  Random Fourier
features are unbiased at every width: there it raises the likelihood but not the validation NLPD.
Inside training it does not replace :func:`rfgp.fit_mll`: re-fitted at every loss evaluation (a
concentrated likelihood) it costs 2.7–5.8× the CPU time, and once at the initial lengthscales it
leads L-BFGS to worse points.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass

import gpytorch
import torch
from gpytorch.kernels import Kernel, ScaleKernel
from gpytorch.likelihoods import GaussianLikelihood
from gpytorch.likelihoods.noise_models import HomoskedasticNoise
from gpytorch.means import ConstantMean
from gpytorch.utils.warnings import NumericalWarning
from torch import Tensor

from ..core.bounds import bounded_coordinate, bounded_value
from ..core.dtypes import in_full_precision
from ..core.user_warnings import warn as warn_user
from ..core.validation import check_positive_int
from ..inference.complex_posterior import ComplexFeatureRootLinearOperator
from ..inference.kernel_evaluation import evaluated_covariance
from ..kernels.nystrom import NystromKernel
from ..training import refuse_inference_mode


@dataclass(frozen=True)
class ScaleNoiseFit:
    """What :func:`fit_scale_and_noise` did.

    Attributes:
        loss_before, loss_after: :func:`rfgp.fit_mll`'s loss (negative MLL per data point with the
            log priors, summed over a batch) before and after, at the model's other hyperparameters.
        fitted: the names of the fitted parameters (``"outputscale"``, ``"noise"``, ``"constant"``).
        iterations: the L-BFGS iterations of the O(F) problem (over its restarts).
    """

    loss_before: float
    loss_after: float
    fitted: tuple[str, ...]
    iterations: int


@in_full_precision  # its own backward passes too: rfgp trains in full precision under autocast
def fit_scale_and_noise(model: gpytorch.models.ExactGP, max_iter: int = 100) -> ScaleNoiseFit:
    r"""Set the outputscale, Gaussian noise and constant mean to their marginal-likelihood optimum, in closed form.

    The other hyperparameters and the feature map stay as they are; typically called after
    :func:`rfgp.set_num_features` (train small, predict big) to fit the scale and noise to the
    width the model predicts with.  Which parameters are fitted: the noise of a ``GaussianLikelihood``;
    the outputscale of a ``ScaleKernel`` that multiplies the whole training covariance (the model's
    ``covar_module``, or the tree inside a :class:`~rfgp.kernels.NystromKernel`); the constant of a
    ``ConstantMean``.  A parameter with ``requires_grad=False`` is kept (frozen).  Batched models
    (one GP per output or class) fit every batch member.  Prediction caches are cleared.

    Cost: one pass of the training features (ΦᵀΦ and Φᵀ[r, 1]) — chunked when the model's kernel
    is, and in float64 (a float32 model is copied: the loss subtracts two terms of size ‖r‖²/σ²) —
    and one F × F eigendecomposition in float64 (≈ 26 s of CPU at F = 4096 on 2 cores); the
    optimisation itself is O(F) per step.  L-BFGS starts from the model's values, or with the generalised
    least-squares constant at the model's scale and noise where that has the lower loss, and restarts with a fresh
    curvature history while a restart lowers the loss; where ``max_iter`` runs out at a gradient above 10⁻⁵ a
    ``NumericalWarning`` says so.

    Args:
        model: an ``ExactGP`` with training data, a ``GaussianLikelihood`` and an rfgp feature kernel.
        max_iter: L-BFGS iterations of the O(F) problem.

    Returns:
        A :class:`ScaleNoiseFit` with the loss before and after.

    Raises:
        TypeError: not an ``ExactGP``, a likelihood other than ``GaussianLikelihood`` (fixed or
            heteroscedastic noise: Dirichlet classification, ``train_Yvar``), or a training
            covariance that is not an rfgp feature root (an exact kernel, a sum with one).
        ValueError: no training data, or no parameter to fit (all frozen).
        FloatingPointError: the loss is not finite at the model's hyperparameters.
        RuntimeError: called under ``torch.inference_mode()``, which records no gradients for its L-BFGS.

    Example:
        >>> import torch, gpytorch, rfgp
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.rand(300, 1, generator=g, dtype=torch.float64)
        >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(300, generator=g, dtype=torch.float64)
        >>> kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()), 16, method="nystrom",
        ...                      x_sample=train_x, seed=0)
        >>> model = rfgp.models.ExactGPModel(train_x, train_y, gpytorch.likelihoods.GaussianLikelihood(), kernel)
        >>> history = rfgp.fit_mll(model.double())            # train at M = 16 landmarks
        >>> model = rfgp.set_num_features(model, 64)          # predict at 64
        >>> fit = rfgp.fit_scale_and_noise(model)             # the scale and noise for 64 landmarks
        >>> fit.fitted, fit.loss_after <= fit.loss_before
        (('outputscale', 'noise', 'constant'), True)
    """
    if not isinstance(model, gpytorch.models.ExactGP):
        raise TypeError(f"model must be a gpytorch.models.ExactGP, got {type(model).__name__}")
    refuse_inference_mode("fit_scale_and_noise")
    max_iter = check_positive_int(max_iter, "max_iter")
    if model.train_inputs is None or model.train_targets is None:
        raise ValueError("model has no training data (train_inputs/train_targets are None)")
    likelihood = model.likelihood
    if not isinstance(likelihood, GaussianLikelihood) or not isinstance(likelihood.noise_covar, HomoskedasticNoise):
        raise TypeError(
            f"fit_scale_and_noise needs a GaussianLikelihood with homoskedastic noise, got {type(likelihood).__name__} "
            "(fixed or per-point noise, as in Dirichlet classification or BoTorch's train_Yvar, has no noise to fit)"
        )
    was_training = model.training
    model.train()  # clears GPyTorch's prediction caches, which the new values invalidate
    try:
        return _fit(model, max_iter)
    finally:
        model.train(was_training)


def _fit(model: gpytorch.models.ExactGP, max_iter: int) -> ScaleNoiseFit:
    scale = _whole_covariance_scale(model.covar_module)
    mean = model.mean_module if isinstance(getattr(model, "mean_module", None), ConstantMean) else None
    noise_module = model.likelihood.noise_covar
    candidates = {
        "outputscale": None if scale is None else _Hyperparameter(scale, "outputscale"),
        "noise": _Hyperparameter(noise_module, "noise"),
        "constant": None if mean is None else _Hyperparameter(mean, "constant"),
    }
    fitted = {name: h for name, h in candidates.items() if h is not None and h.raw.requires_grad}
    if not fitted:
        raise ValueError("fit_scale_and_noise found nothing to fit: the noise, outputscale and constant mean are "
                         "frozen (requires_grad=False) or absent")
    problem = _Problem(model, scale, mean)
    values = {name: h.value() for name, h in candidates.items() if h is not None}
    loss_before = float(problem.loss(values))
    if not math.isfinite(loss_before):
        raise FloatingPointError(f"the marginal likelihood is not finite at the model's hyperparameters (loss "
                                 f"{loss_before}); fit the model first or check its data")
    start = values
    if "constant" in fitted:  # from the better of the model's constant and the GLS one at its scale and noise
        best = problem.best_constant(values)
        if best.numel() == values["constant"].numel():  # else a constant shared by members whose GLS ones differ
            other = {**values, "constant": best.reshape(values["constant"].shape)}
            if float(problem.loss(other)) < loss_before:
                start = other
    # unconstrained coordinates of the values themselves (softplus or sigmoid within the constraint's bounds), so that
    # constraints without a transform (BoTorch's noise: bounds for its optimiser) hold as well
    coordinates = {name: h.coordinate(start[name]).requires_grad_(True) for name, h in fitted.items()}

    def closure() -> Tensor:
        for t in coordinates.values():
            t.grad = None
        loss = problem.loss({**values, **{name: fitted[name].from_coordinate(t) for name, t in coordinates.items()}})
        loss.backward()
        return loss

    # L-BFGS restarted with a fresh curvature history while a restart still lowers the loss: from a start far from the
    # optimum (120 raw targets around 10⁴, the constant at 0, before the GLS start above) its one run stopped at a
    # gradient of 0.18, 0.27 per point above the optimum, which restarts reach
    iterations, previous = 0, math.inf
    while iterations < max_iter:
        optimizer = torch.optim.LBFGS(list(coordinates.values()), lr=1.0, max_iter=max_iter - iterations,
                                      line_search_fn="strong_wolfe", tolerance_grad=1e-10, tolerance_change=1e-14)
        with torch.enable_grad():
            optimizer.step(closure)
            loss = float(closure().detach())
        iterations += optimizer.state[next(iter(coordinates.values()))].get("n_iter", 0)
        if not loss < previous:
            break
        previous = loss
    gradient = max(float(t.grad.abs().max()) for t in coordinates.values())
    if iterations >= max_iter and gradient > _GRADIENT_TOLERANCE:
        warn_user(f"fit_scale_and_noise: L-BFGS used its max_iter={max_iter} iterations and stopped at a largest "
                  f"gradient entry of {gradient:.3g} > {_GRADIENT_TOLERANCE:g} (unconstrained coordinates of "
                  f"{', '.join(fitted)}): the values are not yet optimal; call it again or pass a larger max_iter",
                  NumericalWarning)
    originals = {name: h.raw.detach().clone() for name, h in fitted.items()}
    with torch.no_grad():
        for name, h in fitted.items():
            h.set(fitted[name].from_coordinate(coordinates[name]))
        loss_after = float(problem.loss({name: h.value() for name, h in candidates.items() if h is not None}))
        if not loss_after <= loss_before:  # NaN or no better (rounding at an optimum): keep the model as it was
            for name, h in fitted.items():
                h.raw.copy_(originals[name])
            loss_after = loss_before
    return ScaleNoiseFit(loss_before, loss_after, tuple(fitted), int(iterations))


#: the largest gradient entry (per data point, in the unconstrained coordinates) below which an exhausted max_iter
#: passes without a warning: rfgp.fit_mll's default gtol
_GRADIENT_TOLERANCE = 1e-5


class _Hyperparameter:
    """A positive or free GPyTorch hyperparameter (``outputscale``, ``noise``, ``constant``) of ``module``: its value in
    float64, its unconstrained coordinate within the constraint's bounds (:mod:`rfgp.core.bounds`), and the setter."""

    def __init__(self, module, name: str) -> None:
        self.module, self.name = module, name
        self.raw = getattr(module, f"raw_{name}")
        constraint = getattr(module, f"raw_{name}_constraint", None)
        bounds = (-math.inf, math.inf) if constraint is None else (constraint.lower_bound, constraint.upper_bound)
        self.lower, self.upper = (torch.as_tensor(b, dtype=torch.float64).expand_as(self.raw) for b in bounds)

    def value(self) -> Tensor:
        return getattr(self.module, self.name).detach().double()

    def set(self, value: Tensor) -> None:
        """Set the value, one unit in the last place inside a bound it lies on in the parameter's dtype: GPyTorch's
        transforms reach a bound only at a raw value of ±∞ (softplus⁻¹(0) = −∞), which would be stored and make the
        next optimiser step NaN (a noise-free target's noise optimum lies below the floor 10⁻⁴)."""
        value = value.to(self.raw.dtype)
        lower, upper = self.lower.to(value), self.upper.to(value)
        value = torch.minimum(torch.maximum(value, torch.nextafter(lower, upper)), torch.nextafter(upper, lower))
        setattr(self.module, self.name, value)

    def coordinate(self, value: Tensor) -> Tensor:
        return bounded_coordinate(value.reshape(self.raw.shape), self.lower, self.upper)

    def from_coordinate(self, t: Tensor) -> Tensor:
        return bounded_value(t, self.lower, self.upper)


def _whole_covariance_scale(covar: Kernel) -> ScaleKernel | None:
    """The ScaleKernel whose outputscale multiplies the whole training covariance, if there is one."""
    if isinstance(covar, ScaleKernel):
        return covar
    if isinstance(covar, NystromKernel) and isinstance(covar.base_kernel, ScaleKernel):
        return covar.base_kernel  # Φ = K(X, Z)L⁻ᵀ scales as √s: K and L = chol(K(Z, Z) + relative jitter) do
    return None


def _float64_twin(model: gpytorch.models.ExactGP) -> gpytorch.models.ExactGP:
    """The model in float64 (a copy unless it is float64 already; the model itself where float64 is unsupported).

    The O(F) loss subtracts ‖r‖²/σ² and (s/σ²)·hᵀ(sΦᵀΦ + σ²I)⁻¹h, both large when σ² is small: a ΦᵀΦ
    accumulated in float32 moves it by ~10⁻⁴ per data point (s/σ² ≈ 3000), a float64 Gram of the
    same features by ~10⁻¹⁰ — one statistics pass at twice the float32 cost.
    """
    if model.train_targets.dtype == torch.float64 or model.train_targets.device.type == "mps":
        return model
    return copy.deepcopy(model).double()


class _Problem:
    """The O(F) marginal likelihood of (s, σ², μ) from one eigendecomposition of the unscaled ΦᵀΦ."""

    def __init__(self, model: gpytorch.models.ExactGP, scale: ScaleKernel | None, mean: ConstantMean | None) -> None:
        self.model, self.scale, self.mean = model, scale, mean
        with torch.no_grad():
            exact = _float64_twin(model)
            output = exact(*exact.train_inputs)
            covar = output.lazy_covariance_matrix
            covar = evaluated_covariance(covar)
            if not hasattr(covar, "feature_statistics") or isinstance(covar, ComplexFeatureRootLinearOperator):
                raise TypeError(
                    f"fit_scale_and_noise needs a training covariance ΦΦᵀ from an rfgp feature kernel (rfgp.sketch), "
                    f"got {type(covar).__name__} from {type(model.covar_module).__name__}"
                )
            # r = y − m(x) + μ: the residual of every mean part that is not fitted (m₀), μ added back
            residual = exact.train_targets - output.mean
            if mean is not None:
                residual = residual + mean.constant.detach().double().unsqueeze(-1)
            # centred at its mean r̄ (the loss takes μ − r̄): ‖r − μ1‖² = ‖r‖² − 2μ1ᵀr + μ²N and VᵀΦᵀ(r − μ1) formed
            # from r itself cancel to the digits of a residual far from 0 (raw targets around 10⁴: the loss was
            # off by 10⁻⁶ per point and L-BFGS stopped at a gradient of 0.13, 0.12 per point above the optimum)
            self.reference = residual.double().mean(-1)
            residual = residual - self.reference.unsqueeze(-1).to(residual)
            ones = torch.ones_like(residual)
            gram, cross = covar.feature_statistics(ones[..., :1], torch.stack([residual, ones], -1))
            s0 = (scale.outputscale.detach() if scale is not None else torch.ones((), device=gram.device)).double()
            eigenvalues, vectors = torch.linalg.eigh(gram.double() / s0.unsqueeze(-1).unsqueeze(-1))
            self.eigenvalues = eigenvalues.clamp_min(0.0)  # ΦᵀΦ ⪰ 0: negative values are rounding
            self.projected = vectors.mT @ (cross.double() / s0.sqrt().unsqueeze(-1).unsqueeze(-1))  # VᵀΦ₀ᵀ[r, 1]
            r64 = residual.double()
            self.rr, self.r1 = (r64 * r64).sum(-1), r64.sum(-1)
            self.num_data, self.width = residual.shape[-1], self.eigenvalues.shape[-1]
            self.batch_shape = torch.broadcast_shapes(residual.shape[:-1], self.eigenvalues.shape[:-1])

    def loss(self, values: dict[str, Tensor]) -> Tensor:
        """fit_mll's loss Σ_batch (−log p(y) − Σ log priors)/N at the float64 ``values`` (noise ``(*batch, 1)``)."""
        dtype = torch.float64
        s = values.get("outputscale", torch.ones((), dtype=dtype))
        noise = values["noise"].squeeze(-1)
        mu = values.get("constant", torch.zeros((), dtype=dtype)) - self.reference  # μ − r̄: the residual is centred
        n, lam = self.num_data, self.eigenvalues
        c = self.projected[..., 0] - mu.unsqueeze(-1) * self.projected[..., 1]
        squared = self.rr - 2 * mu * self.r1 + mu * mu * n
        s_, noise_ = s.unsqueeze(-1), noise.unsqueeze(-1)
        quad = squared / noise - (s / noise) * (c * c / (s_ * lam + noise_)).sum(-1)
        logdet = torch.log(s_ * lam + noise_).sum(-1) + (n - self.width) * torch.log(noise)
        negative_log_likelihood = 0.5 * (quad + logdet + n * math.log(2 * math.pi))
        return (negative_log_likelihood.sum() - self.log_prior(values)) / n

    def best_constant(self, values: dict[str, Tensor]) -> Tensor:
        """The constant μ that minimises the data term at the outputscale and noise of ``values`` (generalised least
        squares, 1ᵀK⁻¹r/1ᵀK⁻¹1 with K⁻¹ by Woodbury as in :meth:`loss`; the constant's prior not included):
        μ − r̄ = (1ᵀr_c − Σᵢ wᵢ p₀ᵢ p₁ᵢ)/(N − Σᵢ wᵢ p₁ᵢ²), wᵢ = s/(sλᵢ + σ²), p = VᵀΦᵀ[r_c, 1]."""
        s = values.get("outputscale", torch.ones((), dtype=torch.float64)).unsqueeze(-1)
        weights = s / (s * self.eigenvalues + values["noise"].squeeze(-1).unsqueeze(-1))
        p0, p1 = self.projected[..., 0], self.projected[..., 1]
        return self.reference + (self.r1 - (weights * p0 * p1).sum(-1)) / (self.num_data - (weights * p1 * p1).sum(-1))

    def log_prior(self, values: dict[str, Tensor]) -> Tensor:
        """The log priors of the model, those on the outputscale, noise and constant evaluated at ``values``, as
        fit_mll's loss holds them: GPyTorch's ``ExactMarginalLogLikelihood`` adds each prior's log density to the
        members' losses summed over all but their batch dimensions (a member's own hyperparameter to its loss, a
        shared one to every member's), and the members' losses are summed."""
        owners = {id(self.scale): "outputscale", id(self.model.likelihood.noise_covar): "noise",
                  id(self.mean): "constant"}
        ndim = len(self.batch_shape)
        total = torch.zeros(self.batch_shape, dtype=torch.float64, device=self.eigenvalues.device)
        for _, module, prior, get, _ in self.model.named_priors():
            current = get(module)
            name = owners.get(id(module))
            value = values[name].reshape(current.shape) if name in values else current.detach().double()
            term = prior.log_prob(value).double()
            total = total + term.reshape(*term.shape[:ndim], -1).sum(-1)
        return total.sum()
