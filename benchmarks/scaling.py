"""Million-point GPs: rfgp chunked feature statistics vs GPyTorch's RFFKernel, and 1 vs 2 gloo processes.

Synthetic regression, d = 8, float32, ``ScaleKernel`` of an RBF kernel with F random
Fourier features, the plain ``ExactGP`` + ``ExactMarginalLogLikelihood`` path.  Each
configuration runs in its own subprocess (peak resident memory from
``resource.getrusage(RUSAGE_SELF).ru_maxrss``; with 2 processes, the larger of the two):

* iteration — one MLL + gradient evaluation (s),
* fit       — building the posterior caches A⁻¹ΦᵀD⁻¹r and chol(A) (s),
* predict   — mean and variance at 10 000 test points once the caches exist (s).

GPyTorch's ``RFFKernel`` (F = 2 × num_samples) materialises the N × F features and their
autograd intermediates; configurations estimated above ``--max-gb`` are skipped.

    python benchmarks/scaling.py            # reduced grid that fits ~10 min on 2 cores
    python benchmarks/scaling.py --full     # N ∈ {1e5, 1e6} × F ∈ {512, 1024, 2048}
    python benchmarks/scaling.py --quick    # smoke run
    python benchmarks/scaling.py --config rfgp 1000000 1024 1   # one configuration (scaling_selected.*)
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
DIM, NUM_TEST = 8, 10_000
#: N × F float32 arrays alive at once in GPyTorch's RFFKernel MLL backward (Φ, cos/sin parts, grads)
GPYTORCH_COPIES = 6


def _data(n: int, seed: int = 0):
    import torch

    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, DIM, generator=gen) * 4
    y = torch.sin(x).sum(-1) / 3 + 0.1 * torch.randn(n, generator=gen)
    return x, y, torch.rand(NUM_TEST, DIM, generator=gen) * 4


def _kernel(method: str, num_features: int):
    import gpytorch

    import rfgp

    if method == "gpytorch":
        base = gpytorch.kernels.RFFKernel(num_samples=num_features // 2, num_dims=DIM, ard_num_dims=DIM)
    else:
        base = rfgp.kernels.SketchedRBFKernel(num_features, ard_num_dims=DIM, seed=0)
    return gpytorch.kernels.ScaleKernel(base)


def worker(args) -> dict:
    """One configuration in this process (rank ``args.rank`` of ``args.procs``)."""
    import gpytorch
    import torch
    import torch.distributed as dist

    import rfgp

    torch.set_num_threads(args.threads)
    distributed = args.procs > 1
    if distributed:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}", rank=args.rank,
                                world_size=args.procs)
    x, y, x_test = _data(args.n)
    if distributed:
        rows = slice(args.rank * args.n // args.procs, (args.rank + 1) * args.n // args.procs)
        x, y = x[rows].clone(), y[rows].clone()
    torch.manual_seed(0)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    model = rfgp.models.ExactGPModel(x, y, likelihood, _kernel(args.method, args.f))
    if distributed:
        mll = rfgp.distributed.DistributedExactMarginalLogLikelihood(likelihood, model)
        context = rfgp.distributed.data_parallel
    else:
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        context = _nothing
    model.covar_module(x[:2]).to_dense()  # any lazily drawn features before timing
    with context():
        start, start_cpu = time.perf_counter(), time.process_time()
        loss = -mll(model(x), y)
        loss.backward()
        if distributed:
            rfgp.distributed.sync_gradients(model)
        iteration, iteration_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        model.eval()
        with torch.no_grad():
            start = time.perf_counter()
            model(x_test[:10])  # builds the prediction caches
            fit = time.perf_counter() - start
            start = time.perf_counter()
            prediction = likelihood(model(x_test))
            prediction.mean, prediction.variance
            predict = time.perf_counter() - start
    result = {"iteration_s": iteration, "iteration_cpu_s": iteration_cpu, "fit_s": fit, "predict_s": predict, "loss": loss.item(),
              "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    if distributed:
        dist.destroy_process_group()
    return result


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_configuration(method: str, n: int, f: int, procs: int, cores: int) -> dict:
    """Launch the configuration in ``procs`` fresh subprocesses sharing ``cores`` threads."""
    port = _free_port()
    commands = [
        [sys.executable, __file__, "--worker", "--method", method, "--n", str(n), "--f", str(f),
         "--procs", str(procs), "--rank", str(rank), "--port", str(port), "--threads", str(max(1, cores // procs))]
        for rank in range(procs)
    ]
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    handles = [subprocess.Popen(c, stdout=subprocess.PIPE, text=True, env=env) for c in commands]
    outputs = [json.loads(h.communicate()[0].strip().splitlines()[-1]) for h in handles]
    if any(h.returncode for h in handles):
        raise RuntimeError(f"configuration {method} N={n} F={f} procs={procs} failed")
    keys = ("iteration_s", "iteration_cpu_s", "fit_s", "predict_s", "peak_mb")
    combined = {key: max(o[key] for o in outputs) for key in keys}
    return {"method": method, "N": n, "F": f, "processes": procs, **combined, "loss": outputs[0]["loss"]}


def grid(mode: str):
    """(method, N, F, processes) configurations of each mode."""
    if mode == "quick":
        return [(m, 20_000, 256, 1) for m in ("rfgp", "gpytorch")] + [("rfgp", 20_000, 256, 2)]
    features = (512, 1024, 2048)
    sizes = (100_000, 1_000_000)
    if mode == "full":
        configs = [(m, n, f, 1) for n in sizes for f in features for m in ("rfgp", "gpytorch")]
        return configs + [("rfgp", n, f, 2) for n in sizes for f in features]
    configs = [(m, 100_000, f, 1) for f in features for m in ("rfgp", "gpytorch")]
    configs += [("rfgp", 100_000, 1024, 2), ("rfgp", 1_000_000, 1024, 1), ("gpytorch", 1_000_000, 1024, 1)]
    return configs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--full", action="store_true", help="the complete N × F grid (long on 2 cores)")
    parser.add_argument("--cores", type=int, default=2, help="CPU threads shared by the processes")
    parser.add_argument("--max-gb", type=float, default=8.0, help="skip GPyTorch configurations estimated above this")
    parser.add_argument("--config", nargs=4, action="append", metavar=("METHOD", "N", "F", "PROCS"),
                        help="run only this configuration (repeatable), e.g. --config rfgp 1000000 1024 1")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    for name in ("method", "n", "f", "procs", "rank", "port", "threads"):
        parser.add_argument(f"--{name}", type=str if name == "method" else int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    mode = "quick" if args.quick else "full" if args.full else "selected" if args.config else "reduced"
    configs = [(m, int(n), int(f), int(p)) for m, n, f, p in args.config] if args.config else grid(mode)
    load = os.getloadavg()[0]
    rows = []
    for method, n, f, procs in configs:
        estimate_gb = GPYTORCH_COPIES * n * f * 4 / 1e9
        if method == "gpytorch" and estimate_gb > args.max_gb:
            print(f"skip gpytorch N={n} F={f}: ~{estimate_gb:.0f} GB of N×F intermediates > {args.max_gb} GB")
            rows.append({"method": method, "N": n, "F": f, "processes": procs, "skipped": f"~{estimate_gb:.0f} GB"})
            continue
        row = run_configuration(method, n, f, procs, args.cores)
        print(json.dumps(row))
        rows.append(row)
    write_results(rows, mode, args.cores, max(load, os.getloadavg()[0]))


def write_results(rows: list[dict], mode: str, cores: int, load: float) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / {"quick": "scaling_quick", "selected": "scaling_selected"}.get(mode, "scaling")
    fields = ["method", "N", "F", "processes", "iteration_s", "iteration_cpu_s", "fit_s", "predict_s", "peak_mb", "loss", "skipped"]
    write_csv(f"{stem}.csv", rows, fields)
    header = (f"# Scaling: rfgp chunked vs GPyTorch RFFKernel ({mode} grid, float32, d={DIM}, {cores} CPU threads "
              f"in total, {NUM_TEST} test points)\n\n"
              f"Machine: {os.cpu_count()} CPU cores, load average up to {load:.1f} while measuring "
              "(other jobs shared the cores: absolute times are inflated, compare within the table).\n\n")
    if mode == "reduced":
        header += ("Reduced grid (the full grid, `--full`, does not fit ~10 min on 2 cores): N=1e5 × F ∈ {512, 1024, "
                   "2048}, N=1e6 × F=1024, and 2 gloo processes at N=1e5, F=1024.\n\n")
    lines = ["| method | N | F | processes | iteration (s) | iteration CPU (s) | fit (s) | predict (s) | peak memory (MB) |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if "skipped" in r:
            lines.append(f"| {r['method']} | {r['N']:,} | {r['F']} | {r['processes']} | skipped: {r['skipped']} "
                         f"of N×F intermediates | | | | |")
        else:
            lines.append(f"| {r['method']} | {r['N']:,} | {r['F']} | {r['processes']} | {r['iteration_s']:.2f} | "
                         f"{r['iteration_cpu_s']:.2f} | {r['fit_s']:.2f} | {r['predict_s']:.2f} | {r['peak_mb']:.0f} |")
    Path(f"{stem}.md").write_text(header + "\n".join(lines) + "\n")
    plot(rows, f"{stem}.png")


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if "skipped" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method, procs, marker in (("rfgp", 1, "o"), ("gpytorch", 1, "s"), ("rfgp", 2, "^")):
        for n in sorted({r["N"] for r in done}):
            sel = sorted((r for r in done if r["method"] == method and r["processes"] == procs and r["N"] == n),
                         key=lambda r: r["F"])
            if not sel:
                continue
            label = f"{method} ×{procs} N={n:,}"
            axes[0].plot([r["F"] for r in sel], [r["iteration_s"] for r in sel], marker=marker, label=label)
            axes[1].plot([r["F"] for r in sel], [r["peak_mb"] for r in sel], marker=marker, label=label)
    for ax, title in zip(axes, ("one MLL + gradient (s)", "peak memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("F")
        ax.set_title(title)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
