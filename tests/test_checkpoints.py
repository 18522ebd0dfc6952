"""Checkpoint callbacks and checks, in process (the CLI paths are in ``tests/e2e/test_e2e.py``).

* ``last.ckpt`` is the last epoch even when validation never improves after epoch 0
  (Lightning's ``ModelCheckpoint(monitor, save_last=True)`` rewrites it only on improvement).
* A ``ModelCheckpoint`` the user configures is kept; one that ties ``save_last`` to a metric
  gets a ``LatestCheckpoint`` next to it.
* A checkpoint of another module class or backbone is refused before any weight loads; a
  subclass may load its parent's checkpoint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from cloc_lightning.callbacks import BestCheckpoint, LatestCheckpoint
from cloc_lightning.checkpoints import MODULE_META_KEY, CheckpointMismatchError, checkpoint_mismatch
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CEModule, CLOCModule
from tests.conftest import TINY_BACKBONE, cpu_trainer, tiny_shapes

_dm = tiny_shapes  # 4 classes, 64/32/32 images, batches of 16: 4 training steps per epoch


def _trainer(tmp_path: Path, callbacks: list[Any] | None = None, epochs: int = 4) -> L.Trainer:
    return cpu_trainer(tmp_path, max_epochs=epochs, callbacks=callbacks or [], limit_train_batches=2, limit_val_batches=2)


class WorseEveryEpoch(L.Callback):
    """Adds a growing offset to the monitored metric, so only epoch 0 is ever the best."""

    def on_validation_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        pl_module.log("val/mae", torch.tensor(float(trainer.current_epoch) + 10.0))


def test_last_checkpoint_is_the_last_epoch_when_validation_never_improves(tmp_path: Path) -> None:
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    trainer = _trainer(tmp_path, [WorseEveryEpoch()])
    trainer.fit(model, datamodule=_dm())
    best = trainer.checkpoint_callback
    assert isinstance(best, BestCheckpoint)
    assert Path(best.best_model_path).name.startswith("best-000")  # only epoch 0 was "best"
    last = torch.load(best.last_model_path, map_location="cpu", weights_only=False)
    assert last["epoch"] == 3 and last["global_step"] == 8
    # Lightning's own ModelCheckpoint(monitor, save_last=True) would have kept epoch 0 in last.ckpt
    plain = ModelCheckpoint(dirpath=str(tmp_path / "plain"), monitor="val/mae", save_last=True)
    trainer2 = _trainer(tmp_path / "2", [WorseEveryEpoch(), plain])
    with pytest.MonkeyPatch.context() as mp:  # keep the user's callback as Lightning would run it
        mp.setattr(CEModule, "configure_callbacks", lambda self: [])
        trainer2.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    assert torch.load(plain.last_model_path, map_location="cpu", weights_only=False)["epoch"] == 0


def test_user_checkpoints_are_kept_and_a_tied_save_last_gets_a_latest_checkpoint(tmp_path: Path, capsys: Any) -> None:
    every_step = ModelCheckpoint(dirpath=str(tmp_path / "steps"), every_n_train_steps=1, save_last=True)
    trainer = _trainer(tmp_path, [every_step], epochs=1)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    kinds = [type(cb) for cb in trainer.checkpoint_callbacks]
    assert kinds == [ModelCheckpoint]  # kept as configured, nothing added (its last.ckpt is every step)

    tied = ModelCheckpoint(dirpath=str(tmp_path / "tied"), monitor="val/mae", save_last=True)
    trainer = _trainer(tmp_path, [WorseEveryEpoch(), tied], epochs=3)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    assert "a LatestCheckpoint writes it after every epoch instead" in capsys.readouterr().out
    assert tied.save_last is False and tied in trainer.checkpoint_callbacks
    latest = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, LatestCheckpoint)]
    assert len(latest) == 1 and Path(latest[0].path) == tmp_path / "tied" / "last.ckpt"
    assert torch.load(latest[0].path, map_location="cpu", weights_only=False)["epoch"] == 2


def test_a_checkpoint_of_another_module_or_backbone_is_refused(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path, epochs=1)
    trainer.fit(CEModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm())
    ce_ckpt = trainer.checkpoint_callback.last_model_path
    stored = torch.load(ce_ckpt, map_location="cpu", weights_only=False)[MODULE_META_KEY]
    assert stored["class_path"].endswith("CEModule") and stored["backbone"] == TINY_BACKBONE

    with pytest.raises(CheckpointMismatchError, match=r"written by CEModule .* configured model is CLOCModule"):
        _trainer(tmp_path).test(CLOCModule(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm(), ckpt_path=ce_ckpt)
    with pytest.raises(CheckpointMismatchError, match=r"backbone: checkpoint 'test_resnet' vs configured 'resnet18'"):
        _trainer(tmp_path).test(CEModule(num_classes=4, backbone="resnet18"), datamodule=_dm(), ckpt_path=ce_ckpt)

    class MyCE(CEModule):  # a user's subclass resumes its parent's checkpoint
        pass

    _trainer(tmp_path).test(MyCE(num_classes=4, backbone=TINY_BACKBONE), datamodule=_dm(), ckpt_path=ce_ckpt)
    # and checkpoints written before the record existed are judged by their hyper-parameters
    legacy = {"hyper_parameters": {"backbone": "resnet50"}}
    assert "resnet50" in str(checkpoint_mismatch(CEModule, {"backbone": TINY_BACKBONE}, legacy))
    assert checkpoint_mismatch(CEModule, {"backbone": TINY_BACKBONE}, {"state_dict": {}}) is None


def _cli(args: list[str], capsys: Any) -> tuple[int, str, str]:
    """``cloc-lightning <args>`` in process: (exit code, stdout, stderr)."""
    from cloc_lightning.cli import main

    code = 0
    try:
        main(args)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


def _tiny_cli(tmp_path: Path, num_classes: int) -> list[str]:
    return [
        "--model", "CLOCModule", "--model.num_classes", str(num_classes), "--model.backbone", TINY_BACKBONE,
        "--data", "OrdinalShapesDataModule", "--data.num_classes", str(num_classes), "--data.image_size", "16",
        "--data.train_size", "16", "--data.val_size", "8", "--data.test_size", "8", "--data.batch_size", "8",
        "--data.num_workers", "0", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false",
        "--trainer.logger.init_args.save_dir", str(tmp_path / "runs"),
    ]


def test_init_from_a_margins_yaml_is_one_line_naming_the_file_kind(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Issue 29 item 8: was a 50-line UnpicklingError traceback."""
    import sys

    import yaml

    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    margins = tmp_path / "cloc_margins.yaml"
    margins.write_text(yaml.safe_dump({"learnable_map": [["fixed", 0.5]] * 3, "margin_mode": "mm"}))
    code, out, err = _cli(["fit", *_tiny_cli(tmp_path, 4), "--model.init_from", str(margins)], capsys)
    assert code == 1
    lines = [line for line in err.splitlines() if line.strip() and "Warning" not in line and not line.startswith(" ")]
    assert lines[-2].startswith(f"cloc-lightning: error: cannot read '{margins}' as a PyTorch checkpoint: it is a YAML "
                                "file of CLOC margins"), err[-2000:]
    assert "init_from takes a .ckpt file" in lines[-2] and "--model.learnable_map" in lines[-2]
    assert "Traceback" not in err and "Epoch" not in out
    # the Python API says the same, and a text file that is no YAML mapping is named as what it is
    (tmp_path / "notes.txt").write_text("not a checkpoint\n")
    with pytest.raises(ValueError, match=r"cannot read '.*notes.txt' as a PyTorch checkpoint: it is a text file"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE).load_weights(str(tmp_path / "notes.txt"))
    with pytest.raises(FileNotFoundError, match=r"init_from checkpoint '.*missing.ckpt' does not exist; init_from takes"):
        CLOCModule(num_classes=4, backbone=TINY_BACKBONE).load_weights(str(tmp_path / "missing.ckpt"))


