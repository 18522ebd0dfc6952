"""The intra-op threads a ``cloc-lightning`` run gives torch (:mod:`cloc_lightning.threads`): the cores available
to the process less its loader workers; ``OMP_NUM_THREADS`` wins; the process's own setting comes back afterwards."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch
from lightning.pytorch.callbacks import Callback

import cloc_lightning.threads as threads_mod
from cloc_lightning.cli import main
from cloc_lightning.threads import available_cpus, default_threads
from tests.conftest import TINY_BACKBONE

#: (torch threads, OMP_NUM_THREADS) seen when training starts
SEEN: list[tuple[int, str | None]] = []


class ThreadProbe(Callback):
    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        SEEN.append((torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS")))


def _fit(workers: int) -> tuple[int, str | None]:
    SEEN.clear()
    main(
        [
            "fit",
            "--model",
            "CEModule",
            "--model.backbone",
            TINY_BACKBONE,
            "--data",
            "OrdinalShapesDataModule",
            "--data.num_classes",
            "4",
            "--data.train_size",
            "8",
            "--data.val_size",
            "4",
            "--data.test_size",
            "4",
            "--data.batch_size",
            "4",
            "--data.image_size",
            "16",
            "--data.num_workers",
            str(workers),
            "--trainer.max_epochs",
            "1",
            "--trainer.limit_train_batches",
            "1",
            "--trainer.limit_val_batches",
            "1",
            "--trainer.enable_progress_bar",
            "false",
            "--trainer.enable_model_summary",
            "false",
            "--trainer.logger",
            "false",
            "--trainer.enable_checkpointing",
            "false",
            "--trainer.callbacks+=tests.cli.test_cli_threads.ThreadProbe",
        ]
    )
    assert len(SEEN) == 1
    return SEEN[0]


@pytest.fixture
def two_cores(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A process on 2 cores (the shared machine of issue 42), torch at its default of 2 threads, no OMP_NUM_THREADS."""
    monkeypatch.chdir(tmp_path)  # sys.argv: tests/cli/conftest.py
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1})
    monkeypatch.setattr(threads_mod, "CGROUP_CPU_MAX", str(tmp_path / "no-cgroup"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


def test_one_loader_worker_on_two_cores_leaves_one_thread(two_cores: None) -> None:
    """torch's 2 threads beside 1 busy worker on 2 cores spun against each other: 2.2-2.9x slower epochs."""
    assert _fit(workers=1) == (1, "1")
    assert torch.get_num_threads() == 2 and "OMP_NUM_THREADS" not in os.environ  # restored after the command


def test_no_workers_keep_torchs_threads(two_cores: None) -> None:
    assert _fit(workers=0) == (2, None)


def test_omp_num_threads_wins(two_cores: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    assert _fit(workers=1) == (2, "2")


def test_cores_are_the_affinity_within_the_cgroup_quota(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    quota = tmp_path / "cpu.max"
    monkeypatch.setattr(threads_mod, "CGROUP_CPU_MAX", str(quota))
    assert available_cpus() == 16  # no cgroup file
    quota.write_text("max 100000\n")
    assert available_cpus() == 16
    quota.write_text("250000 100000\n")  # docker --cpus 2.5
    assert available_cpus() == 3
    assert default_threads(workers=2, cpus=3) == 1 and default_threads(workers=8, cpus=16) == 8
    assert default_threads(workers=0, processes=2, cpus=16) == 8 and default_threads(workers=8, processes=4, cpus=16) == 1
