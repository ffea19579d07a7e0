"""Many independent GPs in one batched model: cost per step against the exact batched GP, and how far
``rfgp.fit_mll`` on the summed loss leaves each member from the optimum it reaches alone.

GPyTorch's "Batch GP regression" recipe: ``batch_shape=[B]`` on the constant mean, the ``ScaleKernel(RBFKernel)`` and
the Gaussian likelihood, train_x ``(B, N, d)``, train_y ``(B, N)``; the rfgp model converts the kernel with
``rfgp.sketch``.  Members differ in frequency (0.5–8) and amplitude (targets standardised per member).

1. Speed: one MLL + gradient and one posterior (mean and variance at 20 points, caches rebuilt) of the exact batched
   GP and of the rfgp one, one thread, float64, median of alternated repeats after an untimed call.
2. Training: every member fitted alone by ``rfgp.fit_mll`` (its optimum f_b*), then the batch by ``rfgp.fit_mll``
   with the default ``num_iterations=100``, trained on with further calls (L-BFGS, then Adam from the start); per
   member the gap f_b − f_b* of its loss per data point, and the members that ``fit_mll``'s warning names
   (gradient above their stationary bound); then one long fit_mll call, one with ``optimizer="member_lbfgs"``, and
   BoTorch's ``fit_gpytorch_mll`` (scipy's
   L-BFGS-B on the summed loss) where BoTorch is installed.

    python benchmarks/batch_members.py            # speed at B = 1000, N = 50; training at B = 50, N = 50
    python benchmarks/batch_members.py --quick    # writes results/batch_members_quick.md, not the full run's table
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import warnings
from pathlib import Path

import gpytorch
import torch

import rfgp

RESULTS = Path(__file__).parent / "results"
LONG_FIT = 2000  # iterations of the one long fit_mll call
F64 = torch.float64


class BatchGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, covar_module):
        batch = y.shape[:-1]
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood(batch_shape=batch))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = covar_module

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def data(num_members: int, num_points: int, dim: int):
    gen = torch.Generator().manual_seed(1)
    x = torch.rand(num_members, num_points, dim, generator=gen, dtype=F64)
    freq = torch.linspace(0.5, 8, num_members, dtype=F64).view(-1, 1)
    amp = torch.logspace(-1, 1, num_members, dtype=F64).view(-1, 1)
    y = amp * torch.sin(freq * x[..., 0]) * torch.cos(freq * x[..., -1] / 2)
    y = y + 0.05 * amp * torch.randn(num_members, num_points, generator=gen, dtype=F64)
    return x, (y - y.mean(-1, keepdim=True)) / y.std(-1, keepdim=True)


def model(x, y, num_features: int | None):
    batch = y.shape[:-1]
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch, ard_num_dims=x.shape[-1]),
                                         batch_shape=batch)
    return BatchGP(x, y, exact if num_features is None else rfgp.sketch(exact, num_features, seed=0)).double()


def mll_step(m) -> None:
    m.train()
    m.zero_grad()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(m.likelihood, m)
    (-mll(m(*m.train_inputs), m.train_targets).sum()).backward()


def posterior(m, x_test) -> None:
    m.train()
    m.eval()  # drops the caches: they are rebuilt, as after a training step
    with torch.no_grad():
        prediction = m(x_test)
        prediction.mean, prediction.variance


def speed(num_members: int, num_points: int, dim: int, num_features: int, repeats: int) -> list[tuple]:
    x, y = data(num_members, num_points, dim)
    x_test = torch.rand(20, dim, generator=torch.Generator().manual_seed(2), dtype=F64)
    models = {"exact GPyTorch": model(x, y, None), f"rfgp, F = {num_features}": model(x, y, num_features)}
    times = {(name, what): [] for name in models for what in ("MLL + gradient", "posterior")}
    for name, m in models.items():
        mll_step(m)
        posterior(m, x_test)
    for _ in range(repeats):
        for name, m in models.items():
            for what, run in (("MLL + gradient", lambda: mll_step(m)), ("posterior", lambda: posterior(m, x_test))):
                start = time.perf_counter()
                run()
                times[name, what].append(time.perf_counter() - start)
    return [(name, what, statistics.median(values)) for (name, what), values in times.items()]


def member_losses(m) -> torch.Tensor:
    m.train()
    with torch.no_grad():
        return -gpytorch.mlls.ExactMarginalLogLikelihood(m.likelihood, m)(m(*m.train_inputs), m.train_targets)


def training(num_members: int, num_points: int, dim: int, num_features: int, calls: int) -> tuple[dict, list[tuple]]:
    x, y = data(num_members, num_points, dim)
    alone, iterations, start = [], [], time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for b in range(num_members):
            history = rfgp.fit_mll(model(x[b], y[b], num_features))
            alone.append(history.losses[-1])
            iterations.append(history.num_iterations)
    separate = {"seconds": time.perf_counter() - start, "median iterations": statistics.median(iterations),
                "max iterations": max(iterations), "converged": None}
    optimum = torch.tensor(alone, dtype=F64)
    rows = []
    for optimizer in ("lbfgs", "adam"):
        batch = model(x, y, num_features)
        total, seconds = 0, 0.0
        for _ in range(calls):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                start = time.perf_counter()
                history = rfgp.fit_mll(batch, optimizer=optimizer)
                seconds += time.perf_counter() - start
            total += history.num_iterations
            named = [str(w.message).split(" of ")[0].split(": ")[-1] for w in caught
                     if "batch members" in str(w.message)]
            rows.append((optimizer, *_gaps(batch, optimum, total, seconds), named[0] if named else "0",
                         history.stop_reason.split(":")[0]))
    batch = model(x, y, num_features)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        history = rfgp.fit_mll(batch, num_iterations=LONG_FIT)
        seconds = time.perf_counter() - start
    named = [str(w.message).split(" of ")[0].split(": ")[-1] for w in caught if "batch members" in str(w.message)]
    rows.append(("lbfgs, one call", *_gaps(batch, optimum, history.num_iterations, seconds),
                 named[0] if named else "0", history.stop_reason.split(":")[0]))
    batch = model(x, y, num_features)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        start = time.perf_counter()
        history = rfgp.fit_mll(batch, optimizer="member_lbfgs", num_iterations=LONG_FIT)
        seconds = time.perf_counter() - start
    named = [str(w.message).split(" of ")[0].split(": ")[-1] for w in caught if "batch members" in str(w.message)]
    rows.append(("member_lbfgs, one call", *_gaps(batch, optimum, history.num_iterations, seconds),
                 named[0] if named else "0", history.stop_reason.split(":")[0]))
    try:
        from botorch.fit import fit_gpytorch_mll
        from botorch.models.gpytorch import GPyTorchModel
    except ImportError:
        return separate, rows

    class BoTorchBatchGP(BatchGP, GPyTorchModel):
        _num_outputs = 1

    batch = BoTorchBatchGP(x, y, model(x, y, num_features).covar_module).double()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        start = time.perf_counter()
        fit_gpytorch_mll(gpytorch.mlls.ExactMarginalLogLikelihood(batch.likelihood, batch))
        seconds = time.perf_counter() - start
    rows.append(("BoTorch fit_gpytorch_mll (scipy L-BFGS-B)", *_gaps(batch, optimum, "—", seconds), "—", "—"))
    return separate, rows


def _gaps(batch, optimum, iterations, seconds) -> tuple:
    gap = member_losses(batch) - optimum
    return (iterations, seconds, float(gap.max()), float(gap.mean()), int((gap > 1e-2).sum()),
            int((gap > 1e-3).sum()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes (smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    speed_case = (50, 50, 2, 64, 1) if args.quick else (1000, 50, 2, 64, 3)
    training_case = (8, 30, 2, 64, 2) if args.quick else (50, 50, 2, 64, 5)
    load_before = os.getloadavg()
    timings = speed(*speed_case)
    separate, rows = training(*training_case)
    b, n, d, f, repeats = speed_case
    tb, tn, td, tf, calls = training_case
    lines = [
        "# Many independent GPs in one batched model",
        "",
        f"`python benchmarks/batch_members.py{' --quick' if args.quick else ''}`: float64, one thread. Load average "
        f"(1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} logical CPUs.",
        "",
        f"## Cost per step: B = {b} GPs of N = {n} points, d = {d}",
        "",
        f"Median of {repeats} alternated repeats; the posterior is the mean and variance at 20 test points with the "
        "caches rebuilt.",
        "",
        "| model | what | seconds |",
        "|---|---|---|",
        *(f"| {name} | {what} | {seconds:.3f} |" for name, what, seconds in timings),
        "",
        f"## Training: B = {tb} GPs of N = {tn} points, d = {td}, F = {tf}",
        "",
        f"Each member alone (`rfgp.fit_mll`, defaults): {separate['seconds']:.1f} s in all, "
        f"{separate['median iterations']:g} iterations (median), at most {separate['max iterations']}. The batch: "
        f"`rfgp.fit_mll(model)` (defaults: `num_iterations=100`, L-BFGS, `history_size=10`; or `optimizer=\"adam\"`, "
        f"lr = 0.05) called {calls} times in a row; then L-BFGS and `optimizer=\"member_lbfgs\"` in one call of "
        f"up to {LONG_FIT} iterations each, and BoTorch's `fit_gpytorch_mll` on the same batch (a `GPyTorchModel`). "
        "Gap: a member's loss per data point "
        "minus the one it reached alone.",
        "",
        "| optimiser | iterations | seconds | largest gap | mean gap | members > 1e-2 | members > 1e-3 "
        "| members the warning names | stop |",
        "|---|---|---|---|---|---|---|---|---|",
        *(f"| {opt} | {it} | {s:.1f} | {mx:.3g} | {mean:.3g} | {c2} | {c3} | {named} | {stop} |"
          for opt, it, s, mx, mean, c2, c3, named, stop in rows),
        "",
    ]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"batch_members{'_quick' if args.quick else ''}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
