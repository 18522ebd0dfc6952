"""SupCon and SimCLR pre-training: backbone + normalised MLP projector + SupConLoss on multi-view batches.

P. Khosla et al., *Supervised Contrastive Learning*, NeurIPS 2020 (arXiv:2004.11362);
T. Chen et al., *A Simple Framework for Contrastive Learning of Visual
Representations* (SimCLR), ICML 2020 (arXiv:2002.05709).  Reference code:
https://github.com/HobbitLong/SupContrast (``main_supcon.py``, ``networks/resnet_big.py``).

Stage one of the two-stage protocol; stage two (a linear classifier on the frozen
encoder) is :class:`~cloc_lightning.methods.linear_probe.LinearProbeModule` or the
offline scikit-learn probe :func:`~cloc_lightning.probe.probe_checkpoint`.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from cloc_lightning.losses.supcon import DEFAULT_BASE_TEMPERATURE, SupConLoss
from cloc_lightning.methods.base import BaseModule, OnlineProbeEvalMixin, OptimizerName, SchedulerName
from cloc_lightning.nn.heads import MLPHead
from cloc_lightning.nn.online_probe import OnlineLinearProbe
from cloc_lightning.checkpoints import ENCODER_META_KEY, encoder_metadata

__all__ = ["SupConModule"]

#: temperatures of the SupContrast README's CIFAR commands (``--temp 0.1`` / ``--temp 0.5``)
DEFAULT_TEMPERATURE = {"supcon": 0.1, "simclr": 0.5}


class SupConModule(OnlineProbeEvalMixin, BaseModule):
    """Contrastive pre-training with :class:`~cloc_lightning.losses.SupConLoss` (SupCon, or SimCLR without labels).

    Each training batch holds ``n_views`` augmented views of every image (set
    ``data.train_views``, e.g. :class:`~cloc_lightning.data.SupConViews`); the views go
    through the backbone together (one forward, BatchNorm over all views, as the
    reference), then the projector ``MLPHead(d, d, 128, normalize=True)``, and the
    loss sees ``[bsz, n_views, projector_dim]``.  ``method='supcon'`` passes the labels
    (positives = same class), ``'simclr'`` does not (positives = the other views).

    Labels ``< 0`` (unlabelled images, e.g. STL-10's unlabeled split) are allowed in
    ``supcon`` mode: each such image gets a class of its own, so its positives are
    only its other views (SimCLR for those anchors, SupCon for the rest).

    An :class:`~cloc_lightning.nn.online_probe.OnlineLinearProbe` (``online_probe``) is
    trained alongside on detached backbone features with its own cross-entropy and
    optimiser group (``online_probe_lr``, no weight decay); it is what validation and
    test report: ``val/online_probe/acc`` (+ ``acc_top5`` for nominal data; MAE, QWK,
    ±1 accuracy for ordinal data) and what the best checkpoint monitors.  If the
    validation batches are multi-view (a custom data module), the contrastive loss on
    them is logged as ``val/loss`` too.

    Args:
        method: ``supcon`` (labels) or ``simclr`` (no labels).
        temperature: loss temperature; ``None`` = 0.1 for supcon, 0.5 for simclr
            (the SupContrast README's CIFAR commands).
        base_temperature: 0.07 (default, SupContrast's ``losses.py``): the loss is
            scaled by ``temperature / 0.07`` (1.43x at 0.1, 7.1x at SimCLR's 0.5);
            ``None`` ties it to ``temperature`` (the plain, unscaled loss).
        contrast_mode: ``all`` (every view is an anchor) or ``one`` (view 0 only).
        n_views: views per image the data module must deliver (checked every batch).
        projector_hidden_dim: hidden width of the projector (``None`` = feature dim).
        projector_dim: output dimension of the projector (128 in the paper).
        num_classes: classes of the online probe; ``None`` = the data module's.
        task: metrics of the probe: ``nominal``, ``ordinal`` or ``auto`` (the data
            module's ``task``).
        online_probe: train and report the online linear probe.
        online_probe_lr: the probe's learning rate (``None`` = ``lr``).
        gather_distributed: under DDP, contrast against the global batch (features
            all-gathered with gradients); a no-op on one process.
        backbone, cifar_stem, optimizer, lr, weight_decay, momentum, scheduler,
            warmup_epochs, min_lr_ratio: as :class:`~cloc_lightning.methods.base.BaseModule`,
            with SupContrast's defaults: SGD (momentum 0.9, weight decay 1e-4), lr 0.05
            (its default for batch 256; the README's batch 1024 uses 0.5), cosine to
            ``lr * 1e-3`` after a linear warm-up.  The defaults run that cosine per step
            after a warm-up from ~0 on timm's initialisation; SupContrast's exact
            schedule (per epoch, warm-up from 0.01 with ``--warm``) and ResNet
            initialisation are ``lr_interval: epoch``, ``warmup_from: 0.01`` and
            ``backbone_init: kaiming`` (as in ``configs/supcon/cifar10.yaml``).
        **kwargs: other :class:`~cloc_lightning.methods.base.BaseModule` arguments
            (``pretrained``, ``backbone_kwargs``, ``nesterov``, ``lr_milestones``, ``lr_interval``,
            ``warmup_from``, ``backbone_init``, ``init_from``, ...).

    Example::

        from cloc_lightning.data import ImageFolderDataModule, SupConViews

        dm = ImageFolderDataModule("../shared/data/cifar10", batch_size=256, train_views=SupConViews(n_views=2))
        model = SupConModule(method="supcon", backbone="resnet18", cifar_stem=True, lr=0.05)
        L.Trainer(max_epochs=100).fit(model, datamodule=dm)
        model(images)["features"]          # [B, 512] encoder features for a linear probe
    """

    #: state_dict prefix of the encoder that linear probes evaluate (see :mod:`cloc_lightning.probe`)
    encoder_prefix: str = "backbone."

    def __init__(
        self,
        method: Literal["supcon", "simclr"] = "supcon",
        temperature: float | None = None,
        base_temperature: float | None = DEFAULT_BASE_TEMPERATURE,
        contrast_mode: Literal["all", "one"] = "all",
        n_views: int = 2,
        projector_hidden_dim: int | None = None,
        projector_dim: int = 128,
        num_classes: int | None = None,
        task: Literal["auto", "ordinal", "nominal"] = "auto",
        online_probe: bool = True,
        online_probe_lr: float | None = None,
        gather_distributed: bool = True,
        backbone: str = "resnet18",
        cifar_stem: bool = False,
        optimizer: OptimizerName = "sgd",
        lr: float = 0.05,
        weight_decay: float = 1e-4,
        momentum: float = 0.9,
        scheduler: SchedulerName = "cosine",
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        if method not in ("supcon", "simclr"):
            raise ValueError(f"method must be 'supcon' or 'simclr', got {method!r}")
        if not isinstance(n_views, int) or n_views < 1:
            raise ValueError(f"n_views must be an integer >= 1, got {n_views!r}")
        if method == "simclr" and n_views < 2:
            raise ValueError("simclr needs n_views >= 2 (the positives are the other views of the same image)")
        if projector_dim < 1 or (projector_hidden_dim is not None and projector_hidden_dim < 1):
            raise ValueError(f"projector dimensions must be >= 1, got {projector_hidden_dim} and {projector_dim}")
        if num_classes is not None and (not isinstance(num_classes, int) or num_classes < 2):
            raise ValueError(f"num_classes must be an integer >= 2 or null (= the data module's), got {num_classes!r}")
        if task not in ("auto", "ordinal", "nominal"):
            raise ValueError(f"task must be auto|ordinal|nominal, got {task!r}")
        if online_probe_lr is not None and online_probe_lr <= 0:
            raise ValueError(f"online_probe_lr must be > 0 (or null = lr), got {online_probe_lr}")
        super().__init__(
            backbone=backbone,
            cifar_stem=cifar_stem,
            optimizer=optimizer,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            scheduler=scheduler,
            warmup_epochs=warmup_epochs,
            min_lr_ratio=min_lr_ratio,
            **kwargs,
        )
        self.method = method
        self.n_views = n_views
        self.temperature = float(temperature) if temperature is not None else DEFAULT_TEMPERATURE[method]
        self.projector = self.build_projector()
        self.criterion = self.build_loss()
        self.probe: OnlineLinearProbe | None = None
        if online_probe and num_classes is not None and task != "auto":
            self.probe = self.build_online_probe(num_classes, task)

    # ------------------------------------------------------------------ hooks
    def build_projector(self) -> nn.Module:
        """The projection head: ``[B, feature_dim] -> [B, projector_dim]``, L2-normalised."""
        h = self.hparams
        hidden = h.get("projector_hidden_dim") or self.feature_dim
        return MLPHead(self.feature_dim, hidden, h.get("projector_dim", 128), normalize=True)

    def build_loss(self) -> nn.Module:
        """The contrastive criterion on ``([bsz, n_views, dim], labels or None)``."""
        h = self.hparams
        return SupConLoss(
            temperature=self.temperature,
            contrast_mode=h.get("contrast_mode", "all"),
            # checkpoints of older versions stored ``None`` (then the default: tied) and keep that meaning
            base_temperature=h.get("base_temperature", DEFAULT_BASE_TEMPERATURE),
            gather_distributed=bool(h.get("gather_distributed", True)),
        )

    def build_online_probe(self, num_classes: int, task: Literal["nominal", "ordinal"]) -> OnlineLinearProbe:
        """The online linear probe on backbone features."""
        return OnlineLinearProbe(self.feature_dim, num_classes, task)

    def param_groups(self) -> list[dict[str, Any]]:
        """Backbone + projector with the base settings; the online probe in its own group (no weight decay)."""
        probe_ids = {id(p) for p in self.probe.parameters()} if self.probe is not None else set()
        model = [p for p in self.parameters() if p.requires_grad and id(p) not in probe_ids]
        groups: list[dict[str, Any]] = [{"name": "model", "params": model}]
        if self.probe is not None:
            h = self.hparams
            groups.append(self.probe.param_group(lr=h.get("online_probe_lr") or h.lr))
        return groups

    # ---------------------------------------------------------------- lifecycle
    def setup(self, stage: str) -> None:
        """``init_from``; check the data module's views; build the probe from its classes/task if needed."""
        super().setup(stage)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if stage == "fit" and dm is not None and hasattr(dm, "n_views"):
            if getattr(dm, "train_views", None) is None:
                raise ValueError(
                    f"{type(self).__name__} needs multi-view batches; set data.train_views, e.g. "
                    f"{{class_path: cloc_lightning.data.SupConViews, init_args: {{n_views: {self.n_views}}}}}"
                )
            if dm.n_views != self.n_views:
                raise ValueError(self._views_message(dm.n_views))
        if not self._probe_wanted():
            return
        n = self.hparams.get("num_classes")
        dm_classes = getattr(dm, "num_classes", None) if dm is not None else None
        if n is not None and dm_classes is not None and dm_classes != n:
            raise ValueError(
                f"model.num_classes={n} but {type(dm).__name__} has {dm_classes} classes; "
                f"set --model.init_args.num_classes {dm_classes} (or null to take the data module's)"
            )
        if self.probe is None:
            if n is None:
                if dm_classes is None:
                    raise ValueError(
                        f"{type(self).__name__} cannot size its online probe: set model.num_classes, "
                        "or online_probe: false"
                    )
                n = int(dm_classes)
            task = self.hparams.get("task", "auto")
            if task == "auto":
                task = getattr(dm, "task", "nominal") if dm is not None else "nominal"
            self.probe = self.build_online_probe(n, task)
            self.probe.to(self.device)
            # stored so that checkpoints rebuild the probe in __init__ (load_from_checkpoint)
            self.hparams["num_classes"] = n
            self.hparams["task"] = task

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint[ENCODER_META_KEY] = encoder_metadata(self)

    # ------------------------------------------------------------------ views
    def _views_message(self, got: int) -> str:
        return (
            f"{type(self).__name__}(n_views={self.n_views}) got {got} view(s) per image from the data module; "
            f"set data.train_views.init_args.n_views: {self.n_views} (or model.n_views: {got})"
        )

    def encode_views(self, views: list[torch.Tensor] | tuple[torch.Tensor, ...]) -> torch.Tensor:
        """Backbone features of all views, view-major: ``[n_views * B, feature_dim]``.

        Views of equal size go through the backbone in one batch (BatchNorm sees all
        of them, as the reference); views of other sizes (multi-crop) separately.
        """
        if len({tuple(v.shape) for v in views}) == 1:
            return self.backbone(torch.cat(list(views)))
        return torch.cat([self.backbone(v) for v in views])

    def contrastive_labels(self, y: torch.Tensor) -> torch.Tensor | None:
        """Labels passed to the loss: ``None`` for SimCLR; unlabelled (``< 0``) rows get unique ids.

        The ids are unique across DDP ranks (offset by the rank), since labels are
        gathered with the features.
        """
        if self.method == "simclr":
            return None
        unlabelled = y < 0
        if not bool(unlabelled.any()):
            return y
        y = y.clone()
        offset = (self.global_rank + 1) * (1 << 40)
        y[unlabelled] = offset + torch.arange(int(unlabelled.sum()), device=y.device)
        return y

    def contrastive_loss(self, views: list[torch.Tensor], y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``(loss, features [n_views * B, D])`` of a multi-view batch."""
        if len(views) != self.n_views:
            raise ValueError(self._views_message(len(views)))
        bsz = y.shape[0]
        feats = self.encode_views(views)
        z = self.projector(feats).view(self.n_views, bsz, -1).transpose(0, 1)  # [B, V, dim]
        return self.criterion(z, self.contrastive_labels(y)), feats

    # -------------------------------------------------------------------- steps
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'features': [B, feature_dim], 'projection': [B, projector_dim] (L2-normalised)}``."""
        features = self.backbone(x)
        return {"features": features, "projection": self.projector(features)}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views, y = self.split_batch(batch, expect_views=True, owner=type(self).__name__)
        loss, feats = self.contrastive_loss(list(views), y)
        bsz = y.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        if self.probe is None:
            return loss
        probe_loss, logs = self.probe.training_step(feats, y.repeat(self.n_views))
        self.log_dict(logs, batch_size=bsz)
        return loss + probe_loss

    def _eval_step(self, batch: Any, stage: Literal["val", "test"]) -> None:
        x, y = self.split_batch(batch, owner=type(self).__name__)
        bsz = y.shape[0]
        if isinstance(x, (list, tuple)):  # multi-view evaluation data: also the contrastive loss
            loss, feats = self.contrastive_loss(list(x), y)
            self.log(f"{stage}/loss", loss, on_epoch=True, sync_dist=True, batch_size=bsz)
            feats = feats[:bsz]
        else:
            feats = self.backbone(x)
        if self.probe is not None:
            self.log_dict(self.probe.eval_step(feats, y, stage), on_step=False, on_epoch=True, sync_dist=True, batch_size=bsz)
