"""Configuration in ``state_dict``: tensors only, and loads that refuse a different model.

A module that mixes in :class:`ConfigState` declares the Python attributes that define what it
computes (the sampler, a Matérn ν, a degree, an input dimension, a seed, ...) in
``config_fields``.  ``state_dict()`` then carries each of them as a tensor under the key
``config_<name>`` (written at save time from the attribute, so it can never be stale, and not
a buffer, so ``.double()``/``.float()``/``.to()`` and GPyTorch's batch indexing never touch it),
and ``load_state_dict()`` reads them back before the parameters and buffers are copied.

Encoding (self-describing: the dtype and shape say how to decode, no per-field declaration):

=====================  ===========================================
value                  tensor
=====================  ===========================================
``None``               empty ``torch.bool`` vector, shape (0,)
``bool``               ``torch.bool`` scalar
``int``                ``torch.int64`` scalar (every seed, [-2**63, 2**63))
``float``              ``torch.float64`` scalar (bit exact)
``str``                ``torch.uint8`` vector of its UTF-8 bytes
``tuple`` of ints      ``torch.int64`` vector
``Tensor`` (float64)   the tensor itself (a fitted table, say)
=====================  ===========================================

Every field has a role, which says what a load does with the saved value:

* ``METHOD``: the field defines the approximation (sampler, ν, degree, projection, width, ...).
  A saved value different from the module's raises a ``ValueError`` naming the field and
  both values, before anything of the module is changed.
* ``LAZY``: a value the module may still be waiting for (``input_dim`` of a map that draws at
  its first call).  Adopted when the module has ``None``; otherwise it must match, like
  ``METHOD``.  A saved ``None`` constrains nothing.
* ``DRAW``: identifies the random draw or the data fit (``seed``, fitted widths).  Always
  adopted; the module then re-creates its buffers with the saved shapes
  (:meth:`ConfigState._adopt_config`) and the saved values are copied into them.

A hyperparameter saved with another shape (a kernel built with another ``ard_num_dims`` or ``batch_shape``) fails as
in torch, with a line naming that argument and both values before torch's "size mismatch" line.

A state dict without ``config_*`` keys reports them as missing keys (``strict=True`` fails, and
``strict=False`` loads without checks, e.g. GPyTorch hyperparameters into an rfgp kernel).  A
checkpoint from rfgp versions that kept the feature maps' draw fields in a Python dict under
``_extra_state`` is converted (it carries no method fields, so those are not checked, and the
modules above such a map accept it without configuration).  A legacy state of a module without
feature maps (a Dirichlet likelihood alone) cannot be told apart from a foreign one: load it
with ``strict=False``.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch import Tensor

METHOD = "method"
LAZY = "lazy"
DRAW = "draw"
ROLES = (METHOD, LAZY, DRAW)

#: prefix of the state-dict keys holding configuration fields
CONFIG_PREFIX = "config_"
_LEGACY_KEY = "_extra_state"


def encode(value: Any) -> Tensor:
    """The tensor that stores a configuration value (see the module's table)."""
    if value is None:
        return torch.zeros(0, dtype=torch.bool)
    if isinstance(value, bool):
        return torch.tensor(value)
    if isinstance(value, int):
        return torch.tensor(value, dtype=torch.int64)
    if isinstance(value, float):
        return torch.tensor(value, dtype=torch.float64)
    if isinstance(value, str):
        return torch.tensor(list(value.encode("utf-8")), dtype=torch.uint8)
    if isinstance(value, tuple) and all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        return torch.tensor(value, dtype=torch.int64).reshape(-1)
    if torch.is_tensor(value) and value.dtype == torch.float64:
        return value.detach().clone()
    raise TypeError(
        f"a configuration value must be None, bool, int, float, str, a tuple of ints or a float64 tensor, "
        f"got {type(value).__name__}"
    )


#: the dimensions :func:`encode` gives each dtype (float64 tensors are fitted tables of any shape)
_ENCODED_DIMS = {torch.bool: (0, 1), torch.int64: (0, 1), torch.uint8: (1,)}


def decode(tensor: Tensor, key: str = "a configuration entry") -> Any:
    """The configuration value stored in ``tensor`` (inverse of :func:`encode`); ``key`` names it in errors.

    A tensor of more dimensions than :func:`encode` gives its dtype is refused: it is not one value (a state dict
    whose tensors were all expanded to a batch, as BoTorch's meta-learning tutorial does for its leave-one-out
    models, expands the configuration too)."""
    if not torch.is_tensor(tensor):
        raise TypeError(f"{key} must be a tensor, got {type(tensor).__name__}")
    tensor = tensor.detach().cpu()
    dims = _ENCODED_DIMS.get(tensor.dtype)
    if dims is not None and (tensor.dim() not in dims or tensor.dtype == torch.bool and tensor.numel() > 1):
        raise ValueError(
            f"cannot load state: {key} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}, which holds no "
            "configuration value: a configuration entry is one value per module (a scalar, a vector for a string "
            "or a tuple of ints, an empty bool vector for None), never expanded to a batch. A state dict whose "
            "tensors were all expanded (`{k: t.expand(b, *t.shape)}` for a batch of b models) expands it too: "
            "expand only the parameters (and buffers) that have a batch shape, and load the configuration and "
            "random draws as saved"
        )
    if tensor.dtype == torch.bool:
        return None if tensor.dim() == 1 and tensor.numel() == 0 else bool(tensor)
    if tensor.dtype == torch.int64:
        return int(tensor) if tensor.dim() == 0 else tuple(tensor.tolist())
    if tensor.dtype == torch.float64:
        return float(tensor) if tensor.dim() == 0 else tensor
    if tensor.dtype == torch.uint8:
        return bytes(tensor.tolist()).decode("utf-8")
    raise TypeError(f"{key} has dtype {tensor.dtype}, which encodes no configuration value")


def _is_vector(value: Any) -> bool:
    """Whether a configuration value is a tuple or a tensor rather than one scalar."""
    return isinstance(value, tuple) or torch.is_tensor(value)


def same_value(saved: Any, current: Any) -> bool:
    """Whether two configuration values are equal (same type; tensors compared exactly)."""
    if torch.is_tensor(saved) or torch.is_tensor(current):
        return torch.is_tensor(saved) and torch.is_tensor(current) and torch.equal(saved, current.cpu())
    return type(saved) is type(current) and saved == current


def draw_key(module: ConfigState) -> tuple:
    """The fields of ``module`` that change when its draws or its data fit do — its class, its width and its ``DRAW``
    and ``LAZY`` fields (``METHOD`` fields never change after construction) — and its
    :attr:`~ConfigState.loaded_state_version` (a load may change draws that no field names, such as landmarks given
    by hand, and hyperparameters), as a hashable, comparable tuple of (name, value), a float64 tensor as its shape and
    values: whether a result computed from the module's state still holds."""
    names = [name for name, role in module.config_fields.items() if role != METHOD or name in ("type", "num_features")]
    values = [(name, module._draw_key_value(name)) for name in names]
    values.append(("loaded_state_version", module.loaded_state_version))
    return tuple((name, (tuple(value.shape), tuple(value.flatten().tolist())) if torch.is_tensor(value) else value)
                 for name, value in values)


class ConfigState:
    """``nn.Module`` mixin (listed before ``nn.Module`` in the bases): configuration fields in ``state_dict``.

    Subclasses extend ``config_fields`` ({attribute name: role}; merged along the MRO, base
    classes first).  ``type`` (the class name, role ``METHOD``) is always the first field, so
    the state of one class never loads into another.  :meth:`_config_value` reads a field
    (default: the attribute) and :meth:`_adopt_config` applies adopted ``LAZY``/``DRAW``
    values (default: sets the attributes); override them for derived fields.
    """

    config_fields: ClassVar[dict[str, str]] = {"type": METHOD}
    #: how many loaded states changed this module's own parameters or buffers (:func:`draw_key`)
    loaded_state_version: int = 0
    #: fields added after states of the class were first saved: a state without them is not
    #: missing anything (the module keeps its own values), a state with them loads as usual
    optional_config_fields: ClassVar[frozenset[str]] = frozenset()
    #: earlier class names whose saved states this class loads as its own (a family split out of a
    #: class that multiplexed families by ``method``; the saved ``method`` field is still checked)
    legacy_type_names: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        merged: dict[str, str] = {}
        for base in reversed(cls.__mro__):
            merged.update(base.__dict__.get("config_fields", {}))
        bad = {name: role for name, role in merged.items() if role not in ROLES}
        if bad:
            raise ValueError(f"{cls.__name__}.config_fields has roles {bad}; accepted roles: {ROLES}")
        cls.config_fields = merged

    # --------------------------------------------------------------- fields
    def _config_value(self, name: str) -> Any:
        if name == "type":
            return type(self).__name__
        return getattr(self, name)

    def _draw_key_value(self, name: str) -> Any:
        """The value of field ``name`` in :func:`draw_key` (default: the field itself).  A module whose field is a
        tensor it only ever replaces, never changes in place, may key it by a number it bumps at each replacement:
        the key is compared at every prediction, and a tensor enters it as the list of its values."""
        return self._config_value(name)

    def config(self) -> dict[str, Any]:
        """The configuration fields and their current values."""
        return {name: self._config_value(name) for name in self.config_fields}

    def _adopt_config(self, values: dict[str, Any]) -> None:
        """Apply adopted ``LAZY``/``DRAW`` values (called before the buffers are loaded)."""
        for name, value in values.items():
            setattr(self, name, value)

    def _legacy_config(self, extra: dict) -> dict[str, Any]:
        """Fields of a legacy ``_extra_state`` dict (default: those it has, by name)."""
        return {name: value for name, value in extra.items() if name in self.config_fields}

    # ----------------------------------------------------------- state dict
    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        super()._save_to_state_dict(destination, prefix, keep_vars)
        for name, value in self.config().items():
            destination[prefix + CONFIG_PREFIX + name] = encode(value)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs) -> None:
        saved = self._saved_config(state_dict, prefix, missing_keys)
        self._adopt_config(self._checked_adoptions(saved, prefix))
        error_msgs.extend(self._shape_hints(state_dict, prefix))
        before = {name: tensor.detach().clone() for name, tensor in self._own_tensors().items()}
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        after = self._own_tensors()
        if before.keys() != after.keys() or any(
                a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b)
                for a, b in ((before[name], after[name]) for name in before)):
            self.loaded_state_version += 1
        own = {prefix + CONFIG_PREFIX + name for name in self.config_fields} | {prefix + _LEGACY_KEY}
        unexpected_keys[:] = [key for key in unexpected_keys if key not in own]

    def _shape_hints(self, state_dict, prefix: str) -> list[str]:
        """What torch's "size mismatch for raw_lengthscale" leaves unsaid: the constructor argument that differs.

        One line per parameter of this module, or of its submodules down to the next configured module (the GPyTorch
        base kernel of a Nyström kernel), whose saved shape differs from its own after the adopted draws were
        re-created; torch's ``load_state_dict`` raises its ``RuntimeError`` with them and its own lines."""
        hints = []
        for owner_prefix, owner in _hyperparameter_owners(self, prefix):
            if not getattr(owner, "_load_strict_shapes", True):  # GPyTorch's load_strict_shapes(False) adopts them
                continue
            for name, parameter in owner._parameters.items():
                saved = state_dict.get(owner_prefix + name)
                if (parameter is None or not torch.is_tensor(saved) or torch.nn.parameter.is_lazy(parameter)
                        or saved.shape == parameter.shape or (parameter.dim() == 0 and saved.shape == (1,))):
                    continue  # torch copies these (a 1-vector into a scalar as saved by torch 0.3)
                hints.append(f"{owner_prefix}{name} has shape {tuple(saved.shape)} in the state dict but "
                             f"{tuple(parameter.shape)} in this module: "
                             f"{_shape_reason(owner, name, tuple(saved.shape), tuple(parameter.shape))}")
        return hints

    def _own_tensors(self) -> dict[str, Tensor]:
        """This module's own parameters and buffers (not its submodules')."""
        return {name: tensor for name, tensor in {**self._parameters, **self._buffers}.items() if tensor is not None}

    def _saved_config(self, state_dict, prefix: str, missing_keys: list[str]) -> dict[str, Any]:
        if not any(key.startswith(prefix + CONFIG_PREFIX) for key in state_dict):
            legacy = state_dict.get(prefix + _LEGACY_KEY)
            if isinstance(legacy, dict):
                return self._legacy_config(legacy)
            if any(key.endswith(_LEGACY_KEY) for key in state_dict):
                return {}  # a legacy checkpoint: its feature maps kept their draw fields in a dict
        saved = {}
        for name in self.config_fields:
            key = prefix + CONFIG_PREFIX + name
            if key in state_dict:
                saved[name] = decode(state_dict[key], key)
            elif name not in self.optional_config_fields:
                missing_keys.append(key)
        if saved.get("type") in self.legacy_type_names:
            saved["type"] = type(self).__name__
        return saved

    def _checked_adoptions(self, saved: dict[str, Any], prefix: str) -> dict[str, Any]:
        """The saved values to adopt; raises ``ValueError`` on a ``METHOD`` (or set ``LAZY``) mismatch."""
        adopt = {}
        for name, role in self.config_fields.items():
            if name not in saved:
                continue
            value, current = saved[name], self._config_value(name)
            if role == DRAW or (role == LAZY and current is None):
                if None not in (value, current) and _is_vector(value) != _is_vector(current):  # one entry expanded
                    raise ValueError(
                        f"cannot load state: {prefix}{name} is {value!r} (type {type(value).__name__}) in the state "
                        f"dict but {current!r} (type {type(current).__name__}) in this module"
                    )
                if value is not None or role == DRAW:
                    adopt[name] = value
            elif not (same_value(value, current) or (role == LAZY and value is None)):
                raise ValueError(
                    f"cannot load state: {prefix}{name} is {self._reported_config(name, saved)!r} in the state dict "
                    f"but {self._reported_config(name, self.config())!r} in this module "
                    "(the state was saved from a differently configured module)"
                )
        return adopt

    def _reported_config(self, name: str, values: dict[str, Any]) -> Any:
        """The value of field ``name`` that a load error reports, from ``values`` (saved, or this module's config).

        Default: the field itself; a module whose field is derived from an argument the user passed reports that
        argument instead, when ``values`` hold it."""
        return values[name]


