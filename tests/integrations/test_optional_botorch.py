"""BoTorch is optional: rfgp imports and samples without it, importing rfgp does not import it, and the
pathwise registration happens whichever of the two is imported first."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_rfgp_imports_and_samples_without_botorch():
    out = run(
        "import sys; sys.modules['botorch'] = None\n"
        "import torch, gpytorch, rfgp\n"
        "x = torch.rand(20, 2, dtype=torch.float64); y = x.sum(-1)\n"
        "kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(16, ard_num_dims=2, seed=0))\n"
        "gp = rfgp.models.ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double().eval()\n"
        "print(tuple(rfgp.models.sampling.posterior_paths(gp, 3)(x).shape))\n"
    )
    assert out.strip() == "(3, 20)"


def test_botorch_imported_after_rfgp_gets_the_registration():
    pytest.importorskip("botorch")
    out = run(
        "import sys, rfgp\n"
        "print('botorch' in sys.modules)\n"
        "import botorch\n"
        "from botorch.sampling.pathwise.features.generators import GenKernelFeatures\n"
        "print((rfgp.kernels.FeatureKernel,) in GenKernelFeatures.funcs)\n"
    )
    assert out.split() == ["False", "True"]  # rfgp alone does not import BoTorch (it flips GPyTorch settings)


def test_registration_in_this_process():
    pytest.importorskip("botorch")
    from botorch.sampling.pathwise.features.generators import GenKernelFeatures

    import rfgp

    assert (rfgp.kernels.FeatureKernel,) in GenKernelFeatures.funcs
