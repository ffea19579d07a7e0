"""Argument validation shared by every public constructor and forward path.

Each check raises a ``ValueError``/``TypeError`` that names the argument, what
was given and what is accepted, so a user never has to read a stack trace to
find out which input was wrong.

dtype policy: rfgp computes in float32 or float64.  Half precision (float16, bfloat16)
is refused everywhere with a ``TypeError`` (random-feature sums over F terms lose about
three digits in half precision, and some torch kernels silently upcast it while others do
not), except a kernel input that an enclosing ``torch.autocast`` produced, which is promoted
to the kernel's float32/float64 (:func:`rfgp.core.dtypes.lowered_by_autocast`; rfgp switches
autocast itself off, :func:`rfgp.core.dtypes.full_precision`); integer, boolean and complex
inputs are refused too.  Where float32 and float64 meet,
rfgp follows torch type promotion as GPyTorch does: a kernel call computes in
``torch.promote_types`` of x1's, x2's and the kernel's dtype and returns that dtype
(:mod:`rfgp.core.dtypes`); inputs are never modified, and the module's draws and parameters are
cast per call, never converted in place.  The few places that hold state in one dtype
(streaming statistics, a trained rfgp model's data and posterior caches) refuse a different
dtype with a ``TypeError`` that says why.

Checks that read the data's values (finite entries, label ranges, unit norms) cost one
fused reduction and one host sync per call; :class:`rfgp.settings.validate_inputs` turns
them off for data the user has already validated.  Shape, dtype and argument checks
always run (they are free).
"""

from __future__ import annotations

import itertools
import math
import numbers
import sys

import torch
from linear_operator.utils.errors import NanError
from torch import Tensor
from torch._C._functorch import TransformType
from torch._functorch.pyfunctorch import retrieve_all_functorch_interpreters

from . import settings
from .dtypes import cast_to, lowered_by_autocast, promoted_dtype

SUPPORTED_DTYPES = (torch.float32, torch.float64)
_SUPPORTED = "float32 or float64"


class InvalidValueError(ValueError):
    """A value check failed: NaN/Inf entries, a non-positive noise, a hyperparameter outside its constraint.

    Code that explores values on purpose (MCMC proposals) catches it to reject the point.
    """


class NonFiniteError(InvalidValueError):
    """A tensor that must be finite holds NaN or ±Inf entries."""


class NonFiniteHyperparameterError(NonFiniteError, NanError):
    """Finite inputs, but hyperparameters (a lengthscale underflowed to 0, say) make the features NaN or ±Inf.

    Also linear_operator's ``NanError`` — what a NaN covariance raises in GPyTorch's own Cholesky — so that
    optimisers that probe trial points treat the point as a NaN loss and step back, as they do for exact
    kernels: BoTorch's ``fit_gpytorch_mll`` (scipy L-BFGS-B) returns NaN for a ``NanError`` at a line-search
    trial point instead of aborting the fit.  :func:`rfgp.fit_mll` restores the last finite point.
    """


class DrawCoverageError(ValueError, NanError):
    """Hyperparameters moved outside the range that a map's fixed random draws (or quadrature nodes) were made for.

    Importance-weighted draws (periodic harmonics, rational-quadratic precisions) come from a proposal centred at the
    hyperparameters of draw time; far from them the weights stop being an unbiased estimator with finite variance,
    and the map refuses to evaluate.  ``resample()`` of the kernel re-centres the proposal at the current values.
    A fixed quadrature (BoTorch's ``ExponentialDecayKernel``) refuses powers and decays beyond its measured error
    bound.  Not an :class:`InvalidValueError`: the point is valid for the kernel, so a sampler must not reject it as
    zero density.  :func:`rfgp.fit_mll` treats it as a failed line-search trial point (restore, restart); it is also
    linear_operator's ``NanError`` (as :class:`NonFiniteHyperparameterError`), so BoTorch's ``fit_gpytorch_mll``
    takes such a trial point as a NaN loss and steps back instead of aborting the fit.
    """


def check_positive_int(value, name: str, allow_zero: bool = False) -> int:
    """Return ``value`` as an ``int`` after checking that it is an integer ≥ 1 (≥ 0 with ``allow_zero``)."""
    kind = "a non-negative integer" if allow_zero else "a positive integer"
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {kind}, got {value!r} of type {type(value).__name__}")
    if value < (0 if allow_zero else 1):
        raise ValueError(f"{name} must be {kind}, got {value}")
    return int(value)