def _hyperparameter_owners(module, prefix: str):
    """(prefix, module) for ``module`` and its submodules, not entering configured modules (they check their own)."""
    yield prefix, module
    for name, child in module._modules.items():
        if child is not None and not isinstance(child, ConfigState):
            yield from _hyperparameter_owners(child, f"{prefix}{name}.")


def _shape_reason(owner, name: str, saved: tuple, current: tuple) -> str:
    """The constructor argument of ``owner`` (a GPyTorch kernel, say) that gave parameter ``name`` another shape."""
    batch = tuple(getattr(owner, "batch_shape", ()))
    event = len(current) - len(batch)
    if name == "raw_lengthscale" and saved and current and saved[-1] != current[-1]:
        return (f"the state holds lengthscales for {saved[-1]} input dimensions, this module for {current[-1]}; build "
                f"it with ard_num_dims={saved[-1] if saved[-1] > 1 else None}, as the state was saved")
    if 0 <= event <= len(saved) and saved[len(saved) - event:] == current[len(current) - event:]:
        return (f"the state was saved with batch_shape={saved[:len(saved) - event]}, this module has "
                f"batch_shape={batch}; build it with the saved batch_shape")
    return "the state was saved from a module built with other sizes (ard_num_dims, batch_shape, a number of tasks)"


