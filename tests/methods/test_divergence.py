"""A diverged run (issue 29, item 3): NaN/inf outputs are failures, never a valid prediction or an improvement.

* the metrics of :mod:`cloc_lightning.metrics` are NaN as soon as one scored row is NaN/inf (the arg-max of a NaN row
  is a class index, which used to be scored as a guess);
* ``BestCheckpoint`` never keeps a NaN epoch as the best (Lightning's ``ModelCheckpoint`` keeps a first NaN epoch),
  the module says so on stderr naming the metric, the epoch and the fix, and the final/best summary has no NaN best;
* ``test_after_fit`` on such a run warns that its NaN test metrics are no result;
* margins that are not finite and > 0 (``--model.lr 1e8``: softplus of a raw margin at -inf is 0.0) are never written
  as a margins YAML, at the freeze or at the end of fit.
"""

from __future__ import annotations

import functools
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from cloc_lightning.callbacks import CLOCMarginFreeze
from cloc_lightning.methods import CLOCModule
from cloc_lightning.metrics import build_metrics
from tests._reliability import SMALL, _shapes
from tests.conftest import REPO, cli_in_process, cpu_trainer


class PoisonAtValidation(L.Callback):
    """Make the model's outputs NaN from the validation of epoch ``epoch`` on (what a diverged model gives)."""

    def __init__(self, epoch: int = 0) -> None:
        self.epoch = epoch

    def on_validation_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not trainer.sanity_checking and trainer.current_epoch >= self.epoch:
            with torch.no_grad():
                pl_module.head.weight.fill_(float("nan"))


_trainer = functools.partial(cpu_trainer, limit_train_batches=2, limit_val_batches=1, num_sanity_val_steps=0)


def _fit(model: L.LightningModule, trainer: L.Trainer) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=_shapes(image_size=16))


