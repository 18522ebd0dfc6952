"""Run records through the real CLI (in-process): a run folder's ``config.yaml`` is written once, by the run
that owns it; a resumed fit appends ``config.resume-N.yaml``; a new run into a folder holding records is
refused before it writes anything; ``validate``/``test``/``predict`` refuse to run without trained weights (an
``init_from`` that leaves a head untrained included); a finished run is not resumed; refused and failed runs leave no
run folder; a finished run extended with a larger ``max_epochs`` continues its schedule over the new total."""

from __future__ import annotations

from pathlib import Path
from typing import ClassVar

import lightning as L
import pytest
import yaml

from cloc_lightning.cli import main
from tests.cli._tiny import DATA, MODEL
from tests.conftest import TINY_BACKBONE

#: a CE fit of one epoch on 16 px shapes (2 training steps)
ARGS = [*MODEL, *DATA, "--trainer.logger.init_args.name", "rec"]


def _exit_code(args: list[str]) -> int | str | None:
    try:
        main(args)
    except SystemExit as e:
        return e.code
    return 0


def _lr(path: Path) -> float:
    return float(yaml.safe_load(path.read_text())["model"]["init_args"]["lr"])


def test_records_are_written_once_resume_appends_and_a_pinned_rerun_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "rec" / "version_0"
    pinned = ["--trainer.logger.init_args.version", "0"]
    assert _exit_code(["fit", *ARGS, *pinned]) == 0
    config = (run / "config.yaml").read_text()
    hparams = (run / "hparams.yaml").read_text()
    held = sorted(p.name for p in run.iterdir())

    # (b) a second run pinned to the same folder with another lr: refused before it writes anything
    capsys.readouterr()
    assert _exit_code(["fit", *ARGS, *pinned, "--model.lr", "0.01"]) == 1
    err = capsys.readouterr().err
    assert "run folder runs/rec/version_0 already holds the records of another run" in err, err
    assert "--trainer.logger.init_args.version <new>" in err and "--ckpt_path last" in err
    assert len([ln for ln in err.strip().splitlines() if not ln.startswith("/")]) == 2  # the error + the --debug hint
    assert (run / "config.yaml").read_text() == config and (run / "hparams.yaml").read_text() == hparams
    assert sorted(p.name for p in run.iterdir()) == held

    # (a) resumed fits append their own config and leave config.yaml alone
    assert _exit_code(["fit", *ARGS, "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert _exit_code(["fit", *ARGS, "--ckpt_path", "last", "--trainer.max_epochs", "3"]) == 0
    assert (run / "config.yaml").read_text() == config
    assert yaml.safe_load((run / "config.resume-1.yaml").read_text())["trainer"]["max_epochs"] == 2
    assert yaml.safe_load((run / "config.resume-2.yaml").read_text())["trainer"]["max_epochs"] == 3
    assert _lr(run / "config.yaml") == 0.001

    # an unpinned new run takes the next free folder
    assert _exit_code(["fit", *ARGS, "--model.lr", "0.01"]) == 0
    assert _lr(tmp_path / "runs" / "rec" / "version_1" / "config.yaml") == 0.01
    assert _lr(run / "config.yaml") == 0.001


class FailAtTrainStart(L.Callback):
    """Fails as a late data error would: after the run's config is saved, before any step."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        raise OSError("broken.csv row 1: missing.png does not exist")


def test_a_failed_resume_keeps_the_runs_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The resumed attempt fails after its config is saved: ``config.yaml`` stays the first run's."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "rec" / "version_0"
    assert _exit_code(["fit", *ARGS]) == 0
    config = (run / "config.yaml").read_text()
    with pytest.raises(OSError, match="missing.png"):
        main(
            [
                "fit",
                *ARGS,
                "--ckpt_path",
                "last",
                "--trainer.max_epochs",
                "2",
                "--model.lr",
                "0.05",
                "--trainer.callbacks+=tests.cli.test_cli_records.FailAtTrainStart",
            ]
        )
    assert (run / "config.yaml").read_text() == config
    assert "FailAtTrainStart" in (run / "config.resume-1.yaml").read_text()


@pytest.mark.parametrize("command", ["predict", "test", "validate"])
def test_evaluation_commands_refuse_an_untrained_model(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    assert _exit_code([command, *ARGS]) == 1
    err = capsys.readouterr().err
    assert f"{command} without trained weights: no --ckpt_path and no --model.init_from" in err, err
    assert "--ckpt_path <run folder>/checkpoints/<file>.ckpt" in err and "--model.init_from <checkpoint" in err
    assert not (tmp_path / "runs" / "rec" / "version_0").exists()  # refused before the run folder is made (issue 42, item 9)


def test_predict_with_init_from_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert _exit_code(["fit", *ARGS]) == 0
    ckpt = next((tmp_path / "runs" / "rec" / "version_0" / "checkpoints").glob("last*.ckpt"))
    assert _exit_code(["predict", *ARGS, "--model.init_from", str(ckpt)]) == 0
    assert (tmp_path / "runs" / "rec" / "version_1" / "predictions.csv").is_file()


# ----------------------------------------------------------------------- init_from of another module (issue 42, item 1)
def _other_module_args(model: list[str]) -> list[str]:
    """:data:`ARGS` with another model (same tiny backbone, data, logger)."""
    return [*model, "--model.backbone", TINY_BACKBONE, *ARGS[ARGS.index("--data") :]]


@pytest.mark.parametrize(
    ("command", "model", "untrained"),
    [
        ("predict", ["--model", "OrdinalRegressionModule", "--model.head", "corn"], "head.*"),
        ("test", ["--model", "SupConModule", "--model.method", "supcon"], "probe.*"),
    ],
)
def test_evaluation_refuses_init_from_that_leaves_parameters_untrained(
    command: str, model: list[str], untrained: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A CE checkpoint loads the encoder of a CORN model / a SupCon model, not its head / online probe: refused,
    naming what would be untrained and the fix, before a run folder or a record is written."""
    monkeypatch.chdir(tmp_path)
    assert _exit_code(["fit", *ARGS]) == 0
    ckpt = next((tmp_path / "runs" / "rec" / "version_0" / "checkpoints").glob("last*.ckpt"))
    capsys.readouterr()
    assert _exit_code([command, *_other_module_args(model), "--model.init_from", str(ckpt)]) == 1
    err = capsys.readouterr().err
    assert f"{command} with --model.init_from {ckpt}" in err, err
    assert f"{untrained} not in it" in err and "untrained" in err, err
    assert "--ckpt_path <a checkpoint of" in err and "fit first" in err, err
    assert len([ln for ln in err.strip().splitlines() if not ln.startswith("/")]) == 2, err  # the error + the --debug hint
    assert sorted(p.name for p in (tmp_path / "runs" / "rec").iterdir()) == ["version_0"]  # no run folder left behind


# ----------------------------------------------------------------------- resuming a finished run (issue 42, item 2)
def _records(folder: Path) -> dict[str, int]:
    """Every file under ``folder`` with its size and modification time (ns): what a refused run must leave alone."""
    return {str(p.relative_to(folder)): p.stat().st_mtime_ns + p.stat().st_size for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    ("limit", "end", "fix"),
    [
        ([], "epoch 1 of max_epochs 1", "--trainer.max_epochs 2"),
        (["--trainer.max_steps", "2", "--trainer.max_epochs", "5"], "global step 2 of max_steps 2", "--trainer.max_steps 3"),
    ],
)
def test_resuming_a_finished_run_is_refused_before_any_record_is_written(
    limit: list[str], end: str, fix: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    args = [*ARGS, *limit, "--test_after_fit", "true"]
    assert _exit_code(["fit", *args]) == 0
    runs = tmp_path / "runs" / "rec"
    before = _records(runs)
    capsys.readouterr()
    for ckpt in ("last", str(runs / "version_0" / "checkpoints" / "last.ckpt")):
        assert _exit_code(["fit", *args, "--ckpt_path", ckpt]) == 1
        captured = capsys.readouterr()
        err = captured.err
        assert f"--ckpt_path {ckpt}:" in err and "the end of its run" in err and end in err, err
        assert "would train nothing" in err and fix in err, err
        assert len([ln for ln in err.strip().splitlines() if not ln.startswith("/")]) == 2, err
        assert "test/" not in captured.out  # no test re-run
        assert _records(runs) == before  # no config.resume-1.yaml, no new events, no new run folder


# ----------------------------------------------------------------------- extending a finished run (issue 42, item 14)
class RecordLR(L.Callback):
    """The learning rate each training step's optimiser step uses (read before the step), per process."""

    used: ClassVar[list[tuple[int, float]]] = []

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, batch_idx: int) -> None:
        RecordLR.used.append((trainer.global_step, float(trainer.optimizers[0].param_groups[0]["lr"])))


def test_extending_a_finished_run_continues_the_schedule_over_the_new_total(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A 1-epoch cosine run resumed with max_epochs 2 takes the LRs of steps 2-3 of a 2-epoch run's cosine (docs/cli.md:
    the schedule spans the new total and continues from the resumed step), not LR 0.0 (the old schedule's end) first."""
    monkeypatch.chdir(tmp_path)
    record = ["--trainer.callbacks+=tests.cli.test_cli_records.RecordLR", "--model.lr", "0.01"]
    RecordLR.used = []
    assert _exit_code(["fit", *ARGS, *record, "--trainer.max_epochs", "2", "--trainer.logger.init_args.name", "ref"]) == 0
    reference = dict(RecordLR.used)
    assert sorted(reference) == [0, 1, 2, 3] and reference[0] == pytest.approx(0.01)
    RecordLR.used = []
    assert _exit_code(["fit", *ARGS, *record]) == 0
    assert [s for s, _ in RecordLR.used] == [0, 1]
    RecordLR.used = []
    assert _exit_code(["fit", *ARGS, *record, "--ckpt_path", "last", "--trainer.max_epochs", "2"]) == 0
    assert [s for s, _ in RecordLR.used] == [2, 3]
    assert RecordLR.used[0][1] > 0.0
    assert dict(RecordLR.used) == {2: reference[2], 3: reference[3]}


# ----------------------------------------------------------------------- refused and failed runs leave no folder (issue 42, item 9)
class FailAtStep(L.Callback):
    """Fails at the start of training step ``step`` (0: before any step, as a late data error)."""

    def __init__(self, step: int = 0) -> None:
        self.step = step

    def on_train_batch_start(self, trainer: L.Trainer, pl_module: L.LightningModule, batch: object, batch_idx: int) -> None:
        if trainer.global_step == self.step:
            raise OSError(f"broken.csv row {self.step}: missing.png does not exist")


def test_refused_and_failed_runs_leave_no_run_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    runs = tmp_path / "runs" / "rec"
    # refused at the trains-nothing check (was: in the module's setup, after config.yaml was written)
    assert _exit_code(["fit", *ARGS, "--trainer.max_epochs", "0"]) == 1
    assert not runs.exists() or not list(runs.iterdir())
    # failed before its first step, after config.yaml and hparams.yaml were written: the folder it made goes
    fail = ["--trainer.callbacks+=tests.cli.test_cli_records.FailAtStep"]
    with pytest.raises(OSError, match="missing.png"):
        main(["fit", *ARGS, *fail])
    assert not runs.exists() or not list(runs.iterdir())
    # failed after a step but before the first checkpoint (issue 51: was kept, with no checkpoint): the folder goes too
    with pytest.raises(OSError, match="missing.png"):
        main(["fit", *ARGS, *fail, "--trainer.callbacks.init_args.step", "1"])
    assert not runs.exists() or not list(runs.iterdir())
    # failed after the first checkpoint (epoch 1 ends at step 2): the folder and its checkpoints stay, and so does a folder it did not make
    with pytest.raises(OSError, match="missing.png"):
        main(["fit", *ARGS, *fail, "--trainer.callbacks.init_args.step", "3", "--trainer.max_epochs", "2"])
    assert [p.name for p in runs.iterdir()] == ["version_0"] and (runs / "version_0" / "config.yaml").is_file()
    assert list((runs / "version_0" / "checkpoints").glob("*.ckpt"))
    (runs / "version_1").mkdir()
    (runs / "version_1" / "job.log").write_text("a job script's own log")
    with pytest.raises(OSError, match="missing.png"):
        main(["fit", *ARGS, *fail, "--trainer.logger.init_args.version", "1"])
    assert "job.log" in {p.name for p in (runs / "version_1").iterdir()}


def test_a_batch_count_is_recorded_as_a_count_so_the_config_reruns_the_same(tmp_path: Path) -> None:
    """``--trainer.limit_train_batches 1`` (one batch) is written to config.yaml as ``1``, not ``1.0`` (a fraction: every
    batch), so ``fit --config <run>/config.yaml`` trains what the first run trained (an outside user found 2 of 2)."""
    from benchmarks.option_sweep import run_main

    args = [
        *("fit", *MODEL, *DATA, "--data.train_size", "32", "--data.val_size", "16"),
        "--trainer.limit_train_batches",
        "1",
        "--trainer.limit_val_batches",
        "0.5",
    ]
    assert run_main(args, tmp_path).code == 0
    saved = next(tmp_path.glob("runs/*/version_0/config.yaml"))
    trainer = yaml.safe_load(saved.read_text())["trainer"]
    assert trainer["limit_train_batches"] == 1 and isinstance(trainer["limit_train_batches"], int)
    assert trainer["limit_val_batches"] == 0.5  # a fraction stays one
