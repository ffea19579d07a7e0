"""Multitask MLL and posterior of a sketched ``MultitaskKernel``: statistics from the Kronecker factors (new) against
the whitened interleaved root (old), timed alternately in one process on one thread, with the exact GPyTorch model.

Models, as a GPyTorch user writes them: ``MultitaskMean(ConstantMean)``, ``MultitaskKernel(RBFKernel(), T, rank=1)``
converted with ``rfgp.sketch(kernel, F)`` (F data features, root width F·(1 + T)), and

* "tutorial": GPyTorch's multitask tutorial likelihood ``MultitaskGaussianLikelihood(T)`` (per-task noise, diagonal);
* "correlated": ``MultitaskGaussianLikelihood(T, rank=1)`` (Σ_T = LLᵀ + σ²I).

Per model and repeat, old and new alternate (one untimed warm-up each): one MLL + gradient
(``ExactMarginalLogLikelihood``, loss + backward), and one cold posterior (``train()``/``eval()``, then mean and
variance at 1000 test points under ``torch.no_grad()``).  "old" is the same model with the Kronecker-factor path
switched off (the whitened-root statistics, and the kernel-space rule of the whitened root).  The exact model (the
GPyTorch ``MultitaskKernel``) is timed once per configuration in float64 where ``--exact`` allows.  Writes
``benchmarks/results/kronecker_gram.md`` with the machine load (``os.getloadavg()``).

BoTorch's ``KroneckerMultiTaskGP`` (its defaults: full-rank task covariance, per-task noise; root width F·2p) is timed
for one MLL + gradient, old against new, as built in ``botorch_kronecker_posterior.py``.

Under ``rfgp.settings.memory_budget`` (``--budget`` rows): GPyTorch's multitask tutorial model at N = 20 000, T = 3,
F = 512 (root 60 000 × 2 048, 3.9 GiB of working set; φ 20 000 × 512, 0.33 GiB), float64, at the default budget
(1 GiB: the root is chunked, φ fits) and at 64 MiB (φ in row blocks).  "old" sizes the chunking by the whole root and
takes the chunked whitened root's statistics; "new" sizes it by φ and keeps the Kronecker statistics
(:mod:`rfgp.inference.chunked_kronecker`).  MLL + gradient and the cold posterior, paired as above, and the peak RSS
of one MLL + gradient above the built model, each path in a fresh process.

Test side (``--test-side`` rows): the same models' predictions with warm caches, mean and variance at n* test points
(and their gradient w.r.t. the test inputs), "new" contracting the factors φ* and B of the test root
(:mod:`rfgp.inference.kronecker_posterior`), "old" pushing the test root φ* ⊗ B through the F·m-wide posterior; also
with the test covariance chunked (16 MiB budget), and one MLL + gradient of a covariance expanded to a batch of two
targets (the factors expanded with it, or a plain root).

``--quick``: N ≤ 500, one repeat, float64 only (under a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import multiprocessing
import os
import resource
import statistics
import sys
import time
from unittest import mock

import gpytorch
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import rfgp  # noqa: E402
from rfgp.inference import multioutput  # noqa: E402
from rfgp.inference.kronecker_tasks import KroneckerFeatureRootLinearOperator, KroneckerStatistics  # noqa: E402
from rfgp.inference.operators import FeatureRootLinearOperator  # noqa: E402
from rfgp.kernels import SketchedDecomposableKernel  # noqa: E402
from rfgp.kernels.random_feature_kernel import FeatureKernel  # noqa: E402
from tests._models import MultitaskGP  # noqa: E402

WIDTH, NUM_TEST, REPEATS = 256, 1000, 5
BUDGET_POINTS, BUDGET_TASKS, BUDGET_WIDTH, BUDGET_REPEATS = 20_000, 3, 512, 3
BUDGETS = {"1 GiB (default)": 2**30, "64 MiB": 64 * 2**20}
TEST_SIDE_COUNTS, TEST_SIDE_REPEATS, TEST_SIDE_BUDGET = (100, 1000, 3000), 3, 16 * 2**20


def build(x, y, noise_rank, width):
    torch.manual_seed(0)
    num_tasks = y.shape[-1]
    kernel = gpytorch.kernels.MultitaskKernel(gpytorch.kernels.RBFKernel(), num_tasks=num_tasks, rank=1)
    kernel.data_covar_module.lengthscale = 0.3
    if width is not None:
        kernel = rfgp.sketch(kernel, width)
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks, rank=noise_rank)
    return MultitaskGP(x, y, likelihood, kernel).to(x.dtype)


def phases(model, x, y, test):
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

    def step():
        model.train()
        model.zero_grad()
        (-mll(model(x), y)).backward()

    def posterior():
        model.train()
        model.eval()
        with torch.no_grad():
            prediction = model.likelihood(model(test))
            prediction.mean, prediction.variance

    return {"MLL + gradient": step, "posterior (1000 points)": posterior}


def timed(function) -> float:
    start = time.perf_counter()
    function()
    return time.perf_counter() - start


def switched(path: str):
    """The Kronecker-factor path as built (``new``) or switched off (``old``)."""
    if path == "new":
        return contextlib.nullcontext()
    return mock.patch.object(KroneckerStatistics, "_kronecker_noise", lambda self: None)


def budget_sized(path: str):
    """The chunking of a sketched ``MultitaskKernel`` over the budget sized by φ (``new``) or by the whole root, with
    the chunked whitened root's statistics (``old``)."""
    if path == "new":
        return contextlib.nullcontext()
    return mock.patch.object(SketchedDecomposableKernel, "_multi_output_prediction_forward",
                             FeatureKernel._multi_output_prediction_forward)


