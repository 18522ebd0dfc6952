"""Helpers shared by the callbacks: the run folder and the TensorBoard writer."""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.loggers import TensorBoardLogger

__all__ = ["run_dir", "tensorboard"]


def run_dir(trainer: L.Trainer) -> str:
    """The run folder (``trainer.log_dir``, else ``default_root_dir``).

    ``trainer.log_dir`` is a broadcast from rank 0 under DDP, i.e. a collective: call this
    on every rank (before any ``if trainer.is_global_zero`` branch), never on one rank alone,
    or the other ranks wait for it forever.
    """
    return trainer.log_dir or trainer.default_root_dir


def tensorboard(trainer: L.Trainer) -> Any:
    """The ``SummaryWriter`` of the first TensorBoard logger, or ``None``."""
    for logger in trainer.loggers:
        if isinstance(logger, TensorBoardLogger):
            return logger.experiment
    return None
