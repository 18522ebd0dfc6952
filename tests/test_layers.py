"""The package's layering (docs/extending.md, "Architecture").

A module imports only from its own layer and the layers below, no two modules import each other (directly or
round a longer circle), and every name has one home: a module's ``__all__`` lists what it defines, not names
imported from elsewhere (only the packages' ``__init__`` files gather the public API).  The import graph is
read statically from the sources, every import counted wherever it stands: at the top, inside a function or
under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from tests.conftest import REPO

PACKAGE = "cloc_lightning"

#: top-level module or subpackage -> layer (0 = top); docs/extending.md's Architecture table in the same order
LAYERS = {
    "__main__": 0,
    "cli": 0,
    "probe": 2,
    "methods": 3,
    "callbacks": 4,
    "data": 5,
    "checkpoints": 6,
    "resume": 6,
    "nn": 7,
    "losses": 8,
    "validation": 9,
    "checks": 9,
    "metrics": 9,
    "distributed": 9,
    "plots": 9,
    "_logging": 9,
    "configs": 9,
    "precision": 9,
    "data_contract": 9,
    "hub": 9,
    "threads": 9,
    "_s3_http": 9,
}

#: inside ``data/``: module -> layer (0 = top), the same rule one level down: the concrete data modules stand on
#: ``BaseDataModule``, which stands on the datasets, transforms and evaluation sharding, which stand on the label /
#: CSV / split helpers and the one error type; a helper never imports a data module
DATA_LAYERS = {
    "folder": 0,
    "csv_table": 0,
    "utkface": 0,
    "torchvision_sets": 0,
    "synthetic": 0,
    "base": 1,
    "optimize": 1,
    "stream_setup": 2,
    "streaming": 2,
    "datasets": 2,
    "cache": 2,
    "seeding": 2,
    "store_setup": 2,
    "transforms": 2,
    "eval_sharding": 2,
    "predict": 2,
    "device_augment": 3,
    "stores": 3,
    "tables": 3,
    "overlap": 3,
    "errors": 4,
}

#: inside ``cli/`` (the top layer): module -> layer (0 = top), one job a module: ``main`` and the error filter stand
#: on the LightningCLI subclass, which stands on the run records and the parser; the extra commands and the help
#: formatter are below them all (a command never imports the CLI that dispatches it)
CLI_LAYERS = {
    "entry": 0,
    "lightning_cli": 1,
    "records": 2,
    "parser": 2,
    "commands": 3,
    "helptext": 4,
}

#: the result-table runner ``experiments/`` (beside the package): module -> layer (0 = top), one job a module; it
#: imports nothing of ``benchmarks/`` or ``tests/`` (the benchmarks may import its provenance and tables, not the reverse)
EXPERIMENT_LAYERS = {
    "__main__": 0,
    "cli": 0,
    "runner": 1,
    "render": 2,
    "records": 2,
    "logs": 3,
    "stats": 3,
    "tables": 4,
    "provenance": 4,
    "paths": 5,
}

#: inside ``methods/``: the bases and the helpers every method builds on (a method module, any other, builds on them)
METHOD_BASES = {"base", "classifier", "pretrain", "momentum", "optim", "tracking", "grad_cache"}


def _module_files(root: Path, package: str = PACKAGE) -> dict[str, Path]:
    """Dotted module name -> source file, for every module of ``package`` under ``root`` (a package: its ``__init__``)."""
    files = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def import_graph(root: Path = REPO, package: str = PACKAGE) -> dict[str, dict[str, int]]:
    """``{module: {imported package module: line of the first such import}}`` over every import statement."""
    files = _module_files(root, package)
    graph: dict[str, dict[str, int]] = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        edges: dict[str, int] = {}
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:  # relative: resolved against the importing module's package
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                # `from pkg import mod` imports the module pkg.mod; `from mod import name` the module mod
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in files else base for a in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:  # `import pkg.mod.attr`-like spellings: the module part
                    target = target.rpartition(".")[0]
                if target and target != module:
                    edges.setdefault(target, node.lineno)
        graph[module] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """Circles ``[a, b, ..., a]`` of modules that import each other: in each strongly connected set, the shortest through each member."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles: list[list[str]] = []
    for component in components:  # the shortest circle through each member (breadth first), each circle once
        members = set(component)
        for start in component:
            paths = {start: [start]}
            queue = [start]
            cycle: list[str] | None = None
            while queue and cycle is None:
                v = queue.pop(0)
                for w in sorted(graph[v]):
                    if w == start:
                        cycle = [*paths[v], start]
                        break
                    if w in members and w not in paths:
                        paths[w] = [*paths[v], w]
                        queue.append(w)
            assert cycle is not None
            if not any(set(cycle) == set(c) and len(c) == len(cycle) for c in cycles):
                cycles.append(cycle)
    return cycles


