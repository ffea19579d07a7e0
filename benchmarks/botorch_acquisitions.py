"""BoTorch acquisition set-up and raw-sample evaluation with an rfgp kernel against the exact GP.

For N training points (d = 2, BoTorch's default SingleTaskGP: RBF with its dim-scaled prior, Standardize) and an ORF
sketch of that kernel at width F, one CPU thread, the best of ``--repeats`` (every case on a fresh model copy, so its
prediction caches are built inside the timing, as in a BO iteration):

* ``qLogNEI()``      — constructing qLogNoisyExpectedImprovement with ``X_baseline`` = all N points (BoTorch prunes
  the baseline from 2048 joint posterior samples), for rfgp with and without
  :mod:`rfgp.integrations.botorch_pruning` (``rfgp, BoTorch's pruning sampler``: the dense n × n square root);
* ``ics(qLogNEI)``   — ``gen_batch_initial_conditions`` (q = 2, 512 raw samples) of that acquisition;
* ``ics(UCB)``, ``ics(qNIPV)`` — the same for UpperConfidenceBound (q = 1) and qNegIntegratedPosteriorVariance
  (q = 2, 64 MC points; it fantasises N + q points per raw sample; the exact GP at N ≤ 300 only);
* ``qKG(X)``         — qKnowledgeGradient (16 fantasies) evaluated at 32 one-shot candidates (q = 1), no gradient;
* ``opt(qKG)``, ``opt(qNIPV)`` — ``optimize_acqf`` of qKnowledgeGradient (8 fantasies, q = 1) and of
  qNegIntegratedPosteriorVariance (q = 2), 2 restarts from 16 raw samples, 10 L-BFGS-B iterations: its gradient
  steps differentiate the fantasy posterior w.r.t. X under BoTorch's ``propagate_grads(True)``;
* ``grad(qKG)``, ``grad(qNIPV)`` — those gradient steps alone: 10 values and gradients w.r.t. X at 4 candidates
  (``torch.autograd.grad(value, X)``, as ``gen_candidates_scipy``);
  the fantasy cases also with ``rfgp, fantasies recomputed`` (the fantasy strategy built from all
  N + q points instead of :class:`rfgp.inference.prediction.RankUpdatedFantasyStrategy`'s rank-q cache update).

The largest matrix handed to a Cholesky factorisation is recorded for each case.

    python benchmarks/botorch_acquisitions.py                      # writes results/botorch_acquisitions.md
    python benchmarks/botorch_acquisitions.py --num-train 1000 3000 --features 256 --repeats 1
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "results"


def _timed(function, repeats):
    best, value = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        value = function()
        best = min(best, time.perf_counter() - start)
    return best, value


def run(num_train: int, num_features: int, repeats: int, exact: bool, only: list[str] | None = None) -> list[dict]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    import botorch.acquisition.utils as acquisition_utils
    import torch
    from botorch.acquisition import UpperConfidenceBound, qKnowledgeGradient, qLogNoisyExpectedImprovement
    from botorch.acquisition.active_learning import qNegIntegratedPosteriorVariance
    from botorch.models import SingleTaskGP
    from botorch.optim import optimize_acqf
    from botorch.optim.initializers import gen_batch_initial_conditions

    import rfgp
    from rfgp.inference.prediction import RankUpdatedFantasyStrategy
    from rfgp.integrations import botorch_pruning

    torch.set_num_threads(1)
    gen = torch.Generator().manual_seed(0)
    d = 2
    bounds = torch.tensor([[0.0] * d, [1.0] * d], dtype=torch.float64)
    x = torch.rand(num_train, d, generator=gen, dtype=torch.float64)
    y = torch.sin(6 * x).sum(-1, keepdim=True) + 0.05 * torch.randn(num_train, 1, generator=gen, dtype=torch.float64)
    exact_model = SingleTaskGP(x, y).double()
    exact_model.covar_module.lengthscale = 0.3
    exact_model.likelihood.noise = 1e-2
    sketched_model = copy.deepcopy(exact_model)
    sketched_model.covar_module = rfgp.sketch(exact_model.covar_module, num_features, method="orf", seed=0)
    mc_points = torch.rand(64, d, generator=gen, dtype=torch.float64)
    one_shot = torch.rand(32, 1 + 16, d, generator=gen, dtype=torch.float64)

    def knowledge_gradient(m):
        with torch.no_grad():
            return qKnowledgeGradient(m, num_fantasies=16)(one_shot)

    def optimised(acquisition, q):
        torch.manual_seed(0)  # the same raw samples for every contender
        return optimize_acqf(acquisition, bounds, q=q, num_restarts=2, raw_samples=16, options={"maxiter": 10})

    def gradient_steps(acquisition, X, steps=10):
        for _ in range(steps):  # the gradient w.r.t. X alone, as gen_candidates_scipy takes it
            X = X.detach().requires_grad_(True)
            (grad,) = torch.autograd.grad(acquisition(X).sum(), X)
        return grad

    kg_candidates = torch.rand(4, 1 + 8, d, generator=gen, dtype=torch.float64)
    nipv_candidates = torch.rand(4, 2, d, generator=gen, dtype=torch.float64)
    sizes = []
    cholesky_ex = torch.linalg.cholesky_ex

    def spy(matrix, *args, **kwargs):
        sizes.append(matrix.shape[-1])
        return cholesky_ex(matrix, *args, **kwargs)

    for model in (sketched_model, exact_model):  # warm-up: lazy imports, first-call allocations
        qLogNoisyExpectedImprovement(copy.deepcopy(model).eval(), X_baseline=x[:20])
    torch.linalg.cholesky_ex = spy
    contenders = [("rfgp", sketched_model, botorch_pruning._get_sampler),
                  ("rfgp, BoTorch's pruning sampler", sketched_model, botorch_pruning._botorch_get_sampler),
                  ("rfgp, fantasies recomputed", sketched_model, botorch_pruning._get_sampler)]
    if exact:
        contenders.append(("exact GP", exact_model, botorch_pruning._botorch_get_sampler))
    rows = []
    try:
        for name, model, get_sampler in contenders:
            acquisition_utils.get_sampler = get_sampler
            cases = {
                "qLogNEI()": lambda m: qLogNoisyExpectedImprovement(m, X_baseline=x),
                "ics(qLogNEI)": lambda m: gen_batch_initial_conditions(
                    qLogNoisyExpectedImprovement(m, X_baseline=x), bounds, q=2, num_restarts=4, raw_samples=512),
                "ics(UCB)": lambda m: gen_batch_initial_conditions(
                    UpperConfidenceBound(m, beta=0.5), bounds, q=1, num_restarts=4, raw_samples=512),
                "ics(qNIPV)": lambda m: gen_batch_initial_conditions(
                    qNegIntegratedPosteriorVariance(m, mc_points=mc_points), bounds, q=2, num_restarts=4,
                    raw_samples=512),
                "qKG(X)": knowledge_gradient,
                "opt(qKG)": lambda m: optimised(qKnowledgeGradient(m, num_fantasies=8), 1),
                "opt(qNIPV)": lambda m: optimised(qNegIntegratedPosteriorVariance(m, mc_points=mc_points), 2),
                "grad(qKG)": lambda m: gradient_steps(qKnowledgeGradient(m, num_fantasies=8), kg_candidates),
                "grad(qNIPV)": lambda m: gradient_steps(qNegIntegratedPosteriorVariance(m, mc_points=mc_points),
                                                        nipv_candidates),
            }
            for case, build in cases.items():
                if only is not None and case not in only:
                    continue
                fantasies = case in ("ics(qNIPV)", "qKG(X)", "opt(qKG)", "opt(qNIPV)", "grad(qKG)", "grad(qNIPV)")
                if name == "rfgp, BoTorch's pruning sampler" and case not in ("qLogNEI()", "ics(qLogNEI)"):
                    continue  # the pruning sampler only matters where X_baseline is pruned
                if name == "rfgp, fantasies recomputed" and not fantasies:
                    continue
                if name == "exact GP" and fantasies and num_train > 300:
                    continue  # an N × N fantasy update per raw sample: minutes
                sizes.clear()
                update = RankUpdatedFantasyStrategy.__dict__["of"]
                if name == "rfgp, fantasies recomputed":
                    RankUpdatedFantasyStrategy.of = classmethod(lambda cls, *args: None)
                try:
                    seconds, _ = _timed(lambda: build(copy.deepcopy(model).eval()), repeats)
                finally:
                    RankUpdatedFantasyStrategy.of = update
                rows.append({"N": num_train, "F": num_features, "model": name, "case": case,
                             "seconds": seconds, "largest factorised": max(sizes, default=0)})
                print(rows[-1], flush=True)
    finally:
        torch.linalg.cholesky_ex = cholesky_ex
        acquisition_utils.get_sampler = botorch_pruning._get_sampler
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-train", type=int, nargs="+", default=[300, 1000, 3000, 6000])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--exact-up-to", type=int, default=3000, help="largest N the exact GP runs at")
    parser.add_argument("--cases", nargs="+", default=None, help="run only these cases (default: all)")
    parser.add_argument("--tag", default="")
    args = parser.parse_args()
    rows = []
    for num_train in args.num_train:
        rows += run(num_train, args.features, args.repeats, exact=num_train <= args.exact_up_to, only=args.cases)
    lines = ["| N | F | model | case | seconds | largest factorised |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['N']} | {r['F']} | {r['model']} | {r['case']} | {r['seconds']:.3f} | {r['largest factorised']} |"
              for r in rows]
    name = "botorch_acquisitions" + (f"_{args.tag}" if args.tag else "")
    RESULTS.mkdir(exist_ok=True)
    header = (f"# BoTorch acquisition set-up with rfgp (`benchmarks/botorch_acquisitions.py`)\n\n"
              f"One CPU thread, best of {args.repeats}, float64; each case on a fresh model copy (caches built "
              "inside the timing); `ics` is `gen_batch_initial_conditions` with 512 raw samples. On a shared machine "
              "the times vary by tens of percent: compare rows of one run.\n\n")
    (RESULTS / f"{name}.md").write_text(header + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
