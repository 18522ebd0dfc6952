"""A run's record (``result.json`` in its run folder): completed from the folder's logs, restored from a table's JSON.

Records name their paths relative to the run folders, the data root and the repository
(:mod:`experiments.paths`); records of earlier versions, with absolute paths, are read as they are.
"""

from __future__ import annotations

import calendar
import hashlib
import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.logs import cloc_share, curves
from experiments.paths import REPO, relative_record, repo_relative
from experiments.tables import Table

__all__ = ["complete_record", "counted_windows", "restore_runs", "row_walls"]


def _run_dir(rec: dict[str, Any]) -> Path | None:
    """The folder a record's ``run_dir`` names on this machine, where it can say (an old absolute or a repository path)."""
    text = rec.get("run_dir")
    if not isinstance(text, str) or text.startswith("$"):
        return None
    path = Path(text)
    return path if path.is_absolute() else REPO / path


def complete_record(table: Table, rec: dict[str, Any], run_dir: Path | None = None) -> dict[str, Any]:
    """Add what a cached run's record may lack (CLOC share, curves) from its run folder's logs.

    ``run_dir``: the folder the record was read from (default: the folder its ``run_dir`` names, where that is a
    path of this machine).  A run that was stopped (SIGSTOP) while another job had the machine has a ``paused.json``
    (``{"paused_s": seconds, "why": [...]}``, written by whoever stopped it); that time is taken
    out of its wall time (the recorded value stays as ``wall_s_recorded``).  With
    ``"intervals": [[start, end], ...]`` (Unix seconds) only the stopped time inside the counted
    windows is taken out (:func:`counted_windows`: an interrupted attempt's time after its last
    checkpoint is not in the wall time, so neither is a stop that fell there).
    """
    folder = run_dir if run_dir is not None else _run_dir(rec)
    if folder is None:
        return rec
    paused = folder / "paused.json"
    if paused.is_file() and "wall_s_recorded" not in rec:
        info = json.loads(paused.read_text())
        if "intervals" in info:
            windows = counted_windows(rec, folder)
            rec["paused_s"] = float(sum(_overlap(float(a), float(b), windows) for a, b in info["intervals"]))
        else:
            rec["paused_s"] = float(info["paused_s"])
        rec["paused_why"] = info.get("why", [])
        rec["wall_s_recorded"] = rec["wall_s"]
        rec["wall_s"] = max(0.0, rec["wall_s"] - rec["paused_s"])
    if rec.get("ok") and folder.is_dir():
        for k, v in cloc_share(folder).items():
            rec["metrics"].setdefault(k, v)
        cached = rec.get("curves") or {}
        if table.curve_metrics and any(spec not in cached for spec, _ in table.curve_metrics):
            # missing, or recorded under an older spec of the table's curves: read the logs again
            rec["curves"] = curves(table, folder) or cached
    return rec


