"""Execute tutorials/02_polynomial_sketches.ipynb top to bottom."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parent.parent / "tutorials"


def test_tutorial_02_runs():
    notebook = nbformat.read(TUTORIALS / "02_polynomial_sketches.ipynb", as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}).execute()
