"""The one place in cloc-lightning that talks across ranks.

Every contrastive loss that needs the global batch goes through these helpers,
so the semantics are defined once:

* :func:`gather` concatenates a tensor from every rank along dim 0 **with
  gradients**: the backward pass sums the incoming gradient over all ranks
  (``all_reduce``) and hands each rank the slice of its own rows.  Ranks may hold
  different numbers of rows (e.g. the last, smaller batch of an epoch).
* :func:`gather_no_grad` does the same without autograd (labels, EMA-target
  outputs, anything that must not receive gradients).
* :func:`global_mean` turns a per-anchor loss vector of the *local* anchors into
  this rank's share of the mean over the *global* batch.

Convention (also used by solo-learn's and lightly's gather layers): rank ``r``
computes the loss of its local anchors against the global batch and returns
``L_r = W * sum_{i in r} l_i / N`` (``W`` ranks, ``N`` global anchors), so that
``mean_r L_r`` equals the single-process loss on the concatenated batch.  With
the all-reduce in :func:`gather`'s backward, every parameter gradient after
DDP's gradient averaging equals the single-process gradient exactly, and the
gradient that reaches rank ``r``'s local inputs equals ``W`` times the
single-process gradient of those rows (DDP then divides by ``W``).

On a single process (or when ``torch.distributed`` is not initialised) all
helpers are no-ops that cost nothing.

**Equal sizes.**  Rows of different counts can only be gathered once every rank's count is known
on the host: the helpers then exchange the counts (one small ``all_gather``) and read them, which
on a GPU is a device synchronisation per rank and call (under 2 processes, 6 reads per training
step of SupCon or CLOC and 24 of ReLIC's multi-crop pairs: tests/methods/test_ddp_step_syncs.py).
When every rank is known to pass the same number of rows, nothing needs to be asked: the sizes
are ``[n] * W``, the offset is ``rank * n`` and the global mean is the local mean.  The
helpers take ``equal_sizes`` (``None``: what the innermost :func:`assume_equal_sizes` block says,
else ``False``); the methods open that block around their training step when the training
loader's batches are full on every rank (:func:`loader_batches_equal`: ``drop_last`` with a fixed
``batch_size``).  Evaluation, ``drop_last: false`` and loaders of unknown batching keep the size
exchange, so unequal sizes stay correct.  Assuming equal sizes when they are not is an error the
helpers cannot see without the exchange they skip (a collective of mismatched shapes).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "gather",
    "gather_no_grad",
    "global_mean",
    "mean_scale",
    "assume_equal_sizes",
    "sizes_assumed_equal",
    "loader_batches_equal",
    "all_reduce_sum",
    "local_offset",
    "broadcast_",
    "all_reduce_mean_",
    "release_process_group",
]


def is_distributed() -> bool:
    """True when ``torch.distributed`` is initialised with more than one rank."""
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def world_size() -> int:
    """Number of ranks (1 without an initialised process group)."""
    return dist.get_world_size() if is_distributed() else 1


def rank() -> int:
    """This process' rank (0 without an initialised process group)."""
    return dist.get_rank() if is_distributed() else 0


#: whether the helpers may take every rank's row count to equal this rank's (set by :func:`assume_equal_sizes`)
_EQUAL_SIZES: ContextVar[bool] = ContextVar("cloc_lightning_equal_sizes", default=False)


@contextlib.contextmanager
def assume_equal_sizes(enabled: bool = True) -> Iterator[None]:
    """Within the block, the helpers take every rank's row count to equal this rank's (``enabled``).

    Why: it saves the size exchange and its host read (a device sync on a GPU) in every
    :func:`gather`, :func:`gather_no_grad`, :func:`local_offset`, :func:`global_mean` and
    :func:`mean_scale` call that leaves ``equal_sizes`` at ``None``.  Only for code where the
    counts are known to be equal on every rank, such as a training step on full batches
    (:func:`loader_batches_equal`); ``enabled=False`` restores the exchange inside an outer block.
    Blocks nest; the previous setting comes back on exit, also after an exception.
    """
    token = _EQUAL_SIZES.set(bool(enabled))
    try:
        yield
    finally:
        _EQUAL_SIZES.reset(token)


def sizes_assumed_equal(equal_sizes: bool | None = None) -> bool:
    """``equal_sizes``, or when it is ``None`` what the innermost :func:`assume_equal_sizes` says (``False`` outside one)."""
    return _EQUAL_SIZES.get() if equal_sizes is None else bool(equal_sizes)


def loader_batches_equal(loader: object) -> bool:
    """True when every batch of ``loader`` holds ``loader.batch_size`` samples, on every rank alike.

    A ``DataLoader`` that batches itself (``batch_size`` set) with ``drop_last=True`` yields full
    batches only, whatever its sampler, so processes that build it with the same ``batch_size``
    (one config) hold equal row counts.  Anything else (``drop_last=False``, a custom
    ``batch_sampler``, several loaders, no loader) may give ranks different counts: ``False``.
    """
    return isinstance(loader, DataLoader) and loader.batch_size is not None and bool(loader.drop_last)


def _all_sizes(n: int, device: torch.device, equal_sizes: bool | None = None) -> list[int]:
    """Row counts of every rank: ``[n] * W`` when sizes are assumed equal, else one tiny all_gather read on the host."""
    if sizes_assumed_equal(equal_sizes):
        return [n] * dist.get_world_size()
    local = torch.tensor([n], device=device, dtype=torch.long)
    sizes = [torch.zeros_like(local) for _ in range(dist.get_world_size())]
    dist.all_gather(sizes, local)
    return [int(s.item()) for s in sizes]


