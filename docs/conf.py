"""Sphinx configuration of the rfgp documentation (offline, warnings are errors in CI).

Build: ``python -m sphinx -W --keep-going -b html docs docs/_build/html`` (the README's line).

* API reference: autodoc + napoleon (rfgp's docstrings are Google style), one page per public
  namespace, each listing what that namespace exports (``__all__`` where it has one).
* Landing page: the README, included by ``index.md``.  Its relative links
  (``tutorials/*.ipynb``, ``benchmarks/results/*.md``, ``guide/*.md``) resolve because the build
  first copies the README, the user guide, the committed notebooks and the benchmark results into
  ``docs/`` (git-ignored; see :func:`copy_pages`); its two links to folders go to a generated
  benchmarks page.
* User guide: the repository's ``guide/*.md`` pages (the README's detail), whose links are
  written relative to ``guide/`` (``../benchmarks/results/*.md``) and so resolve in ``docs/guide/``.
* Tutorials: the committed notebooks rendered by myst-nb with their stored outputs; nothing is
  executed (``nb_execution_mode = "off"``).  myst-nb rather than nbsphinx: nbsphinx needs the
  pandoc binary, which pip cannot install.
* No intersphinx and nothing else that reaches the network.
"""

import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # document this checkout's rfgp, not another installed copy

import rfgp  # noqa: E402

DOCS = ROOT / "docs"
PAGES = {"tutorials": ("*.ipynb",), "benchmarks/results": ("*.md", "*.png"), "guide": ("*.md",)}
# The README links to two folders, which are no pages: both go to the generated benchmarks page.
FOLDER_LINKS = {"](benchmarks/)": "](benchmarks/index.md)", "](benchmarks/results/)": "](benchmarks/index.md)"}
# The guide pages link back to the README, which the site shows as its landing page.
GUIDE_LINKS = {"](../README.md)": "](../index.md)"}
BENCHMARKS_INDEX = """# Benchmark results

Each page is the Markdown report that a script in the repository's `benchmarks/` folder wrote
to `benchmarks/results/` (`python benchmarks/<name>.py`, `--quick` for a smoke run), next to
its CSV and figures.

```{toctree}
:glob:

results/*
```
"""


def _write_if_changed(path, data):
    """Write ``data`` (bytes) to ``path`` unless it already holds them (keeps builds incremental)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_bytes() != data:
        path.write_bytes(data)


def _titled(source):
    """A result page's bytes, given a level-1 heading from its file name when it has none
    (a page needs a title to appear in the table of contents)."""
    data = source.read_bytes()
    if source.suffix == ".md" and not data.lstrip().startswith(b"# "):
        data = f"# {source.stem.replace('_', ' ').capitalize()}\n\n".encode() + data
    return data


def copy_pages():
    """Copy the README, the user guide, the committed notebooks and the benchmark results into the source tree.

    The copies are git-ignored; they keep the README's relative links valid inside the site.
    """
    readme = (ROOT / "README.md").read_text()
    for link, page in FOLDER_LINKS.items():
        readme = readme.replace(link, page)
    _write_if_changed(DOCS / "README.md", readme.encode())
    _write_if_changed(DOCS / "benchmarks" / "index.md", BENCHMARKS_INDEX.encode())
    for folder, patterns in PAGES.items():
        for pattern in patterns:
            for source in sorted((ROOT / folder).glob(pattern)):
                data = _titled(source)
                if folder == "guide":
                    for link, page in GUIDE_LINKS.items():
                        data = data.replace(link.encode(), page.encode())
                _write_if_changed(DOCS / folder / source.name, data)


copy_pages()

project = "rfgp"
author = "rfgp developers"
copyright = "rfgp developers"
release = rfgp.__version__
version = release

extensions = [
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
    "sphinx.ext.mathjax",
    "sphinx.ext.viewcode",
    "myst_nb",
]

root_doc = "index"
source_suffix = {".rst": "restructuredtext", ".md": "myst-nb", ".ipynb": "myst-nb"}
# Only these are pages: the API reference, the landing page, the user guide, the notebooks and the
# benchmark results (the benchmark folder also holds scripts, CSVs and figures, which are not pages).
include_patterns = [
    "index.md",
    "guide/*.md",
    "api/*.rst",
    "tutorials/*.ipynb",
    "benchmarks/index.md",
    "benchmarks/results/*.md",
]
exclude_patterns = ["_build"]

# autodoc
autodoc_default_options = {"members": True, "member-order": "bysource", "show-inheritance": True}
autodoc_typehints = "description"
autodoc_class_signature = "mixed"
autoclass_content = "both"
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

# MyST / myst-nb: render the stored outputs, never execute.
nb_execution_mode = "off"
myst_enable_extensions = ["dollarmath", "amsmath"]
myst_heading_anchors = 3

html_theme = "furo"
html_title = f"rfgp {release}"
