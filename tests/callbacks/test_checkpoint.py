"""The checkpoint callbacks, in process (the CLI paths are in ``tests/e2e/test_e2e.py``).

* ``last.ckpt`` is the last epoch even when validation never improves after epoch 0
  (Lightning's ``ModelCheckpoint(monitor, save_last=True)`` rewrites it only on improvement).
* A ``ModelCheckpoint`` the user configures is kept; one that ties ``save_last`` to a metric
  gets a ``LatestCheckpoint`` next to it.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from cloc_lightning.callbacks import BestCheckpoint, LatestCheckpoint
from cloc_lightning.methods import CEModule
from tests.conftest import TINY_BACKBONE, cpu_trainer, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


_trainer = functools.partial(cpu_trainer, max_epochs=4, limit_train_batches=2, limit_val_batches=2)


class WorseEveryEpoch(L.Callback):
    """Adds a growing offset to the monitored metric, so only epoch 0 is ever the best."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("val/mae", torch.tensor(float(trainer.current_epoch) + 10.0))


def test_last_checkpoint_is_the_last_epoch_when_validation_never_improves(tmp_path: Path) -> None:
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    trainer = _trainer(tmp_path, callbacks=[WorseEveryEpoch()])
    trainer.fit(model, datamodule=_dm())
    best = trainer.checkpoint_callback
    assert isinstance(best, BestCheckpoint)
    assert Path(best.best_model_path).name.startswith("best-000")  # only epoch 0 was "best"
    last = torch.load(best.last_model_path, map_location="cpu", weights_only=False)
    assert last["epoch"] == 3 and last["global_step"] == 8
    # Lightning's own ModelCheckpoint(monitor, save_last=True) would have kept epoch 0 in last.ckpt
    plain = ModelCheckpoint(dirpath=str(tmp_path / "plain"), monitor="val/mae", save_last=True)
    trainer2 = _trainer(tmp_path / "2", callbacks=[WorseEveryEpoch(), plain])
    with pytest.MonkeyPatch.context() as mp:  # keep the user's callback as Lightning would run it
        mp.setattr(CEModule, "configure_callbacks", lambda self: [])
        trainer2.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    assert torch.load(plain.last_model_path, map_location="cpu", weights_only=False)["epoch"] == 0


def test_user_checkpoints_are_kept_and_a_tied_save_last_gets_a_latest_checkpoint(tmp_path: Path, capsys: Any) -> None:
    every_step = ModelCheckpoint(dirpath=str(tmp_path / "steps"), every_n_train_steps=1, save_last=True)
    trainer = _trainer(tmp_path, callbacks=[every_step], max_epochs=1)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    kinds = [type(cb) for cb in trainer.checkpoint_callbacks]
    assert kinds == [ModelCheckpoint]  # kept as configured, nothing added (its last.ckpt is every step)

    tied = ModelCheckpoint(dirpath=str(tmp_path / "tied"), monitor="val/mae", save_last=True)
    trainer = _trainer(tmp_path, callbacks=[WorseEveryEpoch(), tied], max_epochs=3)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    assert "a LatestCheckpoint writes it after every epoch instead" in capsys.readouterr().out
    assert tied.save_last is False and tied in trainer.checkpoint_callbacks
    latest = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, LatestCheckpoint)]
    assert len(latest) == 1 and Path(latest[0].path) == tmp_path / "tied" / "last.ckpt"
    assert torch.load(latest[0].path, map_location="cpu", weights_only=False)["epoch"] == 2
