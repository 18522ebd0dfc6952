"""``StepProbe``: the callback the GPU tier adds to every fit (``--trainer.callbacks+=tests.gpu._probe.StepProbe``).

It watches a fit from the side and keeps numbers only (no reference to the trainer or the model):

* **host syncs in the training step** -- on every training batch that is not one of Lightning's
  logging steps (every ``log_every_n_steps``, where ``self.log`` values are read and a sync is
  allowed), ``on_train_batch_start`` calls ``torch.cuda.set_sync_debug_mode(mode)`` and
  ``on_train_batch_end`` resets it to 0.  The window holds the other callbacks'
  ``on_train_batch_start`` that run after this one, the module's ``on_train_batch_start``,
  ``training_step``, the backward pass, the optimiser step (with ReLIC's EMA update inside
  ``optimizer_step``) and the module's gradient hooks.  Mode ``"error"`` stops the fit at the
  first sync with its traceback; mode ``"warn"`` (the tier's default) lets the fit finish and
  records the Python stack of every sync made on the main thread, so one run reports every sync
  site and still measures memory and time.  Under ``16-mixed``, torch's ``GradScaler.step``
  reads its inf/NaN flag with ``.item()`` (torch's design for non-fused optimisers): that call
  alone runs with the check off, and the number of such steps is reported.
* **peak memory** -- ``torch.cuda.reset_peak_memory_stats()`` at ``on_fit_start``;
  ``max_memory_allocated`` / ``max_memory_reserved`` at ``on_fit_end`` (training, validation
  and checkpointing of the whole fit).
* **time per step** -- a CUDA event recorded after each training batch (no sync); at the end
  of the fit the median interval between consecutive batches of the same epoch, after the
  first ``warmup`` batches (on CPU: ``time.perf_counter``).

Results land in :data:`RESULTS` under the ``key`` given to the callback.
"""

from __future__ import annotations

import statistics
import threading
import time
import traceback
import warnings
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback

#: key -> what one fit measured (read and removed by the test that started the fit)
RESULTS: dict[str, dict[str, Any]] = {}
#: the text of torch's sync-debug warning / error
SYNC_MESSAGE = "called a synchronizing CUDA operation"
MIB = 2**20


def is_logging_step(trainer: L.Trainer) -> bool:
    """Lightning's own test, as asked in ``on_train_batch_start``: does this batch update the loggers?"""
    connector = getattr(trainer, "_logger_connector", None)
    if connector is not None and hasattr(connector, "should_update_logs"):
        return bool(connector.should_update_logs)
    every = trainer.log_every_n_steps
    return every > 0 and (trainer.global_step + 1) % every == 0


def _sync_site(stack: list[traceback.FrameSummary]) -> str:
    """The innermost frame outside torch/warnings internals (where the sync was asked for), as ``file:line (function)``."""
    for frame in reversed(stack):
        path = frame.filename.replace("\\", "/")
        if "/torch/" in path or path.endswith(("/warnings.py", "/_py_warnings.py", "tests/gpu/_probe.py")):
            continue
        return f"{path}:{frame.lineno} ({frame.name})"
    last = stack[-1] if stack else None
    return f"{last.filename}:{last.lineno} ({last.name})" if last else "?"


