"""One rank-0 printer (:func:`cloc_lightning._logging.print_line`) for everything the library prints during a run.

Library code that runs inside a fit/test (methods, callbacks, ``nn``) prints through it: on global rank 0 only, on a
line of its own while a progress bar is drawn.  Only the command modules (``cli/``, ``configs``, ``__main__``),
whose printed lines are the command's output, and the printer itself call ``print``.
"""

from __future__ import annotations

import ast
import io
from types import SimpleNamespace
from typing import Any

import pytest

from tests.conftest import REPO

#: the modules whose ``print`` is the command's own output (or the printer itself)
COMMAND_OUTPUT = {"cloc_lightning/_logging.py", "cloc_lightning/configs.py", "cloc_lightning/__main__.py"}


def _bare_prints() -> list[str]:
    found = []
    for path in sorted((REPO / "cloc_lightning").rglob("*.py")):
        rel = path.relative_to(REPO).as_posix()
        if rel in COMMAND_OUTPUT or rel.startswith("cloc_lightning/cli/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), rel)):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print":
                found.append(f"{rel}:{node.lineno}")
    return found


def test_library_code_prints_only_through_print_line() -> None:
    found = _bare_prints()
    assert not found, "bare print( in library code (use cloc_lightning._logging.print_line):\n" + "\n".join(found)


def _trainer(rank: int) -> Any:
    return SimpleNamespace(is_global_zero=rank == 0, progress_bar_callback=None)


def test_print_line_prints_on_rank_zero_only() -> None:
    from cloc_lightning._logging import print_line

    out = io.StringIO()
    print_line(_trainer(0), "shown", file=out)
    print_line(_trainer(1), "hidden", file=out)
    assert out.getvalue() == "shown\n"


def test_print_line_without_a_trainer_follows_lightnings_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning.pytorch.utilities import rank_zero_only

    from cloc_lightning._logging import print_line

    out = io.StringIO()
    monkeypatch.setattr(rank_zero_only, "rank", 1, raising=False)
    print_line(None, "hidden", file=out)
    monkeypatch.setattr(rank_zero_only, "rank", 0, raising=False)
    print_line(None, "shown", file=out)
    assert out.getvalue() == "shown\n"


def test_print_line_stays_importable_from_the_checkpoint_callbacks() -> None:
    from cloc_lightning._logging import print_line
    from cloc_lightning.callbacks.checkpoint import print_line as old_home

    assert old_home is print_line
