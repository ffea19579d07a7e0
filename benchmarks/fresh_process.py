"""Run each benchmark case in a fresh Python process, so that its peak resident memory is its own.

A script adds the hidden ``--case`` option (:func:`add_case_option`), answers it first (:func:`answer_case`: the
case's JSON in, its row's JSON printed), and runs every case through :func:`run_case`.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections.abc import Callable


def add_case_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--case", help=argparse.SUPPRESS)


def answer_case(args: argparse.Namespace, measure: Callable[..., dict]) -> bool:
    """When this process was started for one case: measure it, print its row as JSON, and say so."""
    if not args.case:
        return False
    print(json.dumps(measure(**json.loads(args.case))))
    return True


def run_case(script: str, case: dict, env: dict[str, str] | None = None) -> dict:
    """The row that ``script --case <case>`` prints, run in a fresh interpreter (with ``env`` added)."""
    out = subprocess.run([sys.executable, script, "--case", json.dumps(case)], check=True, capture_output=True,
                         text=True, env={**os.environ, **(env or {})}).stdout
    return json.loads(out.strip().splitlines()[-1])
