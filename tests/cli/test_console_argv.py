"""Every CLI test runs with ``sys.argv`` as on the console, set once in ``tests/cli/conftest.py``."""

from __future__ import annotations

import re
import sys

from tests.conftest import REPO


def test_every_cli_test_sees_the_console_argv() -> None:
    assert sys.argv == ["cloc-lightning"]


def test_no_cli_test_module_sets_argv_itself() -> None:
    """One fixture, not a copy per module (``_console_argv``, ``_quiet_argv``, ... used to be four)."""
    pattern = re.compile(r"""setattr\(\s*(?:"sys\.argv"|sys,\s*"argv")""")
    copies = sorted(p.name for p in (REPO / "tests" / "cli").glob("test_*.py") if pattern.search(p.read_text()))
    assert not copies, f"set sys.argv in tests/cli/conftest.py only: {copies}"
