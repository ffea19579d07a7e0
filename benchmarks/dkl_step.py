"""One deep-kernel-learning training step: rfgp (F = 1024) at N = 20 000 against GPyTorch's exact GP and SGPR.

Model: GPyTorch's DKL tutorial without the grid — an MLP d → 64 → 32 → 2 (ReLU), ``ScaleToBounds(-1, 1)``,
``ScaleKernel(RBFKernel(ard_num_dims=2))``, ``ConstantMean``, ``GaussianLikelihood``, ``ExactMarginalLogLikelihood``.
The kernel is the exact one (GPyTorch's default settings: CG/Lanczos above 800 points), ``rfgp.sketch(kernel, F)``,
or SGPR's ``InducingPointKernel`` with M inducing points in the network's 2-d output space.  Timed: ``zero_grad``,
the marginal likelihood, ``backward`` and an Adam step (after one untimed step), median and minimum of ``--repeats``.
x uniform on [0, 1]^d, y = sin(2π x₁)·cos(π x₂) + noise.  The exact GP runs at the N it can do on this host.

The host is shared (2 cores, other jobs running): one thread, and the table records ``os.getloadavg()``.

    python benchmarks/dkl_step.py      # writes results/dkl_step.md
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402


class DKL(gpytorch.models.ExactGP):
    def __init__(self, x, y, kernel):
        super().__init__(x, y, gpytorch.likelihoods.GaussianLikelihood())
        self.feature_extractor = torch.nn.Sequential(torch.nn.Linear(x.shape[-1], 64), torch.nn.ReLU(),
                                                     torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.scale_to_bounds = gpytorch.utils.grid.ScaleToBounds(-1.0, 1.0)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        z = self.scale_to_bounds(self.feature_extractor(x))
        return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))


def kernel_for(name: str, width: int, dtype: torch.dtype):
    exact = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    if name == "rfgp":
        return rfgp.sketch(exact, width, seed=0)
    if name == "sgpr":
        gen = torch.Generator().manual_seed(1)
        inducing = (torch.rand(width, 2, generator=gen) * 1.9 - 0.95).to(dtype)  # ScaleToBounds' range
        return gpytorch.kernels.InducingPointKernel(exact, inducing_points=inducing,
                                                    likelihood=gpytorch.likelihoods.GaussianLikelihood())
    return exact


def step_times(x, y, name, width, repeats):
    torch.manual_seed(0)
    model = DKL(x, y, kernel_for(name, width, x.dtype)).to(x.dtype)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    model.train()

    def step():
        optimizer.zero_grad()
        loss = -mll(model(x), y)
        loss.backward()
        optimizer.step()
        return loss

    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--d", type=int, default=8)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--inducing", type=int, default=512)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--exact-n", type=int, nargs="+", default=[2000, 5000])
    parser.add_argument("--n", type=int, nargs="+", default=[2000, 5000, 20000])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    runs = [(n, "exact", 0) for n in args.exact_n] + [(n, "sgpr", args.inducing) for n in args.n] + [
        (n, "rfgp", args.features) for n in args.n]
    for dtype in (torch.float32, torch.float64):
        for n, name, width in sorted(runs):
            gen = torch.Generator().manual_seed(0)
            x = torch.rand(n, args.d, generator=gen).to(dtype)
            y = (torch.sin(2 * torch.pi * x[:, 0]) * torch.cos(torch.pi * x[:, 1])
                 + 0.1 * torch.randn(n, generator=gen).to(dtype))
            median, best = step_times(x, y, name, width, args.repeats)
            label = {"exact": "GPyTorch exact", "sgpr": f"SGPR M = {width}", "rfgp": f"rfgp F = {width}"}[name]
            rows.append(f"| {str(dtype)[6:]} | {n} | {label} | {median:.3f} | {best:.3f} |")
            print(rows[-1], flush=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = "\n".join([
        "# Deep kernel learning: one training step (marginal likelihood, gradient, Adam)",
        "",
        f"MLP {args.d} → 64 → 32 → 2, ScaleToBounds, ScaleKernel(RBF); one thread, {args.repeats} repeats; the host "
        f"has 2 cores shared with other jobs (load average at the end: {load}). GPyTorch's exact GP (CG/Lanczos, "
        f"its default above 800 points) runs at N = {', '.join(map(str, args.exact_n))} only: at N = 20 000 its "
        "N × N kernel matrix alone takes 1.6 GB in float32, and its step grows as N² per CG iteration.",
        "",
        "| dtype | N | kernel | median s | min s |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])
    out = Path(__file__).resolve().parent / "results" / "dkl_step.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
