"""The wheel and sdist build, pass ``twine check``, carry what they should, and the demo runs from the wheel.

One build (``python -m build --no-isolation``: sdist, then the wheel from the unpacked sdist, so
the sdist is checked to be complete) serves every test of this module.
"""

import email
import os
import pathlib
import subprocess
import sys
import tarfile
import zipfile

import pytest

import rfgp

ROOT = pathlib.Path(__file__).parents[2]


@pytest.fixture(scope="module")
def dist(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    result = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(out), str(ROOT)],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    (wheel,) = out.glob("rfgp-*.whl")
    (sdist,) = out.glob("rfgp-*.tar.gz")
    return wheel, sdist


def _package_files():
    """Every file of the rfgp package in the source tree (modules and data), relative to the root."""
    return {p.relative_to(ROOT).as_posix() for p in (ROOT / "rfgp").rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in {".pyc", ".pyo"}}


def test_twine_check_passes(dist):
    result = subprocess.run([sys.executable, "-m", "twine", "check", "--strict", *map(str, dist)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_wheel_holds_the_package_typed_and_versioned(dist):
    wheel, _ = dist
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        metadata = email.message_from_bytes(archive.read(f"rfgp-{rfgp.__version__}.dist-info/METADATA"))
    assert "rfgp/py.typed" in names
    missing = _package_files() - names
    assert not missing, f"package files missing from the wheel: {sorted(missing)}"
    assert not any(name.startswith(("tests/", "docs/", "benchmarks/", "tutorials/")) for name in names)
    assert metadata["Version"] == rfgp.__version__ == wheel.name.split("-")[1]
    extras = set(metadata.get_all("Provides-Extra"))
    assert {"test", "botorch", "docs", "datasets"} <= extras


def test_sdist_holds_sources_tests_docs_and_tutorials(dist):
    _, sdist = dist
    with tarfile.open(sdist) as archive:
        names = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    expected = _package_files() | {"README.md", "pyproject.toml", "docs/conf.py", "docs/index.md",
                                   "tests/docs/test_doctests.py", "tutorials/01_swap_your_kernel.ipynb",
                                   "benchmarks/results/time_to_accuracy.md", "guide/gpytorch.md", "guide/botorch.md"}
    missing = expected - names
    assert not missing, f"missing from the sdist: {sorted(missing)}"
    built = ("docs/_build/", "docs/tutorials/", "docs/guide/", ".ci/")
    assert not any(name.startswith(built) or "__pycache__" in name for name in names)


def test_demo_and_datasets_run_from_the_unpacked_wheel(dist, tmp_path):
    """``python -m rfgp demo`` (small) and the offline data sets, importing rfgp from the wheel only."""
    wheel, _ = dist
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    work = tmp_path / "elsewhere"
    work.mkdir()
    script = (
        "import pathlib, rfgp, rfgp.datasets as ds\n"
        f"assert pathlib.Path(rfgp.__file__).is_relative_to({str(site)!r}), rfgp.__file__\n"
        "ds.helmholtz_field(20, seed=0)\n"
        "ds.igrf_magnetic_field(20, seed=0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    commands = [[sys.executable, "-c", script],
                [sys.executable, "-m", "rfgp", "demo", "--num-train", "300", "--num-features", "64",
                 "--iterations", "2", "--plot", "demo.png"]]
    for command in commands:
        result = subprocess.run(command, cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-4000:]
    assert "test RMSE" in result.stdout
    assert (work / "demo.png").stat().st_size > 10_000
