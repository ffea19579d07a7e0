"""Posterior function draws of a random-feature GP in weight space: Thompson sampling at featurisation cost.

With k̂(x, y) = Φ(x)ᵀΦ(y) (outputscale folded into Φ) and Gaussian noise D, the GP is the
Bayesian linear model f(x) = μ(x) + Φ(x)ᵀw, w ~ N(0, I), whose posterior is

    w | y ~ N(A⁻¹ΦᵀD⁻¹(y − μ), A⁻¹),        A = I + ΦᵀD⁻¹Φ = LLᵀ        (F × F)

(paper 000 App. D, Eqs. 88–90; Wilson et al. 2020 §3 "weight-space" sampling is exact here,
because the model's kernel *is* the finite feature map).  A draw w ~ N(m, A⁻¹) is a whole function:
:class:`PosteriorPaths` evaluates S of them at n points for one featurisation and an (n × F)(F × S)
product, chunked under :class:`rfgp.settings.memory_budget`, so Thompson sampling over 10⁵–10⁶
candidates costs what one prediction costs — against an n × n root decomposition of the joint
posterior covariance for sampling the posterior directly.  The draws come from the model's
prediction strategy (:meth:`rfgp.FeatureSpacePredictionStrategy.weight_samples`) in its cheaper
algebra: w = m + L⁻ᵀz from the F × F caches (computed once from the training feature statistics,
chunk by chunk when the training operator is chunked), or, when N ≲ F, Matheron's rule with the
N × N factor of ΦΦᵀ + D, so a wide feature map over few points never forms an F × F matrix.

**Bias-corrected variance.** For feature maps whose expected diagonal falls short of the kernel's
(``has_variance_bias``: truncated Maclaurin, fitted SRF densities, truncated Taylor sketches) the
model's posterior variance is Φ(x)ᵀA⁻¹Φ(x) + c(x), c(x) = k(x, x) − E[k̂(x, x)] ≥ 0 (paper 000
§5.6).  The correction is a diagonal term with no cross-covariance, so a function draw cannot
carry it; with ``variance_correction=True`` (the default) every evaluation adds independent noise
√c(x)·ε, ε ~ N(0, 1), per point and per path, so that the draws' marginal variance matches the
model's posterior variance (their covariance between distinct points is that of k̂).  Such
draws are fresh at every call; pass ``variance_correction=False`` for deterministic paths.
"""

from __future__ import annotations

import gpytorch
import torch
from gpytorch.kernels import ScaleKernel
from torch import Tensor, nn

from ..core.draws import standard_normal
from ..core.dtypes import in_full_precision
from ..core.settings import resolve_chunk_size
from ..core.validation import check_positive_int
from ..inference.chunking import chunk_slices
from ..inference.prediction import draw_fingerprint
from ..kernels.combinations import is_feature_kernel, kernel_diag_moments, kernel_features
from .kernel_inputs import covar_module_inputs


def _base_kernel(kernel):
    return _base_kernel(kernel.base_kernel) if isinstance(kernel, ScaleKernel) else kernel


def check_path_kernel(kernel, what: str = "model.covar_module") -> None:
    """Raise unless ``kernel`` is a real-feature rfgp kernel (optionally inside ``ScaleKernel``) that paths can use."""
    if not is_feature_kernel(kernel):
        raise TypeError(
            f"{what} must be an rfgp feature kernel (rfgp.kernels.*, optionally inside ScaleKernel, or "
            f"rfgp.sketch(...) of a GPyTorch kernel), got {type(kernel).__name__}"
        )
    if getattr(_base_kernel(kernel), "complex_posterior", False):
        raise ValueError(
            f"{what} has complex_posterior=True: its posterior is the complex-feature GP of paper 000 App. D, "
            "which real weight-space paths do not represent; build the kernel with complex_posterior=False"
        )


