"""Errors from the tools under the CLI, before the first step, as one line naming the option or file and the fix
(issue 51, item 1): a config file that is empty or not text, and Trainer settings this machine cannot run
(Lightning's accelerator, strategy and device checks, which reached users as 40-70-line tracebacks)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from cloc_lightning.cli import main
from tests.cli._tiny import CE_MODEL

BASE = ["fit", *CE_MODEL, "--data", "OrdinalShapesDataModule", "--trainer.fast_dev_run", "true"]


def _error(args: list[str], capsys: pytest.CaptureFixture[str]) -> list[str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    assert done.value.code == 1
    lines = capsys.readouterr().err.strip().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("cloc-lightning: error:") or ln.startswith("cloc-lightning fit: error:"))
    return lines[start:]


@pytest.mark.parametrize(
    "content, expected",
    [
        (b"", "the file is empty; a config is a YAML mapping"),
        (b"  \n\n", "the file is empty"),
        (b"\x89PNG\r\n\x1a\n", "not a text file (byte 0: b'\\x89' is not UTF-8)"),
        ("model: {lr: 0.1}\nnote: Zürich\n".encode("cp1252"), "is not UTF-8"),
    ],
)
def test_a_config_that_is_no_yaml_text_is_one_line(
    content: bytes, expected: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "run.yaml"
    path.write_bytes(content)
    err = _error([*BASE, "--config", str(path)], capsys)
    assert f"--config {path}: " in err[0] and expected in err[0], err  # was "Unexpected config:" or a UnicodeDecodeError traceback
    assert err[1:] == ["(--debug shows the traceback)"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU: the settings below are possible here")
@pytest.mark.parametrize(
    "setting, expected",
    [
        (["--trainer.accelerator", "gpu"], "--trainer.accelerator gpu: this machine cannot run it (No supported gpu backend found!)"),
        (["--trainer.accelerator", "cuda"], "--trainer.accelerator cuda: this machine cannot run it"),
        (["--trainer.accelerator", "tpu"], "--trainer.accelerator tpu: this machine cannot run it (Requirement 'torch_xla"),
        (["--trainer.accelerator", "cpu", "--trainer.devices", "0"], "--trainer.devices 0: this machine cannot run it"),
        (["--trainer.strategy", "deepspeed"], "--trainer.strategy deepspeed: this machine cannot run it (To use the `DeepSpeedStrategy`"),
    ],
)
def test_a_trainer_setting_the_machine_cannot_run_is_one_line(
    setting: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    err = _error([*BASE, *setting], capsys)
    assert err[0].startswith(f"cloc-lightning: error: {expected}") and "--trainer.accelerator cpu" in err[0], err
    assert err[1:] == ["(--debug shows the traceback)"]  # was Lightning's traceback (MisconfigurationException, ...)


def test_a_config_that_gives_a_key_twice_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """YAML keeps the second of two equal keys, silently: an outside user's second ``trainer:`` block dropped the first."""
    path = tmp_path / "run.yaml"
    path.write_text("trainer:\n  max_epochs: 1\nmodel:\n  class_path: CEModule\n  init_args: {lr: 0.1, lr: 0.2}\n")
    err = _error([*BASE, "--config", str(path)], capsys)
    assert f"--config {path}:5: key 'lr' given twice (first on line 5)" in err[0], err
