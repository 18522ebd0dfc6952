"""Data faults that used to give a wrong result without a word, or fail late (issue 29, items 2, 7 and 8).

* class order: numeric labels sort as numbers, a non-integer among integer labels names its row,
  ordinal string labels without an order are an error, ordinal folder names sort naturally;
* a CSV row naming a missing image stops at setup (``bad_files: skip`` leaves it out);
* UTKFace ages clipped by ``label_mode: age`` are counted in a warning;
* bad numeric data arguments are one ``error:`` line at construction, through the CLI too.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from cloc_lightning.data import ImageFolderDataModule, OrdinalShapesDataModule, UTKFaceDataModule
from cloc_lightning.data.csv_table import CSVDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.data.transforms import MultiCropViews, SupConViews


def _png(path: Path, seed: int = 0, size: int = 12) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (size, size, 3), dtype=np.uint8)).save(path)


def _csv(tmp_path: Path, labels: list[str], name: str = "data.csv", missing: tuple[int, ...] = ()) -> Path:
    """A CSV (row ``i`` on line ``i + 2``) of tiny PNGs ``img/<i>.png``; the rows in ``missing`` name no file."""
    for i in range(len(labels)):
        if i not in missing and not (tmp_path / "img" / f"{i}.png").exists():
            _png(tmp_path / "img" / f"{i}.png", seed=i)
    path = tmp_path / name
    path.write_text("path,label\n" + "".join(f"img/{i}.png,{y}\n" for i, y in enumerate(labels)))
    return path


def _dm(path: Path, **kw: object) -> CSVDataModule:
    return CSVDataModule(str(path), batch_size=2, num_workers=0, drop_last=False, split_fractions=(1.0, 1.0, 1.0), **kw)


# ------------------------------------------------------------------------------ class order (item 2)
def test_a_non_integer_among_integer_labels_names_its_row(tmp_path: Path) -> None:
    """Before: every label became a string, ranked ['0', '1', '10', '11', '2', '2.5', ...], and the error said num_classes 13."""
    labels = [str(i % 12) for i in range(24)] + ["2.5"]
    for task in ("ordinal", "nominal"):
        with pytest.raises(DataConfigError) as err:
            _dm(_csv(tmp_path, labels), task=task).setup("fit")
        msg = str(err.value)
        assert "non-integer label(s) ['2.5']" in msg and "line 26: 'img/24.png' (label '2.5')" in msg, msg
        assert "num_classes: 13" not in msg and "whole numbers" in msg


def test_numeric_labels_sort_as_numbers(tmp_path: Path) -> None:
    # integer-valued labels written as floats ("10.0") are the integers they name, in numeric order
    dm = _dm(_csv(tmp_path, [f"{i % 12}.0" for i in range(24)], "floats.csv"))
    dm.setup("fit")
    assert dm.class_names == [str(i) for i in range(12)]
    files = dm.train_set.base.files
    assert all(y == int(Path(f).stem) % 12 for f, y in zip(files, dm.train_set.base.targets, strict=True))
    # non-integer numbers (a half-point scale): ranked by value, never as text
    dm = _dm(_csv(tmp_path, ["0.5", "1.5", "10.5", "2.5"] * 2, "half.csv"))
    dm.setup("fit")
    assert dm.class_names == ["0.5", "1.5", "2.5", "10.5"]


def test_ordinal_string_labels_need_class_names(tmp_path: Path) -> None:
    """Before: young/adult/old were ranked alphabetically (adult < old < young) without a word."""
    path = _csv(tmp_path, ["young", "adult", "old"] * 3, "words.csv")
    with pytest.raises(DataConfigError) as err:
        _dm(path).setup("fit")
    msg = str(err.value)
    assert "string labels ['adult', 'old', 'young']" in msg and "no order" in msg
    assert "give data.class_names with these 3 labels in rank order, lowest first" in msg and "--data.class_names '[" in msg
    dm = _dm(path, class_names=["young", "adult", "old"])
    dm.setup("fit")
    assert dm.class_names == ["young", "adult", "old"]
    nominal = _dm(path, task="nominal")  # order does not matter: sorted, as before
    nominal.setup("fit")
    assert nominal.class_names == ["adult", "old", "young"]
    # labels that start with numbers rank by them (natural order)
    dm = _dm(_csv(tmp_path, ["0-3", "4-7", "8-14", "15-24", "60+"] * 2, "ranges.csv"))
    dm.setup("fit")
    assert dm.class_names == ["0-3", "4-7", "8-14", "15-24", "60+"]


def _age_folders(root: Path, names: list[str]) -> Path:
    for split in ("train", "val", "test"):
        for c in names:
            for i in range(2):
                _png(root / split / c / f"{i}.png", seed=i)
    return root


def test_ordinal_folders_sort_naturally_and_the_order_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Before: folders 0-3, 4-7, 8-14, 15-24 were ranked 0-3, 15-24, 4-7, 8-14."""
    root = _age_folders(tmp_path / "ages", ["0-3", "4-7", "8-14", "15-24"])
    dm = ImageFolderDataModule(str(root), task="ordinal", val_fraction=0.0, batch_size=2, num_workers=0)
    with caplog.at_level(logging.INFO):
        dm.setup("fit")
        dm.setup("test")
    assert dm.class_names == ["0-3", "4-7", "8-14", "15-24"]
    for f, y in zip(dm.test_set.base.files, dm.test_set.base.targets, strict=True):
        assert y == dm.class_names.index(Path(f).parent.name)
    shown = [r.getMessage() for r in caplog.records if "ordinal classes" in r.getMessage()]
    assert len(shown) == 1 and "['0-3', '4-7', '8-14', '15-24']" in shown[0], shown
    # nominal folders keep their sorted order
    assert ImageFolderDataModule(str(root)).num_classes == 4
    assert ImageFolderDataModule(str(root)).discover_class_names() == ["0-3", "15-24", "4-7", "8-14"]


