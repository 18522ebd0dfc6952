"""Validation/test sharding under DDP without repeated samples (``cloc_lightning.data.eval_sharding``).

The batch plans are checked against what they must satisfy, over a grid of set sizes,
process counts and batch sizes; the data module's choice of loader is checked with a
stand-in trainer (the 2-process runs are ``tests/e2e/test_ddp_eval.py``).
"""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.eval_sharding import ExactEvalBatches, exact_eval_batches, exact_eval_loader

GRID = list(itertools.product(range(1, 42), range(1, 6), range(1, 7)))  # n, processes, batch size


@pytest.mark.parametrize("world", range(1, 6))
def test_plans_evaluate_every_sample_once_in_equal_numbers_of_non_empty_steps(world: int) -> None:
    for n, w, bs in GRID:
        if w != world:
            continue
        plans = [exact_eval_batches(n, bs, w, r) for r in range(w)]
        possible = n >= w and (bs > 1 or n % w == 0)
        assert all((p is not None) == possible for p in plans), (n, w, bs)  # the same answer on every process
        if not possible:
            continue
        seen = [i for plan in plans for batch in plan for i in batch]  # type: ignore[union-attr]
        assert sorted(seen) == list(range(n)), (n, w, bs)  # every sample, once
        lengths = {len(plan) for plan in plans}  # type: ignore[arg-type]
        assert lengths == {math.ceil(math.ceil(n / w) / bs)}, (n, w, bs)  # the same number of steps on every process
        for r, plan in enumerate(plans):
            assert plan is not None
            assert all(1 <= len(b) <= bs for b in plan), (n, w, bs, plan)
            flat = [i for b in plan for i in b]
            assert flat == list(range(r, n, w)), (n, w, bs, r)  # DistributedSampler's order, unshuffled


@pytest.mark.parametrize("world", range(1, 6))
def test_plans_in_blocks_of_an_order_share_like_the_strided_ones(world: int) -> None:
    """With an ``order`` (a stream's positions by chunk): contiguous parts of it, the strided plans' sizes and steps."""
    rng = np.random.default_rng(world)
    for n, w, bs in GRID:
        if w != world:
            continue
        order = rng.permutation(n).tolist()
        plans = [exact_eval_batches(n, bs, w, r, order) for r in range(w)]
        strided = [exact_eval_batches(n, bs, w, r) for r in range(w)]
        assert [p is None for p in plans] == [p is None for p in strided], (n, w, bs)
        if plans[0] is None:
            continue
        flat = [[i for b in plan for i in b] for plan in plans]  # type: ignore[union-attr]
        assert [i for share in flat for i in share] == order, (n, w, bs)  # part r of the order is process r's, in order
        assert [len(p) for p in plans] == [len(p) for p in strided]  # type: ignore[arg-type]  # the same number of steps
        assert [len(f) for f in flat] == [sum(len(b) for b in p) for p in strided]  # type: ignore[union-attr]  # same shares
        assert all(1 <= len(b) <= bs for plan in plans for b in plan), (n, w, bs)  # type: ignore[union-attr]
    with pytest.raises(ValueError, match="order must be a permutation of the 5 positions"):
        exact_eval_batches(5, 2, 2, 0, [0, 1, 2, 3, 3])


def test_plans_match_distributed_sampler_where_it_repeats_nothing() -> None:
    for n, w, bs in GRID:
        if n % w or n < w:
            continue
        for r in range(w):
            plan = exact_eval_batches(n, bs, w, r)
            assert plan is not None
            reference = list(DistributedSampler(range(n), num_replicas=w, rank=r, shuffle=False))
            assert [i for b in plan for i in b] == reference


def test_plan_rejects_bad_arguments() -> None:
    with pytest.raises(ValueError, match="rank 2 is not in"):
        exact_eval_batches(10, 4, 2, 2)
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        exact_eval_batches(10, 0, 2, 0)
    with pytest.raises(ValueError, match="cannot be shared"):
        ExactEvalBatches(range(3), 1, 2, 0)  # rank 0's share alone could be batched; rank 1's not # type: ignore[arg-type]


