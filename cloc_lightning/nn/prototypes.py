"""Prototype heads (OrdinalCLIP): image features against R prototypes, and rank predictions from the logits.

An image with features ``f`` [N, D] gets the logits ``exp(logit_scale) * cos(f, p_r)``
against R prototypes ``p_r`` [R, D]:

* in training, :class:`RankPromptHead` computes the prototypes as the text features of the
  learned rank prompts (:class:`~cloc_lightning.nn.prompt_learner.RankPromptLearner`), and
  :class:`LinearPrototypeHead` learns them freely (the reference's language-free baseline);
* :func:`logits_to_predictions` turns ``[N, R]`` logits into rank values (expectation or arg-max).

After training the prototypes are fixed vectors: the exported classifier and its file format
are :class:`~cloc_lightning.nn.prototype_classifier.PrototypeClassifier`.

Reference: OrdinalCLIP (Li et al., NeurIPS 2022, arXiv 2206.02338),
https://github.com/xk-huang/OrdinalCLIP (``ordinalclip/models/ordinalclip.py``, ``baseline.py``).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from cloc_lightning.losses.base import compute_dtype, upcast
from cloc_lightning.validation import check_choice

if TYPE_CHECKING:
    from cloc_lightning.nn.prompt_learner import RankPromptLearner

__all__ = [
    "MAX_LOGIT_SCALE",
    "PredictionKind",
    "PrototypeHead",
    "RankPromptHead",
    "LinearPrototypeHead",
    "logits_to_predictions",
]

#: upper bound of a *learned* logit scale (log of 100), as CLIP clamps its own
MAX_LOGIT_SCALE = math.log(100.0)

#: how rank logits become a prediction: the expected rank value or the arg-max rank's value
PredictionKind = Literal["expectation", "argmax"]


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
