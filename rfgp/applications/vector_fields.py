"""Vector-field tools: prior/posterior field samples as functions, and autograd physics checks.

A *field* here is any callable ``x (..., n, d) -> f(x) (..., n, p)`` whose value at a point
depends on that point only (a GP mean, or one weight-space sample).  Samples are returned as
fields too, so their divergence and curl can be checked with autograd:

* feature kernels (sketched, ORFF): f(x) = Φ(x)θ with θ ~ N(0, I) (prior) or
  θ ~ N(A⁻¹ΦᵀD⁻¹(y − μ), A⁻¹) (posterior) — exact samples of the random-feature GP;
* exact kernels: values sampled jointly at anchor points X and extended by kernel
  interpolation f(x) = K(x, X)K(X, X)⁻¹f(X), which interpolates the sample and lies in the span
  of the kernel's columns, so it satisfies the same linear constraints (zero curl/divergence).
"""

from __future__ import annotations

import math
from typing import Callable

import gpytorch
import torch
from linear_operator.utils.cholesky import psd_safe_cholesky
from torch import Tensor

from ..core.dtypes import in_full_precision
from ..core.validation import check_finite, check_positive_float, check_positive_int, check_tensor_dtype
from ..inference.chunking import chunk_slices
from ..inference.multioutput import MultitaskFeatureSpacePredictionStrategy, kernel_num_outputs
from ..inference.multioutput_chunking import points_per_block
from ..inference.prediction import draw_fingerprint
from ..kernels.combinations import FeatureSumKernel, is_feature_kernel, kernel_features, unwrap_scale

Field = Callable[[Tensor], Tensor]


@in_full_precision  # its autograd.grad is a backward pass: under autocast it would run in half precision
def jacobian(field: Field, x: Tensor) -> Tensor:
    """J[..., i, a, b] = ∂fₐ/∂x_b at every point xᵢ, by autograd; shape ``(..., n, p, d)``.

    If ``field`` returns leading sample dimensions that ``x`` lacks, ``x`` is expanded to them
    so that each sample gets its own Jacobian.  An enclosing ``torch.autocast`` is switched off for the field and
    its derivatives (:func:`~rfgp.core.dtypes.full_precision`): the check is made in ``x``'s dtype.
    """
    if not callable(field):
        raise TypeError(f"field must be a callable x -> f(x) (e.g. posterior_mean_field(model)), got "
                        f"{type(field).__name__}")
    check_tensor_dtype(x, "x")
    if x.dim() < 2:  # a (d,) point or (n,) 1-D inputs: ambiguous, and a field takes (..., n, d)
        raise ValueError(f"x must hold points as (..., n, d), got shape {tuple(x.shape)}: pass x.reshape(1, -1) for "
                         "one point in d dimensions, or x.reshape(-1, 1) for n points in one dimension")
    check_finite(x, "x")
    leaf = x.detach().requires_grad_(True)
    with torch.enable_grad():
        values = field(leaf)
        if not torch.is_tensor(values) or not values.requires_grad:
            got = f"a {type(values).__name__}" if not torch.is_tensor(values) else "values detached from x"
            raise TypeError(f"field must return a tensor computed from x by differentiable torch operations (not under "
                            f"torch.no_grad, .detach() or NumPy), got {got}")
        if values.dtype != x.dtype:
            raise TypeError(f"the field returned dtype {values.dtype} for x of dtype {x.dtype}: pass x in the "
                            f"dtype of the model behind the field ({values.dtype})")
        if values.dim() > x.dim():
            leaf = x.detach().expand(*values.shape[:-2], *x.shape[-2:]).clone().requires_grad_(True)
            values = field(leaf)
        rows = [
            torch.autograd.grad(values[..., a].sum(), leaf, retain_graph=a + 1 < values.shape[-1])[0]
            for a in range(values.shape[-1])  # a loop over the p ≤ 3 outputs, not over data
        ]
    return torch.stack(rows, dim=-2)


