"""Reliability of the data modules: out-of-range labels, missing roots, corrupt or unparsable files, dying loader workers."""

from __future__ import annotations

import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from cloc_lightning.data import (
    ImageFolderDataModule,
    UTKFaceDataModule,
)
from cloc_lightning.data.csv_table import CSVDataModule
from cloc_lightning.data.errors import DataConfigError
from cloc_lightning.methods import CEModule
from tests._reliability import (
    SMALL,
    _fit,
    _folder,
    _jpeg,
)
from tests.conftest import REPO, cli_env, cpu_trainer


def test_data_labels_out_of_range_stop_at_setup(tmp_path: Path) -> None:
    """A CSV whose integer labels exceed class_names: stopped before training, with the range."""
    for i in range(6):
        _jpeg(tmp_path / f"{i}.jpg", seed=i)
    (tmp_path / "d.csv").write_text("path,label\n" + "\n".join(f"{i}.jpg,{i % 4}" for i in range(6)))
    with pytest.raises(DataConfigError, match=r"labels must lie in \[0, 3\)"):
        CSVDataModule(str(tmp_path / "d.csv"), class_names=["a", "b", "c"]).setup("fit")
    (tmp_path / "f.csv").write_text("path,label\n" + "\n".join(f"{i}.jpg,{i % 2}.5" for i in range(6)))
    with pytest.raises(DataConfigError, match="not in class_names"):  # non-integer labels need names
        CSVDataModule(str(tmp_path / "f.csv"), class_names=["0", "1"]).setup("fit")


# ---------------------------------------------------------------- data folders and files
def test_missing_or_empty_data_roots(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "noimages" / "a").mkdir(parents=True)
    (tmp_path / "noimages" / "a" / "notes.txt").write_text("x")
    cases = [
        (lambda: UTKFaceDataModule(str(tmp_path / "missing")), "does not exist"),
        (lambda: UTKFaceDataModule(str(tmp_path / "empty")), "contains no image files"),
        (lambda: ImageFolderDataModule(str(tmp_path / "missing")), "does not exist"),
        (lambda: ImageFolderDataModule(str(tmp_path / "empty")), "no class folders"),
        (lambda: ImageFolderDataModule(str(tmp_path / "noimages")), "no images under"),
        (lambda: CSVDataModule(str(tmp_path / "missing.csv")), "does not exist; set data.csv_path"),
    ]
    for make, match in cases:
        with pytest.raises(DataConfigError, match=match):
            make().setup("fit")


