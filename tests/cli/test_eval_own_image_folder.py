"""``ImageFolderDataModule(test_root=...)``: evaluating on a labelled folder of one's own (a second site).

The rule: ``<test_root>/<class>/...`` with sub-folders named after training classes; a second site
may lack classes and its images keep the training indices (by name, never by position); a
sub-folder that is no training class or an image outside the class folders is refused (it
would be scored under no label or a wrong one).  Without ``root`` only ``test``/``predict`` run;
the classes are ``class_order`` or the folder's own, checked against the checkpoint's.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from cloc_lightning.data import ImageFolderDataModule
from cloc_lightning.data.errors import DataConfigError
from tests.cli._tiny import CE_MODEL, CSV_LOGGER, QUIET, png
from tests.conftest import cli_in_process

CLASSES = ["a", "b", "c"]
COMMON = [*QUIET, *CSV_LOGGER]
FIT = ["--trainer.max_epochs", "1", *COMMON]


def _tree(root: Path, per_class: dict[str, int], seed: int) -> None:
    for k, (c, n) in enumerate(per_class.items()):
        for i in range(n):
            png(root / c / f"{c}{seed + i}.png", seed + 100 * k + i)


def _dm(root: Path | None, test_root: Path, **kw: object) -> ImageFolderDataModule:
    return ImageFolderDataModule(
        None if root is None else str(root), test_root=str(test_root), batch_size=2, num_workers=0, drop_last=False, **kw
    )


def test_a_second_site_lacking_a_class_keeps_the_training_indices(tmp_path: Path) -> None:
    _tree(tmp_path / "data" / "train", dict.fromkeys(CLASSES, 4), 0)  # no data/test: test_root replaces it
    _tree(tmp_path / "site2", {"a": 2, "c": 3}, 500)
    dm = _dm(tmp_path / "data", tmp_path / "site2")
    dm.setup("test")
    assert dm.class_names == CLASSES
    base = dm.test_set.base
    assert sorted(zip((Path(f).parent.name for f in base.files), base.targets, strict=True)) == [("a", 0)] * 2 + [("c", 2)] * 3
    dm.setup("fit")
    assert len(dm.train_set) + len(dm.val_set) == 12  # the whole training folder, split into train/val


def test_the_pool_layout_is_split_into_train_and_val_only(tmp_path: Path) -> None:
    _tree(tmp_path / "pool", dict.fromkeys(CLASSES, 10), 0)
    _tree(tmp_path / "site2", dict.fromkeys(CLASSES, 1), 900)
    dm = _dm(tmp_path / "pool", tmp_path / "site2", split_fractions=(0.7, 0.1, 0.2))
    dm.setup("fit")
    dm.setup("test")
    assert len(dm.train_set) + len(dm.val_set) == 30 and len(dm.test_set) == 3
    # without test_root the same pool keeps its test share
    plain = ImageFolderDataModule(str(tmp_path / "pool"), split_fractions=(0.7, 0.1, 0.2), batch_size=2, num_workers=0)
    plain.setup("fit")
    plain.setup("test")
    assert len(plain.train_set) + len(plain.val_set) < 30 and len(plain.test_set) > 0


def test_a_test_folder_sharing_training_files_is_counted(tmp_path: Path) -> None:
    _tree(tmp_path / "data" / "train", dict.fromkeys(CLASSES, 4), 0)
    _tree(tmp_path / "site2", {"a": 2}, 500)
    shutil.copy(tmp_path / "data" / "train" / "b" / "b1.png", tmp_path / "site2" / "a" / "copy.png")  # same bytes, other name
    with pytest.warns(UserWarning, match=r"test_root .*: 1 of 3 test image\(s\) are in the training split"):
        _dm(tmp_path / "data", tmp_path / "site2").setup("test")


@pytest.mark.parametrize(
    ("make", "match"),
    [
        (lambda p: png(p / "site2" / "d" / "x.png", 1), r"sub-folders that are not training classes: \['d'\]"),
        (lambda p: png(p / "site2" / "loose.png", 1), r"1 image\(s\) outside the class sub-folders \(e\.g\. \['loose\.png'\]\)"),
        (lambda p: shutil.rmtree(p / "site2"), r"test_root .* does not exist"),
    ],
)
def test_a_test_folder_that_cannot_be_labelled_is_refused(tmp_path: Path, make, match: str) -> None:
    _tree(tmp_path / "data" / "train", dict.fromkeys(CLASSES, 2), 0)
    _tree(tmp_path / "site2", {"a": 1}, 500)
    make(tmp_path)
    with pytest.raises(DataConfigError, match=match) as err:
        _dm(tmp_path / "data", tmp_path / "site2").setup("test")
    assert "\n" not in str(err.value)


def test_without_root_only_test_runs_and_class_order_gives_the_indices(tmp_path: Path) -> None:
    _tree(tmp_path / "site2", {"a": 2, "c": 1}, 500)
    with pytest.raises(DataConfigError, match=r"data.root is not set, so there is no training or validation data for fit"):
        _dm(None, tmp_path / "site2").setup("fit")
    with pytest.raises(DataConfigError, match=r"data.root is not set; set it .* or data.test_root"):
        ImageFolderDataModule(num_workers=0).setup("test")
    dm = _dm(None, tmp_path / "site2")  # the folder's own classes
    dm.setup("test")
    assert dm.class_names == ["a", "c"] and sorted(dm.test_set.base.targets) == [0, 0, 1]
    dm = _dm(None, tmp_path / "site2", class_order=CLASSES)  # the training classes as configured
    dm.setup("test")
    assert dm.class_names == CLASSES and sorted(dm.test_set.base.targets) == [0, 0, 2]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, module_console_argv: None) -> dict[str, Path]:
    """A 1-epoch CE fit on a 3-class image folder; a second site that lacks class ``b``."""
    work = tmp_path_factory.mktemp("own_image_folder")
    for split, n in (("train", 6), ("test", 2)):
        _tree(work / "data" / split, dict.fromkeys(CLASSES, n), 0 if split == "train" else 300)
    _tree(work / "site2", {"a": 3, "c": 2}, 700)
    from cloc_lightning.cli import main

    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        try:
            main(["fit", *CE_MODEL, "--data", "ImageFolderDataModule", "--data.root", str(work / "data"), "--data.batch_size", "4", *FIT])
        except SystemExit as e:
            assert not e.code, e.code
    ckpt = sorted((work / "runs").rglob("last.ckpt"))[-1]
    return {"work": work, "ckpt": ckpt}


def _test(trained: dict[str, Path], extra: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    args = ["test", *CE_MODEL, "--data", "ImageFolderDataModule", "--data.test_root", str(trained["work"] / "site2")]
    return cli_in_process([*args, *extra, "--ckpt_path", str(trained["ckpt"]), *COMMON], capsys)


def test_cli_test_on_a_second_site_with_the_training_root(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(trained["work"])
    code, out, err = _test(trained, ["--data.root", str(trained["work"] / "data")], capsys)
    assert code == 0, err[-3000:]
    assert re.search(r"test/images\s+\W*\s*5(\.0)?\b", out), out[-3000:]


def test_cli_test_on_a_second_site_alone_needs_the_class_order(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(trained["work"])
    code, out, err = _test(trained, ["--data.class_order", "[a, b, c]"], capsys)
    assert code == 0, err[-3000:]
    assert re.search(r"test/images\s+\W*\s*5(\.0)?\b", out), out[-3000:]
    # the folder's own classes (a, c) are not the checkpoint's: one line that names class_order
    # (also with the model's num_classes given, as the run's own config.yaml gives it)
    for extra in ([], ["--model.num_classes", "3"]):
        code, out, err = _test(trained, extra, capsys)
        lines = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
        assert code != 0 and len(lines) == 1 and "test/mae" not in out, err[-3000:]
        assert "data.class_order" in lines[0] and "leave model.init_args.num_classes" not in lines[0], lines[0]
