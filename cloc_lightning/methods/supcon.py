"""SupCon and SimCLR pre-training: backbone + normalised MLP projector + SupConLoss on multi-view batches.

P. Khosla et al., *Supervised Contrastive Learning*, NeurIPS 2020 (arXiv:2004.11362);
T. Chen et al., *A Simple Framework for Contrastive Learning of Visual
Representations* (SimCLR), ICML 2020 (arXiv:2002.05709).  Reference code:
https://github.com/HobbitLong/SupContrast (``main_supcon.py``, ``networks/resnet_big.py``).

Stage one of the two-stage protocol; stage two (a linear classifier on the frozen
encoder) is :class:`~cloc_lightning.methods.linear_probe.LinearProbeModule` or the
offline scikit-learn probe :func:`~cloc_lightning.probe.probe_checkpoint`.  How to run
both stages, and the settings that reproduce SupContrast: ``docs/methods/supcon.md``.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from torch import nn

from cloc_lightning.losses.supcon import DEFAULT_BASE_TEMPERATURE, SupConLoss
from cloc_lightning.methods.optim import OptimizerName
from cloc_lightning.methods.pretrain import MultiViewModule
from cloc_lightning.validation import check_int, choices

__all__ = ["SupConModule"]

Method = Literal["supcon", "simclr"]

#: temperatures of the SupContrast README's CIFAR commands (``--temp 0.1`` / ``--temp 0.5``)
DEFAULT_TEMPERATURE = {"supcon": 0.1, "simclr": 0.5}


class SupConModule(MultiViewModule):
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

    The online probe (:class:`~cloc_lightning.methods.pretrain.PretrainModule`) trains on
    the detached backbone features of every view.  If the validation batches are
    multi-view (a custom data module), the contrastive loss on them is logged as
    ``val/loss`` too.

    **Defaults** (SupContrast's): SGD (momentum 0.9, weight decay 1e-4), lr 0.05 (its default
    for batch 256), cosine to ``lr * 1e-3`` after a one-epoch linear warm-up; SupContrast's
    exact schedule and initialisation: ``docs/methods/supcon.md``.

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
        gather_distributed: under DDP, contrast against the global batch (features
            all-gathered with gradients); a no-op on one process.
        optimizer: ``sgd`` (SupContrast's; momentum 0.9) | ``adam`` | ``adamw`` | ``radam``.
        lr: base learning rate (SupContrast's 0.05 for batch 256).
        weight_decay: weight decay of the default group (SupContrast's 1e-4).
        warmup_epochs: linear warm-up length (fractions allowed; one epoch here).
        min_lr_ratio: final cosine learning rate as a fraction of the base rate (1e-3 here).
        **kwargs: the :class:`~cloc_lightning.methods.pretrain.PretrainModule` arguments (the
            online probe: ``num_classes``, ``task``, ``online_probe``, ``knn_k``, ...) and the
            :class:`~cloc_lightning.methods.base.BaseModule` ones (backbone, optimiser, schedule).
    """

    def __init__(
        self,
        method: Method = "supcon",
        temperature: float | None = None,
        base_temperature: float | None = DEFAULT_BASE_TEMPERATURE,
        contrast_mode: Literal["all", "one"] = "all",
        n_views: int = 2,
        projector_hidden_dim: int | None = None,
        projector_dim: int = 128,
        gather_distributed: bool = True,
        *,
        optimizer: OptimizerName = "sgd",
        lr: float = 0.05,
        weight_decay: float = 1e-4,
        warmup_epochs: float = 1.0,
        min_lr_ratio: float = 1e-3,
        **kwargs: Any,
    ) -> None:
        if method not in choices(Method):
            raise ValueError(f"method must be {' or '.join(map(repr, choices(Method)))}, got {method!r}")
        check_int("n_views", n_views, 1)
        if method == "simclr" and n_views < 2:
            raise ValueError("simclr needs n_views >= 2 (the positives are the other views of the same image)")
        self.check_projector_dims(projector_dim, projector_hidden_dim)
        super().__init__(
            optimizer=optimizer,
            lr=lr,
            weight_decay=weight_decay,
            warmup_epochs=warmup_epochs,
            min_lr_ratio=min_lr_ratio,
            **kwargs,
        )
        self.method = method
        self.n_views = n_views
        self.temperature = float(temperature) if temperature is not None else DEFAULT_TEMPERATURE[method]
        self.projector = self.build_projector()
        self.criterion = self.build_loss()

    # ------------------------------------------------------------------ hooks
    def build_projector(self) -> nn.Module:
        """The projection head: ``[B, feature_dim] -> [B, projector_dim]``, L2-normalised."""
        return self.mlp_projector(normalize=True)

    def build_loss(self) -> nn.Module:
        """The contrastive criterion on ``([bsz, n_views, dim], labels or None)``."""
        h = self.hparams
        return SupConLoss(
            temperature=self.temperature,
            contrast_mode=h.contrast_mode,
            base_temperature=h.base_temperature,  # None (tied to temperature) stays None, as in older checkpoints
            gather_distributed=bool(h.gather_distributed),
        )

    def contrastive_labels(self, y: torch.Tensor) -> torch.Tensor | None:
        """Labels passed to the loss: ``None`` for SimCLR; unlabelled (``< 0``) rows get unique ids.

        The ids are unique across DDP ranks (offset by the rank), since labels are
        gathered with the features.
        """
        if self.method == "simclr":
            return None
        unlabelled = y < 0
        # the k-th unlabelled row (0-based) gets offset + k, computed on the device (no host sync)
        offset = (self.global_rank + 1) * (1 << 40)
        fresh = offset + torch.cumsum(unlabelled.to(torch.int64), 0) - 1
        return torch.where(unlabelled, fresh, y)

    def view_targets(self, y: torch.Tensor) -> torch.Tensor | None:
        """The loss's labels: :meth:`contrastive_labels`."""
        return self.contrastive_labels(y)

    # -------------------------------------------------------------------- steps
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{'features': [B, feature_dim], 'projection': [B, projector_dim] (L2-normalised)}``."""
        features = self.backbone(x)
        return {"features": features, "projection": self.projector(features)}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        views, y = self.split_batch(batch, expect_views=True, owner=type(self).__name__)
        with self.training_gathers():  # full batches on every process: the gathers read no sizes
            loss, feats = self.views_loss(list(views), y)
        bsz = int(y.shape[0])
        self.log("train/loss", loss, prog_bar=True, batch_size=bsz)
        return self.add_online_eval_loss(loss, feats, y.repeat(self.n_views), batch_size=bsz)
