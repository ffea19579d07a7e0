"""How often DirichletGPClassifier's fit ends in a useless optimum, with and without the learned extra noise.

Seeded synthetic problems with overlapping classes: N ∈ [100, 1000] training points, C ∈ [2, 5] classes,
d ∈ [2, 10] inputs, class centres ~ N(0, I_d), points = centre + N(0, I_d), 1 000 test points.  The generating
model's own class posterior gives the Bayes test NLL, the training labels' frequencies the class-prior NLL.

A fit is **bad** when its test NLL exceeds the class-prior classifier's (it predicts worse than ignoring X);
**poor** when it recovers less than half of the prior → Bayes gap (NLL > Bayes + (prior − Bayes)/2).

Each configuration is fitted on the same problem in the same process (paired), one thread, float32 and float64:
``learn_additional_noise=False`` (the former default), ``True``, and ``None`` (the default: without the extra noise,
refitted with it when the leave-one-out NLL is no better than the class prior's).  ``--exact SEEDS`` also trains
GPyTorch's exact Dirichlet GP (gpytorch.likelihoods.DirichletClassificationLikelihood, ScaleKernel(RBFKernel), same
initialisation) by rfgp.fit_mll's L-BFGS and by 50 Adam steps at lr 0.1 (GPyTorch's tutorial) on those seeds.

    python benchmarks/classifier_degenerate_optimum.py [--seeds 60] [--exact 5 17]
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
CONFIGS = {"no_extra_noise": {"learn_additional_noise": False}, "extra_noise": {"learn_additional_noise": True},
           "default": {}}


def problem(seed: int, num_test: int = 1000):
    rng = np.random.default_rng(seed)
    n, c, d = int(rng.integers(100, 1001)), int(rng.integers(2, 6)), int(rng.integers(2, 11))
    centres = rng.standard_normal((c, d))
    y = rng.integers(0, c, n + num_test)
    x = centres[y] + rng.standard_normal((n + num_test, d))
    log_density = -0.5 * ((x[n:, None, :] - centres[None]) ** 2).sum(-1)
    bayes = np.exp(log_density - log_density.max(1, keepdims=True))
    return x[:n], y[:n], x[n:], y[n:], bayes / bayes.sum(1, keepdims=True)


def nll(probs: np.ndarray, labels: np.ndarray) -> float:
    return float(-np.log(np.clip(probs[np.arange(len(labels)), labels], 1e-300, None)).mean())


def exact_fits(seed: int) -> list[dict]:
    """GPyTorch's exact Dirichlet GP on ``seed``'s problem (float64), by L-BFGS (fit_mll) and Adam."""
    import gpytorch

    import rfgp
    from rfgp.models import ExactGPModel
    from rfgp.models.estimator import _median_distance

    train_x, train_y, test_x, test_y, _ = problem(seed)
    mean, scale = train_x.mean(0), train_x.std(0, ddof=1)
    x, xt = (torch.as_tensor((a - mean) / scale) for a in (train_x, test_x))
    labels, num_classes = torch.as_tensor(train_y), int(train_y.max()) + 1
    rows = []
    for optimizer in ("lbfgs", "adam"):
        likelihood = gpytorch.likelihoods.DirichletClassificationLikelihood(labels, dtype=torch.float64)
        targets = likelihood.transformed_targets
        kernel = gpytorch.kernels.ScaleKernel(gpytorch.kernels.RBFKernel())
        model = ExactGPModel(x, targets, likelihood, kernel,
                             gpytorch.means.ConstantMean(batch_shape=torch.Size([num_classes]))).double()
        with torch.no_grad():
            kernel.base_kernel.lengthscale = _median_distance(x, seed)
            kernel.outputscale = (targets - targets.mean(-1, keepdim=True)).var()
            model.mean_module.constant.copy_(targets.mean(-1))
        start = time.process_time()
        with gpytorch.settings.max_cholesky_size(10**5):
            if optimizer == "lbfgs":
                loss = rfgp.fit_mll(model, 50, progress=False)[-1]
            else:
                model.train()
                adam = torch.optim.Adam(model.parameters(), lr=0.1)
                mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
                for _ in range(50):
                    adam.zero_grad()
                    objective = -mll(model(x), targets).sum()
                    objective.backward()
                    adam.step()
                loss = float(objective)
            seconds = time.process_time() - start
            model.eval()
            with torch.no_grad():
                posterior = model(xt)
                probs = rfgp.likelihoods.DirichletClassificationLikelihood(
                    labels, num_classes=num_classes).double().predict_proba(posterior).numpy()
        rows.append(dict(seed=seed, optimizer=optimizer, lengthscale=float(kernel.base_kernel.lengthscale),
                         loss=loss, test_nll=nll(probs, test_y), cpu_s=seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=60)
    parser.add_argument("--exact", type=int, nargs="*", default=[])
    args = parser.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    from rfgp.models import DegenerateFitWarning, DirichletGPClassifier

    rows = []
    for dtype in (torch.float32, torch.float64):
        for seed in range(args.seeds):
            train_x, train_y, test_x, test_y, bayes = problem(seed)
            prior = np.bincount(train_y, minlength=bayes.shape[1]) / len(train_y)
            prior_nll, bayes_nll = nll(np.tile(prior, (len(test_y), 1)), test_y), nll(bayes, test_y)
            for name, options in CONFIGS.items():
                start = time.process_time()
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always", DegenerateFitWarning)
                    clf = DirichletGPClassifier(dtype=dtype, seed=seed, progress=False, **options).fit(train_x, train_y)
                seconds = time.process_time() - start
                test_nll = nll(clf.predict_proba(test_x), test_y)
                rows.append(dict(
                    dtype=str(dtype).split(".")[-1], seed=seed, N=len(train_y), C=bayes.shape[1], d=train_x.shape[1],
                    config=name, lengthscale=float(clf.model_.covar_module.base_kernel.lengthscale),
                    test_nll=test_nll, prior_nll=prior_nll, bayes_nll=bayes_nll,
                    bad=test_nll > prior_nll, poor=test_nll > bayes_nll + 0.5 * (prior_nll - bayes_nll),
                    loo_nll=clf.leave_one_out_nll_, warned=any(w.category is DegenerateFitWarning for w in caught),
                    kept_extra_noise=clf.learn_additional_noise_, cpu_s=seconds, load=os.getloadavg()[0],
                ))
                print({k: (round(v, 4) if isinstance(v, float) else v) for k, v in rows[-1].items()}, flush=True)
    exact = [row for seed in args.exact for row in exact_fits(seed)]
    for row in exact:
        print(row, flush=True)
    _write(rows, exact, args)


def _write(rows: list[dict], exact: list[dict], args) -> None:
    RESULTS.mkdir(exist_ok=True)
    stem = RESULTS / "classifier_degenerate_optimum"
    write_csv(stem.with_suffix(".csv"), rows)
    lines = [f"# DirichletGPClassifier: bad optima over {args.seeds} seeded problems",
             "", "`python benchmarks/classifier_degenerate_optimum.py "
             f"--seeds {args.seeds}{' --exact ' + ' '.join(map(str, args.exact)) if args.exact else ''}` "
             "(one thread; defaults otherwise: F_train = 256, F = 1024, α_ε = 0.01, L-BFGS).",
             "", "bad: test NLL above the class-prior classifier's; poor: less than half of the prior → Bayes gap "
             "recovered; excess: mean test NLL − Bayes NLL (± SE over seeds); time: mean fit CPU seconds.", "",
             "| dtype | configuration | bad | poor | excess NLL | warned | time (s) |", "|---|---|---|---|---|---|---|"]
    for dtype in ("float32", "float64"):
        for name in CONFIGS:
            sel = [r for r in rows if r["dtype"] == dtype and r["config"] == name]
            excess = np.array([r["test_nll"] - r["bayes_nll"] for r in sel])
            lines.append(f"| {dtype} | {name} | {sum(r['bad'] for r in sel)}/{len(sel)} | "
                         f"{sum(r['poor'] for r in sel)}/{len(sel)} | {excess.mean():.3f} ± "
                         f"{excess.std(ddof=1) / np.sqrt(len(excess)):.3f} | {sum(r['warned'] for r in sel)} | "
                         f"{np.mean([r['cpu_s'] for r in sel]):.2f} |")
    pairs = {}
    for r in rows:
        pairs.setdefault((r["dtype"], r["seed"]), {})[r["config"]] = r
    good = [p for p in pairs.values() if not p["no_extra_noise"]["poor"]]
    lines.append("")
    for name in ("extra_noise", "default"):
        diff = np.array([p[name]["test_nll"] - p["no_extra_noise"]["test_nll"] for p in good])
        lines.append(f"On the {len(good)} (dtype, seed) fits that were not poor without the extra noise, {name} "
                     f"changes the test NLL by {diff.mean():+.4f} ± {diff.std(ddof=1) / np.sqrt(len(diff)):.4f} "
                     f"(paired; range {diff.min():+.3f} … {diff.max():+.3f}).")
    for dtype in ("float32", "float64"):  # the candidate "fit both, keep the lower leave-one-out NLL", from the pairs
        kept = [min((p["no_extra_noise"], p["extra_noise"]), key=lambda r: r["loo_nll"])
                for (t, _), p in pairs.items() if t == dtype]
        excess = np.array([r["test_nll"] - r["bayes_nll"] for r in kept])
        lines.append(f"{dtype}, both fits, the lower leave-one-out NLL kept (twice the fit time): bad "
                     f"{sum(r['bad'] for r in kept)}/{len(kept)}, poor {sum(r['poor'] for r in kept)}/{len(kept)}, "
                     f"excess NLL {excess.mean():.3f} ± {excess.std(ddof=1) / np.sqrt(len(excess)):.3f}, the extra "
                     f"noise kept in {sum(r['config'] == 'extra_noise' for r in kept)}.")
    refits = [p["default"] for p in pairs.values() if p["default"]["warned"]]
    lines += ["", f"The default refitted with the extra noise in {len(refits)} fits and kept that refit in "
              f"{sum(r['kept_extra_noise'] for r in refits)}.",
              "", f"Load average (1 min) during the runs: {min(r['load'] for r in rows):.2f}–"
              f"{max(r['load'] for r in rows):.2f} (2 shared cores)."]
    if exact:
        lines += ["", "GPyTorch's exact Dirichlet GP (float64, shared RBF kernel, same start, no extra noise):",
                  "", "| seed | optimizer | lengthscale | loss | test NLL | CPU s |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['seed']} | {r['optimizer']} | {r['lengthscale']:.3g} | {r['loss']:.3f} | {r['test_nll']:.3f} "
                  f"| {r['cpu_s']:.1f} |" for r in exact]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
