"""experiments/stats.py and logs.py: mean ± std and paired differences over seeds; metrics, curves and the CLOC share read from a run's CSV logs."""

from __future__ import annotations

import math
import statistics

import pytest

from experiments.logs import read_test_metrics
from experiments.stats import aggregate, format_mean_std
from tests.experiments._logs import write_csv


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
    csv_text = "epoch,step,train/loss,val/mae,test/mae,test/qwk\n0,9,1.5,,,\n0,9,,2.0,,\n1,19,,1.5,,\n1,20,,,1.25,0.5\n"
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


def test_cloc_share_per_epoch_from_logged_or_derived_values(tmp_path) -> None:
    from experiments.logs import cloc_share

    # a run that predates train/cloc_share: derived as 1 - ce / loss (loss = ce + lambda * cloc)
    write_csv(
        tmp_path / "metrics.csv",
        [
            {"epoch": 0, "step": 19, "train/loss": 2.0, "train/ce": 1.9, "train/cloc": 0.1},
            {"epoch": 0, "step": 39, "train/loss": 1.0, "train/ce": 0.9, "train/cloc": 0.1},
            {"epoch": 0, "step": 40, "val/mae": 1.0},
            {"epoch": 3, "step": 99, "train/loss": 0.5, "train/ce": 0.25, "train/cloc": 0.25},
        ],
    )
    share = cloc_share(tmp_path)
    assert share["train/cloc_share_first"] == pytest.approx((0.1 / 2.0 + 0.1 / 1.0) / 2)
    assert share["train/cloc_share_last"] == pytest.approx(0.5)
    # logged by CLOCModule: taken as logged
    write_csv(
        tmp_path / "metrics.csv",
        [
            {"epoch": 0, "step": 19, "train/loss": 2.0, "train/ce": 1.0, "train/cloc": 1.0, "train/cloc_share": 0.3},
            {"epoch": 1, "step": 39, "train/loss": 2.0, "train/ce": 1.0, "train/cloc": 1.0, "train/cloc_share": 0.2},
        ],
    )
    assert cloc_share(tmp_path) == {"train/cloc_share_first": 0.3, "train/cloc_share_last": 0.2}
    # CE runs have no CLOC term
    write_csv(tmp_path / "metrics.csv", [{"epoch": 0, "step": 19, "train/loss": 2.0}])
    assert cloc_share(tmp_path) == {}


def test_epoch_series_joins_the_parts_of_a_resumed_run(tmp_path) -> None:
    from experiments.logs import epoch_series, metric_files

    # attempt 0 validated epochs 0-2 and was killed; last.ckpt was at epoch 1, so epoch 2 ran again
    write_csv(tmp_path / "metrics.part0.csv", [{"epoch": e, "step": e, "val/qwk": 0.1 * e} for e in range(3)])
    write_csv(tmp_path / "metrics.csv", [{"epoch": e, "step": e, "val/qwk": 0.5 + e} for e in (2, 3)])
    assert [p.name for p in metric_files(tmp_path)] == ["metrics.part0.csv", "metrics.csv"]
    assert epoch_series(tmp_path, ["val/qwk", "val/mae"]) == {"val/qwk": {0: 0.0, 1: 0.1, 2: 2.5, 3: 3.5}}


def test_curve_metric_alternatives_take_the_key_each_run_logged(tmp_path) -> None:
    from experiments.logs import curves
    from experiments.tables import CIFAR10

    ((spec, _),) = CIFAR10.curve_metrics
    assert spec == "val/online_probe/acc|val/acc"
    pre, ce, both = tmp_path / "pre", tmp_path / "ce", tmp_path / "both"
    for d in (pre, ce, both):
        d.mkdir()
    write_csv(pre / "metrics.csv", [{"epoch": e, "step": e, "val/online_probe/acc": 0.1 * e} for e in range(3)])
    write_csv(ce / "metrics.csv", [{"epoch": e, "step": e, "val/acc": 0.5 + e} for e in range(2)])
    write_csv(both / "metrics.csv", [{"epoch": 0, "step": 0, "val/online_probe/acc": 0.2, "val/acc": 0.9}])
    assert curves(CIFAR10, pre) == {spec: [[0, 0.0], [1, 0.1], [2, 0.2]]}
    assert curves(CIFAR10, ce) == {spec: [[0, 0.5], [1, 1.5]]}
    assert curves(CIFAR10, both) == {spec: [[0, 0.2]]}  # the first alternative wins
    write_csv(ce / "metrics.csv", [{"epoch": 0, "step": 0, "train/loss": 1.0}])
    assert curves(CIFAR10, ce) == {}


def test_paired_differences_use_matching_seeds_only() -> None:
    from experiments.stats import paired_differences

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