def divergence(field: Field, x: Tensor) -> Tensor:
    """∇·f = Σₐ ∂fₐ/∂xₐ at every point, shape ``(..., n)`` (needs p = d)."""
    jac = jacobian(field, x)
    _check_square(jac)
    return jac.diagonal(dim1=-2, dim2=-1).sum(-1)


def curl(field: Field, x: Tensor) -> Tensor:
    """∇×f: the scalar ∂f₂/∂x₁ − ∂f₁/∂x₂ in 2-D (shape ``(..., n)``), the vector curl in 3-D (``(..., n, 3)``).

    For other d use ``J − Jᵀ`` from :func:`jacobian` (zero for gradient fields in any d).
    """
    jac = jacobian(field, x)
    _check_square(jac)
    d = jac.shape[-1]
    if d == 2:
        return jac[..., 1, 0] - jac[..., 0, 1]
    if d == 3:
        return torch.stack(
            (jac[..., 2, 1] - jac[..., 1, 2], jac[..., 0, 2] - jac[..., 2, 0], jac[..., 1, 0] - jac[..., 0, 1]), -1
        )
    raise ValueError(f"curl is defined here for d = 2 or 3 inputs, got d={d}; use jacobian(field, x) and J − Jᵀ")


def _check_square(jac: Tensor) -> None:
    if jac.shape[-1] != jac.shape[-2]:
        raise ValueError(
            f"divergence/curl need a field with as many outputs as input dimensions; got p={jac.shape[-2]} "
            f"outputs for d={jac.shape[-1]}"
        )


def _feature_field(kernel, weights: Tensor, num_outputs: int, offset: Field | None = None) -> Field:
    """x ↦ (Φ(x)θₛ) reshaped to (S, n, p) for weight samples θ of shape (S, F).

    The points are featurised in blocks whose n·p × F root (one per member of the batch of x and of the kernel) fits
    :class:`rfgp.settings.memory_budget` (the whole
    root of a 10⁵-point grid in 3-D at F = 1024 is 2.3 GiB in float64), so peak memory is bounded when no
    gradient is recorded; under autograd (:func:`jacobian`) the blocks' graphs are kept, as for any computation.
    θ belongs to the kernel's draws at this call: once they are re-drawn (``resample()``, :func:`rfgp.set_num_features`,
    a loaded state with other draws) the field raises instead of pairing θ with other features.
    """
    draws = draw_fingerprint(kernel)

    def block(x: Tensor) -> Tensor:
        features = kernel_features(kernel, x).to(weights.dtype)  # (..., c·p, F)
        if features.dim() == 2:
            values = (features @ weights.mT).mT
        else:
            values = (features @ weights.unsqueeze(-1)).squeeze(-1)
        values = values.reshape(*values.shape[:-1], -1, num_outputs)
        return values if offset is None else values + offset(x)

    @in_full_precision  # Φ(x)θ is a matmul that an enclosing autocast would run in half precision
    def field(x: Tensor) -> Tensor:
        if draw_fingerprint(kernel) != draws:
            raise RuntimeError(
                "the kernel's random features were re-drawn after this field was drawn (feature_map.resample(), "
                "rfgp.set_num_features, or a state dict loaded into the kernel), so its weights belong to other "
                "features; draw the field again (prior_field_samples, posterior_field_samples, "
                "posterior_component_fields)"
            )
        num_points = x.shape[-2]
        # the features of x have the batch shape of x and of the kernel (θ's, after the sample axis) together
        batch = math.prod(torch.broadcast_shapes(x.shape[:-2], weights.shape[1:-1]))
        points = points_per_block(num_points, num_outputs, weights.shape[-1], batch, weights.dtype)
        if points is None:
            return block(x)
        return torch.cat([block(x[..., rows, :]) for rows in chunk_slices(num_points, points)], -2)

    return field


