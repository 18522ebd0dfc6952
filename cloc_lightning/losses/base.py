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

__all__ = ["LossOutput", "Loss", "compute_dtype", "upcast"]


def compute_dtype(*tensors: Tensor | None) -> torch.dtype:
    """The dtype a loss computes in: float64 if any of ``tensors`` is float64, else float32.

    Half-precision inputs (bf16/fp16 from autocast or a ``-true`` half precision) are upcast
    to float32; float64 (``64-true``) is kept.  ``None`` entries are skipped.
    """
    return torch.float64 if any(t is not None and t.dtype == torch.float64 for t in tensors) else torch.float32


def upcast(t: Tensor) -> Tensor:
    """``t`` in :func:`compute_dtype` of itself: half -> float32, float32/float64 unchanged (no copy)."""
    return t.to(compute_dtype(t))


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
