"""At what estimate ε̂ = u·tr(ΦᵀWΦ) do float32 feature statistics start to matter?  The threshold of
``rfgp.settings.float32_statistics_tolerance`` (rfgp.inference.statistics_precision).

For a float32 ExactGP (``ScaleKernel(SketchedRBFKernel(512))``, d = 3, lengthscale 0.3, outputscale 1) at noise
variances σ² that put ε̂ = u·N/σ² between 10⁻⁴ and 10², three evaluations of the MLL and its gradient (lengthscale,
outputscale, noise):

* ``f32 stats``: float32 features, statistics formed in float32 (tolerance ∞);
* ``f64 stats``: the same float32 features, statistics formed in float64 (tolerance 0): only the features' rounding;
* the float64 model (reference).

Columns: ‖ΔG‖₂ (float32 against float64 sums of the same float32 features) over ε̂; λ_min(I + G) of the float32 sums;
loss and gradient errors against float64 (loss: |Δ| per point; gradient: ‖Δ‖/‖g‖) for both.  One thread.

    python benchmarks/float32_statistics_threshold.py   # writes results/float32_statistics_threshold.md
"""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp  # noqa: E402
from rfgp.inference.linalg import feature_statistics  # noqa: E402
from rfgp.inference.statistics_precision import unit_roundoff  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.kernels.combinations import kernel_features  # noqa: E402
from rfgp.models import ExactGPModel  # noqa: E402

U = unit_roundoff(torch.float32)
ESTIMATES = (1e-4, 1e-3, 1e-2, 3e-2, 1e-1, 3e-1, 1.0, 3.0, 10.0, 100.0)


def make_model(x, y, dtype, noise, num_features: int = 512):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, seed=0))
    likelihood = gpytorch.likelihoods.GaussianLikelihood(noise_constraint=gpytorch.constraints.GreaterThan(1e-12))
    model = ExactGPModel(x.to(dtype), y.to(dtype), likelihood, kernel).to(dtype).train()
    kernel.base_kernel.lengthscale, kernel.outputscale, likelihood.noise = 0.3, 1.0, noise
    return model


def loss_and_grads(model, tolerance=math.inf):
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    with rfgp.settings.float32_statistics_tolerance(tolerance):
        loss = -mll(model(*model.train_inputs), model.train_targets)
    params = [model.covar_module.base_kernel.raw_lengthscale, model.covar_module.raw_outputscale,
              model.likelihood.raw_noise]
    grads = torch.autograd.grad(loss, params)
    return loss.double(), torch.cat([g.double().reshape(-1) for g in grads])


def gram_pair(model):
    """(Φ, w, G₃₂, G₆₄): the model's float32 features and noise weights, and their Gram ΦᵀWΦ formed in float32
    (returned in float64) and in float64."""
    with torch.no_grad():
        x = model.train_inputs[0]
        features = kernel_features(model.covar_module, x)
        weights = model.likelihood.noise.expand(x.shape[0]).reciprocal()
        empty = features.new_zeros(x.shape[0], 0)
        low = feature_statistics(features, weights, empty)[0].double()
        high = feature_statistics(features.double(), weights.double(), empty.double())[0]
    return features, weights, low, high


def summation_error(model):
    _, _, low, high = gram_pair(model)
    with torch.no_grad():
        error = torch.linalg.eigvalsh(low - high).abs().max().item()
        smallest = torch.linalg.eigvalsh(low + torch.eye(low.shape[0], dtype=low.dtype))[0].item()
        return error, high.diagonal().sum().item(), smallest


def main() -> None:
    torch.set_num_threads(1)
    rows = []
    for num_points in (1500, 5000, 20000):
        gen = torch.Generator().manual_seed(0)
        x = torch.rand(num_points, 3, generator=gen, dtype=torch.float64)
        y = torch.sin(3 * x[:, 0]) + x[:, 1] * torch.cos(2 * x[:, 2])
        for target in ESTIMATES:
            noise = U * num_points / target
            reference = loss_and_grads(make_model(x, y, torch.float64, noise))
            model = make_model(x, y, torch.float32, noise)
            error, trace, smallest = summation_error(model)
            estimate = U * trace
            cells = [f"{num_points}", f"{noise:.2g}", f"{estimate:.2g}", f"{error / estimate:.3f}", f"{smallest:.3g}"]
            for tolerance in (math.inf, 0.0):
                try:
                    loss, grads = loss_and_grads(model, tolerance)
                except Exception as failure:  # a float32 sum that made I + G indefinite
                    cells += [type(failure).__name__, "—"]
                    continue
                cells += [f"{abs(loss - reference[0]).item():.2g}",
                          f"{((grads - reference[1]).norm() / reference[1].norm()).item():.2g}"]
            rows.append("| " + " | ".join(cells) + " |")
            print(rows[-1], flush=True)
    load = ", ".join(f"{v:.1f}" for v in os.getloadavg())
    text = "\n".join([
        "# float32 feature statistics: rounding estimate ε̂ = u·tr(ΦᵀWΦ) against the MLL's error", "",
        "float32 ExactGP, ScaleKernel(SketchedRBFKernel(512)), d = 3, lengthscale 0.3, outputscale 1, noise σ² from "
        "ε̂ = u·N/σ²; MKL, one thread. ‖ΔG‖₂: float32 against float64 sums of the same float32 features. Loss: |Δ| of "
        "the per-point MLL against the float64 model; gradient: ‖Δ‖/‖g‖ (raw lengthscale, outputscale, noise). "
        f"Load average {load}.", "",
        "| N | σ² | ε̂ | ‖ΔG‖₂/ε̂ | λ_min(I + G₃₂) | loss, f32 stats | grad, f32 stats | loss, f64 stats "
        "| grad, f64 stats |",
        "|---|---|---|---|---|---|---|---|---|",
        *rows, ""])
    out = Path(__file__).resolve().parent / "results" / "float32_statistics_threshold.md"
    out.write_text(text)
    print(text)


if __name__ == "__main__":
    main()
