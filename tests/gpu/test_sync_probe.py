"""The GPU tier's sync check can fail: a planted host sync is caught, Lightning's logging steps are exempt
(``pytest -m gpu``; on a CUDA device only, since only CUDA has ``set_sync_debug_mode``).

A plain LightningModule (one linear layer, ``self.log`` of a tensor) is the baseline: with it the
:class:`~tests.gpu._probe.StepProbe` must record no sync at any precision, so a sync that it records
in a shipped config is the library's.  Planting ``float(loss)`` in ``training_step`` must be recorded
on every checked batch (and at this file's line), never on a logging step; mode ``"error"`` must stop
the fit and leave the sync-debug mode off.
"""

from __future__ import annotations

import uuid
from typing import Any

import lightning as L
import pytest
import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from tests.gpu import _probe
from tests.gpu.conftest import CUDA

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="the sync check needs a CUDA device (set_sync_debug_mode)")]

STEPS, EVERY = 7, 3  # logging steps: batches 3 and 6 (Lightning counts from 1); batch 7 ends the fit


class _Tiny(L.LightningModule):
    def __init__(self, plant: bool) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(16, 4)
        self.plant = plant

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = F.cross_entropy(self.layer(x), y)
        if self.plant:
            _ = float(loss)  # planted: a host sync
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)


def _fit(plant: bool, precision: str, mode: str) -> dict[str, Any]:
    key = f"planted-{uuid.uuid4().hex[:8]}"
    data = TensorDataset(torch.randn(STEPS * 8, 16), torch.randint(0, 4, (STEPS * 8,)))
    trainer = L.Trainer(
        accelerator="gpu",
        devices=1,
        precision=precision,
        max_steps=STEPS,
        log_every_n_steps=EVERY,
        logger=L.pytorch.loggers.CSVLogger("/tmp", name=key),
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[_probe.StepProbe(key, sync_mode=mode)],
    )
    trainer.fit(_Tiny(plant), DataLoader(data, batch_size=8))
    return _probe.RESULTS.pop(key)


@pytest.mark.parametrize("precision", ["32-true", "16-mixed", "bf16-mixed"])
def test_plain_module_has_no_sync_and_a_planted_one_is_caught(precision: str) -> None:
    clean = _fit(plant=False, precision=precision, mode="warn")
    assert clean["batches"] == STEPS and clean["logging_batches"] == 2 and clean["checked_batches"] == STEPS - 2
    assert clean["syncs"] == [], f"plain Lightning syncs in the training step at {precision}: {[s['site'] for s in clean['syncs']]}"
    if precision == "16-mixed":
        assert clean["scaler_steps_unchecked"] >= STEPS - 2  # GradScaler.step ran with the check off
    planted = _fit(plant=True, precision=precision, mode="warn")
    assert planted["checked_batches"] == STEPS - 2
    assert {s["batch"] for s in planted["syncs"]} == {0, 1, 3, 4, 6}, planted["syncs"]  # never the logging batches 2, 5
    assert all("test_sync_probe.py" in s["site"] and "training_step" in s["site"] for s in planted["syncs"]), planted["syncs"]
    assert torch.cuda.get_sync_debug_mode() == 0


def test_error_mode_stops_at_the_planted_sync_and_switches_the_check_off() -> None:
    with pytest.raises(RuntimeError, match=_probe.SYNC_MESSAGE):
        _fit(plant=True, precision="32-true", mode="error")
    assert torch.cuda.get_sync_debug_mode() == 0
