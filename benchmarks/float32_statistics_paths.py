"""The adaptive statistics precision on the paths that formed their own statistics: paired CPU times.

Dirichlet classification (per-label Grams, rfgp.inference.classification), Nyström roots, complex-feature GPs and
the multi-output posterior caches (rfgp.inference.multioutput) now decide the precision of float32 statistics by
u·tr(ΦᵀD⁻¹Φ) ≤ ``rfgp.settings.float32_statistics_tolerance`` (rfgp.inference.statistics_precision). Each row
alternates, in one process on one thread, the default (``adaptive``) with the tolerance ∞ (``float32``: no decision,
the path before), then with 0 (``float64``): two paired runs, A B B A, after one untimed evaluation each; medians of
the repeats, CPU time.

* Dirichlet: a float32 3-class ``ExactGPModel`` with ``DirichletClassificationLikelihood`` and
  ``ScaleKernel(SketchedRBFKernel(F))`` on 2-D inputs, one MLL + gradient; benign at outputscale 10 (u·max_c tr ≈
  10⁻³), high signal-to-noise at outputscale 10⁵ (u·max_c tr ≈ 25–50: float32 statistics make I + ΦᵀD_c⁻¹Φ
  indefinite, "—"); materialised Φ and chunked (``rfgp.settings.chunk_size(1000)``).
* Nyström (512 landmarks, materialised and chunked) and complex polynomial features (F = 512): a benign float32
  ``ExactGPModel`` (noise 0.1), one MLL + gradient.
* Multi-output posterior: a float32 curl-free ``MultiOutputGPModel`` (p = 3) at noise 0.1 (benign), the posterior
  mean and variance at 200 points from a fresh cache.

    python benchmarks/float32_statistics_paths.py   # writes results/float32_statistics_paths.md
"""

from __future__ import annotations

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
from rfgp.kernels import (  # noqa: E402
    NystromKernel,
    SketchedCurlFreeKernel,
    SketchedPolynomialKernel,
    SketchedRBFKernel,
)
from rfgp.likelihoods import DirichletClassificationLikelihood  # noqa: E402
from rfgp.models import ExactGPModel, MultiOutputGPModel  # noqa: E402

REPEATS = 6  # even: each mode first as often as second
MODES = {"adaptive": 0.1, "float32": math.inf, "float64": 0.0}


def dirichlet_model(num_points: int, num_features: int, outputscale: float):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 2, generator=gen)
    labels = (x[:, 0] > 0.5).long() + (x[:, 1] > 0.5).long()
    likelihood = DirichletClassificationLikelihood(labels, num_classes=3, dtype=torch.float32)
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([3]))
    model = ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean).train()
    kernel.base_kernel.lengthscale, kernel.outputscale = 0.3, outputscale
    return model


def dirichlet_step(model) -> None:
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    loss = -mll(model(*model.train_inputs), model.train_targets).sum()
    loss.backward()


