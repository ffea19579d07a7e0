"""Every ``>>>`` example in rfgp's docstrings runs and shows what it says (the API reference's examples).

Each docstring's example runs as its own test (id: the docstring's qualified name) in an empty namespace:
no module globals and no pre-imported ``torch``, ``gpytorch`` or ``rfgp``, so every example imports what
it uses, seeds any data its output depends on, and can be pasted into a fresh interpreter as it stands.
"""

import doctest
import importlib
import importlib.util
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


def _docstring_examples(module_name):
    """The docstring examples of ``module_name``; ``None`` where BoTorch, an optional dependency, is missing."""
    if module_name.startswith("rfgp.integrations.") and importlib.util.find_spec("botorch") is None:
        return None
    module = importlib.import_module(module_name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    return [test for test in finder.find(module, module_name, globs={}) if test.examples]


EXAMPLES = {module_name: _docstring_examples(module_name) for module_name in MODULES}
NO_BOTORCH = "BoTorch (the botorch extra) is not installed"


@pytest.mark.parametrize("module_name", MODULES)
def test_every_module_with_an_example_has_a_docstring_example(module_name):
    """A ``>>>`` outside any docstring doctest finds (a comment, a nested function) would never run."""
    if EXAMPLES[module_name] is None:
        pytest.skip(NO_BOTORCH)
    assert EXAMPLES[module_name], f"{module_name} has '>>>' in its source but no docstring example was found"


def _params():
    for module_name, tests in EXAMPLES.items():
        if tests is None:
            yield pytest.param(None, id=module_name, marks=pytest.mark.skip(reason=NO_BOTORCH))
        else:
            yield from (pytest.param(test, id=test.name) for test in tests)


@pytest.mark.parametrize("test", list(_params()))
def test_docstring_example_runs(test):
    report = []
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    runner.run(test, out=report.append)
    assert runner.summarize(verbose=False).failed == 0, "".join(report)


def test_every_public_namespace_has_examples():
    """The examples cover the main namespaces (so they cannot silently disappear)."""
    covered = {name.split(".")[1] for name in MODULES if name.count(".") >= 1}
    assert {"features", "kernels", "models", "likelihoods", "pyro"} <= covered

