"""Evaluating a trained model on a labelled folder of one's own (a held-out set, a second site): issue 42, item 13.

* ``test --data.test_root <folder>`` needs no ``--data.root`` (the training data may not be at the second
  site); the classes come from the configuration and are checked against the checkpoint's.
* A test folder that shares files with the training split (by name or by content) is scored with a
  warning that counts them.
* ``predict`` on a folder whose labels the data module can read (UTKFace names, class folders) writes
  a target column.
* The test table shows the test metrics and the number of images scored, not the checkpoint's
  ``val/*_best`` / ``val/*_final``; the closing line names the logger that wrote the run folder.

In-process through :func:`cloc_lightning.cli.main`, on tiny generated UTKFace-named PNGs.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest

from cloc_lightning.data import ImageFolderDataModule, UTKFaceDataModule
from tests.cli._tiny import CE_MODEL, CSV_LOGGER, QUIET, png
from tests.conftest import cli_in_process

AGES = [2, 5, 10, 20, 30, 40, 50, 70]


def _utk(folder: Path, ages: list[int], seed: int) -> list[Path]:
    return [png(folder / f"{age}_0_1_2017{seed + i:09d}.jpg.chip.jpg", seed + i) for i, age in enumerate(ages)]


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory, module_console_argv: None) -> dict[str, Path]:
    """A 1-epoch CE fit on 32 UTKFace-named files (``data.root``) and a 10-file held-out folder of other faces."""
    work = tmp_path_factory.mktemp("own_folder")
    _utk(work / "utk", AGES * 4, 0)
    _utk(work / "held", [3, 6, 12, 22, 33, 44, 55, 66, 77, 88], 1000)
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(work)
        capsys = _Capture()
        code, _out, err = capsys.run(
            [
                "fit",
                *CE_MODEL,
                "--data",
                "UTKFaceDataModule",
                "--data.root",
                str(work / "utk"),
                "--data.batch_size",
                "4",
                "--trainer.max_epochs",
                "1",
                *QUIET,
                *CSV_LOGGER,
            ]
        )
    assert code == 0, err[-3000:]
    ckpt = sorted((work / "runs").rglob("last.ckpt"))[-1]
    return {"work": work, "ckpt": ckpt, "root": work / "utk", "held": work / "held"}


class _Capture:
    """``cli_in_process`` for a module-scoped fixture (no ``capsys`` there): stdout/stderr through pytest's capture."""

    def run(self, args: list[str]) -> tuple[int, str, str]:
        import contextlib
        import io

        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            from cloc_lightning.cli import main

            code = 0
            try:
                main(args)
            except SystemExit as e:
                code = e.code if isinstance(e.code, int) else 1
        return code, out.getvalue(), err.getvalue()


def _test_table(out: str) -> dict[str, str]:
    """The rows of Lightning's test table ("Test metric" / "DataLoader 0") as ``{metric: value}``."""
    return dict(re.findall(r"^\W*((?:test|val|train)/\S+)\s+\W*\s*([-\d.e+na]+)", out, flags=re.MULTILINE))