def test_ordinal_folders_without_numbers_need_class_order(tmp_path: Path) -> None:
    root = _age_folders(tmp_path / "words", ["young", "adult", "old"])
    with pytest.raises(DataConfigError, match=r"folders \['adult', 'old', 'young'\].*no order.*--data.class_order '\["):
        ImageFolderDataModule(str(root), task="ordinal").setup("fit")
    dm = ImageFolderDataModule(
        str(root), task="ordinal", class_order=["young", "adult", "old"], val_fraction=0.0, batch_size=2, num_workers=0
    )
    dm.setup("fit")
    assert dm.class_names == ["young", "adult", "old"]


# ------------------------------------------------------------------------------ late or silent checks (item 7)
def test_missing_csv_images_stop_at_setup(tmp_path: Path) -> None:
    """Before: the row failed only when training reached it."""
    path = _csv(tmp_path, [str(i % 3) for i in range(12)], missing=(4, 9))
    with pytest.raises(DataConfigError) as err:
        _dm(path).setup("fit")
    msg = str(err.value)
    assert msg.startswith("2 of 12 image(s) listed in") and "line 6: 'img/4.png'; line 11: 'img/9.png'" in msg, msg
    assert "data.root" in msg and "bad_files: skip" in msg
    dm = _dm(path, bad_files="skip")
    with pytest.warns(UserWarning, match=r"bad_files: skip: left out 2 row\(s\) of .* whose image does not exist"):
        dm.setup("fit")
    files = dm.train_set.base.files + dm.val_set.base.files + dm.test_set.base.files
    assert len(files) == 10 and not any(f.endswith(("/4.png", "/9.png")) for f in files)


def test_utkface_ages_outside_the_range_are_counted(tmp_path: Path) -> None:
    """Before: ages above max_age (UTKFace goes to 116) were clipped into the last class without a count."""
    for i, age in enumerate([1, 5, 30, 79, 85, 90, 116, 40]):
        _png(tmp_path / f"{age}_0_1_2017010{i}.jpg.chip.jpg", seed=i)
    dm = UTKFaceDataModule(
        str(tmp_path),
        label_mode="age",
        batch_size=1,
        num_workers=0,
        drop_last=False,
        split_fractions=(1, 0, 0),
        min_age=2,
        test_root=str(tmp_path),
    )
    with pytest.warns(UserWarning) as rec:
        dm.setup("test")
    msgs = [str(w.message) for w in rec if "clips ages" in str(w.message)]
    assert len(msgs) == 1, msgs
    for split in ("train", "test"):
        assert f"{split}: 3 above 80 (ages 85-116), 1 below 2 (age 1) of 8" in msgs[0], msgs[0]
    assert "val:" not in msgs[0] and "data.max_age" in msgs[0]
    assert sorted(dm.test_set.targets) == [0, 3, 28, 38, 77, 78, 78, 78]  # still clipped, as documented
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # test_root is root here: the (right) warning that its files are training files is not this test's subject
        warnings.filterwarnings("ignore", message=r"test_root .* are in the training split")
        for kw in ({"label_mode": "age", "max_age": 120, "min_age": 1}, {}):  # bins: the last group is open
            UTKFaceDataModule(str(tmp_path), split_fractions=(1, 0, 0), test_root=str(tmp_path), **kw).setup("test")


