"""A ScaleKernel's outputscale folded into the sin/cos Functions' pair scales, against multiplying Φ by √s, paired in
one process.

``multiply``: every feature kernel's ``folds_amplitude`` returns ``False``, so the chunked operators' featurizer
multiplies Φ by √s after the feature map, as before: a pass over the N × F features forward, one backward, and an
N × F product for the outputscale's gradient.  ``fold``: the kernels' own protocol, log s passed to
the Function (:meth:`rfgp.kernels.FeatureKernel.amplitude_features`).  Steps as in ``weighted_fourier_step.py``
(one thread, d = 2, F = 1024, ``zero_grad`` + loss + ``backward`` after one untimed step, the two alternating):

* SVGP (GPyTorch's ``VariationalELBO``, M = 64 learnt inducing points), N = 20 000, float32 and float64;
* ExactGP (GPyTorch's ``ExactMarginalLogLikelihood``), N = 5 000, float64 (``--exact-dtypes`` for others).

Kernels: ``rbf``/``periodic`` inside one ``ScaleKernel`` (the chunked operators' featurizer folds s), and ``sum``, the
co2-style ScaleKernel(RBF) + ScaleKernel(Periodic), a ``FeatureSumKernel`` of F/2 features each whose parts' s are
folded by :func:`rfgp.kernels.kernel_features`.

    python benchmarks/outputscale_fold_step.py   # writes results/outputscale_fold_step.md
    python benchmarks/outputscale_fold_step.py --label outputscale_fold_sums --kernels sum \
        --exact-dtypes float32 float64
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
from rfgp.kernels import FeatureKernel  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _paired_steps import exact_loss, paired_times, svgp_loss  # noqa: E402

K = gpytorch.kernels
KERNELS = {
    "rbf": lambda d: K.ScaleKernel(K.RBFKernel(ard_num_dims=d)),
    "periodic": lambda d: K.ScaleKernel(K.PeriodicKernel(ard_num_dims=d)),
    "sum": lambda d: K.ScaleKernel(K.RBFKernel(ard_num_dims=d)) + K.ScaleKernel(K.PeriodicKernel(ard_num_dims=d)),
}
DTYPES = {"float32": torch.float32, "float64": torch.float64}
IMPLEMENTATIONS = ("multiply", "fold")


def _kernel_classes():
    stack, found = [FeatureKernel], []
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    return [cls for cls in found if "folds_amplitude" in vars(cls)]


FOLDS = {cls: vars(cls)["folds_amplitude"] for cls in _kernel_classes()}


def use(name):
    for cls, folds in FOLDS.items():
        cls.folds_amplitude = folds if name == "fold" else (lambda self: False)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="outputscale_fold_step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-features", type=int, default=1024)
    parser.add_argument("--kernels", nargs="+", default=["rbf", "periodic"], choices=list(KERNELS))
    parser.add_argument("--exact-dtypes", nargs="+", default=["float64"], choices=list(DTYPES))
    args = parser.parse_args()
    torch.set_num_threads(1)
    cases = [("svgp", 20000, torch.float32), ("svgp", 20000, torch.float64),
             *(("exact", 5000, DTYPES[name]) for name in args.exact_dtypes)]
    rows = []
    for step, n, dtype in cases:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(n, 2, generator=gen, dtype=dtype)
        y = torch.randn(n, generator=gen, dtype=dtype)
        for name in args.kernels:
            kernel = rfgp.sketch(KERNELS[name](2), num_features=args.num_features, seed=0)
            make = (lambda: svgp_loss(kernel, x, y)) if step == "svgp" else (lambda: exact_loss(kernel, x, y))
            times, outputs = paired_times(make, args.repeats, use, IMPLEMENTATIONS, "fold")
            difference = max(((a - b).abs().max() / b.abs().max().clamp_min(1e-30)).item()
                             for a, b in zip(outputs["multiply"], outputs["fold"], strict=True))
            multiply, fold = (statistics.median(times[k]) for k in IMPLEMENTATIONS)
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            rows.append(f"| {step} | {n} | {str(dtype)[6:]} | {name} | {multiply:.3f} | {min(times['multiply']):.3f} | "
                        f"{fold:.3f} | {min(times['fold']):.3f} | {multiply / fold:.2f} | {difference:.1e} | {load} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# ScaleKernel's outputscale folded into the sin/cos Functions, against multiplying Φ by √s, paired",
        "",
        f"d = 2, F = {args.num_features}, one thread, {args.repeats} repeats each, alternating, on a host shared with "
        "other jobs (2 cores). 'multiply' is Φ·√s after the feature map (as before), 'fold' log s in the Function's "
        "pair scales. 'difference': the largest relative difference of the loss and any gradient between the two.",
        "",
        "| step | N | dtype | kernel | multiply median s | multiply min s | fold median s | fold min s "
        "| multiply / fold | difference | load average |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    out = Path(__file__).resolve().parent / "results" / f"{args.label}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
