"""Runs that train nothing, or not what the config says (issue 29, item 7), and the margins line of a run.

* ``max_epochs 0``, ``max_steps 0`` or ``limit_train_batches 0``: refused at the start of fit with one error naming
  the setting and the fix (``validate``/``test`` with a checkpoint), instead of testing the untrained model and
  writing a "final" margins YAML with exit code 0;
* ``CLOCMarginFreeze(freeze_at_epoch=5)`` with ``max_epochs 1`` never reaches phase two: a warning at fit start
  names both values (the run still gives a labelled phase-one result, so it is not refused);
* the "CLOC margins (frozen) written to …" line is printed on a line of its own, not glued onto the progress bar.
"""

from __future__ import annotations

import re
import sys
import warnings
from functools import partial
from pathlib import Path

import lightning as L
import pytest

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.cli import main
from cloc_lightning.methods import CEModule, CLOCModule
from tests._reliability import SMALL, _shapes
from tests.conftest import REPO, cpu_trainer

_trainer = partial(cpu_trainer, max_epochs=1, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)


@pytest.mark.parametrize(
    ("setting", "value", "what"),
    [
        ("max_epochs", 0, "0 epochs"),
        ("limit_train_batches", 0, "0 batches per epoch"),
        ("limit_train_batches", 0.0, "0 batches per epoch"),
        ("max_steps", 0, "0 optimiser steps"),
    ],
)
def test_a_fit_that_trains_nothing_is_refused(tmp_path: Path, setting: str, value: float, what: str) -> None:
    trainer = _trainer(tmp_path, **{setting: value})
    with warnings.catch_warnings(), pytest.raises(ValueError) as info:
        warnings.simplefilter("ignore")
        trainer.fit(CEModule(num_classes=4, **SMALL), datamodule=_shapes(image_size=16))
    message = str(info.value)
    assert f"trainer.{setting}={value}: fit would train on {what}" in message
    assert f"--trainer.{setting}" in message and "cloc-lightning validate" in message and "--ckpt_path" in message


def test_max_epochs_0_through_the_cli_is_one_error_and_writes_no_margins(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    code = 0
    try:
        main(
            [
                "fit",
                "--config",
                str(REPO / "configs" / "cloc" / "demo.yaml"),
                "--trainer.max_epochs",
                "0",
                "--model.backbone",
                "test_resnet",
                "--data.image_size",
                "16",
                "--data.num_workers",
                "0",
                "--trainer.enable_progress_bar",
                "false",
                "--trainer.logger.init_args.save_dir",
                str(tmp_path / "runs"),
            ]
        )
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    out, err = capsys.readouterr()
    assert code == 1, (out[-2000:], err[-2000:])
    assert "cloc-lightning: error: CLOCModule: trainer.max_epochs=0: fit would train on 0 epochs" in err
    assert "Test metric" not in out and not list(tmp_path.rglob("cloc_margins.yaml"))


def test_freeze_epoch_never_reached_is_said_at_fit_start(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trainer(tmp_path, callbacks=[CLOCMarginFreeze(freeze_at_epoch=5)], logger=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(CLOCModule(num_classes=4, **SMALL), datamodule=_shapes(image_size=16))
    out, err = capsys.readouterr()
    assert "warning: CLOCMarginFreeze(freeze_at_epoch=5) with trainer.max_epochs=1: the margins will never be frozen" in err
    assert "phase two will not run" in err and "--trainer.max_epochs 6" in err
    assert "CLOC margins (final) written to" in out  # the labelled phase-one result is still written


def test_the_margins_line_is_not_glued_onto_the_progress_bar(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    trainer = _trainer(tmp_path, max_epochs=2, enable_progress_bar=True, callbacks=[CLOCMarginFreeze(freeze_at_epoch=1)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(CLOCModule(num_classes=4, **SMALL), datamodule=_shapes(image_size=16))
    out = capsys.readouterr().out
    at = out.index("CLOC margins (frozen) written to")
    assert "Epoch 0" in out[:at]  # the bar was drawn before the line
    same_line = re.split(r"[\r\n]", out[:at])[-1]
    assert same_line.strip() == "", f"glued onto {same_line!r}"


def test_init_from_on_a_resumed_fit_says_the_checkpoint_replaces_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning restores ``--ckpt_path`` after ``setup`` applied ``init_from``: the run says which weights it trains."""
    from cloc_lightning.methods import CEModule
    from tests._reliability import SMALL, _shapes

    def fit(init_from: str | None, ckpt: str | None, root: Path) -> L.Trainer:
        trainer = cpu_trainer(root, max_epochs=1 if ckpt is None else 2, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)
        trainer.fit(CEModule(num_classes=4, init_from=init_from, **SMALL), datamodule=_shapes(), ckpt_path=ckpt)
        return trainer

    first = fit(None, None, tmp_path / "a")
    ckpt = first.checkpoint_callback.last_model_path  # type: ignore[union-attr]
    capsys.readouterr()
    fit(ckpt, ckpt, tmp_path / "b")
    out = capsys.readouterr().out
    assert f"init_from {ckpt}: loaded" in out
    assert f"init_from {ckpt}: replaced by the weights of the resumed checkpoint (--ckpt_path {ckpt})" in out