def data(num_points, num_tasks, dtype):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 1, generator=gen, dtype=torch.float64)
    phase = torch.linspace(0, 1, num_tasks, dtype=torch.float64)
    y = torch.sin(6 * x + phase) + 0.1 * torch.randn(num_points, num_tasks, generator=gen, dtype=torch.float64)
    test = torch.rand(NUM_TEST, 1, generator=gen, dtype=torch.float64)
    return x.to(dtype), y.to(dtype), test.to(dtype)


def paired(function, repeats, switch=switched) -> tuple[float, float]:
    """Median seconds of ``function`` on the (old, new) path, alternated after one untimed run each."""
    times = {"old": [], "new": []}
    for path in times:
        with switch(path):
            function()
    for _ in range(repeats):
        for path in times:
            with switch(path):
                times[path].append(timed(function))
    return statistics.median(times["old"]), statistics.median(times["new"])


def test_sided(path: str):
    """The test side contracted from the factors φ* and B (``new``) or through the test root φ* ⊗ B (``old``),
    materialised or chunked."""
    stack = contextlib.ExitStack()
    if path == "old":
        stack.enter_context(mock.patch.object(multioutput, "kronecker_test_factors", lambda covar: None))
        stack.enter_context(mock.patch.object(multioutput, "ChunkedKroneckerFeatureOperator", type("Plain", (), {})))
    return stack


def expansion(path: str):
    """A covariance expanded to a batch keeps its Kronecker factors (``new``) or is a plain root (``old``)."""
    if path == "new":
        return contextlib.nullcontext()
    plain = FeatureRootLinearOperator._expand_batch
    return mock.patch.object(KroneckerFeatureRootLinearOperator, "_expand_batch", plain)


def test_side_phases(model, test):
    def predict():
        with torch.no_grad():
            prediction = model.likelihood(model(test))
            prediction.mean, prediction.variance

    def gradient():
        inputs = test.clone().requires_grad_(True)
        prediction = model.likelihood(model(inputs))
        torch.autograd.grad((prediction.mean + prediction.variance).sum(), inputs)

    return {"mean + variance": predict, "mean + variance, gradient w.r.t. x*": gradient}


def run_test_side(configs, test_counts, repeats, budget=None):
    """Warm-cache predictions, old (test root) against new (factors), per model and number of test points; under
    ``rfgp.settings.memory_budget(budget)`` (the test covariance chunked) without gradients."""
    rows = []
    for name, num_points, num_tasks, noise_rank in configs:
        x, y, _ = data(num_points, num_tasks, torch.float64)
        model = build(x, y, noise_rank, WIDTH)
        model.eval()
        with rfgp.settings.memory_budget(budget or 2**30), torch.no_grad():
            model(x[:2])  # the caches, once
        for num_test in test_counts:
            test = torch.rand(num_test, 1, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
            for phase, function in test_side_phases(model, test).items():
                if budget is not None and "gradient" in phase:
                    continue
                with rfgp.settings.memory_budget(budget or 2**30):
                    old, new = paired(function, repeats, test_sided)
                label = name if budget is None else f"{name}, test covariance chunked ({budget // 2**20} MiB)"
                rows.append((label, num_points, num_tasks, num_test, phase, old, new))
                print(rows[-1], os.getloadavg(), flush=True)
    return rows


def run_expanded(num_points, num_tasks, repeats):
    """One MLL + gradient of the tutorial model with a batch of two targets and means over an unbatched kernel (its
    covariance expanded to the batch): Kronecker statistics (new) against the expanded plain root's (old)."""
    x, y, test = data(num_points, num_tasks, torch.float64)
    y = torch.stack((y, y.flip(-1)))
    model = build(x, y[0], 0, WIDTH)
    model.set_train_data(x, y, strict=False)
    model.mean_module = gpytorch.means.MultitaskMean(gpytorch.means.ConstantMean(batch_shape=torch.Size([2])),
                                                     num_tasks=num_tasks).double()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)

    def step():
        model.zero_grad()
        (-mll(model(x), y).sum()).backward()

    old, new = paired(step, repeats, expansion)
    row = ("tutorial, batch of 2 targets", num_points, num_tasks, "MLL + gradient", old, new)
    print(row, os.getloadavg(), flush=True)
    return [row]


