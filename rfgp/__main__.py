"""Command line: ``python -m rfgp demo [--num-train N] [--num-features F] [--method sorf] [--plot PATH]``."""

from __future__ import annotations

import argparse

from .demo import run_demo
from .kernels.fourier import FOURIER_METHODS


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m rfgp", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="fit an exact and a sketched GP on embedded data and compare them")
    demo.add_argument("--num-train", type=int, default=3000)
    demo.add_argument("--num-features", type=int, default=256)
    demo.add_argument("--method", choices=tuple(FOURIER_METHODS), default="rff")
    demo.add_argument("--iterations", type=int, default=50)
    demo.add_argument("--plot", default="rfgp-demo.png", help="path of the posterior plot (PNG)")
    args = parser.parse_args(argv)
    if args.command == "demo":
        run_demo(args.num_train, args.num_features, args.method, args.iterations, args.plot, progress=True)


if __name__ == "__main__":
    main()
