"""SIGTERM (a scheduler's preemption) during ``fit``: save a mid-epoch checkpoint, then exit non-zero.

Lightning alone stops a fit on SIGTERM with ``SIGTERMException``, a ``SystemExit`` *without*
an exit code: the process exits 0 (the scheduler records success), no checkpoint is written
and the partial epoch is lost.  :class:`PreemptionCheckpoint` (added to every module's fit by
:meth:`~cloc_lightning.methods.base.BaseModule.configure_callbacks`) instead

1. takes SIGTERM over from Lightning for the training loop (the signal only sets a flag, and
   is relayed once to the processes the strategy launched, as Lightning's own handler does);
2. at the end of the next training batch (one process) -- or, under DDP, at the next
   logging step (``log_every_n_steps``) or epoch end, after every rank agreed on the flag with
   one all-reduce -- writes ``last.ckpt`` into the run's checkpoint folder.  The checkpoint is
   mid-epoch and exact: ``--ckpt_path last`` continues with the next batch, and the run equals
   one that was never interrupted (``tests/callbacks/test_preemption.py``);
3. exits with :attr:`exit_code` (default 143 = 128 + SIGTERM, what a shell reports for a
   process killed by SIGTERM), so a scheduler sees the run as interrupted, not finished.

Under SLURM with ``--signal=USR1@90``, Lightning's ``SLURMEnvironment(auto_requeue=True)``
already checkpoints and requeues on ``SIGUSR1``; this callback covers the ``SIGTERM`` that
SLURM, Kubernetes or a cloud spot reclaim send before killing the job.  A SIGTERM outside the
training loop (``validate``/``test``/``predict``, or a fit's sanity check) ends the command
with the same exit code through :func:`cloc_lightning.cli.main`.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from types import FrameType
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from cloc_lightning._logging import print_line

__all__ = ["PreemptionCheckpoint", "Preempted", "SIGTERM_EXIT_CODE"]

#: exit code after a SIGTERM: 128 + 15, what a shell reports for a process that SIGTERM killed
SIGTERM_EXIT_CODE = 128 + int(signal.SIGTERM)


class Preempted(SystemExit):
    """Raised after the preemption checkpoint is written; exits the process with a non-zero code."""


class PreemptionCheckpoint(Callback):
    """On SIGTERM during ``fit``, write a mid-epoch ``last.ckpt`` and exit with ``exit_code``.

    Args:
        exit_code: the process's exit code after the checkpoint (default 143 = 128 + SIGTERM).
        filename: checkpoint file name without ``.ckpt`` in the run's checkpoint folder (default
            ``last``, what ``--ckpt_path last`` resumes).
    """

    def __init__(self, exit_code: int = SIGTERM_EXIT_CODE, filename: str = "last") -> None:
        if not isinstance(exit_code, int) or isinstance(exit_code, bool) or not 1 <= exit_code <= 255:
            raise ValueError(f"PreemptionCheckpoint: exit_code must be an integer in 1..255 (non-zero), got {exit_code!r}")
        self.exit_code = exit_code
        self.filename = filename
        self.received = False
        self._previous: Any = None
        self._installed = False

    # ------------------------------------------------------------------ the signal
    def _handler(self, signum: int, frame: FrameType | None) -> None:
        first = not self.received
        self.received = True
        launcher = getattr(self._strategy, "launcher", None) if self._strategy is not None else None
        if first and launcher is not None:  # the processes this one launched stop with it (Lightning does the same)
            launcher.kill(signum)

    def _install(self, trainer: L.Trainer) -> None:
        if self._installed or threading.current_thread() is not threading.main_thread():
            return  # signal handlers can only be set from the main thread
        self._strategy = trainer.strategy
        self._previous = signal.getsignal(signal.SIGTERM)
        signal.signal(signal.SIGTERM, self._handler)
        self._installed = True

    def _uninstall(self) -> None:
        if self._installed and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._previous if self._previous is not None else signal.SIG_DFL)
        self._installed = False
        self._strategy = None

    _strategy: Any = None

    # ------------------------------------------------------------------ hooks
    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        # Lightning registered its own SIGTERM handler before the stage started; during the training loop it is ours
        self.received = bool(trainer.received_sigterm)  # a SIGTERM before training started (e.g. in the sanity check)
        self._install(trainer)

    def on_train_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._uninstall()

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._uninstall()

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._uninstall()

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.world_size > 1:
            from cloc_lightning.callbacks.checks import is_logging_step

            if not is_logging_step(trainer):  # ranks agree with one collective, on the steps that already sync
                return
        self._stop_if_preempted(trainer, f"epoch {trainer.current_epoch}, {batch_idx + 1} of its batches done")

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self._stop_if_preempted(trainer, f"the end of epoch {trainer.current_epoch}")

    # ------------------------------------------------------------------ the stop
    def _agreed(self, trainer: L.Trainer) -> bool:
        """Whether any process received SIGTERM (one all-reduce under DDP; a Python flag on one process)."""
        if trainer.world_size <= 1:
            return self.received
        flag = torch.tensor(float(self.received), device=trainer.strategy.root_device)
        return bool(trainer.strategy.reduce(flag, reduce_op="max") > 0)

    def checkpoint_path(self, trainer: L.Trainer) -> str:
        """``<the first checkpoint callback's folder>/<filename>.ckpt``, else ``<log_dir or default_root_dir>/checkpoints/``."""
        for cb in trainer.checkpoint_callbacks:
            if isinstance(cb, ModelCheckpoint) and cb.dirpath:
                return os.path.join(os.fspath(cb.dirpath), f"{self.filename}.ckpt")
        root = trainer.log_dir or trainer.default_root_dir
        return os.path.join(root, "checkpoints", f"{self.filename}.ckpt")

    def _stop_if_preempted(self, trainer: L.Trainer, where: str) -> None:
        if trainer.sanity_checking or not self._agreed(trainer):
            return
        path = self.checkpoint_path(trainer)
        trainer.save_checkpoint(path)  # every rank calls it (a collective); rank 0 writes
        print_line(
            trainer,
            f"\nSIGTERM received: saved a checkpoint at {where} (global step {trainer.global_step}) to {path}; "
            f"resume with --ckpt_path last (or --ckpt_path {path}). Exiting with code {self.exit_code}.",
            file=sys.stderr,
        )
        self._uninstall()
        raise Preempted(self.exit_code)
