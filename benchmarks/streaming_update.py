"""Streaming: rank-k Cholesky update vs refactorisation of A = I + ΦᵀWΦ after a batch of k points.

Two levels, both in the same run:

* factor    — ``rfgp.cholesky_update.cholesky_update(L, V)`` (O(k·F²)) against
  ``torch.linalg.cholesky(I + G + VVᵀ)`` (O(F³)), the work a batch leaves for the next prediction;
* streaming — ``StreamingFeatureGP.update(x_k, y_k)`` followed by ``cholesky()`` with the rank-k
  path forced on (``rank_update="always"``) against forced off (``rank_update="never"``);
  both include featurising the batch and accumulating the statistics.

Times are medians over repeats (wall and process CPU time, ms).  The crossover where the update
stops paying sets ``rfgp.streaming.takes_rank_update`` (``rank_update="auto"``).

    python benchmarks/streaming_update.py              # F ∈ {512, 1024, 2048}, k ∈ {1 … 512}, float32/64
    python benchmarks/streaming_update.py --critical   # only F = 1024, k ∈ {1, 16, 128} (quiet-machine re-run)
    python benchmarks/streaming_update.py --quick      # smoke run
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import gpytorch
import torch

import sys
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

from rfgp.cholesky_update import cholesky_update
from rfgp.kernels import SketchedRBFKernel
from rfgp.kernels.combinations import kernel_features
from rfgp.streaming import StreamingFeatureGP

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
DIM, WARM_POINTS = 8, 4096


def _timed(function, repeats: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of ``function()`` (one untimed warm-up call)."""
    function()
    walls, cpus = [], []
    for _ in range(repeats):
        wall, cpu = time.perf_counter(), time.process_time()
        function()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return 1e3 * statistics.median(walls), 1e3 * statistics.median(cpus)


def _streaming_model(num_features: int, dtype: torch.dtype, mode: str) -> StreamingFeatureGP:
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, ard_num_dims=DIM, seed=0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.01
    return StreamingFeatureGP(kernel, likelihood, rank_update=mode).to(dtype)


def measure(num_features: int, rank: int, dtype: torch.dtype, repeats: int) -> dict:
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(WARM_POINTS + rank, DIM, generator=gen, dtype=dtype) * 4
    y = torch.sin(x).sum(-1) + 0.1 * torch.randn(len(x), generator=gen, dtype=dtype)
    # Factor level: L = chol(I + G) of real random-feature statistics, V = the batch's weighted features.
    model = _streaming_model(num_features, dtype, "never").update(x[:WARM_POINTS], y[:WARM_POINTS])
    chol = model.cholesky()
    with torch.no_grad():
        vectors = (kernel_features(model.covar_module, x[WARM_POINTS:]) / model.likelihood.noise.sqrt()).mT
    updated_matrix = torch.eye(num_features, dtype=dtype) + model.gram + vectors @ vectors.mT
    update_wall, update_cpu = _timed(lambda: cholesky_update(chol, vectors), repeats)
    refactor_wall, refactor_cpu = _timed(lambda: torch.linalg.cholesky(updated_matrix), repeats)
    exact = torch.linalg.cholesky(updated_matrix.double())
    error = ((cholesky_update(chol, vectors).double() - exact).norm() / exact.norm()).item()

    # Streaming level: update + factor, rank-k path forced on vs off (state reset by a fresh copy).
    def stream(mode: str):
        fresh = _streaming_model(num_features, dtype, mode).update(x[:WARM_POINTS], y[:WARM_POINTS])
        fresh.cholesky()
        return lambda: fresh.update(x[WARM_POINTS:], y[WARM_POINTS:]).cholesky()

    stream_update_wall, _ = _timed(stream("always"), repeats)
    stream_refactor_wall, _ = _timed(stream("never"), repeats)
    return {
        "F": num_features, "k": rank, "dtype": str(dtype).removeprefix("torch."),
        "threads": torch.get_num_threads(),
        "update_ms": update_wall, "update_cpu_ms": update_cpu,
        "refactor_ms": refactor_wall, "refactor_cpu_ms": refactor_cpu,
        "speedup": refactor_wall / update_wall, "cpu_speedup": refactor_cpu / update_cpu, "relative_error": error,
        "stream_update_ms": stream_update_wall, "stream_refactor_ms": stream_refactor_wall,
    }


