"""Gradients of a large batch, one mini-batch graph at a time: chunked accumulation and the gradient cache.

A contrastive batch that does not fit in memory as one graph can still be trained on, two ways:

* **chunked accumulation** (:func:`mini_batch_slices` + :func:`chunk_backward`): each mini-batch
  is a batch of its own (its negatives are the mini-batch's); the gradients of the
  ``1/chunks``-scaled losses accumulate in ``.grad``.
* **the gradient cache** (:func:`cached_backward`; Gao et al., "Scaling Deep Contrastive Learning
  Batch Size under Memory Limited Setup", RepL4NLP 2021): the exact gradient of the loss over the
  *whole* batch.  Pass 1 computes every mini-batch's outputs without a graph; the loss and its
  gradient with respect to those outputs are computed on the whole batch; pass 2 re-runs each
  mini-batch with a graph and back-propagates its slice of the cached output gradient.  The random
  number state of each mini-batch is replayed in pass 2 (dropout, stochastic depth draw the same)
  and BatchNorm's running statistics are updated once, as in one forward.

Used by :class:`cloc_lightning.methods.ReLICModule` (``mini_batch_size`` with
``negatives='mini_batch' | 'full_batch'``; its argument and the data module's batches checked by
:func:`check_mini_batch_size` and :func:`check_mini_batches`); nothing here knows about ReLIC.  Under a Trainer the
backward passes go through :meth:`~lightning.pytorch.LightningModule.manual_backward` (precision
scaling), with DDP's gradient all-reduce only on the last mini-batch.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import lightning as L
import torch

from cloc_lightning.data_contract import DataInfo
from cloc_lightning.losses.base import upcast

__all__ = [
    "check_mini_batch_size",
    "check_mini_batches",
    "mini_batch_slices",
    "chunk_backward",
    "rng_state",
    "set_rng_state",
    "cached_backward",
]

RNGState = tuple[torch.Tensor, "torch.Tensor | None"]


def check_mini_batch_size(mini_batch_size: int | None) -> int | None:
    """A method's ``mini_batch_size`` argument: a positive integer, or ``None`` (no splitting); else a ``ValueError``."""
    if mini_batch_size is not None and (isinstance(mini_batch_size, bool) or not isinstance(mini_batch_size, int) or mini_batch_size < 1):
        raise ValueError(f"mini_batch_size must be a positive integer or null (no splitting), got {mini_batch_size!r}")
    return mini_batch_size


def check_mini_batches(mini_batch_size: int | None, data: DataInfo, world_size: int) -> None:
    """Before a fit: ``mini_batch_size`` divides every training batch of the data module ``data``.

    Raises a ``ValueError`` naming the fix when it does not divide ``data.batch_size`` or (one
    process, ``drop_last: false``, a known training-set size) the last, smaller batch.  Nothing to
    check without ``mini_batch_size`` or a known batch size.
    """
    mb = mini_batch_size
    bs = data.batch_size
    if mb is None or bs is None:
        return
    if bs % mb != 0:
        raise ValueError(
            f"mini_batch_size={mb} does not divide data.batch_size={bs}; choose a divisor of the batch size "
            f"(e.g. {max(d for d in range(1, mb + 1) if bs % d == 0)})"
        )
    train_size = data.train_size
    if data.drop_last is False and train_size is not None and world_size == 1:
        last = train_size % bs
        if last and last % mb != 0:
            raise ValueError(
                f"the last training batch holds {last} images, which mini_batch_size={mb} does not divide; "
                "set data.drop_last: true (the seed drops the last batch too)"
            )


