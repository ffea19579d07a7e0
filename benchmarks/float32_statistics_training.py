"""float32 ExactGP MLL + gradient with adaptive-precision feature statistics, paired against fixed precisions.

The feature-space MLL forms ΦᵀD⁻¹Φ of float32 features in float32 while u·tr(ΦᵀD⁻¹Φ) ≤
``rfgp.settings.float32_statistics_tolerance`` (default 10⁻¹; 10⁻² when the results were measured), in
float64 otherwise (rfgp.inference.statistics_precision); the
decision costs one O(N·F) pass over Φ and one host read per evaluation.  Rows: a float32 ``ExactGPModel`` with
``ScaleKernel(SketchedRBFKernel(1024))``, d = 3, lengthscale 0.5, outputscale 1, one MLL + gradient (lengthscale,
outputscale, noise), one thread, CPU time, modes alternating, medians of the repeats after one untimed evaluation
each:

* benign (noise 0.3, u·tr = 2·10⁻⁷·N ≤ 4·10⁻³): ``adaptive`` against ``float32`` (tolerance ∞, the path before: no
  decision at all) — the price of the decision;
* high signal-to-noise (noise 10⁻⁴): ``adaptive`` (float64 statistics) against ``float32`` and ``float64``
  (tolerance 0) — the price of float64 statistics, and of the decision on top of them.

Also: the decision's O(N·F) pass alone (``weighted_square_norm`` + the comparison).

    python benchmarks/float32_statistics_training.py   # writes results/float32_statistics_training.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
from rfgp.inference.linalg import CapacitanceNotPSDError  # noqa: E402
from rfgp.inference.statistics_precision import (  # noqa: E402
    recorded_statistics_dtypes,
    statistics_dtype,
    weighted_square_norm,
)
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.models import ExactGPModel  # noqa: E402

MODES = {"float32": math.inf, "adaptive": rfgp.settings.float32_statistics_tolerance.DEFAULT, "float64": 0.0}


def make_model(num_points, noise):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen)
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(1024, seed=0))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, model.likelihood.noise = 0.5, 1.0, noise
    return model


def step_time(model, tolerance):
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    start = time.process_time()
    with rfgp.settings.float32_statistics_tolerance(tolerance), recorded_statistics_dtypes() as dtypes:
        loss = -mll(model(*model.train_inputs), model.train_targets)
        loss.backward()
    return time.process_time() - start, dtypes


def decision_time(num_points, repeats):
    features = torch.rand(num_points, 1024)
    weights = torch.full((1,), 10.0)
    times = []
    for _ in range(repeats):
        start = time.process_time()
        statistics_dtype(features.dtype, features.device, lambda: weighted_square_norm(features, weights))
        times.append(time.process_time() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for noise, modes in ((0.3, ("float32", "adaptive")), (1e-4, ("float32", "adaptive", "float64"))):
        for num_points in (5000, 10000, 20000):
            model = make_model(num_points, noise)
            times, chosen, failed = {name: [] for name in modes}, None, set()
            for repeat in range(args.repeats + 1):
                for name in modes:
                    if name in failed:
                        continue
                    try:
                        elapsed, dtypes = step_time(model, MODES[name])
                    except CapacitanceNotPSDError:  # float32 statistics made I + ΦᵀD⁻¹Φ indefinite
                        failed.add(name)
                        continue
                    if name == "adaptive":
                        chosen = dtypes
                    if repeat:
                        times[name].append(elapsed)
            median = {name: statistics.median(values) for name, values in times.items() if name not in failed}

            def cell(name):
                return f"{median[name]:.3f}" if name in median else ("NotPSD" if name in failed else "—")

            def ratio(top, bottom):
                return f"{median[top] / median[bottom]:.3f}" if top in median and bottom in median else "—"

            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            estimate = num_points / noise * 2.0**-24  # u·tr(G): ‖φ(x)‖² = outputscale = 1 for sin/cos features
            rows.append(f"| {noise:g} | {num_points} | {estimate:.2g} | {str(chosen[0]).split('.')[-1]} | "
                        f"{cell('float32')} | {cell('adaptive')} | {cell('float64')} | "
                        f"{ratio('adaptive', 'float32')} | {ratio('float64', 'adaptive')} | {load} |")
            print(rows[-1], flush=True)
    decisions = [f"| {n} | {1e3 * decision_time(n, 21):.2f} |" for n in (5000, 10000, 20000)]
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    text = "\n".join([
        "# float32 ExactGP MLL + gradient: adaptive-precision feature statistics, paired", "",
        "float32 ExactGPModel, ScaleKernel(SketchedRBFKernel(1024)), d = 3, lengthscale 0.5, outputscale 1; one MLL "
        f"+ backward per evaluation, one thread, CPU time (process_time), medians of {args.repeats} alternating "
        "repeats; host shared with other "
        "jobs (2 cores). float32: tolerance ∞ (float32 statistics, no decision: the path before); adaptive: the "
        "default 10⁻²; float64: tolerance 0 (float64 statistics, no decision). ε̂ = u·tr(ΦᵀD⁻¹Φ). NotPSD: float32 "
        "statistics made I + ΦᵀD⁻¹Φ indefinite (CapacitanceNotPSDError).", "",
        "| noise | N | ε̂ | adaptive chose | float32 s | adaptive s | float64 s | adaptive / float32 "
        "| float64 / adaptive | load average |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        f"The decision alone (weighted_square_norm of an N × 1024 float32 Φ and the comparison), median of 21, load "
        f"{load}:", "",
        "| N | ms |", "|---|---|", *decisions, ""])
    out = Path(__file__).resolve().parent / "results" / "float32_statistics_training.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
