"""Ordinal and nominal classification metrics on torchmetrics.

Every metric here takes the same inputs, ``update(scores, target)`` with
``scores`` ``[B, C]`` (logits or probabilities; anything whose ``softmax`` is
the class distribution) and integer ``target`` ``[B]``, so one
:class:`~torchmetrics.MetricCollection` serves a whole module and syncs across
DDP ranks like any torchmetrics metric.

Ordinal metrics (classes are ranks ``0..C-1``):

* ``mae``: mean absolute error of the arg-max class, ``mean |argmax - y|``;
* ``mae_expected``: MAE of the expected rank ``sum_c softmax_c * c`` (the usual
  regression read-out of OrdinalCLIP and DLDL-style methods);
* ``acc``: top-1 accuracy;
* ``qwk``: quadratic weighted Cohen's kappa of the arg-max class;
* ``acc_pm1``: accuracy within one rank, ``mean [|argmax - y| <= 1]``.

Nominal metrics: ``acc`` (top-1) and ``acc_top5``.
"""

from __future__ import annotations

from typing import Literal

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassCohenKappa

from cloc_lightning.validation import check_choice, check_tensor

__all__ = [
    "Task",
    "ArgmaxMAE",
    "ExpectedRankMAE",
    "OffByOneAccuracy",
    "ordinal_metrics",
    "nominal_metrics",
    "build_metrics",
]

#: what the classes are: ranks (``ordinal``) or unordered categories (``nominal``)
Task = Literal["ordinal", "nominal"]

_INPUTS = "update(scores [B, C], target [B])"


class _MeanMetric(Metric):
    """Sum of per-sample values over the number of samples, synced over ranks."""

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False
    total: torch.Tensor
    count: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        check_tensor("scores", scores, dim=2, layout="[B, C]", hint=_INPUTS)
        check_tensor("target", target, dim=1, layout="[B]", hint=_INPUTS)
        if scores.shape[0] != target.shape[0]:
            raise ValueError(f"scores [B, C] and target [B] must agree in B, got {tuple(scores.shape)} and {tuple(target.shape)}")
        values = self._values(scores.detach(), target)
        self.total += values.double().sum()
        self.count += values.numel()

    def compute(self) -> torch.Tensor:
        return (self.total / self.count.clamp_min(1)).float()


class ArgmaxMAE(_MeanMetric):
    """``mean |argmax(scores) - target|`` in rank units."""

    higher_is_better = False

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (scores.argmax(dim=1) - target).abs().float()


class ExpectedRankMAE(_MeanMetric):
    """``mean |sum_c softmax(scores)_c * c - target|`` in rank units."""

    higher_is_better = False

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        ranks = torch.arange(scores.shape[1], device=scores.device, dtype=torch.float32)
        expected = scores.float().softmax(dim=1) @ ranks
        return (expected - target.float()).abs()


class OffByOneAccuracy(_MeanMetric):
    """Fraction of samples whose arg-max class is within ``tolerance`` ranks of the target."""

    higher_is_better = True

    def __init__(self, tolerance: int = 1) -> None:
        super().__init__()
        self.tolerance = tolerance

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return ((scores.argmax(dim=1) - target).abs() <= self.tolerance).float()


# Both collections use ``compute_groups=False``: torchmetrics merges metrics whose states are
# equal after the first ``update`` and keeps the merge for the collection's life.  Our mean
# metrics share one state layout, so a first batch in which every error was exactly 1 rank
# (MAE = 1 = the ±1 accuracy) made ``mae`` report ``acc_pm1`` for the rest of the run.


def ordinal_metrics(num_classes: int, prefix: str = "") -> MetricCollection:
    """MAE (arg-max and expected rank), accuracy, QWK and ±1 accuracy."""
    return MetricCollection(
        {
            "mae": ArgmaxMAE(),
            "mae_expected": ExpectedRankMAE(),
            "acc": MulticlassAccuracy(num_classes=num_classes, average="micro"),
            "qwk": MulticlassCohenKappa(num_classes=num_classes, weights="quadratic"),
            "acc_pm1": OffByOneAccuracy(1),
        },
        prefix=prefix,
        compute_groups=False,
    )


def nominal_metrics(num_classes: int, prefix: str = "") -> MetricCollection:
    """Top-1 and (for >= 5 classes) top-5 accuracy."""
    metrics: dict[str, Metric | MetricCollection] = {"acc": MulticlassAccuracy(num_classes=num_classes, average="micro")}
    if num_classes >= 5:
        metrics["acc_top5"] = MulticlassAccuracy(num_classes=num_classes, average="micro", top_k=5)
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


def build_metrics(task: Task, num_classes: int, prefix: str = "") -> MetricCollection:
    """The metric collection for ``task`` (``'ordinal'`` or ``'nominal'``)."""
    check_choice("task", task, Task)
    return ordinal_metrics(num_classes, prefix) if task == "ordinal" else nominal_metrics(num_classes, prefix)
