"""Real data as users hand it over: raw (unstandardised) and standardised, exact GP vs rfgp.

Data sets shipped inside installed packages (nothing downloaded): scikit-learn's ``diabetes``
(``scaled=False``: age in years, sex coded 1/2, blood serum in mg/dl), ``linnerud`` (weight from
three exercise counts, 20 rows), statsmodels' ``co2`` (weekly ppm against its date index as decimal
years, NaN weeks dropped), ``sunspots`` (yearly activity against the year), ``elnino`` (monthly sea
temperature against decimal years), ``engel`` (food expenditure against income, heavy-tailed),
``longley`` (employment from six columns of scales 10²–10⁵, 16 rows), ``stackloss`` (integer-coded
plant measurements), ``star98`` (share above the median from 20 school columns, incl. duplicates and
near-constant columns), ``macrodata`` (real consumption from GDP, investment, ... — scales 1–10⁴);
and, for the Dirichlet classifier, ``iris``, ``wine``, ``breast_cancer`` and ``digits`` (integer
pixels, constant columns).

For every regression set a user's model — ``ConstantMean`` + ``ScaleKernel(RBFKernel(ard_num_dims=d))``
(with ``--matern`` also Matérn-5/2) and, for the time series, ``ScaleKernel(RBF) + ScaleKernel(Periodic)`` — is
trained as GPyTorch's exact GP and with its kernel replaced by ``rfgp.sketch(kernel, F)`` (the default method),
``rfgp.sketch(kernel, M, method="nystrom", x_sample=train_x)`` (M = min(F, N): landmarks are distinct training
rows) and, for RBF, ``method="maclaurin"``, from GPyTorch's default initial hyperparameters, by ``rfgp.fit_mll``
(L-BFGS, at most 40 iterations; with ``--adam`` also by a plain Adam loop, GPyTorch's tutorial: lr 0.1, 60 steps,
RBF only), on the raw columns and targets and on standardised ones, in float64 and float32.  One random 75/25
split (seed 0), at most ``--max-train`` training rows.  Test RMSE and NLPD (per point, of the predictive
distribution with noise) are in the *original* units of the target for both raw and standardised runs, so the
rows compare directly.
Exceptions and the text of every warning are recorded (first 160 characters).

Run: ``python benchmarks/raw_data_sweep.py`` (writes benchmarks/results/raw_data_sweep.md, a few
minutes on 2 cores); ``--quick``: diabetes, co2 and iris in float64.
"""

from __future__ import annotations

import argparse
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

RESULTS = pathlib.Path(__file__).resolve().parent / "results"


def _decimal_year(index) -> np.ndarray:
    return np.asarray(index.year + (index.day_of_year - 1) / 365.25, dtype=np.float64)


def _regression_sets() -> dict:
    """name -> (x (n, d) float64 ndarray, y (n,) float64 ndarray, time series?)."""
    import statsmodels.api as sm
    from sklearn import datasets as skd

    out = {}
    diabetes = skd.load_diabetes(scaled=False)
    out["diabetes"] = (diabetes.data, diabetes.target, False)
    linnerud = skd.load_linnerud()
    out["linnerud"] = (linnerud.data, linnerud.target[:, 0], False)
    co2 = sm.datasets.co2.load_pandas().data.dropna()
    out["co2"] = (_decimal_year(co2.index)[:, None], co2["co2"].to_numpy(), True)
    sun = sm.datasets.sunspots.load_pandas().data
    out["sunspots"] = (sun[["YEAR"]].to_numpy(), sun["SUNACTIVITY"].to_numpy(), True)
    nino = sm.datasets.elnino.load_pandas().data
    months = nino.columns[1:]
    t = (nino["YEAR"].to_numpy()[:, None] + np.arange(len(months))[None, :] / 12.0).ravel()
    out["elnino"] = (t[:, None], nino[months].to_numpy().ravel(), True)
    engel = sm.datasets.engel.load_pandas().data
    out["engel"] = (engel[["income"]].to_numpy(), engel["foodexp"].to_numpy(), False)
    longley = sm.datasets.longley.load_pandas()
    out["longley"] = (longley.exog.to_numpy(), longley.endog.to_numpy(), False)
    stack = sm.datasets.stackloss.load_pandas()
    out["stackloss"] = (stack.exog.to_numpy(), stack.endog.to_numpy(), False)
    star = sm.datasets.star98.load_pandas()
    counts = star.endog.to_numpy()
    out["star98"] = (star.exog.to_numpy(), counts[:, 0] / counts.sum(1), False)
    macro = sm.datasets.macrodata.load_pandas().data
    cols = ["realgdp", "realinv", "realgovt", "realdpi", "cpi", "m1", "tbilrate", "unemp", "pop", "infl"]
    out["macrodata"] = (macro[cols].to_numpy(), macro["realcons"].to_numpy(), False)
    return {k: (np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64), ts) for k, (x, y, ts) in out.items()}


