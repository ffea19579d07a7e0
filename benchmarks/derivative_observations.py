"""GP regression with derivative observations: exact ``RBFKernelGrad`` vs rfgp's sketched kernel.

Test function: Franke's function on [0, 1]² (the function of GPyTorch's "GP regression with
derivative information" example); every training point observes f and ∇f (d + 1 = 3 values)
with Gaussian noise σ = 0.05.  Model: GPyTorch's example model (``ConstantMeanGrad``,
``ScaleKernel(RBFKernelGrad(ard_num_dims=2))``, ``MultitaskGaussianLikelihood(num_tasks=3)``,
``ExactMarginalLogLikelihood``), and the same model with ``rfgp.sketch(kernel, F, method="orf")``.

Hyperparameters are fitted once with the exact GP on a 200-point subset and copied into every
model, so the rows compare the cost and the accuracy of the covariance alone: for each N,
``iteration`` is the median time of one MLL + gradient evaluation; ``predict`` conditions the
model (Woodbury cache / Cholesky) and predicts 1000 test points; RMSE of f and of ∇f against
the noise-free truth.  The exact GP uses a dense Cholesky (``max_cholesky_size`` raised: CG on
the derivative Gram converges slowly) and stops once its next iteration, extrapolated as O(n³)
from the last one, would exceed ``--exact-limit`` seconds, or its n(d + 1) × n(d + 1) Gram would
exceed ``--exact-memory`` bytes; the rows say so.

Run: ``python benchmarks/derivative_observations.py`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float64
NOISE = 0.05


def franke(x: torch.Tensor) -> torch.Tensor:
    """Franke's function and its gradient, columns [f, ∂₁f, ∂₂f]."""
    x = x.detach().requires_grad_(True)
    a, b = 9 * x[:, 0], 9 * x[:, 1]
    f = (0.75 * torch.exp(-((a - 2) ** 2 + (b - 2) ** 2) / 4) + 0.75 * torch.exp(-((a + 1) ** 2) / 49 - (b + 1) / 10)
         + 0.5 * torch.exp(-((a - 7) ** 2 + (b - 3) ** 2) / 4) - 0.2 * torch.exp(-((a - 4) ** 2) - (b - 7) ** 2))
    (grad,) = torch.autograd.grad(f.sum(), x)
    return torch.cat((f.detach().unsqueeze(-1), grad), dim=-1)


def data(n: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 2, generator=generator, dtype=DTYPE)
    return x, franke(x) + NOISE * torch.randn(n, 3, generator=generator, dtype=DTYPE)


class GradientGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMeanGrad()
        self.covar_module = gpytorch.kernels.ScaleKernel(kernel)

    def forward(self, x):
        return gpytorch.distributions.MultitaskMultivariateNormal(self.mean_module(x), self.covar_module(x))


def exact_model(x, y):
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=3)
    return GradientGP(x, y, likelihood, gpytorch.kernels.RBFKernelGrad(ard_num_dims=2)).to(DTYPE)


def fit_hyperparameters(iterations: int):
    x, y = data(200, seed=1)
    model = exact_model(x, y)
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    for _ in range(iterations):
        optimizer.zero_grad()
        (-mll(model(x), y)).backward()
        optimizer.step()
    return model.state_dict()


def build(method: str, x, y, state, num_features: int):
    model = exact_model(x, y)
    model.load_state_dict(state)
    if method != "exact":
        model.covar_module = rfgp.sketch(model.covar_module, num_features, method="orf", seed=0)
    return model


def time_iterations(model, x, y, repeats: int) -> float:
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    times = []
    for _ in range(repeats):
        model.zero_grad()
        start = time.perf_counter()
        (-mll(model(x), y)).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def evaluate(model, test_x, truth):
    model.eval()
    start = time.perf_counter()
    with torch.no_grad():
        mean = model(test_x).mean
    elapsed = time.perf_counter() - start
    error = (mean - truth).pow(2)
    return elapsed, error[:, 0].mean().sqrt().item(), error[:, 1:].mean().sqrt().item()


