"""The kernel-space path (N ≤ F) under the float32 precision rule: accuracy against ε̂ = u·tr(sΦᵀD⁻¹Φ), and paired times.

float32 features form and factorise K = sΦΦᵀ + D in float32 while ε̂ ≤ ``rfgp.settings.float32_statistics_tolerance``
(default 10⁻¹), in float64 otherwise (rfgp.inference.kernel_space.covariance_dtype).

1. Accuracy (the float32 ExactGP of ``float32_statistics_threshold.py`` with F = 2048: d = 3, lengthscale 0.3,
   outputscale 1, noise σ² from ε̂ = u·N/σ²; N = 500, 1000, 2000): ‖D^{-1/2}ΔK D^{-1/2}‖₂ (float32 against float64
   Gram of the same float32 features) over ε̂, λ_min(D^{-1/2}K₃₂D^{-1/2}), and against the float64 model the loss
   (|Δ| per point), gradient (‖Δ‖/‖g‖; lengthscale, outputscale, noise) and posterior mean and variance at 200 test
   points (‖Δ‖/‖·‖), with K in float32 (tolerance ∞) and in float64 (tolerance 0).
2. Time (N = 1000, F = 2048, ``kernel_space_path.py``'s problem, one thread, CPU time, pairs A B B A as
   ``float32_statistics_paths.py``): one MLL + gradient, and the posterior (fresh caches, mean and variance at 200
   points), for a benign model (GPyTorch's default hyperparameters, ε̂ ≈ 6·10⁻⁵) and a high-SNR one (outputscale 20,
   noise 10⁻³, ε̂ ≈ 1.2; at outputscale 100, ε̂ ≈ 6, K formed in float32 is not positive definite): the default
   (``adaptive``) against the tolerance ∞ (float32) and 0 (float64); and the decision alone (``covariance_dtype``: one
   O(N·F) pass and a host read).

    python benchmarks/kernel_space_precision.py   # writes results/kernel_space_precision.md
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from pathlib import Path

import torch
from linear_operator.utils.errors import NotPSDError

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

from float32_statistics_paths import REPEATS, posterior_step, regression_step, timings  # noqa: E402
from float32_statistics_threshold import ESTIMATES, U, loss_and_grads, make_model  # noqa: E402
from kernel_space_path import _model, _problem  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference.kernel_space import covariance_dtype, kernel_gram  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.kernels.combinations import kernel_features  # noqa: E402

NUM_FEATURES = 2048


def rounding(model) -> tuple[float, float, float]:
    """(‖D^{-1/2}(K₃₂ − K₆₄)D^{-1/2}‖₂, ε̂, λ_min(D^{-1/2}K₃₂D^{-1/2})) of the same float32 features."""
    with torch.no_grad():
        features = kernel_features(model.covar_module, model.train_inputs[0])
        noise = model.likelihood.noise.double()
        low, high = kernel_gram(features).double() / noise, kernel_gram(features.double()) / noise
        error = torch.linalg.eigvalsh(low - high).abs().max().item()
        smallest = torch.linalg.eigvalsh(low)[0].item() + 1
        return error, U * high.diagonal().sum().item(), smallest


def posterior(model, points, tolerance=None):
    model.train()
    model.eval()  # fresh caches, formed under the tolerance
    setting = contextlib.nullcontext() if tolerance is None else rfgp.settings.float32_statistics_tolerance(tolerance)
    with torch.no_grad(), setting:
        prediction = model(points)
        return prediction.mean.double(), prediction.variance.double()


def relative(value, reference) -> str:
    return f"{((value - reference).norm() / reference.norm()).item():.2g}"


def errors(model, reference) -> list[str]:
    """Loss, gradient, mean and variance errors of the float32 ``model`` with K in float32 and in float64 against the
    float64 ``reference`` model; a float32 K that does not factorise gives its error's name."""
    loss64, grads64 = loss_and_grads(reference)
    points = reference.train_inputs[0][:200] * 1.01
    mean64, var64 = posterior(reference, points)
    cells = []
    for tolerance in (math.inf, 0.0):
        model.train()
        try:
            loss, grads = loss_and_grads(model, tolerance)
            mean, var = posterior(model, points.float(), tolerance)
        except Exception as failure:  # a float32 K that is not positive definite
            cells += [type(failure).__name__, "—", "—", "—"]
            continue
        cells += [f"{abs(loss - loss64).item():.2g}", relative(grads, grads64), relative(mean, mean64),
                  relative(var, var64)]
    return cells


def accuracy_rows() -> list[str]:
    rows = []
    for num_points in (500, 1000, 2000):
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(num_points, 3, generator=gen, dtype=torch.float64)
        y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
        for target in ESTIMATES:
            noise = U * num_points / target
            model = make_model(x, y, torch.float32, noise, NUM_FEATURES)
            error, estimate, smallest = rounding(model)
            reference = make_model(x, y, torch.float64, noise, NUM_FEATURES)
            cells = [f"{num_points}", f"{noise:.2g}", f"{estimate:.2g}", f"{error / estimate:.3f}", f"{smallest:.3g}",
                     *errors(model, reference)]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    return rows


