"""Errors a newcomer can read, through the real CLI (in-process): parse errors, a missing ``--ckpt_path``, an
unusable logger ``save_dir``, LightningCLI's ``--optimizer``/``--lr_scheduler`` — each one ``error:`` line naming
the input and the fix, before anything trains; help texts without reST markup or truncated summaries; wrong types
and typos in YAML configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from benchmarks.option_sweep import run_main
from cloc_lightning.cli import main
from tests._reliability import _tiny_cli_config
from tests.cli._tiny import DATA, MODEL
from tests.conftest import TINY_BACKBONE


def _fails(args: list[str], capsys: pytest.CaptureFixture[str], code: int) -> str:
    """Run the CLI, expect exit ``code`` with a short message (at most 2 lines on stderr), return stderr."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        main(args)
    assert exc.value.code == code
    out = capsys.readouterr()
    assert "Epoch" not in out.out + out.err and "Traceback" not in out.err
    lines = [ln for ln in out.err.strip().splitlines() if not ln.startswith("/")]  # python warnings (site-packages paths)
    assert 1 <= len(lines) <= 2, out.err
    return out.err


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (
            ["fit", *MODEL, "--model.learning_rate", "0.1", *DATA],
            "error: --model.learning_rate: CEModule has no such argument; did you mean --model.lr",
        ),
        (
            ["fit", *MODEL, *DATA, "--trainer.max_epochz", "2"],
            "error: unknown option --trainer.max_epochz; did you mean --trainer.max_epochs",
        ),
        (["fit", "--config", "missing.yaml"], "error: --config: no such file: "),
        (["fit", "--config", "bad.yaml"], "error: bad.yaml:4:8: invalid YAML: expected ',' or ']'"),
        (
            ["fit", "--model", "CEModule", "--model.num_classes", "eight", *DATA],
            "error: --model.num_classes: expected int, got 'eight' (CEModule)",
        ),
        (
            ["fit", *MODEL, *DATA, "--data.augment_on", "gpu"],
            "error: --data.augment_on: expected one of loader, device; got 'gpu' (OrdinalShapesDataModule)",
        ),
        # the other commands with jsonargparse parsers: the same one line (cli.commands.parse_command_args)
        (["data", "optimize", "--config", "missing.yaml", "--out", "chunks"], "data optimize: error: --config: no such file: "),
        (
            ["data", "optimize", *DATA, "--out", "chunks", "--format", "gif"],
            "data optimize: error: --format: expected one of jpeg, webp, png, raw; got 'gif'",
        ),
        (["data", "optimize", *DATA, "--outt", "chunks"], "data optimize: error: unknown option --outt; did you mean --out?"),
        (
            ["data", "optimize", "--out", "chunks"],
            "data optimize: error: --data is required; give it on the command line or in a --config file",
        ),
        (
            ["data", "optimize", "--data", "OrdinalShapesDataModul", "--out", "chunks"],
            "data optimize: error: --data OrdinalShapesDataModul: no class of that name; did you mean OrdinalShapesDataModule?",
        ),
        (["data", "optimize", "--config", "bad.yaml", "--out", "chunks"], "data optimize: error: bad.yaml:4:8: invalid YAML"),
        (
            ["probe", "--ckpt", "x.ckpt", *DATA, "--data.num_clases", "3"],
            "probe: error: --data.num_clases: OrdinalShapesDataModule has no such argument; did you mean --data.num_classes",
        ),
        (["probe", "--ckpt", "x.ckpt", *DATA, "--split", "tran"], "probe: error: --split: expected one of test, val; got 'tran'"),
    ],
)
def test_parse_errors_are_one_line(
    args: list[str], expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("model:\n  class_path: CEModule\n  init_args: [num_classes: 4\ntrainer: {\n")
    err = _fails(args, capsys, 2)
    assert expected in err, err
    assert "--debug shows the parser's full message" in err
    assert "<unicode string>" not in err and "usage:" not in err


FIT_CONFIG = "fit.yaml"  # a run's config: model, trainer and data sections


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        # probe reads a fit config's data section and ignores the others (as data optimize does)
        (["probe", "--config", FIT_CONFIG, "--ckpt", "nope.ckpt"], 1, "error: encoder checkpoint 'nope.ckpt' does not exist"),
        (["probe", "--config", FIT_CONFIG, "--ckpt", "nope.ckpt", "--device", "gpu"], 1, "error: --device 'gpu' is not a torch device"),
        (
            ["probe", "--config", FIT_CONFIG, "--ckpt", "nope.ckpt", "--output", "."],
            1,
            "error: --output .: cannot write there (it is a folder)",
        ),
        (
            ["probe", "--config", FIT_CONFIG, "--ckpt", "nope.ckpt", "--dvice", "cpu"],
            2,
            "probe: error: unknown option --dvice; did you mean --device?",
        ),
        (["probe", "--ckpt", "nope.ckpt"], 2, "probe: error: --data is required; give it on the command line or in a --config file"),
        # a typo of a top-level key: named with the nearest, not ignored or reported as a missing --data
        (
            ["data", "optimize", "--config", "dat.yaml", "--out", "c"],
            1,
            "error: --config dat.yaml: 'dat' is not a setting here; did you mean 'data'?",
        ),
        (
            ["fit", "--config", "dat.yaml"],
            2,
            "not a setting of fit (a --config key or an option); did you mean --data.",
        ),
        (["data", "optimize", "--config", FIT_CONFIG], 2, "data optimize: error: --out is required"),
        (["fit", *MODEL], 2, "error: --data is required; give it on the command line or in a --config file"),
        # a config that is no mapping: the same line for every command
        (["data", "optimize", "--config", "comments.yaml", "--out", "c"], 1, "error: --config comments.yaml: the file holds only comments"),
        (["probe", "--config", "list.yaml", "--ckpt", "x"], 1, "error: --config list.yaml: the file holds a YAML list, not a mapping"),
        (["fit", "--config", "list.yaml"], 1, "error: --config list.yaml: the file holds a YAML list, not a mapping"),
        # abbreviations are typos, not the option they start
        (
            ["fit", *MODEL, *DATA, "--trainer.max_epoch", "2"],
            2,
            "error: unknown option --trainer.max_epoch; did you mean --trainer.max_epochs",
        ),
    ],
)
def test_command_inputs_are_one_line(
    args: list[str], code: int, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    fit = {"model": {"class_path": "CEModule", "init_args": {"num_classes": 4, "backbone": TINY_BACKBONE}}, "trainer": {"max_epochs": 1}}
    fit["data"] = {
        "class_path": "OrdinalShapesDataModule",
        "init_args": {"num_classes": 4, "train_size": 16, "val_size": 8, "test_size": 8},
    }
    (tmp_path / FIT_CONFIG).write_text(yaml.safe_dump(fit))
    (tmp_path / "dat.yaml").write_text(yaml.safe_dump({"dat": fit["data"]}))
    (tmp_path / "comments.yaml").write_text("# nothing here yet\n")
    (tmp_path / "list.yaml").write_text("- a\n- b\n")
    err = _fails(args, capsys, code)
    assert expected in err, err
    assert not (tmp_path / "c").exists() and not (tmp_path / "runs").exists()


def test_debug_shows_the_parsers_full_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["fit", *MODEL, "--model.learning_rate", "0.1", *DATA, "--debug"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "Option 'learning_rate' is not accepted" in err


def test_debug_shows_a_commands_full_parse_message(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["data", "optimize", *DATA, "--out", "chunks", "--format", "gif", "--debug"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage: cloc-lightning data optimize" in err and "Expected a typing.Literal" in err and "Got value: gif" in err


CLOC = ["--model", "CLOCModule", "--model.num_classes", "4", "--model.backbone", TINY_BACKBONE]


@pytest.mark.parametrize(
    ("args", "code", "expected"),
    [
        # the second of two --config files
        (["fit", "--config", "good.yaml", "--config", "bad.yaml"], 2, "error: bad.yaml:4:8: invalid YAML: expected ',' or ']'"),
        # inline values: the option in place of a file
        (["fit", "--model", "{init_args:", *DATA], 2, "error: --model:1:12: invalid YAML: expected the node content"),
        (["fit", *MODEL, *DATA, "--trainer={max_epochs:"], 2, "error: --trainer:1:13: invalid YAML: expected the node content"),
        (
            ["fit", *MODEL, *DATA, "--model.init_args.lr", "[1,"],
            2,
            "error: --model.init_args.lr:1:4: invalid YAML: expected the node content",
        ),
        # a text option may hold what is no YAML (a checkpoint filename template): only the refused key's value is blamed
        (
            ["fit", *MODEL, *DATA, "--trainer.default_root_dir", "{epoch}-{step}", "--trainer.max_epochz", "2"],
            2,
            "error: unknown option --trainer.max_epochz; did you mean --trainer.max_epochs",
        ),
        # margins: an inline list and a margins file
        (
            ["fit", *CLOC, *DATA, "--model.learnable_map", "[[fixed, 0.5], [fixed, 0.7]"],
            1,
            "error: learnable_map:1:28: invalid YAML: expected ',' or ']', but got '<stream end>'",
        ),
        (
            ["fit", *CLOC, *DATA, "--model.learnable_map", "margins.yaml"],
            1,
            "error: margins.yaml:3:1: invalid YAML: expected ',' or ']', but got '<stream end>'",
        ),
    ],
)
def test_yaml_syntax_errors_name_the_file_line_and_column(
    args: list[str], code: int, expected: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every YAML input (each --config, an inline {...}/[...] value, a margins file): ``<where>:<line>:<col>: invalid YAML``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 1}}))
    (tmp_path / "bad.yaml").write_text("model:\n  class_path: CEModule\n  init_args: [num_classes: 4\ntrainer: {\n")
    (tmp_path / "margins.yaml").write_text("learnable_map:\n  - [fixed, 0.5\n")
    err = _fails(args, capsys, code)
    assert expected in err, err
    assert "<unicode string>" not in err
    assert not (tmp_path / "runs").exists()


def test_compile_backbone_values_are_refused_before_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``{mode: fastest}`` was a 60-line torch traceback at the first step that never named the option."""
    monkeypatch.chdir(tmp_path)
    err = _fails(["fit", *MODEL, *DATA, "--model.compile_backbone", "{mode: fastest}"], capsys, 1)
    assert "error: compile_backbone.mode must be 'default', " in err and "'max-autotune'" in err, err
    assert "got 'fastest'" in err
    assert not (tmp_path / "runs").exists()


def test_debug_names_the_invalid_yaml_file_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """``--debug`` keeps the parser's full message and adds the ``file:line:col`` line (the parser says "<unicode string>")."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "good.yaml").write_text(yaml.safe_dump({"trainer": {"max_epochs": 1}}))
    (tmp_path / "bad.yaml").write_text("trainer: {max_epochs: 1\n")
    with pytest.raises(SystemExit) as exc:
        main(["fit", "--config", "good.yaml", "--config", "bad.yaml", "--debug"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err and "bad.yaml:2:1: invalid YAML: expected ',' or '}'" in err, err


def test_missing_ckpt_path_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    for command in ("fit", "test"):
        err = _fails([command, *MODEL, *DATA, "--ckpt_path", "runs/none/best.ckpt"], capsys, 1)
        assert "error: --ckpt_path runs/none/best.ckpt: no such file; give an existing .ckpt file" in err, err
        assert "--ckpt_path last" in err
    assert not (tmp_path / "runs").exists()


def test_unusable_save_dir_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a folder")
    err = _fails(["fit", *MODEL, *DATA, "--trainer.logger.init_args.save_dir", "afile"], capsys, 1)
    assert "error: logger save_dir:" in err and "afile is a file, not a folder" in err, err

    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o555)
    if os.access(readonly, os.W_OK):  # root writes anywhere: a read-only file system instead
        readonly = Path("/proc/cloc-lightning-runs")
    try:
        err = _fails(["fit", *MODEL, *DATA, "--trainer.logger.init_args.save_dir", str(readonly)], capsys, 1)
    finally:
        (tmp_path / "readonly").chmod(0o755)
    assert "error: logger save_dir: cannot write the run folder" in err and str(readonly) in err, err
    assert "give --trainer.logger.init_args.save_dir a folder you can write to" in err


@pytest.mark.parametrize(
    "args",
    [
        ["--optimizer", "SGD", "--optimizer.lr", "0.5"],
        ["--lr_scheduler=StepLR"],
        ["--config", "optim.yaml"],
    ],
)
def test_lightning_optimizer_options_are_refused(
    args: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "optim.yaml").write_text("optimizer:\n  class_path: torch.optim.SGD\n  init_args: {lr: 0.5}\n")
    err = _fails(["fit", *MODEL, *DATA, *args], capsys, 1)
    assert "cloc-lightning has no --optimizer/--lr_scheduler options" in err, err
    for key in ("--model.optimizer", "--model.lr", "--model.weight_decay", "--model.scheduler", "--model.warmup_epochs"):
        assert key in err


def test_help_offers_no_lightning_optimizer_and_prints_plain_text(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    out = capsys.readouterr().out
    assert "--model.help" in out and "--optimizer" not in out and "--lr_scheduler" not in out

    with pytest.raises(SystemExit):
        main(["fit", "--model.help", "CLOCModule"])
    out = capsys.readouterr().out
    assert "--model.margin_kind" in out or "--model.num_classes" in out
    assert ":class:" not in out and "``" not in out and ":mod:" not in out, out

    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "test                Perform one evaluation epoch over the test set.\n" in out
    assert "predict             Run inference on your data.\n" in out
    assert "make sure you never run on your\n" not in out

    with pytest.raises(SystemExit):
        main(["probe", "--help"])
    out = capsys.readouterr().out
    assert "<lambda>" not in out and "--preset" in out


def test_rst_to_text() -> None:
    from cloc_lightning.cli.helptext import rst_to_text

    assert (
        rst_to_text("see :class:`~cloc_lightning.losses.cloc.CLOCLoss` and :mod:`cloc_lightning.losses`")
        == "see CLOCLoss and cloc_lightning.losses"
    )
    assert rst_to_text("``mm`` (a margin per pair), :func:`f <pkg.f>`, x ``C - 1``") == "mm (a margin per pair), f, x C - 1"


# ---------------------------------------------------------------- wrong types and typos in configs
def test_learnable_map_wrong_type_from_yaml_through_the_cli(tmp_path: Path) -> None:
    """YAML strings: jsonargparse reads a quoted number ('0.4') as the number; anything else is refused by name."""
    cfg = _tiny_cli_config({"learnable_map": [["fixed", "0.4"], ["fixed", "abc"], ["fixed", 0.6]]})
    (tmp_path / "bad.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_main(["fit", "--config", "bad.yaml"], tmp_path)  # the command's entry point, in this process
    assert proc.code != 0
    assert "learnable_map[1]: the margin value must be a number > 0 or None, got 'abc'" in proc.stderr
    assert "learnable_map[0]" not in proc.stderr  # '0.4' became 0.4


def test_config_typos_fail_naming_the_key(tmp_path: Path) -> None:
    """An unknown key in YAML, or on the command line, stops while parsing with the key named.

    (Command-line options may be abbreviated to a unique prefix, argparse's ``allow_abbrev``:
    ``--trainer.max_epoch`` *is* ``--trainer.max_epochs``; a key that is no prefix is refused.)
    """
    cfg = _tiny_cli_config({"margn_lr": 0.1})
    (tmp_path / "cfg.yaml").write_text(yaml.safe_dump(cfg))
    proc = run_main(["fit", "--config", "cfg.yaml"], tmp_path)
    assert proc.code != 0 and "margn_lr" in proc.stderr, proc.stderr[-2000:]
    (tmp_path / "good.yaml").write_text(yaml.safe_dump(_tiny_cli_config({"margin_lr": 0.1})))
    proc = run_main(["fit", "--config", "good.yaml", "--trainer.max_epochz", "1"], tmp_path)
    assert proc.code != 0 and "max_epochz" in proc.stderr, proc.stderr[-2000:]
    assert "Epoch" not in proc.stdout + proc.stderr  # stopped while parsing, before any training


@pytest.mark.parametrize("command", ["validate", "test", "predict"])
def test_evaluating_ckpt_path_last_without_a_run_is_one_line(command: str, tmp_path: Path) -> None:
    """``test --ckpt_path last`` with no run said "training starts from scratch", then asked for a --ckpt_path the user
    had given (an outside user); now one line naming what was looked for, and no run folder."""
    out = run_main([command, *MODEL, *DATA, "--ckpt_path", "last"], tmp_path)
    assert out.code == 1 and f"--ckpt_path last: no last.ckpt of this run to {command}" in out.stderr, out.stderr[-2000:]
    assert "training starts from scratch" not in out.stderr and not any(tmp_path.iterdir())
