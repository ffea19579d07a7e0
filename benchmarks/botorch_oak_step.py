"""BoTorch's OrthogonalAdditiveKernel in a SingleTaskGP: one marginal-likelihood step (loss + backward), exact vs
``rfgp.sketch`` (G features per component), timed alternately in one process on one thread.

Writes ``benchmarks/results/botorch_oak_step.md`` with the machine load (``os.getloadavg()``).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from botorch.models import SingleTaskGP
from botorch.models.kernels.orthogonal_additive_kernel import OrthogonalAdditiveKernel
from gpytorch.mlls import ExactMarginalLogLikelihood

import rfgp

DIM, WIDTH, REPEATS = 4, 64, 3
COMPONENTS = DIM + DIM * (DIM - 1) // 2


def step_timer(model):
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()

    def step():
        model.zero_grad()
        start = time.perf_counter()
        (-mll(model(*model.train_inputs), model.train_targets)).backward()
        return time.perf_counter() - start

    return step


def main():
    torch.set_num_threads(1)
    rows = []
    for n in (1000, 3000):
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(n, DIM, generator=generator, dtype=torch.float64)
        y = torch.sin(5 * x[:, :1]) + x[:, 1:2] * x[:, 2:3] + 0.1 * torch.randn(n, 1, generator=generator,
                                                                                  dtype=torch.float64)
        exact = OrthogonalAdditiveKernel(dim=DIM, second_order=True, dtype=torch.float64)
        steps = {"exact": step_timer(SingleTaskGP(x, y, covar_module=exact)),
                 "rfgp": step_timer(SingleTaskGP(x, y, covar_module=rfgp.sketch(exact, 1 + COMPONENTS * WIDTH,
                                                                                 seed=0)))}
        times = {name: [] for name in steps}
        for name, step in steps.items():
            step()  # untimed warm-up
        for _ in range(REPEATS):
            for name, step in steps.items():
                times[name].append(step())
        medians = {name: statistics.median(t) for name, t in times.items()}
        rows.append((n, medians["exact"], medians["rfgp"], medians["exact"] / medians["rfgp"]))
        print(rows[-1], flush=True)
    load = os.getloadavg()
    lines = [
        "# BoTorch OrthogonalAdditiveKernel: one marginal-likelihood step, exact vs rfgp.sketch",
        "",
        f"SingleTaskGP, d = {DIM} with second-order terms ({COMPONENTS} components), G = {WIDTH} features per "
        f"component (F = {1 + COMPONENTS * WIDTH}), float64, one thread, loss + backward, median of {REPEATS} "
        f"alternated steps after one untimed each. Load average at the end: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f}.",
        "",
        "| N | exact (s) | rfgp (s) | speed-up |",
        "|---|---|---|---|",
        *[f"| {n} | {e:.3f} | {r:.3f} | {s:.1f}× |" for n, e, r, s in rows],
        "",
    ]
    path = os.path.join(os.path.dirname(__file__), "results", "botorch_oak_step.md")
    with open(path, "w") as handle:
        handle.write("\n".join(lines))


if __name__ == "__main__":
    main()
