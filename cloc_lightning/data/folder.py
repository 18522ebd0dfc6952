"""Data modules for a user's own images: a class-per-folder tree (here) or a CSV of paths and labels (:mod:`.csv_table`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lightning.pytorch.utilities import rank_zero_warn

from cloc_lightning.data.base import BaseDataModule
from cloc_lightning.data.datasets import IMAGE_EXTENSIONS, ImageFileDataset, LabelledDataset
from cloc_lightning.data.errors import DataConfigError, check_root_for_stage, check_split_fractions, check_val_fraction, config_errors
from cloc_lightning.data.overlap import overlap_message, shared_with_training
from cloc_lightning.data.tables import (
    class_order,
    hash_split,
    label_indices,
)
from cloc_lightning.metrics import Task
from cloc_lightning.validation import check_choice

__all__ = ["ImageFolderDataModule"]


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
        self.split_fractions = check_split_fractions(split_fractions)
        self.dirs = {"train": train_dir, "val": val_dir, "test": test_dir}
        for split, name in self.dirs.items():
            if not isinstance(name, str) or not name.strip() or os.sep in name.strip(os.sep) or name in (".", ".."):
                raise DataConfigError(
                    f"--data.{split}_dir {name!r}: the name of the {split} split's folder under data.root (one name, "
                    f"like the default {split!r}), not a path; point data.root at the folder that holds it"
                )

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
        if (path / self.dirs["train"]).is_dir():
            for split in ("val", "test"):
                where = path / self.dirs[split]
                if self.dirs[split] != split and not where.is_dir() and not (split == "test" and self.test_root is not None):
                    raise DataConfigError(f"--data.{split}_dir {self.dirs[split]!r}: no folder {str(where)!r}; {_names_here(path)}")
            return True
        if self.dirs["train"] != "train":  # named, so the split layout is meant: never read root's folders as classes
            raise DataConfigError(
                f"--data.train_dir {self.dirs['train']!r}: no folder {str(path / self.dirs['train'])!r}; {_names_here(path)}"
            )
        return False

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
                        f"{str(path)!r} has a {self.dirs['train']!r} folder but no {self.dirs['test']!r} folder "
                        "(data.test_dir); add it, or give data.test_root"
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


def _names_here(path: Path) -> str:
    """What ``path`` holds, for an error naming a split folder that is not there."""
    names = sorted(p.name for p in path.iterdir() if p.is_dir())[:8] if path.is_dir() else []
    return f"folders in data.root: {', '.join(names) or 'none'}"
