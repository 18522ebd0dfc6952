"""Direct tests of :mod:`cloc_lightning.callbacks.checks`: when :class:`DeviceChecks` reads the deferred checks.

The callback is driven hook by hook with a stand-in trainer (it reads only ``global_step``,
``log_every_n_steps`` and the logger connector's ``should_update_logs``), so each promise of its
docstring is checked on its own: checks are recorded, not raised, inside a batch; read at a logging
step, at the end of an epoch and before a checkpoint; raised with the batch of the first failure;
``strict`` raises at once; an exception drops what was recorded.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cloc_lightning.callbacks.checks import DeviceChecks, is_logging_step
from cloc_lightning.checks import deferring, require

CPU = SimpleNamespace(device=torch.device("cpu"))


def _trainer(step: int, every: int = 3, flag: Any = None) -> Any:
    t = SimpleNamespace(global_step=step, log_every_n_steps=every, current_epoch=0)
    if flag is not None:
        t._logger_connector = SimpleNamespace(should_update_logs=flag)
    return t


@pytest.mark.parametrize(("step", "every", "expected"), [(2, 3, True), (5, 3, True), (3, 3, False), (0, 1, True), (4, 0, False)])
def test_is_logging_step_without_lightnings_flag(step: int, every: int, expected: bool) -> None:
    assert is_logging_step(_trainer(step, every)) is expected


@pytest.mark.parametrize("flag", [True, False])
def test_is_logging_step_follows_lightnings_flag(flag: bool) -> None:
    assert is_logging_step(_trainer(step=1, every=3, flag=flag)) is flag  # step 1 of every 3 would say False


def _batch(cb: DeviceChecks, trainer: Any, ok: bool, batch_idx: int) -> None:
    cb.on_train_batch_start(trainer, CPU, None, batch_idx)  # type: ignore[arg-type]
    require(torch.tensor(ok), "the value must be finite; fix: lower the lr", FloatingPointError)
    cb.on_train_batch_end(trainer, CPU, None, None, batch_idx)  # type: ignore[arg-type]


def test_failures_are_recorded_inside_a_batch_and_raised_at_the_next_logging_step() -> None:
    cb = DeviceChecks()
    _batch(cb, _trainer(step=0), ok=True, batch_idx=0)
    _batch(cb, _trainer(step=1), ok=False, batch_idx=1)  # not a logging step: recorded, not raised
    assert not deferring()  # the batch's end gives require back its raising behaviour
    with pytest.raises(FloatingPointError, match=r"lower the lr \[first failed 1 batch\(es\) after the previous check; read at step 2"):
        _batch(cb, _trainer(step=2), ok=True, batch_idx=2)
    _batch(cb, _trainer(step=5), ok=True, batch_idx=3)  # the read cleared the record


@pytest.mark.parametrize("reader", ["epoch_end", "checkpoint"])
def test_epoch_end_and_checkpoints_read_the_record(reader: str) -> None:
    cb = DeviceChecks()
    trainer = _trainer(step=0, every=100)
    _batch(cb, trainer, ok=False, batch_idx=0)
    with pytest.raises(FloatingPointError, match="end of epoch 0" if reader == "epoch_end" else "before writing a checkpoint"):
        if reader == "epoch_end":
            cb.on_train_epoch_end(trainer, CPU)  # type: ignore[arg-type]
        else:
            cb.on_save_checkpoint(trainer, CPU, {})  # type: ignore[arg-type]


def test_strict_raises_inside_the_batch() -> None:
    cb = DeviceChecks(strict=True)
    cb.on_train_batch_start(_trainer(0), CPU, None, 0)  # type: ignore[arg-type]
    assert not deferring()
    with pytest.raises(FloatingPointError, match="lower the lr$"):
        require(torch.tensor(False), "the value must be finite; fix: lower the lr", FloatingPointError)
    cb.on_train_epoch_end(_trainer(0), CPU)  # type: ignore[arg-type]  # nothing recorded, nothing read


def test_an_exception_drops_the_record() -> None:
    cb = DeviceChecks()
    trainer = _trainer(step=0, every=100)
    _batch(cb, trainer, ok=False, batch_idx=0)
    cb.on_exception(trainer, CPU, RuntimeError("preempted"))  # type: ignore[arg-type]
    assert not cb.checks.pending
    cb.on_train_epoch_end(trainer, CPU)  # type: ignore[arg-type]  # no second error for the same run


def test_teardown_deactivates() -> None:
    cb = DeviceChecks()
    cb.on_train_batch_start(_trainer(0), CPU, None, 0)  # type: ignore[arg-type]
    assert deferring()
    cb.teardown(_trainer(0), CPU, "fit")  # type: ignore[arg-type]
    assert not deferring()
