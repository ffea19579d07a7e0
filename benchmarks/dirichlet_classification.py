"""Dirichlet GP classification: rfgp (RFF/SORF/Maclaurin/polynomial sketch) vs GPyTorch exact Dirichlet GP vs softmax SVGP vs scikit-learn.

Part 1 — scikit-learn datasets (digits, breast_cancer, wine), one seeded 70/30 split, standardised
inputs: test error, MNLL, ECE (10 bins), train and predict time of

* rfgp ``DirichletGPClassifier`` with RFF and SORF features (F features, Adam on the exact MLL),
  and with two non-Fourier kernels passed as ``kernel=``: the RBF kernel through the optimised
  Maclaurin sketch (``SketchedRBFKernel(method="maclaurin")``) and the polynomial kernel
  (xᵀy/ℓ² + c)³ through a TensorSRHT polynomial sketch (``SketchedPolynomialKernel``); both start
  from the same median-heuristic lengthscale and target-variance output scale as the default,
* GPyTorch's exact Dirichlet GP (its ``DirichletClassificationLikelihood``, per-class RBF kernels,
  same optimiser and iterations; Cholesky forced),
* a GPyTorch softmax-likelihood variational GP (SVGP, 100 inducing points, ELBO),
* scikit-learn ``GaussianProcessClassifier`` (Laplace, one-vs-rest; on digits with fixed
  median-heuristic hyperparameters because optimising 10 binary Laplace GPs takes too long).

Class probabilities of both Dirichlet GPs: 1000 seeded Monte-Carlo samples through the softmax.

Part 2 — scale row (rfgp only, float32, 2 threads, each case in a fresh subprocess for its peak
RSS): N synthetic points in 10 dimensions, C classes, F = 1024; closed-form fit with fixed
hyperparameters (features + structured per-class capacitance Cholesky + posterior caches), one
MLL + gradient evaluation, peak memory, and the C = 10 / C = 2 cost ratio.

    python benchmarks/dirichlet_classification.py [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SEED = 0


def _load(name):
    from sklearn import datasets
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = getattr(datasets, f"load_{name}")(return_X_y=True)
    x_tr, x_te, y_tr, y_te = train_test_split(x, y, test_size=0.3, random_state=SEED, stratify=y)
    scaler = StandardScaler().fit(x_tr)
    return scaler.transform(x_tr), scaler.transform(x_te), y_tr, y_te


def _scores(probs, y_te):
    from rfgp import metrics

    p, y = torch.as_tensor(np.asarray(probs), dtype=torch.float64), torch.as_tensor(y_te)
    p = p / p.sum(-1, keepdim=True)
    return {
        "error": metrics.classification_error(p, y).item(),
        "mnll": metrics.mean_negative_log_likelihood(p, y).item(),
        "ece": metrics.expected_calibration_error(p, y).item(),
    }


def run_rfgp(data, method, num_features, iterations):
    from rfgp.models import DirichletGPClassifier

    x_tr, x_te, y_tr, y_te = data
    t0 = time.perf_counter()
    clf = DirichletGPClassifier(num_features=num_features, method=method, num_iterations=iterations, optimizer="adam",
                                standardize=False, seed=SEED, progress=False).fit(x_tr, y_tr)
    t1 = time.perf_counter()
    probs = clf.predict_proba(x_te)
    return probs, t1 - t0, time.perf_counter() - t1


def run_rfgp_kernel(data, base_kernel, iterations):
    """rfgp ``DirichletGPClassifier`` with a given feature kernel, initialised like the default one."""
    import gpytorch

    from rfgp.likelihoods.dirichlet import dirichlet_transform
    from rfgp.models import DirichletGPClassifier
    from rfgp.models.estimator import _median_distance

    x_tr, x_te, y_tr, y_te = data
    t0 = time.perf_counter()
    x = torch.as_tensor(x_tr, dtype=torch.float32)
    _, targets = dirichlet_transform(torch.as_tensor(y_tr).long(), int(y_tr.max()) + 1, 0.01)
    kernel = gpytorch.kernels.ScaleKernel(base_kernel)
    with torch.no_grad():
        base_kernel.lengthscale = _median_distance(x, SEED)
        kernel.outputscale = (targets - targets.mean(-1, keepdim=True)).var().clamp_min(1e-3)
    clf = DirichletGPClassifier(kernel=kernel, num_iterations=iterations, optimizer="adam",
                                standardize=False, seed=SEED, progress=False).fit(x_tr, y_tr)
    t1 = time.perf_counter()
    probs = clf.predict_proba(x_te)
    return probs, t1 - t0, time.perf_counter() - t1


def run_gpytorch_exact(data, iterations):
    import gpytorch

    from rfgp.likelihoods import softmax_expectation_mc
    from rfgp.models.estimator import _median_distance

    x_tr, x_te, y_tr, y_te = (torch.as_tensor(a) for a in data)
    x_tr, x_te = x_tr.float(), x_te.float()
    t0 = time.perf_counter()
    likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(y_tr.long(), learn_additional_noise=False)
    num_classes = likelihood.num_classes
    batch = torch.Size([num_classes])

    class Model(gpytorch.models.ExactGP):
        def __init__(self):
            super().__init__(x_tr, likelihood.transformed_targets, likelihood)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model = Model()
    targets = likelihood.transformed_targets
    with torch.no_grad():
        model.covar_module.base_kernel.lengthscale = _median_distance(x_tr, SEED)
        model.covar_module.outputscale = (targets - targets.mean(-1, keepdim=True)).var()
        model.mean_module.constant.copy_(targets.mean(-1))
    with gpytorch.settings.max_cholesky_size(10**5):
        model.train()
        optimizer = torch.optim.Adam(model.parameters(), lr=0.05)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        for _ in range(iterations):
            optimizer.zero_grad()
            (-mll(model(x_tr), targets).sum()).backward()
            optimizer.step()
        model.eval()
        t1 = time.perf_counter()
        with torch.no_grad():
            post = model(x_te)
            probs = softmax_expectation_mc(post.mean.mT, post.variance.mT, 1000, torch.Generator().manual_seed(SEED))[0]
    return probs, t1 - t0, time.perf_counter() - t1


def run_svgp(data, iterations, num_inducing=100):
    import gpytorch

    x_tr, x_te, y_tr, y_te = (torch.as_tensor(a) for a in data)
    x_tr, x_te, y_tr = x_tr.float(), x_te.float(), y_tr.long()
    num_classes = int(y_tr.max()) + 1
    batch = torch.Size([num_classes])
    gen = torch.Generator().manual_seed(SEED)
    t0 = time.perf_counter()
    inducing = x_tr[torch.randperm(len(x_tr), generator=gen)[:num_inducing]].expand(num_classes, -1, -1).clone()

    class SVGP(gpytorch.models.ApproximateGP):
        def __init__(self):
            dist = gpytorch.variational.CholeskyVariationalDistribution(inducing.shape[-2], batch_shape=batch)
            strategy = gpytorch.variational.IndependentMultitaskVariationalStrategy(
                gpytorch.variational.VariationalStrategy(self, inducing, dist, learn_inducing_locations=True),
                num_tasks=num_classes,
            )
            super().__init__(strategy)
            self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
            self.covar_module = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(batch_shape=batch), batch_shape=batch)

        def forward(self, x):
            return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))

    model = SVGP()
    likelihood = gpytorch.likelihoods.SoftmaxLikelihood(num_classes=num_classes, mixing_weights=False)
    mll = gpytorch.mlls.VariationalELBO(likelihood, model, num_data=len(y_tr))
    optimizer = torch.optim.Adam(list(model.parameters()) + list(likelihood.parameters()), lr=0.05)
    model.train()
    for _ in range(iterations):
        optimizer.zero_grad()
        (-mll(model(x_tr), y_tr)).backward()
        optimizer.step()
    model.eval()
    t1 = time.perf_counter()
    with torch.no_grad(), gpytorch.settings.num_likelihood_samples(1000):
        probs = likelihood(model(x_te)).probs.mean(0)
    return probs, t1 - t0, time.perf_counter() - t1


def run_sklearn(data, optimize):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    from rfgp.models.estimator import _median_distance

    x_tr, x_te, y_tr, y_te = data
    lengthscale = float(_median_distance(torch.as_tensor(x_tr), SEED))
    t0 = time.perf_counter()
    clf = GaussianProcessClassifier(ConstantKernel(1.0) * RBF(lengthscale), optimizer="fmin_l_bfgs_b" if optimize else None,
                                    random_state=SEED).fit(x_tr, y_tr)
    t1 = time.perf_counter()
    probs = clf.predict_proba(x_te)
    return probs, t1 - t0, time.perf_counter() - t1


# ----- scale row ---------------------------------------------------------------------------
def scale_worker(num_data, num_classes, num_features, repeats):
    """One scale case in this (fresh) process: prints a JSON line with median wall/CPU times and peak RSS."""
    import resource

    import gpytorch

    from rfgp.kernels import SketchedRBFKernel
    from rfgp.likelihoods import DirichletClassificationLikelihood
    from rfgp.models import ExactGPModel

    torch.set_num_threads(2)
    gen = torch.Generator().manual_seed(SEED)
    x = torch.randn(num_data, 10, generator=gen)
    labels = torch.randint(num_classes, (num_data,), generator=gen)
    x_test = torch.randn(1000, 10, generator=gen)

    def build():
        likelihood = DirichletClassificationLikelihood(labels, num_classes=num_classes)
        kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, method="sorf", input_dim=10, seed=SEED))
        mean = gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))
        return ExactGPModel(x, likelihood.transformed_targets, likelihood, kernel, mean)

    def fit():
        model = build()
        model.eval()
        with torch.no_grad():
            model(x_test[:1])  # builds the posterior caches: features, structured Grams, C Choleskys

    def mll_grad():
        model = build()
        model.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(model.likelihood, model)
        (-mll(model(x), model.train_targets).sum()).backward()

    result = {}
    for name, step in (("fit", fit), ("mll_grad", mll_grad)):
        walls, cpus = [], []
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            step()
            walls.append(time.perf_counter() - wall)
            cpus.append(time.process_time() - cpu)
        result[f"{name}_s"], result[f"{name}_cpu_s"] = float(np.median(walls)), float(np.median(cpus))
    result["peak_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def run_scale(num_data, num_features, repeats=3):
    rows = {}
    for num_classes in (10, 2):
        cmd = [sys.executable, __file__, "--scale-worker", str(num_data), str(num_classes), str(num_features),
               str(repeats)]
        env = dict(os.environ, OMP_NUM_THREADS="2", MKL_NUM_THREADS="2")
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
        rows[num_classes] = json.loads(out.strip().splitlines()[-1])
        print(f"  scale C={num_classes}: {rows[num_classes]}", flush=True)
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--scale-worker", nargs=4, type=int, help=argparse.SUPPRESS)
    parser.add_argument("--scale-n", type=int, default=None, help="N of the scale row")
    parser.add_argument("--scale-only", action="store_true", help="run only the scale row")
    parser.add_argument("--scale-repeats", type=int, default=3, help="timed repeats per scale case (median reported)")
    parser.add_argument("--rfgp-only", action="store_true",
                        help="re-run only the rfgp rows of the dataset table (other methods' rows are kept from the "
                             "existing CSV) and skip the scale row")
    args = parser.parse_args()
    if args.scale_worker:
        scale_worker(*args.scale_worker)
        return
    scale_n = args.scale_n or (10_000 if args.quick else 100_000)
    if args.scale_only:
        scale = run_scale(scale_n, 1024, args.scale_repeats)
        stem = RESULTS / f"dirichlet_classification_scale{'_quick' if args.quick else ''}"
        RESULTS.mkdir(exist_ok=True)
        Path(f"{stem}.md").write_text("\n".join(_scale_lines(scale, scale_n)) + "\n")
        print(Path(f"{stem}.md").read_text())
        return
    from rfgp.kernels import SketchedPolynomialKernel, SketchedRBFKernel

    torch.manual_seed(SEED)
    datasets = ["wine"] if args.quick else ["digits", "breast_cancer", "wine"]
    num_features = 256 if args.quick else 512
    iterations = 10 if args.quick else 30
    stem = RESULTS / ("dirichlet_classification_quick" if args.quick else "dirichlet_classification")
    kept = []
    if args.rfgp_only:
        with open(f"{stem}.csv", newline="") as f:
            kept = [r for r in csv.DictReader(f) if not r["method"].startswith("rfgp")]
        for r in kept:
            r.update({k: float(r[k]) for k in ("error", "mnll", "ece", "train_s", "predict_s")})
    records = []
    for name in datasets:
        data = _load(name)
        runs = {
            "rfgp Dirichlet GP, RFF": lambda: run_rfgp(data, "rff", num_features, iterations),
            "rfgp Dirichlet GP, SORF": lambda: run_rfgp(data, "sorf", num_features, iterations),
            "rfgp Dirichlet GP, Maclaurin RBF": lambda: run_rfgp_kernel(
                data, SketchedRBFKernel(num_features, method="maclaurin", input_dim=data[0].shape[1], seed=SEED),
                iterations),
            "rfgp Dirichlet GP, poly. sketch p=3": lambda: run_rfgp_kernel(
                data, SketchedPolynomialKernel(3, num_features, lengthscale=True, input_dim=data[0].shape[1],
                                               seed=SEED),
                iterations),
            "GPyTorch exact Dirichlet GP": lambda: run_gpytorch_exact(data, iterations),
            "GPyTorch softmax SVGP (100 ind.)": lambda: run_svgp(data, 3 * iterations),
            "sklearn GPC (Laplace, OvR)": lambda: run_sklearn(data, optimize=name != "digits"),
        }
        for method, run in runs.items():
            if args.rfgp_only and not method.startswith("rfgp"):
                records.append(next(r for r in kept if r["dataset"] == name and r["method"] == method))
                continue
            probs, train_s, predict_s = run()
            row = {"dataset": name, "method": method, "n_train": len(data[0]), **_scores(probs, data[3]),
                   "train_s": train_s, "predict_s": predict_s}
            records.append(row)
            print(f"{name:14s} {method:34s} err={row['error']:.3f} mnll={row['mnll']:.3f} ece={row['ece']:.3f} "
                  f"train={train_s:.1f}s predict={predict_s:.2f}s", flush=True)
    scale = None if args.rfgp_only else run_scale(scale_n, 1024, args.scale_repeats)
    _write(records, scale, scale_n, num_features, iterations, args.quick, args.rfgp_only)


def _write(records, scale, scale_n, num_features, iterations, quick, rfgp_only=False):
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / ("dirichlet_classification_quick" if quick else "dirichlet_classification")
    write_csv(f"{stem}.csv", records)
    load = os.getloadavg()[0]
    lines = [
        f"# Dirichlet GP classification ({'quick run' if quick else 'full run'}, seed {SEED}, one 70/30 split)",
        "",
        f"rfgp: F = {num_features}, {iterations} Adam steps on the exact MLL (lr 0.05), float32, MC probabilities "
        f"(1000 samples). GPyTorch exact: same steps; SVGP: {3 * iterations} ELBO steps. sklearn on digits: fixed "
        f"median-heuristic kernel (no optimiser). Host: 2 CPU cores shared with other jobs (load average ≈ {load:.0f} "
        "at the end of the run), so absolute times are inflated and noisy; compare within a row group."
        + (" Only the rfgp rows were re-run (`--rfgp-only`); the other methods' rows, including their times, "
           "come from the previous full run." if rfgp_only else ""),
        "",
        "| dataset | method | test error | MNLL | ECE | train s | predict s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in records:
        lines.append(f"| {r['dataset']} | {r['method']} | {r['error']:.3f} | {r['mnll']:.3f} | {r['ece']:.3f} | "
                     f"{r['train_s']:.2f} | {r['predict_s']:.2f} |")
    if scale is None:
        lines += ["", "Scale row: see `dirichlet_classification_scale.md` (`--scale-only`)."]
    else:
        lines += _scale_lines(scale, scale_n)
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    _plot(records, f"{stem}.png")
    print("\n".join(lines))


def _scale_lines(scale, scale_n):
    c10, c2 = scale[10], scale[2]

    def row(c, r):
        return (f"| {c} | {r['fit_s']:.2f} ({r['fit_cpu_s']:.2f}) | {r['mll_grad_s']:.2f} ({r['mll_grad_cpu_s']:.2f}) "
                f"| {r['peak_mb']:.0f} |")

    return [
        "",
        f"## Scale row: N = {scale_n:,} synthetic points (d = 10), F = 1024 SORF features, float32, 2 threads",
        "",
        f"Host load average ≈ {os.getloadavg()[0]:.1f} on 2 cores when the row finished (shared with other jobs: "
        "wall times are inflated when it exceeds ≈ 1; CPU times in brackets are less sensitive). Median of the "
        "repeats; each C in a fresh process (peak RSS).",
        "",
        "| classes C | closed-form fit s, wall (CPU) (target < 10) | MLL + gradient s, wall (CPU) (target < 15) "
        "| peak RSS MB (target < 4096) |",
        "|---|---|---|---|",
        row(10, c10),
        row(2, c2),
        "",
        f"Cost ratio C = 10 / C = 2 (target < 1.5): fit {c10['fit_s'] / c2['fit_s']:.2f} wall, "
        f"{c10['fit_cpu_s'] / c2['fit_cpu_s']:.2f} CPU; MLL + gradient {c10['mll_grad_s'] / c2['mll_grad_s']:.2f} wall, "
        f"{c10['mll_grad_cpu_s'] / c2['mll_grad_cpu_s']:.2f} CPU.",
    ]


def _plot(records, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    datasets = list(dict.fromkeys(r["dataset"] for r in records))
    methods = list(dict.fromkeys(r["method"] for r in records))
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    width = 0.8 / len(methods)
    for ax, key, label in zip(axes, ("error", "mnll", "train_s"), ("test error", "MNLL", "train time (s)")):
        for j, method in enumerate(methods):
            values = [next(r[key] for r in records if r["dataset"] == d and r["method"] == method) for d in datasets]
            ax.bar(np.arange(len(datasets)) + j * width, values, width, label=method)
        ax.set_xticks(np.arange(len(datasets)) + 0.4 - width / 2, datasets)
        ax.set_title(label)
        if key == "train_s":
            ax.set_yscale("log")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
