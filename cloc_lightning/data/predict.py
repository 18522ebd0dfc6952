"""The images of ``predict_root``: a folder of images (unlabelled) or a CSV of paths, with an optional ``label`` column.

:func:`read_predict_root` is what :meth:`BaseDataModule.build_predict_set <cloc_lightning.data.base.BaseDataModule.build_predict_set>`
returns; a CSV's labels become class indices by :func:`~cloc_lightning.data.tables.label_indices`, the rule the
data module's own labels follow.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from pathlib import Path

from cloc_lightning.data.datasets import IMAGE_EXTENSIONS, ImageFileDataset
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.tables import CSVRows, integer_label, label_indices, read_csv_rows

__all__ = ["read_predict_root", "predict_labels"]


def read_predict_root(predict_root: str, classes: Callable[[], tuple[Sequence[str], bool]]) -> ImageFileDataset:
    """The images of ``predict_root``: a folder (unlabelled) or a CSV of paths (labelled with a ``label`` column).

    ``classes()`` gives the data module's ``(class_names, labels_are_indices)``, asked only for a CSV
    with a ``label`` column (see :func:`predict_labels`).

    Raises:
        DataConfigError: a missing folder or CSV, no images, no ``path`` column, missing
            files or labels outside the data module's classes; the message names the fix.
    """
    root = Path(os.path.expanduser(predict_root))
    if root.suffix.lower() == ".csv":
        return _predict_csv(root, classes)
    if not root.is_dir():
        raise DataConfigError(
            f"predict_root {str(root)!r} does not exist or is not a directory; point data.predict_root at a "
            "folder of images or at a .csv file with a 'path' column (or leave it unset to predict the test split)"
        )
    files = sorted(
        (p for p in root.rglob("*") if p.is_file() and p.name.lower().endswith(IMAGE_EXTENSIONS)),
        key=lambda p: p.relative_to(root).as_posix(),
    )
    if not files:
        raise DataConfigError(
            f"no images under predict_root {str(root)!r} (searched recursively for {', '.join(IMAGE_EXTENSIONS)}); "
            "put the images there or point data.predict_root at the folder that holds them"
        )
    return ImageFileDataset([str(p) for p in files], None, "raise")


def _predict_csv(path: Path, classes: Callable[[], tuple[Sequence[str], bool]]) -> ImageFileDataset:
    table = read_csv_rows(
        path,
        ["path"],
        name="predict_root CSV",
        fix="point data.predict_root at an existing .csv file with a 'path' column, or at a folder of images",
        no_column="predict_root CSV {path!r} has no {column!r} column (columns: {columns}); give it a header row "
        "with a 'path' column of image paths relative to the CSV's folder (and optionally 'label')",
        no_rows_fix="list one image path per row",
    )
    files = table.files("path", path.parent)
    missing = table.missing(files, "path")
    if missing:
        raise DataConfigError(
            f"{len(missing)} path(s) in predict_root CSV {str(path)!r} are not files (paths are relative to "
            f"the CSV's folder {str(path.parent)!r}): {table.describe(missing, 'path')}; fix or remove those rows"
        )
    if "label" not in table.columns:
        return ImageFileDataset(files, None, "raise")
    return ImageFileDataset(files, predict_labels(table, *classes()), "raise")


def predict_labels(table: CSVRows, class_names: Sequence[str], numbered: bool) -> list[int]:
    """The ``label`` column of a predict CSV as class indices (:func:`~cloc_lightning.data.tables.label_indices`):
    integers in ``[0, num_classes)`` where the data module's labels are class indices (``numbered``), else class names."""
    n, names = len(class_names), list(class_names)
    values = [r["label"] for r in table.rows]
    indices = label_indices(values, names, numbered=numbered)
    bad = [i for i, c in enumerate(indices) if c is None]
    if bad:
        by_number = numbered and all(integer_label(v) is not None for v in values if v)
        expected = f"integers in [0, {n})" if by_number else f"names from class_names {names[:10]}"
        raise DataConfigError(
            f"{len(bad)} label(s) in predict_root CSV {str(table.path)!r} are not {expected}: "
            f"{table.describe(bad, 'path', 'label')}; fix those rows, or drop the 'label' column "
            "to predict without targets"
        )
    return [c for c in indices if c is not None]
