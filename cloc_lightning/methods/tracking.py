"""The final and best validation values of a fit: tracked every validation epoch, printed and logged at its end, kept in checkpoints.

:class:`BestFinalTracking` is the piece of :class:`~cloc_lightning.methods.classifier.ClassifierModule`
that does this (a mixin listed before ``BaseModule`` in its bases); every classifier module
inherits it.  Every validation epoch of a fit also logs the running best of
:meth:`~BestFinalTracking.tracked_metrics` -- ``val/acc_best`` and ``val/acc_best_epoch`` (and
``val/mae_best`` / ``val/mae_best_epoch`` for ordinal data) -- next to the epoch's own value;
at the end of ``fit`` both are printed (:meth:`~BestFinalTracking.summary_line`, e.g.
``CEModule: val/acc final 0.8712 (epoch 99), best 0.8760 (epoch 87)``), sent to the loggers
as ``<name>_final`` / ``<name>_best`` and kept in ``val_summary``.  A ``test`` run in the same
process (``test_after_fit``, which tests the best checkpoint) logs them again next to the
test metrics; a ``test`` run of its own (``cloc-lightning test --ckpt_path``) does not: the
checkpoint's validation values are no test metric.  Epochs count from 0, as in the checkpoint names.  The history is saved in
checkpoints (``checkpoint[VAL_HISTORY_KEY]``), so a resumed fit continues it.

A NaN/inf value (a diverged model: :mod:`cloc_lightning.metrics` gives NaN for non-finite
outputs) is never an improvement; a run with no finite epoch has no best.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from torchmetrics import MetricCollection

from cloc_lightning._logging import print_line
from cloc_lightning.data_contract import datamodule_info

if TYPE_CHECKING:  # a mixin of LightningModules: type-checked as one, a plain class at run time
    import lightning as L

    _LightningModule = L.LightningModule
else:
    _LightningModule = object

__all__ = ["BestFinalTracking"]


class BestFinalTracking(_LightningModule):
    """Final/best tracking of the validation metrics in ``val_metrics`` (see the module docstring).

    The class using it sets ``self.val_summary = {}`` and ``self.val_metrics`` (a
    ``MetricCollection`` of the validation metrics, or ``None`` before ``setup``) and has
    ``monitor`` / ``monitor_mode`` properties (``BaseModule`` has).  Subclasses override
    :meth:`tracked_metrics` to track more metrics, :attr:`summary_name` to name themselves in
    :meth:`summary_line` and :attr:`VAL_HISTORY_KEY` to keep their history under their own key.
    """

    #: checkpoint key of the validation history (final / best per tracked metric)
    VAL_HISTORY_KEY: ClassVar[str] = "cloc_lightning/val_history"
    #: how :meth:`summary_line` names the module (``None``: the class name)
    summary_name: ClassVar[str | None] = None
    #: whether this process ran a fit of the module (``test_after_fit``): only then does a test log the fit's values
    _fitted_in_process: bool = False

    #: ``{metric: {"final", "final_epoch", "best", "best_epoch"}}`` of the validation epochs of the fit
    val_summary: dict[str, dict[str, float]]
    val_metrics: MetricCollection | None

    if TYPE_CHECKING:

        @property
        def monitor(self) -> str: ...

        @property
        def monitor_mode(self) -> Literal["min", "max"]: ...

    def tracked_metrics(self) -> dict[str, str]:
        """Validation metrics whose best value is tracked: ``{name: 'max' | 'min'}``.

        Top-1 accuracy (what SupContrast's linear stage reports) and the checkpoint's monitor
        (``val/mae`` for ordinal data).
        """
        tracked = {"val/acc": "max"}
        tracked.setdefault(self.monitor, self.monitor_mode)
        return tracked

    def _tracking(self) -> bool:
        trainer = self._trainer
        return trainer is not None and not trainer.sanity_checking and trainer.state.fn == "fit"

    def on_validation_epoch_end(self) -> None:
        """Update the final/best summary with this epoch's values and log the running best."""
        super().on_validation_epoch_end()
        if not self._tracking() or self.val_metrics is None:
            return
        if not any(m.update_called for m in self.val_metrics.values(copy_state=False)):
            return
        values = self.val_metrics.compute()  # the epoch's values (Lightning computes the same, cached, next)
        epoch = int(self.current_epoch)
        for name, mode in self.tracked_metrics().items():
            if name not in values:
                continue
            value = float(values[name])
            entry = self.val_summary.get(name)
            if entry is None:  # no best yet: NaN until an epoch has a finite value
                entry = self.val_summary[name] = {"best": math.nan, "best_epoch": math.nan}
            # a NaN/inf value (non-finite outputs, cloc_lightning.metrics) is never an improvement
            better = math.isfinite(value) and (
                not math.isfinite(entry["best"]) or (value > entry["best"] if mode == "max" else value < entry["best"])
            )
            entry["final"], entry["final_epoch"] = value, float(epoch)
            if better:
                entry["best"], entry["best_epoch"] = value, float(epoch)
            # the same value on every rank (computed from synced metrics); sync_dist keeps Lightning quiet under DDP
            self.log(f"{name}_best", entry["best"], on_epoch=True, sync_dist=True)
            self.log(f"{name}_best_epoch", entry["best_epoch"], on_epoch=True, sync_dist=True)

    def summary_line(self) -> str:
        """``<summary_name>: val/acc final 0.8712 (epoch 99), best 0.8760 (epoch 87)`` (empty before any validation)."""
        parts = [
            f"{name} final {e['final']:.4f} (epoch {int(e['final_epoch'])}), "
            + (
                f"best {e['best']:.4f} (epoch {int(e['best_epoch'])})"
                if math.isfinite(e["best"])
                else "best none (no epoch had a finite value: the run diverged)"
            )
            for name, e in self.val_summary.items()
        ]
        if not parts:
            return ""
        data = datamodule_info(self._trainer, owner=type(self).__name__)
        note = " [validation set = the test split: data.val_fraction 0]" if data is not None and data.val_fraction == 0 else ""
        return f"{self.summary_name or type(self).__name__}: " + "; ".join(parts) + note

    def on_fit_end(self) -> None:
        """Print the final and best validation values and send them to the loggers (``<name>_final`` / ``_best``)."""
        super().on_fit_end()
        self._fitted_in_process = True
        if not self.val_summary:
            return
        print_line(self.trainer, self.summary_line())
        metrics: dict[str, float] = {}
        for name, e in self.val_summary.items():
            metrics.update({f"{name}_final": e["final"], f"{name}_best": e["best"], f"{name}_best_epoch": e["best_epoch"]})
        if self.trainer.is_global_zero:
            for logger in self.loggers:
                logger.log_metrics(metrics, step=self.global_step)
                logger.save()

    def on_test_epoch_end(self) -> None:
        """Log the fit's final and best validation values next to the test metrics (when this process ran the fit).

        A ``test`` of a checkpoint alone does not: the checkpoint's ``val/*_best`` would stand in the
        test table as if they were test metrics.
        """
        super().on_test_epoch_end()
        if not self._fitted_in_process:
            return
        for name, e in self.val_summary.items():
            self.log(f"{name}_final", e["final"], sync_dist=True)
            self.log(f"{name}_best", e["best"], sync_dist=True)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the validation history (final / best), so a resumed fit continues it."""
        super().on_save_checkpoint(checkpoint)
        checkpoint[self.VAL_HISTORY_KEY] = {k: dict(v) for k, v in self.val_summary.items()}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Restore the validation history when resuming a fit (or when this process has none).

        ``test_after_fit`` loads the best checkpoint into the module that just trained: its
        history (with the true final epoch) is kept then.
        """
        super().on_load_checkpoint(checkpoint)
        saved = checkpoint.get(self.VAL_HISTORY_KEY)
        fitting = self._trainer is not None and self.trainer.state.fn == "fit"
        if isinstance(saved, dict) and (fitting or not self.val_summary):
            self.val_summary = {k: {kk: float(vv) for kk, vv in v.items()} for k, v in saved.items()}
