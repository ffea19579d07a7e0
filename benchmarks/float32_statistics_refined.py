"""Does a refined estimate that uses A = I + G predict the error of float32 feature statistics better than
ε̂ = u·tr(G)?  (rfgp.inference.statistics_precision; ``rfgp.settings.float32_statistics_tolerance``.)

For float32 ExactGP models (RFF, ORF, ORF with F = 32, Nyström, Maclaurin, a LinearFeatureKernel alone and in a sum
with RFF on offset inputs — nearly-constant features that carry most of tr(G)) at noise/outputscale ratios 1…10⁻⁴ and
N = 2 000…50 000:

* the actual errors of the float32-statistics model (tolerance ∞) against the float64-statistics model (tolerance 0,
  the same float32 features): loss per point (GPyTorch's MLL is per point) and relative, gradient ‖Δ‖/‖g‖ over all raw
  hyperparameters, posterior mean ‖Δμ‖/‖μ‖ at 500 test points (a Nyström root Φ = K·L⁻ᵀ is formed from K and L cast
  with the statistics, so its float64 statistics also solve with L in float64; ΔG and the estimates are those of
  the float32 Φ);
* the perturbation itself: ‖E‖₂ with E = L⁻¹ΔGL⁻ᵀ, A₆₄ = LLᵀ, ΔG = G₃₂ − G₆₄ (the relative perturbation of A
  through which G's rounding enters log|A| and A⁻¹ — what an estimate that uses A can at best predict), and ‖ΔG‖₂;
* the estimates: ε̂ = u·tr(G) (the rule today); ε̃_λ = u·tr(G)/λ_min(I + G₃₂) (a bound on ‖A⁻¹ΔG‖₂ scaled like ε̂:
  ‖A^{-1/2}ΔGA^{-1/2}‖₂ ≤ ‖ΔG‖₂/λ_min(A); λ_min from the float64 factor of A formed anyway, F³);
  ε̃_dof = u·tr(A⁻¹G) (the effective degrees of freedom); ε̃_diag = u·Σⱼ Gⱼⱼ/(1 + Gⱼⱼ); ε̃_probe = ‖A⁻¹ΔG V‖_F/√k
  for k = 4 Gaussian probes V (one float64 pass Φᵀ(W(ΦV)) over Φ: an a-posteriori estimate of ‖A⁻¹ΔG‖_F).

A rule is safe if every model it puts in float32 (estimate ≤ 0.1) has errors within the ε̂ = 0.1 row of the
statistics_precision table (loss ≤ 5.4·10⁻⁵ per point or relative, gradient ≤ 3·10⁻⁴).

Second part: tutorial 07's setting (N = 2·10⁵, F = 128 ORF, d = 4, 32 MiB memory budget, chunked, after the
tutorial's 4 Adam steps): per-step time of MLL + gradient at the default tolerance (the rule today) and at ∞
(float32 statistics, what a refined rule would choose), paired, and the same errors and estimates.

    python benchmarks/float32_statistics_refined.py   # writes results/float32_statistics_refined.md

(The "Conclusion" section of the results file is written by hand from these numbers; a rerun drops it.)
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

from float32_statistics_threshold import gram_pair  # noqa: E402  (a sibling script)

import rfgp  # noqa: E402
from rfgp.inference.linalg import CapacitanceNotPSDError  # noqa: E402
from rfgp.inference.statistics_precision import recorded_statistics_dtypes, unit_roundoff  # noqa: E402
from rfgp.kernels import (  # noqa: E402
    FeatureSumKernel,
    LinearFeatureKernel,
    MaclaurinRBFKernel,
    NystromKernel,
    SketchedRBFKernel,
)
from rfgp.models import ExactGPModel  # noqa: E402

U = unit_roundoff(torch.float32)
LOSS_BOUND, GRAD_BOUND = 5.4e-5, 3e-4  # the ε̂ = 0.1 row of the statistics_precision table
RATIOS = (1.0, 1e-2, 1e-3, 1e-4)
SIZES = (2000, 10000, 50000)


def make_kernel(name, x):
    if name == "rff":
        return gpytorch.kernels.ScaleKernel(SketchedRBFKernel(256, seed=0)), 0.3
    if name == "orf":
        return gpytorch.kernels.ScaleKernel(SketchedRBFKernel(128, method="orf", seed=0)), 0.7
    if name == "orf32":
        return gpytorch.kernels.ScaleKernel(SketchedRBFKernel(32, method="orf", seed=0)), 1.0
    if name == "nystrom":
        landmarks = x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(1))[:256]]
        return gpytorch.kernels.ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(), landmarks)), 0.3
    if name == "maclaurin":
        return gpytorch.kernels.ScaleKernel(MaclaurinRBFKernel(256, input_dim=x.shape[-1], seed=0)), 0.5
    if name == "linear":
        return LinearFeatureKernel(input_dim=x.shape[-1]), None
    if name == "linear+rff":
        return FeatureSumKernel(LinearFeatureKernel(input_dim=x.shape[-1]), gpytorch.kernels.ScaleKernel(
            SketchedRBFKernel(256, seed=0))), 0.3
    raise ValueError(name)


def set_lengthscale(kernel, value):
    for module in kernel.modules():
        if hasattr(module, "raw_lengthscale"):
            module.lengthscale = value


def make_data(name, num_points, offset=10.0):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen, dtype=torch.float64)
    if name in ("orf", "orf32"):
        x = 4 * x
    if name in ("linear", "linear+rff"):
        x = x + offset  # offset 10: a nearly-constant linear feature, most of tr(G) in one direction
    f = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
    return x, f, gen


def make_model(name, num_points, ratio, offset=10.0):
    x, f, gen = make_data(name, num_points, offset)
    y = f + math.sqrt(ratio) * torch.randn(num_points, generator=gen, dtype=torch.float64)
    x, y = x.float(), y.float()
    kernel, lengthscale = make_kernel(name, x)
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x, y, likelihood, kernel).train()
    set_lengthscale(kernel, lengthscale)
    likelihood.noise = ratio  # outputscale 1 for the ScaleKernels (the linear variance 1 too)
    for module in kernel.modules():
        if isinstance(module, gpytorch.kernels.ScaleKernel):
            module.outputscale = 1.0
    return model


def loss_and_grads(model, tolerance):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    with rfgp.settings.float32_statistics_tolerance(tolerance):
        loss = -mll(model(*model.train_inputs), model.train_targets)
    grads = torch.autograd.grad(loss, params)
    return loss.detach().double(), torch.cat([g.double().reshape(-1) for g in grads])


def posterior_mean(model, test_x, tolerance):
    model.train()  # drop the caches
    model.eval()
    with rfgp.settings.float32_statistics_tolerance(tolerance), torch.no_grad():
        mean = model(test_x).mean.double()
    model.train()
    return mean


def estimates(model, probes=4):
    """(ε̂, ‖ΔG‖₂, ‖E‖₂, ε̃_λ, ε̃_dof, ε̃_diag, ε̃_probe, coherence) of the model's float32 statistics; coherence
    ‖ΦᵀW1‖²/(Σw·tr(G)) ∈ [0, 1] is the share of tr(G) in the features' weighted mean (1: constant features)."""
    features, weights, low, high = gram_pair(model)
    with torch.no_grad():
        eye = torch.eye(low.shape[0], dtype=torch.float64)
        factor = torch.linalg.cholesky(eye + high)
        delta = low - high
        whitened = torch.linalg.solve_triangular(
            factor, torch.linalg.solve_triangular(factor, delta, upper=False).mT, upper=False)
        relative = torch.linalg.eigvalsh(whitened).abs().max().item()
        absolute = torch.linalg.eigvalsh(delta).abs().max().item()
        a32 = eye + low
        smallest = torch.linalg.eigvalsh(a32)[0].item()
        trace = low.diagonal().sum().item()
        dof = torch.linalg.solve(a32, low).diagonal().sum().item() if smallest > 0 else math.nan
        diag = (low.diagonal() / (1 + low.diagonal())).sum().item()
        v = torch.randn(low.shape[0], probes, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
        exact = features.double().mT @ (weights.double()[:, None] * (features.double() @ v))
        probe = (torch.linalg.solve(a32, exact - low @ v).norm() / math.sqrt(probes)).item()
        lam = U * trace / smallest if smallest > 0 else math.inf
        total = weights.double().sum()
        coherence = ((features.double().mT @ weights.double()).square().sum() / total / high.diagonal().sum()).item()
        return U * trace, absolute, relative, lam, U * dof, U * diag, probe, coherence


def measure(model, test_x):
    reference = loss_and_grads(model, 0.0)
    mean64 = posterior_mean(model, test_x, 0.0)
    try:
        loss, grads = loss_and_grads(model, math.inf)
        mean32 = posterior_mean(model, test_x, math.inf)
    except CapacitanceNotPSDError:  # float32 statistics that made I + G indefinite
        return math.inf, math.inf, math.inf, math.inf
    return (abs(loss - reference[0]).item(), (abs(loss - reference[0]) / reference[0].abs()).item(),
            ((grads - reference[1]).norm() / reference[1].norm()).item(),
            ((mean32 - mean64).norm() / mean64.norm()).item())


NAMES = ("ε̂", "‖ΔG‖₂", "‖E‖₂", "ε̃_λ", "ε̃_dof", "ε̃_diag", "ε̃_probe", "coherence")
ERRORS = ("loss per point", "loss relative", "gradient", "mean")


def row(cells, values, errors):
    shown = [f"{e:.2g}" if e < math.inf else "NotPSD" for e in errors]
    return "| " + " | ".join([*cells, *(f"{v:.2g}" for v in values), *shown]) + " |"


def sweep():
    records, rows = [], []
    for name in ("rff", "orf", "orf32", "nystrom", "maclaurin", "linear", "linear+rff"):
        for num_points in SIZES:
            for ratio in RATIOS:
                model = make_model(name, num_points, ratio)
                test_x = make_data(name, 500)[0].float() + 0.01
                errors = measure(model, test_x)
                values = estimates(model)
                records.append((values, errors))
                rows.append(row([name, f"{num_points}", f"{ratio:g}"], values, errors))
                print(rows[-1], flush=True)
    return records, rows


def concentration():
    """linear+rff at σ² = s = 1: the offset of the inputs moves tr(G) into the linear features' common mean."""
    rows = []
    for offset in (0.0, 1.0, 10.0):
        for num_points in SIZES:
            model = make_model("linear+rff", num_points, 1.0, offset)
            test_x = make_data("linear+rff", 500, offset)[0].float() + 0.01
            errors, values = measure(model, test_x), estimates(model)
            rows.append(row([f"{offset:g}", f"{num_points}", f"{values[1] / values[0]:.2g}"], values, errors))
            print(rows[-1], flush=True)
    return rows


def growth():
    """‖ΔG‖₂/ε̂ against N at σ² = s = 1 (statistics only): the constant that ε̂ leaves to measurement."""
    rows = []
    for name in ("rff", "orf", "linear"):
        for num_points in (2000, 20000, 200000):
            values = estimates(make_model(name, num_points, 1.0))
            rows.append(f"| {name} | {num_points} | {values[0]:.2g} | {values[1]:.2g} | {values[1] / values[0]:.2g} "
                        f"| {values[7]:.2g} |")
            print(rows[-1], flush=True)
    return rows


def summary(records):
    """Per estimate: the models it puts in float32 (≤ 0.1), those the current rule (ε̂ ≤ 0.1) does not, and how many
    of them exceed the ε̂ = 0.1 row (loss > 5.4·10⁻⁵ per point and relative — the table's losses per point were
    O(1) — or gradient > 3·10⁻⁴), with the worst errors."""
    rows = []
    for index, name in enumerate(NAMES[:7]):
        if index in (1, 2):
            continue  # ‖ΔG‖₂ and ‖E‖₂ are measured, not estimated
        chosen = [(v, e) for v, e in records if v[index] <= 0.1]
        moved = [(v, e) for v, e in chosen if v[0] > 0.1]
        over = [(v, e) for v, e in chosen if min(e[0], e[1]) > LOSS_BOUND or e[2] > GRAD_BOUND]
        worst = (max((e[1] for _, e in chosen), default=0.0), max((e[2] for _, e in chosen), default=0.0))
        rows.append(f"| {name} | {len(chosen)} / {len(records)} | {len(moved)} | {len(over)} | {worst[0]:.2g} "
                    f"| {worst[1]:.2g} |")
    return rows


def tutorial_model():
    """Tutorial 07's model after its 4 Adam steps (its code, the same seeds)."""
    torch.manual_seed(0)
    num_train, dim = 200_000, 4
    gen = torch.Generator().manual_seed(1)
    train_x = torch.rand(num_train, dim, generator=gen) * 4
    truth = torch.sin(2 * train_x[:, 0]) * torch.cos(train_x[:, 1]) + 0.5 * train_x[:, 2] - 0.3 * train_x[:, 3] ** 2 / 4
    train_y = truth + 0.1 * torch.randn(num_train, generator=gen)
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(128, method="orf", ard_num_dims=dim, seed=0))
    kernel.base_kernel.lengthscale, likelihood.noise = 0.7, 0.05
    model = ExactGPModel(train_x, train_y, likelihood, kernel)
    with rfgp.settings.memory_budget(32 * 2**20):
        rfgp.fit_mll(model, num_iterations=4, lr=0.15, progress=False, optimizer="adam")
    return model


