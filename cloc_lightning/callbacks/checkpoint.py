"""``last.ckpt`` that is always the last epoch.

Lightning (>= 2.5) writes ``last.ckpt`` of a ``ModelCheckpoint(monitor=..., save_last=True)``
only when that callback also saved a top-k checkpoint, i.e. when the monitored metric
improved: after epochs whose validation did not improve, ``last.ckpt`` still holds the
last *improving* epoch, and ``--ckpt_path last`` silently re-runs the epochs after it.
:class:`LatestCheckpoint` is a separate, unmonitored checkpoint that overwrites
``last.ckpt`` at the end of every training epoch (after that epoch's validation), so a
resumed fit always continues from where it stopped.
"""

from __future__ import annotations

from typing import Any

from lightning.pytorch.callbacks import ModelCheckpoint

__all__ = ["LatestCheckpoint"]


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

