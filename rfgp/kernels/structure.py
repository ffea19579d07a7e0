"""GPyTorch's per-column structure kernels as the exact sums and products :func:`rfgp.sketch` converts.

``AdditiveStructureKernel(base, num_dims)`` and ``ProductStructureKernel(base, num_dims)`` evaluate their
base kernel on each input column i it sees (``last_dim_is_batch=True``) with *one* set of hyperparameters,
and add or multiply the results:

    k(x, y) = Σᵢ k_b(xᵢ, yᵢ)        resp.        k(x, y) = Πᵢ k_b(xᵢ, yᵢ).

That is the ``AdditiveKernel`` resp. ``ProductKernel`` of d copies of the base kernel, copy i on column i
(:func:`column_copies`), with the copies' hyperparameters tied.  ``rfgp.sketch`` converts those copies as
the parts of a sum (features [φ₁(x₁), …, φ_d(x_d)], independent draws per column, F split equally among the
columns, :mod:`rfgp.kernels.tree_widths`) or the factors of a product (width F: one spectral product of the d
columns for stationary bases, a TensorSRHT of their features otherwise), and then gives every copy's
conversion the first copy's ``Parameter`` objects and counts the base's priors once, as GPyTorch does (one
base module): training fits the same model as the exact structure kernel.

The columns are those the base kernel sees: its own ``active_dims`` (indices into the structure kernel's
columns, which its ``active_dims`` select) if it has them, else all d columns of the structure kernel.
GPyTorch does not read ``num_dims`` (it sums over whatever columns come in); the conversion needs d at
conversion, so it takes ``num_dims`` for d, refuses a tree whose columns are known (``x_sample=``,
``active_dims``, ``ard_num_dims``) to be another number, and the converted kernel refuses inputs of another
width at its call (``input_dim``), rather than silently leaving columns out.

``ProductStructureKernel`` over an ``RBFKernel`` is the RBF kernel of all its columns (Πᵢ exp(−(xᵢ − yᵢ)²/2ℓᵢ²)
= exp(−Σᵢ (xᵢ − yᵢ)²/2ℓᵢ²), ℓᵢ = ℓ when the base is not ARD): the same covariance with the same
hyperparameter, so it converts as that RBF kernel (every RBF method applies: ``"orf"``, ``"maclaurin"``, …).

Refused, with what converts instead: an ARD base other than that RBF (GPyTorch divides each column by its
own lengthscale before splitting the columns, so the copies' hyperparameters are not tied), a
``LinearKernel`` inside ``ProductStructureKernel`` (GPyTorch's value is not Πᵢ v xᵢ yᵢ: linear_operator's
product of the per-column low-rank root operators is wrong), a ``GridInterpolationKernel`` base (KISS-GP per
column, an approximation random features replace), an ``ArcKernel`` in the base (GPyTorch's ``ArcKernel`` drops
``last_dim_is_batch``, so GPyTorch's structure kernel over it does not evaluate), a base with several outputs
per input (derivative, multitask: GPyTorch cannot evaluate those per column); and
``method="nystrom"`` of a tree holding a ``ProductStructureKernel``, whose diagonal GPyTorch cannot evaluate
(``kernel(x, diag=True)`` raises in GPyTorch itself), which Nyström needs.
"""

from __future__ import annotations

import copy

import gpytorch
import torch
from gpytorch.kernels import Kernel


def is_rbf_product(kernel: Kernel) -> bool:
    """Whether ``kernel`` is a ``ProductStructureKernel`` over an ``RBFKernel``, i.e. that RBF on all its columns."""
    return (type(kernel) is gpytorch.kernels.ProductStructureKernel
            and type(kernel.base_kernel) is gpytorch.kernels.RBFKernel)


