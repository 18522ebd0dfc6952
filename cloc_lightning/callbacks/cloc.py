"""CLOC's two phases and margin plots as Lightning callbacks."""

from __future__ import annotations

import math
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


class CLOCMarginFreeze(Callback):
    """End CLOC's phase one: freeze the learned margins and write them as a ``learnable_map``.

    At the start of epoch ``freeze_at_epoch`` the margins of the module's CLOC
    loss become fixed (no gradient, removed from the optimiser), so the remaining
    epochs are phase two in the same run.  The all-``fixed`` map is written to
    ``<log_dir>/<filename>`` and logged (TensorBoard text + stdout).  With
    ``freeze_at_epoch=None`` nothing is frozen and the map of the final margins is
    written at the end of fit, ready for a separate phase-two run::

        cloc-lightning fit --config configs/cloc/utkface_phase2.yaml \
            --model.learnable_map <log_dir>/cloc_margins.yaml --model.init_from <phase1.ckpt>

    Resuming from a checkpoint taken after the freeze keeps the margins fixed.
    """

    def __init__(self, freeze_at_epoch: int | None = None, filename: str = "cloc_margins.yaml") -> None:
        if freeze_at_epoch is not None:
            check_int("freeze_at_epoch", freeze_at_epoch, 0, hint="or null: never freeze, write the final margins")
        self.freeze_at_epoch = freeze_at_epoch
        self.filename = filename
        self.frozen_at: dict[str, int] | None = None
        self.path: str | None = None

    @staticmethod
    def _check(pl_module: L.LightningModule) -> None:
        if not hasattr(pl_module, "freeze_margins") or not hasattr(pl_module, "cloc_loss"):
            raise TypeError(f"CLOCMarginFreeze needs a CLOCModule (with cloc_loss/freeze_margins), got {type(pl_module).__name__}")

    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        self._check(pl_module)
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

    @staticmethod
    def check_margins(learnable_map: list[list[Any]], trainer: L.Trainer, phase_one_done: bool) -> None:
        """Refuse margins that are not finite and > 0: they come from a diverged phase one and phase two refuses them."""
        values = [pair[1] for pair in learnable_map]
        bad = [i for i, v in enumerate(values) if not isinstance(v, (int, float)) or not math.isfinite(v) or v <= 0]
        if not bad:
            return
        epoch = trainer.current_epoch
        when = f"at the freeze (start of epoch {epoch})" if phase_one_done else f"at the end of fit (after {epoch} epoch(s))"
        raise ValueError(
            f"CLOCMarginFreeze: the learned margins {when} are {values}; margin(s) {bad} are not finite and > 0 (phase "
            "one diverged: softplus of a raw margin driven to -inf is 0), so no margins YAML is written and phase two "
            "cannot use them. Lower the learning rate (--model.lr, or --model.margin_lr for the margins) or clip "
            "gradients (--trainer.gradient_clip_val 1.0) and train phase one again"
        )

    def write(self, trainer: L.Trainer, pl_module: Any, learnable_map: list[list[Any]], phase_one_done: bool) -> str:
        """Write the margins YAML; return its path.  Raises a ``ValueError`` for margins that are not finite and > 0."""
        self.check_margins(learnable_map, trainer, phase_one_done)
        path = os.path.join(run_dir(trainer), self.filename)
        payload = {
            "learnable_map": learnable_map,
            "margin_mode": pl_module.hparams.margin_mode,
            "n_classes": pl_module.num_classes,
            "margin_names": pl_module.cloc_loss.margin_names(),
            "epoch": trainer.current_epoch,
            "global_step": trainer.global_step,
            "frozen_in_this_run": phase_one_done,
        }
        if trainer.is_global_zero:
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w") as f:
                f.write("# CLOC margins at the end of phase one; use with --model.learnable_map <this file>\n")
                yaml.safe_dump(payload, f, sort_keys=False)
            tb = tensorboard(trainer)
            if tb is not None:
                tb.add_text("cloc/learnable_map", "    " + yaml.safe_dump(learnable_map).replace("\n", "\n    "), trainer.global_step)
            print_line(trainer, f"CLOC margins ({'frozen' if phase_one_done else 'final'}) written to {path}: {learnable_map}")
        self.path = path
        return path

    # the hooks below get a CLOCModule (checked in ``setup``): ``pl_module`` is typed ``Any`` for its CLOC attributes
    def on_train_epoch_start(self, trainer: L.Trainer, pl_module: Any) -> None:
        at = self.freeze_at_epoch
        if at is None or trainer.current_epoch < at or getattr(pl_module, "margins_frozen", False):
            return
        learnable_map = pl_module.freeze_margins()
        self.frozen_at = {"epoch": trainer.current_epoch, "step": trainer.global_step}
        self.write(trainer, pl_module, learnable_map, phase_one_done=True)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        # Lightning (2.x) skips ``on_train_epoch_start`` of the first epoch after resuming from a
        # checkpoint written at the end of an epoch's last batch; freeze before that epoch's first step anyway.
        self.on_train_epoch_start(trainer, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        if not getattr(pl_module, "margins_frozen", False):
            self.write(trainer, pl_module, pl_module.cloc_loss.to_learnable_map("fixed"), phase_one_done=False)

    def state_dict(self) -> dict[str, Any]:
        return {"frozen_at": self.frozen_at, "freeze_at_epoch": self.freeze_at_epoch}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.frozen_at = state_dict.get("frozen_at")


class CLOCMarginPlot(Callback):
    """Record the CLOC margins every ``every_n_steps`` and plot them at the end of fit.

    Writes ``<log_dir>/cloc_margins.png`` (one line per adjacent class pair, the
    freeze marked) and the same figure to TensorBoard (``cloc/margins``).  The
    history is part of the callback's checkpoint state, so resumed runs plot the
    whole training.
    """

    def __init__(self, every_n_steps: int = 5, filename: str = "cloc_margins.png") -> None:
        check_int("every_n_steps", every_n_steps, 1)
        self.every_n_steps = every_n_steps
        self.filename = filename
        self.steps: list[int] = []
        self.values: list[list[float]] = []
        self.frozen_step: int | None = None
        self.path: str | None = None
        self._pending: list[torch.Tensor] = []

    #: recorded margins kept on the device before one host read converts them (``_flush``)
    flush_every: int = 64

    def _record(self, step: int, pl_module: Any) -> None:
        if self.steps and self.steps[-1] == step:
            return
        self.steps.append(step)
        # a device copy now, converted with the others in one read: no host sync on the training step
        self._pending.append(pl_module.cloc_loss.margins().detach().float().clone())
        if len(self._pending) >= self.flush_every:
            self._flush()

    def _flush(self) -> None:
        if self._pending:
            self.values.extend(torch.stack(self._pending).cpu().tolist())
            self._pending = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        if self.frozen_step is None and getattr(pl_module, "margins_frozen", False):
            self.frozen_step = trainer.global_step

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step % self.every_n_steps == 0:
            self._record(trainer.global_step, pl_module)

    def on_fit_end(self, trainer: L.Trainer, pl_module: Any) -> None:
        self._record(trainer.global_step, pl_module)
        self._flush()
        folder = run_dir(trainer)  # a collective under DDP: read on every rank, before the rank-0 branch
        if not trainer.is_global_zero or len(self.steps) < 2:
            return
        fig = margin_figure(self.steps, np.asarray(self.values), pl_module.cloc_loss.margin_names(), self.frozen_step)
        tb = tensorboard(trainer)
        if tb is not None:
            tb.add_figure("cloc/margins", fig, trainer.global_step, close=False)
        self.path = os.path.join(folder, self.filename)
        os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
        save_figure(fig, self.path)
        print_line(trainer, f"CLOC margin plot written to {self.path}")

    def state_dict(self) -> dict[str, Any]:
        self._flush()
        return {"steps": self.steps, "values": self.values, "frozen_step": self.frozen_step}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = []
        self.steps = list(state_dict.get("steps", []))
        self.values = list(state_dict.get("values", []))
        self.frozen_step = state_dict.get("frozen_step")
