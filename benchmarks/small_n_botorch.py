"""BoTorch on either side of N = F: qLogNEI of a ``SingleTaskGP`` and a ``MixedSingleTaskGP`` fit, rfgp against the
exact GP.

Paired measurements, one thread, CPU seconds (``time.process_time``), the variants alternated in one process:

* qLogNEI (cached baseline root, BoTorch's default) on ``SingleTaskGP(Normalize, Standardize)``, d = 12, the default
  kernel converted with ``rfgp.sketch(kernel, 1024, method="orf")``, at the same hyperparameters as the exact model:
  one value + gradient of ``qLogNoisyExpectedImprovement(X_baseline=n_b training points, prune_baseline=False)`` at
  4 t-batches of q = 2 candidates (per evaluation) — at N = 1000 (kernel space: N < F) with n_b = 64, and at
  N = 5000 (feature space: N > F) with n_b = 256 — and, at N = 1000 only, one whole
  ``optimize_acqf(q=2, num_restarts=4, raw_samples=64)`` step with BoTorch's baseline pruning (at N = 5000 the exact
  GP's pruning and ≈ 200 evaluations would take many minutes).  "old": the posterior's whole n × F root per
  evaluation, as before ``rfgp.inference.posterior_covariance.LazyRootPosteriorCovariance``; "new": the q rows only;
* ``MixedSingleTaskGP`` (N = 233, 3 continuous and 3 categorical columns, as palmerpenguins) with
  ``rfgp.sketch(covar_module, 1024)``: one marginal-likelihood value + gradient, and a whole ``fit_gpytorch_mll``
  (with its number of model evaluations).

Synthetic data of the shapes of ``fresh_data_pass_2.py``'s Chicago and penguins rows.  Run
``python benchmarks/small_n_botorch.py`` (≈ 7 min, writes ``benchmarks/results/small_n_botorch_table.md``) or
``--quick`` (N = 500 and N = 2000 with n_b = 64, one repeat, ≤ 1 min, ``small_n_botorch_quick.md``).
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
from rfgp.inference import linalg, posterior_covariance, prediction  # noqa: E402

RESULTS = pathlib.Path(__file__).parent / "results"


def _whole_root(features, factor, kernel_space):
    """The posterior covariance as before: the whole n × F root, formed at every posterior."""
    if not kernel_space:
        root = linalg.CapacitanceFactor(factor).posterior_root(features)
        return posterior_covariance.LowRankPosteriorCovariance(root)
    batch = torch.broadcast_shapes(features.shape[:-2], factor.projection.shape[:-2])
    return posterior_covariance.LowRankPosteriorCovariance(
        factor.posterior_root(features.expand(*batch, *features.shape[-2:])))


def _variant(name: str) -> None:
    prediction.feature_posterior_covariance = (
        _whole_root if name == "rfgp old" else posterior_covariance.feature_posterior_covariance)


def qlognei(n: int, num_baseline: int, repeats: int, evaluations: int, step: bool, rows: list[str]) -> None:
    """qLogNEI on ``SingleTaskGP(Normalize, Standardize)`` at N = ``n``, d = 12, F = 1024 (orf): per value + gradient
    (``evaluations`` of them per repeat, ``num_baseline`` baseline points) and, if ``step``, one ``optimize_acqf``."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize, Standardize
    from botorch.optim import optimize_acqf

    d, width = 12, 1024
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(n, d, generator=gen, dtype=torch.float64)
    y = (torch.sin(3 * x[:, :4]).sum(-1) + 0.3 * torch.randn(n, generator=gen, dtype=torch.float64))[:, None]
    models = {}
    for name in ["exact", "rfgp"]:
        model = SingleTaskGP(x, y, input_transform=Normalize(d), outcome_transform=Standardize(1))
        model.covar_module.lengthscale = torch.tensor([0.3] * 4 + [3.0] * (d - 4))  # pruned baseline ≈ 70 points
        model.likelihood.noise = 0.3
        if name == "rfgp":
            model.covar_module = rfgp.sketch(model.covar_module, width, method="orf", seed=0)
        models[name] = model.eval()
    bounds = torch.stack([torch.zeros(d), torch.ones(d)]).double()
    candidates = torch.rand(4, 2, d, generator=gen, dtype=torch.float64)
    per_eval, steps, values = {}, {}, {}
    for _ in range(repeats):
        for name in ["exact", "rfgp old", "rfgp new"]:
            _variant(name)
            model = models[name.split()[0]]
            torch.manual_seed(0)
            acquisition = qLogNoisyExpectedImprovement(model, X_baseline=x[:num_baseline], prune_baseline=False)
            X = candidates.clone().requires_grad_(True)
            start = time.process_time()
            for _ in range(evaluations):
                value = acquisition(X)
                torch.autograd.grad(value.sum(), X)
            per_eval.setdefault(name, []).append((time.process_time() - start) / evaluations)
            values[name] = value.detach()
            if not step:
                continue
            torch.manual_seed(1)
            start = time.process_time()
            acquisition = qLogNoisyExpectedImprovement(model, X_baseline=x)
            calls, forward = [0], acquisition.forward

            def counted(X, _forward=forward, _calls=calls):
                _calls[0] += 1
                return _forward(X)

            acquisition.forward = counted
            _, best = optimize_acqf(acquisition, bounds=bounds, q=2, num_restarts=4, raw_samples=64)
            steps.setdefault(name, []).append((time.process_time() - start, float(best),
                                               acquisition.X_baseline.shape[0], calls[0]))
    _variant("rfgp new")
    gap = (values["rfgp old"] - values["rfgp new"]).abs().max().item()
    notes = {"rfgp new": f"max |old − new| value {gap:.1e}"}
    space = "kernel space" if models["rfgp"].prediction_strategy.uses_kernel_space else "feature space"
    for name in per_eval:
        whole = "not run"
        if step:
            seconds, best, pruned, calls = sorted(steps[name])[len(steps[name]) // 2]
            whole = f"{seconds:.2f} s (value {best:.3f}, pruned baseline {pruned}, {calls} evaluations)"
        rows.append(f"| qLogNEI, N = {n}, d = {d}, F = {width} ({space}), {num_baseline} baseline points | {name} | "
                    f"{1e3 * statistics.median(per_eval[name]):.1f} ms | {whole} | {notes.get(name, '')} |")


def mixed(repeats: int, fit: bool, rows: list[str]) -> None:
    from botorch.fit import fit_gpytorch_mll
    from botorch.models import MixedSingleTaskGP
    from gpytorch.mlls import ExactMarginalLogLikelihood

    n, width = 233, 1024
    gen = torch.Generator().manual_seed(0)
    continuous = torch.rand(n, 3, generator=gen, dtype=torch.float64)
    codes = torch.stack([torch.randint(0, k, (n,), generator=gen) for k in (3, 3, 2)], -1).double()
    x = torch.cat([continuous, codes], -1)
    y = (torch.sin(3 * continuous).sum(-1) + codes[:, 0] - 0.5 * codes[:, 2]
         + 0.1 * torch.randn(n, generator=gen, dtype=torch.float64))[:, None]

    def build(name):
        model = MixedSingleTaskGP(x, y, cat_dims=[3, 4, 5])
        if name == "rfgp":
            model.covar_module = rfgp.sketch(model.covar_module, width)
        return model, ExactMarginalLogLikelihood(model.likelihood, model)

    step_times, fits = {}, {}
    for _ in range(repeats):
        for name in ["exact", "rfgp"]:
            model, mll = build(name)
            mll.train()
            start = time.process_time()
            for _ in range(5):
                model.zero_grad()
                (-mll(model(*model.train_inputs), model.train_targets)).backward()
            step_times.setdefault(name, []).append((time.process_time() - start) / 5)
    if fit:
        for name in ["exact", "rfgp"]:
            model, mll = build(name)
            calls, forward = [0], model.forward

            def counted(*args, _forward=forward, _calls=calls, **kwargs):
                _calls[0] += 1
                return _forward(*args, **kwargs)

            model.forward = counted
            start = time.process_time()
            fit_gpytorch_mll(mll)
            seconds = time.process_time() - start
            mll.train()
            with torch.no_grad():
                loss = -mll(model(*model.train_inputs), model.train_targets).item()
            fits[name] = f"{seconds:.1f} s, {calls[0] - 1} evaluations, loss {loss:.3f}"
    for name in step_times:
        rows.append(f"| MixedSingleTaskGP, N = {n}, 3 + 3 columns, F = {width} | {name} | "
                    f"{1e3 * statistics.median(step_times[name]):.1f} ms (MLL + gradient) | {fits.get(name, '')} | |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="N = 500 and 2000, one repeat, no fit (≤ 1 min)")
    quick = parser.parse_args().quick
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    rows = ["| problem | model | per evaluation | whole step / fit | note |", "|---|---|---|---|---|"]
    load_before = os.getloadavg()
    qlognei(500 if quick else 1000, 64, 1 if quick else 3, 10, True, rows)
    qlognei(2000 if quick else 5000, 64 if quick else 256, 1 if quick else 3, 3, False, rows)
    mixed(1 if quick else 3, not quick, rows)
    load_after = os.getloadavg()
    text = "\n".join([
        f"`python benchmarks/small_n_botorch.py{' --quick' if quick else ''}` (torch {torch.__version__}, one thread, "
        f"CPU time, medians of paired repeats; load average (1, 5, 15 min) {load_before[0]:.2f}, "
        f"{load_before[1]:.2f}, {load_before[2]:.2f} at the start and {load_after[0]:.2f}, {load_after[1]:.2f}, "
        f"{load_after[2]:.2f} at the end).", "", *rows, ""])
    print(text)
    (RESULTS / f"small_n_botorch_{'quick' if quick else 'table'}.md").write_text(text)


if __name__ == "__main__":
    main()
