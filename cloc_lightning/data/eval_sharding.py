"""Validation and test under DDP with every sample evaluated exactly once.

Lightning gives every process of a distributed run a ``DistributedSampler`` for the
validation and test loaders too.  That sampler makes all shares the same length by
repeating the first samples of the set, so when the set size is not a multiple of the
number of processes up to ``world_size - 1`` samples are evaluated twice and every
epoch-level metric (accuracy, MAE, QWK, the online probe's) is computed on a slightly
different set than on one process.  The shares must have the same number of *batches*
(a validation step may run collectives: the contrastive losses gather the batch of every
rank), but not the same number of *samples*.

:func:`exact_eval_loader` shards the set without repeats: process ``r`` of ``W`` takes
samples ``r, r + W, r + 2W, ...`` (the order ``DistributedSampler`` deals them in) in
batches of ``batch_size``; shares differ by at most one sample, and where the smaller
share's last batch would be empty it takes one sample of its previous batch, so every
process runs the same number of non-empty steps.  The loader iterates index *batches*
(:class:`ExactEvalBatches`, a ``DistributedSampler`` so that Lightning keeps it) over
a dataset view that loads and collates a whole batch (:class:`BatchedView`), i.e. a
``DataLoader`` with automatic batching off (``batch_size=None``).

With the torchmetrics states summed over ranks at epoch end and the step losses logged as
row-weighted means (:meth:`~cloc_lightning.methods.base.BaseModule.log_eval_mean`), the
epoch metrics of a DDP validation or test equal those of one process.

A set read chunk by chunk (``data.stream_from``) is shared by blocks instead: given an ``order`` of
the positions (the stream's: by chunk), process ``r`` takes the ``r``-th contiguous part of it, so each
process downloads and reads about ``1/W`` of the chunks rather than every chunk.  The shares have the
same sizes as the strided ones and the summed metrics do not depend on which process held a sample.

It cannot be done when a process would get no sample (fewer samples than processes) or
when ``batch_size`` is 1 and the shares differ (one process would have one more step):
:func:`exact_eval_loader` then returns ``None`` and the caller falls back to Lightning's
repeating sampler with a warning that names the fix.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any

from torch.utils.data import DataLoader, Dataset, DistributedSampler
from torch.utils.data.dataloader import default_collate

__all__ = ["ExactEvalBatches", "BatchedView", "exact_eval_batches", "exact_eval_loader"]


def exact_eval_batches(n: int, batch_size: int, num_replicas: int, rank: int, order: Sequence[int] | None = None) -> list[list[int]] | None:
    """Index batches of process ``rank`` of ``num_replicas`` over a set of ``n`` samples, each sample once.

    Every process gets the same number of non-empty batches of at most ``batch_size``;
    ``None`` when that is impossible (``n < num_replicas``, or ``batch_size == 1`` with
    ``n`` not a multiple of ``num_replicas``).  Without ``order`` process ``r`` takes samples
    ``r, r + W, ...``; with ``order`` (a permutation of ``0..n-1``) the ``r``-th contiguous part of it.
    """
    if not 0 <= rank < num_replicas:
        raise ValueError(f"rank {rank} is not in [0, {num_replicas})")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if n < num_replicas or (batch_size == 1 and n % num_replicas):  # decided alike on every process
        return None
    if order is None:
        share = list(range(rank, n, num_replicas))
    else:
        if sorted(order) != list(range(n)):
            raise ValueError(f"order must be a permutation of the {n} positions, got {len(order)} values")
        small, extra = divmod(n, num_replicas)  # the strided shares' sizes: the first `extra` one longer
        start = rank * small + min(rank, extra)
        share = [int(i) for i in order[start : start + small + (rank < extra)]]
    largest = -(-n // num_replicas)  # the first shares are one sample longer when n % num_replicas != 0
    n_batches = -(-largest // batch_size)
    batches = [share[i : i + batch_size] for i in range(0, len(share), batch_size)]
    if len(batches) < n_batches:  # this share's last batch would be empty: move one sample into it
        batches.append([batches[-1].pop()])
    return batches


class ExactEvalBatches(DistributedSampler):  # type: ignore[type-arg]
    """Yields the index batches of :func:`exact_eval_batches` for one process (see the module docstring).

    A ``DistributedSampler`` subclass only so that Lightning sees the loader as already
    sharded and leaves it alone; it does not shuffle and ignores ``set_epoch``.
    """

    def __init__(self, dataset: Sized, batch_size: int, num_replicas: int, rank: int, batches: list[list[int]] | None = None) -> None:
        """``batches``: the plan of :func:`exact_eval_batches` when the caller already has it."""
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=False, drop_last=False)  # type: ignore[arg-type]
        if batches is None:
            batches = exact_eval_batches(len(dataset), batch_size, num_replicas, rank)
        if batches is None:
            raise ValueError(
                f"{len(dataset)} samples cannot be shared between {num_replicas} processes with every sample once "
                f"in batches of {batch_size} (see exact_eval_batches)"
            )
        self.batches = batches
        self.batch_size = batch_size
        self.num_samples = sum(len(b) for b in batches)

    def __iter__(self) -> Iterator[list[int]]:
        return iter([list(b) for b in self.batches])

    def __len__(self) -> int:
        return len(self.batches)


class BatchedView(Dataset):  # type: ignore[type-arg]
    """``view[[i, j, ...]]`` = ``collate([dataset[i], dataset[j], ...])``: one whole batch per item."""

    def __init__(self, dataset: Any, collate_fn: Any = default_collate) -> None:
        self.dataset = dataset
        self.collate_fn = collate_fn

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, indices: Sequence[int]) -> Any:
        return self.collate_fn([self.dataset[i] for i in indices])


def exact_eval_loader(
    dataset: Any, batch_size: int, num_replicas: int, rank: int, order: Sequence[int] | None = None, **loader_kwargs: Any
) -> DataLoader[Any] | None:
    """A loader of this process's share of ``dataset``, every sample once over all processes, or ``None``.

    ``order``: shares by contiguous parts of it (see :func:`exact_eval_batches`).  ``loader_kwargs`` are
    the ``DataLoader`` options other than batching (``num_workers``, ``pin_memory``,
    ``persistent_workers``, ``generator``...).  ``None`` where :func:`exact_eval_batches` says it cannot be done.
    """
    for key in ("sampler", "batch_sampler", "shuffle", "drop_last"):
        if key in loader_kwargs:
            raise TypeError(f"exact_eval_loader sets {key!r} itself")
    batches = exact_eval_batches(len(dataset), batch_size, num_replicas, rank, order)
    if batches is None:
        return None
    sampler = ExactEvalBatches(dataset, batch_size, num_replicas, rank, batches=batches)
    return DataLoader(BatchedView(dataset), batch_size=None, sampler=sampler, **loader_kwargs)
