"""Training a multi-output (vector-field) GP whose n·p × F root is chunked: peak memory and time per MLL + gradient.

A 3-D curl-free GP (p = 3 outputs per point, F features, float64) with ``MultitaskGaussianLikelihood`` of rank 0
(independent task noises) or rank 1 (correlated task noise, whitened per point); one marginal likelihood and its
gradient w.r.t. every hyperparameter (kernel, task noise, mean) per repeat.  Each case runs in a fresh process
under a ``rfgp.settings.memory_budget``: the default 1 GiB materialises the root at n = 20 000 (its working set,
4 copies of the n·p × F root, is 0.98 GiB) and chunks it at n = 40 000 (two blocks; refused before), smaller
budgets chunk it (points per block = budget / (4·p·F·8 bytes)).
Reported: the median time of ``--repeats`` evaluations after one warm-up, the process's peak resident memory
(``getrusage`` maxrss) and its growth over the resident memory before the first evaluation (data, model, torch),
with glibc's default allocator (whose heap keeps blocks freed between chunks: the growth rises slowly with n) and
with ``MALLOC_MMAP_THRESHOLD_=65536`` (large blocks mapped and returned on free: the live working set).

    python benchmarks/multioutput_chunked_training.py --tag after     # writes results/multioutput_chunked_training.md
    python benchmarks/multioutput_chunked_training.py --points 2000 --repeats 1 --device cuda
"""

from __future__ import annotations

import argparse
import itertools
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from fresh_process import add_case_option, answer_case, run_case  # benchmarks/, the script's folder

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _case(num_points: int, num_features: int, rank: int, budget: int, repeats: int, threads: int,
          device: str) -> dict:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import gpytorch
    import torch

    import rfgp
    from rfgp.inference.multioutput_chunking import ChunkedMultiOutputFeatureOperator, points_per_block

    torch.set_num_threads(threads)
    torch.manual_seed(0)  # the likelihood draws its task noise factor
    dtype, d = torch.float64, 3
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, d, generator=gen, dtype=dtype) * 2 - 1
    y = torch.stack([torch.sin(3 * x[:, 0]) * x[:, 1], torch.cos(2 * x[:, 1]), x[:, 2] * x[:, 0]], -1)
    y = (y + 0.05 * torch.randn(y.shape, generator=gen, dtype=dtype)).to(device)
    x = x.to(device)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=d, rank=rank)
    kernel = gpytorch.kernels.ScaleKernel(rfgp.kernels.SketchedCurlFreeKernel(num_features, d, method="orf", seed=0))
    mean = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(), num_tasks=d)
    model = rfgp.models.MultiOutputGPModel(x, y, likelihood, kernel, mean).to(device=device, dtype=dtype)
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    parameters = [p for p in model.parameters() if p.requires_grad]
    times = []
    with rfgp.settings.memory_budget(budget):
        chunked = isinstance(model.covar_module(x).evaluate_kernel(), ChunkedMultiOutputFeatureOperator)
        block = points_per_block(num_points, d, num_features, 1, dtype)
        before = _resident_mib()
        for repeat in range(repeats + 1):
            if device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            loss = -mll(model(x), y)
            gradients = torch.autograd.grad(loss, parameters)
            if device == "cuda":
                torch.cuda.synchronize()
            if repeat:
                times.append(time.perf_counter() - start)
    assert all(torch.isfinite(g).all() for g in gradients)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    row = {"n": num_points, "F": num_features, "rank": rank, "budget_mib": budget / 2**20, "chunked": chunked,
           "block_points": block if chunked else None, "seconds": statistics.median(times),
           "loss": float(loss), "peak_rss_mib": round(peak), "growth_mib": round(peak - before)}
    if device == "cuda":
        row["peak_cuda_mib"] = round(torch.cuda.max_memory_allocated() / 2**20)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--points", type=int, nargs="+", default=[20_000, 40_000])
    parser.add_argument("--features", type=int, default=512)
    parser.add_argument("--budgets-mib", type=float, nargs="+", default=[1024, 64])
    parser.add_argument("--ranks", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--tag", default="")
    add_case_option(parser)
    args = parser.parse_args()
    if answer_case(args, _case):
        return
    rows = []
    for points, rank, budget in itertools.product(args.points, args.ranks, args.budgets_mib):
        case = dict(num_points=points, num_features=args.features, rank=rank, budget=int(budget * 2**20),
                    repeats=args.repeats, threads=args.threads, device=args.device)
        runs = []
        for env in ({}, {"MALLOC_MMAP_THRESHOLD_": "65536"}):
            runs.append(run_case(__file__, case, env))
        rows.append({**runs[0], "mapped_growth_mib": runs[1]["growth_mib"]})
        print(rows[-1], flush=True)
    cuda = args.device == "cuda"
    title = "# Chunked training of a multi-output GP: MLL + gradient" + (f" — {args.tag}" * bool(args.tag))
    header = (f"{title}\n\n3-D curl-free ORFF, n points × p = 3 outputs, F = {args.features}, float64, "
              f"{args.device}, {args.threads} thread(s), median of {args.repeats} after a warm-up, load "
              f"{os.getloadavg()[0]:.1f}. RSS growth: over the resident memory before the first evaluation; "
              "mapped: the same with MALLOC_MMAP_THRESHOLD_=65536 (the live working set; glibc's default heap keeps "
              "blocks freed between chunks)\n\n"
              "| n | task noise rank | budget MiB | chunked (points per block) | MLL + grad s | loss | peak RSS MiB "
              "| RSS growth MiB | growth, mapped MiB "
              f"|{' peak CUDA MiB |' * cuda}\n|---|---|---|---|---|---|---|---|---|{'---|' * cuda}\n")
    table = header + "".join(
        f"| {r['n']} | {r['rank']} | {r['budget_mib']:g} | "
        f"{'yes (' + str(r['block_points']) + ')' if r['chunked'] else 'no'} | "
        f"{r['seconds']:.2f} | {r['loss']:.10f} | {r['peak_rss_mib']} | {r['growth_mib']} | {r['mapped_growth_mib']} |"
        f"{(' ' + str(r.get('peak_cuda_mib')) + ' |') * cuda}\n" for r in rows)
    print(table)
    if args.tag:
        RESULTS.mkdir(exist_ok=True)
        suffix = "" if args.tag == "after" else f"_{args.tag}"
        (RESULTS / f"multioutput_chunked_training{suffix}.md").write_text(table)


if __name__ == "__main__":
    main()
