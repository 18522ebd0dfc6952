"""A run that fails before its first checkpoint leaves no run folder, also in its first validation (issue 51, item 3),
and an unreadable image met by a loader worker is the library's one line, not torch's re-raised worker traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloc_lightning.cli import main
from tests.cli._tiny import png


def _csv(folder: Path) -> Path:
    rows = ["path,label"]
    for i in range(24):
        png(folder / "img" / f"{i}.png", seed=i)
        rows.append(f"img/{i}.png,{i % 3}")
    (folder / "img" / "0.png").write_bytes(b"not an image")
    (folder / "data.csv").write_text("\n".join(rows) + "\n")
    return folder / "data.csv"


@pytest.mark.parametrize("workers", ["0", "2"])
def test_an_unreadable_image_in_the_first_validation_is_one_line_and_leaves_no_run_folder(
    workers: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [
        "fit", "--model", "CEModule", "--model.backbone", "test_resnet", "--data", "CSVDataModule", "--data.csv_path",
        str(_csv(tmp_path)), "--data.task", "nominal", "--data.batch_size", "4", "--data.num_workers", workers,
        "--data.split_fractions", "[0.5, 0.25, 0.25]", "--trainer.accelerator", "cpu", "--trainer.max_epochs", "1",
        "--trainer.logger", "CSVLogger", "--trainer.logger.save_dir", "runs", "--trainer.num_sanity_val_steps", "0",
        "--trainer.enable_progress_bar", "false",
    ]  # fmt: skip
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    err = lines[next(i for i, ln in enumerate(lines) if ln.startswith("cloc-lightning: error:")) :]  # after Lightning's warnings
    assert err[0] == (
        f"cloc-lightning: error: Cannot read image '{tmp_path / 'img' / '0.png'}' (UnidentifiedImageError: cannot identify "
        f"image file '{tmp_path / 'img' / '0.png'}'). Fix or remove the file, or set data bad_files: skip to skip unreadable "
        "files with a warning."
    ), err[:3]  # was torch's "Caught RuntimeError in DataLoader worker process 0" and ~40 lines (workers: 2)
    assert err[1:] == ["(--debug shows the traceback)"]
    assert not list((tmp_path / "runs").rglob("*"))  # was runs/default/version_0 with config.yaml and no checkpoint


@pytest.mark.parametrize("existed", [False, True])
def test_a_refused_run_removes_the_save_dir_it_made_and_keeps_one_that_was_there(existed: bool, tmp_path: Path) -> None:
    """``runs/`` made by a command that then fails before its first checkpoint goes with the run folder (an outside user
    found it left behind in 17 refused commands); a ``runs/`` that existed before stays, even when empty."""
    from benchmarks.option_sweep import run_main

    if existed:
        (tmp_path / "runs").mkdir()
    args = ["fit", "--model", "CEModule", "--model.backbone", "test_resnet", "--data", "UTKFaceDataModule"]
    args += ["--data.root", str(tmp_path / "nope"), "--trainer.logger.class_path", "TensorBoardLogger"]
    out = run_main([*args, "--trainer.logger.init_args.save_dir", "runs/deeper"], tmp_path)
    assert out.code == 1 and "UTKFace root" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == (["runs"] if existed else [])
    if existed:
        assert not any((tmp_path / "runs").iterdir())


@pytest.mark.parametrize("command, key", [("validate", "limit_val_batches"), ("test", "limit_test_batches")])
def test_an_evaluation_on_no_batch_is_refused_and_leaves_no_run_folder(command: str, key: str, tmp_path: Path) -> None:
    """``validate``/``test`` with a limit of 0 batches exited 0 with no metrics and a new run folder (an outside user)."""
    from benchmarks.option_sweep import run_main

    args = ["fit", "--model", "CEModule", "--model.backbone", "test_resnet", "--data", "OrdinalShapesDataModule"]
    args += ["--data.train_size", "16", "--data.val_size", "8", "--data.test_size", "8", "--data.batch_size", "8"]
    args += ["--data.num_workers", "0", "--data.image_size", "16", "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false"]
    assert run_main(args, tmp_path).code == 0
    ckpt = next(tmp_path.glob("runs/*/version_0/checkpoints/last.ckpt"))
    runs = sorted(p.name for p in ckpt.parents[2].iterdir())
    out = run_main([command, *args[1:], "--ckpt_path", str(ckpt), f"--trainer.{key}", "0"], tmp_path)
    assert out.code == 1 and f"--trainer.{key} 0: {command} would run on no batch" in out.stderr, out.stderr[-2000:]
    assert sorted(p.name for p in ckpt.parents[2].iterdir()) == runs


@pytest.mark.parametrize(
    "setting, said",
    [
        (["--trainer.val_check_interval", "5"], "--trainer.val_check_interval: Lightning refused the run before its first step"),
        (["--trainer.limit_val_batches", "0.5"], "--trainer.limit_val_batches: Lightning refused the run before its first step"),
    ],
)
def test_lightnings_refusal_before_the_first_step_is_one_line(setting: list[str], said: str, tmp_path: Path) -> None:
    """Lightning's own checks when a fit starts (an interval beyond the epoch's 2 batches, half of 1 validation batch)
    were 56-line tracebacks (an outside user); now one line, and no run folder."""
    from benchmarks.option_sweep import run_main

    args = ["fit", "--model", "CEModule", "--model.backbone", "test_resnet", "--data", "OrdinalShapesDataModule"]
    args += ["--data.num_workers", "0", "--data.train_size", "16", "--data.val_size", "8", "--data.batch_size", "8"]
    out = run_main([*args, "--trainer.max_epochs", "1", "--trainer.enable_progress_bar", "false", *setting], tmp_path)
    assert out.code == 1 and said in out.stderr and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert not any(tmp_path.iterdir())
