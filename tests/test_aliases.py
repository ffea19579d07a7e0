"""rfgp ≤ 0.1's flat module paths keep importing the same objects after the move into layer folders."""

import importlib
import subprocess
import sys

import pytest

import rfgp
from rfgp._aliases import OLD_PATHS


@pytest.mark.parametrize("old", sorted(OLD_PATHS))
def test_old_path_imports_and_resolves_to_the_new_objects(old):
    module = importlib.import_module(old)
    new_modules = [importlib.import_module(name) for name in OLD_PATHS[old]]
    names = {name for m in new_modules for name, value in vars(m).items()
             if not name.startswith("_") and getattr(value, "__module__", None) == m.__name__}  # defined there
    assert names, old
    for name in names:
        owner = next(m for m in new_modules if hasattr(m, name))
        assert getattr(module, name) is getattr(owner, name), f"{old}.{name}"
    parent, _, leaf = old.rpartition(".")
    assert getattr(importlib.import_module(parent), leaf) is module


def test_split_module_names_come_from_their_new_layers():
    from rfgp.complex_posterior import complex_feature_posterior, complex_kernel_posterior
    from rfgp.multioutput import MultiOutputGPModel, MultitaskFeatureSpacePredictionStrategy

    assert MultiOutputGPModel is rfgp.models.MultiOutputGPModel
    assert MultitaskFeatureSpacePredictionStrategy.__module__ == "rfgp.inference.multioutput"
    assert complex_kernel_posterior.__module__ == "rfgp.kernels.complex_posterior_option"
    assert complex_feature_posterior.__module__ == "rfgp.inference.complex_posterior"
    with pytest.raises(AttributeError, match="rfgp.multioutput"):
        rfgp.multioutput.no_such_name


def test_old_paths_work_in_a_fresh_interpreter():
    """``import rfgp.streaming`` as the first statement (before anything else imported rfgp)."""
    code = ("import rfgp.streaming, rfgp.operators\nfrom rfgp.variance import expected_error\n"
            "from rfgp.multioutput import MultiOutputGPModel\nprint(rfgp.streaming.StreamingFeatureGP.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "rfgp.models.streaming"
