"""The runner: each (row, seed) of a table through the real command line, resumable, and the table written after every run.

A run is ``python -m cloc_lightning fit`` (and ``probe``) with the row's config and overrides, in this process
(:data:`IN_PROCESS`) or a subprocess; its record goes to ``<run folder>/result.json`` with its paths in the relative
form of :mod:`experiments.paths`; a finished run is not repeated, an interrupted one resumes from its ``last.ckpt``.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.logs import cloc_share, curves, read_test_metrics
from experiments.paths import DEFAULT_DATA, DEFAULT_OUT, REPO, relative_record
from experiments.provenance import CODE_KEYS, provenance
from experiments.records import complete_record, restore_runs, row_walls
from experiments.render import quote, write_outputs
from experiments.tables import ENCODER_CKPT, INIT_WEIGHTS, TABLES, Row, Table, source_file

__all__ = [
    "PREEMPTED",
    "IN_PROCESS",
    "fit_command",
    "probe_command",
    "init_weights_path",
    "write_init_weights",
    "write_encoder_checkpoint",
    "write_random_encoder",
    "run_one",
    "run_table",
]

#: the exit code of a fit stopped by SIGTERM (cloc_lightning's PreemptionCheckpoint wrote a mid-epoch last.ckpt):
#: the table stops there instead of going on to the next run
PREEMPTED = 143


def _code_state() -> dict[str, Any]:
    """What a run was made with, stored in its record (``code``): the runner's git state and the torch/Lightning versions."""
    info = provenance()
    return {k: info[k] for k in CODE_KEYS}


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONWARNINGS="ignore", HF_HUB_OFFLINE="1")
    env.setdefault("OMP_NUM_THREADS", "2")
    env["PYTHONPATH"] = str(REPO) + os.pathsep + env.get("PYTHONPATH", "")
    return env


#: run ``python -m cloc_lightning ...`` commands by calling :func:`cloc_lightning.cli.main` with the
#: same arguments in this process (saves the 10-90 s import of torch/lightning/timm/open_clip per
#: run on a busy machine); ``--subprocess`` starts a fresh interpreter per command instead.
IN_PROCESS = True


def _run_in_process(args: list[str], f: Any) -> int:
    import contextlib
    import gc
    import warnings

    from cloc_lightning.cli import main as cli_main

    rc = 0
    with contextlib.redirect_stdout(f), contextlib.redirect_stderr(f), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            cli_main(args)
        except SystemExit as e:  # argument errors exit
            rc = e.code if isinstance(e.code, int) else 1
        except Exception:  # noqa: BLE001 - recorded as a failed run
            import traceback

            traceback.print_exc(file=f)
            rc = 1
    gc.collect()
    return rc


