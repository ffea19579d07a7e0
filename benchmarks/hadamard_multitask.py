"""GPyTorch's Hadamard multitask GP: the exact model vs the same code with an rfgp data kernel.

The model is GPyTorch's Hadamard multitask tutorial: inputs (x, task index i), covariance
``covar_module(x).mul(task_covar_module(i))`` with ``IndexKernel(num_tasks=T, rank=1)``, one
``GaussianLikelihood``.  The rfgp model changes only the data kernel, ``ScaleKernel(RBFKernel())`` →
``rfgp.sketch(...)``; rfgp keeps the elementwise product a feature root Φ(x) ⊗ chol(B)[i]
(:mod:`rfgp.inference.elementwise_product`).  In the same run:

* ``exact``               — GPyTorch's model, default settings (N·T > 800: CG and Lanczos);
* ``rfgp-F256``            — rfgp data kernel at F = 256 (root width F·T);
* ``rfgp-F256 generic``    — the same with linear_operator's generic ``MulLinearOperator`` of the product
  (what rfgp did before the face-splitting root: Lanczos roots and CG).

Data: x ∈ [0, 1], T = 3 tasks f_t(x) = sin(2π(x + t/4)) + 0.3·t·x, noise σ = 0.1.  Each method trains
from the same initial hyperparameters with Adam (lr 0.1, ``--iterations`` steps), then predicts 300
test points per task; reported: training and prediction time, test RMSE against the noise-free f and
the mean negative log predictive density of noisy test targets, with the 1-minute load.

Run: ``python benchmarks/hadamard_multitask.py`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from pathlib import Path

import gpytorch
import torch
from gpytorch.lazy import LazyEvaluatedKernelTensor
from linear_operator.operators import LinearOperator

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.operators import FeatureRootLinearOperator  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float64
NUM_TASKS = 3
NOISE = 0.1


def data(points_per_task: int, seed: int):
    """(x (N·T, 1), task index (N·T, 1), noisy y, noise-free f)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.rand(points_per_task * NUM_TASKS, 1, generator=gen, dtype=DTYPE)
    i = torch.arange(NUM_TASKS).repeat_interleave(points_per_task).unsqueeze(-1)
    f = torch.sin(2 * math.pi * (x[:, 0] + i[:, 0] / 4)) + 0.3 * i[:, 0] * x[:, 0]
    return x, i, f + NOISE * torch.randn(f.shape, generator=gen, dtype=DTYPE), f


class HadamardModel(gpytorch.models.ExactGP):
    def __init__(self, x, i, y, likelihood, kernel):
        super().__init__((x, i), y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel
        self.task_covar_module = gpytorch.kernels.IndexKernel(num_tasks=NUM_TASKS, rank=1)

    def forward(self, x, i):
        covar = self.covar_module(x).mul(self.task_covar_module(i))
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), covar)


@contextlib.contextmanager
def generic_product():
    """linear_operator's generic elementwise product for rfgp covariances (rfgp before the face-splitting root)."""
    lazy, root = LazyEvaluatedKernelTensor._mul_matrix, FeatureRootLinearOperator._mul_matrix
    LazyEvaluatedKernelTensor._mul_matrix = lazy.generic_mul_matrix
    FeatureRootLinearOperator._mul_matrix = LinearOperator._mul_matrix
    try:
        yield
    finally:
        LazyEvaluatedKernelTensor._mul_matrix, FeatureRootLinearOperator._mul_matrix = lazy, root


def run(method: str, points_per_task: int, iterations: int, seed: int) -> dict:
    x, i, y, _ = data(points_per_task, seed)
    test_x, test_i, test_y, test_f = data(300, seed + 100)
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
    if method != "exact":
        kernel = rfgp.sketch(kernel, 256, seed=0)
    torch.manual_seed(seed)  # IndexKernel's random covar_factor: the same start for every method
    model = HadamardModel(x, i, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    with generic_product() if method.endswith("generic") else contextlib.nullcontext():
        model.train()
        start = time.perf_counter()
        for _ in range(iterations):
            optimizer.zero_grad()
            loss = -mll(model(x, i), y)
            loss.backward()
            optimizer.step()
        train_s = time.perf_counter() - start
        model.eval()
        start = time.perf_counter()
        with torch.no_grad():
            predictive = model.likelihood(model(test_x, test_i))
            mean, variance = predictive.mean, predictive.variance
        predict_s = time.perf_counter() - start
    nlpd = 0.5 * (math.log(2 * math.pi) + variance.log() + (test_y - mean).pow(2) / variance)
    return {"points_per_task": points_per_task, "rows": points_per_task * NUM_TASKS, "method": method,
            "iterations": iterations, "train_s": train_s, "predict_s": predict_s,
            "rmse": float((mean - test_f).pow(2).mean().sqrt()), "nlpd": float(nlpd.mean()),
            "final_loss": loss.item(), "load_1min": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100 points per task, 10 iterations")
    parser.add_argument("--iterations", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [100] if args.quick else [500, 1000]
    iterations = 10 if args.quick else args.iterations
    rows = []
    for points in sizes:
        for method in ("exact", "rfgp-F256", "rfgp-F256 generic"):
            row = run(method, points, iterations, args.seed)
            rows.append(row)
            print(f"N·T={row['rows']:5d} {method:>18}: train {row['train_s']:7.2f} s, "
                  f"predict {row['predict_s']:5.2f} s, RMSE {row['rmse']:.4f}, NLPD {row['nlpd']:.3f} "
                  f"(load {row['load_1min']:.1f})", flush=True)
    name = "hadamard_multitask" + ("_quick" if args.quick else "")
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / f"{name}.csv", rows)
    lines = [f"# Hadamard multitask GP: exact GPyTorch model vs an rfgp data kernel ({iterations} Adam steps)", "",
             f"T = {NUM_TASKS} tasks, IndexKernel(rank=1), GaussianLikelihood; float64; {os.cpu_count()} CPUs; "
             "load = 1-minute load average after each run.  `generic` multiplies the rfgp covariance by "
             "linear_operator's generic MulLinearOperator (rfgp's behaviour before the face-splitting root).", "",
             "| N·T | method | train (s) | predict (s) | test RMSE | test NLPD | load |",
             "|---:|---|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['rows']} | {r['method']} | {r['train_s']:.2f} | {r['predict_s']:.2f} | {r['rmse']:.4f} | "
              f"{r['nlpd']:.3f} | {r['load_1min']:.1f} |" for r in rows]
    (RESULTS / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
