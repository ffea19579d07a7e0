"""Optional integrations with other libraries, registered only when those libraries are imported.

rfgp must import without them, and importing rfgp must not import them either (``import
botorch`` changes GPyTorch's global settings, which a user who never asked for BoTorch must not
get).  So :func:`when_imported` runs a registration right after the library's own import —
at once if it is already imported, otherwise through a one-shot ``sys.meta_path`` finder that
only reacts to that one module name and removes itself once that module has been executed.

* :mod:`rfgp.integrations.botorch` — pathwise (Matheron) sampling of rfgp kernels in BoTorch.
* :mod:`rfgp.integrations.botorch_kernels` — BoTorch's own kernels (``CategoricalKernel``, ``PositiveIndexKernel``,
  the fidelity kernels ``DownsamplingKernel`` and ``ExponentialDecayKernel``) for ``rfgp.sketch``.
* :mod:`rfgp.integrations.botorch_oak` — BoTorch's ``OrthogonalAdditiveKernel`` for ``rfgp.sketch``.
* :mod:`rfgp.integrations.botorch_transforms` — BoTorch's ``Standardize`` keeps an rfgp posterior's low-rank root.
* :mod:`rfgp.integrations.botorch_multioutput` — ``ModelListGP`` and batched multi-output posteriors keep their
  low-rank roots; ``subset_output`` of a batched multi-output model indexes its converted kernel by the outputs.
* :mod:`rfgp.integrations.botorch_models` — ``rfgp.set_num_features`` rebuilds ``PairwiseGP``'s Laplace approximation;
  ``LatentKroneckerGP``'s dense pathwise sampler refuses rfgp kernels by name.
* :mod:`rfgp.integrations.botorch_pruning` — BoTorch's ``X_baseline`` pruning (qLogNEI, …) samples rfgp posteriors
  through their n × F root.
* :mod:`rfgp.integrations.botorch_cross_validation` — ``loo_cv``'s leave-one-out predictions of rfgp models through
  the F × F capacitance.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from collections.abc import Callable

from ..core.user_warnings import warn as warn_user


def when_imported(module_name: str, register: Callable[[], None]) -> None:
    """Call ``register()`` once ``module_name`` has been imported (now, if it already is)."""
    if module_name in sys.modules:
        _run(module_name, register)
    else:
        sys.meta_path.insert(0, _PostImportFinder(module_name, register))


def _run(module_name: str, register: Callable[[], None]) -> None:
    try:
        register()
    except Exception as error:  # an incompatible version must not break the user's own import
        warn_user(
            f"rfgp could not register its {module_name} integration ({type(error).__name__}: {error}); "
            f"{module_name} itself works, but its rfgp-specific features are unavailable",
            RuntimeWarning,
        )


class _PostImportFinder(importlib.abc.MetaPathFinder):
    def __init__(self, module_name: str, register: Callable[[], None]) -> None:
        self.module_name = module_name
        self.register = register
        self._searching = False

    def find_spec(self, fullname, path, target=None):
        if fullname != self.module_name or self._searching:
            return None
        self._searching = True  # let the other finders locate the module
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._searching = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        exec_module = spec.loader.exec_module

        def exec_then_register(module):
            exec_module(module)
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            _run(fullname, self.register)

        spec.loader.exec_module = exec_then_register
        return spec


def _register_botorch() -> None:
    importlib.import_module(f"{__name__}.botorch")
    importlib.import_module(f"{__name__}.botorch_kernels")
    importlib.import_module(f"{__name__}.botorch_oak")
    importlib.import_module(f"{__name__}.botorch_transforms")
    importlib.import_module(f"{__name__}.botorch_multioutput")
    importlib.import_module(f"{__name__}.botorch_models")
    importlib.import_module(f"{__name__}.botorch_pruning")
    importlib.import_module(f"{__name__}.botorch_cross_validation")


when_imported("botorch", _register_botorch)
