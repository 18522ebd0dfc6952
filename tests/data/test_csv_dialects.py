"""CSV files as spreadsheets write them (issue 51, item 2), generated over every dialect x every CSV reader.

Dialects: a UTF-8 byte-order mark (Excel's "CSV UTF-8"), CRLF line ends, ``;`` as the delimiter (European
locales), Excel's ``sep=;`` first line, quoted fields holding commas (and the delimiter), a trailing empty
column, and all of them at once.  Readers: ``CSVDataModule(csv_path)``, ``CSVDataModule(test_csv)`` and
``predict_root`` (a labelled CSV).  Each reads the same rows as the plain file.  A file that is not UTF-8
(Excel's legacy "CSV" in cp1252) is one line naming the byte and the fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

from cloc_lightning.data import CSVDataModule, DataConfigError
from tests.cli._tiny import png

HEADER = ["path", "label", "note"]


def _rows(folder: Path, n: int = 12) -> list[list[str]]:
    rows = []
    for i in range(n):
        name = f"img, {i}.png" if i % 3 == 0 else f"img{i}.png"  # names with commas: quoted
        png(folder / name, seed=i)
        rows.append([name, str(i % 3), f"seen by A; B, {i}"])
    return rows


def _field(value: str, delimiter: str) -> str:
    return f'"{value}"' if ("," in value or delimiter in value or '"' in value) else value


def _write(path: Path, rows: list[list[str]], *, delimiter: str = ",", newline: str = "\n", bom: bool = False,
           sep_line: bool = False, trailing: bool = False, encoding: str = "utf-8") -> Path:  # fmt: skip
    lines = [f"sep={delimiter}"] if sep_line else []
    for row in [HEADER, *rows]:
        lines.append(delimiter.join(_field(v, delimiter) for v in row) + (delimiter if trailing else ""))
    path.write_bytes(("\ufeff" if bom else "").encode(encoding) + newline.join(lines).encode(encoding) + newline.encode(encoding))
    return path


DIALECTS: dict[str, dict[str, object]] = {
    "plain": {},
    "bom": {"bom": True},
    "crlf": {"newline": "\r\n"},
    "semicolon": {"delimiter": ";"},
    "sep line": {"delimiter": ";", "sep_line": True},
    "tab": {"delimiter": "\t"},
    "trailing empty column": {"trailing": True},
    "all at once": {"bom": True, "newline": "\r\n", "delimiter": ";", "trailing": True},
}


def _csv_path(path: Path) -> list[tuple[str, int]]:
    dm = CSVDataModule(str(path), task="nominal", split_fractions=(0.5, 0.25, 0.25), batch_size=2, num_workers=0, drop_last=False)
    base = dm._ensure_base()
    return sorted(
        (Path(f).name, y) for split in ("train", "val", "test") for f, y in zip(base[split].files, base[split].targets, strict=True)
    )


def _test_csv(path: Path) -> list[tuple[str, int]]:
    dm = CSVDataModule(test_csv=str(path), task="nominal", class_names=["0", "1", "2"], batch_size=2, num_workers=0)
    test = dm._ensure_base()["test"]
    return sorted((Path(f).name, y) for f, y in zip(test.files, test.targets, strict=True))


def _predict_root(path: Path) -> list[tuple[str, int]]:
    dm = CSVDataModule(test_csv=str(path), task="nominal", class_names=["0", "1", "2"], predict_root=str(path), batch_size=2, num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dm.setup("predict")
    ds = dm.predict_set.base
    return sorted((Path(f).name, y) for f, y in zip(ds.files, ds.targets, strict=True))


READERS: dict[str, Callable[[Path], list[tuple[str, int]]]] = {"csv_path": _csv_path, "test_csv": _test_csv, "predict_root": _predict_root}


@pytest.mark.parametrize("reader", list(READERS))
@pytest.mark.parametrize("dialect", list(DIALECTS))
def test_every_reader_reads_every_spreadsheet_dialect(dialect: str, reader: str, tmp_path: Path) -> None:
    rows = _rows(tmp_path)
    want = READERS[reader](_write(tmp_path / "plain.csv", rows))
    got = READERS[reader](_write(tmp_path / "sheet.csv", rows, **DIALECTS[dialect]))  # type: ignore[arg-type]
    assert got == want and len(got) == len(rows)  # was: a missing 'path' column, or names cut at the comma


@pytest.mark.parametrize("reader", list(READERS))
def test_a_csv_that_is_not_utf8_names_the_byte_and_how_to_save_it(reader: str, tmp_path: Path) -> None:
    rows = _rows(tmp_path)
    rows[1][2] = "Zürich café"
    path = _write(tmp_path / "legacy.csv", rows, delimiter=";", encoding="cp1252")
    with pytest.raises(DataConfigError, match=r"legacy.csv' is not UTF-8 text \(byte \d+: .*save it as UTF-8 \(in Excel: 'CSV UTF-8"):
        READERS[reader](path)