def test_corrupt_image_fails_with_the_name_by_default_and_skip_counts(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    bad = root / "train" / "a" / "a3.jpg"
    bad.write_bytes(b"\xff\xd8 truncated jpeg")
    dm = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none")
    dm.setup("test")
    with pytest.raises(RuntimeError, match=r"Cannot read image '.*a3\.jpg'.*bad_files: skip"):
        list(dm.train_dataloader())
    dm = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none", bad_files="skip")
    dm.setup("test")
    with warnings.catch_warnings(record=True) as rec:
        warnings.simplefilter("always")
        n = sum(b[0].shape[0] for b in dm.train_dataloader())
    messages = [str(w.message) for w in rec if "skipping unreadable image" in str(w.message)]
    assert n == 12 and len(messages) == 1  # the next readable image takes the bad one's place
    assert "a3.jpg" in messages[0] and "1 skipped so far" in messages[0]
    assert dm.train_set.base.skipped == 1


def test_skip_leaves_unreadable_files_out_of_evaluation_splits(tmp_path: Path) -> None:
    """An unreadable test/val image is left out (not replaced by its neighbour): metrics and prediction names stay true."""
    import torch

    from cloc_lightning.callbacks.predictions import PredictionWriter

    root = _folder(tmp_path / "data")
    for name in ("a2.jpg", "b5.jpg"):
        (root / "test" / name[0] / name).write_bytes(b"\xff\xd8 truncated jpeg")
    dm = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none", bad_files="skip")
    with pytest.warns(UserWarning, match=r"left 2 unreadable image\(s\) out of the test split.*other 10.*a2\.jpg.*b5\.jpg"):
        dm.setup("test")
    names = [Path(dm.test_set.describe(i)).name for i in range(len(dm.test_set))]
    assert names == [f"a{i}.jpg" for i in (0, 1, 3, 4, 5)] + [f"b{i}.jpg" for i in range(5)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is substituted any more
        batches = list(dm.test_dataloader())
    targets = torch.cat([y for _, y in batches]).tolist()
    assert targets == [0] * 5 + [1] * 5
    # each loaded image is the file its row names (the images differ by their seed)
    from PIL import Image

    for i, name in enumerate(names):
        with Image.open(root / "test" / name[0] / name) as img:
            expected = dm.eval_image_transform()(img.convert("RGB"))
        assert torch.equal(dm.test_set[i][0], expected), name
    # predicting the test split through a Trainer: one CSV row per readable file, under its own name
    model = CEModule(num_classes=2, backbone="test_resnet", backbone_kwargs={"channels": [8, 8, 16, 16]})
    out = tmp_path / "predictions.csv"
    trainer = cpu_trainer(callbacks=[PredictionWriter(str(out))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.predict(model, datamodule=dm, return_predictions=False)
    import csv

    rows = list(csv.DictReader(out.open()))
    assert [Path(r["path"]).name for r in rows] == names and [int(r["target"]) for r in rows] == targets
    # a readable set is kept whole without decoding twice in the loaders; raise mode does not scan at all
    clean = ImageFolderDataModule(str(_folder(tmp_path / "clean")), val_fraction=0.0, batch_size=4, num_workers=0, bad_files="skip")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        clean.setup("test")
    assert len(clean.test_set) == 12
    strict = ImageFolderDataModule(str(root), val_fraction=0.0, batch_size=4, num_workers=0, augment="none")
    strict.setup("test")
    assert len(strict.test_set) == 12
    with pytest.raises(RuntimeError, match=r"Cannot read image '.*a2\.jpg'"):
        list(strict.test_dataloader())


# ---------------------------------------------------------------- data loader faults
@pytest.mark.slow  # loader worker processes killed: the long tier (pytest -m slow)
def test_dying_loader_worker_is_a_clear_error_not_a_hang(tmp_path: Path) -> None:
    script = (
        "import warnings, lightning as L, torch\n"
        "from torch.utils.data import DataLoader\n"
        "from tests._faults import DyingWorkerDataset\n"
        "from cloc_lightning.methods import CEModule\n"
        "warnings.simplefilter('ignore')\n"
        "model = CEModule(num_classes=2, backbone='test_resnet', backbone_kwargs={'channels': [8, 8, 16, 16]})\n"
        "loader = DataLoader(DyingWorkerDataset(), batch_size=4, num_workers=1, persistent_workers=True)\n"
        "trainer = L.Trainer(max_epochs=1, accelerator='cpu', logger=False, enable_checkpointing=False,\n"
        "                    enable_progress_bar=False, enable_model_summary=False)\n"
        "trainer.fit(model, train_dataloaders=loader)\n"
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=cli_env(), capture_output=True, text=True, timeout=180)
    assert proc.returncode != 0
    assert "DataLoader worker (pid" in proc.stderr and "exited unexpectedly" in proc.stderr, proc.stderr[-3000:]
    assert time.monotonic() - t0 < 180


# a loader worker in the long tier (9 s of the fast tier); in the main process it stays fast
@pytest.mark.parametrize("workers", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_file_corrupted_mid_epoch_names_the_file(workers: int, tmp_path: Path) -> None:
    """The file is fine at setup and broken when the loader reaches it (e.g. a network disk): the error names it."""
    root = _folder(tmp_path / "data", n=20)
    dm = ImageFolderDataModule(str(root), val_fraction=0.25, batch_size=4, num_workers=workers, augment="none")
    dm.setup("fit")
    order = list(dm.train_dataloader().sampler)  # epoch 0's order (the epoch-seeded sampler)
    last = len(order) // 4 * 4 - 1  # the last sample of the last full batch (drop_last)
    assert last >= 23  # batch 6 or later: at most batches 0-3 can be loaded when step 0 ends
    victim = Path(dm.train_set.base.files[dm.train_set.indices[order[last]]])

    class Corrupt(L.Callback):
        def on_train_batch_end(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == 1:  # after the first step; loader workers prefetch 2 batches ahead
                victim.write_bytes(b"\x00 not an image any more")

    model = CEModule(num_classes=2, **SMALL)
    with pytest.raises(RuntimeError, match=rf"Cannot read image '.*{victim.name}'.*bad_files: skip"):
        _fit(model, dm, tmp_path, callbacks=[Corrupt()], limit_train_batches=None, limit_val_batches=0)


def test_split_fractions_that_do_not_sum_to_one_are_said_to_be_proportions() -> None:
    """``[0.5, 0.5, 0.5]`` was read as thirds without a word (an outside user); negative or missing shares are refused."""
    from cloc_lightning.data.errors import DataConfigError, check_split_fractions

    with pytest.warns(UserWarning, match=r"sum to 1.5, not 1: read as proportions, \[0.333, 0.333, 0.333\]"):
        assert check_split_fractions([0.5, 0.5, 0.5]) == (0.5, 0.5, 0.5)
    for bad in ([0.5, 0.6, -0.1], [0.5, 0.5], [0, 0, 0], "abc"):
        with pytest.raises(DataConfigError, match="--data.split_fractions .*three shares"):
            check_split_fractions(bad)