def check_seed(seed, name: str = "seed", allow_none: bool = True) -> int | None:
    """Return ``seed`` as a Python ``int`` in [-2**63, 2**63) (the range of ``torch.Generator.manual_seed`` and of the
    int64 it is saved as in ``state_dict``), or ``None`` where ``allow_none``, after checking it.

    ``manual_seed`` itself raises errors that name no argument: a RuntimeError for floats, bools and ``None``, a
    ValueError ("Overflow when unpacking long long") for integers beyond 64 bits; a string seed failed later with "can
    only concatenate str".
    """
    if seed is None and allow_none:
        return None
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        accepted = "an int or None" if allow_none else "an int"
        raise TypeError(f"{name} must be {accepted}, got {seed!r} of type {type(seed).__name__}")
    if not -(2**63) <= seed < 2**63:
        raise ValueError(f"{name} must be an int in [-2**63, 2**63), got {seed}")
    return int(seed)


def check_choice(value, name: str, choices) -> str:
    """Return ``value`` after checking it is one of ``choices``."""
    try:
        found = value in choices
    except (TypeError, ValueError, RuntimeError):  # an array or tensor compares element-wise: no choice
        found = False
    if not found:
        accepted = ", ".join(repr(c) for c in choices)
        raise ValueError(f"{name} must be one of {accepted}; got {value!r}")
    return value


