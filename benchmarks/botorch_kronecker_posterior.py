"""BoTorch's KroneckerMultiTaskGP: exact vs its MultitaskKernel converted by ``rfgp.sketch`` (F data features), timed
alternately in one process on one thread; and the sketched model's posterior at N up to 20 000, old rfgp vs new.

Exact vs rfgp (the default run), per model and repeat: ``posterior`` with cold caches (after ``train()``/``eval()``:
BoTorch eigendecomposes the training covariance's factors and solves for the mean cache), then a warm ``posterior`` of
q = 8 points with 64 Matheron samples (an acquisition step's model work), then one marginal-likelihood step (loss +
backward).

Posterior at scale (``--scale``, with ``--baseline DIR``: an rfgp checkout of the code to compare against, e.g.
``git worktree add /tmp/old <commit>``): per N, task noise (BoTorch's per-task diagonal noise, or
``likelihood_rank=1``) and implementation, a fresh process (``fresh_process``; the implementations alternate) builds the
sketched model (p = 2 tasks, F = 256, BoTorch's defaults), then times ``posterior`` of 1000 points (mean and variance)
and one ``rsample(64)``, and reads its peak resident memory (``VmHWM``) over the resident memory before the posterior;
the two implementations' means, variances and samples (same seed) are compared.  ``--quick``: N = 2000 only, one
repeat, printed, not written (under a minute).

A rank-1 task noise above BoTorch's ``max_cholesky_size`` (``--rank-one N``): the exact and sketched models' posterior
variance with BoTorch's defaults (Lanczos) and under ``gpytorch.settings.max_cholesky_size(N + 1)`` (dense).

Writes ``benchmarks/results/botorch_kronecker_posterior.md`` (its section for the part run) with the machine load
(``os.getloadavg()``).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import torch
from botorch.models import KroneckerMultiTaskGP
from gpytorch.mlls import ExactMarginalLogLikelihood

import rfgp

sys.path.insert(0, os.path.dirname(__file__))
from fresh_process import add_case_option, answer_case, run_case  # noqa: E402  (benchmarks/, the script's folder)

NUM_DATA, DIM, WIDTH, REPEATS = 2000, 3, 256, 3
RESULTS = os.path.join(os.path.dirname(__file__), "results", "botorch_kronecker_posterior.md")
SCALE_HEADING = "## The sketched model's posterior at scale: old vs new rfgp"
RANK_ONE_HEADING = "## A rank-1 task noise above BoTorch's max_cholesky_size: the posterior variance"
SCALE_BUDGET = 8 * 2**30  # rfgp.settings.memory_budget for the scale section (bytes)


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def phases(model, x, test):
    mll = ExactMarginalLogLikelihood(model.likelihood, model)

    def cold():
        model.train()
        model.eval()
        with torch.no_grad():
            posterior = model.posterior(test)
            posterior.mean, posterior.variance

    def sample():
        with torch.no_grad():
            model.posterior(test).rsample(torch.Size([64]))

    def step():
        model.train()
        model.zero_grad()
        (-mll(model(x), model.train_targets)).backward()
        model.eval()

    return {"cold posterior": cold, "warm posterior + 64 samples": sample, "MLL + gradient": step}


def build(x, y, width):
    torch.manual_seed(0)
    model = KroneckerMultiTaskGP(x, y)
    with torch.no_grad():
        model.likelihood.task_noises = torch.linspace(0.01, 0.05, y.shape[-1], dtype=torch.float64)
        model.covar_module.data_covar_module.lengthscale = 0.3
    if width is not None:
        model.covar_module = rfgp.sketch(model.covar_module, width, seed=0)
    return model.eval()


def exact_vs_rfgp() -> list[str]:
    rows = []
    for num_tasks in (2, 4):
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(NUM_DATA, DIM, generator=generator, dtype=torch.float64)
        y = torch.stack([torch.sin((t + 2) * x[:, t % DIM]) for t in range(num_tasks)], -1)
        y = y + 0.1 * torch.randn(NUM_DATA, num_tasks, generator=generator, dtype=torch.float64)
        test = torch.rand(8, DIM, generator=generator, dtype=torch.float64)
        models = {"exact": phases(build(x, y, None), x, test), "rfgp": phases(build(x, y, WIDTH), x, test)}
        for phase in models["exact"]:
            times = {name: [] for name in models}
            for name in models:
                models[name][phase]()  # untimed warm-up
            for _ in range(REPEATS):
                for name in models:
                    times[name].append(timed(models[name][phase]))
            medians = {name: statistics.median(t) for name, t in times.items()}
            rows.append((num_tasks, phase, medians["exact"], medians["rfgp"], medians["exact"] / medians["rfgp"]))
            print(rows[-1], os.getloadavg(), flush=True)
    load = os.getloadavg()
    lines = [
        "# BoTorch KroneckerMultiTaskGP: exact vs rfgp.sketch of its MultitaskKernel",
        "",
        f"N = {NUM_DATA}, d = {DIM}, BoTorch's defaults (full-rank task covariance, per-task noise, Standardize), "
        f"F = {WIDTH} data features (root width F·2p), float64, one thread, median of {REPEATS} alternated runs "
        "after one untimed each. Cold posterior: caches cleared (train()/eval()), then posterior mean and variance of "
        "8 points; warm: posterior of 8 points and 64 Matheron samples with the training caches kept; MLL: one loss + "
        f"backward. Load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores).",
        "",
        "| tasks p | phase | exact (s) | rfgp (s) | speed-up |",
        "|---|---|---|---|---|",
        *[f"| {p} | {phase} | {e:.3f} | {r:.3f} | {s:.1f}× |" for p, phase, e, r, s in rows],
        "",
    ]
    return lines


def resident_mib() -> float:
    """This process's peak resident memory (``VmHWM``, MiB): torch's allocations included, which tracemalloc misses."""
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) / 1024 for line in status if line.startswith("VmHWM"))


def scale_model(num_data: int, noise: str, sketched: bool, num_test: int) -> tuple[KroneckerMultiTaskGP, torch.Tensor]:
    """(model in eval mode, test points) of the scale sections: p = 2 tasks, BoTorch's defaults, its per-task
    ``"diagonal"`` noise or a ``"rank 1"`` task noise; the MultitaskKernel sketched at F = WIDTH or exact."""
    from gpytorch.likelihoods import MultitaskGaussianLikelihood

    generator = torch.Generator().manual_seed(0)
    x = torch.rand(num_data, DIM, generator=generator, dtype=torch.float64)
    y = torch.stack([torch.sin(3 * x[:, 0]), torch.cos(2 * x[:, 1])], -1)
    y = y + 0.1 * torch.randn(num_data, 2, generator=generator, dtype=torch.float64)
    test = torch.rand(num_test, DIM, generator=generator, dtype=torch.float64)
    torch.manual_seed(0)
    likelihood = None if noise == "diagonal" else MultitaskGaussianLikelihood(2, rank=1).double()
    model = KroneckerMultiTaskGP(x, y, likelihood=likelihood)
    if sketched:
        model.covar_module = rfgp.sketch(model.covar_module, WIDTH, seed=0)
    return model.eval(), test


def measure_scale(num_data: int, noise: str, output: str) -> dict:
    """One case of the scale section, in this (fresh) process: times, peak memory, and the results saved to
    ``output`` for the comparison of the implementations."""
    torch.set_num_threads(1)
    model, test = scale_model(num_data, noise, sketched=True, num_test=1000)
    before = resident_mib()
    # at N = 20 000 the training root (N·p × F·2p) exceeds the default budget, and its chunked covariance has no
    # Kronecker factors for BoTorch's posterior
    with torch.no_grad(), rfgp.settings.memory_budget(SCALE_BUDGET):
        start = time.perf_counter()
        posterior = model.posterior(test)
        mean, variance = posterior.mean, posterior.variance
        posterior_seconds = time.perf_counter() - start
        torch.manual_seed(1)
        start = time.perf_counter()
        samples = posterior.rsample(torch.Size([64]))
        sample_seconds = time.perf_counter() - start
    torch.save({"mean": mean, "variance": variance, "samples": samples}, output)
    return {"posterior_s": posterior_seconds, "rsample_s": sample_seconds, "peak_mib": resident_mib() - before,
            "rfgp": os.path.dirname(os.path.dirname(rfgp.__file__))}


def scale(baseline: str, sizes: list[int], repeats: int) -> list[str]:
    """The scale section's lines: old (``baseline``) and new (this checkout) alternated in fresh processes."""
    implementations = {"old": baseline, "new": os.path.dirname(os.path.dirname(os.path.abspath(__file__)))}
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        for num_data in sizes:
            for noise in ("diagonal", "rank 1"):
                runs = {name: [] for name in implementations}
                for repeat in range(repeats):
                    for name, checkout in implementations.items():
                        case = {"num_data": num_data, "noise": noise, "output": os.path.join(folder, f"{name}.pt")}
                        runs[name].append(run_case(__file__, case, {"PYTHONPATH": checkout}))
                        assert runs[name][-1]["rfgp"] == checkout, runs[name][-1]["rfgp"]
                old, new = (torch.load(os.path.join(folder, f"{name}.pt")) for name in implementations)
                difference = {key: float((old[key] - new[key]).abs().max()) for key in old}
                medians = {name: {key: statistics.median(run[key] for run in rs) for key in ("posterior_s", "rsample_s",
                                                                                              "peak_mib")}
                           for name, rs in runs.items()}
                rows.append((num_data, noise, medians, difference, float(new["variance"].mean())))
                print(rows[-1], os.getloadavg(), flush=True)
    load = os.getloadavg()
    return [
        SCALE_HEADING,
        "",
        f"p = 2 tasks, d = {DIM}, F = {WIDTH} data features, BoTorch's defaults (full-rank task covariance, "
        "Standardize) with its per-task diagonal noise or a rank-1 task noise (`MultitaskGaussianLikelihood(2, "
        "rank=1)`), float64, one thread. Posterior of 1000 points (mean and variance), then one `rsample(64)`; peak "
        "resident memory (`VmHWM`) over the resident memory before the posterior, each run in a fresh process, old "
        f"and new alternated, median of {repeats}. Old: the (N, F) data eigenvectors that BoTorch pads with an "
        "N × (N − F) zero tensor; new: square eigenvectors with implicit zero columns. Largest |old − new| over "
        "the means, variances and samples (same seed). Under `rfgp.settings.memory_budget(8 GiB)`, so that old and new "
        "run the same path: with the default 1 GiB the N = 20 000 training root is chunked, whose covariance gave "
        "BoTorch no Kronecker factors before fc61331 (it now does while φ fits the budget). Load average at the end: "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores).",
        "",
        "| N | task noise | posterior old → new (s) | rsample(64) old → new (s) | peak memory old → new (MiB) | "
        "largest difference | average posterior variance |",
        "|---|---|---|---|---|---|---|",
        *[f"| {n} | {noise} | {m['old']['posterior_s']:.2f} → {m['new']['posterior_s']:.2f} | "
          f"{m['old']['rsample_s']:.2f} → {m['new']['rsample_s']:.2f} | {m['old']['peak_mib']:.0f} → "
          f"{m['new']['peak_mib']:.0f} | {max(d.values()):.1e} | {variance:.3g} |"
          for n, noise, m, d, variance in rows],
        "",
        "Above N = 4096 (BoTorch's `max_cholesky_size`) the rank-1 rows' variances are BoTorch's Lanczos path, wrong "
        "for the exact model as for the sketched one (guide/botorch.md): linear_operator's diagonalization of the "
        "likelihood's constant data noise stops Lanczos after a step or two, so the whitening root has a couple of "
        "columns (next section).",
        "",
    ]


