"""Benchmark: kernel distance D_K²(P, Q) from GaussianSketch / GaussianSketchHD (paper 003), RFF and SORF.

For each dimension d ∈ {2, 8, 32}, set size n ∈ {10³, 10⁴, 10⁵} and width F (P and Q of n points
each, Q a slightly shifted copy of P's distribution, so that D_K² is small: the regime where
relative error matters), every feature map of the same width F estimates D_K² = ‖F(P) − F(Q)‖²
with ONE draw for both sets.  The exact value comes from the float64 chunked GEMM computation
:func:`rfgp.distances.exact_gaussian_kernel_distance` (signed weights, upper-triangular blocks:
(2n)²/2 kernel evaluations).  At n = 10⁵ that is 2·10¹⁰ evaluations (minutes per d), so it is
computed once per d, cached with its wall and CPU time in ``kernel_distance_exact.csv`` and
reused by every method and later run (``--recompute-exact`` redoes it).  The additive error
α = 10⁻³·D² that sets the Taylor order s comes from a pilot exact value at n = 10³ per d.

Reported per (d, n, method, F): median relative error |D̂² − D²|/D² over seeds and median
wall-clock and CPU seconds of the WHOLE sketch pipeline: building the map (centre/radius/order
from the data, random draws) + features of both sets + mean embeddings (chunks of 2048 rows).

Data: P uniform in [−1, 1]^d, Q uniform in [−1, 1]^d shifted by 0.1 in the first coordinate;
lengthscale ℓ = √d (so that ‖x‖₂/ℓ ≤ 1 for every d: the Taylor sketches need s > 2eR² with R
the ball radius in units of √2ℓ).  GaussianSketch(HD) are centred (bounding-box centre) with s
chosen by the exact-tail rule for α = 10⁻³·D²(n = 10³).  torch runs on one thread (on a shared machine
the per-op thread overhead otherwise dominates the many small sketch operations).

Usage::

    python benchmarks/kernel_distance.py               # full run (writes the results)
    python benchmarks/kernel_distance.py --quick       # smoke run (n = 1000, writes *_quick files)
    python benchmarks/kernel_distance.py --timing-row  # only d = 32, n = 10⁵ (the timing-critical row)
"""

from __future__ import annotations

import argparse
import csv
import math
import os
import statistics
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402
from rfgp.distances import exact_gaussian_kernel_distance, kernel_distance  # noqa: E402
from rfgp.features import GaussianSketch, GaussianSketchHD, RandomFourierFeatures  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
EXACT_CACHE = RESULTS / "kernel_distance_exact.csv"
METHODS = ("gaussian_sketch", "gaussian_sketch_hd", "rff", "sorf")
#: seeds per set size (fewer at large n: the tree sketches take minutes per draw there)
SEEDS = {1000: 3, 10000: 1, 100000: 1}
#: widths per set size (F = 1024 at n = 10⁵ would take ~20 CPU min for the d = 32 GaussianSketch tree alone)
WIDTHS = {1000: (256, 1024), 10000: (256,), 100000: (256,)}
PILOT_N = 1000
#: rows per feature evaluation (the d = 32 tree holds 32 leaf outputs of CHUNK × F at once)
CHUNK = 2048


