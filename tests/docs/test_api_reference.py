"""The API reference (docs/api/*.rst) names only objects that exist.

Sphinx's autodoc skips a name listed in ``:members:`` that its module no longer has without a warning, so a
renamed or moved function silently drops out of the reference even under ``sphinx -W``.
"""

import importlib
import pathlib
import re

import pytest

API = pathlib.Path(__file__).parents[2] / "docs" / "api"
DIRECTIVE = re.compile(r"^\.\. automodule:: (\S+)\n((?:   :[\w-]+:.*\n)*)", re.M)
OPTION = re.compile(r"^   :(members|exclude-members):(.*)$", re.M)


def _listed_names():
    for page in sorted(API.glob("*.rst")):
        for module, options in DIRECTIVE.findall(page.read_text(encoding="utf-8")):
            for option, names in OPTION.findall(options):
                for name in filter(None, (n.strip() for n in names.split(","))):
                    yield pytest.param(module, option, name, id=f"{page.stem}:{module}.{name}")


@pytest.mark.parametrize("module, option, name", list(_listed_names()))
def test_every_listed_member_exists(module, option, name):
    if module.startswith("rfgp.integrations."):  # BoTorch is optional
        pytest.importorskip("botorch")
    assert hasattr(importlib.import_module(module), name), (
        f"docs/api lists {name!r} in :{option}: of {module}, which has no such attribute")
