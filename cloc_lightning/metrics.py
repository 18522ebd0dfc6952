"""Ordinal and nominal classification metrics on torchmetrics.

Every metric here takes the same inputs, ``update(scores, target)`` with
``scores`` ``[B, C]`` (logits or probabilities; anything whose ``softmax`` is
the class distribution) and integer ``target`` ``[B]``, so one
:class:`~torchmetrics.MetricCollection` serves a whole module and syncs across
DDP ranks like any torchmetrics metric.

Ordinal metrics (classes are ranks ``0..C-1``):

* ``mae``: mean absolute error of the arg-max class, ``mean |argmax - y|``;
* ``mae_expected``: MAE of the expected rank ``sum_c softmax_c * c`` (the usual
  regression read-out of OrdinalCLIP and DLDL-style methods), or of a regressor's own
  continuous estimate when the module passes it (``update(scores, target, expected=...)``);
* ``acc``: top-1 accuracy;
* ``qwk``: quadratic weighted Cohen's kappa of the arg-max class;
* ``acc_pm1``: accuracy within one rank, ``mean [|argmax - y| <= 1]``.

Nominal metrics: ``acc`` (top-1) and ``acc_top5``.

**Non-finite scores are failures.**  A row of ``scores`` holding NaN or inf (a diverged
model) is no prediction: the arg-max of a NaN row is some class index and would be scored
as a valid guess.  Every metric here counts such rows on the device (a ``nonfinite`` state,
summed over DDP ranks like the others; no host read) and computes to NaN when the count is
not zero, so a diverged model's MAE, accuracy or QWK is NaN, never a number that looks
like a result, and a best-checkpoint callback never takes it for an improvement.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torchmetrics import Metric, MetricCollection
from torchmetrics.classification import MulticlassAccuracy, MulticlassCohenKappa

from cloc_lightning.validation import check_choice, check_tensor

__all__ = [
    "Task",
    "TaskSetting",
    "Accuracy",
    "QuadraticKappa",
    "ArgmaxMAE",
    "ExpectedRankMAE",
    "OffByOneAccuracy",
    "ordinal_metrics",
    "nominal_metrics",
    "build_metrics",
]

#: what the classes are: ranks (``ordinal``) or unordered categories (``nominal``); a data module's ``task``
#: and what the metrics, probes and checkpoints follow
Task = Literal["ordinal", "nominal"]
#: a module's ``task`` argument: a :data:`Task`, or ``auto`` (the data module's)
TaskSetting = Literal["auto", "ordinal", "nominal"]

_INPUTS = "update(scores [B, C], target [B])"


def _nonfinite_rows(scores: torch.Tensor) -> torch.Tensor:
    """Number of rows of ``scores`` ``[B, C]`` holding a NaN or inf, as a 0-d int64 tensor on the device."""
    return (~torch.isfinite(scores.detach()).all(dim=1)).sum()


def _nan_if_nonfinite(value: torch.Tensor, nonfinite: torch.Tensor) -> torch.Tensor:
    """``value``, or NaN where any scored row was NaN/inf (a device-side select: no host read)."""
    return torch.where(nonfinite > 0, torch.full_like(value, float("nan")), value)


class _NonFiniteIsNaN:
    """Mixin for a torchmetrics classification metric: counts NaN/inf score rows (device-side) and computes NaN if any."""

    nonfinite: torch.Tensor

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.add_state("nonfinite", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")  # type: ignore[attr-defined]

    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        if preds.dim() == 2:
            self.nonfinite += _nonfinite_rows(preds)
        super().update(preds, target)  # type: ignore[misc]

    def compute(self) -> torch.Tensor:
        return _nan_if_nonfinite(super().compute(), self.nonfinite)  # type: ignore[misc]


class Accuracy(_NonFiniteIsNaN, MulticlassAccuracy):
    """``MulticlassAccuracy`` (top-k with ``top_k``) that is NaN when any scored row was NaN/inf."""


class QuadraticKappa(_NonFiniteIsNaN, MulticlassCohenKappa):
    """``MulticlassCohenKappa`` (give ``weights='quadratic'``) that is NaN when any scored row was NaN/inf."""


class _MeanMetric(Metric):
    """Sum of per-sample values over the number of samples, synced over ranks; NaN if any row of scores was NaN/inf."""

    is_differentiable = False
    higher_is_better: bool | None = None
    full_state_update = False
    total: torch.Tensor
    count: torch.Tensor
    nonfinite: torch.Tensor

    def __init__(self) -> None:
        super().__init__()
        self.add_state("total", default=torch.tensor(0.0, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("nonfinite", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")
        self.add_state("count", default=torch.tensor(0, dtype=torch.long), dist_reduce_fx="sum")

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, scores: torch.Tensor, target: torch.Tensor) -> None:
        self._check_inputs(scores, target)
        self._add(self._values(scores.detach(), target), scores)

    @staticmethod
    def _check_inputs(scores: torch.Tensor, target: torch.Tensor) -> None:
        check_tensor("scores", scores, dim=2, layout="[B, C]", hint=_INPUTS)
        check_tensor("target", target, dim=1, layout="[B]", hint=_INPUTS)
        if scores.shape[0] != target.shape[0]:
            raise ValueError(f"scores [B, C] and target [B] must agree in B, got {tuple(scores.shape)} and {tuple(target.shape)}")

    def _add(self, values: torch.Tensor, scores: torch.Tensor) -> None:
        """Accumulate the per-sample ``values`` [B] and the non-finite rows of ``scores``."""
        self.total += values.double().sum()
        self.count += values.numel()
        self.nonfinite += _nonfinite_rows(scores)

    def compute(self) -> torch.Tensor:
        return _nan_if_nonfinite((self.total / self.count.clamp_min(1)).float(), self.nonfinite)


class ArgmaxMAE(_MeanMetric):
    """``mean |argmax(scores) - target|`` in rank units."""

    higher_is_better = False

    def _values(self, scores: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return (scores.argmax(dim=1) - target).abs().float()


class ExpectedRankMAE(_MeanMetric):
    """``mean |sum_c softmax(scores)_c * c - target|`` in rank units, or ``mean |expected - target|``.

    ``update(scores, target, expected=None)``: ``expected`` ``[B]`` is a model's own continuous
    rank estimate when its scores are no class distribution (a regressor's output clamped to
    ``[0, C-1]``, :class:`~cloc_lightning.methods.LinearRegressorModule`); a
    :class:`~torchmetrics.MetricCollection` hands the keyword to this metric only.  Without it
    (every classifier), the softmax expectation of ``scores``.  Rows of ``scores`` that are not
    finite make the value NaN either way.
    """

    higher_is_better = False

    def update(self, scores: torch.Tensor, target: torch.Tensor, expected: torch.Tensor | None = None) -> None:
        if expected is None:
            super().update(scores, target)
            return
        self._check_inputs(scores, target)
        check_tensor("expected", expected, dim=1, layout="[B]", hint="update(scores [B, C], target [B], expected [B])")
        if expected.shape[0] != target.shape[0]:
            raise ValueError(f"expected [B] and target [B] must agree in B, got {tuple(expected.shape)} and {tuple(target.shape)}")
        self._add((expected.detach().float() - target.float()).abs(), scores)

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
            "acc": Accuracy(num_classes=num_classes, average="micro"),
            "qwk": QuadraticKappa(num_classes=num_classes, weights="quadratic"),
            "acc_pm1": OffByOneAccuracy(1),
        },
        prefix=prefix,
        compute_groups=False,
    )


def nominal_metrics(num_classes: int, prefix: str = "") -> MetricCollection:
    """Top-1 and (for >= 5 classes) top-5 accuracy."""
    metrics: dict[str, Metric | MetricCollection] = {"acc": Accuracy(num_classes=num_classes, average="micro")}
    if num_classes >= 5:
        metrics["acc_top5"] = Accuracy(num_classes=num_classes, average="micro", top_k=5)
    return MetricCollection(metrics, prefix=prefix, compute_groups=False)


def build_metrics(task: Task, num_classes: int, prefix: str = "") -> MetricCollection:
    """The metric collection for ``task`` (``'ordinal'`` or ``'nominal'``)."""
    check_choice("task", task, Task)
    return ordinal_metrics(num_classes, prefix) if task == "ordinal" else nominal_metrics(num_classes, prefix)
