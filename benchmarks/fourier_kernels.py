"""Benchmark: rfgp's Fourier-feature kernels against GPyTorch's exact RBF and ``RFFKernel``.

Measures, in one run and on the same data:

1. Training: one ``ExactMarginalLogLikelihood`` forward + backward of an ``ExactGP`` with
   ``ScaleKernel(kernel)`` and a ``GaussianLikelihood``, for GPyTorch ``RBFKernel`` (exact),
   GPyTorch ``RFFKernel(num_samples=F/2)`` and rfgp ``SketchedRBFKernel(F, method=rff|orf|sorf)``,
   N ∈ {1e3, 1e4, 1e5}, F = 1024, d = 8, float64 and float32.
2. Prediction: posterior mean and variance at 1000 test points, with the prediction cache
   built inside the timed region (first call after ``eval()``) and with it already built.
3. The floating-point floor of one feature-space MLL-and-gradient step, 4·N·F² flops,
   timed as plain matmuls Φᵀ@Φ + Φ@S (Φ: N × F, S: F × F) in the same run.
4. Kernel approximation error ‖K̂ − K‖_F/‖K‖_F of RFF/ORF/SORF (and GPyTorch ``RFFKernel``)
   vs F on scikit-learn's digits, σ = mean distance to the 50th nearest neighbour over
   1000 points (Yu et al. 2016, paper 002, Sec. 5), several seeds.

Methods are timed round-robin (one repetition of every method, then the next), so a
background load affects all of them alike; each number is the median of the repetitions
after warm-up.  Writes ``fourier_kernels.md``, ``fourier_kernels_{timing,error}.csv`` and
``fourier_kernels_{timing,error}.png`` into ``benchmarks/results/``.

Usage::

    python benchmarks/fourier_kernels.py            # full run (tens of minutes on 2 CPU cores)
    python benchmarks/fourier_kernels.py --quick    # smoke run (a minute)
    python benchmarks/fourier_kernels.py --profile 20000   # torch.profiler breakdown of one training step
    python benchmarks/fourier_kernels.py --timing-only --sizes 100000   # re-time one size, keep the error table
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import math
import os
import platform
import statistics
import sys
import time
import warnings
from pathlib import Path

import gpytorch
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.kernels.combinations import kernel_features  # noqa: E402
from rfgp.models import ExactGPModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
METHODS = ("exact", "gpytorch-rff", "rfgp-rff", "rfgp-orf", "rfgp-sorf", "rfgp-rff-chunked")
RFGP_METHODS = ("rfgp-rff", "rfgp-orf", "rfgp-sorf")
#: memory budget of the rfgp-* rows: large enough that Φ is materialised, as GPyTorch's
#: RFFKernel does; "rfgp-rff-chunked" keeps rfgp's default budget (1 GiB), which chunks
#: the feature statistics from N ≈ 33 000 (float64, F = 1024) on and recomputes Φ in the backward pass.
MATERIALISED_BUDGET = 16 * 2**30
TIMING_ONLY_NOTE = (" Timing re-run (`--timing-only`): the approximation-error table below is the one of the last full "
                    "run, read from `fourier_kernels_error.csv`.")


# ----------------------------------------------------------------------------- timing
def make_kernel(method: str, num_features: int, dim: int, seed: int):
    if method == "exact":
        return gpytorch.kernels.RBFKernel()
    if method == "gpytorch-rff":
        torch.manual_seed(seed)  # RFFKernel draws from the global generator
        return gpytorch.kernels.RFFKernel(num_samples=num_features // 2, num_dims=dim)
    method = method.removeprefix("rfgp-").removesuffix("-chunked")
    return SketchedRBFKernel(num_features, method=method, input_dim=dim, seed=seed)


def memory_setting(method: str):
    """The rfgp memory budget a method is timed under (see :data:`MATERIALISED_BUDGET`)."""
    if method.startswith("rfgp-") and not method.endswith("-chunked"):
        return rfgp.settings.memory_budget(MATERIALISED_BUDGET)
    return contextlib.nullcontext()


def make_data(num_train: int, num_test: int, dim: int, dtype: torch.dtype, seed: int = 0):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(num_train + num_test, dim, generator=generator, dtype=torch.float64) * 4 - 2
    y = torch.sin(x[:, : dim // 2].sum(-1)) * torch.cos(x[:, dim // 2 :].sum(-1))
    y = y + 0.1 * torch.randn(num_train + num_test, generator=generator, dtype=torch.float64)
    x, y = x.to(dtype), y.to(dtype)
    return x[:num_train], y[:num_train], x[num_train:]


def make_model(method, x, y, num_features, seed):
    kernel = gpytorch.kernels.ScaleKernel(make_kernel(method, num_features, x.shape[-1], seed))
    kernel.base_kernel.lengthscale = 1.0
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    likelihood.noise = 0.01
    model = ExactGPModel(x, y, likelihood, kernel).to(x.dtype)
    return model, gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)


def time_call(fn) -> tuple[float, float]:
    """(wall-clock seconds, process CPU seconds summed over threads) of one call."""
    start_wall, start_cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start_wall, time.process_time() - start_cpu


def training_step(model, mll, method=""):
    with memory_setting(method):
        _training_step(model, mll)


def under(method, fn, *args):
    with memory_setting(method):
        return fn(*args)


def _training_step(model, mll):
    model.train()
    model.likelihood.train()
    model.zero_grad()
    loss = -mll(model(*model.train_inputs), model.train_targets)
    loss.backward()


def predict(model, x_test):
    # The exact GP gets LOVE (fast_pred_var): without it every variance is a CG solve with
    # 1000 right-hand sides against the N × N kernel, minutes at N = 1e4.  The feature
    # kernels ignore the flag (their Woodbury variances are exact and cheap).
    exact = not isinstance(model.covar_module.base_kernel, (gpytorch.kernels.RFFKernel, SketchedRBFKernel))
    with torch.no_grad(), gpytorch.settings.fast_pred_var(exact):
        posterior = model(x_test)
        return posterior.mean, posterior.variance


def predict_with_cache_build(model, x_test):
    model.train()  # drops the prediction strategy and its caches
    model.eval()
    return predict(model, x_test)


def floor_step(features, square):
    return features.mT @ features, features @ square


def median_times(tasks: dict, warmup: int, repeats: int, budget: float = math.inf) -> dict:
    """Median (wall, CPU) seconds and repetition count of each task, timed round-robin.

    ``warmup`` untimed rounds, then up to ``repeats`` timed rounds; no new round starts once
    the timed rounds have taken ``budget`` seconds (at least one round is always timed).
    """
    times = {name: [] for name in tasks}
    for _ in range(warmup):
        for fn in tasks.values():
            fn()
    start = time.perf_counter()
    for _ in range(repeats):
        for name, fn in tasks.items():
            times[name].append(time_call(fn))
        if time.perf_counter() - start > budget:
            break
    return {
        name: (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values), len(values))
        for name, values in times.items()
    }


def benchmark_timing(sizes, dtypes, num_features, dim, num_test, exact_max_n, float32_max_n, schedule, on_block):
    """Time every (dtype, N) block; ``on_block(rows)`` is called after each, so partial results survive."""
    rows = []
    for dtype in dtypes:
        for n in sizes:
            if dtype == torch.float32 and n > float32_max_n:
                continue
            warmup, repeats, budget = schedule(n)
            x, y, x_test = make_data(n, num_test, dim, dtype)
            methods = [m for m in METHODS if m != "exact" or n <= exact_max_n]
            models = {m: (*make_model(m, x, y, num_features, seed=1), m) for m in methods}
            print(f"N={n:>6} {str(dtype):>13}: timing training ...", flush=True)
            train = median_times(
                {m: (lambda mm=mm: training_step(*mm)) for m, mm in models.items()}, warmup, repeats, budget
            )
            for model, *_ in models.values():
                model.eval()
            print(f"N={n:>6} {str(dtype):>13}: timing prediction ...", flush=True)
            with_cache = median_times(
                {m: (lambda mm=mm: under(mm[2], predict_with_cache_build, mm[0], x_test)) for m, mm in models.items()},
                0,
                repeats,
                budget,
            )
            cached = median_times(
                {m: (lambda mm=mm: under(mm[2], predict, mm[0], x_test)) for m, mm in models.items()}, 1, repeats, budget
            )
            del models
            generator = torch.Generator().manual_seed(0)
            features = torch.randn(n, num_features, generator=generator, dtype=torch.float64).to(dtype)
            square = torch.randn(num_features, num_features, generator=generator, dtype=torch.float64).to(dtype)
            floor = median_times({"floor": lambda: floor_step(features, square)}, warmup, repeats, budget)["floor"]
            del features, square
            for method in METHODS:
                skipped = method not in train
                rows.append(
                    {
                        "dtype": str(dtype).removeprefix("torch."),
                        "n": n,
                        "method": method,
                        "train_s": math.nan if skipped else train[method][0],
                        "predict_with_cache_build_s": math.nan if skipped else with_cache[method][0],
                        "predict_cached_s": math.nan if skipped else cached[method][0],
                        "floor_s": floor[0],
                        "train_cpu_s": math.nan if skipped else train[method][1],
                        "floor_cpu_s": floor[1],
                        "train_repetitions": 0 if skipped else train[method][2],
                        "skipped": skipped,
                    }
                )
            for row in rows[-len(METHODS):]:
                print(
                    f"   {row['method']:>13}: train {row['train_s']:.4f}s  predict {row['predict_with_cache_build_s']:.4f}s"
                    f" / cached {row['predict_cached_s']:.4f}s  (floor {row['floor_s']:.4f}s)"
                    f"  CPU: train {row['train_cpu_s']:.4f}s floor {row['floor_cpu_s']:.4f}s",
                    flush=True,
                )
            on_block(rows)
    return rows


# ------------------------------------------------------------------------ approximation
def digits_bandwidth(x: torch.Tensor, num_points: int = 1000, neighbour: int = 50, seed: int = 0) -> float:
    """σ = mean distance of ``num_points`` sampled points to their 50th nearest neighbour (paper 002, Sec. 5)."""
    generator = torch.Generator().manual_seed(seed)
    sample = x[torch.randperm(x.shape[0], generator=generator)[:num_points]]
    distances = torch.cdist(sample, sample)  # neighbours within the sample: σ = 33.6 on digits, as in the notes
    # k-th smallest including the point itself at distance 0, hence neighbour + 1
    return distances.kthvalue(neighbour + 1, dim=-1).values.mean().item()


def load_digits_tensor() -> torch.Tensor:
    from sklearn.datasets import load_digits

    return torch.as_tensor(load_digits().data, dtype=torch.float64)


def read_errors(path: Path) -> list[dict]:
    """The error rows of an earlier run (``--timing-only``)."""
    with path.open() as handle:
        return [
            {"num_features": int(r["num_features"]), "method": r["method"], "seed": int(r["seed"]),
             "rel_frobenius": float(r["rel_frobenius"])}
            for r in csv.DictReader(handle)
        ]


def benchmark_error(feature_counts, seeds, num_points):
    data = load_digits_tensor()
    sigma = digits_bandwidth(data)
    generator = torch.Generator().manual_seed(0)
    x = data[torch.randperm(data.shape[0], generator=generator)[:num_points]]
    exact = torch.exp(-torch.cdist(x, x).pow(2) / (2 * sigma**2))
    exact_norm = torch.linalg.matrix_norm(exact)
    rows = []
    for num_features in feature_counts:
        for method in ("gpytorch-rff", "rfgp-rff", "rfgp-orf", "rfgp-sorf"):
            for seed in range(seeds):
                kernel = make_kernel(method, num_features, x.shape[-1], seed).double()
                kernel.lengthscale = sigma
                with torch.no_grad():
                    if method == "gpytorch-rff":
                        approx = kernel(x).to_dense()
                    else:
                        features = kernel_features(kernel, x)
                        approx = features @ features.mT
                error = (torch.linalg.matrix_norm(approx - exact) / exact_norm).item()
                rows.append({"num_features": num_features, "method": method, "seed": seed, "rel_frobenius": error})
        print(f"F={num_features:>5}: approximation errors done", flush=True)
    return rows, sigma


# ---------------------------------------------------------------------------- reports
def error_summary(rows):
    summary = {}
    for row in rows:
        summary.setdefault((row["num_features"], row["method"]), []).append(row["rel_frobenius"])
    return {key: (statistics.mean(v), statistics.stdev(v) if len(v) > 1 else 0.0) for key, v in summary.items()}


def fmt(seconds: float) -> str:
    return "skipped (N too large for an exact GP)" if math.isnan(seconds) else f"{seconds:.4f}"


def markdown_report(timing, errors, sigma, args, dim, target_n) -> tuple[str, list[str]]:
    lines = [
        "# Fourier-feature kernels: rfgp vs GPyTorch",
        "",
        f"Generated by `python benchmarks/fourier_kernels.py{' --quick' if args.quick else ''}` on "
        f"{platform.processor() or platform.machine()}, {torch.get_num_threads()} torch threads, "
        f"torch {torch.__version__}, gpytorch {gpytorch.__version__}, rfgp {rfgp.__version__}. "
        f"F = {args.num_features}, d = {dim}, {args.num_test} test points; median of {args.repeats} "
        f"repetitions after {args.warmup} warm-up round(s)"
        + f"; for N ≥ {args.large_n} no warm-up (one iteration takes seconds) and no new repetition after "
        f"{args.budget:.0f} s, to fit the run into the time available on the shared machine (column *reps*)"
        + ", methods timed round-robin. "
        f"Load average (1 min) at start/end: {args.load_start:.1f}/{os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores: the machine was shared with other jobs, so wall-clock times are inflated; "
        "the *CPU* columns (process CPU time over all threads) are less sensitive to that."
        + (" **Quick smoke run: sizes reduced, not the full benchmark.**" if args.quick else "")
        + (TIMING_ONLY_NOTE if args.timing_only else ""),
        "",
        "- *train*: one `ExactMarginalLogLikelihood` forward + backward (`ScaleKernel`, `GaussianLikelihood`, `ExactGP`).",
        "- *predict (+cache)*: posterior mean and variance at the test points, first call after `eval()` "
        "(builds the prediction cache); *predict (cached)*: a second call.",
        f"- rfgp-rff/orf/sorf run with `rfgp.settings.memory_budget({MATERIALISED_BUDGET // 2**30} GiB)` so that Φ is "
        "materialised, as GPyTorch's `RFFKernel` does; *rfgp-rff-chunked* is rfgp-rff under the default 1 GiB budget "
        "(chunked feature statistics with Φ recomputed in the backward pass where N·F exceeds it).",
        "- *floor*: 4·N·F² flops as plain matmuls Φᵀ@Φ + Φ@S (Φ: N × F) in the same run; *×floor* = train / floor.",
        "- The exact GP uses GPyTorch's default settings (CG/Lanczos above 800 points) and LOVE "
        "(`fast_pred_var`) for its predictive variances; it is skipped where "
        f"N > {args.exact_max_n} (an N × N kernel matrix would not fit or take minutes per iteration).",
        f"- float32 is timed up to N = {min(args.float32_max_n, max(args.sizes))}"
        + (" (larger N left out to fit the run into the time available on the shared machine)."
           if args.float32_max_n < max(args.sizes) else "."),
        "",
        "## Training and prediction time (seconds)",
        "",
        "| dtype | N | method | train | ×floor | speed-up vs gpytorch-rff | train CPU | ×floor CPU | speed-up CPU "
        "| predict (+cache) | predict (cached) | reps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    by_key = {(r["dtype"], r["n"], r["method"]): r for r in timing}
    for row in timing:
        reference = by_key[(row["dtype"], row["n"], "gpytorch-rff")]
        cells = [row["dtype"], row["n"], row["method"], fmt(row["train_s"])]
        for clock in ("", "_cpu"):
            if clock:
                cells.append(fmt(row["train_cpu_s"]))
            if row["skipped"]:
                cells += ["", ""]
            else:
                train = row[f"train{clock}_s"]
                cells += [f"{train / row[f'floor{clock}_s']:.2f}", f"{reference[f'train{clock}_s'] / train:.2f}×"]
        cells += [fmt(row["predict_with_cache_build_s"]), fmt(row["predict_cached_s"]), row["train_repetitions"] or ""]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    floors = sorted({(r["dtype"], r["n"], r["floor_s"], r["floor_cpu_s"]) for r in timing})
    lines += ["", "| dtype | N | floor wall (s) | floor CPU (s) |", "|---|---|---|---|"]
    lines += [f"| {d} | {n} | {f:.4f} | {c:.4f} |" for d, n, f, c in floors]

    summary = error_summary(errors)
    feature_counts = sorted({r["num_features"] for r in errors})
    methods = ("gpytorch-rff", "rfgp-rff", "rfgp-orf", "rfgp-sorf")
    num_seeds = len({r["seed"] for r in errors})
    lines += [
        "",
        "## Kernel approximation error on scikit-learn digits",
        "",
        f"‖K̂ − K‖_F / ‖K‖_F on {args.error_points} digits (d = 64), RBF with σ = mean 50-NN distance = {sigma:.2f}; "
        f"mean ± standard deviation over {num_seeds} seeds.",
        "",
        "| F | F/d | " + " | ".join(methods) + " | ORF/RFF | SORF/RFF |",
        "|---|---|" + "---|" * (len(methods) + 2),
    ]
    for f in feature_counts:
        cells = [f"{summary[(f, m)][0]:.4f} ± {summary[(f, m)][1]:.4f}" for m in methods]
        rff = summary[(f, "rfgp-rff")][0]
        lines.append(
            f"| {f} | {f / 64:g} | " + " | ".join(cells)
            + f" | {summary[(f, 'rfgp-orf')][0] / rff:.3f} | {summary[(f, 'rfgp-sorf')][0] / rff:.3f} |"
        )

    # --------------------------------------------------------------- targets
    verdicts = []
    float64 = [r for r in timing if r["dtype"] == "float64" and r["n"] == target_n]
    if float64:
        reference = next(r for r in float64 if r["method"] == "gpytorch-rff")
        for row in (r for r in float64 if r["method"] in RFGP_METHODS):
            speedup, speedup_cpu = reference["train_s"] / row["train_s"], reference["train_cpu_s"] / row["train_cpu_s"]
            verdicts.append(
                f"{'PASS' if speedup >= 2 else 'FAIL'}: {row['method']} at N={target_n}, F={args.num_features}, "
                f"float64 trains {speedup:.2f}× faster per iteration than GPyTorch RFFKernel (target ≥ 2×; "
                f"CPU time: {speedup_cpu:.2f}×)"
            )
        chunked = next((r for r in float64 if r["method"] == "rfgp-rff-chunked"), None)
        if chunked is not None:
            verdicts.append(
                f"INFO (no target): rfgp-rff-chunked (default 1 GiB memory budget) at N={target_n}, float64: "
                f"{reference['train_s'] / chunked['train_s']:.2f}× faster than GPyTorch RFFKernel, "
                f"{chunked['train_s'] / chunked['floor_s']:.2f}× the floor (CPU time: "
                f"{reference['train_cpu_s'] / chunked['train_cpu_s']:.2f}×, {chunked['train_cpu_s'] / chunked['floor_cpu_s']:.2f}×)"
            )
        for row in (r for r in float64 if r["method"] in RFGP_METHODS):
            ratio, ratio_cpu = row["train_s"] / row["floor_s"], row["train_cpu_s"] / row["floor_cpu_s"]
            verdicts.append(
                f"{'PASS' if ratio <= 1.5 else 'FAIL'}: {row['method']} at N={target_n}, float64 takes {ratio:.2f}× "
                f"the 4·N·F² matmul floor (target ≤ 1.5×; CPU time: {ratio_cpu:.2f}×)"
            )
    target_f = 4 * 64
    if (target_f, "rfgp-rff") in summary:
        rff = summary[(target_f, "rfgp-rff")][0]
        for method in ("rfgp-orf", "rfgp-sorf"):
            ratio = summary[(target_f, method)][0] / rff
            verdicts.append(
                f"{'PASS' if ratio <= 0.6 else 'FAIL'}: {method} relative Frobenius error at F = 4d = {target_f} on digits "
                f"is {ratio:.3f}× RFF's (target ≤ 0.6×)"
            )
    lines += ["", "## Targets", ""] + [f"- {v}" for v in verdicts]
    lines += ["", "Plots: `fourier_kernels_timing.png`, `fourier_kernels_error.png`.", ""]
    return "\n".join(lines), verdicts


def plot_timing(timing, path: Path) -> None:
    dtypes = sorted({r["dtype"] for r in timing}, reverse=True)
    fig, axes = plt.subplots(1, len(dtypes), figsize=(6 * len(dtypes), 4.5), squeeze=False)
    for ax, dtype in zip(axes[0], dtypes):
        rows = [r for r in timing if r["dtype"] == dtype]
        for method in METHODS:
            points = [(r["n"], r["train_s"]) for r in rows if r["method"] == method and not r["skipped"]]
            if points:
                ax.plot(*zip(*points), marker="o", label=method)
        floor = sorted({(r["n"], r["floor_s"]) for r in rows})
        ax.plot(*zip(*floor), "k--", label="4·N·F² matmul floor")
        ax.set(xscale="log", yscale="log", xlabel="N (training points)", ylabel="seconds per MLL + backward",
               title=f"training iteration, {dtype}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_error(errors, sigma, path: Path) -> None:
    summary = error_summary(errors)
    feature_counts = sorted({r["num_features"] for r in errors})
    fig, ax = plt.subplots(figsize=(6, 4.5))
    for method in ("gpytorch-rff", "rfgp-rff", "rfgp-orf", "rfgp-sorf"):
        means = [summary[(f, method)][0] for f in feature_counts]
        stds = [summary[(f, method)][1] for f in feature_counts]
        ax.errorbar(feature_counts, means, yerr=stds, marker="o", capsize=3, label=method)
    ax.set(xscale="log", yscale="log", xlabel="F (real feature width)", ylabel="‖K̂ − K‖_F / ‖K‖_F",
           title=f"RBF approximation on digits (σ = {sigma:.1f})")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def profile_training(n, num_features, dim, path: Path) -> None:
    """torch.profiler breakdown (self CPU time per op and input shape) of one training step per method."""
    from torch.profiler import ProfilerActivity, profile

    x, y, _ = make_data(n, 1, dim, torch.float64)
    sections = []
    for method in ("gpytorch-rff", "rfgp-rff", "rfgp-sorf"):
        model, mll = make_model(method, x, y, num_features, seed=1)
        training_step(model, mll, method)  # warm-up
        with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
            training_step(model, mll, method)
        table = prof.key_averages(group_by_input_shape=True).table(
            sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=36, max_shapes_column_width=70
        )
        sections.append(f"===== {method}: one MLL forward + backward, N={n}, F={num_features}, float64\n{table}")
        print(sections[-1], flush=True)
    path.write_text("\n\n".join(sections))


def main(argv=None) -> list[str]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--num-features", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--num-test", type=int, default=1000)
    parser.add_argument("--exact-max-n", type=int, default=10_000)
    parser.add_argument("--error-points", type=int, default=1000)
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--float32-max-n", type=int, default=100_000, help="largest N timed in float32")
    parser.add_argument("--large-n", type=int, default=10_000, help="from this N on, no warm-up and a time budget")
    parser.add_argument("--budget", type=float, default=300.0,
                        help="seconds after which no further repetition starts (N ≥ --large-n)")
    parser.add_argument("--profile", type=int, metavar="N", help="only profile one training step per method at N")
    parser.add_argument("--timing-only", action="store_true",
                        help="re-run only the timing part; the error table is read from the last full run's CSV")
    args = parser.parse_args(argv)
    args.load_start = os.getloadavg()[0]
    torch.set_num_threads(os.cpu_count() or 1)
    warnings.filterwarnings("ignore", category=gpytorch.utils.warnings.NumericalWarning)
    dim = 8
    sizes = args.sizes
    feature_counts = [64, 128, 256, 512, 1024, 2048]
    if args.quick:
        sizes, args.num_features, args.repeats, args.num_test = [500, 2_000], 256, 2, 200
        args.exact_max_n, args.error_points, args.seeds, feature_counts = 500, 300, 3, [64, 256]
    args.out.mkdir(parents=True, exist_ok=True)
    if args.profile:
        profile_training(args.profile, args.num_features, dim, args.out / "fourier_kernels_profile.txt")
        return []

    def schedule(n):
        return (0, args.repeats, args.budget) if n >= args.large_n else (args.warmup, args.repeats, math.inf)

    stem = "fourier_kernels_quick" if args.quick else "fourier_kernels"
    if args.timing_only:
        errors, sigma = read_errors(args.out / f"{stem}_error.csv"), digits_bandwidth(load_digits_tensor())
    else:
        errors, sigma = benchmark_error(feature_counts, args.seeds, args.error_points)
        write_csv(args.out / f"{stem}_error.csv", errors)
        plot_error(errors, sigma, args.out / f"{stem}_error.png")

    def write_timing(timing, complete=False):
        write_csv(args.out / f"{stem}_timing.csv", timing)
        plot_timing(timing, args.out / f"{stem}_timing.png")
        report, verdicts = markdown_report(timing, errors, sigma, args, dim, max(sizes))
        report = report.replace("fourier_kernels_timing.png", f"{stem}_timing.png").replace(
            "fourier_kernels_error.png", f"{stem}_error.png"
        )
        if not complete:
            report = report.replace(
                "## Training", "**Partial results: the run had not finished all (dtype, N) blocks.**\n\n## Training", 1
            )
        (args.out / f"{stem}.md").write_text(report)
        return verdicts

    timing = benchmark_timing(
        sizes, (torch.float64, torch.float32), args.num_features, dim, args.num_test, args.exact_max_n,
        args.float32_max_n, schedule, write_timing,
    )
    verdicts = write_timing(timing, complete=True)
    print("\n".join(verdicts))
    return verdicts


if __name__ == "__main__":
    main()
