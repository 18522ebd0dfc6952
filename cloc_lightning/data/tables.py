"""Labels, CSV tables and hash splits: how the data modules turn file names and label text into classes and splits.

* :func:`hash_split` / :func:`hash_fraction`: deterministic splits by a hash of each sample's key
  (independent of file order, the OS and the other files);
* :func:`label_indices`: the one rule by which a label's text (a class folder's name, a CSV label)
  becomes a class index;
* :func:`integer_label`, :func:`is_number`, :func:`class_order`: label text as class indices and,
  for ordinal data, the rank order of labels that came without one;
* :func:`read_csv_rows` / :class:`CSVRows`: the one CSV reader (``CSVDataModule``, ``predict_root``).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.metrics import Task

__all__ = [
    "hash_fraction",
    "hash_split",
    "integer_label",
    "is_number",
    "class_order",
    "label_indices",
    "CSVRows",
    "read_csv_rows",
]


def hash_fraction(key: str, salt: str = "") -> float:
    """A deterministic number in [0, 1) from ``key`` (md5; independent of file order or OS)."""
    digest = hashlib.md5((salt + key).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def hash_split(keys: Sequence[str], fractions: Sequence[float], salt: str = "") -> list[int]:
    """Assign each key to split ``0..len(fractions)-1`` by :func:`hash_fraction`.

    ``fractions`` are normalised to sum to 1.  The assignment of a key never
    depends on the other keys, so adding files does not move existing ones.
    """
    f = np.asarray(fractions, dtype=np.float64)
    if (f < 0).any() or f.sum() <= 0:
        raise DataConfigError(f"split fractions must be >= 0 with a positive sum, got {list(fractions)}")
    edges = np.cumsum(f / f.sum())
    last = len(f) - 1
    return [min(int(np.searchsorted(edges, hash_fraction(k, salt), side="right")), last) for k in keys]


_INTEGER = re.compile(r"^[+-]?\d+(\.0*)?$")
_NUMBER = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_DIGITS = re.compile(r"(\d+)")


def integer_label(value: str) -> int | None:
    """The integer a label names (``'3'``, ``'-1'``, ``'3.0'``), or ``None`` when it names no integer."""
    text = value.strip()
    return int(float(text)) if _INTEGER.match(text) else None


def label_indices(labels: Sequence[str], class_names: Sequence[str], *, numbered: bool) -> list[int | None]:
    """The class index each label text names (``None``: no class of ``class_names``), by one rule for every reader.

    * ``numbered=False``: the labels *are* the class names (class folders, string CSV labels): a label is
      the position of its text in ``class_names``, so ``'2'`` names the folder ``2``, never class index 2;
    * ``numbered=True``: the labels are class indices ``0..C-1`` and ``class_names`` only names them
      (integer CSV labels, the built-in data sets): a column of integers (``'3'``, ``'3.0'``) is read as
      indices, ``None`` outside ``[0, C)``; a column with any other label is read by name, every label of it.

    Surrounding white space is ignored.  The data modules say which holds for their labels
    (``BaseDataModule.labels_are_indices``); ``ImageFolderDataModule``, ``CSVDataModule`` and ``predict_root``
    CSVs all read labels through this function.
    """
    texts = [v.strip() for v in labels]
    if numbered and all(integer_label(v) is not None for v in texts if v):
        return [i if (i := integer_label(v) if v else None) is not None and 0 <= i < len(class_names) else None for v in texts]
    lookup = {name: c for c, name in enumerate(class_names)}
    return [lookup.get(v) for v in texts]


def is_number(value: str) -> bool:
    """Whether a label is written as a (finite) number: ``'2'``, ``'2.5'``, ``'.5'``, ``'1e3'``."""
    return bool(_NUMBER.match(value.strip()))


def _natural_key(name: str) -> tuple[tuple[int, ...], str]:
    """``'15-24'`` -> ``((15, 24), '-')``: the numbers in a name, compared as numbers, then the rest."""
    parts = _DIGITS.split(name)
    return tuple(int(p) for p in parts[1::2]), "".join(parts[0::2])


def _shown(names: Sequence[str], limit: int = 12) -> str:
    """``[a, b, c]`` (YAML flow style, as typed on the command line), shortened after ``limit`` names."""
    head = ", ".join(names[:limit])
    return f"[{head}{', ...' if len(names) > limit else ''}]"


def class_order(labels: Sequence[str], task: Task, *, noun: str, where: str, key: str) -> list[str]:
    """The class order of distinct labels that came without one (CSV labels, class folder names).

    * ``nominal``: sorted (the order of nominal classes carries no meaning), as always;
    * ``ordinal``, every label a number: by value (``2 < 10``, ``0.5 < 1.5``);
    * ``ordinal``, every label starting with a number: naturally, the numbers in the names
      compared as numbers (``0-3 < 4-7 < 15-24 < 60+``);
    * ``ordinal`` otherwise (or two names with the same numbers): a :class:`DataConfigError`
      naming the labels and ``key`` (the argument that gives the rank order) -- for ordinal
      data the order is the label, so it is never guessed from the spelling.

    ``noun`` and ``where`` name the labels in the message (``"string labels"``, ``"in the
    'label' column of 'x.csv'"``).
    """
    found = sorted(labels)
    if task != "ordinal":
        return found
    if all(is_number(v) for v in found):
        return sorted(found, key=lambda v: (float(v), v))
    unnumbered = [v for v in found if not v[:1].isdigit()]
    if not unnumbered:
        ordered = sorted(found, key=_natural_key)
        numbers = [_natural_key(v)[0] for v in ordered]
        if len(set(numbers)) == len(numbers):
            return ordered
        reason = "some differ only in their words, so their numbers do not rank them"
    elif len(unnumbered) < len(found):
        reason = f"{unnumbered[:5]}{' ...' if len(unnumbered) > 5 else ''} do not start with a number to rank them by"
    else:
        reason = "none starts with a number to rank them by"
    raise DataConfigError(
        f"task is ordinal but the {noun} {found[:12]}{' ...' if len(found) > 12 else ''} {where} have no order "
        f"({reason}), and an alphabetical rank would be wrong; give data.{key} with these {len(found)} labels in rank "
        f"order, lowest first, e.g. --data.{key} '{_shown(found)}' rearranged into rank order (or set data.task: "
        "nominal if the classes have no order)"
    )


@dataclass(frozen=True)
class CSVRows:
    """The rows of a CSV file with a header row, as :func:`read_csv_rows` read them."""

    #: the CSV file
    path: Path
    #: the header's column names, stripped of surrounding white space
    columns: list[str]
    #: one ``{column: value}`` per row, values stripped ('' where a row has fewer fields than the header)
    rows: list[dict[str, str]]
    #: the CSV line number of each row (blank lines skipped), as error messages name the rows
    lines: list[int]

    def files(self, column: str, base: Path) -> list[str]:
        """The paths of ``column``, relative to ``base`` (absolute paths stay as they are)."""
        return [str(base / r[column]) for r in self.rows]

    def missing(self, files: Sequence[str], column: str) -> list[int]:
        """The indices of the rows whose path (``column``; its file in ``files``) is empty or not a file."""
        return [i for i, (r, f) in enumerate(zip(self.rows, files, strict=True)) if not r[column] or not os.path.isfile(f)]

    def describe(self, indices: Sequence[int], column: str, label: str | None = None, limit: int = 5) -> str:
        """``line <n>: '<path>'`` (with ``label``: ``... (label '<v>')``) for the first ``limit`` of the rows
        ``indices``, then ``; ... and <k> more row(s)``."""
        shown = "; ".join(
            f"line {self.lines[i]}: {self.rows[i][column]!r}" + (f" (label {self.rows[i][label]!r})" if label else "")
            for i in indices[:limit]
        )
        return shown + (f"; ... and {len(indices) - limit} more row(s)" if len(indices) > limit else "")


def read_csv_rows(
    path: Path,
    columns: Sequence[str],
    *,
    name: str,
    fix: str,
    no_column: str,
    no_rows_fix: str = "",
    column_keys: Mapping[str | None, str] | None = None,
) -> CSVRows:
    """Read the CSV file ``path`` (a header row, then one row per line) that must have ``columns``.

    Column names and values are stripped of surrounding white space; a row with fewer fields
    than the header reads '' for the rest, one with more has the extra fields ignored.  Files as
    spreadsheets write them are read: a UTF-8 byte-order mark, CRLF line ends, ``;`` (or tab) as the
    delimiter when the header holds more of them than commas, Excel's ``sep=;`` first line, quoted
    fields that hold commas, and empty columns (a trailing delimiter).  Text that is not UTF-8 is
    refused naming the byte and how to save the file as UTF-8.

    Args:
        path: the CSV file.
        columns: the column names it must have.
        name: how error messages name the file (``"CSV file"``, ``"predict_root CSV"``).
        fix: what to do when the file does not exist (the end of that message).
        no_column: the message for a missing column, a ``str.format`` template with the fields
            ``path``, ``column``, ``columns`` (the header's names) and ``key`` (the setting that named the column:
            ``column_keys[column]``, else the column).
        no_rows_fix: what to do when the file has no rows ('' for nothing).

    Raises:
        DataConfigError: the file does not exist, lacks one of ``columns`` or has no rows.
    """
    if not path.is_file():
        raise DataConfigError(f"{name} {str(path)!r} does not exist; {fix}")
    try:
        text = path.read_text(encoding="utf-8-sig")  # Excel's "CSV UTF-8" starts with a byte-order mark
    except UnicodeDecodeError as e:
        raise DataConfigError(
            f"{name} {str(path)!r} is not UTF-8 text (byte {e.start}: {e.object[e.start : e.start + 1]!r}); save it as UTF-8 "
            "(in Excel: 'CSV UTF-8 (Comma delimited)'; in LibreOffice: character set Unicode (UTF-8))"
        ) from e
    lines_in = text.splitlines(keepends=True)
    skipped = 0
    delimiter = None
    if lines_in and lines_in[0].strip().lower().startswith("sep=") and len(lines_in[0].strip()) == 5:  # Excel's "sep=;" line
        delimiter, skipped = lines_in[0].strip()[4], 1
    first = next((ln for ln in lines_in[skipped:] if ln.strip()), "")
    if delimiter is None:  # the header's own separator: ',' or, as spreadsheets of many locales write, ';' (or a tab)
        counts = {d: first.count(d) for d in (",", ";", "\t")}
        delimiter = max(counts, key=lambda d: (counts[d], d == ","))
    with io.StringIO("".join(lines_in[skipped:]), newline="") as f:
        reader = csv.DictReader(f, delimiter=delimiter)
        header = [c.strip() for c in reader.fieldnames or []]
        for column in columns:
            if column not in header:
                key = (column_keys or {}).get(column, column)
                raise DataConfigError(no_column.format(path=str(path), column=column, columns=header, key=key))
        rows, lines = [], []
        for row in reader:
            rows.append({k.strip(): (v or "").strip() for k, v in row.items() if isinstance(k, str) and k.strip()})
            lines.append(reader.line_num + skipped)
    if not rows:
        raise DataConfigError(f"{name} {str(path)!r} has no rows" + (f"; {no_rows_fix}" if no_rows_fix else ""))
    return CSVRows(path, header, rows, lines)
