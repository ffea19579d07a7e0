"""Closed-form profiling of outputscale, noise and constant mean: does it shorten training?  (Issue 16, optional item.)

For y ~ N(μ1, sΦΦᵀ + σ²I) with the N × F features Φ fixed (lengthscales fixed), the eigendecomposition
ΦᵀΦ = V diag(λ) Vᵀ and c = Vᵀ Φᵀ(y − μ1) give the marginal likelihood in O(F) per evaluation
(Woodbury and the matrix determinant lemma, Rasmussen & Williams 2006, Eq. 2.30 and A.9–A.10):

    (y − μ1)ᵀK⁻¹(y − μ1) = ‖y − μ1‖²/σ² − (s/σ²) Σᵢ cᵢ²/(sλᵢ + σ²),
    log|K| = Σᵢ log(sλᵢ + σ²) + (N − F) log σ²,

(no division by λᵢ, so rank-deficient Φ is fine; c and ‖y − μ1‖² are quadratic in μ, from Φᵀy, Φᵀ1, ‖y‖², 1ᵀy).
One O(N·F² + F³) pass (ΦᵀΦ, Φᵀ[y, 1], eigh in float64), then (s, σ², μ) are optimised by L-BFGS on that
O(F) function of the model's own raw parameters (constraints and priors included).

Variants, each from GPyTorch's default initial hyperparameters, float32, 2 threads, CPU time:

* ``fit_mll``     — ``rfgp.fit_mll`` (L-BFGS over all hyperparameters), the product's default;
* ``warm start``  — (s, σ², μ) profiled once at the initial lengthscales, then ``rfgp.fit_mll``;
* ``concentrated`` — (s, σ², μ) re-profiled at every loss evaluation and L-BFGS (strong Wolfe, same ftol) over
  the other hyperparameters only: the profile likelihood max_{s,σ²,μ} log p(y | θ, s, σ², μ), whose gradient in θ
  is the partial gradient at the profiled point (envelope theorem).

Data: the validation splits of ``time_to_accuracy.py`` (the training rows' own 80/20 split; test rows unseen),
RFF F = 1024 and Nyström M = 512 models as in that benchmark.  Results:
``benchmarks/results/profiled_likelihood.md``.  Run: ``python benchmarks/profiled_likelihood.py`` (~15 min).
"""

from __future__ import annotations

import argparse
import math
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


def scale_kernel(covar) -> gpytorch.kernels.ScaleKernel:
    """The ScaleKernel whose outputscale multiplies the whole training covariance (also inside a Nyström map)."""
    for module in (covar, getattr(covar, "base_kernel", None)):
        if isinstance(module, gpytorch.kernels.ScaleKernel):
            return module
    raise TypeError(f"no outputscale over the whole covariance in {type(covar).__name__}")


def profiled_parameters(model) -> list[torch.Tensor]:
    return [scale_kernel(model.covar_module).raw_outputscale, model.likelihood.noise_covar.raw_noise,
            model.mean_module.raw_constant]


def profile(model, max_iter: int = 50) -> None:
    """Set (s, σ², μ) to their marginal-likelihood optimum (with their priors) at the other hyperparameters."""
    x, y = model.train_inputs[0], model.train_targets
    scale = scale_kernel(model.covar_module)
    with torch.no_grad():
        covar = model.covar_module(x).evaluate_kernel()
        ones = torch.ones_like(y)
        gram, cross = covar.feature_statistics(ones.new_ones(1), torch.stack([y, ones], -1))
        s0 = scale.outputscale.detach().double()
        eigenvalues, vectors = torch.linalg.eigh(gram.double() / s0)
        eigenvalues = eigenvalues.clamp_min(0.0)
        projected = vectors.mT @ (cross.double() / s0.sqrt())  # Vᵀ Φ₀ᵀ[y, 1]
        y64 = y.double()
        n, f = y.shape[-1], eigenvalues.shape[-1]
        yy, y1 = (y64 * y64).sum(), y64.sum()
    params = profiled_parameters(model)
    optimizer = torch.optim.LBFGS(params, lr=1.0, max_iter=max_iter, line_search_fn="strong_wolfe",
                                  tolerance_grad=1e-9, tolerance_change=1e-12)

    def closure():
        optimizer.zero_grad()
        s, noise = scale.outputscale.double().squeeze(), model.likelihood.noise.double().squeeze()
        mu = model.mean_module.constant.double().squeeze()
        c = projected[:, 0] - mu * projected[:, 1]
        quad = (yy - 2 * mu * y1 + mu * mu * n) / noise - (s / noise) * (c * c / (s * eigenvalues + noise)).sum()
        logdet = torch.log(s * eigenvalues + noise).sum() + (n - f) * torch.log(noise)
        log_prior = sum(prior.log_prob(get(module)).sum() for _, module, prior, get, _ in model.named_priors())
        loss = (0.5 * (quad + logdet + n * math.log(2 * math.pi)) - log_prior) / n
        loss.backward()
        return loss

    with torch.enable_grad():
        optimizer.step(closure)
    for p in params:
        p.grad = None


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
        profile(model)
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
    with torch.no_grad():  # the returned point: profiled at its lengthscales
        profile(model)
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
                model.train()
                profile(model)
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
            **evaluate_exact(model, data.test_x, data.test_y)}


def reach(curve, target: float) -> float | None:
    return next((cpu for cpu, loss in curve if loss <= target), None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=120.0, help="CPU seconds per variant")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    sections = []
    for name, kind, width in CONFIGS:
        data = load(name, None, validation=True)
        rows = [run(variant, kind, data, width, args.budget) for variant in VARIANTS]
        target = rows[0].get("loss")
        lines = [f"## {name} (validation split, N = {data.train_x.shape[0]}), {kind} {'M' if kind == 'nystrom' else 'F'}"
                 f" = {width}", "",
                 "| variant | CPU [s] | iterations | loss evaluations | final −MLL/N | CPU s to fit_mll's final loss "
                 "| validation NLPD | validation RMSE | stop |", "|---|---|---|---|---|---|---|---|---|"]
        for row in rows:
            if "failed" in row:
                lines.append(f"| {row['variant']} | {row['cpu_s']:.1f} | – | – | – | – | – | – | FAILED: {row['failed']} |")
                continue
            hit = reach(row["curve"], target) if target is not None else None
            lines.append(f"| {row['variant']} | {row['cpu_s']:.1f} | {row['iterations']} | {row['evaluations']} | "
                         f"{row['loss']:.5f} | {'–' if hit is None else f'{hit:.1f}'} | {row['nlpd']:.4f} | "
                         f"{row['rmse']:.4f} | {row['reason']} |")
            print(name, kind, row["variant"], f"{row['cpu_s']:.1f} s", f"loss {row['loss']:.5f}", flush=True)
        sections.append("\n".join(lines))
    header = (f"# Closed-form profiling of outputscale, noise and mean against `rfgp.fit_mll`\n\n"
              f"float32, {args.threads} threads, CPU budget {args.budget:g} s per variant.  Load average (1, 5, 15 min)"
              f" before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
              f"{', '.join(f'{v:.2f}' for v in os.getloadavg())} on {os.cpu_count()} logical CPUs.  Produced by "
              f"`benchmarks/profiled_likelihood.py` (variants and formulas in its docstring).\n")
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "profiled_likelihood.md").write_text(header + "\n" + "\n\n".join(sections) + "\n")


if __name__ == "__main__":
    main()
