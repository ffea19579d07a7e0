"""Exact matrix-valued (operator-valued) kernels for vector fields, in GPyTorch's multitask layout.

Each kernel maps inputs x ∈ R^d to p outputs and returns the (n·p) × (m·p) covariance in
GPyTorch's *interleaved* multitask order: entry [i·p + s, j·p + t] = K(xᵢ, yⱼ)[s, t], the
order of ``gpytorch.kernels.MultitaskKernel`` and of
``MultitaskMultivariateNormal(..., interleaved=True)``; ``num_outputs_per_input`` = p.

* :class:`DecomposableKernel` — K(x, y) = k(x, y)·A, A = LLᵀ + diag(v) learned (the intrinsic
  coregionalisation model; paper 004 §A, Cor. 2).
* :class:`CurlFreeRBFKernel` — K = −∇∇ᵀk₀, the covariance of ∇g for g ~ GP(0, k₀): samples are
  gradient fields (zero curl).
* :class:`DivFreeRBFKernel` — K = (∇∇ᵀ − ΔI)k₀: samples have zero divergence.

With k₀(δ) = exp(−½δᵀΛ⁻¹δ), Λ = diag(ℓ²) and v = Λ⁻¹δ (digest Part II.2, verified by finite
differences in the tests):

    K_curl(δ) = (Λ⁻¹ − vvᵀ)·k₀(δ)                      (isotropic: (1/ℓ²)(I − δδᵀ/ℓ²)k₀)
    K_div(δ)  = (vvᵀ − Λ⁻¹ + (tr Λ⁻¹ − ‖v‖²)I)·k₀(δ)     (isotropic: (1/ℓ²)(δδᵀ/ℓ² + (d − 1 − ‖δ‖²/ℓ²)I)k₀)

so K_curl(0) = I/ℓ² and K_div(0) = (d − 1)I/ℓ²; wrap in ``ScaleKernel`` for an outputscale σ².
These kernels are dense (O(n²p²) memory) and exist for validation and small data; their
random-feature counterparts are in :mod:`rfgp.kernels.sketched_operator_valued`.
"""

from __future__ import annotations

import torch
from gpytorch.kernels import Kernel, MultitaskKernel
from torch import Tensor

from ..core.config_state import METHOD, ConfigState
from ..core.dtypes import in_full_precision, lowered_by_autocast, promote_pair, promoted_dtype
from ..core.validation import (
    check_finite,
    check_hyperparameter,
    check_positive_int,
    check_tensor_dtype,
)
from .checked_call import CheckedCallMixin, refuse_last_dim_is_batch
from .families import check_kernel_kwargs
from .hyperparameters import parameter_value


def interleave(blocks: Tensor) -> Tensor:
    """``(..., n, m, p, q)`` per-pair blocks → the ``(..., n·p, m·q)`` interleaved matrix."""
    n, m, p, q = blocks.shape[-4:]
    return blocks.transpose(-3, -2).reshape(*blocks.shape[:-4], n * p, m * q)


def check_vector_input(x: Tensor, name: str, input_dim: int) -> None:
    """Inputs of a vector-field kernel must have exactly ``input_dim`` columns (float32/float64, or autocast's half
    precision output, promoted to the kernel's dtype: :func:`~rfgp.core.dtypes.lowered_by_autocast`)."""
    if not lowered_by_autocast(x):
        check_tensor_dtype(x, name)
    if x.dim() < 2 or x.shape[-1] != input_dim:
        raise ValueError(
            f"{name} must have shape (..., n, {input_dim}) for this kernel with input_dim={input_dim} "
            f"(= number of outputs p), got shape {tuple(x.shape)}"
        )
    check_finite(x, name)


def check_vector_dim(input_dim, name: str = "input_dim") -> int:
    input_dim = check_positive_int(input_dim, name)
    if input_dim < 2:
        raise ValueError(f"{name} must be ≥ 2 (a vector field in R^d with d ≥ 2 outputs), got {input_dim}")
    return input_dim


