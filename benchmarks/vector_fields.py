"""Vector-field regression: exact vs sketched curl/div-free GPs vs independent and decomposable GPs.

Datasets: the curl-free part of a synthetic 2-D Helmholtz field, the divergence-free part of a
3-D one, and the Earth's main magnetic field (IGRF via ``ppigrf``, curl-free, 0–1000 km shell).
Methods (all ``MultiOutputGPModel`` with ``MultitaskGaussianLikelihood(rank=0)``):

* ``exact-matching``   exact curl-free / div-free kernel (dense, only for small N)
* ``orff-{rff,orf,sorf}`` sketched matching kernel, F features
* ``independent``      one sketched-RBF GP per output (A diagonal), root width ≈ F
* ``decomposable``     sketched RBF ⊗ learned A = LLᵀ + diag (rank 1), root width ≈ F

Hyperparameters of every method are fitted on the same 500-point subset (Adam on the exact
MLL); then for each N the model is conditioned on N points ("fit" = building the Woodbury
cache) and predicts 1000 test points ("predict").  RMSE and MNLL (per component, latent
predictive) against the noise-free field; training targets carry 5 % Gaussian noise and
are standardised.

Run: ``python benchmarks/vector_fields.py`` (full) or ``--quick``.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

import rfgp  # noqa: E402
from rfgp.datasets import helmholtz_field, igrf_magnetic_field  # noqa: E402
from rfgp.kernels import (  # noqa: E402
    CurlFreeRBFKernel,
    DivFreeRBFKernel,
    SketchedCurlFreeKernel,
    SketchedDecomposableKernel,
    SketchedDivFreeKernel,
    SketchedRBFKernel,
)
from rfgp.multioutput import MultiOutputGPModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float64


def load(name: str, n: int, seed: int):
    """(x, noisy targets, noise-free targets, family)."""
    noise = torch.Generator().manual_seed(seed + 1)
    if name == "synthetic-2d-curl":
        clean = helmholtz_field(n, input_dim=2, seed=seed)
        x, f, family = clean["x"], clean["curl_free"], "curl"
    elif name == "synthetic-3d-div":
        clean = helmholtz_field(n, input_dim=3, seed=seed, width=0.45)
        x, f, family = clean["x"], clean["divergence_free"], "div"
    else:
        x, f = igrf_magnetic_field(n, altitude_km=(0.0, 1000.0), max_degree=13, seed=seed)
        f, family = f / 30.0, "curl"  # µT / 30: unit-scale targets
    return x, f + 0.05 * f.std() * torch.randn(f.shape, generator=noise, dtype=DTYPE), f, family


def make_kernel(method: str, family: str, d: int, num_features: int):
    derivative = {"curl": (CurlFreeRBFKernel, SketchedCurlFreeKernel), "div": (DivFreeRBFKernel, SketchedDivFreeKernel)}[family]
    if method == "exact-matching":
        return derivative[0](d), True
    if method.startswith("orff-"):
        width = 1 if family == "curl" else d - 1
        features = num_features - num_features % (2 * width)
        return derivative[1](features, d, method=method[5:], seed=0), True
    scalar = SketchedRBFKernel(2 * round(num_features / (2 * (1 + d))), method="orf", seed=0)
    kernel = SketchedDecomposableKernel(scalar, num_tasks=d, rank=1)
    if method == "independent":
        kernel.task_covar_module.covar_factor.data.zero_()
        kernel.task_covar_module.covar_factor.requires_grad_(False)
    return kernel, False


def build(x, y, kernel, derivative: bool, lengthscale: float):
    likelihood = gpytorch.likelihoods.MultitaskGaussianLikelihood(num_tasks=y.shape[-1], rank=0)
    model = MultiOutputGPModel(x, y, likelihood, gpytorch.kernels.ScaleKernel(kernel)).to(DTYPE)
    inner = kernel if derivative else kernel.base_kernel
    inner.lengthscale = lengthscale
    model.covar_module.outputscale = y.var().item() * (lengthscale**2 if derivative else 1.0)
    likelihood.noise = 0.01
    return model, likelihood


def evaluate(model, likelihood, test_x, test_y):
    model.eval()
    likelihood.eval()
    start = time.perf_counter()
    with torch.no_grad():
        predictive = model(test_x)  # latent field, scored against the noise-free truth
        mean, var = predictive.mean, predictive.variance
    seconds = time.perf_counter() - start
    rmse = (mean - test_y).pow(2).mean().sqrt().item()
    mnll = (0.5 * torch.log(2 * math.pi * var) + 0.5 * (test_y - mean).pow(2) / var).mean().item()
    return rmse, mnll, seconds


def run(datasets, sizes, methods, num_features, exact_max, train_subset, iterations, seed=0):
    rows = []
    for name in datasets:
        x_all, y_all, f_all, family = load(name, max(sizes) + 1000, seed)
        scale = y_all[:-1000].std()
        test_x, test_y = x_all[-1000:], f_all[-1000:] / scale
        d = x_all.shape[-1]
        lengthscale = 0.5 if name.startswith("synthetic") else 0.6
        for method in methods:
            kernel, derivative = make_kernel(method, family, d, num_features)
            sub_x, sub_y = x_all[:train_subset], y_all[:train_subset] / scale
            model, likelihood = build(sub_x, sub_y, kernel, derivative, lengthscale)
            start = time.perf_counter()
            rfgp.fit_mll(model, num_iterations=iterations, lr=0.05, progress=False, optimizer="adam")
            hyper_seconds = time.perf_counter() - start
            state = model.state_dict()
            for n in sizes:
                if method == "exact-matching" and n > exact_max:
                    continue
                x, y = x_all[:n], y_all[:n] / scale
                model, likelihood = build(x, y, make_kernel(method, family, d, num_features)[0], derivative, lengthscale)
                model.load_state_dict(state, strict=False)
                model.set_train_data(x, y, strict=False)
                model.eval()
                start = time.perf_counter()
                with torch.no_grad():
                    model(x[:1])  # builds the posterior cache: the O(N·p·F²) (or O(N³p³)) step
                fit_seconds = time.perf_counter() - start
                rmse, mnll, predict_seconds = evaluate(model, likelihood, test_x, test_y)
                rows.append(
                    dict(dataset=name, method=method, n=n, rmse=rmse, mnll=mnll, fit_s=fit_seconds,
                         predict_s=predict_seconds, hyper_s=hyper_seconds)
                )
                print(f"{name:18s} {method:15s} N={n:6d} rmse={rmse:.4f} mnll={mnll:7.3f} "
                      f"fit={fit_seconds:7.2f}s predict={predict_seconds:6.2f}s", flush=True)
    return rows


def write(rows, header: str, stem: str = "vector_fields"):
    RESULTS.mkdir(parents=True, exist_ok=True)
    write_csv(RESULTS / f"{stem}.csv", rows)
    lines = [header, "", "| dataset | method | N | RMSE | MNLL | fit (s) | predict (s) | hyper-fit (s) |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['dataset']} | {r['method']} | {r['n']} | {r['rmse']:.4f} | {r['mnll']:.3f} | "
            f"{r['fit_s']:.2f} | {r['predict_s']:.2f} | {r['hyper_s']:.1f} |"
        )
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = sorted({r["dataset"] for r in rows})
    fig, axes = plt.subplots(2, len(datasets), figsize=(4.5 * len(datasets), 7), squeeze=False)
    for col, name in enumerate(datasets):
        for method in sorted({r["method"] for r in rows}):
            sel = [r for r in rows if r["dataset"] == name and r["method"] == method]
            if not sel:
                continue
            axes[0, col].plot([r["n"] for r in sel], [r["rmse"] for r in sel], "o-", label=method)
            axes[1, col].plot([r["n"] for r in sel], [r["fit_s"] + r["predict_s"] for r in sel], "o-", label=method)
        axes[0, col].set(title=name, xscale="log", yscale="log", ylabel="test RMSE (standardised)")
        axes[1, col].set(xscale="log", yscale="log", xlabel="N training points (p outputs each)", ylabel="fit + predict time (s)")
    axes[0, 0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    args = parser.parse_args()
    torch.set_default_dtype(DTYPE)
    methods = ["exact-matching", "orff-rff", "orff-orf", "orff-sorf", "independent", "decomposable"]
    datasets = ["synthetic-2d-curl", "synthetic-3d-div", "igrf-curl"]
    if args.quick:
        sizes, num_features, exact_max, subset, iterations = [200, 500], 256, 500, 200, 10
    else:
        sizes, num_features, exact_max, subset, iterations = [500, 2000, 10000, 30000], 512, 1000, 500, 30
    rows = run(datasets, sizes, methods, num_features, exact_max, subset, iterations)
    header = (
        f"# Vector-field regression ({'quick' if args.quick else 'full'} run): F = {num_features} root columns, "
        f"hyperparameters fitted on {subset} points ({iterations} Adam steps), 1000 test vectors, "
        f"exact GP up to N = {exact_max}; largest N = {max(sizes)} points = {max(sizes) * 3} vectors in 3-D "
        "(reduced from 100 000 points to fit the time budget). CPU, float64, 2 cores shared with other jobs "
        "(load ≈ 15: timings are noisy, compare within a row block only)."
    )
    write(rows, header, "vector_fields_quick" if args.quick else "vector_fields")


if __name__ == "__main__":
    main()
