"""Fault injection for the fault tests (kill/resume, preemption, dying loader workers; importable by ``class_path`` from a
CLI subprocess)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback
from torch.utils.data import Dataset


class PauseAtStep(Callback):
    """At the start of training batch ``global_step == step``, write ``marker`` (the pid) and sleep.

    The checkpoint of the previous step has been written by then (``ModelCheckpoint`` runs
    last in ``on_train_batch_end``), so the test can SIGKILL the process at a known step.
    """

    def __init__(self, step: int, marker: str, seconds: float = 600.0) -> None:
        self.step = step
        self.marker = marker
        self.seconds = seconds

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            Path(self.marker).write_text(str(os.getpid()))
            time.sleep(self.seconds)


class DyingWorkerDataset(Dataset):
    """A dataset whose ``__getitem__`` kills the loader worker process (``os._exit``) at ``index``."""

    def __init__(self, n: int = 32, index: int = 3) -> None:
        self.n = n
        self.index = index

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        import torch
        from torch.utils.data import get_worker_info

        if i == self.index and get_worker_info() is not None:
            os._exit(7)
        return torch.zeros(3, 16, 16), i % 2


class SignalAtStep(Callback):
    """After training step ``step`` (``on_train_batch_end`` with ``global_step == step``), send ``signum``
    (default SIGTERM) to this very process on global rank ``rank`` only: a scheduler's preemption at a known step."""

    def __init__(self, step: int, signum: int = 15, rank: int = 0) -> None:
        self.step = step
        self.signum = signum
        self.rank = rank
        self.sent = False

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step == self.step and trainer.global_rank == self.rank and not self.sent:
            self.sent = True
            os.kill(os.getpid(), self.signum)


class SignalInSanityCheck(Callback):
    """Send SIGTERM to this process after the first batch of a fit's sanity-check validation."""

    def on_validation_batch_end(self, trainer: L.Trainer, *args: Any, **kwargs: Any) -> None:
        if trainer.sanity_checking:
            os.kill(os.getpid(), 15)
