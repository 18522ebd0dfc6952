"""``last.ckpt`` that is always the last epoch.

Lightning (>= 2.5) writes ``last.ckpt`` of a ``ModelCheckpoint(monitor=..., save_last=True)``
only when that callback also saved a top-k checkpoint, i.e. when the monitored metric
improved: after epochs whose validation did not improve, ``last.ckpt`` still holds the
last *improving* epoch, and ``--ckpt_path last`` silently re-runs the epochs after it.

* :class:`BestCheckpoint` -- the monitored checkpoint every module adds by default: the best
  epoch, and ``last.ckpt`` rewritten at the end of every training epoch (after that epoch's
  validation), improved or not.  ``trainer.checkpoint_callback.last_model_path`` is the last
  epoch, ``best_model_path`` the best.  An epoch whose monitored value is NaN or inf (a
  diverged model: its metrics are NaN, :mod:`cloc_lightning.metrics`) is never a best
  checkpoint; Lightning's ``ModelCheckpoint`` would save a first NaN epoch as its best (it
  ranks NaN as the worst value but keeps it while it has fewer than ``save_top_k``), so a run
  that diverged in every epoch has no best checkpoint at all.
* :class:`LatestCheckpoint` -- an unmonitored checkpoint that only overwrites ``last.ckpt``;
  added next to a ``ModelCheckpoint(monitor=..., save_last=True)`` that you configure (whose
  ``save_last`` is then switched off), or configure it yourself.
"""

from __future__ import annotations

import sys
from typing import Any, TextIO

import torch
from lightning.pytorch.callbacks import ModelCheckpoint, TQDMProgressBar

__all__ = ["BestCheckpoint", "LatestCheckpoint", "print_line"]


def print_line(trainer: Any, message: str, file: TextIO | None = None) -> None:
    """Print ``message`` on a line of its own on global rank 0, also while a progress bar is drawn.

    A plain ``print`` while Lightning's tqdm bar is on screen continues the bar's line
    (``Epoch 4: 100%|…| 12/12 [...]CLOC margins (frozen) written to …``); ``tqdm.write``
    clears the bars, prints the line and redraws them.  Other progress bars print through
    their own ``print``.
    """
    if trainer is not None and not trainer.is_global_zero:
        return
    out = sys.stdout if file is None else file
    bar = getattr(trainer, "progress_bar_callback", None) if trainer is not None else None
    if bar is None or not bar.is_enabled:
        print(message, file=out, flush=True)
    elif isinstance(bar, TQDMProgressBar):
        from lightning.pytorch.callbacks.progress.tqdm_progress import Tqdm

        Tqdm.write(message, file=out)
        out.flush()
    else:
        bar.print(message)


class BestCheckpoint(ModelCheckpoint):
    """``ModelCheckpoint`` of the best ``monitor`` value whose ``last.ckpt`` is the last epoch, always.

    Same arguments as ``ModelCheckpoint`` (``save_last`` defaults to ``True``).  At the end of
    every training epoch, if this epoch did not already write ``last.ckpt`` (it does when the
    metric improved), it is written now.
    """

    def __init__(self, *args: Any, save_last: bool | None = True, **kwargs: Any) -> None:
        super().__init__(*args, **{**kwargs, "save_last": save_last})

    def check_monitor_top_k(self, trainer: Any, current: torch.Tensor | None = None) -> bool:
        """Lightning's decision, except that a NaN/inf value is never an improvement (nor a first best).

        The value is the same on every rank (logged metrics are synced), so the ranks agree.
        The module says why in its own warning (``BaseModule.on_validation_end``).
        """
        if current is not None and not bool(torch.isfinite(torch.as_tensor(current)).all()):
            return False
        return super().check_monitor_top_k(trainer, current)

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if not self.save_last or trainer.sanity_checking or trainer.fast_dev_run or trainer.state.fn != "fit":
            return
        if self._last_global_step_saved != trainer.global_step or not self.last_model_path:
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class LatestCheckpoint(ModelCheckpoint):
    """Overwrite ``<dirpath>/last.ckpt`` at the end of every training epoch, improved or not.

    Every :class:`~cloc_lightning.methods.base.BaseModule` adds one next to its
    best-metric checkpoint (see ``BaseModule.configure_callbacks``).  Configure it yourself
    to change the folder or to also save every ``every_n_train_steps`` steps::

        trainer:
          callbacks:
            - class_path: cloc_lightning.callbacks.LatestCheckpoint
              init_args: {every_n_train_steps: 500}

    Args:
        dirpath: checkpoint folder (default: ``<log_dir>/checkpoints``, as Lightning's).
        filename: file name without ``.ckpt`` (default ``last``, what ``--ckpt_path last`` finds).
        every_n_train_steps: also overwrite it every this many optimiser steps (``None``: epoch ends only).
        **kwargs: other ``ModelCheckpoint`` arguments except ``monitor``/``save_top_k``/``save_last``.
    """

    def __init__(
        self,
        dirpath: str | None = None,
        filename: str = "last",
        every_n_train_steps: int | None = None,
        **kwargs: Any,
    ) -> None:
        for fixed in ("monitor", "save_top_k", "save_last", "enable_version_counter"):
            if fixed in kwargs:
                raise ValueError(f"LatestCheckpoint sets {fixed} itself; use ModelCheckpoint for a monitored checkpoint")
        kwargs.setdefault("save_on_train_epoch_end", True)
        super().__init__(
            dirpath=dirpath,
            filename=filename,
            monitor=None,
            save_top_k=1,
            save_last=False,
            every_n_train_steps=every_n_train_steps,
            enable_version_counter=False,  # overwrite, never last-v1.ckpt
            **kwargs,
        )


    @property
    def path(self) -> str:
        """The file last written (``''`` before the first save)."""
        return self.best_model_path  # an unmonitored top-1 checkpoint: its "best" is the newest
