"""High-dimensional inputs (embeddings, one-hot tables, digits): every RBF/Matérn method of ``rfgp.sketch``.

For each method, d and F: the kernel error ‖K̂ − K‖_F/‖K‖_F against GPyTorch's exact kernel on 200 points at the
median-heuristic lengthscale (mean over 3 seeds), the size of the random draws, and the time and peak-RSS growth of
one −MLL + gradient at N points (one thread) against GPyTorch's exact GP on the same data; then 3 L-BFGS steps
(``rfgp.fit_mll``) and a prediction, checked finite.  Inputs: standard Gaussian rows (an embedding of width d).

Run: ``python benchmarks/high_dimensional_inputs.py [--quick]`` (writes benchmarks/results/high_dimensional_inputs.md;
``--quick``: d = 64, F = 256, N = 500, float64 only).  Each case runs in a fresh process so that peak RSS is its own.
GaussianSketch (not HD) runs at d = 64 only: its tree has one leaf per column, O(N·d·F log F), minutes per step above.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
METHODS = ("rbf:rff", "rbf:orf", "rbf:sorf", "rbf:maclaurin", "rbf:gaussian_sketch_hd", "rbf:gaussian_sketch",
           "rbf:nystrom", "matern0.5:rff", "matern1.5:orf", "matern2.5:sorf", "exact")


def run_case(method: str, d: int, width: int, dtype_name: str, n: int) -> dict:
    """One case in this process: returns the measurements (or the error) as a dict."""
    import resource

    import gpytorch
    import torch
    from gpytorch.kernels import MaternKernel, RBFKernel, ScaleKernel

    sys.path.insert(0, str(ROOT))
    import rfgp
    from rfgp.models.regression import ExactGPModel

    torch.set_num_threads(1)
    dtype = getattr(torch, dtype_name)
    g = torch.Generator().manual_seed(12345)  # not a feature seed: draws must not equal the data
    x = torch.randn(n, d, generator=g, dtype=dtype)
    y = torch.sin(x[:, :5].sum(-1)) + 0.1 * torch.randn(n, generator=g, dtype=dtype)
    sample = x[:200]
    lengthscale = torch.cdist(sample.double(), sample.double()).median().item()
    family, name = method.split(":") if ":" in method else ("rbf", method)
    leaf = RBFKernel(ard_num_dims=d) if family == "rbf" else MaternKernel(nu=float(family[6:]), ard_num_dims=d)
    leaf.lengthscale = lengthscale
    exact = ScaleKernel(leaf).to(dtype)
    options = {"nystrom": {"x_sample": x}, "gaussian_sketch": {"x_sample": x, "alpha": 1e-2},
               "gaussian_sketch_hd": {"x_sample": x, "alpha": 1e-2}}.get(name, {})
    out = {"method": method, "d": d, "F": width, "dtype": dtype_name, "N": n}
    try:
        errors, draws = [], 0.0
        with torch.no_grad():
            dense = exact(sample).to_dense()
        for seed in range(3 if name != "exact" else 0):
            kernel = rfgp.sketch(exact, width, method=name, seed=seed, **options).to(dtype)
            with torch.no_grad():
                errors.append(((kernel(sample).to_dense() - dense).norm() / dense.norm()).item())
            draws = sum(b.numel() * b.element_size() for b in kernel.buffers()) / 2**20
        out["kernel_error"] = sum(errors) / len(errors) if errors else 0.0
        out["draws_MiB"] = draws
        kernel = exact if name == "exact" else kernel
        likelihood = gpytorch.likelihoods.GaussianLikelihood().to(dtype)
        model = ExactGPModel(x, y, likelihood, kernel).to(dtype)
        mll = gpytorch.mlls.ExactMarginalLogLikelihood(likelihood, model)
        model.train()
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        start = time.perf_counter()
        loss = -mll(model(x), y)
        loss.backward()
        out["mll_grad_s"] = time.perf_counter() - start
        out["peak_rss_growth_MiB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024 - base
        out["grad_finite"] = all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)
        start = time.perf_counter()
        rfgp.fit_mll(model, num_iterations=3, progress=False)
        out["fit3_s"] = time.perf_counter() - start
        model.eval()
        with torch.no_grad():
            prediction = likelihood(model(x[:500]))
        out["predict_finite"] = bool(torch.isfinite(prediction.mean).all() and (prediction.variance > 0).all())
    except Exception as error:  # a refusal is a result: recorded with its message
        out["error"] = f"{type(error).__name__}: {str(error)[:300]}"
    return out


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--case":
        print(json.dumps(run_case(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5], int(sys.argv[6]))))
        return
    quick = "--quick" in sys.argv
    if quick:
        grid = [(m, 64, 256, "float64", 500) for m in METHODS]
    else:
        # GaussianSketch's per-column tree costs O(N·d·F log F): minutes per −MLL + gradient above d = 64
        grid = [(m, d, 1024, "float64", 2000) for d in (64, 300) for m in METHODS
                if d == 64 or m.split(":")[-1] != "gaussian_sketch"]
        grid += [(m, 1024, 4096, "float32", 2000) for m in METHODS if m.split(":")[-1] != "gaussian_sketch"]
    rows, load = [], os.getloadavg()
    for case in grid:
        command = [sys.executable, __file__, "--case", *map(str, case)]
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
            lines = result.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if lines else {"error": result.stderr.strip().splitlines()[-1][:300]}
        except subprocess.TimeoutExpired:
            row = {"error": "timed out after 900 s"}
        row.update(zip(("method", "d", "F", "dtype", "N"), case))
        print(row, flush=True)
        rows.append(row)
    header = ("| method | d | F | dtype | N | kernel error | draws MiB | −MLL+grad s | peak RSS growth MiB "
              "| 3 L-BFGS s | finite | error |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    body = "".join(
        f"| {r['method']} | {r['d']} | {r['F']} | {r['dtype']} | {r['N']} | {r.get('kernel_error', float('nan')):.3f} "
        f"| {r.get('draws_MiB', float('nan')):.1f} | {r.get('mll_grad_s', float('nan')):.2f} "
        f"| {r.get('peak_rss_growth_MiB', float('nan')):.0f} | {r.get('fit3_s', float('nan')):.1f} "
        f"| {r.get('grad_finite', '')}/{r.get('predict_finite', '')} | {r.get('error', '')} |\n"
        for r in rows
    )
    text = (f"# High-dimensional inputs\n\n`python benchmarks/high_dimensional_inputs.py{' --quick' if quick else ''}`"
            f"; one thread; load average at start {load[0]:.2f}, {load[1]:.2f}, {load[2]:.2f} (2 shared cores), at end "
            f"{os.getloadavg()[0]:.2f}.  Kernel error: ‖K̂ − K‖_F/‖K‖_F on 200 points at the median-heuristic "
            "lengthscale, mean of 3 seeds; draws: the converted kernel's buffers; `exact`: GPyTorch's exact GP "
            "(its default CG/Lanczos path above 800 points).\n\n" + header + body)
    name = "high_dimensional_inputs_quick.md" if quick else "high_dimensional_inputs.md"
    (ROOT / "benchmarks" / "results" / name).write_text(text)


if __name__ == "__main__":
    main()