def test_a_checkpoint_of_another_class_count_names_which_side_said_what(tmp_path: Path, capsys: Any, monkeypatch: Any) -> None:
    """Issue 29 item 9: validate with an 8-class checkpoint under a 5-class config blamed 'model.num_classes=8'."""
    import sys

    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    eight = CLOCModule(num_classes=8, backbone=TINY_BACKBONE)
    trainer = L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path))
    trainer.strategy.connect(eight)
    trainer.save_checkpoint(str(tmp_path / "eight.ckpt"))
    code, _out, err = _cli(["validate", *_tiny_cli(tmp_path, 5), "--ckpt_path", str(tmp_path / "eight.ckpt")], capsys)
    assert code == 1
    assert "the checkpoint was trained with num_classes=8, but the configured model says num_classes=5" in err, err[-2000:]
    assert "model.num_classes=8 but" not in err
    # the Python API: refused before any weight loads, both values named
    with pytest.raises(CheckpointMismatchError, match="trained with num_classes=8, but the configured model says num_classes=5"):
        L.Trainer(logger=False, enable_progress_bar=False, default_root_dir=str(tmp_path)).validate(
            CLOCModule(num_classes=5, backbone=TINY_BACKBONE),
            datamodule=OrdinalShapesDataModule(num_classes=5, val_size=8, batch_size=8, num_workers=0, image_size=16),
            ckpt_path=str(tmp_path / "eight.ckpt"),
        )
