"""Strip outputs from notebooks before committing them (the test suite checks that they are stripped).

Usage (from the repository root)::

    python notebooks/strip_outputs.py notebooks/*.ipynb          # strip in place
    python notebooks/strip_outputs.py --check notebooks/*.ipynb  # exit 1 if one still has outputs

Stripping empties every code cell's ``outputs``, sets ``execution_count`` to null, drops the
``execution`` timing metadata (nbclient writes it) and the notebook-level ``widgets`` state. The
rest of the notebook stays as it is.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import nbformat

__all__ = ["strip_notebook", "unstripped_cells", "main"]


def unstripped_cells(nb: Any) -> list[int]:
    """Indices of the cells that still carry outputs, execution counts or execution metadata."""
    bad = []
    for i, cell in enumerate(nb.cells):
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs") or cell.get("execution_count") is not None or "execution" in cell.get("metadata", {}):
            bad.append(i)
    return bad


def strip_notebook(nb: Any) -> bool:
    """Strip ``nb`` in place; return whether anything changed."""
    changed = False
    for cell in nb.cells:
        if cell.get("cell_type") != "code":
            continue
        if cell.get("outputs"):
            cell["outputs"] = []
            changed = True
        if cell.get("execution_count") is not None:
            cell["execution_count"] = None
            changed = True
        if "execution" in cell.get("metadata", {}):
            del cell["metadata"]["execution"]
            changed = True
    if "widgets" in nb.metadata:
        del nb.metadata["widgets"]
        changed = True
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("notebooks", nargs="+", type=Path, help=".ipynb files")
    parser.add_argument("--check", action="store_true", help="only report; exit 1 if a notebook has outputs")
    args = parser.parse_args(argv)
    dirty = []
    for path in args.notebooks:
        nb = nbformat.read(str(path), as_version=4)
        if args.check:
            cells = unstripped_cells(nb)
            if cells:
                dirty.append(f"{path}: cells {cells} have outputs")
        elif strip_notebook(nb):
            nbformat.write(nb, str(path))
            print(f"stripped {path}")
    if dirty:
        print("\n".join(dirty) + "\nrun: python notebooks/strip_outputs.py notebooks/*.ipynb", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
