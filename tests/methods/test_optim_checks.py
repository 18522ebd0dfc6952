"""The learning-rate schedule's checks of the run's length (``methods/optim.py``), through the command's entry point."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from benchmarks.option_sweep import run_main

BASE = ["fit", "--model", "CEModule", "--model.backbone", "test_resnet", "--data", "OrdinalShapesDataModule"]
BASE += ["--data.num_workers", "0", "--data.train_size", "16", "--data.val_size", "8", "--data.test_size", "8"]
BASE += ["--data.batch_size", "8", "--data.image_size", "16", "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1"]
BASE += ["--trainer.enable_progress_bar", "false"]


def test_a_schedule_without_an_end_is_one_line_and_leaves_no_run_folder(tmp_path: Path) -> None:
    """``--trainer.max_epochs -1`` (no end) with a cosine schedule was a 50-line OverflowError (an outside user)."""
    out = run_main([*BASE, "--trainer.max_epochs", "-1"], tmp_path)
    assert out.code == 1 and "--model.scheduler cosine: the schedule needs the run's length" in out.stderr, out.stderr[-2000:]
    assert "Traceback" not in out.stderr and not any(tmp_path.iterdir())


def test_a_warm_up_that_lasts_the_whole_run_is_said(tmp_path: Path) -> None:
    """``--model.warmup_epochs 5`` in a 1-epoch run trained silently below the set learning rate (an outside user)."""
    with pytest.warns(UserWarning, match=r"--model.warmup_epochs 5 lasts the whole run \(1 optimiser steps"):
        assert run_main([*BASE, "--trainer.max_epochs", "1", "--model.warmup_epochs", "5"], tmp_path).code == 0
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        (tmp_path / "b").mkdir()
        assert run_main([*BASE, "--trainer.max_epochs", "2", "--model.warmup_epochs", "1"], tmp_path / "b").code == 0
    assert not [w for w in seen if "lasts the whole run" in str(w.message)]
