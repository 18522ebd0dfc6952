"""benchmarks/experiments.py: metric parsing, aggregation, and a --quick run of each table on the real data.

The two ``--quick`` tests start the real command line in subprocesses (one row each:
UTKFace CE = fit + test; CIFAR-10 random encoder = the probe path); each takes well
under a minute on an idle 2-core machine, several on a heavily shared one.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys

import pytest

from benchmarks.experiments import TABLES, aggregate, fit_command, format_mean_std, read_test_metrics
from tests.conftest import CIFAR10, REPO, SHARED_DATA, UTKFACE, needs


def test_format_mean_std_matches_sample_std() -> None:
    vals = [0.5, 0.7, 0.9]
    mean, std = statistics.fmean(vals), statistics.stdev(vals)
    assert format_mean_std(vals, "pct") == f"{100 * mean:.1f} ± {100 * std:.1f}"
    assert format_mean_std(vals, "f3") == f"{mean:.3f} ± {std:.3f}"
    assert format_mean_std([1.23456], "f2") == "1.23"
    assert format_mean_std([], "f2") == "–"
    assert format_mean_std([float("nan"), 2.0], "f2") == "2.00"


def test_read_test_metrics_takes_the_logged_test_row(tmp_path) -> None:
    # the layout CSVLogger writes: train rows, validation rows, then the test row
    csv_text = (
        "epoch,step,train/loss,val/mae,test/mae,test/qwk\n"
        "0,9,1.5,,,\n"
        "0,9,,2.0,,\n"
        "1,19,,1.5,,\n"
        "1,20,,,1.25,0.5\n"
    )
    path = tmp_path / "metrics.csv"
    path.write_text(csv_text)
    assert read_test_metrics(path) == {"test/mae": 1.25, "test/qwk": 0.5}
    assert read_test_metrics(path, "val/") == {"val/mae": 1.5}
    with pytest.raises(FileNotFoundError, match="logged no metrics"):
        read_test_metrics(tmp_path / "missing.csv")


def test_aggregate_over_seeds_ignores_failed_runs() -> None:
    runs = [
        {"row": "a", "seed": 0, "ok": True, "metrics": {"m": 1.0}, "wall_s": 10.0},
        {"row": "a", "seed": 1, "ok": True, "metrics": {"m": 3.0}, "wall_s": 30.0},
        {"row": "a", "seed": 2, "ok": False, "metrics": {"m": 100.0}, "wall_s": 1.0},
        {"row": "b", "seed": 0, "ok": True, "metrics": {"m": 5.0}, "wall_s": 5.0},
    ]
    agg = aggregate(runs)
    assert agg["a"]["seeds"] == [0, 1]
    assert agg["a"]["m"]["mean"] == 2.0 and agg["a"]["m"]["std"] == pytest.approx(math.sqrt(2.0))
    assert agg["a"]["wall_s"]["max"] == 30.0
    assert agg["b"]["m"]["n"] == 1 and math.isnan(agg["b"]["m"]["std"])


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
    cmd = [sys.executable, "-m", "benchmarks.experiments", table, "--quick", "--seeds", "0", "--rows", *rows,
           "--out", str(out), "--runs-dir", str(tmp_path / "runs"), "--data-root", str(SHARED_DATA)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=300)
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


@pytest.mark.slow
@pytest.mark.realdata
@needs(CIFAR10)
def test_quick_cifar10_random_encoder_probe(tmp_path) -> None:
    payload = _run_quick("cifar10", ["random"], tmp_path)
    (run,) = payload["runs"]
    assert run["ok"], run.get("log_tail")
    top1 = run["metrics"]["probe/top1"]
    assert 0.0 <= top1 <= 1.0 and run["probe"]["n_features"] == 96
    md = (tmp_path / "out" / "cifar10.md").read_text()
    assert "Random-init encoder" in md and "QUICK" in md
