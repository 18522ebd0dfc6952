"""OrdinalCLIP: ordinal regression as image–language matching with learned rank prompts.

Li, Huang, Zhu, Tang, Li, Zhou, Lu. *OrdinalCLIP: Learning Rank Prompts for Language-Guided
Ordinal Regression*, NeurIPS 2022 (arXiv 2206.02338); reference code
https://github.com/xk-huang/OrdinalCLIP (``ordinalclip/models/ordinalclip.py``,
``ordinalclip/models/baseline.py``, ``ordinalclip/runner/runner.py``).

Every rank r has a prompt ``[SOT] context rank_r . [EOT]`` whose feature from CLIP's frozen
text encoder is the rank's *language prototype* ``t_r`` (:class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner`).
An image with features ``f`` gets the logits ``exp(logit_scale) * cos(f, t_r)`` for ``r = 0..R-1``,
trained with CE over ranks + KL over the batch per rank
(:class:`~cloc_lightning.losses.rank_prompt.OrdinalCLIPLoss`).  After training the R
prototypes are fixed vectors: :meth:`OrdinalCLIPModule.export_prototypes` (or
``cloc-lightning export-prototypes CKPT OUT``) writes the image encoder + an ``[R, D]`` matrix,
which predicts at the cost of a linear head with no text encoder in memory
(:class:`~cloc_lightning.nn.prompt_learner.PrototypeClassifier`).

This module is one :class:`~cloc_lightning.methods.base.ClassifierModule`: ``forward(images)``
returns ``[B, R]`` logits, so the shared ordinal metrics (argmax MAE, expected-rank MAE,
accuracy, QWK, ±1 accuracy), validation/test/predict steps and checkpointing apply unchanged.
"""

from __future__ import annotations

import argparse
import copy
import math
import os
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cloc_lightning.losses.rank_prompt import OrdinalCLIPLoss
from cloc_lightning.methods.base import ClassifierModule, OptimizerName, SchedulerName
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.nn.clip import load_clip, resolve_clip_model
from cloc_lightning.nn.prompt_learner import (
    INTERPOLATION_KINDS,
    RANK_POSITIONS,
    PrototypeClassifier,
    RankPromptLearner,
    logits_to_predictions,
    rank_interpolation_weights,
    register_encoder_builder,
)

__all__ = [
    "OrdinalCLIPModule",
    "RankPromptHead",
    "LinearPrototypeHead",
    "ProjectedEncoder",
    "export_prototypes_main",
    "MAX_LOGIT_SCALE",
]

#: upper bound of a *learned* logit scale (log of 100), as CLIP clamps its own
MAX_LOGIT_SCALE = math.log(100.0)


# --------------------------------------------------------------------------------------------
# image encoder: a timm backbone projected to the CLIP embedding width
# --------------------------------------------------------------------------------------------


class ProjectedEncoder(nn.Module):
    """A feature extractor followed by a linear projection to the CLIP embedding width D.

    ``forward(x [B, 3, H, W]) -> [B, D]`` = ``proj(encoder(x))``: the image encoder of
    ``image_encoder: timm`` as one module, as exported (in :class:`OrdinalCLIPModule` the two parts
    are ``backbone`` and ``image_proj``, so that ``backbone.*`` is a bare timm network like in every
    other module).  The reference replaces ``clip_model.visual`` by a torchvision network with
    ``num_classes=embed_dim`` the same way.

    Args:
        encoder: module mapping images to ``[B, F]`` features.
        in_features: F.
        embed_dim: D.
    """

    def __init__(self, encoder: nn.Module, in_features: int, embed_dim: int) -> None:
        super().__init__()
        self.encoder = encoder
        self.proj = nn.Linear(in_features, embed_dim)

    def forward(self, x: Tensor) -> Tensor:
        """``[B, 3, H, W]`` → ``[B, D]``."""
        return self.proj(self.encoder(x))


def build_timm_projected(
    backbone: str, embed_dim: int, cifar_stem: bool = False, backbone_kwargs: dict[str, Any] | None = None
) -> ProjectedEncoder:
    """Randomly initialised ``ProjectedEncoder(timm backbone, Linear(F, embed_dim))``.

    Registered as the :class:`PrototypeClassifier` encoder builder ``"timm_projected"`` (weights
    come from the exported state dict).
    """
    net, width = create_backbone(backbone, False, cifar_stem, **(backbone_kwargs or {}))
    return ProjectedEncoder(net, width, embed_dim)


register_encoder_builder("timm_projected", build_timm_projected)


# --------------------------------------------------------------------------------------------
# heads: features [B, D] -> logits [B, R] against R prototypes
# --------------------------------------------------------------------------------------------