def rank_one_variance(num_data: int) -> list[str]:
    """The rank-1 section's lines: the posterior variance of 20 points under BoTorch's defaults and under
    ``gpytorch.settings.max_cholesky_size(N + 1)`` (dense eigendecompositions), exact and sketched models."""
    import gpytorch

    rows = []
    for name, sketched in (("exact", False), ("rfgp.sketch", True)):
        model, test = scale_model(num_data, "rank 1", sketched, num_test=20)
        with torch.no_grad(), rfgp.settings.memory_budget(SCALE_BUDGET):
            torch.manual_seed(0)  # Lanczos's initial vectors
            default = model.posterior(test).variance
            data_noise = model.likelihood._shaped_noise_covar(model.train_inputs[0].shape).linear_ops[0]
            whitening_rank = data_noise.root_inv_decomposition(method="diagonalization").root.shape[-1]
            model.train()
            model.eval()
            with gpytorch.settings.max_cholesky_size(num_data + 1):
                dense = model.posterior(test).variance
        rows.append((name, float(default.nanmean()), int(default.isnan().sum()), float(dense.mean()),
                     whitening_rank))
        print(rows[-1], os.getloadavg(), flush=True)
    load = os.getloadavg()
    return [
        RANK_ONE_HEADING,
        "",
        f"N = {num_data} (above BoTorch's `max_cholesky_size` 4096), p = 2 tasks, `MultitaskGaussianLikelihood(2, "
        f"rank=1)`, F = {WIDTH}, float64, one thread: BoTorch's posterior variance of 20 points with its defaults "
        "(Lanczos) and under `gpytorch.settings.max_cholesky_size(N + 1)` (dense eigendecompositions, O(N³)), and "
        "the number of columns of the data noise's inverse root that BoTorch whitens with "
        "(`root_inv_decomposition(method=\"diagonalization\")` of the likelihood's `ConstantDiagLinearOperator`; N "
        f"if exact). Load average at the end: {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores).",
        "",
        "| model | average variance, defaults (NaN excluded) | NaN of 40 | average variance, dense | "
        "columns of the whitening root |",
        "|---|---|---|---|---|",
        *[f"| {name} | {default:.3g} | {nans} | {dense:.3g} | {rank} |" for name, default, nans, dense, rank in rows],
        "",
    ]


