"""The exported OrdinalCLIP classifier and its file format: an image encoder and R fixed prototypes, no text encoder.

After training, OrdinalCLIP's R prototypes are fixed vectors: :class:`PrototypeClassifier` holds an
image encoder and the ``[R, D]`` matrix, the cost of a linear head, with its own file format
(:meth:`PrototypeClassifier.save` / :meth:`PrototypeClassifier.load`).  An image encoder is
stored as a state dict plus the name and arguments of a builder registered in
:data:`~cloc_lightning.nn.encoders.ENCODER_BUILDERS` (``open_clip_visual``, ``timm_projected``,
or your own via :func:`~cloc_lightning.nn.encoders.register_encoder_builder`), so loading needs no
pickled code.

Reference: OrdinalCLIP (Li et al., NeurIPS 2022, arXiv 2206.02338),
https://github.com/xk-huang/OrdinalCLIP (``ordinalclip/models/ordinalclip.py``).
"""

from __future__ import annotations

import pickle
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cloc_lightning.nn.encoders import get_encoder_builder
from cloc_lightning.nn.prototypes import PredictionKind, logits_to_predictions

if TYPE_CHECKING:
    from cloc_lightning.nn.prompt_learner import RankPromptLearner

__all__ = ["PrototypeClassifier"]

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

    * with ``encoder_builder={"name": ..., "kwargs": {...}}`` (a name in :data:`~cloc_lightning.nn.encoders.ENCODER_BUILDERS`,
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
            get_encoder_builder(encoder_builder.get("name"))  # an unknown name: the error names the registered ones
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
            raise ValueError(f"image encoder gives features of shape {tuple(feats.shape)}, expected [N, {self.prototypes.shape[1]}]")
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
    def load(cls, path: str | Any, map_location: str | torch.device = "cpu", allow_pickle: bool = True) -> PrototypeClassifier:
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
            raise ValueError(f"{path} has format version {payload['version']} > {_FORMAT_VERSION}; upgrade cloc-lightning")
        builder = payload.get("encoder_builder")
        if builder is not None:
            encoder = get_encoder_builder(builder["name"], needed_by=str(path))(**builder["kwargs"])
            encoder.load_state_dict(payload["encoder_state_dict"])
        else:
            encoder = payload["encoder_module"]
        clf = cls(encoder, payload["prototypes"], payload["logit_scale"], payload["rank_values"], builder)
        with torch.no_grad():  # stored already normalised: keep the exact bits (no second normalisation)
            clf.prototypes.copy_(payload["prototypes"])
        return clf.to(map_location).eval()