def run(sizes, num_features, repeats, exact_limit, exact_memory, hyper_iterations, report):
    """The benchmark rows; ``report(rows)`` is called after every row (partial results survive a kill)."""
    state = fit_hyperparameters(hyper_iterations)
    test_x = torch.rand(1000, 2, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    truth = franke(test_x)
    rows, exact_stopped = [], None
    for index, n in enumerate(sizes):
        x, y = data(n, seed=0)
        methods = ["exact"] + [f"rfgp-orf-F{f}" for f in num_features]
        for method in methods:
            row = {"n": n, "observations": 3 * n, "method": method, "status": "ok", "load_1min": os.getloadavg()[0]}
            gram_bytes = (3 * n) ** 2 * 8
            if method == "exact" and exact_stopped is None and gram_bytes > exact_memory:
                exact_stopped = f"not run from N = {n}: its {3 * n}² Gram needs {gram_bytes / 2**30:.1f} GiB per copy"
            if method == "exact" and exact_stopped is not None:
                rows.append({**row, "status": exact_stopped, "iteration_s": float("nan"), "predict_s": float("nan"),
                             "rmse_f": float("nan"), "rmse_grad": float("nan")})
                report(rows)
                continue
            model = build(method, x, y, state, int(method.split("F")[-1]) if method != "exact" else 0)
            with gpytorch.settings.max_cholesky_size(10**9), rfgp.settings.memory_budget(16 * 2**30):
                row["iteration_s"] = time_iterations(model, x, y, repeats)
                row["predict_s"], row["rmse_f"], row["rmse_grad"] = evaluate(model, test_x, truth)
            if method == "exact" and index + 1 < len(sizes):
                predicted = row["iteration_s"] * (sizes[index + 1] / n) ** 3
                if predicted > exact_limit:
                    exact_stopped = (f"stopped after N = {n} ({row['iteration_s']:.0f} s/iteration): O(n³) predicts "
                                     f"{predicted:.0f} s > {exact_limit:.0f} s per iteration")
            rows.append(row)
            report(rows)
            print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    return rows


def write(rows, header: str, stem: str):
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_csv(RESULTS / f"{stem}.csv", rows)
    lines = [header, "", "| N | observations N(d+1) | method | MLL+grad per iteration (s) | predict 1000 (s) | "
             "RMSE f | RMSE ∇f | load (1 min) | status |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['n']} | {r['observations']} | {r['method']} | {r['iteration_s']:.3g} | {r['predict_s']:.3g} | "
                     f"{r['rmse_f']:.4f} | {r['rmse_grad']:.4f} | {r['load_1min']:.1f} | {r['status']} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for method in dict.fromkeys(r["method"] for r in rows):
        sel = [r for r in rows if r["method"] == method and r["status"] == "ok"]
        axes[0].plot([r["observations"] for r in sel], [r["iteration_s"] for r in sel], "o-", label=method)
        axes[1].plot([r["observations"] for r in sel], [r["rmse_grad"] for r in sel], "o-", label=method)
    axes[0].set(xscale="log", yscale="log", xlabel="observations N(d + 1)", ylabel="MLL + gradient (s)")
    axes[1].set(xscale="log", yscale="log", xlabel="observations N(d + 1)", ylabel="test RMSE of ∇f")
    axes[0].legend(fontsize=8)
    fig.suptitle("Franke function with gradient observations: exact RBFKernelGrad vs rfgp")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--exact-limit", type=float, default=120.0,
                        help="stop the exact GP when its next iteration is predicted to take longer (s)")
    parser.add_argument("--exact-memory", type=float, default=2**30, help="largest exact Gram in bytes")
    args = parser.parse_args()
    if args.quick:
        sizes, num_features, repeats, hyper = [100, 300], [256], 2, 10
    else:
        sizes, num_features, repeats, hyper = [100, 300, 1000, 3000, 10000], [512, 1024], 2, 50
    header = (
        f"# Derivative observations ({'quick' if args.quick else 'full'} run): Franke function, d = 2, f and ∇f "
        f"observed (σ = {NOISE}); exact GPyTorch RBFKernelGrad vs rfgp.sketch(..., method='orf'); hyperparameters "
        f"fitted once ({hyper} Adam steps, exact GP, 200 points) and shared; median of {repeats} MLL + gradient "
        f"evaluations; 1000 test points. CPU float64, torch threads = {torch.get_num_threads()}, machine shared "
        "with other jobs (load column: 1-minute load average when the row started)."
    )
    stem = "derivative_observations_quick" if args.quick else "derivative_observations"
    run(sizes, num_features, repeats, args.exact_limit, args.exact_memory, hyper, lambda rows: write(rows, header, stem))


if __name__ == "__main__":
    main()
