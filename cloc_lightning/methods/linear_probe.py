"""Stage two of contrastive pre-training: a linear classifier on a frozen encoder.

The linear evaluation protocol of SimCLR (Chen et al. 2020) and SupCon (Khosla et
al. 2020; ``main_linear.py`` of https://github.com/HobbitLong/SupContrast): the
encoder of a stage-one checkpoint is frozen -- no gradients, and in eval mode
throughout, so BatchNorm statistics do not move -- and only a linear layer is
trained with cross-entropy on its features.

SupContrast's ``main_linear.py`` validates on the test set after every epoch and
prints the *best* accuracy over the epochs; this module logs both the latest and the
best validation accuracy every epoch (``val/acc`` and ``val/acc_best``) and prints
both at the end of ``fit`` (see :class:`LinearProbeModule`).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from cloc_lightning.checkpoints import EncoderCheckpoint, load_encoder, load_encoder_weights
from cloc_lightning.checks import require
from cloc_lightning.losses.base import upcast
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.methods.optim import OptimizerName
from cloc_lightning.nn.encoders import build_registered_encoder, encoder_feature_dim
from cloc_lightning.nn.online_probe import masked_cross_entropy

__all__ = ["LinearProbeModule"]


class LinearProbeModule(ClassifierModule):
    """A linear classifier with cross-entropy on the frozen encoder of a stage-one checkpoint.

    ``encoder_ckpt`` may come from any of our pre-training modules: SupCon/SimCLR
    (:class:`~cloc_lightning.methods.SupConModule`), Rank-N-Contrast (:class:`~cloc_lightning.methods.RnCModule`),
    :class:`~cloc_lightning.methods.CEModule`,
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

    **Final and best.** SupContrast's ``main_linear.py`` reports the best test accuracy
    over the epochs (it validates on the test set: ``val_fraction: 0`` here does the
    same).  The module logs both the latest and the best validation values every epoch
    and prints both at the end of ``fit`` -- ``linear probe: val/acc final 0.8712 (epoch
    99), best 0.8760 (epoch 87)`` -- as every
    :class:`~cloc_lightning.methods.classifier.ClassifierModule` does.

    Training labels ``< 0`` (unlabelled images) are skipped.

    **Defaults** (SupContrast ``main_linear.py``'s): SGD, momentum 0.9, no weight decay, lr 0.1
    (its README: 5 for SupCon, 1 for SimCLR at batch 512), cosine schedule.

    Args:
        encoder_ckpt: the stage-one checkpoint (``.ckpt``) or an encoder ``state_dict`` file.
        backbone: timm name overriding the checkpoint's (``None`` = the checkpoint's).
        cifar_stem: override of the checkpoint's ``cifar_stem`` (``None`` = the checkpoint's).
        backbone_kwargs: override of the checkpoint's extra timm arguments.
        normalize_features: L2-normalise the features before the classifier (ReLIC
            evaluates normalised features).
        encoder_info: set automatically (the architecture read from ``encoder_ckpt``,
            stored so that this module's own checkpoints reload without the stage-one
            file); leave unset.
        pretrained: not used: the encoder's weights come from ``encoder_ckpt`` (leave it ``false``).
        optimizer: ``sgd`` (``main_linear.py``'s; momentum 0.9) | ``adam`` | ``adamw`` | ``radam``.
        lr: base learning rate (``main_linear.py``'s 0.1).
        **kwargs: the :class:`~cloc_lightning.methods.classifier.ClassifierModule` arguments
            (``num_classes``, ``task``, the optimiser and schedule, ``init_from``, ...).

    Keyword Args:
        num_classes (int): classes of the linear classifier (must match the data module).

    Example::

        cloc-lightning fit --config configs/supcon/cifar10_cpu.yaml           # stage one
        cloc-lightning fit --config configs/linear_probe/cifar10_cpu.yaml \\
            --model.encoder_ckpt runs/supcon_cifar10_cpu/version_0/checkpoints/last.ckpt

        model = LinearProbeModule(num_classes=10, encoder_ckpt="last.ckpt", lr=1.0)
        L.Trainer(max_epochs=10).fit(model, datamodule=dm)
    """

    #: ``init_from`` never overwrites the frozen encoder
    init_from_exclude = ("backbone.",)
    #: checkpoint key of the validation history (kept from before the tracking moved to ClassifierModule)
    VAL_HISTORY_KEY = "linear_probe_val_history"
    summary_name = "linear probe"

    #: the encoder architecture (set by :meth:`prepare_build`; stored as ``hparams.encoder_info``)
    _encoder_info: dict[str, Any]
    #: the stage-one encoder weights between :meth:`prepare_build` and their loading in ``__init__``
    _stage_one: EncoderCheckpoint | None

    def evaluation_keys(self) -> list[str]:
        """The base's keys but the encoder's: it comes from ``encoder_ckpt`` (loaded in ``__init__``), not ``init_from``."""
        return [k for k in super().evaluation_keys() if not k.startswith("backbone.")]

    def __init__(
        self,
        encoder_ckpt: str | None = None,
        backbone: str | None = None,
        cifar_stem: bool | None = None,
        backbone_kwargs: dict[str, Any] | None = None,
        normalize_features: bool = False,
        encoder_info: dict[str, Any] | None = None,
        *,
        pretrained: bool | str = False,
        optimizer: OptimizerName = "sgd",
        lr: float = 0.1,
        **kwargs: Any,
    ) -> None:
        if pretrained not in (None, False, "false", "False"):
            raise ValueError(
                "LinearProbeModule takes its encoder weights from encoder_ckpt; remove 'pretrained' "
                "(to probe timm's pretrained weights, train nothing in stage one: use a CEModule checkpoint or a state_dict file)"
            )
        if encoder_info is None and not encoder_ckpt:
            raise ValueError(
                "LinearProbeModule needs encoder_ckpt: the checkpoint of a stage-one run, e.g. "
                "--model.encoder_ckpt runs/supcon/version_0/checkpoints/last.ckpt"
            )
        # backbone / cifar_stem / backbone_kwargs (overrides of the checkpoint's) are read with the
        # stage-one checkpoint in prepare_build(), before the backbone is built
        super().__init__(pretrained=False, optimizer=optimizer, lr=lr, **kwargs)
        if self._stage_one is not None:
            load_encoder_weights(self.backbone, self._stage_one)
            self._stage_one = None  # the weights now live in the backbone
        self.normalize_features = normalize_features
        self.backbone.requires_grad_(False)
        self.backbone.eval()

    # ------------------------------------------------------------------ hooks
    def prepare_build(self) -> None:
        """Read the encoder architecture (and, the first time, its weights) before the backbone is built.

        From ``encoder_ckpt``, or, when one of this module's own checkpoints is reloaded, from
        the stored ``encoder_info`` (the weights then come with its ``state_dict``); explicit
        ``backbone`` / ``cifar_stem`` / ``backbone_kwargs`` override it.  The result is stored
        as ``hparams.encoder_info``, so this module's checkpoints reload without the stage-one file.
        """
        h = self.hparams
        overrides = {"backbone": h.backbone, "cifar_stem": h.cifar_stem, "backbone_kwargs": h.backbone_kwargs}
        self._stage_one = None
        if h.encoder_info is None:
            self._stage_one = load_encoder(h.encoder_ckpt, h.backbone, h.cifar_stem, h.backbone_kwargs)
            info = self._stage_one.info()
        else:
            info = dict(h.encoder_info)
            info.update({k: v for k, v in overrides.items() if v is not None})
        self._encoder_info = info
        self.hparams["encoder_info"] = info

    def build_backbone(self) -> tuple[nn.Module, int]:
        """The stage-one architecture (timm ``backbone`` with ``cifar_stem``/``backbone_kwargs``), randomly initialised.

        Override it (returning ``(module, feature_dim)``) for an encoder that is not a
        timm model; its ``state_dict`` keys must match the checkpoint's encoder weights.
        """
        info = self._encoder_info
        encoder = build_registered_encoder(  # the "timm" builder of the one encoder registry, as checkpoints.build_encoder
            "timm", backbone=info["backbone"], cifar_stem=bool(info.get("cifar_stem", False)), backbone_kwargs=info.get("backbone_kwargs")
        )
        return encoder, encoder_feature_dim(encoder)

    # ---------------------------------------------------------------- frozen encoder
    def train(self, mode: bool = True) -> LinearProbeModule:
        """Switch the classifier's mode; the encoder stays in eval mode (frozen BatchNorm statistics)."""
        super().train(mode)
        self.backbone.eval()
        return self

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Frozen features ``[B, feature_dim]`` (L2-normalised with ``normalize_features``) in the head's dtype.

        float32 under 32-true and the mixed precisions, float64 under ``64-true``, bf16/fp16
        under the ``-true`` half precisions (the head's weights have the Trainer's dtype).
        """
        with torch.no_grad():
            f = self.backbone(x)
        f = f.to(next((p.dtype for p in self.head.parameters() if p.is_floating_point()), torch.float32))
        return F.normalize(f, dim=1) if self.normalize_features else f

    def extract_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.encode(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Class scores ``[B, num_classes]``."""
        logits: torch.Tensor = self.head(self.encode(x))
        return logits

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        # unlabelled rows (y < 0) are ignored by the loss; the frozen encoder is in eval mode, so they change
        # nothing else (no boolean-mask indexing: that would read the device every step)
        require(
            y < self.num_classes,
            f"a training label is >= num_classes={self.num_classes}; set --model.num_classes to the data module's number of classes",
            detail=lambda: f" (largest label {int(y.max())})",
        )
        logits = self(x)
        loss, acc = masked_cross_entropy(upcast(logits), y, self.num_classes)  # float32, or float64 under 64-true
        n = y.shape[0]
        self.log("train/loss", loss, prog_bar=True, batch_size=n)
        self.log("train/acc", acc, batch_size=n)
        return loss

    def encoder_metadata(self) -> dict[str, Any]:
        """The stage-one encoder's architecture, so this checkpoint can itself be probed (``cloc-lightning probe``)."""
        meta = super().encoder_metadata()
        meta.update({k: self._encoder_info.get(k) for k in ("backbone", "cifar_stem", "backbone_kwargs")})
        return meta
