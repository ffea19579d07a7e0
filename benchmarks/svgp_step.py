"""One SVGP ELBO-and-gradient step at N = 20 000, M = 64: exact kernel against rfgp at F = 256 and 1024.

GPyTorch's ``VariationalStrategy`` evaluates K(Z, x) and, by a separate kernel call with ``diag=True``, k̂(x, x).
Before the closed-form diagonal (:meth:`rfgp.features.FeatureMap.squared_norm`), an rfgp kernel featurised the
minibatch x for each of the two calls; with it, sin/cos maps featurise x once per step.

Model: GPyTorch's SVGP (``CholeskyVariationalDistribution``, learnt inducing points, ``GaussianLikelihood``,
``VariationalELBO``), ``ScaleKernel(RBFKernel(ard_num_dims=d))`` exact or ``rfgp.sketch``-ed (default method), x
uniform on [0, 1]^d, one thread.  ``--kernels spectral_mixture periodic`` time the weighted-Fourier families instead
(``SpectralMixtureKernel(num_mixtures=4)``, ``ScaleKernel(PeriodicKernel)``, both ARD), whose closed-form diagonal
is mean(w)·A rather than 1.  ``--paired`` also times every rfgp model with its diagonal computed from the features
(the closed forms switched off on its kernels), alternately with the closed form, in the same process: the ratio is
robust to the load of a shared host, where separate before/after runs are not.  Timed: ``zero_grad``, ELBO and
``backward`` (after one untimed step), the median and minimum of ``--repeats`` repeats.  The table records
``os.getloadavg()`` (the host is shared).

    python benchmarks/svgp_step.py --label after     # writes results/svgp_step_after.md
    python benchmarks/svgp_step.py --label weighted_paired --dims 2 --kernels spectral_mixture periodic --paired

``results/svgp_step_before.md`` is this script run with ``--label before`` in a checkout of the commit before the
closed-form diagonal (it imports the rfgp of the checkout it lies in); ``results/svgp_step_weighted_before.md`` is
``--dims 2 --kernels spectral_mixture periodic`` in a checkout of c230996, before the weighted-Fourier closed forms.
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
from rfgp.kernels.random_feature_kernel import FeatureKernel  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import UserSVGP  # noqa: E402  (GPyTorch's SVGP tutorial model)

KERNELS = {
    "rbf": lambda d: gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d)),
    "spectral_mixture": lambda d: gpytorch.kernels.SpectralMixtureKernel(num_mixtures=4, ard_num_dims=d),
    "periodic": lambda d: gpytorch.kernels.ScaleKernel(gpytorch.kernels.PeriodicKernel(ard_num_dims=d)),
}


def _no_closed_form(x):
    return None


def step_times(kernel, x, y, num_inducing, num_features, repeats, paired=False):
    """(median, min) of a step's seconds; with ``paired``, also those of the same model with its diagonal computed from
    the features (every feature kernel's closed form switched off), the two timed alternately."""
    covar = KERNELS[kernel](x.shape[-1])
    if num_features:
        covar = rfgp.sketch(covar, num_features=num_features, seed=0)
    model = UserSVGP(covar, x[:num_inducing].clone()).to(x.dtype)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(x.dtype)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=x.shape[0])
    model.train()
    likelihood.train()
    feature_kernels = [module for module in covar.modules() if isinstance(module, FeatureKernel)]

    def step(explicit):
        for module in feature_kernels:
            if explicit:
                module.feature_squared_norm = _no_closed_form
            else:
                module.__dict__.pop("feature_squared_norm", None)
        model.zero_grad()
        likelihood.zero_grad()
        start = time.perf_counter()
        (-mll(model(x), y)).backward()
        return time.perf_counter() - start

    modes = (False, True) if paired and num_features else (False,)
    times = {mode: [] for mode in modes}
    for mode in modes:
        step(mode)
    for _ in range(repeats):
        for mode in modes:
            times[mode].append(step(mode))
    return [(statistics.median(t), min(t)) for t in times.values()]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after")
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--m", type=int, default=64)
    parser.add_argument("--dims", type=int, nargs="+", default=[2, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--kernels", nargs="+", default=["rbf"], choices=sorted(KERNELS))
    parser.add_argument("--paired", action="store_true",
                        help="also time each rfgp model with its diagonal from the features, alternately")
    parser.add_argument("--dtypes", nargs="+", default=["float32", "float64"], choices=["float32", "float64"])
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for kernel in args.kernels:
        for dtype in (getattr(torch, name) for name in args.dtypes):
            for d in args.dims:
                gen = torch.Generator().manual_seed(0)
                x = torch.rand(args.n, d, generator=gen).to(dtype)
                y = torch.randn(args.n, generator=gen).to(dtype)
                for num_features in (0, 256, 1024):
                    (median, best), *explicit = step_times(kernel, x, y, args.m, num_features, args.repeats,
                                                           args.paired)
                    name = "exact" if num_features == 0 else f"F = {num_features}"
                    row = f"| {kernel} | {str(dtype)[6:]} | {d} | {name} | {median:.3f} | {best:.3f} |"
                    if args.paired:
                        row += f" {explicit[0][0]:.3f} | {explicit[0][0] / median:.2f} |" if explicit else " | |"
                    rows.append(row)
                    print(rows[-1], flush=True)
    load = ", ".join(f"{v:.2f}" for v in os.getloadavg())
    text = "\n".join([
        f"# SVGP ELBO and gradient, {args.label}",
        "",
        f"N = {args.n}, M = {args.m}, one thread, {args.repeats} repeats; load average at the end: {load}",
        "",
        "| kernel | dtype | d | features | median s | min s |"
        + (" explicit diagonal, median s | ratio |" if args.paired else ""),
        "|---|---|---|---|---|---|" + ("---|---|" if args.paired else ""),
        *rows,
        "",
    ])
    out = Path(__file__).resolve().parent / "results" / f"svgp_step_{args.label}.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