def check_convertible(kernel: Kernel) -> None:
    """The TypeError for a structure kernel whose base has no tied per-column conversion (see the module doc)."""
    name = type(kernel).__name__
    kernels = [module for module in kernel.base_kernel.modules() if isinstance(module, Kernel)]
    if any(type(k) is gpytorch.kernels.GridInterpolationKernel for k in kernels):
        raise TypeError(
            f"rfgp.sketch does not convert {name} over a GridInterpolationKernel: that is KISS-GP on each column, "
            "an approximation of its base kernel that random features replace rather than approximate a second "
            f"time; convert the structure kernel over the grid's base kernel instead, e.g. {name}(RBFKernel(), "
            "num_dims)"
        )
    arcs = [k for k in kernels if type(k) is gpytorch.kernels.ArcKernel]
    if arcs:
        raise TypeError(
            f"rfgp.sketch does not convert {name} over an ArcKernel: GPyTorch's ArcKernel.forward drops "
            f"last_dim_is_batch, so GPyTorch's own {name} over it does not evaluate (a ValueError in 1.15) and there "
            "is no covariance to convert to; the per-column product (or sum) of arc kernels is "
            "ProductKernel(*(ArcKernel(base, active_dims=[i]) for i in range(d))), which converts"
        )
    probe = torch.zeros(1, 1)
    outputs = kernel.base_kernel.num_outputs_per_input(probe, probe)
    if outputs > 1:
        raise TypeError(
            f"rfgp.sketch does not convert {name} over {type(kernel.base_kernel).__name__}, a kernel with {outputs} "
            "outputs per input (derivative or multitask): GPyTorch cannot evaluate it per column either (its exact "
            f"{name} over RBFKernelGrad raises at evaluation); convert the base kernel without the structure wrapper"
        )
    ard = [k for k in kernels if k.ard_num_dims is not None and k.ard_num_dims > 1]
    if ard and not is_rbf_product(kernel):
        raise TypeError(
            f"rfgp.sketch does not convert {name} over {type(ard[0]).__name__}(ard_num_dims={ard[0].ard_num_dims}): "
            "GPyTorch divides each column by its own lengthscale before it evaluates the base kernel per column, "
            "so the columns do not share that hyperparameter; the same model converts as a sum (or product) of "
            "per-column kernels, e.g. ScaleKernel(AdditiveKernel(*(RBFKernel(active_dims=[i]) for i in range(d)))) "
            f"for {name}(ScaleKernel(RBFKernel(ard_num_dims=d)), d)"
        )
    linear = [k for k in kernels if type(k) is gpytorch.kernels.LinearKernel]
    if linear and type(kernel) is gpytorch.kernels.ProductStructureKernel:
        raise TypeError(
            "rfgp.sketch does not convert ProductStructureKernel over a LinearKernel: GPyTorch's value of it is not "
            "the documented Πᵢ v xᵢ yᵢ (the per-column linear covariances are low-rank root operators, whose "
            "product linear_operator's LowRankRootLinearOperator.prod gets wrong), so no conversion can be the same "
            "model; ProductKernel(*(LinearKernel(active_dims=[i]) for i in range(d))) is that product and converts"
        )


def column_positions(kernel: Kernel, width: int | None) -> list[int]:
    """The positions, among the columns the structure kernel sees, of the columns its base kernel is evaluated on.

    Args:
        kernel: the ``AdditiveStructureKernel`` or ``ProductStructureKernel``.
        width: the number of columns it sees, ``None`` when unknown at conversion.

    Raises:
        ValueError: the base kernel has no ``active_dims`` and ``width`` is known and is not ``num_dims``.
    """
    if kernel.base_kernel.active_dims is not None:
        return kernel.base_kernel.active_dims.tolist()
    if width is not None and width != kernel.num_dims:
        raise ValueError(
            f"{type(kernel).__name__}(num_dims={kernel.num_dims}) sees {width} columns: GPyTorch evaluates its base "
            f"kernel on every column it is given (it does not read num_dims), and the conversion needs their number "
            f"d; set num_dims={width}, or select {kernel.num_dims} columns with active_dims"
        )
    return list(range(kernel.num_dims))


def column_copies(kernel: Kernel, positions: list[int]) -> list[Kernel]:
    """Copies of the structure kernel's base kernel, copy i with ``active_dims=[positions[i]]`` (the exact parts of
    the equivalent sum or product; their hyperparameters are copies, tied again after conversion)."""
    base = kernel.base_kernel
    device = next((t.device for t in (*base.parameters(), *base.buffers())), None)
    copies = []
    for position in positions:
        part = copy.deepcopy(base)
        part.active_dims = torch.tensor([position], device=device)  # the buffer every GPyTorch kernel registers
        copies.append(part)
    return copies


def check_nystrom(kernel: Kernel) -> None:
    """The TypeError for ``method="nystrom"`` of a tree holding a ``ProductStructureKernel`` (see the module doc)."""
    if any(type(module) is gpytorch.kernels.ProductStructureKernel for module in kernel.modules()):
        raise TypeError(
            "rfgp.sketch(..., method='nystrom') does not convert a tree holding ProductStructureKernel: Nyström "
            "evaluates the exact kernel's diagonal, and GPyTorch's ProductStructureKernel(...)(x, diag=True) raises "
            "(its __call__ turns the diagonal vector into a linear operator, a GPyTorch bug); convert it to random "
            "features instead (rfgp.sketch without method='nystrom')"
        )


def load_base_kernel_keys(paths: tuple[str, ...], module: Kernel, state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook of a converted structure kernel: the exact kernel's keys ``base_kernel.*`` go to
    every column's conversion, ``paths[i].*`` (their hyperparameters are tied: the same values).

    A key goes to the columns whose conversion has it (a prior's buffers: the first column's, which counts the
    prior); the base kernel's own ``active_dims`` are dropped, the column each conversion selects taking their
    place.  A converted state (no
    ``base_kernel.*`` keys) loads as it is.
    """
    head = prefix + "base_kernel."
    own = {prefix + key for key in module.state_dict()}
    for key in [key for key in state_dict if key.startswith(head)]:
        rest = key[len(head):]
        targets = [prefix + ".".join(part for part in (path, rest) if part) for path in paths]
        targets = [target for target in targets if target in own]  # a prior's buffers: on the first column only
        if rest == "active_dims":
            del state_dict[key]
        elif targets:
            value = state_dict.pop(key)
            for target in targets:
                state_dict[target] = value
