"""Warnings attributed to the user's line, not to the rfgp (or GPyTorch, BoTorch, torch) frame that issued them.

``warnings.warn(..., stacklevel=n)`` names the frame n levels up, a depth that changes with every refactoring and
with the road a call takes (``rfgp.sketch`` directly or through a BoTorch model's constructor, a kernel evaluated by
GPyTorch's ``__call__`` or by linear_operator inside a solve).  A fixed depth left several of rfgp's warnings
pointing at its own source lines, where the user can neither see which of their calls it was nor filter it by
module.  :func:`warn` walks out of the libraries instead (Python 3.12's ``skip_file_prefixes`` does the same, by
file name).
"""

from __future__ import annotations

import contextlib
import sys
import warnings

#: top-level modules whose frames a warning skips: rfgp, the libraries that call into it, and Python's import and
#: decorator machinery between them and the user's code
LIBRARY_MODULES = frozenset({
    "rfgp", "gpytorch", "linear_operator", "torch", "botorch", "pyro", "sklearn",
    "importlib", "contextlib", "functools",
})


def warn(message: str, category: type[Warning] = UserWarning) -> None:
    """``warnings.warn(message, category)`` attributed to the first calling frame outside :data:`LIBRARY_MODULES`
    (the outermost frame where there is none).

    The frame's module (``__name__``; a script is ``__main__``, a notebook cell its kernel's namespace) decides,
    so the user's line is named whether rfgp was reached directly or through GPyTorch, BoTorch or scikit-learn.
    """
    frame = sys._getframe(1)
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] in LIBRARY_MODULES:
        frame = frame.f_back  # stops at the outermost frame where every frame is the libraries'
    # warn_explicit at the user's frame, with its registry, as warnings.warn does: a stacklevel counted here was off
    # where import machinery lay between rfgp and the user (warnings.warn does not count importlib._bootstrap
    # frames), as in a warning of rfgp's import hook for ``import botorch``, which named "sys", line 1.  Without
    # module_globals, as warnings.warn: given them, C's warn_explicit asks the frame's __loader__ for the source line
    # and raises its error ("ImportError: '__main__' is not a built-in module" for code read from stdin)
    module_globals = frame.f_globals
    warnings.warn_explicit(message, category, frame.f_code.co_filename, frame.f_lineno,
                           module_globals.get("__name__", "<string>"),
                           module_globals.setdefault("__warningregistry__", {}))


@contextlib.contextmanager
def held_warnings():
    """The warnings raised inside the block, held back (a list of ``warnings.WarningMessage``) for
    :func:`replay_warnings`: an estimator that fits several models and keeps one shows the kept fit's warnings only.
    Replayed at once if the block raises, so that they still explain the error."""
    caught = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            yield caught
    except BaseException:
        replay_warnings(caught)
        raise


def replay_warnings(caught) -> None:
    """Issues held warnings again, under the caller's filters, with their original category and location, each
    distinct one once: a warning raised at every training step (statistics over ``rfgp.settings.memory_budget``)
    is held once per step, and ``warn_explicit`` without a registry deduplicates nothing (it was shown once per
    step)."""
    seen = set()
    for message in caught:
        key = (message.category, str(message.message), message.filename, message.lineno)
        if key in seen:
            continue
        seen.add(key)
        warnings.warn_explicit(message.message, message.category, message.filename, message.lineno,
                               source=message.source)