def _gather_padded(x: torch.Tensor, sizes: list[int]) -> torch.Tensor:
    """all_gather rows of possibly different counts; returns their concatenation."""
    x = x.contiguous()
    max_n = max(sizes)
    if x.shape[0] < max_n:
        pad = x.new_zeros((max_n - x.shape[0], *x.shape[1:]))
        x = torch.cat([x, pad], dim=0)
    out = [torch.empty_like(x) for _ in sizes]
    dist.all_gather(out, x)
    if min(sizes) == max_n:  # all equal: nothing was padded
        return torch.cat(out, dim=0)
    return torch.cat([o[:n] for o, n in zip(out, sizes, strict=True)], dim=0)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward all-reduces (sums) the gradient and keeps the local slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, equal_sizes: bool) -> torch.Tensor:
        sizes = _all_sizes(x.shape[0], x.device, equal_sizes)
        r = dist.get_rank()
        ctx.start = sum(sizes[:r])
        ctx.n = x.shape[0]
        return _gather_padded(x, sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.start : ctx.start + ctx.n], None


def gather(x: torch.Tensor, equal_sizes: bool | None = None) -> torch.Tensor:
    """Concatenate ``x`` ([n_r, ...]) from all ranks along dim 0, with gradients.

    Returns ``[sum_r n_r, ...]``; rank ``r``'s rows start at :func:`local_offset`.
    ``equal_sizes``: every rank passes as many rows as this one, so no sizes are exchanged
    (``None``: :func:`sizes_assumed_equal`).  Identity on a single process.
    """
    if not is_distributed():
        return x
    gathered: torch.Tensor = _GatherWithGrad.apply(x, sizes_assumed_equal(equal_sizes))
    return gathered


@torch.no_grad()
def gather_no_grad(x: torch.Tensor, equal_sizes: bool | None = None) -> torch.Tensor:
    """Concatenate ``x`` from all ranks along dim 0, detached (labels, EMA targets); ``equal_sizes`` as in :func:`gather`."""
    if not is_distributed():
        return x
    return _gather_padded(x.detach(), _all_sizes(x.shape[0], x.device, equal_sizes))


def local_offset(n_local: int, device: torch.device | None = None, equal_sizes: bool | None = None) -> int:
    """Index of this rank's first row in the gathered (rank-ordered) batch (``rank * n_local`` with equal sizes)."""
    if not is_distributed():
        return 0
    sizes = _all_sizes(n_local, device or torch.device("cpu"), equal_sizes)
    return sum(sizes[: dist.get_rank()])


@torch.no_grad()
def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (a detached copy; identity on one process)."""
    if not is_distributed():
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def mean_scale(n_local: int, like: torch.Tensor, equal_sizes: bool | None = None) -> float | torch.Tensor:
    """``W / N_global``: the factor turning a sum over ``n_local`` local rows into this rank's share of the global mean.

    ``1 / n_local`` (a Python number, nothing exchanged) on one process or with equal sizes
    (``N_global = W * n_local``; ``equal_sizes`` as in :func:`gather`); otherwise a 0-d tensor of
    ``like``'s dtype and device from an ``all_reduce`` of the counts (not read on the host).
    """
    if not is_distributed() or sizes_assumed_equal(equal_sizes):
        return 1.0 / n_local
    n_global = all_reduce_sum(torch.tensor(float(n_local), device=like.device, dtype=like.dtype))
    return world_size() / n_global


def global_mean(per_anchor: torch.Tensor, equal_sizes: bool | None = None) -> torch.Tensor:
    """This rank's share of the global mean of a per-anchor loss vector.

    ``per_anchor`` holds the losses of the local anchors ([n_local]).  Returns
    ``W * per_anchor.sum() / N_global``; on one process, or with equal sizes (``equal_sizes``
    as in :func:`gather`), that is ``per_anchor.mean()``.  The mean over ranks of the returned
    value is the mean over all anchors.
    """
    if not is_distributed() or sizes_assumed_equal(equal_sizes):
        return per_anchor.mean()
    return per_anchor.sum() * mean_scale(per_anchor.numel(), per_anchor, equal_sizes=False)


@torch.no_grad()
def broadcast_(tensors: list[torch.Tensor], src: int = 0) -> None:
    """Overwrite ``tensors`` in place with rank ``src``'s values (a no-op on one process).

    For state that DDP does not synchronise itself (parameters kept out of its reducer,
    such as CLOC's margins, see :class:`~cloc_lightning.methods.cloc.CLOCModule`).  Every
    rank must call it with tensors of the same shapes, in the same order.
    """
    if not is_distributed():
        return
    for t in tensors:
        dist.broadcast(t.data, src=src)


@torch.no_grad()
def all_reduce_mean_(tensors: list[torch.Tensor]) -> None:
    """Replace each tensor, in place, by its mean over ranks (a no-op on one process).

    What DDP does to the gradients of the parameters in its reducer; used for gradients
    of parameters kept out of it.  Every rank must call it with the same shapes, in order.
    """
    if not is_distributed():
        return
    n = world_size()
    for t in tensors:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(n)


def release_process_group() -> None:
    """Destroy the default process group, if one is initialised (every backend).

    Lightning destroys an NCCL group at exit but leaves a gloo group to the interpreter's
    finalisation, where gloo's worker threads can abort the process (``terminate called without
    an active exception``, exit code -6) after the run has finished its work
    (pytorch/pytorch#190489).  The command line calls this when a command ends, on every rank; a
    no-op on one process without ``torch.distributed``.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
