"""Kernel-space path (N ≤ F): one marginal-likelihood-and-gradient evaluation against GPyTorch's exact GP.

At N = 1000 and F = 2048 the feature-space (capacitance) path costs O(N·F² + F³); the automatic
kernel-space path of :mod:`rfgp.kernel_space` costs O(N²·F + N³).  In the same run, interleaved
(one call of every row per repeat, so load changes hit all rows alike):

* ``rfgp auto``             — ScaleKernel(SketchedRBFKernel(F)) + GaussianLikelihood, kernel-space path;
* ``rfgp feature space``    — the same model with the capacitance path forced;
* ``gpytorch exact (default)`` — ScaleKernel(RBFKernel()), GPyTorch's default settings (N > 800:
  preconditioned CG + Lanczos);
* ``gpytorch exact (Cholesky)`` — the same under ``gpytorch.settings.max_cholesky_size(N)``.

Times are medians (and minima) of wall-clock seconds over repeats, for 1 and 2 intra-op threads,
float64 and float32; ratios are against the exact GP in the same run.  The table records
``os.getloadavg()`` before and after, since the host is shared.

    python benchmarks/kernel_space_path.py            # N = 1000, F = 2048, 7 repeats
    python benchmarks/kernel_space_path.py --quick    # N = 300, F = 512, 2 repeats (smoke run)
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

from rfgp import operators
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
DIM = 4


def _problem(num_data: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(num_data, DIM, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1) + 0.1 * torch.randn(num_data, generator=g, dtype=torch.float64)
    return x.to(dtype), y.to(dtype)


def _step(kernel, x, y, dtype, context=None):
    """A closure running one −MLL forward + backward on a fresh model with the kernel."""
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), gpytorch.kernels.ScaleKernel(kernel))
    model = model.to(dtype).train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

    def run():
        model.zero_grad()
        with context() if context is not None else _nothing():
            (-mll(model(x), y)).backward()

    return run


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class _feature_space:
    """Force the capacitance path (the pre-kernel-space behaviour at N > F)."""

    def __enter__(self):
        self.saved = operators.FeatureRootAddedDiagLinearOperator.uses_kernel_space
        operators.FeatureRootAddedDiagLinearOperator.uses_kernel_space = lambda self, statistics_batch=None: False

    def __exit__(self, *exc):
        operators.FeatureRootAddedDiagLinearOperator.uses_kernel_space = self.saved
        return False


def measure(num_data: int, num_features: int, dtype: torch.dtype, threads: int, repeats: int) -> list[dict]:
    torch.set_num_threads(threads)
    x, y = _problem(num_data, dtype)
    rows = {
        "rfgp auto (kernel space)": _step(SketchedRBFKernel(num_features, seed=0), x, y, dtype),
        "rfgp feature space (forced)": _step(SketchedRBFKernel(num_features, seed=0), x, y, dtype, _feature_space),
        "gpytorch exact (default)": _step(gpytorch.kernels.RBFKernel(), x, y, dtype),
        "gpytorch exact (Cholesky)": _step(gpytorch.kernels.RBFKernel(), x, y, dtype,
                                           lambda: gpytorch.settings.max_cholesky_size(num_data)),
    }
    times = {name: [] for name in rows}
    for run in rows.values():
        run()  # warm-up
    for _ in range(repeats):
        for name, run in rows.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    medians = {name: statistics.median(t) for name, t in times.items()}
    out = []
    for name, t in times.items():
        out.append({
            "dtype": str(dtype).removeprefix("torch."), "threads": threads, "N": num_data, "F": num_features,
            "model": name, "median_s": medians[name], "min_s": min(t),
            "ratio_vs_exact_default": medians[name] / medians["gpytorch exact (default)"],
            "ratio_vs_exact_cholesky": medians[name] / medians["gpytorch exact (Cholesky)"],
        })
    return out


def _gflops(n: int, f: int) -> float:
    """Flops of one kernel-space MLL + gradient: N²F (symmetric Gram) + 2N²F (SΦ) + N³/3 + 2N³/3, in GFlop."""
    return (n * n * f + 2 * n * n * f + n**3) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    num_data, num_features, repeats = (300, 512, 2) if args.quick else (1000, 2048, 7)
    load_before = os.getloadavg()
    rows = []
    for dtype in (torch.float64, torch.float32):
        for threads in (1, 2):
            rows += measure(num_data, num_features, dtype, threads, repeats)
    load_after = os.getloadavg()
    suffix = "_quick" if args.quick else ""
    RESULTS.mkdir(parents=True, exist_ok=True)
    with open(RESULTS / f"kernel_space_path{suffix}.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"# Kernel-space path: one MLL + gradient at N = {num_data}, F = {num_features} (d = {DIM})",
        "",
        (f"Medians over {repeats} interleaved repeats, wall-clock seconds.  Load average (1, 5, 15 min) "
        f"before: {', '.join(f'{v:.2f}' for v in load_before)}; after: {', '.join(f'{v:.2f}' for v in load_after)} "
        f"on {os.cpu_count()} logical CPUs."),
        "",
        (f"Cost model of one rfgp iteration (kernel space): N²·F for the symmetric Gram ΦΦᵀ (computed from "
         f"its upper blocks), 2·N²·F for ∂Φ = 2sSΦ, N³/3 (Cholesky) + 2N³/3 (K⁻¹ from the factor) — "
         f"{_gflops(num_data, num_features):.1f} GFlop here, all in BLAS/LAPACK (the profile puts ≥ 90 % of the time "
         "there); the exact GP needs O(N³) only, so the ratio to it is bounded below by the N²·F terms "
         "(every ∂/∂Φ of a log-determinant needs one N × N by N × F product)."),
        "",
        "| dtype | threads | model | median [s] | min [s] | × exact (default) | × exact (Cholesky) |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(f"| {r['dtype']} | {r['threads']} | {r['model']} | {r['median_s']:.3f} | {r['min_s']:.3f} | "
                     f"{r['ratio_vs_exact_default']:.2f} | {r['ratio_vs_exact_cholesky']:.2f} |")
    text = "\n".join(lines) + "\n"
    (RESULTS / f"kernel_space_path{suffix}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
