"""``CSVDataModule(test_csv=...)``: evaluating on a labelled table of one's own (a second site).

The rule: a CSV with the same path and label columns, paths relative to its own folder; its
labels name the training classes by the training CSV's rule (string labels by name, integer
labels as indices), a site may lack classes, and a label that is no training class is refused
with its rows.  With ``csv_path`` it replaces the test split (hash split: train/val by the
first two fractions; split column: the ``test`` rows are left out with a warning); without
``csv_path`` only ``test``/``predict`` run and the classes are ``class_names`` / ``num_classes``
or the table's own, checked against the checkpoint's.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cloc_lightning.data import CSVDataModule
from cloc_lightning.data.errors import DataConfigError
from tests.cli._tiny import CE_MODEL, CSV_LOGGER, QUIET, png
from tests.conftest import cli_in_process

CLASSES = ["young", "adult", "old"]
COMMON = [*QUIET, *CSV_LOGGER]


def _table(folder: Path, rows: list[tuple[str, str]], name: str, seed: int, split: list[str] | None = None) -> Path:
    """``folder/name`` listing ``rows`` (label, image name); each image is written under ``folder/img/``."""
    lines = ["path,label" + (",split" if split else "")]
    for k, (label, image) in enumerate(rows):
        png(folder / "img" / image, seed + k)
        lines.append(f"img/{image},{label}" + (f",{split[k]}" if split else ""))
    path = folder / name
    path.write_text("\n".join(lines) + "\n")
    return path


def _train(folder: Path, labels: list[str], n: int = 10, split: bool = False) -> Path:
    rows = [(c, f"t_{c}{i}.png") for c in labels for i in range(n)]
    return _table(folder, rows, "train.csv", 0, ["train", "val", "test"] * (len(rows) // 3) if split else None)


def _dm(csv: Path | None, test_csv: Path, **kw: object) -> CSVDataModule:
    kw.setdefault("class_names", CLASSES)
    return CSVDataModule(None if csv is None else str(csv), test_csv=str(test_csv), batch_size=2, num_workers=0, drop_last=False, **kw)


def test_a_second_site_lacking_a_class_keeps_the_training_indices(tmp_path: Path) -> None:
    train = _train(tmp_path / "data", CLASSES)
    site = _table(tmp_path / "site2", [("old", "s1.png"), ("young", "s2.png"), ("old", "s3.png")], "site.csv", 500)
    dm = _dm(train, site)
    dm.setup("fit")
    dm.setup("test")
    assert dm.class_names == CLASSES
    base = dm.test_set.base
    assert sorted(zip((Path(f).name for f in base.files), base.targets, strict=True)) == [
        ("s1.png", 2),
        ("s2.png", 0),
        ("s3.png", 2),
    ]
    assert all(Path(f).parent == tmp_path / "site2" / "img" for f in base.files)  # relative to the test CSV's folder
    assert len(dm.train_set) + len(dm.val_set) == 30  # every training row, split into train/val only
    plain = CSVDataModule(str(train), class_names=CLASSES, batch_size=2, num_workers=0, drop_last=False)
    plain.setup("fit")
    plain.setup("test")
    assert len(plain.train_set) + len(plain.val_set) < 30 and len(plain.test_set) > 0


def test_integer_labels_stay_class_indices_on_the_second_site(tmp_path: Path) -> None:
    train = _train(tmp_path / "data", ["0", "1", "2", "3"], n=3)
    site = _table(tmp_path / "site2", [("3", "a.png"), ("1.0", "b.png")], "site.csv", 500)
    dm = _dm(train, site, class_names=None)
    dm.setup("test")
    assert dm.class_names == ["0", "1", "2", "3"] and sorted(dm.test_set.base.targets) == [1, 3]
    out_of_range = _table(tmp_path / "site3", [("4", "a.png")], "site.csv", 600)
    with pytest.raises(
        DataConfigError,
        match=r"1 row\(s\) have a label that is no training class \(line 2: 'img/a.png' \(label '4'\)\).*class indices 0\.\.3",
    ):
        _dm(train, out_of_range, class_names=None).setup("test")


def test_a_split_column_s_test_rows_are_left_out_with_a_warning(tmp_path: Path) -> None:
    train = _train(tmp_path / "data", CLASSES, split=True)  # 30 rows: 10 each of train, val, test
    site = _table(tmp_path / "site2", [("adult", "s.png")], "site.csv", 500)
    dm = _dm(train, site, split_column="split")
    with pytest.warns(UserWarning, match=r"data.test_csv .* replaces the test split: the 10 row\(s\) of .* whose 'split' is test"):
        dm.setup("fit")
    dm.setup("test")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (10, 10, 1)


def test_a_test_csv_sharing_training_files_is_counted(tmp_path: Path) -> None:
    train = _train(tmp_path / "data", CLASSES)
    site = _table(tmp_path / "site2", [("young", "s.png")], "site.csv", 500)
    shutil.copy(tmp_path / "data" / "img" / "t_old1.png", tmp_path / "site2" / "img" / "s.png")  # same bytes, other name
    dm = _dm(train, site)
    with pytest.warns(UserWarning, match=r"test_csv .*: 1 of 1 test image\(s\) are in the training split of data.csv_path"):
        dm.setup("test")


@pytest.mark.parametrize(
    ("rows", "match"),
    [
        (
            [("middle", "s.png")],
            r"test_csv .*: 1 row\(s\) have a label that is no training class \(line 2: 'img/s.png' \(label 'middle'\)\)",
        ),
        ([("", "s.png")], r"label that is no training class \(line 2: 'img/s.png' \(label ''\)\)"),
    ],
)
def test_a_label_that_is_no_training_class_is_refused(tmp_path: Path, rows: list[tuple[str, str]], match: str) -> None:
    train = _train(tmp_path / "data", CLASSES)
    site = _table(tmp_path / "site2", rows, "site.csv", 500)
    with pytest.raises(DataConfigError, match=match) as err:
        _dm(train, site).setup("test")
    assert "\n" not in str(err.value)


def test_missing_test_images_name_the_test_csv_and_bad_files_skip_keeps_the_rest(tmp_path: Path) -> None:
    train = _train(tmp_path / "data", CLASSES)
    site = _table(tmp_path / "site2", [("old", "a.png"), ("young", "b.png")], "site.csv", 500)
    (tmp_path / "site2" / "img" / "b.png").unlink()
    with pytest.raises(
        DataConfigError, match=r"1 of 2 image\(s\) listed in .*site\.csv' \(data.test_csv\) do not exist .*line 3: 'img/b.png'"
    ) as err:
        _dm(train, site).setup("test")
    assert "relative to the test CSV's own folder" in str(err.value) and "\n" not in str(err.value)
    dm = _dm(train, site, bad_files="skip")
    with pytest.warns(UserWarning, match=r"bad_files: skip: left out 1 row\(s\) of .*site\.csv"):
        dm.setup("test")
    assert dm.test_set.base.targets == [2]
    with pytest.raises(DataConfigError, match=r"test_csv .*nope\.csv' does not exist; set data.test_csv"):
        _dm(train, tmp_path / "nope.csv").setup("test")


def test_without_csv_path_only_test_runs_and_the_classes_come_from_class_names(tmp_path: Path) -> None:
    site = _table(tmp_path / "site2", [("old", "a.png"), ("young", "b.png"), ("old", "c.png")], "site.csv", 500)
    with pytest.raises(DataConfigError, match=r"data.csv_path is not set, so there is no training or validation data for fit"):
        _dm(None, site).setup("fit")
    with pytest.raises(DataConfigError, match=r"data.csv_path is not set; set it .* or data.test_csv"):
        CSVDataModule(num_workers=0).setup("test")
    dm = _dm(None, site)  # the training classes as configured
    dm.setup("test")
    assert dm.class_names == CLASSES and sorted(dm.test_set.base.targets) == [0, 2, 2]
    dm = _dm(None, site, class_names=None)  # the table's own labels (ranked by the ordinal rule: needs names here)
    with pytest.raises(DataConfigError, match=r"class_names"):
        dm.setup("test")
    numbered = _table(tmp_path / "site3", [("2", "a.png"), ("0", "b.png")], "site.csv", 600)
    dm = _dm(None, numbered, class_names=None, num_classes=4)
    dm.setup("test")
    assert dm.class_names == ["0", "1", "2", "3"] and sorted(dm.test_set.base.targets) == [0, 2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, module_console_argv: None) -> dict[str, Path]:
    """A 1-epoch CE fit on a 3-class CSV; a second site that lacks class ``adult``."""
    work = tmp_path_factory.mktemp("own_csv")
    train = _train(work / "data", CLASSES)
    site = _table(work / "site2", [("old", "a.png"), ("young", "b.png"), ("old", "c.png")], "site.csv", 700)
    from cloc_lightning.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        try:
            main(
                [
                    "fit",
                    *CE_MODEL,
                    "--data",
                    "CSVDataModule",
                    "--data.csv_path",
                    str(train),
                    "--data.class_names",
                    "[young, adult, old]",
                    "--data.batch_size",
                    "4",
                    "--trainer.max_epochs",
                    "1",
                    *COMMON,
                ]
            )
        except SystemExit as e:
            assert not e.code, e.code
    ckpt = sorted((work / "runs").rglob("last.ckpt"))[-1]
    return {"work": work, "train": train, "site": site, "ckpt": ckpt}


def _test(trained: dict[str, Path], extra: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = ["test", *CE_MODEL, "--data", "CSVDataModule", "--data.test_csv", str(trained["site"])]
    return cli_in_process([*args, *extra, "--ckpt_path", str(trained["ckpt"]), *COMMON], capsys)


def test_cli_test_on_a_second_site_with_the_training_csv(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(trained["work"])
    code, out, err = _test(trained, ["--data.csv_path", str(trained["train"]), "--data.class_names", "[young, adult, old]"], capsys)
    assert code == 0, err[-3000:]
    assert re.search(r"test/images\s+\W*\s*3(\.0)?\b", out), out[-3000:]


def test_cli_test_on_a_second_site_alone_needs_the_class_names(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(trained["work"])
    code, out, err = _test(trained, ["--data.class_names", "[young, adult, old]"], capsys)
    assert code == 0, err[-3000:]
    assert re.search(r"test/images\s+\W*\s*3(\.0)?\b", out), out[-3000:]
    # the table's own labels (old, young: two classes) are not the checkpoint's three: one line naming class_names
    code, out, err = _test(trained, ["--data.task", "nominal"], capsys)
    lines = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
    assert code != 0 and len(lines) == 1 and "test/mae" not in out, err[-3000:]
    assert "data.class_names" in lines[0] and "test_csv" in lines[0], lines[0]
