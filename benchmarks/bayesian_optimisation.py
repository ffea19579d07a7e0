"""Bayesian optimisation with BoTorch: exact ``SingleTaskGP`` against the same model with an rfgp kernel.

The rfgp model is BoTorch's default ``SingleTaskGP`` with its default kernel (RBF, dimension-scaled
LogNormal lengthscale prior, BoTorch 0.18) converted by ``rfgp.sketch(..., method="orf"|"sorf")``
— same priors, likelihood, ``Normalize``/``Standardize`` transforms, ``fit_gpytorch_mll`` (scipy
L-BFGS-B) and acquisition optimisation.  Three studies, each in the same run for both models:

1. throughput — Hartmann-6 with N = 1 000, 5 000, 20 000 noisy observations: time of one BO
   iteration = ``fit_gpytorch_mll`` + ``optimize_acqf(qLogExpectedImprovement)``; the exact
   model is skipped above ``--exact-max`` points (its N × N Cholesky per L-BFGS step);
2. sample efficiency — simple regret on Branin and Hartmann-6 from 20 Sobol points over 40
   iterations of qLogNoisyExpectedImprovement (q = 1), ≥ 10 seeds, exact vs ORF and SORF;
3. Thompson sampling — Hartmann-6 from 20 points: rfgp's pathwise posterior draws
   (``get_matheron_path_model``: the kernel's own Φ, weight-space update) maximised over 10⁵
   random candidates against BoTorch's exact-posterior ``MaxPosteriorSampling`` over the largest
   candidate set its joint covariance allows (``--exact-candidates``, 5 000 by default: 10⁵
   candidates would need a 10⁵ × 10⁵ covariance): time per proposal and regret.

Outputs ``benchmarks/results/bayesian_optimisation{_quick}.{md,csv,png}`` with the machine load
(``os.getloadavg``) at start and end.

    python benchmarks/bayesian_optimisation.py --quick                # smoke run (~1 minute)
    python benchmarks/bayesian_optimisation.py                        # the full study (hours on 2 cores)
    python benchmarks/bayesian_optimisation.py --seeds 3 --iterations 15 --sizes 1000 5000
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402
from botorch.acquisition import qLogExpectedImprovement, qLogNoisyExpectedImprovement  # noqa: E402
from botorch.fit import fit_gpytorch_mll  # noqa: E402
from botorch.generation import MaxPosteriorSampling  # noqa: E402
from botorch.models import SingleTaskGP  # noqa: E402
from botorch.models.transforms import Normalize, Standardize  # noqa: E402
from botorch.models.utils.gpytorch_modules import get_covar_module_with_dim_scaled_prior  # noqa: E402
from botorch.optim import optimize_acqf  # noqa: E402
from botorch.sampling.pathwise import get_matheron_path_model  # noqa: E402
from botorch.test_functions import Branin, Hartmann  # noqa: E402
from botorch.utils.sampling import draw_sobol_samples  # noqa: E402
from gpytorch.mlls import ExactMarginalLogLikelihood  # noqa: E402

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
DTYPE = torch.float64
NOISE_STD = 0.05
PROBLEMS = {"branin": lambda: Branin(negate=True), "hartmann6": lambda: Hartmann(dim=6, negate=True)}


def make_model(kind: str, x: torch.Tensor, y: torch.Tensor, num_features: int) -> SingleTaskGP:
    """BoTorch's default SingleTaskGP; for rfgp kinds its default kernel sketched with ``rfgp.sketch``."""
    covar = None
    if kind != "exact":
        default = get_covar_module_with_dim_scaled_prior(ard_num_dims=x.shape[-1])
        covar = rfgp.sketch(default, num_features, method=kind)
    return SingleTaskGP(x, y, covar_module=covar, input_transform=Normalize(x.shape[-1]),
                        outcome_transform=Standardize(1)).to(DTYPE)


def fit(model: SingleTaskGP, maxiter: int) -> None:
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model),
                     optimizer_kwargs={"options": {"maxiter": maxiter}})