class PosteriorPaths(nn.Module):
    r"""S posterior function draws f_s(x) = μ(x) + Φ(x)ᵀw_s of a fitted random-feature GP.

    Build it with :func:`posterior_paths`.  Calling it on x ``(..., n, d)`` (``(n,)`` is one column, as ``model(x)``
    reads it) returns ``(S, *batch, n)`` for single-output models and ``(S, *batch, n, p)`` for operator-valued
    kernels with p outputs per input.  For a BoTorch model x is what ``model.posterior`` takes: the paths apply the
    model's ``input_transform`` as its posterior does in eval mode, and return values on the outcome scale,
    ``outcome_transform.untransform`` of the paths' values; a multi-output model's m outputs are the last batch
    dimension, ``(S, *batch, m, n)``, as BoTorch's paths.

    The weights belong to the kernel's draws at :func:`posterior_paths`: once they are re-drawn (``resample()``,
    :func:`rfgp.set_num_features`, a state loaded into the kernel alone) calling the paths raises instead of pairing
    w_s with other features (a state loaded into the paths, weights and kernel together, is theirs).

    Attributes:
        weights: ``(S, *batch, F)`` the drawn w_s.
    """

    def __init__(self, mean_module: nn.Module, covar_module: nn.Module, weights: Tensor, num_outputs: int,
                 variance_correction: bool, generator: torch.Generator | None, input_transform: nn.Module | None = None,
                 outcome_transform: nn.Module | None = None, num_outcomes: int = 1) -> None:
        super().__init__()
        self.mean_module = mean_module
        self.covar_module = covar_module
        self.input_transform = input_transform
        self.outcome_transform = outcome_transform
        self.num_outcomes = num_outcomes
        self.register_buffer("weights", weights)
        self.num_outputs = num_outputs
        self.variance_correction = variance_correction
        self.generator = generator
        self.draws = draw_fingerprint(covar_module)
        self.register_load_state_dict_post_hook(_record_draws)

    @property
    def num_paths(self) -> int:
        return self.weights.shape[0]

    @in_full_precision  # Φ(x)W is a matmul that an enclosing autocast would run in half precision
    def forward(self, x: Tensor) -> Tensor:
        if x.dim() == 1:  # n points of one column, as ExactGP.__call__ reads them (GPyTorch's 1-D tutorials)
            x = x.unsqueeze(-1)
        if x.dim() < 2:
            raise ValueError(f"x must have shape (..., n, d), or (n,) for one input column, got {tuple(x.shape)}")
        x = self._transformed_inputs(x)
        if draw_fingerprint(self.covar_module) != self.draws:
            raise RuntimeError(
                "the kernel's random features were re-drawn after these posterior paths were drawn "
                "(feature_map.resample(), rfgp.set_num_features, or a state dict loaded into the kernel), so their "
                "weights belong to other features; draw them again with rfgp.sampling.posterior_paths(model, ...) "
                "(after model.train(); model.eval())"
            )
        weights = self.weights.movedim(0, -1)  # (*batch, F, S)
        num_features = weights.shape[-2]
        rows = x.shape[-2] * self.num_outputs
        batch_numel = max(weights[..., 0, 0].numel(), x[..., 0, 0].numel())
        chunk = resolve_chunk_size(rows, num_features, batch_numel, x.dtype) or rows
        chunk = max(1, chunk // self.num_outputs)
        values = torch.cat(
            [self._chunk_values(x[..., points, :], weights) for points in chunk_slices(x.shape[-2], chunk)], dim=-2
        )  # (*batch, n·p, S)
        values = values.movedim(-1, 0)
        if self.num_outputs > 1:
            values = values.unflatten(-1, (x.shape[-2], self.num_outputs))
        return self._on_outcome_scale(values + self.mean_module(x), x)

    def _transformed_inputs(self, x: Tensor) -> Tensor:
        """x as ``model.posterior`` passes it to the model in eval mode: ``input_transform(x)``, which applies the
        transform where its ``transform_on_eval`` is set (and, under ``botorch.models.transforms.input.fantasize``,
        its ``transform_on_fantasize``)."""
        if self.input_transform is None:
            return x
        if any(module.training for module in self.input_transform.modules()):
            raise ValueError(
                f"the model's input_transform ({type(self.input_transform).__name__}) is in training mode "
                "(model.train()): posterior paths apply it as model.posterior does, in eval mode, and in training mode "
                "it would transform x by its transform_on_train rule (a Normalize(learn_bounds=True) learns its bounds "
                "from x); call model.eval() first"
            )
        return self.input_transform(x)

    def _on_outcome_scale(self, values: Tensor, x: Tensor) -> Tensor:
        """Path values f(x) on the outcome scale, ``outcome_transform.untransform(f, X=x)`` (x transformed, as
        ``model.posterior`` passes it): g⁻¹(f) of a Gaussian path f is a draw of the untransformed posterior
        (Standardize: μ_y + σ_y f; Log: exp f; Power(p): f^(1/p); Bilog: sign(f)(e^|f| − 1); a chain in reverse).
        BoTorch's m outputs are the values' last batch dimension and the transform's last dimension."""
        if self.outcome_transform is None:
            return values
        if self.num_outcomes == 1:
            return self.outcome_transform.untransform(values.unsqueeze(-1), X=x)[0].squeeze(-1)
        return self.outcome_transform.untransform(values.transpose(-1, -2), X=x)[0].transpose(-1, -2)

    def _chunk_values(self, x: Tensor, weights: Tensor) -> Tensor:
        values = kernel_features(self.covar_module, x) @ weights
        if not self.variance_correction:
            return values
        moments = kernel_diag_moments(self.covar_module, x)
        if moments is None:
            return values
        correction = (moments[0] - moments[1]).clamp_min(0.0).unsqueeze(-1)
        noise = standard_normal(values.shape, values, self.generator)  # on the generator's device, then moved
        return values + correction.sqrt() * noise


def _record_draws(paths: PosteriorPaths, incompatible_keys) -> None:
    """After a state loaded into the paths (weights and kernel together): the weights belong to the loaded draws."""
    paths.draws = draw_fingerprint(paths.covar_module)


def _botorch_transforms(model) -> tuple[nn.Module | None, nn.Module | None]:
    """The model's BoTorch ``input_transform`` and ``outcome_transform`` (``None`` where absent), the outcome transform
    checked to untransform samples: one whose ``untransform`` is not defined (BoTorch's base class raises
    ``NotImplementedError``) has no outcome-scale value of a path and is refused by name."""
    input_transform = getattr(model, "input_transform", None)
    outcome_transform = getattr(model, "outcome_transform", None)
    input_transform = input_transform if isinstance(input_transform, nn.Module) else None
    if not isinstance(outcome_transform, nn.Module):
        return input_transform, None
    num_outputs = getattr(model, "num_outputs", 1)  # BoTorch's m: targets (*batch, m, n) if m > 1, else (*batch, n)
    first_targets = model.train_targets[..., :1].reshape(-1, num_outputs)[:1]  # (1, m): values untransform accepts
    first_input = model.train_inputs[0].reshape(-1, model.train_inputs[0].shape[-1])[:1]
    try:
        outcome_transform.untransform(first_targets, X=first_input)
    except NotImplementedError as error:
        raise ValueError(
            f"{type(model).__name__} has an outcome_transform ({type(outcome_transform).__name__}) whose untransform "
            f"of samples is not defined ({error}): posterior paths return values on the outcome scale, "
            "outcome_transform.untransform of the paths' values; give the transform an untransform or build the "
            "model without it"
        ) from None
    return input_transform, outcome_transform


def posterior_paths(model: gpytorch.models.ExactGP, num_paths: int, generator: torch.Generator | None = None,
                    variance_correction: bool = True) -> PosteriorPaths:
    """Draw ``num_paths`` posterior functions f(x) = μ(x) + Φ(x)ᵀw, w ~ N(A⁻¹ΦᵀD⁻¹(y − μ), A⁻¹).

    Args:
        model: an ``ExactGP`` with ``mean_module`` and an rfgp ``covar_module`` (a feature kernel,
            optionally inside ``ScaleKernel``), a Gaussian likelihood and its training data; its
            current hyperparameters are used.
        num_paths: S.
        generator: source of the weight draws and of the bias-correction noise, on any device: they are drawn on
            the generator's device and moved to the model's (the same draws for a model on any device).  ``None``:
            torch's global generator, on the model's device.
        variance_correction: add the bias correction c(x) as independent per-point noise (see the
            module docstring); ignored for maps without a variance bias.

    Returns:
        :class:`PosteriorPaths` (an ``nn.Module``; the drawn weights are a buffer).  A BoTorch model's transforms
        are applied around the paths as ``model.posterior`` applies them: x is input-transformed (``Normalize``,
        ``Warp``, ...; in eval mode, so calling the paths after ``model.train()`` raises), the values f(x), with
        any bias-correction noise, are drawn in the model's transformed outcome space and returned as
        ``outcome_transform.untransform(f, X=x)`` (``Standardize``, ``StratifiedStandardize``, ``Log``,
        ``Power``, ``Bilog``, ``ChainedOutcomeTransform``): an untransformed Gaussian draw, so the paths' mean and
        variance are ``model.posterior(x).mean`` and ``.variance`` (Log: the log-normal's).

    Raises:
        ValueError: the model's ``outcome_transform`` does not define ``untransform`` of samples (it raises
            ``NotImplementedError``): a path has no value on the outcome scale.
        ValueError: the model's ``forward`` transforms its inputs before ``covar_module`` sees them (deep kernel
            learning; :func:`~rfgp.models.kernel_inputs.covar_module_inputs`): paths of x would skip the network.

    Example:
        >>> import torch, gpytorch, rfgp
        >>> g = torch.Generator().manual_seed(0)
        >>> train_x = torch.rand(200, 1, generator=g, dtype=torch.float64)
        >>> train_y = torch.sin(6 * train_x[:, 0]) + 0.1 * torch.randn(200, generator=g, dtype=torch.float64)
        >>> kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(512, seed=0))
        >>> likelihood = gpytorch.likelihoods.GaussianLikelihood()
        >>> model = rfgp.models.ExactGPModel(train_x, train_y, likelihood, kernel).double()
        >>> _ = model.eval()
        >>> paths = rfgp.sampling.posterior_paths(model, num_paths=16, generator=torch.Generator().manual_seed(0))
        >>> candidates = torch.rand(10**4, 1, dtype=torch.float64)
        >>> values = paths(candidates)                      # (16, 10**4), one featurisation
        >>> best = candidates[values.argmax(-1)]            # 16 Thompson-sampling proposals
        >>> best.shape
        torch.Size([16, 1])
    """
    num_paths = check_positive_int(num_paths, "num_paths")
    if not isinstance(model, gpytorch.models.ExactGP):
        raise TypeError(f"model must be a gpytorch.models.ExactGP, got {type(model).__name__}")
    for name in ("mean_module", "covar_module"):
        if not isinstance(getattr(model, name, None), nn.Module):
            raise TypeError(
                f"posterior paths evaluate model.mean_module and model.covar_module (GPyTorch's names for the mean and "
                f"the kernel), but {type(model).__name__} has no module {name!r}: register them under these names"
            )
    check_path_kernel(model.covar_module)
    if model.train_inputs is None:
        raise ValueError("model has no training data (model.train_inputs is None); posterior paths need it")
    input_transform, outcome_transform = _botorch_transforms(model)
    if covar_module_inputs(model, model.train_inputs[0]) is not model.train_inputs[0]:
        raise ValueError(
            f"{type(model).__name__}.forward passes its inputs to covar_module transformed (a deep kernel's network, "
            "an input warping): posterior paths evaluate mean_module and covar_module on x itself, so they would "
            "skip that transformation; sample the posterior at the candidates instead, "
            "model(x).rsample(torch.Size([S])), or build an ExactGP on the transformed inputs"
        )
    # detached: paths are functions of x, not of the hyperparameters
    weights = _prediction_strategy(model).weight_samples(num_paths, generator).detach()
    num_outputs = int(model.covar_module.num_outputs_per_input(model.train_inputs[0], model.train_inputs[0]))
    return PosteriorPaths(model.mean_module, model.covar_module, weights.squeeze(-1), num_outputs,
                          variance_correction, generator, input_transform, outcome_transform,
                          getattr(model, "num_outputs", 1))


def _prediction_strategy(model):
    """The model's eval-mode rfgp prediction strategy (built if needed), which draws the posterior weights."""
    if model.training:
        raise ValueError("call model.eval() first: posterior paths use the eval-mode prediction caches")
    if model.prediction_strategy is None:
        with torch.no_grad():  # builds the prediction strategy (no global skip_posterior_variances: threads)
            model(*(x[..., :1, :] for x in model.train_inputs))
    strategy = model.prediction_strategy
    if not hasattr(strategy, "weight_samples"):
        raise TypeError(
            f"the model's prediction strategy {type(strategy).__name__} has no feature-space caches; "
            "posterior paths need rfgp's FeatureSpacePredictionStrategy (an rfgp covar_module)"
        )
    return strategy
