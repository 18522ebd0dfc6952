"""Write ``predict`` outputs to a CSV file (one file under DDP too)."""

from __future__ import annotations

import csv
import os
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import lightning as L
import torch
from lightning.pytorch.callbacks import BasePredictionWriter

from cloc_lightning._logging import print_line

__all__ = ["PredictionWriter", "merge_prediction_parts"]


def merge_prediction_parts(parts: Sequence[str], output_path: str, remove: bool = True) -> int:
    """Merge the per-rank CSV files of a DDP ``predict`` into ``output_path``, sorted by the ``index`` column.

    Rows repeating an index already seen are dropped (Lightning's predict sampler gives
    every sample to one rank only, so there should be none); empty parts (a rank that
    received no sample) are skipped.

    Args:
        parts: the per-rank files (``predictions.rank<k>.csv``), all with the same header.
        output_path: the merged file; not written when every part is empty.
        remove: delete the parts after merging.

    Returns:
        The number of rows written.

    Raises:
        FileNotFoundError: a part is missing (its rank failed, or the ranks do not share
            the output folder: set ``PredictionWriter(output_path=...)`` to a shared folder).
        ValueError: the parts have different headers or no ``index`` first column.
    """
    header: list[str] | None = None
    rows: dict[int, list[str]] = {}
    for part in parts:
        if not os.path.isfile(part):
            raise FileNotFoundError(
                f"prediction part {part!r} is missing: its rank failed or cannot write to this folder; "
                "every rank must see the same output folder (set PredictionWriter output_path to a shared path)"
            )
        with open(part, newline="") as f:
            reader = csv.reader(f)
            part_header = next(reader, None)
            if part_header is None:
                continue
            if header is None:
                header = part_header
            if part_header != header or header[0] != "index":
                raise ValueError(f"prediction part {part!r} has header {part_header}, expected {header} (index first)")
            for row in reader:
                rows.setdefault(int(row[0]), row)
    if header is not None:
        os.makedirs(os.path.dirname(os.path.abspath(output_path)), exist_ok=True)
        with open(output_path, "w", newline="") as f:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows[i] for i in sorted(rows))
    if remove:
        for part in parts:
            os.remove(part)
    return len(rows)


def _first_loader(nested: Sequence[Any]) -> list[Any]:
    """Dataloader 0's list of per-batch items from Lightning's per-dataloader nesting (or an unnested list)."""
    if nested and isinstance(nested[0], list) and (not nested[0] or isinstance(nested[0][0], (list, tuple, dict))):
        return list(nested[0])
    return list(nested)


def _describer(trainer: L.Trainer) -> Callable[[int], str] | None:
    """The predict dataset's ``describe(index)`` (file path or in-memory sample name), if it has one."""
    loaders = trainer.predict_dataloaders
    if isinstance(loaders, dict):
        loaders = next(iter(loaders.values()), None)
    elif isinstance(loaders, (list, tuple)):
        loaders = loaders[0] if loaders else None
    describe = getattr(getattr(loaders, "dataset", None), "describe", None)
    return describe if callable(describe) else None


