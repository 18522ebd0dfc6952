"""Count host-device synchronisation points of a training step, the way a GPU would stall on them.

On CPU nothing waits, so the count is taken at the Python calls that would make a CUDA
device synchronise: reading a value (``Tensor.item``, ``bool``/``float``/``int`` of a tensor,
``tolist``, ``numpy``, ``cpu``, ``.to('cpu')``), ops whose output size depends on the data
(``torch.unique``, ``bincount``, ``nonzero``, ``masked_select``, ``torch.where(cond)``,
boolean-mask indexing and assignment) and host-to-device copies of Python numbers
(``torch.tensor`` / ``torch.as_tensor`` / ``torch.full`` of a Python scalar, what ``self.log``
does with a float).  Each event is attributed to the library when a frame of the
``cloc_lightning`` package is on the stack (the innermost such frame is kept for the report),
else to Lightning / the test.  Calls made by a data loader's fetch (the dataset's
``__getitem__`` and collation: CPU work, in loader worker processes on a real run) are not counted,
nor ``torch.optim``'s reads of its step counters (CPU tensors unless ``capturable``).

:class:`SyncCounter` is also a callback: it numbers the training batches (a batch runs from
its ``on_train_batch_start`` to the next one), so that events are counted per step and
Lightning's logging steps can be told apart from typical steps.
"""

from __future__ import annotations

import contextlib
import numbers
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

PACKAGE = str(Path(__file__).resolve().parents[1] / "cloc_lightning")

#: library functions that run only on CPU tensors (each checks the device first), where reading a value
#: stalls nothing: CLOC's packed-key row sort (NumPy's in-place sort) and the sigmoid loss's fixed exp shift.
#: On CUDA they are not called (tests/methods/test_sync_free_step.py checks the device tests).
CPU_ONLY = frozenset({"_argsort_rows_packed", "_exp_shift"})
_LOADER = "torch/utils/data/"
_OPTIM = "torch/optim/"
_VALUE_READS = ("item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy", "cpu")
_DATA_SIZED = ("unique", "bincount", "nonzero", "masked_select", "unique_consecutive")


@dataclass
class Event:
    kind: str
    library: bool
    where: str  # innermost cloc_lightning frame (file:line function), or the innermost caller


@dataclass
class SyncCounter(Callback):
    """Patch the sync-causing calls (``with counter.patched():``) and count them per training batch."""

    batch: int = -1
    events: dict[int, list[Event]] = field(default_factory=dict)
    logging_steps: set[int] = field(default_factory=set)
    train_batches: list[int] = field(default_factory=list)
    _busy: bool = False

    # ------------------------------------------------------------------ callback
    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.batch += 1
        self.train_batches.append(self.batch)
        connector = trainer._logger_connector
        if connector.should_update_logs:
            self.logging_steps.add(self.batch)

    def on_train_epoch_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        self.batch += 1  # what follows (validation, epoch end) is no training step

    # ------------------------------------------------------------------ counting
    def _record(self, kind: str) -> None:
        if self._busy or self.batch < 0:
            return
        self._busy = True
        try:
            frame = sys._getframe(2)
            caller = f"{frame.f_code.co_filename}:{frame.f_lineno} {frame.f_code.co_name}"
            if _OPTIM in frame.f_code.co_filename:
                return  # torch.optim reading its own step counters (host tensors); the closure it runs is counted
            library = None
            while frame is not None:
                name = frame.f_code.co_filename
                if _LOADER in name:
                    return  # the data pipeline (CPU, in loader workers)
                if name.startswith(PACKAGE) and library is None:
                    if frame.f_code.co_name in CPU_ONLY:
                        return  # a CPU fast path, never taken on an accelerator (see CPU_ONLY)
                    library = f"{Path(name).relative_to(Path(PACKAGE).parent)}:{frame.f_lineno} {frame.f_code.co_name}"
                frame = frame.f_back
            self.events.setdefault(self.batch, []).append(Event(kind, library is not None, library or caller))
        finally:
            self._busy = False

    @contextlib.contextmanager
    def patched(self) -> Iterator[SyncCounter]:
        saved: list[tuple[Any, str, Any]] = []

        def patch(owner: Any, name: str, make: Callable[[Any], Any]) -> None:
            original = getattr(owner, name)
            saved.append((owner, name, original))
            setattr(owner, name, make(original))

        def counting(kind: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def wrapper(*args: Any, **kwargs: Any) -> Any:
                    self._record(kind)
                    return original(*args, **kwargs)

                return wrapper

            return make

        for name in _VALUE_READS:
            patch(torch.Tensor, name, counting(f"Tensor.{name}"))
        for name in _DATA_SIZED:
            if hasattr(torch.Tensor, name):
                patch(torch.Tensor, name, counting(f"Tensor.{name}"))
            if hasattr(torch, name):
                patch(torch, name, counting(f"torch.{name}"))

        def make_to(original: Any) -> Any:
            def to(t: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
                target = kwargs.get("device", args[0] if args else None)
                if isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu" and t.device.type != "cpu":
                    self._record("Tensor.to(cpu)")
                return original(t, *args, **kwargs)

            return to

        patch(torch.Tensor, "to", make_to)

        def make_where(original: Any) -> Any:
            def where(*args: Any, **kwargs: Any) -> Any:
                if len(args) + len(kwargs) == 1:
                    self._record("torch.where(cond)")
                return original(*args, **kwargs)

            return where

        patch(torch, "where", make_where)

        def has_bool_index(index: Any) -> bool:
            items = index if isinstance(index, tuple) else (index,)
            return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool and i.ndim > 0 for i in items)

        def make_getitem(original: Any) -> Any:
            def getitem(t: torch.Tensor, index: Any) -> Any:
                if has_bool_index(index):
                    self._record("boolean-mask indexing")
                return original(t, index)

            return getitem

        def make_setitem(original: Any) -> Any:
            def setitem(t: torch.Tensor, index: Any, value: Any) -> Any:
                if has_bool_index(index):
                    self._record("boolean-mask assignment")
                return original(t, index, value)

            return setitem

        patch(torch.Tensor, "__getitem__", make_getitem)
        patch(torch.Tensor, "__setitem__", make_setitem)

        def make_scalar_copy(kind: str) -> Callable[[Any], Any]:
            def make(original: Any) -> Any:
                def copy(data: Any, *args: Any, **kwargs: Any) -> Any:
                    if isinstance(data, numbers.Number) and not isinstance(data, bool):
                        self._record(kind)
                    return original(data, *args, **kwargs)

                return copy

            return make

        patch(torch, "tensor", make_scalar_copy("torch.tensor(number): host-to-device copy"))
        patch(torch, "as_tensor", make_scalar_copy("torch.as_tensor(number): host-to-device copy"))
        try:
            yield self
        finally:
            for owner, name, original in reversed(saved):
                setattr(owner, name, original)

    # ------------------------------------------------------------------ reading
    def steps(self, typical: bool = True) -> list[int]:
        """Training batches counted: with ``typical``, not the first, not a logging step and not the last."""
        if not typical:
            return list(self.train_batches)
        return [b for b in self.train_batches[1:-1] if b not in self.logging_steps]

    def per_step(self, batches: list[int], library: bool | None = True) -> dict[int, list[Event]]:
        return {b: [e for e in self.events.get(b, []) if library is None or e.library == library] for b in batches}

    def summary(self, batches: list[int], library: bool | None = True) -> Counter[str]:
        return Counter(f"{e.kind} at {e.where}" for b in batches for e in self.events.get(b, []) if library is None or e.library == library)