@pytest.mark.parametrize("label_mode", ["bins", "age"])
def test_utkface_ages_outside_1_to_116_are_refused_or_skipped_with_a_count(tmp_path: Path, label_mode: str) -> None:
    """Before (issue 42, item 4): in label_mode bins, 250 went to '60+' and 0 to '0-3' without a count."""
    for i, age in enumerate([0, 5, 30, 250, 60, 117, 40, 8]):
        _png(tmp_path / f"{age}_0_1_2017010{i}.jpg.chip.jpg", seed=i)
    kw = dict(label_mode=label_mode, batch_size=1, num_workers=0, drop_last=False, split_fractions=(1, 0, 0), test_root=str(tmp_path))
    with pytest.raises(DataConfigError) as err:
        UTKFaceDataModule(str(tmp_path), **kw).setup("test")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith(f"3 UTKFace file(s) in {str(tmp_path)!r} have ages outside 1..116"), msg
    assert "0_0_1_20170100.jpg.chip.jpg" in msg and "250_0_1_20170103.jpg.chip.jpg" in msg, msg
    assert "data.age_range" in msg and "data.strict_names: false" in msg, msg
    dm = UTKFaceDataModule(str(tmp_path), strict_names=False, **kw)
    with pytest.warns(UserWarning, match=r"skipped 3 UTKFace file\(s\) with ages outside 1\.\.116 \(ages 0, 117, 250\)"):
        dm.setup("test")
    assert len(dm.test_set) == 5  # the other five, none binned into an end class
    dm = UTKFaceDataModule(str(tmp_path), age_range=(0, 250), **kw)  # ages that are real: widen the range
    dm.setup("test")
    assert len(dm.test_set) == 8


