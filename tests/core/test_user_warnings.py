"""rfgp's warnings name the user's line: the first frame outside rfgp and the libraries between it and the user.

Before, each warning carried a fixed ``stacklevel`` that fitted one road into it: ``rfgp.sketch``'s truncation warning
named ``rfgp/kernels/conversion.py``, a warning raised while GPyTorch evaluated a kernel named a GPyTorch frame.
"""

from __future__ import annotations

import importlib
import os
import pathlib
import subprocess
import sys
import warnings

import gpytorch
import pytest
import torch

import rfgp
from rfgp.core.user_warnings import warn

DTYPE = torch.float64


def _caught(action):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        action()
    return caught


def test_a_direct_call_names_its_caller():
    (record,) = _caught(lambda: warn("message", RuntimeWarning))
    assert record.filename == __file__ and record.category is RuntimeWarning


def test_the_conversion_warning_names_the_line_that_called_rfgp_sketch():
    x = 2 * torch.rand(40, 2, generator=torch.Generator().manual_seed(0), dtype=DTYPE) - 1
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel()).to(DTYPE)
    kernel.base_kernel.lengthscale = 0.2  # the order-10 allocation leaves out a quarter of k(x, x) over x
    caught = _caught(lambda: rfgp.sketch(kernel, 32, method="maclaurin", x_sample=x, seed=0))
    truncation = [w for w in caught if issubclass(w.category, rfgp.TruncationWarning)]
    assert truncation and all(w.filename == __file__ for w in truncation)


def test_a_warning_raised_while_gpytorch_evaluates_the_marginal_likelihood_names_the_users_line():
    """MemoryBudgetWarning comes from deep inside linear_operator's solve of a batched model's covariance."""
    batch = torch.Size([4])

    class BatchGP(gpytorch.models.ExactGP):
        def __init__(self, x, y):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch))
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = rfgp.kernels.SketchedRBFKernel(64, batch_shape=batch, seed=0)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    x = torch.rand(4, 200, 1, generator=torch.Generator().manual_seed(0), dtype=DTYPE)
    y = torch.sin(6 * x[..., 0])
    model = BatchGP(x, y).to(DTYPE)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with rfgp.settings.memory_budget(150_000):  # the (4, 64, 64) statistics of a gradient exceed it
        caught = _caught(lambda: mll(model(x), y).sum().backward())
    budget = [w for w in caught if issubclass(w.category, rfgp.MemoryBudgetWarning)]
    assert budget and all(w.filename == __file__ for w in budget)


def test_fit_mll_warnings_name_the_call_of_fit_mll():
    class GP(gpytorch.models.ExactGP):
        def __init__(self, x, y):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
            self.mean_module = gpytorch.means.ConstantMean()
            self.covar_module = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(64, seed=0))

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    x = 1000 * torch.rand(50, 1, generator=torch.Generator().manual_seed(0), dtype=DTYPE)  # raw inputs in thousands
    model = GP(x, torch.sin(x[:, 0] / 300)).to(DTYPE)
    caught = _caught(lambda: rfgp.fit_mll(model, num_iterations=2, progress=False))
    scale = [w for w in caught if issubclass(w.category, rfgp.DataScaleWarning)]
    assert scale and all(w.filename == __file__ for w in scale)


@pytest.mark.parametrize("module", ["rfgp.kernels", "gpytorch.kernels", "torch.nn"])
def test_frames_of_the_libraries_are_skipped(module):
    namespace = {"__name__": module, "warn": warn}
    exec("def issue():\n    warn('inside', UserWarning)\n", namespace)
    (record,) = _caught(namespace["issue"])
    assert record.filename == __file__


def test_a_warning_raised_inside_an_import_names_the_import_line(tmp_path, monkeypatch):
    """rfgp's hook registering an integration when its library is imported warns if the registration fails: the
    import machinery's frames lay between, which ``warnings.warn`` leaves out of its stacklevel count; the warning
    had named "sys", line 1."""
    from rfgp.integrations import when_imported

    (tmp_path / "rfgp_hooked_library.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "rfgp_hooked_library", raising=False)

    def register():
        raise RuntimeError("incompatible version")

    when_imported("rfgp_hooked_library", register)
    caught = _caught(lambda: importlib.import_module("rfgp_hooked_library"))
    hooked = [w for w in caught if "rfgp_hooked_library integration" in str(w.message)]
    assert len(hooked) == 1 and hooked[0].filename == __file__


def test_a_warning_from_code_read_from_stdin_is_shown_not_raised():
    """Code piped to ``python -`` (``__main__`` from stdin, whose loader has no source): passing the frame's globals
    to ``warnings.warn_explicit`` made it ask that loader for the line, and every rfgp warning raised
    "ImportError: '__main__' is not a built-in module" instead of being shown."""
    code = "from rfgp.core.user_warnings import warn\nwarn('shown from stdin')\nprint('went on')\n"
    result = subprocess.run([sys.executable, "-"], input=code, capture_output=True, text=True, check=False,
                            env={**os.environ, "PYTHONPATH": str(pathlib.Path(__file__).resolve().parents[2])})
    assert result.returncode == 0, result.stderr
    assert "<stdin>:2: UserWarning: shown from stdin" in result.stderr and "went on" in result.stdout
