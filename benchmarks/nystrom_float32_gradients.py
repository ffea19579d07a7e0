"""Float32 Nyström gradients: the backward's K̄ = Φ̄L⁻¹ solved per row against the M × M factor form it replaced.

The fused backward of Nyström statistics (rfgp.inference.triangular_statistics) used to form K̄ =
W(2Φ(SL⁻¹) + R(L⁻ᵀH̄)ᵀ) for float32 features too, with SL⁻¹ and L⁻ᵀH̄ formed in float64 and rounded to float32
once for all N rows ("factor form" below).  Float32 features now solve Φ̄ = W(2ΦS + RH̄ᵀ) against L per row
("row solve", the code's path).  For float32 ExactGP models, the errors of float32 statistics (tolerance ∞) against
float64 statistics of the same model (tolerance 0, the same float32 features) — relative gradient over the raw
hyperparameters, and the lengthscale's alone — under either form:

* against the conditioning of the landmark factor L = chol(K(Z, Z) + εI): lengthscale ℓ, number of landmarks M and
  relative jitter ε of an RBF on x ∈ [0, 1]³, N = 2 000, noise 10⁻² (κ(L) and (max/min diag L)² listed);
* the Nyström rows of ``float32_statistics_refined.py`` (256 landmarks, ℓ = 0.3, N = 2 000–50 000, noise
  1…10⁻⁴; loss and posterior mean do not go through the backward and are those of its table);
* the time per float32 MLL + gradient (one thread, CPU time, medians of alternating repeats and the median of their
  paired ratios), materialised and chunked (``rfgp.settings.memory_budget``).

    python benchmarks/nystrom_float32_gradients.py   # writes results/nystrom_float32_gradients.md
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import statistics
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks
sys.path.insert(0, str(Path(__file__).resolve().parent))

from float32_statistics_refined import make_model  # noqa: E402

import rfgp  # noqa: E402
from rfgp.inference import triangular_statistics  # noqa: E402
from rfgp.inference.statistics_precision import unit_roundoff  # noqa: E402
from rfgp.kernels import NystromKernel  # noqa: E402
from rfgp.models import ExactGPModel  # noqa: E402

FORMS = ("factor form", "row solve")


@contextlib.contextmanager
def form(name):
    """The backward's K̄ by the M × M factors rounded to float32 (the form before) or by the row solve (the code's)."""
    if name == "row solve":
        yield
        return
    uses, factors = triangular_statistics._uses_factors, triangular_statistics._right_factors

    def rounded_factors(chol, grad_gram, grad_projection):
        wide = factors(chol.double(), grad_gram.double(), grad_projection.double())
        return tuple(f.to(chol.dtype) for f in wide)

    triangular_statistics._uses_factors = lambda weights, needs, dtype: uses(weights, needs, torch.float64)
    triangular_statistics._right_factors = rounded_factors
    try:
        yield
    finally:
        triangular_statistics._uses_factors, triangular_statistics._right_factors = uses, factors


def conditioned_model(num_points, lengthscale, num_landmarks, jitter, noise=1e-2):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen, dtype=torch.float64)
    y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2]) + math.sqrt(noise) * torch.randn(
        num_points, generator=gen, dtype=torch.float64)
    landmarks = x[torch.randperm(num_points, generator=torch.Generator().manual_seed(1))[:num_landmarks]].float()
    kernel = gpytorch.kernels.ScaleKernel(NystromKernel(gpytorch.kernels.RBFKernel(), landmarks, jitter=jitter))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x.float(), y.float(), likelihood, kernel).train()
    kernel.base_kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = lengthscale, 1.0, noise
    return model


def gradients(model, tolerance, budget=2**40):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    with rfgp.settings.float32_statistics_tolerance(tolerance), rfgp.settings.memory_budget(budget):
        loss = -mll(model(*model.train_inputs), model.train_targets)
        grads = torch.autograd.grad(loss, [p for _, p in named])
    return {n: g.double().reshape(-1) for (n, _), g in zip(named, grads)}


def errors(model, budget=2**40):
    """{form: (gradient error, lengthscale gradient error)} of float32 against float64 statistics."""
    reference = gradients(model, 0.0, budget)
    whole = torch.cat(list(reference.values()))
    name = next(n for n in reference if n.endswith("raw_lengthscale"))
    result = {}
    for which in FORMS:
        with form(which):
            grads = gradients(model, math.inf, budget)
        result[which] = (((torch.cat(list(grads.values())) - whole).norm() / whole.norm()).item(),
                         ((grads[name] - reference[name]).norm() / reference[name].norm()).item())
    return result


def estimate(model):
    """(κ(L), (max/min diag L)², ε̂ = u·tr(ΦᵀD⁻¹Φ)) of the float32 model."""
    nystrom = model.covar_module.base_kernel
    with torch.no_grad():
        chol = nystrom.landmark_cholesky(torch.float32).double()
        features = nystrom.featurize(model.train_inputs[0]).double()
        trace = features.square().sum() * model.covar_module.outputscale.double() / model.likelihood.noise.double()
    diagonal = chol.diagonal()
    return (torch.linalg.cond(chol).item(), (diagonal.max() / diagonal.min()).item() ** 2,
            unit_roundoff(torch.float32) * trace.item())


def conditioning():
    lines = ["| ℓ | M | jitter | κ(L) | (max/min diag L)² | ε̂ | gradient, factor form | gradient, row solve | "
             "lengthscale, factor form | lengthscale, row solve |", "|---|---|---|---|---|---|---|---|---|---|"]
    for lengthscale in (0.1, 0.3, 1.0):
        for num_landmarks in (64, 256):
            for jitter in (1e-6, 1e-4):
                model = conditioned_model(2000, lengthscale, num_landmarks, jitter)
                found = errors(model)
                cells = [f"{v:.2g}" for v in estimate(model)]
                cells += [f"{found[f][0]:.2g}" for f in FORMS] + [f"{found[f][1]:.2g}" for f in FORMS]
                lines.append(f"| {lengthscale} | {num_landmarks} | {jitter:g} | " + " | ".join(cells) + " |")
                print(lines[-1], flush=True)
    chunked = conditioned_model(2000, 0.3, 256, 1e-6)
    lines += ["", "Chunked (ℓ = 0.3, M = 256, jitter 10⁻⁶):", "",
              "| memory budget | gradient, factor form | gradient, row solve |", "|---|---|---|"]
    for budget in (2**18, 2**19, 2**20, 2**21, 2**22):
        found = errors(chunked, budget)
        lines.append(f"| 2^{int(math.log2(budget))} B | {found[FORMS[0]][0]:.2g} | {found[FORMS[1]][0]:.2g} |")
        print(lines[-1], flush=True)
    return lines


def refined_rows():
    lines = ["| N | σ²/s | gradient, factor form | gradient, row solve | lengthscale, factor form | "
             "lengthscale, row solve |", "|---|---|---|---|---|---|"]
    for num_points in (2000, 10000, 50000):
        for ratio in (1.0, 1e-2, 1e-3, 1e-4):
            found = errors(make_model("nystrom", num_points, ratio))
            cells = [f"{found[f][0]:.2g}" for f in FORMS] + [f"{found[f][1]:.2g}" for f in FORMS]
            lines.append(f"| {num_points} | {ratio:g} | " + " | ".join(cells) + " |")
            print(lines[-1], flush=True)
    return lines


def step_time(model, budget):
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    params = [p for p in model.parameters() if p.requires_grad]
    start = time.process_time()
    with rfgp.settings.float32_statistics_tolerance(math.inf), rfgp.settings.memory_budget(budget):
        loss = -mll(model(*model.train_inputs), model.train_targets)
        torch.autograd.grad(loss, params)
    return time.process_time() - start


def timing(repeats):
    lines = ["| N | M | memory budget | s, factor form | s, row solve | paired ratio (median, range) |",
             "|---|---|---|---|---|---|"]
    for num_points, num_landmarks, budget in ((10000, 256, 2**40), (10000, 1024, 2**40), (20000, 512, 2**40),
                                              (20000, 512, 2**24)):
        model = conditioned_model(num_points, 0.3, num_landmarks, 1e-6)
        times = {f: [] for f in FORMS}
        step_time(model, budget)  # warm-up
        for repeat in range(repeats):
            for which in (FORMS if repeat % 2 else FORMS[::-1]):
                with form(which):
                    times[which].append(step_time(model, budget))
        ratios = [b / a for a, b in zip(times[FORMS[0]], times[FORMS[1]])]
        shown = "whole" if budget == 2**40 else f"2^{int(math.log2(budget))} B (chunked)"
        lines.append(f"| {num_points} | {num_landmarks} | {shown} | {statistics.median(times[FORMS[0]]):.3f} | "
                     f"{statistics.median(times[FORMS[1]]):.3f} | {statistics.median(ratios):.2f} "
                     f"({min(ratios):.2f}–{max(ratios):.2f}) |")
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    torch.set_num_threads(1)
    sections = [
        "# Float32 Nyström gradients: the backward's row solve against the M × M factor form", "",
        f"Generated by `benchmarks/nystrom_float32_gradients.py` (one thread, torch {torch.__version__}). Errors of "
        "float32 statistics (tolerance ∞) against float64 statistics (tolerance 0) of the same float32 model: "
        "gradient ‖Δ‖/‖g‖ over the raw hyperparameters, and the lengthscale's. Factor form: K̄ = W(2Φ(SL⁻¹) + "
        "R(L⁻ᵀH̄)ᵀ) with SL⁻¹, L⁻ᵀH̄ formed in float64 and rounded to float32 (the backward before); row solve: "
        "K̄ = Φ̄L⁻¹ (now). ε̂ = u·tr(ΦᵀD⁻¹Φ).", "",
        "## Conditioning of the landmark factor (RBF, x ∈ [0, 1]³, N = 2 000, noise 10⁻²)", "", *conditioning(), "",
        "## The Nyström rows of float32_statistics_refined (256 landmarks, ℓ = 0.3)", "", *refined_rows(), "",
        f"## Time per float32 MLL + gradient (ℓ = 0.3, jitter 10⁻⁶, {args.repeats} alternating repeats)", "",
        *timing(args.repeats), "", f"Load average after the run: {', '.join(f'{v:.1f}' for v in os.getloadavg())}.",
    ]
    out = Path(__file__).resolve().parent / "results" / "nystrom_float32_gradients.md"
    out.write_text("\n".join(sections) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