def expanded_markdown(rows, repeats, load) -> str:
    lines = [
        "",
        "## Expanded to a batch: Kronecker factors kept (new) vs a plain expanded root (old)",
        "",
        f"GPyTorch's multitask tutorial model with two sets of targets (`y` of shape 2 × N × T, `MultitaskMean` with a "
        f"batch of 2) over the unbatched sketched kernel (`rfgp.sketch(kernel, {WIDTH})`): linear_operator's noise sum "
        "expands the covariance to the batch. Old: the expanded root lost its factors (whitened-root statistics, "
        "O(N·T·F²·m²); the chunked one raised AttributeError); new: the factors are expanded with it. float64, one CPU "
        f"thread, median of {repeats} alternated runs after one untimed each. Load average (1, 5, 15 min) at the end: "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores).",
        "",
        "| model | N | T | phase | old (s) | new (s) | old/new |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, num_points, num_tasks, phase, old, new in rows:
        lines.append(f"| {name} | {num_points} | {num_tasks} | {phase} | {old:.3f} | {new:.3f} | {old / new:.1f}× |")
    return "\n".join(lines) + "\n"


def test_side_markdown(rows, repeats, load) -> str:
    lines = [
        "",
        "## Test side: factors φ* and B (new) vs the test root φ* ⊗ B (old)",
        "",
        f"The models above (`rfgp.sketch(kernel, {WIDTH})`, root width F·m = {WIDTH}·(1 + T)), float64, warm posterior "
        "caches, one CPU thread, median of "
        f"{repeats} alternated runs after one untimed each. Load average (1, 5, 15 min) at the end: {load[0]:.2f}, "
        f"{load[1]:.2f}, {load[2]:.2f} (2 shared cores). Old: mean Φ*w and variance ‖Φ*L⁻ᵀ‖² per row "
        "(n*·T·(F·m)² flops); new (`rfgp.inference.kronecker_posterior`): mean φ*·W·Bᵀ, variance B_t·Mᵢ·B_tᵀ from "
        "C = A⁻¹ ((F·m)³ + n*·(F·m)² flops) where that is fewer, `likelihood(model(x*))` as in GPyTorch's tutorial.",
        "",
        "| model | N | T | n* | phase | old (s) | new (s) | old/new |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, num_points, num_tasks, num_test, phase, old, new in rows:
        lines.append(f"| {name} | {num_points} | {num_tasks} | {num_test} | {phase} | {old:.3f} | {new:.3f} | "
                     f"{old / new:.1f}× |")
    return "\n".join(lines) + "\n"


def _budget_model(num_points, width):
    x, y, test = data(num_points, BUDGET_TASKS, torch.float64)
    return build(x, y, 0, width), x, y, test


def _peak_rss_megabytes() -> float:
    """This process's peak RSS: Linux's VmHWM (the getrusage maximum survives exec, so a spawned child would start
    from its parent's RSS), ru_maxrss elsewhere."""
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith("VmHWM:"))
        return int(line.split()[1]) / 1024
    except (OSError, StopIteration):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _peak_worker(num_points, width, budget, path, queue):
    torch.set_num_threads(1)
    model, x, y, test = _budget_model(num_points, width)
    start = _peak_rss_megabytes()
    with rfgp.settings.memory_budget(budget), budget_sized(path):
        phases(model, x, y, test)["MLL + gradient"]()
    queue.put(_peak_rss_megabytes() - start)


