"""The share of an SVGP step that one featurisation of the inducing points Z costs (forward and backward).

GPyTorch's ``VariationalStrategy`` evaluates K(Z, Z) and K(Z, x) as two slices of its lazily evaluated kernel tensor,
by separate kernel calls, so an rfgp kernel featurises Z twice per step.  This script measures what a cache of Φ(Z)
across the two calls could save at most: the time of Φ(Z) forward and backward against the whole ELBO step
(``ScaleKernel(RBFKernel(ard_num_dims=d))`` sketched at F features, x uniform on [0, 1]^d, one thread, medians of
``--repeats``).

    python benchmarks/svgp_inducing_share.py       # writes results/svgp_inducing_share.md
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

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import UserSVGP  # noqa: E402  (GPyTorch's SVGP tutorial model)


def median_seconds(function, repeats):
    function()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def shares(n, m, num_features, d, repeats):
    gen = torch.Generator().manual_seed(0)
    x, y = torch.rand(n, d, generator=gen), torch.randn(n, generator=gen)
    covar = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))
    covar = rfgp.sketch(covar, num_features=num_features, seed=0)
    model = UserSVGP(covar, torch.rand(m, d, generator=gen))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=10 * n)
    model.train()
    likelihood.train()
    inducing = model.variational_strategy.inducing_points

    def step():
        model.zero_grad()
        likelihood.zero_grad()
        (-mll(model(x), y)).backward()

    def featurise_inducing_points():
        model.zero_grad()
        covar.base_kernel.featurize(inducing).sum().backward()

    return median_seconds(step, repeats), median_seconds(featurise_inducing_points, repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for n, m, num_features, d in [(1024, 512, 1024, 8), (1024, 128, 1024, 8), (256, 512, 1024, 8)]:
        step, inducing = shares(n, m, num_features, d, args.repeats)
        rows.append(f"| {n} | {m} | {num_features} | {d} | {step:.4f} | {inducing:.4f} | {100 * inducing / step:.1f} |")
        print(rows[-1], flush=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = "\n".join([
        "# One featurisation of the inducing points against an SVGP step (float32)",
        "",
        f"One thread, medians of {args.repeats} repeats; load average at the end: {load}",
        "",
        "| minibatch n | M | F | d | step s | Φ(Z) forward + backward s | share % |",
        "|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    (Path(__file__).resolve().parent / "results" / "svgp_inducing_share.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