def regression_model(kind: str, num_points: int, num_features: int):
    """A benign float32 ExactGP (noise 0.1, u·tr ≈ 10⁻³): Nyström features at ``num_features`` landmarks, or complex
    polynomial features of degree 2 (``complex_posterior=True``)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen)
    if kind == "nystrom":
        base = NystromKernel(gpytorch.kernels.RBFKernel(), x[:num_features].clone())
    else:
        base = SketchedPolynomialKernel(2, num_features, weights="complex", complex_posterior=True, seed=0)
    kernel = gpytorch.kernels.ScaleKernel(base)
    model = ExactGPModel(x, torch.sin(4 * x[:, 0]), gpytorch.likelihoods.GaussianLikelihood(), kernel).train()
    model.likelihood.noise = 0.1
    return model


def regression_step(model) -> None:
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    mll(model(*model.train_inputs), model.train_targets).backward()


def multioutput_model(num_points: int, num_features: int):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen)
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1]), x[:, 2]], -1)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3, rank=0, has_task_noise=False)
    kernel = gpytorch.kernels.ScaleKernel(SketchedCurlFreeKernel(num_features, input_dim=3, seed=0))
    model = MultiOutputGPModel(x, y, likelihood, kernel)
    kernel.base_kernel.lengthscale, likelihood.noise = 0.5, 0.1
    return model.eval(), x[:200] * 1.01


def posterior_step(model_and_points) -> None:
    model, points = model_and_points
    model.prediction_strategy = None  # a fresh cache: the statistics are formed again
    with torch.no_grad():
        posterior = model(points)
        posterior.mean, posterior.variance


def paired(step, state, modes, chunk=None) -> dict[str, float]:
    """Median CPU time of ``step(state)`` for two modes, in A B B A order (a mode that follows a float64 one pays for
    reallocating the buffers it freed: 8 % measured, so each mode follows the other equally often)."""
    times = {mode: [] for mode in modes}
    for repeat in range(REPEATS + 1):
        for mode in (modes if repeat % 2 else modes[::-1]):
            with rfgp.settings.float32_statistics_tolerance(MODES[mode]), rfgp.settings.chunk_size(chunk):
                start = time.process_time()
                step(state)
                elapsed = time.process_time() - start
            if repeat:
                times[mode].append(elapsed)
    return {mode: statistics.median(values) for mode, values in times.items()}


def timings(step, state, benign: bool, chunk=None) -> tuple[float, float | None, float, float]:
    """(adaptive against float32, float32, adaptive against float64, float64): two paired runs; float32 only for a
    benign model (float32 statistics make the high-SNR capacitances indefinite, CapacitanceNotPSDError)."""
    versus32 = {"adaptive": math.nan, "float32": None}
    if benign:
        versus32 = paired(step, state, ("adaptive", "float32"), chunk)
    versus64 = paired(step, state, ("adaptive", "float64"), chunk)
    return versus32["adaptive"], versus32["float32"], versus64["adaptive"], versus64["float64"]


def row(path: str, size, num_features: int, case: str, times) -> str:
    adaptive32, float32, adaptive64, float64 = times
    first = f"{adaptive32:.3f} | {float32:.3f} | {adaptive32 / float32:.2f}" if float32 else "— | — | —"
    return (f"| {path} | {size} | {num_features} | {case} | {first} | {adaptive64:.3f} | {float64:.3f} | "
            f"{adaptive64 / float64:.2f} |")


def main() -> None:
    torch.set_num_threads(1)
    lines = ["| path | N | F | case | adaptive (s) | float32 (s) | adaptive / float32 | adaptive (s) | float64 (s) | "
             "adaptive / float64 |", "|---|---|---|---|---|---|---|---|---|---|"]
    for num_points, num_features in ((5000, 512), (10000, 1024)):
        for chunk in (None, 1000):
            for case, outputscale in (("benign", 10.0), ("high SNR", 1e5)):
                model = dirichlet_model(num_points, num_features, outputscale)
                path = "Dirichlet MLL + grad" + (" (chunked)" if chunk else "")
                lines.append(row(path, num_points, num_features, case,
                                 timings(dirichlet_step, model, case == "benign", chunk)))
                print(lines[-1], flush=True)
    for kind, chunk in (("nystrom", None), ("nystrom", 1000), ("complex", None)):
        path = {"nystrom": "Nyström MLL + grad", "complex": "complex-feature MLL + grad"}[kind]
        lines.append(row(path + (" (chunked)" if chunk else ""), 5000, 512, "benign",
                         timings(regression_step, regression_model(kind, 5000, 512), True, chunk)))
        print(lines[-1], flush=True)
    for num_points, num_features in ((2000, 512), (5000, 1024)):
        state = multioutput_model(num_points, num_features)
        lines.append(row("multi-output posterior caches", f"{num_points}×3", num_features, "benign",
                         timings(posterior_step, state, True)))
        print(lines[-1], flush=True)
    load = ", ".join(f"{value:.2f}" for value in os.getloadavg())
    text = ("# Adaptive statistics precision on the Dirichlet, Nyström, complex-feature and multi-output paths\n\n"
            f"Generated by `benchmarks/float32_statistics_paths.py` (one thread, CPU time, medians of {REPEATS} "
            f"repeats per pair, A B B A; load average at the end: {load}; torch {torch.__version__}).\n\n"
            + "\n".join(lines) + "\n")
    out = Path(__file__).resolve().parent / "results" / "float32_statistics_paths.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