class SavedDrawShapes:
    """``nn.Module`` mixin (listed before :class:`ConfigState`): draws take the shapes a loaded state saved.

    For draws whose shape depends on hyperparameters at draw time (the number of harmonics of a
    periodic measure follows the lengthscale then), a module re-drawn at its own hyperparameters
    while a state loads can hold buffers of another shape than the saved ones — a state saved after
    training, or converted from a trained exact kernel, loaded into a freshly built module.  Such a
    module calls :meth:`_adopt_saved_shapes` right after it (re-)registers its draws; during a load
    the buffers the state dict holds with another shape are re-created with the saved shape, and
    the saved values are then copied into them.  Outside a load it does nothing.
    """

    _saved_shapes: ClassVar[dict] = {}

    def _adopt_saved_shapes(self) -> None:
        for name, buffer in list(self.named_buffers(recurse=False)):
            shape = self._saved_shapes.get(name)
            if shape is not None and buffer.shape != shape:
                self.register_buffer(name, buffer.new_empty(shape))

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        self._saved_shapes = {
            key[len(prefix):]: value.shape for key, value in state_dict.items()
            if key.startswith(prefix) and "." not in key[len(prefix):] and torch.is_tensor(value)
        }
        try:
            self._adopt_saved_shapes()
            super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        finally:
            self._saved_shapes = {}
