"""Exact resume with loader workers: training augmentations are a function of (seed, epoch, sample index).

* The training set's images of an epoch are the same with 0 or 2 workers (fork or spawn),
  across loader constructions and after a mid-epoch ``load_state_dict``; they differ
  between epochs, and the main process's global generator is never drawn from.
* A CLI fit with ``num_workers: 2`` SIGKILLed at the epoch 0/1 boundary and mid-epoch 1,
  each time resumed with ``--ckpt_path last``, ends bit-identical to an uninterrupted run
  (the kill/resume helpers of ``tests/_reliability.py``, with workers).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.data.datasets import TransformedSubset
from cloc_lightning.resume import EpochShuffleSampler, ResumableDataLoader
from tests._reliability import RESUME_SETUPS, _cli_config, _fit_killed_at, _last_ckpt, assert_same
from tests.conftest import run_cli


def _shapes(workers: int, seed: int = 0, **kw: Any) -> OrdinalShapesDataModule:
    dm = OrdinalShapesDataModule(
        num_classes=4, train_size=24, val_size=8, test_size=8, batch_size=6, num_workers=workers, augment="crop_flip", seed=seed, **kw
    )
    dm.setup("fit")
    return dm


def _epoch_images(loader: Any, epoch: int) -> torch.Tensor:
    loader.sampler.set_epoch(epoch)
    return torch.cat([x for x, _ in loader])


def test_train_images_depend_on_seed_epoch_and_index_only() -> None:
    rng_before = torch.get_rng_state()
    dm0, dm2 = _shapes(0), _shapes(2)
    in_process = [_epoch_images(dm0.train_dataloader(), e) for e in range(2)]
    assert torch.equal(torch.get_rng_state(), rng_before), "num_workers 0 drew from the global generator"
    persistent = dm2.train_dataloader()  # one loader, workers kept across epochs: set_epoch reaches them
    with_workers = [_epoch_images(persistent, e) for e in range(2)]
    rebuilt = _epoch_images(_shapes(2).train_dataloader(), 1)  # a new data module and loader
    for e in range(2):
        assert torch.equal(in_process[e], with_workers[e]), f"epoch {e}: 0 and 2 workers differ"
    assert torch.equal(rebuilt, with_workers[1])
    assert not torch.equal(in_process[0], in_process[1])
    # the same sample (not only the order) changes between epochs, and with the data module's seed
    one = dm0.train_set
    one.set_epoch(0)
    x0 = one[3][0]
    one.set_epoch(1)
    assert not torch.equal(x0, one[3][0])
    other_seed = _shapes(0, seed=1).train_set
    other_seed.set_epoch(0)
    assert not torch.equal(x0, other_seed[3][0])
    # evaluation sets are not seeded per sample (deterministic transform, no shared epoch)
    assert dm0.val_set.seed is None and dm0.test_set.seed is None


def test_unseeded_augmentations_depend_on_the_workers() -> None:
    """The control: without per-sample seeding, 0 and 2 workers draw different crops (what the fix removes)."""
    dm0, dm2 = _shapes(0), _shapes(2)
    for dm in (dm0, dm2):
        ts = dm.train_set
        dm.train_set = TransformedSubset(ts.base, ts.indices, ts.transform)
    torch.manual_seed(0)
    assert not torch.equal(_epoch_images(dm0.train_dataloader(), 0), _epoch_images(dm2.train_dataloader(), 0))


def test_mid_epoch_load_state_dict_with_workers_continues_the_epoch() -> None:
    full = _epoch_images(_shapes(0).train_dataloader(), 1)
    loader = _shapes(2).train_dataloader()
    assert isinstance(loader, ResumableDataLoader) and isinstance(loader.sampler, EpochShuffleSampler)
    loader.load_state_dict({"epoch": 1, "batches": 2, "batch_size": 6})
    rest = torch.cat([x for x, _ in loader])
    assert loader.state_dict() == {"epoch": 2, "batches": 0, "batch_size": 6}
    assert torch.equal(rest, full[2 * 6 :])


@pytest.mark.slow
def test_spawned_persistent_workers_follow_the_epoch() -> None:
    """Spawned workers get the dataset pickled once; the shared epoch still reaches them every epoch."""
    dm = _shapes(0)
    expected = [_epoch_images(dm.train_dataloader(), e) for e in range(2)]
    ds = dm.train_set
    loader = ResumableDataLoader(
        ds,
        batch_size=6,
        sampler=EpochShuffleSampler(ds, 0),
        num_workers=2,
        persistent_workers=True,
        multiprocessing_context="spawn",
        drop_last=True,
    )
    for e in range(2):
        assert torch.equal(_epoch_images(loader, e), expected[e]), f"epoch {e} differs with spawned workers"


@pytest.mark.slow
def test_cli_fit_with_workers_killed_and_resumed_equals_an_uninterrupted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """CLOC, 3 epochs of 4 steps, random crops + flips drawn in 2 persistent loader workers, margins frozen at
    epoch 1: SIGKILL at the epoch 0/1 boundary and mid-epoch 1, resume each time; the final checkpoint equals
    the uninterrupted run's bit for bit (weights, margins, Adam state, schedule, loop progress)."""
    cloc = RESUME_SETUPS["cloc"]
    monkeypatch.setitem(RESUME_SETUPS, "cloc-workers", {**cloc, "data": {**cloc["data"], "num_workers": 2}})
    reference_cfg = _cli_config(tmp_path, "reference", setup="cloc-workers")
    assert "num_workers: 2" in reference_cfg.read_text() and "augment: crop_flip" in reference_cfg.read_text()
    run_cli(["fit", "--config", str(reference_cfg)], tmp_path, timeout=300)
    reference = torch.load(_last_ckpt(tmp_path / "runs" / "reference"), map_location="cpu", weights_only=False)
    assert reference["global_step"] == 12

    _fit_killed_at(tmp_path, "chain", 4, resume=True, setup="cloc-workers")  # last.ckpt: end of epoch 0
    out = _fit_killed_at(tmp_path, "chain", 6, resume=True, setup="cloc-workers")  # mid-epoch 1
    assert "resuming from" in out
    final = run_cli(
        ["fit", "--config", str(_cli_config(tmp_path, "chain", setup="cloc-workers")), "--ckpt_path", "last"], tmp_path, timeout=300
    )
    assert "resuming from" in final.stdout

    resumed = torch.load(_last_ckpt(tmp_path / "runs" / "chain"), map_location="cpu", weights_only=False)
    assert_same(resumed["state_dict"], reference["state_dict"], "state_dict")
    assert_same(resumed["optimizer_states"], reference["optimizer_states"], "optimizer_states")
    assert_same(resumed["lr_schedulers"], reference["lr_schedulers"], "lr_schedulers")
    assert_same(resumed["cloc"], reference["cloc"], "cloc")
    assert (resumed["global_step"], resumed["epoch"]) == (reference["global_step"], reference["epoch"])