class StepProbe(Callback):
    """Sync check, peak memory and step time of one fit (see the module docstring).

    Args:
        key: where the numbers go in :data:`RESULTS`.
        sync_mode: ``"warn"`` (record every sync and go on), ``"error"`` (stop at the first) or
            ``"off"`` (no sync check).  Only on CUDA.
        warmup: training batches left out of the step time.
    """

    def __init__(self, key: str, sync_mode: str = "warn", warmup: int = 3) -> None:
        if sync_mode not in ("warn", "error", "off"):
            raise ValueError(f"sync_mode must be 'warn', 'error' or 'off', got {sync_mode!r}")
        self.key = key
        self.sync_mode = sync_mode
        self.warmup = warmup
        self.cuda = False
        self.batches = 0
        self.checked = 0
        self.logging = 0
        self.scaler_steps = 0
        self.syncs: list[dict[str, Any]] = []
        self.marks: list[tuple[int, Any]] = []  # (epoch, CUDA event or perf_counter time) after each batch
        self.start_alloc = 0
        self._active = False
        self._scaler: Any = None
        self._warnings: Any = None
        self._showwarning: Any = None

    # ---------------------------------------------------------------- sync window
    def _set_mode(self, mode: str | int) -> None:
        if self.cuda and self.sync_mode != "off":
            torch.cuda.set_sync_debug_mode(mode)

    def _on_warning(self, message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if SYNC_MESSAGE in str(message) and self._active and threading.current_thread() is threading.main_thread():
            stack = traceback.extract_stack()[:-1]
            self.syncs.append({"batch": self.batches - 1, "site": _sync_site(stack), "stack": traceback.format_list(stack[-14:])})
            return
        self._showwarning(message, category, filename, lineno, file, line)

    def _wrap_scaler(self, trainer: L.Trainer) -> None:
        scaler = getattr(trainer.precision_plugin, "scaler", None)
        if scaler is None or not self.cuda:
            return
        original = scaler.step

        def step(*args: Any, **kwargs: Any) -> Any:  # GradScaler.step reads found_inf with .item(): torch's, not ours
            mode = torch.cuda.get_sync_debug_mode()
            torch.cuda.set_sync_debug_mode(0)
            self.scaler_steps += 1
            try:
                return original(*args, **kwargs)
            finally:
                torch.cuda.set_sync_debug_mode(mode)

        scaler.step = step
        self._scaler = scaler

    # ---------------------------------------------------------------- hooks
    def setup(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        self.cuda = pl_module.device.type == "cuda" or trainer.strategy.root_device.type == "cuda"
        if self.cuda and self.sync_mode == "warn":
            self._warnings = warnings.catch_warnings()
            self._warnings.__enter__()
            warnings.filterwarnings("always", message=SYNC_MESSAGE)
            self._showwarning = warnings.showwarning
            warnings.showwarning = self._on_warning

    def on_fit_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        if self.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            self.start_alloc = torch.cuda.memory_allocated()
        self._wrap_scaler(trainer)

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: Any, batch_idx: int) -> None:
        self.batches += 1
        if is_logging_step(trainer):
            self.logging += 1
            return
        if self.cuda and self.sync_mode != "off":
            self.checked += 1
            self._active = True
            self._set_mode(self.sync_mode)

    def on_train_batch_end(self, trainer: L.Trainer, pl_module: L.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self._active:
            self._set_mode(0)
            self._active = False
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((trainer.current_epoch, event))
        else:
            self.marks.append((trainer.current_epoch, time.perf_counter()))

    def _step_ms(self) -> float | None:
        if self.cuda:
            torch.cuda.synchronize()
        gaps = []
        for i in range(max(1, self.warmup), len(self.marks)):
            (e0, a), (e1, b) = self.marks[i - 1], self.marks[i]
            if e0 != e1:
                continue  # validation and checkpoints happen between epochs
            gaps.append(a.elapsed_time(b) if self.cuda else 1000.0 * (b - a))
        return statistics.median(gaps) if gaps else None

    def on_fit_end(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        result: dict[str, Any] = {
            "device": str(trainer.strategy.root_device),
            "batches": self.batches,
            "global_step": int(trainer.global_step),
            "sync_mode": self.sync_mode if self.cuda else "off (no CUDA)",
            "checked_batches": self.checked,
            "logging_batches": self.logging,
            "scaler_steps_unchecked": self.scaler_steps,
            "syncs": self.syncs,
            "ms_per_step": self._step_ms(),
            "log_dir": trainer.log_dir,
            # the last logged training losses (read here, after the fit: a sync outside the checked window)
            "train_losses": {
                k: float(v)
                for k, v in trainer.callback_metrics.items()
                if k.startswith("train/loss") and isinstance(v, torch.Tensor) and v.numel() == 1
            },
        }
        if self.cuda:
            result.update(
                start_alloc_mib=self.start_alloc / MIB,
                peak_alloc_mib=torch.cuda.max_memory_allocated() / MIB,
                peak_reserved_mib=torch.cuda.max_memory_reserved() / MIB,
            )
        RESULTS[self.key] = result

    def _restore(self) -> None:
        if self._active:
            self._set_mode(0)
            self._active = False
        if self.cuda:
            torch.cuda.set_sync_debug_mode(0)
        if self._warnings is not None:
            warnings.showwarning = self._showwarning
            self._warnings.__exit__(None, None, None)
            self._warnings = None
        if self._scaler is not None:
            del self._scaler.step  # the instance attribute set by _wrap_scaler; the class's method again
            self._scaler = None

    def on_exception(self, trainer: L.Trainer, pl_module: L.LightningModule, exception: BaseException) -> None:
        self._restore()
        RESULTS.setdefault(self.key, {"syncs": self.syncs, "batches": self.batches})

    def teardown(self, trainer: L.Trainer, pl_module: L.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._restore()
