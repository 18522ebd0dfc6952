"""``PredictionWriter``: the DDP merge of per-rank parts (sorted, duplicates dropped, parts removed), also through
``write_on_epoch_end`` with stand-in ranks that count their collective calls.

``predict`` through the command line and the data module's ``predict_root``: ``tests/cli/test_predict.py``.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

from cloc_lightning.callbacks import PredictionWriter
from cloc_lightning.callbacks.predictions import merge_prediction_parts


def _part(path: Path, rows: list[list[Any]], header: list[str] | None = None) -> str:
    with open(path, "w", newline="") as f:
        if rows or header:
            w = csv.writer(f)
            w.writerow(header or ["index", "path", "pred", "expected", "p0", "p1"])
            w.writerows(rows)
    return str(path)


def test_merge_prediction_parts_sorts_by_index_and_drops_duplicates(tmp_path: Path) -> None:
    parts = [
        _part(
            tmp_path / "p.rank0.csv",
            [[0, "a.png", 1, "0.9", "0.1", "0.9"], [2, "c.png", 0, "0.2", "0.8", "0.2"], [4, "e.png", 1, "0.6", "0.4", "0.6"]],
        ),
        _part(
            tmp_path / "p.rank1.csv",
            [[1, "b.png", 0, "0.1", "0.9", "0.1"], [3, "d.png", 1, "0.7", "0.3", "0.7"], [2, "c.png", 0, "0.2", "0.8", "0.2"]],
        ),  # a repeated sample
        _part(tmp_path / "p.rank2.csv", []),  # a rank that got no sample
    ]
    assert merge_prediction_parts(parts, str(tmp_path / "p.csv")) == 5
    with open(tmp_path / "p.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [r["index"] for r in rows] == ["0", "1", "2", "3", "4"]
    assert [r["path"] for r in rows] == ["a.png", "b.png", "c.png", "d.png", "e.png"]
    assert not list(tmp_path.glob("p.rank*.csv"))

    a = _part(tmp_path / "q.rank0.csv", [[0, "a.png", 1, "0.9", "0.1", "0.9"]])
    b = _part(tmp_path / "q.rank1.csv", [[1, "b.png", 3, 1, 0, 1]], header=["index", "path", "target", "pred", "expected", "p0"])
    with pytest.raises(ValueError, match="has header"):
        merge_prediction_parts([a, b], str(tmp_path / "q.csv"))
    with pytest.raises(FileNotFoundError, match="every rank must see the same output folder"):
        merge_prediction_parts([a, str(tmp_path / "q.rank9.csv")], str(tmp_path / "q.csv"))


class _Rank:
    """A stand-in trainer of one DDP rank: counts its collective calls (log_dir, barrier)."""

    def __init__(self, rank: int, log_dir: Path, dataset: Any) -> None:
        self.global_rank, self.world_size, self.is_global_zero = rank, 2, rank == 0
        self._log_dir, self.collectives = str(log_dir), []
        self.strategy = SimpleNamespace(barrier=lambda name=None: self.collectives.append(f"barrier {name}"))
        self.predict_dataloaders = SimpleNamespace(dataset=dataset)

    @property
    def log_dir(self) -> str:
        self.collectives.append("log_dir")
        return self._log_dir


def _outputs(indices: list[list[int]]) -> list[dict[str, torch.Tensor]]:
    outs = []
    for batch in indices:
        probs = torch.full((len(batch), 3), 1 / 3)
        outs.append(
            {"pred": torch.tensor(batch) % 3, "expected": torch.ones(len(batch)), "probs": probs, "target": torch.tensor(batch) % 3}
        )
    return outs


def test_writer_under_ddp_every_rank_makes_the_same_collective_calls(tmp_path: Path) -> None:
    """Rank 1 (3 samples) and rank 0 (no sample: an uneven share) each write a part; rank 0 merges."""
    dataset = SimpleNamespace(describe=lambda i: f"img{i}.png")
    ranks = [_Rank(r, tmp_path / "logs", dataset) for r in range(2)]
    writers = [PredictionWriter(), PredictionWriter()]
    share = {0: [], 1: [[5, 1], [3]]}  # the real dataset indices of each rank's batches
    for r in (1, 0):  # rank 0's merge runs after rank 1 has written its part (the first barrier)
        writers[r].write_on_epoch_end(ranks[r], None, _outputs(share[r]), [share[r]])  # type: ignore[arg-type]
    for rank in ranks:
        assert rank.collectives == ["log_dir", "barrier PredictionWriter.parts", "barrier PredictionWriter.merged"]
    with open(tmp_path / "logs" / "predictions.csv") as fh:
        rows = list(csv.DictReader(fh))
    assert [(r["index"], r["path"], r["target"]) for r in rows] == [("1", "img1.png", "1"), ("3", "img3.png", "0"), ("5", "img5.png", "2")]
    assert writers[0].written == str(tmp_path / "logs" / "predictions.csv")
    assert not list((tmp_path / "logs").glob("predictions.rank*.csv"))
