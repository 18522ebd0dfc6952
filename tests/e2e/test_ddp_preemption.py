"""SIGTERM under 2-process DDP (gloo): every rank stops at the same step, one mid-epoch checkpoint, exact resume.

Only rank 0 receives the signal (a scheduler that signals one task, or a signal relayed late).
:class:`~cloc_lightning.callbacks.preemption.PreemptionCheckpoint` all-reduces its flag on the
logging steps (here every 2nd step) and at epoch ends, so both ranks save the same checkpoint
and raise ``Preempted`` (exit code 143) together, instead of rank 0 leaving while rank 1 waits in
the next gradient all-reduce.  The resumed fit equals the uninterrupted one bit for bit on both
ranks.  Marked ``slow`` and ``ddp``.
"""

from __future__ import annotations

import os
import traceback
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest

from cloc_lightning.callbacks.preemption import Preempted
from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CLOCModule
from tests._ddp import run_distributed
from tests._faults import SignalAtStep
from tests._reliability import SMALL, assert_same

pytestmark = [pytest.mark.slow, pytest.mark.ddp]


def _fit(root: Path, sigterm_at: int | None = None, ckpt: str | None = None) -> dict[str, Any]:
    L.seed_everything(0, verbose=False)
    model = CLOCModule(num_classes=4, scheduler="none", margin_lr=0.05, **SMALL)
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=128, val_size=8, test_size=8, batch_size=16, num_workers=0, augment="crop_flip"
    )  # 2 processes x 16 per step: 4 steps per epoch
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        deterministic=True,
        log_every_n_steps=2,
        callbacks=[] if sigterm_at is None else [SignalAtStep(sigterm_at, rank=0)],
    )
    out: dict[str, Any] = {"exit": None}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
        except Preempted as e:
            out["exit"] = e.code
    out.update(
        global_step=trainer.global_step,
        state={k: v.detach().clone() for k, v in model.state_dict().items()},
        optimizer_state=trainer.optimizers[0].state_dict()["state"],
    )
    return out


def _preempt_and_resume(rank: int, world_size: int, work: str) -> dict[str, Any]:
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    out: dict[str, Any] = {}
    try:
        out["full"] = _fit(Path(work) / "full")
        out["stopped"] = _fit(Path(work) / "part", sigterm_at=5)
        ckpt = Path(work) / "part" / "checkpoints" / "last.ckpt"
        out["ckpt_exists"] = ckpt.is_file()
        out["resumed"] = _fit(Path(work) / "part", ckpt=str(ckpt))
    except Exception:  # noqa: BLE001 - reported by the test
        out["error"] = traceback.format_exc()
    return out


def test_ddp_sigterm_on_one_rank_stops_both_with_one_checkpoint_and_resumes_exactly(tmp_path: Path) -> None:
    ranks = run_distributed(_preempt_and_resume, 2, str(tmp_path))
    for r, result in enumerate(ranks):
        assert "error" not in result, f"rank {r} failed:\n{result['error']}"
        assert result["stopped"]["exit"] == 143, f"rank {r} was not preempted: {result['stopped']['exit']!r}"
        assert result["ckpt_exists"]
        # the flag is agreed on the next logging step (log_every_n_steps=2) after step 5
        assert result["stopped"]["global_step"] == 6, result["stopped"]["global_step"]
        assert result["full"]["global_step"] == result["resumed"]["global_step"] == 8
        assert_same(result["resumed"]["state"], result["full"]["state"], f"rank {r} state")
        assert_same(result["resumed"]["optimizer_state"], result["full"]["optimizer_state"], f"rank {r} optimizer")
    weights = {k: v for k, v in ranks[0]["resumed"]["state"].items() if "running_" not in k and "num_batches" not in k}
    assert_same(weights, {k: ranks[1]["resumed"]["state"][k] for k in weights}, "rank 0 vs rank 1 weights")  # BN stats are per rank