def _describe(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + f" -> {cycle[-1]}"


def _top(module: str) -> str:
    return module.split(".")[1]


def _layer(module: str) -> int:
    return LAYERS[_top(module)]


def upward_imports(graph: dict[str, dict[str, int]]) -> list[str]:
    """``'a:line imports b'`` for each import of a module on a higher layer than the importer's."""
    upward = []
    for module, edges in sorted(graph.items()):
        if module == PACKAGE:
            continue  # the package's own __init__ (version, logging filters) belongs to no layer
        for target, line in sorted(edges.items()):
            if target != PACKAGE and _layer(target) < _layer(module):
                upward.append(f"{module}:{line} imports {target}")
    return upward


def test_imports_point_down() -> None:
    upward = upward_imports(import_graph())
    assert not upward, "imports that point up the layers (see docs/extending.md, Architecture):\n" + "\n".join(upward)


def test_data_helpers_never_import_a_data_module() -> None:
    """``data/``'s modules follow :data:`DATA_LAYERS`: every one has a layer there and imports only its own or lower ones."""
    graph = import_graph()
    prefix = f"{PACKAGE}.data."
    modules = {m.removeprefix(prefix) for m in graph if m.startswith(prefix)}
    assert modules == set(DATA_LAYERS), f"data/ modules without a layer in DATA_LAYERS: {sorted(modules - set(DATA_LAYERS))}"
    upward = [
        f"{prefix}{m}:{line} imports {target}"
        for m in sorted(modules)
        for target, line in sorted(graph[prefix + m].items())
        if target.startswith(prefix) and DATA_LAYERS[target.removeprefix(prefix)] < DATA_LAYERS[m]
    ]
    assert not upward, "data/ imports that point up (see DATA_LAYERS):\n" + "\n".join(upward)


def test_cli_modules_import_down() -> None:
    """``cli/``'s modules follow :data:`CLI_LAYERS`: every one has a layer there and imports only its own or lower ones."""
    graph = import_graph()
    prefix = f"{PACKAGE}.cli."
    modules = {m.removeprefix(prefix) for m in graph if m.startswith(prefix)}
    assert modules == set(CLI_LAYERS), f"cli/ modules without a layer in CLI_LAYERS: {sorted(modules ^ set(CLI_LAYERS))}"
    upward = [
        f"{prefix}{m}:{line} imports {target}"
        for m in sorted(modules)
        for target, line in sorted(graph[prefix + m].items())
        if target == PACKAGE + ".cli" or (target.startswith(prefix) and CLI_LAYERS[target.removeprefix(prefix)] < CLI_LAYERS[m])
    ]
    assert not upward, "cli/ imports that point up (see CLI_LAYERS; a module never imports the package's __init__):\n" + "\n".join(upward)


def test_method_bases_import_no_method() -> None:
    """The bases of ``methods/`` (:data:`METHOD_BASES`: ``BaseModule``, ``PretrainModule``, ``MomentumModule``, their
    helpers) import no method module: a method builds on them, never the reverse."""
    graph = import_graph()
    prefix = f"{PACKAGE}.methods."
    up = [
        f"{module}:{line} imports {target}"
        for module, edges in sorted(graph.items())
        if module.startswith(prefix) and module.removeprefix(prefix) in METHOD_BASES
        for target, line in sorted(edges.items())
        if target.startswith(prefix) and target.removeprefix(prefix) not in METHOD_BASES
    ]
    assert not up, "a base of methods/ imports a method (add a new helper module to METHOD_BASES):\n" + "\n".join(up)
    missing = {name for name in METHOD_BASES if f"{prefix}{name}" not in graph}
    assert not missing, f"METHOD_BASES names modules that do not exist: {sorted(missing)}"


def test_no_import_cycles() -> None:
    graph = import_graph()
    cycles = [_describe(c, graph) for c in import_cycles(graph)]
    assert not cycles, "modules that import each other:\n" + "\n".join(cycles)


def test_no_import_cycles_between_layer_units() -> None:
    """Importing ``pkg.mod`` runs ``pkg/__init__`` too: the top-level units (``methods``, ``probe``, ...) form no circle."""
    graph = import_graph()
    units: dict[str, dict[str, int]] = {}
    for module, edges in graph.items():
        if module == PACKAGE:
            continue
        unit = units.setdefault(_top(module), {})
        for target, line in edges.items():
            if target != PACKAGE and _top(target) != _top(module):
                unit.setdefault(_top(target), line)
    cycles = [" -> ".join(c) for c in import_cycles(units)]
    assert not cycles, "parts of the package that import each other:\n" + "\n".join(cycles)


def test_all_lists_only_names_defined_here() -> None:
    """One name, one home: outside the packages' ``__init__`` files, ``__all__`` names what the module defines."""
    foreign = []
    for module, path in _module_files(REPO).items():
        if path.name == "__init__.py":
            continue
        tree = ast.parse(path.read_text(), str(path))
        defined: set[str] = set()
        exported: list[str] = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names = {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
                defined |= names
                if "__all__" in names and isinstance(node.value, (ast.List, ast.Tuple)):
                    exported += [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
        foreign += [f"{module}.__all__: {name}" for name in exported if name not in defined]
    assert not foreign, "names exported by a module that does not define them (import them from their home):\n" + "\n".join(foreign)


def test_every_module_has_a_layer() -> None:
    tops = {
        p.stem if p.is_file() else p.name
        for p in (REPO / PACKAGE).iterdir()
        if (p.suffix == ".py" or (p.is_dir() and (p / "__init__.py").is_file()))
    }
    assert tops - {"__init__"} <= set(LAYERS), sorted(tops - {"__init__"} - set(LAYERS))


#: the most lines a module of the package may have (one job a module; issue 41 item 2)
MAX_MODULE_LINES = 650
#: modules still over it, each with the most lines it may have until it is split (never more: the list only shrinks;
#: empty since data/base.py's predict_root reader moved to data/predict.py)
STILL_LONG: dict[str, int] = {}


def test_no_module_over_650_lines() -> None:
    sizes = {p.relative_to(REPO).as_posix(): len(p.read_text().splitlines()) for p in _module_files(REPO).values()}
    long = sorted(f"{path}: {n} lines" for path, n in sizes.items() if n > STILL_LONG.get(path, MAX_MODULE_LINES))
    assert not long, f"modules over {MAX_MODULE_LINES} lines (split them, one job a module):\n" + "\n".join(long)
    done = sorted(path for path in STILL_LONG if sizes.get(path, 0) <= MAX_MODULE_LINES)
    assert not done, f"no longer over {MAX_MODULE_LINES} lines: take them off STILL_LONG: {done}"


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The reader counts function-level, ``TYPE_CHECKING``, ``from pkg import mod`` and relative imports."""
    pkg = tmp_path / PACKAGE
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "sub" / "__init__.py").write_text("from cloc_lightning.sub.b import B\n")
    (pkg / "a.py").write_text("def f():\n    from cloc_lightning.sub import b\n")
    (pkg / "sub" / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .c import C\nclass B: ...\n")
    (pkg / "sub" / "c.py").write_text("import cloc_lightning.a\n")
    graph = import_graph(tmp_path)
    assert graph == {
        "cloc_lightning": {},
        "cloc_lightning.a": {"cloc_lightning.sub.b": 2},
        "cloc_lightning.sub": {"cloc_lightning.sub.b": 1},
        "cloc_lightning.sub.b": {"cloc_lightning.sub.c": 3},
        "cloc_lightning.sub.c": {"cloc_lightning.a": 1},
    }
    assert import_cycles(graph) == [["cloc_lightning.a", "cloc_lightning.sub.b", "cloc_lightning.sub.c", "cloc_lightning.a"]]


def _imported_tops(path: Path) -> set[str]:
    """The top-level names a source file imports (absolute imports), wherever the import stands."""
    tops: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            tops |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_the_experiment_runner_is_layered_and_stands_alone() -> None:
    """``experiments/`` follows :data:`EXPERIMENT_LAYERS` (no circle, no import up), imports nothing of ``benchmarks/``
    or ``tests/``, and the library imports neither of them."""
    graph = import_graph(REPO, "experiments")
    modules = {m.removeprefix("experiments.") for m in graph if m != "experiments"}
    assert modules == set(EXPERIMENT_LAYERS), f"experiments/ modules without a layer: {sorted(modules ^ set(EXPERIMENT_LAYERS))}"
    up = [
        f"{module}:{line} imports {target}"
        for module, edges in sorted(graph.items())
        if module != "experiments"
        for target, line in sorted(edges.items())
        if target != "experiments"
        and EXPERIMENT_LAYERS[target.removeprefix("experiments.")] < EXPERIMENT_LAYERS[module.removeprefix("experiments.")]
    ]
    assert not up, "experiments/ imports that point up (see EXPERIMENT_LAYERS):\n" + "\n".join(up)
    assert not import_cycles(graph), import_cycles(graph)
    foreign = sorted(
        f"{p.relative_to(REPO)} imports {top}"
        for p in _module_files(REPO, "experiments").values()
        for top in _imported_tops(p) & {"benchmarks", "tests"}
    )
    assert not foreign, "the runner imports the benchmarks or the tests:\n" + "\n".join(foreign)
    tooling = sorted(
        f"{p.relative_to(REPO)} imports {top}"
        for p in _module_files(REPO).values()
        for top in _imported_tops(p) & {"experiments", "benchmarks", "tests"}
    )
    assert not tooling, "the library imports the repository's tooling:\n" + "\n".join(tooling)


def test_no_private_lightning_name_is_imported() -> None:
    """Public Lightning APIs only: no ``_name`` imported from ``lightning`` / ``pytorch_lightning`` (modules or names)."""
    private = []
    for module, path in _module_files(REPO).items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("lightning", "pytorch_lightning"):
                dotted = [*(node.module or "").split("."), *(a.name for a in node.names)]
            elif isinstance(node, ast.Import):
                dotted = [
                    part for a in node.names if a.name.split(".")[0] in ("lightning", "pytorch_lightning") for part in a.name.split(".")
                ]
            else:
                continue
            if any(part.startswith("_") for part in dotted):
                private.append(f"{module}:{node.lineno} imports {'.'.join(dotted)}")
    assert not private, "private Lightning names imported (use a public API):\n" + "\n".join(private)


def test_one_import_path_per_class() -> None:
    """No module imports the package by a string (``importlib.import_module("cloc_lightning....")``): such imports hide
    from the layer checks above (issue 50, item 7: ``methods/base.py``'s module ``__getattr__`` handed out
    ``ClassifierModule`` of its own subclass's module that way; a ``__getattr__`` that only explains a removed name stays)."""
    import re

    hidden = []
    for path in sorted((REPO / PACKAGE).rglob("*.py")):
        text = path.read_text()
        if re.search(r"""import_module\(\s*f?["']cloc_lightning""", text):
            hidden.append(str(path.relative_to(REPO)))
    assert not hidden, f"string imports of the package in: {hidden}"
    import cloc_lightning.methods.base as base

    assert not hasattr(base, "ClassifierModule")  # one home: cloc_lightning.methods (.classifier)
