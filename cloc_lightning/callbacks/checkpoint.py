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

import os
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from cloc_lightning._logging import print_line as print_line

__all__ = ["BestCheckpoint", "LatestCheckpoint", "install_checkpoints"]

# print_line lives in cloc_lightning._logging (the one rank-0 printer); still importable from here, its first home


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
        The module's :class:`~cloc_lightning.callbacks.finite.FiniteChecks` says why in its own warning.
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


def _is_default_checkpoint(cb: Callback) -> bool:
    """Whether ``cb`` is Lightning's own ``ModelCheckpoint()`` (added when no checkpoint callback is configured)."""
    if type(cb) is not ModelCheckpoint:
        return False
    default = ModelCheckpoint()
    return (
        cb.state_key == default.state_key
        and cb.dirpath is None
        and cb.filename is None
        and cb.save_last is None
        and cb.save_top_k == default.save_top_k
        and cb.save_weights_only == default.save_weights_only
    )


def install_checkpoints(trainer: L.Trainer, module: Any) -> list[Callback]:
    """Put a module's checkpoint callbacks on ``trainer``; return the trainer's callbacks after that.

    What every :class:`~cloc_lightning.methods.base.BaseModule` does in ``configure_callbacks``
    when checkpointing is enabled:

    * With no ``ModelCheckpoint`` configured (only Lightning's default one), a
      :class:`BestCheckpoint` keeps the best epoch by ``module.monitor`` (``module.monitor_mode``)
      and rewrites ``last.ckpt`` after every epoch, improved or not.
    * A ``ModelCheckpoint`` that you configure is kept as it is.  If it ties ``save_last`` to
      a monitored metric (Lightning then rewrites ``last.ckpt`` only when the metric
      improves), its ``save_last`` is switched off and a :class:`LatestCheckpoint` in the same
      folder writes ``last.ckpt`` every epoch instead (a message says so).

    Checkpoint callbacks are put on the trainer directly rather than returned by
    ``configure_callbacks``: Lightning drops every trainer callback of a type that
    ``configure_callbacks`` returns, which would discard checkpoints you configured (and print
    a misleading "will override" notice).
    """
    current: list[Callback] = trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at runtime, not declared on Trainer
    existing = trainer.checkpoint_callbacks
    if existing:  # checkpointing is enabled
        added: list[Callback] = []
        if all(_is_default_checkpoint(cb) for cb in existing):
            current = [cb for cb in current if not _is_default_checkpoint(cb)]
            added.append(
                BestCheckpoint(
                    monitor=module.monitor,
                    mode=module.monitor_mode,
                    filename="best-{epoch:03d}-{step}",
                    auto_insert_metric_name=False,
                )
            )
        elif not any(isinstance(cb, (LatestCheckpoint, BestCheckpoint)) for cb in current):
            configured = [cb for cb in trainer.checkpoint_callbacks if isinstance(cb, ModelCheckpoint)]
            tied = [cb for cb in configured if cb.save_last is True and cb.monitor is not None]
            for cb in tied:
                cb.save_last = False
                print_line(
                    trainer,
                    f"ModelCheckpoint(monitor={cb.monitor!r}, save_last=True) would rewrite last.ckpt only "
                    "when the metric improves; a LatestCheckpoint writes it after every epoch instead",
                )
            configured_last = any(cb.save_last for cb in configured)
            if not configured_last or tied:
                dirpath = tied[0].dirpath if tied else None
                added.append(LatestCheckpoint(dirpath=None if dirpath is None else os.fspath(dirpath)))
        if added:
            # checkpoints run after every other callback (Lightning's own ordering)
            current = [*current, *added]
            trainer.callbacks = current  # type: ignore[attr-defined]
    return current
