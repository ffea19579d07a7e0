"""Foundations of every layer: input validation, global settings, tensor-only configuration state, the memory guard.

Nothing here imports another part of rfgp, and every other layer may import from here.

* :mod:`~rfgp.core.validation` — the boundary checks (NaN/Inf, dtypes, shapes, hyperparameter
  values) that raise :class:`~rfgp.core.validation.InvalidValueError` naming the argument;
* :mod:`~rfgp.core.settings` — context managers such as ``memory_budget``, ``chunk_size`` and
  ``validate_inputs`` (public as :mod:`rfgp.settings`);
* :mod:`~rfgp.core.config_state` — a map's or kernel's configuration stored as ``config_*``
  tensors, so ``state_dict`` round-trips it bit for bit;
* :mod:`~rfgp.core.memory` — refuses random draws and solves that would not fit in memory;
* :mod:`~rfgp.core.locks` — a re-entrant lock per object around state built lazily at first use (threads);
* :mod:`~rfgp.core.state_cache` — a graph-free result reused while the tensors and settings it came from are
  unchanged (compared by value).
"""
