"""Where the runner's files live, and how a record names a path so that it reads the same on every machine.

A run's record (``result.json``, the table's ``runs[]``) names

* a path under the run folders (``--runs-dir``) as ``$RUNS/<row>/seed<S>/...``,
* a path under the data (``--data-root``) as ``$DATA/<data set>/...``,
* any other path in the repository relative to its root (``configs/ce/utkface.yaml``),
* the interpreter of a ``python -m cloc_lightning`` command as ``python``.

With ``RUNS`` and ``DATA`` set in the shell, a recorded command runs again as written, from the repository root.
Records written before this rule (absolute paths of the machine that ran them) are read as they are and written
back in this form: their own run folder and ``--data.root`` say which prefixes to replace (:func:`relative_record`).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "benchmarks" / "results" / "experiments"
DEFAULT_DATA = Path(os.environ.get("CLOC_SHARED_DATA", REPO.parent / "shared" / "data"))

#: how a record names the run folders' root (``--runs-dir``) and the data root (``--data-root``)
RUNS, DATA = "$RUNS", "$DATA"
#: how a record names the interpreter of a ``python -m cloc_lightning`` command
PYTHON = "python"

#: record fields that are free text (an error message, a log's tail), not paths
_TEXT = frozenset({"error", "log_tail"})

__all__ = ["REPO", "DEFAULT_OUT", "DEFAULT_DATA", "RUNS", "DATA", "PYTHON", "relative", "relative_record", "repo_relative"]


def _spellings(path: Path | str) -> set[str]:
    """A folder as given and as an absolute path (a relative ``--runs-dir`` is relative to the repository root)."""
    text = str(path).rstrip("/") or "/"
    return {text, os.path.abspath(text), str(Path(text).resolve())}


def relative(value: str, roots: Sequence[tuple[str, str]]) -> str:
    """``value`` with the first of ``roots`` (``(prefix, name)``, longest prefix first) it lies under replaced by ``name``.

    A ``name`` of ``""`` makes the path relative to the prefix (the repository); a string under no root is returned as it is.
    """
    for prefix, name in roots:
        if value == prefix:
            return name or "."
        if value.startswith(prefix.rstrip("/") + "/"):
            rest = value[len(prefix.rstrip("/")) + 1 :]
            return f"{name}/{rest}" if name else rest
    return value


def _old_runs_root(run_dir: Any, row: Any, seed: Any) -> str | None:
    """The run folders' root of a recorded absolute ``<root>/<row>/seed<S>``, or ``None``."""
    if not isinstance(run_dir, str) or not os.path.isabs(run_dir):
        return None
    p = Path(run_dir)
    return str(p.parent.parent) if p.name == f"seed{seed}" and p.parent.name == row else None


def _roots(rec: dict[str, Any], runs_dir: Path | None, data_root: Path | None, data_subdir: str) -> list[tuple[str, str]]:
    """The prefixes a record's paths are written relative to: its run folders, its data root, the repository."""
    roots: dict[str, str] = {}
    for path, name in ((data_root, DATA), (runs_dir, RUNS)):
        if path is not None:
            roots.update(dict.fromkeys(_spellings(path), name))
    # an old record's own machine: where its run folder and its data were
    for old in (rec.get("run_dir"), (rec.get("restored_from") or {}).get("run_dir")):
        root = _old_runs_root(old, rec.get("row"), rec.get("seed"))
        if root is not None:
            roots.setdefault(root, RUNS)
    for cmd in rec.get("commands") or []:
        for flag, value in itertools.pairwise(cmd):
            if flag == "--data.root" and os.path.isabs(value) and Path(value).name == data_subdir:
                roots.setdefault(str(Path(value).parent), DATA)
    roots.update(dict.fromkeys(_spellings(REPO), ""))
    return sorted(roots.items(), key=lambda kv: -len(kv[0]))


def _walk(value: Any, roots: Sequence[tuple[str, str]], key: str | None = None) -> Any:
    if isinstance(value, dict):
        return {k: v if k in _TEXT else _walk(v, roots, k) for k, v in value.items()}
    if isinstance(value, list):
        if key == "commands":
            return [_command(c, roots) if isinstance(c, list) else _walk(c, roots) for c in value]
        return [_walk(v, roots) for v in value]
    if isinstance(value, str):
        return relative(value, roots)
    return value


def _command(cmd: list[Any], roots: Sequence[tuple[str, str]]) -> list[Any]:
    out = [_walk(a, roots) for a in cmd]
    if len(out) > 2 and out[1:3] == ["-m", "cloc_lightning"]:
        out[0] = PYTHON  # whichever interpreter ran it: the one of the environment the command is run in
    return out


def relative_record(rec: dict[str, Any], runs_dir: Path | None, data_root: Path | None, data_subdir: str) -> dict[str, Any]:
    """A copy of a run's record with every path in the relative form of this module's rule (see the module's docstring).

    ``runs_dir``/``data_root``: this machine's run folders' root and data root (``None`` where unknown); an old record's
    absolute ``run_dir`` (``<root>/<row>/seed<S>``) and ``--data.root <root>/<data_subdir>`` name the roots of the machine
    that wrote it.  Free text (``error``, ``log_tail``) is kept as it is.  Applying it twice changes nothing.
    """
    return dict(_walk(rec, _roots(rec, runs_dir, data_root, data_subdir)))


def repo_relative(path: Path) -> str:
    """``path`` relative to the git checkout that holds it (this one, or another checkout or worktree of the
    repository, e.g. ``main`` when the runner runs in a worktree), so a record names the committed file the
    same way on every machine; absolute when no checkout holds it."""
    path = path.resolve()
    for root in (REPO, *path.parents):
        if (root / ".git").exists() and path.is_relative_to(root):
            return str(path.relative_to(root))
    return str(path)
