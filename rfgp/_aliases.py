"""The module paths of rfgp ≤ 0.1 (a flat package), kept importable after the move into layer folders.

``import rfgp.operators``, ``from rfgp.streaming import StreamingFeatureGP``, ``rfgp.variance`` and
the other old spellings keep working: each old path is registered in ``sys.modules`` (and as an
attribute of its parent package) as the module now holding that code.  Where a module's names
were split between layers (the multi-output model moved up to :mod:`rfgp.models`, the
kernel-level complex posterior to :mod:`rfgp.kernels`), the old path is a read-only view that
looks each name up in the new modules, in order.
"""

from __future__ import annotations

import importlib
import sys
import types

#: old module path → the module(s) that now hold its names, first match wins
OLD_PATHS: dict[str, tuple[str, ...]] = {
    "rfgp._validation": ("rfgp.core.validation",),
    "rfgp.config_state": ("rfgp.core.config_state",),
    "rfgp.memory": ("rfgp.core.memory",),
    "rfgp.settings": ("rfgp.core.settings",),
    "rfgp.dot_product": ("rfgp.features.dot_product",),
    "rfgp.signed_log": ("rfgp.features.signed_log",),
    "rfgp.variance": ("rfgp.features.variance",),
    "rfgp.linalg": ("rfgp.inference.linalg",),
    "rfgp.chunking": ("rfgp.inference.chunking",),
    "rfgp.kernel_space": ("rfgp.inference.kernel_space",),
    "rfgp.operators": ("rfgp.inference.operators",),
    "rfgp.log_prob": ("rfgp.inference.log_prob",),
    "rfgp.prediction": ("rfgp.inference.prediction",),
    "rfgp.multioutput": ("rfgp.inference.multioutput", "rfgp.models.multioutput"),
    "rfgp.classification": ("rfgp.inference.classification",),
    "rfgp.complex_posterior": ("rfgp.inference.complex_posterior", "rfgp.kernels.complex_posterior_option"),
    "rfgp.cholesky_update": ("rfgp.inference.cholesky_update",),
    "rfgp.distributed": ("rfgp.inference.distributed",),
    "rfgp.conversion": ("rfgp.kernels.conversion",),
    "rfgp.kernels.complex_posterior": ("rfgp.kernels.complex_posterior_option",),
    "rfgp.streaming": ("rfgp.models.streaming",),
    "rfgp.feature_width": ("rfgp.models.feature_width",),
    "rfgp.sampling": ("rfgp.models.sampling",),
    "rfgp.applications.sampling": ("rfgp.models.sampling",),
    "rfgp.vector_fields": ("rfgp.applications.vector_fields",),
    "rfgp.distances": ("rfgp.applications.distances",),
}


def _view(old: str, sources: list[types.ModuleType]) -> types.ModuleType:
    """A module named ``old`` whose attributes are looked up in ``sources`` in order."""
    view = types.ModuleType(old, sources[0].__doc__)

    def __getattr__(name: str):
        for source in sources:
            if hasattr(source, name):
                return getattr(source, name)
        raise AttributeError(f"module {old!r} (now {', '.join(s.__name__ for s in sources)}) has no attribute {name!r}")

    def __dir__():
        return sorted({name for source in sources for name in dir(source)})

    view.__getattr__ = __getattr__
    view.__dir__ = __dir__
    view.__all__ = sorted({
        name for source in sources
        for name in getattr(source, "__all__", [n for n in vars(source) if not n.startswith("_")])
    })
    return view


def install() -> None:
    """Register every old path in ``sys.modules`` and on its parent package (idempotent)."""
    for old, new in OLD_PATHS.items():
        sources = [importlib.import_module(name) for name in new]
        module = sources[0] if len(sources) == 1 else _view(old, sources)
        sys.modules.setdefault(old, module)
        parent, _, leaf = old.rpartition(".")
        setattr(sys.modules[parent], leaf, sys.modules[old])