class PredictionWriter(BasePredictionWriter):
    """Collect ``predict_step`` dicts and write one CSV row per sample at the end of ``predict``.

    Columns: ``index`` (the sample's index in the predict dataset), ``path`` (the image
    file, or the dataset's ``describe(index)`` for in-memory samples; empty if the dataset
    has no ``describe``), ``target`` (when labels exist), ``pred`` (arg-max class),
    ``expected`` (expected rank), ``rank`` (when ``predict_step`` gives one: an ordinal
    regression module's own prediction, CORN/CORAL), ``regression`` (when ``predict_step`` gives
    one: a regressor's raw output, :class:`~cloc_lightning.methods.LinearRegressorModule`) and the
    class probabilities ``p0 .. p{C-1}`` (when given).

    Under DDP every rank writes its share to ``predictions.rank<k>.csv``; after a barrier
    rank 0 merges the parts into one ``predictions.csv`` sorted by index
    (:func:`merge_prediction_parts`) and removes them, and a second barrier lets every
    rank return once the file exists.  The ranks must share the output folder.

    Args:
        output_path: CSV path; default ``<trainer.log_dir>/predictions.csv``.
    """

    def __init__(self, output_path: str | None = None) -> None:
        super().__init__(write_interval="epoch")
        self.output_path = output_path
        self.written: str | None = None

    def _table(
        self, trainer: L.Trainer, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> tuple[list[str], list[list[Any]]] | None:
        """Header and rows of this rank's predictions; ``None`` when there are none (or they are not dicts)."""
        outs = _first_loader(predictions)
        if not outs:
            return None
        if not isinstance(outs[0], dict):
            warnings.warn(
                f"PredictionWriter writes the dicts of predict_step; got {type(outs[0]).__name__}, nothing written",
                stacklevel=2,
            )
            return None
        cat = {k: torch.cat([o[k].detach().cpu() for o in outs]) for k in outs[0]}
        n = len(cat["pred"])
        indices = [int(i) for batch in _first_loader(batch_indices) for i in batch]
        if len(indices) != n:
            warnings.warn(
                "PredictionWriter: the loader's batch indices are unavailable (not a DataLoader with a batch sampler); "
                "the index column is the row number of this process's output",
                stacklevel=2,
            )
            indices = list(range(n))
        describe = _describer(trainer)
        probs = cat.get("probs")
        header = ["index", "path"] + (["target"] if "target" in cat else []) + ["pred", "expected"]
        header += ["rank"] if "rank" in cat else []
        header += ["regression"] if "regression" in cat else []
        header += [f"p{c}" for c in range(probs.shape[1])] if probs is not None else []
        rows: list[list[Any]] = []
        for i, index in enumerate(indices):
            row: list[Any] = [index, describe(index) if describe is not None else ""]
            row += [int(cat["target"][i])] if "target" in cat else []
            row += [int(cat["pred"][i]), f"{float(cat['expected'][i]):.4f}"]
            row += [int(cat["rank"][i])] if "rank" in cat else []
            row += [f"{float(cat['regression'][i]):.4f}"] if "regression" in cat else []
            row += [f"{float(p):.5f}" for p in probs[i]] if probs is not None else []
            rows.append(row)
        return header, rows

    def write_on_epoch_end(
        self, trainer: L.Trainer, pl_module: L.LightningModule, predictions: Sequence[Any], batch_indices: Sequence[Any]
    ) -> None:
        # every rank runs this method to the end: log_dir (a broadcast) and the barriers are collectives
        log_dir = trainer.log_dir if self.output_path is None else None
        path = self.output_path or os.path.join(log_dir or ".", "predictions.csv")
        table = self._table(trainer, predictions, batch_indices)
        if trainer.world_size <= 1:
            if table is not None:
                _write_csv(path, *table)
                self.written = path
                print_line(trainer, f"predictions written to {path}")
            return
        root, ext = os.path.splitext(path)
        parts = [f"{root}.rank{r}{ext}" for r in range(trainer.world_size)]
        _write_csv(parts[trainer.global_rank], *(table or ([], [])))  # empty file: no sample on this rank
        trainer.strategy.barrier("PredictionWriter.parts")
        error: Exception | None = None
        n = 0
        if trainer.is_global_zero:
            try:
                n = merge_prediction_parts(parts, path)
            except (OSError, ValueError) as e:  # raised after the barrier, so no rank is left waiting
                error = e
        trainer.strategy.barrier("PredictionWriter.merged")
        if error is not None:
            raise error
        if os.path.isfile(path):
            self.written = path
        if n:
            print_line(trainer, f"predictions written to {path} ({n} rows from {trainer.world_size} processes)")


def _write_csv(path: str, header: list[str], rows: list[list[Any]]) -> None:
    """Write ``header`` and ``rows`` to ``path`` (an empty file without a header)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", newline="") as f:
        if header:
            w = csv.writer(f)
            w.writerow(header)
            w.writerows(rows)
