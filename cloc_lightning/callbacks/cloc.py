"""CLOC's two phases and margin plots as Lightning callbacks.

The margins themselves (values, frozen state, YAML) belong to the module's CLOC loss
(:class:`~cloc_lightning.losses.cloc_margins.CLOCMargins`); these callbacks only say *when*:
:class:`CLOCMarginFreeze` at which epoch phase two starts (as Lightning's ``BaseFinetuning``
says when to unfreeze), :class:`CLOCMarginPlot` which steps the plot keeps.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import lightning as L
import numpy as np
import torch
import yaml
from lightning.pytorch.callbacks import Callback

from cloc_lightning.callbacks._util import run_dir, tensorboard
from cloc_lightning.callbacks.checkpoint import print_line
from cloc_lightning.plots import margin_figure, save_figure
from cloc_lightning.validation import check_int

__all__ = ["CLOCMarginFreeze", "CLOCMarginPlot"]

#: how to avoid a diverged phase one, on the command line (ends the refusal of unusable margins)
_DIVERGED_FIX = (
    "Lower the learning rate (--model.lr, or --model.margin_lr for the margins) or clip gradients "
    "(--trainer.gradient_clip_val 1.0) and train phase one again"
)


def _margins_of(pl_module: Any, who: str) -> Any:
    """The module's CLOC loss, the owner of its margins; a ``TypeError`` naming ``who`` for another module."""
    if not hasattr(pl_module, "freeze_margins") or not hasattr(pl_module, "cloc_loss"):
        raise TypeError(f"{who} needs a CLOCModule (with cloc_loss/freeze_margins), got {type(pl_module).__name__}")
    return pl_module.cloc_loss


