"""Peak memory of a batch of B independent GPs under ``rfgp.settings.memory_budget``.

GPyTorch's batch GP regression (``batch_shape=[B]`` on the constant mean, ``ScaleKernel(SketchedRBFKernel(F))`` and
the Gaussian likelihood; train_x ``(B, N, d)``), float64, N = 1000 points per member, d = 2.  Each case runs in a fresh
process with ``MALLOC_MMAP_THRESHOLD_=65536`` (large blocks returned on free: the live working set, not glibc's heap):
one MLL + gradient, or one posterior (mean and variance at 100 test points, caches built), after a warm-up on a tiny
model that loads torch's kernels.  Reported: the growth of the peak resident memory (``getrusage`` maxrss) over the
resident memory before the evaluation, and the same in units of one (B, F, F) float64 matrix.

    python benchmarks/batch_memory.py     # writes results/batch_memory.md
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).parent / "results" / "batch_memory.md"
POINTS, DIM, TEST = 1000, 2, 100


def rss_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def case(members: int, features: int, budget_mib: int, what: str) -> dict:
    import warnings

    import gpytorch
    import torch

    import rfgp

    torch.set_num_threads(1)

    class BatchGP(gpytorch.models.ExactGP):
        def __init__(self, x, y, covar_module):
            super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=y.shape[:-1]))
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=y.shape[:-1])
            self.covar_module = covar_module

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    def build(b, n, f):
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(b, n, DIM, generator=gen, dtype=torch.float64)
        y = torch.sin(6 * x[..., 0]) + 0.1 * torch.randn(b, n, generator=gen, dtype=torch.float64)
        kernel = gpytorch.kernels.ScaleKernel(
            rfgp.kernels.SketchedRBFKernel(f, seed=0, batch_shape=torch.Size([b])), batch_shape=torch.Size([b]))
        return BatchGP(x, y, kernel).double(), x, y

    def run(model, x, y, test):
        if what == "mll":
            model.train()
            mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
            (-mll(model(x), y).sum()).backward()
        else:
            model.eval()
            with torch.no_grad():
                prediction = model(test)
                prediction.mean, prediction.variance

    warnings.simplefilter("ignore")
    small, sx, sy = build(2, 20, 8)
    run(small, sx, sy, sx[:, :3])
    model, x, y = build(members, POINTS, features)
    test = torch.rand(TEST, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    with rfgp.settings.memory_budget(budget_mib * 2**20):
        before = rss_mib()
        run(model, x, y, test)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    statistics_mib = members * features**2 * 8 / 2**20
    return {"B": members, "F": features, "budget_mib": budget_mib, "what": what, "growth_mib": round(peak - before, 1),
            "bff_mib": round(statistics_mib, 1), "copies": round((peak - before) / statistics_mib, 1)}


def main() -> None:
    if len(sys.argv) == 5:
        print(json.dumps(case(int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4])))
        return
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    rows = []
    for what in ("mll", "posterior"):
        for members in (1, 10, 100):
            for features in (128, 256, 512):
                for budget in (4, 16, 64):
                    out = subprocess.run([sys.executable, __file__, str(members), str(features), str(budget), what],
                                         env=env, capture_output=True, text=True, check=True).stdout
                    rows.append(json.loads(out.strip().splitlines()[-1]))
                    print(rows[-1], flush=True)
    write_results(rows)


def write_results(rows: list[dict]) -> None:
    lines = ["# " + __doc__.splitlines()[0], "", "`python benchmarks/batch_memory.py`: "
             + " ".join(__doc__.split("\n\n")[1].split()), "",
             "| evaluation | B | F | budget (MiB) | peak growth (MiB) | one (B, F, F) (MiB) | growth / (B, F, F) |",
             "|---|---|---|---|---|---|---|"]
    lines += [f"| {r['what']} | {r['B']} | {r['F']} | {r['budget_mib']} | {r['growth_mib']} | {r['bff_mib']} | "
              f"{r['copies']} |" for r in rows]
    widest = max(r["B"] for r in rows)
    for what in ("mll", "posterior"):
        copies = [r["copies"] for r in rows if r["B"] == widest and r["what"] == what and r["budget_mib"] <= 16]
        lines.append(f"\nAt B = {widest} under budgets of at most 16 MiB, {what}: {min(copies)}–{max(copies)} "
                     "(B, F, F) matrices, the chunks included.")
    RESULTS.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
