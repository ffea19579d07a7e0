"""How accurate is a float32 model's marginal likelihood and gradient when its targets are far from zero?

The precision rule of float32 statistics (rfgp.inference.statistics_precision) bounds the rounding of the Gram and
log-determinant terms by ε̂ = u·tr(sΦᵀD⁻¹Φ); the quadratic term rᵀK⁻¹r = rᵀD⁻¹r − bᵀA⁻¹b cancels two terms of size
‖r‖²/σ², so its absolute error grows with the residual.  For a float32 ``ExactGPModel`` (``ScaleKernel(
SketchedRBFKernel(F))``, d = 3, lengthscale 0.3, outputscale 1, ``ConstantMean`` at 0 — far from its optimum) with
targets y = offset + sin(3x₀) + x₁cos(2x₂), against the float64 model with the same draws (``.double()``): the error of
the loss per point (GPyTorch's MLL is per point) and the relative error of each hyperparameter's gradient (raw
lengthscale, raw outputscale, raw noise, mean constant), in

* ``feature``: the feature-space path (materialised Φ, F × F capacitance);
* ``kernel``: the N × N kernel-space path (taken at N ≤ F; forced at N = 500, F = 256);
* ``chunked``: ``rfgp.settings.chunk_size(N // 4)``.

The dtype column says what the rule chose (``32``/``64``).  One thread.

    python benchmarks/float32_residual_precision.py [--sizes 500x256 ...] [--out NAME]

(It writes one table; the results file holds this branch's "After" table beside the "Before" one of c5c16ba, run with
the same script, and a summary written by hand: a rerun replaces all three by its table.)
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path
from unittest import mock

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
import rfgp.inference.operators as operators  # noqa: E402
from rfgp.inference.statistics_precision import recorded_statistics_dtypes  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.models import ExactGPModel  # noqa: E402

OFFSETS = (0.0, 10.0, 1e3, 1e4)
NOISES = (1e-1, 1e-2, 1e-4)
NAMES = ("lengthscale", "outputscale", "noise", "mean")


def make_model(num_points: int, num_features: int, offset: float, noise: float):
    gen = torch.Generator().manual_seed(0)
    x = torch.rand(num_points, 3, generator=gen)
    y = offset + torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x, y, likelihood, kernel).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.3, 1.0, noise
    return model


def parameters(model):
    return [model.covar_module.base_kernel.raw_lengthscale, model.covar_module.raw_outputscale,
            model.likelihood.raw_noise, model.mean_module.raw_constant]


def loss_and_grads(model, path: str):
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    chunk = model.train_inputs[0].shape[0] // 4 if path == "chunked" else None
    kernel_space = mock.patch.object(operators, "prefers_kernel_space", lambda *a, **k: path == "kernel")
    with rfgp.settings.chunk_size(chunk), kernel_space, recorded_statistics_dtypes() as dtypes:
        loss = -mll(model(*model.train_inputs), model.train_targets)
        grads = torch.autograd.grad(loss, parameters(model))
    chosen = "64" if torch.float64 in dtypes else ("32" if dtypes else "-")
    return loss.double(), torch.stack([g.double().reshape(()) for g in grads]), chosen


def rows_for(num_points: int, num_features: int, paths):
    for offset in OFFSETS:
        for noise in NOISES:
            model = make_model(num_points, num_features, offset, noise)
            reference = copy.deepcopy(model).double()
            ref_loss, ref_grads, _ = loss_and_grads(reference, "feature" if num_points > num_features else "kernel")
            for path in paths:
                try:
                    loss, grads, chosen = loss_and_grads(model, path)
                except Exception as failure:  # an indefinite float32 matrix
                    name = type(failure).__name__
                    yield f"| {num_points} | {num_features} | {offset:g} | {noise:g} | {path} | {name} |"
                    continue
                relative = ((grads - ref_grads).abs() / ref_grads.abs()).tolist()
                cells = [f"{num_points}", f"{num_features}", f"{offset:g}", f"{noise:g}", path, chosen,
                         f"{ref_loss.item():.3g}", f"{abs(loss - ref_loss).item():.2g}",
                         *(f"{r:.1e}" for r in relative)]
                yield "| " + " | ".join(cells) + " |"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["500x256", "500x2048", "5000x256", "5000x2048"])
    parser.add_argument("--out", default="float32_residual_precision")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for size in args.sizes:
        num_points, num_features = map(int, size.split("x"))
        paths = ("feature", "kernel", "chunked") if num_points <= 500 else ("feature", "chunked")
        for row in rows_for(num_points, num_features, paths):
            rows.append(row)
            print(row, flush=True)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    text = "\n".join([
        "# float32 marginal likelihood and gradient at targets far from zero, against the float64 model", "",
        "float32 ExactGPModel, ScaleKernel(SketchedRBFKernel(F)), d = 3, lengthscale 0.3, outputscale 1, ConstantMean "
        "at 0, targets offset + sin(3x₀) + x₁cos(2x₂); reference: the same model .double(). Loss: |Δ| of the "
        "per-point loss; gradients: |Δg|/|g| per raw hyperparameter. dtype: the statistics' precision the rule chose. "
        f"One thread, load average {load}.", "",
        "| N | F | offset | σ² | path | dtype | loss (f64) | Δloss | lengthscale | outputscale | noise | mean |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
        *rows, ""])
    out = Path(__file__).resolve().parent / "results" / f"{args.out}.md"
    out.write_text(text)


if __name__ == "__main__":
    main()
