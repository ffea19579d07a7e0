"""Weighted-Fourier features (periodic, spectral mixture, RQ with trainable α, spectral products) through one custom
autograd Function, against the plain cat/mul/exp formula, paired in one process; the RBF's plain RFF map as the
yardstick.

Two steps, each ELBO/MLL and ``backward`` after one untimed step, one thread, float64, d = 2, F = 1024:

* SVGP (GPyTorch's ``VariationalELBO``, M = 64 learnt inducing points), N = 20 000, as ``svgp_step.py``;
* ExactGP (GPyTorch's ``ExactMarginalLogLikelihood``, the loss ``rfgp.fit_mll`` minimises), N = 5 000.

``plain`` swaps :func:`rfgp.features.weighted_fourier.fourier_features` and ``SpectralProductKernel.featurize``
(periodic × RBF) for the formulas they replaced (below, the baseline, with the spectral mixture's √A multiplied
afterwards as before); ``function`` is the module's own (√A
folded into the pair scales).  The two are timed alternately, ``--repeats`` times each, so a shared
host's load hits both alike; the table records ``os.getloadavg()`` and the medians' ratio.

    python benchmarks/weighted_fourier_step.py   # writes results/weighted_fourier_step.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
from rfgp.features import weighted_fourier  # noqa: E402
from rfgp.kernels import SpectralProductKernel  # noqa: E402

sys.path.insert(0, os.path.dirname(__file__))
from _paired_steps import exact_loss, paired_times, svgp_loss  # noqa: E402

K = gpytorch.kernels
KERNELS = {
    "rbf": lambda d: K.ScaleKernel(K.RBFKernel(ard_num_dims=d)),
    "periodic": lambda d: K.ScaleKernel(K.PeriodicKernel(ard_num_dims=d)),
    "spectral_mixture": lambda d: K.SpectralMixtureKernel(num_mixtures=3, ard_num_dims=d),
    "rq": lambda d: K.ScaleKernel(K.RQKernel(ard_num_dims=d)),
    "periodic_x_rbf": lambda d: K.ScaleKernel(K.PeriodicKernel(active_dims=[0]) * K.RBFKernel(active_dims=[1])),
}


def plain_fourier_features(x, frequencies, log_weights=None, log_amplitude=None):
    """The formula before the custom Function (the baseline): autograd through cat, exp and mul, and the spectral
    mixture's amplitude as it was applied, a multiplication of Φ by √A afterwards."""
    projection = x @ frequencies.mT
    features = torch.cat([torch.cos(projection), torch.sin(projection)], dim=-1)
    m = frequencies.shape[-2]
    if log_weights is None:
        features = features / math.sqrt(m)
    else:
        amplitudes = torch.exp(0.5 * (log_weights - math.log(m))).unsqueeze(-2)
        features = features * torch.cat([amplitudes, amplitudes], dim=-1)
    if log_amplitude is None:
        return features
    return features * log_amplitude.exp().sqrt().unsqueeze(-1).unsqueeze(-1)


def plain_product_featurize(self, x):
    """SpectralProductKernel.featurize before the custom Function (the baseline)."""
    terms, log_amplitude, log_weights = self.spectrum(x)
    projection = sum(u @ frequencies.mT for u, frequencies in terms)
    scale = (log_amplitude.exp() / self.num_frequencies).sqrt()[..., None, None]
    features = torch.cat((projection.cos(), projection.sin()), -1) * scale
    return features if log_weights is None else weighted_fourier.scale_sincos_pairs(features, (0.5 * log_weights).exp())


IMPLEMENTATIONS = {"plain": (plain_fourier_features, plain_product_featurize),
                   "function": (weighted_fourier.fourier_features, SpectralProductKernel.featurize)}


def use(name):
    weighted_fourier.fourier_features, SpectralProductKernel.featurize = IMPLEMENTATIONS[name]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="weighted_fourier_step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-features", type=int, default=1024)
    parser.add_argument("--kernels", nargs="+", default=list(KERNELS), choices=list(KERNELS))
    parser.add_argument("--steps", nargs="+", default=["svgp", "exact"], choices=["svgp", "exact"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = {"svgp": 20000, "exact": 5000}
    rows = []
    for step in args.steps:
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(sizes[step], 2, generator=gen, dtype=torch.float64)
        y = torch.randn(sizes[step], generator=gen, dtype=torch.float64)
        for name in args.kernels:
            kernel = rfgp.sketch(KERNELS[name](2), num_features=args.num_features, seed=0)
            make = (lambda: svgp_loss(kernel, x, y)) if step == "svgp" else (lambda: exact_loss(kernel, x, y))
            times, _ = paired_times(make, args.repeats, use, IMPLEMENTATIONS, "function")
            plain, function = (statistics.median(times[k]) for k in IMPLEMENTATIONS)
            load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
            rows.append(f"| {step} | {sizes[step]} | {name} | {plain:.3f} | {min(times['plain']):.3f} | "
                        f"{function:.3f} | {min(times['function']):.3f} | {plain / function:.2f} | {load} |")
            print(rows[-1], flush=True)
    text = "\n".join([
        "# Weighted-Fourier features: custom Function against the plain formula, paired",
        "",
        f"d = 2, F = {args.num_features}, float64, one thread, {args.repeats} repeats each, alternating. "
        "'plain' is the cat/exp/mul autograd formula before the custom Function; the RBF row uses neither "
        "(its RFF map has had its own Function all along), so its ratio is the noise floor.",
        "",
        "| step | N | kernel | plain median s | plain min s | function median s | function min s "
        "| plain / function | load average |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows,
        "",
    ])
    out = Path(__file__).resolve().parent / "results" / f"{args.label}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
