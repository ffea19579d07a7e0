"""Which sketch should ``method="maclaurin"`` use by default?  Gram error of every projection × weights.

Optimized Maclaurin features (paper 000 Algorithms 2–4) of the Gaussian kernel
(``SketchedRBFKernel(F, method="maclaurin", projection=..., weights=...)``) and of the polynomial
kernel (xᵀy/ℓ² + 1)³ (``SketchedPolynomialKernel(3, F, method="maclaurin", ...)``) for projection
∈ {Rademacher, Gaussian, TensorSRHT} × weights ∈ {real, CtR}, at equal real width F, against
rfgp's RFF map (``method="rff"``) and scikit-learn's ``RBFSampler`` (Gaussian kernel only).  Data: scikit-learn's bundled digits
(d = 64), breast_cancer (d = 30) and diabetes (d = 10), standardised, the first 1 000 rows, F = 512;
lengthscale: the median pairwise distance (Gaussian; also half of it, where ‖x‖²/ℓ² is 4× larger
and the Maclaurin series needs higher degrees) or √d (polynomial, so that xᵀy/ℓ² = O(1)).

Per cell: mean ± standard error over the seeds of the relative Frobenius error ‖K̂ − K‖_F/‖K‖_F
(paper 000 Eq. 58) and the mean seconds to build the map (allocation, draws) and compute the
features (float64, 1 thread).

    python benchmarks/maclaurin_defaults.py [--quick]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rfgp.kernels import SketchedPolynomialKernel, SketchedRBFKernel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
PROJECTIONS = ("rademacher", "gaussian", "srht")
WEIGHTS = ("real", "ctr")


def load(name: str, rows: int) -> torch.Tensor:
    from sklearn import datasets

    x = torch.tensor(getattr(datasets, f"load_{name}")().data[:rows], dtype=torch.float64)
    std = x.std(0)
    return (x - x.mean(0)) / torch.where(std > 0, std, torch.ones_like(std))


def exact_and_builders(kernel: str, x: torch.Tensor, factor: float = 1.0):
    d = x.shape[-1]
    if kernel == "gaussian":
        lengthscale = torch.pdist(x).median() * factor
        exact = torch.exp(-0.5 * torch.cdist(x, x).pow(2) / lengthscale**2)

        def build(F, seed, **options):
            return SketchedRBFKernel(F, input_dim=d, seed=seed, **options), lengthscale
    else:
        lengthscale = torch.tensor(float(d) ** 0.5)
        exact = (x @ x.T / lengthscale**2 + 1.0).pow(3)

        def build(F, seed, **options):
            kernel = SketchedPolynomialKernel(3, F, input_dim=d, seed=seed, lengthscale=True, **options)
            kernel.offset = 1.0
            return kernel, lengthscale
    return exact, build


def sklearn_gram_error(exact, x, F, seed, lengthscale) -> tuple[float, float]:
    """scikit-learn's RBFSampler (Rahimi & Recht: √(2/F) cos(wᵀx + b)) at the same F, as a reference."""
    from sklearn.kernel_approximation import RBFSampler

    start = time.perf_counter()
    sampler = RBFSampler(gamma=0.5 / float(lengthscale) ** 2, n_components=F, random_state=seed)
    z = torch.as_tensor(sampler.fit_transform(x.numpy()))
    seconds = time.perf_counter() - start
    return float((z @ z.T - exact).norm() / exact.norm()), seconds


def gram_error(build, exact, x, F, seed, options) -> tuple[float, float]:
    start = time.perf_counter()
    kernel, lengthscale = build(F, seed, **options)
    kernel.lengthscale = lengthscale
    with torch.no_grad():
        approx = kernel(x).to_dense()
    seconds = time.perf_counter() - start
    return float((approx - exact).norm() / exact.norm()), seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = range(2 if args.quick else 4)
    widths = (256,) if args.quick else (512,)
    rows = 300 if args.quick else 1000
    lines = ["# Optimized Maclaurin defaults: Gram relative Frobenius error (mean ± s.e.) and seconds", "",
             f"{len(seeds)} seeds, {rows} standardised rows per dataset, float64, 1 thread; produced by "
             f"`benchmarks/maclaurin_defaults.py{' --quick' if args.quick else ''}`.", "",
             "| kernel | data | F | method | projection | weights | Gram rel. error | s |", "|---|---|---|---|---|---|---|---|"]
    settings = [("gaussian", 1.0), ("gaussian", 0.5), ("polynomial", 1.0)]
    for kernel, factor in settings:
        for name in ("digits", "breast_cancer", "diabetes"):
            x = load(name, rows)
            exact, build = exact_and_builders(kernel, x, factor)
            for F in widths:
                cells = [("maclaurin", p, w) for p in PROJECTIONS for w in WEIGHTS]
                if kernel == "gaussian":
                    cells += [("rff", "–", "–"), ("sklearn RBFSampler", "–", "–")]
                for method, projection, weights in cells:
                    options = {"method": method}
                    if method == "maclaurin":
                        options.update(projection=projection, weights=weights)
                    if method == "sklearn RBFSampler":
                        results = [sklearn_gram_error(exact, x, F, seed, build(F, 0)[1]) for seed in seeds]
                    else:
                        results = [gram_error(build, exact, x, F, seed, options) for seed in seeds]
                    errors = [e for e, _ in results]
                    se = statistics.stdev(errors) / len(errors) ** 0.5
                    seconds = statistics.mean(s for _, s in results)
                    label = kernel if factor == 1.0 else f"{kernel}, ℓ × {factor:g}"
                    line = (f"| {label} | {name} | {F} | {method} | {projection} | {weights} | "
                            f"{statistics.mean(errors):.4f} ± {se:.4f} | {seconds:.3f} |")
                    lines.append(line)
                    print(line, flush=True)
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"maclaurin_defaults{'_quick' if args.quick else ''}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
