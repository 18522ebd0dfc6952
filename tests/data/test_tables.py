"""Labels, CSV tables and hash splits (``cloc_lightning.data.tables``): the helpers every file-based data module reads with."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import numpy as np
import pytest

from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.tables import class_order, hash_fraction, hash_split, integer_label, is_number, read_csv_rows


# ---------------------------------------------------------------- hash splits
def test_hash_split_fractions() -> None:
    keys = [f"f{i}.jpg" for i in range(4000)]
    split = hash_split(keys, (0.7, 0.1, 0.2))
    counts = np.bincount(split, minlength=3) / len(keys)
    assert np.allclose(counts, [0.7, 0.1, 0.2], atol=0.03)
    assert hash_split(keys[:10], (0.7, 0.1, 0.2)) == split[:10]
    with pytest.raises(DataConfigError, match="fractions"):
        hash_split(keys, (0, 0))


def test_hash_fraction_is_the_md5_of_salt_and_key() -> None:
    """The number of a key is fixed by its name alone (md5, first 8 bytes), so a split never moves between machines."""
    for key, salt in (("a.jpg", ""), ("a.jpg", "val"), ("img/10.png", "subsample")):
        expected = int(hashlib.md5((salt + key).encode("utf-8")).hexdigest()[:16], 16) / 2**64
        assert hash_fraction(key, salt) == expected and 0.0 <= expected < 1.0
    assert hash_fraction("a.jpg") != hash_fraction("a.jpg", "val")
    with pytest.raises(DataConfigError, match=r"split fractions must be >= 0 with a positive sum, got \[0.5, -0.1\]"):
        hash_split(["a"], (0.5, -0.1))


# ---------------------------------------------------------------- labels
@pytest.mark.parametrize(
    ("text", "expected"), [("3", 3), ("-1", -1), ("+2", 2), (" 3.0 ", 3), ("7.", 7), ("3.5", None), ("1e3", None), ("x", None), ("", None)]
)
def test_integer_label(text: str, expected: int | None) -> None:
    assert integer_label(text) == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2", True),
        ("2.5", True),
        (".5", True),
        ("1e3", True),
        (" -3 ", True),
        ("x", False),
        ("", False),
        ("inf", False),
        ("nan", False),
        ("1.2.3", False),
    ],
)
def test_is_number(text: str, expected: bool) -> None:
    assert is_number(text) is expected


def test_class_order_nominal_sorted_ordinal_by_value_or_by_the_numbers_in_the_names() -> None:
    def order(labels: list[str], task: str = "ordinal") -> list[str]:
        return class_order(labels, task, noun="string labels", where="in here", key="class_names")  # type: ignore[arg-type]

    assert order(["young", "adult", "old"], "nominal") == ["adult", "old", "young"]
    assert order(["10", "2", "0.5"], "nominal") == ["0.5", "10", "2"]
    assert order(["10", "2", "0.5"]) == ["0.5", "2", "10"]
    assert order(["15-24", "0-3", "60+", "4-7", "8-14"]) == ["0-3", "4-7", "8-14", "15-24", "60+"]


@pytest.mark.parametrize(
    ("labels", "reason"),
    [
        (["young", "adult", "old"], "none starts with a number to rank them by"),
        (["1 a", "1 b"], "some differ only in their words, so their numbers do not rank them"),
        (["1", "y", "x"], "['x', 'y'] do not start with a number to rank them by"),
    ],
)
def test_class_order_never_guesses_an_ordinal_order(labels: list[str], reason: str) -> None:
    shown = ", ".join(sorted(labels))
    with pytest.raises(DataConfigError) as info:
        class_order(labels, "ordinal", noun="string labels", where="in here", key="class_names")
    assert str(info.value) == (
        f"task is ordinal but the string labels {sorted(labels)} in here have no order ({reason}), and an alphabetical "
        f"rank would be wrong; give data.class_names with these {len(labels)} labels in rank order, lowest first, e.g. "
        f"--data.class_names '[{shown}]' rearranged into rank order (or set data.task: nominal if the classes have no order)"
    )


# ---------------------------------------------------------------- the CSV reader
def _read(path: Path, columns: tuple[str, ...] = ("path", "label"), no_rows_fix: str = "list one image per row") -> object:
    return read_csv_rows(
        path,
        columns,
        name="CSV file",
        fix="set data.csv_path",
        no_column="{path!r} has no {column!r} column (columns: {columns})",
        no_rows_fix=no_rows_fix,
    )


def test_read_csv_rows_strips_skips_blank_lines_and_fills_short_rows(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text(" path , label \n a.png , 1 \n\nb.png\nc.png,2,extra\n")
    (tmp_path / "a.png").write_bytes(b"")
    table = read_csv_rows(path, ["path", "label"], name="CSV file", fix="", no_column="")
    assert table.path == path and table.columns == ["path", "label"]
    assert table.rows == [{"path": "a.png", "label": "1"}, {"path": "b.png", "label": ""}, {"path": "c.png", "label": "2"}]
    assert table.lines == [2, 4, 5]
    files = table.files("path", tmp_path)
    assert files == [str(tmp_path / n) for n in ("a.png", "b.png", "c.png")]
    assert table.missing(files, "path") == [1, 2]
    assert table.describe([1, 2], "path", "label") == "line 4: 'b.png' (label ''); line 5: 'c.png' (label '2')"
    assert table.describe([1, 2], "path", limit=1) == "line 4: 'b.png'; ... and 1 more row(s)"


def test_read_csv_rows_errors_name_the_file_and_the_fix(tmp_path: Path) -> None:
    absent = tmp_path / "absent.csv"
    with pytest.raises(DataConfigError, match=re.escape(f"CSV file {str(absent)!r} does not exist; set data.csv_path")):
        _read(absent)
    no_label = tmp_path / "no_label.csv"
    no_label.write_text("path\na.png\n")
    with pytest.raises(DataConfigError, match=re.escape(f"{str(no_label)!r} has no 'label' column (columns: ['path'])")):
        _read(no_label)
    empty = tmp_path / "empty.csv"
    empty.write_text("path,label\n\n")
    with pytest.raises(DataConfigError, match=re.escape(f"CSV file {str(empty)!r} has no rows; list one image per row")):
        _read(empty)
    with pytest.raises(DataConfigError, match=re.escape(f"CSV file {str(empty)!r} has no rows") + "$"):
        _read(empty, no_rows_fix="")
