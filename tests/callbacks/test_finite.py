"""Direct tests of :mod:`cloc_lightning.callbacks.finite`: the NaN/inf guards and the train-nothing refusal.

Hooks are driven one at a time with stand-ins for the trainer and module (the guards read only a
few attributes), against a plain reference (``torch.isfinite`` per tensor) and for each setting
that turns a guard off.
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from cloc_lightning.callbacks.finite import (
    FiniteChecks,
    check_trains_something,
    grads_finite,
    nonfinite_grad_message,
    nonfinite_loss_message,
    nonfinite_monitor_message,
)
from cloc_lightning.checks import DeferredChecks


@pytest.mark.parametrize("seed", range(6))
def test_grads_finite_equals_the_per_tensor_reference(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    grads = [
        torch.randn(int(torch.randint(1, 50, (1,), generator=g)), generator=g) * 10.0 ** float(torch.randint(-20, 18, (1,), generator=g))
        for _ in range(5)
    ]
    grads.append(torch.randn(7, dtype=torch.float64, generator=g))  # a second dtype: its own fused group
    if seed % 3 == 1:
        grads[seed % 5].view(-1)[0] = math.nan
    elif seed % 3 == 2:
        grads[-1][3] = -math.inf
    reference = all(bool(torch.isfinite(t).all()) for t in grads)
    out = grads_finite(grads)
    assert out.dtype == torch.bool and out.dim() == 0
    assert bool(out) is reference and reference is (seed % 3 == 0)


def test_messages_name_the_owner_and_the_fixes() -> None:
    loss = nonfinite_loss_message("CLOCModule")
    assert loss.startswith("CLOCModule: ") and "--model.lr" in loss and "--trainer.gradient_clip_val" in loss
    assert "--model.check_finite_loss false" in loss
    grad = nonfinite_grad_message("CEModule")
    assert grad.startswith("CEModule: ") and "--model.strict_checks true" in grad
    mon = nonfinite_monitor_message("CEModule", "val/mae", math.nan, 3, others=False)
    assert "val/mae is nan at epoch 3" in mon and "BestCheckpoint" in mon
    assert "a ModelCheckpoint you configured" in nonfinite_monitor_message("CEModule", "val/mae", math.inf, 3, others=True)


def _limits(max_epochs: Any = 2, max_steps: Any = -1, limit_train_batches: Any = 1.0) -> Any:
    return SimpleNamespace(max_epochs=max_epochs, max_steps=max_steps, limit_train_batches=limit_train_batches)


@pytest.mark.parametrize(
    ("setting", "value", "what"),
    [
        ("max_epochs", 0, "0 epochs"),
        ("max_steps", 0, "0 optimiser steps"),
        ("limit_train_batches", 0, "0 batches"),
        ("limit_train_batches", 0.0, "0 batches"),
    ],
)
def test_check_trains_something_refuses_each_zero(setting: str, value: Any, what: str) -> None:
    with pytest.raises(ValueError, match=rf"^M: trainer.{setting}={value}: fit would train on {what}.*cloc-lightning validate"):
        check_trains_something(_limits(**{setting: value}), "M")


@pytest.mark.parametrize("limits", [{}, {"max_epochs": None}, {"max_steps": 1}, {"limit_train_batches": 1}, {"limit_train_batches": 0.1}])
def test_check_trains_something_lets_real_runs_go(limits: dict[str, Any]) -> None:
    check_trains_something(_limits(**limits), "M")


class _Module(nn.Module):
    def __init__(self, check: bool = True) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(3))
        self.b = nn.Parameter(torch.ones(2))
        self.hparams = {"check_finite_loss": check}
        self.global_step, self.current_epoch = 7, 1


def _trainer(**kw: Any) -> Any:
    t = SimpleNamespace(
        precision_plugin=SimpleNamespace(),
        is_global_zero=True,
        progress_bar_callback=None,
        sanity_checking=False,
        state=SimpleNamespace(fn="fit"),
        callback_metrics={},
        checkpoint_callbacks=[],
        ckpt_path=None,
    )
    t.__dict__.update(kw)
    return t


def test_loss_guard_raises_before_the_backward_pass_and_can_be_turned_off() -> None:
    cb = FiniteChecks()
    cb.on_before_backward(_trainer(), _Module(), torch.tensor(1.5))  # type: ignore[arg-type]
    with pytest.raises(FloatingPointError, match=r"^_Module: the training loss is not finite .* Loss nan at step 7 \(epoch 1\)"):
        cb.on_before_backward(_trainer(), _Module(), torch.tensor(math.nan))  # type: ignore[arg-type]
    cb.on_before_backward(_trainer(), _Module(check=False), torch.tensor(math.nan))  # type: ignore[arg-type]


def test_loss_guard_is_recorded_when_deferring() -> None:
    checks = DeferredChecks()
    with checks.active():
        FiniteChecks().on_before_backward(_trainer(), _Module(), torch.tensor(math.inf))  # type: ignore[arg-type]
    with pytest.raises(FloatingPointError, match="the training loss is not finite"):
        checks.raise_if_failed("at step 7", across_processes=False)


def _optimizer(m: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(m.parameters(), lr=0.1)


def test_gradient_guard_names_the_tensors_and_skips_under_a_grad_scaler() -> None:
    cb, m = FiniteChecks(), _Module()
    m.w.grad = torch.tensor([0.0, math.nan, 1.0])
    m.b.grad = torch.zeros(2)
    with pytest.raises(FloatingPointError, match=r"Non-finite in 1 tensor\(s\) \['w'\] at step 7"):
        cb.on_before_optimizer_step(_trainer(), m, _optimizer(m))  # type: ignore[arg-type]
    scaler = _trainer(precision_plugin=SimpleNamespace(scaler=object()))
    cb.on_before_optimizer_step(scaler, m, _optimizer(m))  # type: ignore[arg-type]  # fp16's scaler skips such steps
    cb.on_before_optimizer_step(_trainer(), _Module(check=False), _optimizer(m))  # type: ignore[arg-type]
    m.w.grad = torch.ones(3)
    cb.on_before_optimizer_step(_trainer(), m, _optimizer(m))  # type: ignore[arg-type]
    fresh = _Module()
    cb.on_before_optimizer_step(_trainer(), fresh, _optimizer(fresh))  # type: ignore[arg-type]  # no grads yet


def test_monitor_warning(capsys: pytest.CaptureFixture[str]) -> None:
    m = _Module()
    m.monitor = "val/mae"  # type: ignore[assignment]
    cb = FiniteChecks()
    cb.on_validation_end(_trainer(callback_metrics={"val/mae": torch.tensor(0.7)}), m)  # type: ignore[arg-type]
    cb.on_validation_end(_trainer(callback_metrics={"val/mae": torch.tensor(math.nan)}, sanity_checking=True), m)  # type: ignore[arg-type]
    cb.on_validation_end(_trainer(callback_metrics={"val/mae": torch.tensor(math.nan)}, state=SimpleNamespace(fn="validate")), m)  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    cb.on_validation_end(_trainer(callback_metrics={"val/mae": torch.tensor(math.nan)}), m)  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "warning: _Module: the monitored metric val/mae is nan at epoch 1" in err


def test_test_warning_names_the_metrics_and_the_weights(capsys: pytest.CaptureFixture[str]) -> None:
    cb = FiniteChecks()
    cb.on_test_end(_trainer(callback_metrics={"test/mae": torch.tensor(0.3), "val/x": torch.tensor(math.nan)}), _Module())  # type: ignore[arg-type]
    assert capsys.readouterr().err == ""
    cb.on_test_end(
        _trainer(callback_metrics={"test/mae": torch.tensor(math.nan), "test/acc": torch.tensor(math.inf)}, ckpt_path="best.ckpt"),
        _Module(),
    )  # type: ignore[arg-type]
    err = capsys.readouterr().err
    assert "the test metrics ['test/acc', 'test/mae'] are NaN/inf: the weights of best.ckpt" in err
