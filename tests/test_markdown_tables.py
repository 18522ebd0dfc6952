"""The Markdown tables of README.md, docs/ and benchmarks/results/ render as tables.

A GitHub-flavoured Markdown table needs a delimiter row (``|---|---|``) right after its header
row, and every body row needs the header's number of cells; without the delimiter the whole
table shows as lines of text with pipes (README's headline table did, from 2d9e520 until this
test). Fenced code blocks are skipped; a table row is a line that starts and ends with ``|``. Cells are split on ``|`` not escaped as ``\\|``, as GitHub
does, code spans included.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from experiments.render import markdown_table

ROOT = Path(__file__).resolve().parents[1]
README_MAX_LINES = 120  # the team's standard: README.md stays short; the long tables live in docs/
_DELIMITER = re.compile(r"^\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$")


def markdown_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += sorted((ROOT / "docs").rglob("*.md"))
    files += sorted((ROOT / "benchmarks" / "results").rglob("*.md"))
    return [f for f in files if f.is_file()]


def cells(row: str) -> list[str]:
    """The cells of one table row: split on unescaped pipes, outer pipes dropped."""
    parts = re.split(r"(?<!\\)\|", row.strip())
    if parts and parts[0].strip() == "":
        parts = parts[1:]
    if parts and parts[-1].strip() == "":
        parts = parts[:-1]
    return parts


def tables(text: str) -> list[tuple[int, list[str]]]:
    """Each table's first line number (1-based) and its rows, outside fenced code blocks."""
    found: list[tuple[int, list[str]]] = []
    in_fence = False
    current: list[str] = []
    start = 0
    for number, line in enumerate([*text.splitlines(), ""], start=1):
        if line.lstrip().startswith("```"):
            in_fence = not in_fence
        stripped = line.strip()
        is_row = not in_fence and stripped.startswith("|") and stripped.endswith("|")
        if is_row:
            if not current:
                start = number
            current.append(line)
        elif current:
            found.append((start, current))
            current = []
    return found


def problems(text: str, name: str) -> list[str]:
    out = []
    for start, rows in tables(text):
        if len(rows) < 2 or not _DELIMITER.match(rows[1].strip()):
            out.append(f"{name}:{start}: the table has no delimiter row (|---|---|) after its header")
            continue
        width = len(cells(rows[0]))
        for offset, row in enumerate(rows[1:], start=1):
            if len(cells(row)) != width:
                out.append(f"{name}:{start + offset}: {len(cells(row))} cells where the header has {width}")
    return out


def test_the_checker_finds_a_table_without_delimiter_and_a_short_row() -> None:
    assert tables("a\n| x | y |\n|---|---|\n| 1 | 2 |\n\ntext\n") == [(2, ["| x | y |", "|---|---|", "| 1 | 2 |"])]
    assert tables("```\n| not | a table |\n```\n") == []
    assert cells(r"| a `x\|y` | b |") == [r" a `x\|y` ", " b "]
    found = problems("| m | MAE |\n| CE | 0.5 |\n\n| m | MAE |\n|:--|--:|\n| CE |\n", "x.md")
    assert len(found) == 2
    assert "no delimiter row" in found[0] and ":1:" in found[0]
    assert "1 cells where the header has 2" in found[1] and ":6:" in found[1]


def test_the_renderer_escapes_pipes_inside_cells() -> None:
    text = markdown_table(["pair", "|loss diff|"], [["a", "1e-7 (max |grad| 2e-5)"], ["b", r"already \| escaped"]])
    assert problems(text, "rendered") == []
    assert [len(cells(row)) for row in text.splitlines()] == [2, 2, 2, 2]
    assert r"(max \|grad\| 2e-5)" in text and r"already \| escaped" in text


@pytest.mark.parametrize("path", markdown_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_markdown_tables_have_a_delimiter_row_and_equal_widths(path: Path) -> None:
    assert problems(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT))) == []


def test_readme_stays_short() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) < README_MAX_LINES, f"README.md has {len(lines)} lines; keep it under {README_MAX_LINES}"