@pytest.mark.parametrize("task", ["ordinal", "nominal"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_metrics_are_nan_when_any_output_row_is_not_finite(task: str, bad: float) -> None:
    torch.manual_seed(0)
    scores, target = torch.randn(16, 6), torch.randint(0, 6, (16,))
    clean = build_metrics(task, 6)  # type: ignore[arg-type]
    clean.update(scores, target)
    reference = {k: float(v) for k, v in clean.compute().items()}
    metrics = build_metrics(task, 6)  # type: ignore[arg-type]
    metrics.update(scores, target)
    poisoned = scores.clone()
    poisoned[5, 2] = bad  # one entry of one row, in the second batch
    metrics.update(poisoned, target)
    values = {k: float(v) for k, v in metrics.compute().items()}
    assert values and all(v != v for v in values.values()), values  # every metric NaN
    metrics.reset()  # a new epoch starts clean, and finite scores give the same values as before
    metrics.update(scores, target)
    assert {k: float(v) for k, v in metrics.compute().items()} == reference


def test_a_nan_validation_epoch_is_never_the_best_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Epoch 0 finite, epoch 1 NaN: the best stays epoch 0, and stderr names the metric, the epoch and the fix."""
    model = CLOCModule(num_classes=4, **SMALL)
    trainer = _trainer(tmp_path, callbacks=[PoisonAtValidation(epoch=1)], max_epochs=2)
    _fit(model, trainer)
    best = trainer.checkpoint_callback.best_model_path  # type: ignore[union-attr]
    assert Path(best).name.startswith("best-000-"), best
    assert (
        model.val_summary["val/mae"]["best_epoch"] == 0.0 and model.val_summary["val/mae"]["final"] != model.val_summary["val/mae"]["final"]
    )
    err = capsys.readouterr().err
    assert "the monitored metric val/mae is nan at epoch 1" in err and "--model.lr" in err and "gradient_clip_val" in err, err


def test_a_run_nan_in_every_epoch_has_no_best_checkpoint(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's ModelCheckpoint kept a first NaN epoch as 'best' (ranked as inf); BestCheckpoint keeps none."""
    model = CLOCModule(num_classes=4, **SMALL)
    trainer = _trainer(tmp_path, callbacks=[PoisonAtValidation(epoch=0)], max_epochs=1)
    _fit(model, trainer)
    assert trainer.checkpoint_callback.best_model_path == ""  # type: ignore[union-attr]
    assert not list(tmp_path.rglob("best-*.ckpt")) and list(tmp_path.rglob("last.ckpt"))  # last is still the last epoch
    assert "best none (no epoch had a finite value" in model.summary_line()
    assert "val/mae is nan at epoch 0" in capsys.readouterr().err


def _cli_args(tmp_path: Path, *extra: str) -> list[str]:
    return [
        "--data",
        "OrdinalShapesDataModule",
        "--data.num_classes",
        "4",
        "--data.image_size",
        "16",
        "--data.train_size",
        "32",
        "--data.val_size",
        "8",
        "--data.test_size",
        "8",
        "--data.batch_size",
        "8",
        "--data.num_workers",
        "0",
        "--trainer.limit_train_batches",
        "2",
        "--trainer.limit_val_batches",
        "1",
        "--trainer.limit_test_batches",
        "1",
        "--trainer.enable_progress_bar",
        "false",
        "--trainer.enable_model_summary",
        "false",
        "--trainer.num_sanity_val_steps",
        "0",
        "--trainer.logger.init_args.save_dir",
        str(tmp_path / "runs"),
        *extra,
    ]


_run = cli_in_process


def test_test_after_fit_of_a_diverged_run_warns_that_its_metrics_are_no_result(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    code, out, err = _run(
        [
            "fit",
            "--model",
            "CLOCModule",
            "--model.num_classes",
            "4",
            "--model.backbone",
            "test_resnet",
            "--trainer.max_epochs",
            "1",
            "--test_after_fit",
            "true",
            "--trainer.callbacks+=tests.methods.test_divergence.PoisonAtValidation",
            *_cli_args(tmp_path),
        ],
        capsys,
    )
    assert code == 0, err[-3000:]
    assert not list((tmp_path / "runs").rglob("best-*.ckpt"))  # no "best" of a diverged run
    assert "val/mae is nan at epoch 0" in err
    assert "test_after_fit: no best checkpoint was saved" in out
    assert "warning: CLOCModule: the test metrics ['test/acc'" in err and "are NaN/inf" in err and "no result" in err, err


def test_diverged_margins_are_not_written_at_the_end_of_fit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's command: the demo config with --model.lr 1e8 (here shortened): the 0.0 margins are refused, named."""
    monkeypatch.setattr(sys, "argv", ["cloc-lightning"])
    code, _out, err = _run(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "cloc" / "demo.yaml"),
            "--model.lr",
            "1e8",
            "--model.backbone",
            "test_resnet",
            "--trainer.max_epochs",
            "1",
            "--trainer.callbacks.init_args.freeze_at_epoch",
            "null",
            *_cli_args(tmp_path, "--data.num_classes", "6", "--model.num_classes", "6"),
        ],
        capsys,
    )
    assert code == 1
    assert "error: CLOCMarginFreeze: the learned margins at the end of fit (after 1 epoch(s)) are [0.0, 0.0" in err, err[-3000:]
    assert "are not finite and > 0" in err and "--model.lr" in err
    assert not list((tmp_path / "runs").rglob("cloc_margins.yaml"))


def test_diverged_margins_are_not_frozen_into_phase_two(tmp_path: Path) -> None:
    model = CLOCModule(num_classes=4, **SMALL, lr=1e8)
    freeze = CLOCMarginFreeze(freeze_at_epoch=1)
    trainer = _trainer(tmp_path, callbacks=[freeze], max_epochs=2)
    with pytest.raises(ValueError, match=r"learned margins at the freeze \(start of epoch 1\) are \[0\.0, 0\.0, 0\.0\]"):
        _fit(model, trainer)
    assert freeze.path is None and not list(tmp_path.rglob("cloc_margins.yaml"))
