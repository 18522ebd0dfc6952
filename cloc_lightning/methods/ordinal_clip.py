"""OrdinalCLIP: ordinal regression as image–language matching with learned rank prompts.

Li, Huang, Zhu, Tang, Li, Zhou, Lu. *OrdinalCLIP: Learning Rank Prompts for Language-Guided
Ordinal Regression*, NeurIPS 2022 (arXiv 2206.02338); reference code
https://github.com/xk-huang/OrdinalCLIP (``ordinalclip/models/ordinalclip.py``,
``ordinalclip/models/baseline.py``, ``ordinalclip/runner/runner.py``).

Every rank r has a prompt ``[SOT] context rank_r . [EOT]`` whose feature from CLIP's frozen
text encoder is the rank's *language prototype* ``t_r`` (:class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner`).
An image with features ``f`` gets the logits ``exp(logit_scale) * cos(f, t_r)`` for ``r = 0..R-1``
(:class:`~cloc_lightning.nn.prototypes.RankPromptHead`), trained with CE over ranks + KL over
the batch per rank (:class:`~cloc_lightning.losses.rank_prompt.OrdinalCLIPLoss`).  After training
the R prototypes are fixed vectors: :meth:`OrdinalCLIPModule.export_prototypes` (or
``cloc-lightning export-prototypes CKPT OUT``) writes the image encoder + an ``[R, D]`` matrix,
which predicts at the cost of a linear head with no text encoder in memory
(:class:`~cloc_lightning.nn.prototype_classifier.PrototypeClassifier`).

This module is one :class:`~cloc_lightning.methods.classifier.ClassifierModule`: ``forward(images)``
returns ``[B, R]`` logits, so the shared ordinal metrics (argmax MAE, expected-rank MAE,
accuracy, QWK, ±1 accuracy), validation/test/predict steps and checkpointing apply unchanged.
The network pieces (prompt learner, frozen text encoder, prototype heads, exported classifier)
live in :mod:`cloc_lightning.nn`; the how-to is ``docs/methods/ordinal_clip.md``.
"""

from __future__ import annotations

import copy
import os
from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cloc_lightning.losses.rank_prompt import OrdinalCLIPLoss
from cloc_lightning.methods.classifier import ClassifierModule
from cloc_lightning.methods.optim import OptimizerName
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.nn.clip import load_clip, resolve_clip_model
from cloc_lightning.nn.encoders import ProjectedEncoder
from cloc_lightning.nn.prompt_learner import InterpolationKind, RankPosition, RankPromptLearner, rank_interpolation_weights
from cloc_lightning.nn.prototype_classifier import PrototypeClassifier
from cloc_lightning.nn.prototypes import (
    MAX_LOGIT_SCALE,
    LinearPrototypeHead,
    PrototypeHead,
    RankPromptHead,
    logits_to_predictions,
)
from cloc_lightning.nn.text_encoder import clip_embed_dim
from cloc_lightning.validation import check_choice, check_float

__all__ = [
    "OrdinalCLIPModule",
    "ImageEncoderKind",
    "HeadKind",
]

#: the image encoder: CLIP's visual tower, or a timm backbone projected to the CLIP width
ImageEncoderKind = Literal["clip", "timm"]
#: the head: language prototypes from rank prompts, or R freely learned prototypes (no language)
HeadKind = Literal["prompts", "linear"]


@dataclass
class _LoadedCLIP:
    """What :meth:`OrdinalCLIPModule.build_backbone` hands to :meth:`~OrdinalCLIPModule.build_head`.

    A plain object, not an ``nn.Module``: stored on the module it is not registered as a child,
    so the whole CLIP model (text tower included) does not become part of the module; only what
    the head keeps of it does.
    """

    model: nn.Module
    tokenizer: Any
    logit_scale: float