def prior_field_samples(
    kernel,
    num_samples: int,
    anchors: Tensor | None = None,
    generator: torch.Generator | None = None,
    jitter: float = 1e-8,
) -> Field:
    """Draw ``num_samples`` zero-mean prior vector fields of a (multi-output) kernel.

    Args:
        kernel: an rfgp feature kernel (weight-space samples, exact for the sketched GP) or an
            exact kernel (then ``anchors`` is required).
        num_samples: S.
        anchors: ``(N, d)`` points where an exact kernel's sample is drawn jointly (required); for
            feature kernels only a probe that sizes the features.
        generator: torch generator of the Gaussian draws.
        jitter: added to the anchor Gram matrix's diagonal (exact kernels).

    Returns:
        A field ``x (n, d) | (S, n, d) -> (S, n, p)``; a kernel with ``batch_shape`` B gives every member its own
        S samples, ``x (n, d) | (S, *B, n, d) -> (S, *B, n, p)``.
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    jitter = check_positive_float(jitter, "jitter", allow_zero=True)
    if is_feature_kernel(kernel):
        if anchors is None:
            raise ValueError("feature kernels need a probe input to size their features: pass anchors=x (n, d)")
        with torch.no_grad():  # one point sizes the root: the whole n·p × F root of the anchors may exceed the budget
            root = kernel_features(kernel, anchors[..., :1, :])
        num_outputs = root.shape[-2]
        weights = torch.randn(num_samples, *root.shape[:-2], root.shape[-1], generator=generator, dtype=root.dtype)
        return _feature_field(kernel, weights.to(root.device), num_outputs)  # θ (S, *batch, F)
    if anchors is None:
        raise ValueError(f"anchors (N, d) are required to sample the exact kernel {type(kernel).__name__}")
    with torch.no_grad():
        gram = kernel(anchors).to_dense()
        chol = psd_safe_cholesky(gram + jitter * torch.eye(gram.shape[-1], dtype=gram.dtype, device=gram.device))
        normal = torch.randn(*gram.shape[:-1], num_samples, generator=generator, dtype=gram.dtype).to(gram.device)
        # K⁻¹f(X) for f(X) = Lε: (LLᵀ)⁻¹Lε = L⁻ᵀε, one triangular solve
        coefficients = torch.linalg.solve_triangular(chol.mT, normal, upper=True).movedim(-1, 0)  # (S, *batch, N·p)
    num_outputs = kernel_num_outputs(kernel, anchors)

    def field(x: Tensor) -> Tensor:
        cross = kernel(x, anchors).to_dense()  # (..., n·p, N·p)
        values = (cross @ coefficients.unsqueeze(-1)).squeeze(-1) if cross.dim() > 2 else (cross @ coefficients.mT).mT
        return values.reshape(*values.shape[:-1], -1, num_outputs)

    return field


def posterior_field_samples(model, num_samples: int, generator: torch.Generator | None = None) -> Field:
    """Draw ``num_samples`` posterior vector fields of a trained multi-output feature GP.

    θ ~ N(E[θ | y], A⁻¹) drawn by the model's
    :class:`~rfgp.inference.multioutput.MultitaskFeatureSpacePredictionStrategy` in its cheaper algebra (F × F
    caches, or Matheron's rule with the N·p × N·p factor when N·p ≲ F; built on first use), f(x) = μ(x) + Φ(x)θ.
    The model must be an ExactGP whose ``covar_module`` is an rfgp multi-output feature kernel and whose
    ``forward`` returns ``MultitaskMultivariateNormal(mean_module(x), covar_module(x))`` (e.g.
    :class:`~rfgp.models.multioutput.MultiOutputGPModel`).
    """
    num_samples = check_positive_int(num_samples, "num_samples")
    kernel = model.covar_module
    if not is_feature_kernel(kernel):
        if isinstance(kernel, gpytorch.kernels.AdditiveKernel) and all(map(is_feature_kernel, kernel.kernels)):
            advice = ("GPyTorch's k₁ + k₂ of rfgp kernels; use MultiOutputFeatureSumKernel(k₁, k₂) (root [R₁, R₂], "
                      "e.g. the Helmholtz kernel) instead")
        else:
            advice = "for exact kernels sample model(x) at fixed points instead"
        raise TypeError(f"posterior_field_samples needs an rfgp feature kernel, got {type(kernel).__name__}: {advice}")
    model.eval()
    train_x = model.train_inputs[0]
    with torch.no_grad():
        model(train_x[..., :1, :])  # builds the prediction strategy and its cache
        strategy = model.prediction_strategy
        if not isinstance(strategy, MultitaskFeatureSpacePredictionStrategy):
            raise TypeError(f"expected a MultitaskFeatureSpacePredictionStrategy, got {type(strategy).__name__}")
        weights = strategy.weight_samples(num_samples, generator).squeeze(-1)  # (S, F), θ ~ N(E[θ | y], A⁻¹)
    num_outputs = kernel_num_outputs(model.covar_module, train_x)
    return _feature_field(model.covar_module, weights, num_outputs, offset=model.mean_module)


def posterior_component_fields(model) -> list[Field]:
    """Posterior mean of every component of a multi-output feature-sum model.

    The model's ``covar_module`` is a :class:`~rfgp.kernels.MultiOutputFeatureSumKernel`, or the
    :class:`~rfgp.kernels.FeatureSumKernel` that :func:`rfgp.sketch` makes of GPyTorch's sum of multi-output kernels
    (e.g. of an exact curl-free plus divergence-free Helmholtz kernel; refused before), optionally inside
    ``ScaleKernel``.  With K̂ = Σᵢ RᵢRᵢᵀ the weights split as θ = [θ₁, …], and component i has posterior mean
    Rᵢ(x)E[θᵢ | y] (e.g. the curl-free and divergence-free parts of a Helmholtz fit); the
    components sum to the posterior mean minus the prior mean.  A ``ScaleKernel`` around the sum (root
    √s·[R₁, …]) scales every component by its √s.
    """
    kernel, outputscale = unwrap_scale(model.covar_module)
    if not isinstance(kernel, FeatureSumKernel):
        inside = f" around {type(kernel).__name__}" if kernel is not model.covar_module else ""
        raise TypeError("model.covar_module must be a MultiOutputFeatureSumKernel (or rfgp.sketch's FeatureSumKernel "
                        "of a sum of multi-output kernels), optionally inside ScaleKernel, got "
                        f"{type(model.covar_module).__name__}{inside}")
    root_scale = 1.0 if outputscale is None else outputscale.detach().sqrt()[..., None, None]  # (*batch, 1, 1)
    model.eval()
    train_x = model.train_inputs[0]
    with torch.no_grad():
        model(train_x[..., :1, :])
        strategy = model.prediction_strategy
        if not isinstance(strategy, MultitaskFeatureSpacePredictionStrategy):
            raise TypeError(f"posterior_component_fields needs a multi-output model predicting through "
                            f"MultitaskFeatureSpacePredictionStrategy, got {type(strategy).__name__}")
        weight_mean = strategy.weight_mean.squeeze(-1)
        widths = [kernel_features(part, train_x[..., :1, :]).shape[-1] for part in kernel.kernels]
    offsets = torch.tensor([0] + widths).cumsum(0).tolist()
    num_outputs = kernel_num_outputs(kernel, train_x)

    def component_field(i: int) -> Field:
        weights = weight_mean[..., offsets[i] : offsets[i + 1]].unsqueeze(0)  # (1, *batch, F_i)
        field = _feature_field(kernel.kernels[i], weights, num_outputs)
        return lambda x: field(x).squeeze(0) * root_scale

    return [component_field(i) for i in range(len(kernel.kernels))]


def posterior_mean_field(model) -> Field:
    """The posterior mean x ↦ E[f(x) | y] of a trained multi-output GP, as a differentiable field."""
    model.eval()

    def field(x: Tensor) -> Tensor:
        return model(x).mean  # the posterior covariance is lazy: not formed for the mean

    return field
