"""Prototype heads and the exported prototype classifier (OrdinalCLIP).

An image with features ``f`` [N, D] gets the logits ``exp(logit_scale) * cos(f, p_r)``
against R prototypes ``p_r`` [R, D]:

* in training, :class:`RankPromptHead` computes the prototypes as the text features of the
  learned rank prompts (:class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner`), and
  :class:`LinearPrototypeHead` learns them freely (the reference's language-free baseline);
* after training they are fixed vectors: :class:`PrototypeClassifier` holds an image encoder
  and the ``[R, D]`` matrix, the cost of a linear head, with its own file format
  (:meth:`PrototypeClassifier.save` / :meth:`PrototypeClassifier.load`).  An image encoder is
  stored as a state dict plus the name and arguments of a builder registered in
  :data:`ENCODER_BUILDERS` (``open_clip_visual``, ``timm_projected``, or your own via
  :func:`register_encoder_builder`), so loading needs no pickled code.

Reference: OrdinalCLIP (Li et al., NeurIPS 2022, arXiv 2206.02338),
https://github.com/xk-huang/OrdinalCLIP (``ordinalclip/models/ordinalclip.py``, ``baseline.py``).
"""

from __future__ import annotations

import math
import pickle
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cloc_lightning.losses.base import compute_dtype, upcast
from cloc_lightning.nn.backbones import create_backbone
from cloc_lightning.validation import check_choice

if TYPE_CHECKING:
    from cloc_lightning.nn.prompt_learner import RankPromptLearner

__all__ = [
    "MAX_LOGIT_SCALE",
    "PredictionKind",
    "ENCODER_BUILDERS",
    "register_encoder_builder",
    "ProjectedEncoder",
    "build_timm_projected",
    "PrototypeHead",
    "RankPromptHead",
    "LinearPrototypeHead",
    "PrototypeClassifier",
    "logits_to_predictions",
]

#: upper bound of a *learned* logit scale (log of 100), as CLIP clamps its own
MAX_LOGIT_SCALE = math.log(100.0)

#: how rank logits become a prediction: the expected rank value or the arg-max rank's value
PredictionKind = Literal["expectation", "argmax"]


# --------------------------------------------------------------------------------------------
# image-encoder builders (what an export records to rebuild its encoder without pickling)
# --------------------------------------------------------------------------------------------

#: Builders that re-create an image encoder's architecture from JSON-like kwargs when loading an
#: exported :class:`PrototypeClassifier` (no pickled code needed). Register your own with
#: :func:`register_encoder_builder`.
ENCODER_BUILDERS: dict[str, Callable[..., nn.Module]] = {}


