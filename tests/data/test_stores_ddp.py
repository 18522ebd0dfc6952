"""One node, one store: under 2-process gloo DDP the data is decoded once and mapped by both processes.

Before issue 49 every rank decoded the whole split into its own copy (a 2-process fit raised ``/dev/shm`` to
2.00x the store size).  The processes here are started as ``torchrun`` starts them (``tests/_ddp.py``) and the
data module sees a trainer of two ranks on one node; each process also sets its own ``PL_GLOBAL_SEED``, as
``torchrun`` processes that each drew a random seed (``--seed_everything true``) do: the data seed must agree.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests._ddp import run_distributed

PROJECT = Path(__file__).resolve().parents[1] / "fixtures" / "store_project"
SIZES = dict(train_size=48, val_size=12, test_size=12)


def _trainer(rank: int, world: int) -> Any:
    def broadcast(obj: Any, src: int = 0) -> Any:
        box = [obj]
        dist.broadcast_object_list(box, src)
        return box[0]

    return SimpleNamespace(
        world_size=world, global_rank=rank, local_rank=rank, is_global_zero=rank == 0, strategy=SimpleNamespace(broadcast=broadcast)
    )


def _du(folder: str) -> int:
    return sum(f.stat().st_size for f in Path(folder).rglob("*") if f.is_file())


def _rank(rank: int, world: int, cache: str, shm: str, cache_dir: str) -> dict[str, Any]:
    sys.path.insert(0, str(PROJECT))
    from store_project import CountedShapes

    os.environ["CLOC_SHM_DIR"] = shm
    os.environ["PL_GLOBAL_SEED"] = str(100 + rank)
    before = _du(shm) if os.path.isdir(shm) else 0
    dm = CountedShapes(
        num_classes=3, image_size=32, batch_size=4, num_workers=0, cache=cache, cache_dir=cache_dir, augment="rrc_flip", **SIZES
    )
    dm.trainer = _trainer(rank, world)
    dm.setup("fit")
    dm.setup("test")  # the test split, which a fit does not decode, stored together by both processes too
    dist.barrier()
    stores = {split: dm._stored[split] for split in ("train", "val", "test")}
    out = {
        "seed": dm.train_seed,
        "folders": {k: s.folder for k, s in stores.items()},
        "inodes": {k: os.stat(s.path).st_ino for k, s in stores.items()},
        "sums": {k: int(s.images.to(torch.int64).sum()) for k, s in stores.items()},
        "nbytes": sum(int(s.images.numel()) for s in stores.values()),
        "shm_growth": (_du(shm) - before) if cache == "memory" else None,
    }
    dist.barrier()
    return out


@pytest.mark.slow  # 2-process DDP: the long tier (pytest -m slow)
@pytest.mark.parametrize("cache", ["memory", "disk"])
def test_two_processes_of_a_node_decode_once_and_map_one_store(cache: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "decodes"
    monkeypatch.setenv("STORE_PROJECT_DECODES", str(marker))
    a, b = run_distributed(_rank, 2, cache, str(tmp_path / "shm"), str(tmp_path / "cache"))
    n = sum(SIZES.values())
    assert marker.stat().st_size == n  # every image decoded once, by one process (was once per rank: 2n)
    assert a["folders"] == b["folders"] and a["inodes"] == b["inodes"] and a["sums"] == b["sums"]
    assert a["seed"] == b["seed"] == 100  # rank 0's seed on both (each had drawn its own)
    if cache == "memory":
        assert all(Path(f).parent == tmp_path / "shm" for f in a["folders"].values())
        growth = a["shm_growth"]
        assert a["nbytes"] <= growth < 1.2 * a["nbytes"], (growth, a["nbytes"])  # one copy for the node (was 2.00x)
