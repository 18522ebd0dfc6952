"""Direct tests of :mod:`cloc_lightning.methods.tracking`: the final and best validation values of a fit.

A minimal LightningModule mixes in :class:`BestFinalTracking` the way ``ClassifierModule`` does and
reports a scripted validation value per epoch, so the tracked final/best (NaN never an improvement,
``min`` and ``max`` modes, the summary line, the values sent to the loggers and the checkpoint
round trip) are compared with the script itself.
"""

from __future__ import annotations

import csv
import math
from typing import Any, Literal

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader, TensorDataset
from torchmetrics import MeanMetric, MetricCollection

from cloc_lightning.methods.tracking import BestFinalTracking
from tests.conftest import cpu_trainer


class _Scripted(BestFinalTracking, L.LightningModule):
    """Reports ``script[epoch]`` as ``val/mae`` and ``1 - script[epoch]`` as ``val/acc`` each validation epoch."""

    def __init__(self, script: list[float], mode: Literal["min", "max"] = "min") -> None:
        super().__init__()
        self.script, self._mode = script, mode
        self.layer = torch.nn.Linear(2, 1)
        self.val_summary = {}
        self.val_metrics = MetricCollection({"val/mae": MeanMetric(nan_strategy="disable"), "val/acc": MeanMetric(nan_strategy="disable")})

    @property
    def monitor(self) -> str:
        return "val/mae"

    @property
    def monitor_mode(self) -> Literal["min", "max"]:
        return self._mode

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        return self.layer(batch[0]).pow(2).mean()

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        assert self.val_metrics is not None
        v = self.script[self.current_epoch]
        self.val_metrics["val/mae"].update(torch.tensor(v))
        self.val_metrics["val/acc"].update(torch.tensor(1.0 - v))

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()
        assert self.val_metrics is not None
        self.val_metrics.reset()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _loader() -> DataLoader[Any]:
    return DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)


def _fit(script: list[float], tmp: Any, mode: Literal["min", "max"] = "min", **kw: Any) -> tuple[_Scripted, L.Trainer]:
    model = _Scripted(script, mode)
    trainer = cpu_trainer(tmp, max_epochs=len(script), num_sanity_val_steps=0, **kw)
    trainer.fit(model, _loader(), _loader())
    return model, trainer


def _reference(script: list[float], better: Any) -> tuple[float, int]:
    """Best finite value and its first epoch, by a plain loop over the script."""
    best, at = math.nan, -1
    for e, v in enumerate(script):
        if math.isfinite(v) and (not math.isfinite(best) or better(v, best)):
            best, at = v, e
    return best, at


@pytest.mark.parametrize("script", [[0.5, 0.3, math.nan, 0.4], [math.nan, 0.9, 0.9, 0.2], [0.1, math.inf, 0.3]])
def test_final_and_best_follow_the_script(script: list[float], tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    model, _ = _fit(script, tmp_path)
    mae, acc = model.val_summary["val/mae"], model.val_summary["val/acc"]
    best, at = _reference(script, lambda a, b: a < b)
    assert (mae["best"], mae["best_epoch"]) == pytest.approx((best, at))
    assert mae["final_epoch"] == len(script) - 1 and (mae["final"] == pytest.approx(script[-1]) or not math.isfinite(script[-1]))
    best_acc, at_acc = _reference([1.0 - v for v in script], lambda a, b: a > b)  # val/acc is always tracked, as max
    assert (acc["best"], acc["best_epoch"]) == pytest.approx((best_acc, at_acc))
    out = capsys.readouterr().out
    assert out.startswith("_Scripted: val/acc final ") and "; val/mae final " in out and f"best {best:.4f} (epoch {at})" in out


def test_max_mode_and_a_run_without_a_finite_epoch(tmp_path: Any) -> None:
    model, _ = _fit([0.2, 0.6, 0.4], tmp_path, mode="max")
    assert (model.val_summary["val/mae"]["best"], model.val_summary["val/mae"]["best_epoch"]) == pytest.approx((0.6, 1))
    model, _ = _fit([math.nan, math.nan], tmp_path / "b")
    assert math.isnan(model.val_summary["val/mae"]["best"])
    assert "best none (no epoch had a finite value: the run diverged)" in model.summary_line()


def test_logged_running_best_and_final_values(tmp_path: Any) -> None:
    _, trainer = _fit([0.5, 0.3, 0.4], tmp_path, logger=CSVLogger(str(tmp_path), name="t"), log_every_n_steps=1)
    with open(f"{trainer.logger.log_dir}/metrics.csv") as f:  # type: ignore[union-attr]
        rows = list(csv.DictReader(f))
    running = [float(r["val/mae_best"]) for r in rows if r.get("val/mae_best") and r.get("val/mae_final", "") == ""]
    assert running == pytest.approx([0.5, 0.3, 0.3])  # the running best, epoch by epoch
    final = [r for r in rows if r.get("val/mae_final")]
    assert len(final) == 1 and float(final[0]["val/mae_final"]) == pytest.approx(0.4)
    assert float(final[0]["val/mae_best_epoch"]) == 1.0


def test_checkpoint_round_trip_and_resumed_history(tmp_path: Any) -> None:
    model, trainer = _fit([0.5, 0.3], tmp_path)
    ckpt: dict[str, Any] = {}
    model.on_save_checkpoint(ckpt)
    assert ckpt[BestFinalTracking.VAL_HISTORY_KEY] == model.val_summary
    fresh = _Scripted([0.0])
    fresh.on_load_checkpoint(ckpt)  # no history of its own: takes the saved one
    assert fresh.val_summary == model.val_summary
    own = {"val/mae": {"final": 0.1, "final_epoch": 9.0, "best": 0.1, "best_epoch": 9.0}}
    fresh.val_summary = {k: dict(v) for k, v in own.items()}
    fresh.on_load_checkpoint(ckpt)  # outside a fit, a module that has a history keeps it (test_after_fit)
    assert fresh.val_summary == own
    # a resumed fit continues the saved history: epoch 2 (0.4) is no improvement over epoch 1 (0.3)
    resumed = _Scripted([0.5, 0.3, 0.4])
    trainer2 = cpu_trainer(tmp_path, max_epochs=3, num_sanity_val_steps=0)
    last = tmp_path / "last.ckpt"
    trainer.save_checkpoint(last)
    trainer2.fit(resumed, _loader(), _loader(), ckpt_path=str(last))
    assert (resumed.val_summary["val/mae"]["best"], resumed.val_summary["val/mae"]["best_epoch"]) == pytest.approx((0.3, 1))
    assert resumed.val_summary["val/mae"]["final_epoch"] == 2