def modes_of_tutorial():
    return {"default": rfgp.settings.float32_statistics_tolerance.DEFAULT, "float32": math.inf}


def tutorial(repeats):
    model = tutorial_model()
    model.train()  # fit_mll leaves it in eval mode
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    modes = modes_of_tutorial()
    times, chosen = {name: [] for name in modes}, {}
    for repeat in range(repeats + 1):
        for name, tolerance in modes.items():
            model.zero_grad()
            start = time.perf_counter()
            with rfgp.settings.memory_budget(32 * 2**20), rfgp.settings.float32_statistics_tolerance(tolerance), \
                    recorded_statistics_dtypes() as dtypes:
                loss = -mll(model(*model.train_inputs), model.train_targets)
                loss.backward()
            if repeat:
                times[name].append(time.perf_counter() - start)
            chosen[name] = str(dtypes[0]).split(".")[-1]
    with rfgp.settings.memory_budget(32 * 2**20):
        errors = measure(model, torch.rand(500, 4, generator=torch.Generator().manual_seed(3)) * 4)
    values = estimates(model)
    hyper = (f"lengthscale {model.covar_module.base_kernel.lengthscale.detach().numpy().round(2).tolist()}, "
             f"outputscale {model.covar_module.outputscale.item():.3g}, noise {model.likelihood.noise.item():.3g}")
    return times, chosen, errors, values, hyper


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    records, rows = sweep()
    concentrated = concentration()
    grown = growth()
    load_sweep = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    times, chosen, errors, values, hyper = tutorial(args.repeats)
    load_tutorial = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    median = {name: statistics.median(t) for name, t in times.items()}
    header = " | ".join([*NAMES, *ERRORS])
    rule = "|---" * (len(NAMES) + len(ERRORS))
    text = "\n".join([
        "# float32 feature statistics: refined estimates that use A = I + G, against the measured errors", "",
        "Generated by `benchmarks/float32_statistics_refined.py` (one thread, torch "
        f"{torch.__version__}). Float32 ExactGP models, outputscale 1, noise σ² = ratio·s; errors of float32 "
        "statistics (tolerance ∞) against float64 statistics (tolerance 0) of the same float32 features: loss per "
        "point (GPyTorch's MLL) and relative, gradient ‖Δ‖/‖g‖ over the raw hyperparameters, posterior mean "
        "‖Δμ‖/‖μ‖ at 500 test points; NotPSD: float32 statistics made I + G indefinite (CapacitanceNotPSDError). "
        "‖E‖₂ = ‖L⁻¹ΔGL⁻ᵀ‖₂ (A₆₄ = LLᵀ). ε̂ = u·tr(G); ε̃_λ = ε̂/λ_min(I + G₃₂) (inf: I + G₃₂ indefinite); "
        "ε̃_dof = u·tr(A⁻¹G); ε̃_diag = u·Σ Gⱼⱼ/(1 + Gⱼⱼ); ε̃_probe = ‖A⁻¹ΔGV‖_F/2 (4 Gaussian probes, one float64 "
        "pass); coherence = ‖ΦᵀW1‖²/(Σw·tr(G)), the share of tr(G) in the features' weighted mean. "
        "Kernels: rff = ScaleKernel(SketchedRBFKernel(256)), ℓ = 0.3, x ∈ [0,1]³; orf = SketchedRBFKernel(128, "
        "'orf'), ℓ = 0.7, x ∈ [0,4]³; nystrom = 256 landmarks of an RBF, ℓ = 0.3; maclaurin = MaclaurinRBFKernel(256), "
        "ℓ = 0.5; orf32 = SketchedRBFKernel(32, 'orf'), ℓ = 1, x ∈ [0,4]³ (few features, every direction of G "
        "large); linear = LinearFeatureKernel (variance 1) on x ∈ [10,11]³ (nearly-constant, nearly collinear "
        "features); linear+rff = LinearFeatureKernel + rff on the same inputs. "
        f"Load average after the sweep {load_sweep}.", "",
        f"| kernel | N | σ²/s | {header} |", f"|---|---|---{rule}|", *rows, "",
        "## Summary per estimate (τ = 0.1)", "",
        "Models put in float32 (estimate ≤ 0.1), of them moved from float64 by the estimate (ε̂ > 0.1), of them "
        f"over the ε̂ = 0.1 row of the statistics_precision table (loss > {LOSS_BOUND:g} both per point and relative "
        f"— the table's losses were O(1) per point — or gradient > {GRAD_BOUND:g}), and the worst errors among the "
        "float32 ones.", "",
        "| estimate | float32 | moved from float64 | over the 0.1 row | worst loss, relative | worst gradient |",
        "|---|---|---|---|---|---|", *summary(records), "",
        "## Concentrated trace: linear+rff at σ² = s = 1, inputs offset", "",
        f"| offset | N | ‖ΔG‖₂/ε̂ | {header} |", f"|---|---|---{rule}|", *concentrated, "",
        "## ‖ΔG‖₂/ε̂ against N (σ² = s = 1)", "",
        "| kernel | N | ε̂ | ‖ΔG‖₂ | ‖ΔG‖₂/ε̂ | coherence |", "|---|---|---|---|---|---|", *grown, "",
        "## Tutorial 07's setting", "",
        f"N = 200 000, F = 128 ORF, d = 4, after the tutorial's 4 Adam steps ({hyper}); one MLL + gradient, "
        f"32 MiB memory budget (chunked), one thread, wall time, medians of {args.repeats} alternating repeats, "
        f"load average {load_tutorial}.", "",
        "| tolerance | chose | s per MLL + gradient |", "|---|---|---|",
        *(f"| {name} | {chosen[name]} | {median[name]:.3f} |" for name in modes_of_tutorial()), "",
        f"| {header} |", f"{rule}|", row([], values, errors), ""])
    out = Path(__file__).resolve().parent / "results" / "float32_statistics_refined.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