def write_section(lines: list[str], heading: str | None) -> None:
    """Writes ``lines`` into the results file: its first part (``heading`` None) or the section ``heading`` (``## ``
    headings), the others kept."""
    text = open(RESULTS).read() if os.path.exists(RESULTS) else ""
    first, *sections = text.split("\n## ")
    sections = {"## " + section.split("\n", 1)[0]: "## " + section.rstrip("\n") for section in sections}
    if heading is None:
        first = "\n".join(lines)
    else:
        sections[heading] = "\n".join(lines).rstrip("\n")
    with open(RESULTS, "w") as handle:
        handle.write("\n\n".join([first.rstrip("\n"), *sections.values()]) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_case_option(parser)
    parser.add_argument("--scale", action="store_true", help="the posterior at scale, old (--baseline) vs new")
    parser.add_argument("--baseline", help="an rfgp checkout of the old code (for --scale)")
    parser.add_argument("--sizes", type=int, nargs="+", default=[2000, 8000, 20000])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="--scale at N = 2000, one repeat, printed only")
    parser.add_argument("--rank-one", type=int, metavar="N", help="the rank-1 task noise's variance at N points")
    args = parser.parse_args()
    if answer_case(args, measure_scale):
        return
    torch.set_num_threads(1)
    if args.rank_one:
        write_section(rank_one_variance(args.rank_one), RANK_ONE_HEADING)
        return
    if not (args.scale or args.quick):
        write_section(exact_vs_rfgp(), None)
        return
    if args.baseline is None:
        parser.error("--scale and --quick compare against --baseline DIR (an rfgp checkout of the old code)")
    sizes, repeats = ([2000], 1) if args.quick else (args.sizes, args.repeats)
    lines = scale(os.path.abspath(args.baseline), sizes, repeats)
    if args.quick:
        print("\n".join(lines))
    else:
        write_section(lines, SCALE_HEADING)


if __name__ == "__main__":
    main()
