"""The CSV data module: images listed in a CSV file with path and label columns (and a test CSV of one's own)."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import ImageFileDataset, LabelledDataset
from cloc_lightning.data.errors import DataConfigError, check_root_for_stage, check_split_fractions, config_errors
from cloc_lightning.data.overlap import overlap_message, shared_with_training
from cloc_lightning.data.tables import (
    CSVRows,
    class_order,
    hash_split,
    integer_label,
    is_number,
    label_indices,
    read_csv_rows,
)
from cloc_lightning.metrics import Task
from cloc_lightning.validation import check_choice, check_int

__all__ = ["CSVDataModule"]


class CSVDataModule(BaseDataModule):
    """Images listed in a CSV file with a path and a label column (and optionally a split column).

    Labels may be integers ``0..C-1`` (also written ``3.0``) or strings; strings are mapped
    to classes by ``class_names``; without it nominal labels take sorted order, and ordinal
    labels rank by value (numbers such as ``0.5, 1.5``) or by their leading numbers (``0-3,
    4-7, 15-24``); other ordinal string labels need ``class_names`` (an error says so, never
    an alphabetical rank), and a non-integer among integer labels is an error naming its
    rows.  With a ``split_column`` its values ``train``/``val``/``test`` assign the splits,
    otherwise a hash of the path does (``split_fractions``).

    Every row's image must exist at setup: missing ones are an error listing the count and
    the first rows, or with ``bad_files: skip`` are left out of every split with a warning.

    A labelled table of one's own (a held-out set, a second site) is evaluated with
    ``test_csv``: a CSV with the same path and label columns (relative paths from its own
    folder), whose every row is a test image.  Its labels are matched to the training
    classes by the same rule as the training CSV's (a name is a name, an integer an index),
    and a second site may lack classes.  With ``csv_path`` too, ``test_csv`` replaces the
    test split: without a split column the rows are split into train/val by the first two
    ``split_fractions``; with one, the rows marked ``test`` are not used (a warning counts
    them); files shared with the training split are counted in a warning.  Without
    ``csv_path`` only ``test`` (and ``predict``) can run; the classes are ``class_names`` (or
    ``num_classes`` for integer labels), else ``test_csv``'s own labels, and the
    checkpoint's classes are checked against them when it is loaded.

    The number of classes of integer labels is ``num_classes``, else the length of
    ``class_names``, else ``max label + 1``; in the last case every class ``0..max`` must
    have images, so a stray label (a ``9`` in a ``0..4`` data set) is an error naming its
    rows rather than five silently added empty classes.  Labels outside ``[0,
    num_classes)`` and empty labels are errors naming their rows (CSV line numbers, paths).

    Args:
        csv_path: the CSV file (with a header row; ``None``: test / predict alone on ``test_csv``).
        root: base folder of the training CSV's relative paths (default: the CSV's folder).
        path_column: name of the column holding the image paths.
        label_column: name of the column holding the labels.
        split_column: name of the optional column holding each row's split.
        task: ``'ordinal'`` or ``'nominal'``.
        class_names: label names in class order (string labels) or display names.
        num_classes: the number of classes; set it to accept classes without images
            (``None``: from ``class_names`` or the labels, see above).
        split_fractions: ``(train, val, test)`` when there is no split column.
        test_csv: evaluate on this CSV instead of the test split (see above).
        **kwargs: :class:`BaseDataModule` arguments.
    """

    def __init__(
        self,
        csv_path: str | None = None,
        root: str | None = None,
        path_column: str = "path",
        label_column: str = "label",
        split_column: str | None = None,
        task: Task = "ordinal",
        class_names: list[str] | None = None,
        num_classes: int | None = None,
        split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
        test_csv: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        with config_errors():
            self.task = check_choice("task", task, Task)
            if num_classes is not None:
                check_int("num_classes", num_classes, 2, hint="or null to infer it from the labels")
        if num_classes is not None and class_names and len(class_names) != num_classes:
            raise DataConfigError(
                f"num_classes={num_classes} but class_names has {len(class_names)} names; give one name per class "
                "or leave num_classes unset"
            )
        self.csv_path = csv_path
        self.test_csv = test_csv
        if root is not None and not str(root).strip():
            raise DataConfigError("--data.root '': an empty folder name; leave it unset (null) for the CSV's own folder")
        self.root = root
        self.columns = (path_column, label_column, split_column)
        self.given_class_names = class_names
        self.given_num_classes = num_classes
        self.split_fractions = check_split_fractions(split_fractions)
        self._table: CSVRows | None = None
        self._test_table: CSVRows | None = None
        self._integer_labels = False

    def setup(self, stage: str | None = None) -> None:
        """As :meth:`BaseDataModule.setup`; without ``csv_path`` only ``test`` (and ``predict``) can run, on ``test_csv``."""
        if self.csv_path is None:
            check_root_for_stage(
                type(self).__name__,
                stage,
                self.test_csv,
                "a CSV file with a path and a label column",
                predict_alone=False,
                without_root="data.test_csv (test and predict)",
                root_key="data.csv_path",
                test_key="data.test_csv",
            )
        super().setup(stage)

    def _defining_csv(self) -> str:
        """The CSV whose labels define the classes: the training CSV, or ``test_csv`` alone."""
        path = self.csv_path if self.csv_path is not None else self.test_csv
        if path is None:
            raise DataConfigError(
                "CSVDataModule: data.csv_path is not set; set it to the training CSV, or data.test_csv to evaluate a CSV alone"
            )
        return path

    def class_source(self) -> str:
        return f" in the {self.columns[1]!r} column of {self._defining_csv()!r} (or data.class_names)"

    def class_mismatch_hint(self) -> str:
        """A second site alone may lack classes: say what restores the training classes."""
        if self.csv_path is None and not self.given_class_names and self.given_num_classes is None:
            return (
                f"; test_csv {self.test_csv!r} alone gives its own labels as the classes: give data.class_names (the "
                "training classes in label order; data.num_classes for integer labels) or data.csv_path (the training "
                "CSV) so a site lacking classes keeps their indices"
            )
        return ""

    def _read_csv(self, path: str, setting: str, columns: Sequence[str]) -> CSVRows:
        return read_csv_rows(
            Path(os.path.expanduser(path)),
            columns,
            name="CSV file" if setting == "data.csv_path" else "test_csv",
            fix=f"set {setting}",
            no_column=(
                "--data.{key} {column!r}: no such column in {path} (its columns: {columns}); give one of the header's names "
                f"({setting})"
            ),
            column_keys=dict(zip(self.columns, ("path_column", "label_column", "split_column"), strict=True)),
        )

    def _read(self) -> CSVRows:
        """The rows of the CSV that defines the classes (read once; :func:`~cloc_lightning.data.tables.read_csv_rows`)."""
        if self._table is None:
            if self.csv_path is None:
                return self._read_test()
            self._table = self._read_csv(self.csv_path, "data.csv_path", [c for c in self.columns if c is not None])
        return self._table

    def _read_test(self) -> CSVRows:
        """``test_csv``'s rows (its path and label columns; a split column is not read)."""
        assert self.test_csv is not None
        if self._test_table is None:
            self._test_table = self._read_csv(self.test_csv, "data.test_csv", self.columns[:2])
        return self._test_table

    def _label_rows(self, wanted: Callable[[str], bool]) -> str:
        """``line <n>: <path> (label <v>)`` for the first rows whose label satisfies ``wanted``."""
        path_col, label_col, _ = self.columns
        table = self._read()
        return table.describe([i for i, r in enumerate(table.rows) if wanted(r[label_col])], path_col, label_col)

    def _label_map(self) -> dict[str, int]:
        """Label -> class index, for every distinct (stripped) label of the label column.

        Integer labels (``3``, also written ``3.0``) are class indices; other labels are names,
        ordered by ``class_names``, else by :func:`~cloc_lightning.data.tables.class_order`
        (ordinal: by value or by their leading numbers, otherwise an error asking for
        ``class_names``; nominal: sorted).  A non-integer number among integer labels (``2.5``
        in ``0..11``) is an error naming its rows.
        """
        label_col = self.columns[1]
        where = f"the {label_col!r} column of {self._defining_csv()!r}"
        values = sorted({r[label_col] for r in self._read().rows})
        if "" in values:
            raise DataConfigError(f"{where} has empty labels: {self._label_rows(lambda v: not v)}; fill them in or remove those rows")
        ints = {v: integer_label(v) for v in values}
        self._integer_labels = all(i is not None for i in ints.values())
        if self._integer_labels:
            return self._integer_label_map(values, {v: i for v, i in ints.items() if i is not None}, where)
        fractional = [v for v in values if ints[v] is None and is_number(v)]
        if fractional and not self.given_class_names and any(i is not None for i in ints.values()):
            raise DataConfigError(
                f"{where} holds integer class indices and {len(fractional)} non-integer label(s) "
                f"{fractional[:5]}{' ...' if len(fractional) > 5 else ''}: {self._label_rows(lambda v: v in fractional)}. "
                "Class indices are whole numbers 0..C-1: fix those rows, or give data.class_names with every label "
                "in rank order to use the labels as class names"
            )
        if self.given_class_names:
            names = list(self.given_class_names)
        else:
            if self.given_num_classes is not None and self.given_num_classes != len(values):
                raise DataConfigError(
                    f"num_classes={self.given_num_classes} but {where} has {len(values)} distinct string labels "
                    f"{values[:10]}; give class_names with one name per class (classes without images included) or "
                    "fix num_classes"
                )
            names = class_order(values, self.task, noun="string labels", where=f"in {where}", key="class_names")
        unknown = [v for v in values if v not in names]
        if unknown:
            raise DataConfigError(
                f"labels {unknown[:5]} are not in class_names {names} ({self._label_rows(lambda v: v in unknown)}); "
                "fix those rows or add the names to class_names"
            )
        if self.given_num_classes is not None and self.given_num_classes != len(names):
            raise DataConfigError(
                f"num_classes={self.given_num_classes} but {where} has {len(names)} distinct string labels {names[:10]}; "
                "give class_names with one name per class (classes without images included) or fix num_classes"
            )
        indices = label_indices(values, names, numbered=False)  # each value is a name (checked above)
        return {v: c for v, c in zip(values, indices, strict=True) if c is not None}

    def labels_are_indices(self) -> bool:
        """Integer labels are class indices (``class_names`` names them); string labels are the class names."""
        self._label_map()
        return self._integer_labels

    def _integer_label_map(self, values: list[str], ints: dict[str, int], where: str) -> dict[str, int]:
        """Integer labels (``ints``: label -> integer): checked against ``num_classes`` / ``class_names``, or free
        of classes without images."""
        numbers = sorted(set(ints.values()))
        given = self.given_num_classes or (len(self.given_class_names) if self.given_class_names else None)
        if given is not None:
            bad = {v for v in values if not 0 <= ints[v] < given}
            if bad:
                source = f"num_classes={given}" if self.given_num_classes else f"class_names has {given} names"
                raise DataConfigError(
                    f"integer labels must lie in [0, {given}) ({source}); {where} has labels "
                    f"{sorted({ints[v] for v in bad})[:10]} in rows {self._label_rows(lambda v: v in bad)}. "
                    "Fix those rows, or raise data.num_classes (and class_names) if the data has more classes"
                )
            n = given
        else:
            if numbers[0] < 0:
                negative = {v for v in values if ints[v] < 0}
                raise DataConfigError(
                    f"integer labels must be >= 0; {where} has negative labels in rows "
                    f"{self._label_rows(lambda v: v in negative)}. Fix those rows (labels are class indices 0..C-1)"
                )
            n = numbers[-1] + 1
            present = set(numbers)
            empty = [c for c in range(n) if c not in present]
            if empty:
                unexpected = {v for v in values if ints[v] > empty[0]}
                hint = " (labels start at 1: class indices are 0-based, subtract 1)" if empty == [0] else ""
                raise DataConfigError(
                    f"the integer labels of {where} leave classes {empty[:10]}{' ...' if len(empty) > 10 else ''} "
                    f"without images{hint}: labels {sorted({ints[v] for v in unexpected})[:10]} come after the gap, in rows "
                    f"{self._label_rows(lambda v: v in unexpected)}. "
                    f"Fix those rows, or set data.num_classes to accept empty classes (e.g. data.num_classes: {n})"
                )
        return {str(i): i for i in range(n)} | dict(ints)

    def discover_class_names(self) -> list[str]:
        if self.given_class_names:
            self._label_map()
            return list(self.given_class_names)
        mapping = self._label_map()
        n = self.given_num_classes or max(mapping.values()) + 1
        if self._integer_labels:
            return [str(i) for i in range(n)]
        inverse = {v: k for k, v in mapping.items()}
        return [inverse.get(i, str(i)) for i in range(n)]

    def _existing(self, table: CSVRows, files: list[str], base: Path, setting: str) -> list[int] | None:
        """Check that every row's image exists (at setup, not when training reaches the row).

        Returns ``None`` when all exist; with ``bad_files: skip`` the indices of the rows whose
        image exists (the others are left out of every split, with one warning); otherwise, or
        when no image exists at all, a :class:`DataConfigError` with the count and the first rows.
        """
        path_col = self.columns[0]
        missing = table.missing(files, path_col)
        if not missing:
            return None
        shown = table.describe(missing, path_col)
        what = f"{len(missing)} of {len(files)} image(s) listed in {str(table.path)!r} ({setting}) do not exist"
        where = f"(paths are relative to {str(base)!r}): {shown}"
        if setting == "data.test_csv":
            base_fix = "write them relative to the test CSV's own folder (or absolute)"
        else:
            base_fix = "set data.root to the folder the paths are relative to (default: the CSV's folder)"
        if len(missing) == len(files):
            raise DataConfigError(f"{what} {where}; {base_fix}")
        if self.bad_files != "skip":
            raise DataConfigError(
                f"{what} {where}; fix those paths ({base_fix}), or set data.bad_files: skip to leave the rows whose "
                "image does not exist out (with a warning)"
            )
        return self._skip(
            len(files),
            missing,
            f"left out {len(missing)} row(s) of {str(table.path)!r} whose image does not exist ({len(files) - len(missing)} kept) {where}",
        )

    def _test_csv_set(self, mapping: dict[str, int]) -> tuple[list[str], list[int]]:
        """``test_csv``'s images with the training classes' indices; a label that names no class is refused with its rows."""
        table = self._read_test()
        path_col, label_col, _ = self.columns
        assert self.class_names is not None
        n = len(self.class_names)

        def index(value: str) -> int | None:
            if self._integer_labels:  # the training labels are class indices: so are the site's
                i = integer_label(value)
                return i if i is not None and 0 <= i < n else None
            return mapping.get(value)

        labels = [index(r[label_col]) for r in table.rows]
        unknown = [i for i, c in enumerate(labels) if c is None]
        if unknown:
            kind = f"class indices 0..{n - 1}" if self._integer_labels else f"the class names {list(self.class_names)[:10]}"
            raise DataConfigError(
                f"test_csv {str(table.path)!r}: {len(unknown)} row(s) have a label that is no training class "
                f"({table.describe(unknown, path_col, label_col)}); its labels must be {kind}, as in the training data: "
                "fix those rows (a site may lack classes, not add them)"
            )
        known = [c for c in labels if c is not None]  # every label (checked above)
        files = table.files(path_col, table.path.parent)
        kept = self._existing(table, files, table.path.parent, "data.test_csv")
        indices = list(range(len(files))) if kept is None else kept
        return [files[i] for i in indices], [known[i] for i in indices]

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.class_names = self.discover_class_names()
        mapping = self._label_map()
        test = self._test_csv_set(mapping) if self.test_csv is not None else None
        if self.csv_path is None:  # test alone on test_csv (setup refuses every other stage)
            assert test is not None
            return {
                "train": ImageFileDataset([], [], self.bad_files),
                "val": ImageFileDataset([], [], self.bad_files),
                "test": ImageFileDataset(*test, self.bad_files),
            }
        table = self._read()
        rows = table.rows
        base = Path(os.path.expanduser(self.root)) if self.root else table.path.parent
        path_col, label_col, split_col = self.columns
        files = table.files(path_col, base)
        labels = [mapping[r[label_col]] for r in rows]
        kept = self._existing(table, files, base, "data.csv_path")
        if kept is not None:
            rows, files, labels = [rows[i] for i in kept], [files[i] for i in kept], [labels[i] for i in kept]
        if split_col is not None:
            names = {"train": 0, "val": 1, "valid": 1, "validation": 1, "test": 2}
            bad = sorted({r[split_col] for r in rows if r[split_col].lower() not in names})
            if bad:
                raise DataConfigError(f"split column {split_col!r} has values {bad}; use train, val or test")
            split = [names[r[split_col].lower()] for r in rows]
            unused = split.count(2) if test is not None else 0
            if unused:
                rank_zero_warn(
                    f"data.test_csv {self.test_csv!r} replaces the test split: the {unused} row(s) of {self.csv_path!r} whose "
                    f"{split_col!r} is test are neither trained on nor tested; leave data.test_csv out to test on them"
                )
        else:
            # with test_csv the rows are train + val only, by the first two fractions
            fractions = self.split_fractions if test is None else self.split_fractions[:2]
            split = hash_split([r[path_col] for r in rows], fractions)
        sets = {
            name: (
                [f for f, s in zip(files, split, strict=True) if s == i],
                [y for y, s in zip(labels, split, strict=True) if s == i],
            )
            for i, name in enumerate(("train", "val", "test"))
        }
        if test is not None:
            sets["test"] = test
            overlap = shared_with_training(sets["train"][0], test[0])
            if overlap:
                message = overlap_message(
                    overlap, len(test[0]), str(self.test_csv), str(self.csv_path), test_key="test_csv", root_key="data.csv_path", fix="CSV"
                )
                rank_zero_warn(message)
        return {k: ImageFileDataset(f, y, self.bad_files) for k, (f, y) in sets.items()}
