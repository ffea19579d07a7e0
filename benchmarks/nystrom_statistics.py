"""One Nyström −MLL + gradient: the triangular statistics' backward against autograd through the solve.

Synthetic data (x uniform in [0, 1]^d, y = Σ sin(6x) + noise), ``ScaleKernel(RBF, ARD)`` converted whole
by ``rfgp.sketch(..., method="nystrom")`` (the outputscale inside K and K(Z, Z)) and, second, the
outputscale outside (``ScaleKernel(NystromKernel(RBF))``), float32, 2 threads; third, the first
model with its statistics over chunks of ``--chunk-size`` rows.  "autograd" is the same model with the
dense root Φ (``NystromKernel.feature_root = featurize``) and FeatureKernel's featurizer: autograd
through the triangular solve and :mod:`rfgp.inference.linalg`'s (chunked) statistics.  The two are timed alternately in one
process (median of ``--repeats``), and both float32 gradients are compared with a float64 evaluation
of the same model: max over hyperparameters of |g32 − g64| / |g64|.

Run: ``python benchmarks/nystrom_statistics.py`` (writes benchmarks/results/nystrom_statistics.md).
Check ``uptime`` first: timings on a shared machine are only comparable at low load.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

import gpytorch
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import rfgp
from rfgp.kernels import FeatureKernel, NystromKernel
from rfgp.models.regression import ExactGPModel

FUSED_ROOT, FUSED_FEATURIZER = NystromKernel.feature_root, NystromKernel.featurizer


def problem(n, d, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=gen)
    y = torch.sin(6 * x).sum(-1) + 0.1 * torch.randn(n, generator=gen)
    return x.to(dtype), y.to(dtype)


def model_for(form, x, y, m):
    d = x.shape[-1]
    if form == "inside":
        kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d)), m,
                             method="nystrom", x_sample=x, seed=0)
    else:
        kernel = gpytorch.kernels.ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d), x[:m]))
    model = ExactGPModel(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(x.dtype)
    return model.train()


def step(model, x, y, path, chunk_size=None):
    fused = path == "triangular"
    NystromKernel.feature_root = FUSED_ROOT if fused else NystromKernel.featurize
    NystromKernel.featurizer = FUSED_FEATURIZER if fused else FeatureKernel.featurizer
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.perf_counter()
    with rfgp.settings.chunk_size(chunk_size):
        loss = -mll(model(x), y)
        grads = torch.autograd.grad(loss, params)
    return time.perf_counter() - start, loss.item(), torch.cat([g.reshape(-1).double() for g in grads])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=14016)
    parser.add_argument("--m", type=int, default=1024)
    parser.add_argument("--d", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--chunk-size", type=int, default=2048, help="rows per chunk of the chunked rows")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    rows = []
    for form, chunk_size in (("inside", None), ("outside", None), ("inside", args.chunk_size)):
        x, y = problem(args.n, args.d, torch.float32)
        model = model_for(form, x, y, args.m)
        reference = model_for(form, *problem(args.n, args.d, torch.float64), args.m)
        _, _, exact = step(reference, *problem(args.n, args.d, torch.float64), "autograd")
        times = {"autograd": [], "triangular": []}
        results = {path: step(model, x, y, path, chunk_size) for path in times}  # warm-up, values
        for _ in range(args.repeats):
            for path, samples in times.items():
                samples.append(step(model, x, y, path, chunk_size)[0])
        median = {path: statistics.median(t) for path, t in times.items()}
        error = {path: float(((results[path][2] - exact).abs() / exact.abs()).max()) for path in times}
        chunks = "" if chunk_size is None else f", chunks of {chunk_size}"
        rows.append(f"| {form}{chunks} | {median['autograd']:.3f} | {median['triangular']:.3f} | "
                    f"{median['autograd'] / median['triangular']:.2f} | "
                    f"{abs(results['triangular'][1] - results['autograd'][1]):.1e} | "
                    f"{error['autograd']:.1e} | {error['triangular']:.1e} |")
        print(rows[-1], flush=True)
    NystromKernel.feature_root, NystromKernel.featurizer = FUSED_ROOT, FUSED_FEATURIZER
    header = (
        f"# Nyström −MLL + gradient: triangular statistics vs autograd through the solve\n\n"
        f"N = {args.n}, M = {args.m}, d = {args.d}, float32, {args.threads} threads, median of {args.repeats}, "
        f"load average {load:.2f} at the start.  Error: max over hyperparameters of |g32 − g64|/|g64|.\n\n"
        "| outputscale | autograd (s) | triangular (s) | speed-up | |Δ loss| | error autograd | error triangular |\n"
        "|---|---|---|---|---|---|---|\n"
    )
    out = pathlib.Path(__file__).parent / "results" / "nystrom_statistics.md"
    out.write_text(header + "\n".join(rows) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
