"""The :class:`FeatureMap` base class: an explicit random feature map Φ with k(x, y) ≈ Φ(x)ᵀΦ(y).

Conventions shared by every map in :mod:`rfgp.features` (see ``DESIGN.md``):

* ``num_features`` is the **real output width** F, for every method.
* Random draws are registered buffers, so ``state_dict()`` reproduces them bit for
  bit and ``.to(device)``/``.double()`` moves them.  They are a deterministic function
  of an integer ``seed`` and of the input dimension; ``resample()`` draws a new seed.
* ``state_dict()`` holds tensors only: besides the draws, the configuration that defines
  the map (class, width, input dimension, seed, sampler, degree, ...) as ``config_*``
  entries (:mod:`rfgp.core.config_state`).  Loading adopts the seed and the input dimension of a
  lazily initialised map and refuses a state saved from a differently configured map.
* The input dimension may be left unset; the draws are then made at the first call
  (like GPyTorch's ``RFFKernel``), which is what :func:`rfgp.sketch` relies on.
* Inputs arrive already divided by the lengthscale: hyperparameters live in the
  GPyTorch kernel, the map only sees ``x / lengthscale``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from ..core.config_state import CONFIG_PREFIX, DRAW, LAZY, METHOD, ConfigState, decode, same_value
from ..core.draws import register_draw
from ..core.dtypes import FullPrecisionMethods
from ..core.locks import init_lock
from ..core.memory import check_draws
from ..core.validation import (
    check_features_input,
    check_positive_int,
    check_seed,
    has_values,
    refuse_draws_under_vmap,
)

_SEED_BOUND = 2**62


def _new_seed(generator: torch.Generator | None) -> int:
    """A seed drawn from ``generator`` (``None``: torch's), on the generator's own device (a CUDA generator draws
    there: on the CPU, torch refuses it)."""
    device = None if generator is None else generator.device
    return int(torch.randint(_SEED_BOUND, (1,), generator=generator, device=device).item())


def widen_draws(module: nn.Module, draws: dict[str, Tensor], drawn_in: torch.dtype) -> None:
    """Register the seed's ``draws`` (buffers of ``module`` by name) in the buffers' current, wider dtype where the
    buffers are exactly the draws rounded to ``drawn_in`` — all of them, or none (draws that depend on more than the
    seed, such as hyperparameters that have changed since, keep their converted values).  Buffers on ``meta`` have
    no values to compare: they take the draws' shapes and the wider dtype."""
    widened = {}
    for name, value in draws.items():
        current = getattr(module, name, None)
        if not value.is_floating_point() or current is None or not current.is_floating_point():
            continue
        if current.shape != value.shape:
            return
        rounded = value.to(drawn_in).to(device=current.device, dtype=current.dtype)
        if has_values(current) and not torch.equal(rounded, current):
            return
        widened[name] = value.to(device=current.device, dtype=current.dtype)
    for name, value in widened.items():
        module.register_buffer(name, value)


class FeatureMap(FullPrecisionMethods, ConfigState, nn.Module):
    """Base class of all random feature maps.

    Subclasses implement :meth:`_draw` (the random quantities, as a dict of tensors) and
    :meth:`_features` (Φ from the input and the drawn buffers).  Maps whose expected
    diagonal E[Φ(x)ᵀΦ(x)] differs from the target k(x, x) (truncated Maclaurin, fitted
    SRF densities, ...) also override :meth:`target_diag` and :meth:`expected_diag`, and
    set ``has_variance_bias = True``; the kernels then add the difference to the
    posterior variance (paper 000, §5.6).

    Args:
        num_features: real output width F.
        input_dim: input dimension d; ``None`` draws lazily at the first call.
        seed: integer seed of the draws.  Exclusive with ``generator``.
        generator: a ``torch.Generator`` from which the seed is drawn.  With neither,
            the seed comes from torch's global generator (so ``torch.manual_seed`` applies).
    """

    #: whether E[Φ(x)ᵀΦ(x)] can differ from k(x, x) and needs a variance correction
    has_variance_bias: bool = False

    #: whether :meth:`squared_norm` gives ‖Φ(x)‖² in closed form, without the features
    has_closed_form_squared_norm: bool = False

    #: whether :meth:`_draw` depends on the seed and the configuration only (not on hyperparameters at draw time), so
    #: that draws rounded to float32 can be made again in float64 (:meth:`_apply`)
    draws_follow_seed: bool = True

    #: Φ(x) of every map, its own ``forward`` included, in its input's dtype under an enclosing ``torch.autocast``
    full_precision_methods = ("forward",)

    #: configuration saved in ``state_dict`` (subclasses add theirs; see :mod:`rfgp.core.config_state`)
    config_fields = {"num_features": METHOD, "input_dim": LAZY, "seed": DRAW}

    def __init__(
        self,
        num_features: int,
        input_dim: int | None = None,
        seed: int | None = None,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__()
        self.num_features = check_positive_int(num_features, "num_features")
        self.input_dim = None if input_dim is None else check_positive_int(input_dim, "input_dim")
        if seed is not None and generator is not None:
            raise ValueError("pass either seed or generator, not both")
        if seed is not None:
            self.seed = check_seed(seed)
        else:
            self.seed = _new_seed(generator)
        # Follows .to()/.double()/.cuda(): the dtype and device lazily drawn buffers get.
        self.register_buffer("_anchor", torch.empty(0), persistent=False)
        self._buffer_names: tuple[str, ...] = ()
        if self.input_dim is not None:
            self._materialize()

    # ------------------------------------------------------------------ draws
    def _draw(self, input_dim: int, generator: torch.Generator) -> dict[str, Tensor]:
        """Return the random quantities for ``input_dim`` drawn from the CPU ``generator``."""
        raise NotImplementedError

    def _materialize(self) -> None:
        """Make the seed's draws for ``input_dim`` and register them as buffers (replacing those of a previous seed).

        The draws are made outside ``torch.inference_mode()``, whichever call makes them (a first call, ``resample()``,
        a state loaded into a map never called, a new width): as inference tensors they could never be used by a later
        call that records a graph (training: "Inference tensors cannot be saved for backward")."""
        check_draws(self, self.input_dim, self._anchor.device)
        generator = torch.Generator().manual_seed(self.seed)
        with torch.inference_mode(False):
            draws = self._draw(self.input_dim, generator)
            for name, value in draws.items():
                if value.is_floating_point():
                    value = value.to(device=self._anchor.device, dtype=self._anchor.dtype)
                else:
                    value = value.to(device=self._anchor.device)
                register_draw(self, name, value)
        for name in set(self._buffer_names) - set(draws):  # draws of a previous seed or allocation
            delattr(self, name)
        self._buffer_names = tuple(draws)

    def _apply(self, fn, *args, **kwargs):
        """``.double()``, ``.to(...)``: draws rounded to a narrower dtype are made again in the wider one.

        The draws are made in the dtype the map has when it draws; a map that drew at construction under torch's
        default float32 and was then converted with ``.double()`` kept float32-rounded draws (kernel values 1e-8–1e-7
        away from the map built in float64 with the same seed).  After a widening conversion the draws the seed gives
        are made again and kept where their rounding to the old dtype is exactly the converted buffers (maps whose
        draws are centred on hyperparameters at draw time, ``draws_follow_seed = False``, keep the converted ones)."""
        drawn_in = self._anchor.dtype
        result = super()._apply(fn, *args, **kwargs)
        widened = torch.finfo(self._anchor.dtype).bits > torch.finfo(drawn_in).bits
        if widened and self.is_initialized and self.draws_follow_seed:
            self._widen_draws(drawn_in)
        return result

    def _widen_draws(self, drawn_in: torch.dtype) -> None:
        with torch.inference_mode(False), torch.no_grad():
            draws = self._draw(self.input_dim, torch.Generator().manual_seed(self.seed))
        widen_draws(self, draws, drawn_in)

    @property
    def is_initialized(self) -> bool:
        return bool(self._buffer_names)

    @property
    def fits_on_first_input(self) -> bool:
        """Whether the next call fits part of the map to the values of its inputs, not only to their dimension
        (the optimized Maclaurin allocation): state fixed by the first inputs the map sees."""
        return False

    def resample(self, generator: torch.Generator | None = None) -> FeatureMap:
        """Redraw all random quantities (from ``generator`` if given, else torch's global RNG)."""
        self.seed = _new_seed(generator)
        if self.input_dim is not None:
            self._materialize()
        return self

    # ---------------------------------------------------------------- forward
    def forward(self, x: Tensor) -> Tensor:
        """Φ(x) of shape ``(..., n, num_features)`` for ``x`` of shape ``(..., n, d)``."""
        self._prepare(x)
        return self._features(x)

    def prepare(self, x: Tensor) -> None:
        """Make the draws (and any data-dependent fit) from a batch of inputs without computing features."""
        self._prepare(x)

    def _prepare(self, x: Tensor) -> None:
        """Validate an input and make the draws at the first call when ``input_dim`` was left unset."""
        check_features_input(x, "x", self.input_dim)
        self._draw_at_first_call(x)

    def _draw_at_first_call(self, x: Tensor) -> None:
        """Make the draws for ``x``'s width when ``input_dim`` was left unset (a validated input).

        Draws made at a first call under ``torch.inference_mode()`` (a prediction before training) are made outside
        it: as inference tensors they could never be used by a later call that records a graph (training).  A first call
        under ``torch.func.vmap`` (or ``jacfwd``/``jacrev``/``hessian``) is refused (:func:`refuse_draws_under_vmap`).

        Threads calling a fresh map at once draw once: the draws are made under the map's
        :func:`~rfgp.core.locks.init_lock`, and a thread goes without it only once they are registered
        (:attr:`is_initialized`, set after the last buffer), not once ``input_dim`` is set (it is set before them: a
        second thread's call raised ``AttributeError`` on a draw not yet registered)."""
        if not self.is_initialized:
            refuse_draws_under_vmap(self)
            with init_lock(self):
                if self.input_dim is None:
                    self._draw_for(x.shape[-1])

    def _draw_for(self, input_dim: int) -> None:
        """Make the draws for ``input_dim``, then publish it (a failed draw leaves the map without an input_dim)."""
        self.input_dim = input_dim
        try:
            self._materialize()
        except BaseException:
            self.input_dim = None
            raise

    def _features(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def _buffer(self, name: str, like: Tensor) -> Tensor:
        """A drawn buffer in the dtype and on the device of ``like`` (a no-op when they match)."""
        value = getattr(self, name)
        if value.is_floating_point() and value.dtype != like.dtype:
            value = value.to(like.dtype)
        return value.to(like.device)

    # ------------------------------------------------------- bias correction
    def target_diag(self, x: Tensor) -> Tensor:
        """k(x, x) of the kernel this map targets, shape ``(..., n)``."""
        raise NotImplementedError

    def expected_diag(self, x: Tensor) -> Tensor:
        """E[Φ(x)ᵀΦ(x)] over the random draws, shape ``(..., n)``."""
        raise NotImplementedError

    def squared_norm(self, x: Tensor) -> Tensor:
        """‖Φ(x)‖² = Φ(x)ᵀΦ(x) of these draws, shape ``(..., n)``, from a closed form that does not need the
        features' values (sin/cos maps: cos² + sin² = 1); maps that have one set ``has_closed_form_squared_norm``.

        The diagonal k̂(x, x) of a kernel call with ``diag=True`` (an SVGP step's k̂(x, x) next to K(Z, x)) then
        costs O(n) instead of a second featurisation of x.  Inputs are validated by the caller (:meth:`prepare`).
        """
        raise NotImplementedError

    # ------------------------------------------------------------- state dict
    def _adopt_config(self, values: dict) -> None:
        """Adopt the saved seed (and input_dim, ...), then re-create the buffers with the saved shapes."""
        changed = not all(same_value(value, self._config_value(name)) for name, value in values.items())
        super()._adopt_config(values)
        if self.input_dim is not None and (changed or not self.is_initialized):
            self._materialize()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        saved_dim = state_dict.get(prefix + CONFIG_PREFIX + "input_dim")
        if saved_dim is not None and decode(saved_dim) is None:
            # saved before its first call, so without draws: this map's are made again from the adopted seed, also
            # where the seed is its own (after ``to_empty()`` its buffers hold no draws, only uninitialised memory)
            if self.is_initialized and self.draws_follow_seed:
                self._materialize()
            drawn = {prefix + name for name in self._buffer_names}
            missing_keys[:] = [key for key in missing_keys if key not in drawn]
        saved_in = [state_dict[prefix + name].dtype for name in self._buffer_names
                    if torch.is_tensor(state_dict.get(prefix + name)) and state_dict[prefix + name].is_floating_point()]
        if saved_in and self.is_initialized and self.draws_follow_seed:
            # draws saved in float32, loaded into a float64 map: the seed's draws in float64, as ``.double()`` after
            # the load gives (:meth:`_apply`), not the float32 draws converted
            drawn_in = min(saved_in, key=lambda dtype: torch.finfo(dtype).bits)
            if torch.finfo(self._anchor.dtype).bits > torch.finfo(drawn_in).bits:
                self._widen_draws(drawn_in)

    def extra_repr(self) -> str:
        return f"input_dim={self.input_dim}, num_features={self.num_features}"
