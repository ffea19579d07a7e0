"""TuRBO's Thompson batch with an rfgp kernel against the exact GP.

BoTorch's TuRBO-1 tutorial model — SingleTaskGP with ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d,
lengthscale_constraint=Interval(0.005, 4.0))) and noise in [1e-8, 1e-3] — on N training points in d = 6, converted
with ``rfgp.sketch(model.covar_module, num_features=F)`` (random Fourier features of the Matérn-5/2 spectral density).
One Thompson batch is the tutorial's step: C Sobol candidates in the trust region around the best point with its
perturbation masks, then ``MaxPosteriorSampling(model, replacement=False)(X_cand, num_samples=q)``, which draws one
joint posterior sample at all C candidates.  The exact GP factorises the N × N training covariance and the dense
C × C posterior covariance (O(N³ + C³)); rfgp draws R·ε from the C × F posterior root (O(N·F² + C·F)).  Times are the
best of ``--repeats``, each on a fresh model copy (prediction caches built inside the timing, as in a TuRBO
iteration), fixed hyperparameters (no fit), float64, one CPU thread.  The largest matrix handed to a Cholesky
factorisation is recorded.

    python benchmarks/turbo_thompson.py                  # N = 1000, 5000; C = 5000; F = 256, 1024; writes results
    python benchmarks/turbo_thompson.py --num-train 1000 --candidates 2000 --repeats 1 --no-write
"""

from __future__ import annotations

import argparse
import copy
import os
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
D = 6


def _load() -> str:
    return " / ".join(f"{value:.1f}" for value in os.getloadavg())


def run(num_train: int, num_candidates: int, widths: list[int], batch: int, repeats: int, exact: bool) -> list[dict]:
    import gpytorch
    import torch
    from botorch.generation.sampling import MaxPosteriorSampling
    from botorch.models import SingleTaskGP
    from gpytorch.constraints import Interval
    from gpytorch.kernels import MaternKernel, ScaleKernel
    from gpytorch.likelihoods import GaussianLikelihood
    from torch.quasirandom import SobolEngine

    import rfgp

    generator = torch.Generator().manual_seed(0)
    X = torch.rand(num_train, D, generator=generator, dtype=torch.float64)
    Y = -((X - 0.3) ** 2).sum(-1, keepdim=True) + 0.1 * torch.sin(9 * X).sum(-1, keepdim=True)
    Y = (Y - Y.mean()) / Y.std()
    kernel = ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=D, lengthscale_constraint=Interval(0.005, 4.0)))
    likelihood = GaussianLikelihood(noise_constraint=Interval(1e-8, 1e-3))
    model = SingleTaskGP(X, Y, covar_module=kernel, likelihood=likelihood)
    model.covar_module.base_kernel.lengthscale = torch.linspace(0.3, 1.0, D, dtype=torch.float64)
    model.likelihood.noise = 1e-4
    model.eval()

    # the tutorial's candidates: trust region of side 0.8 (scaled by the lengthscales) around the best point
    center = X[Y.argmax()]
    weights = model.covar_module.base_kernel.lengthscale.squeeze().detach()
    weights = weights / weights.mean() / torch.prod(weights / weights.mean()).pow(1.0 / D)
    lower, upper = (center - 0.4 * weights).clamp(0, 1), (center + 0.4 * weights).clamp(0, 1)
    perturbed = lower + (upper - lower) * SobolEngine(D, scramble=True, seed=0).draw(num_candidates).double()
    mask = torch.rand(num_candidates, D, generator=generator, dtype=torch.float64) <= min(20.0 / D, 1.0)
    mask[mask.sum(-1) == 0, 0] = True
    candidates = center.expand(num_candidates, D).clone()
    candidates[mask] = perturbed[mask]

    sizes = []
    originals = {name: getattr(torch.linalg, name) for name in ("cholesky", "cholesky_ex")}

    def spying(name):
        def spy(matrix, *args, **kwargs):
            sizes.append(matrix.shape[-1])
            return originals[name](matrix, *args, **kwargs)
        return spy

    models = [(f"rfgp F = {width}", width) for width in widths] + ([("exact GP", None)] if exact else [])
    rows = []
    for label, width in models:
        def thompson_batch():
            fresh = copy.deepcopy(model)
            if width is not None:
                fresh.covar_module = rfgp.sketch(fresh.covar_module, num_features=width, seed=0)
            fresh.eval()
            with torch.no_grad(), gpytorch.settings.max_cholesky_size(float("inf")):  # as the tutorial
                return MaxPosteriorSampling(fresh, replacement=False)(candidates, num_samples=batch)

        best = float("inf")
        for name in originals:
            setattr(torch.linalg, name, spying(name))
        try:
            for _ in range(repeats):
                sizes.clear()
                torch.manual_seed(0)
                start = time.perf_counter()
                chosen = thompson_batch()
                best = min(best, time.perf_counter() - start)
        finally:
            for name, original in originals.items():
                setattr(torch.linalg, name, original)
        assert chosen.shape == (batch, D)
        rows.append({"N": num_train, "C": num_candidates, "model": label, "seconds": best,
                     "largest": max(sizes) if sizes else 0, "load": _load()})
        print(f"N = {num_train:5d}  C = {num_candidates}  {label:14s} {best:8.3f} s  largest factorised "
              f"{rows[-1]['largest']}  load {rows[-1]['load']}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-train", type=int, nargs="+", default=[1000, 5000])
    parser.add_argument("--candidates", type=int, default=5000)
    parser.add_argument("--features", type=int, nargs="+", default=[256, 1024])
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--no-exact", action="store_true")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    start_load = _load()
    rows = [row for n in args.num_train
            for row in run(n, args.candidates, args.features, args.batch, args.repeats, not args.no_exact)]
    if args.no_write:
        return
    lines = ["# TuRBO Thompson batch with rfgp (`benchmarks/turbo_thompson.py`)", "",
             f"One Thompson batch of q = {args.batch} (`MaxPosteriorSampling(model, replacement=False)`) over C Sobol "
             "trust-region candidates, the TuRBO tutorial's Matérn-5/2 model in d = 6 at fixed hyperparameters, "
             f"caches built inside the timing; one CPU thread, float64, best of {args.repeats}.  The machine's 2 cores "
             "are shared with other jobs: the load average (1 / 5 / 15 min) is recorded per row (at the start: "
             f"{start_load}); compare rows of one run.", "",
             "| N | C | model | seconds | largest factorised | load |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['N']} | {r['C']} | {r['model']} | {r['seconds']:.3f} | {r['largest']} | {r['load']} |"
              for r in rows]
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "turbo_thompson.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
