"""Cross-entropy baseline: backbone + linear head trained end to end."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from cloc_lightning.losses.base import upcast
from cloc_lightning.methods.classifier import ClassifierModule

__all__ = ["CEModule"]


class CEModule(ClassifierModule):
    """Backbone + linear classifier trained with cross-entropy (the baseline of every table).

    Also the SupCE baseline of Khosla et al. (2020) when trained with SGD on
    CIFAR (``configs/ce/cifar10.yaml``).

    Args:
        num_classes: number of classes.
        label_smoothing: cross-entropy label smoothing.
        **kwargs: :class:`~cloc_lightning.methods.classifier.ClassifierModule` /
            :class:`~cloc_lightning.methods.base.BaseModule` arguments
            (``task``, ``backbone``, ``pretrained``, ``cifar_stem``, ``optimizer``, ``lr``, ...).

    Example::

        model = CEModule(num_classes=8, backbone="resnet18", lr=1e-3)
        trainer = L.Trainer(max_epochs=10)
        trainer.fit(model, datamodule=UTKFaceDataModule("data/utkface"))
    """

    def __init__(self, num_classes: int, label_smoothing: float = 0.0, **kwargs: Any) -> None:
        if not 0.0 <= label_smoothing < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        super().__init__(num_classes=num_classes, **kwargs)
        self.criterion = self.build_loss()

    def build_loss(self) -> nn.Module:
        """The loss on ``(logits [B, C] float32, labels [B])``: the one hook a new supervised loss overrides.

        Called from ``__init__`` (set the attributes it reads before ``super().__init__()``); training logs
        it as ``train/loss``, validation and test as ``val/loss`` / ``test/loss`` (:meth:`eval_outputs`).
        """
        return nn.CrossEntropyLoss(label_smoothing=self.hparams.label_smoothing)

    def eval_outputs(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]:
        """Validation and test score the logits with the training loss (:meth:`build_loss`), so ``val/loss`` is the loss trained on."""
        logits = self(x).float()
        loss: torch.Tensor = self.criterion(logits, y)
        return loss, logits, {}

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        logits = self(x)
        loss: torch.Tensor = self.criterion(upcast(logits), y)  # float32 (float64 under 64-true)
        acc = (logits.argmax(dim=1) == y).float().mean()
        self.log("train/loss", loss, prog_bar=True, batch_size=y.shape[0])
        self.log("train/acc", acc, batch_size=y.shape[0])
        return loss
