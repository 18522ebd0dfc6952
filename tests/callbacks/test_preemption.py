"""SIGTERM (a scheduler's preemption): a mid-epoch checkpoint, a non-zero exit, and a resume equal to one fit.

Before :class:`~cloc_lightning.callbacks.preemption.PreemptionCheckpoint`, Lightning turned SIGTERM
into ``SIGTERMException`` -- a ``SystemExit`` without a code: exit 0, no checkpoint, the partial
epoch lost.  The signal here is a real one (``os.kill`` of the process itself, through the
installed handlers) sent after a known training step by ``tests._faults.SignalAtStep``.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
import yaml

from cloc_lightning.callbacks.preemption import SIGTERM_EXIT_CODE, Preempted, PreemptionCheckpoint
from cloc_lightning.methods import CLOCModule
from tests._faults import SignalAtStep
from tests._reliability import SMALL, _last_ckpt, _shapes, assert_same
from tests.conftest import cli_env, cpu_trainer

STEPS_PER_EPOCH = 4


def _fit(root: Path, sigterm_at: int | None = None, ckpt: str | None = None) -> tuple[CLOCModule, L.Trainer, BaseException | None]:
    """CLOC, learnable margins, random crops and flips: 2 epochs x 4 steps, the default checkpoints (epoch ends only)."""
    L.seed_everything(0, verbose=False)
    model = CLOCModule(num_classes=4, **SMALL, margin_lr=0.05)
    dm = _shapes(augment="crop_flip", batch_size=16, train_size=16 * STEPS_PER_EPOCH)
    callbacks: list[L.Callback] = [] if sigterm_at is None else [SignalAtStep(sigterm_at)]
    trainer = cpu_trainer(root, max_epochs=2, limit_val_batches=1, num_sanity_val_steps=0, deterministic=True, callbacks=callbacks)
    raised: BaseException | None = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        except SystemExit as e:  # Preempted, or Lightning's SIGTERMException
            raised = e
    return model, trainer, raised


def test_sigterm_mid_epoch_saves_a_checkpoint_exits_non_zero_and_resumes_exactly(tmp_path: Path) -> None:
    full, full_trainer, raised = _fit(tmp_path / "full")
    assert raised is None and full_trainer.global_step == 2 * STEPS_PER_EPOCH

    before = signal.getsignal(signal.SIGTERM)
    _, _, raised = _fit(tmp_path / "part", sigterm_at=6)  # after step 6: mid-epoch 1
    assert isinstance(raised, Preempted), f"SIGTERM ended the fit with {raised!r}, not Preempted"
    assert raised.code == SIGTERM_EXIT_CODE == 143
    assert signal.getsignal(signal.SIGTERM) == before  # the handlers are restored
    ckpt_path = tmp_path / "part" / "checkpoints" / "last.ckpt"
    assert ckpt_path.is_file(), "no checkpoint written on SIGTERM"
    ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
    assert (ckpt["global_step"], ckpt["epoch"]) == (6, 1)  # mid-epoch, not the end of epoch 0

    resumed, trainer, raised = _fit(tmp_path / "part", ckpt=str(ckpt_path))
    assert raised is None and trainer.global_step == 2 * STEPS_PER_EPOCH
    assert_same(resumed.state_dict(), full.state_dict(), "state_dict")
    assert_same(trainer.optimizers[0].state_dict(), full_trainer.optimizers[0].state_dict(), "optimizer")
    assert_same(
        trainer.lr_scheduler_configs[0].scheduler.state_dict(), full_trainer.lr_scheduler_configs[0].scheduler.state_dict(), "lr_scheduler"
    )


def test_preemption_checkpoint_is_added_once_and_checks_its_exit_code(tmp_path: Path) -> None:
    mine = PreemptionCheckpoint(exit_code=99)
    L.seed_everything(0, verbose=False)
    trainer = cpu_trainer(
        tmp_path, max_epochs=1, limit_train_batches=2, limit_val_batches=0, num_sanity_val_steps=0, callbacks=[mine, SignalAtStep(1)]
    )
    with warnings.catch_warnings(), pytest.raises(Preempted) as info:
        warnings.simplefilter("ignore")
        trainer.fit(CLOCModule(num_classes=4, **SMALL), datamodule=_shapes())
    assert info.value.code == 99
    assert sum(isinstance(cb, PreemptionCheckpoint) for cb in trainer.callbacks) == 1  # the module did not add a second
    for bad in (0, 256, True, "143"):
        with pytest.raises(ValueError, match="exit_code must be an integer in 1..255"):
            PreemptionCheckpoint(exit_code=bad)  # type: ignore[arg-type]


def _cli_cfg(tmp_path: Path, name: str, sigterm_at: int | None) -> Path:
    cfg: dict[str, Any] = {
        "seed_everything": 0,
        "trainer": {
            "accelerator": "cpu",
            "devices": 1,
            "max_epochs": 2,
            "deterministic": True,
            "log_every_n_steps": 1,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "limit_val_batches": 1,
            "num_sanity_val_steps": 0,
            "logger": {"class_path": "lightning.pytorch.loggers.TensorBoardLogger", "init_args": {"save_dir": "runs", "name": name}},
            "callbacks": [] if sigterm_at is None else [{"class_path": "tests._faults.SignalAtStep", "init_args": {"step": sigterm_at}}],
        },
        "model": {"class_path": "cloc_lightning.methods.CLOCModule", "init_args": {"num_classes": 4, **SMALL, "margin_lr": 0.05}},
        "data": {
            "class_path": "cloc_lightning.data.OrdinalShapesDataModule",
            "init_args": {
                "num_classes": 4,
                "train_size": 16 * STEPS_PER_EPOCH,
                "val_size": 8,
                "test_size": 8,
                "batch_size": 16,
                "num_workers": 0,
                "augment": "crop_flip",
                "image_size": 32,
            },
        },
    }
    path = tmp_path / f"{name}_{sigterm_at}.yaml"
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    return path


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cloc_lightning", *args], cwd=tmp_path, env=cli_env(), capture_output=True, text=True, timeout=300
    )


@pytest.mark.slow
def test_cli_fit_sigterm_then_resume_equals_an_uninterrupted_run(tmp_path: Path) -> None:
    """Through the real command line: rc 143 and a message naming the checkpoint, then ``--ckpt_path last``."""
    ref = _cli(tmp_path, "fit", "--config", str(_cli_cfg(tmp_path, "reference", None)))
    assert ref.returncode == 0, ref.stderr[-3000:]
    part = _cli(tmp_path, "fit", "--config", str(_cli_cfg(tmp_path, "chain", 6)))
    assert part.returncode == SIGTERM_EXIT_CODE, (part.returncode, part.stderr[-3000:])
    assert "SIGTERM received: saved a checkpoint at epoch 1, 2 of its batches done (global step 6)" in part.stderr, part.stderr[-3000:]
    assert "resume with --ckpt_path last" in part.stderr
    stopped = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert stopped["global_step"] == 6
    done = _cli(tmp_path, "fit", "--config", str(_cli_cfg(tmp_path, "chain", None)), "--ckpt_path", "last")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "resuming from" in done.stdout and "global step 6" in done.stdout, done.stdout[-2000:]
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"]) == (8, 1)
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")


@pytest.mark.slow
def test_cli_sigterm_outside_the_training_loop_exits_non_zero(tmp_path: Path) -> None:
    """A SIGTERM in a fit's sanity-check validation (Lightning's own handler still runs there): Lightning's
    ``SIGTERMException`` exited 0; the command now exits 143 and says why."""
    cfg = _cli_cfg(tmp_path, "sanity", None)
    proc = _cli(
        tmp_path,
        "fit",
        "--config",
        str(cfg),
        "--trainer.num_sanity_val_steps",
        "1",
        "--trainer.callbacks+=tests._faults.SignalInSanityCheck",
    )
    assert proc.returncode == SIGTERM_EXIT_CODE, (proc.returncode, proc.stderr[-3000:])
    assert "SIGTERM" in proc.stderr and "Epoch 0" not in proc.stdout
