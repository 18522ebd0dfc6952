"""``BaseModule.log_eval_mean``: evaluation losses are per-row means over the epoch (batches of unequal size).

The DDP side (ranks holding different numbers of rows) is ``tests/e2e/test_ddp_eval.py``.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Any, ClassVar

import torch
import torch.nn.functional as F

from cloc_lightning.data import OrdinalShapesDataModule
from cloc_lightning.methods import CEModule
from tests.conftest import TINY_BACKBONE, cpu_trainer

_trainer = partial(cpu_trainer, enable_checkpointing=False)


def test_validation_and_test_loss_are_the_mean_over_every_row() -> None:
    torch.manual_seed(0)
    model = CEModule(num_classes=4, backbone=TINY_BACKBONE)
    dm = OrdinalShapesDataModule(num_classes=4, train_size=16, val_size=17, test_size=13, batch_size=8, num_workers=0)
    trainer = _trainer()
    got = {**trainer.validate(model, datamodule=dm, verbose=False)[0], **trainer.test(model, datamodule=dm, verbose=False)[0]}
    model.eval()
    for split, n in (("val", 17), ("test", 13)):  # batches of 8, 8, 1 and 8, 5
        ds = getattr(dm, f"{split}_set")
        x = torch.stack([ds[i][0] for i in range(n)])
        y = torch.tensor([ds[i][1] for i in range(n)])
        with torch.no_grad():
            per_row = F.cross_entropy(model(x), y, reduction="none")
        assert math.isclose(got[f"{split}/loss"], float(per_row.mean()), rel_tol=1e-5), (split, got)
        batch_means = torch.stack([per_row[i : i + 8].mean() for i in range(0, n, 8)])
        assert not math.isclose(float(batch_means.mean()), float(per_row.mean()), rel_tol=1e-5)  # the test can tell them apart


class _Logs(CEModule):
    """Logs known values with known weights (a subclass as a user would write one)."""

    values: ClassVar[list[tuple[float, int]]] = []

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        value, weight = self.values[batch_idx]
        self.log_eval_mean("val/custom", torch.tensor(value), weight)


def _custom(values: list[tuple[float, int]]) -> float:
    _Logs.values = values
    model = _Logs(num_classes=4, backbone=TINY_BACKBONE)
    dm = OrdinalShapesDataModule(num_classes=4, train_size=16, val_size=8 * len(values), test_size=8, batch_size=8, num_workers=0)
    return _trainer().validate(model, datamodule=dm, verbose=False)[0]["val/custom"]


def test_log_eval_mean_weights_and_keeps_nan() -> None:
    assert math.isclose(_custom([(1.0, 8), (4.0, 1), (2.0, 3)]), (8 + 4 + 6) / 12, rel_tol=1e-6)
    assert math.isnan(_custom([(1.0, 8), (float("nan"), 1)]))  # a NaN loss shows, it is not dropped
    assert math.isclose(_custom([(1.0, 8), (float("nan"), 0), (4.0, 1)]), 12 / 9, rel_tol=1e-6)  # a mean over 0 rows adds nothing