def _run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
    """Run ``cmd`` in the repository root, appending its output to ``log``; return (returncode, wall seconds).

    ``python -m cloc_lightning ARGS`` runs in this process when :data:`IN_PROCESS` (no timeout there).
    """
    start = time.perf_counter()
    with open(log, "a") as f:
        f.write("$ " + " ".join(quote(c) for c in cmd) + "\n")
        f.flush()
        if IN_PROCESS and cmd[1:3] == ["-m", "cloc_lightning"]:
            f.write("[experiments] in-process\n")
            f.flush()
            return _run_in_process(cmd[3:], f), time.perf_counter() - start
        try:
            proc = subprocess.run(cmd, cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            f.write(f"\n[experiments] timed out after {timeout:.0f} s\n")
            rc = 124
    return rc, time.perf_counter() - start


def _tail(path: Path, n: int = 2500) -> str:
    try:
        return path.read_text()[-n:]
    except OSError:
        return ""


def init_weights_path(run_dir: Path, row: Row, seed: int) -> Path:
    """Where a row with ``init_from`` finds its source's weights: ``<runs_dir>/<source>/seed<S>/init_weights.pt``
    (``encoder_ckpt.pt`` for a row whose ``init_arg`` is ``encoder_ckpt``)."""
    assert row.init_from is not None
    return run_dir.parent.parent / row.init_from / f"seed{seed}" / source_file(row.init_arg)


def write_encoder_checkpoint(ckpt: Path, path: Path) -> None:
    """Keep a checkpoint without its optimiser, scheduler and loop state as ``path`` (a stage-two ``encoder_ckpt``)."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    for key in ("optimizer_states", "lr_schedulers", "loops", "callbacks"):
        state.pop(key, None)
    state["source"] = str(ckpt)
    tmp = path.with_suffix(".tmp")
    torch.save(state, tmp)
    tmp.replace(path)


def write_init_weights(ckpt: Path, path: Path) -> None:
    """Keep a checkpoint's ``state_dict`` (no optimiser state) as ``path`` for the rows that start from it."""
    import torch

    state = torch.load(ckpt, map_location="cpu", weights_only=False)["state_dict"]
    tmp = path.with_suffix(".tmp")
    torch.save({"state_dict": state, "source": str(ckpt)}, tmp)
    tmp.replace(path)


def fit_command(table: Table, row: Row, seed: int, run_dir: Path, data_root: Path, quick: bool, extra: Sequence[str]) -> list[str]:
    """The ``python -m cloc_lightning fit`` command of one (row, seed)."""
    assert row.config is not None
    cmd = [sys.executable, "-m", "cloc_lightning", "fit", "--config", row.config]
    cmd += ["--data.root", str(data_root / table.data_subdir)]
    cmd += table.quick_scale if quick else table.scale
    cmd += row.overrides
    if quick:
        cmd += row.quick_overrides
    if row.init_from is not None:
        cmd += [f"--model.{row.init_arg}", str(init_weights_path(run_dir, row, seed))]
    cmd += list(extra)
    cmd += ["--seed_everything", str(seed), "--data.seed", str(seed)]
    if row.kind == "supervised":
        cmd += ["--test_after_fit", "true"]
    cmd += [
        "--trainer.logger",
        "lightning.pytorch.loggers.CSVLogger",
        "--trainer.logger.save_dir",
        str(run_dir),
        "--trainer.logger.name",
        "",
        "--trainer.logger.version",
        "",
        "--trainer.default_root_dir",
        str(run_dir),
    ]
    return cmd


def probe_command(
    table: Table, ckpt: Path, out_json: Path, data_root: Path, quick: bool, seed: int, backbone: str | None = None, row: Row | None = None
) -> list[str]:
    """The ``python -m cloc_lightning probe`` command of one checkpoint."""
    assert table.probe_config is not None
    cmd = [sys.executable, "-m", "cloc_lightning", "probe", "--config", table.probe_config, "--ckpt", str(ckpt)]
    cmd += ["--data.root", str(data_root / table.data_subdir), "--data.seed", str(seed)]
    cmd += table.probe_overrides
    if quick:
        cmd += table.quick_probe_overrides
    if row is not None:
        cmd += row.probe_overrides
    if backbone is not None:
        cmd += ["--backbone", backbone]
    cmd += ["--output", str(out_json)]
    return cmd


def write_random_encoder(backbone: str, seed: int, path: Path) -> None:
    """A randomly initialised ``backbone`` (timm, seeded) saved as a plain ``state_dict``."""
    import torch

    from cloc_lightning.nn.backbones import create_backbone

    torch.manual_seed(seed)
    model, _ = create_backbone(backbone, False, False)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save(model.state_dict(), path)


def _find_ckpt(run_dir: Path) -> Path | None:
    lasts = sorted(run_dir.rglob("last.ckpt"))
    return lasts[-1] if lasts else None


def _prepare_resume(run_dir: Path, last: Path) -> list[dict[str, Any]]:
    """Keep an interrupted attempt's logs and time; return the attempts so far (oldest first)."""
    import torch

    info_path = run_dir / "attempt.json"
    if info_path.is_file():
        info = json.loads(info_path.read_text())
        earlier, started, started_utc = info.get("earlier", []), float(info["started"]), info["started_utc"]
    else:  # an attempt from before attempt.json existed: the fit wrote config.yaml when it started
        info, earlier = {}, []
        started = (run_dir / "config.yaml").stat().st_mtime if (run_dir / "config.yaml").is_file() else last.stat().st_mtime
        started_utc = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(started))
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    k = len(list(run_dir.glob("metrics.part*.csv")))
    if (run_dir / "metrics.csv").is_file():
        (run_dir / "metrics.csv").rename(run_dir / f"metrics.part{k}.csv")
    attempt = {
        "started_utc": started_utc,
        "checkpoint_epoch": int(ckpt.get("epoch", -1)),
        "checkpoint_step": int(ckpt.get("global_step", -1)),
        # the work after the checkpoint is lost and done again, so it does not count
        "wall_s": max(0.0, last.stat().st_mtime - started),
    }
    if "code" in info:
        attempt["code"] = info["code"]  # what the interrupted attempt ran (the record's "code" is the final attempt's)
    return [*earlier, attempt]


