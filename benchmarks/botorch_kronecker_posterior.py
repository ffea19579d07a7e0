"""BoTorch's KroneckerMultiTaskGP: exact vs its MultitaskKernel converted by ``rfgp.sketch`` (F data features), timed
alternately in one process on one thread.

Per model and repeat: ``posterior`` with cold caches (after ``train()``/``eval()``: BoTorch eigendecomposes the
training covariance's factors and solves for the mean cache), then a warm ``posterior`` of q = 8 points with 64
Matheron samples (an acquisition step's model work), then one marginal-likelihood step (loss + backward).
Writes ``benchmarks/results/botorch_kronecker_posterior.md`` with the machine load (``os.getloadavg()``).
"""

from __future__ import annotations

import os
import statistics
import time

import torch
from botorch.models import KroneckerMultiTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

import rfgp

NUM_DATA, DIM, WIDTH, REPEATS = 2000, 3, 256, 3


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def phases(model, x, test):
    mll = ExactMarginalLogLikelihood(model.likelihood, model)

    def cold():
        model.train()
        model.eval()
        with torch.no_grad():
            posterior = model.posterior(test)
            posterior.mean, posterior.variance

    def sample():
        with torch.no_grad():
            model.posterior(test).rsample(torch.Size([64]))

    def step():
        model.train()
        model.zero_grad()
        (-mll(model(x), model.train_targets)).backward()
        model.eval()

    return {"cold posterior": cold, "warm posterior + 64 samples": sample, "MLL + gradient": step}


def build(x, y, width):
    torch.manual_seed(0)
    model = KroneckerMultiTaskGP(x, y)
    with torch.no_grad():
        model.likelihood.task_noises = torch.linspace(0.01, 0.05, y.shape[-1], dtype=torch.float64)
        model.covar_module.data_covar_module.lengthscale = 0.3
    if width is not None:
        model.covar_module = rfgp.sketch(model.covar_module, width, seed=0)
    return model.eval()


def main():
    torch.set_num_threads(1)
    rows = []
    for num_tasks in (2, 4):
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(NUM_DATA, DIM, generator=generator, dtype=torch.float64)
        y = torch.stack([torch.sin((t + 2) * x[:, t % DIM]) for t in range(num_tasks)], -1)
        y = y + 0.1 * torch.randn(NUM_DATA, num_tasks, generator=generator, dtype=torch.float64)
        test = torch.rand(8, DIM, generator=generator, dtype=torch.float64)
        models = {"exact": phases(build(x, y, None), x, test), "rfgp": phases(build(x, y, WIDTH), x, test)}
        for phase in models["exact"]:
            times = {name: [] for name in models}
            for name in models:
                models[name][phase]()  # untimed warm-up
            for _ in range(REPEATS):
                for name in models:
                    times[name].append(timed(models[name][phase]))
            medians = {name: statistics.median(t) for name, t in times.items()}
            rows.append((num_tasks, phase, medians["exact"], medians["rfgp"], medians["exact"] / medians["rfgp"]))
            print(rows[-1], os.getloadavg(), flush=True)
    load = os.getloadavg()
    lines = [
        "# BoTorch KroneckerMultiTaskGP: exact vs rfgp.sketch of its MultitaskKernel",
        "",
        f"N = {NUM_DATA}, d = {DIM}, BoTorch's defaults (full-rank task covariance, per-task noise, Standardize), "
        f"F = {WIDTH} data features (root width F·2p), float64, one thread, median of {REPEATS} alternated runs "
        "after one untimed each. Cold posterior: caches cleared (train()/eval()), then posterior mean and variance of "
        "8 points; warm: posterior of 8 points and 64 Matheron samples with the training caches kept; MLL: one loss + "
        f"backward. Load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores).",
        "",
        "| tasks p | phase | exact (s) | rfgp (s) | speed-up |",
        "|---|---|---|---|---|",
        *[f"| {p} | {phase} | {e:.3f} | {r:.3f} | {s:.1f}× |" for p, phase, e, r, s in rows],
        "",
    ]
    path = os.path.join(os.path.dirname(__file__), "results", "botorch_kronecker_posterior.md")
    with open(path, "w") as handle:
        handle.write("\n".join(lines))


if __name__ == "__main__":
    main()
