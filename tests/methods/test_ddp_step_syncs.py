"""Host reads of a DDP training step: none from the gathers when every rank's batch has the same size.

Each contrastive loss gathers the global batch (:mod:`cloc_lightning.distributed`).  Rows of
different counts need the counts of every rank on the host (a size exchange whose values are read:
a device sync per gather on a GPU); with ``drop_last`` training loaders every rank's batch holds
``batch_size`` samples, so the methods tell the gathers the sizes are equal and nothing is read.

Counted here under 2-process CPU DDP (gloo, a real ``Trainer.fit`` with ``strategy='ddp'``) with
the sync-causing calls patched (``tests/_syncs.py``), for SupCon, CLOC and ReLIC (the sigmoid
loss): 0 host reads by the library on a typical training step (the first, the last and Lightning's
logging steps aside, as in ``tests/methods/test_sync_free_step.py``), and 0 from
``cloc_lightning/distributed.py`` on every training step.  With ``drop_last: false`` the sizes are
not known to be equal and the size exchange (its reads) comes back: the counter sees it, and the
fit still trains.  Before the methods told the gathers, every training step read 6 values of the
size exchange (3 exchanges x 2 ranks) plus a host-to-device copy in ``global_mean`` for SupCon and
CLOC, and 24 reads plus 4 copies for ReLIC's 4 multi-crop pairs.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import Any

import lightning as L
import pytest
import torch

from tests._ddp import run_distributed
from tests._reliability import _make
from tests._syncs import SyncCounter

METHODS = ("SupConModule-supcon", "CLOCModule", "ReLICModule")
LOG_EVERY = 4
BATCHES = 6  # per rank: typical steps 1, 2, 4 (0 the first, 3 a logging step, 5 the last)
GATHER_FILE = "cloc_lightning/distributed.py"


def _fit_counting(name: str, drop_last: bool, root: str) -> dict[str, Any]:
    """One DDP fit of ``name`` on this rank with the sync-causing calls counted; what was read, per step."""
    model, dm0 = _make(name)
    bsz = 8
    # 2 ranks x BATCHES batches of 8; drop_last false: 2 samples more per rank, a last batch of 2
    train_size = 2 * bsz * BATCHES + (0 if drop_last else 4)
    dm = type(dm0)(
        num_classes=4,
        train_size=train_size,
        val_size=8,
        test_size=8,
        batch_size=bsz,
        num_workers=0,
        image_size=dm0.image_size,
        augment="none",
        train_views=dm0.train_views,
        drop_last=drop_last,
    )
    counter = SyncCounter()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=1,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        log_every_n_steps=LOG_EVERY,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=root,
        callbacks=[counter],
    )
    with warnings.catch_warnings(), counter.patched():
        warnings.simplefilter("ignore")
        trainer.fit(model, datamodule=dm)
    steps = counter.steps(typical=False)
    gather_reads = [[f"{e.kind} at {e.where}" for e in counter.events.get(b, []) if e.where.startswith(GATHER_FILE)] for b in steps]
    return {
        "steps": len(steps),
        "typical": counter.steps(),
        "library_typical": dict(counter.summary(counter.steps(), library=True)),
        "gather_reads_per_step": [len(r) for r in gather_reads],
        "gather_sites": sorted({s for r in gather_reads for s in r}),
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
    }


def _rank_fn(rank: int, world_size: int, root: str, cases: list[tuple[str, bool]]) -> dict[str, Any]:
    os.environ.update({"LOCAL_RANK": str(rank), "RANK": str(rank), "NODE_RANK": "0", "WORLD_SIZE": str(world_size)})
    return {
        f"{name} drop_last={drop_last}": _fit_counting(name, drop_last, os.path.join(root, f"{name}-{drop_last}"))
        for name, drop_last in cases
    }


@pytest.mark.slow
@pytest.mark.ddp
def test_no_host_reads_in_the_gathers_of_a_ddp_training_step_with_equal_batches(tmp_path: Path) -> None:
    cases = [(name, True) for name in METHODS] + [("SupConModule-supcon", False)]
    ranks = run_distributed(_rank_fn, 2, str(tmp_path), cases)
    for rank, result in enumerate(ranks):
        for name in METHODS:
            got = result[f"{name} drop_last=True"]
            assert got["steps"] == BATCHES and got["finite"], (rank, name, got)
            assert len(got["typical"]) >= 3, (rank, name, got["typical"])
            # the gathers read nothing on any training step, and the library nothing on a typical one
            assert got["gather_reads_per_step"] == [0] * BATCHES, (rank, name, got["gather_sites"])
            assert not got["library_typical"], (rank, name, got["library_typical"])
        # sizes not known to be equal (drop_last false): the size exchange is read, every step; the fit still trains
        fallback = result["SupConModule-supcon drop_last=False"]
        assert fallback["steps"] == BATCHES + 1 and fallback["finite"], fallback
        assert min(fallback["gather_reads_per_step"]) > 0, fallback
        assert any(site.startswith("Tensor.item at") for site in fallback["gather_sites"]), fallback