def make_sets(n: int, d: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    q = torch.rand(n, d, generator=g, dtype=torch.float64) * 2 - 1
    q[:, 0] += 0.1
    return p, q


def make_map(method: str, width: int, pooled: torch.Tensor, alpha: float, seed: int):
    d = pooled.shape[-1]
    if method == "gaussian_sketch":
        return GaussianSketch.for_data(pooled, width, alpha=alpha, seed=seed).double()
    if method == "gaussian_sketch_hd":
        return GaussianSketchHD.for_data(pooled, width, alpha=alpha, seed=seed).double()
    sampler = "iid" if method == "rff" else "structured"
    return RandomFourierFeatures(width, input_dim=d, sampler=sampler, seed=seed).double()


def timed(fn):
    wall, cpu = time.perf_counter(), time.process_time()
    value = fn()
    return value, time.perf_counter() - wall, time.process_time() - cpu


def load_average() -> str:
    return "/".join(f"{v:.2f}" for v in os.getloadavg())


def _read_cache() -> dict:
    if not EXACT_CACHE.exists():
        return {}
    with open(EXACT_CACHE) as f:
        return {(int(r["d"]), int(r["n"])): r for r in csv.DictReader(f)}


def exact_reference(n: int, d: int, recompute: bool = False) -> dict:
    """D² of the benchmark's (P, Q) for (n, d), from the cache or computed (and cached) now."""
    cache = _read_cache()
    if (d, n) in cache and not recompute:
        row = cache[(d, n)]
        return {key: float(row[key]) for key in ("exact", "exact_wall_s", "exact_cpu_s")}
    p, q = make_sets(n, d)
    value, wall, cpu = timed(lambda: exact_gaussian_kernel_distance(p, q, math.sqrt(d), squared=True).item())
    cache = _read_cache()  # re-read: another run may have added entries meanwhile
    cache[(d, n)] = {"d": d, "n": n, "exact": repr(value), "exact_wall_s": f"{wall:.2f}", "exact_cpu_s": f"{cpu:.2f}",
                     "threads": torch.get_num_threads(), "load_average": load_average()}
    RESULTS.mkdir(exist_ok=True)
    write_csv(EXACT_CACHE, (cache[key] for key in sorted(cache)), list(cache[(d, n)]))
    print(f"exact d={d} n={n}: {value:.6e} in {wall:.1f} s wall / {cpu:.1f} s CPU", flush=True)
    return {"exact": value, "exact_wall_s": wall, "exact_cpu_s": cpu}


def run(dims, sizes, widths, seeds, recompute_exact):
    """Sketch estimates first, exact references last (cached ones are reused; see the module doc)."""
    measured = []
    for d in dims:
        lengthscale = math.sqrt(d)
        # α = 10⁻³·D² from a pilot exact value at n = 10³ (D² = population MMD + O(1/n) barely moves with n)
        alpha = 1e-3 * exact_reference(PILOT_N, d, recompute_exact)["exact"]
        for n in sizes:
            p, q = make_sets(n, d)
            p, q = p / lengthscale, q / lengthscale
            pooled = torch.cat((p, q))
            for method, width in [(m, w) for w in widths[n] for m in METHODS]:
                estimates, walls, cpus, order = [], [], [], ""
                for seed in range(seeds[n]):
                    def pipeline():
                        feature_map = make_map(method, width, pooled, alpha, seed)
                        return feature_map, kernel_distance(feature_map, p, q, squared=True, chunk_size=CHUNK).item()

                    (feature_map, estimate), wall, cpu = timed(pipeline)
                    order = getattr(feature_map, "order", "")
                    estimates.append(estimate)
                    walls.append(wall)
                    cpus.append(cpu)
                row = {"d": d, "n": n, "method": method, "width": width, "order": order, "seeds": seeds[n],
                       "estimates": estimates, "wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}
                measured.append(row)
                print({k: v for k, v in row.items() if k != "estimates"}, flush=True)
    rows = []
    for row in measured:
        reference = exact_reference(row["n"], row["d"], recompute_exact and row["n"] != PILOT_N)
        errors = [abs(e - reference["exact"]) / reference["exact"] for e in row.pop("estimates")]
        wall, cpu = row.pop("wall_s"), row.pop("cpu_s")
        rows.append(row | reference | {"median_rel_error": statistics.median(errors), "wall_s": wall, "cpu_s": cpu})
    return rows


def write(rows, args, start_load, end_load):
    suffix = "_quick" if args.quick else ("_timing_row" if args.timing_row else "")
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / f"kernel_distance{suffix}.csv", rows)
    lines = [
        "# Kernel distance D_K²(P, Q): GaussianSketch(HD) vs RFF vs SORF vs exact",
        "",
        f"Load average (1/5/15 min) at start {start_load}, at end {end_load}; shared 2-core CPU, torch on "
        f"{torch.get_num_threads()} thread. Equal width F for every map; seeds per n: {args.seeds}; widths per n: "
        f"{args.widths} (REDUCED: F = 1024 only at n = 10³ and 1 seed at n ≥ 10⁴, because the d = 32 GaussianSketch "
        "tree takes ~6 ms CPU per point at F = 1024 and the machine was shared by ~6 jobs). Sketch time = map construction (data radius, order, draws) + features "
        "of both sets + mean embeddings. Exact D² from `exact_gaussian_kernel_distance` (float64, chunked GEMM, "
        "(2n)²/2 kernel evaluations), computed once per (d, n) and cached in `kernel_distance_exact.csv` with "
        "its own time and load average (exact time below = that cached measurement).",
        "",
        "| d | n | D² (exact) | exact wall s | exact CPU s | method | F | s | seeds | median rel. error "
        "| wall s | CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['d']} | {r['n']} | {r['exact']:.4e} | {r['exact_wall_s']:.2f} | {r['exact_cpu_s']:.2f} | "
            f"{r['method']} | {r['width']} | {r['order']} | {r['seeds']} | {r['median_rel_error']:.2e} | "
            f"{r['wall_s']:.3f} | {r['cpu_s']:.3f} |"
        )
    (RESULTS / f"kernel_distance{suffix}.md").write_text("\n".join(lines) + "\n")

    plot(rows, RESULTS / f"kernel_distance{suffix}.png")


def plot(rows, path):
    """Median relative error vs CPU seconds (the shared machine makes wall time noisy), one panel per d."""
    dims = sorted({int(r["d"]) for r in rows})
    fig, axes = plt.subplots(1, len(dims), figsize=(4.8 * len(dims), 4.0), squeeze=False)
    markers = {1000: "o", 10000: "s", 100000: "^"}
    colors = dict(zip(METHODS, plt.rcParams["axes.prop_cycle"].by_key()["color"]))
    for ax, d in zip(axes[0], dims):
        for n in sorted({int(r["n"]) for r in rows}):
            sel = [r for r in rows if int(r["d"]) == d and int(r["n"]) == n]
            for method in METHODS:
                pts = sorted((float(r["cpu_s"]), float(r["median_rel_error"])) for r in sel if r["method"] == method)
                ax.loglog(*zip(*pts), marker=markers.get(n, "o"), color=colors[method], ls="-", lw=0.8,
                          label=method if n == min(int(r["n"]) for r in rows) else None)
            ax.axvline(float(sel[0]["exact_cpu_s"]), color="grey", ls=":", lw=1)
        ax.set(title=f"d = {d} (dotted: exact CPU time per n)",
               xlabel="CPU time [s] (marker: n = 1e3 o, 1e4 s, 1e5 ^)", ylabel="median relative error of D²")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main():
    torch.set_num_threads(1)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: n = 1000, d ∈ {2, 8}, 2 seeds")
    parser.add_argument("--timing-row", action="store_true", help="only d = 32, n = 10⁵ (timing-critical row)")
    parser.add_argument("--exact-only", action="store_true", help="only compute/cache the exact references")
    parser.add_argument("--recompute-exact", action="store_true", help="ignore the cached exact values")
    parser.add_argument("--replot", action="store_true", help="only redraw the PNG from the CSV")
    parser.add_argument("--exact-threads", type=int, default=1, help="torch threads for --exact-only")
    args = parser.parse_args()
    dims, sizes = [2, 8, 32], [1000, 10000, 100000]
    args.seeds, args.widths = dict(SEEDS), dict(WIDTHS)
    if args.quick:
        dims, sizes = [2, 8], [1000]
        args.seeds, args.widths = {1000: 2}, {1000: (256, 1024)}
    elif args.timing_row:
        dims, sizes = [32], [100000]
    if args.replot:
        with open(RESULTS / "kernel_distance.csv") as f:
            plot(list(csv.DictReader(f)), RESULTS / "kernel_distance.png")
        return
    if args.exact_only:
        torch.set_num_threads(args.exact_threads)
        for d in dims:
            for n in sizes:
                exact_reference(n, d, args.recompute_exact)
        return
    start_load = load_average()
    rows = run(dims, sizes, args.widths, args.seeds, args.recompute_exact)
    write(rows, args, start_load, load_average())


if __name__ == "__main__":
    main()