def run_one(
    table: Table,
    row: Row,
    seed: int,
    run_dir: Path,
    data_root: Path,
    quick: bool,
    extra: Sequence[str],
    timeout: float,
    keep_checkpoints: bool,
    resume: bool = True,
) -> dict[str, Any]:
    """Run one (row, seed); return its record (also written to ``run_dir/result.json``).

    A run folder left by an interrupted attempt (a ``checkpoints/last.ckpt`` and no finished
    ``result.json``) is resumed from that checkpoint (``--ckpt_path``) unless ``resume`` is
    false; the earlier attempts' logs are kept as ``metrics.part<k>.csv`` and their time up to
    the checkpoint counts in the run's wall time.
    """
    last = run_dir / "checkpoints" / "last.ckpt"
    resumed: list[dict[str, Any]] = []
    if resume and row.kind != "random" and last.is_file():
        resumed = _prepare_resume(run_dir, last)
    else:
        if run_dir.exists():
            shutil.rmtree(run_dir)
        run_dir.mkdir(parents=True)
    log = run_dir / "output.log"
    record: dict[str, Any] = {
        "row": row.key,
        "seed": seed,
        "run_dir": str(run_dir),
        "commands": [],
        "metrics": {},
        "ok": False,
        "mode": "in-process" if IN_PROCESS else "subprocess",
        "code": _code_state(),
        "started_utc": resumed[0]["started_utc"] if resumed else time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }
    if resumed:
        record["resumed"] = resumed
    (run_dir / "attempt.json").write_text(
        json.dumps(
            {
                "started": time.time(),
                "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
                "earlier": resumed,
                "code": record["code"],
            }
        )
    )
    start = time.perf_counter()
    try:
        source = init_weights_path(run_dir, row, seed) if row.init_from is not None else None
        if source is not None and not source.is_file():
            raise RuntimeError(
                f"row {row.key} starts from row {row.init_from}'s weights, but {source} does not exist: "
                f"run --rows {row.init_from} --seeds {seed} first (same --runs-dir)"
            )
        if row.kind in ("supervised", "pretrain", "encoder"):
            cmd = fit_command(table, row, seed, run_dir, data_root, quick, extra)
            if resumed:
                cmd += ["--ckpt_path", str(last)]
            record["commands"].append(cmd)
            rc, wall = _run(cmd, log, timeout)
            record["fit_wall_s"] = wall
            if rc == PREEMPTED:
                record["preempted"] = True
                raise RuntimeError(f"fit exited with {rc} (SIGTERM: its last.ckpt is kept; run the table again to resume it)")
            if rc != 0:
                raise RuntimeError(f"fit exited with {rc}")
            record["metrics"].update(read_test_metrics(run_dir / "metrics.csv") if (run_dir / "metrics.csv").is_file() else {})
            if row.kind == "supervised" and not record["metrics"]:
                raise RuntimeError("fit finished but logged no test/* metrics")
            record["metrics"].update(cloc_share(run_dir))
            record["curves"] = curves(table, run_dir)
            dependants = {r.init_arg for r in table.rows if r.init_from == row.key}
            if dependants:
                ckpt = _find_ckpt(run_dir)
                if ckpt is None:
                    raise RuntimeError(f"fit wrote no last.ckpt for the rows that start from {row.key}")
                if "init_from" in dependants:
                    write_init_weights(ckpt, run_dir / INIT_WEIGHTS)
                    record["init_weights"] = str(run_dir / INIT_WEIGHTS)
                if "encoder_ckpt" in dependants:
                    write_encoder_checkpoint(ckpt, run_dir / ENCODER_CKPT)
                    record["encoder_ckpt"] = str(run_dir / ENCODER_CKPT)
        if row.kind in ("pretrain", "random"):
            if row.kind == "random":
                ckpt = run_dir / "random_encoder.pt"
                write_random_encoder(table.random_backbone, seed, ckpt)
                backbone = table.random_backbone
            else:
                ckpt = _find_ckpt(run_dir)
                backbone = None
                if ckpt is None:
                    raise RuntimeError("fit wrote no last.ckpt to probe")
            out_json = run_dir / "probe.json"
            cmd = probe_command(table, ckpt, out_json, data_root, quick, seed, backbone, row)
            record["commands"].append(cmd)
            rc, wall = _run(cmd, log, timeout)
            record["probe_wall_s"] = wall
            if rc != 0 or not out_json.is_file():
                raise RuntimeError(f"probe exited with {rc}")
            probe = json.loads(out_json.read_text())
            record["probe"] = probe
            for k in ("top1", "top5", "train_top1"):
                if k in probe:
                    record["metrics"][f"probe/{k}"] = float(probe[k])
        record["ok"] = True
    except Exception as e:  # noqa: BLE001 - a failed run is recorded, the table goes on
        record["error"] = f"{type(e).__name__}: {e}"
        record["log_tail"] = _tail(log)
    record["wall_s"] = time.perf_counter() - start + sum(a["wall_s"] for a in resumed)
    if not keep_checkpoints and record["ok"]:  # a failed or preempted run keeps its last.ckpt: the next attempt resumes it
        for p in list(run_dir.rglob("*.ckpt")) + list(run_dir.rglob("random_encoder.pt")):
            p.unlink()
    record = relative_record(record, run_dir.parent.parent, data_root, table.data_subdir)
    (run_dir / "result.json").write_text(json.dumps(record, indent=2))
    return record