def check_vector_kernel_kwargs(input_dim: int, kwargs: dict) -> None:
    """``ard_num_dims`` and ``active_dims`` of a curl- or divergence-free kernel (exact or sketched) must give
    d = ``input_dim`` columns, the number of outputs."""
    ard = kwargs.get("ard_num_dims")
    if ard is not None and ard != input_dim:
        raise ValueError(f"ard_num_dims must be None or input_dim={input_dim}, got {ard}")
    if kwargs.get("active_dims") is not None and len(kwargs["active_dims"]) != input_dim:
        raise ValueError(f"active_dims must select input_dim={input_dim} columns, got {kwargs['active_dims']}")


class _GaussianDerivativeKernel(CheckedCallMixin, ConfigState, Kernel):
    """Shared machinery of the curl- and divergence-free Gaussian kernels (p = d outputs)."""

    has_lengthscale = True
    #: a scalar lengthscale has the same shape in every dimension: the state must say which d it is for
    config_fields = {"input_dim": METHOD}

    def __init__(self, input_dim: int, **kwargs) -> None:
        self.input_dim = check_vector_dim(input_dim)
        check_vector_kernel_kwargs(self.input_dim, kwargs)
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(**kwargs)

    @property
    def num_outputs(self) -> int:
        return self.input_dim

    def num_outputs_per_input(self, x1: Tensor, x2: Tensor) -> int:
        return self.input_dim

    def _blocks(self, v: Tensor, inv_sq: Tensor) -> Tensor:
        """The matrix factor M(v) of K = M(v)·k₀ for v = Λ⁻¹δ of shape (..., d); returns (..., d, d)."""
        raise NotImplementedError

    def _diagonal(self, v: Tensor, inv_sq: Tensor) -> Tensor:
        """diag M(v), shape (..., d)."""
        raise NotImplementedError

    @in_full_precision
    def forward(self, x1: Tensor, x2: Tensor, diag: bool = False, last_dim_is_batch: bool = False, **params):
        if last_dim_is_batch:
            refuse_last_dim_is_batch(self)
        check_vector_input(x1, "x1", self.input_dim)
        check_vector_input(x2, "x2", self.input_dim)
        x1, x2 = promote_pair(x1, x2, promoted_dtype(x1.dtype, x2.dtype, self.lengthscale.dtype))
        lengthscale = self.lengthscale  # (*batch, 1, d or 1)
        inv_sq = lengthscale.pow(-2).expand(*lengthscale.shape[:-1], self.input_dim)
        if diag:
            delta = x1 - x2  # (..., n, d)
            v = delta * inv_sq
            k0 = torch.exp(-0.5 * (delta * v).sum(-1, keepdim=True))
            return (self._diagonal(v, inv_sq) * k0).flatten(-2)
        delta = x1.unsqueeze(-2) - x2.unsqueeze(-3)  # (..., n, m, d)
        inv_sq = inv_sq.unsqueeze(-2)
        v = delta * inv_sq
        k0 = torch.exp(-0.5 * (delta * v).sum(-1))
        return interleave(self._blocks(v, inv_sq) * k0.unsqueeze(-1).unsqueeze(-1))

    def _set_lengthscale(self, value) -> None:
        check_hyperparameter(value, "lengthscale", self.raw_lengthscale_constraint)
        super()._set_lengthscale(parameter_value(value, self.raw_lengthscale))  # a float in the kernel's dtype

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}"


class CurlFreeRBFKernel(_GaussianDerivativeKernel):
    r"""Curl-free Gaussian kernel K(x, y) = −∇∇ᵀk₀(x − y) = (Λ⁻¹ − vvᵀ)k₀, v = Λ⁻¹(x − y).

    The covariance of ∇g for a scalar g ~ GP(0, k₀) (paper 004 §D.1.2; digest II.2(b)); every
    sample is a gradient field, so its Jacobian is symmetric (zero curl).  K(x, x) = Λ⁻¹.

    Args:
        input_dim: d ≥ 2, also the number of outputs.
        kwargs: ``ard_num_dims`` (None or d), ``lengthscale_prior``, ``lengthscale_constraint``,
            ``batch_shape``, ``active_dims`` as in ``gpytorch.kernels.RBFKernel``.

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import CurlFreeRBFKernel
        >>> covar_module = gpytorch.kernels.ScaleKernel(CurlFreeRBFKernel(input_dim=2))
        >>> covar_module(torch.randn(5, 2)).shape
        torch.Size([10, 10])
    """

    def _blocks(self, v, inv_sq):
        return torch.diag_embed(inv_sq.expand_as(v)) - v.unsqueeze(-1) * v.unsqueeze(-2)

    def _diagonal(self, v, inv_sq):
        return inv_sq - v.pow(2)