class _PrototypeHead(nn.Module):
    """``logits = exp(logit_scale) * normalize(features) @ normalize(prototypes)ᵀ`` (float32).

    Subclasses implement :meth:`compute_prototypes`.  In training mode, or whenever gradients
    are enabled, the prototypes are recomputed on every call (they depend on the learned
    parameters).  In eval mode with gradients disabled (Lightning's validation / test /
    predict) they are computed once and cached; the cache is keyed on the version counters of
    every parameter and buffer of the head (an optimiser step or ``load_state_dict`` changes
    them in place, which bumps the counters), the device, and the autocast/inference mode, and
    it is dropped whenever ``train()``/``eval()`` is called.
    """

    def __init__(self, logit_scale: float, learn_logit_scale: bool) -> None:
        super().__init__()
        value = torch.tensor(float(logit_scale), dtype=torch.float32)
        if learn_logit_scale:
            self.logit_scale = nn.Parameter(value)
        else:
            self.register_buffer("logit_scale", value)
        self.learn_logit_scale = bool(learn_logit_scale)
        self._cache: tuple[tuple[Any, ...], Tensor] | None = None

    def compute_prototypes(self) -> Tensor:
        """``[R, D]`` prototypes (not normalised), any float dtype."""
        raise NotImplementedError

    def effective_logit_scale(self) -> Tensor:
        """The log-multiplier used in the logits (a learned one is clamped at log 100, as CLIP)."""
        if self.learn_logit_scale:
            return self.logit_scale.float().clamp(max=MAX_LOGIT_SCALE)
        return self.logit_scale.float()

    def train(self, mode: bool = True) -> _PrototypeHead:  # noqa: D102 - also drops the cache
        self._cache = None
        return super().train(mode)

    def _cache_key(self, device: torch.device) -> tuple[Any, ...]:
        versions = tuple(t._version for t in (*self.parameters(), *self.buffers()))
        return (
            str(device),
            torch.is_autocast_enabled(device.type),
            torch.is_inference_mode_enabled(),
            len(versions),
            versions,
        )

    def normalized_prototypes(self, device: torch.device | None = None) -> Tensor:
        """``[R, D]`` float32 unit-norm prototypes (cached in eval mode without gradients)."""
        use_cache = not self.training and not torch.is_grad_enabled()
        if not use_cache:
            self._cache = None
            return F.normalize(self.compute_prototypes().float(), dim=-1)
        key = self._cache_key(device or self.logit_scale.device)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, F.normalize(self.compute_prototypes().float(), dim=-1))
        return self._cache[1]

    def forward(self, features: Tensor) -> Tensor:
        """``[B, D]`` image features → ``[B, R]`` float32 logits."""
        prototypes = self.normalized_prototypes(features.device)
        with torch.autocast(features.device.type, enabled=False):  # similarities in float32
            feats = F.normalize(features.float(), dim=-1)
            return self.effective_logit_scale().exp() * (feats @ prototypes.t())


class RankPromptHead(_PrototypeHead):
    """OrdinalCLIP's head: prototypes are the text features of the R rank prompts.

    Args:
        prompt_learner: the :class:`RankPromptLearner` (its ``forward()`` gives ``[R, D]``).
        logit_scale: log of the logit multiplier (CLIP's ``logit_scale``).
        learn_logit_scale: make it a parameter (clamped at log 100) instead of a buffer.
    """

    def __init__(self, prompt_learner: RankPromptLearner, logit_scale: float, learn_logit_scale: bool = False) -> None:
        super().__init__(logit_scale, learn_logit_scale)
        self.prompt_learner = prompt_learner

    def compute_prototypes(self) -> Tensor:
        """``[R, D]`` language prototypes (R prompts through the frozen text encoder)."""
        return self.prompt_learner()


class LinearPrototypeHead(_PrototypeHead):
    """The reference's baseline head: R freely learned prototypes, no language.

    ``logits = exp(logit_scale) * cos(features, weight_r)`` with a bias-free ``weight [R, D]``
    (``last_project`` of ``ordinalclip/models/baseline.py``, which uses the scale 100): a linear
    layer on normalised features with normalised rows.  It has exactly the shape and cost of
    the exported OrdinalCLIP classifier, so it isolates what the language prototypes add.

    Args:
        num_ranks: R.
        embed_dim: D.
        logit_scale: log of the logit multiplier.
        learn_logit_scale: make it a parameter (clamped at log 100) instead of a buffer.
    """

    def __init__(self, num_ranks: int, embed_dim: int, logit_scale: float, learn_logit_scale: bool = False) -> None:
        super().__init__(logit_scale, learn_logit_scale)
        self.weight = nn.Parameter(torch.empty(num_ranks, embed_dim))
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))  # nn.Linear's default initialisation

    def compute_prototypes(self) -> Tensor:
        """``[R, D]`` learned prototypes."""
        return self.weight


# --------------------------------------------------------------------------------------------
# the module
# --------------------------------------------------------------------------------------------


def _close(name: str, options: tuple[str, ...]) -> str:
    return f"one of {list(options)}, got {name!r}"


