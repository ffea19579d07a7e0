"""One SVGP ELBO-and-gradient step at N = 20 000, M = 64: exact kernel against rfgp at F = 256 and 1024.

GPyTorch's ``VariationalStrategy`` evaluates K(Z, x) and, by a separate kernel call with ``diag=True``, k̂(x, x).
Before the closed-form diagonal (:meth:`rfgp.features.FeatureMap.squared_norm`), an rfgp kernel featurised the
minibatch x for each of the two calls; with it, sin/cos maps featurise x once per step.

Model: GPyTorch's SVGP (``CholeskyVariationalDistribution``, learnt inducing points, ``GaussianLikelihood``,
``VariationalELBO``), ``ScaleKernel(RBFKernel(ard_num_dims=d))`` exact or ``rfgp.sketch``-ed (default method), x
uniform on [0, 1]^d, one thread.  Timed: ``zero_grad``, ELBO and ``backward`` (after one untimed step), the median and
minimum of ``--repeats`` repeats.  The table records ``os.getloadavg()`` (the host is shared).

    python benchmarks/svgp_step.py --label after     # writes results/svgp_step_after.md

``results/svgp_step_before.md`` is this script run with ``--label before`` in a checkout of the commit before the
closed-form diagonal (it imports the rfgp of the checkout it lies in).
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

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
from _models import UserSVGP  # noqa: E402  (GPyTorch's SVGP tutorial model)


def step_times(x, y, num_inducing, num_features, repeats):
    covar = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1]))
    if num_features:
        covar = rfgp.sketch(covar, num_features=num_features, seed=0)
    model = UserSVGP(covar, x[:num_inducing].clone()).to(x.dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(x.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    model.train()
    likelihood.train()

    def step():
        model.zero_grad()
        likelihood.zero_grad()
        (-mll(model(x), y)).backward()

    step()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return statistics.median(times), min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for dtype in (torch.float32, torch.float64):
        for d in args.dims:
            gen = torch.Generator().manual_seed(0)
            x = torch.rand(args.n, d, generator=gen).to(dtype)
            y = torch.randn(args.n, generator=gen).to(dtype)
            for num_features in (0, 256, 1024):
                median, best = step_times(x, y, args.m, num_features, args.repeats)
                name = "exact" if num_features == 0 else f"F = {num_features}"
                rows.append(f"| {str(dtype)[6:]} | {d} | {name} | {median:.3f} | {best:.3f} |")
                print(rows[-1], flush=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = "\n".join([
        f"# SVGP ELBO and gradient, {args.label}",
        "",
        f"N = {args.n}, M = {args.m}, one thread, {args.repeats} repeats; load average at the end: {load}",
        "",
        "| dtype | d | kernel | median s | min s |",
        "|---|---|---|---|---|",
        *rows,
        "",
    ])
    out = Path(__file__).resolve().parent / "results" / f"svgp_step_{args.label}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
