"""``CSVDataModule`` labels: a stray integer label is an error naming its rows, never silently extra classes.

Without ``num_classes`` the classes are ``0..max label`` and each needs images; with it,
labels outside ``[0, num_classes)`` are errors.  Every message names the offending rows
(CSV line numbers and paths) and the fix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from cloc_lightning.data.csv_table import CSVDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.methods import CEModule
from tests.conftest import TINY_BACKBONE, cpu_trainer


def _csv(tmp_path: Path, labels: list[str], name: str = "data.csv") -> Path:
    """A CSV (header on line 1, row ``i`` on line ``i + 2``) of tiny PNGs ``img/<i>.png`` with these labels."""
    (tmp_path / "img").mkdir(exist_ok=True)
    for i in range(len(labels)):
        if not (tmp_path / "img" / f"{i}.png").exists():
            pixels = np.random.default_rng(i).integers(0, 255, (12, 12, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "img" / f"{i}.png")
    path = tmp_path / name
    path.write_text("path,label\n" + "".join(f"img/{i}.png,{y}\n" for i, y in enumerate(labels)))
    return path


def _dm(path: Path, **kw: object) -> CSVDataModule:
    return CSVDataModule(str(path), batch_size=2, num_workers=0, split_fractions=(1.0, 1.0, 1.0), **kw)


#: 0..4 twice (10 rows), then a stray 9 in row 10 (CSV line 12)
STRAY = [str(i % 5) for i in range(10)] + ["9"]


def test_a_stray_label_is_named_not_five_empty_classes(tmp_path: Path) -> None:
    dm = _dm(_csv(tmp_path, STRAY))
    with pytest.raises(DataConfigError) as err:
        dm.setup("fit")
    msg = str(err.value)
    assert "leave classes [5, 6, 7, 8] without images" in msg and "labels [9] come after the gap" in msg
    assert "line 12: 'img/10.png' (label '9')" in msg
    assert "Fix those rows, or set data.num_classes to accept empty classes (e.g. data.num_classes: 10)" in msg
    with pytest.raises(DataConfigError, match="without images"):
        _ = dm.num_classes  # asked first by the model's num_classes check: the same error, not 10 classes


def test_num_classes_accepts_empty_classes(tmp_path: Path) -> None:
    dm = _dm(_csv(tmp_path, STRAY), num_classes=10)
    dm.setup("fit")
    assert dm.num_classes == 10 and dm.class_names == [str(i) for i in range(10)]
    targets = dm.train_set.targets + dm.val_set.targets + dm.test_set.targets
    assert 9 in targets and set(targets) <= set(range(10))
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape[0] == 2 and y.max() < 10


def test_labels_outside_num_classes_name_their_rows(tmp_path: Path) -> None:
    labels = [str(i % 5) for i in range(10)] + ["9", "5", "-1"] + ["7"] * 5
    dm = _dm(_csv(tmp_path, labels), num_classes=5)
    with pytest.raises(DataConfigError) as err:
        dm.setup("fit")
    msg = str(err.value)
    assert msg.startswith("integer labels must lie in [0, 5) (num_classes=5)")
    assert (
        "has labels [-1, 5, 7, 9] in rows line 12: 'img/10.png' (label '9'); line 13: 'img/11.png' (label '5'); "
        "line 14: 'img/12.png' (label '-1'); line 15: 'img/13.png' (label '7'); line 16: 'img/14.png' (label '7'); "
        "... and 3 more row(s)" in msg
    )
    assert "Fix those rows, or raise data.num_classes (and class_names)" in msg
    # class_names fixes the number of classes the same way (and its error keeps its wording)
    with pytest.raises(DataConfigError, match=r"labels must lie in \[0, 3\) \(class_names has 3 names\).*line 5: 'img/3.png'"):
        _dm(_csv(tmp_path, ["0", "1", "2", "3"], "three.csv"), class_names=["a", "b", "c"]).setup("fit")


def test_negative_one_based_and_empty_labels_without_num_classes(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match=r"must be >= 0; .* rows line 4: 'img/2.png' \(label '-2'\)\. Fix those rows"):
        _dm(_csv(tmp_path, ["0", "1", "-2", "1"], "neg.csv")).setup("fit")
    with pytest.raises(
        DataConfigError,
        match=r"leave classes \[0\] without images \(labels start at 1: class indices "
        r"are 0-based, subtract 1\)",
    ):
        _dm(_csv(tmp_path, ["1", "2", "3", "4"], "one_based.csv")).setup("fit")
    with pytest.raises(DataConfigError, match=r"has empty labels: line 3: 'img/1.png' \(label ''\); fill them in"):
        _dm(_csv(tmp_path, ["0", "", "1"], "empty.csv")).setup("fit")


def test_num_classes_with_class_names_or_string_labels(tmp_path: Path) -> None:
    with pytest.raises(DataConfigError, match="num_classes=4 but class_names has 3 names"):
        CSVDataModule("x.csv", class_names=["a", "b", "c"], num_classes=4)
    with pytest.raises(DataConfigError, match="num_classes must be >= 2"):
        CSVDataModule("x.csv", num_classes=1)
    words = _csv(tmp_path, ["low", "mid", "low", "mid"], "words.csv")
    with pytest.raises(
        DataConfigError,
        match=r"num_classes=3 but .* has 2 distinct string labels \['low', 'mid'\]; "
        "give class_names",
    ):
        _dm(words, num_classes=3).setup("fit")
    dm = _dm(words, num_classes=3, class_names=["low", "mid", "high"])  # an empty 'high' class, by name
    assert dm.num_classes == 3 and dm.class_names == ["low", "mid", "high"]
    with pytest.raises(DataConfigError, match=r"labels \['top'\] are not in class_names .*line 4: 'img/2.png'"):
        _dm(_csv(tmp_path, ["low", "mid", "top"], "unknown.csv"), class_names=["low", "mid"]).setup("fit")


def test_fit_stops_at_the_data_not_at_the_model_mismatch(tmp_path: Path) -> None:
    """Before: ``model.num_classes=5 but CSVDataModule has 10 classes; set ... num_classes 10`` (the wrong fix)."""
    model = CEModule(num_classes=5, backbone=TINY_BACKBONE)
    trainer = cpu_trainer(tmp_path, max_epochs=1, enable_checkpointing=False)
    with pytest.raises(DataConfigError, match=r"line 12: 'img/10.png' \(label '9'\)"):
        trainer.fit(model, datamodule=_dm(_csv(tmp_path, STRAY)))


def test_both_csv_readers_strip_names_and_values_and_name_short_rows(tmp_path: Path) -> None:
    """One reader (``read_csv_rows``) for ``CSVDataModule`` and ``predict_root``: white space around column names and
    values is ignored, and a row with fewer fields than the header reads empty fields (a named row, not a crash)."""
    from cloc_lightning.data import OrdinalShapesDataModule

    labels = [str(i % 3) for i in range(12)]
    path = _csv(tmp_path, labels)
    spaced = tmp_path / "spaced.csv"
    spaced.write_text(" path , label \n" + "".join(f" img/{i}.png , {y} \n" for i, y in enumerate(labels)))
    splits = []
    for csv_path in (path, spaced):
        dm = _dm(csv_path)
        dm.setup("fit")
        splits.append([sorted(s.base.files[i] for i in s.indices) for s in (dm.train_set, dm.val_set, dm.test_set)])
        assert dm.num_classes == 3 and sum(len(files) for files in splits[-1]) == 12
        predict = OrdinalShapesDataModule(num_classes=3, num_workers=0, predict_root=str(csv_path))
        predict.setup("predict")
        assert predict.predict_set is not None and predict.predict_set.base.targets == [int(y) for y in labels]
    assert splits[0] == splits[1]  # the same rows, the same hash split
    short = tmp_path / "short.csv"
    short.write_text("path,label\nimg/0.png,0\nimg/1.png\n\nimg/2.png,1\n")  # line 3 has no label, line 4 is blank
    with pytest.raises(DataConfigError, match=r"has empty labels: line 3: 'img/1.png' \(label ''\)"):
        _dm(short).setup("fit")
    no_path = tmp_path / "no_path.csv"
    no_path.write_text("label,path\n0,img/0.png\n1\n2,img/2.png\n")
    with pytest.raises(DataConfigError, match=r"1 of 3 image\(s\) listed in .* do not exist .*: line 3: ''"):
        _dm(no_path, class_names=["a", "b", "c"]).setup("fit")
    with pytest.raises(DataConfigError, match=r"1 path\(s\) .* are not files .*: line 3: ''; fix or remove those rows"):
        OrdinalShapesDataModule(num_classes=3, num_workers=0, predict_root=str(no_path)).setup("predict")
