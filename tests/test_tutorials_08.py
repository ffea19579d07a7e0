"""The Pyro tutorial runs top to bottom without errors."""

from pathlib import Path

import nbformat
from nbclient import NotebookClient

TUTORIALS = Path(__file__).resolve().parents[1] / "tutorials"


def test_tutorial_08_executes():
    path = TUTORIALS / "08_pyro_likelihoods_and_bayesian_hyperparameters.ipynb"
    notebook = nbformat.read(path, as_version=4)
    NotebookClient(notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}).execute()
    outputs = [output for cell in notebook.cells if cell.cell_type == "code" for output in cell.outputs]
    assert not [output for output in outputs if output.output_type == "error"]
    assert sum(output.output_type == "display_data" for output in outputs) == 5
