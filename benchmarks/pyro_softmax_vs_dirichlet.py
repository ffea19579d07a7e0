"""Softmax-likelihood SVI (rfgp.pyro) vs the Dirichlet closed form on scikit-learn digits.

Both models use the same random Fourier features (RBF kernel, same F and seed):

* **softmax SVI** — ``rfgp.pyro.RandomFeatureGP`` with a ``Categorical`` likelihood (one
  latent GP per class), mean-field Gaussian guide on the F·C weights, MAP lengthscale and
  outputscale, trained by SVI.
* **Dirichlet** — GPyTorch's ``DirichletClassificationLikelihood`` (Milios et al. 2018:
  Gaussian regression on log-Dirichlet-transformed one-hot labels, closed form) + an
  ``ExactGP`` with batch_shape (C,) and ``ScaleKernel(SketchedRBFKernel)``, hyperparameters
  from a few MLL steps; class probabilities by Monte Carlo through the softmax.

Reports accuracy, mean negative log-likelihood (MNLL), expected calibration error (ECE,
15 equal-width bins) and training/prediction time.  Usage::

    python benchmarks/pyro_softmax_vs_dirichlet.py [--quick]
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import gpytorch
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pyro  # noqa: E402
import pyro.distributions as dist  # noqa: E402
import torch  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

from rfgp.features import RandomFourierFeatures  # noqa: E402
from rfgp.kernels import SketchedRBFKernel  # noqa: E402
from rfgp.pyro import Categorical, RandomFeatureGP, fit_svi, posterior_predictive, weight_guide  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
NUM_BINS = 15


# ------------------------------------------------------------------ metrics (private to this script)
def mnll(probabilities: torch.Tensor, labels: torch.Tensor) -> float:
    """Mean negative log predictive probability of the true class."""
    return -probabilities[torch.arange(len(labels)), labels].clamp_min(1e-12).log().mean().item()


def ece(probabilities: torch.Tensor, labels: torch.Tensor, num_bins: int = NUM_BINS) -> float:
    """Expected calibration error: Σ_b (n_b/n)|accuracy_b − confidence_b| over confidence bins."""
    confidence, prediction = probabilities.max(-1)
    correct = (prediction == labels).double()
    bins = (confidence * num_bins).long().clamp_max(num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins).double()
    gap = torch.bincount(bins, weights=correct - confidence.double(), minlength=num_bins).abs()
    return (gap.sum() / counts.sum()).item()


def reliability(probabilities: torch.Tensor, labels: torch.Tensor, num_bins: int = NUM_BINS):
    confidence, prediction = probabilities.max(-1)
    bins = (confidence * num_bins).long().clamp_max(num_bins - 1)
    counts = torch.bincount(bins, minlength=num_bins).double()
    accuracy = torch.bincount(bins, weights=(prediction == labels).double(), minlength=num_bins) / counts.clamp_min(1)
    return accuracy, counts


# ------------------------------------------------------------------ data
def load_data(seed: int):
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float64) / 16.0
    y = torch.tensor(digits.target, dtype=torch.long)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    return x_train, x_test, y_train, y_test


def median_distance(x: torch.Tensor) -> float:
    return torch.cdist(x, x).median().item()


# ------------------------------------------------------------------ models
class Timer:
    """Wall-clock and process CPU seconds of a block (CPU time is robust to a loaded machine)."""

    def __enter__(self):
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc):
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu


def softmax_svi(x_train, y_train, x_test, num_features, num_steps, lengthscale, num_classes, seed):
    pyro.set_rng_seed(seed)
    feature_map = RandomFourierFeatures(num_features, input_dim=x_train.shape[-1], seed=seed).double()
    model = RandomFeatureGP(
        feature_map,
        Categorical(num_classes),
        lengthscale=dist.LogNormal(math.log(lengthscale), 0.5),
        outputscale=dist.LogNormal(math.log(4.0), 1.0),
    )
    guide = weight_guide(model, family="mean_field", hyperparameters="map")
    with Timer() as train:
        fit_svi(model, guide, x_train, y_train, num_steps=num_steps, lr=0.05, num_particles=4, final_lr_fraction=0.1)
    with Timer() as predict, torch.no_grad():
        f = posterior_predictive(model, x_test, guide, num_samples=256, return_sites=("f",))["f"]
        probabilities = model.likelihood.expected_value(f).mean(0)
    return probabilities, train, predict


class DirichletGP(gpytorch.models.ExactGP):
    def __init__(self, x, likelihood, num_features, lengthscale, seed):
        super().__init__(x, likelihood.transformed_targets, likelihood)
        batch = torch.Size((likelihood.num_classes,))
        self.mean_module = gpytorch.means.ConstantMean(batch_shape=batch)
        base = SketchedRBFKernel(num_features, seed=seed, batch_shape=batch)
        base.lengthscale = lengthscale
        self.covar_module = gpytorch.kernels.ScaleKernel(base, batch_shape=batch)

    def forward(self, x):
        return gpytorch.distributions.MultivariateNormal(self.mean_module(x), self.covar_module(x))


def dirichlet(x_train, y_train, x_test, num_features, num_steps, lengthscale, seed):
    torch.manual_seed(seed)
    likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(
        y_train, learn_additional_noise=True, dtype=torch.float64
    )
    model = DirichletGP(x_train, likelihood, num_features, lengthscale, seed).double()
    with Timer() as train:
        model.train()
        likelihood.train()
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
        for _ in range(num_steps):
            optimizer.zero_grad()
            loss = -mll(model(x_train), likelihood.transformed_targets).sum()
            loss.backward()
            optimizer.step()
    model.eval()
    with Timer() as predict, torch.no_grad():
        latent = model(x_test)  # batch (C,) over the test points
        f = latent.rsample(torch.Size((256,)))  # (S, C, n)
        probabilities = torch.softmax(f, dim=-2).mean(0).T
    return probabilities, train, predict


# ------------------------------------------------------------------ main
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small smoke run")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    num_features = 128 if args.quick else 512
    svi_steps = 100 if args.quick else 1000
    mll_steps = 10 if args.quick else 50

    x_train, x_test, y_train, y_test = load_data(args.seed)
    num_classes = int(y_train.max()) + 1
    lengthscale = median_distance(x_train)
    rows = []
    runs = {
        "softmax SVI (rfgp.pyro)": lambda: softmax_svi(
            x_train, y_train, x_test, num_features, svi_steps, lengthscale, num_classes, args.seed
        ),
        "Dirichlet closed form (GPyTorch)": lambda: dirichlet(
            x_train, y_train, x_test, num_features, mll_steps, lengthscale, args.seed
        ),
    }
    probabilities = {}
    for name, run in runs.items():
        probs, train, predict = run()
        probabilities[name] = probs
        rows.append({
            "method": name,
            "accuracy": (probs.argmax(-1) == y_test).double().mean().item(),
            "mnll": mnll(probs, y_test),
            "ece": ece(probs, y_test),
            "train_cpu_s": train.cpu,
            "predict_cpu_s": predict.cpu,
            "train_wall_s": train.wall,
            "predict_wall_s": predict.wall,
        })
        print(rows[-1], flush=True)

    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / ("pyro_softmax_vs_dirichlet" + ("_quick" if args.quick else ""))
    write_csv(stem.with_suffix(".csv"), rows)
    header = (
        f"Digits (n_train={len(y_train)}, n_test={len(y_test)}, d=64, C={num_classes}), RBF random Fourier "
        f"features F={num_features}, seed {args.seed}; softmax: {svi_steps} SVI steps; Dirichlet: {mll_steps} MLL "
        f"steps.  ECE with {NUM_BINS} bins.  Times in seconds, {torch.get_num_threads()} torch thread(s): process CPU "
        "time (robust to other load on the machine) and wall clock."
    )
    lines = [header, "", "| method | accuracy | MNLL | ECE | train CPU (s) | predict CPU (s) | train wall (s) | predict wall (s) |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        lines.append(
            f"| {row['method']} | {row['accuracy']:.4f} | {row['mnll']:.4f} | {row['ece']:.4f} | "
            f"{row['train_cpu_s']:.2f} | {row['predict_cpu_s']:.2f} | {row['train_wall_s']:.2f} | {row['predict_wall_s']:.2f} |"
        )
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))

    figure, axis = plt.subplots(figsize=(5, 4.5))
    centres = (torch.arange(NUM_BINS) + 0.5) / NUM_BINS
    axis.plot([0, 1], [0, 1], "k:", label="perfect calibration")
    for name, probs in probabilities.items():
        accuracy, counts = reliability(probs, y_test)
        keep = counts > 0
        axis.plot(centres[keep], accuracy[keep], "o-", label=name)
    axis.set_xlabel("confidence")
    axis.set_ylabel("accuracy")
    axis.set_title("Reliability on digits (test set)")
    axis.legend()
    figure.tight_layout()
    figure.savefig(stem.with_suffix(".png"), dpi=120)


if __name__ == "__main__":
    main()
