"""CLOC: cross-entropy + ordinal contrastive multi-margin N-pair loss, trained in two phases.

Pitawela, Carneiro, Chen. *CLOC: Contrastive Learning for Ordinal Classification
with Multi-Margin N-pair Loss*, CVPR 2025 (arXiv 2504.17813).

The CLOC README's training loop::

    output = model(imgs)
    loss = cls_criterion(output, labels) + margin_criterion(output, labels, global_step)

is :meth:`CLOCModule.training_step` with ``cloc_on='logits'`` and ``loss_weight=1``.
Phase one optimises model and margins together; phase two keeps the learned
margins fixed.  Both phases can run in one fit (the :class:`CLOCMarginFreeze`
callback freezes at an epoch) or as two runs (``learnable_map`` from the YAML the
callback writes, weights from ``init_from``).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
import torch.nn.functional as F
from lightning.pytorch.loggers import TensorBoardLogger
from torch import nn

from cloc_lightning import distributed as dist_utils
from cloc_lightning._logging import print_line
from cloc_lightning.checkpoints import CheckpointMismatchError
from cloc_lightning.losses.base import upcast
from cloc_lightning.losses.cloc import OrdinalContrastiveLoss_mm, OrdinalContrastiveLoss_sm
from cloc_lightning.losses.cloc_margins import LearnableMap, load_learnable_map
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.validation import check_int

__all__ = ["CLOCModule"]


class CLOCModule(ClassifierModule):
    """Backbone + classifier trained with ``CE(logits) + loss_weight * CLOC(output)``.

    Args:
        num_classes: number of ordinal classes ``C``.
        margin_mode: ``mm`` (a margin per adjacent class pair,
            :class:`~cloc_lightning.losses.OrdinalContrastiveLoss_mm`) or ``sm``
            (one shared margin, :class:`~cloc_lightning.losses.OrdinalContrastiveLoss_sm`).
        learnable_map: ``None`` (all margins learnable, U(0.5, 1.0)), a list of
            ``[kind, value]`` pairs (``C - 1`` for mm, 1 for sm; kinds ``learnable`` /
            ``fixed``; value = the margin) or the path of a margins YAML file.
        loss_weight: ``lambda`` of the CLOC term.
        cloc_on: ``logits`` (as the CLOC README loop: the loss sees the classifier
            output) or ``features`` (backbone features, or their projection).
        projector_dim: with ``cloc_on='features'``, an MLP projector
            ``feature_dim -> feature_dim -> projector_dim`` feeds the loss (``None``: raw features).
        reduction: ``official`` (per-anchor sum / (|P|·|N|²), as the official code) or
            ``mean`` (/ (|P|·|N|)); see :mod:`cloc_lightning.losses.cloc`.
        margin_lr: learning rate of the margins (default: the base ``lr``).
        margin_weight_decay: weight decay of the margins (default 0).
        gather_distributed: under DDP, contrast each rank's anchors with the global
            batch (features with gradients, labels gathered); a no-op on one process.
        log_margins_every_n_steps: how often the margins are logged (``margins/C{i}-C{i+1}``, the
            values before that step's update); the one cadence of the margin history:
            :class:`~cloc_lightning.callbacks.CLOCMarginPlot` records at the same steps unless
            given its own ``every_n_steps``.  ``0`` logs no margins.
        **kwargs: :class:`~cloc_lightning.methods.classifier.ClassifierModule` and
            :class:`~cloc_lightning.methods.base.BaseModule` arguments (``backbone``,
            ``init_from``, ``optimizer`` (Adam by default, as the CLOC README), ``lr``, ...).
    """

    #: weights of the CLOC criterion never come from ``init_from`` (phase two sets its own margins)
    init_from_exclude = ("cloc_loss.",)
    #: the margins and the projector of ``cloc_on: features`` serve the CLOC loss only (evaluation reads backbone + head)
    training_only_prefixes = ("cloc_loss.", "projector.")

    def __init__(
        self,
        num_classes: int,
        margin_mode: Literal["mm", "sm"] = "mm",
        learnable_map: LearnableMap | str | None = None,
        loss_weight: float = 1.0,
        cloc_on: Literal["logits", "features"] = "logits",
        projector_dim: int | None = None,
        reduction: Literal["official", "mean"] = "official",
        margin_lr: float | None = None,
        margin_weight_decay: float = 0.0,
        gather_distributed: bool = True,
        log_margins_every_n_steps: int = 10,
        **kwargs: Any,
    ) -> None:
        if margin_mode not in ("mm", "sm"):
            raise ValueError(f"margin_mode must be 'mm' or 'sm', got {margin_mode!r}")
        if cloc_on not in ("logits", "features"):
            raise ValueError(f"cloc_on must be 'logits' or 'features', got {cloc_on!r}")
        if loss_weight < 0:
            raise ValueError(f"loss_weight must be >= 0, got {loss_weight}")
        if projector_dim is not None and cloc_on != "features":
            raise ValueError("projector_dim only applies with cloc_on: features")
        check_int("log_margins_every_n_steps", log_margins_every_n_steps, 0, hint="0 logs no margins")
        resolved_map = load_learnable_map(learnable_map)  # validated by the criterion (the margins' owner)
        super().__init__(num_classes=num_classes, **kwargs)
        # store the resolved map, so a checkpoint does not depend on the YAML file
        self.hparams["learnable_map"] = resolved_map
        self.projector = self.build_projector()
        self.cloc_loss = self.build_loss()
        # The margins stay out of DDP's reducer: freezing them mid-fit (phase two) would otherwise
        # leave parameters the reducer waits for ("parameters that were not used in producing the
        # loss") under plain ``strategy: ddp``.  Their gradients are averaged over ranks in
        # :meth:`on_after_backward` and their values broadcast from rank 0 in :meth:`on_fit_start`.
        self._ddp_params_and_buffers_to_ignore = self._margin_state_names()
        # False only after loading a checkpoint whose optimiser dropped the frozen margins (an earlier build)
        self._margins_in_optimizer = True
        # parameters per optimiser of a checkpoint resumed after the freeze (checked in on_fit_start)
        self._stored_optimizer_sizes: list[int] | None = None

    # ------------------------------------------------------------------ hooks
    def build_projector(self) -> nn.Module:
        """What maps backbone features to the CLOC embedding when ``cloc_on='features'``."""
        dim = self.hparams.projector_dim
        if self.hparams.cloc_on != "features" or dim is None:
            return nn.Identity()
        return MLPHead(self.feature_dim, self.feature_dim, dim)

    def build_loss(self) -> OrdinalContrastiveLoss_mm | OrdinalContrastiveLoss_sm:
        """The CLOC criterion; it owns the margins (:class:`~cloc_lightning.losses.cloc_margins.CLOCMargins`:
        parse, validate, freeze, log, YAML), which are parameters/buffers of this module."""
        h = self.hparams
        cls = OrdinalContrastiveLoss_mm if h.margin_mode == "mm" else OrdinalContrastiveLoss_sm
        return cls(
            self.num_classes,
            learnable_map=h.learnable_map,
            reduction=h.reduction,
            gather_distributed=h.gather_distributed,
        )

    def _margin_state_names(self) -> list[str]:
        """Fully qualified names of the CLOC criterion's parameters and buffers (kept out of DDP)."""
        prefix = "cloc_loss."
        named = list(self.cloc_loss.named_parameters()) + list(self.cloc_loss.named_buffers())
        return [prefix + name for name, _ in named]

    def margin_parameters(self) -> list[nn.Parameter]:
        """The trainable raw margins (empty when all are fixed or frozen)."""
        return self.cloc_loss.margin_parameters()

    def param_groups(self) -> list[dict[str, Any]]:
        """Model parameters with the base settings; margins in their own group (``margin_lr``/``margin_weight_decay``).

        The margins built learnable are in it, frozen or not: after the freeze their ``grad`` stays
        ``None`` and the optimiser skips them, so the optimiser is built alike before and after the
        freeze (a resumed fit loads its state as written).
        """
        margin_ids = {id(p) for p in self.cloc_loss.parameters()}
        model = [p for p in self.parameters() if p.requires_grad and id(p) not in margin_ids]
        groups: list[dict[str, Any]] = [{"name": "model", "params": model}]
        margins = self.cloc_loss.optimised_parameters() if self._margins_in_optimizer else self.margin_parameters()
        if margins:
            h = self.hparams
            groups.append({"name": "margins", "params": margins, "lr": h.margin_lr or h.lr, "weight_decay": h.margin_weight_decay})
        return groups

    # ---------------------------------------------------------------- margins
    @property
    def margins_frozen(self) -> bool:
        """Whether phase one ended (read from the margins' owner, ``cloc_loss.frozen``)."""
        return self.cloc_loss.frozen

    def freeze_margins(self) -> list[list[Any]]:
        """Stop the margins from learning (phase two): their owner freezes them.

        Records the trainer's epoch and step with the freeze (``cloc_loss.frozen_at``) and returns
        the all-``fixed`` ``learnable_map`` of the current margins.  Safe to call again; called by
        :class:`~cloc_lightning.callbacks.CLOCMarginFreeze`.  The margins stay in their optimiser
        group with the state phase one left; with no gradient from now on, the optimiser skips
        them (the same holds for a freeze through the owner itself, ``cloc_loss.freeze()``).
        """
        if self._trainer is None:
            return self.cloc_loss.freeze()
        return self.cloc_loss.freeze(epoch=self.trainer.current_epoch, step=self.trainer.global_step)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        # the margins' record, and whether the optimiser holds the margins built learnable (frozen or not)
        checkpoint["cloc"] = {**self.cloc_loss.checkpoint_record(), "margins_in_optimizer": self._margins_in_optimizer}

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        record = checkpoint.get("cloc", {})
        self.cloc_loss.load_checkpoint_record(record)
        # Without ``margins_in_optimizer`` (an earlier build), the optimiser held the margins until the freeze and
        # dropped them at it: a fit resumed after the freeze builds its optimiser without them, as stored.
        self._margins_in_optimizer = bool(record.get("margins_in_optimizer", not self.margins_frozen))
        self._stored_optimizer_sizes = (
            [sum(len(g["params"]) for g in state.get("param_groups", [])) for state in checkpoint.get("optimizer_states") or []]
            if self.margins_frozen and self._margins_in_optimizer
            else None
        )

    def _check_resumed_optimizers(self) -> None:
        """One line naming the fix when a resumed fit's optimiser leaves out the frozen margins its checkpoint holds.

        The margins stay in their optimiser group after the freeze; an own ``param_groups`` or
        ``configure_optimizers`` that keeps only parameters with ``requires_grad`` leaves them out on
        resume, and torch would refuse the stored state with a message naming neither.
        """
        stored, self._stored_optimizer_sizes = self._stored_optimizer_sizes, None
        margins = {id(p) for p in self.cloc_loss.optimised_parameters()}
        optimizers = self.trainer.optimizers
        if not stored or not margins or self.trainer.ckpt_path is None or len(stored) != len(optimizers):
            return
        built = [[p for g in opt.param_groups for p in g["params"]] for opt in optimizers]
        if any(id(p) in margins for params in built for p in params):
            return
        if sum(stored) == sum(len(params) for params in built) + len(margins):
            raise CheckpointMismatchError(
                f"{type(self).__name__}: cannot resume {self.trainer.ckpt_path}: its optimiser holds the frozen CLOC "
                "margins, but the optimiser built for resuming leaves them out (its param_groups or configure_optimizers "
                "keeps only parameters with requires_grad); keep self.cloc_loss.optimised_parameters() in the optimiser: "
                "frozen margins get no gradient, so the optimiser skips them"
            )

    def configure_callbacks(self) -> list[Any]:
        """The base callbacks plus a :class:`~cloc_lightning.callbacks.CLOCMarginPlot` unless one is configured."""
        from cloc_lightning.callbacks.cloc import CLOCMarginPlot

        callbacks = super().configure_callbacks()
        if self._trainer is None:
            return callbacks
        configured: list[Any] = self.trainer.callbacks  # type: ignore[attr-defined]  # set by Lightning at runtime, not declared on Trainer
        if not any(isinstance(cb, CLOCMarginPlot) for cb in configured):
            callbacks.append(CLOCMarginPlot())
        return callbacks

    # ------------------------------------------------------------------- steps
    def setup(self, stage: str) -> None:
        super().setup(stage)
        if self.resolved_task() == "nominal" and self._trainer is not None:
            print_line(
                self._trainer,
                f"{type(self).__name__}: the data module's classes are nominal (task: nominal); CLOC's margins assume "
                "ordered classes (class i next to i+1). Metrics and checkpoints follow the nominal task (val/acc).",
            )

    def on_fit_start(self) -> None:
        # after configure_optimizers, before a resumed fit loads the optimiser state
        self._check_resumed_optimizers()
        # every rank starts from rank 0's margins (DDP does not broadcast what it ignores)
        dist_utils.broadcast_([*self.cloc_loss.parameters(), *self.cloc_loss.buffers()])
        logger = self.logger
        if isinstance(logger, TensorBoardLogger) and self.trainer.is_global_zero:
            logger.experiment.add_custom_scalars(self.cloc_loss.tensorboard_layout("margins/"))

    def on_after_backward(self) -> None:
        """Average the learnable margins' gradients over ranks (what DDP does for the other parameters).

        Runs after every backward pass (also with gradient accumulation: the mean is linear).
        A rank whose loss did not touch a margin contributes a zero gradient, so every rank
        joins the same collectives.
        """
        if not dist_utils.is_distributed():
            return
        # the trainable margins only: a frozen one keeps ``grad is None`` (a zero gradient would move it
        # through Adam's momentum or AdamW's decay, as it is still in its optimiser group)
        params = self.cloc_loss.margin_parameters()
        grads = []
        for p in params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        dist_utils.all_reduce_mean_(grads)

    def cloc_embedding(self, features: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """What the CLOC loss sees: the logits, or the (projected) features."""
        if self.hparams.cloc_on == "logits":
            return logits
        projected: torch.Tensor = self.projector(features)
        return projected

    def embed(self, x: torch.Tensor) -> torch.Tensor:
        """What the CLOC loss sees for images ``x`` (logits or projected features)."""
        features = self.backbone(x)
        return self.cloc_embedding(features, self.head(features))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        features = self.backbone(x)
        logits = self.head(features)
        ce = F.cross_entropy(upcast(logits), y)  # float32 (float64 under 64-true)
        with self.training_gathers():  # full batches on every process: the gathers read no sizes
            cloc = self.cloc_loss(self.cloc_embedding(features, logits), y)
        loss: torch.Tensor = ce + self.hparams.loss_weight * cloc
        n = y.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/ce", ce, batch_size=n)
        self.log("train/cloc", cloc, batch_size=n)
        # how much of the objective the CLOC term is (0 = switched off in effect, 0.5 = as large as CE)
        weighted = self.hparams.loss_weight * cloc.detach()
        self.log("train/cloc_share", weighted / (ce.detach() + weighted).clamp_min(1e-12), batch_size=n)
        self.log("train/acc", (logits.argmax(1) == y).float().mean(), batch_size=n)
        every = self.hparams.log_margins_every_n_steps
        if every and self.global_step % every == 0:  # device tensors: read only when the logger writes
            self.log_dict({f"margins/{k}": v for k, v in self.cloc_loss.margin_values().items()}, batch_size=n)
        return loss
