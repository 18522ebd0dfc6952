"""The cloc-lightning command in a subprocess: help, fit + test_after_fit, predict, typos, real data."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from benchmarks.option_sweep import run_main
from tests.conftest import REPO, TINY_BACKBONE, UTKFACE, needs, run_cli


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_help_lists_registered_classes(tmp_path: Path) -> None:
    out = run_cli(["fit", "--help"], tmp_path).stdout
    assert "--test_after_fit" in out and "--model" in out and "--data" in out
    for name in ("CEModule", "OrdinalShapesDataModule", "UTKFaceDataModule", "ImageFolderDataModule", "CSVDataModule"):
        assert name in out, name
    model_help = run_cli(["fit", "--model.help", "CEModule"], tmp_path).stdout
    assert "--model.num_classes" in model_help and "--model.backbone" in model_help


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_fit_then_test_then_predict(tmp_path: Path, tiny_shapes_args: list[str]) -> None:
    args = ["--model", "CEModule", "--model.num_classes", "4", "--model.backbone", TINY_BACKBONE, *tiny_shapes_args]
    out = run_cli(["fit", *args, "--test_after_fit", "true", "--trainer.logger.init_args.name", "smoke"], tmp_path).stdout
    assert "test/mae" in out and "test/qwk" in out and "test/acc_pm1" in out
    assert "best checkpoint:" in out and "logs (TensorBoard): runs/smoke/version_0" in out
    ckpts = sorted((tmp_path / "runs" / "smoke" / "version_0" / "checkpoints").glob("best-*.ckpt"))
    assert ckpts, "no best checkpoint written"
    assert (tmp_path / "runs" / "smoke" / "version_0" / "config.yaml").is_file()
    pred = run_cli(["predict", *args, "--ckpt_path", str(ckpts[0]), "--trainer.logger.init_args.name", "pred"], tmp_path).stdout
    path = tmp_path / "runs" / "pred" / "version_0" / "predictions.csv"
    assert "predictions written to" in pred and path.is_file()
    rows = list(csv.DictReader(path.open()))
    assert len(rows) == 32 and set(rows[0]) >= {"target", "pred", "expected", "p0", "p3"}
    assert all(0 <= int(r["pred"]) < 4 for r in rows)


@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_python_m_and_config_file(tmp_path: Path) -> None:
    cfg = REPO / "configs" / "ce" / "demo.yaml"
    out = run_cli(
        [
            "fit",
            "--config",
            str(cfg),
            "--model.backbone",
            TINY_BACKBONE,
            "--data.train_size",
            "64",
            "--data.val_size",
            "32",
            "--data.test_size",
            "32",
            "--data.num_workers",
            "0",
            "--trainer.max_epochs",
            "1",
            "--trainer.enable_progress_bar",
            "false",
        ],
        tmp_path,
    ).stdout
    assert "test/mae" in out and "runs/ce_demo/version_0" in out


def test_unknown_key_fails_with_clear_message(tmp_path: Path, tiny_shapes_args: list[str]) -> None:
    proc = run_main(["fit", "--model", "CEModule", "--model.num_classes", "4", "--model.learning_rate", "0.1", *tiny_shapes_args], tmp_path)
    assert proc.code != 0
    assert "learning_rate" in proc.stderr


def test_typo_in_yaml_config_fails(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(
        "model:\n  class_path: cloc_lightning.methods.CEModule\n  init_args:\n    num_classes: 4\n    backbon: resnet18\n"
        "data:\n  class_path: cloc_lightning.data.OrdinalShapesDataModule\n"
    )
    proc = run_main(["fit", "--config", str(cfg)], tmp_path)
    assert proc.code != 0 and "backbon" in proc.stderr


@needs(UTKFACE)
@pytest.mark.realdata
@pytest.mark.slow  # a CLI subprocess run: the long tier (pytest -m slow)
def test_ce_utkface_config_trains_and_reports(tmp_path: Path) -> None:
    out = run_cli(
        [
            "fit",
            "--config",
            str(REPO / "configs" / "ce" / "utkface.yaml"),
            "--data.root",
            str(UTKFACE),
            "--model.backbone",
            TINY_BACKBONE,
            "--data.image_size",
            "32",
            "--trainer.max_epochs",
            "1",
            "--trainer.limit_train_batches",
            "3",
            "--trainer.limit_val_batches",
            "2",
            "--trainer.limit_test_batches",
            "2",
            "--data.num_workers",
            "0",
            "--trainer.enable_progress_bar",
            "false",
        ],
        tmp_path,
    ).stdout
    assert "test/mae" in out and "test/qwk" in out


def test_every_shipped_config_parses() -> None:
    """Every YAML under configs/ resolves against the current classes (no unknown or stale keys), through the command's
    entry point in this process (``--print_config``)."""
    configs = sorted(str(p) for p in (REPO / "configs").rglob("*.yaml"))
    assert len(configs) >= 10
    bad = []
    for path in configs:
        if "/linear_probe/probe_" in path:  # configs of the `cloc-lightning probe` command
            out = run_main(["probe", "--config", path, "--ckpt", "stage_one.ckpt", "--print_config"], REPO)
        else:
            out = run_main(["fit", "--config", path, "--print_config"], REPO)
        if out.code != 0 or "class_path" not in out.stdout:
            bad.append(f"{path}: exit {out.code}, {out.stderr[-500:]}")
    assert not bad, "\n".join(bad)
