"""Data modules for a user's own images: a class-per-folder tree or a CSV of paths and labels."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import IMAGE_EXTENSIONS, ImageFileDataset, LabelledDataset
from cloc_lightning.data.errors import DataConfigError, check_root_for_stage, check_val_fraction, config_errors
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

__all__ = ["ImageFolderDataModule", "CSVDataModule"]


def _class_dirs(path: Path) -> list[str]:
    return sorted(d.name for d in path.iterdir() if d.is_dir() and not d.name.startswith("."))


def _scan(path: Path, class_names: Sequence[str]) -> tuple[list[str], list[int]]:
    files, labels = [], []
    for c, name in enumerate(class_names):
        d = path / name
        if not d.is_dir():
            continue
        for p in sorted(d.rglob("*")):
            if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS):
                files.append(str(p))
                labels.append(c)
    return files, labels


class ImageFolderDataModule(BaseDataModule):
    """Images in ``<root>/<split>/<class>/*.jpg`` (or ``<root>/<class>/*.jpg``).

    Layouts:

    * ``root/train/<class>/...`` and ``root/test/<class>/...`` (and optionally
      ``root/val/<class>/...``): the given splits; without ``val/``, ``val_fraction``
      of ``train`` is held out by a hash of the file name.
    * ``root/<class>/...``: one pool split into train/val/test by ``split_fractions``.

    A labelled folder of one's own (a held-out set, a second site) is evaluated with
    ``test_root``: ``<test_root>/<class>/...`` with sub-folders named after training classes.
    A second site may lack some classes; its images keep the training classes' indices
    (matched by name, never by position).  With ``root`` too, the test split is
    ``test_root`` (``root``'s own ``test`` folder, or the pool's test share, is not used: the
    pool is split into train/val by the first two ``split_fractions``), and ``test_root`` is
    compared with the training split (a warning counts shared files, by name or content).
    Without ``root`` only ``test`` (and ``predict``) can run; the classes are ``class_order``
    or else ``test_root``'s folders, and the checkpoint's classes are checked against them
    when it is loaded (a folder lacking a class then asks for ``class_order``).

    Args:
        root: the folder (``None``: test / predict alone on ``test_root`` / ``predict_root``).
        task: ``'nominal'`` (top-1/top-5 metrics) or ``'ordinal'`` (MAE, QWK, ...).
        class_order: class folder names in label order (e.g. ``['young', 'adult', 'old']``).
            Default: sorted folder names for nominal data; for ordinal data folder names
            that start with numbers rank by them (``0-3, 4-7, 8-14, 15-24``), and names
            without numbers need ``class_order`` (an error says so; never an alphabetical rank).
        val_fraction: held-out share of ``train`` when there is no ``val`` folder.
        split_fractions: ``(train, val, test)`` for the single-pool layout.
        train_dir: name of the training split's folder under ``root``.
        val_dir: name of the validation split's folder (absent: ``val_fraction`` of train).
        test_dir: name of the test split's folder.
        test_root: evaluate on this folder of class sub-folders instead of the test split (see above).
        **kwargs: :class:`BaseDataModule` arguments.

    Example: the CIFAR-10 JPEG copy in ``../shared/data/cifar10`` (``train/``, ``test/``).
    """

    default_mean = (0.4914, 0.4822, 0.4465)
    default_std = (0.2470, 0.2435, 0.2616)

    def __init__(
        self,
        root: str | None = None,
        task: Task = "nominal",
        class_order: list[str] | None = None,
        val_fraction: float = 0.1,
        split_fractions: tuple[float, float, float] = (0.7, 0.1, 0.2),
        train_dir: str = "train",
        val_dir: str = "val",
        test_dir: str = "test",
        test_root: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        with config_errors():
            self.task = check_choice("task", task, Task)
        self.val_fraction = check_val_fraction(val_fraction)
        self.root = root
        self.test_root = test_root
        self.class_order = class_order
        self.split_fractions = tuple(split_fractions)
        self.dirs = {"train": train_dir, "val": val_dir, "test": test_dir}

    def setup(self, stage: str | None = None) -> None:
        """As :meth:`BaseDataModule.setup`; without ``root`` only ``test`` (and ``predict``) can run, on ``test_root``."""
        if self.root is None:
            layout = "<root>/<train|test>/<class>/*.jpg or <root>/<class>/*.jpg"
            alone = self.predict_root is not None and self.class_order is not None  # predict_root's targets need the classes
            without = "data.test_root (test) / data.predict_root with data.class_order (predict)"
            check_root_for_stage(type(self).__name__, stage, self.test_root, layout, predict_alone=alone, without_root=without)
        super().setup(stage)

    def _root(self) -> Path:
        if self.root is None:
            raise DataConfigError("ImageFolderDataModule: data.root is not set; set it, or give data.class_order to evaluate without it")
        path = Path(os.path.expanduser(self.root))
        if not path.is_dir():
            raise DataConfigError(
                f"image folder root {str(path)!r} does not exist or is not a directory; "
                "point data.root at <root>/<train|test>/<class>/*.jpg or <root>/<class>/*.jpg"
            )
        return path

    def _test_root(self) -> Path:
        assert self.test_root is not None
        path = Path(os.path.expanduser(self.test_root))
        if not path.is_dir():
            raise DataConfigError(
                f"test_root {str(path)!r} does not exist or is not a directory; point data.test_root at <folder>/<class>/*.jpg"
            )
        return path

    def _class_base(self) -> Path:
        """The folder whose sub-folders are the classes: the training split's, or ``test_root`` without ``root``."""
        if self.root is None and self.test_root is not None:
            return self._test_root()
        path = self._root()
        return path / self.dirs["train"] if self._split_layout() else path

    def class_source(self) -> str:
        return f" in {str(self._class_base())!r} (one sub-folder per class: <root>/<train|test>/<class>/*.jpg or <root>/<class>/*.jpg)"

    def _split_layout(self) -> bool:
        path = self._root()
        return (path / self.dirs["train"]).is_dir()

    def discover_class_names(self) -> list[str]:
        if self.root is None and self.class_order is not None:
            return list(self.class_order)  # test / predict alone: the training classes as configured
        base = self._class_base()
        found = _class_dirs(base)
        if not found:
            raise DataConfigError(f"no class folders in {str(base)!r}; expected <class>/*.jpg sub-folders")
        if self.class_order is None:
            return class_order(found, self.task, noun="class folders", where=f"in {str(base)!r}", key="class_order")
        missing = [c for c in self.class_order if c not in found]
        extra = [c for c in found if c not in self.class_order]
        if missing or extra:
            raise DataConfigError(
                f"class_order does not match the folders in {str(base)!r}: missing folders {missing}, folders not in class_order {extra}"
            )
        return list(self.class_order)

    def class_mismatch_hint(self) -> str:
        """Added to the fix of a class mismatch with the model or checkpoint: a second site alone may lack classes."""
        if self.root is None and self.class_order is None and self.test_root is not None:
            return (
                f"; test_root {self.test_root!r} alone gives its own folders as the classes: give data.class_order "
                "(the training classes in label order) or data.root (the training folder) so a site lacking classes keeps their indices"
            )
        return ""

    def labels_are_indices(self) -> bool:
        """``False``: the class folders' names are the labels (a predict CSV's ``2`` names the folder ``2``)."""
        return False

    def build_predict_set(self) -> LabelledDataset:
        """``predict_root`` as the base class reads it; a folder whose every image lies in a class sub-folder
        (``<predict_root>/<class>/...``, the training classes' names) gets those classes as targets.

        A folder where only some images lie in class sub-folders is predicted without targets,
        and a warning counts the others.
        """
        ds = super().build_predict_set()
        assert self.predict_root is not None
        root = Path(os.path.expanduser(self.predict_root))
        if not isinstance(ds, ImageFileDataset) or ds.labelled or root.suffix.lower() == ".csv":
            return ds
        names = self.class_names or self.discover_class_names()
        tops = [Path(f).relative_to(root).parts for f in ds.files]
        named = label_indices([parts[0] for parts in tops], names, numbered=False)
        classes = [c if len(parts) > 1 else None for c, parts in zip(named, tops, strict=True)]
        if all(c is not None for c in classes):
            return ImageFileDataset(ds.files, [int(c) for c in classes if c is not None], "raise")
        if any(c is not None for c in classes):
            other = [str(Path(*parts)) for parts, c in zip(tops, classes, strict=True) if c is None]
            rank_zero_warn(
                f"predict_root {str(root)!r}: {len(other)} of {len(classes)} image(s) are not in a sub-folder named after "
                f"a class {list(names)[:10]} (e.g. {other[:3]}), so predictions.csv has no target column; move them "
                "into their class folders to get targets",
            )
        return ds

    def _scan_test_root(self, class_names: Sequence[str]) -> tuple[list[str], list[int]]:
        """``test_root``'s images with the indices of ``class_names``; sub-folders that are no class and loose images are refused."""
        path = self._test_root()
        unknown = [d for d in _class_dirs(path) if d not in class_names]
        if unknown:
            raise DataConfigError(
                f"test_root {str(path)!r} has sub-folders that are not training classes: {unknown[:10]} "
                f"(the classes: {list(class_names)[:10]}); rename or remove them (a class is matched by its folder name)"
            )
        loose = sorted(p.name for p in path.iterdir() if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS))
        if loose:
            raise DataConfigError(
                f"test_root {str(path)!r} has {len(loose)} image(s) outside the class sub-folders (e.g. {loose[:3]}), "
                "which have no label; move them into <test_root>/<class>/, or use data.predict_root for unlabelled images"
            )
        files, labels = _scan(path, class_names)
        if not files:
            raise DataConfigError(f"no images in the class sub-folders of test_root {str(path)!r} ({list(class_names)[:10]})")
        return files, labels

    def build_base_sets(self) -> dict[str, LabelledDataset]:
        self.class_names = self.discover_class_names()
        if self.root is None:  # test alone on test_root (setup refuses every other stage)
            test = self._scan_test_root(self.class_names)
            return {
                "train": ImageFileDataset([], [], self.bad_files),
                "val": ImageFileDataset([], [], self.bad_files),
                "test": ImageFileDataset(*test, self.bad_files),
            }
        sets = self._root_sets(self._root())
        if self.test_root is not None:
            sets["test"] = self._scan_test_root(self.class_names)
            overlap = shared_with_training(sets["train"][0], sets["test"][0])
            if overlap:
                # once per job, not once per process (every rank sets up the same data)
                rank_zero_warn(overlap_message(overlap, len(sets["test"][0]), self.test_root, str(self.root)))
        return {k: ImageFileDataset(f, y, self.bad_files) for k, (f, y) in sets.items()}

    def _root_sets(self, path: Path) -> dict[str, tuple[list[str], list[int]]]:
        """``{split: (files, labels)}`` of ``root`` (without ``test`` when ``test_root`` replaces it)."""
        assert self.class_names is not None
        sets: dict[str, tuple[list[str], list[int]]] = {}
        if self._split_layout():
            train = _scan(path / self.dirs["train"], self.class_names)
            if not train[0]:
                raise DataConfigError(f"no images in {str(path / self.dirs['train'])!r}")
            test_dir = path / self.dirs["test"]
            if self.test_root is None:
                if not test_dir.is_dir():
                    raise DataConfigError(
                        f"{str(path)!r} has a {self.dirs['train']!r} folder but no {self.dirs['test']!r} folder; "
                        "add it, or give data.test_root"
                    )
                sets["test"] = _scan(test_dir, self.class_names)
            if (path / self.dirs["val"]).is_dir():
                sets["train"], sets["val"] = train, _scan(path / self.dirs["val"], self.class_names)
            else:
                split = hash_split(
                    [os.path.basename(f) + str(y) for f, y in zip(*train, strict=True)], (1 - self.val_fraction, self.val_fraction)
                )
                for i, name in enumerate(("train", "val")):
                    sets[name] = (
                        [f for f, s in zip(train[0], split, strict=True) if s == i],
                        [y for y, s in zip(train[1], split, strict=True) if s == i],
                    )
        else:
            files, labels = _scan(path, self.class_names)
            if not files:
                raise DataConfigError(f"no images under {str(path)!r}")
            # with test_root the pool is train + val only, by the first two fractions
            fractions = self.split_fractions if self.test_root is None else self.split_fractions[:2]
            split = hash_split([os.path.relpath(f, path) for f in files], fractions)
            for i, name in enumerate(("train", "val", "test")[: len(fractions)]):
                sets[name] = (
                    [f for f, s in zip(files, split, strict=True) if s == i],
                    [y for y, s in zip(labels, split, strict=True) if s == i],
                )
        return sets


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
        self.root = root
        self.columns = (path_column, label_column, split_column)
        self.given_class_names = class_names
        self.given_num_classes = num_classes
        self.split_fractions = tuple(split_fractions)
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
            no_column=f"column {{column!r}} not in {{path!r}} (columns: {{columns}}); set the *_column arguments ({setting})",
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
