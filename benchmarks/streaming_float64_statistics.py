"""Streaming float32 data: the statistics G = ΦᵀWΦ and B = ΦᵀWr formed in float32 or float64, paired in one process.

Float32 sums carry errors of up to about u·tr(G) (rfgp.inference.statistics_precision), which at a high signal-to-
noise ratio exceed the 1 that I adds to G and make I + G indefinite by chance (tests/models/test_streaming.py); the
float64 products cost time. ``StreamingFeatureGP.update`` forms a float32 batch in float32 while u·tr(G) of the stream
is within ``rfgp.settings.float32_statistics_tolerance`` (default 10⁻¹), in float64 otherwise. Three modes, paired:
``float32`` (tolerance ∞: always float32 products), ``adaptive`` (the default tolerance; 10⁻² when the recorded
results were measured) and ``float64`` (tolerance 0: always float64, what update did before the adaptive rule). G and
B are summed in float64 in every mode. Each row streams N = 20 000 float32 points of d = 2 into
``ScaleKernel(SketchedRBFKernel(F))`` (outputscale ≈ 0.69) in batches of k (``rank_update="never"``: statistics only),
one thread, CPU time, the modes alternating, after one untimed pass each, at the default noise ≈ 0.69 (u·tr(G) ≈
1.2·10⁻³ at the end: benign) and at noise 10⁻⁴ (u·tr(G) ≈ 8: float64 from the first batch).

    python benchmarks/streaming_float64_statistics.py   # writes results/streaming_float64_statistics.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.models import streaming  # noqa: E402

MODES = {"float32": math.inf, "adaptive": rfgp.settings.float32_statistics_tolerance.DEFAULT, "float64": 0.0}


def stream_time(x, y, num_features, batch, noise, tolerance):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    if noise is not None:
        likelihood.noise = noise
    model = streaming.StreamingFeatureGP(kernel, likelihood, rank_update="never")
    start = time.process_time()
    with rfgp.settings.float32_statistics_tolerance(tolerance):
        for i in range(0, x.shape[0], batch):
            model.update(x[i:i + batch], y[i:i + batch])
    return time.process_time() - start


def decision_time(x, y, num_features, batch, noise, updates=40):
    """Median CPU time of the precision decision inside ``update`` (statistics_dtype, wrapped), and of the update."""
    decide, spent = streaming.statistics_dtype, []

    def timed(*args):
        start = time.process_time()
        chosen = decide(*args)
        spent.append(time.process_time() - start)
        return chosen

    streaming.statistics_dtype = timed
    try:
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
        likelihood = gpytorch.likelihoods.GaussianLikelihood()
        if noise is not None:
            likelihood.noise = noise
        model = streaming.StreamingFeatureGP(kernel, likelihood, rank_update="never")
        totals = []
        for _ in range(updates):
            start = time.process_time()
            model.update(x[:batch], y[:batch])
            totals.append(time.process_time() - start)
    finally:
        streaming.statistics_dtype = decide
    return statistics.median(spent), statistics.median(totals)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(20000, 2, generator=gen)
    y = torch.sin(x.sum(-1))
    rows = []
    for noise in (None, 1e-4):
        for num_features in (512, 1024):
            for batch in (64, 2000):
                times = {name: [] for name in MODES}
                for repeat in range(args.repeats + 1):
                    for name, tolerance in MODES.items():
                        elapsed = stream_time(x, y, num_features, batch, noise, tolerance)
                        if repeat:
                            times[name].append(elapsed)
                low, adaptive, high = (statistics.median(times[name]) for name in MODES)
                load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
                rows.append(f"| {'default' if noise is None else noise} | {num_features} | {batch} | {low:.3f} | "
                            f"{adaptive:.3f} | {high:.3f} | {high / adaptive:.2f} | {adaptive / low:.2f} | {load} |")
                print(rows[-1], flush=True)
    decisions = []
    for noise in (None, 1e-4):
        for num_features in (512, 1024):
            for batch in (64, 2000):
                decided, update = decision_time(x, y, num_features, batch, noise)
                decisions.append(f"| {'default' if noise is None else noise} | {num_features} | {batch} | "
                                 f"{1e3 * decided:.3f} | {1e3 * update:.2f} | {decided / update:.3f} |")
                print(decisions[-1], flush=True)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    text = "\n".join([
        "# Streaming float32 data: statistics formed in float32, adaptively or in float64, paired", "",
        "N = 20 000 float32 points, d = 2, ScaleKernel(SketchedRBFKernel(F)), batches of k, update() only, one thread, "
        "CPU time (process_time), "
        f"medians of {args.repeats} alternating repeats, host shared with other jobs (2 cores). float32: tolerance ∞; "
        "adaptive: the default tolerance 10⁻² (float32 while u·tr(G) ≤ 10⁻²); float64: tolerance 0, the products "
        "update() formed before the adaptive rule. Noise 'default' ≈ 0.69 (u·tr(G) ≤ 1.2·10⁻³: all float32), 10⁻⁴ "
        "(u·tr(G) ≈ 8 at the end: float64 from the first batch).", "",
        "| noise | F | k | float32 s | adaptive s | float64 s | float64 / adaptive | adaptive / float32 "
        "| load average |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows, "",
        "The decision alone inside update() (the batch's Σwᵢ‖φᵢ‖², the stream's tr(G) and the comparison: "
        f"statistics_dtype, wrapped), median CPU time over 40 updates of the adaptive mode, load {load}:", "",
        "| noise | F | k | decision ms | update ms | share |", "|---|---|---|---|---|---|",
        *decisions, ""])
    out = Path(__file__).resolve().parent / "results" / "streaming_float64_statistics.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
