"""What a run logged: the CSVLogger files of a run folder read into metrics, per-epoch series and the CLOC share."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from pathlib import Path

from experiments.tables import Table

__all__ = ["read_test_metrics", "metric_files", "epoch_series", "cloc_share", "curves"]


def read_test_metrics(metrics_csv: Path, prefix: str = "test/") -> dict[str, float]:
    """The metrics starting with ``prefix`` from a CSVLogger ``metrics.csv`` (last non-empty value of each)."""
    if not metrics_csv.is_file():
        raise FileNotFoundError(f"{metrics_csv} does not exist: the run logged no metrics")
    out: dict[str, float] = {}
    with open(metrics_csv, newline="") as f:
        for row in csv.DictReader(f):
            for k, v in row.items():
                if k and k.startswith(prefix) and v not in (None, ""):
                    out[k] = float(v)
    return out


def metric_files(run_dir: Path) -> list[Path]:
    """A run's CSVLogger files in order: ``metrics.part<k>.csv`` of interrupted attempts, then ``metrics.csv``."""
    parts = sorted(run_dir.glob("metrics.part*.csv"), key=lambda p: int(p.stem.split("part")[-1]))
    return parts + ([run_dir / "metrics.csv"] if (run_dir / "metrics.csv").is_file() else [])


def _rows(run_dir: Path) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in metric_files(run_dir):
        with open(path, newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows


def epoch_series(run_dir: Path, keys: Sequence[str]) -> dict[str, dict[int, float]]:
    """Per key, ``{epoch: value}`` of the epoch-level rows a run logged (validation metrics).

    A resumed run repeats the epochs after its last checkpoint; the later attempt's value wins.
    """
    out: dict[str, dict[int, float]] = {k: {} for k in keys}
    for row in _rows(run_dir):
        for k in keys:
            v = row.get(k)
            if v not in (None, "") and row.get("epoch") not in (None, ""):
                out[k][int(float(row["epoch"]))] = float(v)
    return {k: v for k, v in out.items() if v}


def cloc_share(run_dir: Path) -> dict[str, float]:
    """The CLOC term's share of the loss, mean over the logged steps of the first and of the last epoch.

    Read from ``train/cloc_share`` (logged by :class:`~cloc_lightning.methods.CLOCModule`), or
    for runs logged before it existed derived as ``1 - train/ce / train/loss`` (``loss = ce +
    λ·cloc``).  Empty for runs without a CLOC term.
    """
    per_epoch: dict[int, list[float]] = {}
    for row in _rows(run_dir):
        if row.get("epoch") in (None, ""):
            continue
        logged = row.get("train/cloc_share")
        if logged:
            share = float(logged)
        else:
            loss, ce = row.get("train/loss"), row.get("train/ce")
            if not loss or not ce or not row.get("train/cloc"):
                continue
            share = 1.0 - float(ce) / float(loss)
        per_epoch.setdefault(int(float(row["epoch"])), []).append(share)
    if not per_epoch:
        return {}
    first, last = min(per_epoch), max(per_epoch)
    return {"train/cloc_share_first": statistics.fmean(per_epoch[first]), "train/cloc_share_last": statistics.fmean(per_epoch[last])}


def curves(table: Table, run_dir: Path) -> dict[str, list[list[float]]]:
    """``{metric: [[epoch, value], ...]}`` of the table's curve metrics a run logged."""
    keys = [k for spec, _ in table.curve_metrics for k in spec.split("|")]
    series = epoch_series(run_dir, keys)
    out: dict[str, list[list[float]]] = {}
    for spec, _ in table.curve_metrics:  # "a|b": the first of the keys this run logged
        for k in spec.split("|"):
            if k in series:
                out[spec] = [[e, v] for e, v in sorted(series[k].items())]
                break
    return out