def observe(problem, x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    noise = NOISE_STD * torch.randn(x.shape[0], generator=generator, dtype=DTYPE)
    return (problem(x) + noise).unsqueeze(-1)


def initial_points(problem, n: int, seed: int) -> torch.Tensor:
    return draw_sobol_samples(problem.bounds.to(DTYPE), n=n, q=1, seed=seed).squeeze(-2)


# ------------------------------------------------------------------------- 1. throughput
def throughput(args) -> list[dict]:
    problem = PROBLEMS["hartmann6"]()
    rows = []
    for n in args.sizes:
        generator = torch.Generator().manual_seed(n)
        x = initial_points(problem, n, seed=n)
        y = observe(problem, x, generator)
        for kind in ("exact", args.method):
            if kind == "exact" and n > args.exact_max:
                rows.append({"study": "throughput", "model": kind, "n": n, "note": f"skipped: N > --exact-max={args.exact_max}"})
                print(f"throughput N={n} exact skipped (N > {args.exact_max})", flush=True)
                continue
            torch.manual_seed(0)
            model = make_model(kind, x, y, args.features)
            start = time.perf_counter()
            fit(model, args.maxiter)
            fitted = time.perf_counter()
            acqf = qLogExpectedImprovement(model.eval(), best_f=y.max())
            optimize_acqf(acqf, problem.bounds.to(DTYPE), q=1, num_restarts=args.restarts,
                          raw_samples=args.raw_samples, options={"maxiter": args.acqf_maxiter})
            done = time.perf_counter()
            row = {"study": "throughput", "model": kind, "n": n, "fit_s": fitted - start,
                   "acqf_s": done - fitted, "iteration_s": done - start}
            rows.append(row)
            print(f"throughput N={n} {kind}: fit {row['fit_s']:.2f} s, acqf {row['acqf_s']:.2f} s", flush=True)
    return rows


# --------------------------------------------------------------------- 2. regret curves
def regret_run(problem_name: str, kind: str, seed: int, args) -> list[float]:
    problem = PROBLEMS[problem_name]()
    bounds = problem.bounds.to(DTYPE)
    generator = torch.Generator().manual_seed(10_000 + seed)
    x = initial_points(problem, args.initial, seed)
    y = observe(problem, x, generator)
    best_true = problem(x).max()
    regrets = [float(problem.optimal_value - best_true)]
    for _ in range(args.iterations):
        torch.manual_seed(seed)
        model = make_model(kind, x, y, args.features)
        fit(model, args.maxiter)
        acqf = qLogNoisyExpectedImprovement(model.eval(), X_baseline=x, prune_baseline=True)
        candidate, _ = optimize_acqf(acqf, bounds, q=1, num_restarts=args.restarts, raw_samples=args.raw_samples,
                                     options={"maxiter": args.acqf_maxiter})
        x = torch.cat((x, candidate))
        y = torch.cat((y, observe(problem, candidate, generator)))
        best_true = torch.maximum(best_true, problem(candidate).max())
        regrets.append(float(problem.optimal_value - best_true))
    return regrets


def regret_curves(args) -> list[dict]:
    rows = []
    for problem_name in args.problems:
        for kind in ("exact", "orf", "sorf"):
            for seed in range(args.seeds):
                start = time.perf_counter()
                regrets = regret_run(problem_name, kind, seed, args)
                elapsed = time.perf_counter() - start
                rows.extend({"study": "regret", "problem": problem_name, "model": kind, "seed": seed,
                             "iteration": i, "regret": r, "run_s": elapsed} for i, r in enumerate(regrets))
                print(f"regret {problem_name} {kind} seed {seed}: final {regrets[-1]:.4f} ({elapsed:.0f} s)", flush=True)
    return rows


# ----------------------------------------------------------------- 3. Thompson sampling
def thompson_run(kind: str, seed: int, args) -> tuple[list[float], float]:
    problem = PROBLEMS["hartmann6"]()
    bounds = problem.bounds.to(DTYPE)
    generator = torch.Generator().manual_seed(20_000 + seed)
    x = initial_points(problem, args.initial, seed)
    y = observe(problem, x, generator)
    best_true = problem(x).max()
    regrets, proposal_s = [float(problem.optimal_value - best_true)], []
    num_candidates = args.candidates if kind != "exact" else args.exact_candidates
    for _ in range(args.ts_iterations):
        torch.manual_seed(seed)
        model = make_model("exact" if kind == "exact" else args.method, x, y, args.features)
        fit(model, args.maxiter)
        model.eval()
        candidates = bounds[0] + (bounds[1] - bounds[0]) * torch.rand(num_candidates, bounds.shape[-1], dtype=DTYPE)
        start = time.perf_counter()
        with torch.no_grad():
            if kind == "exact":
                candidate = MaxPosteriorSampling(model, replacement=False)(candidates, num_samples=1)
            else:
                path = get_matheron_path_model(model)
                candidate = candidates[path(candidates).squeeze(-1).argmax()].unsqueeze(0)
        proposal_s.append(time.perf_counter() - start)
        x = torch.cat((x, candidate))
        y = torch.cat((y, observe(problem, candidate, generator)))
        best_true = torch.maximum(best_true, problem(candidate).max())
        regrets.append(float(problem.optimal_value - best_true))
    return regrets, statistics.median(proposal_s)


def thompson(args) -> list[dict]:
    rows = []
    for kind in ("exact", "pathwise"):
        for seed in range(args.ts_seeds):
            regrets, proposal = thompson_run(kind, seed, args)
            candidates = args.exact_candidates if kind == "exact" else args.candidates
            rows.extend({"study": "thompson", "model": kind, "seed": seed, "iteration": i, "regret": r,
                         "proposal_s": proposal, "candidates": candidates} for i, r in enumerate(regrets))
            print(f"thompson {kind} seed {seed}: {candidates} candidates, proposal {proposal:.3f} s, "
                  f"final regret {regrets[-1]:.4f}", flush=True)
    return rows


# ------------------------------------------------------------------------------ output
def mean_se(values: list[float]) -> tuple[float, float]:
    mean = statistics.fmean(values)
    se = statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else float("nan")
    return mean, se


def final_regrets(rows: list[dict], study: str, key: tuple) -> dict:
    last = {}
    for row in rows:
        if row["study"] == study:
            group = tuple(row[k] for k in key)
            last.setdefault(group, {})[row["seed"]] = row  # keeps the last iteration per seed
    return {group: [r["regret"] for r in seeds.values()] for group, seeds in last.items()}


def command_arguments() -> str:
    """The command line without the ``--note`` text (printed as its own paragraph)."""
    arguments, skip = [], False
    for argument in sys.argv[1:]:
        if skip or argument == "--note":
            skip = argument == "--note"
            continue
        arguments.append(argument)
    return " ".join(arguments)


def write_results(rows: list[dict], name: str, args, loads: tuple[float, float]) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    fields = sorted({k for row in rows for k in row})
    write_csv(RESULTS / f"{name}.csv", rows, fields)
    lines = [f"# Bayesian optimisation: exact SingleTaskGP vs rfgp ({name})", "",
             f"Command: `python benchmarks/bayesian_optimisation.py {command_arguments()}`.  "
             f"rfgp kernel: `rfgp.sketch(BoTorch default RBF kernel, F={args.features})`, float64, "
             f"fit_gpytorch_mll with L-BFGS-B maxiter={args.maxiter}, optimize_acqf num_restarts={args.restarts}, "
             f"raw_samples={args.raw_samples}, maxiter={args.acqf_maxiter}.  Machine load (1-min loadavg) "
             f"{loads[0]:.1f} at start, {loads[1]:.1f} at end, on a shared 2-core CPU: absolute times are "
             "inflated, compare the two models within a row.", ""]
    if args.note:
        lines += [f"**Note:** {args.note}", ""]
    throughput_rows = [r for r in rows if r["study"] == "throughput"]
    if throughput_rows:
        lines += ["## 1. Time per BO iteration (Hartmann-6, fit + qLogEI optimisation)", "",
                  "| N | model | fit (s) | acquisition (s) | iteration (s) |", "|---|---|---|---|---|"]
        for r in throughput_rows:
            if "note" in r:
                lines.append(f"| {r['n']} | {r['model']} | — | — | {r['note']} |")
            else:
                lines.append(f"| {r['n']} | {r['model']} | {r['fit_s']:.2f} | {r['acqf_s']:.2f} | {r['iteration_s']:.2f} |")
        lines.append("")
    finals = final_regrets(rows, "regret", ("problem", "model"))
    if finals:
        lines += [f"## 2. Simple regret after {args.iterations} iterations ({args.initial} initial points, "
                  f"{args.seeds} seeds, mean ± SE)", "",
                  "| problem | model | final regret | difference to exact (SE units) |", "|---|---|---|---|"]
        for (problem, model), values in sorted(finals.items()):
            mean, se = mean_se(values)
            exact_mean, exact_se = mean_se(finals.get((problem, "exact"), values))
            z = (mean - exact_mean) / math.hypot(se, exact_se) if model != "exact" and se + exact_se > 0 else float("nan")
            lines.append(f"| {problem} | {model} | {mean:.4f} ± {se:.4f} | {'—' if model == 'exact' else f'{z:+.2f}'} |")
        lines.append("")
    ts = final_regrets(rows, "thompson", ("model",))
    if ts:
        lines += [f"## 3. Thompson sampling on Hartmann-6 ({args.ts_iterations} iterations, {args.ts_seeds} seeds)", "",
                  "| sampler | candidates | proposal time (s, median) | final regret (mean ± SE) |", "|---|---|---|---|"]
        for (model,), values in sorted(ts.items()):
            proposal = statistics.median(r["proposal_s"] for r in rows if r["study"] == "thompson" and r["model"] == model)
            candidates = next(r["candidates"] for r in rows if r["study"] == "thompson" and r["model"] == model)
            mean, se = mean_se(values)
            label = "exact MaxPosteriorSampling" if model == "exact" else f"rfgp pathwise ({args.method})"
            lines.append(f"| {label} | {candidates} | {proposal:.3f} | {mean:.4f} ± {se:.4f} |")
        lines.append("")
    (RESULTS / f"{name}.md").write_text("\n".join(lines))
    plot(rows, name)
    print("\n".join(lines))


def plot(rows: list[dict], name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    problems = sorted({r["problem"] for r in rows if r["study"] == "regret"})
    throughput_rows = [r for r in rows if r["study"] == "throughput" and "note" not in r]
    thompson_rows = [r for r in rows if r["study"] == "thompson"]
    panels = bool(throughput_rows) + len(problems) + bool(thompson_rows)
    fig, axes = plt.subplots(1, panels, figsize=(4.2 * panels, 3.6), squeeze=False)
    axes = list(axes[0])
    if throughput_rows:
        ax = axes.pop(0)
        for model in sorted({r["model"] for r in throughput_rows}):
            points = [(r["n"], r["iteration_s"]) for r in throughput_rows if r["model"] == model]
            ax.plot(*zip(*points), "o-", label=model)
        ax.set(xscale="log", yscale="log", xlabel="N observations", ylabel="s per BO iteration",
               title="Hartmann-6: fit + qLogEI")
        ax.legend()
    for problem in problems:
        _regret_panel(axes.pop(0), [r for r in rows if r["study"] == "regret" and r["problem"] == problem], problem)
    if thompson_rows:
        _regret_panel(axes.pop(0), thompson_rows, "Hartmann-6 Thompson sampling")
    fig.tight_layout()
    fig.savefig(RESULTS / f"{name}.png", dpi=110)


def _regret_panel(ax, rows: list[dict], title: str) -> None:
    for model in sorted({r["model"] for r in rows}):
        series = {}
        for r in rows:
            if r["model"] == model:
                series.setdefault(r["iteration"], []).append(max(r["regret"], 1e-6))
        steps = sorted(series)
        means = torch.tensor([statistics.fmean(series[s]) for s in steps])
        ses = torch.tensor([mean_se(series[s])[1] if len(series[s]) > 1 else 0.0 for s in steps])
        ax.plot(steps, means, label=model)
        ax.fill_between(steps, (means - ses).clamp_min(1e-6), means + ses, alpha=0.2)
    ax.set(yscale="log", xlabel="iteration", ylabel="simple regret", title=title)
    ax.legend()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, 1 seed, few iterations")
    parser.add_argument("--studies", nargs="+", default=["throughput", "regret", "thompson"])
    parser.add_argument("--sizes", nargs="+", type=int, default=[1000, 5000, 20000])
    parser.add_argument("--exact-max", type=int, default=5000, help="largest N the exact model is timed at")
    parser.add_argument("--method", default="orf", choices=["rff", "orf", "sorf"], help="sketch for studies 1 and 3")
    parser.add_argument("--features", type=int, default=1024)
    parser.add_argument("--problems", nargs="+", default=["branin", "hartmann6"])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--initial", type=int, default=20)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--ts-seeds", type=int, default=10)
    parser.add_argument("--ts-iterations", type=int, default=20)
    parser.add_argument("--candidates", type=int, default=100_000)
    parser.add_argument("--exact-candidates", type=int, default=5000)
    parser.add_argument("--maxiter", type=int, default=100, help="L-BFGS-B iterations per fit")
    parser.add_argument("--restarts", type=int, default=4)
    parser.add_argument("--raw-samples", type=int, default=256)
    parser.add_argument("--acqf-maxiter", type=int, default=50)
    parser.add_argument("--note", default="", help="text written at the top of the results (reduced runs say why)")
    parser.add_argument("--name", default=None)
    args = parser.parse_args()
    if args.quick:
        args.sizes, args.exact_max, args.features = [300, 1000], 300, 128
        args.seeds, args.iterations, args.ts_seeds, args.ts_iterations = 2, 3, 2, 3
        args.candidates, args.exact_candidates, args.maxiter = 20_000, 500, 20
        args.restarts, args.raw_samples, args.acqf_maxiter = 2, 32, 10
        args.note = args.note or "--quick smoke run: tiny sizes, 2 seeds, 3 iterations — not a result"
    torch.set_num_threads(max(1, torch.get_num_threads()))
    name = args.name or ("bayesian_optimisation_quick" if args.quick else "bayesian_optimisation")
    load_start = os.getloadavg()[0]
    rows = []
    studies = {"throughput": throughput, "regret": regret_curves, "thompson": thompson}
    for study in args.studies:
        rows += studies[study](args)
    write_results(rows, name, args, (load_start, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