def _cached(table: Table, rec: dict[str, Any], run_dir: Path, runs_dir: Path, data_root: Path) -> dict[str, Any]:
    """A finished run's record read from ``run_dir``: completed from its logs, its paths in the relative form
    (an old record's absolute ones too; the file itself is left as it is)."""
    return relative_record(complete_record(table, rec, run_dir), runs_dir, data_root, table.data_subdir)


def _parse_deadline(value: str | None) -> float | None:
    """``HH:MM`` (UTC, today) or a full ISO time -> epoch seconds."""
    if not value:
        return None
    from datetime import datetime, timezone

    if len(value) <= 5 and ":" in value:
        hh, mm = (int(x) for x in value.split(":"))
        now = datetime.now(timezone.utc)
        return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()
    dt = datetime.fromisoformat(value)
    return (dt if dt.tzinfo else dt.replace(tzinfo=timezone.utc)).timestamp()


def run_table(
    name: str,
    seeds: Sequence[int],
    quick: bool = False,
    out: Path = DEFAULT_OUT,
    runs_dir: Path | None = None,
    rows: Sequence[str] | None = None,
    data_root: Path = DEFAULT_DATA,
    extra: Sequence[str] = (),
    rerun: bool = False,
    timeout: float = 1800,
    keep_checkpoints: bool = False,
    command: str | None = None,
    deadline: str | None = None,
    restore: Path | None = None,
) -> dict[str, Any]:
    """Run (or resume) a table; write its markdown/JSON after every run; return the JSON payload.

    Rows not selected with ``rows`` still appear in the output with the finished runs
    cached in ``runs_dir`` (so a table can be filled by several invocations).  With
    ``deadline`` (``HH:MM`` UTC or ISO time) no run starts after it and a running one is
    stopped at it (recorded as failed).  ``restore`` (a table's JSON) first puts the finished
    runs it records back into ``runs_dir`` (:func:`restore_runs`).
    """
    if name not in TABLES:
        raise ValueError(f"unknown table {name!r}; choose from {sorted(TABLES)}")
    table = TABLES[name]
    if not (data_root / table.data_subdir).is_dir():
        raise FileNotFoundError(
            f"{table.name} needs the data at {data_root / table.data_subdir}; pass --data-root (or set CLOC_SHARED_DATA) "
            "to the folder holding utkface/ and cifar10/"
        )
    selected = [r for r in table.rows if rows is None or r.key in rows]
    stop_at = _parse_deadline(deadline)
    unknown = set(rows or []) - {r.key for r in table.rows}
    if unknown:
        raise ValueError(f"unknown rows {sorted(unknown)} for {name}; rows: {[r.key for r in table.rows]}")
    runs_dir = runs_dir or (REPO / "runs" / "experiments" / (name + ("_quick" if quick else "")))
    if restore is not None:
        done = restore_runs(table, restore, runs_dir)
        print(
            f"[experiments] restored from {restore}: {len(done['restored'])} run(s)"
            + (f"; kept {len(done['kept'])} already in {runs_dir}" if done["kept"] else ""),
            flush=True,
        )
    command = command or "python -m experiments " + " ".join(quote(a) for a in sys.argv[1:])
    env = provenance(command)
    skipped: dict[str, str] = {}
    for r in table.rows:
        if r.optional and r.config and not (REPO / r.config).is_file():
            skipped[r.key] = f"{r.config} does not exist"
    runs: list[dict[str, Any]] = []
    for r in table.rows:  # finished runs of the rows this invocation does not run
        if r in selected or r.key in skipped:
            continue
        for seed in seeds:
            cached = runs_dir / r.key / f"seed{seed}" / "result.json"
            if cached.is_file():
                rec = json.loads(cached.read_text())
                if rec.get("ok"):
                    runs.append(_cached(table, rec, cached.parent, runs_dir, data_root))
    shown_rows = [r for r in table.rows if r in selected or any(x["row"] == r.key for x in runs)]
    # seeds outermost: every row gets seed 0 before any row gets seed 1, so a cut-short table is balanced
    for seed in seeds:
        for r in selected:
            if r.key in skipped:
                continue
            run_dir = runs_dir / r.key / f"seed{seed}"
            cached = run_dir / "result.json"
            if cached.is_file() and not rerun:
                rec = json.loads(cached.read_text())
                if rec.get("ok"):
                    runs.append(_cached(table, rec, run_dir, runs_dir, data_root))
                    print(f"[experiments] {name}/{r.key} seed {seed}: cached ({rec['wall_s']:.0f} s)", flush=True)
                    continue
            limit = timeout
            if stop_at is not None:
                left = stop_at - time.time()
                same = row_walls(runs, runs_dir, r.key)
                expected = statistics.fmean(same) if same else 60.0
                if left < expected:
                    print(
                        f"[experiments] {name}/{r.key} seed {seed}: not started: {left:.0f} s to the deadline {deadline}, "
                        f"a run takes ~{expected:.0f} s",
                        flush=True,
                    )
                    continue
                limit = min(timeout, left)
            print(f"[experiments] {name}/{r.key} seed {seed}: running ...", flush=True)
            rec = run_one(table, r, seed, run_dir, data_root, quick, extra, limit, keep_checkpoints, resume=not rerun)
            runs.append(rec)
            status = "ok" if rec["ok"] else f"FAILED ({rec.get('error')}); log: {run_dir / 'output.log'}"
            shown = {k: round(v, 4) for k, v in rec["metrics"].items() if any(k == m for m, _, _ in table.metrics)}
            print(f"[experiments] {name}/{r.key} seed {seed}: {status} in {rec['wall_s']:.0f} s {shown}", flush=True)
            write_outputs(out, table, shown_rows, runs, command, list(seeds), skipped, quick, extra, env)
            if rec.get("preempted"):
                print(
                    f"[experiments] stopped: {name}/{r.key} seed {seed} was preempted (SIGTERM); run the same command "
                    "again to resume it from its last.ckpt",
                    flush=True,
                )
                raise SystemExit(PREEMPTED)
    md = write_outputs(out, table, shown_rows, runs, command, list(seeds), skipped, quick, extra, env)
    print(md.read_text())
    payload: dict[str, Any] = json.loads((out / f"{table.name}.json").read_text())
    return payload
