"""``rfgp.fit_scale_and_noise`` (closed-form outputscale, noise and constant mean): where does it pay?  (Issue 16.)

For y ~ N(μ1, sΦΦᵀ + σ²I) with Φ fixed, one eigendecomposition of ΦᵀΦ makes the marginal likelihood an
O(F) function of (s, σ², μ) (formulas: :mod:`rfgp.models.scale_and_noise`), and
``rfgp.fit_scale_and_noise`` sets them to its optimum.  Two uses are measured against ``rfgp.fit_mll``
alone, each from GPyTorch's default initial hyperparameters, float32, 2 threads, CPU time:

1. Inside training —
   * ``fit_mll``     — ``rfgp.fit_mll`` (L-BFGS over all hyperparameters), the product's default;
   * ``warm start``  — ``fit_scale_and_noise`` once at the initial lengthscales, then ``rfgp.fit_mll``;
   * ``concentrated`` — ``fit_scale_and_noise`` at every loss evaluation and L-BFGS (strong Wolfe, same ftol)
     over the other hyperparameters only: the profile likelihood max_{s,σ²,μ} log p(y | θ, s, σ², μ), whose
     gradient in θ is the partial gradient at the profiled point (envelope theorem).
2. After training, train small / predict big — the ``fit_mll`` model re-drawn by ``rfgp.set_num_features`` at
   4× its width, predicted with its trained hyperparameters, then with ``fit_scale_and_noise`` at the new width.

Data: the validation splits of ``time_to_accuracy.py`` (the training rows' own 80/20 split; test rows unseen),
RFF F = 1024 and Nyström M = 512 models as in that benchmark.  Results:
``benchmarks/results/profiled_likelihood.md``.  Run: ``python benchmarks/profiled_likelihood.py`` (~25 min).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import gpytorch
import torch
from linear_operator.utils.errors import NanError, NotPSDError
from time_to_accuracy import evaluate_exact, exact_model, load, rbf

import rfgp
from rfgp.kernels import SketchedRBFKernel

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
CONFIGS = (("diamonds", "rff", 1024), ("diamonds", "nystrom", 512), ("elecdemand", "rff", 1024),
           ("elecdemand", "nystrom", 512))
VARIANTS = ("fit_mll", "warm start", "concentrated")


def profiled_parameters(model) -> list[torch.Tensor]:
    """The raw outputscale, noise and constant that ``rfgp.fit_scale_and_noise`` sets."""
    scale = model.covar_module if hasattr(model.covar_module, "outputscale") else model.covar_module.base_kernel
    return [scale.raw_outputscale, model.likelihood.noise_covar.raw_noise, model.mean_module.raw_constant]


def fit_concentrated(model, budget: float, ftol: float = 1e-6) -> tuple[list[tuple[float, float]], int, str]:
    """L-BFGS over the non-profiled hyperparameters of the profile likelihood: ((CPU s, loss) per iteration,
    evaluations, stop reason)."""
    model.train()
    profiled = {id(p) for p in profiled_parameters(model)}
    outer = [p for p in model.parameters() if p.requires_grad and id(p) not in profiled]
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    evaluations = 0

    def closure():
        nonlocal evaluations
        evaluations += 1
        rfgp.fit_scale_and_noise(model)
        model.train()
        model.zero_grad()
        loss = -mll(model(*model.train_inputs), model.train_targets)
        loss.backward()
        return loss

    optimizer = torch.optim.LBFGS(outer, lr=1.0, max_iter=1, max_eval=26, tolerance_grad=0.0, tolerance_change=0.0,
                                  history_size=10, line_search_fn="strong_wolfe")
    start, curve, reason = time.process_time(), [], "time budget"
    while time.process_time() - start < budget:
        loss = float(optimizer.step(closure).detach())
        curve.append((time.process_time() - start, loss))
        if len(curve) > 1 and abs(loss - curve[-2][1]) <= ftol * max(abs(loss), abs(curve[-2][1]), 1.0):
            reason = "converged (relative loss change ≤ 1e-6)"
            break
    rfgp.fit_scale_and_noise(model)  # the returned point: profiled at its lengthscales
    with torch.no_grad():
        curve.append((time.process_time() - start, float(-mll(model(*model.train_inputs), model.train_targets))))
    return curve, evaluations, reason


def build(kind: str, data, width: int):
    x, d = data.train_x, data.train_x.shape[-1]
    torch.manual_seed(0)
    if kind == "nystrom":
        covar = rfgp.sketch(rbf(d), width, method="nystrom", x_sample=x, seed=0)
    else:
        covar = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(width, ard_num_dims=d, seed=0))
    return exact_model(x, data.train_y, covar)


def run(variant: str, kind: str, data, width: int, budget: float) -> dict:
    model = build(kind, data, width)
    start = time.process_time()
    try:
        if variant == "concentrated":
            curve, evaluations, reason = fit_concentrated(model, budget)
            iterations = len(curve) - 1
        else:
            if variant == "warm start":
                rfgp.fit_scale_and_noise(model)
            offset = time.process_time() - start
            history = rfgp.fit_mll(model, num_iterations=10**6, time_budget=budget - offset, clock="cpu",
                                   progress=False)
            curve = [(offset + c, loss) for c, loss in zip(history.cpu_seconds, history.losses)]
            evaluations, iterations, reason = history.evaluations[-1], history.num_iterations, history.stop_reason
    except (NotPSDError, NanError, rfgp.NonFiniteLossError) as error:
        return {"variant": variant, "failed": f"{type(error).__name__}: {str(error).splitlines()[0][:90]}",
                "cpu_s": time.process_time() - start}
    return {"variant": variant, "cpu_s": time.process_time() - start, "evaluations": evaluations,
            "iterations": iterations, "loss": curve[-1][1], "curve": curve, "reason": reason.split(":")[0],
            "model": model, **evaluate_exact(model, data.test_x, data.test_y)}


def predict_big(model, data, width: int, factor: int) -> list[str]:
    """Table rows: the trained model at ``width``, re-drawn at factor·width, then with the scale and noise re-fitted."""
    def row(name, cpu, extra=""):
        metrics = evaluate_exact(model, data.test_x, data.test_y)
        scale = model.covar_module if hasattr(model.covar_module, "outputscale") else model.covar_module.base_kernel
        return (f"| {name} | {cpu} | {scale.outputscale.item():.4f} | {model.likelihood.noise.item():.5f} | "
                f"{metrics['nlpd']:.4f} | {metrics['rmse']:.4f} | {extra} |")

    rows = [row(f"trained at {width}", "–")]
    start = time.process_time()
    rfgp.set_num_features(model, factor * width)
    rows.append(row(f"re-drawn at {factor * width}, trained scale and noise", f"{time.process_time() - start:.1f}"))
    start = time.process_time()
    fit = rfgp.fit_scale_and_noise(model)
    rows.append(row(f"re-drawn at {factor * width}, `fit_scale_and_noise`", f"{time.process_time() - start:.1f}",
                    f"loss {fit.loss_before:.5f} → {fit.loss_after:.5f}"))
    return rows


def reach(curve, target: float) -> float | None:
    return next((cpu for cpu, loss in curve if loss <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per variant")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--factor", type=int, default=4, help="prediction width / training width")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    sections = []
    for name, kind, width in CONFIGS:
        data = load(name, None, validation=True)
        rows = [run(variant, kind, data, width, args.budget) for variant in VARIANTS]
        target = rows[0].get("loss")
        letter = "M" if kind == "nystrom" else "F"
        lines = [f"## {name} (validation split, N = {data.train_x.shape[0]}), {kind} {letter}"
                 f" = {width}", "",
                 "| variant | CPU [s] | iterations | loss evaluations | final −MLL/N | CPU s to fit_mll's final loss "
                 "| validation NLPD | validation RMSE | stop |", "|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            if "failed" in row:
                failed = f"FAILED: {row['failed']}"
                lines.append(f"| {row['variant']} | {row['cpu_s']:.1f} | – | – | – | – | – | – | {failed} |")
                continue
            hit = reach(row["curve"], target) if target is not None else None
            lines.append(f"| {row['variant']} | {row['cpu_s']:.1f} | {row['iterations']} | {row['evaluations']} | "
                         f"{row['loss']:.5f} | {'–' if hit is None else f'{hit:.1f}'} | {row['nlpd']:.4f} | "
                         f"{row['rmse']:.4f} | {row['reason']} |")
            print(name, kind, row["variant"], f"{row['cpu_s']:.1f} s", f"loss {row['loss']:.5f}", flush=True)
        lines += ["", f"After training: the `fit_mll` model predicted at {args.factor}× its width "
                  "(CPU: `set_num_features`, then `fit_scale_and_noise`; the posterior rebuild is not counted).", "",
                  "| model | CPU [s] | outputscale | noise | validation NLPD | validation RMSE | |",
                  "|---|---|---|---|---|---|---|"]
        if "model" in rows[0]:
            lines += predict_big(rows[0]["model"], data, width, args.factor)
        sections.append("\n".join(lines))
    header = (f"# `rfgp.fit_scale_and_noise`: inside training and after `set_num_features`\n\n"
              f"float32, {args.threads} threads, CPU budget {args.budget:g} s per variant.  Load average (1, 5, 15 min)"
              f" before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
              f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} logical CPUs.  Produced by "
              f"`benchmarks/profiled_likelihood.py` (variants and formulas in its docstring).\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profiled_likelihood.md").write_text(header + "\n" + "\n\n".join(sections) + "\n")


if __name__ == "__main__":
    main()
