"""Sampled likelihoods of a variational GP: ``likelihood(model(x))`` in eval mode, exact kernel against rfgp.

A likelihood without an analytic marginal (here Beta) draws ``num_likelihood_samples`` S samples of f(x) inside a
``pyro.plate``; GPyTorch expands the predictive covariance to S copies and factorises each (for the exact kernel,
``LazyEvaluatedKernelTensor.repeat`` hands it S real copies of x).  An rfgp kernel receives them as stride-0 views
(:mod:`rfgp.kernels.batch_expansion`), recognises them from their strides (:mod:`rfgp.core.batch_copies`) and
computes Φ(x) and the dense Gram once; before, it featurised every copy and, where S·n·F exceeded the memory
budget, split the work into chunks.

Model: GPyTorch's SVGP (``VariationalStrategy``, ``CholeskyVariationalDistribution``, M = 32 inducing points,
d = 2), ``ScaleKernel(RBFKernel(ard_num_dims=2))`` exact or ``rfgp.sketch``-ed (ORF), float64, eval mode under
``torch.no_grad()``.  Timed: ``likelihood(model(x)).mean`` (the variational caches warmed by one call first), the
median of ``--repeats`` interleaved repeats.  A last row times K(x, x) on 256 distinct t-batches of 4 points (no
copies to find: the cost of looking, now a look at the strides).  The table records ``os.getloadavg()`` (the host
is shared) and the thread count.


    python benchmarks/sampled_likelihood.py --label after     # writes results/sampled_likelihood_after.{md,csv}

``results/sampled_likelihood_before.md`` is this script run, with ``--label before``, in a checkout of the commit
before :mod:`rfgp.core.batch_copies` (it imports the rfgp of the checkout it lies in).
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
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402

sys.path.append(os.path.join(os.path.dirname(__file__), "..", "tests"))  # last: tests/packaging is no packaging
from _models import UserSVGP  # noqa: E402  (GPyTorch's SVGP tutorial model)

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float64
#: (test points n, samples S, widths F; 0 is the exact kernel)
CASES = [(200, 100, (0, 1024, 4096)), (20, 512, (0, 65536))]


def exact_kernel():
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=2))
    kernel.base_kernel.lengthscale = torch.tensor([[0.2, 0.3]])
    return kernel


def build(width: int) -> UserSVGP:
    kernel = exact_kernel()
    if width:
        kernel = rfgp.sketch(kernel, width, method="orf", seed=0)
    inducing = torch.rand(32, 2, generator=torch.Generator().manual_seed(0))
    return UserSVGP(kernel, inducing).to(DTYPE).eval()


def sampled_prediction(model, likelihood, x, samples: int) -> float:
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(samples):
        start = time.perf_counter()
        likelihood(model(x)).mean
        return time.perf_counter() - start


def distinct_batches(kernel, x) -> float:
    with torch.no_grad():
        start = time.perf_counter()
        kernel(x).to_dense()
        return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="after", help="suffix of the result files (before / after)")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    load_start = os.getloadavg()[0]
    likelihood = gpytorch.likelihoods.BetaLikelihood().to(DTYPE).eval()
    jobs = []
    for num_points, samples, widths in CASES:
        x = torch.rand(num_points, 2, generator=torch.Generator().manual_seed(1), dtype=DTYPE)
        for width in widths:
            model = build(width)
            sampled_prediction(model, likelihood, x, 1)  # caches chol(K_ZZ)
            jobs.append(((f"n = {num_points}, S = {samples}", width),
                         lambda m=model, x=x, s=samples: sampled_prediction(m, likelihood, x, s)))
    batches = torch.rand(256, 4, 2, generator=torch.Generator().manual_seed(2), dtype=DTYPE)
    for width in (0, 1024):
        kernel = build(width).covar_module
        jobs.append((("K(x, x), 256 distinct t-batches × 4 points", width),
                     lambda k=kernel: distinct_batches(k, batches)))
    times = {key: [] for key, _ in jobs}
    for _ in range(args.repeats):
        for key, job in jobs:
            times[key].append(job())
    load_end = os.getloadavg()[0]
    rows = [{"case": case, "kernel": f"rfgp ORF F = {width}" if width else "exact",
             "median_s": statistics.median(values), "min_s": min(values)}
            for (case, width), values in times.items()]
    write(rows, args, (load_start, load_end))


def write(rows, args, load) -> None:
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / f"sampled_likelihood_{args.label}"
    write_csv(stem.with_suffix(".csv"), rows)
    lines = [
        f"# Sampled likelihood of an SVGP, exact kernel vs rfgp ({args.label})",
        "",
        f"`likelihood(model(x)).mean`, Beta likelihood, float64, eval mode, no_grad; median (min) of {args.repeats} "
        f"interleaved repeats; {torch.get_num_threads()} intra-op threads; 1-min load {load[0]:.1f} → {load[1]:.1f} "
        "on 2 shared cores.",
        "",
        "| case | kernel | median s | min s |",
        "|---|---|---|---|",
    ]
    lines += [f"| {r['case']} | {r['kernel']} | {r['median_s']:.3f} | {r['min_s']:.3f} |" for r in rows]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