def mini_batch_slices(batch_size: int, mini_batch_size: int | None) -> list[slice]:
    """The mini-batches of a batch of ``batch_size`` (one slice when ``mini_batch_size`` is ``None``).

    Raises a ``ValueError`` naming the fix when ``mini_batch_size`` does not divide the batch.
    """
    mb = mini_batch_size or batch_size
    if mb > batch_size or batch_size % mb != 0:
        raise ValueError(
            f"mini_batch_size={mb} does not divide the batch of {batch_size} images; use a divisor of data.batch_size "
            "and data.drop_last: true (so that the last batch is full too)"
        )
    return [slice(c * mb, (c + 1) * mb) for c in range(batch_size // mb)]


def chunk_backward(module: L.LightningModule, tensor: torch.Tensor, last: bool) -> None:
    """Backward of one mini-batch's loss.

    Under a Trainer through ``module.manual_backward`` (precision scaling) with DDP's gradient
    synchronisation blocked unless ``last``; standalone (no Trainer) through
    ``torch.autograd.backward``.  Always outside autocast: the step runs under the Trainer's
    autocast, and custom autograd Functions (the fused losses) would otherwise run their backward
    matmuls in half precision.
    """
    no_autocast = torch.autocast(device_type=tensor.device.type, enabled=False)
    if module._trainer is None:
        with no_autocast:
            torch.autograd.backward(tensor)
        return
    strategy = module.trainer.strategy
    ctx: AbstractContextManager[Any] = nullcontext()
    if not last and hasattr(strategy, "block_backward_sync"):
        ctx = strategy.block_backward_sync()
    with ctx, no_autocast:
        module.manual_backward(tensor)


def rng_state(device: torch.device) -> RNGState:
    """The CPU generator's state and, on a CUDA device, that device's."""
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


def set_rng_state(state: RNGState, device: torch.device) -> None:
    """Restore a state taken by :func:`rng_state` on the same device."""
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def cached_backward(
    forward: Callable[[slice], Sequence[torch.Tensor]],
    slices: Sequence[slice],
    loss_fn: Callable[[list[torch.Tensor]], tuple[torch.Tensor, ...]],
    backward: Callable[[torch.Tensor, bool], None],
    *,
    device: torch.device,
    params: Sequence[torch.Tensor] = (),
    buffers: Sequence[torch.Tensor] = (),
    last_extra: torch.Tensor | None = None,
) -> tuple[torch.Tensor, ...]:
    """Accumulate the exact gradient of ``loss_fn`` over the whole batch, one mini-batch graph at a time.

    Args:
        forward: the outputs of one mini-batch (``slice`` of the batch), e.g. one projection per
            view; called twice per mini-batch (without and with a graph).
        slices: the mini-batches (:func:`mini_batch_slices`).
        loss_fn: ``(outputs over the whole batch, one per output of forward, upcast to float32)
            -> (loss, *other values)``; differentiated with respect to the outputs and ``params``.
        backward: ``backward(tensor, last)`` of one surrogate (e.g. :func:`chunk_backward`).
        device: where the batch lives (its random number state is replayed).
        params: parameters the loss itself owns (a learnable temperature); their gradient is
            added with the last mini-batch.
        buffers: the network's buffers (BatchNorm running statistics): restored after pass 1 so
            that pass 2 updates them once.
        last_extra: a loss added to the last mini-batch's backward as it is (e.g. an online
            probe's cross-entropy on detached features).

    Returns:
        ``loss_fn``'s values on the whole batch, detached.
    """
    saved_buffers = [b.clone() for b in buffers]
    rng_states = []
    outputs: list[list[torch.Tensor]] = []
    with torch.no_grad():  # pass 1: every mini-batch's outputs, no graph kept
        for sl in slices:
            rng_states.append(rng_state(device))
            for j, out in enumerate(forward(sl)):
                if j == len(outputs):
                    outputs.append([])
                outputs[j].append(out)
    if buffers:  # pass 2 repeats the forward: keep the running statistics updated once
        torch._foreach_copy_(list(buffers), saved_buffers)
    leaves = [upcast(torch.cat(o)).requires_grad_(True) for o in outputs]
    params = list(params)
    with torch.enable_grad():
        values = loss_fn(leaves)
        with torch.autocast(device_type=device.type, enabled=False):  # see chunk_backward
            grads = torch.autograd.grad(values[0], [*leaves, *params])
    out_grads, param_grads = grads[: len(leaves)], grads[len(leaves) :]
    after_pass1 = rng_state(device)
    for c, sl in enumerate(slices):  # pass 2: re-forward each mini-batch with a graph; back-propagate its gradient slice
        set_rng_state(rng_states[c], device)
        surrogate = torch.zeros((), device=device)
        for j, out in enumerate(forward(sl)):
            surrogate = surrogate + (out.to(out_grads[j].dtype) * out_grads[j][sl]).sum()
        last = c == len(slices) - 1
        if last:
            for p, gp in zip(params, param_grads, strict=True):
                surrogate = surrogate + (p * gp).sum()
            if last_extra is not None:
                surrogate = surrogate + last_extra
        backward(surrogate, last)
    set_rng_state(after_pass1, device)
    return tuple(v.detach() for v in values)