COLUMNS = [
    ("F", "F", "{}"), ("k", "k", "{}"), ("dtype", "dtype", "{}"), ("threads", "threads", "{}"),
    ("update_ms", "rank-k update (ms)", "{:.2f}"), ("update_cpu_ms", "update CPU (ms)", "{:.2f}"),
    ("refactor_ms", "refactorise (ms)", "{:.2f}"), ("refactor_cpu_ms", "refactorise CPU (ms)", "{:.2f}"),
    ("speedup", "speed-up (wall)", "{:.2f}"), ("cpu_speedup", "speed-up (CPU)", "{:.2f}"),
    ("relative_error", "rel. error vs float64 chol", "{:.1e}"),
    ("stream_update_ms", "StreamingFeatureGP update+factor, rank-k (ms)", "{:.2f}"),
    ("stream_refactor_ms", "… refactorised (ms)", "{:.2f}"),
]


def write_results(rows: list[dict], name: str, note: str, load: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_csv(RESULTS / f"{name}.csv", rows)
    lines = [
        f"# Streaming: rank-k Cholesky update vs refactorisation ({note})",
        "",
        f"Machine: {os.cpu_count()} CPU cores, torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"load average up to {load:.1f} while measuring (other jobs shared the cores when it is above the core "
        "count: compare within a row). Median of repeats; 'refactorise' is `torch.linalg.cholesky(I + G + VVᵀ)`, "
        "the streaming columns include featurising the batch and accumulating the statistics. With one thread, "
        "CPU time is the least disturbed measure on a shared machine; the plot shows it.",
        "",
        "| " + " | ".join(title for _, title, _ in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(fmt.format(row[key]) for key, _, fmt in COLUMNS) + " |" for row in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")
    plot(rows, RESULTS / f"{name}.png")


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = sorted({(row["F"], row["dtype"]) for row in rows})
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    for index, (num_features, dtype) in enumerate(groups):
        selected = [row for row in rows if (row["F"], row["dtype"]) == (num_features, dtype)]
        ks = [row["k"] for row in selected]
        color = f"C{index}"
        ax.loglog(ks, [row["update_cpu_ms"] for row in selected], "o-", color=color,
                  label=f"update, F={num_features} {dtype}")
        ax.loglog(ks, [row["refactor_cpu_ms"] for row in selected], "--", color=color,
                  label=f"refactorise, F={num_features} {dtype}")
    ax.set_xlabel("batch size k")
    ax.set_ylabel("CPU time (ms, median)")
    ax.set_title("rank-k Cholesky update vs refactorisation")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="smoke run: F = 256, k ∈ {1, 16}")
    mode.add_argument("--critical", action="store_true", help="only the reported row: F = 1024, k ∈ {1, 16, 128}")
    parser.add_argument("--repeats", type=int, default=None, help="timed repeats per configuration")
    parser.add_argument("--threads", type=int, default=None, help="torch intra-op threads (default: torch's)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        grid, dtypes, repeats, name, note = [(256, k) for k in (1, 16)], [torch.float64], 2, "streaming_update_quick", "quick smoke run"
    elif args.critical:
        grid, dtypes, repeats, name, note = [(1024, k) for k in (1, 16, 128)], [torch.float32, torch.float64], 7, \
            "streaming_update_critical", "F = 1024 only"
    else:
        ks = (1, 4, 16, 32, 64, 128, 256, 512)
        grid = [(f, k) for f in (512, 1024, 2048) for k in ks if k < f]
        dtypes, repeats, name, note = [torch.float32, torch.float64], 5, "streaming_update", "full grid"
    repeats = args.repeats or repeats
    load = os.getloadavg()[0]
    rows = []
    for dtype in dtypes:
        for num_features, rank in grid:
            rows.append(measure(num_features, rank, dtype, repeats))
            load = max(load, os.getloadavg()[0])
            row = rows[-1]
            print(f"F={num_features} k={rank} {row['dtype']}: update {row['update_ms']:.2f} ms, "
                  f"refactorise {row['refactor_ms']:.2f} ms, speed-up {row['speedup']:.2f}", flush=True)
    write_results(rows, name, note, load)


if __name__ == "__main__":
    main()
