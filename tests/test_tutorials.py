"""Execute the tutorial notebooks top to bottom (nbclient, kernel ``python3``, cwd ``tutorials/``).

Add a notebook by appending its file name to :data:`NOTEBOOKS`.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"

#: notebooks in ``tutorials/`` executed by this test, in order
NOTEBOOKS = [
    "01_swap_your_kernel.ipynb",
]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs(name, monkeypatch):
    path = TUTORIALS / name
    assert path.is_file(), f"{path} is listed in NOTEBOOKS but does not exist"
    # The kernel is a subprocess: make it import this checkout's rfgp even when it is not installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    errors = [out for cell in notebook.cells for out in cell.get("outputs", []) if out.output_type == "error"]
    assert not errors
