"""CORN and CORAL: a backbone with ``K - 1`` binary "rank > k" tasks, trained end to end."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torchmetrics import MetricCollection

from cloc_lightning._logging import print_line
from cloc_lightning.checkpoints import INIT_FROM_HINT, MODULE_META_KEY, match_weights, read_checkpoint
from cloc_lightning.checks import DeferredChecks
from cloc_lightning.losses.base import upcast
from cloc_lightning.losses.ordinal_regression import (
    CORALLoss,
    CORNLoss,
    class_probabilities_from_exceedance,
    coral_exceedance,
    corn_exceedance,
    rank_from_exceedance,
)
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.metrics import _MeanMetric, _nonfinite_rows
from cloc_lightning.nn.ordinal_heads import CORALHead, CORNHead
from cloc_lightning.validation import check_choice, check_tensor

__all__ = ["OrdinalRegressionModule", "OrdinalHeadName", "RankMAE"]

#: the ordinal head and loss: ``corn`` (Shi et al. 2023) or ``coral`` (Cao et al. 2020)
OrdinalHeadName = Literal["corn", "coral"]

_NOMINAL = (
    "OrdinalRegressionModule (CORN/CORAL) predicts the ordered events 'y > k', so its classes must be ranks "
    "(task ordinal), but {what}; for unordered classes use cloc_lightning.methods.CEModule"
)


class RankMAE(_MeanMetric):
    """``mean |rank - target|`` of a module's own integer rank prediction ``rank`` ``[B]``.

    ``update(scores [B, C], target [B], rank=[B])``: ``rank`` is the prediction of the model's
    own rule (CORN/CORAL: the number of exceedance probabilities above 0.5,
    :func:`~cloc_lightning.losses.ordinal_regression.rank_from_exceedance`); ``scores`` are only
    checked for NaN/inf rows, which make the value NaN (as every metric of
    :mod:`cloc_lightning.metrics`).  Accumulated on the device, summed over DDP ranks.
    """

    higher_is_better = False

    def update(self, scores: torch.Tensor, target: torch.Tensor, rank: torch.Tensor | None = None) -> None:
        hint = "update(scores [B, C], target [B], rank=[B])"
        if rank is None:
            raise ValueError(f"RankMAE needs the predicted ranks: {hint} (a MetricCollection passes rank=... to it only)")
        check_tensor("scores", scores, dim=2, layout="[B, C]", hint=hint)
        check_tensor("target", target, dim=1, layout="[B]", hint=hint)
        check_tensor("rank", rank, dim=1, layout="[B]", hint=hint)
        if not scores.shape[0] == target.shape[0] == rank.shape[0]:
            raise ValueError(
                f"scores [B, C], target [B] and rank [B] must agree in B, got {tuple(scores.shape)}, "
                f"{tuple(target.shape)} and {tuple(rank.shape)}"
            )
        self.total += (rank.detach().double() - target.double()).abs().sum()
        self.count += target.numel()
        self.nonfinite += _nonfinite_rows(scores)


class OrdinalRegressionModule(ClassifierModule):
    """Backbone + an ordinal regression head with ``K - 1`` binary tasks "y > k", trained with CORN or CORAL.

    * ``head: corn`` -- **CORN** (Shi, Cao, Raschka, "Deep neural networks for rank-consistent
      ordinal regression based on conditional training", Pattern Analysis and Applications
      2023; arXiv 2111.08851): a linear layer to ``K - 1`` logits, logit ``k`` trained on the
      samples with ``y >= k`` only, so it models ``P(y > k | y > k-1)``; ``P(y > k)`` is the
      product of the conditional probabilities up to ``k``
      (:class:`~cloc_lightning.nn.ordinal_heads.CORNHead`,
      :class:`~cloc_lightning.losses.ordinal_regression.CORNLoss`).
    * ``head: coral`` -- **CORAL** (Cao, Mirjalili, Raschka, "Rank consistent ordinal regression
      for neural networks with application to age estimation", Pattern Recognition Letters 2020;
      arXiv 1901.07884): one weight vector shared by the ``K - 1`` tasks plus one bias each,
      every sample trains every task, ``P(y > k) = sigmoid(z_k)``; ``importance_weights`` are the
      paper's task weights ``lambda_k`` (:class:`~cloc_lightning.nn.ordinal_heads.CORALHead`,
      :class:`~cloc_lightning.losses.ordinal_regression.CORALLoss`).

    **Prediction rule** (both papers)::

        rank(x) = sum_{k=0}^{K-2} 1[ P(y > k | x) > 0.5 ]

    predicted by :meth:`predict_step` as ``rank`` and scored as ``val/mae_rank`` /
    ``test/mae_rank`` (:class:`RankMAE`, accumulated on the device).

    **Scores.**  :meth:`forward` returns class scores whose softmax is the class distribution,
    as every classifier here does, so the shared metrics, plots and ``predict_step`` keys work
    unchanged: the log of ``P(y = k) = P(y > k-1) - P(y > k)``
    (:func:`~cloc_lightning.losses.ordinal_regression.class_probabilities_from_exceedance`;
    ``P(y > -1) = 1``, ``P(y > K-1) = 0``), clamped at the smallest normal float before the
    log and computed in float32 (float64 under ``64-true``) with autocast off.  ``val/mae`` is
    then the MAE of the arg-max (most probable) class and ``val/mae_expected`` that of the
    expected rank; ``val/mae_rank`` is the papers' rule, which is the median of the
    distribution whenever ``P(y > k)`` is non-increasing in ``k`` (always for CORN; for CORAL
    when its biases are ordered).  The best checkpoint monitors ``val/mae`` as for every
    classifier (the same selection as the CE baseline the configs pair it with); the running
    best of ``val/mae_rank`` is logged and printed beside it.

    **Losses.**  Training minimises the CORN/CORAL loss of the head's logits
    (:meth:`build_loss`); ``val/loss`` and ``test/loss`` are the same loss on the evaluation
    batches (not a cross-entropy of the scores).  In evaluation the loss's value checks are not
    read: NaN/inf outputs make the loss and every metric NaN (reported after the epoch) instead
    of stopping the run, and labels out of range are refused by the accuracy metric.

    The task must be ordinal: ``task: nominal``, or ``task: auto`` with a nominal data module,
    is refused.  Hooks for a subclass: :meth:`build_head` (``[B, feature_dim] -> [B, K-1]``
    logits with the meaning of ``head``'s kind) and :meth:`build_loss` (a criterion on
    ``(logits [B, K-1], labels [B])``), as :class:`~cloc_lightning.methods.CEModule`'s.

    ``init_from`` loads the backbone from any checkpoint of this project (a CE, CLOC or SimCLR
    run, ...); the head's weights only from a checkpoint of this module with the same ``head``
    (a CE head's ``K`` logits are no CORN/CORAL thresholds), and a message says when it starts
    fresh.  ``--ckpt_path`` of a run with the other ``head`` is refused naming the fix.

    Args:
        num_classes: K, the number of ranks (the head has ``K - 1`` outputs).
        head: ``corn`` (default) or ``coral``.
        importance_weights: CORAL's ``K - 1`` task weights ``lambda_k >= 0`` (default: all 1,
            as in the paper's experiments); only with ``head: coral``.
        **kwargs: :class:`~cloc_lightning.methods.classifier.ClassifierModule` /
            :class:`~cloc_lightning.methods.base.BaseModule` arguments
            (``task``, ``backbone``, ``pretrained``, ``cifar_stem``, ``optimizer``, ``lr``, ...).

    Example::

        model = OrdinalRegressionModule(num_classes=8, head="corn", backbone="resnet18", lr=1e-3)
        trainer = L.Trainer(max_epochs=15)
        trainer.fit(model, datamodule=UTKFaceDataModule("data/utkface"))
        out = trainer.predict(model, datamodule=dm)[0]  # out["rank"]: the papers' prediction
    """

    #: the prefix of the head's weights (``init_from`` loads them only from the same kind of head)
    head_prefix: ClassVar[str] = "head."
    #: a checkpoint of the other ``head`` is refused by ``--ckpt_path`` (:func:`~cloc_lightning.checkpoints.checkpoint_mismatch`)
    identity_hparams: ClassVar[tuple[str, ...]] = ("head",)

    def __init__(
        self,
        num_classes: int,
        head: OrdinalHeadName = "corn",
        importance_weights: list[float] | None = None,
        **kwargs: Any,
    ) -> None:
        check_choice("head", head, OrdinalHeadName)
        if kwargs.get("task") == "nominal":
            raise ValueError(_NOMINAL.format(what="task is 'nominal'"))
        if importance_weights is not None:
            _check_importance_weights(importance_weights, head, num_classes)
        super().__init__(num_classes=num_classes, **kwargs)
        self.criterion = self.build_loss()

    # ------------------------------------------------------------------ hooks
    def build_head(self) -> nn.Module:
        """``CORNHead`` or ``CORALHead``: ``[B, feature_dim] -> [B, K-1]`` logits of the events ``y > k``."""
        if self.hparams.head == "coral":
            return CORALHead(self.feature_dim, self.num_classes)
        return CORNHead(self.feature_dim, self.num_classes)

    def build_loss(self) -> nn.Module:
        """The training (and evaluation) loss on ``(logits [B, K-1], labels [B])``: ``CORNLoss`` or ``CORALLoss``."""
        if self.hparams.head == "coral":
            return CORALLoss(self.num_classes, importance_weights=self.hparams.importance_weights)
        return CORNLoss(self.num_classes)

    def build_metrics(self, task: Literal["ordinal", "nominal"], prefix: str) -> MetricCollection:
        """The ordinal metrics plus ``mae_rank``, the MAE of the papers' prediction rule (:class:`RankMAE`)."""
        metrics = super().build_metrics(task, prefix)
        metrics.add_metrics({"mae_rank": RankMAE()})
        return metrics

    # ------------------------------------------------------------------ outputs
    def ordinal_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The head's ``[B, K-1]`` logits for images ``[B, 3, H, W]`` (what the loss takes)."""
        logits: torch.Tensor = self.head(self.backbone(x))
        if logits.dim() != 2 or logits.shape[1] != self.num_classes - 1:
            raise ValueError(
                f"{type(self).__name__}: the head must give [B, K-1] = [B, {self.num_classes - 1}] logits for "
                f"num_classes={self.num_classes}, got {tuple(logits.shape)}; check build_head"
            )
        return logits

    def exceedance(self, logits: torch.Tensor) -> torch.Tensor:
        """``P(y > k)`` ``[B, K-1]`` of the head's logits (float32, float64 for float64 logits), by ``head``'s rule."""
        z = upcast(logits)
        return coral_exceedance(z) if self.hparams.head == "coral" else corn_exceedance(z)

    @staticmethod
    def scores_from_exceedance(exceedance: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, K]``: ``log P(y = k)`` clamped at the dtype's smallest normal number (softmax = the distribution)."""
        with torch.autocast(device_type=exceedance.device.type, enabled=False):
            probs = class_probabilities_from_exceedance(upcast(exceedance))
            return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, num_classes]`` (log class probabilities, float32) for images ``[B, 3, H, W]``."""
        return self.scores_from_exceedance(self.exceedance(self.ordinal_logits(x)))

    # -------------------------------------------------------------------- steps
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        logits = self.ordinal_logits(x)
        loss: torch.Tensor = self.criterion(logits, y)  # float32 (float64 under 64-true); checks recorded on the device
        rank = rank_from_exceedance(self.exceedance(logits.detach()))
        self.log("train/loss", loss, prog_bar=True, batch_size=y.shape[0])
        self.log("train/mae_rank", (rank - y).abs().float().mean(), batch_size=y.shape[0])
        return loss

    def eval_outputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """``(the CORN/CORAL loss, log class probabilities [B, K], {'rank': the papers' prediction [B]})``."""
        logits = self.ordinal_logits(x)
        with DeferredChecks().active():  # a throwaway record: NaN outputs give NaN metrics, no per-batch host read
            loss: torch.Tensor = self.criterion(logits, y)
        exceedance = self.exceedance(logits)
        return loss, self.scores_from_exceedance(exceedance), {"rank": rank_from_exceedance(exceedance)}

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, torch.Tensor]:
        """``{'pred', 'expected', 'probs', 'rank', 'exceedance', 'target'}``.

        ``pred``: arg-max class; ``expected``: expected rank; ``probs``: ``P(y = k)`` ``[B, K]``;
        ``rank``: the papers' prediction (number of ``P(y > k) > 0.5``); ``exceedance``:
        ``P(y > k)`` ``[B, K-1]``; ``target``: the labels when the batch has them.
        """
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        exceedance = self.exceedance(self.ordinal_logits(x))
        probs = self.scores_from_exceedance(exceedance).softmax(dim=1)
        ranks = torch.arange(probs.shape[1], device=probs.device, dtype=probs.dtype)
        out = {
            "pred": probs.argmax(dim=1),
            "expected": probs @ ranks,
            "probs": probs,
            "rank": rank_from_exceedance(exceedance),
            "exceedance": exceedance,
        }
        if y is not None:
            out["target"] = y
        return out

    def tracked_metrics(self) -> dict[str, str]:
        """The classifier's tracked metrics plus ``val/mae_rank`` (its running best is logged and printed)."""
        return {**super().tracked_metrics(), "val/mae_rank": "min"}

    # ---------------------------------------------------------------- task and checkpoints
    def setup(self, stage: str) -> None:
        """Refuse nominal data (``task: auto`` with a nominal data module), then the classifier's setup."""
        if self.resolved_task() == "nominal":
            data = self.datamodule_info
            raise ValueError(_NOMINAL.format(what=f"{data.name if data is not None else 'the data module'}'s task is 'nominal'"))
        super().setup(stage)

    @staticmethod
    def _written_by_this_method(checkpoint: dict[str, Any]) -> bool:
        """Whether ``checkpoint`` was written by :class:`OrdinalRegressionModule` or a subclass of it."""
        record = checkpoint.get(MODULE_META_KEY) or {}
        lineage = list(record.get("lineage") or [])
        class_path = (checkpoint.get("hyper_parameters") or {}).get("_class_path")
        own = f"{OrdinalRegressionModule.__module__}.{OrdinalRegressionModule.__qualname__}"
        return own in lineage or class_path in (own, "cloc_lightning.methods.OrdinalRegressionModule")

    def _head_writer(self, path: str) -> str | None:
        """``None`` when ``path`` holds a head of this module's kind, else what wrote it (for messages; may be empty)."""
        checkpoint = read_checkpoint(path, mmap=True, what="init_from checkpoint", hint=INIT_FROM_HINT)
        hparams = checkpoint.get("hyper_parameters") or {}
        if self._written_by_this_method(checkpoint) and hparams.get("head") == self.hparams.head:
            return None
        return str((checkpoint.get(MODULE_META_KEY) or {}).get("class_path") or hparams.get("_class_path") or "")

    def init_from_report(self, path: str) -> dict[str, list[str]]:
        """:meth:`load_weights`'s report without loading (the head's keys are missing unless the file has this head)."""
        if self._head_writer(path) is None:
            return super().init_from_report(path)
        return match_weights(self, path, exclude=(*type(self).init_from_exclude, self.head_prefix), mmap=True)[1]

    def load_weights(self, path: str) -> dict[str, list[str]]:
        """``init_from``: the base's matching weights, the head's only from this module with the same ``head``.

        From a CE / CLOC / SimCLR / other checkpoint (or a plain ``state_dict``), the keys under
        :attr:`head_prefix` are skipped and the head keeps its initialisation (said on stdout).
        """
        writer = self._head_writer(path)
        if writer is None:
            return super().load_weights(path)
        # instance attribute over the class's init_from_exclude, for this one call
        self.__dict__["init_from_exclude"] = (*type(self).init_from_exclude, self.head_prefix)
        try:
            result = super().load_weights(path)
        finally:
            del self.__dict__["init_from_exclude"]
        source = f"a {writer.rsplit('.', 1)[-1]} checkpoint" if writer else "no checkpoint of this module"
        print_line(
            self._trainer,
            f"init_from {path}: {self.head_prefix}* not loaded ({source}, not a {self.hparams.head.upper()} head); "
            f"the {self.hparams.head.upper()} head starts from its initialisation",
        )
        return result


def _check_importance_weights(weights: Any, head: str, num_classes: Any) -> None:
    """One-line errors for CORAL's task weights: only with ``head: coral``, ``K - 1`` finite numbers ``>= 0``."""
    if head != "coral":
        raise ValueError(f"importance_weights are CORAL's task weights, but head is {head!r}; set head: coral or remove importance_weights")
    k = num_classes if isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2 else None
    ok = isinstance(weights, (list, tuple)) and all(
        isinstance(w, (int, float)) and not isinstance(w, bool) and w == w and abs(w) != float("inf") and w >= 0 for w in weights
    )
    if not ok or (k is not None and len(weights) != k - 1):
        need = f"{k - 1} " if k is not None else "K - 1 "
        raise ValueError(
            f"importance_weights must be {need}finite numbers >= 0, one per threshold 'y > k' of num_classes={num_classes} "
            f"(K - 1 for K classes), got {weights!r}"
        )