class OrdinalCLIPModule(ClassifierModule):
    """OrdinalCLIP (Li et al., NeurIPS 2022): learned rank prompts on a frozen CLIP text encoder.

    ``forward(images [B, 3, H, W]) -> logits [B, R]`` with
    ``logits = exp(logit_scale) * cos(image_encoder(x), t_r)``, ``t_r`` the text feature of rank
    r's prompt; loss ``ce_weight * CE + kl_weight * KL``
    (:class:`~cloc_lightning.losses.rank_prompt.OrdinalCLIPLoss`).  Predictions: the argmax
    rank and the expectation ``sum_r softmax_r * r``; the shared ordinal metrics report both
    (``mae`` and ``mae_expected``), accuracy, QWK and ±1 accuracy.

    What is trained (each in its own optimiser group, see :meth:`param_groups`):

    * the context tokens (``context_lr``) and base rank embeddings (``rank_lr``) of the prompt
      learner;
    * the image encoder (``image_encoder_lr``): CLIP's visual tower (``image_encoder: clip``)
      or a timm ``backbone`` + ``image_proj = Linear(F, D)`` to the CLIP embedding width
      (``image_encoder: timm``);
    * the logit scale only with ``learn_logit_scale: true`` (``logit_scale_lr``).

    The CLIP text encoder is frozen: ``requires_grad=False``, always in eval mode, and never in
    the optimiser.  Its weights are in the checkpoint (``save_text_encoder: true``, needed for a
    randomly initialised CLIP; with pretrained weights ``false`` keeps checkpoints small).

    Prototypes are recomputed at every training step (R prompts through the text encoder; only
    up to the EOT position, see :class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner`)
    and computed once and cached in evaluation (see :class:`RankPromptHead`).

    ``head: linear`` replaces the language prototypes by R freely learned prototypes
    (:class:`LinearPrototypeHead`, the reference's ``Baseline``): the linear-head baseline on the
    same image encoder, scale and loss.  It builds no prompt learner and keeps no text encoder.

    DDP: each process computes the same R prototypes from the (replicated) prompt parameters; CE
    is per image and the KL term runs over each process's local batch, as in the reference, so
    no all-gather is needed (there is no ``gather_distributed`` option). The frozen text weights
    have ``requires_grad=False``, so DDP does not synchronise them.

    Args:
        num_classes: number of ranks R (>= 2); must match the data module.
        clip_model: open_clip model name whose text tower (and, with ``image_encoder: clip``,
            visual tower) is used, e.g. ``ViT-S-32-alt`` (small), ``RN50-quickgelu`` (the
            reference's default), ``ViT-B-16-quickgelu`` (the paper's best). See
            :func:`cloc_lightning.nn.clip.load_clip`. With a ``pretrained`` tag trained with
            QuickGELU (every ``openai`` tag) a plain name is built as its ``-quickgelu`` variant
            (``ViT-B-16`` + ``openai`` → ``ViT-B-16-quickgelu``, a printed note;
            :func:`~cloc_lightning.nn.clip.resolve_clip_model`), and ``hparams.clip_model`` (so the
            checkpoint) records the variant built, so that ``export-prototypes`` and reloading with
            ``pretrained: null`` rebuild the same activation.
        pretrained: ``None`` (random init: what tests and offline machines use; **no language
            prior then**), an open_clip tag (``openai``; fails fast with a clear error when not
            cached and offline) or a local checkpoint path.
        clip_config: overrides of the open_clip model config of ``clip_model`` (top-level keys
            replace the named config's, e.g. ``{text_cfg: {...}, vision_cfg: {...}, embed_dim: 64}``),
            as ``open_clip.create_model(clip_model, **clip_config)``. For custom or tiny
            architectures (the tests use one); ``pretrained`` must then be ``None`` or a path.
        image_encoder: ``clip`` (CLIP's visual tower) or ``timm`` (``backbone`` + a Linear
            projection to the CLIP embedding width D).
        backbone: timm model name for ``image_encoder: timm``.
        backbone_pretrained: timm weights for ``image_encoder: timm`` (``False``, ``True`` or a path).
        cifar_stem: 3x3 stem without max-pool for the timm backbone (32 px images).
        backbone_kwargs: extra ``timm.create_model`` arguments.
        head: ``prompts`` (OrdinalCLIP) or ``linear`` (learned prototypes, no language).
        num_base_ranks: B base rank embeddings interpolated to all R ranks (1 <= B <= R).
        num_tokens_per_rank: T tokens per rank.
        num_context_tokens: N context tokens (ignored with ``init_context``).
        init_context: text initialising the context (e.g. ``"the age of the person is"``).
        rank_specific_context: one context per rank instead of a shared one.
        init_rank_names: B or R names initialising the base rank embeddings.
        interpolation: ``linear`` | ``inv_prop`` | ``normal``
            (:func:`~cloc_lightning.nn.prompt_learner.rank_interpolation_weights`).
        rank_position: where the rank tokens go in the prompt: ``tail`` | ``front`` | ``middle``.
        save_text_encoder: keep the frozen text weights in checkpoints (default; needed when
            ``pretrained`` is ``None``).
        logit_scale: log of the logit multiplier; ``None`` = with ``head: prompts`` the CLIP
            model's (log 100 = 4.6052 for OpenAI weights, as the reference, which takes
            ``clip_model.logit_scale`` from the OpenAI checkpoint; log(1/0.07) ≈ 2.66 for a random
            init), with ``head: linear`` log 100 (the reference ``Baseline``'s fixed 100).
        learn_logit_scale: learn it (clamped at log 100); frozen by default as in the reference
            (its ``lr_logit_scale`` is 0).
        ce_weight: weight of the CE term.
        kl_weight: weight of the KL term.
        target_sharpness: sharpness of the KL soft targets (reference: 10).
        check_finite: raise a clear error on NaN/inf logits (one device sync per step).
        context_lr: lr of the context tokens (default ``lr``).
        rank_lr: lr of the base rank embeddings, or of the prototypes with ``head: linear``
            (default ``lr``).
        image_encoder_lr: lr of the image encoder (default ``lr``).
        logit_scale_lr: lr of a learned logit scale (default ``lr``; no weight decay).
        optimizer: ``radam`` (reference) | ``adam`` | ``adamw`` | ``sgd``. ``radam`` is
            ``torch.optim.RAdam`` with *decoupled* weight decay (``p ← p − lr·wd·p``), as the
            reference's RAdam (Liu et al.'s implementation) applies it; torch's default would add
            ``wd·p`` to the gradient (L2), which the adaptive step rescales.
        lr: base learning rate (reference: 1e-4 for every group).
        weight_decay: weight decay of every group except the logit scale (reference: 0 in
            ``configs/default.yaml``, 5e-4 in its MORPH runs).
        scheduler: ``cosine`` (per step, after ``warmup_epochs``) | ``step`` | ``none``. The
            reference steps torch's ``CosineAnnealingLR(T_max=max_epochs)`` (MORPH runs) or
            ``MultiStepLR([60], 0.1)`` (its default config) once per epoch; ``step`` with
            ``lr_milestones: [60]`` is exactly the latter, ``cosine`` with ``lr_interval: step``
            equals the former at every epoch start (``configs/ordinal_clip/utkface_seed.yaml``).
        **kwargs: other :class:`~cloc_lightning.methods.base.ClassifierModule` /
            :class:`~cloc_lightning.methods.base.BaseModule` arguments (``task``,
            ``warmup_epochs``, ``min_lr_ratio``, ``init_from``, ...).

    Example::

        model = OrdinalCLIPModule(num_classes=80, clip_model="ViT-S-32-alt", pretrained=None,
                                  image_encoder="timm", backbone="resnet18", num_base_ranks=3)
        L.Trainer(max_epochs=20).fit(model, datamodule=UTKFaceDataModule(root, label_mode="age", max_age=80))
        model.export_prototypes("ordinalclip.pt")     # image encoder + [R, D] prototypes
        clf = PrototypeClassifier.load("ordinalclip.pt")
        ages = clf.predict(images) + 1                 # expected rank; ranks are age - min_age

        # command line
        cloc-lightning fit --config configs/ordinal_clip/utkface.yaml
        cloc-lightning export-prototypes runs/.../best.ckpt ordinalclip.pt --rank-offset 1
    """

    def __init__(
        self,
        num_classes: int,
        clip_model: str = "ViT-S-32-alt",
        pretrained: str | None = None,
        clip_config: dict[str, Any] | None = None,
        image_encoder: Literal["clip", "timm"] = "clip",
        backbone: str = "resnet18",
        backbone_pretrained: bool | str = False,
        cifar_stem: bool = False,
        backbone_kwargs: dict[str, Any] | None = None,
        head: Literal["prompts", "linear"] = "prompts",
        num_base_ranks: int = 3,
        num_tokens_per_rank: int = 1,
        num_context_tokens: int = 10,
        init_context: str | None = None,
        rank_specific_context: bool = False,
        init_rank_names: list[str] | None = None,
        interpolation: Literal["linear", "inv_prop", "normal"] = "linear",
        rank_position: Literal["tail", "front", "middle"] = "tail",
        save_text_encoder: bool = True,
        logit_scale: float | None = None,
        learn_logit_scale: bool = False,
        ce_weight: float = 1.0,
        kl_weight: float = 1.0,
        target_sharpness: float = 10.0,
        check_finite: bool = True,
        context_lr: float | None = None,
        rank_lr: float | None = None,
        image_encoder_lr: float | None = None,
        logit_scale_lr: float | None = None,
        optimizer: OptimizerName = "radam",
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        scheduler: SchedulerName = "cosine",
        **kwargs: Any,
    ) -> None:
        # cheap checks first: a config error must not wait for a CLIP model to be built
        if image_encoder not in ("clip", "timm"):
            raise ValueError(f"image_encoder must be {_close(image_encoder, ('clip', 'timm'))}")
        if head not in ("prompts", "linear"):
            raise ValueError(f"head must be {_close(head, ('prompts', 'linear'))}")
        if clip_config is not None and not isinstance(clip_config, dict):
            raise TypeError(
                f"clip_config must be a dict of open_clip model-config overrides, got {type(clip_config).__name__}"
            )
        if clip_config and pretrained is not None and not os.path.isfile(os.path.expanduser(str(pretrained))):
            raise ValueError(
                f"clip_config changes the architecture of {clip_model!r}, so pretrained={pretrained!r} (a tag of the "
                "named architecture) cannot be loaded into it; use pretrained: null or a checkpoint file path"
            )
        for name, value in (("context_lr", context_lr), ("rank_lr", rank_lr), ("image_encoder_lr", image_encoder_lr),
                            ("logit_scale_lr", logit_scale_lr)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0):
                raise ValueError(f"{name} must be a number >= 0 (or null for the base lr), got {value!r}")
        if logit_scale is not None and not math.isfinite(float(logit_scale)):
            raise ValueError(f"logit_scale must be a finite number (the log of the multiplier), got {logit_scale!r}")
        if head == "prompts":
            if interpolation not in INTERPOLATION_KINDS:
                raise ValueError(f"interpolation must be {_close(interpolation, INTERPOLATION_KINDS)}")
            if rank_position not in RANK_POSITIONS:
                raise ValueError(f"rank_position must be {_close(rank_position, RANK_POSITIONS)}")
            if isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2:
                rank_interpolation_weights(num_classes, num_base_ranks, interpolation)  # validates R, B
        loss_kwargs = dict(
            ce_weight=ce_weight, kl_weight=kl_weight, target_sharpness=target_sharpness, check_finite=check_finite
        )
        OrdinalCLIPLoss(**loss_kwargs)  # validates the weights before anything is built
        super().__init__(
            num_classes=num_classes,
            optimizer=optimizer,
            lr=lr,
            weight_decay=weight_decay,
            scheduler=scheduler,
            backbone=backbone,
            cifar_stem=cifar_stem,
            backbone_kwargs=backbone_kwargs,
            **kwargs,
        )
        #: projection of timm features to D (identity for CLIP's visual tower, which ends at D)
        self.image_proj: nn.Module = (
            nn.Linear(self.feature_dim, self.embed_dim) if image_encoder == "timm" else nn.Identity()
        )
        self.criterion = OrdinalCLIPLoss(**loss_kwargs)

    # ------------------------------------------------------------------ building
    def _clip_arch(self) -> dict[str, Any] | None:
        """The open_clip model config actually built (named config + ``clip_config``), or None (hf-hub/local-dir)."""
        import open_clip

        h = self.hparams
        name = h.clip_model
        if name.startswith(("hf-hub:", "local-dir:")):
            return None
        cfg = copy.deepcopy(open_clip.get_model_config(name.replace("/", "-")) or {})
        cfg.update(copy.deepcopy(h.clip_config or {}))
        return cfg or None

    def _load_clip(self) -> tuple[nn.Module, Any]:
        h = self.hparams
        if not h.clip_config:
            model, tokenizer = load_clip(h.clip_model, h.pretrained)  # prints a note when it switches
            resolved, _ = resolve_clip_model(h.clip_model, h.pretrained)
            if resolved != h.clip_model:
                # the checkpoint records the architecture actually built (reloads with pretrained: null,
                # export-prototypes and encoder_builder() must rebuild the same activation)
                self.hparams["clip_model"] = resolved
            return model, tokenizer
        import open_clip

        from cloc_lightning.nn.clip import _validate_model_name

        _validate_model_name(h.clip_model)
        pretrained = os.path.expanduser(h.pretrained) if h.pretrained else None
        model = open_clip.create_model(h.clip_model, pretrained=pretrained, **copy.deepcopy(h.clip_config)).eval()
        ctx = int((self._clip_arch() or {}).get("text_cfg", {}).get("context_length", 77))
        return model, open_clip.get_tokenizer(h.clip_model, context_length=ctx)

    def build_backbone(self) -> tuple[nn.Module, int]:
        """Load CLIP, keep its parts aside for :meth:`build_head`; return ``(image encoder, feature width)``.

        The encoder is CLIP's visual tower (features ``[B, D]``) or the timm ``backbone``
        (features ``[B, F]``, projected to D by ``image_proj``).
        """
        h = self.hparams
        clip_model, tokenizer = self._load_clip()
        self.embed_dim = _embed_dim(clip_model)  #: D, the CLIP embedding width shared by both towers
        if h.image_encoder == "clip":
            encoder: nn.Module = clip_model.visual
            width = self.embed_dim
        else:
            kw = h.backbone_kwargs or {}
            encoder, width = create_backbone(h.backbone, h.backbone_pretrained, h.cifar_stem, **kw)
        if h.logit_scale is not None:
            scale = float(h.logit_scale)
        elif h.head == "linear":
            scale = MAX_LOGIT_SCALE  # the reference Baseline multiplies by a fixed 100
        else:
            scale = float(clip_model.logit_scale.detach())  # OpenAI weights: log 100, as the reference
        # not an attribute: nn.Module would register the whole CLIP (text tower included) as a child
        self.__dict__["_pending_clip"] = (clip_model, tokenizer, scale)
        return encoder, width

    def build_head(self) -> nn.Module:
        """:class:`RankPromptHead` (``head: prompts``) or :class:`LinearPrototypeHead` (``head: linear``)."""
        h = self.hparams
        clip_model, tokenizer, scale = self.__dict__.pop("_pending_clip")
        if h.head == "linear":
            return LinearPrototypeHead(self.num_classes, self.embed_dim, scale, h.learn_logit_scale)
        prompts = RankPromptLearner(
            clip_model,
            num_ranks=self.num_classes,
            num_base_ranks=h.num_base_ranks,
            num_tokens_per_rank=h.num_tokens_per_rank,
            num_context_tokens=h.num_context_tokens,
            init_context=h.init_context,
            rank_specific_context=h.rank_specific_context,
            init_rank_names=h.init_rank_names,
            interpolation=h.interpolation,
            rank_position=h.rank_position,
            tokenizer=tokenizer,
            save_text_encoder=h.save_text_encoder,
        )
        if prompts.embed_dim != self.embed_dim:
            raise ValueError(
                f"text features have dimension {prompts.embed_dim} but the image encoder gives {self.embed_dim}; "
                "check clip_config (embed_dim must be shared by both towers)"
            )
        return RankPromptHead(prompts, scale, h.learn_logit_scale)

    # ------------------------------------------------------------------ lifecycle
    def setup(self, stage: str) -> None:
        """Also check that the data's image size is the one CLIP's visual tower was built for."""
        super().setup(stage)
        dm = getattr(self.trainer, "datamodule", None) if self._trainer is not None else None
        if self.hparams.image_encoder != "clip" or dm is None:
            return
        want, got = getattr(self.backbone, "image_size", None), getattr(dm, "image_size", None)
        pair = lambda v: tuple(v) if isinstance(v, (list, tuple)) else (v, v)  # noqa: E731
        if want is not None and got is not None and pair(want) != pair(got):
            raise ValueError(
                f"CLIP's visual tower of {self.hparams.clip_model!r} takes {pair(want)[0]}x{pair(want)[1]} px images "
                f"(its positional embedding has a fixed size) but {type(dm).__name__} gives image_size={got}; set "
                f"--data.image_size {pair(want)[0]}, or use --model.image_encoder timm for other sizes"
            )

    # ------------------------------------------------------------------ optimiser
    def build_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """As :class:`~cloc_lightning.methods.base.BaseModule`, but ``radam`` decays weights decoupled.

        The reference's RAdam (``ordinalclip/runner/optim/custom_optim/radam.py``, Liu et al.)
        applies weight decay as ``p ← p − lr·wd·p``; ``torch.optim.RAdam`` does that with
        ``decoupled_weight_decay=True`` (its default adds ``wd·p`` to the gradient instead).
        Same result with ``weight_decay: 0``.
        """
        h = self.hparams
        if h.optimizer == "radam":
            return torch.optim.RAdam(groups, lr=h.lr, weight_decay=h.weight_decay, decoupled_weight_decay=True)
        return super().build_optimizer(groups)

    def param_groups(self) -> list[dict[str, Any]]:
        """One group per role, each with its own lr; the frozen text encoder is in none of them.

        Groups (``name``): ``image_encoder`` (``backbone`` + ``image_proj``, ``image_encoder_lr``),
        ``context`` (``context_lr``) and ``ranks`` (``rank_lr``) for ``head: prompts``, ``prototypes`` (``rank_lr``) for
        ``head: linear``, ``logit_scale`` (``logit_scale_lr``, no weight decay) when learned, and
        ``other`` (base lr) for any remaining trainable parameter a subclass adds.
        """
        h = self.hparams

        def lr(value: float | None) -> float:
            return float(h.lr if value is None else value)

        encoder = [p for m in (self.backbone, self.image_proj) for p in m.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"name": "image_encoder", "params": encoder, "lr": lr(h.image_encoder_lr)}]
        if isinstance(self.head, RankPromptHead):
            g = self.head.prompt_learner.param_groups()
            groups.append({"name": "context", "params": list(g["context"]), "lr": lr(h.context_lr)})
            groups.append({"name": "ranks", "params": list(g["ranks"]), "lr": lr(h.rank_lr)})
        else:
            groups.append({"name": "prototypes", "params": [self.head.weight], "lr": lr(h.rank_lr)})
        if h.learn_logit_scale:
            groups.append({"name": "logit_scale", "params": [self.head.logit_scale], "lr": lr(h.logit_scale_lr),
                           "weight_decay": 0.0})
        seen = {id(p) for g in groups for p in g["params"]}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in seen]
        if other:
            groups.append({"name": "other", "params": other})
        return groups

    # ------------------------------------------------------------------ steps
    def image_features(self, x: Tensor) -> Tensor:
        """Image features ``[B, D]`` in the CLIP embedding space (``image_proj(backbone(x))``)."""
        return self.image_proj(self.backbone(x))

    def forward(self, x: Tensor) -> Tensor:
        """Rank logits ``[B, R]`` (float32) for images ``[B, 3, H, W]``."""
        return self.head(self.image_features(x))

    def embed(self, x: Tensor) -> Tensor:
        """L2-normalised image features ``[B, D]``: the space the prototypes live in (for plots)."""
        return F.normalize(self.image_features(x).float(), dim=-1)

    def prototypes(self) -> Tensor:
        """The current ``[R, D]`` unit-norm prototypes (no gradient)."""
        with torch.no_grad():
            return F.normalize(self.head.compute_prototypes().float(), dim=-1)

    def training_step(self, batch: Any, batch_idx: int) -> Tensor:
        x, y = self.split_batch(batch, expect_views=False, owner=type(self).__name__)
        logits = self(x)
        loss, parts = self.criterion.compute(logits, y)
        n = y.shape[0]
        with torch.no_grad():
            pred = logits.argmax(dim=1)
            self.log("train/loss", loss, prog_bar=True, batch_size=n)
            self.log("train/ce", parts["ce"], batch_size=n)
            self.log("train/kl", parts["kl"], batch_size=n)
            self.log("train/acc", (pred == y).float().mean(), batch_size=n)
            self.log("train/mae", (pred - y).abs().float().mean(), batch_size=n)
            if self.hparams.learn_logit_scale:
                self.log("train/logit_scale", self.head.effective_logit_scale().exp(), batch_size=n)
        return loss

    # ------------------------------------------------------------------ frozen-encoder probes
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Record the class, so :mod:`cloc_lightning.probe` finds :meth:`encoder_state_dict`."""
        from cloc_lightning.checkpoints import ENCODER_META_KEY, encoder_metadata

        super().on_save_checkpoint(checkpoint)
        checkpoint[ENCODER_META_KEY] = encoder_metadata(self)

    @classmethod
    def encoder_state_dict(cls, checkpoint: dict[str, Any]) -> dict[str, Tensor]:
        """The probe hook (:mod:`cloc_lightning.probe`): the timm ``backbone`` weights, for ``image_encoder: timm``.

        A CLIP visual tower (``image_encoder: clip``) is not a timm model, so
        ``LinearProbeModule`` / ``cloc-lightning probe`` cannot rebuild it: a clear error.
        """
        hp = checkpoint.get("hyper_parameters") or {}
        if hp.get("image_encoder", "clip") != "timm":
            raise ValueError(
                "this OrdinalCLIPModule checkpoint (image_encoder: clip) holds a CLIP visual tower, not a timm "
                "backbone, so LinearProbeModule / cloc-lightning probe cannot rebuild its encoder; evaluate it with "
                "`cloc-lightning test --ckpt_path ...` or `cloc-lightning export-prototypes`, or train OrdinalCLIP "
                "with image_encoder: timm to probe its backbone"
            )
        state = checkpoint.get("state_dict") or {}
        return {k[len("backbone."):]: v for k, v in state.items() if k.startswith("backbone.")}

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> dict[str, Tensor]:
        """``{'pred': argmax rank, 'expected': sum softmax·rank, 'probs': [B, R], 'target'}``, as the export predicts."""
        x, y = batch if isinstance(batch, (list, tuple)) else (batch, None)
        logits = self(x).float()
        out = {
            "pred": logits.argmax(dim=1),
            "expected": logits_to_predictions(logits, kind="expectation"),
            "probs": logits.softmax(dim=1),
        }
        if y is not None:
            out["target"] = y
        return out

    # ------------------------------------------------------------------ export
    def encoder_builder(self) -> dict[str, Any] | None:
        """How :meth:`PrototypeClassifier.load` re-creates this image encoder (None: pickle it)."""
        h = self.hparams
        if type(self).build_backbone is not OrdinalCLIPModule.build_backbone:
            return None  # a subclass builds its own encoder: only pickling is safe
        if h.image_encoder == "timm":
            return {"name": "timm_projected", "kwargs": {
                "backbone": h.backbone, "embed_dim": int(self.embed_dim), "cifar_stem": bool(h.cifar_stem),
                "backbone_kwargs": copy.deepcopy(dict(h.backbone_kwargs or {})),
            }}
        arch = self._clip_arch()
        if arch is None or "vision_cfg" not in arch:
            return None
        return {"name": "open_clip_visual", "kwargs": {
            "embed_dim": int(arch["embed_dim"]), "vision_cfg": copy.deepcopy(dict(arch["vision_cfg"])),
            "quick_gelu": bool(arch.get("quick_gelu", False)),
        }}

    def image_encoder_module(self) -> nn.Module:
        """A copy of the image encoder as one module ``[B, 3, H, W] -> [B, D]`` (as exported)."""
        if isinstance(self.image_proj, nn.Identity):
            return copy.deepcopy(self.backbone)
        proj = self.image_proj
        assert isinstance(proj, nn.Linear)
        encoder = ProjectedEncoder(copy.deepcopy(self.backbone), proj.in_features, proj.out_features)
        encoder.proj.load_state_dict(proj.state_dict())
        return encoder.to(proj.weight.device)

    def to_prototype_classifier(self, rank_values: Tensor | list[float] | None = None) -> PrototypeClassifier:
        """The inference model: a copy of the image encoder + the R prototypes computed once.

        Its logits equal this module's ``forward`` (eval mode) on the same images.

        Args:
            rank_values: ``[R]`` value of each rank for ``predict`` (default ``0..R-1``).
        """
        with torch.no_grad():
            prototypes = self.head.compute_prototypes().float().cpu()
            scale = self.head.effective_logit_scale().detach().cpu()
        encoder = self.image_encoder_module().cpu().eval()
        return PrototypeClassifier(encoder, prototypes, scale, rank_values, self.encoder_builder()).eval()

    def export_prototypes(
        self, path: str | os.PathLike[str], rank_values: Tensor | list[float] | None = None
    ) -> PrototypeClassifier:
        """Write image encoder + ``[R, D]`` prototypes to ``path`` (no text encoder); return the classifier.

        Load with :meth:`PrototypeClassifier.load(path) <cloc_lightning.nn.prompt_learner.PrototypeClassifier.load>`
        (CLIP visual towers and timm encoders are stored as state dicts + a builder, loadable with
        ``weights_only=True``; a ``timm`` encoder needs ``import cloc_lightning.methods`` first,
        which registers its builder).

        Args:
            path: output file.
            rank_values: ``[R]`` value of each rank for ``predict`` (default ``0..R-1``).
        """
        clf = self.to_prototype_classifier(rank_values)
        parent = os.path.dirname(os.path.abspath(os.fspath(path)))
        os.makedirs(parent, exist_ok=True)
        clf.save(os.fspath(path))
        return clf


def _embed_dim(clip_model: nn.Module) -> int:
    """CLIP's joint embedding width D (the text projection's output width)."""
    proj = getattr(clip_model, "text_projection", None)
    if isinstance(proj, Tensor) and proj.dim() == 2:
        return int(proj.shape[1])
    if isinstance(proj, nn.Linear):
        return int(proj.out_features)
    text = getattr(clip_model, "text", None)
    if text is not None and getattr(text, "output_dim", None):
        return int(text.output_dim)
    raise ValueError(f"cannot find the embedding width of {type(clip_model).__name__}; use an open_clip CLIP model")


# --------------------------------------------------------------------------------------------
# `cloc-lightning export-prototypes CKPT OUT`
# --------------------------------------------------------------------------------------------


def _count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def export_prototypes_main(argv: list[str] | None = None) -> PrototypeClassifier:
    """``cloc-lightning export-prototypes CKPT OUT``: OrdinalCLIP checkpoint → PrototypeClassifier file.

    Loads the :class:`OrdinalCLIPModule` checkpoint on CPU (when the checkpoint holds the text
    encoder weights, CLIP is re-created with ``pretrained=None`` and filled from the checkpoint:
    no download), computes the R prototypes once and writes image encoder + prototypes.
    """
    parser = argparse.ArgumentParser(
        prog="cloc-lightning export-prototypes",
        description="Export an OrdinalCLIP checkpoint as image encoder + R language prototypes "
        "(PrototypeClassifier): no text encoder needed at inference, the cost of a linear head.",
    )
    parser.add_argument("ckpt", help="OrdinalCLIPModule checkpoint (.ckpt) written by `cloc-lightning fit`")
    parser.add_argument("out", help="output file (.pt), loaded with PrototypeClassifier.load(out)")
    parser.add_argument("--rank-offset", type=float, default=0.0,
                        help="value of rank 0 for predict(): rank_values = offset + arange(R) (e.g. min_age)")
    parser.add_argument("--rank-step", type=float, default=1.0, help="spacing of the rank values (default 1)")
    args = parser.parse_args(argv)
    if not os.path.isfile(args.ckpt):
        parser.error(f"checkpoint {args.ckpt!r} does not exist")
    ckpt = torch.load(args.ckpt, map_location="cpu", weights_only=False)
    hp = ckpt.get("hyper_parameters", {}) if isinstance(ckpt, dict) else {}
    state = ckpt.get("state_dict", {}) if isinstance(ckpt, dict) else {}
    if "clip_model" not in hp or not any(k.startswith("head.") for k in state):
        parser.error(f"{args.ckpt!r} is not an OrdinalCLIPModule checkpoint (no clip_model hyper-parameter or head)")
    overrides: dict[str, Any] = {"init_from": None}
    if any(".text_encoder." in k for k in state) or hp.get("head") == "linear":
        overrides["pretrained"] = None  # every weight is in the checkpoint: do not fetch pretrained CLIP
    model = OrdinalCLIPModule.load_from_checkpoint(args.ckpt, map_location="cpu", **overrides).eval()
    R = model.num_classes
    values = args.rank_offset + args.rank_step * torch.arange(R, dtype=torch.float32)
    clf = model.export_prototypes(args.out, rank_values=values)
    n_enc, n_module = _count(clf.image_encoder), _count(model)
    D = clf.prototypes.shape[1]
    print(
        f"exported {R} prototypes (D={D}) + image encoder to {args.out} "
        f"({os.path.getsize(args.out) / 2**20:.1f} MiB)\n"
        f"  parameters: image encoder {n_enc:,} + prototypes {R * D:,} (a linear head would have {R * D + R:,}); "
        f"training module incl. frozen text encoder {n_module:,}\n"
        f"  load: PrototypeClassifier.load({args.out!r}); predict(images) -> rank values "
        f"{float(values[0]):g}..{float(values[-1]):g}"
    )
    return clf
