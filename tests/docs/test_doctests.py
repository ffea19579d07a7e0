"""Every ``>>>`` example in rfgp's docstrings runs and shows what it says (the API reference's examples).

An example sees its module's globals plus ``torch``, ``gpytorch`` and ``rfgp`` — the three names
every example may take for granted, as NumPy's examples take ``np`` — and builds anything else
(data, models) inline, seeded.  Each docstring starts from ``torch.manual_seed(0)``.
"""

import doctest
import importlib
import pathlib

import gpytorch
import pytest
import torch

import rfgp

PACKAGE = pathlib.Path(rfgp.__file__).parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
NAMESPACE = {"torch": torch, "gpytorch": gpytorch, "rfgp": rfgp}


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Only modules whose source has an example are imported (rfgp.integrations.botorch imports BoTorch).
MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text(encoding="utf-8"))

def _examples(module_name):
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [test for test in finder.find(module, module_name, extraglobs=NAMESPACE) if test.examples]


@pytest.mark.parametrize("module_name", MODULES)
def test_docstring_examples_run(module_name):
    tests = _examples(module_name)
    assert tests, f"{module_name} has '>>>' in its source but no docstring example was found"
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    for test in tests:
        torch.manual_seed(0)
        runner.run(test, out=report.append)
    failed = runner.summarize(verbose=False).failed
    assert failed == 0, "".join(report)


def test_every_public_namespace_has_examples():
    """The examples cover the main namespaces (so they cannot silently disappear)."""
    covered = {name.split(".")[1] for name in MODULES if name.count(".") >= 1}
    assert {"features", "kernels", "models", "likelihoods", "pyro"} <= covered
