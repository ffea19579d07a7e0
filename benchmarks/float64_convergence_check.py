"""Cost of ``rfgp.fit_mll``'s float64 check of a float32 fit's stopping point (stall or convergence).

A float32 fit that stops is evaluated once more on a float64 copy of the model (loss and gradient), so that a float32
loss that is rounding noise is not reported as converged (``rfgp.training._check_in_float64``).  This script fits
float32 models as a user would (RFF and Nyström, N = 10³ and 10⁴, one thread), times the whole fit and the check
inside it, and writes ``results/float64_convergence_check.md`` with the machine's load.  The check's share is what a
user pays for it; the alternative, no check, is the fit time minus the check.

    python benchmarks/float64_convergence_check.py
"""

from __future__ import annotations

import os
import pathlib
import time
import warnings

import gpytorch
import torch

import rfgp
import rfgp.training as training
from rfgp.models import ExactGPModel

RESULTS = pathlib.Path(__file__).parent / "results" / "float64_convergence_check.md"
CASES = [(1000, 256, "rff"), (10000, 512, "rff"), (10000, 512, "nystrom"), (1000, 2048, "rff")]


def model(n: int, width: int, method: str) -> ExactGPModel:
    generator = torch.Generator().manual_seed(0)
    x = torch.rand(n, 4, generator=generator) * 2 - 1
    y = torch.sin(3 * x).sum(-1) + 0.1 * torch.randn(n, generator=generator)
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=4))
    if method == "rff":
        kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedRBFKernel(width, ard_num_dims=4, seed=0))
    else:
        kernel = rfgp.sketch(exact, width, method="nystrom", x_sample=x, seed=0)
    return ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).float()


def main() -> None:
    torch.set_num_threads(1)
    check = training._check_in_float64
    seconds: list[float] = []

    def timed(*args, **kwargs):
        start = time.process_time()
        result = check(*args, **kwargs)
        seconds.append(time.process_time() - start)
        return result

    training._check_in_float64 = timed
    load_before = os.getloadavg()
    rows = []
    try:
        for n, width, method in CASES:
            seconds.clear()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                start = time.process_time()
                history = rfgp.fit_mll(model(n, width, method), 100, progress=False)
                total = time.process_time() - start
            spent = sum(seconds)
            rows.append(f"| {n} | {width} | {method} | {history.stop_reason.split(':')[0]} | {history.num_iterations} "
                        f"| {total:.2f} | {spent:.3f} | {100 * spent / total:.1f} % |")
    finally:
        training._check_in_float64 = check
    load_after = os.getloadavg()
    RESULTS.write_text(
        "# Cost of fit_mll's float64 check of a float32 stopping point\n\n"
        f"CPU seconds, one thread.  Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}"
        f"; after: {', '.join(f'{v:.2f}' for v in load_after)} on {os.cpu_count()} logical CPUs.\n\n"
        "| N | F | map | stop | iterations | fit [s] | check [s] | check share |\n|---|---|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
    )
    print(RESULTS.read_text())


if __name__ == "__main__":
    main()
