"""Multitask GPs with correlated observation noise: GPyTorch's exact multitask model vs rfgp.sketch of it.

The model is GPyTorch's multitask regression pattern: ``MultitaskMean``, ``MultitaskKernel(RBFKernel(),
num_tasks=T, rank=1)`` and ``MultitaskGaussianLikelihood(num_tasks=T, rank=1)`` (noise I_N ⊗ Σ_T with
Σ_T = BBᵀ + σ²I couples the tasks of each observation).  The rfgp model is the same code with
``rfgp.sketch(kernel, F)``: its marginal likelihood and posterior whiten Φ per point by chol(Σ_T)
(:mod:`rfgp.inference.task_noise`) and run in feature space.  The sketched decomposable kernel's root has
F·(rank + T) columns (F = 256: 1 024), so its cost per step is O(N·T·(F·(rank + T))²); GPyTorch's exact
model uses the Kronecker structure of K_XX ⊗ B + I ⊗ Σ_T (eigendecompositions, O(N³ + T³)).

Data: 2-D inputs, T = 3 smooth outputs mixed through a fixed matrix, noise with correlation 0.6
between tasks.  Each method trains from the same initial hyperparameters with Adam (lr 0.05,
``--iterations`` steps) on N points, then predicts 1 000 test points; reported: training time,
prediction time, test RMSE against the noise-free outputs and the mean per-entry negative log
predictive density of noisy test targets (the likelihood's marginal), with the 1-minute load.

Run: ``python benchmarks/correlated_task_noise.py`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402
from tests._models import MultitaskGP  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float64
NUM_TASKS = 3
MIXING = torch.tensor([[1.0, 0.5, 0.0], [0.0, 1.0, 0.5], [0.3, 0.0, 1.0]], dtype=DTYPE)
#: Σ_T: variance 0.04 per task, correlation 0.6 between tasks
NOISE_COVARIANCE = 0.04 * (0.4 * torch.eye(NUM_TASKS, dtype=DTYPE) + 0.6 * torch.ones((NUM_TASKS,) * 2, dtype=DTYPE))


def data(n: int, seed: int):
    """(x, noisy y, noise-free f) with y − f ~ N(0, Σ_T) per point."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=gen, dtype=DTYPE) * 2 - 1
    latent = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1]) * x[:, 0], torch.sin(2 * x.sum(-1))], -1)
    f = latent @ MIXING.T
    noise = torch.randn(n, NUM_TASKS, generator=gen, dtype=DTYPE) @ torch.linalg.cholesky(NOISE_COVARIANCE).T
    return x, f + noise, f


def build(method: str, x, y):
    kernel = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=NUM_TASKS, rank=1)
    if method != "exact":
        kernel = rfgp.sketch(kernel, int(method.split("F")[-1]), seed=0)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=NUM_TASKS, rank=1)
    return MultitaskGP(x, y, likelihood, kernel).to(DTYPE)


def run(method: str, n: int, iterations: int, seed: int) -> dict:
    x, y, _ = data(n, seed)
    test_x, test_y, test_f = data(1000, seed + 100)
    model = build(method, x, y)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    model.train()
    start = time.perf_counter()
    for _ in range(iterations):
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
    train_s = time.perf_counter() - start
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        predictive = model.likelihood(model(test_x))
        mean, variance = predictive.mean, predictive.variance
    predict_s = time.perf_counter() - start
    nlpd = 0.5 * (math.log(2 * math.pi) + variance.log() + (test_y - mean).pow(2) / variance)
    return {"n": n, "method": method, "iterations": iterations, "train_s": train_s, "predict_s": predict_s,
            "rmse": float((mean - test_f).pow(2).mean().sqrt()), "nlpd": float(nlpd.mean()),
            "final_loss": loss.item(), "load_1min": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N up to 1000, 20 iterations")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exact-max", type=int, default=2000,
                        help="largest N for the exact model (N = 2000, 50 steps: ~3 min on 2 cores; ×8 per doubling)")
    args = parser.parse_args()
    sizes = [250, 1000] if args.quick else [500, 1000, 2000, 4000]
    iterations = 20 if args.quick else args.iterations
    methods = ["exact", "rfgp-F64", "rfgp-F256"]
    rows = []
    for n in sizes:
        for method in methods:
            if method == "exact" and n > args.exact_max:
                print(f"N={n:5d} {method:>10}: not run (N > --exact-max={args.exact_max})", flush=True)
                continue
            row = run(method, n, iterations, args.seed)
            rows.append(row)
            print(f"N={n:5d} {method:>10}: train {row['train_s']:7.2f} s, predict {row['predict_s']:5.2f} s, "
                  f"RMSE {row['rmse']:.4f}, NLPD {row['nlpd']:.3f} (load {row['load_1min']:.1f})", flush=True)
    name = "correlated_task_noise" + ("_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / f"{name}.csv", rows)
    lines = [f"# Correlated multitask noise: exact GPyTorch multitask GP vs rfgp.sketch ({iterations} Adam steps)", "",
             f"T = {NUM_TASKS} tasks, MultitaskGaussianLikelihood(rank=1); {os.cpu_count()} CPUs; load = 1-minute "
             f"load average after each run; the exact model is not run above N = {args.exact_max}.", "",
             "| N | method | train (s) | predict (s) | test RMSE | test NLPD | load |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['n']} | {r['method']} | {r['train_s']:.2f} | {r['predict_s']:.2f} | {r['rmse']:.4f} | "
              f"{r['nlpd']:.3f} | {r['load_1min']:.1f} |" for r in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