class _Items(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.full((2,), float(i)), i


@pytest.mark.parametrize("workers", [0, 1])
def test_loader_collates_the_planned_batches(workers: int) -> None:
    ds = _Items(17)
    seen: list[int] = []
    for rank in range(2):
        loader = exact_eval_loader(ds, 8, 2, rank, num_workers=workers)
        assert loader is not None
        assert isinstance(loader.sampler, DistributedSampler)  # Lightning keeps an already sharded loader
        assert len(loader) == 2
        batches = list(loader)
        sizes = [int(y.shape[0]) for _, y in batches]
        assert sizes == ([8, 1] if rank == 0 else [7, 1]), sizes  # rank 1's 8 samples: 7 + 1, so no empty step
        for x, y in batches:
            assert x.shape == (y.shape[0], 2) and torch.equal(x[:, 0].long(), y)
            seen += y.tolist()
    assert sorted(seen) == list(range(17))
    assert exact_eval_loader(_Items(1), 8, 2, 0) is None
    with pytest.raises(TypeError, match="sets 'shuffle' itself"):
        exact_eval_loader(ds, 8, 2, 0, shuffle=False)


def _stand_in_trainer(world: int, rank: int, use_distributed_sampler: bool = True) -> Any:
    kwargs = {"num_replicas": world, "rank": rank} if world > 1 else None
    return SimpleNamespace(
        distributed_sampler_kwargs=kwargs,
        _accelerator_connector=SimpleNamespace(use_distributed_sampler=use_distributed_sampler),
    )


def _shapes(val_size: int = 17, eval_batch_size: int = 8) -> OrdinalShapesDataModule:
    dm = OrdinalShapesDataModule(
        num_classes=4,
        train_size=16,
        val_size=val_size,
        test_size=val_size,
        batch_size=8,
        eval_batch_size=eval_batch_size,
        num_workers=0,
    )
    dm.setup("fit")
    dm.setup("test")
    return dm


def test_data_module_shards_val_and_test_exactly_under_ddp() -> None:
    dm = _shapes()
    labels = {split: [int(y) for _, y in getattr(dm, f"{split}_set")] for split in ("val", "test")}
    for split in ("val", "test"):
        got: list[int] = []
        for rank in range(2):
            dm.trainer = _stand_in_trainer(2, rank)
            loader = getattr(dm, f"{split}_dataloader")()
            assert isinstance(loader.sampler, ExactEvalBatches)
            got += [int(v) for _, y in loader for v in y]
        assert sorted(got) == sorted(labels[split]) and len(got) == 17
    # predict keeps a plain loader: Lightning shards it without repeats itself and tracks the indices
    dm.trainer = _stand_in_trainer(2, 0)
    assert not isinstance(dm.predict_dataloader().sampler, DistributedSampler)
    # what rank-0-only readers (the plot callbacks) use: the whole split, in order
    for split in ("val", "test"):
        assert [int(v) for _, y in dm.whole_split_dataloader(split) for v in y] == labels[split]
    with pytest.raises(ValueError, match="split"):
        dm.whole_split_dataloader("train")  # type: ignore[arg-type]


def test_data_module_keeps_plain_loaders_on_one_process_or_when_the_user_shards() -> None:
    dm = _shapes()
    for trainer in (None, _stand_in_trainer(1, 0), _stand_in_trainer(2, 0, use_distributed_sampler=False)):
        dm.trainer = trainer
        loader = dm.val_dataloader()
        assert loader.batch_size == 8 and not isinstance(loader.sampler, DistributedSampler)


@pytest.mark.parametrize(
    ("val_size", "eval_batch_size", "fix"),
    [(17, 1, "set data.eval_batch_size to 2 or more"), (1, 8, "use at most 1 processes for val")],
)
def test_data_module_falls_back_to_lightning_with_a_warning_naming_the_fix(val_size: int, eval_batch_size: int, fix: str) -> None:
    dm = _shapes(val_size, eval_batch_size)
    dm.trainer = _stand_in_trainer(2, 0)
    with pytest.warns(UserWarning, match="cannot be shared between 2 processes") as record:
        loader = dm.val_dataloader()
    assert fix in str(record[0].message)
    assert loader.batch_size == eval_batch_size and not isinstance(loader.sampler, DistributedSampler)
