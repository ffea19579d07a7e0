"""Pathwise (Matheron) sampling through BoTorch: the update in the N × N algebra against the F × F capacitance.

``botorch.sampling.pathwise.draw_matheron_paths`` on a ``SingleTaskGP`` whose kernel rfgp converted draws prior
paths from the kernel's own features and updates them in weight space, v = Φᵀ(ΦΦᵀ + D)⁻¹r (Wilson et al. 2020,
"Efficiently sampling functions from Gaussian process posteriors", eq. 13, in weight space).  rfgp computes v from
the N × N Cholesky factor when N ≲ F (a Bayesian-optimisation loop's few observations under a wide map) and as
A⁻¹ΦᵀD⁻¹r from the F × F capacitance A = I + ΦᵀD⁻¹Φ otherwise — the same vector by the push-through identity, chosen
by the posterior's flop rule (``FeatureRootAddedDiagLinearOperator.uses_kernel_space``).

Rows, in the same run and interleaved (one call of every row per repeat): the automatic choice, and the same draw
with the choice forced to the capacitance (``uses_kernel_space`` patched to return False) — the algebra before the
N × N path existed — for a BO loop's regime (N = 30, F = 8 192) and for a wide-data regime where the capacitance is
the automatic choice anyway (N = 3 000, F = 512).  Each call draws 16 paths and evaluates them on 10³ points; the
model's prediction caches are built before timing.  Medians and minima of wall-clock seconds, float64, one thread;
the load average is recorded since the host is shared.

    python benchmarks/pathwise_update.py            # 5 repeats; writes benchmarks/results/pathwise_update.md
    python benchmarks/pathwise_update.py --quick    # F = 2 048, 2 repeats (smoke run)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

from botorch.models import SingleTaskGP  # noqa: E402
from botorch.sampling.pathwise import draw_matheron_paths  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.operators import FeatureRootAddedDiagLinearOperator  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DIM = 4
NUM_PATHS = 16
NUM_TEST = 1000


def _model(num_data: int, num_features: int) -> SingleTaskGP:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(num_data, DIM, generator=g, dtype=torch.float64)
    y = torch.sin(3 * x).sum(-1, keepdim=True) + 0.1 * torch.randn(num_data, 1, generator=g, dtype=torch.float64)
    model = SingleTaskGP(x, y)
    model.covar_module = rfgp.sketch(model.covar_module, num_features, seed=0)
    model.eval()
    with torch.no_grad():
        model.posterior(x[:2])  # the prediction caches, as a BO loop has them after its first acquisition
    return model


def _draw(model, points: torch.Tensor) -> float:
    start = time.perf_counter()
    with torch.no_grad():
        values = draw_matheron_paths(model, sample_shape=torch.Size([NUM_PATHS]))(points)
    assert values.shape == (NUM_PATHS, NUM_TEST) and bool(torch.isfinite(values).all())
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="F = 2 048 in the BO regime, 2 repeats")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    repeats = 2 if args.quick else args.repeats
    regimes = [(30, 2048 if args.quick else 8192), (3000, 512)]
    points = torch.rand(NUM_TEST, DIM, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    models = {regime: _model(*regime) for regime in regimes}
    capacitance = mock.patch.object(FeatureRootAddedDiagLinearOperator, "uses_kernel_space", return_value=False)
    times: dict[tuple, list[float]] = {}
    load_start, begin = os.getloadavg(), time.perf_counter()
    for _ in range(repeats):
        for regime, model in models.items():
            times.setdefault((regime, "automatic"), []).append(_draw(model, points))
            with capacitance:
                times.setdefault((regime, "F × F capacitance (forced)"), []).append(_draw(model, points))
    load_end = os.getloadavg()
    lines = [
        "# Pathwise sampling through BoTorch: the N × N update against the F × F capacitance", "",
        f"`python benchmarks/pathwise_update.py{' --quick' if args.quick else ''}`; torch {torch.__version__}, "
        f"gpytorch {gpytorch.__version__}, float64, one thread, d = {DIM}, {NUM_PATHS} paths on {NUM_TEST} points per "
        f"call, {repeats} interleaved repeats ({time.perf_counter() - begin:.0f} s in all).  Load average (1, 5, 15 "
        f"min) before: {', '.join(f'{v:.2f}' for v in load_start)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_end)}.", "",
        "| N | F | update | median [s] | min [s] | × automatic (median) |",
        "|---|---|---|---|---|---|",
    ]
    for regime in regimes:
        base = statistics.median(times[(regime, "automatic")])
        for update in ("automatic", "F × F capacitance (forced)"):
            values = times[(regime, update)]
            lines.append(f"| {regime[0]} | {regime[1]} | {update} | {statistics.median(values):.3f} | "
                         f"{min(values):.3f} | {statistics.median(values) / base:.2f} |")
    name = "pathwise_update_quick.md" if args.quick else "pathwise_update.md"
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
