"""experiments/records.py and paths.py: what a run's record holds: paths relative to the run folders, the data root and the repository, so that a record
reads the same on every machine; records written by earlier versions (absolute paths) are still read, and written
back in the relative form; the old ``python -m benchmarks.experiments`` says in one line where the runner went."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import experiments.runner as runner
from experiments.records import complete_record, restore_runs
from experiments.render import write_outputs
from experiments.runner import run_table
from experiments.stats import aggregate
from experiments.tables import TABLES
from tests.conftest import REPO
from tests.experiments._logs import write_csv

#: a finished run's result.json as the runner before issue 41 wrote it (absolute paths of the machine that ran it):
#: a copy of a real record of the UTKFace table, cut to two metrics and two epochs of curves
OLD_RECORD = Path(__file__).resolve().parent.parent / "fixtures" / "experiments" / "old_result.json"


def _absolute_paths(value: Any) -> list[str]:
    """Every string in ``value`` that is an absolute path (free text such as an error message is not a path)."""
    if isinstance(value, dict):
        return [p for k, v in value.items() if k not in ("error", "log_tail") for p in _absolute_paths(v)]
    if isinstance(value, list):
        return [p for v in value for p in _absolute_paths(v)]
    return [value] if isinstance(value, str) and value.startswith("/") else []


def _arg(cmd: list[str], flag: str) -> str:
    return cmd[len(cmd) - 1 - cmd[::-1].index(flag) + 1]


def test_a_new_runs_record_names_its_paths_relative_to_the_runs_dir_and_the_data_root(tmp_path, monkeypatch) -> None:
    ran: list[list[str]] = []

    def fake_run(cmd: list[str], log: Path, timeout: float) -> tuple[int, float]:
        ran.append(cmd)
        (log.parent / "metrics.csv").write_text("epoch,step,test/mae\n0,9,0.5\n")
        return 0, 1.0

    monkeypatch.setattr(runner, "_run", fake_run)
    data, runs = tmp_path / "data", tmp_path / "runs"
    (data / "utkface").mkdir(parents=True)
    table = TABLES["utkface"]
    row = next(r for r in table.rows if r.key == "ce")
    rec = runner.run_one(table, row, 0, runs / "ce" / "seed0", data, quick=True, extra=[], timeout=60, keep_checkpoints=False)
    saved = json.loads((runs / "ce" / "seed0" / "result.json").read_text())
    assert rec["ok"] and saved == rec
    assert saved["run_dir"] == "$RUNS/ce/seed0"
    (cmd,) = saved["commands"]
    assert cmd[:4] == ["python", "-m", "cloc_lightning", "fit"] and _arg(cmd, "--config") == "configs/ce/utkface.yaml"
    assert _arg(cmd, "--data.root") == "$DATA/utkface"
    assert _arg(cmd, "--trainer.logger.save_dir") == _arg(cmd, "--trainer.default_root_dir") == "$RUNS/ce/seed0"
    assert not _absolute_paths(saved), _absolute_paths(saved)
    # what ran had this machine's paths
    assert ran[0][0] == sys.executable and _arg(ran[0], "--data.root") == str(data / "utkface")


def test_an_old_record_with_absolute_paths_is_read_and_written_relative(tmp_path) -> None:
    old = json.loads(OLD_RECORD.read_text())
    assert old["run_dir"].startswith("/") and old["commands"][0][0].startswith("/")  # the fixture is an old record
    runs = tmp_path / "runs"
    (runs / "ce_pre" / "seed0").mkdir(parents=True)
    (runs / "ce_pre" / "seed0" / "result.json").write_text(json.dumps(old))
    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    payload = run_table(
        "utkface", [0], out=tmp_path / "out", runs_dir=runs, rows=["ce_pre"], data_root=data, deadline="2000-01-01T00:00", command="render"
    )  # a past deadline starts nothing: render only
    (run,) = payload["runs"]
    assert run["ok"] and run["metrics"] == old["metrics"] and run["curves"] == old["curves"] and run["wall_s"] == old["wall_s"]
    assert payload["summary"]["ce_pre"]["test/mae"]["values"] == [old["metrics"]["test/mae"]]
    assert run["run_dir"] == "$RUNS/ce_pre/seed0"
    (cmd,) = run["commands"]
    assert cmd[0] == "python" and _arg(cmd, "--data.root") == "$DATA/utkface"
    assert _arg(cmd, "--trainer.logger.save_dir") == "$RUNS/ce_pre/seed0"
    assert cmd[1:] == [a if not a.startswith("/") else cmd[i + 1] for i, a in enumerate(old["commands"][0][1:])]  # nothing else changed
    assert not _absolute_paths(payload["runs"]), _absolute_paths(payload["runs"])
    # the cached record itself is left as it is (a runner of the old version may still be reading the folder)
    assert json.loads((runs / "ce_pre" / "seed0" / "result.json").read_text()) == old

    # a table's JSON of the old version, restored on a new machine: the restored result.json is relative too
    table = TABLES["utkface"]
    write_outputs(tmp_path / "old", table, [r for r in table.rows if r.key == "ce_pre"], [old], "cmd", [0], {}, False, [], {})
    restore_runs(table, tmp_path / "old" / "utkface.json", tmp_path / "new")
    restored = json.loads((tmp_path / "new" / "ce_pre" / "seed0" / "result.json").read_text())
    assert restored["run_dir"] == restored["restored_from"]["run_dir"] == "$RUNS/ce_pre/seed0"
    assert restored["commands"] == run["commands"] and restored["metrics"] == old["metrics"]
    # only the restored table's file stays absolute: this one lies in no checkout (a committed one: repository path)
    assert _absolute_paths(restored) == [restored["restored_from"]["file"]] == [str((tmp_path / "old" / "utkface.json").resolve())]


@pytest.mark.parametrize(
    "source", sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks" / "results" / "experiments").rglob("*.json"))
)
def test_the_committed_tables_restore_without_absolute_paths(source: str, tmp_path) -> None:
    """Every committed table (written by earlier versions, with the paths of the machines that ran them) restores."""
    payload = json.loads((REPO / source).read_text())
    table = TABLES[payload["table"]]
    done = restore_runs(table, REPO / source, tmp_path)
    keys = {r.key for r in table.rows}  # runs of rows the table no longer has are not restored
    assert len(done["restored"]) == len({(r["row"], r["seed"]) for r in payload["runs"] if r.get("ok") and r["row"] in keys})
    for path in tmp_path.rglob("result.json"):
        rec = json.loads(path.read_text())
        assert not _absolute_paths(rec), (path, _absolute_paths(rec))
        assert rec["run_dir"] == f"$RUNS/{rec['row']}/seed{rec['seed']}"


def test_the_old_entry_point_names_the_new_command_in_one_line() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.experiments", "utkface", "--quick", "--rows", "ce"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "python -m experiments utkface --quick --rows ce" in line, line


# ---- a cached record completed from its folder (stopped time, curves); a table's JSON restored on a new machine
def test_time_a_run_spent_stopped_is_taken_out_of_its_wall_time(tmp_path) -> None:
    run_dir = tmp_path / "row" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "paused.json").write_text(json.dumps({"paused_s": 600, "why": ["stopped for the test suite"]}))
    rec = {"row": "row", "seed": 0, "ok": True, "metrics": {}, "wall_s": 1000.0, "run_dir": str(run_dir), "curves": {"x": []}}
    done = complete_record(TABLES["utkface"], rec)
    assert done["wall_s"] == 400.0 and done["wall_s_recorded"] == 1000.0 and done["paused_s"] == 600.0
    assert complete_record(TABLES["utkface"], done)["wall_s"] == 400.0  # a second pass does not subtract again
    other = {"row": "row", "seed": 1, "ok": True, "metrics": {}, "wall_s": 900.0, "run_dir": str(tmp_path / "none"), "curves": {"x": []}}
    assert complete_record(TABLES["utkface"], other)["wall_s"] == 900.0 and "paused_s" not in other
    assert aggregate([done, other])["row"]["wall_s"]["values"] == [400.0, 900.0]


def test_only_stops_inside_the_counted_time_are_taken_out(tmp_path) -> None:
    """An interrupted attempt counts up to its last checkpoint; a stop after it (or outside any attempt) is not wall time."""
    import calendar
    import time

    run_dir = tmp_path / "row" / "seed0"
    run_dir.mkdir(parents=True)
    t0 = calendar.timegm(time.strptime("2026-11-24 13:23:14", "%Y-%m-%d %H:%M:%S"))
    # attempt 1: 13:23:14 + 524 s (its last checkpoint at 13:31:58); then killed. Attempt 2 starts at t0 + 7000 s.
    resumed = [{"started_utc": "2026-11-24 13:23:14", "checkpoint_epoch": 1, "checkpoint_step": 140, "wall_s": 524.0}]
    t2 = t0 + 7000.0
    (run_dir / "attempt.json").write_text(json.dumps({"started": t2, "started_utc": "later", "earlier": resumed}))
    stops = [
        [t0 + 314, t0 + 475],  # 161 s inside attempt 1's counted time
        [t0 + 500, t0 + 600],  # straddles its checkpoint: 24 s count
        [t0 + 619, t0 + 2409],  # after its checkpoint, before the kill: not counted
        [t2 + 100, t2 + 400],  # 300 s inside attempt 2
        [t2 + 3000, t2 + 3100],  # after the run finished: not counted
    ]
    (run_dir / "paused.json").write_text(json.dumps({"paused_s": 9999, "why": ["..."], "intervals": stops}))

    def record() -> dict:
        return {
            "row": "row",
            "seed": 0,
            "ok": True,
            "metrics": {},
            "wall_s": 524.0 + 2000.0,
            "run_dir": str(run_dir),
            "resumed": resumed,
            "curves": {"x": []},
        }

    done = complete_record(TABLES["utkface"], record())
    assert done["paused_s"] == pytest.approx(161 + 24 + 300)
    assert done["wall_s"] == pytest.approx(2524 - 485) and done["wall_s_recorded"] == 2524.0
    # no attempt.json: the final attempt's start is unknown, a clear error instead of a guess
    (run_dir / "attempt.json").unlink()
    with pytest.raises(FileNotFoundError, match="plain paused_s"):
        complete_record(TABLES["utkface"], record())


def test_cached_curves_under_an_older_spec_are_read_again_from_the_logs(tmp_path) -> None:
    run = tmp_path / "ce" / "seed0"
    run.mkdir(parents=True)
    write_csv(
        run / "metrics.csv",
        [{"epoch": 0, "step": 9, "val/mae": 1.5, "val/qwk": 0.4}, {"epoch": 1, "step": 19, "val/mae": 1.25, "val/qwk": 0.5}],
    )
    old = {
        "row": "ce",
        "seed": 0,
        "ok": True,
        "metrics": {},
        "wall_s": 1.0,
        "run_dir": str(run),
        "curves": {"val/mae": [[0, 9.0]], "val/qwk": [[0, 9.0]]},
    }  # keys of an earlier table version
    curves = complete_record(TABLES["utkface"], old)["curves"]
    assert curves["val/mae|val/online_probe/mae"] == [[0, 1.5], [1, 1.25]]
    assert curves["val/qwk|val/online_probe/qwk"] == [[0, 0.4], [1, 0.5]]
    gone = {**old, "run_dir": str(tmp_path / "deleted"), "curves": {"val/mae": [[0, 9.0]]}}
    assert complete_record(TABLES["utkface"], gone)["curves"] == {"val/mae": [[0, 9.0]]}  # no logs: kept as recorded


def test_a_tables_json_restores_its_finished_runs_on_a_new_machine(tmp_path) -> None:

    table = TABLES["utkface"]
    rows = [r for r in table.rows if r.key in ("ce", "cloc_mm")]
    mae = {("ce", 0): 0.50, ("ce", 1): 0.60, ("cloc_mm", 0): 0.45}
    runs = [
        {
            "row": k,
            "seed": s,
            "ok": True,
            "wall_s": 100.0 + 10 * s,
            "run_dir": f"old/{k}/seed{s}",
            "metrics": {"test/mae": v},
            "curves": {"val/mae|val/online_probe/mae": [[0, 1.0], [1, v]]},
        }
        for (k, s), v in mae.items()
    ]
    runs.append({"row": "cloc_mm", "seed": 1, "ok": False, "wall_s": 5.0, "metrics": {}, "error": "RuntimeError: killed"})
    write_outputs(tmp_path / "old", table, rows, runs, "cmd", [0, 1], {}, False, [], {})
    source = tmp_path / "old" / "utkface.json"

    runs_dir = tmp_path / "runs"
    (runs_dir / "ce" / "seed1").mkdir(parents=True)
    (runs_dir / "ce" / "seed1" / "result.json").write_text(json.dumps({**runs[1], "metrics": {"test/mae": 0.70}}))  # already here
    done = restore_runs(table, source, runs_dir)
    assert sorted(done["restored"]) == ["ce seed 0", "cloc_mm seed 0"] and done["kept"] == ["ce seed 1"]
    assert not (runs_dir / "cloc_mm" / "seed1").exists()  # a failed run is not restored: the runner runs it again
    rec = json.loads((runs_dir / "cloc_mm" / "seed0" / "result.json").read_text())
    assert rec["run_dir"] == "$RUNS/cloc_mm/seed0" and rec["restored_from"]["run_dir"] == "old/cloc_mm/seed0"
    assert rec["restored_from"]["sha256"] == __import__("hashlib").sha256(source.read_bytes()).hexdigest()
    assert json.loads((runs_dir / "ce" / "seed1" / "result.json").read_text())["metrics"]["test/mae"] == 0.70  # kept as it was

    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    payload = run_table(
        "utkface",
        [0, 1],
        out=tmp_path / "new",
        runs_dir=runs_dir,
        rows=["ce", "cloc_mm"],
        data_root=data,
        deadline="2000-01-01T00:00",
        command="render",
    )  # a past deadline starts nothing: render only
    assert payload["summary"]["ce"]["test/mae"]["values"] == [0.50, 0.70]
    assert payload["summary"]["cloc_mm"]["test/mae"]["values"] == [0.45]
    assert payload["summary"]["cloc_mm"]["wall_s"]["mean"] == 100.0
    assert payload["runs"][0]["curves"] == runs[0]["curves"] or payload["runs"][1]["curves"] == runs[0]["curves"]
    md = (tmp_path / "new" / "utkface.md").read_text()
    assert "Restored records (`--restore-runs`" in md and f"2 run(s) from `{source.resolve()}`" in md

    # restoring again changes nothing; the wrong table or a smoke-test JSON is refused, naming the fix
    assert restore_runs(table, source, runs_dir)["restored"] == []
    with pytest.raises(ValueError, match="holds the 'utkface' table, not 'cifar10'; pass a cifar10.json"):
        restore_runs(TABLES["cifar10"], source, runs_dir)
    quick = tmp_path / "quick.json"
    quick.write_text(json.dumps({**json.loads(source.read_text()), "quick": True}))
    with pytest.raises(ValueError, match="smoke-test runs"):
        restore_runs(table, quick, runs_dir)
    with pytest.raises(FileNotFoundError, match="no such file"):
        restore_runs(table, tmp_path / "missing.json", runs_dir)


def test_restored_runs_name_a_json_in_another_checkout_by_its_repo_path(tmp_path) -> None:
    # the runner in a worktree restoring main's committed table: the records name the file as the
    # repository does (benchmarks/results/...), not by this machine's absolute checkout path

    table = TABLES["utkface"]
    rows = [r for r in table.rows if r.key == "ce"]
    runs = [{"row": "ce", "seed": 0, "ok": True, "wall_s": 100.0, "run_dir": "old/ce/seed0", "metrics": {"test/mae": 0.5}}]
    other = tmp_path / "main"
    (other / ".git").mkdir(parents=True)
    write_outputs(other / "benchmarks" / "results", table, rows, runs, "cmd", [0], {}, False, [], {})
    restore_runs(table, other / "benchmarks" / "results" / "utkface.json", tmp_path / "runs")
    rec = json.loads((tmp_path / "runs" / "ce" / "seed0" / "result.json").read_text())
    assert rec["restored_from"]["file"] == "benchmarks/results/utkface.json"