def decision_time(model, calls: int = 200) -> float:
    """CPU seconds of one ``covariance_dtype`` decision on the model's training features (the MLL's call)."""
    with torch.no_grad():
        features = kernel_features(model.covar_module.base_kernel, model.train_inputs[0])
        noise = model.likelihood.noise.expand(features.shape[0])
        scale = model.covar_module.outputscale
    covariance_dtype(features, noise, scale)
    start = time.process_time()
    for _ in range(calls):
        covariance_dtype(features, noise, scale)
    return (time.process_time() - start) / calls


def timing_rows() -> list[str]:
    x, y = _problem(1000, torch.float32)
    high_snr = {"covar_module.outputscale": 20.0, "likelihood.noise_covar.noise": 1e-3}
    rows = []
    for case, hyperparameters in (("benign", None), ("high SNR", high_snr)):
        model = _model(SketchedRBFKernel(NUM_FEATURES, seed=0), x, y, torch.float32, hyperparameters)
        reference = _model(SketchedRBFKernel(NUM_FEATURES, seed=0), x.double(), y.double(), torch.float64,
                           hyperparameters)
        estimate = rounding(model)[1]
        accuracy = errors(model, reference)
        decision = decision_time(model)
        model.train()
        step = paired_times(regression_step, model)
        rows.append(_row("MLL + gradient", case, estimate, step, decision, accuracy[:2], accuracy[4:6]))
        print(rows[-1], flush=True)
        model.eval()
        prediction = paired_times(posterior_step, (model, x[:200] * 1.01))
        rows.append(_row("posterior (caches, 200 points)", case, estimate, prediction, None, accuracy[2:4],
                         accuracy[6:8]))
        print(rows[-1], flush=True)
    return rows


def paired_times(step, state):
    """:func:`float32_statistics_paths.timings` against float32 and float64, or against float64 only where K formed in
    float32 is not positive definite."""
    try:
        return timings(step, state, True)
    except NotPSDError:
        return timings(step, state, False)


def _row(path, case, estimate, times, decision, errors32, errors64) -> str:
    adaptive32, float32, adaptive64, float64 = times
    versus32 = f"{adaptive32:.4f} | {float32:.4f} | {adaptive32 / float32:.3f}" if float32 else "— | — | —"
    share = "—" if decision is None else f"{decision * 1e3:.2f} ms ({decision / adaptive64:.2%})"
    return (f"| {path} | {case} | {estimate:.2g} | {versus32} | {adaptive64:.4f} | {float64:.4f} | "
            f"{adaptive64 / float64:.3f} | {share} | {' / '.join(errors32)} | {' / '.join(errors64)} |")


def main() -> None:
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    timing = timing_rows()
    load_between = os.getloadavg()
    accuracy = accuracy_rows()
    load_after = os.getloadavg()
    loads = "; ".join(", ".join(f"{v:.2f}" for v in load) for load in (load_before, load_between, load_after))
    text = "\n".join([
        "# Kernel-space path (N ≤ F): the float32 precision rule", "",
        f"Generated by `benchmarks/kernel_space_precision.py`: one thread, torch {torch.__version__}, "
        f"{os.cpu_count()} logical CPUs (shared host). Load average (1, 5, 15 min) before the timings, between and "
        f"after the accuracy sweep: {loads}.", "",
        "## Time: N = 1000, F = 2048", "",
        f"CPU seconds, medians of {REPEATS} repeats per pair (A B B A). *adaptive*: the default tolerance 10⁻¹ "
        "(benign: K in float32 after the decision; high SNR: float64); *float32*: tolerance ∞ (no decision, the path "
        "before); *float64*: tolerance 0. The decision: one `covariance_dtype` call (its share of the adaptive "
        "evaluation). Errors against the float64 model, K in float32 and in float64: loss |Δ| per point / gradient "
        "‖Δ‖/‖g‖, or posterior mean / variance ‖Δ‖/‖·‖ at 200 points.", "",
        "| evaluation | model | ε̂ | adaptive | float32 | ratio | adaptive | float64 | ratio | decision "
        "| errors, K float32 | errors, K float64 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *timing, "",
        "## Accuracy against ε̂ = u·tr(sΦᵀD⁻¹Φ)", "",
        f"float32 ExactGP, ScaleKernel(SketchedRBFKernel({NUM_FEATURES})), d = 3, lengthscale 0.3, outputscale 1, "
        "noise σ² from ε̂ = u·N/σ². ‖ΔK̃‖₂ = ‖D^{-1/2}(K₃₂ − K₆₄)D^{-1/2}‖₂ of the same float32 features; λ_min of "
        "D^{-1/2}K₃₂D^{-1/2} (≥ 1 in exact arithmetic). Against the float64 model: loss |Δ| per point, gradient "
        "‖Δ‖/‖g‖, posterior mean and variance ‖Δ‖/‖·‖, with K in float32 (tolerance ∞) and in float64 (tolerance 0).",
        "",
        "| N | σ² | ε̂ | ‖ΔK̃‖₂/ε̂ | λ_min(K̃₃₂) | loss, K f32 | grad, K f32 | mean, K f32 | var, K f32 | loss, K f64 "
        "| grad, K f64 | mean, K f64 | var, K f64 |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        *accuracy, ""])
    out = Path(__file__).resolve().parent / "results" / "kernel_space_precision.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