def _classification_sets() -> dict:
    from sklearn import datasets as skd

    return {name: getattr(skd, f"load_{name}")(return_X_y=True) for name in ("iris", "wine", "breast_cancer", "digits")}


def _split(n: int, max_train: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    n_test = max(2, n // 4)
    test, train = perm[:n_test], perm[n_test:]
    return train[:max_train], test[: max(n_test, 1)][:max_train]


class UserGP(gpytorch.models.ExactGP):
    def __init__(self, x, y, likelihood, kernel):
        super().__init__(x, y, likelihood)
        self.mean_module = gpytorch.means.ConstantMean()
        self.covar_module = kernel

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def _kernel(name: str, d: int):
    k = gpytorch.kernels
    if name == "rbf":
        return k.ScaleKernel(k.RBFKernel(ard_num_dims=d))
    if name == "matern52":
        return k.ScaleKernel(k.MaternKernel(nu=2.5, ard_num_dims=d))
    if name == "rbf+periodic":
        return k.ScaleKernel(k.RBFKernel()) + k.ScaleKernel(k.PeriodicKernel())
    raise ValueError(name)


def _adam(model, steps: int = 60, lr: float = 0.1) -> float:
    model.train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        loss = -mll(model(*model.train_inputs), model.train_targets)
        loss.backward()
        opt.step()
    return loss.item()


def _train(model, trainer: str) -> float:
    if trainer == "adam":
        return _adam(model)
    history = rfgp.fit_mll(model, num_iterations=40, progress=False)
    return history.losses[-1]


def _evaluate(model, x, y, y_scale: float) -> tuple[float, float]:
    """Test RMSE and NLPD per point in the target's original units (y_scale: std used to standardise)."""
    model.eval()
    with torch.no_grad():
        pred = model.likelihood(model(x))
        mean, var = pred.mean, pred.variance
        rmse = (mean - y).pow(2).mean().sqrt().item() * y_scale
        nlpd = (0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - mean).pow(2) / var).mean().item() + math.log(y_scale)
    return rmse, nlpd


def _warning_texts(caught) -> str:
    """The distinct warnings recorded, as "Category: message" joined by " / "."""
    return " / ".join(dict.fromkeys(f"{w.category.__name__}: {_short(w.message)}" for w in caught))


def _short(text: str, n: int = 160) -> str:
    text = " ".join(str(text).split()).replace("|", "/")
    return text if len(text) <= n else text[: n - 1] + "…"


def _run(make_model, trainer, x_test, y_test, y_scale) -> dict:
    start = time.perf_counter()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            model = make_model()
            loss = _train(model, trainer)
            rmse, nlpd = _evaluate(model, x_test, y_test, y_scale)
            error = ""
        except Exception as exc:  # recorded in the table: finding these is the point of the sweep
            loss = rmse = nlpd = float("nan")
            error = f"{type(exc).__name__}: {_short(exc)}"
    return {"loss": loss, "rmse": rmse, "nlpd": nlpd, "time": time.perf_counter() - start, "error": error,
            "warnings": _warning_texts(caught)}


def regression_sweep(args) -> list[dict]:
    rows = []
    for name, (x_np, y_np, is_series) in _regression_sets().items():
        if args.datasets and name not in args.datasets:
            continue
        train, test = _split(len(y_np), args.max_train)
        kernels = ["rbf"] + (["matern52"] if args.matern else []) + (["rbf+periodic"] if is_series else [])
        for dtype in args.dtypes:
            for scaling in ("raw", "standardised"):
                x, y = torch.tensor(x_np, dtype=dtype), torch.tensor(y_np, dtype=dtype)
                x_tr, y_tr, x_te, y_te = x[train], y[train], x[test], y[test]
                y_scale = 1.0
                if scaling == "standardised":
                    mu, sd = x_tr.mean(0), x_tr.std(0).clamp_min(1e-12)
                    x_tr, x_te = (x_tr - mu) / sd, (x_te - mu) / sd
                    y_mu, y_scale = y_tr.mean(), y_tr.std().item()
                    y_tr, y_te = (y_tr - y_mu) / y_scale, (y_te - y_mu) / y_scale
                for kname in kernels:
                    methods = ["exact", "default", "nystrom"] + (["maclaurin"] if kname == "rbf" else [])
                    for trainer in args.trainers:
                        if trainer == "adam" and kname != "rbf":
                            continue
                        for method in methods:
                            def make_model(kname=kname, method=method):
                                torch.manual_seed(0)
                                kernel = _kernel(kname, x_tr.shape[-1])
                                if method == "nystrom":  # landmarks are distinct training rows: M ≤ N
                                    kernel = rfgp.sketch(kernel, min(args.num_features, len(train)), method="nystrom",
                                                         x_sample=x_tr, seed=0)
                                elif method == "maclaurin":
                                    kernel = rfgp.sketch(kernel, args.num_features, method="maclaurin", x_sample=x_tr,
                                                         seed=0)
                                elif method == "default":
                                    kernel = rfgp.sketch(kernel, args.num_features, seed=0)
                                return UserGP(x_tr, y_tr, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(dtype)

                            result = _run(make_model, trainer, x_te, y_te, y_scale)
                            row = {"dataset": name, "n_train": len(train), "d": x_np.shape[1], "kernel": kname,
                                   "method": method, "dtype": str(dtype).replace("torch.", ""), "data": scaling,
                                   "trainer": trainer, **result}
                            rows.append(row)
                            print(_format_row(row), flush=True)
    return rows


def classification_sweep(args) -> list[dict]:
    from rfgp.models import DirichletGPClassifier

    rows = []
    for name, (x_np, y_np) in _classification_sets().items():
        if args.datasets and name not in args.datasets:
            continue
        train, test = _split(len(y_np), args.max_train)
        for dtype in args.dtypes:
            for standardize in (False, True):
                start = time.perf_counter()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    try:
                        clf = DirichletGPClassifier(num_features=args.num_features, num_iterations=50,
                                                    standardize=standardize, dtype=dtype, progress=False)
                        clf.fit(x_np[train], y_np[train])
                        proba = np.asarray(clf.predict_proba(x_np[test]))
                        err = float((proba.argmax(1) != y_np[test]).mean())
                        mnll = float(-np.log(np.clip(proba[np.arange(len(test)), y_np[test]], 1e-300, None)).mean())
                        error = ""
                    except Exception as exc:
                        err = mnll = float("nan")
                        error = f"{type(exc).__name__}: {_short(exc)}"
                row = {"dataset": name, "n_train": len(train), "d": x_np.shape[1], "dtype": str(dtype)[6:],
                       "standardize": standardize, "error_rate": err, "mnll": mnll,
                       "time": time.perf_counter() - start, "error": error, "warnings": _warning_texts(caught)}
                rows.append(row)
                print(row, flush=True)
    return rows


def _format_row(r: dict) -> str:
    return (f"| {r['dataset']} | {r['n_train']} | {r['d']} | {r['kernel']} | {r['method']} | {r['dtype']} | "
            f"{r['data']} | {r['trainer']} | {r['loss']:.4g} | {r['rmse']:.4g} | {r['nlpd']:.4g} | {r['time']:.1f} | "
            f"{r['error']} | {r['warnings']} |")


def write_table(reg: list[dict], cls: list[dict], args, loads) -> None:
    lines = ["# Raw vs standardised real data: exact GP vs rfgp", "",
             f"`python benchmarks/raw_data_sweep.py {' '.join(sys.argv[1:])}`; F = {args.num_features}, at most "
             f"{args.max_train} training rows, torch {torch.__version__}, gpytorch {gpytorch.__version__}, "
             f"{torch.get_num_threads()} threads, load average (1 min) {loads[0]:.2f} at start, {loads[1]:.2f} at end.",
             "RMSE and NLPD (per test point, predictive distribution with noise) in the target's original units; "
             "loss: final training loss (−MLL per point) in the units the model saw.", "",
             "| data set | N | d | kernel | method | dtype | data | trainer | train loss | test RMSE | test NLPD | "
             "time (s) | error | warnings |", "|" + "---|" * 14]
    lines += [_format_row(r) for r in reg]
    if cls:
        lines += ["", "## Dirichlet classifier (`DirichletGPClassifier`, F as above, 50 Adam steps)", "",
                  "| data set | N | d | dtype | standardize | test error | test MNLL | time (s) | error | warnings |",
                  "|" + "---|" * 10]
        lines += [f"| {r['dataset']} | {r['n_train']} | {r['d']} | {r['dtype']} | {r['standardize']} | "
                  f"{r['error_rate']:.3f} | {r['mnll']:.3f} | {r['time']:.1f} | {r['error']} | {r['warnings']} |"
                  for r in cls]
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"raw_data_sweep{'_quick' if args.quick else ''}.md").write_text("\n".join(lines) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="diabetes and co2, float64, L-BFGS only")
    parser.add_argument("--datasets", nargs="*", default=None)
    parser.add_argument("--num-features", type=int, default=256)
    parser.add_argument("--max-train", type=int, default=150)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-classification", action="store_true")
    parser.add_argument("--matern", action="store_true", help="also ScaleKernel(MaternKernel(nu=2.5, ard_num_dims=d))")
    parser.add_argument("--adam", action="store_true", help="also train the RBF models by a plain Adam loop")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    args.dtypes = [torch.float64] if args.quick else [torch.float64, torch.float32]
    args.trainers = ["lbfgs", "adam"] if args.adam else ["lbfgs"]
    if args.quick and not args.datasets:
        args.datasets = ["diabetes", "co2", "iris"]
    load_start = os.getloadavg()[0]
    reg = regression_sweep(args)
    cls = [] if args.no_classification else classification_sweep(args)
    write_table(reg, cls, args, (load_start, os.getloadavg()[0]))


if __name__ == "__main__":
    main()