class DivFreeRBFKernel(_GaussianDerivativeKernel):
    r"""Divergence-free Gaussian kernel K = (∇∇ᵀ − ΔI)k₀ = (vvᵀ − Λ⁻¹ + (tr Λ⁻¹ − ‖v‖²)I)k₀.

    Fourier factor A(ω) = ‖ω‖²I − ωωᵀ (digest II.2(c)); samples have zero divergence.  In 2-D
    it is the rotated curl-free kernel R K_curl Rᵀ; in 3-D the covariance of ∇ × a for a vector
    potential a ~ GP(0, k₀I).  K(x, x) = (tr Λ⁻¹)I − Λ⁻¹ (= (d − 1)I/ℓ² when isotropic).
    Arguments as :class:`CurlFreeRBFKernel`.
    """

    def _blocks(self, v, inv_sq):
        inv_sq = inv_sq.expand_as(v)
        trace = (inv_sq.sum(-1) - v.pow(2).sum(-1)).unsqueeze(-1)
        return v.unsqueeze(-1) * v.unsqueeze(-2) + torch.diag_embed(trace - inv_sq)

    def _diagonal(self, v, inv_sq):
        inv_sq = inv_sq.expand_as(v)
        return v.pow(2) - inv_sq + (inv_sq.sum(-1) - v.pow(2).sum(-1)).unsqueeze(-1)


class DecomposableKernel(MultitaskKernel):
    r"""Decomposable (separable) kernel K(x, y) = k(x, y)·A with A = LLᵀ + diag(v) learned.

    The intrinsic coregionalisation model, identical in layout and parameters to
    ``gpytorch.kernels.MultitaskKernel`` (A lives in ``task_covar_module``, an ``IndexKernel``
    with ``covar_factor`` L of shape p × rank and ``var`` v); this class adds the
    operator-valued vocabulary (paper 004 §A: K₀(δ) = k₀(δ)A).

    Args:
        base_kernel: the scalar kernel k (exact, or an rfgp feature kernel).
        num_outputs: p.
        rank: columns of L (0: independent outputs, A = diag(v)).
        output_covar_prior: optional prior on A (``task_covar_prior`` of ``MultitaskKernel``).

    Example:
        >>> import torch, gpytorch
        >>> from rfgp.kernels import DecomposableKernel
        >>> kernel = DecomposableKernel(gpytorch.kernels.RBFKernel(), num_outputs=3, rank=1)
        >>> kernel(torch.randn(4, 2)).shape
        torch.Size([12, 12])
    """

    def __init__(self, base_kernel: Kernel, num_outputs: int, rank: int = 1, output_covar_prior=None, **kwargs):
        if not isinstance(base_kernel, Kernel):
            raise TypeError(f"base_kernel must be a gpytorch Kernel, got {type(base_kernel).__name__}")
        num_outputs = check_positive_int(num_outputs, "num_outputs")
        rank = check_positive_int(rank, "rank", allow_zero=True)
        check_kernel_kwargs(type(self).__name__, kwargs)
        super().__init__(base_kernel, num_tasks=num_outputs, rank=rank, task_covar_prior=output_covar_prior, **kwargs)
        self.rank = rank

    @property
    def base_kernel(self) -> Kernel:
        return self.data_covar_module

    @property
    def num_outputs(self) -> int:
        return self.num_tasks

    @property
    def output_covariance(self) -> Tensor:
        """A = LLᵀ + diag(v), shape (p, p)."""
        return self.task_covar_module.covar_matrix.to_dense()
