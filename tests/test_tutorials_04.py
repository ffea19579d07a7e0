"""Execute tutorials/04_dirichlet_classification.ipynb top to bottom."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def test_tutorial_04_runs():
    notebook = nbformat.read(TUTORIALS / "04_dirichlet_classification.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}).execute()
    outputs = "".join(o.get("text", "") for cell in notebook.cells for o in cell.get("outputs", []))
    assert "test error" in outputs and "Traceback" not in outputs
