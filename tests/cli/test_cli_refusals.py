"""Refusals that named the wrong cause, through the real CLI (in-process): a Trainer strategy, accelerator or devices
value Lightning does not know (a typo) is no limit of the machine; a first word that is no command names the nearest
command and all of them; evaluation commands without a logger write ``config.<command>-N.yaml`` (not an enum's
``config.TrainerFn.TESTING-1.yaml``) and leave ``config.yaml`` to a later ``fit`` in that folder."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from lightning.pytorch.trainer.states import TrainerFn

from cloc_lightning.cli import COMMANDS, RunConfigSaver, main
from tests.cli._tiny import CE_MODEL, MODEL, QUIET

FIT = ["fit", *CE_MODEL, "--data", "OrdinalShapesDataModule", "--trainer.fast_dev_run", "true"]


def _stderr_of_exit(args: list[str], code: int, capsys: pytest.CaptureFixture[str]) -> list[str]:
    """Run the CLI, expect exit ``code``, return stderr's lines from the error line on (Lightning's start-up lines dropped)."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == code
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    return lines[next(i for i, ln in enumerate(lines) if ln.startswith("cloc-lightning: error:")) :]


# ------------------------------------------------------------------------------------------------ Trainer settings
@pytest.mark.parametrize(
    "setting, expected",
    [
        (
            ["--trainer.strategy", "dpp"],
            "--trainer.strategy dpp: Lightning does not know this strategy; did you mean ddp? (Lightning's choices: auto, ddp, ddp_fork,",
        ),
        (["--trainer.strategy=ddp_spwan"], "--trainer.strategy ddp_spwan: Lightning does not know this strategy; did you mean ddp_spawn?"),
        (
            ["--trainer.strategy", "qwerty"],
            "--trainer.strategy qwerty: Lightning does not know this strategy; give one of Lightning's choices: auto, ddp,",
        ),
        (
            ["--trainer.accelerator", "gpux"],
            "--trainer.accelerator gpux: Lightning does not know this accelerator; did you mean gpu? (Lightning's choices: auto, cpu, cuda, gpu,",
        ),
        (
            ["--trainer.devices", "two"],
            '--trainer.devices two: Lightning does not know this form of devices; did you mean 2? (devices takes a number (an int > 0, e.g. 2), device indices ([0, 1] or "0,1"), -1 for all of them, or auto)',
        ),
        (["--trainer.devices", "1.5"], "--trainer.devices 1.5: Lightning does not know this form of devices (devices takes a number"),
        (["--trainer.devices", "-2"], "--trainer.devices -2: Lightning does not know this form of devices (devices takes a number"),
        (["--trainer.num_nodes", "0"], "--trainer.num_nodes 0: Lightning's Trainer refuses it: num_nodes is the number of machines"),
    ],
)
def test_a_trainer_value_lightning_does_not_know_is_named_as_such(
    setting: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _stderr_of_exit([*FIT, *setting], 1, capsys)
    assert err[0].startswith(f"cloc-lightning: error: {expected}"), err
    assert "machine" not in err[0].replace("number of machines", ""), err  # was "this machine cannot run it ..."
    assert err[1:] == ["(--debug shows the traceback)"]


def test_the_strategy_choices_are_lightnings_registry(capsys: pytest.CaptureFixture[str]) -> None:
    from lightning.pytorch.strategies import StrategyRegistry

    line = _stderr_of_exit([*FIT, "--trainer.strategy", "dpp"], 1, capsys)[0]
    shown = line.split("(Lightning's choices: ", 1)[1]
    for name in StrategyRegistry.available_strategies():
        assert name in shown or "_find_unused_parameters_" in name, (name, line)


def test_a_value_from_the_config_file_is_shown_as_given(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    cfg = tmp_path / "run.yaml"
    cfg.write_text("trainer:\n  strategy: dpp\n")
    err = _stderr_of_exit([*FIT, "--config", str(cfg)], 1, capsys)
    assert err[0].startswith("cloc-lightning: error: trainer.strategy 'dpp': Lightning does not know this strategy; did you mean ddp?"), err


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the setting below is possible here")
def test_a_machine_limit_still_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    err = _stderr_of_exit([*FIT, "--trainer.accelerator", "gpu"], 1, capsys)
    assert err[0].startswith("cloc-lightning: error: --trainer.accelerator gpu: this machine cannot run it (No supported gpu backend"), err


# ---------------------------------------------------------------------------------------------------- command names
ALL = "(commands: fit, validate, test, predict, probe, export-prototypes, configs, cache, data; cloc-lightning --help describes them)"


@pytest.mark.parametrize(
    "argv, expected",
    [
        (["prob", "--ckpt", "x.ckpt"], "unknown command 'prob'; did you mean probe? "),
        (["dta", "optimize"], "unknown command 'dta'; did you mean data? "),
        (["export_prototypes", "a", "b"], "unknown command 'export_prototypes'; did you mean export-prototypes? "),
        (["tset", *MODEL], "unknown command 'tset'; did you mean test? "),
        (["train"], "unknown command 'train'; did you mean fit? "),
        (["help"], "unknown command 'help'; did you mean --help? "),
        (["qqq"], "unknown command 'qqq' "),
        (["cfg.yaml"], "unknown command 'cfg.yaml': a config file is given with --config, e.g. cloc-lightning fit --config cfg.yaml "),
    ],
)
def test_an_unknown_command_names_the_nearest_and_all_of_them(argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = _stderr_of_exit(argv, 2, capsys)
    assert err == [f"cloc-lightning: error: {expected}{ALL}"], err  # one line; was jsonargparse's 4 sub-commands only


def test_the_listed_commands_are_every_command() -> None:
    from cloc_lightning.cli import CLOCLightningCLI

    assert ALL.startswith(f"(commands: {', '.join([*CLOCLightningCLI.subcommands(), *COMMANDS])};")


@pytest.mark.parametrize("argv", [["--help"], ["fit", "--help"], ["configs", "--help"]])
def test_help_still_works(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(argv)
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage:" in out and "unknown command" not in out


# ------------------------------------------------------------------------------- evaluation records without a logger
@pytest.mark.parametrize(
    "stage, expected",
    [
        (TrainerFn.TESTING, "config.test-1.yaml"),
        (TrainerFn.VALIDATING, "config.validate-1.yaml"),
        (TrainerFn.PREDICTING, "config.predict-1.yaml"),
    ],
)
def test_an_evaluation_record_is_named_by_the_commands_value(stage: TrainerFn, expected: str, tmp_path: Path) -> None:
    saver = RunConfigSaver(parser=None, config=None)
    (tmp_path / "config.yaml").write_text("x: 1\n")
    assert saver.record_name(str(tmp_path), stage) == expected  # was config.TrainerFn.TESTING-1.yaml
    (tmp_path / expected).write_text("x: 1\n")
    assert saver.record_name(str(tmp_path), stage) == expected.replace("-1", "-2")
    # the first record of an evaluation in a folder of no logger version: not config.yaml, which a fit would then be refused over
    (tmp_path / "config.yaml").unlink()
    assert saver.record_name(str(tmp_path), stage, own_folder=False) == expected.replace("-1", "-2")
    assert saver.record_name(str(tmp_path), stage) == "config.yaml"  # a logger's version folder of its own


def test_evaluating_without_a_logger_leaves_the_folder_to_a_later_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tiny = [*CE_MODEL, "--data", "OrdinalShapesDataModule", *QUIET, "--data.train_size", "16", "--data.val_size", "8"]
    tiny += ["--data.test_size", "8", "--data.batch_size", "8", "--trainer.max_epochs", "1", "--trainer.logger", "false"]
    trained, here = tmp_path / "trained", tmp_path / "here"
    trained.mkdir()
    here.mkdir()
    monkeypatch.chdir(trained)
    main(["fit", *tiny])
    ckpt = str(trained / "checkpoints" / "last.ckpt")

    monkeypatch.chdir(here)
    for command in ("test", "test", "validate"):
        main([command, *tiny, "--ckpt_path", ckpt])
    assert sorted(p.name for p in here.iterdir()) == [
        "config.test-1.yaml",
        "config.test-2.yaml",
        "config.validate-1.yaml",
        "data.test-1.json",
        "data.test-2.json",
        "data.validate-1.json",
    ]
    capsys.readouterr()
    main(["fit", *tiny])  # was refused: "run folder … already holds the records of another run (config.yaml)"
    assert "already holds" not in capsys.readouterr().err
    assert (here / "config.yaml").is_file() and (here / "checkpoints" / "last.ckpt").is_file()
    # a fit still owns its folder: a second new fit there is refused, as documented
    assert _stderr_of_exit(["fit", *tiny], 1, capsys)[0].startswith(f"cloc-lightning: error: run folder {here} already holds the records")


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    from importlib.metadata import version

    main(["--version"])
    assert capsys.readouterr().out.strip() == f"cloc-lightning {version('cloc-lightning')}"