def _utc_seconds(stamp: str) -> float:
    """Unix seconds of a ``%Y-%m-%d %H:%M:%S`` UTC time stamp (as the records write them)."""
    return float(calendar.timegm(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")))


def counted_windows(rec: dict[str, Any], run_dir: Path) -> list[tuple[float, float]]:
    """The spans of clock time (Unix seconds) that a finished run's ``wall_s`` counts.

    Each interrupted attempt in ``rec["resumed"]`` counts from its start to its last
    checkpoint (``wall_s`` of the attempt); the final attempt from its start (``attempt.json``,
    rewritten when an attempt starts) for the rest of the recorded wall time.
    """
    earlier = rec.get("resumed", [])
    windows = [(t, t + float(a["wall_s"])) for a in earlier for t in [_utc_seconds(a["started_utc"])]]
    info = run_dir / "attempt.json"
    if not info.is_file():
        raise FileNotFoundError(
            f"{run_dir}/paused.json has stop intervals but {info} (the final attempt's start) is missing; "
            "give paused.json a plain paused_s instead"
        )
    start = float(json.loads(info.read_text())["started"])
    windows.append((start, start + float(rec["wall_s"]) - sum(float(a["wall_s"]) for a in earlier)))
    return windows


def _overlap(a: float, b: float, windows: list[tuple[float, float]]) -> float:
    """Seconds of ``[a, b]`` inside the (disjoint) ``windows``."""
    return sum(max(0.0, min(b, w1) - max(a, w0)) for w0, w1 in windows)


def restore_runs(table: Table, source: Path, runs_dir: Path) -> dict[str, list[str]]:
    """Write the finished runs recorded in a table's JSON back into ``runs_dir`` as their ``result.json``.

    A table's run folders live under ``runs/`` (not in the repository), so a new machine has
    only the committed ``<table>.json``.  Its ``runs[]`` are the finished runs' records; restoring
    them lets the runner fill the missing rows and render the whole table again, without
    repeating what already ran.  Each restored record keeps its metrics, curves, commands, code
    and wall time (stopped time already taken out), points ``run_dir`` at its new folder and
    says where it came from (``restored_from``); the tables count restored runs.  Its paths are
    written in the relative form (:func:`~experiments.paths.relative_record`), also those of a table
    written by an earlier version with the absolute paths of its machine.  A run folder
    that already has a ``result.json`` is left as it is.  Returns the restored and the kept
    ``"<row> seed <s>"``.
    """
    if not source.is_file():
        raise FileNotFoundError(f"--restore-runs {source}: no such file; pass the {table.name}.json a render wrote")
    raw = source.read_bytes()
    payload = json.loads(raw)
    if not isinstance(payload, dict) or not isinstance(payload.get("runs"), list):
        raise ValueError(f"--restore-runs {source}: not a table's JSON (no 'runs' list); pass the {table.name}.json a render wrote")
    if payload.get("table") != table.name:
        raise ValueError(f"--restore-runs {source} holds the {payload.get('table')!r} table, not {table.name!r}; pass a {table.name}.json")
    if payload.get("quick"):
        raise ValueError(f"--restore-runs {source} holds --quick smoke-test runs, which are not results; pass a full table's JSON")
    keys = {r.key for r in table.rows}
    origin = repo_relative(source)
    digest = hashlib.sha256(raw).hexdigest()
    done: dict[str, list[str]] = {"restored": [], "kept": []}
    for rec in payload["runs"]:
        if not rec.get("ok") or rec.get("row") not in keys:
            continue
        run_dir = runs_dir / rec["row"] / f"seed{rec['seed']}"
        name = f"{rec['row']} seed {rec['seed']}"
        if (run_dir / "result.json").is_file():
            done["kept"].append(name)
            continue
        run_dir.mkdir(parents=True, exist_ok=True)
        old = relative_record(rec, None, None, table.data_subdir)  # the machine that wrote it: its own run folder and data root
        restored = {
            **old,
            "run_dir": str(run_dir),
            "restored_from": old.get("restored_from")
            or {
                "file": origin,
                "sha256": digest,
                "run_dir": old.get("run_dir"),
                "restored_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            },
        }
        (run_dir / "result.json").write_text(json.dumps(relative_record(restored, runs_dir, None, table.data_subdir), indent=2))
        done["restored"].append(name)
    return done


def row_walls(runs: Sequence[dict[str, Any]], runs_dir: Path, row: str) -> list[float]:
    """The wall times of ``row``'s finished runs, which say how long its next run takes.

    Only the row's own runs count: another row's do not (on the GPU table a stage-two regressor
    was held back by its 6x longer pre-training's time).  They are this invocation's runs and the
    ones cached in ``runs_dir`` for any seed, so ``--seeds 2`` alone still knows what seeds 0 and 1
    took; a row with no finished run is given a minute.
    """
    walls = {x["seed"]: float(x["wall_s"]) for x in runs if x.get("ok") and x["row"] == row}
    for cached in sorted((runs_dir / row).glob("seed*/result.json")):
        try:
            rec = json.loads(cached.read_text())
        except (OSError, ValueError):
            continue
        if rec.get("ok") and rec.get("seed") not in walls and isinstance(rec.get("wall_s"), int | float):
            walls[rec["seed"]] = float(rec["wall_s"])
    return list(walls.values())
