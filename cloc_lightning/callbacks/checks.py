"""Read the training step's value checks every ``log_every_n_steps`` instead of every step.

:class:`DeviceChecks` is added to every fit by
:meth:`~cloc_lightning.methods.base.BaseModule.configure_callbacks`.  Around each training
batch it makes a :class:`~cloc_lightning.checks.DeferredChecks` active, so the checks of the
losses, the online probe and the module's finite-loss / finite-gradient guards record
device-side flags instead of reading the device (:func:`cloc_lightning.checks.require`).
The flags are read with one host sync:

* after every batch at which Lightning updates its loggers (``trainer.log_every_n_steps``;
  Lightning reads the logged values on those steps anyway),
* at the end of every training epoch, and
* before any checkpoint is written (``on_save_checkpoint``), so a checkpoint never holds
  weights that a check flagged.

A failed check raises its own error (the message names the fix) plus the batch at which
it first failed.  With the module's ``strict_checks: true`` the callback stays inactive and
every check reads the device at once, stopping at the failing step before the optimiser
changes the weights (one or more host syncs per step: a debugging mode).
"""

from __future__ import annotations

from typing import Any

import lightning as L
from lightning.pytorch.callbacks import Callback

from cloc_lightning.checks import DeferredChecks

__all__ = ["DeviceChecks", "is_logging_step"]


def is_logging_step(trainer: L.Trainer) -> bool:
    """Whether Lightning writes the training step's logged values to the loggers after this batch.

    Lightning's own test (its logger connector's ``should_update_logs``: every
    ``log_every_n_steps`` optimiser steps), read in ``training_step`` or ``on_train_batch_end``;
    the same on every process.
    """
    connector = getattr(trainer, "_logger_connector", None)
    flag = getattr(connector, "should_update_logs", None)
    if isinstance(flag, bool):
        return flag
    every = int(getattr(trainer, "log_every_n_steps", 50))
    return every > 0 and (trainer.global_step + 1) % every == 0


class DeviceChecks(Callback):
    """Defer the training step's value checks and read them every ``log_every_n_steps`` (see the module docstring).

    Args:
        strict: read every check at once instead (the module's ``strict_checks``).
    """

    def __init__(self, strict: bool = False) -> None:
        self.strict = bool(strict)
        self.checks = DeferredChecks()

    @property
    def state_key(self) -> str:
        return "DeviceChecks"

    def _read(self, trainer: L.Trainer, where: str) -> None:
        self.checks.deactivate()
        self.checks.raise_if_failed(
            f"{where} (checks are read every log_every_n_steps={getattr(trainer, 'log_every_n_steps', '?')} steps and before "
            "checkpoints; the weights were updated after the failing batch: resume from the last checkpoint with "
            "--ckpt_path; --model.strict_checks true stops at the failing step before the weights change)"
        )

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.strict:
            return
        self.checks.advance(pl_module.device)
        self.checks.activate()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.strict:
            return
        self.checks.deactivate()
        if is_logging_step(trainer):
            self._read(trainer, f"at step {trainer.global_step}")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if not self.strict:
            self._read(trainer, f"at the end of epoch {trainer.current_epoch}")

    def on_save_checkpoint(self, trainer: L.Trainer, pl_module: L.LightningModule, checkpoint: dict[str, Any]) -> None:
        if not self.strict:
            self._read(trainer, f"before writing a checkpoint at step {trainer.global_step}")

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self.checks.deactivate()
        self.checks.failures(across_processes=False)  # drop what was recorded; the run is over

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self.checks.deactivate()
