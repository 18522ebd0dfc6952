"""Value checks that never stop the device: device-side flags, read every few steps.

A check such as "the loss is finite" or "every label lies in ``[0, C)``" needs the
*value* of a tensor.  Reading it on the host (``bool(t)``, ``.item()``, ``.tolist()``)
makes the CPU wait until the GPU has finished every queued kernel: on a GPU each such
read costs a pipeline stall per training step.  This module lets a check be *recorded*
instead of read:

* :func:`require` is what losses, heads and modules call.  Outside a training step (plain
  Python, a test, a notebook) it reads the flag at once and raises, exactly as an
  ``if not bool(ok): raise ...`` would.  Inside a training step driven by a
  :class:`DeferredChecks` (see :meth:`DeferredChecks.active`), it only ORs the flag
  into a device tensor: no host sync.
* :meth:`DeferredChecks.raise_if_failed` reads all recorded flags with **one** host sync
  (under DDP plus one scalar all-reduce, so every process stops together) and raises the
  first failed check's error, naming the batch at which it first failed.  The trainer
  callback :class:`~cloc_lightning.callbacks.checks.DeviceChecks` calls it every
  ``log_every_n_steps`` (when Lightning syncs for its loggers anyway), at the end of
  each training epoch and before any checkpoint is written, so no checkpoint ever holds
  what a check caught.

What a deferred check catches is the same as what the immediate one does; it is reported
at most ``log_every_n_steps`` batches later.  A check whose failure could crash a kernel
before it is read (an out-of-range class index in a scatter on CUDA) is paired with a
clamp at the call site, so the step runs to the read on harmless values.

Example::

    checks = DeferredChecks()
    with checks.active():
        require(torch.isfinite(loss), "the loss is not finite; lower the learning rate")  # no sync
    checks.raise_if_failed()  # one sync: raises ValueError(...) if the loss was NaN
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass

import torch

from cloc_lightning import distributed as dist_utils

__all__ = ["DeferredChecks", "require", "deferring", "CheckFailure"]

_ACTIVE: ContextVar[DeferredChecks | None] = ContextVar("cloc_lightning_deferred_checks", default=None)


@dataclass
class _Entry:
    error: type[Exception]
    message: str
    failed: torch.Tensor  # bool scalar on the device: failed at least once since the last read
    first: torch.Tensor  # int64 scalar on the device: batch counter at the first failure (-1: none)


@dataclass(frozen=True)
class CheckFailure:
    """A check that failed since the last read: its error type, message and the first failing batch (0-based)."""

    error: type[Exception]
    message: str
    first_batch: int


def deferring() -> bool:
    """Whether :func:`require` records (``True``, inside :meth:`DeferredChecks.active`) or raises at once."""
    return _ACTIVE.get() is not None


def require(
    ok: torch.Tensor,
    message: str,
    error: type[Exception] = ValueError,
    detail: Callable[[], str] | None = None,
) -> None:
    """Check that every entry of the boolean tensor ``ok`` is true.

    Outside :meth:`DeferredChecks.active` this reads ``ok`` now (one host sync) and raises
    ``error(message + detail())``.  Inside, the flag is recorded on the device and raised
    by the next :meth:`DeferredChecks.raise_if_failed`; ``detail`` (text that needs host
    values, e.g. the offending label) is then not evaluated.

    Args:
        ok: a bool tensor of any shape (``all()`` of it is the condition).
        message: the error's text; it names the fix.  Equal messages share one flag.
        error: the exception type raised on failure.
        detail: optional callable returning extra text, evaluated only when raising at once.
    """
    checks = _ACTIVE.get()
    if checks is not None:
        checks.record(~ok.all(), message, error)
        return
    if not bool(ok.all()):
        raise error(message + (detail() if detail is not None else ""))


class DeferredChecks:
    """Device-side record of value checks, read with one host sync on demand.

    ``record(failed, message, error)`` ORs ``failed`` into the entry of ``(error, message)``
    and remembers the batch counter of its first failure; :meth:`advance` counts batches
    (a device increment); :meth:`failures` / :meth:`raise_if_failed` read everything at
    once and clear it.  Not thread-safe; one instance per training loop.
    """

    def __init__(self) -> None:
        self._entries: dict[tuple[type[Exception], str], _Entry] = {}
        self._counter: torch.Tensor | None = None  # batches since the last read, on the device

    # ------------------------------------------------------------------ recording
    @contextlib.contextmanager
    def active(self) -> Iterator[DeferredChecks]:
        """Within this block :func:`require` records into this instance instead of raising."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def activate(self) -> None:
        """Make this instance the one :func:`require` records into (until :meth:`deactivate`).

        For hooks that start and end a step in different calls (a trainer callback's
        ``on_train_batch_start`` / ``on_train_batch_end``); prefer :meth:`active` elsewhere.
        """
        _ACTIVE.set(self)

    @staticmethod
    def deactivate() -> None:
        """Let :func:`require` raise at once again."""
        _ACTIVE.set(None)

    def advance(self, device: torch.device) -> None:
        """Count one batch (the numbering of :attr:`CheckFailure.first_batch`); a device op, no sync."""
        if self._counter is None or self._counter.device != device:
            self._counter = torch.zeros((), dtype=torch.int64, device=device)
        else:
            self._counter.add_(1)

    def record(self, failed: torch.Tensor, message: str, error: type[Exception] = ValueError) -> None:
        """OR the bool scalar ``failed`` into the entry ``(error, message)`` (no host sync)."""
        failed = failed.detach().reshape(()).to(torch.bool)
        if self._counter is None or self._counter.device != failed.device:
            self._counter = torch.zeros((), dtype=torch.int64, device=failed.device)
        key = (error, message)
        entry = self._entries.get(key)
        if entry is None or entry.failed.device != failed.device:
            first = torch.where(failed, self._counter, torch.full_like(self._counter, -1))
            self._entries[key] = _Entry(error, message, failed.clone(), first)
            return
        entry.first = torch.where(entry.failed, entry.first, torch.where(failed, self._counter, entry.first))
        entry.failed = entry.failed | failed

    @property
    def pending(self) -> bool:
        """Whether anything was recorded since the last read."""
        return bool(self._entries)

    # ------------------------------------------------------------------ reading
    def failures(self, across_processes: bool = True) -> tuple[list[CheckFailure], bool]:
        """Read and clear the record: ``(this process's failures, whether any process failed)``.

        One host sync (and, under DDP with ``across_processes``, one scalar all-reduce,
        which every process must call at the same point).  Failures are ordered by the
        batch at which they first failed, then by the order they were recorded in.
        """
        entries = list(self._entries.values())
        self._entries.clear()
        if self._counter is not None:
            self._counter.zero_()
        distributed = across_processes and dist_utils.is_distributed()
        if not entries and not distributed:
            return [], False
        if entries:
            flags = torch.stack([e.failed for e in entries]).to(torch.int64)
            firsts = torch.stack([e.first for e in entries])
            any_local = flags.amax().reshape(1)
        else:
            flags = firsts = torch.zeros(0, dtype=torch.int64)
            any_local = torch.zeros(1, dtype=torch.int64, device=_device())
        if distributed:
            any_global = dist_utils.all_reduce_sum(any_local.to(_device()))
            values = torch.cat([flags.to(any_global.device), firsts.to(any_global.device), any_global]).tolist()
        else:
            values = torch.cat([flags, firsts, any_local]).tolist()
        k = len(entries)
        failed = [CheckFailure(e.error, e.message, int(values[k + i])) for i, e in enumerate(entries) if values[i]]
        failed.sort(key=lambda f: f.first_batch)  # stable: record order among equal batches
        return failed, bool(values[-1])

    def raise_if_failed(self, where: str = "", across_processes: bool = True) -> None:
        """Raise the first failed check's error (one host sync); nothing when every check passed.

        ``where`` says when the read happened (e.g. ``"at step 50"``); the message adds the
        batch of the first failure.  Under DDP a process whose own checks passed raises a
        ``RuntimeError`` saying that another process failed, so that no process waits forever.
        """
        failed, anywhere = self.failures(across_processes)
        if failed:
            first = failed[0]
            seen = f" [first failed {first.first_batch} batch(es) after the previous check; read {where}]" if where else ""
            raise first.error(first.message + seen)
        if anywhere:
            raise RuntimeError(
                f"stopping: a value check failed on another process ({where or 'at the last read'}); "
                "its error message is printed by that process above"
            )


def _device() -> torch.device:
    """The device collectives of the default process group use (CUDA for NCCL, else CPU)."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized() and dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")
