"""Sampling multi-output BoTorch posteriors of rfgp models: ``posterior(X).rsample`` over many candidates.

BoTorch joins the outputs of a ``ModelListGP`` and of a batched multi-output ``SingleTaskGP`` with GPyTorch's
``MultitaskMultivariateNormal.from_independent_mvns``.  Measured here, for N training points, F features and
n candidates: the time of ``posterior(X)`` and of its ``rsample(S)`` (apart, the best of ``--repeats``, one thread)
and the peak resident memory of the process (each case runs in a fresh one) for

* ``single``  — one single-output ``SingleTaskGP`` (the reference),
* ``list``    — a ``ModelListGP`` of ``m`` such models,
* ``batched`` — one ``SingleTaskGP`` with ``m`` output columns,

each without and with BoTorch's ``Standardize``, in float64 and float32.

    python benchmarks/multioutput_sampling.py --tag after            # writes results/multioutput_sampling_after.md
    python benchmarks/multioutput_sampling.py --candidates 3000 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import resource
import sys
import time
from pathlib import Path

from fresh_process import add_case_option, answer_case, run_case  # benchmarks/, the script's folder

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _case(kind: str, dtype_name: str, standardize: bool, n: int, num_train: int, num_outputs: int,
          num_features: int, num_samples: int, repeats: int) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import torch
    from botorch.models import ModelListGP, SingleTaskGP
    from botorch.models.transforms import Standardize

    import rfgp

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    d = 3
    x = torch.rand(num_train, d, generator=gen, dtype=dtype)
    y = torch.stack([torch.sin(3 * x).sum(-1) * (k + 1) for k in range(num_outputs)], -1)
    y = y + 0.1 * torch.randn(y.shape, generator=gen, dtype=dtype)
    candidates = torch.rand(n, d, generator=gen, dtype=dtype)

    def model(targets):
        batch = torch.Size([targets.shape[-1]]) if targets.shape[-1] > 1 else torch.Size()
        kernel = rfgp.kernels.SketchedRBFKernel(num_features=num_features, method="orf", seed=0, ard_num_dims=d,
                                                batch_shape=batch)
        transform = Standardize(targets.shape[-1]) if standardize else None
        return SingleTaskGP(x, targets, covar_module=kernel, outcome_transform=transform).to(dtype).eval()

    if kind == "single":
        gp = model(y[:, :1])
    elif kind == "list":
        gp = ModelListGP(*[model(y[:, k : k + 1]) for k in range(num_outputs)]).eval()
    else:
        gp = model(y)
    posterior_times, sample_times = [], []
    with torch.no_grad():
        for _ in range(repeats):
            start = time.perf_counter()
            posterior = gp.posterior(candidates)
            middle = time.perf_counter()
            samples = posterior.rsample(torch.Size([num_samples]))
            sample_times.append(time.perf_counter() - middle)
            posterior_times.append(middle - start)
    assert torch.isfinite(samples).all()
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return {"model": kind, "dtype": dtype_name, "standardize": standardize, "n": n, "outputs": samples.shape[-1],
            "posterior_s": min(posterior_times), "rsample_s": min(sample_times), "peak_rss_mib": round(peak_mib),
            "shape": list(samples.shape)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", type=int, nargs="+", default=[3000, 6000])
    parser.add_argument("--train", type=int, default=200)
    parser.add_argument("--outputs", type=int, default=2)
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--samples", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--dtypes", nargs="+", default=["float64", "float32"])
    parser.add_argument("--tag", default="")
    add_case_option(parser)
    args = parser.parse_args()
    if answer_case(args, _case):
        return
    rows = []
    for n in args.candidates:
        for dtype in args.dtypes:
            for standardize in (False, True):
                for kind in ("single", "list", "batched"):
                    case = dict(kind=kind, dtype_name=dtype, standardize=standardize, n=n, num_train=args.train,
                                num_outputs=args.outputs, num_features=args.features, num_samples=args.samples,
                                repeats=args.repeats)
                    rows.append(run_case(__file__, case))
                    print(rows[-1], flush=True)
    title = "# Multi-output sampling: posterior(X).rsample of rfgp BoTorch models" + (f" — {args.tag}" * bool(args.tag))
    header = (f"{title}\n\nN = {args.train}, d = 3, F = {args.features}, {args.outputs} outputs, "
              f"{args.samples} samples, 1 thread, load {os.getloadavg()[0]:.1f}\n\n"
              "| n | dtype | Standardize | model | posterior() s | rsample s | peak RSS MiB |\n"
              "|---|---|---|---|---|---|---|\n")
    table = header + "".join(f"| {r['n']} | {r['dtype']} | {r['standardize']} | {r['model']} | "
                             f"{r['posterior_s']:.3f} | {r['rsample_s']:.3f} | {r['peak_rss_mib']} |\n" for r in rows)
    print(table)
    if args.tag:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / f"multioutput_sampling_{args.tag}.md").write_text(table)


if __name__ == "__main__":
    main()