def register_encoder_builder(name: str, builder: Callable[..., nn.Module] | None = None) -> Any:
    """Register ``builder(**kwargs) -> nn.Module`` under ``name`` (usable as a decorator)."""

    def deco(fn: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        ENCODER_BUILDERS[name] = fn
        return fn

    return deco(builder) if builder is not None else deco


def _open_clip_visual(**kwargs: Any) -> nn.Module:
    from cloc_lightning.nn.clip import build_open_clip_visual

    return build_open_clip_visual(**kwargs)


register_encoder_builder("open_clip_visual", _open_clip_visual)


class ProjectedEncoder(nn.Module):
    """A feature extractor followed by a linear projection to the CLIP embedding width D.

    ``forward(x [B, 3, H, W]) -> [B, D]`` = ``proj(encoder(x))``: the image encoder of
    ``image_encoder: timm`` as one module, as exported (in
    :class:`~cloc_lightning.methods.ordinal_clip.OrdinalCLIPModule` the two parts are ``backbone``
    and ``image_proj``, so that ``backbone.*`` is a bare timm network like in every other module).  The reference replaces ``clip_model.visual`` by a torchvision network with
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
        features: Tensor = self.proj(self.encoder(x))
        return features


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


class PrototypeHead(nn.Module):
    """``logits = exp(logit_scale) * normalize(features) @ normalize(prototypes)ᵀ`` (float32; float64 under ``64-true``).

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
            return upcast(self.logit_scale).clamp(max=MAX_LOGIT_SCALE)
        return upcast(self.logit_scale)

    def train(self, mode: bool = True) -> PrototypeHead:  # also drops the cache
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
        """``[R, D]`` float32 (float64 under ``64-true``) unit-norm prototypes (cached in eval mode without gradients)."""
        use_cache = not self.training and not torch.is_grad_enabled()
        if not use_cache:
            self._cache = None
            return F.normalize(upcast(self.compute_prototypes()), dim=-1)
        key = self._cache_key(device or self.logit_scale.device)
        if self._cache is None or self._cache[0] != key:
            self._cache = (key, F.normalize(upcast(self.compute_prototypes()), dim=-1))
        return self._cache[1]

    def forward(self, features: Tensor) -> Tensor:
        """``[B, D]`` image features → ``[B, R]`` float32 logits (float64 when the features or prototypes are float64)."""
        prototypes = self.normalized_prototypes(features.device)
        with torch.autocast(features.device.type, enabled=False):  # similarities in float32 (float64 under 64-true)
            feats = F.normalize(features.to(compute_dtype(features, prototypes)), dim=-1)
            prototypes = prototypes.to(feats.dtype)
            return self.effective_logit_scale().exp() * (feats @ prototypes.t())


class RankPromptHead(PrototypeHead):
    """OrdinalCLIP's head: prototypes are the text features of the R rank prompts.

    Args:
        prompt_learner: the :class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner` (its ``forward()``
            gives ``[R, D]``).
        logit_scale: log of the logit multiplier (CLIP's ``logit_scale``).
        learn_logit_scale: make it a parameter (clamped at log 100) instead of a buffer.
    """

    def __init__(self, prompt_learner: RankPromptLearner, logit_scale: float, learn_logit_scale: bool = False) -> None:
        super().__init__(logit_scale, learn_logit_scale)
        self.prompt_learner = prompt_learner

    def compute_prototypes(self) -> Tensor:
        """``[R, D]`` language prototypes (R prompts through the frozen text encoder)."""
        prototypes: Tensor = self.prompt_learner()  # a call, not .forward(): hooks see it
        return prototypes


class LinearPrototypeHead(PrototypeHead):
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
# exported classifier
# --------------------------------------------------------------------------------------------

_FORMAT = "cloc_lightning.PrototypeClassifier"
_FORMAT_VERSION = 1


class PrototypeClassifier(nn.Module):
    """Image encoder + fixed language prototypes: OrdinalCLIP at inference, no text encoder.

    ``logits = exp(logit_scale) * cos(image_encoder(x), prototypes)``: one ``[N, D] x [D, R]``
    matmul on the normalised image features, i.e. the cost of a linear head (the prototypes
    are stored already L2-normalised). The paper (arXiv 2206.02338) points out that only the
    language prototypes need to be kept, with zero extra cost over a linear head; reference
    ``OrdinalCLIP.forward`` (``logit_scale.exp() * image @ text.T``).

    Buffers: ``prototypes`` ``[R, D]`` (unit rows), ``logit_scale`` (scalar, the *log* of the
    multiplier, like CLIP's ``logit_scale``), ``rank_values`` ``[R]`` (the value of each rank
    used by predictions, default ``0..R-1``).

    File format (:meth:`save` / :meth:`load`), a ``torch.save`` dict:

    * with ``encoder_builder={"name": ..., "kwargs": {...}}`` (a name in :data:`ENCODER_BUILDERS`,
      e.g. ``"open_clip_visual"`` with ``{"clip_model": "ViT-B-32"}``), the image encoder is
      stored as its ``state_dict`` + builder name/kwargs and loaded with
      ``torch.load(weights_only=True)``: no pickled code, robust across library versions as
      long as the architecture is unchanged;
    * without a builder, the image encoder module is pickled whole (works for any module, e.g.
      a timm backbone + projection); loading then needs ``weights_only=False``, the defining
      classes importable, and is for files you trust (``load(..., allow_pickle=True)``, default).

    Args:
        image_encoder: module mapping images ``[N, ...]`` to features ``[N, D]``.
        prototypes: ``[R, D]`` language prototypes (normalised here).
        logit_scale: log of the logit multiplier (CLIP's ``model.logit_scale``, e.g. ``log(100)``).
        rank_values: ``[R]`` value of each rank (e.g. ages), default ``arange(R)``.
        encoder_builder: ``{"name": str, "kwargs": dict}`` to rebuild ``image_encoder`` on load.

    Example:
        >>> clf = PrototypeClassifier.from_prompt_learner(image_encoder, prompt_learner,
        ...                                               logit_scale=clip.logit_scale)  # doctest: +SKIP
        >>> clf.save("ordinalclip_export.pt")
        >>> clf = PrototypeClassifier.load("ordinalclip_export.pt")
        >>> ages = clf.predict(images)                    # [N] expected rank values
    """

    prototypes: Tensor
    logit_scale: Tensor
    rank_values: Tensor

    def __init__(
        self,
        image_encoder: nn.Module,
        prototypes: Tensor,
        logit_scale: float | Tensor,
        rank_values: Tensor | Sequence[float] | None = None,
        encoder_builder: dict[str, Any] | None = None,
    ) -> None:
        super().__init__()
        if not isinstance(image_encoder, nn.Module):
            raise TypeError(f"image_encoder must be an nn.Module, got {type(image_encoder).__name__}")
        prototypes = torch.as_tensor(prototypes).detach()
        if prototypes.dim() != 2 or prototypes.shape[0] < 2:
            raise ValueError(f"prototypes must be [R, D] with R >= 2, got shape {tuple(prototypes.shape)}")
        if not torch.isfinite(prototypes).all():
            raise ValueError("prototypes contain NaN/inf (diverged training?); re-export from a finite checkpoint")
        R = prototypes.shape[0]
        if rank_values is None:
            rank_values = torch.arange(R, dtype=torch.float32)
        rank_values = torch.as_tensor(rank_values, dtype=torch.float32).detach().clone()
        if rank_values.shape != (R,):
            raise ValueError(f"rank_values must have shape [{R}], got {tuple(rank_values.shape)}")
        if encoder_builder is not None:
            if not isinstance(encoder_builder, dict) or set(encoder_builder) - {"name", "kwargs"}:
                raise ValueError("encoder_builder must be {'name': <registered builder>, 'kwargs': {...}}")
            if encoder_builder.get("name") not in ENCODER_BUILDERS:
                raise ValueError(
                    f"unknown encoder builder {encoder_builder.get('name')!r}; registered: {sorted(ENCODER_BUILDERS)}"
                )
            encoder_builder = {"name": encoder_builder["name"], "kwargs": dict(encoder_builder.get("kwargs") or {})}
        self.image_encoder = image_encoder
        self.encoder_builder = encoder_builder
        self.register_buffer("prototypes", F.normalize(prototypes.float(), dim=-1))
        scale = torch.as_tensor(logit_scale, dtype=torch.float32).detach().clone().reshape(())
        self.register_buffer("logit_scale", scale)
        self.register_buffer("rank_values", rank_values)

    @classmethod
    def from_prompt_learner(
        cls,
        image_encoder: nn.Module,
        prompt_learner: RankPromptLearner,
        logit_scale: float | Tensor,
        rank_values: Tensor | Sequence[float] | None = None,
        encoder_builder: dict[str, Any] | None = None,
    ) -> PrototypeClassifier:
        """Compute the R prototypes once (no grad) and wrap them with ``image_encoder``.

        Args:
            image_encoder: the trained image encoder (features ``[N, D]``).
            prompt_learner: the trained :class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner` (its
                ``forward()`` gives ``[R, D]``).
            logit_scale: log of the multiplier used in training (CLIP's ``logit_scale``).
            rank_values: ``[R]`` rank values, default ``arange(R)``.
            encoder_builder: see the class docstring.
        """
        with torch.no_grad():
            prototypes = prompt_learner().float().cpu()
        return cls(image_encoder, prototypes, logit_scale, rank_values, encoder_builder)

    @property
    def num_ranks(self) -> int:
        """R."""
        return int(self.prototypes.shape[0])

    def forward(self, images: Tensor) -> Tensor:
        """``[N, ...]`` images → ``[N, R]`` float32 logits ``exp(logit_scale) * cos(f(x), prototypes)``."""
        feats = self.image_encoder(images)
        if feats.dim() != 2 or feats.shape[1] != self.prototypes.shape[1]:
            raise ValueError(
                f"image encoder gives features of shape {tuple(feats.shape)}, expected [N, {self.prototypes.shape[1]}]"
            )
        return self.logits_from_features(feats)

    def logits_from_features(self, features: Tensor) -> Tensor:
        """``[N, D]`` image features → ``[N, R]`` float32 logits."""
        feats = F.normalize(features.float(), dim=-1)
        return self.logit_scale.exp() * (feats @ self.prototypes.t())

    @torch.no_grad()
    def predict(self, images: Tensor, kind: PredictionKind = "expectation") -> Tensor:
        """Predicted rank values ``[N]`` (float32) for ``[N, ...]`` images.

        ``"expectation"``: ``sum_r softmax(logits)_r * rank_values[r]``; ``"argmax"``:
        ``rank_values[argmax_r logits]`` (the two predictions of the reference's metrics).
        """
        return logits_to_predictions(self(images), self.rank_values, kind)

    # -- file I/O -------------------------------------------------------------------------------
    def save(self, path: str | Any) -> None:
        """Write a self-contained file (see the class docstring for the format)."""
        payload: dict[str, Any] = {
            "format": _FORMAT,
            "version": _FORMAT_VERSION,
            "prototypes": self.prototypes.detach().cpu(),
            "logit_scale": self.logit_scale.detach().cpu(),
            "rank_values": self.rank_values.detach().cpu(),
        }
        if self.encoder_builder is not None:
            payload["encoder_builder"] = self.encoder_builder
            payload["encoder_state_dict"] = {k: v.detach().cpu() for k, v in self.image_encoder.state_dict().items()}
        else:
            payload["encoder_module"] = self.image_encoder
        torch.save(payload, path)

    @classmethod
    def load(
        cls, path: str | Any, map_location: str | torch.device = "cpu", allow_pickle: bool = True
    ) -> PrototypeClassifier:
        """Load a file written by :meth:`save`; the classifier is returned in eval mode.

        Args:
            path: file path.
            map_location: passed to ``torch.load``.
            allow_pickle: allow files that pickle the image encoder (written without
                ``encoder_builder``); unpickling runs code, so only for trusted files.
        """
        try:
            payload = torch.load(path, map_location=map_location, weights_only=True)
        except pickle.UnpicklingError as exc:
            if not allow_pickle:
                raise ValueError(
                    f"{path} stores a pickled image encoder; load it with allow_pickle=True if you trust the file, "
                    "or re-export with an encoder_builder"
                ) from exc
            payload = torch.load(path, map_location=map_location, weights_only=False)
        if not isinstance(payload, dict) or payload.get("format") != _FORMAT:
            raise ValueError(f"{path} is not a PrototypeClassifier export (written by PrototypeClassifier.save)")
        if payload.get("version", 0) > _FORMAT_VERSION:
            raise ValueError(
                f"{path} has format version {payload['version']} > {_FORMAT_VERSION}; upgrade cloc-lightning"
            )
        builder = payload.get("encoder_builder")
        if builder is not None:
            if builder["name"] not in ENCODER_BUILDERS:
                raise ValueError(
                    f"{path} needs the encoder builder {builder['name']!r}, which is not registered; import the "
                    f"module that registers it (registered: {sorted(ENCODER_BUILDERS)})"
                )
            encoder = ENCODER_BUILDERS[builder["name"]](**builder["kwargs"])
            encoder.load_state_dict(payload["encoder_state_dict"])
        else:
            encoder = payload["encoder_module"]
        clf = cls(encoder, payload["prototypes"], payload["logit_scale"], payload["rank_values"], builder)
        with torch.no_grad():  # stored already normalised: keep the exact bits (no second normalisation)
            clf.prototypes.copy_(payload["prototypes"])
        return clf.to(map_location).eval()


def logits_to_predictions(
    logits: Tensor,
    rank_values: Tensor | None = None,
    kind: PredictionKind = "expectation",
) -> Tensor:
    """Rank predictions from ``[N, R]`` logits.

    Args:
        logits: ``[N, R]``.
        rank_values: ``[R]`` value of each rank, default ``arange(R)``.
        kind: ``"expectation"`` (``sum_r softmax_r * value_r``) or ``"argmax"`` (``value[argmax]``).

    Returns:
        ``[N]`` float32 predictions.
    """
    check_choice("kind", kind, PredictionKind)
    logits = logits.float()
    if rank_values is None:
        rank_values = torch.arange(logits.shape[-1], dtype=torch.float32, device=logits.device)
    rank_values = rank_values.to(device=logits.device, dtype=torch.float32)
    if kind == "expectation":
        return torch.softmax(logits, dim=-1) @ rank_values
    return rank_values[logits.argmax(dim=-1)]