def peak_megabytes(num_points, width, budget, path) -> float:
    """Peak RSS (MB) of one MLL + gradient above the built model, in a fresh process."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=_peak_worker, args=(num_points, width, budget, path, queue))
    process.start()
    result = queue.get()
    process.join()
    return result


def run_budget(num_points, width, budgets, repeats):
    """The tutorial model over the budget: old (sized by the root) against new (sized by φ)."""
    rows = []
    peaks = {label: {path: peak_megabytes(num_points, width, budget, path) for path in ("old", "new")}
             for label, budget in budgets.items()}
    model, x, y, test = _budget_model(num_points, width)
    steps = phases(model, x, y, test)
    for label, budget in budgets.items():
        for phase, function in steps.items():
            with rfgp.settings.memory_budget(budget):
                old, new = paired(function, repeats, budget_sized)
            peak = (peaks[label]["old"], peaks[label]["new"]) if phase == "MLL + gradient" else (None, None)
            rows.append((label, num_points, BUDGET_TASKS, width, phase, old, new, *peak))
            print(rows[-1], os.getloadavg(), flush=True)
    return rows


def budget_markdown(rows, repeats, load) -> str:
    lines = [
        "",
        "## Under the memory budget: sized by φ and Kronecker statistics (new) vs sized by the root, chunked whitened "
        "root (old)",
        "",
        f"GPyTorch's multitask tutorial model (`MultitaskGaussianLikelihood(T)`), `MultitaskKernel(RBFKernel(), T, "
        f"rank=1)` sketched at F data features (root width F·(1 + T)), float64, one CPU thread, median of {repeats} "
        "alternated runs after one untimed each; peak: RSS above the built model during one MLL + gradient, each "
        f"path in a fresh process. Load average (1, 5, 15 min) at the end: {load[0]:.2f}, {load[1]:.2f}, "
        f"{load[2]:.2f} (2 shared cores). At 1 GiB the root (N·T × F·m, 4 working copies: 3.9 GiB at N = 20 000, "
        "F = 512) is chunked while φ (0.33 GiB) fits: new takes the Kronecker statistics from φ whole; at 64 MiB φ is "
        "accumulated in row blocks.",
        "",
        "| budget | N | T | F | phase | old (s) | new (s) | old/new | old peak (MB) | new peak (MB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for label, num_points, num_tasks, width, phase, old, new, old_peak, new_peak in rows:
        peaks = "— | —" if old_peak is None else f"{old_peak:.0f} | {new_peak:.0f}"
        lines.append(f"| {label} | {num_points} | {num_tasks} | {width} | {phase} | {old:.3f} | {new:.3f} | "
                     f"{old / new:.1f}× | {peaks} |")
    return "\n".join(lines) + "\n"


def run(configs, dtypes, repeats, exact_limit):
    rows = []
    for name, num_points, num_tasks, noise_rank in configs:
        for dtype in dtypes:
            x, y, test = data(num_points, num_tasks, dtype)
            steps = phases(build(x, y, noise_rank, WIDTH), x, y, test)
            for phase, function in steps.items():
                old, new = paired(function, repeats)
                exact = None
                if num_points * num_tasks <= exact_limit and dtype == torch.float64:
                    exact = timed(phases(build(x, y, noise_rank, None), x, y, test)[phase])
                rows.append((name, num_points, num_tasks, str(dtype).removeprefix("torch."), phase, old, new, exact))
                print(rows[-1], os.getloadavg(), flush=True)
    return rows


def run_botorch(task_counts, repeats):
    """One MLL + gradient of BoTorch's ``KroneckerMultiTaskGP`` (its defaults, N = 2000, d = 3, float64) sketched as in
    ``botorch_kronecker_posterior.py`` (whose exact timings stand: this change does not touch them)."""
    import botorch_kronecker_posterior as reference

    rows = []
    for num_tasks in task_counts:
        generator = torch.Generator().manual_seed(0)
        x = torch.rand(reference.NUM_DATA, reference.DIM, generator=generator, dtype=torch.float64)
        y = torch.stack([torch.sin((t + 2) * x[:, t % reference.DIM]) for t in range(num_tasks)], -1)
        y = y + 0.1 * torch.randn(reference.NUM_DATA, num_tasks, generator=generator, dtype=torch.float64)
        model = reference.build(x, y, WIDTH)
        step = reference.phases(model, x, x[:8])["MLL + gradient"]
        old, new = paired(step, repeats)
        rows.append(("BoTorch KroneckerMultiTaskGP", reference.NUM_DATA, num_tasks, "float64", "MLL + gradient", old,
                     new, None))
        print(rows[-1], os.getloadavg(), flush=True)
    return rows


def markdown(rows, repeats, load) -> str:
    lines = [
        "# Multitask MLL and posterior: Kronecker-factor statistics vs the whitened interleaved root",
        "",
        f"`benchmarks/kronecker_gram.py`: GPyTorch ExactGP, `MultitaskKernel(RBFKernel(), T, rank=1)` converted with "
        f"`rfgp.sketch(kernel, {WIDTH})` (root width {WIDTH}·(1 + T)); \"tutorial\": `MultitaskGaussianLikelihood(T)` "
        "(GPyTorch's multitask tutorial), \"correlated\": `MultitaskGaussianLikelihood(T, rank=1)`. One CPU thread, "
        f"median of {repeats} alternated runs after one untimed each; posterior: cold caches, mean and variance at "
        f"{NUM_TEST} test points. Exact: the GPyTorch model, float64, one run. Load average (1, 5, 15 min) at the end: "
        f"{load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores). BoTorch rows: `KroneckerMultiTaskGP` with its "
        "defaults (full-rank task covariance, per-task noise; root width 256·2T), N = 2000, d = 3, MLL only (its "
        "posterior is BoTorch's algebra; exact timings in `botorch_kronecker_posterior.md`).",
        "",
        "| model | N | T | dtype | phase | old (s) | new (s) | old/new | exact (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, num_points, num_tasks, dtype, phase, old, new, exact in rows:
        exact_text = "—" if exact is None else f"{exact:.3f}"
        lines.append(f"| {name} | {num_points} | {num_tasks} | {dtype} | {phase} | {old:.3f} | {new:.3f} | "
                     f"{old / new:.1f}× | {exact_text} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat, float64 (under a minute)")
    parser.add_argument("--exact", type=int, default=8000, help="largest N·T timed with the exact model")
    parser.add_argument("--budget", action="store_true",
                        help="only the memory-budget rows, appended to (or replacing) that section of the results")
    parser.add_argument("--test-side", action="store_true",
                        help="only the test-side rows, appended to (or replacing) that section of the results")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.quick:
        configs = [("correlated", 500, 2, 1), ("tutorial", 500, 2, 0)]
        rows = run(configs, (torch.float64,), 1, 0)
        budget_rows = run_budget(500, 32, {"16 KiB": 16 * 2**10}, 1)
        test_rows = run_test_side(configs, (1000,), 1) + run_test_side(configs[:1], (1000,), 1, 2**20)
        print(markdown(rows, 1, os.getloadavg()) + budget_markdown(budget_rows, 1, os.getloadavg())
              + test_side_markdown(test_rows, 1, os.getloadavg())
              + expanded_markdown(run_expanded(500, 2, 1), 1, os.getloadavg()))
        return
    path = os.path.join(os.path.dirname(__file__), "results", "kronecker_gram.md")
    sections = read_sections(path)
    if args.test_side:
        configs = [("tutorial", 4000, 2, 0), ("correlated", 2000, 4, 1)]
        rows = run_test_side(configs, TEST_SIDE_COUNTS, TEST_SIDE_REPEATS)
        rows += run_test_side(configs[1:], TEST_SIDE_COUNTS[1:], TEST_SIDE_REPEATS, TEST_SIDE_BUDGET)
        sections[2] = test_side_markdown(rows, TEST_SIDE_REPEATS, os.getloadavg())
        sections[3] = expanded_markdown(run_expanded(2000, 3, TEST_SIDE_REPEATS), TEST_SIDE_REPEATS, os.getloadavg())
    else:
        budget_rows = run_budget(BUDGET_POINTS, BUDGET_WIDTH, BUDGETS, BUDGET_REPEATS)
        sections[1] = budget_markdown(budget_rows, BUDGET_REPEATS, os.getloadavg())
    if not (args.budget or args.test_side):
        configs = [("correlated", 2000, 2, 1), ("correlated", 2000, 4, 1), ("tutorial", 4000, 2, 0)]
        rows = run(configs, (torch.float64, torch.float32), REPEATS, args.exact) + run_botorch((2, 4), REPEATS)
        sections[0] = markdown(rows, REPEATS, os.getloadavg())
    with open(path, "w") as handle:
        handle.write("".join(sections))
    print("".join(sections))


def read_sections(path) -> list[str]:
    """The results file as [main table, memory-budget section, test-side section, expanded-batch section] ("" for a
    missing one), so that a run of one part replaces only its own section."""
    sections = ["", "", "", ""]
    if os.path.exists(path):
        with open(path) as handle:
            text = handle.read()
        for index, heading in ((3, "\n## Expanded to a batch"), (2, "\n## Test side"),
                               (1, "\n## Under the memory budget")):
            if heading in text:
                text, section = text.split(heading, 1)
                sections[index] = heading + section
        sections[0] = text.rstrip("\n") + "\n"
    return sections

if __name__ == "__main__":
    main()
