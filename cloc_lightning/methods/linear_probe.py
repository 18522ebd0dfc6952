"""Stage two of contrastive pre-training: a linear classifier on a frozen encoder.

The linear evaluation protocol of SimCLR (Chen et al. 2020) and SupCon (Khosla et
al. 2020; ``main_linear.py`` of https://github.com/HobbitLong/SupContrast): the
encoder of a stage-one checkpoint is frozen -- no gradients, and in eval mode
throughout, so BatchNorm statistics do not move -- and only a linear layer is
trained with cross-entropy on its features.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.methods.base import ClassifierModule, OptimizerName, SchedulerName
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.probe import ENCODER_META_KEY, EncoderCheckpoint, encoder_metadata, load_encoder, load_encoder_weights

__all__ = ["LinearProbeModule"]


class LinearProbeModule(ClassifierModule):
    """A linear classifier with cross-entropy on the frozen encoder of a stage-one checkpoint.

    ``encoder_ckpt`` may come from any of our pre-training modules: SupCon/SimCLR
    (:class:`~cloc_lightning.methods.SupConModule`), :class:`~cloc_lightning.methods.CEModule`,
    :class:`~cloc_lightning.methods.CLOCModule`, ReLIC (whose evaluation encoder is the
    EMA target's) -- :mod:`cloc_lightning.probe` describes how the encoder weights are
    found -- or a plain ``state_dict`` file of a timm encoder (then give ``backbone``).
    The backbone architecture is read from the checkpoint; ``backbone`` / ``cifar_stem``
    override it (a mismatch with the weights is a clear error).

    The encoder is frozen: ``requires_grad=False`` and **eval mode even while
    training** (BatchNorm running statistics stay as in stage one); ``init_from``
    never touches it.  Reported: ``val/acc``, ``val/acc_top5`` (nominal) or the
    ordinal metrics (MAE, accuracy, QWK, ±1 accuracy) for ordinal data, and the same
    under ``test/``; the best checkpoint monitors ``val/acc`` (nominal) / ``val/mae``.

    Training labels ``< 0`` (unlabelled images) are skipped.

    Args:
        num_classes: classes of the linear classifier (must match the data module).
        encoder_ckpt: the stage-one checkpoint (``.ckpt``) or an encoder ``state_dict`` file.
        backbone: timm name overriding the checkpoint's (``None`` = the checkpoint's).
        cifar_stem: override of the checkpoint's ``cifar_stem`` (``None`` = the checkpoint's).
        backbone_kwargs: override of the checkpoint's extra timm arguments.
        normalize_features: L2-normalise the features before the classifier (ReLIC
            evaluates normalised features).
        encoder_info: set automatically (the architecture read from ``encoder_ckpt``,
            stored so that this module's own checkpoints reload without the stage-one
            file); leave unset.
        optimizer, lr, weight_decay, momentum, scheduler, warmup_epochs: as
            :class:`~cloc_lightning.methods.base.BaseModule`, with SupContrast
            ``main_linear.py``'s defaults: SGD, momentum 0.9, no weight decay, lr 0.1
            (its README: 5 for SupCon, 1 for SimCLR at batch 512).
        **kwargs: other :class:`~cloc_lightning.methods.base.ClassifierModule` arguments
            (``task``, ``lr_milestones``, ``lr_gamma``, ``min_lr_ratio``, ``init_from``, ...).

    Example::

        cloc-lightning fit --config configs/supcon/cifar10_cpu.yaml           # stage one
        cloc-lightning fit --config configs/linear_probe/cifar10_cpu.yaml \\
            --model.encoder_ckpt runs/supcon_cifar10_cpu/version_0/checkpoints/last.ckpt

        model = LinearProbeModule(num_classes=10, encoder_ckpt="last.ckpt", lr=1.0)
        L.Trainer(max_epochs=10).fit(model, datamodule=dm)
    """

    #: ``init_from`` never overwrites the frozen encoder
    init_from_exclude = ("backbone.",)

    def __init__(
        self,
        num_classes: int,
        encoder_ckpt: str | None = None,
        backbone: str | None = None,
        cifar_stem: bool | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        normalize_features: bool = False,
        encoder_info: dict[str, Any] | None = None,
        optimizer: OptimizerName = "sgd",
        lr: float = 0.1,
        weight_decay: float = 0.0,
        momentum: float = 0.9,
        scheduler: SchedulerName = "cosine",
        warmup_epochs: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if kwargs.get("pretrained") not in (None, False, "false", "False"):
            raise ValueError(
                "LinearProbeModule takes its encoder weights from encoder_ckpt; remove 'pretrained' "
                "(to probe timm's pretrained weights, train nothing in stage one: use a CEModule checkpoint or a state_dict file)"
            )
        kwargs.pop("pretrained", None)
        enc: EncoderCheckpoint | None = None
        if encoder_info is None:
            if not encoder_ckpt:
                raise ValueError(
                    "LinearProbeModule needs encoder_ckpt: the checkpoint of a stage-one run, e.g. "
                    "--model.encoder_ckpt runs/supcon/version_0/checkpoints/last.ckpt"
                )
            enc = load_encoder(encoder_ckpt, backbone, cifar_stem, backbone_kwargs)
            info = enc.info()
        else:  # reloading one of our own checkpoints: the weights come with its state_dict
            info = dict(encoder_info)
            for key, value in (("backbone", backbone), ("cifar_stem", cifar_stem), ("backbone_kwargs", backbone_kwargs)):
                if value is not None:
                    info[key] = value
        # read by build_backbone() during the base constructor (before nn.Module attributes exist)
        object.__setattr__(self, "_encoder_info", info)
        super().__init__(
            num_classes=num_classes,
            backbone=info["backbone"],
            cifar_stem=bool(info.get("cifar_stem", False)),
            backbone_kwargs=info.get("backbone_kwargs") or None,
            pretrained=False,
            optimizer=optimizer,
            lr=lr,
            weight_decay=weight_decay,
            momentum=momentum,
            scheduler=scheduler,
            warmup_epochs=warmup_epochs,
            **kwargs,
        )
        if enc is not None:
            load_encoder_weights(self.backbone, enc)
        self.hparams["encoder_info"] = info
        self.normalize_features = normalize_features
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    # ------------------------------------------------------------------ hooks
    def build_backbone(self) -> tuple[nn.Module, int]:
        """The stage-one architecture (timm ``backbone`` with ``cifar_stem``/``backbone_kwargs``), randomly initialised.

        Override it (returning ``(module, feature_dim)``) for an encoder that is not a
        timm model; its ``state_dict`` keys must match the checkpoint's encoder weights.
        """
        info = self._encoder_info
        return create_backbone(info["backbone"], False, bool(info.get("cifar_stem", False)), **(info.get("backbone_kwargs") or {}))

    # ---------------------------------------------------------------- frozen encoder
    def train(self, mode: bool = True) -> "LinearProbeModule":
        """Switch the classifier's mode; the encoder stays in eval mode (frozen BatchNorm statistics)."""
        super().train(mode)
        self.backbone.eval()
        return self

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen features ``[B, feature_dim]`` (L2-normalised with ``normalize_features``)."""
        with torch.no_grad():
            f = self.backbone(x)
        f = f.float()
        return F.normalize(f, dim=1) if self.normalize_features else f

    def extract_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, num_classes]``."""
        return self.head(self.encode(x))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        keep = y >= 0
        if not bool(keep.all()):
            x, y = x[keep], y[keep]
        if y.numel() == 0:  # an all-unlabelled batch: nothing to learn from
            return sum(p.sum() for p in self.head.parameters()) * 0.0
        logits = self(x)
        loss = F.cross_entropy(logits.float(), y)
        n = y.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", (logits.argmax(1) == y).float().mean(), batch_size=n)
        return loss

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the encoder's architecture, so this checkpoint can itself be probed (``cloc-lightning probe``)."""
        super().on_save_checkpoint(checkpoint)
        meta = encoder_metadata(self)
        meta.update({k: self._encoder_info.get(k) for k in ("backbone", "cifar_stem", "backbone_kwargs")})
        checkpoint[ENCODER_META_KEY] = meta
