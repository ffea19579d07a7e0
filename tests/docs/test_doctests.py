"""Every ``>>>`` example in rfgp's docstrings runs and shows what it says (the API reference's examples).

Each docstring's example runs as its own test (id: the docstring's qualified name) in an empty namespace:
no module globals and no pre-imported ``torch``, ``gpytorch`` or ``rfgp``, so every example imports what
it uses, seeds its own data and can be pasted into a fresh interpreter as it stands.
"""

import doctest
import importlib
import pathlib

import pytest

import rfgp

PACKAGE = pathlib.Path(rfgp.__file__).parent
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# Only modules whose source has an example are imported (rfgp.integrations.botorch imports BoTorch).
MODULES = sorted(_module_name(p) for p in PACKAGE.rglob("*.py") if ">>>" in p.read_text(encoding="utf-8"))


def _docstring_examples():
    finder = doctest.DocTestFinder(exclude_empty=True)
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        tests = [test for test in finder.find(module, module_name, globs={}) if test.examples]
        yield module_name, tests


EXAMPLES = dict(_docstring_examples())


@pytest.mark.parametrize("module_name", MODULES)
def test_every_module_with_an_example_has_a_docstring_example(module_name):
    """A ``>>>`` outside any docstring doctest finds (a comment, a nested function) would never run."""
    assert EXAMPLES[module_name], f"{module_name} has '>>>' in its source but no docstring example was found"


@pytest.mark.parametrize(
    "test", [pytest.param(test, id=test.name) for tests in EXAMPLES.values() for test in tests])
def test_docstring_example_runs(test):
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).failed == 0, "".join(report)


def test_every_public_namespace_has_examples():
    """The examples cover the main namespaces (so they cannot silently disappear)."""
    covered = {name.split(".")[1] for name in MODULES if name.count(".") >= 1}
    assert {"features", "kernels", "models", "likelihoods", "pyro"} <= covered

