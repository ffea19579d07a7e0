"""Leave-one-out at feature-space cost: GPyTorch's ``LeaveOneOutPseudoLikelihood`` and BoTorch's ``loo_cv``.

Both take diag(K⁻¹) of the N × N noise-added covariance from a dense Cholesky factor (O(N³)) whatever the kernel;
for rfgp covariances K = ΦΦᵀ + D rfgp now forms it through the F × F capacitance
(:mod:`rfgp.inference.leave_one_out`, O(N·F² + F³)).  Measured, float64, RBF kernel on d = 4 inputs, F = 256
(random Fourier features), wall time, best of ``--repeats``:

* ``LOO-PLL step`` — one value and gradient of the pseudo-likelihood w.r.t. all hyperparameters (train mode);
* ``loo_cv`` — ``botorch.cross_validation.loo_cv`` of a ``SingleTaskGP`` (eval mode, no gradients);

each for ``rfgp`` (the new path), ``rfgp, dense`` (the same model through GPyTorch's / BoTorch's own dense
method: what happened before) and ``exact`` (the exact GP with GPyTorch's ``RBFKernel``).  The dense paths are run
up to ``--dense-max`` (loo_cv) and ``--dense-step-max`` (LOO-PLL step) points.
Results: ``benchmarks/results/leave_one_out.md``.
Run: ``python benchmarks/leave_one_out.py`` (≈ 15 min on 2 shared cores; the dense N = 10 000 loo_cv needs
≈ 3 GB; the dense LOO-PLL step, O(N³) with an N × N backward, is run up to ``--dense-step-max`` = 5000).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import botorch.cross_validation as cross_validation
import torch
from botorch.cross_validation import loo_cv
from botorch.models import SingleTaskGP
from gpytorch.kernels import RBFKernel, ScaleKernel
from gpytorch.mlls import LeaveOneOutPseudoLikelihood

import rfgp  # noqa: F401  (installs the leave-one-out hooks)
from rfgp.integrations import botorch_cross_validation
from rfgp.kernels import SketchedRBFKernel

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import UserGP  # noqa: E402  (the ExactGP a GPyTorch user writes)

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
F64 = torch.float64


def data(n: int, d: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=g, dtype=F64)
    y = torch.sin(4 * x).sum(-1) + 0.1 * torch.randn(n, generator=g, dtype=F64)
    return x, y


def kernel(exact: bool, num_features: int, d: int = 4):
    base = RBFKernel(ard_num_dims=d) if exact else SketchedRBFKernel(num_features, method="rff", seed=0,
                                                                      ard_num_dims=d)
    return ScaleKernel(base)


def best_time(function, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        function()
        times.append(time.perf_counter() - start)
    return min(times)


def pseudo_likelihood_step(n: int, variant: str, num_features: int, repeats: int) -> float:
    x, y = data(n)
    model = UserGP(x, y, kernel(variant == "exact", num_features)).double().train()
    mll = LeaveOneOutPseudoLikelihood(model.likelihood, model)
    forward = LeaveOneOutPseudoLikelihood.forward
    if variant == "rfgp, dense":
        forward = forward.gpytorch_forward

    def step():
        model.zero_grad()
        (-forward(mll, model(x), y)).backward()

    return best_time(step, repeats)


def cross_validation_time(n: int, variant: str, num_features: int, repeats: int) -> float:
    x, y = data(n)
    model = SingleTaskGP(x, y.unsqueeze(-1), covar_module=kernel(variant == "exact", num_features)).eval()
    helper = cross_validation._compute_loo_predictions
    if variant == "rfgp, dense":
        cross_validation._compute_loo_predictions = botorch_cross_validation._botorch_compute_loo_predictions
    try:
        with torch.no_grad():
            return best_time(lambda: loo_cv(model), repeats)
    finally:
        cross_validation._compute_loo_predictions = helper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 5000, 10000])
    parser.add_argument("--num-features", type=int, default=256)
    parser.add_argument("--dense-max", type=int, default=10000, help="largest N for the dense loo_cv")
    parser.add_argument("--dense-step-max", type=int, default=5000, help="largest N for the dense LOO-PLL step")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    variants = ("rfgp", "rfgp, dense", "exact")
    rows = []
    for n in args.sizes:
        for variant in variants:
            dense = variant != "rfgp"
            repeats = 1 if dense and n > 2000 else args.repeats
            step = cv = None
            if not dense or n <= args.dense_step_max:
                step = pseudo_likelihood_step(n, variant, args.num_features, repeats)
            if not dense or n <= args.dense_max:
                cv = cross_validation_time(n, variant, args.num_features, repeats)
            rows.append((n, variant, step, cv))
            print(f"N = {n:6d}  {variant:12s}  LOO-PLL step {step}  loo_cv {cv}", flush=True)
    lines = [
        f"# Leave-one-out: LOO-PLL training step and loo_cv (F = {args.num_features}, float64, "
        f"{args.threads} threads)",
        "",
        "`rfgp`: the feature-space path; `rfgp, dense`: the same model through GPyTorch's / BoTorch's dense method "
        "(before); `exact`: GPyTorch's RBFKernel.  Wall time, best of repeats (one repeat for dense N > 2000), "
        "on a shared 2-core machine (other jobs running: compare within a row group, not across runs).  "
        "Script: `benchmarks/leave_one_out.py`.  `not run`: dense paths above `--dense-max` (loo_cv) or "
        f"`--dense-step-max` = {args.dense_step_max} (the LOO-PLL step, O(N³) with an N × N backward).",
        "",
        "| N | variant | LOO-PLL step (s) | loo_cv (s) |",
        "|---:|---|---:|---:|",
    ]
    def fmt(seconds):
        return "not run" if seconds is None else f"{seconds:.3f}"

    for n, variant, step, cv in rows:
        lines.append(f"| {n} | {variant} | {fmt(step)} | {fmt(cv)} |")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "leave_one_out.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