def test_setup_warnings_are_given_once_per_job_by_rank_zero(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every DDP process sets up the same data; the data modules' setup warnings come from rank 0 only (once per job)."""
    from lightning.pytorch.utilities import rank_zero_only

    for i, age in enumerate([0, 5, 30, 250]):
        _png(tmp_path / f"{age}_0_1_2017010{i}.jpg.chip.jpg", seed=i)
    kw = dict(strict_names=False, batch_size=1, num_workers=0, drop_last=False, split_fractions=(1, 0, 0), test_root=str(tmp_path))
    seen = {}
    for rank in (0, 1):
        monkeypatch.setattr(rank_zero_only, "rank", rank)
        with warnings.catch_warnings(record=True) as rec:
            warnings.simplefilter("always")
            UTKFaceDataModule(str(tmp_path), **kw).setup("test")
        seen[rank] = [str(w.message) for w in rec if issubclass(w.category, UserWarning)]
    # rank 0: the skipped ages (data.root and test_root, the same folder here) and the test/train overlap
    assert any("skipped 2 UTKFace file(s) with ages outside" in m for m in seen[0]), seen[0]
    assert any("their metrics are no held-out result" in m for m in seen[0]), seen[0]
    assert not [m for m in seen[1] if "UTKFace" in m or "held-out" in m], seen[1]


# ------------------------------------------------------------------------------ bad numbers (item 8)
@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"image_size": 0}, "image_size must be >= 1, got 0"),
        ({"image_size": -32}, "image_size must be >= 1, got -32"),
        ({"num_workers": -1}, "num_workers must be >= 0"),
        ({"batch_size": 0}, "batch_size must be >= 1"),
        ({"eval_batch_size": 0}, "eval_batch_size must be >= 1"),
        ({"rrc_scale": (0.0, 1.0)}, "rrc_scale min must be > 0.0"),
        ({"std": (0.2, 0.0, 0.2)}, "std"),
        ({"mean": (0.5, 0.5)}, "mean must be three numbers"),
    ],
)
def test_bad_numeric_data_arguments_fail_at_construction(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(DataConfigError, match=match):
        OrdinalShapesDataModule(**kwargs)  # type: ignore[arg-type]


def test_bad_view_arguments_fail_at_construction() -> None:
    with pytest.raises(ValueError, match=r"scale min must be > 0"):
        SupConViews(scale=(0.0, 1.0))
    with pytest.raises(ValueError, match=r"global_scale max must be <= 1"):
        MultiCropViews(global_scale=(0.1, 1.5))
    with pytest.raises(ValueError, match=r"local_scale must be a pair"):
        MultiCropViews(local_scale=(0.1,))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"size must be >= 1"):
        SupConViews(size=0)
    with pytest.raises(ValueError, match=r"blur_p must be <= 1"):
        MultiCropViews(blur_p=2.0)
    with pytest.raises(DataConfigError, match=r"image_size must be >= 16"):
        OrdinalShapesDataModule(image_size=8)


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        ("image_size", "0", "image_size must be >= 1, got 0"),
        ("num_workers", "-1", "num_workers must be >= 0, got -1"),
        ("rrc_scale", "[0, 1]", "rrc_scale min must be > 0.0"),
    ],
)
def test_bad_data_numbers_are_one_error_line_through_the_cli(
    key: str, value: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 124 lines from torchvision (image_size 0), 68 from the DataLoader (num_workers -1)."""
    from cloc_lightning.cli import main

    args = [
        "fit",
        "--model",
        "CEModule",
        "--model.num_classes",
        "4",
        "--model.backbone",
        "test_resnet",
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        "4",
        "--data.train_size",
        "8",
        "--trainer.logger",
        "false",
        "--trainer.fast_dev_run",
        "true",
        f"--data.{key}",
        value,
    ]
    with pytest.raises(SystemExit) as exit_info:
        main(args)
    assert exit_info.value.code == 1
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    errors = [line for line in lines if "error:" in line]
    assert len(errors) == 1 and expected in errors[0], err[-3000:]
    assert "Traceback" not in err and len(lines) <= 4, err[-3000:]


def test_default_arguments_are_unchanged() -> None:
    dm = OrdinalShapesDataModule(num_workers=0)
    assert (dm.image_size, dm.batch_size, dm.eval_batch_size, dm.rrc_scale) == (32, 64, 64, (0.5, 1.0))
    assert torch.tensor(dm.std).min() > 0


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("fraction", "non-integer label(s) ['2.5']: line 26: 'img/24.png' (label '2.5')"),
        ("words", "task is ordinal but the string labels ['adult', 'old', 'young'] in the 'label' column of"),
        ("missing", "1 of 12 image(s) listed in"),
    ],
)
def test_data_faults_are_one_error_line_through_the_cli(
    case: str, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The user meets these in ``cloc-lightning fit``: one ``error:`` line, exit code 1, before any training."""
    from cloc_lightning.cli import main

    labels = {
        "fraction": [str(i % 12) for i in range(24)] + ["2.5"],
        "words": ["young", "adult", "old"] * 4,
        "missing": [str(i % 3) for i in range(12)],
    }[case]
    path = _csv(tmp_path, labels, missing=(5,) if case == "missing" else ())
    with pytest.raises(SystemExit) as exit_info:
        main(
            [
                "fit",
                "--model",
                "CEModule",
                "--model.num_classes",
                "3",
                "--model.backbone",
                "test_resnet",
                "--data",
                "CSVDataModule",
                "--data.csv_path",
                str(path),
                "--data.num_workers",
                "0",
                "--trainer.logger",
                "false",
                "--trainer.fast_dev_run",
                "true",
                "--trainer.accelerator",
                "cpu",
                "--trainer.default_root_dir",
                str(tmp_path),
            ]
        )
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if "error:" in line]
    assert len(errors) == 1 and expected in errors[0], captured.err[-3000:]
    assert "Traceback" not in captured.err and "Epoch" not in captured.out + captured.err