def check_positive_float(value, name: str, allow_zero: bool = False) -> float:
    """Return ``value`` as a ``float`` after checking it is finite and > 0 (or ≥ 0)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {value!r} of type {type(value).__name__}")
    converted = math.inf if isinstance(value, int) and abs(value) > sys.float_info.max else float(value)  # overflow
    ok = converted >= 0 if allow_zero else converted > 0
    if not ok or not math.isfinite(converted):
        bound = "≥ 0" if allow_zero else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value}")
    return converted


def check_dtype_argument(dtype, name: str = "dtype") -> torch.dtype:
    """A ``dtype`` argument: torch.float32 or torch.float64 (see the dtype policy above)."""
    if dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be torch.float32 or torch.float64, got {dtype!r}{_half_hint(dtype)}")
    return dtype


def _half_hint(dtype) -> str:
    if not isinstance(dtype, torch.dtype):  # a string such as "float64": no hint (it has no dtype attributes)
        return ""
    if dtype in (torch.float16, torch.bfloat16):
        return (" (half precision is not supported: random-feature sums lose about three digits in it; under "
                "torch.autocast a kernel takes autocast's half-precision outputs and computes in float32)")
    if dtype == torch.bool or not (dtype.is_floating_point or dtype.is_complex):
        # integer-coded columns (counts, categories, pixels, torch.from_numpy of an int array): the conversion is
        # the user's, since float32 rounds integers beyond 2**24 (timestamps in seconds or nanoseconds)
        return (" (integer inputs are not promoted: convert them, e.g. x.to(torch.float64), and pass the same "
                "tensor for training and prediction; float32 represents integers exactly only up to 2**24)")
    return ""


def check_tensor_dtype(x, name: str) -> None:
    """``x`` is a real float32/float64 tensor (TypeError otherwise, naming ``name`` and its dtype)."""
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name} must be a real tensor ({_SUPPORTED}), got the complex dtype {x.dtype}")
    if x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must be a floating-point tensor ({_SUPPORTED}), got dtype {x.dtype}{_half_hint(x.dtype)}")


def check_points(x, name: str) -> Tensor:
    """``x``: points as the rows of a real float32/float64 tensor of shape (n, d) with n ≥ 1 and d ≥ 1 and finite
    entries (a TypeError for another type or dtype, a ValueError for another shape or a NaN/Inf, naming ``name``);
    returned as given."""
    check_tensor_dtype(x, name)
    if x.dim() != 2 or x.shape[0] < 1 or x.shape[1] < 1:
        raise ValueError(f"{name} must have shape (n, d) with n ≥ 1 and d ≥ 1 (one point per row), got shape "
                         f"{tuple(x.shape)}")
    check_finite(x, name)
    return x


def check_same_dtype(x: Tensor, name: str, dtype: torch.dtype | None, other: str, reason: str = "") -> None:
    """``x`` has ``dtype`` (that of ``other``), where a computation cannot follow type promotion (``reason`` says why).

    Kernel calls promote (:func:`check_kernel_inputs`); this check guards the few places that hold state in one
    dtype (streaming statistics, a trained model's posterior caches and its data).
    """
    if dtype is not None and x.dtype != dtype:
        raise TypeError(
            f"{name} has dtype {x.dtype} but {other} is {dtype}{': ' + reason if reason else ''}; convert one of "
            f"them explicitly (e.g. {name}.to({dtype}) or model.to({x.dtype}))"
        )


def first_floating_tensor(module) -> Tensor | None:
    """A module's first floating parameter or buffer (parameters first; ``None`` if it has none).

    The module tree is walked only up to that tensor (every kernel call asks, and a tree's parameters were listed
    in full twice per call before)."""
    return next((t for t in itertools.chain(module.parameters(), module.buffers()) if t.is_floating_point()), None)


def module_dtype(module) -> torch.dtype | None:
    """The floating dtype of a module's first floating parameter or buffer (``None`` if it has none)."""
    tensor = first_floating_tensor(module)
    return None if tensor is None else tensor.dtype


def check_finite(x: Tensor, name: str, hint: str = "") -> None:
    """One fused reduction: raise :class:`NonFiniteError` naming ``name`` if ``x`` holds NaN or ±Inf.

    Skipped under ``rfgp.settings.validate_inputs(False)``.
    """
    if reads_values(x) and not bool(torch.isfinite(x).all()):
        raise NonFiniteError(nonfinite_message(x, name, hint))


def has_values(x: Tensor) -> bool:
    """Whether ``x`` holds values: a tensor on the ``meta`` device (shape inference, ``torch.device("meta")``) has
    only a shape and a dtype, so value checks pass it and rfgp returns outputs of the right shapes on ``meta``."""
    return x.device.type != "meta"


def reads_values(x: Tensor) -> bool:
    """Whether a value check reads ``x``: checks are on (:class:`rfgp.settings.validate_inputs`) and ``x`` has
    entries with values (:func:`has_values`)."""
    return settings.validate_inputs.on() and x.numel() > 0 and has_values(x)


def check_gaussian_moments(**tensors: Tensor) -> None:
    """Finite floating means and variances, variances (keyword names starting with ``var``) ≥ 0: raise naming the
    argument, never clamp (a negative variance is a bug upstream, not rounding to hide).  Values on ``meta`` are not
    read (:func:`has_values`)."""
    for name, tensor in tensors.items():
        check_tensor_dtype(tensor, name)
        check_finite(tensor, name)
        if name.startswith("var") and has_values(tensor) and bool((tensor < 0).any()):
            raise ValueError(f"{name} must be ≥ 0 (variances), got the minimum {float(tensor.min()):.6g}")


def nonfinite_message(x: Tensor, name: str, hint: str = "") -> str:
    """What is wrong with a non-finite ``x`` (error path only: counts and the first bad position)."""
    nan = int(torch.isnan(x).sum())
    inf = int(torch.isinf(x).sum())
    first = tuple(int(i) for i in (~torch.isfinite(x)).nonzero()[0])
    return (
        f"{name} contains NaN or Inf entries ({nan} NaN and {inf} ±Inf of {x.numel()}, the first at index {first}); "
        f"rfgp needs finite values{': ' + hint if hint else ''}"
    )


def check_features_input(x: Tensor, name: str, input_dim: int | None) -> None:
    """Check a feature-map input: a real floating tensor of shape (..., n, d) with finite entries, not vmapped over
    (:func:`refuse_vmapped_input`)."""
    check_tensor_dtype(x, name)
    refuse_vmapped_input(x, name)
    check_input_shape(x, name, input_dim)
    check_finite(x, name)


def check_input_shape(x: Tensor, name: str, input_dim: int | None) -> None:
    """A feature-map input has shape (..., n, d), with d = ``input_dim`` when the draws were made for one."""
    if x.dim() < 2:
        raise ValueError(f"{name} must have shape (..., n, d), got shape {tuple(x.shape)}")
    if input_dim is not None and x.shape[-1] != input_dim:
        raise ValueError(
            f"{name} has {x.shape[-1]} input dimensions (last axis) but this feature map was built for "
            f"input_dim={input_dim}"
        )


def refuse_functorch_transforms() -> None:
    """The NotImplementedError for a kernel call under ``torch.func.vmap``, ``grad``, ``jacrev``, ``jvp``, ….

    rfgp's feature maps and inference run custom autograd Functions (fused sin/cos features, TensorSRHT
    gathers, feature statistics) and value checks that functorch cannot batch or transform; without this
    check PyTorch answers with errors about ``setup_context`` or data-dependent control flow.
    """
    if torch._C._are_functorch_transforms_active():
        raise NotImplementedError(
            "rfgp kernels do not run under torch.func transforms (vmap, grad, jacrev, jvp, ...): their feature "
            "maps and marginal likelihood use custom autograd Functions and value checks that functorch cannot "
            "batch. For an ensemble of models with different hyperparameters build the kernel (and mean, "
            "likelihood) with batch_shape=torch.Size([B]), one member per model sharing the random draws; take "
            "derivatives with torch.autograd; torch.func.functional_call alone works"
        )


def refuse_vmapped_input(x: Tensor, name: str) -> None:
    """The NotImplementedError for a feature-map input that ``torch.func.vmap`` batches.

    The value checks read the input (``bool`` of a reduction) and the fused feature Functions write into ``out=``
    buffers, neither of which vmap can batch: PyTorch answered "data-dependent control flow" or "Batching rule not
    implemented for aten::cos.out".  Maps broadcast over leading batch dimensions instead.  ``grad``, ``jacrev``,
    ``jacfwd`` and ``hessian`` of a map that has made its draws work: they batch tangents, never the input itself.
    """
    functorch = torch._C._functorch
    while functorch.is_functorch_wrapped_tensor(x):
        if functorch.is_batchedtensor(x):
            raise NotImplementedError(
                f"rfgp feature maps do not run under torch.func.vmap over their input ({name}): their input checks "
                "and fused feature functions cannot be batched by vmap. A feature map broadcasts over leading batch "
                f"dimensions: pass {name} of shape (..., n, d) instead; torch.func.grad, jacrev, jacfwd and hessian "
                "of a map that has made its draws work"
            )
        x = functorch.get_unwrapped(x)


def refuse_draws_under_vmap(module) -> None:
    """The NotImplementedError for a first call that would make a map's draws under ``torch.func.vmap`` (also inside
    ``jacfwd``, ``jacrev`` and ``hessian``, which vmap over tangents and cotangents).

    Random draws made there are per slice under ``randomness="different"``: they were registered as buffers holding
    batched tensors, the Jacobian came out wrong and the next call failed with "your tensor may have escaped from
    inside a function being vmapped".  ``torch.func.grad`` alone draws plain tensors, once, and is not refused.
    """
    if torch._C._are_functorch_transforms_active() and any(
            interpreter.key() == TransformType.Vmap for interpreter in retrieve_all_functorch_interpreters()):
        raise NotImplementedError(
            f"{type(module).__name__} makes its random draws at its first call, and this first call runs under "
            "torch.func.vmap (or jacfwd, jacrev, hessian, which vmap): draws made there would be per slice or "
            "escape the transform. Call the map once outside the transform (or load a saved state) before "
            "transforming it"
        )


def check_kernel_inputs(x1: Tensor, x2: Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """Free checks of a kernel call (supported dtypes, equal trailing dims); returns the dtype it computes in.

    That is ``torch.promote_types`` of x1's, x2's and the kernel's ``dtype``, as for GPyTorch's kernels
    (see :mod:`rfgp.core.dtypes`), and at least float32: half-precision inputs are accepted only as the output of an
    enclosing ``torch.autocast`` (:func:`rfgp.core.dtypes.lowered_by_autocast`), refused otherwise.  Under a
    ``torch.func`` transform a kernel call raises (see :func:`refuse_functorch_transforms`).
    """
    refuse_functorch_transforms()
    lowered = False
    for x, name in ((x1, "x1"), (x2, "x2")):
        if lowered_by_autocast(x):
            lowered = True  # autocast's half-precision output: computed in float32 (or float64) from its values
        else:
            check_tensor_dtype(x, name)
    if x1.shape[-1] != x2.shape[-1]:
        raise ValueError(
            f"x2 has {x2.shape[-1]} input dimensions (last axis) but x1 has {x1.shape[-1]}; "
            "both must have the kernel's input dimension"
        )
    return promoted_dtype(x1.dtype, x2.dtype, dtype, torch.float32 if lowered else None)


def check_task_indices(x: Tensor, name: str, num_tasks: int, values: bool = True) -> None:
    """``x`` holds task indices 0..``num_tasks``−1: an integer tensor, or a float32/float64 one with integral values.

    ``values=False`` checks the type only; the value check (one fused reduction, a host
    synchronisation) is also skipped under ``rfgp.settings.validate_inputs(False)``.
    """
    if not torch.is_tensor(x):
        raise TypeError(f"{name} must be a torch.Tensor of task indices, got {type(x).__name__}")
    integer = not (x.is_floating_point() or x.is_complex()) and x.dtype != torch.bool
    if not integer and x.dtype not in SUPPORTED_DTYPES:
        raise TypeError(f"{name} must hold task indices as an integer tensor or as {_SUPPORTED}, got dtype {x.dtype}")
    if not (values and settings.validate_inputs.on()) or x.numel() == 0:
        return
    valid = (x >= 0) & (x < num_tasks)
    if not integer:
        valid &= x == x.round()  # NaN compares unequal: refused too
    if not bool(valid.all()):
        first = tuple(int(i) for i in (~valid).nonzero()[0])
        raise ValueError(
            f"{name} must hold task indices 0..{num_tasks - 1} (integers, or floats with integral values), got "
            f"{x[first].item()} at index {first}"
        )


def check_unit_rows(x: Tensor, name: str, hint: str) -> None:
    """Every row of ``x`` has norm 1 within √eps of its dtype (float32: 3.5e-4, float64: 1.5e-8)."""
    if not reads_values(x):
        return
    check_finite(x, name)
    deviation = (x.norm(dim=-1) - 1).abs()
    tolerance = math.sqrt(torch.finfo(x.dtype).eps)
    if bool((deviation > tolerance).any()):
        # its position (batch index, row) in a batched x, as nonfinite_message gives: a flat index named another row
        position = tuple(int(i) for i in (deviation == deviation.max()).nonzero()[0])
        norm = float(x[position].norm())
        worst = position[0] if len(position) == 1 else position
        # enough significant digits to show |norm − 1| to three digits
        digits = 3 - math.floor(math.log10(abs(norm - 1))) if norm != 1 else 3
        raise ValueError(
            f"{name} must lie on the unit sphere (every row with norm 1 within {tolerance:.2g} for {x.dtype}); "
            f"row {worst} has norm {norm:.{max(digits, 3)}g} (|norm − 1| = {abs(norm - 1):.3g}). {hint}"
        )


def promote_unit_rows(x: Tensor, name: str, dtype: torch.dtype, hint: str) -> Tensor:
    """A unit-norm input in the call's ``dtype``: rows promoted from a lower precision are checked to *their*
    precision (a float32 unit vector is unit only to float32's √eps) and projected back onto the sphere."""
    if x.dtype == dtype:
        return x
    check_unit_rows(x, name, hint)
    return normalize_rows(cast_to(x, dtype), name)


def normalize_rows(x: Tensor, name: str) -> Tensor:
    """x/‖x‖ row by row; an all-zero row has no direction and raises instead of staying zero."""
    norms = x.norm(dim=-1, keepdim=True)
    if reads_values(x) and bool((norms == 0).any()):
        row = int((norms.reshape(-1) == 0).nonzero()[0])
        raise ValueError(f"{name} has an all-zero row (row {row}), which cannot be normalised onto the unit sphere")
    return x / norms


def check_hyperparameter(value, name: str, constraint=None, allow_bound: bool = False) -> None:
    """A value assigned to a hyperparameter is finite and inside its (positive) constraint.

    ``allow_bound`` accepts the lower bound itself (an offset c = 0 is a valid kernel; ℓ = 0 is not).  Accepted: real
    numbers (nested lists of them), float32/float64 or int32/int64 tensors; not bools, strings, complex or
    half-precision values (the dtype policy above).
    """
    try:
        tensor = value if torch.is_tensor(value) else torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):  # a string, a ragged list, an int beyond 64 bits
        tensor = None
    if tensor is None or tensor.dtype not in (*SUPPORTED_DTYPES, torch.int32, torch.int64):
        given = f"{value!r} of type {type(value).__name__}" + ("" if tensor is None else f" (dtype {tensor.dtype})")
        raise TypeError(f"{name} must be a real number or a float32/float64 (or int32/int64) tensor, got {given}")
    if not torch.is_tensor(value):
        tensor = torch.as_tensor(value, dtype=torch.float64)  # Python floats checked in double precision
    lower = getattr(constraint, "lower_bound", torch.tensor(0.0))
    upper = getattr(constraint, "upper_bound", torch.tensor(math.inf))
    tensor = tensor.detach()
    if not has_values(tensor):
        return
    above = tensor >= lower.to(tensor) if allow_bound else tensor > lower.to(tensor)
    inside = torch.isfinite(tensor) & above & (tensor < upper.to(tensor))
    if not bool(inside.all()):
        shown = tensor.item() if tensor.numel() == 1 else tensor.tolist()
        bounds = f"{'≥' if allow_bound else '>'} {float(lower.min()):g}" if math.isinf(float(upper.max())) else (
            f"in ({float(lower.min()):g}, {float(upper.max()):g})")
        where = f" (its constraint is {constraint})" if constraint is not None else ""
        raise InvalidValueError(f"{name} must be finite and {bounds}{where}, got {shown}")


def describe_bad_hyperparameters(module) -> list[str]:
    """``name = value`` of every hyperparameter of ``module`` that is non-finite or, if constrained, on/out of its
    lower bound (unconstrained ones such as an ``IndexKernel``'s ``covar_factor`` are checked finite)."""
    bad = []
    for raw_name, raw, constraint in module.named_parameters_and_constraints():
        value = raw.detach() if constraint is None else constraint.transform(raw.detach())
        valid = torch.isfinite(value)
        if constraint is not None:
            valid = valid & (value > constraint.lower_bound.to(value))
        if not bool(valid.all()):
            name = raw_name.replace("raw_", "")
            shown = value.item() if value.numel() == 1 else value.tolist()
            bad.append(f"{name} = {shown}")
    return bad


#: what the feature-space solve sees of the targets: the residual of the marginal likelihood
RESIDUAL = "y − μ (the training targets minus the prior mean)"


def check_targets(y: Tensor, name: str = RESIDUAL, num_tasks: int | None = None, point_axis: int = -1,
                  allow_empty: bool = False) -> None:
    """Targets (or residuals y − μ) of a Gaussian model: finite and non-empty (an MLL over no data is 0/0).

    ``point_axis``: the axis of the N data points, −1 for target vectors ``(*b, N)``, −2 for linear_operator's
    right-hand sides ``(*b, N, k)`` (a 1-D ``(N,)`` one has them along −1).
    ``num_tasks``: ``y`` ``(*b, N·T)`` holds T outputs per point in GPyTorch's interleaved order (entry n·T + t),
    checked as ``(*b, N, T)`` so that the error names the (point, task) of a bad entry, not its flat index.
    ``allow_empty``: no points pass (a rank's empty shard inside :class:`rfgp.inference.distributed.data_parallel`,
    whose statistics are sums over all ranks' points)."""
    if y is None:
        return
    if num_tasks is not None:
        y, name = y.reshape(*y.shape[:-1], -1, num_tasks), f"{name}, indexed (…, point, task),"
        point_axis = -2
    if y.shape[max(point_axis, -y.dim())] == 0 and not allow_empty:
        raise ValueError(f"{name} is empty (0 data points); the marginal likelihood and posterior need at least one")
    check_finite(y, name, "remove or impute the rows of train_y with NaN/Inf, or fix a mean module that returns "
                          "them (a NaN target makes the marginal likelihood and every prediction NaN); to leave "
                          "NaN targets out, train and predict inside "
                          "gpytorch.settings.observation_nan_policy('mask') (or 'fill' for prediction)")


def check_noise(noise: Tensor) -> Tensor:
    """The likelihood's noise variances D (returned unchanged): finite and > 0, as D⁻¹ weights the data (not read on
    ``meta``, :func:`reads_values`)."""
    if reads_values(noise) and not bool((torch.isfinite(noise) & (noise > 0)).all()):
        values = noise.detach()
        raise InvalidValueError(
            f"the likelihood's noise variances must be finite and > 0 (the feature-space solve weights every point "
            f"by 1/noise), got values in [{float(values.min()):.6g}, {float(values.max()):.6g}]"
            f"{' including NaN' if bool(noise.isnan().any()) else ''}"
        )
    return noise


def empty_shards_allowed() -> bool:
    """Whether training data may have no rows: on a rank of an initialised ``torch.distributed`` process group, whose
    shard of the data may be empty (N points split over more ranks).  Inside
    :class:`rfgp.inference.distributed.data_parallel` its statistics are zero (ΦᵀD⁻¹Φ = 0, ΦᵀD⁻¹y = 0, no points)
    and sum with the other ranks'; an evaluation on its points alone is refused (:func:`check_targets`)."""
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def check_training_data(train_x: Tensor, train_y: Tensor, target_axis: int = -1,
                        allow_nan_targets: bool = False) -> None:
    """train_x ``(..., n, d)`` and train_y with n along ``target_axis`` of an ExactGP: dtype, sizes, finiteness.

    ``allow_nan_targets``: NaN (not ±Inf) targets pass, for models built inside
    ``gpytorch.settings.observation_nan_policy("mask")`` or ``("fill")``, which leave them out.
    """
    check_tensor_dtype(train_x, "train_x")
    check_tensor_dtype(train_y, "train_y")
    check_same_dtype(train_y, "train_y", train_x.dtype, "train_x",
                     "an rfgp model keeps its training data in one dtype, that of its posterior caches")
    if train_x.dim() < 2:
        one_column = " (one input column: train_x.unsqueeze(-1))" if train_x.dim() == 1 else ""
        raise ValueError(f"train_x must have shape (..., n, d){one_column}, got {tuple(train_x.shape)}")
    if train_x.shape[-2] == 0 and not empty_shards_allowed():
        raise ValueError("train_x is empty (0 rows): a GP needs at least one training point (a rank of a "
                         "torch.distributed process group may hold an empty shard: initialise the process group "
                         "before building its model)")
    if train_y.dim() < -target_axis or train_y.shape[target_axis] != train_x.shape[-2]:
        raise ValueError(
            f"train_y must hold one target per row of train_x ({train_x.shape[-2]} along axis {target_axis}), "
            f"got shape {tuple(train_y.shape)}"
        )
    _check_batch_shapes_broadcast(train_x.shape[:-2], train_y.shape[:target_axis])
    check_finite(train_x, "train_x")
    if allow_nan_targets:
        train_y = torch.where(train_y.isnan(), torch.zeros((), dtype=train_y.dtype), train_y)
    check_finite(train_y, "train_y (the training targets)",
                 "remove or impute those rows, or (for NaN) build, train and predict with the model inside "
                 "gpytorch.settings.observation_nan_policy('mask'), which leaves NaN targets out")


def _check_batch_shapes_broadcast(x_batch: torch.Size, y_batch: torch.Size) -> None:
    """train_y's batch shape (before its point axis) broadcasts with train_x's ``(*b)`` (GPyTorch failed at the
    first marginal likelihood with "The size of tensor a (2) must match the size of tensor b (3)")."""
    try:
        torch.broadcast_shapes(x_batch, y_batch)
    except RuntimeError:
        raise ValueError(f"train_y's batch shape {tuple(y_batch)} does not broadcast with train_x's "
                         f"{tuple(x_batch)} (train_x is (*b, n, d)); give both the same batch shape") from None


def check_model_inputs(model, inputs) -> None:
    """Inputs of an rfgp ExactGP call, checked against its training inputs (dtype, trailing dimension, finite)."""
    if model.train_inputs is None:
        return
    for x, train_x in zip(inputs, model.train_inputs):
        check_prediction_inputs(x, train_x)


def check_prediction_inputs(x: Tensor, train_x: Tensor, name: str = "x") -> None:
    """Test inputs of a trained ExactGP: train_x's dtype and trailing dimension, finite."""
    check_tensor_dtype(x, name)
    check_same_dtype(x, name, train_x.dtype, "train_x",
                     "the posterior caches are computed in the training data's dtype, and test inputs meet them "
                     "in products that do not promote")
    if x.dim() < 2 or x.shape[-1] != train_x.shape[-1]:
        raise ValueError(
            f"{name} must have shape (..., n, {train_x.shape[-1]}) like train_x (d = {train_x.shape[-1]} "
            f"input dimensions), got shape {tuple(x.shape)}"
        )
    check_finite(x, name)