def test_test_on_a_folder_alone_needs_no_training_root(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: --data.root was required (parse error, exit 2); with it, the training data had to be there and was split."""
    monkeypatch.chdir(trained["work"])
    code, out, err = cli_in_process(
        [
            "test",
            *CE_MODEL,
            "--data",
            "UTKFaceDataModule",
            "--data.test_root",
            str(trained["held"]),
            "--ckpt_path",
            str(trained["ckpt"]),
            *QUIET,
            *CSV_LOGGER,
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    table = _test_table(out)
    assert "test/mae" in table and "test/acc" in table, out[-3000:]
    assert float(table["test/images"]) == 10, table  # how many images were scored
    assert not [k for k in table if k.startswith("val/")], table  # the checkpoint's val/*_best is no test metric
    assert re.search(r"^logs \(CSV\): runs/\w+/version_\d+$", out, flags=re.MULTILINE), out[-1500:]
    assert "TensorBoard" not in out


def test_a_test_folder_under_other_bins_is_checked_against_the_checkpoint(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(trained["work"])
    code, out, err = cli_in_process(
        [
            "test",
            *CE_MODEL,
            "--data",
            "UTKFaceDataModule",
            "--data.test_root",
            str(trained["held"]),
            "--data.age_bins",
            "[0, 5, 10, 20, 30, 40, 50, 65]",
            "--ckpt_path",
            str(trained["ckpt"]),
            *QUIET,
            *CSV_LOGGER,
        ],
        capsys,
    )
    lines = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
    assert code == 1 and len(lines) == 1 and "test/mae" not in out, err[-3000:]
    assert "the checkpoint was trained on classes" in lines[0] and "'60+'" in lines[0] and "'65+'" in lines[0], lines[0]


def test_fit_and_validate_without_a_root_name_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    _utk(tmp_path / "held", AGES, 0)
    code, out, err = cli_in_process(
        [
            "fit",
            *CE_MODEL,
            "--data",
            "UTKFaceDataModule",
            "--data.test_root",
            str(tmp_path / "held"),
            "--trainer.max_epochs",
            "1",
            *QUIET,
            *CSV_LOGGER,
        ],
        capsys,
    )
    lines = [ln for ln in err.splitlines() if ln.startswith("cloc-lightning: error:")]
    assert code == 1 and len(lines) == 1 and "Epoch" not in out, err[-3000:]
    assert "data.root is not set" in lines[0] and "fit" in lines[0] and "data.test_root" in lines[0], lines[0]


def test_a_test_folder_sharing_files_with_the_training_split_is_counted(
    trained: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: 3 byte-identical copies of training faces under other names and ages, and one training file name,
    were scored as held-out faces without a word."""
    dm = UTKFaceDataModule(str(trained["root"]), num_workers=0)
    train = dm._ensure_base()["train"].files  # type: ignore[attr-defined]
    dup = tmp_path / "dup"
    _utk(dup, [15, 25, 35, 45], 5000)  # new faces
    for i, src in enumerate(train[:3]):  # the same bytes, another name (and age)
        shutil.copy(src, dup / f"{90 + i}_1_0_2018{i:09d}.jpg.chip.jpg")
    png(dup / Path(train[3]).name, 7777)  # a training file's name, other bytes
    monkeypatch.chdir(trained["work"])
    with pytest.warns(UserWarning) as rec:  # in-process: pytest records the warnings (on the console: stderr)
        code, out, err = cli_in_process(
            [
                "test",
                *CE_MODEL,
                "--data",
                "UTKFaceDataModule",
                "--data.root",
                str(trained["root"]),
                "--data.test_root",
                str(dup),
                "--ckpt_path",
                str(trained["ckpt"]),
                *QUIET,
                *CSV_LOGGER,
            ],
            capsys,
        )
    assert code == 0, err[-3000:]
    warned = [str(w.message) for w in rec if "training split" in str(w.message)]
    assert len(warned) == 1, err[-3000:]
    line = warned[0]
    assert "4 of 8 test image(s)" in line and "3 byte-identical" in line and "1 with a training file's name" in line, line
    assert str(dup) in line and str(trained["root"]) in line, line
    assert float(_test_table(out)["test/images"]) == 8  # still scored: a warning, with the count


def test_predict_on_a_utkface_folder_writes_the_targets(
    trained: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Before: no target column, although every file name holds its age."""
    monkeypatch.chdir(trained["work"])
    code, out, err = cli_in_process(
        [
            "predict",
            *CE_MODEL,
            "--data",
            "UTKFaceDataModule",
            "--data.predict_root",
            str(trained["held"]),
            "--ckpt_path",
            str(trained["ckpt"]),
            *QUIET,
            *CSV_LOGGER,
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    path = trained["work"] / re.findall(r"predictions written to (\S+?\.csv)", out)[-1]
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    dm = UTKFaceDataModule(str(trained["root"]))
    assert len(rows) == 10 and "target" in rows[0], rows[:1]
    for row in rows:
        age = int(Path(row["path"]).name.split("_")[0])
        assert int(row["target"]) == dm.age_to_label(age), row


def test_predict_on_class_folders_reads_the_targets(tmp_path: Path) -> None:
    """An image folder's predict_root with the training classes as sub-folders gives targets (other folders: none)."""
    for split in ("train", "test"):
        for c in ("cat", "dog"):
            for i in range(2):
                png(tmp_path / "data" / split / c / f"{i}.png", i)
    for c, n in (("dog", 2), ("cat", 1)):
        for i in range(n):
            png(tmp_path / "new" / c / f"x{i}.png", 50 + i)
    dm = ImageFolderDataModule(str(tmp_path / "data"), predict_root=str(tmp_path / "new"), num_workers=0)
    dm.setup("predict")
    assert dm.predict_set is not None
    base = dm.predict_set.base
    assert [Path(f).parent.name for f in base.files] == ["cat", "dog", "dog"]
    assert base.labelled and list(base.targets) == [0, 1, 1]
    png(tmp_path / "loose" / "a.png", 1)
    png(tmp_path / "loose" / "sub" / "b.png", 2)
    dm = ImageFolderDataModule(str(tmp_path / "data"), predict_root=str(tmp_path / "loose"), num_workers=0)
    dm.setup("predict")
    assert dm.predict_set is not None and not dm.predict_set.base.labelled
