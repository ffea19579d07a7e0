"""T targets of one kernel: one MLL + gradient of a target batch against T single-target models.

A GPyTorch ``ExactGP`` whose targets (and constant mean) carry a batch of T over one unbatched sketched kernel — T
independent GPs with one set of hyperparameters, ``rfgp.models.GPRegressor``'s model for (N, T) targets — has a
covariance whose features are one Φ expanded to the batch (stride 0).  rfgp forms ΦᵀΦ (feature space, N > F) or
ΦΦᵀ (kernel space, N ≲ F) once for the batch and factorises once per target.  Rows: the batch of T, the same T
targets as T separate models (what the batch replaces), and one target.  One thread, float64, median of repeats
after one untimed call each, alternated.

    python benchmarks/target_batch.py            # N = 4000, F = 512, T = 8 and N = 1000, F = 2048, T = 4
    python benchmarks/target_batch.py --quick    # writes results/target_batch_quick.md, not the full run's table
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import gpytorch
import torch

import rfgp
from rfgp.inference.kernel_space import prefers_kernel_space

RESULTS = Path(__file__).parent / "results"


class TargetBatchGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, num_features):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.mean = gpytorch.means.ConstantMean(batch_shape=y.shape[:-1])
        self.covar = gpytorch.kernels.ScaleKernel(
            rfgp.kernels.SketchedRBFKernel(num_features, ard_num_dims=x.shape[-1], seed=0))

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean(x), self.covar(x))


def step_seconds(models, x) -> float:
    """One MLL + gradient of every model in ``models`` (summed losses), seconds."""
    start = time.perf_counter()
    for model in models:
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        (-mll(model(x), model.train_targets).sum()).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, 2 repeats (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [(400, 128, 4), (100, 256, 2)] if args.quick else [(4000, 512, 8), (1000, 2048, 4)]
    repeats = 2 if args.quick else 5
    load_before = os.getloadavg()
    rows = []
    for num_data, num_features, num_targets in cases:
        gen = torch.Generator().manual_seed(0)
        x = torch.randn(num_data, 3, generator=gen, dtype=torch.float64)
        y = torch.sin(2 * x).sum(-1) + 0.1 * torch.randn(num_targets, num_data, generator=gen, dtype=torch.float64)
        variants = {
            f"batch of T = {num_targets}": [TargetBatchGP(x, y, num_features).double()],
            f"T = {num_targets} separate models": [TargetBatchGP(x, y[t], num_features).double()
                                                   for t in range(num_targets)],
            "one target": [TargetBatchGP(x, y[0], num_features).double()],
        }
        times = {name: [] for name in variants}
        for name, models in variants.items():
            step_seconds(models, x)  # untimed
        for _ in range(repeats):
            for name, models in variants.items():
                times[name].append(step_seconds(models, x))
        path = "kernel space" if prefers_kernel_space(num_data, num_features) else "feature space"
        for name, values in times.items():
            rows.append((num_data, num_features, path, name, statistics.median(values)))
    lines = [
        "# T targets of one kernel: a target batch against T single-target models",
        "",
        f"`python benchmarks/target_batch.py{' --quick' if args.quick else ''}`: one MLL + gradient, float64, one "
        f"thread, median of {repeats} alternated repeats. GPyTorch `ExactGP` with `ConstantMean(batch_shape=[T])` and "
        "one `ScaleKernel(SketchedRBFKernel(F, ard_num_dims=3))`; d = 3. Load average (1, 5, 15 min) before: "
        f"{', '.join(f'{v:.2f}' for v in load_before)}; after: {', '.join(f'{v:.2f}' for v in os.getloadavg())} "
        f"on {os.cpu_count()} logical CPUs.",
        "",
        "| N | F | path | model | seconds |",
        "|---|---|---|---|---|",
        *(f"| {n} | {f} | {path} | {name} | {seconds:.3f} |" for n, f, path, name, seconds in rows),
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"target_batch{'_quick' if args.quick else ''}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