class OrdinalCLIPModule(ClassifierModule):
    """OrdinalCLIP (Li et al., NeurIPS 2022): learned rank prompts on a frozen CLIP text encoder.

    ``forward(images [B, 3, H, W]) -> logits [B, R]`` with
    ``logits = exp(logit_scale) * cos(image_encoder(x), t_r)``, ``t_r`` the text feature of rank
    r's prompt; loss ``ce_weight * CE + kl_weight * KL``
    (:class:`~cloc_lightning.losses.rank_prompt.OrdinalCLIPLoss`).  Predictions: the argmax
    rank and the expectation ``sum_r softmax_r * r``; the shared ordinal metrics report both
    (``mae`` and ``mae_expected``).

    Parts: ``backbone`` (CLIP's visual tower, or a timm network) and ``image_proj`` (identity, or
    ``Linear(F, D)`` to the CLIP width D for ``image_encoder: timm``) form the image encoder;
    ``head`` is a :class:`~cloc_lightning.nn.prototypes.RankPromptHead` (its prompt learner
    holds the frozen text encoder: ``requires_grad=False``, always in eval mode, in no optimiser
    group) or, with ``head: linear``, a :class:`~cloc_lightning.nn.prototypes.LinearPrototypeHead`
    (no text encoder).  :meth:`param_groups` gives each trained part its own learning rate.
    CLIP is loaded once in :meth:`build_backbone`, which hands it to :meth:`build_head`.
    DDP needs no all-gather: every process computes the same prototypes, CE is per image and
    the KL term runs over the local batch, as in the reference.

    Recipes, the reference's settings and the export: ``docs/methods/ordinal_clip.md``.

    Args:
        num_classes: number of ranks R (>= 2); must match the data module.
        clip_model: open_clip model name whose text tower (and, with ``image_encoder: clip``,
            visual tower) is used, e.g. ``ViT-S-32-alt``, ``RN50-quickgelu`` (the reference's
            default). With a ``pretrained`` tag trained with QuickGELU (every ``openai`` tag) a plain
            name is built as its ``-quickgelu`` variant
            (:func:`~cloc_lightning.nn.clip.resolve_clip_model`), and ``hparams.clip_model`` records
            the variant built, so that reloads rebuild the same activation.
        pretrained: ``None`` (random init, no language prior), an open_clip tag (``openai``) or a
            local checkpoint path.
        clip_config: overrides of the open_clip model config of ``clip_model`` (top-level keys
            replace the named config's), as ``open_clip.create_model(clip_model, **clip_config)``;
            ``pretrained`` must then be ``None`` or a path.
        image_encoder: ``clip`` (CLIP's visual tower) or ``timm`` (``backbone`` + a Linear
            projection to the CLIP embedding width D).
        backbone_pretrained: timm weights for ``image_encoder: timm`` (``False``, ``True`` or a path).
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
            model's (log 100 for OpenAI weights), with ``head: linear`` log 100.
        learn_logit_scale: learn it (clamped at log 100); frozen by default as in the reference.
        ce_weight: weight of the CE term.
        kl_weight: weight of the KL term.
        target_sharpness: sharpness of the KL soft targets (reference: 10).
        check_finite: raise a clear error on NaN/inf logits (one device sync per step).
        context_lr: lr of the context tokens (default ``lr``).
        rank_lr: lr of the base rank embeddings, or of the prototypes with ``head: linear``
            (default ``lr``).
        image_encoder_lr: lr of the image encoder (default ``lr``).
        logit_scale_lr: lr of a learned logit scale (default ``lr``; no weight decay).
        optimizer: ``radam`` (the reference's and this module's default; decoupled weight
            decay, see :meth:`build_optimizer`) | ``adam`` | ``adamw`` | ``sgd``.
        lr: base learning rate (the reference's and this module's default: 1e-4 for every group).
        backbone: timm model name for ``image_encoder: timm`` (unused with CLIP's visual tower).
        cifar_stem: 3x3 stem without max-pool for the timm backbone (32 px images).
        backbone_kwargs: extra ``timm.create_model`` arguments of the timm backbone.
        weight_decay: weight decay of every group except the logit scale.
        **kwargs: the :class:`~cloc_lightning.methods.classifier.ClassifierModule` /
            :class:`~cloc_lightning.methods.base.BaseModule` arguments (``task``, the optimiser and
            schedule, ``init_from``, ...).

    The four arguments after ``lr`` are the base class's, with its defaults, declared here for
    their meaning in this module (``--model.help OrdinalCLIPModule`` shows this text).
    """

    head: PrototypeHead
    #: the CLIP parts between build_backbone and build_head (None outside construction)
    _loaded_clip: _LoadedCLIP | None

    def __init__(
        self,
        num_classes: int,
        clip_model: str = "ViT-S-32-alt",
        pretrained: str | None = None,
        clip_config: dict[str, Any] | None = None,
        image_encoder: ImageEncoderKind = "clip",
        backbone_pretrained: bool | str = False,
        head: HeadKind = "prompts",
        num_base_ranks: int = 3,
        num_tokens_per_rank: int = 1,
        num_context_tokens: int = 10,
        init_context: str | None = None,
        rank_specific_context: bool = False,
        init_rank_names: list[str] | None = None,
        interpolation: InterpolationKind = "linear",
        rank_position: RankPosition = "tail",
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
        *,
        optimizer: OptimizerName = "radam",
        lr: float = 1e-4,
        backbone: str = "resnet18",
        cifar_stem: bool = False,
        backbone_kwargs: dict[str, Any] | None = None,
        weight_decay: float = 0.0,
        **kwargs: Any,
    ) -> None:
        # cheap checks first: a config error must not wait for a CLIP model to be built
        check_choice("image_encoder", image_encoder, ImageEncoderKind)
        check_choice("head", head, HeadKind)
        if clip_config is not None and not isinstance(clip_config, dict):
            raise TypeError(f"clip_config must be a dict of open_clip model-config overrides, got {type(clip_config).__name__}")
        if clip_config and pretrained is not None and not os.path.isfile(os.path.expanduser(str(pretrained))):
            raise ValueError(
                f"clip_config changes the architecture of {clip_model!r}, so pretrained={pretrained!r} (a tag of the "
                "named architecture) cannot be loaded into it; use pretrained: null or a checkpoint file path"
            )
        for name, value in (
            ("context_lr", context_lr),
            ("rank_lr", rank_lr),
            ("image_encoder_lr", image_encoder_lr),
            ("logit_scale_lr", logit_scale_lr),
        ):
            if value is not None:
                check_float(name, value, minimum=0.0, allow_inf=True, expect="a number >= 0 (or null for the base lr)")
        if logit_scale is not None:
            check_float("logit_scale", logit_scale, hint="it is the log of the logit multiplier")
        if head == "prompts":
            check_choice("interpolation", interpolation, InterpolationKind)
            check_choice("rank_position", rank_position, RankPosition)
            if isinstance(num_classes, int) and not isinstance(num_classes, bool) and num_classes >= 2:
                rank_interpolation_weights(num_classes, num_base_ranks, interpolation)  # validates R, B
        loss_kwargs: dict[str, Any] = dict(
            ce_weight=ce_weight, kl_weight=kl_weight, target_sharpness=target_sharpness, check_finite=check_finite
        )
        OrdinalCLIPLoss(**loss_kwargs)  # validates the weights before anything is built
        super().__init__(
            num_classes=num_classes,
            optimizer=optimizer,
            lr=lr,
            backbone=backbone,
            cifar_stem=cifar_stem,
            backbone_kwargs=backbone_kwargs,
            weight_decay=weight_decay,
            **kwargs,
        )
        self._loaded_clip = None  # build_head has taken what it needs; a subclass's head may not have
        #: projection of timm features to D (identity for CLIP's visual tower, which ends at D)
        self.image_proj: nn.Module = nn.Linear(self.feature_dim, self.embed_dim) if image_encoder == "timm" else nn.Identity()
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

    def _load_clip(self) -> tuple[Any, Any]:
        """``(open_clip model, tokenizer)`` as configured (``clip_model``, ``pretrained``, ``clip_config``)."""
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
        self.embed_dim = clip_embed_dim(clip_model)  #: D, the CLIP embedding width shared by both towers
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
        self._loaded_clip = _LoadedCLIP(clip_model, tokenizer, scale)  # for build_head, which drops it
        return encoder, width

    def build_head(self) -> PrototypeHead:
        """:class:`RankPromptHead` (``head: prompts``) or :class:`LinearPrototypeHead` (``head: linear``)."""
        h = self.hparams
        loaded, self._loaded_clip = self._loaded_clip, None
        if loaded is None:
            raise RuntimeError("build_head needs the CLIP model that build_backbone loads; call build_backbone first")
        scale = loaded.logit_scale
        if h.head == "linear":
            return LinearPrototypeHead(self.num_classes, self.embed_dim, scale, h.learn_logit_scale)
        prompts = RankPromptLearner(
            loaded.model,
            num_ranks=self.num_classes,
            num_base_ranks=h.num_base_ranks,
            num_tokens_per_rank=h.num_tokens_per_rank,
            num_context_tokens=h.num_context_tokens,
            init_context=h.init_context,
            rank_specific_context=h.rank_specific_context,
            init_rank_names=h.init_rank_names,
            interpolation=h.interpolation,
            rank_position=h.rank_position,
            tokenizer=loaded.tokenizer,
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
        data = self.datamodule_info
        if self.hparams.image_encoder != "clip" or data is None:
            return
        want, got = getattr(self.backbone, "image_size", None), data.image_size

        def pair(v: Any) -> tuple[Any, ...]:
            return tuple(v) if isinstance(v, (list, tuple)) else (v, v)

        if want is not None and got is not None and pair(want) != pair(got):
            raise ValueError(
                f"CLIP's visual tower of {self.hparams.clip_model!r} takes {pair(want)[0]}x{pair(want)[1]} px images "
                f"(its positional embedding has a fixed size) but {data.name} gives image_size={got}; set "
                f"--data.image_size {pair(want)[0]}, or use --model.image_encoder timm for other sizes"
            )

    # ------------------------------------------------------------------ optimiser
    def build_optimizer(self, groups: list[dict[str, Any]]) -> torch.optim.Optimizer:
        """As :class:`~cloc_lightning.methods.base.BaseModule`, but ``radam`` decays weights decoupled.

        The reference's RAdam (``ordinalclip/runner/optim/custom_optim/radam.py``, Liu et al.)
        applies weight decay as ``p ← p − lr·wd·p``; ``torch.optim.RAdam`` does that with
        ``decoupled_weight_decay=True`` (its default adds ``wd·p`` to the gradient instead).
        Same result with ``weight_decay: 0``.  ``optimizer_foreach`` reaches it; RAdam has no fused kernel.
        """
        h = self.hparams
        if h.optimizer == "radam":
            return torch.optim.RAdam(
                groups,
                lr=h.lr,
                weight_decay=h.weight_decay,
                decoupled_weight_decay=True,
                **self.optimizer_options(torch.optim.RAdam),
            )
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
            groups.append({"name": "logit_scale", "params": [self.head.logit_scale], "lr": lr(h.logit_scale_lr), "weight_decay": 0.0})
        seen = {id(p) for g in groups for p in g["params"]}
        other = [p for p in self.parameters() if p.requires_grad and id(p) not in seen]
        if other:
            groups.append({"name": "other", "params": other})
        return groups

    # ------------------------------------------------------------------ steps
    def image_features(self, x: Tensor) -> Tensor:
        """Image features ``[B, D]`` in the CLIP embedding space (``image_proj(backbone(x))``)."""
        features: Tensor = self.image_proj(self.backbone(x))
        return features

    def forward(self, x: Tensor) -> Tensor:
        """Rank logits ``[B, R]`` (float32) for images ``[B, 3, H, W]``."""
        logits: Tensor = self.head(self.image_features(x))
        return logits

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
    # (BaseModule.on_save_checkpoint records the class, so cloc_lightning.checkpoints finds this hook)
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
        return {k[len("backbone.") :]: v for k, v in state.items() if k.startswith("backbone.")}

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
        """How :meth:`PrototypeClassifier.load` re-creates this image encoder (None: pickle it).

        ``{"name": <a builder of cloc_lightning.nn.encoders.ENCODER_BUILDERS>, "kwargs": {...}}``.
        """
        h = self.hparams
        if type(self).build_backbone is not OrdinalCLIPModule.build_backbone:
            return None  # a subclass builds its own encoder: only pickling is safe
        if h.image_encoder == "timm":
            return {
                "name": "timm_projected",
                "kwargs": {
                    "backbone": h.backbone,
                    "embed_dim": int(self.embed_dim),
                    "cifar_stem": bool(h.cifar_stem),
                    "backbone_kwargs": copy.deepcopy(dict(h.backbone_kwargs or {})),
                },
            }
        arch = self._clip_arch()
        if arch is None or "vision_cfg" not in arch:
            return None
        return {
            "name": "open_clip_visual",
            "kwargs": {
                "embed_dim": int(arch["embed_dim"]),
                "vision_cfg": copy.deepcopy(dict(arch["vision_cfg"])),
                "quick_gelu": bool(arch.get("quick_gelu", False)),
            },
        }

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

    def export_prototypes(self, path: str | os.PathLike[str], rank_values: Tensor | list[float] | None = None) -> PrototypeClassifier:
        """Write image encoder + ``[R, D]`` prototypes to ``path`` (no text encoder); return the classifier.

        Load with :meth:`PrototypeClassifier.load(path) <cloc_lightning.nn.prototype_classifier.PrototypeClassifier.load>`
        (CLIP visual towers and timm encoders are stored as state dicts + a builder registered in
        :mod:`cloc_lightning.nn.encoders`, loadable with ``weights_only=True``).

        Args:
            path: output file.
            rank_values: ``[R]`` value of each rank for ``predict`` (default ``0..R-1``).
        """
        clf = self.to_prototype_classifier(rank_values)
        parent = os.path.dirname(os.path.abspath(os.fspath(path)))
        os.makedirs(parent, exist_ok=True)
        clf.save(os.fspath(path))
        return clf
