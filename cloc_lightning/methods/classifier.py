"""The base of every method that outputs class scores.

:class:`ClassifierModule` is :class:`~cloc_lightning.methods.base.BaseModule` plus a linear
classification head, ordinal or nominal **metrics** (hook :meth:`ClassifierModule.build_metrics`)
and the validation, test and predict steps used by every module that outputs class scores, plus
the final and best validation values of a fit (:mod:`cloc_lightning.methods.tracking`).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn
from torchmetrics import MetricCollection

from cloc_lightning.methods.base import BaseModule
from cloc_lightning.methods.tracking import BestFinalTracking
from cloc_lightning.metrics import TaskSetting, build_metrics
from cloc_lightning.validation import check_choice, check_keywords

__all__ = ["ClassifierModule"]


class ClassifierModule(BestFinalTracking, BaseModule):
    """Backbone + linear head with ordinal/nominal metrics for validation, test and predict.

    **Final and best.**  Every validation epoch of a fit also logs the running best of
    :meth:`tracked_metrics` (``val/acc_best``, ``val/acc_best_epoch``, ...); at the end of
    ``fit`` the final and best values are printed (:meth:`summary_line`), sent to the loggers
    and kept in ``val_summary`` and in checkpoints (:attr:`VAL_HISTORY_KEY`), so a resumed fit
    continues them: :class:`~cloc_lightning.methods.tracking.BestFinalTracking`.

    Args:
        num_classes: number of classes (ranks); must match the data module's.
        task: ``ordinal`` (MAE, expected-rank MAE, accuracy, QWK, ±1 accuracy),
            ``nominal`` (top-1/top-5) or ``auto`` (the data module's ``task``).
        **kwargs: :class:`~cloc_lightning.methods.base.BaseModule` arguments (backbone, optimiser, schedule).
    """

    def __init__(self, num_classes: int, task: TaskSetting = "auto", **kwargs: Any) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 2:
            raise ValueError(f"num_classes must be an integer >= 2, got {num_classes!r}")
        check_choice("task", task, TaskSetting)
        check_keywords(self, super().__init__, kwargs)
        super().__init__(**kwargs)
        self.num_classes = num_classes
        self.task = task
        self.head = self.build_head()
        self.val_metrics: MetricCollection | None = None
        self.test_metrics: MetricCollection | None = None
        if task != "auto":
            self._make_metrics(task)
        #: ``{metric: {"final", "final_epoch", "best", "best_epoch"}}`` of the validation epochs of the fit
        self.val_summary: dict[str, dict[str, float]] = {}

    # ------------------------------------------------------------------ hooks
    def build_head(self) -> nn.Module:
        """The classifier on backbone features: ``Linear(feature_dim, num_classes)``."""
        return nn.Linear(self.feature_dim, self.num_classes)

    def build_metrics(self, task: Literal["ordinal", "nominal"], prefix: str) -> MetricCollection:
        """Metrics logged as ``<prefix><name>`` (see :mod:`cloc_lightning.metrics`)."""
        return build_metrics(task, self.num_classes, prefix)

    def resolved_task(self) -> Literal["ordinal", "nominal"]:
        """``task``, or with ``task='auto'`` the attached data module's ``task`` (``ordinal`` without a data module).

        Known before ``setup``: the checkpoint callback that monitors ``val/acc`` (nominal) or
        ``val/mae`` (ordinal) is built from it.
        """
        if self.task != "auto":
            return self.task
        data = self.datamodule_info
        return "ordinal" if data is None else data.task

    @property
    def monitor(self) -> str:
        return "val/acc" if self.resolved_task() == "nominal" else "val/mae"

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        return "max" if self.resolved_task() == "nominal" else "min"

    # ---------------------------------------------------------------- lifecycle
    def _make_metrics(self, task: Literal["ordinal", "nominal"]) -> tuple[MetricCollection, MetricCollection]:
        self.task = task
        self.val_metrics = self.build_metrics(task, "val/")
        self.test_metrics = self.build_metrics(task, "test/")
        return self.val_metrics, self.test_metrics

    def setup(self, stage: str) -> None:
        super().setup(stage)
        data = self.datamodule_info
        if data is not None:
            data.check_num_classes(
                self.num_classes,
                fix=f"give the model num_classes {{n}} ({type(self).__name__}(num_classes={{n}}); "
                "the command line takes it from the data module: leave model.num_classes out)",
            )
        if self.val_metrics is None:
            for metrics in self._make_metrics(self.resolved_task()):
                metrics.to(self.device)

    # -------------------------------------------------------------------- steps
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores (logits) ``[B, num_classes]`` for images ``[B, 3, H, W]``."""
        logits: torch.Tensor = self.head(self.backbone(x))
        return logits

    def eval_outputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss, scores [B, C], metric keywords)`` of an evaluation batch: what validation and test log and score.

        The default: the cross-entropy of the class scores ``self(x)`` (in float32), the scores
        themselves and no keywords.  A module whose output is no class distribution overrides
        it: :class:`~cloc_lightning.methods.LinearRegressorModule` returns its L1 loss, scores
        whose arg-max is its nearest rank and ``{'expected': its clamped output}``, which
        ``mae_expected`` reads instead of a softmax expectation (the keywords go to the metrics
        whose ``update`` takes them, :class:`~cloc_lightning.metrics.ExpectedRankMAE`).
        """
        logits = self(x).float()
        return F.cross_entropy(logits, y), logits, {}

    def _eval_step(self, batch: Any, metrics: MetricCollection | None, stage: str) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        loss, scores, metric_kwargs = self.eval_outputs(x, y)
        self.log_eval_mean(f"{stage}/loss", loss, y.shape[0])
        if metrics is None:  # plain-Python use (no setup)
            val, test = self._make_metrics("ordinal" if self.task == "auto" else self.task)
            metrics = (val if stage == "val" else test).to(scores.device)
        metrics.update(scores, y, **metric_kwargs)
        self.log_dict(metrics, on_step=False, on_epoch=True, batch_size=y.shape[0])
        if stage == "test":
            self.log_eval_count("test/images", y.shape[0], scores.device)
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, self.val_metrics, "val")

    def test_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self._eval_step(batch, self.test_metrics, "test")

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """``{'pred': argmax class, 'expected': expected rank, 'probs': [B, C], 'target': labels}``."""
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        probs = self(x).float().softmax(dim=1)
        ranks = torch.arange(probs.shape[1], device=probs.device, dtype=probs.dtype)
        out = {"pred": probs.argmax(dim=1), "expected": probs @ ranks, "probs": probs}
        if y is not None:
            out["target"] = y
        return out
