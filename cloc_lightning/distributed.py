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
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "is_distributed",
    "world_size",
    "rank",
    "gather",
    "gather_no_grad",
    "global_mean",
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


def _all_sizes(n: int, device: torch.device) -> list[int]:
    """Row counts of every rank (one tiny all_gather)."""
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
    return torch.cat([o[:n] for o, n in zip(out, sizes, strict=True)], dim=0)


class _GatherWithGrad(torch.autograd.Function):
    """all_gather whose backward all-reduces (sums) the gradient and keeps the local slice."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        sizes = _all_sizes(x.shape[0], x.device)
        r = dist.get_rank()
        ctx.start = sum(sizes[:r])
        ctx.n = x.shape[0]
        return _gather_padded(x, sizes)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        return grad[ctx.start : ctx.start + ctx.n]


def gather(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` ([n_r, ...]) from all ranks along dim 0, with gradients.

    Returns ``[sum_r n_r, ...]``; rank ``r``'s rows start at :func:`local_offset`.
    Identity on a single process.
    """
    if not is_distributed():
        return x
    gathered: torch.Tensor = _GatherWithGrad.apply(x)
    return gathered


@torch.no_grad()
def gather_no_grad(x: torch.Tensor) -> torch.Tensor:
    """Concatenate ``x`` from all ranks along dim 0, detached (labels, EMA targets)."""
    if not is_distributed():
        return x
    return _gather_padded(x.detach(), _all_sizes(x.shape[0], x.device))


def local_offset(n_local: int, device: torch.device | None = None) -> int:
    """Index of this rank's first row in the gathered (rank-ordered) batch."""
    if not is_distributed():
        return 0
    sizes = _all_sizes(n_local, device or torch.device("cpu"))
    return sum(sizes[: dist.get_rank()])


@torch.no_grad()
def all_reduce_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum of ``x`` over ranks (a detached copy; identity on one process)."""
    if not is_distributed():
        return x
    y = x.detach().clone()
    dist.all_reduce(y, op=dist.ReduceOp.SUM)
    return y


def global_mean(per_anchor: torch.Tensor) -> torch.Tensor:
    """This rank's share of the global mean of a per-anchor loss vector.

    ``per_anchor`` holds the losses of the local anchors ([n_local]).  Returns
    ``W * per_anchor.sum() / N_global``; on one process that is ``per_anchor.mean()``.
    The mean over ranks of the returned value is the mean over all anchors.
    """
    if not is_distributed():
        return per_anchor.mean()
    n_global = all_reduce_sum(
        torch.tensor(float(per_anchor.numel()), device=per_anchor.device, dtype=per_anchor.dtype)
    )
    return per_anchor.sum() * (world_size() / n_global)


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
