"""The package layout is the architecture: no module imports from a layer above its own.

Layers, bottom to top (``rfgp/__init__.py`` explains them): core < features < inference < kernels
< likelihoods < training < models < applications < pyro, integrations, demo.  ``metrics`` and
``datasets`` are leaf utilities on top of core.  Every ``import`` statement counts, including
those inside functions (a lazy import still makes the lower layer depend on the higher one).
"""

import ast
from pathlib import Path

import pytest

import rfgp

PACKAGE = Path(rfgp.__file__).parent
LAYERS = {
    "core": 0, "metrics": 1, "datasets": 1, "features": 2, "inference": 3, "kernels": 4, "likelihoods": 5,
    "training": 6, "models": 7, "applications": 8, "pyro": 8, "integrations": 9, "demo": 10, "__main__": 11,
}
#: the package root wires everything together and keeps the old module paths
EXEMPT = {"rfgp", "rfgp._aliases"}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer(module: str) -> int:
    top = module.split(".")[1]
    return LAYERS[top]


def imported_modules(path: Path, module: str):
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if target == "rfgp":  # from rfgp import x: x is the layer
                yield from (f"rfgp.{alias.name}" for alias in node.names)
            elif target.startswith("rfgp."):
                yield target
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name.startswith("rfgp."))


MODULES = sorted((module_name(p), p) for p in PACKAGE.rglob("*.py"))


def test_every_folder_and_top_level_module_has_a_layer():
    tops = {name.split(".")[1] for name, _ in MODULES if name not in EXEMPT}
    assert tops <= set(LAYERS), f"modules without a layer: {tops - set(LAYERS)}"


@pytest.mark.parametrize("module,path", [(m, p) for m, p in MODULES if m not in EXEMPT], ids=lambda v: str(v))
def test_imports_only_from_the_same_or_a_lower_layer(module, path):
    upward = [target for target in imported_modules(path, module) if layer(target) > layer(module)]
    assert not upward, f"{module} (layer {module.split('.')[1]}) imports from higher layers: {upward}"


def test_at_most_a_dozen_modules_at_the_top():
    assert len(list(PACKAGE.glob("*.py"))) <= 12
