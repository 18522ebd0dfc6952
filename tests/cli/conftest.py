"""Fixtures of every CLI test."""

from __future__ import annotations

from collections.abc import Iterator

import pytest


@pytest.fixture(autouse=True)
def console_argv(monkeypatch: pytest.MonkeyPatch) -> None:
    """``sys.argv`` as on the console: ``cloc-lightning`` alone (LightningCLI warns when it holds pytest's arguments
    besides ``args``, and the CLI reads ``--debug`` from it)."""
    monkeypatch.setattr("sys.argv", ["cloc-lightning"])


@pytest.fixture(scope="module")
def module_console_argv() -> Iterator[None]:
    """:func:`console_argv` for a module-scoped fixture (which runs before, and outside, the per-test one)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("sys.argv", ["cloc-lightning"])
        yield
