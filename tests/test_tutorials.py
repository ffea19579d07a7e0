"""Execute the tutorial notebooks top to bottom (nbclient, kernel ``python3``, cwd ``tutorials/``).

Add a notebook by adding it to :data:`NOTEBOOKS` with what its outputs must show.
"""

from __future__ import annotations

import os
from pathlib import Path

import nbclient
import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
TUTORIALS = ROOT / "tutorials"

#: notebook → (text its outputs must contain, number of figures it must draw)
NOTEBOOKS = {
    "01_swap_your_kernel.ipynb": ("same lengthscale: True", 3),
    "02_polynomial_sketches.ipynb": ("all within 4 standard errors: True", 3),
    "03_maclaurin_and_bias_correction.ipynb": ("p* = 9, widths = (1, 1, 1, 1, 1, 1, 1, 1, 1)", 1),
    "04_dirichlet_classification.ipynb": ("same predicted class", 4),
    "06_kernel_distance_and_two_sample_tests.ipynb": ("refused: lengthscale 0.3 is below min_lengthscale", 2),
    "05_vector_fields.ipynb": ("prediction strategy: MultitaskFeatureSpacePredictionStrategy", 2),
    "07_million_points.ipynb": ("updated factor = refactorised factor to float32 rounding: True", 3),
    "08_pyro_likelihoods_and_bayesian_hyperparameters.ipynb": ("", 5),
    "09_any_gpytorch_kernel.ipynb": ("same hyperparameters: True", 2),
    "10_bayesian_optimisation.ipynb": ("draws agree with the posterior within 5 standard errors: True", 3),
}


@pytest.mark.parametrize("name", sorted(NOTEBOOKS))
def test_notebook_runs(name, monkeypatch):
    expected_text, expected_figures = NOTEBOOKS[name]
    path = TUTORIALS / name
    # The kernel is a subprocess: make it import this checkout's rfgp even when it is not installed.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    # One intra-op thread per kernel, as in the test processes (conftest.py): pytest-xdist already runs
    # one process per core, and oversubscribed threads slow the many small ops of NUTS/SVI cells ~8×.
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    monkeypatch.setenv("MKL_NUM_THREADS", "1")
    notebook = nbformat.read(path, as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=300, kernel_name="python3", resources={"metadata": {"path": str(TUTORIALS)}}
    )
    client.execute()  # raises CellExecutionError, naming the cell, on any error
    outputs = [out for cell in notebook.cells if cell.cell_type == "code" for out in cell.outputs]
    assert not [out for out in outputs if out.output_type == "error"]
    # no warnings: a reader cannot tell a harmless one from a problem (fix the cause, or filter it saying why)
    printed_warnings = [out.text for out in outputs if out.output_type == "stream" and out.name == "stderr"]
    assert not printed_warnings, f"{name} prints to stderr: {printed_warnings}"
    text = "".join(out.get("text", "") + str(out.get("data", {}).get("text/plain", "")) for out in outputs)
    assert expected_text in text
    assert sum(out.output_type == "display_data" for out in outputs) == expected_figures
