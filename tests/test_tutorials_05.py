"""Execute tutorials/05_vector_fields.ipynb top to bottom."""

import os
from pathlib import Path

import nbformat
from nbclient import NotebookClient

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"


def test_tutorial_05_vector_fields_executes(monkeypatch):
    # rfgp is imported from this checkout (the notebook kernel inherits the environment).
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    notebook = nbformat.read(TUTORIALS / "05_vector_fields.ipynb", as_version=4)
    NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    ).execute()
    outputs = "".join(
        output.get("text", "") for cell in notebook.cells if cell.cell_type == "code" for output in cell.get("outputs", [])
    )
    assert "MultitaskFeatureSpacePredictionStrategy" in outputs
