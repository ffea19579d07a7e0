"""The README's documentation command builds the site offline with warnings as errors."""

import pathlib
import re
import shlex
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[2]
README = (ROOT / "README.md").read_text()


def readme_docs_command() -> str:
    lines = re.findall(r"^python -m sphinx .*$", README, re.M)
    assert len(lines) == 1, f"README.md must show exactly one docs command line, found {lines}"
    return lines[0]


def test_readme_docs_command_treats_warnings_as_errors():
    arguments = shlex.split(readme_docs_command())
    assert "-W" in arguments and "--keep-going" in arguments
    assert arguments[-2:] == ["docs", "docs/_build/html"]


def test_docs_build_without_warnings():
    """Runs the README's line verbatim from the repository root (the current interpreter's Sphinx)."""
    command = readme_docs_command().replace("python", shlex.quote(sys.executable), 1)
    result = subprocess.run(command, shell=True, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-8000:]
    html = ROOT / "docs" / "_build" / "html"
    pages = ["index.html", "api/kernels.html", "tutorials/01_swap_your_kernel.html",
             "benchmarks/results/time_to_accuracy.html",
             "guide/gpytorch.html", "guide/botorch.html", "guide/training.html"]
    for page in pages:
        assert (html / page).is_file(), f"{page} missing from the built site"
    landing = (html / "index.html").read_text()
    # the README's links to notebooks and results point at pages of the site
    assert 'href="tutorials/01_swap_your_kernel.html"' in landing
    assert 'href="benchmarks/results/time_to_accuracy.html"' in landing
    # the README's summaries link to the user guide, whose links resolve from docs/guide/
    assert 'href="guide/gpytorch.html#any-kernel-tree-derivatives-included"' in landing
    guide = (html / "guide" / "training.html").read_text()
    assert 'href="../benchmarks/results/time_to_accuracy.html"' in guide and 'href="../index.html"' in guide
    assert 'id="rfgp.kernels.SketchedRBFKernel"' in (html / "api" / "kernels.html").read_text()
    # autodoc documents nothing, silently, for a module that only re-exports names without __all__:
    # every namespace page must describe at least one object
    empty = [page.name for page in (html / "api").glob("*.html")
             if page.name != "index.html" and 'class="sig sig-object py"' not in page.read_text()]
    assert not empty, f"API pages that document no object: {empty}"
