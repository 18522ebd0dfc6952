"""The package's layering (docs/extending.md, "Architecture"): a module imports only from its own layer and the layers below."""

from __future__ import annotations

import ast

from tests.conftest import REPO

#: top-level module or subpackage -> layer (0 = top); README's Architecture table in the same order
LAYERS = {
    "cli": 0, "commands": 0, "probe": 0, "__main__": 0,
    "methods": 1,
    "callbacks": 2,
    "data": 3,
    "checkpoints": 4, "resume": 4,
    "nn": 5,
    "losses": 6,
    "validation": 7, "checks": 7, "metrics": 7, "distributed": 7, "plots": 7, "_logging": 7, "configs": 7, "precision": 7,
}


def _layer(module: str) -> int:
    return LAYERS[module.split(".")[1]]


def test_imports_point_down() -> None:
    package = REPO / "cloc_lightning"
    upward = []
    for path in sorted(package.rglob("*.py")):
        rel = path.relative_to(REPO).with_suffix("")
        if rel.name == "__init__" and len(rel.parts) == 2:
            continue  # the package's own __init__ re-exports the public API
        module = ".".join(rel.parts)
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            for target in targets:
                if target.startswith("cloc_lightning.") and _layer(target) < _layer(module):
                    upward.append(f"{module}:{node.lineno} imports {target}")
    assert not upward, "imports that point up the layers (see docs/extending.md, Architecture):\n" + "\n".join(upward)


def test_every_module_has_a_layer() -> None:
    tops = {p.stem if p.is_file() else p.name for p in (REPO / "cloc_lightning").iterdir()
            if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))}
    assert tops - {"__init__"} <= set(LAYERS), sorted(tops - {"__init__"} - set(LAYERS))
