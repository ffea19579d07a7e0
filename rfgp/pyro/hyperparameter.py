"""How a Pyro model's scalar hyperparameter is specified: a fixed value or a prior.

* a number or tensor: the hyperparameter is fixed (stored as a buffer, so it follows
  ``.to()`` and ``state_dict``);
* a ``pyro.distributions.Distribution``: it is a latent variable with that prior
  (a :class:`pyro.nn.PyroSample`), inferred by NUTS or by a guide (MAP, mean-field, joint).
  Its samples are cast to the data's dtype and device; build the prior's parameters on
  the data's device, since Pyro scores guide samples under the prior as given.
"""

from __future__ import annotations

import numbers

import pyro.distributions as dist
import torch
from pyro.nn import PyroModule, PyroSample
from torch import Tensor


def register_hyperparameter(module: PyroModule, name: str, spec, positive: bool = True, max_ndim: int = 0) -> None:
    """Attach hyperparameter ``name`` to ``module``: a fixed buffer or a ``PyroSample`` prior.

    The hyperparameter is a scalar, or a vector where ``max_ndim`` = 1 (an ARD lengthscale): a fixed value of at most
    ``max_ndim`` dimensions, a prior with batch shape ``()`` and at most ``max_ndim`` event dimensions (a vector
    prior is ``prior.expand([d]).to_event(1)``).  Any other shape would broadcast against the data points (one
    value per point where their number happens to match).  A floating tensor keeps its dtype (float64 stays exact).

    Raises:
        TypeError: ``spec`` is neither a real number, a real tensor nor a Pyro distribution.
        ValueError: a fixed value is not finite, or not > 0 where ``positive``; ``spec`` has more dimensions than
            ``max_ndim``, or a prior has a batch shape.
    """
    shapes = "a scalar" if max_ndim == 0 else "a scalar or a (d,) vector"
    if isinstance(spec, dist.Distribution):
        if spec.batch_shape != () or len(spec.event_shape) > max_ndim:
            raise ValueError(
                f"the prior of {name} must be {shapes}: batch shape () and event shape of at most {max_ndim} "
                f"dimension(s), got batch shape {tuple(spec.batch_shape)} and event shape {tuple(spec.event_shape)}"
                + (" (a vector prior is prior.expand([d]).to_event(1))" if max_ndim else "")
            )
        if positive and not _support_is_positive(spec):
            raise ValueError(
                f"the prior of {name} must have positive support, got {spec!r} with support {spec.support}"
            )
        setattr(module, name, PyroSample(spec))
        return
    if isinstance(spec, bool) or not (isinstance(spec, numbers.Real) or torch.is_tensor(spec)):
        raise TypeError(
            f"{name} must be a number, a real tensor or a pyro.distributions prior, got {type(spec).__name__}"
        )
    if torch.is_tensor(spec) and (spec.is_complex() or spec.dtype == torch.bool):
        raise TypeError(f"{name} must be a real number or tensor, got a tensor of dtype {spec.dtype}")
    keep_dtype = torch.is_tensor(spec) and spec.is_floating_point()
    value = torch.as_tensor(spec, dtype=spec.dtype if keep_dtype else torch.get_default_dtype()).clone()
    if value.dim() > max_ndim:
        raise ValueError(f"{name} must be {shapes}, got shape {tuple(value.shape)}")
    if not bool(torch.isfinite(value).all()):
        raise ValueError(f"{name} must be finite, got {spec!r}")
    if positive and not bool((value > 0).all()):
        raise ValueError(f"{name} must be > 0, got {spec!r}")
    module.register_buffer(name, value)


def _support_is_positive(prior: dist.Distribution) -> bool:
    lower = support_lower_bound(prior)
    return lower is not None and lower >= 0


def support_lower_bound(prior: dist.Distribution) -> float | None:
    """The smallest lower bound of ``prior``'s support over its entries (``None`` where the support has none)."""
    support = prior.support
    while isinstance(support, torch.distributions.constraints.independent):
        support = support.base_constraint
    lower = getattr(support, "lower_bound", None)
    return None if lower is None else float(torch.as_tensor(lower).min())


def prior_median(prior: dist.Distribution, num_draws: int = 4096) -> Tensor:
    """The median of ``prior`` per event entry, from ``num_draws`` draws under a fixed seed (reproducible).

    Sampled rather than taken from ``icdf``, which most positive priors (Gamma) lack; the caller's random
    state is left untouched.  The median exists for every prior (HalfCauchy has no mean).
    """
    # A prior on a GPU means CUDA is initialised; seeding CUDA before that would be queued for its initialisation.
    cuda = range(torch.cuda.device_count()) if torch.cuda.is_initialized() else ()
    with torch.random.fork_rng(devices=cuda):
        torch.default_generator.manual_seed(0)
        if cuda:
            torch.cuda.manual_seed_all(0)
        draws = prior.sample((num_draws,))
    return draws.median(0).values


def hyperparameter_value(module: PyroModule, name: str, like: Tensor) -> Tensor:
    """The hyperparameter (sampled from its prior when it has one) in the dtype/device of ``like``."""
    return getattr(module, name).to(dtype=like.dtype, device=like.device)


def is_random(module: PyroModule, name: str) -> bool:
    """Whether hyperparameter ``name`` of ``module`` has a prior (is a latent site)."""
    # PyroModule keeps its PyroSample attributes in this dict (there is no public accessor).
    return name in module._pyro_samples
