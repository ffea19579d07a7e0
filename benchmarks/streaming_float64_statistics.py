"""Streaming float32 data: the statistics G = ΦᵀWΦ and B = ΦᵀWr summed in float64 (``StreamingFeatureGP.update``
since the sums are formed in ``factor_dtype``) against summed in float32 (as before), paired in one process.

Float32 sums carry errors of about eps₃₂·‖G‖, which at a high signal-to-noise ratio exceed the 1 that I adds to G
and make I + G indefinite by chance (tests/models/test_streaming.py); the float64 products cost time.  Each row
streams N = 20 000 float32 points of d = 2 into ``ScaleKernel(SketchedRBFKernel(F))`` in batches of k
(``rank_update="never"``: statistics only), one thread, the two alternating, after one untimed pass each.

    python benchmarks/streaming_float64_statistics.py   # writes results/streaming_float64_statistics.md
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

from rfgp.core.dtypes import factor_dtype  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.models import streaming  # noqa: E402

SUMS = {"float32 sums": lambda dtype, device: dtype, "float64 sums": factor_dtype}


def stream_time(x, y, num_features, batch):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    model = streaming.StreamingFeatureGP(kernel, gpytorch.likelihoods.GaussianLikelihood(), rank_update="never")
    start = time.perf_counter()
    for i in range(0, x.shape[0], batch):
        model.update(x[i:i + batch], y[i:i + batch])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20000, 2, generator=gen)
    y = torch.sin(x.sum(-1))
    rows = []
    for num_features in (512, 1024):
        for batch in (64, 2000):
            times = {name: [] for name in SUMS}
            for repeat in range(args.repeats + 1):
                for name, work in SUMS.items():
                    streaming.factor_dtype = work
                    elapsed = stream_time(x, y, num_features, batch)
                    if repeat:
                        times[name].append(elapsed)
            streaming.factor_dtype = factor_dtype
            low, high = (statistics.median(times[name]) for name in SUMS)
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            rows.append(f"| {num_features} | {batch} | {low:.3f} | {high:.3f} | {high / low:.2f} | {load} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# Streaming float32 data: statistics summed in float64 against float32, paired", "",
        "N = 20 000 float32 points, d = 2, ScaleKernel(SketchedRBFKernel(F)), batches of k, update() only, one thread, "
        f"medians of {args.repeats} alternating repeats, host shared with other jobs (2 cores).", "",
        "| F | k | float32 sums s | float64 sums s | float64 / float32 | load average |",
        "|---|---|---|---|---|---|",
        *rows, ""])
    out = Path(__file__).resolve().parent / "results" / "streaming_float64_statistics.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
