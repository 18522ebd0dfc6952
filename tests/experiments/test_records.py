"""What a run's record holds: paths relative to the run folders, the data root and the repository, so that a record
reads the same on every machine; records written by earlier versions (absolute paths) are still read, and written
back in the relative form; the old ``python -m benchmarks.experiments`` says in one line where the runner went."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import benchmarks.experiments as runner
from benchmarks.experiments import TABLES, restore_runs, run_table, write_outputs
from tests.conftest import REPO

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
    payload = run_table("utkface", [0], out=tmp_path / "out", runs_dir=runs, rows=["ce_pre"], data_root=data,
                        deadline="2000-01-01T00:00", command="render")  # a past deadline starts nothing: render only
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
    assert not _absolute_paths(restored), _absolute_paths(restored)


@pytest.mark.parametrize("source", sorted(str(p.relative_to(REPO)) for p in (REPO / "benchmarks" / "results" / "experiments").rglob("*.json")))
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
    proc = subprocess.run([sys.executable, "-m", "benchmarks.experiments", "utkface", "--quick", "--rows", "ce"], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    (line,) = proc.stderr.strip().splitlines()
    assert "python -m experiments utkface --quick --rows ce" in line, line
