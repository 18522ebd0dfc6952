"""Write ``predict`` outputs to a CSV file."""

from __future__ import annotations

import csv
import os
from typing import Any, Sequence

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

__all__ = ["PredictionWriter"]


class PredictionWriter(BasePredictionWriter):
    """Collect ``predict_step`` dicts and write one CSV row per sample at the end of ``predict``.

    Columns: ``index``, ``target`` (when labels exist), ``pred`` (arg-max class),
    ``expected`` (expected rank) and the class probabilities ``p0 .. p{C-1}``.
    Under DDP every rank writes ``predictions.rank<k>.csv``.

    Args:
        output_path: CSV path; default ``<trainer.log_dir>/predictions.csv``.
    """

    def __init__(self, output_path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.written: str | None = None

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        outs = predictions[0] if predictions and isinstance(predictions[0], list) else predictions
        if not outs or not isinstance(outs[0], dict):
            return
        cat = {k: torch.cat([o[k].detach().cpu() for o in outs]) for k in outs[0]}
        path = self.output_path or os.path.join(trainer.log_dir or ".", "predictions.csv")
        if trainer.world_size > 1:
            root, ext = os.path.splitext(path)
            path = f"{root}.rank{trainer.global_rank}{ext}"
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        probs = cat.get("probs")
        n = len(cat["pred"])
        with open(path, "w", newline="") as f:
            w = csv.writer(f)
            header = ["index"] + (["target"] if "target" in cat else []) + ["pred", "expected"]
            header += [f"p{c}" for c in range(probs.shape[1])] if probs is not None else []
            w.writerow(header)
            for i in range(n):
                row: list[Any] = [i] + ([int(cat["target"][i])] if "target" in cat else [])
                row += [int(cat["pred"][i]), f"{float(cat['expected'][i]):.4f}"]
                row += [f"{float(p):.5f}" for p in probs[i]] if probs is not None else []
                w.writerow(row)
        self.written = path
        print(f"predictions written to {path}")
