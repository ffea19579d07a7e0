"""Execute tutorials/07_million_points.ipynb top to bottom."""

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"


def test_tutorial_07_runs(monkeypatch):
    # The kernel imports this checkout's rfgp even when it is not pip-installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(TUTORIALS / "07_million_points.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}).execute()
    outputs = "".join(o.get("text", "") for c in notebook.cells if c.cell_type == "code" for o in c.outputs)
    assert "ChunkedFeatureRootLinearOperator" in outputs
