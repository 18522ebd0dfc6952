"""One rule turns a label's text into a class index (:func:`cloc_lightning.data.tables.label_indices`).

A class folder's name, a ``predict_root`` sub-folder's name, a training CSV's label and a predict CSV's label
name the same class when they are the same text.  The case that used to differ: class folders (or CSV string
labels) that are numbers (``1, 2, 3``): a predict CSV read ``2`` as class index 2 (the folder ``3``) while the
``predict_root`` sub-folder ``2`` and the training folder ``2`` were class 1.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cloc_lightning.data import ImageFolderDataModule
from cloc_lightning.data.csv_table import CSVDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.tables import label_indices


def _png(path: Path, seed: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (12, 12, 3), dtype=np.uint8)).save(path)


def test_the_rule() -> None:
    names = ["1", "2", "3"]
    assert label_indices(["2", "1", " 3 ", "0", "x"], names, numbered=False) == [1, 0, 2, None, None]
    # class indices 0..C-1 (integer CSV labels, the built-in data sets): a column of integers is indices ...
    assert label_indices(["2", "0", "3.0", "3"], ["cat", "dog", "emu", "fox"], numbered=True) == [2, 0, 3, 3]
    assert label_indices(["4", "-1"], ["cat", "dog", "emu", "fox"], numbered=True) == [None, None]
    # ... and a column with any non-integer is read by name, every label of it
    assert label_indices(["dog", "1", "fox"], ["cat", "dog", "emu", "fox"], numbered=True) == [1, None, 3]


def test_a_predict_csv_names_numbered_class_folders_as_the_folders_do(tmp_path: Path) -> None:
    for c in ("1", "2", "3"):
        for i in range(2):
            _png(tmp_path / "train" / c / f"{i}.png", int(c) * 10 + i)
            _png(tmp_path / "test" / c / f"{i}.png", int(c) * 10 + i + 5)
            _png(tmp_path / "predict" / c / f"{i}.png", int(c) * 10 + i + 7)
    rows = [(f"predict/{c}/{i}.png", c) for c in ("1", "2") for i in range(2)]
    (tmp_path / "predict.csv").write_text("path,label\n" + "".join(f"{p},{y}\n" for p, y in rows))

    def targets(predict_root: Path) -> list[int]:
        dm = ImageFolderDataModule(str(tmp_path), task="ordinal", num_workers=0, predict_root=str(predict_root))
        dm.setup("predict")
        assert dm.num_classes == 3 and dm.predict_set is not None
        ds = dm.predict_set.base
        return [t for f, t in zip(ds.files, ds.targets, strict=True) if Path(f).parent.name in ("1", "2")]

    from_folders = targets(tmp_path / "predict")
    assert from_folders == [0, 0, 1, 1]
    assert targets(tmp_path / "predict.csv") == from_folders  # was [1, 1, 2, 2]: '2' read as index 2, the folder '3'


def test_a_predict_csv_names_numbered_string_labels_as_the_training_csv_does(tmp_path: Path) -> None:
    labels = ["1", "1.5", "2"] * 2  # not all integers: names (in the order class_names gives)
    for i in range(len(labels)):
        _png(tmp_path / "img" / f"{i}.png", i)
    (tmp_path / "data.csv").write_text("path,label\n" + "".join(f"img/{i}.png,{y}\n" for i, y in enumerate(labels)))
    (tmp_path / "predict.csv").write_text("path,label\nimg/0.png,1\nimg/2.png,2\n")
    dm = CSVDataModule(
        str(tmp_path / "data.csv"),
        task="ordinal",
        num_workers=0,
        batch_size=1,
        split_fractions=(1.0, 1.0, 1.0),
        class_names=["1", "1.5", "2"],
        predict_root=str(tmp_path / "predict.csv"),
    )
    dm.setup("fit")
    trained = {Path(f).name: t for s in (dm.train_set, dm.val_set, dm.test_set) for f, t in zip(s.base.files, s.base.targets, strict=True)}
    assert dm.class_names == ["1", "1.5", "2"] and trained["0.png"] == 0 and trained["2.png"] == 2
    dm.setup("predict")
    assert dm.predict_set is not None and dm.predict_set.base.targets == [0, 2]  # was [1, 2]
    (tmp_path / "bad.csv").write_text("path,label\nimg/0.png,3\n")
    bad = CSVDataModule(str(tmp_path / "data.csv"), num_workers=0, class_names=["1", "1.5", "2"], predict_root=str(tmp_path / "bad.csv"))
    with pytest.raises(DataConfigError, match=r"are not names from class_names \['1', '1.5', '2'\]: line 2: 'img/0.png'"):
        bad.setup("predict")
