"""Small-data overhead: rfgp against the exact GP it replaces at BO sizes (N = 10–500), per call.

At N ≤ 500 a random-feature GP cannot beat the exact GP on flops; what it must not do is add so much Python,
checking and dispatch per call that a BO loop (thousands of fits, predictions and acquisition gradients) becomes
much slower.  For N in {10, 50, 200, 500}, d in {2, 6}, float64, one thread, CPU seconds (``time.process_time``),
the models alternated in one process (paired repeats, medians), every model a BoTorch ``SingleTaskGP`` (its default
``Standardize`` outcome transform) whose ``covar_module`` alone differs:

* ``exact RBF``: BoTorch's default kernel (RBF with its dimension-scaled prior), ``exact Matérn``:
  ``ScaleKernel(MaternKernel(2.5, ard_num_dims=d))``;
* ``RFF F``: ``rfgp.sketch(that kernel, F)`` for F = 256 and 1024 (the Matérn one at F = 256), ``Maclaurin 256``:
  ``rfgp.sketch(RBF, 256, method="maclaurin")``, ``Nyström M``: ``rfgp.sketch(RBF, M, method="nystrom",
  x_sample=X)`` with M = min(N, 256) landmarks.

Columns (milliseconds per call):

* ``MLL``: one ``ExactMarginalLogLikelihood`` value + backward in train mode;
* ``post 1 / 32 / 512 first``: ``model.posterior(X)``'s mean and variance (no grad) at 1, 32, 512 test points in
  eval mode, the first call after ``train()`` → ``eval()`` (the prediction caches are built inside the timing);
* ``… rep``: the same at a new X of the same shape, caches warm (the cost inside an acquisition optimisation);
* ``LogEI`` / ``qLogNEI``: one value + gradient w.r.t. X of ``LogExpectedImprovement(best_f=max y)`` and of
  ``qLogNoisyExpectedImprovement(X_baseline=X_train)`` (constructed once, outside the timing) at X of shape
  (32, 1, d) — 32 raw samples of q = 1, caches warm.

The rfgp rows also give the ratio to the exact model of the same kernel family (RBF rows against ``exact RBF``,
Matérn against ``exact Matérn``).  The machine's load average is written with the results.

    python benchmarks/small_data_overhead.py                 # writes results/small_data_overhead.md
    python benchmarks/small_data_overhead.py --quick         # N = 10, 200, d = 2, one repeat
    python benchmarks/small_data_overhead.py --label after   # writes results/small_data_overhead_after.md
    python benchmarks/small_data_overhead.py --models 'exact RBF,RFF 256,Maclaurin 256' --sizes 50,500 --label x

``results/small_data_overhead_before.md`` and ``_after.md`` are this script run against rfgp before and after the
small-data overhead pass (the header names the rfgp it imported; a copy of the script outside the repository, with
``PYTHONPATH`` pointing at the checkout to measure, imports that checkout's rfgp), and ``small_data_overhead.md``
sets their ratios side by side (``--compare``).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import rfgp  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"
COLUMNS = ["MLL", "post 1 first", "post 1 rep", "post 32 first", "post 32 rep", "post 512 first", "post 512 rep",
           "LogEI", "qLogNEI"]


def _models(n: int, d: int, names: list[str] | None = None) -> dict:
    from botorch.models import SingleTaskGP
    from gpytorch.kernels import MaternKernel, ScaleKernel

    gen = torch.Generator().manual_seed(n * 10 + d)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = (torch.sin(6 * x).sum(-1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=gen, dtype=torch.float64))

    def stgp(kernel=None):
        return SingleTaskGP(x, y, covar_module=kernel)

    def matern():
        return ScaleKernel(MaternKernel(2.5, ard_num_dims=d)).double()

    models = {"exact RBF": stgp(), "exact Matérn": stgp(matern())}
    for width in (256, 1024):
        models[f"RFF {width}"] = stgp(rfgp.sketch(stgp().covar_module, width, seed=0))
    models["Matérn RFF 256"] = stgp(rfgp.sketch(matern(), 256, seed=0))
    models["Maclaurin 256"] = stgp(rfgp.sketch(stgp().covar_module, 256, method="maclaurin", seed=0))
    landmarks = min(n, 256)
    models[f"Nyström {landmarks}"] = stgp(rfgp.sketch(stgp().covar_module, landmarks, method="nystrom", x_sample=x,
                                                      seed=0))
    if names is not None:
        unknown = sorted(set(names) - set(models))
        if unknown:
            raise SystemExit(f"--models: unknown model(s) {unknown}; the models are {sorted(models)}")
        models = {name: model for name, model in models.items() if name in names}
    return {name: model.double() for name, model in models.items()}, x, y


def _clock(function, calls: int) -> float:
    start = time.process_time()
    for _ in range(calls):
        function()
    return (time.process_time() - start) / calls


def _measure(model, x, y, gen, calls: int) -> dict:
    from botorch.acquisition import LogExpectedImprovement, qLogNoisyExpectedImprovement
    from gpytorch.mlls import ExactMarginalLogLikelihood

    d = x.shape[-1]
    times = {}
    mll = ExactMarginalLogLikelihood(model.likelihood, model)
    model.train()

    def mll_step():
        model.zero_grad()
        (-mll(model(*model.train_inputs), model.train_targets).sum()).backward()

    mll_step()
    times["MLL"] = _clock(mll_step, calls)
    for m in (1, 32, 512):
        tests = [torch.rand(m, d, generator=gen, dtype=torch.float64) for _ in range(calls + 1)]

        def posterior(test):
            with torch.no_grad():
                p = model.posterior(test)
                return p.mean, p.variance

        first = []
        for test in tests[:3]:
            model.train()
            model.eval()
            start = time.process_time()
            posterior(test)
            first.append(time.process_time() - start)
        times[f"post {m} first"] = statistics.median(first)
        iterator = iter(tests[1:])
        times[f"post {m} rep"] = _clock(lambda: posterior(next(iterator)), calls)
    model.eval()
    candidates = torch.rand(32, 1, d, generator=gen, dtype=torch.float64)
    for name, acquisition in [("LogEI", LogExpectedImprovement(model, best_f=model.train_targets.max())),
                              ("qLogNEI", qLogNoisyExpectedImprovement(model, X_baseline=x))]:
        def step():
            X = candidates.clone().requires_grad_(True)
            torch.autograd.grad(acquisition(X).sum(), X)

        step()
        times[name] = _clock(step, calls)
    return times


def run(sizes, dims, repeats: int, calls: int, rows: list[str], names: list[str] | None = None) -> None:
    for d in dims:
        for n in sizes:
            models, x, y = _models(n, d, names)
            samples = {name: {} for name in models}
            for repeat in range(repeats):
                for name, model in models.items():
                    gen = torch.Generator().manual_seed(repeat)
                    for column, seconds in _measure(model, x, y, gen, calls).items():
                        samples[name].setdefault(column, []).append(seconds)
            medians = {name: {c: statistics.median(v) for c, v in s.items()} for name, s in samples.items()}
            for name, cells in medians.items():
                reference = medians.get("exact Matérn" if "Matérn" in name else "exact RBF")
                text = []
                for column in COLUMNS:
                    cell = f"{1e3 * cells[column]:.2f}"
                    if not name.startswith("exact") and reference is not None:
                        cell += f" ({cells[column] / reference[column]:.1f}×)"
                    text.append(cell)
                rows.append(f"| {n} | {d} | {name} | " + " | ".join(text) + " |")
                print(rows[-1], flush=True)


def _table(label: str) -> tuple[str, dict]:
    lines = (RESULTS / f"small_data_overhead_{label}.md").read_text().splitlines()
    rows = {}
    for line in lines[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 + len(COLUMNS):
            rows[tuple(cells[:3])] = [float(c.split()[0]) for c in cells[3:]]
    return lines[0], rows


def compare(before: str, after: str, output: str = "small_data_overhead") -> None:
    """results/<output>.md (default small_data_overhead.md): per cell the rfgp model's ratio to the exact model
    before → after (each against the exact model of its own run, which absorbs the machine's load), and the rfgp
    time before → after."""
    (head_before, old), (head_after, new) = _table(before), _table(after)
    text = ["Small-data overhead before → after (ratio to the exact model of the same family in its own run, then "
            "milliseconds per call before → after).", "", f"Before: {head_before}", "", f"After: {head_after}", "",
            "| N | d | model | " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---|" * len(COLUMNS)]
    for key, values in new.items():
        n, d, name = key
        if name.startswith("exact") or key not in old:
            continue
        reference = "exact Matérn" if "Matérn" in name else "exact RBF"
        ratios_old = [a / b for a, b in zip(old[key], old[(n, d, reference)])]
        ratios_new = [a / b for a, b in zip(values, new[(n, d, reference)])]
        cells = [f"{ro:.1f}× → {rn:.1f}× ({a:.2f} → {b:.2f})"
                 for ro, rn, a, b in zip(ratios_old, ratios_new, old[key], values)]
        text.append(f"| {n} | {d} | {name} | " + " | ".join(cells) + " |")
    (RESULTS / f"{output}.md").write_text("\n".join(text) + "\n")
    print("\n".join(text))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 10 and 200, d = 2, one repeat (≈ 1 min)")
    parser.add_argument("--label", default=None, help="suffix of the results file (e.g. before / after)")
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"), default=None,
                        help="labels of two results files to set side by side in results/small_data_overhead.md")
    parser.add_argument("--output", default="small_data_overhead", help="the --compare table's file name (no .md)")
    parser.add_argument("--models", default=None,
                        help="comma-separated model names to measure (e.g. 'exact RBF,RFF 256,Maclaurin 256')")
    parser.add_argument("--sizes", default=None, help="comma-separated N (default 10,50,200,500)")
    parser.add_argument("--dims", default=None, help="comma-separated d (default 2,6)")
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare, output=args.output)
        return
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = ["| N | d | model | " + " | ".join(COLUMNS) + " |", "|---|---|---|" + "---|" * len(COLUMNS)]
    load_before = os.getloadavg()
    names = None if args.models is None else [name.strip() for name in args.models.split(",")]
    sizes = [10, 200] if args.quick else [10, 50, 200, 500]
    dims = [2] if args.quick else [2, 6]
    sizes = sizes if args.sizes is None else [int(v) for v in args.sizes.split(",")]
    dims = dims if args.dims is None else [int(v) for v in args.dims.split(",")]
    run(sizes, dims, 1 if args.quick else 3, 5, rows, names)
    load_after = os.getloadavg()
    command = " ".join(["python benchmarks/small_data_overhead.py", *(["--quick"] if args.quick else []),
                        *([f"--label {args.label}"] if args.label else []),
                        *([f"--models '{args.models}'"] if args.models else []),
                        *([f"--sizes {args.sizes}"] if args.sizes else []),
                        *([f"--dims {args.dims}"] if args.dims else [])])
    text = "\n".join([
        f"`{command}` (torch {torch.__version__}, rfgp at {pathlib.Path(rfgp.__file__).parent}, one thread, CPU "
        f"time, float64, milliseconds per call, medians of paired repeats, ratio to the exact model of the same "
        f"family in brackets; load average (1, 5, 15 min) {load_before[0]:.2f}, {load_before[1]:.2f}, "
        f"{load_before[2]:.2f} at the start and {load_after[0]:.2f}, {load_after[1]:.2f}, {load_after[2]:.2f} at "
        f"the end).", "", *rows, ""])
    print(text)
    name = "small_data_overhead" + ("_quick" if args.quick else "") + (f"_{args.label}" if args.label else "")
    (RESULTS / f"{name}.md").write_text(text)


if __name__ == "__main__":
    main()