class CLOCMarginFreeze(Callback):
    """End CLOC's phase one at an epoch: freeze the learned margins and write them as a ``learnable_map``.

    At the start of epoch ``freeze_at_epoch`` the module freezes its margins
    (``freeze_margins``: the CLOC loss fixes them; their optimiser group skips them), so the remaining
    epochs are phase two in the same run, and the loss writes the all-``fixed`` map to
    ``<log_dir>/<filename>`` (also logged: TensorBoard text + stdout).  With
    ``freeze_at_epoch=None`` nothing is frozen and the map of the final margins is written at
    the end of fit, ready for a separate phase-two run::

        cloc-lightning fit --config configs/cloc/utkface_phase2.yaml \
            --model.learnable_map <log_dir>/cloc_margins.yaml --model.init_from <phase1.ckpt>

    The callback only decides when; whether and when the margins were frozen is the loss's
    record (:attr:`frozen_at` reads it), which checkpoints keep: resuming after the freeze
    keeps the margins fixed.
    """

    def __init__(self, freeze_at_epoch: int | None = None, filename: str = "cloc_margins.yaml") -> None:
        if freeze_at_epoch is not None:
            check_int("freeze_at_epoch", freeze_at_epoch, 0, hint="or null: never freeze, write the final margins")
        self.freeze_at_epoch = freeze_at_epoch
        self.filename = filename
        self.path: str | None = None
        self._margins: Any = None  # the module's CLOC loss (set in ``setup``)

    @property
    def frozen_at(self) -> dict[str, Any] | None:
        """``{'epoch': e, 'step': s}`` of the freeze, as the margins record it; ``None`` before (or before ``setup``)."""
        return None if self._margins is None else self._margins.frozen_at

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._margins = _margins_of(pl_module, "CLOCMarginFreeze")
        at, epochs = self.freeze_at_epoch, trainer.max_epochs
        if stage == "fit" and at is not None and not getattr(trainer, "fast_dev_run", False) and epochs is not None and 0 < epochs <= at:
            # A warning, not an error: the run still gives a valid, labelled phase-one result (the final margins
            # YAML, frozen_in_this_run: false, for a separate phase-two run), and shortened trial runs of the
            # two-phase configs (--trainer.max_epochs 1) stay possible; but it is said at the start, not discovered.
            print_line(
                trainer,
                f"warning: CLOCMarginFreeze(freeze_at_epoch={at}) with trainer.max_epochs={epochs}: the margins will "
                f"never be frozen (epochs 0..{epochs - 1} are all phase one) and phase two will not run; the final "
                f"margins are written at the end instead. For both phases set freeze_at_epoch below {epochs} "
                f"(--trainer.callbacks.init_args.freeze_at_epoch) or --trainer.max_epochs {at + 1} or more; "
                "freeze_at_epoch: null trains phase one only without this warning.",
                file=sys.stderr,
            )

    def write(self, trainer: L.Trainer, pl_module: Any, phase_one_done: bool) -> str:
        """Have the margins write their YAML (rank 0); return its path.

        Margins that are not finite and > 0 (a diverged phase one) are refused on every rank
        with a ``ValueError`` that says when, and no file is written.
        """
        margins = _margins_of(pl_module, "CLOCMarginFreeze")
        epoch = trainer.current_epoch
        when = f"at the freeze (start of epoch {epoch})" if phase_one_done else f"at the end of fit (after {epoch} epoch(s))"
        learnable_map = margins.usable_map(f"CLOCMarginFreeze: the learned margins {when}", _DIVERGED_FIX)
        path = os.path.join(run_dir(trainer), self.filename)  # a collective under DDP: on every rank
        if trainer.is_global_zero:
            margins.to_yaml(path, epoch=epoch, global_step=trainer.global_step, frozen_in_this_run=phase_one_done)
            tb = tensorboard(trainer)
            if tb is not None:
                tb.add_text("cloc/learnable_map", "    " + yaml.safe_dump(learnable_map).replace("\n", "\n    "), trainer.global_step)
            print_line(trainer, f"CLOC margins ({'frozen' if phase_one_done else 'final'}) written to {path}: {learnable_map}")
        self.path = path
        return path

    # the hooks below get a CLOCModule (checked in ``setup``): ``pl_module`` is typed ``Any`` for its CLOC attributes
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        at = self.freeze_at_epoch
        if at is None or trainer.current_epoch < at or pl_module.margins_frozen:
            return
        pl_module.freeze_margins()
        self.write(trainer, pl_module, phase_one_done=True)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        # Lightning (2.x) skips ``on_train_epoch_start`` of the first epoch after resuming from a checkpoint written at
        # the end of an epoch's last batch.  ``ResumeState`` (every module's callbacks) lets that epoch start anew, but
        # only on the Lightning loops it knows: on any other, the freeze still comes here, before that epoch's first step.
        self.on_train_epoch_start(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not pl_module.margins_frozen:
            self.write(trainer, pl_module, phase_one_done=False)

    def state_dict(self) -> dict[str, Any]:
        # ``frozen_at`` is not kept here: it is the margins' record, in the checkpoint's ``cloc`` entry
        return {"freeze_at_epoch": self.freeze_at_epoch}


class CLOCMarginPlot(Callback):
    """Record the CLOC margins during training and plot them at the end of fit.

    Records the margins the module logs (``margins/C{i}-C{i+1}``: before the update of each
    step divisible by ``every_n_steps``) and the final ones.  ``every_n_steps=None`` (the
    default) follows the module's ``log_margins_every_n_steps``, so the plot and the logged
    scalars are one history.  Writes ``<log_dir>/cloc_margins.png`` (one line per adjacent
    class pair, the freeze marked) and the same figure to TensorBoard (``cloc/margins``).  The
    history is part of the callback's checkpoint state, so resumed runs plot the whole training.
    """

    def __init__(self, every_n_steps: int | None = None, filename: str = "cloc_margins.png") -> None:
        if every_n_steps is not None:
            check_int("every_n_steps", every_n_steps, 1, hint="or null: the module's log_margins_every_n_steps")
        self.every_n_steps = every_n_steps
        self.filename = filename
        self.steps: list[int] = []
        self.values: list[list[float]] = []
        self.path: str | None = None
        self._pending: list[torch.Tensor] = []
        self._margins: Any = None  # the module's CLOC loss (set in ``setup``)
        self._every = every_n_steps or 0

    #: recorded margins kept on the device before one host read converts them (``_flush``)
    flush_every: int = 64

    @property
    def frozen_step(self) -> int | None:
        """The global step at which the margins were frozen (their record), or ``None``."""
        frozen_at = None if self._margins is None else self._margins.frozen_at
        return None if frozen_at is None else frozen_at.get("step")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._margins = _margins_of(pl_module, "CLOCMarginPlot")
        if self.every_n_steps is None:
            self._every = int(pl_module.hparams.get("log_margins_every_n_steps") or 0)

    def _record(self, step: int) -> None:
        if self.steps and self.steps[-1] == step:
            return
        self.steps.append(step)
        # a device copy now, converted with the others in one read: no host sync on the training step
        self._pending.append(self._margins.margins().detach().float().clone())
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self.values.extend(torch.stack(self._pending).cpu().tolist())
            self._pending = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self._every and trainer.global_step % self._every == 0:
            self._record(trainer.global_step)

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._record(trainer.global_step)
        self._flush()
        folder = run_dir(trainer)  # a collective under DDP: read on every rank, before the rank-0 branch
        if not trainer.is_global_zero or len(self.steps) < 2:
            return
        fig = margin_figure(self.steps, np.asarray(self.values), self._margins.margin_names(), self.frozen_step)
        tb = tensorboard(trainer)
        if tb is not None:
            tb.add_figure("cloc/margins", fig, trainer.global_step, close=False)
        self.path = os.path.join(folder, self.filename)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        save_figure(fig, self.path)
        print_line(trainer, f"CLOC margin plot written to {self.path}")

    def state_dict(self) -> dict[str, Any]:
        self._flush()
        # the freeze step is not kept here: it is the margins' record, in the checkpoint's ``cloc`` entry
        return {"steps": self.steps, "values": self.values}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = []
        self.steps = list(state_dict.get("steps", []))
        self.values = list(state_dict.get("values", []))
