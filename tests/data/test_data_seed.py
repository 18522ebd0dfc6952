"""``data.seed: null`` (the default) follows the run's seed; the checkpoint keeps the seed in use; an explicit one wins.

Before issue 49 ``data.seed`` defaulted to 0: runs that differed only in ``--seed_everything`` drew the same
training order and the same augmentations, on both paths, so "3 seeds" varied only the initialisation.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from cloc_lightning.cli import main as cli_main
from cloc_lightning.data import OrdinalShapesDataModule
from tests._reliability import SMALL, assert_same

KW: dict[str, Any] = dict(num_classes=3, train_size=32, val_size=8, test_size=8, batch_size=8, num_workers=0)


def _first_batch(seed_everything: int | None, augment_on: str = "loader", **kw: Any) -> torch.Tensor:
    os.environ.pop("PL_GLOBAL_SEED", None)
    if seed_everything is not None:
        L.seed_everything(seed_everything, verbose=False)
    dm = OrdinalShapesDataModule(augment="rrc_flip", augment_on=augment_on, cache="none", **KW, **kw)
    dm.setup("fit")
    batch = dm.on_after_batch_transfer(next(iter(dm.train_dataloader())), 0)
    return batch[0]


@pytest.mark.parametrize("augment_on", ["loader", "device"])
def test_the_run_seed_reaches_order_and_augmentation(augment_on: str) -> None:
    a, b, a2 = (_first_batch(s, augment_on) for s in (1, 2, 1))
    assert torch.equal(a, a2)  # the same run seed: the same batch
    assert not torch.equal(a, b)  # another run seed: another order and other views (was equal: data.seed 0 for both)
    # an explicit data.seed wins over the run's seed
    assert torch.equal(_first_batch(1, augment_on, seed=7), _first_batch(2, augment_on, seed=7))


def test_unseeded_runs_use_zero_and_say_where_the_seed_came_from() -> None:
    os.environ.pop("PL_GLOBAL_SEED", None)
    dm = OrdinalShapesDataModule(**KW)
    dm.setup("fit")
    assert dm.train_seed == 0 and dm.seed_origin() == "default" and dm.seed is None
    L.seed_everything(11, verbose=False)
    dm = OrdinalShapesDataModule(**KW)
    dm.setup("fit")
    assert dm.train_seed == 11 and dm.seed_origin() == "seed_everything" and dm.train_set.seed == 11
    assert dm.state_dict()["data_seed"] == 11
    explicit = OrdinalShapesDataModule(seed=3, **KW)
    explicit.setup("fit")
    assert explicit.train_seed == 3 and explicit.seed_origin() == "data.seed"


def test_a_checkpoints_seed_is_restored_and_an_explicit_one_wins_with_a_warning() -> None:
    L.seed_everything(5, verbose=False)
    dm = OrdinalShapesDataModule(augment_on="device", cache="none", augment="rrc_flip", **KW)
    dm.setup("fit")
    dm.load_state_dict({"class_names": dm.class_names, "data_seed": 9})
    assert dm.train_seed == 9 and dm.seed_origin() == "checkpoint"
    assert dm.train_set.seed == 9 and dm._device_sets["train"].seed == 9 and dm.device_augment().seed == 9
    explicit = OrdinalShapesDataModule(seed=4, **KW)
    explicit.setup("fit")
    with pytest.warns(UserWarning, match=r"trained with data seed 9, and data.seed=4 is set.*set data.seed: null"):
        explicit.load_state_dict({"class_names": explicit.class_names, "data_seed": 9})
    assert explicit.train_seed == 4


@pytest.mark.slow  # kill and resume: the long tier (pytest -m slow)
def test_a_resume_under_another_run_seed_continues_the_checkpoints_data(tmp_path: Path) -> None:
    """Stopped at step 3, resumed by a run whose own seed differs (``seed_everything: true`` draws a new one): the same weights."""
    from lightning.pytorch.callbacks import ModelCheckpoint

    from cloc_lightning.methods import CEModule
    from tests._reliability import _trainer

    class Killed(Exception):
        pass

    class Stop(L.Callback):
        def on_train_batch_start(self, trainer: L.Trainer, *args: Any) -> None:
            if trainer.global_step == 3:
                raise Killed

    def run(folder: str, seed: int, ckpt: str | None = None, stop: bool = False) -> L.LightningModule:
        L.seed_everything(seed, verbose=False)
        model = CEModule(num_classes=3, **SMALL)
        dm = OrdinalShapesDataModule(augment="rrc_flip", **{**KW, "batch_size": 16})
        cbs: list[L.Callback] = [ModelCheckpoint(dirpath=str(tmp_path / folder), every_n_train_steps=1, save_last=True)]
        if stop:
            cbs.append(Stop())
        trainer = _trainer(tmp_path, max_epochs=2, limit_train_batches=None, limit_val_batches=0, callbacks=cbs, enable_checkpointing=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with contextlib.suppress(Killed):
                trainer.fit(model, dm, ckpt_path=ckpt)
        return model

    full = run("full", 5)
    run("part", 5, stop=True)
    resumed = run("resumed", 6, ckpt=str(tmp_path / "part" / "last.ckpt"))
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")


def _cli_fit(tmp_path: Path, name: str, seed: str, *extra: str) -> Path:
    args = [
        "fit", "--config", "configs/ce/demo.yaml", "--seed_everything", seed, "--model.backbone", "test_resnet",
        "--data.train_size", "24", "--data.val_size", "8", "--data.test_size", "8", "--data.batch_size", "8", "--data.num_workers", "0",
        "--trainer.max_epochs", "1", "--trainer.accelerator", "cpu", "--trainer.enable_progress_bar", "false",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", str(tmp_path), "--trainer.logger.name", name,
        "--trainer.callbacks", "[]", "--test_after_fit", "false", *extra,
    ]  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cli_main(args)
    return tmp_path / name / "version_0"


def test_the_cli_records_the_seed_in_use_with_seed_everything_true(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--seed_everything true`` draws a seed (Lightning 2.6 alone takes 0); config.yaml keeps it and data.json the data seed."""
    monkeypatch.delenv("PL_GLOBAL_SEED", raising=False)
    drawn = []
    for name in ("random1", "random2"):
        os.environ.pop("PL_GLOBAL_SEED", None)
        run = _cli_fit(tmp_path, name, "true")
        seed = yaml.safe_load((run / "config.yaml").read_text())["seed_everything"]
        record = yaml.safe_load((run / "data.json").read_text())
        assert isinstance(seed, int) and record["seed"] == seed and record["seed_from"] == "seed_everything"
        assert record["source"].startswith("OrdinalShapesDataModule(") and record["stores"] == []
        drawn.append(seed)
    assert drawn[0] != drawn[1]  # two draws in [0, 2**31): equal once in two billion (was 0 and 0)
    monkeypatch.setenv("PL_GLOBAL_SEED", "77")  # what Lightning's DDP launcher hands its other processes
    run = _cli_fit(tmp_path, "inherited", "true")
    assert yaml.safe_load((run / "config.yaml").read_text())["seed_everything"] == 77


