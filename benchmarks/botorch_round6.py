"""BoTorch round 6 acquisitions with rfgp kernels against the exact GP: one value and gradient w.r.t. X.

The models of ``tests/integrations/test_botorch_round6.py`` at N training points (d = 2, fixed hyperparameters), each
kernel exact or converted to ORF features of width F; one CPU thread, float64, the exact and the converted model
alternated in one process (paired), best of ``--repeats``, the machine's load average recorded:

* ``qHVKG``     — qHypervolumeKnowledgeGradient on a ModelListGP of two SingleTaskGPs, 2 fantasies × 3 Pareto points,
  4 one-shot t-batches (q = 1);
* ``qMF-HVKG``  — qMultiFidelityHypervolumeKnowledgeGradient on two SingleTaskMultiFidelityGPs (linear_truncated=False,
  d = 3 with the data fidelity), cost-aware, the same one-shot shape;
* ``qBALD``     — qBayesianActiveLearningByDisagreement on a 3-member ensemble, 64 samples, 16 t-batches of q = 2.

    python benchmarks/botorch_round6.py                     # writes results/botorch_round6.md
    python benchmarks/botorch_round6.py --num-train 500 --repeats 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def run(num_train: int, num_features: int, repeats: int) -> list[dict]:
    sys.path.insert(0, str(ROOT))
    import torch

    from tests.integrations import test_botorch_round6 as round6

    torch.set_num_threads(1)
    one_shot = round6.uniform(4, 1 + round6.NUM_FANTASIES * round6.NUM_PARETO, seed=7)
    mf_one_shot = torch.rand(4, 1 + round6.NUM_FANTASIES * round6.NUM_PARETO, 3,
                             generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    pairs = round6.uniform(16, 2, seed=7)
    cases = {  # name: (build the model: exact if num_features is None, acquisition, X)
        "qHVKG": (lambda f: round6.two_objective_model(
            num_train, (lambda m: m) if f is None else (lambda m: round6.sketched_copy(m, f)))[1],
            round6._hvkg, one_shot),
        "qMF-HVKG": (lambda f: round6.multi_fidelity_model(num_train, f), round6._multi_fidelity_hvkg, mf_one_shot),
        "qBALD": (lambda f: round6.ensemble(
            num_train, (lambda m: m.eval()) if f is None else (lambda m: round6.sketched_copy(m, f)))[1],
            round6._bald, pairs),
    }
    rows = []
    for case, (build, acquisition, X) in cases.items():
        models = {"exact GP": build(None), f"rfgp ORF, F = {num_features}": build(num_features)}
        best = dict.fromkeys(models, float("inf"))
        for _ in range(repeats):
            for name, model in models.items():  # alternated: exact, rfgp, exact, rfgp, ...
                start = time.perf_counter()
                round6.value_and_grad(acquisition(model), X)
                best[name] = min(best[name], time.perf_counter() - start)
        for name, seconds in best.items():
            rows.append({"N": num_train, "case": case, "model": name, "seconds": seconds,
                         "load": os.getloadavg()[0]})
            print(rows[-1], flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--num-train", type=int, nargs="+", default=[500, 2000])
    parser.add_argument("--features", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rows = [row for n in args.num_train for row in run(n, args.features, args.repeats)]
    lines = ["| N | case | model | seconds (value + gradient) | load (1 min) |", "|---|---|---|---|---|"]
    lines += [f"| {r['N']} | {r['case']} | {r['model']} | {r['seconds']:.3f} | {r['load']:.1f} |" for r in rows]
    header = ("# BoTorch round 6 acquisitions with rfgp (`benchmarks/botorch_round6.py`)\n\n"
              f"One CPU thread, float64, best of {args.repeats}, exact and rfgp alternated in one process; machine "
              f"load average (1, 5, 15 min) at the start {tuple(round(v, 1) for v in load_before)}, at the end "
              f"{tuple(round(v, 1) for v in os.getloadavg())} (2 shared cores): compare rows of one run.\n\n")
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "botorch_round6.md").write_text(header + "\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
