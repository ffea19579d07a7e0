"""Every benchmark script imports against today's API, and importing one does not run it.

``benchmarks/*.py`` are the library's acceptance evidence; a name they import that was removed or renamed fails here
instead of when someone next runs the benchmark.  The scripts are imported (not run) in one fresh interpreter, in
sorted order, as the modules they are: several put folders on ``sys.path`` at import, and one script's path must not
break the next one's imports (``tests/packaging`` once shadowed the ``packaging`` distribution).
"""

import ast
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py"))

IMPORT_ALL = """
import importlib, importlib.util, json, sys, traceback
failures = {}
for path in sys.argv[1:]:
    name = "benchmark_" + path.rsplit("/", 1)[-1][:-3]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        failures[path] = traceback.format_exc(limit=-3)
packaging = importlib.import_module("packaging.version")
print(json.dumps({"failures": failures, "packaging": packaging.__file__}))
"""


def test_the_benchmarks_are_found():
    assert len(SCRIPTS) > 50, [path.name for path in SCRIPTS]


def test_every_benchmark_imports():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", IMPORT_ALL, *map(str, SCRIPTS)], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["failures"] == {}, "\n".join(f"{path}:\n{error}" for path, error in report["failures"].items())
    assert not Path(report["packaging"]).is_relative_to(ROOT), report["packaging"]


def _top_level_calls(tree: ast.Module) -> list[str]:
    """The module's own functions that a top-level statement calls for its effect (``main()`` outside the guard)."""
    defined = {node.name for node in tree.body if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}
    return [statement.value.func.id for statement in tree.body
            if isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)
            and isinstance(statement.value.func, ast.Name) and statement.value.func.id in defined]


def test_importing_a_benchmark_does_not_run_it():
    """A script's ``main`` (or any function it defines, called for its effect) runs only under ``if __name__ ==
    "__main__":``."""
    running = {}
    for path in SCRIPTS:
        tree = ast.parse(path.read_text(), filename=str(path))
        calls = _top_level_calls(tree)
        if calls:
            running[path.name] = calls
        has_main = any(isinstance(node, ast.FunctionDef) and node.name == "main" for node in tree.body)
        guarded = any(isinstance(node, ast.If) and "__name__" in ast.unparse(node.test) for node in tree.body)
        if has_main and not guarded:
            running[path.name] = ["main without an `if __name__ == '__main__':` guard"]
    assert running == {}
