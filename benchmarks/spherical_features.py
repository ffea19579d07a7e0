"""Spherical random features on sklearn digits: relative Frobenius error vs width, and fit time.

Reproduces the SRF rows of paper 000, §6.4 (Figs. 8/9, kernel panel) on an offline dataset:
k(x, y) = (1 − ‖x − y‖²/a²)^p with a = 2, p ∈ {3, 7, 10}, on digits (d = 64) unit-normalised
either raw (non-negative pixels) or after centring; widths F ∈ {1d, 3d, 5d}; error
‖K − K̂‖_F/‖K‖_F (Eq. 58) on 500 points, mean ± std over seeds.

Methods (all real width F):
* SRF, SRF Orth. — rfgp.kernels.SketchedSphericalPolynomialKernel, method "srf" / "srf_orth".
* SRF Orth. Comp. (paper counting) — Eq. 60 with F complex features, i.e. 2F real numbers;
  at equal *real* width it is identical to SRF Orth. (footnote 19), so it is shown at the
  paper's counting only.
* RFF surrogate — RFF for the Gaussian exp(−pτ²/a²), which matches k to second order at τ = 0
  (the obvious RFF-family stand-in; biased for the polynomial kernel).
* K̂ floor — the fitted kernel itself (infinitely many features): the bias every SRF variant
  converges to.
Also times the radial-density fit (first call, memory cache cleared) and the cached call.

Run: python benchmarks/spherical_features.py [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

from rfgp.features import RandomFourierFeatures  # noqa: E402
from rfgp.features.radial_density import clear_memory_cache, fit_radial_density  # noqa: E402
from rfgp.kernels import SketchedSphericalPolynomialKernel  # noqa: E402

RESULTS = os.path.join(os.path.dirname(__file__), "results")
A = 2.0


def relative_frobenius(approx, exact):
    return float(torch.linalg.matrix_norm(approx - exact) / torch.linalg.matrix_norm(exact))


def digits(centred: bool, num_points: int) -> torch.Tensor:
    x = torch.tensor(load_digits().data, dtype=torch.float64)
    if centred:
        x = x - x.mean(0)
    x = torch.nn.functional.normalize(x, dim=-1)
    return x[torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:num_points]]


def errors_for(x, power, width, seed):
    exact = SketchedSphericalPolynomialKernel(power, 2, a=A).exact(x, x)
    out = {}
    for name, method, real_width in (("SRF", "srf", width), ("SRF Orth.", "srf_orth", width),
                                     ("SRF Orth. Comp. (paper counting)", "srf_orth_complex", 2 * width)):
        kernel = SketchedSphericalPolynomialKernel(power, real_width, a=A, method=method, seed=seed).double()
        out[name] = relative_frobenius(kernel(x).to_dense(), exact)
    rff = RandomFourierFeatures(width, input_dim=x.shape[-1], seed=seed).double()
    features = rff(x * (2 * power) ** 0.5 / A)  # lengthscale a/√(2p): exp(−pτ²/a²)
    out["RFF surrogate"] = relative_frobenius(features @ features.T, exact)
    fitted = kernel.feature_map.fitted_kernel(torch.cdist(x, x))
    out["K̂ floor (F → ∞)"] = relative_frobenius(fitted, exact)
    return out


def fit_times(dims, powers):
    rows = []
    for dim in dims:
        for power in powers:
            clear_memory_cache()
            start = time.perf_counter()
            density = fit_radial_density(A, power, dim)
            first = time.perf_counter() - start
            start = time.perf_counter()
            fit_radial_density(A, power, dim)
            cached = time.perf_counter() - start
            rows.append({"d": dim, "p": power, "fit_s": first, "cached_s": cached, "max_fit_error": density.max_error,
                         "mass": density.mass})
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 seeds, p = 3 only, small fit grid")
    args = parser.parse_args()
    torch.set_num_threads(2)
    seeds = range(2) if args.quick else range(5)
    powers = (3,) if args.quick else (3, 7, 10)
    num_points = 200 if args.quick else 500
    rows = []
    for centred in (False, True):
        x = digits(centred, num_points)
        d = x.shape[-1]
        for power in powers:
            for multiple in (1, 3, 5):
                per_seed = [errors_for(x, power, 2 * ((multiple * d) // 2), s) for s in seeds]
                for method in per_seed[0]:
                    values = torch.tensor([e[method] for e in per_seed])
                    rows.append({"data": "centred" if centred else "non-negative", "p": power, "F": f"{multiple}d",
                                 "method": method, "mean": float(values.mean()), "std": float(values.std())})
    timing = fit_times((8, 64, 1024) if args.quick else (8, 64, 256, 1024), (3, 20) if args.quick else (3, 7, 10, 20))

    os.makedirs(RESULTS, exist_ok=True)
    tag = "_quick" if args.quick else ""
    write_csv(os.path.join(RESULTS, f"spherical_features{tag}.csv"), rows)
    lines = [
        f"# Spherical random features on digits (a = 2, {len(seeds)} seeds, {num_points} points{', QUICK run' if args.quick else ''})",
        "",
        "Relative Frobenius error ‖K − K̂‖_F/‖K‖_F (paper 000, Eq. 58), mean ± std over seeds. "
        "F = real output width (d = 64). 'SRF Orth. Comp. (paper counting)' uses F complex features (2F real numbers).",
        "",
        "| data | p | method | F = 1d | F = 3d | F = 5d |",
        "|---|---|---|---|---|---|",
    ]
    for data in ("non-negative", "centred"):
        for power in powers:
            for method in dict.fromkeys(r["method"] for r in rows):
                cells = [r for r in rows if r["data"] == data and r["p"] == power and r["method"] == method]
                lines.append(f"| {data} | {power} | {method} | " + " | ".join(
                    f"{c['mean']:.4f} ± {c['std']:.4f}" for c in cells) + " |")
    lines += ["", f"Radial-density fit time ({torch.get_num_threads()} threads; first call with the memory cache cleared, then cached):", "",
              "| d | p | fit (s) | cached (s) | max |K̂ − k| | K̂(0) |", "|---|---|---|---|---|---|"]
    lines += [f"| {t['d']} | {t['p']} | {t['fit_s']:.2f} | {t['cached_s']:.1e} | {t['max_fit_error']:.4f} | {t['mass']:.4f} |"
              for t in timing]
    with open(os.path.join(RESULTS, f"spherical_features{tag}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))

    fig, axes = plt.subplots(2, len(powers), figsize=(4 * len(powers), 6.5), squeeze=False)
    for i, data in enumerate(("non-negative", "centred")):
        for j, power in enumerate(powers):
            ax = axes[i, j]
            for method in dict.fromkeys(r["method"] for r in rows):
                cells = [r for r in rows if r["data"] == data and r["p"] == power and r["method"] == method]
                ax.errorbar([c["F"] for c in cells], [c["mean"] for c in cells], [c["std"] for c in cells],
                            marker="o", capsize=3, label=method)
            ax.set_yscale("log")
            ax.set_title(f"{data}, p = {power}")
            ax.set_xlabel("F")
    axes[0, 0].set_ylabel("rel. Frobenius error")
    axes[1, 0].set_ylabel("rel. Frobenius error")
    axes[0, -1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(RESULTS, f"spherical_features{tag}.png"), dpi=120)


if __name__ == "__main__":
    main()
