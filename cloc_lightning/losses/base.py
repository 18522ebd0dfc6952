"""The return contract every loss class follows.

* ``loss(...)`` (``forward``) returns the scalar to minimise: a float32 0-d tensor with
  gradient.  This is what a training step backpropagates.
* ``loss.compute(...)`` returns a :class:`LossOutput`: the same scalar and the named parts
  a method logs (``{}`` for a loss without parts; detached tensors).  ``forward`` is
  ``compute(...).loss``.

The functional forms (``supcon_loss``, ``sigmoid_contrastive_loss``, ``ordinal_clip_loss``)
are the kernels behind the classes and keep their documented returns.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from torch import Tensor, nn

__all__ = ["LossOutput", "Loss"]


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
