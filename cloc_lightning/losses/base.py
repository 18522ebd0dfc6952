"""The return contract every loss class follows.

* ``loss(...)`` (``forward``) returns the scalar to minimise: a float32 0-d tensor with
  gradient (float64 when its inputs are float64, as under ``64-true``; :func:`compute_dtype`).
  This is what a training step backpropagates.
* ``loss.compute(...)`` returns a :class:`LossOutput`: the same scalar and the named parts
  a method logs (``{}`` for a loss without parts; detached tensors).  ``forward`` is
  ``compute(...).loss``.

The functional forms (``supcon_loss``, ``sigmoid_contrastive_loss``, ``ordinal_clip_loss``)
are the kernels behind the classes and keep their documented returns.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from cloc_lightning.checks import require
from cloc_lightning.validation import check_tensor

__all__ = ["LossOutput", "Loss", "compute_dtype", "upcast", "check_rank_labels"]


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """The dtype a loss computes in: float64 if any of ``tensors`` is float64, else float32.

    Half-precision inputs (bf16/fp16 from autocast or a ``-true`` half precision) are upcast
    to float32; float64 (``64-true``) is kept.  ``None`` entries are skipped.
    """
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def upcast(t: Tensor) -> Tensor:
    """``t`` in :func:`compute_dtype` of itself: half -> float32, float32/float64 unchanged (no copy)."""
    return t.to(compute_dtype(t))


def check_rank_labels(logits: Tensor, labels: Tensor, num_classes: int, owner: str, check_finite: bool, per_sample: str = "") -> Tensor:
    """The ranks ``labels`` ``[N]`` of the ``[N, *]`` ``logits`` as ``long``, checked (the ordinal losses' input check).

    The shapes are checked at once; with ``check_finite`` the values too, on the device
    (:func:`~cloc_lightning.checks.require`: read at once, or recorded inside a Trainer's step):
    finite ``logits`` and ranks in ``[0, num_classes)``, then clamped into that range so that a
    deferred bad label cannot index out of bounds.  ``owner`` names the loss in the messages,
    ``per_sample`` says what the logits of a sample are (e.g. ``" for 4 logits per sample"``).
    """
    n = logits.shape[0]
    check_tensor("labels", labels, floating=False, layout="[N]", holding="ranks")
    if labels.shape != (n,):
        raise ValueError(f"{owner}: labels must be a [N]={n} tensor, got shape {tuple(labels.shape)}")
    labels = labels.long()
    if check_finite:
        require(
            torch.isfinite(logits),
            f"{owner} got NaN/inf logits (diverged training?); lower the learning rate, use gradient clipping, or check the inputs",
        )
        require(
            (labels >= 0) & (labels < num_classes),
            f"{owner}: labels must be ranks in [0, {num_classes}){per_sample}; check num_classes and the label mapping of the data",
            detail=lambda: f" (got min {int(labels.min())} max {int(labels.max())})",
        )
        labels = labels.clamp(0, num_classes - 1)
    return labels


class LossOutput(NamedTuple):
    """What :meth:`Loss.compute` returns."""

    #: the scalar to minimise (float32, 0-d, with gradient)
    loss: Tensor
    #: named parts for logging (detached 0-d tensors), e.g. ``{"ce": ..., "kl": ...}``
    terms: dict[str, Tensor]


class Loss(nn.Module):
    """Base of the loss classes: ``forward`` gives the scalar, :meth:`compute` the scalar and its parts.

    A loss without parts implements ``forward`` (``compute`` wraps it); a loss with parts
    implements ``compute`` and sets ``forward = compute(...).loss`` (see
    :class:`~cloc_lightning.losses.SigmoidContrastiveLoss`).
    """

    def compute(self, *args: Any, **kwargs: Any) -> LossOutput:
        """``LossOutput(self(*args, **kwargs), {})``; losses with parts override it."""
        return LossOutput(self(*args, **kwargs), {})