def test_a_resumed_run_records_the_checkpoints_data_seed(tmp_path: Path) -> None:
    os.environ.pop("PL_GLOBAL_SEED", None)
    run = _cli_fit(tmp_path, "resumed", "4")
    _cli_fit(tmp_path, "resumed", "9", "--ckpt_path", str(next(run.rglob("last*.ckpt"))), "--trainer.max_epochs", "2")
    record = yaml.safe_load((run / "data.resume-1.json").read_text())
    assert record["seed"] == 4 and record["seed_from"] == "checkpoint"  # was the new run's 9, written before the restore


def test_the_run_folder_records_the_stores_key_and_source(tmp_path: Path) -> None:
    run = _cli_fit(tmp_path, "disk", "4", "--data.cache", "disk", "--data.cache_dir", str(tmp_path / "stores"))
    record = yaml.safe_load((run / "data.json").read_text())
    assert record["seed"] == 4 and record["cache"] == "disk"
    assert [s["split"] for s in record["stores"]] == ["train", "val"]  # a fit does not decode the test split
    for store in record["stores"]:
        assert (tmp_path / "stores" / store["key"]).is_dir() and store["folder"] == str(tmp_path / "stores" / store["key"])
        assert store["source"].startswith("OrdinalShapesDataModule(") and store["layout"].startswith("32x32 px")
