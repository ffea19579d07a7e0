"""A re-entrant lock per object, for state built lazily at first use by one of several threads.

A model served from a thread pool (a web server's workers, ``concurrent.futures.ThreadPoolExecutor``) is called by
several threads at once, and PyTorch releases the GIL inside its kernels.  State an rfgp object builds at its first
call — a feature map's random draws when ``input_dim`` was left unset, the optimized Maclaurin allocation, the
posterior caches of a prediction strategy — was built without a lock: a second thread could find ``input_dim`` set
before the draws existed (``AttributeError`` on a buffer), or build the state a second time.

Builders take :func:`init_lock` around the build and test the state again inside it (double-checked
initialisation), so a built object never takes the lock.  The locks live in a table keyed weakly on the object, not
on the object: ``state_dict``, ``pickle``, ``copy.deepcopy``, ``torch.save``, DataLoader workers,
``torch.jit.trace`` and ``torch.compile`` see nothing of them, and a copy gets a lock of its own at its first build.

A build that is host-side Python (:func:`untraced_build`: the optimized Maclaurin allocation and its draws) runs as
Python under ``torch.compile`` too, instead of being traced by TorchDynamo.
"""

from __future__ import annotations

import functools
import sys
import threading
import weakref
from typing import Callable, TypeVar

Function = TypeVar("Function", bound=Callable)

_TABLE_LOCK = threading.Lock()
_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def init_lock(owner: object) -> threading.RLock:
    """The re-entrant lock of ``owner`` (made at the first request), which serialises its lazy first-use builds.

    Re-entrant: a build may call another of the same object's builders (a Maclaurin map's allocation draws its
    sketches).  ``owner`` must be weakly referenceable and hash by identity (modules and plain objects do)."""
    with _TABLE_LOCK:
        lock = _LOCKS.get(owner)
        if lock is None:
            lock = _LOCKS[owner] = threading.RLock()
        return lock


def untraced_build(function: Function) -> Function:
    """``function``, run as Python (``torch._dynamo.disable``) even when compiled code reaches it.

    For one-time, host-side builds of Python numbers and caches, which compiling cannot speed up: traced, the
    optimized Maclaurin allocation recompiled at every candidate order (guards on ``len(self._cache)`` of its pair
    statistics, on the degree, on float values of its sums) and its draws once per degree.  TorchDynamo still traces
    the wrapper and guards on the wrapped code: decorate the one entry of a build, not its parts.  It is looked up at
    the call, not imported here: it is imported whenever something is compiled, and importing it costs seconds that
    an rfgp import without ``torch.compile`` should not pay.
    """

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        dynamo = sys.modules.get("torch._dynamo")
        if dynamo is None:
            return function(*args, **kwargs)
        return dynamo.disable(function)(*args, **kwargs)  # a wrapper per call: no state for Dynamo to guard on

    return wrapper
