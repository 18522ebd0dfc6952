"""A fit stopped in the middle of an epoch under 2-process DDP (gloo) and resumed ends as the uninterrupted fit.

In each of two externally created processes (the ``torchrun`` path, ``strategy='ddp'``):
an uninterrupted CLOC fit of 2 epochs x 2 steps (random crops and flips, learnable
margins), and the same fit stopped after step 3 (``max_steps``; a checkpoint after every
step, so ``last.ckpt`` is 1 batch into epoch 1) then resumed from ``last.ckpt``.  Every
parameter, buffer and optimiser state must be equal bit for bit on both ranks.  Under
Lightning's ``DistributedSampler`` the resumed fit would start epoch 1's data over (its
step 4 would train on the batch step 3 already used); the data modules' training loader
under DDP (:class:`~cloc_lightning.resume.DistributedEpochShuffleSampler`) continues with the
next batch.  Marked ``slow`` and ``ddp``.
"""

from __future__ import annotations

import os
import traceback
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CLOCModule
from cloc_lightning.resume import DistributedEpochShuffleSampler
from tests._ddp import run_distributed
from tests._reliability import SMALL, assert_same

pytestmark = [pytest.mark.slow, pytest.mark.ddp]


def _fit(root: Path, max_steps: int = -1, ckpt: str | None = None) -> dict[str, Any]:
    L.seed_everything(0, verbose=False)
    model = CLOCModule(num_classes=4, scheduler="none", margin_lr=0.05, **SMALL)
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=64, val_size=8, test_size=8, batch_size=16, num_workers=0, augment="crop_flip"
    )  # 64 samples, 16 per process and step, 2 processes: 2 steps per epoch
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=2,
        max_steps=max_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(root),
        deterministic=True,
        callbacks=[ModelCheckpoint(dirpath=str(root / "ckpt"), every_n_train_steps=1, save_last=True)],
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm, ckpt_path=ckpt)
    sampler = trainer.train_dataloader.sampler
    optimizer = trainer.optimizers[0].state_dict()
    return {
        "global_step": trainer.global_step,
        "sampler": type(sampler).__name__,
        "state": {k: v.detach().clone() for k, v in model.state_dict().items()},
        "optimizer_state": optimizer["state"],
    }


def _stop_and_resume(rank: int, world_size: int, work: str) -> dict[str, Any]:
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    out: dict[str, Any] = {}
    try:
        out["full"] = _fit(Path(work) / "full")
        torch.distributed.barrier()
        out["stopped"] = _fit(Path(work) / "part", max_steps=3)
        torch.distributed.barrier()
        out["resumed"] = _fit(Path(work) / "resumed", ckpt=str(Path(work) / "part" / "ckpt" / "last.ckpt"))
    except Exception:  # noqa: BLE001 - reported by the test
        out["error"] = traceback.format_exc()
    return out


def test_ddp_fit_stopped_mid_epoch_and_resumed_equals_an_uninterrupted_fit(tmp_path: Path) -> None:
    ranks = run_distributed(_stop_and_resume, 2, str(tmp_path))
    for r, result in enumerate(ranks):
        assert "error" not in result, f"rank {r} failed:\n{result['error']}"
        assert result["full"]["sampler"] == result["resumed"]["sampler"] == DistributedEpochShuffleSampler.__name__
        assert result["stopped"]["global_step"] == 3 and result["full"]["global_step"] == result["resumed"]["global_step"] == 4
        assert_same(result["resumed"]["state"], result["full"]["state"], f"rank {r} state_dict")
        assert_same(result["resumed"]["optimizer_state"], result["full"]["optimizer_state"], f"rank {r} optimiser state")
    # the ranks hold the same weights (BatchNorm running statistics are each rank's own after its last step)
    params = [{k: v for k, v in r["full"]["state"].items() if "running_" not in k and "num_batches" not in k} for r in ranks]
    assert_same(params[0], params[1], "rank 0 vs rank 1")
    # the stopped fit really was cut short: its weights are not the full fit's
    assert any(not torch.equal(v, ranks[0]["full"]["state"][k]) for k, v in ranks[0]["stopped"]["state"].items())


def test_distributed_epoch_shuffle_sampler_deals_one_permutation_and_skips() -> None:
    data = list(range(10))
    shares = [list(DistributedEpochShuffleSampler(data, 3, r, seed=5)) for r in range(3)]
    assert [len(s) for s in shares] == [4, 4, 4]  # 10 padded to 12 with the order's first 2 indices
    dealt = [shares[i % 3][i // 3] for i in range(12)]
    assert sorted(dealt[:10]) == data and dealt[10:] == dealt[:2]
    sampler = DistributedEpochShuffleSampler(data, 3, 1, seed=5)
    sampler.set_epoch(1)
    epoch1 = list(sampler)
    assert epoch1 != shares[1]  # a new order each epoch ...
    sampler.skip(2)
    assert list(sampler) == epoch1[2:] and list(sampler) == epoch1  # ... skip applies to the next pass only
    sampler.skip(2)
    sampler.set_epoch(2)  # a pending skip belongs to its epoch
    assert len(list(sampler)) == 4
    dropped = [list(DistributedEpochShuffleSampler(data, 3, r, seed=5, drop_last=True)) for r in range(3)]
    assert [len(s) for s in dropped] == [3, 3, 3] and len({i for s in dropped for i in s}) == 9
