"""Draw and apply time of rfgp's complex Rademacher/Gaussian sketch vs a plain complex matmul (dp-rfs).

The reference is what the seed authors' dp-rfs code does for a degree-n complex Rademacher
sketch: draw one complex {±1, ±i} matrix per degree (one ``randint`` into a table of the four
units; CN(0, 1) for Gaussian), compute ``x.to(complex) @ Wᵢ``, multiply over the degrees, scale
by D^{−1/2} and return [Re, Im].  rfgp: ``PolynomialSketch(n, F, projection=..., weights="ctr")``
— draw = constructing the map with ``input_dim`` (the buffers), apply = ``forward(x)``.

Grid: d ∈ {64, 1024}, F ∈ {1024, 8192} real features (D = F/2 complex), degree n ∈ {1, 2, 4},
float32 and float64, N = 256 inputs, 1 thread; median of 3 repeats.  Ratios > 1: rfgp slower.

    python benchmarks/complex_sketch_speed.py [--quick] [--tag after] [--projection gaussian]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))  # the shared _results helper
from _results import write_csv  # noqa: E402

from rfgp.features import PolynomialSketch  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def reference_draw(projection: str, degree: int, d: int, width: int, dtype, generator):
    cdtype = COMPLEX[dtype]
    if projection == "rademacher":
        units = torch.tensor([1, -1, 1j, -1j], dtype=cdtype)
        return units[torch.randint(0, 4, (degree, d, width), generator=generator)]
    return torch.randn((degree, d, width), generator=generator, dtype=cdtype)  # CN(0, 1): E|w|² = 1


def reference_apply(x, weights):
    xc = x.to(weights.dtype)
    out = xc @ weights[0]
    for w in weights[1:]:
        out = out * (xc @ w)
    out = out / math.sqrt(weights.shape[-1])
    return torch.cat((out.real, out.imag), dim=-1)


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--tag", default="")
    parser.add_argument("--projection", choices=("rademacher", "gaussian"), action="append",
                        help="only these projections (default: both)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dims, widths, degrees = ((64, 1024), (1024, 8192), (1, 2, 4)) if not args.quick else ((64,), (1024,), (1, 3))
    repeats, n = (3, 256) if not args.quick else (2, 128)
    rows = []
    for projection in args.projection or ("rademacher", "gaussian"):
        for dtype in (torch.float32, torch.float64):
            for d in dims:
                for F in widths:
                    for degree in degrees:
                        x = torch.randn(n, d, dtype=dtype) / math.sqrt(d)
                        generator = torch.Generator().manual_seed(0)
                        ref_draw = median_seconds(
                            lambda: reference_draw(projection, degree, d, F // 2, dtype, generator), repeats)
                        weights = reference_draw(projection, degree, d, F // 2, dtype, generator)
                        ref_apply = median_seconds(lambda: reference_apply(x, weights), repeats)

                        def build():
                            return PolynomialSketch(degree, F, input_dim=d, projection=projection, weights="ctr",
                                                    seed=0).to(dtype)

                        draw = median_seconds(build, repeats)
                        phi = build()
                        with torch.no_grad():
                            apply = median_seconds(lambda: phi(x), repeats)
                        row = {"projection": projection, "dtype": str(dtype).removeprefix("torch."), "d": d, "F": F,
                               "degree": degree, "draw_s": draw, "reference_draw_s": ref_draw,
                               "draw_ratio": draw / ref_draw, "apply_s": apply, "reference_apply_s": ref_apply,
                               "apply_ratio": apply / ref_apply}
                        rows.append(row)
                        print(" ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
                              flush=True)
    stem = RESULTS / f"complex_sketch_speed{'_quick' if args.quick else ''}{'_' + args.tag if args.tag else ''}"
    RESULTS.mkdir(exist_ok=True)
    write_csv(f"{stem}.csv", rows)
    lines = [f"# Complex (CtR) sketch: rfgp vs a plain complex matmul (dp-rfs){' — ' + args.tag if args.tag else ''}",
             "", f"N = {n} inputs, 1 thread, median of {repeats}; ratio = rfgp / reference (> 1: rfgp slower).", "",
             "| projection | dtype | d | F | degree | draw s | ref draw s | draw ratio | apply s | ref apply s | apply ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['projection']} | {r['dtype']} | {r['d']} | {r['F']} | {r['degree']} | {r['draw_s']:.4f} | "
                     f"{r['reference_draw_s']:.4f} | {r['draw_ratio']:.2f} | {r['apply_s']:.4f} | "
                     f"{r['reference_apply_s']:.4f} | {r['apply_ratio']:.2f} |")
    for key in ("draw_ratio", "apply_ratio"):
        values = [r[key] for r in rows]
        lines.append("")
        lines.append(f"{key}: geometric mean {math.exp(statistics.mean(math.log(v) for v in values)):.2f}, "
                     f"max {max(values):.2f}")
    Path(f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-4:]))


if __name__ == "__main__":
    main()
